//! What `agent-sandbox run` will make, decided before the engine makes anything, and pure: the
//! container (its name, labels, mounts, limits, variables), its state volumes, and the files put
//! into it before it starts. Built from the flags, what `host` read, the image's facts and the
//! git guard's plan; `run` only executes it. The keys are chosen last ([`SandboxSpec::secrets`]),
//! once the image's baked policy says which APIs it reaches.

use std::collections::HashMap;
use std::path::Path;

use bollard::models::{ContainerCreateBody, HealthConfig, HostConfig, HostConfigLogConfig, Mount, MountType};
use sandbox_images::labels;
use sandbox_policy::apis::APIS;
use sandbox_policy::layout::{AGENT_UID, DNS_ENV, GATEWAY_CAPS, ROLE_ENV, RUN_DIR, SECRETS_DIR, SHARED_DIR};
use sandbox_policy::{Allowlist, Policy};

use crate::approve::{self, RUNTIME_DROP_IN};
use crate::engine::{Entry, Found, ImageFacts};
use crate::exit::{Code, Failure, Result};
use crate::flags::RunFlags;
use crate::gitguard::{GitSnapshot, GuardMount};
use crate::host::Host;
use crate::identity;

const DEFAULT_PIDS: i64 = 2048;
/// The mode of sidecar mode's run-folder tmpfs in the agent's container (the agent's own).
const RUN_DIR_MODE: &str = "mode=0755";
/// The gateway's processes: PID 1, the name check, the forwarder, nft and the probes it starts.
const GATEWAY_PIDS: i64 = 256;

/// The sandbox `run` makes. Its `Debug` shows no key.
pub struct SandboxSpec {
    /// The container as `ls` will list it: name, agent, project, state volume, git snapshot.
    pub found: Found,
    /// The state volumes, in the order of the image's state directories, and their labels.
    pub volumes: Vec<String>,
    pub volume_labels: HashMap<String, String>,
    pub body: ContainerCreateBody,
    /// Sidecar mode: the holder, which owns the network namespace, and the gateway in it.
    pub holder: Option<ContainerCreateBody>,
    pub gateway: Option<ContainerCreateBody>,
    /// Drop-ins (`--allow`, `--policy`) and the host's sign-in files; root's unless the agent's.
    pub files: Vec<Entry>,
    /// The image's id, which keys the launcher's copy of its policy (run.rs, `baked_policy`).
    pub image_id: String,
    agent: String,
    /// Whether a missing key is fine: `--no-key`, `--login-from-host`, `--offline`.
    keyless: bool,
    keys: HashMap<String, String>,
    /// The variables given by `--key-file`, not taken from the environment.
    explicit: std::collections::BTreeSet<String>,
}

impl std::fmt::Debug for SandboxSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxSpec")
            .field("name", &self.found.name)
            .field("volumes", &self.volumes)
            .field("files", &self.files)
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl SandboxSpec {
    /// The sandbox of `flags.agent` on the project `host` read, from `image` (`facts` its
    /// facts); `git` is the guard's plan (None with `--writable-git-config`), `logins` the
    /// host's sign-in files `--login-from-host` read: (path in the sandbox, contents).
    pub fn new(
        flags: &RunFlags,
        host: &Host,
        image: &str,
        facts: &ImageFacts,
        git: Option<(Vec<GuardMount>, GitSnapshot)>,
        logins: Vec<(String, Vec<u8>)>,
    ) -> Result<SandboxSpec> {
        let project = host.project.to_string_lossy().into_owned();
        let name = identity::container_name(&flags.agent, &host.project);
        let state_dirs = facts.state_dirs();
        let base = flags.state.clone().unwrap_or_else(|| name.clone());
        let volumes: Vec<String> = state_dirs
            .iter()
            .enumerate()
            .map(|(index, dir)| identity::state_volume(&base, index, dir))
            .collect();
        let owner = HashMap::from([
            (labels::LAUNCHER_AGENT.to_string(), flags.agent.clone()),
            (labels::LAUNCHER_PROJECT.to_string(), project.clone()),
        ]);
        let bind = |source: String, target: String, read_only: bool| Mount {
            target: Some(target),
            source: Some(source),
            typ: Some(MountType::BIND),
            read_only: read_only.then_some(true),
            ..Default::default()
        };
        let mut mounts = vec![bind(project.clone(), crate::gitguard::WORKSPACE.into(), false)];
        let mut container_labels = owner.clone();
        let mut snapshot = String::new();
        if let Some((guard, before)) = git {
            mounts.extend(guard.into_iter().map(|m| Mount {
                read_only: Some(m.read_only),
                ..bind(m.source.display().to_string(), m.target, m.read_only)
            }));
            snapshot = serde_json::to_string(&before).expect("a snapshot serialises");
            container_labels.insert(labels::LAUNCHER_GIT.to_string(), snapshot.clone());
        }
        mounts.extend(state_dirs.iter().zip(&volumes).map(|(dir, volume)| Mount {
            target: Some(dir.clone()),
            source: Some(volume.clone()),
            typ: Some(MountType::VOLUME),
            ..Default::default()
        }));
        let state = volumes.first().cloned().unwrap_or_default();
        container_labels.insert(labels::LAUNCHER_STATE.to_string(), state.clone());
        if let Some(dns) = flags.dns.filter(|dns| !sandbox_policy::resolver_outside(dns)) {
            return Err(Failure::new(
                Code::BadArgument,
                format!(
                    "--dns {dns}: give a resolver outside the sandbox; on loopback the agent could bind its \
                     address and answer for it"
                ),
            ));
        }
        let log_config = HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([("max-size".into(), "10m".into()), ("max-file".into(), "3".into())])),
        };
        let mut host_config = HostConfig {
            mounts: Some(mounts),
            cap_add: (!flags.offline).then(|| vec!["NET_ADMIN".to_string()]),
            network_mode: if flags.offline { Some("none".into()) } else { flags.network.clone() },
            dns: flags.dns.map(|dns| vec![dns.to_string()]),
            pids_limit: Some(flags.pids_limit.unwrap_or(DEFAULT_PIDS)),
            memory: Some(host.memory),
            nano_cpus: flags.cpus.map(|c| (c * 1e9) as i64),
            log_config: Some(log_config.clone()),
            ..Default::default()
        };
        let mut env = host.env.clone();
        let mut user = None;
        let (mut holder, mut gateway) = (None, None);
        if flags.sidecar() {
            let shared = identity::shared_volume(&name);
            let gateway_name = identity::gateway_name(&name);
            container_labels.insert(labels::LAUNCHER_GATEWAY.to_string(), gateway_name.clone());
            let sidecar_labels = HashMap::from([
                (labels::LAUNCHER_GATEWAY_OF.to_string(), name.clone()),
                (labels::LAUNCHER_PROJECT.to_string(), project.clone()),
            ]);
            // The holder owns the network namespace and runs nothing, so that the gateway and
            // the agent's container each restart into the one the gateway's table is in.
            holder = Some(ContainerCreateBody {
                image: Some(image.to_string()),
                user: Some("65534:65534".into()),
                entrypoint: Some(vec!["/usr/local/bin/sandbox-init".into(), "hold".into()]),
                // It holds no firewall: the image's health check would call it unhealthy.
                healthcheck: Some(no_healthcheck()),
                labels: Some(sidecar_labels.clone()),
                host_config: Some(HostConfig {
                    network_mode: host_config.network_mode.take(),
                    dns: host_config.dns.take(),
                    cap_drop: Some(vec!["ALL".into()]),
                    security_opt: Some(vec!["no-new-privileges".into()]),
                    readonly_rootfs: Some(true),
                    pids_limit: Some(8),
                    log_config: Some(log_config.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            let in_namespace = Some(format!("container:{}", identity::holder_name(&name)));
            // The agent's container: the agent, without any capability, in the holder's
            // namespace; its run folder its own, the gateway's shared folder read-only.
            host_config.network_mode = in_namespace.clone();
            host_config.cap_add = None;
            host_config.runtime = flags.runtime.clone();
            host_config.cap_drop = Some(vec!["ALL".into()]);
            host_config.security_opt = Some(vec!["no-new-privileges".into()]);
            host_config.tmpfs = Some(HashMap::from([(
                RUN_DIR.to_string(),
                format!("uid={AGENT_UID},gid={AGENT_UID},{RUN_DIR_MODE}"),
            )]));
            host_config.mounts.get_or_insert_with(Vec::new).push(Mount {
                target: Some(SHARED_DIR.into()),
                source: Some(shared.clone()),
                typ: Some(MountType::VOLUME),
                read_only: Some(true),
                ..Default::default()
            });
            user = Some(format!("{AGENT_UID}:{AGENT_UID}"));
            env.push(format!("{ROLE_ENV}=agent"));
            let mut gateway_env = host.env.clone();
            gateway_env.push(format!("{ROLE_ENV}=gateway"));
            gateway_env.extend(flags.dns.map(|dns| format!("{DNS_ENV}={dns}")));
            gateway = Some(ContainerCreateBody {
                image: Some(image.to_string()),
                env: Some(gateway_env),
                labels: Some(sidecar_labels),
                host_config: Some(HostConfig {
                    mounts: Some(vec![Mount {
                        target: Some(SHARED_DIR.into()),
                        source: Some(shared),
                        typ: Some(MountType::VOLUME),
                        ..Default::default()
                    }]),
                    cap_drop: Some(vec!["ALL".into()]),
                    cap_add: Some(GATEWAY_CAPS.iter().map(|c| c.to_string()).collect()),
                    security_opt: Some(vec!["no-new-privileges".into()]),
                    network_mode: in_namespace,
                    pids_limit: Some(GATEWAY_PIDS),
                    log_config: Some(log_config),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            user,
            env: Some(env),
            labels: Some(container_labels),
            host_config: Some(host_config),
            // Sidecar mode's agent container would run the image's health check as the agent's
            // own uid, which could answer for it: the gateway's is the sandbox's.
            healthcheck: flags.sidecar().then(no_healthcheck),
            ..Default::default()
        };
        let root_file = |path: &str, contents: Vec<u8>| Entry {
            path: path.to_string(),
            contents: Some(contents),
            mode: 0o644,
            uid: 0,
        };
        let mut files = Vec::new();
        if !flags.allow.is_empty() {
            files.push(root_file(RUNTIME_DROP_IN, approve::render(&flags.allow).into_bytes()));
        }
        files.extend(host.policies.iter().map(|(path, bytes)| root_file(path, bytes.clone())));
        for (inside, bytes) in logins {
            if !state_dirs.iter().any(|d| Path::new(&inside).starts_with(d)) {
                return Err(Failure::new(
                    Code::NoLogin,
                    format!("--login-from-host: {inside} is in none of the image's state directories"),
                ));
            }
            files.push(Entry { path: inside, contents: Some(bytes), mode: 0o600, uid: u64::from(AGENT_UID) });
        }
        let mut keys = host.keys_in_env.clone();
        keys.extend(host.key_files.clone());
        Ok(SandboxSpec {
            found: Found {
                gateway: if flags.sidecar() { identity::gateway_name(&name) } else { String::new() },
                name,
                agent: flags.agent.clone(),
                project,
                state,
                git: snapshot,
                image: image.to_string(),
                ..Default::default()
            },
            volumes,
            volume_labels: owner,
            body,
            holder,
            gateway,
            files,
            image_id: facts.id.clone(),
            agent: flags.agent.clone(),
            keyless: flags.no_key || flags.login_from_host || flags.offline,
            explicit: host.key_files.keys().cloned().collect(),
            keys,
        })
    }

    /// Points the agent at the user's model server (`run --model-server`): its variables on the
    /// agent's container, its name in the hosts file of the network namespace's owner (the
    /// holder, in sidecar mode, whose file the other containers share), its address for the
    /// forwarder (on the gateway too, in sidecar mode), and no model API key handed over (the
    /// forwarder would send it to the server).
    pub fn use_model_server(&mut self, plan: crate::model::Plan) {
        // The agent's processes take the URL and the model; PID 1 with the firewall (the one
        // container, or the gateway) the address its forwarder alone reaches.
        self.body.env.get_or_insert_with(Vec::new).extend(plan.env.iter().cloned());
        if let Some(gateway) = self.gateway.as_mut() {
            gateway.env.get_or_insert_with(Vec::new).extend(plan.env);
        }
        let owner = self.holder.as_mut().unwrap_or(&mut self.body);
        owner.host_config.get_or_insert_with(Default::default).extra_hosts = Some(plan.extra_hosts);
        let api_vars: Vec<&str> = APIS.iter().flat_map(|api| api.keys.iter().map(|k| k.var)).collect();
        self.keys.retain(|var, _| !api_vars.contains(&var.as_str()));
        self.keyless = true;
    }

    /// What Podman (4.3, through its Docker-compatible API) takes otherwise: the agent's run
    /// folder as a tmpfs given to the container's user by Podman's own `U` option, as it refuses
    /// `uid=`. Only sidecar mode's agent container has that tmpfs.
    pub fn for_podman(&mut self) {
        if let Some(tmpfs) = self.body.host_config.as_mut().and_then(|h| h.tmpfs.as_mut()) {
            tmpfs.insert(RUN_DIR.to_string(), format!("U,{RUN_DIR_MODE}"));
        }
    }

    /// The keys of the APIs `baked` (the image's policy) reaches, as root-only secret files;
    /// without one, a failure saying how to give it, unless the sandbox may start keyless.
    pub fn secrets(&self, baked: &Policy) -> Result<Vec<Entry>> {
        let (mut keys, wanted) = keys_for(baked, &self.keys);
        if keys.is_empty() && !wanted.is_empty() && !self.keyless {
            let first = wanted[0];
            return Err(Failure::new(
                Code::NoKey,
                format!(
                    "no key for {}: export {} (or pass --key-file {first}=FILE); it goes in as the root-only \
                     secret {SECRETS_DIR}/{}, which sandbox-init holds and the agent never sees. \
                     --no-key starts it without (sign in inside the session)",
                    self.agent,
                    wanted.join(" or "),
                    first.to_ascii_lowercase()
                ),
            ));
        }
        keys.extend(tokens_for(baked, &self.keys, &self.explicit));
        let mut entries = Vec::new();
        if !keys.is_empty() {
            entries.push(Entry { path: SECRETS_DIR.into(), contents: None, mode: 0o700, uid: 0 });
        }
        for (var, key) in keys {
            let path = format!("{SECRETS_DIR}/{}", var.to_ascii_lowercase());
            entries.push(Entry { path, contents: Some(key.into_bytes()), mode: 0o400, uid: 0 });
        }
        Ok(entries)
    }
}

/// The image's HEALTHCHECK turned off (`--no-healthcheck`), for a container of it that runs
/// something other than a sandbox's PID 1.
pub fn no_healthcheck() -> HealthConfig {
    HealthConfig { test: Some(vec!["NONE".into()]), ..Default::default() }
}

/// The keys the APIs `baked` allows take, from those given (`--key-file` over the environment):
/// (variable, key); and every variable those APIs take.
fn keys_for(baked: &Policy, given: &HashMap<String, String>) -> (Vec<(String, String)>, Vec<&'static str>) {
    let mut keys = Vec::new();
    let mut wanted = Vec::new();
    for api in apis_reached(baked) {
        for key in api.keys {
            wanted.push(key.var);
            if let Some(value) = given.get(key.var) {
                keys.push((key.var.to_string(), value.trim().to_string()));
            }
        }
    }
    (keys, wanted)
}

/// The model APIs the policy `baked` (an image's) reaches, whose keys sandbox-init holds.
pub fn apis_reached(baked: &Policy) -> Vec<&'static sandbox_policy::apis::Api> {
    let allowlist = Allowlist::new(baked);
    APIS.iter().filter(|api| allowlist.matches(api.host).is_some()).collect()
}

/// The tokens of the built-in forwarded services (GitHub, npm) `baked` names, of those given:
/// none is required (without one, the forwarder serves public reads). Where the policy keeps a
/// service direct (the copilot image), sandbox-init gives its token to the agent itself: only a
/// token given on purpose (`--key-file`) goes in, never one that is merely in the environment.
fn tokens_for(
    baked: &Policy,
    given: &HashMap<String, String>,
    explicit: &std::collections::BTreeSet<String>,
) -> Vec<(String, String)> {
    let services = sandbox_policy::forward::BUILTINS.iter().filter(|b| baked.services.contains(b.name));
    let mut tokens = Vec::new();
    for service in services {
        let direct = baked.forward.get(service.name).is_some_and(|f| f.direct);
        for var in service.token_vars.iter().filter(|v| !direct || explicit.contains(**v)) {
            tokens.extend(given.get(*var).map(|t| (var.to_string(), t.trim().to_string())));
        }
    }
    tokens
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser as _;

    use super::*;
    use crate::flags::{Cli, Command};

    fn flags(args: &[&str]) -> RunFlags {
        let mut argv = vec!["agent-sandbox", "run"];
        argv.extend(args);
        match Cli::parse_from(argv).command {
            Command::Run(flags) => *flags,
            other => panic!("{other:?}"),
        }
    }

    fn host() -> Host {
        Host {
            project: PathBuf::from("/home/ana/src/app"),
            policies: vec![("/etc/agent-sandbox/policy.d/run-1-extra.txt".into(), b"docs.rs\n".to_vec())],
            env: vec!["EDITOR=vi".into(), "SANDBOX_UNATTENDED=1".into()],
            key_files: HashMap::from([("ANTHROPIC_API_KEY".into(), "sk-from-file".into())]),
            keys_in_env: HashMap::from([
                ("ANTHROPIC_API_KEY".into(), "sk-from-env".into()),
                ("OPENAI_API_KEY".into(), "sk-openai".into()),
            ]),
            memory: 8 << 30,
        }
    }

    fn claude() -> ImageFacts {
        ImageFacts {
            id: format!("sha256:{}", "a".repeat(64)),
            env: vec![format!(
                "{}=/home/agent/.claude:/home/agent/.config/claude:/tmp/x",
                sandbox_policy::layout::STATE_DIRS_ENV
            )],
            labels: HashMap::new(),
            entrypoint: vec!["/usr/local/bin/sandbox-init".into()],
            platform: "linux/amd64".into(),
        }
    }

    fn guard() -> (Vec<GuardMount>, GitSnapshot) {
        let mounts = vec![GuardMount {
            source: PathBuf::from("/home/ana/src/app/.git/config"),
            target: "/workspace/.git/config".into(),
            read_only: true,
        }];
        (mounts, GitSnapshot::default())
    }

    /// What the engine is asked to make, as it is asked: the container, the volumes, the files.
    fn render(spec: &SandboxSpec) -> String {
        let files: Vec<String> = spec.files.iter().map(|f| format!("{f:?}")).collect();
        let mut body = serde_json::to_value(&spec.body).unwrap();
        // Sorted, so that the snapshot does not depend on a hash map's order.
        body["Labels"] = serde_json::to_value(
            spec.body.labels.iter().flatten().collect::<std::collections::BTreeMap<_, _>>(),
        )
        .unwrap();
        format!(
            "name: {}\nvolumes: {:?}\nfiles:\n  {}\ncontainer: {}\n",
            spec.found.name,
            spec.volumes,
            files.join("\n  "),
            serde_json::to_string_pretty(&body).unwrap()
        )
    }

    #[test]
    fn a_claude_sandbox_on_a_project() {
        let flags = flags(&["claude", "--allow", "docs.rs", "--cpus", "1.5", "--state", "mine"]);
        let logins = vec![("/home/agent/.claude/.credentials.json".to_string(), b"{}".to_vec())];
        let spec =
            SandboxSpec::new(&flags, &host(), "agent-claude:1", &claude(), Some(guard()), logins).unwrap();
        insta::assert_snapshot!(render(&spec));
    }

    #[test]
    fn an_offline_sandbox_with_writable_git_config() {
        let flags = flags(&["shell", "--offline", "--writable-git-config", "--pids-limit", "64"]);
        let spec = SandboxSpec::new(&flags, &host(), "agent-shell:1", &claude(), None, vec![]).unwrap();
        let host_config = spec.body.host_config.as_ref().unwrap();
        assert_eq!(host_config.network_mode.as_deref(), Some("none"));
        assert_eq!(host_config.cap_add, None, "no NET_ADMIN without a network");
        assert_eq!(host_config.pids_limit, Some(64));
        assert!(!spec.body.labels.as_ref().unwrap().contains_key(labels::LAUNCHER_GIT));
        assert_eq!(
            host_config.mounts.as_ref().unwrap().iter().filter(|m| m.typ == Some(MountType::BIND)).count(),
            1
        );
    }

    /// Sidecar mode: the agent's container holds no capability, no key variable and the shared
    /// folder read-only; the gateway holds NET_ADMIN and the resolver, in its namespace.
    #[test]
    fn a_sidecar_sandbox_is_an_agent_container_without_capabilities_and_its_gateway() {
        let sidecar = flags(&["claude", "--sidecar", "--dns", "10.0.0.53"]);
        let spec =
            SandboxSpec::new(&sidecar, &host(), "agent-claude:1", &claude(), Some(guard()), vec![]).unwrap();
        let agent = spec.body.host_config.as_ref().unwrap();
        assert_eq!((agent.cap_add.clone(), agent.cap_drop.clone()), (None, Some(vec!["ALL".to_string()])));
        assert_eq!(agent.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(spec.body.user.as_deref(), Some("1000:1000"));
        let shared = agent.mounts.iter().flatten().find(|m| m.target.as_deref() == Some(SHARED_DIR)).unwrap();
        assert_eq!(
            (shared.read_only, shared.source.as_deref()),
            (Some(true), Some(&*identity::shared_volume(&spec.found.name)))
        );
        let env = spec.body.env.clone().unwrap();
        assert!(
            env.contains(&"SANDBOX_ROLE=agent".to_string()) && !env.iter().any(|e| e.contains("sk-")),
            "{env:?}"
        );
        let labels = spec.body.labels.as_ref().unwrap();
        assert_eq!(labels[labels::LAUNCHER_GATEWAY], identity::gateway_name(&spec.found.name));
        assert_eq!(spec.found.gateway, identity::gateway_name(&spec.found.name), "run makes it by that name");
        let gateway = spec.gateway.as_ref().unwrap();
        let host_config = gateway.host_config.as_ref().unwrap();
        // NET_ADMIN and what PID 1 needs, no other capability, and no gaining any.
        assert_eq!(host_config.cap_drop, Some(vec!["ALL".to_string()]));
        let caps = host_config.cap_add.clone().unwrap();
        assert!(caps.contains(&"NET_ADMIN".to_string()) && caps.len() == GATEWAY_CAPS.len(), "{caps:?}");
        assert_eq!(host_config.security_opt, Some(vec!["no-new-privileges".to_string()]));
        let in_namespace = Some(format!("container:{}", identity::holder_name(&spec.found.name)));
        assert_eq!(host_config.network_mode, in_namespace, "the gateway joins the holder's namespace");
        assert_eq!(agent.network_mode, in_namespace, "so does the agent's container");
        assert_eq!(agent.dns, None, "a joined container takes no resolver of its own");
        let holder = spec.holder.as_ref().unwrap();
        let holder_host = holder.host_config.as_ref().unwrap();
        assert_eq!(holder_host.network_mode, None, "the holder is on the engine's default bridge");
        assert_eq!(holder_host.dns, Some(vec!["10.0.0.53".to_string()]));
        assert_eq!(
            (holder_host.cap_drop.clone(), holder_host.readonly_rootfs),
            (Some(vec!["ALL".to_string()]), Some(true))
        );
        assert_eq!(
            holder.entrypoint,
            Some(vec!["/usr/local/bin/sandbox-init".to_string(), "hold".to_string()])
        );
        assert!(!holder.labels.as_ref().unwrap().contains_key(labels::LAUNCHER_AGENT));
        let none = Some(vec!["NONE".to_string()]);
        assert_eq!(holder.healthcheck.as_ref().and_then(|h| h.test.clone()), none);
        assert_eq!(
            spec.body.healthcheck.as_ref().and_then(|h| h.test.clone()),
            none,
            "the agent's container"
        );
        assert_eq!(gateway.healthcheck, None, "the gateway keeps the image's");
        let gateway_env = gateway.env.clone().unwrap();
        assert!(gateway_env.contains(&"SANDBOX_ROLE=gateway".to_string()), "{gateway_env:?}");
        assert!(gateway_env.contains(&"SANDBOX_DNS=10.0.0.53".to_string()), "{gateway_env:?}");
        let gateway_labels = gateway.labels.as_ref().unwrap();
        assert!(
            !gateway_labels.contains_key(labels::LAUNCHER_AGENT),
            "ls would list the gateway as a sandbox"
        );
        assert_eq!(gateway_labels[labels::LAUNCHER_GATEWAY_OF], spec.found.name);
        // One container: no gateway, the resolver for Docker to use.
        let single = SandboxSpec::new(
            &flags(&["claude", "--dns", "10.0.0.53"]),
            &host(),
            "i",
            &claude(),
            None,
            vec![],
        )
        .unwrap();
        assert!(single.gateway.is_none());
        assert_eq!(single.body.host_config.unwrap().dns, Some(vec!["10.0.0.53".to_string()]));
    }

    /// `--runtime runsc`: the agent's container under gVisor, its gateway on the default runtime.
    #[test]
    fn another_runtime_is_the_agents_containers_alone_and_implies_sidecar_mode() {
        let spec =
            SandboxSpec::new(&flags(&["shell", "--runtime", "runsc"]), &host(), "i", &claude(), None, vec![])
                .unwrap();
        assert_eq!(spec.body.host_config.as_ref().unwrap().runtime.as_deref(), Some("runsc"));
        let gateway = spec.gateway.as_ref().expect("sidecar mode");
        assert_eq!(gateway.host_config.as_ref().unwrap().runtime, None, "the gateway needs nftables");
    }

    #[test]
    fn a_resolver_the_agent_could_take_over_is_refused() {
        for dns in ["127.0.0.53", "::1", "0.0.0.0", "::ffff:127.0.0.1"] {
            let refused =
                SandboxSpec::new(&flags(&["shell", "--dns", dns]), &host(), "i", &claude(), None, vec![])
                    .unwrap_err();
            assert_eq!(refused.code, Code::BadArgument, "{dns}");
            assert!(refused.message.contains(&format!("--dns {dns}")), "{refused}");
        }
    }

    #[test]
    fn a_sign_in_file_outside_the_state_directories_is_refused() {
        let logins = vec![("/home/agent/.bashrc".to_string(), b"x".to_vec())];
        let refused =
            SandboxSpec::new(&flags(&["claude"]), &host(), "i", &claude(), None, logins).unwrap_err();
        assert_eq!(refused.code, Code::NoLogin);
        assert!(refused.message.contains("/home/agent/.bashrc"), "{refused}");
    }

    #[test]
    fn only_the_keys_of_apis_the_policy_allows_are_handed_over_and_a_key_file_wins() {
        let spec = SandboxSpec::new(&flags(&["claude"]), &host(), "i", &claude(), None, vec![]).unwrap();
        let policy = |text: &str| Policy::from_yaml(Path::new("p.yaml"), text).unwrap();
        let anthropic = spec.secrets(&policy("version: 1\nservices: [anthropic]\n")).unwrap();
        let written: Vec<(&str, Option<&[u8]>)> =
            anthropic.iter().map(|e| (e.path.as_str(), e.contents.as_deref())).collect();
        assert_eq!(
            written,
            [(SECRETS_DIR, None), ("/run/secrets/anthropic_api_key", Some(&b"sk-from-file"[..]))],
        );
        assert!(anthropic.iter().all(|e| e.uid == 0 && e.mode & 0o077 == 0));
        let github = spec.secrets(&policy("version: 1\nservices: [github]\n")).unwrap();
        assert!(github.is_empty(), "no API, no key");
        // A GitHub token goes in where the policy names GitHub, and only there; it is no model
        // API's key, so an image that wants one still stops without it.
        let mut with_token =
            SandboxSpec::new(&flags(&["claude"]), &host(), "i", &claude(), None, vec![]).unwrap();
        with_token.keys = HashMap::from([("GH_TOKEN".to_string(), "ghp_from_env".to_string())]);
        let github = with_token.secrets(&policy("version: 1\nservices: [github]\n")).unwrap();
        assert_eq!(github.last().map(|e| e.path.as_str()), Some("/run/secrets/gh_token"));
        assert!(with_token.secrets(&policy("version: 1\nservices: [npm]\n")).unwrap().is_empty());
        let both = with_token.secrets(&policy("version: 1\nservices: [anthropic, github]\n")).unwrap_err();
        assert_eq!(both.code, Code::NoKey);
        // Where GitHub is direct, the agent gets the token: only one given with --key-file.
        let direct = policy("version: 1\nforward:\n  github:\n    direct: true\n");
        assert!(with_token.secrets(&direct).unwrap().is_empty(), "an ambient token handed to the agent");
        with_token.explicit.insert("GH_TOKEN".into());
        assert_eq!(with_token.secrets(&direct).unwrap().len(), 2);
        let gemini = spec.secrets(&policy("version: 1\nservices: [google]\n")).unwrap_err();
        assert_eq!(gemini.code, Code::NoKey);
        assert!(gemini.message.contains("GEMINI_API_KEY"), "{gemini}");
        let keyless =
            SandboxSpec::new(&flags(&["gemini", "--no-key"]), &host(), "i", &claude(), None, vec![]).unwrap();
        assert!(keyless.secrets(&policy("version: 1\nservices: [google]\n")).unwrap().is_empty());
    }
}
