//! `agent-sandbox`: run an AI coding agent in its sandbox on a project, watch it, and widen its
//! allowlist live. `flags` declares the command line; `main` only dispatches: each command is
//! `run` on its flags, in the module named after it. Below them: `spec` (what `run` will make,
//! pure), `approve` (the drop-in and the approval queue), `gitguard`, `terminal`, `identity`,
//! and `engine`, every engine call.

mod allow;
mod approve;
mod attach;
mod clock;
mod deny;
mod engine;
mod exec;
mod exit;
mod flags;
mod gitguard;
mod host;
mod identity;
mod k8s;
mod logs;
mod ls;
mod model;
mod pending;
mod policy;
mod queue;
mod run;
mod say;
mod spec;
mod status;
mod stop;
mod terminal;
mod ui;
mod verify;
mod why;

use clap::Parser as _;

use crate::exit::{Code, Result};
use crate::flags::{Cli, Command, PolicyCommand};

fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let code = match runtime {
        Ok(runtime) => match runtime.block_on(dispatch(cli.command)) {
            Ok(code) => code,
            Err(failure) => {
                // A failure may quote the sandbox's log or a name the agent chose.
                say::line(&format!("agent-sandbox: {failure}"));
                failure.code as i32
            }
        },
        Err(e) => {
            eprintln!("agent-sandbox: cannot start: {e}");
            Code::Engine as i32
        }
    };
    // Not the runtime's shutdown: a read of the terminal may still be blocked in it.
    std::process::exit(code);
}

async fn dispatch(command: Command) -> Result<i32> {
    match command {
        Command::Run(flags) => run::run(&flags).await,
        Command::Ls(flags) => ls::run(&flags).await,
        Command::Attach(flags) => attach::run(&flags).await,
        Command::Exec(flags) => exec::run(&flags).await,
        Command::Stop(flags) => stop::run(&flags).await,
        Command::Logs(flags) => logs::run(&flags).await,
        Command::Status(flags) => status::run(&flags).await,
        Command::Allow(flags) => allow::run(&flags).await,
        Command::Deny(flags) => deny::run(&flags).await,
        Command::Pending(flags) => pending::run(&flags).await,
        Command::K8s(flags) => k8s::run(&flags).await,
        Command::Verify(flags) => verify::run(&flags).await,
        Command::Policy(PolicyCommand::Check(flags)) => policy::run(&flags).await,
        Command::Why(flags) => why::run(&flags).await,
        Command::Ui(flags) => ui::run(&flags).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::flags::Cli;

    /// `--help` of the launcher and of each command, as users read it.
    #[test]
    fn help() {
        let mut cli = Cli::command();
        // Built, so that each command's usage line names the binary.
        cli.build();
        let mut text = cli.render_long_help().to_string();
        for sub in cli.get_subcommands_mut() {
            text.push_str(&format!("\n===== {} --help =====\n", sub.get_name()));
            text.push_str(&sub.render_long_help().to_string());
            let parent = sub.get_name().to_string();
            let nested = sub.get_subcommands_mut().filter(|n| n.get_name() != "help" && parent != "help");
            for nested in nested {
                text.push_str(&format!("\n===== {parent} {} --help =====\n", nested.get_name()));
                text.push_str(&nested.render_long_help().to_string());
            }
        }
        insta::assert_snapshot!(text);
    }
}
