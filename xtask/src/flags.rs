//! The command line of `cargo xtask`, declared in one place.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::os::OsSource;
use crate::progress::ProgressMode;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Build, test and publish the agent-sandbox images",
    long_about = "Build, test and publish the agent-sandbox images.\n\n\
        Every folder under images/ is an image; its Dockerfile's FROM names its parent. \
        `cargo xtask graph` shows the graph, `cargo xtask build` builds it.",
    after_help = "Exit codes: 0 success, 1 failure (the message says what failed), 2 bad usage.",
    arg_required_else_help = true
)]
pub struct Xtask {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the images and their ancestors, in dependency order, and record them in images.lock
    #[command(
        long_about = "Build the images and their ancestors, in dependency order, and record them in images.lock.\n\n\
            An image whose inputs (context files, build args, parent image) have not changed since \
            an existing image was built is not rebuilt: it is tagged again. Siblings build in \
            parallel. Each image is tagged <prefix>/agent-<name>:<version> and :sha-<commit>.",
        after_help = "Examples:\n  cargo xtask build                 build every image\n  \
            cargo xtask build shell           build shell and what it is built on\n  \
            cargo xtask build --ca-bundle /usr/local/share/ca-certificates/corp.crt\n  \
            cargo xtask build --locked        fail if images.lock would change"
    )]
    Build(BuildFlags),
    /// Print the image graph (text tree, --json, or --dot for Graphviz)
    Graph(GraphFlags),
    /// Measure the build system (prints figures; asserts nothing)
    Bench(BenchFlags),
    /// Build what the suites need, then run them with cargo-nextest
    #[command(
        long_about = "Build what the suites need, then run them with cargo-nextest, in one run.\n\n\
            Where a test sits says what it needs: under `net_admin::single::`, `net_admin::sidecar::` \
            or `net_admin::gvisor::` it gives containers NET_ADMIN, in that shape (one container; \
            sidecar mode's pair; that pair with the agent under runsc); elsewhere in the container \
            suites it gives none; outside them it starts no container. One run schedules them all \
            in one pool and writes JUnit with each test's time under target/nextest/<profile>/.",
        after_help = "Examples:\n  cargo xtask test                     everything (but --arm64's)\n  \
            cargo xtask test --pure              the tests that start no container, in seconds\n  \
            cargo xtask test --ci                no capability for any container\n  \
            cargo xtask test --shape sidecar     the NET_ADMIN tests in sidecar mode\n  \
            cargo xtask test -- firewall::       only tests whose name contains `firewall::`"
    )]
    Test(TestFlags),
    /// Run what CI checks, in order: fmt, clippy, the pure tests, the build, images.lock unchanged, the suites
    #[command(
        long_about = "Run what CI checks, in order, stopping at the first that fails:\n\n  \
            fmt       cargo fmt --all -- --check\n  \
            clippy    cargo clippy --workspace --all-targets -- -D warnings\n  \
            pure      cargo xtask test --pure: every test that starts no container\n  \
            build     cargo xtask build (every image, and the shell's arm64 chain)\n  \
            lock      git diff --exit-code images.lock: the build must not have changed it\n  \
            test      the container suites, every shape in one nextest run\n\n\
            .ci/run installs the tools and the engine, then runs this; the GitHub workflow's test \
            job runs it too. At its end: each step's time, how many tests ran in each place \
            (without a container; with none given a capability; with NET_ADMIN in each shape), \
            and the 15 slowest tests.",
        after_help = "Examples:\n  cargo xtask ci\n  cargo xtask ci --skip fmt --skip clippy   only the build and the suites\n  \
            cargo xtask ci --ca-bundle /usr/local/share/ca-certificates/corp.crt"
    )]
    Ci(CiFlags),
    /// Install and start what a fresh machine lacks, build AGENT's image and install the launcher
    #[command(
        long_about = "Install and start what a fresh machine lacks, once, in order: the \
            distribution's packages (docker.io, mmdebstrap; with --tests also docker-registry, \
            Node.js and git), the engine where none answers (systemd, else dockerd itself), and \
            with --tests the Rust tools the suites use (cargo-nextest, rustfmt, clippy) and the \
            pinned tools the suites run (the Dev Containers CLI, kubernetes-validate, the \
            scanners, and Debian's nginx for the wire suite, unpacked, not installed), in the \
            user's cache (~/.cache/agent-sandbox/ci-tools, or AGENT_SANDBOX_CI_TOOLS), which every \
            checkout shares. For each AGENT named, its image is built \
            and the launcher installed (cargo install), so that `agent-sandbox run AGENT DIR` \
            works next.\n\n\
            It says what is missing and asks before installing on a terminal; elsewhere it \
            installs only with --yes. Packages need a Debian-like system (apt-get) and root or \
            sudo; where it cannot install, it names what to install and stops (exit 1). \
            --check only looks.",
        after_help = "Examples:\n  cargo xtask setup claude          then: agent-sandbox run claude ~/src/myapp\n  \
            cargo xtask setup --tests         then: cargo xtask ci\n  \
            cargo xtask setup --check         what is missing, nothing installed\n  \
            cargo xtask setup --tests --yes   what .ci/run does"
    )]
    Setup(SetupFlags),
    /// Push the images to a registry, read their manifests back, and pin the digests in images.lock
    #[command(
        long_about = "Push the images (and their ancestors) to a registry, parents first, as \
            HOST/NAMESPACE/agent-<name>:<version> and :sha-<commit>. Each manifest is then read back \
            from the registry, checked to refer to the image pushed, and `repository@sha256:…` is \
            recorded in images.lock (only once every image succeeded).\n\n\
            Credentials: AGENT_SANDBOX_REGISTRY_USER and AGENT_SANDBOX_REGISTRY_PASSWORD, else \
            GITHUB_TOKEN (with GITHUB_ACTOR) for ghcr.io, else the docker config's logins. \
            Transient registry errors are retried with backoff; refused credentials are not.",
        after_help = "Examples:\n  cargo xtask publish --registry ghcr.io/agent-sandbox\n  \
            cargo xtask publish --registry 127.0.0.1:5000/test shell --dry-run"
    )]
    Publish(PublishFlags),
    /// Print the pinned references (repository@digest) recorded by `publish`
    Digests(DigestsFlags),
    /// List the agent-sandbox images this engine holds, found by their label
    List(ListFlags),
    /// Remove the project's images that images.lock no longer names (older builds' generations)
    #[command(
        long_about = "Remove the project's images that images.lock no longer names.\n\n\
            Every build that changes an input (a Dockerfile, a CLI version, sandbox-init) leaves the \
            previous image behind, tagged :sha-<old commit>; a few generations of the agent images \
            take tens of gigabytes. prune keeps the latest build of every image (the one tagged \
            <prefix>/agent-<name>:<version>) and every image images.lock records, and removes the \
            other images the build made under --prefix, with their inputs tags.\n\n\
            Only images carrying the build's inputs label are touched, and of their tags only \
            <prefix>/agent-* and the inputs index. An image that also has another tag (a registry's, \
            one of yours) loses only the project's tags; an image a container uses, even a stopped \
            one, is kept (nothing is forced). Images no prefix tag claims are taken only when older \
            than 10 minutes, so a build in progress elsewhere keeps its image. Look first with \
            --dry-run. Exit status: 0 when done (kept images included), 1 on an engine error or a \
            lock that records no image.",
        after_help = "Examples:\n  cargo xtask prune --dry-run   what would go\n  cargo xtask prune"
    )]
    Prune(PruneFlags),
    /// Scaffold a new agent image: images/NAME/Dockerfile and policies/NAME.yaml
    #[command(
        after_help = "Examples:\n  cargo xtask new-agent acme --npm @acme/cli --cmd acme --domain api.acme.com\n  \
            cargo xtask new-agent tool --pip tool-cli --cmd tool\n  \
            cargo xtask new-agent mine --from shell --cmd bash\n\n\
            Existing files are never overwritten. The image appears in `cargo xtask graph` and the \
            contract suite covers it with no further edit."
    )]
    NewAgent(NewAgentFlags),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["npm", "pip", "from"])))]
pub struct NewAgentFlags {
    /// The image name (a lowercase letter, then lowercase letters, digits and hyphens)
    pub name: String,
    /// Install the CLI from this npm package (built on `node`)
    #[arg(long)]
    pub npm: Option<String>,
    /// Install the CLI from this PyPI package into a uv venv (built on `python`)
    #[arg(long)]
    pub pip: Option<String>,
    /// Build on this image of the graph and install nothing
    #[arg(long)]
    pub from: Option<String>,
    /// The command that starts the agent (ASSISTANT_CMD); defaults to NAME
    #[arg(long)]
    pub cmd: Option<String>,
    /// A domain the agent needs (repeatable): `host`, `*.host` or `host:port`
    #[arg(long = "domain")]
    pub domains: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SetupFlags {
    /// Agent images to build (with what they are built on); the launcher is installed with them
    #[arg(value_name = "AGENT")]
    pub agents: Vec<String>,
    /// Also what the test command needs
    #[arg(long)]
    pub tests: bool,
    /// Install without asking
    #[arg(long, short = 'y', conflicts_with = "check")]
    pub yes: bool,
    /// Only say what is missing; install nothing
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub common: CommonBuildFlags,
}

#[derive(Debug, Args)]
pub struct CiFlags {
    /// A step not to run (repeatable)
    #[arg(long, value_enum, value_name = "STEP")]
    pub skip: Vec<CiStep>,
    #[command(flatten)]
    pub common: CommonBuildFlags,
}

/// The steps of `cargo xtask ci`, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CiStep {
    Fmt,
    Clippy,
    Pure,
    Build,
    Lock,
    Test,
}

#[derive(Debug, Args)]
pub struct PruneFlags {
    /// Print what would be removed; remove nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Tag prefix whose images are judged: <prefix>/agent-<name>
    #[arg(long, env = crate::project::PREFIX_ENV, default_value = crate::project::DEFAULT_PREFIX)]
    pub prefix: String,
}

#[derive(Debug, Args)]
pub struct ListFlags {
    /// Every image of the project, not only the agent images
    #[arg(long)]
    pub all: bool,
    /// One JSON object per image (name, id, every tag, size, CLI version), as an array
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PublishFlags {
    /// Where to publish: HOST/NAMESPACE (e.g. ghcr.io/agent-sandbox)
    #[arg(long, env = "AGENT_SANDBOX_REGISTRY")]
    pub registry: String,
    /// Images to publish (with their ancestors); all when none is named
    pub images: Vec<String>,
    /// Print what would be pushed, push nothing
    #[arg(long)]
    pub dry_run: bool,
    /// The platforms of each image's index, comma-separated: linux/amd64, linux/arm64 [default:
    /// the host's]. Each platform's image is pushed as `<version>-<arch>`, then one OCI image
    /// index of them as `<version>` (and `sha-<commit>`), which `docker pull` resolves by
    /// platform and images.lock pins
    #[arg(long, value_delimiter = ',', value_name = "PLATFORM")]
    pub platform: Vec<crate::platform::Platform>,
    #[command(flatten)]
    pub common: CommonBuildFlags,
}

#[derive(Debug, Args)]
pub struct DigestsFlags {
    /// A JSON object: image name -> pinned reference
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// A Markdown table, for a CI job summary
    #[arg(long)]
    pub markdown: bool,
}

#[derive(Debug, Args)]
pub struct BuildFlags {
    /// Images to build (with their ancestors); all when none is named
    pub images: Vec<String>,
    #[command(flatten)]
    pub common: CommonBuildFlags,
    /// Verify only: fail if building would change images.lock (nothing is built)
    #[arg(long)]
    pub locked: bool,
    /// The platforms to build for, comma-separated: linux/amd64, linux/arm64 [default: the
    /// host's]. Another platform than the host's needs qemu-user-static registered with
    /// binfmt_misc (`cargo xtask setup --tests`) and `--os-source mirror`; its images are tagged
    /// <version>-<arch>. The platforms' chains build at once, `--jobs` shared between them
    #[arg(long, value_delimiter = ',', value_name = "PLATFORM")]
    pub platform: Vec<crate::platform::Platform>,
}

/// Build settings shared by every command that builds images.
#[derive(Debug, Args, Clone)]
pub struct CommonBuildFlags {
    /// How many images may build at once
    #[arg(long, short, default_value_t = 2)]
    pub jobs: usize,
    /// Where the OS layer comes from [default: mirror where mmdebstrap is installed, else registry]
    #[arg(long, value_enum, env = crate::project::OS_SOURCE_ENV)]
    pub os_source: Option<OsSource>,
    /// Debian archive for the mirror source
    #[arg(long, env = crate::os::MIRROR_ENV, default_value = crate::os::DEFAULT_MIRROR)]
    pub debian_mirror: String,
    /// Debian security archive for the mirror source ("none" to leave it out)
    #[arg(long, env = crate::os::SECURITY_MIRROR_ENV, default_value = crate::os::DEFAULT_SECURITY_MIRROR)]
    pub debian_security_mirror: String,
    /// Bootstrap the OS layer again even if one with the same settings exists (picks up archive updates)
    #[arg(long)]
    pub refresh_os: bool,
    /// Tag prefix: images are tagged <prefix>/agent-<name>
    #[arg(long, env = crate::project::PREFIX_ENV, default_value = crate::project::DEFAULT_PREFIX)]
    pub prefix: String,
    /// Extra CA certificates (PEM) to trust during builds and in the images, for TLS-intercepting proxies
    #[arg(long, env = crate::project::CA_BUNDLE_ENV, value_name = "FILE")]
    pub ca_bundle: Option<PathBuf>,
    /// Progress display
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
}

#[derive(Debug, Args)]
pub struct GraphFlags {
    /// Machine-readable JSON
    #[arg(long, conflicts_with = "dot")]
    pub json: bool,
    /// Graphviz dot (`cargo xtask graph --dot | dot -Tsvg > graph.svg`)
    #[arg(long)]
    pub dot: bool,
}

#[derive(Debug, Args)]
pub struct BenchFlags {
    #[command(subcommand)]
    pub what: BenchTarget,
}

#[derive(Debug, Subcommand)]
pub enum BenchTarget {
    /// No-op rebuild of the whole graph vs. `docker build` of every image with a warm cache
    Build {
        /// Repetitions of each measurement (the median is reported)
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[command(flatten)]
        common: CommonBuildFlags,
    },
    /// sandbox-init's cost: start to `sandbox ready` (1 and 10,000 domains) vs. a trivial
    /// entrypoint, DNS gate latency and throughput vs. the upstream, the name check, the key
    /// forwarder, and attached output through sandbox-attach's filter. Needs NET_ADMIN.
    Sandbox {
        /// Repetitions of each start measurement (the median is reported)
        #[arg(long, default_value_t = 7)]
        runs: usize,
        #[command(flatten)]
        common: CommonBuildFlags,
    },
    /// The launcher's web page (`agent-sandbox ui`) with 20 sandboxes and 100,000 connection
    /// lines, in headless Chromium: page load vs. `ls`, live update latency (a sandbox started
    /// or stopped, a name refused to the agent) vs. the poll period, the connections view and its
    /// API vs. a handful of lines, the longest main-thread task. Needs NET_ADMIN
    Ui {
        /// Repetitions of each measurement
        #[arg(long, default_value_t = 7)]
        runs: usize,
        #[command(flatten)]
        common: CommonBuildFlags,
    },
    /// The performance card, docs/performance.md: every image built (for its size), the sandbox
    /// bench's figures with their p95, the time to a first command against a bare container,
    /// the machine, and the peers' published figures apart. Needs NET_ADMIN; about 15 minutes.
    Card {
        /// Repetitions of each start measurement
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// Sandboxes (and bare containers) started for the time to a first command
        #[arg(long, default_value_t = 20)]
        first_command_runs: usize,
        #[command(flatten)]
        common: CommonBuildFlags,
    },
}

#[derive(Debug, Args)]
pub struct TestFlags {
    /// Only what gives no container a capability: every test but those under `net_admin::`,
    /// with the `ci` profile
    #[arg(long)]
    pub ci: bool,
    /// Only the tests that start no container (unit tests, tidy, snapshots): seconds, no image
    /// built
    #[arg(long, conflicts_with_all = ["ci", "shape"])]
    pub pure: bool,
    /// Only the NET_ADMIN tests of one shape (`…::net_admin::<shape>::…`). Without it, one run
    /// has every test of every shape
    #[arg(long, value_enum, conflicts_with = "ci")]
    pub shape: Option<TestShape>,
    /// Only the arm64 chain's suite (arm64::, its release part included): shell and claude built
    /// for linux/arm64, under qemu-user where the host is amd64 (registered by `cargo xtask
    /// setup --tests`), and their contract checked there; and the firewall in a real arm64 kernel:
    /// shell's filesystem booted on Debian's arm64 kernel under qemu-system-aarch64 (as root, a
    /// few minutes). The release workflow runs it; every CI run checks the emulated part
    #[arg(long, conflicts_with_all = ["ci", "shape", "pure"])]
    pub arm64: bool,
    #[command(flatten)]
    pub common: CommonBuildFlags,
    /// Arguments passed on to `cargo nextest run`
    #[arg(last = true)]
    pub nextest_args: Vec<String>,
}

/// How the suites start sandboxes with NET_ADMIN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TestShape {
    /// One container: the firewall and the session
    Single,
    /// A gateway with NET_ADMIN and an agent container without any capability
    Sidecar,
    /// Sidecar mode with the agent's container under gVisor (the engine's `runsc` runtime)
    Gvisor,
}
