//! `agent-sandbox status`: sandbox-status run in the sandbox, its output and status passed on.

use crate::engine::Engine;
use crate::exit::Result;
use crate::flags::StatusFlags;

pub async fn run(flags: &StatusFlags) -> Result<i32> {
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    sandbox.ensure_running()?;
    let cmd: &[&str] = if flags.json { &["sandbox-status", "--json"] } else { &["sandbox-status"] };
    let out = sandbox.exec(cmd).await?;
    if flags.json {
        crate::say::json_text(&out.stdout);
    } else {
        crate::say::out(&out.stdout);
    }
    crate::say::err_bytes(out.stderr.as_bytes());
    Ok(i32::try_from(out.code).unwrap_or(1))
}
