//! `cargo xtask bench`: figures for the build system, measured against a baseline in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions, BuildPlan};
use crate::flags::{BenchFlags, BenchTarget};
use crate::progress::ProgressMode;

impl BenchFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        run(root, self).await
    }
}

async fn run(root: &Path, flags: BenchFlags) -> anyhow::Result<()> {
    match flags.what {
        BenchTarget::Build { runs, common } => {
            let mut opts = BuildOptions::new(root);
            common.apply(&mut opts);
            bench_build(opts, runs.max(1)).await.map(|_| ())
        }
        BenchTarget::Sandbox { runs, common } => {
            let mut opts = BuildOptions::new(root);
            common.apply(&mut opts);
            bench_tests(root, opts, runs.max(1), "sandbox").await
        }
        BenchTarget::Ui { runs, common } => {
            let mut opts = BuildOptions::new(root);
            common.apply(&mut opts);
            bench_tests(root, opts, runs.max(1), "ui").await
        }
        BenchTarget::Card { runs, first_command_runs, common } => {
            let mut opts = BuildOptions::new(root);
            common.apply(&mut opts);
            crate::card::bench_card(root, opts, runs.max(1), first_command_runs.max(1)).await
        }
    }
}

/// Builds the smallest image, then runs the tests crate's bench `name` (`sandbox`, `ui`), which
/// uses the suites' harness (networks, peers, the probe, the launcher, the browser) and prints
/// its own table.
async fn bench_tests(root: &Path, mut opts: BuildOptions, runs: usize, name: &str) -> anyhow::Result<()> {
    opts.images = vec!["shell".into(), "os".into()];
    build::build(&opts).await?.ensure_success()?;
    let sh = Shell::new()?;
    let _dir = sh.push_dir(root);
    let _env: Vec<_> = opts.export_env().into_iter().map(|(k, v)| sh.push_env(k, v)).collect();
    let _runs = sh.push_env("BENCH_RUNS", runs.to_string());
    cmd!(sh, "cargo bench --quiet --package sandbox-tests --bench {name}")
        .run()
        .with_context(|| format!("the {name} bench failed"))
}

/// No-op rebuild of the whole graph vs. a `docker build` (classic builder, warm layer cache) of
/// every image with the same contexts, build args and labels. Returns how many images each
/// `docker build` round built.
pub async fn bench_build(mut opts: BuildOptions, runs: usize) -> anyhow::Result<usize> {
    eprintln!("warming up: building the whole graph once");
    let report = build::build(&opts).await?;
    report.ensure_success()?;
    let images = report.results.len();
    opts.progress = ProgressMode::Quiet;

    let mut noop = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let report = build::build(&opts).await?;
        noop.push(started.elapsed());
        anyhow::ensure!(report.built().is_empty(), "a no-op build rebuilt {:?}", report.built());
    }

    let sh = Shell::new()?;
    let dir = tempfile::tempdir()?;
    for plan in &report.plans {
        materialize(plan, &dir.path().join(&plan.name))?;
    }
    let mut docker = Vec::with_capacity(runs);
    let mut each: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); report.plans.len()];
    let tags: Vec<String> = report
        .plans
        .iter()
        .map(|plan| format!("{}/{}:latest", crate::project::BENCH_REPOSITORY, plan.name))
        .collect();
    let measured = (|| {
        for _ in 0..runs {
            let started = Instant::now();
            for ((plan, samples), tag) in report.plans.iter().zip(&mut each).zip(&tags) {
                let one = Instant::now();
                crate::engine::cli_build(
                    &sh,
                    &dir.path().join(&plan.name),
                    &plan.build_args,
                    &plan.labels,
                    tag,
                )
                .with_context(|| format!("docker build of '{}' failed", plan.name))?;
                samples.push(one.elapsed());
            }
            docker.push(started.elapsed());
        }
        Ok::<_, anyhow::Error>(())
    })();
    // The copies go, measured or not: they are the benchmark's, not the user's images.
    let engine = crate::engine::Engine::connect().await?;
    for tag in &tags {
        if engine.image_id(tag).await?.is_some() {
            engine.remove_tag(tag).await.context("cannot remove the benchmark's tags")?;
        }
    }
    measured?;

    let (noop, docker) = (median(noop), median(docker));
    println!("images in the graph:                          {images}");
    println!("no-op `cargo xtask build` (median of {runs}):       {:>8.3} s", noop.as_secs_f64());
    println!("warm `docker build` of each (median of {runs}):   {:>8.3} s", docker.as_secs_f64());
    println!(
        "ratio (docker build / no-op xtask build):     {:>8.1}x",
        docker.as_secs_f64() / noop.as_secs_f64()
    );
    println!("targets: no-op under 1 s, at least 10x faster than the docker build loop");
    println!("\nwarm `docker build` per image (median of {runs}; the layer cache holds every step):");
    for (plan, samples) in report.plans.iter().zip(each) {
        println!("  {:<12} {:>8.3} s", plan.name, median(samples).as_secs_f64());
    }
    Ok(report.plans.len())
}

fn materialize(plan: &BuildPlan, dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for (path, file) in &plan.context.files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("a file has a folder"))?;
        std::fs::write(&target, &file.data).with_context(|| format!("cannot write {}", target.display()))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode))?;
    }
    Ok(())
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
