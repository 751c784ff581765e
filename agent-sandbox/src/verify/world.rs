//! The test world of `verify`: its internal network, the peers (containers of the image under
//! test running the static probe), the image as the sandbox, and the calls the checks make into
//! them: the probe as the agent, a peer's files read through the engine. It checks itself before
//! any check runs, and is removed whatever happens.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, Ipam, IpamConfig, NetworkCreateRequest,
    NetworkingConfig,
};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions,
};

use sandbox_verify::{
    ALLOWED, BLOCKED, Broken, Closed, DNS_SERVE, DROP_IN, Role, SECRETS_DIR, SITE_SERVE, Stage, ZONE,
};

use crate::engine::{Engine, Entry, Found, Sandbox};
use crate::exit::{Code, Failure, Result};

/// Where the probe is mounted in every container of the world.
pub(super) const PROBE: &str = "/opt/agent-sandbox-verify/sandbox-probe";
/// Labels every container and the network of a world, with the world's name.
pub(super) const LABEL: &str = "io.github.agent-sandbox.verify";

/// The test world: its network and containers, and where each peer answers.
pub(super) struct World {
    pub(super) engine: Engine,
    pub(super) image: String,
    pub(super) probe: PathBuf,
    pub(super) sandbox_init: bool,
    /// Drop-ins beside the image's own and verify's (a running sandbox's), by file name.
    pub(super) drop_ins: Vec<(String, Vec<u8>)>,
    /// Sidecar mode (`--sidecar`, `--runtime`): the sandbox is `run --sidecar`'s pair.
    pub(super) sidecar: bool,
    /// The agent's container's runtime in sidecar mode (`runsc`).
    pub(super) runtime: Option<String>,
    /// Sidecar mode's pair once made: the handle routes root's calls to the gateway.
    pub(super) pair: std::sync::Mutex<Option<Sandbox>>,
    /// The volumes sidecar mode's pair makes, named before they are made.
    pub(super) volumes: std::sync::Mutex<Vec<String>>,
    pub(super) net: String,
    pub(super) policy_dir: tempfile::TempDir,
    pub(super) nanos: u32,
    pub(super) containers: std::sync::Mutex<Vec<String>>,
    /// The key the sandbox holds (variable, value), or why it holds none.
    pub(super) held: std::sync::Mutex<std::result::Result<(String, String), String>>,
    /// Each role's addresses: IPv4, and IPv6 where the network has it.
    pub(super) addrs: std::sync::Mutex<HashMap<Role, (IpAddr, Option<IpAddr>)>>,
}

/// A role's name, in its container's name.
fn role_name(role: Role) -> &'static str {
    match role {
        Role::Site => "site",
        Role::Outside => "outside",
        Role::Dns => "dns",
        Role::Sandbox => "sandbox",
        Role::Closed => "closed",
    }
}

impl World {
    pub(super) fn new(
        engine: &Engine,
        target: &super::target::Target,
        probe: &Path,
        sandbox_init: bool,
    ) -> World {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        World {
            engine: engine.clone(),
            image: target.image.clone(),
            drop_ins: target.drop_ins.clone(),
            probe: probe.to_path_buf(),
            sandbox_init,
            sidecar: target.sidecar,
            runtime: target.runtime.clone(),
            pair: Default::default(),
            volumes: Default::default(),
            net: format!("agent-sandbox-verify-{}-{nanos:08x}", std::process::id()),
            policy_dir: tempfile::tempdir().expect("a temporary folder"),
            nanos,
            containers: Default::default(),
            held: std::sync::Mutex::new(Err("the world was not built".into())),
            addrs: Default::default(),
        }
    }

    /// Where the agent of `role` runs: in sidecar mode the pair's agent container.
    fn agent_side(&self, role: Role) -> Sandbox {
        match (role, self.pair.lock().expect("pair").as_ref()) {
            (Role::Sandbox, Some(pair)) => pair.agent_side(),
            _ => self.handle(role),
        }
    }

    pub(super) fn handle(&self, role: Role) -> Sandbox {
        let id = format!("{}.{}", self.net, role_name(role));
        self.engine.sandbox(Found { id: id.clone(), name: id, ..Default::default() })
    }

    pub(super) async fn build(&self, policy: Option<&str>) -> Result<()> {
        let docker = self.engine.docker();
        let labels = HashMap::from([(LABEL.to_string(), self.net.clone())]);
        // Outside the engine's own (private) ranges: the world's peers play public services,
        // whose answers the gate opens without `private: true` (sandbox_verify::world_subnets).
        // IPv6 too where the engine gives a network one; else IPv4 alone.
        let seed = std::process::id() ^ self.nanos;
        let mut made = Err(Failure::new(Code::Engine, "no free /24 in 198.18.0.0/15 for the test world"));
        for [v4, v6] in sandbox_verify::world_subnets(seed) {
            let mut tried = Ok(());
            for subnets in [vec![v4.clone(), v6], vec![v4]] {
                let ipv6 = subnets.len() > 1;
                let config =
                    subnets.into_iter().map(|s| IpamConfig { subnet: Some(s), ..Default::default() });
                let request = NetworkCreateRequest {
                    name: self.net.clone(),
                    internal: Some(true),
                    labels: Some(labels.clone()),
                    enable_ipv6: Some(ipv6),
                    ipam: Some(Ipam { config: Some(config.collect()), ..Default::default() }),
                    ..Default::default()
                };
                tried = docker.create_network(request).await.map(|_| ());
                if tried.is_ok() {
                    break;
                }
            }
            match tried {
                Ok(()) => {
                    made = Ok(());
                    break;
                }
                Err(e) if sandbox_verify::overlaps(&e.to_string()) => continue,
                Err(e) => {
                    made = Err(e.into());
                    break;
                }
            }
        }
        made?;
        self.start(Role::Site, SITE_SERVE, &[ALLOWED, BLOCKED], None, true).await?;
        self.start(Role::Outside, SITE_SERVE, &[], None, true).await?;
        self.start(Role::Dns, DNS_SERVE, &[], None, true).await?;
        for role in [Role::Site, Role::Outside, Role::Dns] {
            self.wait_for(role, "peer ready", Duration::from_secs(30)).await?;
        }
        let zone = sandbox_verify::zone(self.addr(Role::Site));
        let file = Entry { path: ZONE.into(), contents: Some(zone.into_bytes()), mode: 0o644, uid: 0 };
        self.handle(Role::Dns).put(&[file]).await?;
        std::fs::write(self.policy_dir.path().join(DROP_IN), sandbox_verify::drop_in())
            .map_err(|e| Failure::new(Code::Engine, format!("cannot write the test world's policy: {e}")))?;
        if let Some(policy) = policy {
            std::fs::write(self.policy_dir.path().join("policy.yaml"), policy)
                .map_err(|e| Failure::new(Code::Engine, format!("cannot write the policy: {e}")))?;
        }
        let dns = self.addr(Role::Dns);
        if self.sidecar {
            let pair = self.start_pair(dns, policy).await?;
            *self.pair.lock().expect("pair") = Some(pair);
        } else if self.sandbox_init {
            self.start(Role::Sandbox, &[], &[], Some(dns), false).await?;
            self.wait_for(Role::Sandbox, "sandbox ready", Duration::from_secs(60)).await?;
        } else {
            // Not a sandbox: the probe idles as its process, as the image's own would run.
            self.start(Role::Sandbox, &["serve", "--udp", "7"], &[], Some(dns), true).await?;
            self.wait_for(Role::Sandbox, "peer ready", Duration::from_secs(30)).await?;
        }
        Ok(())
    }

    /// Starts a container of the image in the world: a peer (`probe` set: the probe is its
    /// process, as root) or the sandbox (its own entrypoint, NET_ADMIN, the policies).
    pub(super) async fn start(
        &self,
        role: Role,
        cmd: &[&str],
        aliases: &[&str],
        dns: Option<IpAddr>,
        probe: bool,
    ) -> Result<()> {
        let name = format!("{}.{}", self.net, role_name(role));
        let mut binds = vec![format!("{}:{PROBE}:ro", self.probe.display())];
        let mut host = HostConfig { network_mode: Some(self.net.clone()), ..Default::default() };
        if role == Role::Sandbox || role == Role::Closed {
            // One drop-in beside the image's own, which stay.
            let drop_in = self.policy_dir.path().join(DROP_IN);
            binds.push(format!("{}:/etc/agent-sandbox/policy.d/{DROP_IN}:ro", drop_in.display()));
            let policy = self.policy_dir.path().join("policy.yaml");
            if policy.exists() {
                binds.push(format!("{}:/etc/agent-sandbox/policy.yaml:ro", policy.display()));
            }
            host.dns = dns.map(|d| vec![d.to_string()]);
            // `closed`: the engine's default capabilities, which lack NET_ADMIN (the flag a user
            // forgets).
            if role == Role::Sandbox {
                host.cap_add = Some(vec!["NET_ADMIN".into()]);
            }
        }
        host.binds = Some(binds);
        let endpoint = EndpointSettings {
            aliases: Some(aliases.iter().map(|a| a.to_string()).collect()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            entrypoint: probe.then(|| vec![PROBE.to_string()]),
            cmd: probe.then(|| cmd.iter().map(|c| c.to_string()).collect()),
            user: probe.then(|| "0".to_string()),
            // A peer runs the probe alone: no health check of the image's runs beside it, as
            // root, where the evidence is written.
            healthcheck: probe.then(crate::spec::no_healthcheck),
            labels: Some(HashMap::from([(LABEL.to_string(), self.net.clone())])),
            host_config: Some(host),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(self.net.clone(), endpoint)])),
            }),
            ..Default::default()
        };
        let docker = self.engine.docker();
        let options = CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
        docker.create_container(Some(options), body).await?;
        self.containers.lock().expect("containers").push(name.clone());
        if role == Role::Sandbox {
            self.handle(role).put(&self.drop_in_files()).await?;
            let held = self.key_to_hold().await?;
            *self.held.lock().expect("held key") = held;
        }
        let held = self.held.lock().expect("held key").clone();
        if let (Role::Sandbox, Ok((var, key))) = (role, held) {
            // As `run` gives a key: a root-only file sandbox-init holds.
            let secrets = [
                Entry { path: SECRETS_DIR.into(), contents: None, mode: 0o700, uid: 0 },
                Entry {
                    path: format!("{SECRETS_DIR}/{}", var.to_ascii_lowercase()),
                    contents: Some(key.into_bytes()),
                    mode: 0o400,
                    uid: 0,
                },
            ];
            self.handle(role).put(&secrets).await?;
        }
        docker.start_container(&name, None::<StartContainerOptions>).await?;
        self.record_addresses(&name, role).await
    }

    /// [`World::drop_ins`] as root's files in the policy folder.
    pub(super) fn drop_in_files(&self) -> Vec<Entry> {
        let folder = sandbox_policy::layout::DROP_IN_DIR;
        let drop_ins = self.drop_ins.iter().filter(|(name, _)| name != DROP_IN);
        drop_ins
            .map(|(name, bytes)| Entry {
                path: format!("{folder}/{name}"),
                contents: Some(bytes.clone()),
                mode: 0o644,
                uid: 0,
            })
            .collect()
    }

    /// The addresses of `container` on the world's network, as `role`'s.
    pub(super) async fn record_addresses(&self, container: &str, role: Role) -> Result<()> {
        let inspect = self.engine.docker().inspect_container(container, None).await?;
        let endpoint =
            inspect.network_settings.and_then(|n| n.networks).and_then(|mut n| n.remove(&self.net));
        let parse = |a: Option<String>| a.and_then(|a| a.parse::<IpAddr>().ok());
        let (v4, v6) = match endpoint {
            Some(e) => (parse(e.ip_address), parse(e.global_ipv6_address)),
            None => (None, None),
        };
        if let Some(v4) = v4 {
            self.addrs.lock().expect("addresses").insert(role, (v4, v6));
        }
        Ok(())
    }

    /// A made-up key for the first model API the created sandbox's policy reaches (`--policy`,
    /// else the image's own), whose key sandbox-init would hold; or why there is none.
    async fn key_to_hold(&self) -> Result<std::result::Result<(String, String), String>> {
        if !self.sandbox_init {
            return Ok(Err("the image has no sandbox-init to hold a key".into()));
        }
        let text = self.read(Role::Sandbox, sandbox_policy::BAKED_POLICY).await?;
        let parsed = crate::run::parse_baked_policy(text.as_bytes())?;
        Ok(match crate::spec::apis_reached(&parsed).first().and_then(|api| api.keys.first()) {
            Some(key) => Ok((key.var.to_string(), sandbox_verify::made_up_key())),
            None => {
                Err("the policy reaches no model API whose key sandbox-init holds: no key to hold".into())
            }
        })
    }

    pub(super) async fn wait_for(&self, role: Role, line: &str, within: Duration) -> Result<()> {
        let name = role_name(role);
        let handle = self.handle(role);
        let deadline = Instant::now() + within;
        loop {
            let log = handle.logs(None).await?;
            if log.contains(line) {
                return Ok(());
            }
            if let Some(code) = handle.exited().await? {
                return Err(Failure::new(
                    Code::Sandbox,
                    format!(
                        "the test world's {name} container of {} exited ({code}): {}",
                        self.image,
                        last_lines(&log)
                    ),
                ));
            }
            if Instant::now() > deadline {
                return Err(Failure::new(
                    Code::Sandbox,
                    format!("the test world's {name} container never said `{line}`: {}", last_lines(&log)),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Removes every container and the network, whatever happened: those it named, and any
    /// carrying the world's label (a create that Ctrl-C cut short may still be finishing in the
    /// engine), until the network goes, for up to 10 s.
    pub(super) async fn remove(&self) {
        let docker = self.engine.docker();
        let pair = self.pair.lock().expect("pair").take();
        if let Some(pair) = pair {
            let _ = pair.remove(0).await;
        }
        let mut names: Vec<String> = self.containers.lock().expect("containers").drain(..).collect();
        let label = format!("{LABEL}={}", self.net);
        let filters = HashMap::from([("label", vec![label.as_str()])]);
        for _ in 0..50 {
            let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
            let listed = docker.list_containers(Some(options)).await.unwrap_or_default();
            names.extend(listed.into_iter().filter_map(|c| c.id));
            for name in names.drain(..) {
                let options = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
                let _ = docker.remove_container(&name, Some(options)).await;
            }
            let gone = match docker.remove_network(&self.net).await {
                Ok(()) => true,
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => true,
                Err(_) => false,
            };
            let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
            if gone && docker.list_containers(Some(options)).await.is_ok_and(|l| l.is_empty()) {
                let volumes: Vec<String> = self.volumes.lock().expect("volumes").drain(..).collect();
                for volume in volumes {
                    let _ = self.engine.remove_volume(&volume).await;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "verify: could not remove all of the test world {}: `docker ps -a --filter label={label}`",
            self.net
        );
    }

    fn addr(&self, role: Role) -> IpAddr {
        self.addrs.lock().expect("addresses")[&role].0
    }
}

impl Stage for World {
    type Error = Failure;

    fn sandbox_init(&self) -> bool {
        self.sandbox_init
    }

    fn probe_path(&self) -> &str {
        PROBE
    }

    fn addr(&self, role: Role) -> IpAddr {
        World::addr(self, role)
    }

    fn addr6(&self, role: Role) -> Option<IpAddr> {
        self.addrs.lock().expect("addresses").get(&role).and_then(|a| a.1)
    }

    /// Through sandbox-exec, or as uid 1000 in an image without sandbox-init.
    async fn as_agent(&self, role: Role, cmd: &[&str]) -> Result<String> {
        let handle = self.agent_side(role);
        let out = if self.sandbox_init {
            handle.exec(&[&["sandbox-exec", "--"], cmd].concat()).await
        } else {
            handle.exec_as(Some("1000:1000"), cmd).await
        };
        // A program the image does not have is evidence, not the end of the run.
        Ok(match out {
            Ok(out) => format!("{}{}", out.stdout, out.stderr),
            Err(e) => format!("cannot run {}: {e}", cmd.first().unwrap_or(&"")),
        })
    }

    async fn as_agent_detached(&self, cmd: &[&str]) -> Result<()> {
        let handle = self.agent_side(Role::Sandbox);
        if self.sandbox_init {
            handle.exec_detached(None, &[&["sandbox-exec", "--"], cmd].concat()).await
        } else {
            handle.exec_detached(Some("1000:1000"), cmd).await
        }
    }

    /// In sidecar mode the sandbox's root side is the gateway (the pair's handle routes there).
    async fn peer_exec(&self, role: Role, cmd: &[&str]) -> Result<String> {
        let pair = self.pair.lock().expect("pair").clone();
        let handle = match (role, pair) {
            (Role::Sandbox, Some(pair)) => pair,
            _ => self.handle(role),
        };
        Ok(handle.exec(cmd).await?.stdout)
    }

    /// Through the engine: no `cat` needed in the image.
    async fn read(&self, role: Role, path: &str) -> Result<String> {
        let files = self.agent_side(role).get(path).await?;
        Ok(files.into_iter().map(|(_, c)| String::from_utf8_lossy(&c).into_owned()).collect())
    }

    fn held_key(&self) -> std::result::Result<(String, String), String> {
        self.held.lock().expect("held key").clone()
    }

    async fn closed(&self) -> Result<Closed> {
        let (cmd, probe): (&[&str], bool) =
            if self.sandbox_init { (&[], false) } else { (&["serve", "--udp", "7"], true) };
        self.start(Role::Closed, cmd, &[], Some(self.addr(Role::Dns)), probe).await?;
        let handle = self.handle(Role::Closed);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = handle.logs(None).await?;
            if let Some(code) = handle.exited().await? {
                return Ok(Closed::Exited { code, log });
            }
            if log.contains("sandbox ready") || log.contains("peer ready") || Instant::now() > deadline {
                return Ok(Closed::Running { log });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl From<Broken> for Failure {
    fn from(broken: Broken) -> Failure {
        Failure::new(Code::Sandbox, broken.to_string())
    }
}

pub(super) fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(2)..].join(" | ")
}
