//! `agent-sandbox allow`: names added to a running sandbox's allowlist, live (`approve`).

use crate::approve;
use crate::engine::Engine;
use crate::exit::{Code, Failure, Result};
use crate::flags::AllowFlags;

pub async fn run(flags: &AllowFlags) -> Result<i32> {
    // Checked before the engine is asked anything.
    approve::validate("DOMAIN", &flags.domains)?;
    let upload = flags
        .upload
        .as_deref()
        .map(|size| {
            sandbox_policy::parse_size(size)
                .map_err(|why| Failure::new(Code::BadArgument, format!("--upload {size}: {why}")))
        })
        .transpose()?;
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    let _held = approve::hold(&sandbox).await?;
    let domains = if flags.pending {
        approve::allow_pending(&sandbox, &flags.domains, flags.yes).await?
    } else {
        let cautions = approve::typed_cautions(&sandbox, &flags.domains).await?;
        let n = flags.domains.len();
        if !cautions.is_empty() && flags.yes != Some(n) {
            return Err(Failure::new(
                Code::BadArgument,
                format!(
                    "add --yes {n} to allow exactly these; nothing changed:\n  {}",
                    cautions.join("\n  ")
                ),
            ));
        }
        approve::allow(&sandbox, &flags.domains, upload).await?;
        flags.domains.clone()
    };
    if let Some(bytes) = upload {
        eprintln!(
            "agent-sandbox: {} allows {} up to {bytes} bytes an hour each (where no other entry allows more)",
            sandbox.name,
            domains.join(", ")
        );
        return Ok(0);
    }
    if domains.is_empty() {
        eprintln!("agent-sandbox: nothing pending in {} up to the last review", sandbox.name);
    } else {
        crate::say::line(&format!("agent-sandbox: {} now allows {}", sandbox.name, domains.join(", ")));
    }
    Ok(0)
}
