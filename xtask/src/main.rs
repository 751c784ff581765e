//! `cargo xtask`: parse the flags, run one command.

use clap::Parser as _;
use xtask::flags::{Command, Xtask};
use xtask::{bench, build, graph, project, test};

fn main() -> std::process::ExitCode {
    let flags = Xtask::parse();
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the async runtime");
    match runtime.block_on(run(flags)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(flags: Xtask) -> anyhow::Result<()> {
    let root = project::root();
    match flags.command {
        Command::Build(f) => {
            let mut opts = build::BuildOptions::new(&root);
            f.common.apply(&mut opts);
            opts.images = f.images;
            opts.locked = f.locked;
            let report = build::build(&opts).await?;
            report.ensure_success()?;
            let built = report.built().len();
            let fresh = report.up_to_date().len();
            eprintln!(
                "{} images: {built} built, {fresh} up to date (OS layer: {}); {} {}",
                report.results.len(),
                report.os_source,
                if opts.locked { "verified against" } else { "recorded in" },
                opts.lock_path.display()
            );
            Ok(())
        }
        Command::Graph(f) => {
            let graph = graph::ImageGraph::discover(&root.join("images"))?;
            let out = if f.json {
                graph.render_json()
            } else if f.dot {
                graph.render_dot()
            } else {
                graph.render_text()
            };
            print!("{out}");
            if !out.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        Command::Bench(f) => bench::run(&root, f).await,
        Command::Test(f) => test::run(&root, f).await,
    }
}
