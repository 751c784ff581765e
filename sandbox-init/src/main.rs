//! sandbox-init: the entrypoint of every agent-sandbox image.
//!
//! Until the firewall lands this binary fails closed: it never starts the agent, because an
//! agent without its egress allowlist would be a sandbox in name only. `--version` answers so
//! images can be checked.

use std::process::ExitCode;

/// The agent was not started because the sandbox could not be set up (sysexits' EX_CONFIG).
const EXIT_NOT_SANDBOXED: u8 = 78;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().skip(1).any(|a| a == "--version" || a == "-V") {
        println!("sandbox-init {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "sandbox-init: the egress firewall is not implemented in this build; refusing to start the agent (exit {EXIT_NOT_SANDBOXED})"
    );
    ExitCode::from(EXIT_NOT_SANDBOXED)
}
