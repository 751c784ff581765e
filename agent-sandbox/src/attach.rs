//! `agent-sandbox attach`: this terminal on the sandbox's session (`terminal`), and when that
//! ends, what changed in the project's git files (`gitguard`).

use crate::engine::{Engine, Sandbox};
use crate::exit::Result;
use crate::flags::AttachFlags;

pub async fn run(flags: &AttachFlags) -> Result<i32> {
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    sandbox.ensure_running()?;
    attach_and_check(&sandbox).await
}

/// Attaches; when that ends (a detach, or the session's end), names what changed in the
/// project's git files.
pub async fn attach_and_check(sandbox: &Sandbox) -> Result<i32> {
    let status = crate::terminal::attach(sandbox).await?;
    crate::gitguard::changes_since_start(sandbox)?;
    Ok(status)
}
