//! `agent-sandbox allow`: names added to a running sandbox's allowlist, live (`approve`).

use crate::approve;
use crate::engine::Engine;
use crate::exit::Result;
use crate::flags::AllowFlags;

pub async fn run(flags: &AllowFlags) -> Result<i32> {
    // Checked before the engine is asked anything.
    approve::validate("DOMAIN", &flags.domains)?;
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    let _held = approve::hold(&sandbox).await?;
    let domains = if flags.pending {
        approve::allow_pending(&sandbox, &flags.domains, flags.yes).await?
    } else {
        approve::allow(&sandbox, &flags.domains).await?;
        flags.domains.clone()
    };
    if domains.is_empty() {
        eprintln!("agent-sandbox: nothing pending in {} up to the last review", sandbox.name);
    } else {
        eprintln!("agent-sandbox: {} now allows {}", sandbox.name, domains.join(", "));
    }
    Ok(0)
}
