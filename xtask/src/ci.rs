//! `cargo xtask ci`: what CI checks, in one command and one order, so that `.ci/run` and the
//! GitHub workflow cannot drift apart: fmt, clippy, the tests that start no container (seconds,
//! and a failure stops the run there), the build, images.lock unchanged by it, and the container
//! suites in one nextest run, every shape in one pool. It stops at the first step that fails
//! and says which; at its end (or its failure) it prints each step's time, how many tests ran in
//! each place, and the slowest tests, read from the runs' JUnit reports.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::ValueEnum as _;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};
use crate::platform::Platform;
use crate::progress::ProgressMode;
use crate::test::{CONTAINERS, EMULATED_IMAGES, PURE, junit_path, run_nextest};

use crate::flags::{CiFlags, CiStep};

/// How many of the slowest tests the summary names.
const SLOWEST: usize = 15;

/// The arm64 walk, started with the run: awaited by the build step if it is done by then, else
/// after the container suites (its images are arm64::'s alone).
type Pending =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<build::BuildReport>> + Send>>;

/// What the steps hand on to the next.
#[derive(Default)]
struct State {
    /// The arm64 walk, while it runs.
    arm64: Option<Pending>,
    /// The static binaries' build, until the build step joins it.
    binaries: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    /// The suites' environment, from the build step.
    env: Vec<(String, String)>,
    /// Whether the container suites follow the build: the arm64 walk may then go on beside them
    /// (the test step, last of all, then sees it end, or the run's failure waits for it).
    suites_follow: bool,
    /// The lock step found the arm64 walk still running: the lock is checked once it is done.
    lock_deferred: bool,
}

/// Where the arm64 tests' JUnit report is kept when they run after the other suites, beside the
/// first run's (`junit.xml`), for the summary.
const ARM64_JUNIT: &str = "junit-arm64.xml";

impl CiFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let steps: Vec<CiStep> =
            CiStep::value_variants().iter().copied().filter(|step| !self.skip.contains(step)).collect();
        let mut times: Vec<(CiStep, Duration)> = Vec::new();
        // The arm64 chain waits on emulated build steps for minutes (on a cold machine base's
        // package step alone takes nine, one core's work): it starts now, on a thread of its own
        // (its cross build in a target folder of its own), beside fmt, clippy, the pure tests,
        // the host's build and, if it is still running then, the container suites.
        let mut state = State {
            arm64: (steps.contains(&CiStep::Build) && Platform::host() != Platform::Arm64).then(|| {
                let mut opts = self.build_options(root);
                opts.platform = Platform::Arm64;
                opts.images = EMULATED_IMAGES.iter().map(|i| i.to_string()).collect();
                opts.jobs = 1;
                Box::pin(build::spawn_build(opts)) as Pending
            }),
            // The static binaries the build step and the suites need, from the start as well.
            binaries: steps.contains(&CiStep::Build).then(|| spawn_static_binaries(root)),
            suites_follow: steps.contains(&CiStep::Test),
            ..State::default()
        };
        // A report of an earlier run is never summarised as this one's.
        if steps.contains(&CiStep::Test) {
            let junit = junit_path(root, "default");
            for stale in [junit.clone(), junit.with_file_name(ARM64_JUNIT)] {
                let _ = std::fs::remove_file(stale);
            }
        }
        for (n, step) in steps.iter().enumerate() {
            eprintln!("==> ci [{}/{}] {}", n + 1, steps.len(), describe(*step));
            let started = Instant::now();
            let result = self.step(*step, root, &mut state).await;
            times.push((*step, started.elapsed()));
            if let Err(e) = result {
                // The walk cannot be stopped mid-step (the engine goes on building): waited for,
                // and said, rather than holding the exit silently.
                if state.arm64.is_some() {
                    eprintln!("==> waiting for the arm64 chain's build to end before exiting");
                    if let Err(arm64) = finish_arm64(root, &mut state).await {
                        eprintln!("{arm64:#}");
                    }
                }
                eprintln!("{}", summary(&times, root));
                let rest: Vec<String> = steps[n + 1..].iter().map(|s| name(*s)).collect();
                let rest = if rest.is_empty() {
                    String::new()
                } else {
                    format!(" ({} did not run)", rest.join(", "))
                };
                return Err(e.context(format!("ci: step `{}` failed{rest}", name(*step))));
            }
        }
        eprintln!("{}", summary(&times, root));
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

    async fn step(&self, step: CiStep, root: &Path, state: &mut State) -> anyhow::Result<()> {
        let sh = Shell::new()?;
        let _dir = sh.push_dir(root);
        // Every build of the workspace in the run lints as it compiles, so that each finds the
        // last one's artifacts fresh (the wrapper is part of cargo's fingerprint).
        for (name, value) in lint_env()? {
            sh.set_var(name, value);
        }
        match step {
            CiStep::Fmt => {
                cmd!(sh, "cargo fmt --all -- --check").run().context("cargo fmt: run `cargo fmt --all`")?
            }
            CiStep::Clippy => lint_build(&sh)?,
            CiStep::Pure => run_nextest(&sh, "pure", PURE, &[])?,
            CiStep::Build => {
                if let Some(binaries) = state.binaries.take() {
                    binaries
                        .join()
                        .map_err(|_| anyhow::anyhow!("the static binaries' build panicked"))?
                        .context("the static binaries (sandbox-init, sandbox-probe)")?;
                }
                let mut opts = self.build_options(root);
                let host = build::build(&opts).await;
                // Done already (its images up to date, as on a warm machine): judged now. Else,
                // with the suites to follow, it goes on beside them; without, it is waited for.
                // The host's result is judged first: its error is the one reported.
                let mut other = None;
                if let Some(mut walk) = state.arm64.take() {
                    let polled =
                        std::future::poll_fn(|cx| std::task::Poll::Ready(walk.as_mut().poll(cx))).await;
                    match polled {
                        std::task::Poll::Ready(done) => other = Some(done),
                        std::task::Poll::Pending
                            if state.suites_follow
                                && host.as_ref().is_ok_and(|h| h.ensure_success().is_ok()) =>
                        {
                            eprintln!(
                                "==> the arm64 chain goes on under emulation beside the container suites; \
                                 images.lock and arm64:: wait for it"
                            );
                            state.arm64 = Some(walk);
                        }
                        std::task::Poll::Pending => other = Some(walk.await),
                    }
                }
                let host = host?;
                host.ensure_success()?;
                if let Some(other) = other {
                    other.context("the arm64 chain")?.ensure_success()?;
                }
                // The suites find these images up to date: the same settings, the OS source
                // pinned to the one just used, and their ids.
                let suites = crate::test::suites_env(&mut opts, &host);
                state.env = suites.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            }
            CiStep::Lock if state.arm64.is_some() => {
                eprintln!("images.lock is checked once the arm64 chain is built, after the container suites");
                state.lock_deferred = true;
            }
            CiStep::Lock => check_lock(&sh)?,
            CiStep::Test => {
                let env = &mut state.env;
                if env.is_empty() {
                    // The build step was skipped: the suites' own settings, as `cargo xtask
                    // test` would build them.
                    let mut opts = self.build_options(root);
                    let report = build::build(&opts).await?;
                    report.ensure_success()?;
                    let suites = crate::test::suites_env(&mut opts, &report);
                    *env = suites.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                }
                for (name, value) in env.iter() {
                    sh.set_var(name, value);
                }
                // The launcher's suite runs the real binary, and the suites' peers the probe:
                // both built here (fresh from the steps before), not by a test holding a slot.
                lint_build(&sh)?;
                crate::test::launcher_for_suites(&sh, root);
                crate::test::probe_for_suites(&sh, root)?;
                if state.arm64.is_none() {
                    return run_nextest(&sh, "default", CONTAINERS, &[]);
                }
                // The arm64 chain still builds: its tests run once it is done, after the others.
                run_nextest(&sh, "default", &format!("{CONTAINERS} & not test(/^arm64::/)"), &[])?;
                finish_arm64(root, state).await?;
                run_after(&sh, root, &format!("{CONTAINERS} & test(/^arm64::/)"))?;
            }
        }
        Ok(())
    }
}

/// images.lock as the checkout has it: the build recorded nothing new.
fn check_lock(sh: &Shell) -> anyhow::Result<()> {
    cmd!(sh, "git diff --exit-code -- images.lock").run().context(
        "the build changed images.lock: commit what `cargo xtask build` recorded with the change that caused it",
    )
}

/// Waits for the arm64 walk if it still runs and checks the lock if the lock step left that to
/// it: whatever the walk's outcome, its error first, naming what it leaves unchecked.
async fn finish_arm64(root: &Path, state: &mut State) -> anyhow::Result<()> {
    let walk = match state.arm64.take() {
        Some(walk) => {
            eprintln!("==> waiting for the arm64 chain (under emulation)");
            walk.await.context("the arm64 chain").and_then(|report| report.ensure_success())
        }
        None => Ok(()),
    };
    let lock = if std::mem::take(&mut state.lock_deferred) {
        eprintln!("==> checking images.lock, the arm64 chain's entries included");
        let sh = Shell::new()?;
        sh.change_dir(root);
        check_lock(&sh)
    } else {
        Ok(())
    };
    match (walk, lock) {
        (Err(walk), Err(lock)) => Err(walk.context(format!("and {lock:#}"))),
        (Err(walk), Ok(())) => Err(walk.context("arm64:: did not run")),
        (Ok(()), lock) => lock,
    }
}

/// A second nextest run of the default profile over `filter`: its JUnit report goes beside the
/// first run's ([`ARM64_JUNIT`]), which stays where the summary reads it.
fn run_after(sh: &Shell, root: &Path, filter: &str) -> anyhow::Result<()> {
    let junit = junit_path(root, "default");
    let first = junit.with_file_name("junit-first.xml");
    let moved = std::fs::rename(&junit, &first).is_ok();
    // A filter that matches nothing (a module renamed) fails rather than passing empty.
    let result = run_nextest(sh, "default", filter, &["--no-tests=fail".to_string()]);
    let _ = std::fs::rename(&junit, junit.with_file_name(ARM64_JUNIT));
    if moved {
        let _ = std::fs::rename(&first, &junit);
    }
    result
}

/// What clippy-driver, as the workspace's rustc wrapper, takes: its arguments joined by its
/// separator, as `cargo clippy -- -D warnings` passes them.
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

/// clippy's lints, as errors, in a full build: clippy-driver as the workspace's rustc wrapper
/// (what `cargo clippy` sets for a check). The workspace is then compiled once, linted in the
/// same pass, where a check and then a build compiled every crate twice.
fn lint_env() -> anyhow::Result<[(&'static str, String); 2]> {
    anyhow::ensure!(
        crate::project::on_path("clippy-driver"),
        "clippy-driver is not on PATH: `rustup component add clippy` (or `cargo xtask setup --tests`)"
    );
    Ok([("RUSTC_WORKSPACE_WRAPPER", "clippy-driver".to_string()), ("CLIPPY_ARGS", CLIPPY_ARGS.to_string())])
}

/// Every target of the workspace, as `cargo clippy --workspace --all-targets` checks them, built
/// with the lints of `sh`'s [`lint_env`] in the test profile: the set and the features nextest's
/// build takes, so the pure and container steps compile nothing more (but the suites' own).
fn lint_build(sh: &Shell) -> anyhow::Result<()> {
    cmd!(sh, "cargo build --workspace --all-targets --profile test").run().context(
        "clippy's lints or the build failed (`cargo clippy --workspace --all-targets` shows the lints)",
    )
}

/// sandbox-init for the host's images and the suites' probe, static, built from the run's start
/// on a thread of its own at the lowest priority, in a target folder of their own
/// (`project::static_binary_for`): their release builds (LTO, one codegen unit: mostly one
/// core's work) take what the lint build leaves idle and never delay the pure tests' verdict.
fn spawn_static_binaries(root: &Path) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        // Linux's nice value is a thread's, and the processes it starts inherit it. At worst the
        // call fails and the builds run at the usual priority.
        // SAFETY: setpriority reads no memory of ours; `0` names the calling thread.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
        let sh = Shell::new()?;
        crate::project::sandbox_init_binary(&sh, &root)?;
        crate::project::probe_binary(&sh, &root)?;
        Ok(())
    })
}

/// The step's name, as `--skip` takes it.
fn name(step: CiStep) -> String {
    step.to_possible_value().expect("every step has a name").get_name().to_string()
}

fn describe(step: CiStep) -> &'static str {
    match step {
        CiStep::Fmt => "fmt: cargo fmt --all -- --check",
        CiStep::Clippy => {
            "clippy: every target built once with clippy's lints as errors (clippy-driver as rustc's wrapper)"
        }
        CiStep::Pure => "pure: every test that starts no container (unit tests, tidy, snapshots)",
        CiStep::Build => "build: every image, and the shell's arm64 chain (under emulation)",
        CiStep::Lock => "lock: images.lock unchanged by the build",
        CiStep::Test => "test: the container suites, every shape in one nextest run (JUnit)",
    }
}

/// Each step run and its time; then, from the JUnit reports of the pure step and the
/// container suites' run, how many tests ran where and the slowest.
fn summary(times: &[(CiStep, Duration)], root: &Path) -> String {
    let mut text = steps_table(times);
    let mut cases = Vec::new();
    for profile in ["pure", "default"] {
        let ran = times.iter().any(|(step, _)| match profile {
            "pure" => *step == CiStep::Pure,
            _ => *step == CiStep::Test,
        });
        if let (true, Ok(xml)) = (ran, std::fs::read_to_string(junit_path(root, profile))) {
            cases.extend(test_cases(&xml));
        }
        // The arm64 tests' own run, where they ran after the others.
        let arm64 = junit_path(root, profile).with_file_name(ARM64_JUNIT);
        if let (true, "default", Ok(xml)) = (ran, profile, std::fs::read_to_string(arm64)) {
            cases.extend(test_cases(&xml));
        }
    }
    if !cases.is_empty() {
        text.push_str(&places_table(&cases));
        text.push_str(&slowest_table(&cases, SLOWEST));
    }
    text
}

fn steps_table(times: &[(CiStep, Duration)]) -> String {
    let mut text = String::from("ci steps:");
    for (step, time) in times {
        text.push_str(&format!("\n  {:<8} {:>6.0} s", name(*step), time.as_secs_f64()));
    }
    let total: Duration = times.iter().map(|(_, t)| *t).sum();
    text.push_str(&format!("\n  {:<8} {:>6.0} s", "total", total.as_secs_f64()));
    text
}

/// One test case of a JUnit report: its binary (`classname`), name and seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub binary: String,
    pub name: String,
    pub seconds: f64,
}

/// The test cases of a JUnit report as nextest writes it (`<testcase name=… classname=…
/// time=…>`); anything else is skipped. A few attributes of one element, not a general XML
/// reader: the xtask takes no parser for it.
pub fn test_cases(xml: &str) -> Vec<Case> {
    let attribute = |element: &str, key: &str| -> Option<String> {
        let start = element.find(&format!(" {key}=\""))? + key.len() + 3;
        let end = element[start..].find('"')? + start;
        Some(
            element[start..end]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        )
    };
    xml.split("<testcase")
        .skip(1)
        .filter_map(|rest| {
            let element = &rest[..rest.find('>')?];
            Some(Case {
                binary: attribute(element, "classname")?,
                name: attribute(element, "name")?,
                seconds: attribute(element, "time")?.parse().ok()?,
            })
        })
        .collect()
}

/// Where a test ran: which shape of the NET_ADMIN tests, the other container suites (no
/// capability), or no container at all.
pub fn place(case: &Case) -> &'static str {
    let containers = case.binary.starts_with("sandbox-tests::") && !case.binary.ends_with("sandbox-tests");
    for shape in ["single", "sidecar", "gvisor"] {
        if case.name.contains(&format!("::net_admin::{shape}::")) {
            return match shape {
                "single" => "NET_ADMIN, one container",
                "sidecar" => "NET_ADMIN, sidecar mode",
                _ => "NET_ADMIN, the agent under gVisor",
            };
        }
    }
    if containers { "containers, no capability" } else { "no container" }
}

fn places_table(cases: &[Case]) -> String {
    let mut counts: std::collections::BTreeMap<&str, (usize, f64)> = std::collections::BTreeMap::new();
    for case in cases {
        let entry = counts.entry(place(case)).or_default();
        entry.0 += 1;
        entry.1 += case.seconds;
    }
    let mut text = String::from("\ntests by place (count, summed test time):");
    for (place, (count, seconds)) in counts {
        text.push_str(&format!("\n  {place:<34} {count:>4}  {seconds:>7.0} s"));
    }
    text
}

fn slowest_table(cases: &[Case], count: usize) -> String {
    let mut sorted: Vec<&Case> = cases.iter().collect();
    sorted.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let mut text = format!("\nthe {count} slowest tests:");
    for case in sorted.into_iter().take(count) {
        text.push_str(&format!("\n  {:>6.1} s  {}", case.seconds, case.name));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_lists_each_step_and_the_total() {
        assert_eq!(
            steps_table(&[(CiStep::Fmt, Duration::from_secs(2)), (CiStep::Test, Duration::from_secs(61))]),
            "ci steps:\n  fmt           2 s\n  test         61 s\n  total        63 s"
        );
    }

    /// The arm64 walk's end, when it ran beside the suites: a failed walk still has the deferred
    /// lock checked, and its error says what did not run; a good walk leaves the lock's verdict.
    #[tokio::test]
    async fn a_failed_arm64_walk_still_has_the_lock_checked_and_names_what_did_not_run() {
        let repo = tempfile::tempdir().unwrap();
        let sh = Shell::new().unwrap();
        sh.change_dir(repo.path());
        let lock = repo.path().join("images.lock");
        std::fs::write(&lock, "recorded\n").unwrap();
        cmd!(sh, "git init -q").run().unwrap();
        cmd!(sh, "git add images.lock").run().unwrap();
        cmd!(sh, "git -c user.name=t -c user.email=t@example.org commit -q -m lock").run().unwrap();
        let end = |walk: anyhow::Result<()>, lock_changed: bool| {
            std::fs::write(&lock, if lock_changed { "changed\n" } else { "recorded\n" }).unwrap();
            let walk: Pending = Box::pin(async move {
                walk.map(|()| build::BuildReport {
                    results: Vec::new(),
                    plans: Vec::new(),
                    lock: Default::default(),
                    local: Default::default(),
                    os_source: crate::os::OsSource::Mirror,
                })
            });
            let mut state = State { arm64: Some(walk), lock_deferred: true, ..State::default() };
            let root = repo.path().to_path_buf();
            async move { finish_arm64(&root, &mut state).await.map_err(|e| format!("{e:#}")) }
        };
        let failed = || Err(anyhow::anyhow!("base failed under emulation"));
        let both = end(failed(), true).await.unwrap_err();
        assert!(both.contains("base failed") && both.contains("images.lock"), "{both}");
        let walk = end(failed(), false).await.unwrap_err();
        assert!(walk.contains("base failed") && walk.contains("arm64:: did not run"), "{walk}");
        let lock = end(Ok(()), true).await.unwrap_err();
        assert!(lock.contains("images.lock") && !lock.contains("arm64"), "{lock}");
        end(Ok(()), false).await.unwrap();
    }

    /// Where the arm64 tests ran after the others (their chain still building when the suites
    /// started), the summary counts both runs' reports; a report of arm64's left from a run
    /// whose test step did not run is not read.
    #[test]
    fn the_summary_counts_the_arm64_tests_run_after_the_others() {
        let root = tempfile::tempdir().unwrap();
        let junit = junit_path(root.path(), "default");
        std::fs::create_dir_all(junit.parent().unwrap()).unwrap();
        let case = |name: &str| {
            format!(
                r#"<testsuites><testcase name="{name}" classname="sandbox-tests::suites" time="2.0"/></testsuites>"#
            )
        };
        std::fs::write(&junit, case("firewall::net_admin::single::a")).unwrap();
        std::fs::write(junit.with_file_name(ARM64_JUNIT), case("arm64::the_shell_runs")).unwrap();
        let text = summary(&[(CiStep::Test, Duration::from_secs(9))], root.path());
        assert!(text.contains("NET_ADMIN, one container              1"), "{text}");
        assert!(text.contains("containers, no capability             1"), "{text}");
        assert!(text.contains("arm64::the_shell_runs"), "{text}");
        let text = summary(&[(CiStep::Build, Duration::from_secs(9))], root.path());
        assert!(!text.contains("arm64::"), "{text}");
    }

    /// nextest's JUnit report, as it writes one: each case's binary, name and time; the places
    /// counted and the slowest named.
    #[test]
    fn the_junit_report_gives_each_tests_place_and_time() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="4" failures="0" errors="0" uuid="x" timestamp="t" time="99.1">
    <testsuite name="sandbox-tests::suites" tests="3" disabled="0" errors="0" failures="0">
        <testcase name="firewall::net_admin::sidecar::a_blocked_name_is_refused" classname="sandbox-tests::suites" timestamp="t" time="4.26">
        </testcase>
        <testcase name="refusals::an_invalid_policy_is_refused" classname="sandbox-tests::suites" timestamp="t" time="1.5"/>
        <testcase name="agents::net_admin::single::kilo::completes_a_turn" classname="sandbox-tests::suites" timestamp="t" time="61.0"><system-out>&lt;x&gt;</system-out></testcase>
    </testsuite>
    <testsuite name="sandbox-policy" tests="1">
        <testcase name="tests::a &amp; b" classname="sandbox-policy" timestamp="t" time="0.01"/>
    </testsuite>
</testsuites>"#;
        let cases = test_cases(xml);
        assert_eq!(cases.len(), 4);
        assert_eq!(
            cases[3],
            Case { binary: "sandbox-policy".into(), name: "tests::a & b".into(), seconds: 0.01 }
        );
        let places: Vec<&str> = cases.iter().map(place).collect();
        assert_eq!(
            places,
            [
                "NET_ADMIN, sidecar mode",
                "containers, no capability",
                "NET_ADMIN, one container",
                "no container"
            ]
        );
        let slowest = slowest_table(&cases, 2);
        assert_eq!(
            slowest,
            "\nthe 2 slowest tests:\n    61.0 s  agents::net_admin::single::kilo::completes_a_turn\n     4.3 s  firewall::net_admin::sidecar::a_blocked_name_is_refused"
        );
    }
}
