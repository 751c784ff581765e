//! The command line of `agent-sandbox`, declared in one place.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const ROOT_AFTER_HELP: &str = "Examples:\n  \
    agent-sandbox run claude                 Claude Code on the current directory\n  \
    agent-sandbox ls                         the sandboxes and what they were refused\n  \
    agent-sandbox pending claude             names the agent asked for and was refused\n  \
    agent-sandbox allow claude docs.rs       let it reach docs.rs, now, without a restart\n\n\
    Exit codes:\n  \
    0   success\n  \
    1   the engine refused a call (its message is shown)\n  \
    2   bad usage (clap's own message)\n  \
    64  a bad argument: a domain, --env, --key-file, the project folder\n  \
    65  a policy file (--policy, or a drop-in in the sandbox) is invalid or unreadable\n  \
    66  no image for the agent: build it, or pass --image\n  \
    67  no key for the agent's API: export its variable, or --key-file, or --no-key\n  \
    68  no sandbox matches the name given, or more than one does\n  \
    69  no container engine answers (start it, or set DOCKER_HOST)\n  \
    70  the sandbox did not start, or did not apply a change (sandbox-init's message is shown)\n  \
    71  a host sign-in file (--login-from-host) is missing or unreadable\n  \
    72  the project's git files changed while the agent ran (stop, or the end of run, names them)\n  \
    73  verify: a check failed (the scorecard says which, and what it means)\n  \
    74  ui: an approval the page sent no longer matches the queue (the page looks again)\n\n\
    exec exits with its command's status instead, and with these codes only where it cannot run \
    the command at all. policy check and why exit 1 when they refuse a target.";

#[derive(Debug, Parser)]
#[command(
    name = "agent-sandbox",
    version,
    about = "Run an AI coding agent in its sandbox on a project",
    long_about = "Run an AI coding agent in its sandbox on a project.\n\n\
        Each agent runs in its image (built by `cargo xtask build`): outbound network limited to \
        its policy's allowlist, the agent a user without capabilities, its session in tmux. One \
        sandbox per agent and project; its sign-in and history live in a state volume of that \
        agent and project alone.",
    after_help = ROOT_AFTER_HELP,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start AGENT's sandbox on a project and attach to its session (or reattach)
    #[command(
        long_about = "Start AGENT's sandbox on DIR (default: the current directory) and attach to \
            its session. If that agent's sandbox on that project is running, reattach instead.\n\n\
            The project is mounted at /workspace. The agent's state (sign-in, history) lives in a \
            volume named after the agent and the project's canonical path, so two projects never \
            share it (--state picks one by hand). Keys go in as root-only secret files that \
            sandbox-init holds: the agent's processes never see them. Detach from the session \
            with C-b d; the sandbox keeps running.\n\n\
            The project's git configuration and hooks (.git/config, config.worktree, hooks, and \
            those of its submodules and worktrees) are read-only in the sandbox: your own git runs \
            what they name, as you, on the host. `stop` (and the end of an attached run) names \
            any change to them and any repository the agent nested in the project, and exits 72.",
        after_help = "Examples:\n  \
            agent-sandbox run claude                          Claude Code on the current directory\n  \
            agent-sandbox run codex ~/src/app --detach        start it, attach later\n  \
            agent-sandbox run claude --allow docs.rs --allow '*.python.org'\n  \
            agent-sandbox run aider --key-file OPENAI_API_KEY=~/.secrets/openai\n  \
            agent-sandbox run claude --unattended --detach    no permission prompts\n  \
            agent-sandbox run shell --offline                 no network at all\n  \
            agent-sandbox run claude --sidecar                the firewall in a gateway container beside it\n  \
            agent-sandbox run claude --runtime runsc          the agent under gVisor, the firewall beside it\n  \
            agent-sandbox run aider --model-server http://localhost:11434 --model qwen2.5-coder:7b\n  \
            \x20                                                 a local model (Ollama), no cloud key"
    )]
    Run(Box<RunFlags>),
    /// List the sandboxes: agent, project, uptime, state volume, connections allowed and refused
    #[command(after_help = "Examples:\n  agent-sandbox ls\n  agent-sandbox ls --json")]
    Ls(LsFlags),
    /// Attach to a sandbox's session (detach again with C-b d)
    #[command(after_help = "Examples:\n  agent-sandbox attach claude\n  agent-sandbox attach myproject")]
    Attach(AttachFlags),
    /// Run a command as the agent in a running sandbox, without attaching
    #[command(
        long_about = "Run a command as the agent in a running sandbox, without attaching: as uid \
            1000 with no capability, in /workspace, with the session's environment (the \
            forwarder's address and the keys' placeholders; never a key), behind the sandbox's \
            firewall, in whichever container the agent has (the one container, or sidecar mode's \
            and gVisor's agent container). It is `docker exec C sandbox-exec -- CMD`, found by \
            the sandbox's name in every shape.\n\n\
            A sandbox still starting is waited for, until its firewall holds.\n\n\
            Its output is the sandbox's, which the agent controls (the command runs as the \
            agent's uid, beside its processes): on a terminal it is filtered as `attach` filters \
            the session (colours pass; clipboard writes, links, title reports and the like do \
            not); into a pipe or a file it passes as it is. Standard input reaches the command \
            only with -i. The exit status is the command's (126: it could not be run, 127: it was \
            not found), 141 when its output could not be written, 128 + the signal that ended \
            the launcher, or one of the launcher's own codes below where it cannot run it at all \
            (68: no such sandbox, or it is stopped).",
        after_help = "Examples:\n  \
            agent-sandbox exec claude -- git status           a command, its output and status\n  \
            agent-sandbox exec -i claude -- sh -s < job.sh    a script from this standard input\n  \
            agent-sandbox exec -it claude -- bash             a shell as the agent (its ~/.bashrc)"
    )]
    Exec(ExecFlags),
    /// Stop a sandbox and remove its container; its state volume is kept
    #[command(after_help = "Examples:\n  agent-sandbox stop claude")]
    Stop(StopFlags),
    /// Show a sandbox's log: sandbox-init's lines, refused names and connections
    #[command(after_help = "Examples:\n  agent-sandbox logs claude\n  agent-sandbox logs claude --follow")]
    Logs(LogsFlags),
    /// Show a sandbox's policy in force, the addresses it opened and its last denials
    #[command(after_help = "Examples:\n  agent-sandbox status claude\n  agent-sandbox status claude --json")]
    Status(StatusFlags),
    /// Allow more names in a running sandbox, live: nothing restarts
    #[command(
        long_about = "Allow more names in a running sandbox, live: the names go into the sandbox's \
            runtime drop-in (/etc/agent-sandbox/policy.d/launcher.txt, writable by root alone) and \
            sandbox-init reloads its policy. The session is untouched. --pending allows every name \
            `agent-sandbox pending` lists.",
        after_help = "Examples:\n  \
            agent-sandbox allow claude docs.rs\n  \
            agent-sandbox allow claude '*.readthedocs.io' pypi.org:443\n  \
            agent-sandbox allow claude uploads.example.com --upload 1GiB\n  \
            agent-sandbox pending claude && agent-sandbox allow claude --pending"
    )]
    Allow(AllowFlags),
    /// Take back names `allow` gave a running sandbox, live: their connections are cut
    #[command(after_help = "Examples:\n  agent-sandbox deny claude docs.rs")]
    Deny(DenyFlags),
    /// List the names a sandbox's agent was refused since the last approval, with counts
    #[command(
        long_about = "List the names a sandbox's agent was refused since the last approval or \
            dismissal, with how often: the approval queue of an unattended agent. \
            `agent-sandbox allow SANDBOX --pending` allows them all; --dismiss empties the queue \
            without allowing anything. Allowed names past their upload budget are listed too, \
            with their budget: `agent-sandbox allow SANDBOX NAME --upload SIZE` raises one.",
        after_help = "Examples:\n  \
            agent-sandbox pending claude\n  \
            agent-sandbox pending claude --json\n  \
            agent-sandbox pending claude --dismiss"
    )]
    Pending(PendingFlags),
    /// Print AGENT's sandbox as a Kubernetes Pod (or SandboxTemplate): the gateway a native sidecar
    #[command(
        long_about = "Print AGENT's sandbox as Kubernetes objects, for `kubectl apply -f -`: sidecar \
            mode's shape as a Pod. The gateway is a native sidecar (an init container with \
            restartPolicy: Always) holding NET_ADMIN and the keys, from a Secret; the agent's \
            container meets the restricted Pod Security Standard (non-root, every capability \
            dropped, seccomp RuntimeDefault, no privilege escalation). --template prints a \
            kubernetes-sigs/agent-sandbox SandboxTemplate instead. --policy and --allow go into a \
            ConfigMap printed before it.\n\n\
            The output is validated against Kubernetes' published schema, and the Pod run by a \
            stand-in for a kubelet on Docker; it has never run on a cluster. The pod's namespace must admit NET_ADMIN for the gateway (Pod Security \
            `privileged`), which a restricted namespace does not. The image is read from the \
            local engine for its state folders and the APIs whose keys it holds; the cluster must \
            be able to pull the reference printed.",
        after_help = "Examples:\n  \
            agent-sandbox k8s claude --dns 10.96.0.10 | kubectl apply -f -\n  \
            agent-sandbox k8s codex --dns 10.96.0.10 --policy team.yaml --template\n  \
            agent-sandbox k8s shell --dns 10.96.0.10 --runtime-class kata\n\n\
            The cluster's DNS service: kubectl -n kube-system get svc kube-dns -o jsonpath='{.spec.clusterIP}'"
    )]
    K8s(K8sFlags),
    /// Check that an image and its policy hold: egress, DNS, names, privileges, the firewall
    #[command(
        long_about = "Check that IMAGE and its policy hold against an agent that tries to get out. \
            verify builds a test world on a private internal network of the engine, from containers \
            of IMAGE itself running the static probe (nothing is pulled): a peer under an allowed and \
            a blocked name on one address, a listener under no name, and an upstream DNS server that \
            logs every query. It starts IMAGE as a sandbox with NET_ADMIN, its policy (or --policy) \
            plus the allowed name, runs each check as the agent, with a positive control, and reads \
            the evidence where it lands. Then it removes the world, on Ctrl-C too. With --sidecar \
            (or --runtime runsc) the sandbox is the pair `run --sidecar` makes: a gateway with the \
            firewall and the keys, the agent's container without any capability. Where the policy \
            reaches a model API, the sandbox holds a made-up key for it that the agent must not find. \
            Named a running sandbox, verify checks its image in a fresh world with the policy and the \
            shape it runs with, never touching it, and reads its own agent's processes.\n\n\
            It prints a scorecard: each check PASS, FAIL or N/A, its evidence, and what a FAIL means. \
            The exit status is 73 when a check fails. An image without sandbox-init runs too (its \
            process replaced by the probe, the agent uid 1000), and fails what it fails.",
        after_help = "Examples:\n  \
            agent-sandbox verify localhost/agent-sandbox/agent-shell:0.1.0\n  \
            agent-sandbox verify my-agent:dev --policy team.yaml --json\n  \
            agent-sandbox verify localhost/agent-sandbox/agent-claude:0.1.0 --runtime runsc\n  \
            agent-sandbox verify debian:trixie-slim           what an image with no sandbox gives\n  \
            agent-sandbox verify claude                        the running claude sandbox\n\n\
            The probe: --probe FILE, AGENT_SANDBOX_PROBE, or sandbox-probe beside agent-sandbox. \
            The JSON's schema: docs/verify.schema.json."
    )]
    Verify(VerifyFlags),
    /// Say whether a running sandbox's agent reaches a name or URL, and why not
    #[command(
        long_about = "Say whether a running sandbox's agent reaches each name or URL, and why not: \
            what its policy in force says (as `policy check` judges: the entry, the port, the \
            forwarder's rule), and what the sandbox recorded that the policy alone does not say: an \
            upload budget spent this hour, a DNS answer that pointed into your network or at a \
            metadata service, how often and when the name was refused. A refusal ends with the \
            command that would allow it, where one would.\n\n\
            Exit status: 0 when the agent reaches every target, 1 when one is refused.",
        after_help = "Examples:\n  \
            agent-sandbox why claude docs.rs\n  \
            agent-sandbox why claude https://uploads.example.com/ 'POST https://api.github.com/gists'"
    )]
    Why(WhyFlags),
    /// Say whether a policy lets the agent reach URLs, and why, without sending anything
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Serve a local web page to watch every sandbox, approve what agents ask for, and see what they connect to
    #[command(
        long_about = "Serve a local web page to watch every sandbox: which run, what each agent's \
            screen shows, where each tried to connect, and what waits for approval; allow, deny, \
            approve and stop from it, with the same rules and messages as the commands.\n\n\
            It listens on 127.0.0.1 only and prints its URL with a random token (open that URL: \
            without the token every request is refused). A request that changes anything needs \
            the token in a header and the page's own Origin, so another web page cannot use it; a \
            Host other than 127.0.0.1 or localhost is refused. The page and its script are inside \
            this binary: nothing is fetched from anywhere. Nothing happens while no page looks. \
            Ctrl-C ends it.",
        after_help = "Examples:\n  \
            agent-sandbox ui                     serve, and open the page in the browser\n  \
            agent-sandbox ui --port 8750 --no-open"
    )]
    Ui(UiFlags),
}

#[derive(Debug, Args)]
pub struct WhyFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
    /// Names (port 443), HOST:PORT, URLs, `METHOD URL`
    #[arg(value_name = "TARGET", required = true)]
    pub targets: Vec<String>,
    /// The answers as one JSON array: target, allowed, reason, change
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Say whether a policy lets the agent reach each URL or HOST:PORT, and why
    #[command(
        long_about = "Say whether a policy lets the agent reach each target, and why, without sending \
            anything: the entry or range that opens it, or what refuses it (a name not in the policy, \
            a port it does not open, the forwarder's rule for GitHub, npm or a declared API) and what \
            would allow it. The policy is a running sandbox's, as in force now (its image's, its \
            drop-ins, what `allow` gave), with --policy files added; or the --policy files alone.\n\n\
            A target is a URL (GET unless a method comes before it: 'POST https://api.github.com/gists'), \
            or HOST:PORT for a connection that is not HTTP. Names are judged as the DNS gate judges \
            them, before any answer: a name allowed here is still refused an answer that points at \
            the user's network (unless its entry says private), this host, or a cloud metadata \
            service. A model API whose key the sandbox holds is reached through the forwarder too, \
            which this does not judge.\n\n\
            Exit status: 0 when every target is allowed, 1 when one is refused.",
        after_help = "Examples:\n  \
            agent-sandbox policy check claude https://docs.rs/ pypi.org:443\n  \
            agent-sandbox policy check claude 'POST https://api.github.com/gists'\n  \
            agent-sandbox policy check --policy team.yaml https://registry.npmjs.org/ --json\n  \
            agent-sandbox policy check claude --policy more.yaml POST https://api.github.com/graphql --body query.json"
    )]
    Check(PolicyCheckFlags),
}

#[derive(Debug, Args)]
pub struct PolicyCheckFlags {
    /// A running sandbox (its agent, project or container name), then the targets: URLs, `METHOD
    /// URL`, HOST:PORT. Without a sandbox, --policy gives the policy
    #[arg(value_name = "SANDBOX|TARGET", required = true)]
    pub targets: Vec<String>,
    /// Judge with this policy file too (YAML, or a .txt list of domains; repeatable)
    #[arg(long, value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// The body of the requests, for the forwarder rules that read one (GitHub's GraphQL
    /// mutations, git LFS batches)
    #[arg(long, value_name = "FILE")]
    pub body: Option<PathBuf>,
    /// The answers as one JSON array: target, allowed, reason, change
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct UiFlags {
    /// The port on 127.0.0.1 (default: 8750, or a free one if it is taken)
    #[arg(long, value_name = "N")]
    pub port: Option<u16>,
    /// Print the URL, do not open a browser
    #[arg(long)]
    pub no_open: bool,
}

#[derive(Debug, Args)]
pub struct VerifyFlags {
    /// The image to check, as the engine names it; or a running sandbox (its name, agent or
    /// project), whose image is checked with the policy and shape it runs with
    pub image: String,
    /// Check with this policy instead of the image's own (it replaces /etc/agent-sandbox/policy.yaml)
    #[arg(long, value_name = "FILE")]
    pub policy: Option<std::path::PathBuf>,
    /// The scorecard as JSON (docs/verify.schema.json)
    #[arg(long)]
    pub json: bool,
    /// The static probe binary (tests/probe's sandbox-probe)
    #[arg(long, value_name = "FILE")]
    pub probe: Option<std::path::PathBuf>,
    /// Check the image in sidecar mode, as `run --sidecar` makes it: a gateway with the
    /// firewall, the agent's container without any capability
    #[arg(long)]
    pub sidecar: bool,
    /// Sidecar mode with the agent's container under this runtime (runsc: gVisor), as `run
    /// --runtime` makes it
    #[arg(long, value_name = "NAME")]
    pub runtime: Option<String>,
}

#[derive(Debug, Args)]
pub struct K8sFlags {
    /// The agent: an image under images/ (claude, codex, gemini, opencode, kilo, continue, qwen, copilot, aider, vibe, shell)
    pub agent: String,
    /// The resolver the gateway asks for allowed names: the cluster's DNS service, or one
    /// outside. Every container of the pod resolves through the gateway's gate (127.0.0.1)
    #[arg(long, value_name = "IP", required = true)]
    pub dns: std::net::IpAddr,
    /// Add a policy file (YAML, or a .txt list of domains) to the image's (repeatable)
    #[arg(long = "policy", value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// Allow DOMAIN too (repeatable; `*.example.com` for subdomains, `:PORT` for other ports)
    #[arg(long = "allow", value_name = "DOMAIN")]
    pub allow: Vec<String>,
    /// The image the cluster pulls (default: the digest images.lock pins, else the local tag)
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// The objects' name (default: agent-sandbox-AGENT)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// A RuntimeClass for the pod: a VM runtime with a guest kernel (Kata). Not gVisor, which
    /// runs the gateway in its own kernel too, where nftables does not exist
    #[arg(long, value_name = "NAME")]
    pub runtime_class: Option<String>,
    /// A kubernetes-sigs/agent-sandbox SandboxTemplate instead of a Pod
    #[arg(long)]
    pub template: bool,
    /// No Secret of keys (sign in inside the session instead)
    #[arg(long)]
    pub no_key: bool,
    /// Let the agent act without asking (SANDBOX_UNATTENDED=1)
    #[arg(long)]
    pub unattended: bool,
    /// Pass a variable to the agent (NAME=VALUE, or NAME from your environment); not for keys
    #[arg(long = "env", short = 'e', value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// The agent container's memory limit (e.g. 4g, 512m; default 8g)
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
}

#[derive(Debug, Args)]
pub struct RunFlags {
    /// The agent: an image under images/ (claude, codex, gemini, opencode, kilo, continue, qwen, copilot, aider, vibe, shell)
    pub agent: String,
    /// The project folder, mounted at /workspace
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Allow DOMAIN too (repeatable; `*.example.com` for subdomains, `:PORT` for other ports)
    #[arg(long = "allow", value_name = "DOMAIN")]
    pub allow: Vec<String>,
    /// Add a policy file (YAML, or a .txt list of domains) to the image's (repeatable)
    #[arg(long = "policy", value_name = "FILE")]
    pub policy: Vec<PathBuf>,
    /// No network at all (the firewall has nothing to filter)
    #[arg(long)]
    pub offline: bool,
    /// Start it and return, without attaching
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// The image (default: the locally built one, else the digest images.lock pins, pulled; the
    /// lock built in, or the file $AGENT_SANDBOX_IMAGES_LOCK names)
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// The image's platform, linux/amd64 or linux/arm64 (default: the engine's own). Another
    /// runs under the engine's emulation; under qemu-user the firewall cannot be programmed, so
    /// only with --offline
    #[arg(long, value_name = "PLATFORM")]
    pub platform: Option<sandbox_images::platform::Platform>,
    /// The state volume's name, instead of one derived from the agent and the project
    #[arg(long, value_name = "NAME")]
    pub state: Option<String>,
    /// Read a key from FILE instead of the environment (repeatable), e.g. OPENAI_API_KEY=~/key
    #[arg(long = "key-file", value_name = "VAR=FILE")]
    pub key_files: Vec<String>,
    /// Start without a key (sign in inside the session instead)
    #[arg(long)]
    pub no_key: bool,
    /// Copy the host's sign-in files for this agent (e.g. ~/.claude/.credentials.json) into
    /// its state volume; the agent can read what they hold
    #[arg(long)]
    pub login_from_host: bool,
    /// Let the agent act without asking (SANDBOX_UNATTENDED=1: the CLI's own
    /// skip-permissions flag; the sandbox stays the boundary)
    #[arg(long)]
    pub unattended: bool,
    /// Pass a variable to the agent (NAME=VALUE, or NAME from your environment); not for keys
    #[arg(long = "env", short = 'e', value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// CPUs the sandbox may use (default: no limit)
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,
    /// Memory limit (e.g. 4g, 512m; default 8g)
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Most processes the sandbox may have at once (default 2048)
    #[arg(long, value_name = "N")]
    pub pids_limit: Option<i64>,
    /// The Docker network to join (default: the engine's default bridge)
    #[arg(long, value_name = "NAME")]
    pub network: Option<String>,
    /// The resolver the sandbox asks for allowed names (as `docker run --dns`): for a network
    /// with a resolver of its own. Not a loopback address, which the agent could take over
    #[arg(long, value_name = "IP")]
    pub dns: Option<std::net::IpAddr>,
    /// Two containers: a gateway holding the firewall, the keys and the logs (NET_ADMIN), and
    /// the agent's container beside it in its network namespace, with no capability at all.
    /// The agent's container cannot touch the firewall's processes; `stop` removes both
    #[arg(long, conflicts_with = "offline")]
    pub sidecar: bool,
    /// Run the agent's container under this runtime of the engine (`runsc`: gVisor, its own
    /// kernel). Implies --sidecar: the gateway stays on the engine's default runtime, where
    /// nftables works
    #[arg(long, value_name = "NAME", conflicts_with = "offline")]
    pub runtime: Option<String>,
    /// Use this model server (Ollama's http://localhost:11434, or any OpenAI-compatible one on
    /// this host or your network) instead of the agent's cloud API: the sandbox's forwarder alone
    /// reaches its address and port, with the model's requests alone (no pull or push), the
    /// CLI's own settings point at the forwarder, and no key is handed over. One on this host's
    /// loopback is reached through the engine's host gateway (make it listen on the bridge's
    /// address: OLLAMA_HOST=172.17.0.1). Needs --model
    #[arg(long, value_name = "URL", requires = "model", conflicts_with_all = ["offline", "login_from_host"])]
    pub model_server: Option<String>,
    /// The model's name on --model-server, as the server lists it (qwen2.5-coder:7b)
    #[arg(long, value_name = "NAME", requires = "model_server")]
    pub model: Option<String>,
    /// Let the agent write the project's git configuration and hooks, which your own git runs
    /// (as you, on the host) the next time you use it in the project
    #[arg(long)]
    pub writable_git_config: bool,
}

impl RunFlags {
    /// Sidecar mode: asked for, or implied by another runtime for the agent's container.
    pub fn sidecar(&self) -> bool {
        self.sidecar || self.runtime.is_some()
    }

    /// The options that shape a new sandbox, as given: a running one cannot take them.
    pub fn shaping(&self) -> Vec<&'static str> {
        [
            ("--allow", !self.allow.is_empty()),
            ("--policy", !self.policy.is_empty()),
            ("--offline", self.offline),
            ("--image", self.image.is_some()),
            ("--platform", self.platform.is_some()),
            ("--state", self.state.is_some()),
            ("--key-file", !self.key_files.is_empty()),
            ("--no-key", self.no_key),
            ("--login-from-host", self.login_from_host),
            ("--unattended", self.unattended),
            ("--env", !self.env.is_empty()),
            ("--cpus", self.cpus.is_some()),
            ("--memory", self.memory.is_some()),
            ("--pids-limit", self.pids_limit.is_some()),
            ("--network", self.network.is_some()),
            ("--dns", self.dns.is_some()),
            ("--sidecar", self.sidecar),
            ("--runtime", self.runtime.is_some()),
            ("--model-server", self.model_server.is_some()),
            ("--writable-git-config", self.writable_git_config),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

#[derive(Debug, Args)]
pub struct LsFlags {
    /// Everything as one JSON array
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SandboxFlag {
    /// The sandbox: its agent, its project's folder name, or its container name
    pub sandbox: String,
}

#[derive(Debug, Args)]
pub struct AttachFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
}

#[derive(Debug, Args)]
pub struct ExecFlags {
    /// Pass this standard input to the command (without it, the command reads nothing)
    #[arg(long, short = 'i')]
    pub interactive: bool,
    /// Give the command a terminal of its own (needs one here): a shell, a full-screen program
    #[arg(long, short = 't')]
    pub tty: bool,
    #[command(flatten)]
    pub which: SandboxFlag,
    /// The command and its arguments (after `--` when an argument starts with `-`)
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StopFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
}

#[derive(Debug, Args)]
pub struct LogsFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
    /// Keep printing new lines
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct StatusFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
    /// sandbox-status's JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AllowFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
    /// Names to allow (`*.example.com` for subdomains, `:PORT` for other ports)
    #[arg(value_name = "DOMAIN", required_unless_present = "pending")]
    pub domains: Vec<String>,
    /// Allow every name `agent-sandbox pending` lists
    #[arg(long)]
    pub pending: bool,
    /// Approve N names, N being how many: with --pending when there are more than three, or one
    /// under a new site or a forwarded service's site; and a name typed here that is a
    /// forwarded service's other host or a bundle's write host (the refusal says why)
    #[arg(long, value_name = "N")]
    pub yes: Option<usize>,
    /// Give the names this upload budget, bytes an hour (64MB, 1GiB): raises a spent budget
    /// that `pending` lists (never lowers one: the largest of a name's entries holds)
    #[arg(long, value_name = "SIZE", conflicts_with = "pending")]
    pub upload: Option<String>,
}

#[derive(Debug, Args)]
pub struct DenyFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
    /// Names `allow` gave (as written there)
    #[arg(value_name = "DOMAIN", required = true)]
    pub domains: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PendingFlags {
    #[command(flatten)]
    pub which: SandboxFlag,
    /// Empty the queue without allowing anything
    #[arg(long)]
    pub dismiss: bool,
    /// The queue as JSON
    #[arg(long)]
    pub json: bool,
}
