//! `agent-sandbox run`: everything is checked before anything starts (domains, policy files,
//! variables, key files, the project folder), then the sandbox is found or created: its image,
//! its state volumes, its keys as root-only secret files, its drop-ins, the host's sign-in if
//! asked; it is started, and the launcher waits for sandbox-init's `sandbox ready` line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType};
use sandbox_images::labels;
use sandbox_policy::apis::{APIS, key_vars};
use sandbox_policy::{Allowlist, Policy};

use crate::approve::{self, RUNTIME_DROP_IN};
use crate::engine::{self, Entry, ImageFacts};
use crate::exit::{Code, Failure, Result};
use crate::flags::RunFlags;
use crate::identity;

use sandbox_policy::layout::{AGENT_HOME, AGENT_UID, SECRETS_DIR};
const DEFAULT_MEMORY: &str = "8g";
const DEFAULT_PIDS: i64 = 2048;
/// How long sandbox-init may take to say `sandbox ready`.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The pinned digests, as this checkout's images.lock records them once published.
const IMAGES_LOCK: &str = include_str!("../../images.lock");
/// Names an images.lock to take the pinned digests from instead of the one built in: a newer
/// checkout's, once it is published, without installing the launcher again.
pub const IMAGES_LOCK_ENV: &str = "AGENT_SANDBOX_IMAGES_LOCK";

/// What `run` decided before touching the engine.
struct Plan {
    project: PathBuf,
    policies: Vec<(String, Vec<u8>)>,
    env: Vec<String>,
    key_files: HashMap<String, String>,
    memory: i64,
}

fn bad(message: impl Into<String>) -> Failure {
    Failure::new(Code::BadArgument, message)
}

fn plan(flags: &RunFlags) -> Result<Plan> {
    if flags.agent.is_empty()
        || !flags.agent.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(bad(format!(
            "agent `{}`: an image name under images/, such as claude or shell",
            flags.agent
        )));
    }
    let project = std::fs::canonicalize(&flags.dir)
        .map_err(|e| bad(format!("project folder {}: {e}", flags.dir.display())))?;
    if !project.is_dir() {
        return Err(bad(format!("project {} is not a folder", project.display())));
    }
    approve::validate("--allow", &flags.allow)?;
    if !flags.detach && !crate::terminal::interactive() {
        return Err(bad(
            "no terminal to attach to: add --detach, then `agent-sandbox attach` from a terminal",
        ));
    }
    let mut policies = Vec::new();
    for (index, file) in flags.policy.iter().enumerate() {
        Policy::read(file).map_err(|e| Failure::new(Code::BadPolicy, e.to_string()))?;
        let bytes = std::fs::read(file)
            .map_err(|e| Failure::new(Code::BadPolicy, format!("{}: {e}", file.display())))?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        policies.push((format!("{}/run-{}-{name}", sandbox_policy::DROP_IN_DIR, index + 1), bytes));
    }
    let is_key = |name: &str| key_vars().any(|k| k == name);
    let mut env = Vec::new();
    for given in &flags.env {
        let (name, value) = match given.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => {
                let value = std::env::var(given)
                    .map_err(|_| bad(format!("--env {given}: {given} is not set in your environment")))?;
                (given.clone(), value)
            }
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad(format!("--env {given}: `{name}` is not a variable name")));
        }
        if is_key(&name) {
            return Err(bad(format!(
                "--env {name}: a key goes in as a secret file, not a variable the engine shows to anyone \
                 who inspects the container; export {name} (the launcher hands it over) or use --key-file {name}=FILE"
            )));
        }
        env.push(format!("{name}={value}"));
    }
    if flags.unattended {
        env.push(format!("{}=1", sandbox_policy::layout::UNATTENDED_ENV));
    }
    let mut key_files = HashMap::new();
    for given in &flags.key_files {
        let (var, file) = given
            .split_once('=')
            .ok_or_else(|| bad(format!("--key-file {given}: write VAR=FILE, e.g. OPENAI_API_KEY=~/key")))?;
        if !is_key(var) {
            return Err(bad(format!(
                "--key-file {given}: `{var}` is not a key variable sandbox-init holds ({})",
                key_vars().collect::<Vec<_>>().join(", ")
            )));
        }
        let path = expand_home(file);
        let key = std::fs::read_to_string(&path).map_err(|e| {
            Failure::new(Code::NoKey, format!("--key-file {var}: cannot read {}: {e}", path.display()))
        })?;
        let key = key.trim().to_string();
        if key.is_empty() {
            return Err(Failure::new(Code::NoKey, format!("--key-file {var}: {} is empty", path.display())));
        }
        key_files.insert(var.to_string(), key);
    }
    let size = flags.memory.as_deref().unwrap_or(DEFAULT_MEMORY);
    let memory =
        parse_size(size).ok_or_else(|| bad(format!("--memory {size}: write a size such as 4g or 512m")))?;
    if !flags.detach && !crate::terminal::interactive() {
        return Err(bad(
            "no terminal to attach to: add --detach, then `agent-sandbox attach` from a terminal",
        ));
    }
    Ok(Plan { project, policies, env, key_files, memory })
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// `4g`, `512m`, `1024k` or bytes.
fn parse_size(text: &str) -> Option<i64> {
    let text = text.trim().to_ascii_lowercase();
    let text = text.strip_suffix('b').unwrap_or(&text);
    let (number, unit) = match text.char_indices().last()? {
        (i, 'k') => (&text[..i], 1 << 10),
        (i, 'm') => (&text[..i], 1 << 20),
        (i, 'g') => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    let bytes = number.parse::<f64>().ok()? * f64::from(unit);
    (bytes >= 6.0 * f64::from(1 << 20)).then_some(bytes as i64)
}

/// `--image`, else `<prefix>/agent-<agent>:<version>` if the engine has it, else the digest
/// images.lock pins (pulled).
async fn image(docker: &Docker, flags: &RunFlags) -> Result<(String, ImageFacts)> {
    let build = format!("cargo xtask build {}", flags.agent);
    if let Some(reference) = &flags.image {
        return match engine::image(docker, reference).await? {
            Some(facts) => Ok((reference.clone(), facts)),
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
        sandbox_images::naming::repository(&prefix, &flags.agent),
        sandbox_images::naming::VERSION
    );
    if let Some(facts) = engine::image(docker, &local).await? {
        return Ok((local, facts));
    }
    if let Some(pinned) = pinned(&flags.agent)? {
        eprintln!("agent-sandbox: {local} is not built here; pulling {pinned}");
        sandbox_images::engine::ensure_pulled(docker, &pinned).await?;
        if let Some(facts) = engine::image(docker, &pinned).await? {
            return Ok((pinned, facts));
        }
    }
    Err(Failure::new(
        Code::NoImage,
        format!(
            "no image for `{}`: {local} is not in the engine and images.lock pins no published digest for it. \
             Build it with `{build}` in a checkout of agent-sandbox, or pass --image REF",
            flags.agent
        ),
    ))
}

/// The digest the lock pins for `agent`: $AGENT_SANDBOX_IMAGES_LOCK's lock if set (a missing or
/// invalid file fails, naming it), else the one built in.
fn pinned(agent: &str) -> Result<Option<String>> {
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

/// The keys the image's APIs take, from `--key-file` or the environment: (variable, key).
fn keys_for(
    baked: &Policy,
    key_files: &HashMap<String, String>,
) -> (Vec<(String, String)>, Vec<&'static str>) {
    let allowlist = Allowlist::new(baked);
    let mut keys = Vec::new();
    let mut wanted = Vec::new();
    for api in APIS.iter().filter(|api| allowlist.matches(api.host).is_some()) {
        for key in api.keys {
            wanted.push(key.var);
            let value = key_files
                .get(key.var)
                .cloned()
                .or_else(|| std::env::var(key.var).ok().filter(|v| !v.trim().is_empty()));
            if let Some(value) = value {
                keys.push((key.var.to_string(), value.trim().to_string()));
            }
        }
    }
    (keys, wanted)
}

/// The home-relative paths an image's login-files label names. The label is the image's, which
/// anyone may build: a path that leaves the home folder (`..`, an absolute path, `.`) is
/// refused, so that no label makes the launcher read another of the user's files.
fn login_paths(declared: &str) -> Result<Vec<PathBuf>> {
    use std::path::Component;
    declared
        .split(':')
        .filter(|p| !p.is_empty())
        .map(|relative| {
            let path = PathBuf::from(relative);
            let segments_normal = relative.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
            if segments_normal && path.components().all(|c| matches!(c, Component::Normal(_))) {
                Ok(path)
            } else {
                Err(Failure::new(
                    Code::NoLogin,
                    format!(
                        "--login-from-host: the image names `{relative}` as a sign-in file: only a path \
                         inside the home folder, without `..` or `.`, is read"
                    ),
                ))
            }
        })
        .collect()
}

/// A file's bytes, refusing a link as the last component (the CLI writes a plain file there).
fn read_no_link(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The host's sign-in files the image names, read now: (path in the sandbox, contents).
fn login_files(agent: &str, facts: &ImageFacts, state_dirs: &[String]) -> Result<Vec<(String, Vec<u8>)>> {
    let Some(declared) = facts.labels.get(labels::LOGIN_FILES).filter(|l| !l.trim().is_empty()) else {
        return Err(Failure::new(
            Code::NoLogin,
            format!(
                "--login-from-host: the {agent} image names no sign-in files to copy (its CLI keeps none in a file, or takes a key)"
            ),
        ));
    };
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .ok_or_else(|| Failure::new(Code::NoLogin, "--login-from-host: HOME is not set"))?;
    let mut files = Vec::new();
    for relative in login_paths(declared)? {
        let host = home.join(&relative);
        let bytes = read_no_link(&host).map_err(|e| {
            Failure::new(
                Code::NoLogin,
                format!(
                    "--login-from-host: cannot read {}: {e} (sign in on the host first, or drop the flag)",
                    host.display()
                ),
            )
        })?;
        let inside = format!("{AGENT_HOME}/{}", relative.display());
        if !state_dirs.iter().any(|d| Path::new(&inside).starts_with(d)) {
            return Err(Failure::new(
                Code::NoLogin,
                format!("--login-from-host: {inside} is in none of the image's state directories"),
            ));
        }
        files.push((inside, bytes));
    }
    Ok(files)
}

pub async fn run(flags: &RunFlags) -> Result<i32> {
    let plan = plan(flags)?;
    let docker = engine::connect().await?;
    let name = identity::container_name(&flags.agent, &plan.project);
    let project = plan.project.to_string_lossy().into_owned();
    let existing = engine::sandboxes(&docker)
        .await?
        .into_iter()
        .find(|s| s.agent == flags.agent && s.project == project);
    if let Some(found) = existing {
        if found.running {
            let shaping = flags.shaping();
            if !shaping.is_empty() {
                let live = if flags.allow.is_empty() {
                    String::new()
                } else {
                    format!(" (`agent-sandbox allow {} DOMAIN…` widens it live)", found.name)
                };
                return Err(bad(format!(
                    "{} is running on {project}, and {} would shape a new sandbox, not this one: \
                     `agent-sandbox stop {}` first, or run without them to reattach{live}",
                    found.name,
                    shaping.join(", "),
                    found.name,
                )));
            }
            eprintln!("agent-sandbox: {} is running on {project}: reattaching", found.name);
            return if flags.detach { Ok(0) } else { attach_and_check(&docker, &found.id).await };
        }
        // Stopped (the session ended, or the engine restarted): its state is in its volumes.
        engine::remove(&docker, &found.id, 0).await?;
    }
    let (reference, facts) = image(&docker, flags).await?;
    let state_dirs: Vec<String> = facts
        .env_var(sandbox_policy::layout::STATE_DIRS_ENV)
        .unwrap_or_default()
        .split(':')
        .filter(|d| d.starts_with(AGENT_HOME))
        .map(str::to_string)
        .collect();
    let logins =
        if flags.login_from_host { login_files(&flags.agent, &facts, &state_dirs)? } else { Vec::new() };
    let base = flags.state.clone().unwrap_or_else(|| name.clone());
    let owner = HashMap::from([
        (labels::LAUNCHER_AGENT.to_string(), flags.agent.clone()),
        (labels::LAUNCHER_PROJECT.to_string(), project.clone()),
    ]);
    let mut mounts = vec![Mount {
        target: Some(crate::gitguard::WORKSPACE.into()),
        source: Some(project.clone()),
        typ: Some(MountType::BIND),
        ..Default::default()
    }];
    let mut container_labels = owner.clone();
    if flags.writable_git_config {
        eprintln!(
            "agent-sandbox: --writable-git-config: the agent may write {project}'s git configuration and \
             hooks; your own git runs what they name (core.fsmonitor, core.pager, hooks, filters), as you, \
             the next time you use it there"
        );
    } else {
        let (guard, snapshot) = crate::gitguard::plan(&plan.project)
            .map_err(|e| bad(format!("cannot guard {project}'s git files: {e}")))?;
        mounts.extend(guard.into_iter().map(|m| Mount {
            target: Some(m.target),
            source: Some(m.source.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(m.read_only),
            ..Default::default()
        }));
        let snapshot = serde_json::to_string(&snapshot).expect("a snapshot serialises");
        container_labels.insert(labels::LAUNCHER_GIT.to_string(), snapshot);
    }
    // The volumes this run makes: a run that fails removes them (and its container) again.
    let mut made = Vec::new();
    for (index, dir) in state_dirs.iter().enumerate() {
        let volume = identity::state_volume(&base, index, dir);
        if engine::ensure_volume(&docker, &volume, owner.clone()).await? {
            made.push(volume.clone());
        }
        mounts.push(Mount {
            target: Some(dir.clone()),
            source: Some(volume),
            typ: Some(MountType::VOLUME),
            ..Default::default()
        });
    }
    let state = state_dirs.first().map(|d| identity::state_volume(&base, 0, d)).unwrap_or_default();
    container_labels.insert(labels::LAUNCHER_STATE.to_string(), state.clone());
    let host = HostConfig {
        mounts: Some(mounts),
        cap_add: (!flags.offline).then(|| vec!["NET_ADMIN".to_string()]),
        network_mode: if flags.offline { Some("none".into()) } else { flags.network.clone() },
        pids_limit: Some(flags.pids_limit.unwrap_or(DEFAULT_PIDS)),
        memory: Some(plan.memory),
        nano_cpus: flags.cpus.map(|c| (c * 1e9) as i64),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([("max-size".into(), "10m".into()), ("max-file".into(), "3".into())])),
        }),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(reference.clone()),
        env: Some(plan.env.clone()),
        labels: Some(container_labels),
        host_config: Some(host),
        ..Default::default()
    };
    // Nothing half-made is left: a sandbox that cannot be created, prepared or started is
    // removed, with the volumes this run made (its last words are in the failure).
    let mut id = None;
    let started = async {
        let created = engine::create(&docker, &name, body).await?;
        id = Some(created.clone());
        prepare(&docker, &created, &plan, flags, &logins).await?;
        engine::start(&docker, &created).await?;
        wait_ready(&docker, &created, &name).await?;
        Ok::<_, Failure>(created)
    }
    .await;
    let id = match started {
        Ok(created) => created,
        Err(e) => {
            if let Some(id) = id {
                let _ = engine::remove(&docker, &id, 0).await;
            }
            for volume in &made {
                let _ = engine::remove_volume(&docker, volume).await;
            }
            return Err(e);
        }
    };
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
    attach_and_check(&docker, &id).await
}

/// Attaches; when that ends (a detach, or the session's end), names what changed in the
/// project's git files.
async fn attach_and_check(docker: &Docker, id: &str) -> Result<i32> {
    let status = crate::terminal::attach(docker, id).await?;
    if let Ok(found) = engine::find(docker, id).await {
        git_changes(&found)?;
    }
    Ok(status)
}

/// What changed in the project's git files since the sandbox started, as a failure naming each
/// change (exit 72); nothing if they were not guarded (`--writable-git-config`) or nothing
/// changed.
pub fn git_changes(sandbox: &engine::Found) -> Result<i32> {
    if sandbox.git.is_empty() {
        return Ok(0);
    }
    let Ok(before) = serde_json::from_str::<crate::gitguard::GitSnapshot>(&sandbox.git) else {
        return Err(Failure::new(
            Code::GitChanged,
            format!(
                "{}'s record of the project's git files does not parse: check them before you run git in {}",
                sandbox.name, sandbox.project
            ),
        ));
    };
    let changes = before.changes(&crate::gitguard::snapshot(Path::new(&sandbox.project)));
    if changes.is_empty() {
        return Ok(0);
    }
    Err(Failure::new(
        Code::GitChanged,
        format!(
            "the project's git files changed while {} ran; your own git runs what they name, as you: \
             look at each before you run git in {}:\n  {}",
            sandbox.name,
            sandbox.project,
            changes.join("\n  ")
        ),
    ))
}

/// Everything that goes into the created container before it starts: keys, drop-ins, sign-in.
async fn prepare(
    docker: &Docker,
    id: &str,
    plan: &Plan,
    flags: &RunFlags,
    logins: &[(String, Vec<u8>)],
) -> Result<()> {
    let baked_text = engine::get(docker, id, sandbox_policy::BAKED_POLICY)
        .await?
        .into_iter()
        .next()
        .map(|(_, b)| b)
        .unwrap_or_default();
    let baked =
        Policy::from_yaml(Path::new(sandbox_policy::BAKED_POLICY), &String::from_utf8_lossy(&baked_text))
            .map_err(|e| Failure::new(Code::BadPolicy, format!("the image's policy: {e}")))?;
    let (keys, wanted) = keys_for(&baked, &plan.key_files);
    if keys.is_empty() && !wanted.is_empty() && !flags.no_key && !flags.login_from_host && !flags.offline {
        let first = wanted[0];
        return Err(Failure::new(
            Code::NoKey,
            format!(
                "no key for {}: export {} (or pass --key-file {first}=FILE); it goes in as the root-only \
                 secret {SECRETS_DIR}/{}, which sandbox-init holds and the agent never sees. \
                 --no-key starts it without (sign in inside the session)",
                flags.agent,
                wanted.join(" or "),
                first.to_ascii_lowercase()
            ),
        ));
    }
    let mut entries = Vec::new();
    if !keys.is_empty() {
        entries.push(Entry { path: SECRETS_DIR.into(), contents: None, mode: 0o700, uid: 0 });
        for (var, key) in &keys {
            let path = format!("{SECRETS_DIR}/{}", var.to_ascii_lowercase());
            entries.push(Entry { path, contents: Some(key.clone().into_bytes()), mode: 0o400, uid: 0 });
        }
    }
    if !flags.allow.is_empty() {
        let text = approve::render(&flags.allow);
        entries.push(Entry {
            path: RUNTIME_DROP_IN.into(),
            contents: Some(text.into_bytes()),
            mode: 0o644,
            uid: 0,
        });
    }
    for (path, bytes) in &plan.policies {
        entries.push(Entry { path: path.clone(), contents: Some(bytes.clone()), mode: 0o644, uid: 0 });
    }
    for (path, bytes) in logins {
        entries.push(Entry {
            path: path.clone(),
            contents: Some(bytes.clone()),
            mode: 0o600,
            uid: u64::from(AGENT_UID),
        });
    }
    engine::put(docker, id, &entries).await
}

/// Waits for `sandbox ready`, or reports why sandbox-init stopped.
async fn wait_ready(docker: &Docker, id: &str, name: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        let log = engine::logs(docker, id, None).await?;
        if log.lines().any(|l| l.starts_with(sandbox_policy::layout::READY)) {
            return Ok(());
        }
        if let Some(code) = engine::exited(docker, id).await? {
            let tail: Vec<&str> = log.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(Failure::new(
                Code::Sandbox,
                format!("{name} stopped at start (exit {code}); sandbox-init said:\n{}", tail.join("\n")),
            ));
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(Failure::new(
                Code::Sandbox,
                format!(
                    "{name} is not ready after {} s: `agent-sandbox logs {name}`",
                    START_TIMEOUT.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_images_lock_built_in_parses() {
        let lock: sandbox_images::lock::ImagesLock = serde_json::from_str(IMAGES_LOCK).unwrap();
        assert!(lock.images.contains_key("shell"), "{:?}", lock.images.keys());
    }

    #[test]
    fn a_login_label_names_files_in_the_home_folder_alone_and_no_link_is_read() {
        let ok = login_paths(".claude/.credentials.json:.codex/auth.json").unwrap();
        assert_eq!(ok, [PathBuf::from(".claude/.credentials.json"), PathBuf::from(".codex/auth.json")]);
        for bad in ["../.ssh/id_ed25519", "/etc/shadow", ".claude/../../x", "./.claude/x", ".a/./b"] {
            let refused = login_paths(bad).unwrap_err();
            assert_eq!(refused.code, Code::NoLogin, "{bad}");
            assert!(refused.message.contains(bad), "{bad}: {}", refused.message);
        }
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("secret"), "private key").unwrap();
        std::os::unix::fs::symlink(home.path().join("secret"), home.path().join("credentials.json")).unwrap();
        assert!(read_no_link(&home.path().join("credentials.json")).is_err(), "a link was read");
        assert_eq!(read_no_link(&home.path().join("secret")).unwrap(), b"private key");
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("8g"), Some(8 << 30));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("1k"), None, "below the engine's minimum");
        assert_eq!(parse_size("lots"), None);
    }

    #[test]
    fn only_the_keys_of_apis_the_policy_allows_are_handed_over() {
        let files = HashMap::from([("OPENAI_API_KEY".to_string(), "sk-file".to_string())]);
        let anthropic =
            Policy::from_yaml(Path::new("p.yaml"), "version: 1\nservices: [anthropic]\n").unwrap();
        let (keys, wanted) = keys_for(&anthropic, &files);
        assert_eq!(wanted, ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"]);
        assert!(keys.iter().all(|(var, _)| var.starts_with("ANTHROPIC_")), "{keys:?}");
        let openai = Policy::from_yaml(Path::new("p.yaml"), "version: 1\nservices: [openai]\n").unwrap();
        assert_eq!(keys_for(&openai, &files).0, [("OPENAI_API_KEY".to_string(), "sk-file".to_string())]);
        let github = Policy::from_yaml(Path::new("p.yaml"), "version: 1\nservices: [github]\n").unwrap();
        assert_eq!(keys_for(&github, &files), (vec![], vec![]));
    }
}
