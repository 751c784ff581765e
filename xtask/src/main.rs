//! `cargo xtask`: parse the flags, run one command. Each command is `run` on its flags, in the
//! module of the same name.

use clap::Parser as _;
use xtask::flags::{Command, Xtask};

fn main() -> std::process::ExitCode {
    let flags = Xtask::parse();
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the async runtime");
    let result = runtime.block_on(run(flags));
    // A failed step says so at once: no wait for work still running beside it on the blocking
    // pool (`cargo xtask ci`'s arm64 chain), which the exit ends.
    runtime.shutdown_background();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(flags: Xtask) -> anyhow::Result<()> {
    let root = xtask::project::root();
    match flags.command {
        Command::Build(f) => f.run(&root).await,
        Command::Graph(f) => f.run(&root),
        Command::Bench(f) => f.run(&root).await,
        Command::Test(f) => f.run(&root).await,
        Command::Ci(f) => f.run(&root).await,
        Command::Setup(f) => f.run(&root).await,
        Command::Publish(f) => f.run(&root).await,
        Command::Digests(f) => f.run(&root),
        Command::List(f) => f.run().await,
        Command::Prune(f) => f.run(&root).await,
        Command::NewAgent(f) => f.run(&root),
    }
}
