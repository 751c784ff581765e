//! `agent-sandbox attach`: this terminal on the sandbox's session (`terminal`), and when that
//! ends, what changed in the project's git files (`gitguard`).

use crate::engine::{Engine, Sandbox};
use crate::exit::Result;
use crate::flags::AttachFlags;

pub async fn run(flags: &AttachFlags) -> Result<i32> {
    let engine = Engine::connect().await?;
    let sandbox = engine.find(&flags.which.sandbox).await?;
    sandbox.ensure_running()?;
    attach_and_check(&engine, &sandbox).await
}

/// Attaches; when that ends (a detach, or the session's end), names what changed in the
/// project's git files.
pub async fn attach_and_check(engine: &Engine, sandbox: &Sandbox) -> Result<i32> {
    let status = crate::terminal::attach(sandbox).await?;
    if let Ok(found) = engine.find(&sandbox.id).await {
        crate::gitguard::changes_since_start(&found)?;
    }
    Ok(status)
}
