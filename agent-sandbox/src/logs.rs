//! `agent-sandbox logs`: the container's log (sandbox-init's lines, refused names and
//! connections), once or followed.

use crate::engine::Engine;
use crate::exit::Result;
use crate::flags::LogsFlags;

pub async fn run(flags: &LogsFlags) -> Result<i32> {
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    if flags.follow {
        sandbox.follow_logs().await?;
    } else {
        crate::say::out(&sandbox.logs(None).await?);
    }
    Ok(0)
}
