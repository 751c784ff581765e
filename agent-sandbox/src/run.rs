//! `agent-sandbox run`: every argument is checked and what it names read (`host`) before the
//! engine is asked anything; then the running sandbox is reattached, or the image is found, the
//! sandbox decided (`spec`, pure) and made: volumes, container, files and keys, start, and the
//! wait for sandbox-init's `sandbox ready` line. A run that fails removes what it made.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_policy::Policy;
use sandbox_policy::layout::SECRETS_DIR;

use crate::attach::attach_and_check;
use crate::engine::{Engine, ImageFacts, Sandbox};
use crate::exit::{Code, Failure, Result};
use crate::flags::RunFlags;
use crate::host::{Host, bad};
use crate::spec::SandboxSpec;
use sandbox_images::platform::Platform;

/// How long sandbox-init may take to say `sandbox ready`.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The pinned digests, as this checkout's images.lock records them once published.
const IMAGES_LOCK: &str = include_str!("../../images.lock");
/// Names an images.lock to take the pinned digests from instead of the one built in: a newer
/// checkout's, once it is published, without installing the launcher again.
pub const IMAGES_LOCK_ENV: &str = "AGENT_SANDBOX_IMAGES_LOCK";

pub async fn run(flags: &RunFlags) -> Result<i32> {
    let host = Host::check(flags)?;
    let engine = Engine::connect().await?;
    let project = host.project.to_string_lossy().into_owned();
    let existing =
        engine.sandboxes().await?.into_iter().find(|s| s.agent == flags.agent && s.project == project);
    if let Some(found) = existing {
        if found.running {
            return reattach(&found, flags).await;
        }
        // Stopped (the session ended, or the engine restarted): its state is in its volumes.
        // What it changed in the project's git files is named now, before a new snapshot is
        // taken; the next run starts.
        found.remove(0).await?;
        crate::gitguard::changes_since_start(&found).map_err(|mut failure| {
            failure.message = format!(
                "{} had stopped and is removed; {}\n(`agent-sandbox run` again starts a new one)",
                found.name, failure.message
            );
            failure
        })?;
    }
    if let Some(runtime) = &flags.runtime {
        check_runtime(runtime, engine.runtime_args(runtime).await?)?;
    }
    let (reference, facts) = image(&engine, &flags.agent, flags.image.as_deref(), flags.platform).await?;
    let logins =
        if flags.login_from_host { crate::host::login_files(&flags.agent, &facts)? } else { Vec::new() };
    let git = if flags.writable_git_config {
        eprintln!(
            "agent-sandbox: --writable-git-config: the agent may write {project}'s git configuration and \
             hooks; your own git runs what they name (core.fsmonitor, core.pager, hooks, filters), as you, \
             the next time you use it there"
        );
        None
    } else {
        let plan = crate::gitguard::plan(&host.project)
            .map_err(|e| bad(format!("cannot guard {project}'s git files: {e}")))?;
        Some(plan)
    };
    let mut spec = SandboxSpec::new(flags, &host, &reference, &facts, git, logins)?;
    if let (Some(url), Some(model)) = (&flags.model_server, &flags.model) {
        let plan = crate::model::plan(&engine, &flags.agent, &facts, url, model).await?;
        // The URL and the name are checked: letters, digits and a few signs.
        eprintln!(
            "agent-sandbox: the agent's model is {model} on {}; the sandbox's forwarder alone reaches {} \
             port {}, with the model's requests alone, and no API key goes in",
            plan.url, plan.address, plan.port
        );
        spec.use_model_server(plan);
    }
    if engine.is_podman().await? {
        spec.for_podman();
    }
    let sandbox = make(&engine, &spec).await?;
    let (name, state) = (&spec.found.name, &spec.found.state);
    eprintln!(
        "agent-sandbox: {name} runs {reference} on {project}{}",
        if state.is_empty() { String::new() } else { format!(", state in volume {state}") }
    );
    if flags.detach {
        eprintln!(
            "agent-sandbox: attach with `agent-sandbox attach {name}`, stop with `agent-sandbox stop {name}`"
        );
        return Ok(0);
    }
    attach_and_check(&sandbox).await
}

/// The agent's sandbox on this project runs: attach to it, unless an option would shape a new one.
async fn reattach(found: &Sandbox, flags: &RunFlags) -> Result<i32> {
    let shaping = flags.shaping();
    if !shaping.is_empty() {
        let live = if flags.allow.is_empty() {
            String::new()
        } else {
            format!(" (`agent-sandbox allow {} DOMAIN…` widens it live)", found.name)
        };
        return Err(bad(format!(
            "{} is running on {}, and {} would shape a new sandbox, not this one: \
             `agent-sandbox stop {}` first, or run without them to reattach{live}",
            found.name,
            found.project,
            shaping.join(", "),
            found.name,
        )));
    }
    eprintln!("agent-sandbox: {} is running on {}: reattaching", found.name, found.project);
    if flags.detach { Ok(0) } else { attach_and_check(found).await }
}

/// Makes what `spec` says and starts it. Nothing half-made is left: a sandbox that cannot be
/// created, prepared or started is removed, with the volumes this run made (its last words are
/// in the failure).
pub(crate) async fn make(engine: &Engine, spec: &SandboxSpec) -> Result<Sandbox> {
    let mut made = Vec::new();
    let mut created = None;
    let started = async {
        for volume in &spec.volumes {
            if engine.ensure_volume(volume, spec.volume_labels.clone()).await? {
                made.push(volume.clone());
            }
        }
        let (Some(holder), Some(gateway)) = (&spec.holder, &spec.gateway) else {
            let sandbox = engine.create(spec.found.clone(), spec.body.clone()).await?;
            created = Some(sandbox.clone());
            let mut files = spec.secrets(&baked_policy(&sandbox, &spec.image_id).await?)?;
            files.extend(spec.files.iter().cloned());
            sandbox.put(&files).await?;
            sandbox.start().await?;
            wait_ready(&sandbox).await?;
            return Ok::<_, Failure>(sandbox);
        };
        // Sidecar mode: a fresh shared folder (a ready file left in an old one would be the
        // last run's); the holder, which owns the network namespace; the agent's container and
        // the gateway in it, the policy and the keys the gateway's alone.
        let name = &spec.found.name;
        let shared = crate::identity::shared_volume(name);
        // One that cannot be removed (a container of the last run still uses it) is not used:
        // the agent's container would take the last gateway's ready file for this one's.
        engine.remove_volume(&shared).await.map_err(|e| {
            Failure::new(
                e.code,
                format!(
                    "cannot remove the last run's shared volume {shared} ({e}): `docker ps -a --filter \
                     volume={shared}` shows what still uses it"
                ),
            )
        })?;
        engine.ensure_volume(&shared, spec.volume_labels.clone()).await?;
        made.push(shared);
        let found = |name: String| crate::engine::Found { name, ..Default::default() };
        let holder = engine.create(found(crate::identity::holder_name(name)), holder.clone()).await?;
        // The holder starts while the agent's container is made: the latter only names it.
        let (sandbox, held) =
            tokio::join!(engine.create(spec.found.clone(), spec.body.clone()), holder.start());
        let sandbox = sandbox?;
        created = Some(sandbox.clone());
        held?;
        let agent = sandbox.agent_side();
        let mut files = spec.secrets(&baked_policy(&agent, &spec.image_id).await?)?;
        files.extend(spec.files.iter().cloned());
        let (firewall_files, agent_files): (Vec<_>, Vec<_>) = files
            .into_iter()
            .partition(|f| f.path.starts_with("/etc/agent-sandbox") || f.path.starts_with(SECRETS_DIR));
        let mut gateway = gateway.clone();
        let gateway = async {
            resolver_for_gateway(&holder, &mut gateway).await?;
            let gateway = engine.create(found(sandbox.gateway.clone()), gateway).await?;
            gateway.put(&firewall_files).await?;
            Ok::<_, Failure>(gateway)
        };
        let (gateway, ()) = tokio::try_join!(gateway, agent.put(&agent_files))?;
        // Both at once: the agent's container starts its session once the gateway's ready file is
        // there (sandbox-init's wait_for_gateway), and runs nothing of the agent's before.
        tokio::try_join!(gateway.start(), agent.start())?;
        tokio::try_join!(wait_ready(&sandbox), wait_ready(&agent))?;
        Ok::<_, Failure>(sandbox)
    }
    .await;
    if started.is_err() {
        if let Some(sandbox) = created {
            let _ = sandbox.remove(0).await;
        }
        if spec.holder.is_some() {
            // Made before the agent's container, which needs it to exist.
            let holder = crate::identity::holder_name(&spec.found.name);
            let found = crate::engine::Found { id: holder.clone(), name: holder, ..Default::default() };
            let _ = engine.sandbox(found).remove(0).await;
        }
        for volume in &made {
            let _ = engine.remove_volume(volume).await;
        }
    }
    started
}

/// Without `--dns`, the gateway takes the resolvers Docker gave the namespace's holder (the
/// default bridge's are the host's), read before the gateway points the file at its own gate; on
/// a network whose only resolver is Docker's, it resolves the network's own names through it.
async fn resolver_for_gateway(
    holder: &Sandbox,
    gateway: &mut bollard::models::ContainerCreateBody,
) -> Result<()> {
    let env = gateway.env.get_or_insert_with(Vec::new);
    let var = format!("{}=", sandbox_policy::layout::DNS_ENV);
    if env.iter().any(|e| e.starts_with(&var)) {
        return Ok(());
    }
    let conf = holder.get("/etc/resolv.conf").await?.into_iter().next().map(|(_, b)| b).unwrap_or_default();
    let resolvers: Vec<String> = String::from_utf8_lossy(&conf)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(|a| a.trim().to_string())
        .filter(|a| a.parse::<std::net::IpAddr>().is_ok_and(|ip| sandbox_policy::resolver_outside(&ip)))
        .collect();
    if !resolvers.is_empty() {
        env.push(format!("{var}{}", resolvers.join(",")));
    }
    Ok(())
}

/// `--runtime NAME` only where the agent's packets still cross the network namespace's
/// netfilter, where the gateway's rules are: runsc registered with `--network=host`. Its own
/// netstack, or a VM's network (Kata), would take them past it. `args`: how the engine runs it,
/// None where it has no such runtime.
pub fn check_runtime(runtime: &str, args: Option<Vec<String>>) -> Result<()> {
    let bad = |why: String| Err(Failure::new(Code::BadArgument, format!("--runtime {runtime}: {why}")));
    match args {
        None => bad("the engine has no such runtime (`docker info` lists them; `cargo xtask setup --tests` \
             registers runsc, gVisor)"
            .into()),
        Some(args) if runtime == "runsc" && runsc_network(&args) == Some("host") => Ok(()),
        Some(_) if runtime == "runsc" => {
            bad("runsc is registered without `--network=host`: gVisor's own network stack would take the \
             agent's packets past the gateway's rules; add it to the runtime's runtimeArgs in \
             /etc/docker/daemon.json"
                .into())
        }
        Some(_) => {
            bad("only runsc with `--network=host` is known to keep the agent's packets in the namespace \
             whose netfilter holds the gateway's rules; a runtime with a network of its own (a VM's) \
             would take them past it"
                .into())
        }
    }
}

/// The network mode runsc takes from its arguments: the last `--network` given, as Go's flag
/// package reads them (`--network=host`, `-network=host`, `--network host`), so that a later
/// `--network=sandbox` overrides an earlier `--network=host`.
fn runsc_network(args: &[String]) -> Option<&str> {
    let mut mode = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else { continue };
        if let Some(value) = flag.strip_prefix("network=") {
            mode = Some(value);
        } else if flag == "network" {
            mode = args.next().map(String::as_str);
        }
    }
    mode
}

/// The image's own policy: the launcher's copy, kept by the image's id, else read from the
/// created container (an archive call, 40 ms on 2 cores) and kept. The id is the digest of the
/// image's configuration, which names its layers' contents: one id, one file. A copy that does
/// not parse is read again from the container.
async fn baked_policy(sandbox: &Sandbox, image_id: &str) -> Result<Policy> {
    let kept = sandbox_images::cache_home().and_then(|home| policy_copy(&home, image_id));
    if let Some(policy) = kept.as_deref().and_then(read_own).and_then(|b| parse_baked_policy(&b).ok()) {
        return Ok(policy);
    }
    let text = sandbox.get(sandbox_policy::BAKED_POLICY).await?.into_iter().next().map(|(_, b)| b);
    let bytes = text.unwrap_or_default();
    let policy = parse_baked_policy(&bytes)?;
    if let Some(path) = kept {
        // A copy is a saving, not a need: one that cannot be written is not.
        let _ = keep(&path, &bytes);
    }
    Ok(policy)
}

/// Where the policy of the image `id` is kept under `cache`; None for an id that is no
/// `sha256:` digest (nothing safe to key a copy by).
fn policy_copy(cache: &Path, id: &str) -> Option<std::path::PathBuf> {
    let hex = id.strip_prefix("sha256:")?;
    let digest = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    digest.then(|| cache.join("agent-sandbox/baked-policy").join(format!("{hex}.yaml")))
}

/// Writes `bytes` at `path` whole or not at all (a temporary file renamed into place), in
/// folders made mode 0700, the file mode 0600.
fn keep(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let tmp = dir.join(format!(".{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(bytes)?;
    std::fs::rename(&tmp, path)
}

/// The bytes of `path` if it is a file (not a link) of this user's that nobody else may write:
/// a copy another user could have put there decides nothing.
fn read_own(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(crate::approve::no_follow()).open(path).ok()?;
    let meta = file.metadata().ok()?;
    let own = meta.is_file() && meta.uid() == rustix::process::getuid().as_raw() && meta.mode() & 0o022 == 0;
    let mut bytes = Vec::new();
    (own && file.read_to_end(&mut bytes).is_ok()).then_some(bytes)
}

/// The image's own policy from its file's bytes (none: empty, which the parser refuses).
pub fn parse_baked_policy(bytes: &[u8]) -> Result<Policy> {
    Policy::from_yaml(Path::new(sandbox_policy::BAKED_POLICY), &String::from_utf8_lossy(bytes))
        .map_err(|e| Failure::new(Code::BadPolicy, format!("the image's policy: {e}")))
}

/// `--image`, else `<prefix>/agent-<agent>:<tag>` if the engine has it (the tag `cargo xtask
/// build` gives the platform: the version itself for this machine's, `<version>-arm64` for
/// arm64 built on amd64), else the digest images.lock pins (pulled; an index gives the
/// platform's manifest). The image must be of `platform` (`--platform`), or of the engine's own
/// where the launcher chose it; one of another platform than the engine's is named as emulated.
pub async fn image(
    engine: &Engine,
    agent: &str,
    given: Option<&str>,
    platform: Option<Platform>,
) -> Result<(String, ImageFacts)> {
    let native = engine.platform().await?;
    let (reference, facts) = find_image(engine, agent, given, platform, native).await?;
    // `--image` is the user's choice, of whatever platform; the launcher's own must be the one
    // it looked for.
    let asked = if given.is_some() { platform } else { platform.or(native) };
    if let Some(note) = check_platform(&reference, &facts.platform, asked, native)? {
        eprintln!("agent-sandbox: {note}");
    }
    Ok((reference, facts))
}

/// [`image`]'s search, without its check: `k8s`, which runs nothing here, prints the image
/// found for the cluster to pull.
pub async fn find_image(
    engine: &Engine,
    agent: &str,
    given: Option<&str>,
    platform: Option<Platform>,
    native: Option<Platform>,
) -> Result<(String, ImageFacts)> {
    let wanted = platform.or(native).unwrap_or_default();
    let build = match wanted == Platform::host() {
        true => format!("cargo xtask build {agent}"),
        false => format!("cargo xtask build --platform {wanted} {agent}"),
    };
    if let Some(reference) = given {
        return match engine.image(reference).await? {
            Some(facts) => Ok((reference.to_string(), facts)),
            None => Err(Failure::new(
                Code::NoImage,
                format!(
                    "no image {reference} in the engine: build it (`{build}` in a checkout of agent-sandbox) or pull it"
                ),
            )),
        };
    }
    let prefix = std::env::var(sandbox_images::naming::PREFIX_ENV)
        .unwrap_or_else(|_| sandbox_images::naming::DEFAULT_PREFIX.into());
    let local = format!(
        "{}:{}",
        sandbox_images::naming::repository(&prefix, agent),
        wanted.tag(sandbox_images::naming::VERSION)
    );
    if let Some(facts) = engine.image(&local).await? {
        return Ok((local, facts));
    }
    if let Some(pinned) = pinned(agent)? {
        eprintln!("agent-sandbox: {local} is not built here; pulling {pinned}");
        engine.pull(&pinned, None).await?;
        let mut facts = engine.image(&pinned).await?;
        // The engine names one platform's image by the index's digest: the last one pulled.
        if facts.as_ref().is_some_and(|f| f.platform.parse::<Platform>().ok() != Some(wanted)) {
            engine.pull(&pinned, Some(wanted)).await?;
            facts = engine.image(&pinned).await?;
        }
        if let Some(facts) = facts {
            return Ok((pinned, facts));
        }
    }
    Err(Failure::new(
        Code::NoImage,
        format!(
            "no image for `{agent}`: {local} is not in the engine and images.lock pins no published digest for it. \
             Build it with `{build}` in a checkout of agent-sandbox, or pass --image REF"
        ),
    ))
}

/// Whether the image found (`found`, its platform as the engine records it) may run: of the
/// platform asked for, if one was (else an error naming both); and a note when it is not the
/// engine's own, which runs it under emulation. Pure.
pub fn check_platform(
    reference: &str,
    found: &str,
    asked: Option<Platform>,
    native: Option<Platform>,
) -> Result<Option<String>> {
    let image = found.parse::<Platform>().ok();
    if let Some(asked) = asked
        && image != Some(asked)
    {
        return Err(Failure::new(
            Code::NoImage,
            format!("{reference} is a {found} image, not {asked} (--platform {asked})"),
        ));
    }
    Ok(match (image, native) {
        (Some(image), Some(native)) if image != native => Some(format!(
            "{reference} is {image}, not the engine's {native}: it runs under the engine's emulation. Under \
             qemu-user (binfmt_misc on Linux) netfilter's netlink is not translated, so sandbox-init cannot program \
             the firewall and refuses to start the agent, unless --offline leaves it no network to filter"
        )),
        _ => None,
    })
}

/// The digest the lock pins for `agent`: $AGENT_SANDBOX_IMAGES_LOCK's lock if set (a missing or
/// invalid file fails, naming it), else the one built in.
pub fn pinned(agent: &str) -> Result<Option<String>> {
    let lock = match std::env::var_os(IMAGES_LOCK_ENV) {
        Some(path) => {
            let path = PathBuf::from(path);
            let bad = |e: String| {
                Failure::new(Code::BadArgument, format!("{IMAGES_LOCK_ENV}={}: {e}", path.display()))
            };
            if !path.is_file() {
                return Err(bad("no such file".into()));
            }
            sandbox_images::lock::ImagesLock::read(&path).map_err(|e| bad(format!("{e:#}")))?
        }
        None => serde_json::from_str(IMAGES_LOCK).map_err(|e| {
            Failure::new(
                Code::NoImage,
                format!("the images.lock built into this launcher does not parse: {e}"),
            )
        })?,
    };
    Ok(lock.images.get(agent).and_then(|image| image.pinned.clone()))
}

/// Waits for `sandbox ready`, following the container's log (no polling), or reports why
/// sandbox-init stopped.
pub async fn wait_ready(sandbox: &Sandbox) -> Result<()> {
    let name = &sandbox.name;
    let followed = tokio::time::timeout(START_TIMEOUT, sandbox.follow_until(sandbox_policy::layout::READY));
    let log = match followed.await {
        Ok(Ok((true, _))) => return Ok(()),
        Ok(Ok((false, log))) => log,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(Failure::new(
                Code::Sandbox,
                format!(
                    "{name} is not ready after {} s: `agent-sandbox logs {name}`",
                    START_TIMEOUT.as_secs()
                ),
            ));
        }
    };
    // The log ended: the container stopped.
    let code = sandbox.exited().await?.map_or_else(|| "its log ended".to_string(), |c| format!("exit {c}"));
    let tail: Vec<&str> = log.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect();
    Err(Failure::new(
        Code::Sandbox,
        format!("{name} stopped at start ({code}); sandbox-init said:\n{}", tail.join("\n")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_policy_is_kept_by_its_digest_alone() {
        let cache = Path::new("/c");
        let hex = "0123456789abcdef".repeat(4);
        assert_eq!(
            policy_copy(cache, &format!("sha256:{hex}")),
            Some(Path::new("/c/agent-sandbox/baked-policy").join(format!("{hex}.yaml")))
        );
        // Nothing that is not a whole sha256 digest keys a copy: a name, a tag, a path.
        for id in ["", "shell", "localhost/agent-sandbox/agent-shell:0.1.0", "sha256:../../x", "sha256:abc"] {
            assert_eq!(policy_copy(cache, id), None, "{id}");
        }
        assert_eq!(policy_copy(cache, &format!("sha256:{}", hex.to_uppercase())), None);
        let dir = tempfile::tempdir().unwrap();
        let path = policy_copy(dir.path(), &format!("sha256:{hex}")).unwrap();
        keep(&path, b"version: 1\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"version: 1\n");
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temporary file stays");
        assert_eq!(read_own(&path).as_deref(), Some(&b"version: 1\n"[..]));
        // A copy others may write, or a link, decides nothing.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read_own(&path), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(read_own(&link), None);
    }

    #[test]
    fn an_image_of_another_platform_than_asked_is_refused_and_one_not_the_engines_is_named() {
        let (amd64, arm64) = (Some(Platform::Amd64), Some(Platform::Arm64));
        assert_eq!(check_platform("i", "linux/amd64", None, amd64).unwrap(), None);
        assert_eq!(check_platform("i", "linux/arm64/v8", arm64, arm64).unwrap(), None);
        let refused = check_platform("i", "linux/amd64", arm64, amd64).unwrap_err();
        assert_eq!(refused.code, Code::NoImage);
        assert!(refused.message.contains("i is a linux/amd64 image, not linux/arm64"), "{}", refused.message);
        // An image of a platform this project does not build is refused only when one was asked.
        assert!(check_platform("i", "linux/riscv64", arm64, amd64).is_err());
        assert_eq!(check_platform("i", "linux/riscv64", None, amd64).unwrap(), None);
        let emulated = check_platform("i", "linux/arm64/v8", arm64, amd64).unwrap().unwrap();
        assert!(
            emulated.contains("not the engine's linux/amd64") && emulated.contains("--offline"),
            "{emulated}"
        );
        assert!(
            check_platform("i", "linux/arm64", None, amd64).unwrap().is_some(),
            "named without --platform too"
        );
        assert_eq!(
            check_platform("i", "linux/arm64", None, None).unwrap(),
            None,
            "an engine of no known platform"
        );
    }

    #[test]
    fn a_runtime_is_taken_only_where_the_agents_packets_cross_the_gateways_rules() {
        let args = |list: &[&str]| Some(list.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        for ok in [
            &["--network=host"][..],
            &["--network", "host"],
            &["-network=sandbox", "--debug", "--network=host"],
        ] {
            assert!(check_runtime("runsc", args(ok)).is_ok(), "{ok:?}");
        }
        for (runtime, args, says) in [
            ("runsc", None, "no such runtime"),
            ("runsc", Some(vec![]), "without `--network=host`"),
            // runsc takes the last: a later `--network=sandbox` overrides `--network=host`.
            ("runsc", args(&["--network=host", "--network=sandbox"]), "without `--network=host`"),
            ("runsc", args(&["--network=host", "-network", "sandbox"]), "without `--network=host`"),
            ("kata", Some(vec!["--network=host".into()]), "only runsc"),
        ] {
            let refused = check_runtime(runtime, args).unwrap_err();
            assert_eq!(refused.code, Code::BadArgument);
            assert!(refused.message.contains(says), "{refused}");
        }
    }

    #[test]
    fn the_images_lock_built_in_parses() {
        let lock: sandbox_images::lock::ImagesLock = serde_json::from_str(IMAGES_LOCK).unwrap();
        assert!(lock.images.contains_key("shell"), "{:?}", lock.images.keys());
    }
}
