//! `cargo xtask test`: build what the suites need, then run them with cargo-nextest, in one run.
//! Where a test sits says what it needs and in which shape it runs (tests/src/place.rs): the
//! container suites are `package(sandbox-tests) & kind(test)`; of them, those that give a
//! container NET_ADMIN are under `net_admin::<shape>::`, generated once per shape; everything
//! else starts no container. One nextest run schedules every test of every shape in one pool,
//! with one tail, and writes JUnit with each test's time (`target/nextest/<profile>/junit.xml`).

use std::path::Path;

use anyhow::Context as _;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};
use crate::flags::{TestFlags, TestShape};

/// The tests that start no container: every crate's unit tests, tidy, the snapshots, the
/// harness's own; all but the container suites' binary.
pub const PURE: &str = "not (package(sandbox-tests) & kind(test))";

/// The container suites, but what only `--arm64` runs.
pub const CONTAINERS: &str = "package(sandbox-tests) & kind(test) & not test(/^arm64::release::/)";

/// The tests that give a container NET_ADMIN (`cargo xtask test --ci` leaves them out: the `ci`
/// profile's default-filter in .config/nextest.toml says the same).
pub const NET_ADMIN: &str = "test(/::net_admin::/)";

/// Tells the suites that this run removes their shared sandboxes after it
/// (`SandboxSpec::start_shared`), so they may share them; its value is the pid of the xtask that
/// owns the run.
pub const SHARED_ENV: &str = "AGENT_SANDBOX_TEST_SHARED";
/// The label of a sandbox the tests of one nextest run share; its value `PID-RUN`, the owning
/// xtask's pid and the run's id, so that a run started beside it leaves it alone.
pub const SHARED_LABEL: &str = "io.github.agent-sandbox.test.shared";

/// What `--arm64` runs: the arm64 chain's suite, its release part included.
pub const ARM64_SUITES: &str = "package(sandbox-tests) & test(/^arm64::/)";

/// The images every CI run builds for arm64 as well (under emulation on an amd64 machine), whose
/// contract `arm64::` checks: the shell image's chain, os and base with it. Base dominates it
/// (apt and dpkg under qemu-user); an agent's chain adds its own minutes to a cold run and
/// proves a Dockerfile's pins for the platform, which the publish workflow's `--arm64` proves
/// before anything is pushed ([`ARM64_RELEASE_IMAGES`]).
pub const EMULATED_IMAGES: &[&str] = &["shell"];

/// What `cargo xtask test --arm64` builds for arm64: the shell's chain and claude's, an npm
/// agent's, whose contract `arm64::release::claude::` checks.
pub const ARM64_RELEASE_IMAGES: &[&str] = &["shell", "claude"];

impl TestFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        run(root, self).await
    }
}

/// The filterset and profile a run of `flags` takes.
fn selection(flags: &TestFlags) -> (String, &'static str) {
    match (flags.pure, flags.ci, flags.shape) {
        (true, ..) => (PURE.to_string(), "pure"),
        (_, true, _) => (format!("not {NET_ADMIN} & not test(/^arm64::release::/)"), "ci"),
        (_, _, Some(shape)) => (format!("{CONTAINERS} & {}", shape_filter(shape)), "default"),
        _ => ("not test(/^arm64::release::/)".to_string(), "default"),
    }
}

/// The tests of one shape: `net_admin::<shape>::`.
pub fn shape_filter(shape: TestShape) -> String {
    format!("test(/::net_admin::{}::/)", shape_name(shape))
}

pub fn shape_name(shape: TestShape) -> &'static str {
    match shape {
        TestShape::Single => "single",
        TestShape::Sidecar => "sidecar",
        TestShape::Gvisor => "gvisor",
    }
}

async fn run(root: &Path, flags: TestFlags) -> anyhow::Result<()> {
    let mut opts = BuildOptions::new(root);
    flags.common.apply(&mut opts);
    if flags.arm64 {
        return run_arm64(root, flags, opts).await;
    }
    let (filter, profile) = selection(&flags);
    let sh = if flags.pure {
        let sh = Shell::new()?;
        sh.change_dir(root);
        sh
    } else {
        eprintln!("building the images the suites use");
        let sh = build_for_suites(root, &mut opts).await?;
        // The launcher's suite runs the real binary: built once here rather than by the first
        // test of each test process, which would hold their slots while it compiles.
        cmd!(sh, "cargo build --quiet --package agent-sandbox")
            .run()
            .context("cannot build agent-sandbox")?;
        launcher_for_suites(&sh, root);
        // The peers' and sandboxes' probe likewise.
        probe_for_suites(&sh, root)?;
        warn_without_runsc(&flags).await?;
        sh
    };
    run_nextest(&sh, profile, &filter, &flags.nextest_args)
}

/// Runs `cargo nextest run` over `filter` with `profile`, and says where its JUnit report is. The
/// sandboxes its tests shared are removed after it, however it ended (on Ctrl-C the engine
/// keeps them until the next run, which removes them first).
pub fn run_nextest(sh: &Shell, profile: &str, filter: &str, args: &[String]) -> anyhow::Result<()> {
    remove_shared(false);
    let _shared = sh.push_env(SHARED_ENV, std::process::id().to_string());
    let result = cmd!(sh, "cargo nextest run --workspace --profile {profile} -E {filter} {args...}")
        .run()
        .with_context(|| format!("the tests failed (profile {profile}, {filter})"));
    remove_shared(true);
    let junit = junit_path(sh.current_dir().as_path(), profile);
    if junit.exists() {
        eprintln!("JUnit report, with each test's time: {}", junit.display());
    }
    result
}

/// Removes the sandboxes and the worlds runs' tests shared (containers, then networks), from
/// a thread of its own (callers are in the runtime already): this process's runs' when `own`,
/// else those whose xtask is gone (interrupted by Ctrl-C), never those of a run beside this one.
fn remove_shared(own: bool) {
    let _ = std::thread::spawn(move || {
        let remove =
            |value: &str| if own { owner(value) == Some(std::process::id()) } else { abandoned(value) };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        runtime.block_on(async {
            let engine = crate::engine::Engine::connect().await.ok()?;
            engine.remove_containers_labelled(SHARED_LABEL, remove).await.ok()?;
            engine.remove_networks_labelled(SHARED_LABEL, remove).await.ok()
        })
    })
    .join();
}

/// The pid of the xtask that owns a shared run's label value (`PID-RUN`).
fn owner(value: &str) -> Option<u32> {
    value.split_once('-')?.0.parse().ok()
}

/// Whether what a run shared outlived it: its owner is gone (or is this process, a pid used
/// again), or its value has no owner (an older xtask's).
fn abandoned(value: &str) -> bool {
    match owner(value) {
        Some(pid) => pid == std::process::id() || !Path::new(&format!("/proc/{pid}")).exists(),
        None => true,
    }
}

/// Where a run with `profile` writes its JUnit report.
pub fn junit_path(root: &Path, profile: &str) -> std::path::PathBuf {
    root.join("target/nextest").join(profile).join("junit.xml")
}

/// The gVisor tests need the engine's runsc: without it they fail, each naming the runtime; this
/// says so once, before the run.
async fn warn_without_runsc(flags: &TestFlags) -> anyhow::Result<()> {
    if flags.ci || flags.shape.is_some_and(|s| s != TestShape::Gvisor) {
        return Ok(());
    }
    let runtimes = crate::engine::Engine::connect().await?.runtimes().await?;
    if !runtimes.iter().any(|r| r == crate::gvisor::RUNTIME) {
        let how = "`cargo xtask setup --tests` installs and registers it";
        if flags.shape == Some(TestShape::Gvisor) {
            anyhow::bail!("the engine has no runsc runtime: {how}");
        }
        eprintln!("WARNING: the engine has no runsc runtime, so net_admin::gvisor:: tests will fail ({how})");
    }
    Ok(())
}

/// Builds what `opts` names and returns a shell in `root` for the suites, with [`suites_env`].
pub async fn build_for_suites(root: &Path, opts: &mut BuildOptions) -> anyhow::Result<Shell> {
    let report = build::build(opts).await?;
    report.ensure_success()?;
    let sh = Shell::new()?;
    sh.change_dir(root);
    for (name, value) in suites_env(opts, &report) {
        sh.set_var(name, value);
    }
    Ok(sh)
}

/// What the suites are given of a build (`report`, of `opts`): its settings, with the OS source
/// pinned to the one just used (set in `opts`), so that they find these images up to date
/// instead of building others; and, for the host's, the images' ids
/// ([`crate::project::SUITE_IMAGES_ENV`]).
pub fn suites_env(opts: &mut BuildOptions, report: &build::BuildReport) -> Vec<(&'static str, String)> {
    opts.os_source = Some(report.os_source);
    let mut env = opts.export_env();
    if opts.platform == crate::platform::Platform::host() {
        env.push((crate::project::SUITE_IMAGES_ENV, report.suite_images()));
    }
    env
}

/// Builds the probe (or finds it built) and gives its path to the suites through `sh`
/// ([`crate::project::PROBE_ENV`]): built here, not by a test holding a slot (its release
/// build takes a minute), and found by no test again.
pub fn probe_for_suites(sh: &Shell, root: &Path) -> anyhow::Result<()> {
    let probe = crate::project::probe_binary(sh, root)?;
    sh.set_var(crate::project::PROBE_ENV, probe);
    Ok(())
}

/// Gives the suites the path of the launcher just built ([`crate::project::LAUNCHER_ENV`]): each
/// test process that runs it would otherwise ask cargo whether it is fresh (a third of a
/// CPU-second, about 60 times a run). The dev and test profiles both build into `debug/`.
pub fn launcher_for_suites(sh: &Shell, root: &Path) {
    // Absolute: the tests run in their package's folder, and CARGO_TARGET_DIR may be relative.
    let built = root.join(crate::project::target_dir(root)).join("debug").join("agent-sandbox");
    sh.set_var(crate::project::LAUNCHER_ENV, built);
}

/// `--arm64`: the arm64 chain ([`ARM64_RELEASE_IMAGES`]), built under
/// emulation, then `arm64::`, its release part (the VM) included.
async fn run_arm64(root: &Path, flags: TestFlags, mut opts: BuildOptions) -> anyhow::Result<()> {
    crate::emulation::ensure(crate::platform::Platform::Arm64)?;
    opts.platform = crate::platform::Platform::Arm64;
    opts.images = ARM64_RELEASE_IMAGES.iter().map(|i| i.to_string()).collect();
    eprintln!(
        "building the arm64 chain of {} (every build step under qemu-user)",
        ARM64_RELEASE_IMAGES.join(", ")
    );
    let sh = build_for_suites(root, &mut opts).await?;
    run_nextest(&sh, "default", ARM64_SUITES, &flags.nextest_args).context("the arm64 suites failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run shared is removed by its own xtask, or once that xtask is gone; a run beside
    /// it on the same engine (another checkout, another filter) leaves it alone.
    #[test]
    fn a_shared_run_is_removed_only_once_its_xtask_is_gone() {
        let me = std::process::id();
        assert_eq!(owner(&format!("{me}-7abca64f")), Some(me));
        // PID 1 runs for as long as the machine does: a live run's.
        assert!(!abandoned("1-7abca64f"));
        assert!(abandoned(&format!("{}-7abca64f", u32::MAX)), "no such process");
        assert!(abandoned(&format!("{me}-7abca64f")), "this process's pid, from an earlier run");
        assert!(abandoned("7abca64f"), "an older xtask's value, with no owner");
    }

    /// The ci profile's default-filter is the filter `--ci` runs: one expression, kept the same
    /// in both places.
    #[test]
    fn the_ci_profile_leaves_out_what_needs_net_admin_and_the_arm64_vm() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let toml = std::fs::read_to_string(root.join(".config/nextest.toml")).unwrap();
        let ci = toml.split("\n[profile.ci]\n").nth(1).expect("a ci profile");
        let line = ci.lines().find_map(|l| l.strip_prefix("default-filter = ")).expect("a default-filter");
        let flags = |args: &[&str]| {
            use clap::Parser as _;
            let argv = [&["cargo xtask", "test"][..], args].concat();
            match crate::flags::Xtask::try_parse_from(argv).unwrap().command {
                crate::flags::Command::Test(flags) => flags,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(line.trim_matches('"'), selection(&flags(&["--ci"])).0);
        assert_eq!(selection(&flags(&[])).0, "not test(/^arm64::release::/)");
        assert_eq!(selection(&flags(&["--pure"])), (PURE.to_string(), "pure"));
        assert_eq!(shape_filter(TestShape::Sidecar), "test(/::net_admin::sidecar::/)");
    }
}
