//! `cargo xtask test`: build what the suites need, then run them with cargo-nextest.

use std::path::Path;

use anyhow::Context as _;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};
use crate::flags::{TestFlags, TestShape};

/// Tells the suites which mode they run in: `full` (containers may get NET_ADMIN) or `ci`.
pub const MODE_ENV: &str = "AGENT_SANDBOX_TEST_MODE";

impl TestFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        run(root, self).await
    }
}

/// What `--arm64` runs: the arm64 chain's suite, its release part included.
pub const ARM64_SUITES: &str = "package(sandbox-tests) & test(/^arm64::/)";

/// What only `--arm64` runs: left out of the other passes for its time and its needs (shell's
/// firewall in a real arm64 kernel, booted under qemu-system-aarch64: about two minutes of both
/// cores, as root).
pub const ARM64_RELEASE_SUITES: &str = "test(/^arm64::release::/)";

async fn run(root: &Path, flags: TestFlags) -> anyhow::Result<()> {
    let mut opts = BuildOptions::new(root);
    flags.common.apply(&mut opts);
    if flags.arm64 {
        return run_arm64(root, flags, opts).await;
    }
    eprintln!("building the images the suites use");
    let (mode, profile) = if flags.ci { ("ci", "ci") } else { ("full", "default") };
    let sh = build_for_suites(root, &mut opts, mode).await?;
    // The launcher's suite runs the real binary: built once here rather than by the first test
    // of each test process, which would hold their slots while it compiles.
    cmd!(sh, "cargo build --quiet --package agent-sandbox").run().context("cannot build agent-sandbox")?;
    let args = &flags.nextest_args;
    let every = !flags.ci && args.is_empty() && flags.shape.is_none();
    let (single, sidecar, gvisor) = match flags.shape {
        Some(TestShape::Single) => (true, false, false),
        Some(TestShape::Sidecar) => (false, true, false),
        Some(TestShape::Gvisor) => (false, false, true),
        // Asked for particular tests: those, once.
        None => (true, every, every),
    };
    // Asked of the engine only for a run that has a gVisor pass.
    let has_runsc = gvisor
        && crate::engine::Engine::connect()
            .await?
            .runtimes()
            .await?
            .iter()
            .any(|r| r == crate::gvisor::RUNTIME);
    if gvisor && !has_runsc {
        let how = "`cargo xtask setup --tests` installs and registers it";
        if flags.shape == Some(TestShape::Gvisor) {
            anyhow::bail!("the engine has no runsc runtime: {how}");
        }
        eprintln!("WARNING: the gVisor pass does not run: the engine has no runsc runtime ({how})");
    }
    let mut result = Ok(());
    if single {
        let only: Vec<String> =
            if flags.net_admin_only { vec!["-E".into(), net_admin_suites(root)?] } else { Vec::new() };
        result = cmd!(sh, "cargo nextest run --workspace --profile {profile} {only...} {args...}")
            .run()
            .with_context(|| format!("the {mode} suites failed"));
    }
    if sidecar {
        eprintln!("the network suites again, as sidecar mode's pair ({SHAPE_ENV}=sidecar)");
        let _shape = sh.push_env(SHAPE_ENV, "sidecar");
        // Without arguments, the suites that prove the network; with them, what they select.
        let filter: Vec<&str> = if args.is_empty() { vec!["-E", SIDECAR_SUITES] } else { vec![] };
        let second = cmd!(sh, "cargo nextest run --workspace --profile {profile} {filter...} {args...}")
            .run()
            .context("the network suites failed in sidecar mode");
        result = result.and(second);
    }
    if gvisor && has_runsc {
        eprintln!("the firewall's suites again, the agent's container under gVisor ({RUNTIME_ENV}=runsc)");
        let _shape = sh.push_env(SHAPE_ENV, "sidecar");
        let _runtime = sh.push_env(RUNTIME_ENV, crate::gvisor::RUNTIME);
        let filter: Vec<&str> = if args.is_empty() { vec!["-E", GVISOR_SUITES] } else { vec![] };
        let third = cmd!(sh, "cargo nextest run --workspace --profile {profile} {filter...} {args...}")
            .run()
            .context("the firewall's suites failed with the agent under gVisor");
        result = result.and(third);
    }
    let junit = root.join("target/nextest").join(profile).join("junit.xml");
    if junit.exists() {
        eprintln!("JUnit report: {}", junit.display());
    }
    result
}

/// Builds what `opts` names and returns a shell in `root` for the suites: the build's settings
/// exported, with the OS source pinned to the one just used, so that the suites find these
/// images up to date instead of building others; `mode` is the suites' mode.
async fn build_for_suites(root: &Path, opts: &mut BuildOptions, mode: &str) -> anyhow::Result<Shell> {
    let report = build::build(opts).await?;
    report.ensure_success()?;
    opts.os_source = Some(report.os_source);
    let sh = Shell::new()?;
    sh.change_dir(root);
    for (name, value) in opts.export_env() {
        sh.set_var(name, value);
    }
    sh.set_var(MODE_ENV, mode);
    Ok(sh)
}

/// `--arm64`: the arm64 chain every CI run builds ([`crate::ci::EMULATED_IMAGES`]), built under
/// emulation, then `arm64::`, its release part (the VM) included.
async fn run_arm64(root: &Path, flags: TestFlags, mut opts: BuildOptions) -> anyhow::Result<()> {
    crate::emulation::ensure(crate::platform::Platform::Arm64)?;
    opts.platform = crate::platform::Platform::Arm64;
    opts.images = crate::ci::EMULATED_IMAGES.iter().map(|i| i.to_string()).collect();
    eprintln!(
        "building the arm64 chain of {} (every build step under qemu-user)",
        crate::ci::EMULATED_IMAGES.join(", ")
    );
    let sh = build_for_suites(root, &mut opts, "ci").await?;
    let args = &flags.nextest_args;
    cmd!(sh, "cargo nextest run --workspace --profile default -E {ARM64_SUITES} {args...}")
        .run()
        .context("the arm64 suites failed")
}

/// What `--ci` leaves out, as a nextest filterset: the `ci` profile's default-filter in
/// .config/nextest.toml (`not (…)`, the one list of the suites that need NET_ADMIN), inverted;
/// less what only `--arm64` runs, which the ci profile leaves out too.
pub fn net_admin_suites(root: &Path) -> anyhow::Result<String> {
    let path = root.join(".config/nextest.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let inverted = inverted_ci_filter(&text).with_context(|| {
        format!("{}: [profile.ci] has no `default-filter = \"not (…)\"` line", path.display())
    })?;
    Ok(format!("({inverted}) & not {ARM64_RELEASE_SUITES}"))
}

fn inverted_ci_filter(nextest_toml: &str) -> Option<String> {
    let ci = nextest_toml.split("\n[profile.ci]\n").nth(1)?;
    let section = ci.split("\n[").next()?;
    let line = section.lines().find_map(|l| l.trim().strip_prefix("default-filter = \""))?;
    let filter = line.strip_suffix('"')?.strip_prefix("not (")?.strip_suffix(')')?;
    Some(filter.to_string())
}

/// Tells the suites to run sidecar mode's agent containers under this runtime (`runsc`).
pub const RUNTIME_ENV: &str = "AGENT_SANDBOX_TEST_RUNTIME";

/// The suites run with the agent under gVisor: what the firewall proves from the agent's side
/// (names::'s gigabyte and thousand connections, and the launcher's, run under gVisor by hand;
/// docs/sidecar.md).
pub const GVISOR_SUITES: &str = "package(sandbox-tests) & (test(/^firewall::/) | test(/^keys::/) | test(/^attacks::network::/) | test(/^attacks::sidecar::/) | test(/^attacks::verify::/))";

/// Tells the suites to start every sandbox with NET_ADMIN as sidecar mode's pair.
pub const SHAPE_ENV: &str = "AGENT_SANDBOX_TEST_SHAPE";

/// The suites run in both shapes: everything the firewall, the name check and the held keys
/// prove from the agent's side, and the launcher's commands on a sandbox with a network. `attacks::sidecar::` starts its pairs itself, in the first pass.
pub const SIDECAR_SUITES: &str = "package(sandbox-tests) & (test(/^firewall::/) | test(/^names::/) | test(/^keys::/) | test(/^attacks::network::/) | test(/^attacks::verify::/) | test(/^launcher::net_admin_/))";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_net_admin_suites_are_the_ci_profiles_filter_inverted() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let only = net_admin_suites(root).unwrap();
        for suite in ["firewall::", "agents::", "attacks::(approvals|network", "podman::"] {
            assert!(only.contains(suite), "{suite} not in {only}");
        }
        assert!(only.starts_with("(package(sandbox-tests) & ("), "{only}");
        assert!(only.ends_with(&format!(") & not {ARM64_RELEASE_SUITES}")), "{only}");
        assert!(only.contains(ARM64_RELEASE_SUITES), "the ci profile leaves it out too: {only}");
        assert_eq!(only.matches('(').count(), only.matches(')').count(), "{only}");
        let toml = "[profile.default]\nx = 1\n\n[profile.ci]\nfail-fast = false\ndefault-filter = \"not (test(/^a::/))\"\n\n[profile.ci.junit]\n";
        assert_eq!(inverted_ci_filter(toml).as_deref(), Some("test(/^a::/)"));
        assert_eq!(inverted_ci_filter("[profile.ci]\ndefault-filter = \"test(a)\"\n"), None);
        assert_eq!(inverted_ci_filter("[profile.default]\n"), None);
    }
}
