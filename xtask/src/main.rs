//! `cargo xtask`: parse the flags, run one command. Each command is `run` on its flags, in the
//! module of the same name.

use clap::Parser as _;
use xtask::flags::{Command, Xtask};

fn main() -> std::process::ExitCode {
    forget_cargo_run();
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

/// Removes what `cargo run` told this process about xtask's own package, before any thread
/// starts. The cargo runs xtask makes (clippy, nextest, the launcher's build) would otherwise
/// inherit it, and a build script that watches such a variable (ring's watches
/// `CARGO_MANIFEST_DIR`) would see it change between a cargo run from the shell (`cargo xtask`
/// itself, `cargo build`) and one from xtask, and ring, rustls and the ten crates above them would
/// compile again each time: about a minute of a CI run.
fn forget_cargo_run() {
    let names: Vec<_> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| {
            let name = name.to_string_lossy();
            name.starts_with("CARGO_PKG_")
                || matches!(
                    &*name,
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                )
        })
        .collect();
    for name in names {
        // SAFETY: the process has one thread yet (the runtime starts after this), so no other
        // thread reads the environment while it changes.
        unsafe { std::env::remove_var(name) };
    }
}
