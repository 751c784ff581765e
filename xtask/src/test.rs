//! `cargo xtask test`: build what the suites need, then run them with cargo-nextest.

use std::path::Path;

use anyhow::Context as _;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};
use crate::flags::TestFlags;

/// Tells the suites which mode they run in: `full` (containers may get NET_ADMIN) or `ci`.
pub const MODE_ENV: &str = "AGENT_SANDBOX_TEST_MODE";

impl TestFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        run(root, self).await
    }
}

async fn run(root: &Path, flags: TestFlags) -> anyhow::Result<()> {
    let mut opts = BuildOptions::new(root);
    flags.common.apply(&mut opts);
    eprintln!("building the images the suites use");
    let report = build::build(&opts).await?;
    report.ensure_success()?;
    // The suites resolve the same build settings, so they reuse these images instead of
    // building others: the OS source is pinned to the one just used.
    opts.os_source = Some(report.os_source);

    let sh = Shell::new()?;
    let _dir = sh.push_dir(root);
    let _guards: Vec<_> = opts.export_env().into_iter().map(|(k, v)| sh.push_env(k, v)).collect();
    let (mode, profile) = if flags.ci { ("ci", "ci") } else { ("full", "default") };
    let _mode = sh.push_env(MODE_ENV, mode);
    // The launcher's suite runs the real binary: built once here rather than by the first test
    // of each test process, which would hold their slots while it compiles.
    cmd!(sh, "cargo build --quiet --package agent-sandbox").run().context("cannot build agent-sandbox")?;
    let args = &flags.nextest_args;
    let result = cmd!(sh, "cargo nextest run --workspace --profile {profile} {args...}")
        .run()
        .with_context(|| format!("the {mode} suites failed"));
    let junit = root.join("target/nextest").join(profile).join("junit.xml");
    if junit.exists() {
        eprintln!("JUnit report: {}", junit.display());
    }
    result
}
