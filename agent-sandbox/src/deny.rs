//! `agent-sandbox deny`: names `allow` gave taken back, live; their connections are cut
//! (`approve`).

use crate::approve;
use crate::engine::Engine;
use crate::exit::Result;
use crate::flags::DenyFlags;

pub async fn run(flags: &DenyFlags) -> Result<i32> {
    approve::validate("DOMAIN", &flags.domains)?;
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    let _held = approve::hold(&sandbox).await?;
    approve::deny(&sandbox, &flags.domains).await?;
    eprintln!(
        "agent-sandbox: {} no longer allows {} (its connections are cut)",
        sandbox.name,
        flags.domains.join(", ")
    );
    Ok(0)
}
