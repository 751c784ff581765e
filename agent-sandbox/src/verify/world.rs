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
    CreateContainerOptions, RemoveContainerOptionsBuilder, StartContainerOptions,
};

use crate::engine::{Engine, Entry, Found, Sandbox};
use crate::exit::{Code, Failure, Result};

/// Where the probe is mounted in every container of the world.
pub(super) const PROBE: &str = "/opt/agent-sandbox-verify/sandbox-probe";
pub(super) const ALLOWED: &str = "allowed.verify.test";
pub(super) const BLOCKED: &str = "blocked.verify.test";
/// An allowed name that only the upstream resolver knows: the engine's own DNS answers the peer's
/// aliases itself, so the DNS checks' control asks this one.
pub(super) const UPSTREAM: &str = "upstream.verify.test";
pub(super) const PEER_LOG: &str = "/tmp/agent-sandbox-verify-peer.log";
pub(super) const ZONE: &str = "/tmp/agent-sandbox-verify-zone";
pub(super) const QUERIES: &str = "/tmp/agent-sandbox-verify-queries";
/// The port of the listener the agent opens for the inbound check.
pub(super) const INBOUND: u16 = 8081;
/// The drop-in that allows the world's allowed name, beside the image's own drop-ins.
pub(super) const DROP_IN: &str = "agent-sandbox-verify.yaml";
/// Labels every container and the network of a world, with the world's name.
pub(super) const LABEL: &str = "io.github.agent-sandbox.verify";

/// The test world: its network and containers, and where each peer answers.
pub(super) struct World {
    pub(super) engine: Engine,
    pub(super) image: String,
    pub(super) probe: PathBuf,
    pub(super) sandbox_init: bool,
    pub(super) net: String,
    pub(super) policy_dir: tempfile::TempDir,
    pub(super) nanos: u32,
    pub(super) containers: std::sync::Mutex<Vec<String>>,
    pub(super) addrs: std::sync::Mutex<HashMap<&'static str, IpAddr>>,
}

/// The key of a role's IPv6 address.
fn v6_role(role: &str) -> &'static str {
    match role {
        "site" => "site6",
        "outside" => "outside6",
        "dns" => "dns6",
        "sandbox" => "sandbox6",
        _ => "other6",
    }
}

impl World {
    pub(super) fn new(engine: &Engine, image: &str, probe: &Path, sandbox_init: bool) -> World {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        World {
            engine: engine.clone(),
            image: image.to_string(),
            probe: probe.to_path_buf(),
            sandbox_init,
            net: format!("agent-sandbox-verify-{}-{nanos:08x}", std::process::id()),
            policy_dir: tempfile::tempdir().expect("a temporary folder"),
            nanos,
            containers: Default::default(),
            addrs: Default::default(),
        }
    }

    pub(super) fn addr(&self, role: &str) -> IpAddr {
        self.addrs.lock().expect("addresses")[role]
    }

    /// The peer's IPv6 address, where the network has IPv6.
    pub(super) fn addr6(&self, role: &str) -> Option<IpAddr> {
        self.addrs.lock().expect("addresses").get(v6_role(role)).copied()
    }

    pub(super) fn handle(&self, role: &str) -> Sandbox {
        let id = format!("{}.{role}", self.net);
        self.engine.sandbox(Found { id: id.clone(), name: id, ..Default::default() })
    }

    pub(super) async fn build(&self, policy: Option<&str>) -> Result<()> {
        let docker = self.engine.docker();
        let labels = HashMap::from([(LABEL.to_string(), self.net.clone())]);
        // IPv6 too where the engine gives a network one (a unique local /64 of the world's).
        let subnet = format!("fd00:5e:{:x}:{:x}::/64", std::process::id() & 0xffff, self.nanos & 0xffff);
        let request = NetworkCreateRequest {
            name: self.net.clone(),
            internal: Some(true),
            labels: Some(labels.clone()),
            enable_ipv6: Some(true),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig { subnet: Some(subnet), ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        if docker.create_network(request).await.is_err() {
            let request = NetworkCreateRequest {
                name: self.net.clone(),
                internal: Some(true),
                labels: Some(labels),
                ..Default::default()
            };
            docker.create_network(request).await?;
        }
        let serve = ["serve", "--http", "80", "--echo", "443", "--udp", "9", "--log", PEER_LOG];
        self.start("site", &serve, &[ALLOWED, BLOCKED], None, true).await?;
        self.start("outside", &serve, &[], None, true).await?;
        self.start("dns", &["serve", "--dns", ZONE, QUERIES], &[], None, true).await?;
        for role in ["site", "outside", "dns"] {
            self.wait_for(role, "peer ready", Duration::from_secs(30)).await?;
        }
        let site = self.addr("site");
        let zone = format!(
            "{ALLOWED} A {site} 60\n{BLOCKED} A {site} 60\n*.{BLOCKED} A {site} 60\n{UPSTREAM} A {site} 60\n"
        );
        let file = Entry { path: ZONE.into(), contents: Some(zone.into_bytes()), mode: 0o644, uid: 0 };
        self.handle("dns").put(&[file]).await?;
        let drop_in = format!(
            "version: 1\ndescription: agent-sandbox verify's test world\ndomains:\n  - {ALLOWED}\n  - {UPSTREAM}\n"
        );
        std::fs::write(self.policy_dir.path().join(DROP_IN), drop_in)
            .map_err(|e| Failure::new(Code::Engine, format!("cannot write the test world's policy: {e}")))?;
        if let Some(policy) = policy {
            std::fs::write(self.policy_dir.path().join("policy.yaml"), policy)
                .map_err(|e| Failure::new(Code::Engine, format!("cannot write the policy: {e}")))?;
        }
        let dns = self.addr("dns");
        if self.sandbox_init {
            self.start("sandbox", &[], &[], Some(dns), false).await?;
            self.wait_for("sandbox", "sandbox ready", Duration::from_secs(60)).await?;
        } else {
            // Not a sandbox: the probe idles as its process, as the image's own would run.
            self.start("sandbox", &["serve", "--udp", "7"], &[], Some(dns), true).await?;
            self.wait_for("sandbox", "peer ready", Duration::from_secs(30)).await?;
        }
        Ok(())
    }

    /// Starts a container of the image in the world: a peer (`probe` set: the probe is its
    /// process, as root) or the sandbox (its own entrypoint, NET_ADMIN, the policies).
    pub(super) async fn start(
        &self,
        role: &'static str,
        cmd: &[&str],
        aliases: &[&str],
        dns: Option<IpAddr>,
        probe: bool,
    ) -> Result<()> {
        let name = format!("{}.{role}", self.net);
        let mut binds = vec![format!("{}:{PROBE}:ro", self.probe.display())];
        let mut host = HostConfig { network_mode: Some(self.net.clone()), ..Default::default() };
        if role == "sandbox" || role == "closed" {
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
            if role == "sandbox" {
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
        docker.start_container(&name, None::<StartContainerOptions>).await?;
        let inspect = docker.inspect_container(&name, None).await?;
        let endpoint =
            inspect.network_settings.and_then(|n| n.networks).and_then(|mut n| n.remove(&self.net));
        let parse = |a: Option<String>| a.and_then(|a| a.parse::<IpAddr>().ok());
        let (v4, v6) = match endpoint {
            Some(e) => (parse(e.ip_address), parse(e.global_ipv6_address)),
            None => (None, None),
        };
        let mut addrs = self.addrs.lock().expect("addresses");
        if let Some(v4) = v4 {
            addrs.insert(role, v4);
        }
        if let Some(v6) = v6 {
            addrs.insert(v6_role(role), v6);
        }
        Ok(())
    }

    pub(super) async fn wait_for(&self, role: &str, line: &str, within: Duration) -> Result<()> {
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
                        "the test world's {role} container of {} exited ({code}): {}",
                        self.image,
                        last_lines(&log)
                    ),
                ));
            }
            if Instant::now() > deadline {
                return Err(Failure::new(
                    Code::Sandbox,
                    format!("the test world's {role} container never said `{line}`: {}", last_lines(&log)),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Removes every container and the network, whatever happened.
    pub(super) async fn remove(&self) {
        let docker = self.engine.docker();
        let names: Vec<String> = self.containers.lock().expect("containers").drain(..).collect();
        for name in names {
            let options = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
            let _ = docker.remove_container(&name, Some(options)).await;
        }
        let _ = docker.remove_network(&self.net).await;
    }

    /// The probe as the agent in the sandbox: through sandbox-exec, or as uid 1000 in an image
    /// without sandbox-init. Its `key=value` lines.
    pub(super) async fn probe(&self, args: &[&str]) -> Result<HashMap<String, String>> {
        let out = self.as_agent("sandbox", &[&[PROBE], args].concat()).await?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    pub(super) async fn as_agent(&self, role: &str, cmd: &[&str]) -> Result<String> {
        let handle = self.handle(role);
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

    /// Starts `cmd` as the agent and returns without waiting for it (a listener).
    pub(super) async fn as_agent_detached(&self, role: &str, cmd: &[&str]) -> Result<()> {
        let handle = self.handle(role);
        if self.sandbox_init {
            handle.exec_detached(None, &[&["sandbox-exec", "--"], cmd].concat()).await
        } else {
            handle.exec_detached(Some("1000:1000"), cmd).await
        }
    }

    /// How much the listener under no name has logged: each check that reaches it adds to it.
    pub(super) async fn outside_requests(&self) -> Result<usize> {
        // Each connection it accepted (`conn`) and each request it answered (`http`).
        let log = self.read("outside", PEER_LOG).await?;
        Ok(log.lines().filter(|l| l.starts_with("conn ") || l.starts_with("http ")).count())
    }

    /// A file of a peer's, read through the engine (no `cat` needed in the image).
    pub(super) async fn read(&self, role: &str, path: &str) -> Result<String> {
        let files = self.handle(role).get(path).await?;
        Ok(files.into_iter().map(|(_, c)| String::from_utf8_lossy(&c).into_owned()).collect())
    }

    /// The world's own controls, from the site peer as root: the listener under no name logs a
    /// request (by IPv4, and IPv6 where there is one) and answers UDP and ICMP, and the resolver
    /// answers a direct query. A world where one fails would make a refusal look like a PASS:
    /// verify stops instead.
    pub(super) async fn controls(&self) -> Result<()> {
        let site = self.handle("site");
        let field = |out: &crate::engine::Output, key: &str| {
            out.stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or("(none)")
                .to_string()
        };
        let outside = self.addr("outside").to_string();
        let mut targets = vec![outside.clone()];
        targets.extend(self.addr6("outside").map(|a| a.to_string()));
        for target in targets {
            let before = self.outside_requests().await?;
            let out = site.exec(&[PROBE, "tcp", &target, "80", "--http"]).await?;
            if self.outside_requests().await? <= before {
                return Err(broken(format!(
                    "the listener at {target}:80 logged no request ({})",
                    field(&out, "outcome")
                )));
            }
        }
        let udp = site.exec(&[PROBE, "udp", &outside, "9"]).await?;
        let icmp = site.exec(&[PROBE, "icmp", &outside]).await?;
        if field(&udp, "outcome") != "echoed" || field(&icmp, "outcome") != "reply" {
            return Err(broken(format!(
                "the listener does not answer UDP ({}) or ICMP ({})",
                field(&udp, "outcome"),
                field(&icmp, "outcome")
            )));
        }
        let dns = self.addr("dns").to_string();
        let name = format!("control.{UPSTREAM}");
        site.exec(&[PROBE, "dns", &name, "--server", &dns]).await?;
        if !self.read("dns", QUERIES).await?.contains(&name) {
            return Err(broken("the resolver logged no direct query".into()));
        }
        Ok(())
    }
}

pub(super) fn broken(why: String) -> Failure {
    Failure::new(
        Code::Sandbox,
        format!("the test world's own control failed, so no check could be trusted: {why}"),
    )
}

pub(super) fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(2)..].join(" | ")
}
