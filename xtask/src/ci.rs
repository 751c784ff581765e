//! `cargo xtask ci`: what CI checks, in one command and one order, so that `.ci/run` and the
//! GitHub workflow cannot drift apart: fmt, clippy, the build, images.lock unchanged by it, and
//! the suites in both modes. It stops at the first step that fails and says which.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::ValueEnum as _;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};
use crate::platform::Platform;
use crate::progress::ProgressMode;

use crate::flags::{CiFlags, CiStep, TestFlags};

/// The images every CI run builds for arm64 as well (under emulation on an amd64 machine) and
/// whose contract `arm64::` checks (`cargo xtask test --arm64` builds them too): the shell
/// image and one npm agent, claude. Every build step
/// of the chain runs under qemu-user (base's apt, dpkg and perl for most of the time), on a
/// thread of its own beside the host's build and the first steps.
pub const EMULATED_IMAGES: &[&str] = &["shell", "claude"];

/// The arm64 walk, started with the run and awaited by the build step.
type Pending =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<build::BuildReport>> + Send>>;

impl CiFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let steps: Vec<CiStep> =
            CiStep::value_variants().iter().copied().filter(|step| !self.skip.contains(step)).collect();
        let mut times: Vec<(CiStep, Duration)> = Vec::new();
        // The arm64 chain waits on emulated build steps for minutes: it starts now, on a thread
        // of its own (its cross build in a target folder of its own), beside fmt, clippy and the
        // host's build, and the build step waits for it.
        let mut arm64: Option<Pending> =
            (steps.contains(&CiStep::Build) && Platform::host() != Platform::Arm64).then(|| {
                let mut opts = self.build_options(root);
                opts.platform = Platform::Arm64;
                opts.images = EMULATED_IMAGES.iter().map(|i| i.to_string()).collect();
                opts.jobs = 1;
                Box::pin(build::spawn_build(opts)) as Pending
            });
        for (n, step) in steps.iter().enumerate() {
            eprintln!("==> ci [{}/{}] {}", n + 1, steps.len(), describe(*step));
            let started = Instant::now();
            let result = self.step(*step, root, &mut arm64).await;
            times.push((*step, started.elapsed()));
            if let Err(e) = result {
                eprintln!("{}", summary(&times));
                let rest: Vec<String> = steps[n + 1..].iter().map(|s| name(*s)).collect();
                let rest = if rest.is_empty() {
                    String::new()
                } else {
                    format!(" ({} did not run)", rest.join(", "))
                };
                return Err(e.context(format!("ci: step `{}` failed{rest}", name(*step))));
            }
        }
        eprintln!("{}", summary(&times));
        Ok(())
    }

    /// The build's options as the run's flags give them, progress as plain lines (a log).
    fn build_options(&self, root: &Path) -> BuildOptions {
        let mut opts = BuildOptions::new(root);
        self.common.apply(&mut opts);
        if opts.progress == ProgressMode::Auto {
            opts.progress = ProgressMode::Plain;
        }
        opts
    }

    async fn step(&self, step: CiStep, root: &Path, arm64: &mut Option<Pending>) -> anyhow::Result<()> {
        let sh = Shell::new()?;
        let _dir = sh.push_dir(root);
        match step {
            CiStep::Fmt => cmd!(sh, "cargo fmt --all -- --check").run().context("cargo fmt: run `cargo fmt --all`")?,
            CiStep::Clippy => cmd!(sh, "cargo clippy --workspace --all-targets -- -D warnings").run()?,
            CiStep::Build => {
                let host = build::build(&self.build_options(root)).await;
                let other = match arm64.take() {
                    Some(walk) => Some(walk.await),
                    None => None,
                };
                host?.ensure_success()?;
                if let Some(other) = other {
                    other.context("the arm64 chain")?.ensure_success()?;
                }
            }
            CiStep::Lock => cmd!(sh, "git diff --exit-code -- images.lock").run().context(
                "the build changed images.lock: commit what `cargo xtask build` recorded with the change that caused it",
            )?,
            CiStep::Test | CiStep::TestCi => {
                // The NET_ADMIN suites in every shape, then the rest once, without any
                // capability: no test runs twice in one shape.
                let flags = TestFlags {
                    ci: step == CiStep::TestCi,
                    shape: None,
                    net_admin_only: step == CiStep::Test,
                    arm64: false,
                    common: self.common.clone(),
                    nextest_args: Vec::new(),
                };
                flags.run(root).await?;
            }
        }
        Ok(())
    }
}

/// The step's name, as `--skip` takes it.
fn name(step: CiStep) -> String {
    step.to_possible_value().expect("every step has a name").get_name().to_string()
}

fn describe(step: CiStep) -> &'static str {
    match step {
        CiStep::Fmt => "fmt: cargo fmt --all -- --check",
        CiStep::Clippy => "clippy: cargo clippy --workspace --all-targets -- -D warnings",
        CiStep::Build => "build: every image, and the arm64 chain of shell and claude (under emulation)",
        CiStep::Lock => "lock: images.lock unchanged by the build",
        CiStep::Test => "test: the suites, NET_ADMIN allowed",
        CiStep::TestCi => "test-ci: the suites that need no capability (JUnit)",
    }
}

/// Each step run and its time, as one line each.
fn summary(times: &[(CiStep, Duration)]) -> String {
    let mut text = String::from("ci steps:");
    for (step, time) in times {
        text.push_str(&format!("\n  {:<8} {:>6.0} s", name(*step), time.as_secs_f64()));
    }
    let total: Duration = times.iter().map(|(_, t)| *t).sum();
    text.push_str(&format!("\n  {:<8} {:>6.0} s", "total", total.as_secs_f64()));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_lists_each_step_and_the_total() {
        assert_eq!(
            summary(&[(CiStep::Fmt, Duration::from_secs(2)), (CiStep::TestCi, Duration::from_secs(61))]),
            "ci steps:\n  fmt           2 s\n  test-ci      61 s\n  total        63 s"
        );
    }
}
