//! `agent-sandbox`: run an AI coding agent in its sandbox on a project, watch it, and widen its
//! allowlist live. `flags` declares the command line; each command is in the module named for
//! what it does (`run`, `manage`, `approve`, `terminal`), every engine call in `engine`.

mod approve;
mod engine;
mod exit;
mod flags;
mod gitguard;
mod identity;
mod manage;
mod run;
mod terminal;

use clap::Parser as _;

use crate::exit::{Code, Result};
use crate::flags::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let code = match runtime {
        Ok(runtime) => match runtime.block_on(dispatch(cli.command)) {
            Ok(code) => code,
            Err(failure) => {
                eprintln!("agent-sandbox: {failure}");
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
        Command::Ls(flags) => {
            let docker = engine::connect().await?;
            let rows = manage::rows(&docker).await?;
            print!("{}", if flags.json { manage::render_json(&rows) } else { manage::render_text(&rows) });
            Ok(0)
        }
        Command::Attach(which) => {
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &which.sandbox).await?;
            sandbox.ensure_running()?;
            terminal::attach(&docker, &sandbox.id).await
        }
        Command::Stop(which) => {
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &which.sandbox).await?;
            engine::remove(&docker, &sandbox.id, 10).await?;
            approve::forget(&sandbox);
            let git = run::git_changes(&sandbox);
            let kept = if sandbox.state.is_empty() {
                String::new()
            } else {
                format!(
                    "; its state stays in volume {} (`docker volume rm {}` deletes it)",
                    sandbox.state, sandbox.state
                )
            };
            eprintln!("agent-sandbox: stopped {}{kept}", sandbox.name);
            git
        }
        Command::Logs(flags) => {
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &flags.which.sandbox).await?;
            if flags.follow {
                engine::follow_logs(&docker, &sandbox.id).await?;
            } else {
                print!("{}", engine::logs(&docker, &sandbox.id, None).await?);
            }
            Ok(0)
        }
        Command::Status(flags) => {
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &flags.which.sandbox).await?;
            manage::status(&docker, &sandbox, flags.json).await
        }
        Command::Allow(flags) => {
            // Checked before the engine is asked anything.
            approve::validate("DOMAIN", &flags.domains)?;
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &flags.which.sandbox).await?;
            let _held = approve::hold(&sandbox).await?;
            let domains = if flags.pending {
                approve::allow_pending(&docker, &sandbox, &flags.domains, flags.yes).await?
            } else {
                approve::allow(&docker, &sandbox, &flags.domains).await?;
                flags.domains
            };
            if domains.is_empty() {
                eprintln!("agent-sandbox: nothing pending in {} up to the last review", sandbox.name);
            } else {
                eprintln!("agent-sandbox: {} now allows {}", sandbox.name, domains.join(", "));
            }
            Ok(0)
        }
        Command::Deny(flags) => {
            approve::validate("DOMAIN", &flags.domains)?;
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &flags.which.sandbox).await?;
            let _held = approve::hold(&sandbox).await?;
            approve::deny(&docker, &sandbox, &flags.domains).await?;
            eprintln!(
                "agent-sandbox: {} no longer allows {} (its connections are cut)",
                sandbox.name,
                flags.domains.join(", ")
            );
            Ok(0)
        }
        Command::Pending(flags) => {
            let docker = engine::connect().await?;
            let sandbox = engine::find(&docker, &flags.which.sandbox).await?;
            let _held = approve::hold(&sandbox).await?;
            if flags.dismiss {
                let dismissed = approve::dismiss(&docker, &sandbox).await?;
                eprintln!("agent-sandbox: dismissed {dismissed} names");
                return Ok(0);
            }
            let queue = approve::pending(&docker, &sandbox).await?;
            if flags.json {
                println!("{}", serde_json::to_string_pretty(&queue.names).expect("the queue serialises"));
            } else if queue.names.is_empty() {
                eprintln!("agent-sandbox: nothing pending in {}", sandbox.name);
            } else {
                print!("{}", approve::render_pending(&queue.names));
                eprintln!(
                    "agent-sandbox: allow these with `agent-sandbox allow {} --pending` (names refused \
                     after this look wait for the next), or some with `agent-sandbox allow {} NAME…`; \
                     `--dismiss` empties the queue",
                    sandbox.name, sandbox.name
                );
            }
            if !queue.unallowable.is_empty() {
                eprintln!(
                    "agent-sandbox: also refused, and not domains a policy can hold: {}",
                    queue.unallowable.join(", ")
                );
            }
            Ok(0)
        }
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
        }
        insta::assert_snapshot!(text);
    }
}
