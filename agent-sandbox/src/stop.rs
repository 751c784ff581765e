//! `agent-sandbox stop`: the container stopped and removed (its state volumes stay), its change
//! lock forgotten, and what changed in the project's git files while it ran.

use crate::engine::{Engine, Sandbox};
use crate::exit::Result;
use crate::flags::StopFlags;

pub async fn run(flags: &StopFlags) -> Result<i32> {
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    let (stopped, git) = stop(&sandbox).await?;
    crate::say::line(&format!("agent-sandbox: {stopped}"));
    git
}

/// Stops and removes `sandbox` (the CLI's and the web page's stop): what to tell the user, and
/// what changed in the project's git files while it ran (a failure naming each change).
pub async fn stop(sandbox: &Sandbox) -> Result<(String, Result<i32>)> {
    sandbox.remove(10).await?;
    crate::approve::forget(sandbox);
    let git = crate::gitguard::changes_since_start(sandbox);
    let kept = if sandbox.state.is_empty() {
        String::new()
    } else {
        format!(
            "; its state stays in volume {} (`docker volume rm {}` deletes it)",
            sandbox.state, sandbox.state
        )
    };
    Ok((format!("stopped {}{kept}", sandbox.name), git))
}
