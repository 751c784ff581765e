//! What `verify` checks: an image the engine has, or a running sandbox of the launcher's. A
//! running sandbox is never changed: its image is checked in a fresh world with the policy it
//! runs with (its policy file and every drop-in, `allow`'s among them) and in its shape (sidecar
//! mode, its runtime), and its own agent's processes are read where they run.

use sandbox_policy::layout::{AGENT_UID, BAKED_POLICY, DROP_IN_DIR};

use crate::engine::{Engine, ImageFacts, Sandbox};
use crate::exit::{Code, Failure, Result};
use crate::flags::VerifyFlags;

/// What the world is built from.
pub(super) struct Target {
    /// The image, as the engine names it (a running sandbox's: its image's id).
    pub image: String,
    pub facts: ImageFacts,
    /// The policy that replaces the image's (`--policy`, or the running sandbox's).
    pub policy: Option<String>,
    /// Drop-ins beside the image's own: the running sandbox's, by file name.
    pub drop_ins: Vec<(String, Vec<u8>)>,
    pub sidecar: bool,
    pub runtime: Option<String>,
    /// The running sandbox checked, if that is what was named.
    pub running: Option<Sandbox>,
}

impl Target {
    /// An image of that reference, else a running sandbox `which` names (as `attach` finds one).
    pub(super) async fn resolve(
        engine: &Engine,
        flags: &VerifyFlags,
        policy: Option<String>,
    ) -> Result<Target> {
        let sidecar = flags.sidecar || flags.runtime.is_some();
        if let Some(facts) = engine.image(&flags.image).await? {
            if let Ok(sandbox) = engine.find(&flags.image).await {
                return Err(Failure::new(
                    Code::BadArgument,
                    format!(
                        "{} names both an image and the sandbox {}: give the image by its id (`docker \
                         image inspect`) or the sandbox by its container name",
                        flags.image, sandbox.name
                    ),
                ));
            }
            return Ok(Target {
                image: flags.image.clone(),
                facts,
                policy,
                drop_ins: Vec::new(),
                sidecar,
                runtime: flags.runtime.clone(),
                running: None,
            });
        }
        let sandbox = engine.find(&flags.image).await.map_err(|_| {
            Failure::new(
                Code::NoImage,
                format!(
                    "no image {} in the engine and no sandbox of that name: build or pull the image, or \
                     name a sandbox `agent-sandbox ls` lists",
                    flags.image
                ),
            )
        })?;
        sandbox.ensure_running()?;
        if flags.policy.is_some() || sidecar {
            return Err(Failure::new(
                Code::BadArgument,
                format!(
                    "{} is a running sandbox: verify takes its policy and its shape from it (leave out \
                     --policy, --sidecar and --runtime)",
                    sandbox.name
                ),
            ));
        }
        let docker = engine.docker();
        let inspect = docker.inspect_container(&sandbox.id, None).await?;
        let image = inspect.image.unwrap_or_else(|| sandbox.image.clone());
        let runtime = inspect
            .host_config
            .and_then(|h| h.runtime)
            .filter(|r| !r.is_empty() && r != "runc" && r != "crun");
        let facts = engine.image(&image).await?.ok_or_else(|| {
            Failure::new(
                Code::NoImage,
                format!("the image of {} ({image}) is gone from the engine", sandbox.name),
            )
        })?;
        // Where the firewall is (the gateway in sidecar mode): the policy it runs with.
        let policy = sandbox.get(BAKED_POLICY).await?.into_iter().next().map(|(_, b)| b);
        let policy = policy.map(|b| String::from_utf8_lossy(&b).into_owned());
        let drop_ins = sandbox
            .get(DROP_IN_DIR)
            .await?
            .into_iter()
            .filter_map(|(path, bytes)| {
                let name = std::path::Path::new(&path).file_name()?.to_str()?.to_string();
                Some((name, bytes))
            })
            .collect();
        eprintln!("verify: {} runs {image}: checking that image with the policy it runs with", sandbox.name);
        Ok(Target {
            image,
            facts,
            policy,
            drop_ins,
            sidecar: !sandbox.gateway.is_empty(),
            runtime,
            running: Some(sandbox),
        })
    }
}

/// The running sandbox's own agent: every process of the agent's uid, where it runs.
pub(super) async fn processes(engine: &Engine, sandbox: &Sandbox) -> Result<sandbox_verify::Outcome> {
    // Absolute paths: a folder of the agent's on the PATH must not choose what runs here. The
    // reader names itself, so that it and its children are not counted as the agent.
    let script = "echo self=$$; for f in /proc/[0-9]*/status; do /bin/cat \"$f\" 2>/dev/null; done";
    let out = sandbox.agent_side().exec(&["/bin/sh", "-c", script]).await?;
    let inspect = engine.docker().inspect_container(&sandbox.id, None).await?;
    let options = inspect.host_config.and_then(|h| h.security_opt).unwrap_or_default();
    let no_new_privs = options.iter().any(|o| o == "no-new-privileges" || o == "no-new-privileges:true");
    Ok(sandbox_verify::running_processes(&out.stdout, AGENT_UID, no_new_privs))
}
