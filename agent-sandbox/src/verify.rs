//! `agent-sandbox verify IMAGE`: whether a user's own image and policy hold, checked the way the
//! attacks:: suite checks the shipped ones. A test world on a private internal network of the
//! engine, made of containers of the image itself running the static probe (nothing is pulled):
//! a peer under an allowed and a blocked name on one address, a listener under no name, and an
//! upstream DNS server that logs every query. Then the image as a sandbox with NET_ADMIN, its
//! policy plus the allowed name, and each check run as the agent, with a positive control,
//! reading its evidence where it lands (the peer's log, the resolver's log). The world is removed
//! at the end, on Ctrl-C too.

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
use serde::Serialize;

use crate::engine::{Engine, Entry, Found, Sandbox};
use crate::exit::{Code, Failure, Result};
use crate::flags::VerifyFlags;

/// Where the probe is mounted in every container of the world.
const PROBE: &str = "/opt/agent-sandbox-verify/sandbox-probe";
const ALLOWED: &str = "allowed.verify.test";
const BLOCKED: &str = "blocked.verify.test";
/// An allowed name that only the upstream resolver knows: the engine's own DNS answers the peer's
/// aliases itself, so the DNS checks' control asks this one.
const UPSTREAM: &str = "upstream.verify.test";
const PEER_LOG: &str = "/tmp/agent-sandbox-verify-peer.log";
const ZONE: &str = "/tmp/agent-sandbox-verify-zone";
const QUERIES: &str = "/tmp/agent-sandbox-verify-queries";
/// The port of the listener the agent opens for the inbound check.
const INBOUND: u16 = 8081;
/// The drop-in that allows the world's allowed name, beside the image's own drop-ins.
const DROP_IN: &str = "agent-sandbox-verify.yaml";
/// Labels every container and the network of a world, with the world's name.
const LABEL: &str = "io.github.agent-sandbox.verify";

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    #[serde(rename = "N/A")]
    NotApplicable,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NotApplicable => "N/A",
        })
    }
}

/// One line of the scorecard.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub id: &'static str,
    pub check: &'static str,
    pub verdict: Verdict,
    /// What was seen, on the receiving side where there is one: one line.
    pub evidence: String,
    /// What a FAIL means for the user.
    pub meaning: &'static str,
}

/// The scorecard, as `--json` prints it (docs/verify.schema.json).
#[derive(Debug, Serialize)]
pub struct Card {
    pub image: String,
    /// Whether the image's entrypoint is sandbox-init.
    pub sandbox_init: bool,
    pub checks: Vec<Outcome>,
    pub passed: usize,
    pub failed: usize,
    pub not_applicable: usize,
    pub seconds: f64,
}

pub async fn run(flags: &VerifyFlags) -> Result<i32> {
    let probe = probe_path(flags.probe.as_deref())?;
    let policy = match &flags.policy {
        Some(path) => Some(read_policy(path)?),
        None => None,
    };
    let engine = Engine::connect().await?;
    let facts = engine.image(&flags.image).await?.ok_or_else(|| {
        Failure::new(Code::NoImage, format!("no image {} in the engine: build or pull it first", flags.image))
    })?;
    let sandbox_init = facts.entrypoint.iter().any(|e| e.contains("sandbox-init"));
    let started = Instant::now();
    let world = World::new(&engine, &flags.image, &probe, sandbox_init);
    eprintln!("verify: building the test world for {} (network {})", flags.image, world.net);
    let checks = tokio::select! {
        result = async {
            world.build(policy.as_deref()).await?;
            eprintln!("verify: running the checks as the agent");
            world.checks().await
        } => result,
        _ = tokio::signal::ctrl_c() => Err(Failure::new(Code::Sandbox, "interrupted: the test world is removed")),
    };
    world.remove().await;
    let checks = checks?;
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    let card = Card {
        image: flags.image.clone(),
        sandbox_init,
        passed: count(Verdict::Pass),
        failed: count(Verdict::Fail),
        not_applicable: count(Verdict::NotApplicable),
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        checks,
    };
    if flags.json {
        println!("{}", serde_json::to_string_pretty(&card).expect("the card is JSON"));
    } else {
        print!("{}", render(&card));
    }
    Ok(if card.failed > 0 { Code::Failed as i32 } else { 0 })
}

/// The probe binary: `--probe`, `AGENT_SANDBOX_PROBE`, or `sandbox-probe` beside this program.
fn probe_path(given: Option<&Path>) -> Result<PathBuf> {
    let beside = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("sandbox-probe")));
    let path = given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("AGENT_SANDBOX_PROBE").map(PathBuf::from))
        .or(beside)
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            Failure::new(
                Code::BadArgument,
                "verify needs the static probe binary (tests/probe, `sandbox-probe`): give it with --probe \
                 FILE or AGENT_SANDBOX_PROBE, or put it beside agent-sandbox; the suites build it as \
                 target/agent-sandbox/sandbox-probe",
            )
        })?;
    std::fs::canonicalize(&path)
        .map_err(|e| Failure::new(Code::BadArgument, format!("{}: {e}", path.display())))
}

fn read_policy(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::new(Code::BadPolicy, format!("{}: {e}", path.display())))?;
    sandbox_policy::Policy::from_yaml(path, &text)
        .map_err(|e| Failure::new(Code::BadPolicy, e.to_string()))?;
    Ok(text)
}

/// The scorecard as text: one line per check, the evidence and, for a FAIL, what it means.
pub fn render(card: &Card) -> String {
    let mut out = format!(
        "agent-sandbox verify {}{}\n\n",
        card.image,
        if card.sandbox_init { "" } else { " (its entrypoint is not sandbox-init)" }
    );
    for c in &card.checks {
        out.push_str(&format!("{:<5} {:<24} {}\n", c.verdict.to_string(), c.id, c.check));
        out.push_str(&format!("      {}\n", c.evidence));
        if c.verdict == Verdict::Fail {
            out.push_str(&format!("      means: {}\n", c.meaning));
        }
    }
    out.push_str(&format!(
        "\n{} passed, {} failed, {} not applicable, in {:.1} s\n",
        card.passed, card.failed, card.not_applicable, card.seconds
    ));
    out
}

/// The test world: its network and containers, and where each peer answers.
struct World {
    engine: Engine,
    image: String,
    probe: PathBuf,
    sandbox_init: bool,
    net: String,
    policy_dir: tempfile::TempDir,
    nanos: u32,
    containers: std::sync::Mutex<Vec<String>>,
    addrs: std::sync::Mutex<HashMap<&'static str, IpAddr>>,
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
    fn new(engine: &Engine, image: &str, probe: &Path, sandbox_init: bool) -> World {
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

    fn addr(&self, role: &str) -> IpAddr {
        self.addrs.lock().expect("addresses")[role]
    }

    /// The peer's IPv6 address, where the network has IPv6.
    fn addr6(&self, role: &str) -> Option<IpAddr> {
        self.addrs.lock().expect("addresses").get(v6_role(role)).copied()
    }

    fn handle(&self, role: &str) -> Sandbox {
        let id = format!("{}.{role}", self.net);
        self.engine.sandbox(Found { id: id.clone(), name: id, ..Default::default() })
    }

    async fn build(&self, policy: Option<&str>) -> Result<()> {
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
    async fn start(
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

    async fn wait_for(&self, role: &str, line: &str, within: Duration) -> Result<()> {
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
    async fn remove(&self) {
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
    async fn probe(&self, args: &[&str]) -> Result<HashMap<String, String>> {
        let out = self.as_agent("sandbox", &[&[PROBE], args].concat()).await?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    async fn as_agent(&self, role: &str, cmd: &[&str]) -> Result<String> {
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

    /// How many requests the listener under no name has logged: each check that reaches it adds
    /// one.
    async fn outside_requests(&self) -> Result<usize> {
        Ok(self.read("outside", PEER_LOG).await?.lines().filter(|l| l.starts_with("http 80 ")).count())
    }

    /// A file of a peer's, read through the engine (no `cat` needed in the image).
    async fn read(&self, role: &str, path: &str) -> Result<String> {
        let files = self.handle(role).get(path).await?;
        Ok(files.into_iter().map(|(_, c)| String::from_utf8_lossy(&c).into_owned()).collect())
    }

    /// The world's own controls, from the site peer as root: the listener under no name logs a
    /// request (by IPv4, and IPv6 where there is one) and answers UDP and ICMP, and the resolver
    /// answers a direct query. A world where one fails would make a refusal look like a PASS:
    /// verify stops instead.
    async fn controls(&self) -> Result<()> {
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

    async fn checks(&self) -> Result<Vec<Outcome>> {
        self.controls().await?;
        let mut out = Vec::new();
        let outcome =
            |f: &HashMap<String, String>| f.get("outcome").cloned().unwrap_or_else(|| "(none)".into());
        let site_log = || self.read("site", PEER_LOG);
        let outside = self.addr("outside").to_string();
        let dns = self.addr("dns").to_string();

        // The control of every egress check: the allowed name, reached.
        let allowed = self.probe(&["tcp", ALLOWED, "80", "--http"]).await?;
        let reached = site_log().await?.contains(&format!("host={ALLOWED}"));
        out.push(Outcome {
            id: "egress.allowed",
            check: "an allowed name is reachable (the control of the egress checks)",
            verdict: if reached { Verdict::Pass } else { Verdict::Fail },
            evidence: format!("{ALLOWED}:80: {}; the peer {}", outcome(&allowed), logged(reached)),
            meaning: "the allowlist lets nothing through: the agent cannot work, and the refusals below prove nothing",
        });
        let control = |refused: bool, evidence: String| {
            if !reached {
                (Verdict::Fail, format!("{evidence}; but the control (the allowed name) failed"))
            } else {
                (if refused { Verdict::Pass } else { Verdict::Fail }, evidence)
            }
        };

        let blocked = self.probe(&["tcp", BLOCKED, "80", "--http"]).await?;
        let leaked = site_log().await?.contains(&format!("host={BLOCKED}"));
        let (verdict, evidence) =
            control(!leaked, format!("{BLOCKED}:80: {}; the peer {}", outcome(&blocked), logged(leaked)));
        out.push(Outcome {
            id: "egress.blocked-name",
            check: "a name the policy does not list is refused",
            verdict,
            evidence,
            meaning: "the agent reaches names outside the allowlist",
        });

        let fronted = self.probe(&["tcp", ALLOWED, "80", "--http", "--host", BLOCKED]).await?;
        let leaked = site_log().await?.contains(&format!("host={BLOCKED}"));
        let (verdict, evidence) = control(
            !leaked,
            format!(
                "Host: {BLOCKED} to {ALLOWED}'s address: {}; the peer {}",
                outcome(&fronted),
                logged(leaked)
            ),
        );
        out.push(Outcome {
            id: "names.host",
            check: "another site's Host on an allowed address is refused",
            verdict,
            evidence,
            meaning: "any site that shares an address with an allowed one (a CDN) is reachable",
        });

        // Two requests on one connection, the second for the blocked name.
        let hosts = |log: &str, name: &str| log.matches(&format!("host={name} ")).count();
        let log = site_log().await?;
        let (allowed_before, blocked_before) = (hosts(&log, ALLOWED), hosts(&log, BLOCKED));
        let pipelined = self.probe(&["http-pipeline", ALLOWED, "80", ALLOWED, BLOCKED]).await?;
        let log = site_log().await?;
        let first = hosts(&log, ALLOWED) > allowed_before;
        let leaked = hosts(&log, BLOCKED) > blocked_before;
        out.push(Outcome {
            id: "names.second-request",
            check: "a second request on one connection, for another site, is refused",
            verdict: match (first, leaked) {
                (true, false) => Verdict::Pass,
                _ => Verdict::Fail,
            },
            evidence: format!(
                "GET for {ALLOWED}, then for {BLOCKED}, on one connection: {}; the peer logged the first {}, the second {}",
                outcome(&pipelined),
                if first { "(the control)" } else { "not at all (the control failed)" },
                if leaked { "too" } else { "not" }
            ),
            meaning: "a site that shares an address with an allowed one is reached after a first allowed request",
        });

        let hello = self.probe(&["tls-hello", ALLOWED, "443"]).await?;
        let fronted = self.probe(&["tls-hello", ALLOWED, "443", "--sni", BLOCKED]).await?;
        let sni_control = outcome(&hello).starts_with("answered");
        let passed = outcome(&fronted).starts_with("answered");
        out.push(Outcome {
            id: "names.sni",
            check: "another site's SNI on an allowed address is refused",
            verdict: match (sni_control, passed) {
                (true, false) => Verdict::Pass,
                _ => Verdict::Fail,
            },
            evidence: format!(
                "SNI {BLOCKED}: {}; the control, SNI {ALLOWED}: {} (the peer echoes what it receives)",
                outcome(&fronted),
                outcome(&hello)
            ),
            meaning: "TLS to any site that shares an address with an allowed one is let through",
        });

        let before = self.outside_requests().await?;
        let direct = self.probe(&["tcp", &outside, "80", "--http"]).await?;
        let leaked = self.outside_requests().await? > before;
        let (verdict, evidence) = control(
            !leaked,
            format!(
                "{outside}:80, an address under no allowed name: {}; the listener {}",
                outcome(&direct),
                logged(leaked)
            ),
        );
        out.push(Outcome {
            id: "egress.address",
            check: "an address no allowed name resolves to is refused",
            verdict,
            evidence,
            meaning: "the agent connects to any address by its number, past every name",
        });

        let udp = self.probe(&["udp", &outside, "9"]).await?;
        let answered = outcome(&udp) == "echoed";
        let (verdict, evidence) = control(
            !answered,
            format!("UDP to {outside}:9: {} (the listener echoes what it receives)", outcome(&udp)),
        );
        out.push(Outcome {
            id: "egress.udp",
            check: "UDP to an address outside the policy is refused",
            verdict,
            evidence,
            meaning: "datagrams leave to any address (QUIC, a tunnel)",
        });

        let icmp = self.probe(&["icmp", &outside]).await?;
        let (verdict, evidence) =
            control(outcome(&icmp) != "reply", format!("an ICMP echo to {outside}: {}", outcome(&icmp)));
        out.push(Outcome {
            id: "egress.icmp",
            check: "ICMP to an address outside the policy is refused",
            verdict,
            evidence,
            meaning: "pings carry data to any address (an ICMP tunnel)",
        });

        let ipv6_meaning = "the agent leaves over IPv6, past a firewall that filters IPv4 alone";
        out.push(match self.addr6("outside") {
            Some(outside6) => {
                let outside6 = outside6.to_string();
                let before = self.outside_requests().await?;
                let direct = self.probe(&["tcp", &outside6, "80", "--http"]).await?;
                let leaked = self.outside_requests().await? > before;
                let (verdict, evidence) = control(
                    !leaked,
                    format!("[{outside6}]:80: {}; the listener {}", outcome(&direct), logged(leaked)),
                );
                Outcome {
                    id: "egress.address-ipv6",
                    check: "an IPv6 address no allowed name resolves to is refused",
                    verdict,
                    evidence,
                    meaning: ipv6_meaning,
                }
            }
            None => Outcome {
                id: "egress.address-ipv6",
                check: "an IPv6 address no allowed name resolves to is refused",
                verdict: Verdict::NotApplicable,
                evidence: "the engine gave the test world's network no IPv6".into(),
                meaning: ipv6_meaning,
            },
        });

        out.push(self.inbound().await?);

        let marker = format!(
            "x{:x}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
        );
        let exfil = format!("{marker}.{BLOCKED}");
        let asked = self.probe(&["dns", &exfil]).await?;
        let control_asked = self.probe(&["dns", UPSTREAM]).await?;
        let queries = self.read("dns", QUERIES).await?;
        let leaked = queries.contains(&marker);
        let upstream_control = queries.contains(UPSTREAM);
        out.push(Outcome {
            id: "dns.exfiltration",
            check: "a query for a name outside the policy never reaches the upstream resolver",
            verdict: match (upstream_control, leaked) {
                (true, false) => Verdict::Pass,
                _ => Verdict::Fail,
            },
            evidence: format!(
                "{exfil}: {}; the resolver {}; the control, {UPSTREAM} (allowed): {}, {}",
                outcome(&asked),
                if leaked { "logged it" } else { "never saw it" },
                outcome(&control_asked),
                if upstream_control { "asked upstream" } else { "never reached the resolver" }
            ),
            meaning: "the agent sends data out in DNS names, to whoever runs that domain's servers",
        });

        let direct_name = format!("d{marker}.{ALLOWED}");
        let direct = self.probe(&["dns", &direct_name, "--server", &dns]).await?;
        let leaked = self.read("dns", QUERIES).await?.contains(&format!("d{marker}"));
        let (verdict, evidence) = control(
            !leaked,
            format!(
                "{direct_name} asked of {dns}:53 directly: {}; the resolver {}",
                outcome(&direct),
                if leaked { "logged it" } else { "never saw it" }
            ),
        );
        out.push(Outcome {
            id: "dns.direct",
            check: "the agent cannot query a resolver directly",
            verdict,
            evidence,
            meaning: "any DNS server is the agent's: names resolve and data leaves past the gate",
        });

        out.push(self.capabilities().await?);
        out.push(self.tamper(&outside, reached).await?);
        out.push(self.policy_files().await?);
        out.push(self.fail_closed(&outside).await?);
        out.push(Outcome {
            id: "keys.held",
            check: "a held API key is invisible to the agent",
            verdict: Verdict::NotApplicable,
            evidence: "no key is given to verify: the forwarder is not in the test world".into(),
            meaning: "the agent could read the user's API key",
        });
        Ok(out)
    }

    /// A listener the agent opens is not reachable from the network: the control reaches it
    /// from inside.
    async fn inbound(&self) -> Result<Outcome> {
        let meaning = "anything on the network reaches what the agent serves (a shell, a tunnel's far end)";
        let port = INBOUND.to_string();
        let start = format!(
            "{PROBE} serve --tcp {port} --log /tmp/agent-sandbox-verify-inbound.log >/dev/null 2>&1 &"
        );
        self.as_agent("sandbox", &["sh", "-c", &start]).await?;
        let mut inside = String::new();
        for _ in 0..20 {
            inside = self.as_agent("sandbox", &[PROBE, "tcp", "127.0.0.1", &port, "--raw"]).await?;
            if inside.contains("outcome=connected") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !inside.contains("outcome=connected") {
            return Ok(Outcome {
                id: "ingress.listener",
                check: "a listener of the agent's cannot be reached from the network",
                verdict: Verdict::NotApplicable,
                evidence: format!(
                    "the agent's listener did not come up (sh and the probe as the agent): {}",
                    first_line(&inside)
                ),
                meaning,
            });
        }
        let sandbox = self.addr("sandbox").to_string();
        let from = self.handle("outside").exec(&[PROBE, "tcp", &sandbox, &port, "--raw"]).await?;
        let reached = from.stdout.contains("outcome=connected");
        Ok(Outcome {
            id: "ingress.listener",
            check: "a listener of the agent's cannot be reached from the network",
            verdict: if reached { Verdict::Fail } else { Verdict::Pass },
            evidence: format!(
                "{sandbox}:{port} from another container: {}; the control, from inside: connected",
                from.stdout.lines().find_map(|l| l.strip_prefix("outcome=")).unwrap_or("(none)")
            ),
            meaning,
        })
    }

    async fn capabilities(&self) -> Result<Outcome> {
        let fields = self.probe(&["caps"]).await?;
        let zero = |k: &str| fields.get(k).is_some_and(|v| v.trim_start_matches('0').is_empty());
        let uid = fields.get("Uid").and_then(|u| u.split_whitespace().next()).unwrap_or("?").to_string();
        let no_new = fields.get("NoNewPrivs").map(String::as_str) == Some("1");
        let sets = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
        let held: Vec<&str> = sets.iter().copied().filter(|s| !zero(s)).collect();
        let good = held.is_empty() && uid != "0" && uid != "?" && no_new;
        Ok(Outcome {
            id: "process.privileges",
            check: "the agent is not root, holds no capability, and cannot gain one (NoNewPrivs)",
            verdict: if good { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "uid {uid}; capability sets {}; NoNewPrivs {}",
                if held.is_empty() {
                    "all empty".to_string()
                } else {
                    format!("{} not empty", held.join(", "))
                },
                fields.get("NoNewPrivs").map_or("unknown", String::as_str)
            ),
            meaning: "the agent can change the firewall, or become root through a setuid program",
        })
    }

    async fn tamper(&self, outside: &str, reached: bool) -> Result<Outcome> {
        let flushed = self.as_agent("sandbox", &["nft", "flush", "ruleset"]).await?;
        let before = self.outside_requests().await?;
        let again = self.probe(&["tcp", outside, "80", "--http"]).await?;
        let leaked = self.outside_requests().await? > before;
        let said = flushed.lines().next().unwrap_or("no output").trim().to_string();
        Ok(Outcome {
            id: "firewall.tamper",
            check: "the agent cannot change the firewall",
            verdict: if !leaked && reached { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "`nft flush ruleset` as the agent: {said}; then {outside}:80: {}",
                again.get("outcome").map_or("(none)", String::as_str)
            ),
            meaning: "the agent turns the firewall off",
        })
    }

    async fn policy_files(&self) -> Result<Outcome> {
        if !self.sandbox_init {
            return Ok(Outcome {
                id: "policy.files",
                check: "the agent cannot change the policy",
                verdict: Verdict::NotApplicable,
                evidence: "the image has no sandbox-init, and so no policy files".into(),
                meaning: "the agent widens its own allowlist",
            });
        }
        let mut written = Vec::new();
        for target in ["/etc/agent-sandbox/policy.yaml", "/etc/agent-sandbox/policy.d/agent.yaml"] {
            let script = format!("echo 'domains: [example.com]' >> {target} && echo WROTE");
            if self.as_agent("sandbox", &["sh", "-c", &script]).await?.contains("WROTE") {
                written.push(target);
            }
        }
        Ok(Outcome {
            id: "policy.files",
            check: "the agent cannot change the policy",
            verdict: if written.is_empty() { Verdict::Pass } else { Verdict::Fail },
            evidence: if written.is_empty() {
                "appending to policy.yaml and writing a drop-in as the agent both failed".into()
            } else {
                format!("the agent wrote {}", written.join(" and "))
            },
            meaning: "the agent widens its own allowlist at the next reload or start",
        })
    }

    /// The image without NET_ADMIN (the engine's default capabilities): it must not start an
    /// agent with an open network.
    async fn fail_closed(&self, outside: &str) -> Result<Outcome> {
        let meaning =
            "without the capability to program its firewall the sandbox runs the agent with an open network";
        let (cmd, probe): (&[&str], bool) =
            if self.sandbox_init { (&[], false) } else { (&["serve", "--udp", "7"], true) };
        self.start("closed", cmd, &[], Some(self.addr("dns")), probe).await?;
        let handle = self.handle("closed");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = handle.logs(None).await?;
            if let Some(code) = handle.exited().await? {
                return Ok(Outcome {
                    id: "egress.fail-closed",
                    check: "without NET_ADMIN the sandbox does not start",
                    verdict: if code != 0 { Verdict::Pass } else { Verdict::Fail },
                    evidence: format!("exited {code}: {}", last_lines(&log)),
                    meaning,
                });
            }
            if log.contains("sandbox ready") || log.contains("peer ready") || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let before = self.outside_requests().await?;
        let out = self.as_agent("closed", &[PROBE, "tcp", outside, "80", "--http"]).await?;
        let leaked = self.outside_requests().await? > before;
        Ok(Outcome {
            id: "egress.fail-closed",
            check: "without NET_ADMIN the sandbox does not start",
            verdict: Verdict::Fail,
            evidence: format!(
                "it runs without NET_ADMIN; {outside}:80 from it: {}{}",
                out.lines().find_map(|l| l.strip_prefix("outcome=")).unwrap_or("(none)"),
                if leaked { ", and the listener logged it" } else { "" }
            ),
            meaning,
        })
    }
}

fn broken(why: String) -> Failure {
    Failure::new(
        Code::Sandbox,
        format!("the test world's own control failed, so no check could be trusted: {why}"),
    )
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("no output").trim()
}

fn logged(yes: bool) -> &'static str {
    if yes { "logged the request" } else { "logged nothing" }
}

fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(2)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(verdicts: &[Verdict]) -> Card {
        let checks: Vec<Outcome> = verdicts
            .iter()
            .map(|&verdict| Outcome {
                id: "egress.address",
                check: "an address no allowed name resolves to is refused",
                verdict,
                evidence: "10.0.0.3:80: refused; the listener logged nothing".into(),
                meaning: "the agent connects to any address",
            })
            .collect();
        Card {
            image: "i".into(),
            sandbox_init: true,
            passed: verdicts.iter().filter(|v| **v == Verdict::Pass).count(),
            failed: verdicts.iter().filter(|v| **v == Verdict::Fail).count(),
            not_applicable: verdicts.iter().filter(|v| **v == Verdict::NotApplicable).count(),
            seconds: 1.0,
            checks,
        }
    }

    #[test]
    fn a_fail_says_what_it_means_and_a_pass_does_not() {
        let text = render(&card(&[Verdict::Pass, Verdict::Fail, Verdict::NotApplicable]));
        assert_eq!(text.matches("means: the agent connects to any address").count(), 1, "{text}");
        assert!(text.contains("PASS  egress.address"), "{text}");
        assert!(text.contains("N/A   egress.address"), "{text}");
        assert!(text.ends_with("1 passed, 1 failed, 1 not applicable, in 1.0 s\n"), "{text}");
    }

    #[test]
    fn the_json_names_verdicts_as_the_schema_does() {
        let json =
            serde_json::to_value(card(&[Verdict::Pass, Verdict::Fail, Verdict::NotApplicable])).unwrap();
        let verdicts: Vec<&str> =
            json["checks"].as_array().unwrap().iter().map(|c| c["verdict"].as_str().unwrap()).collect();
        assert_eq!(verdicts, ["PASS", "FAIL", "N/A"]);
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/verify.schema.json")).expect("the schema is JSON");
        let required: Vec<&str> =
            schema["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        for key in &required {
            assert!(json.get(key).is_some(), "{key} is required by the schema");
        }
        let object = json.as_object().unwrap();
        for key in object.keys() {
            assert!(schema["properties"].get(key).is_some(), "{key} is not in the schema");
        }
        let check = &schema["properties"]["checks"]["items"];
        for key in json["checks"][0].as_object().unwrap().keys() {
            assert!(check["properties"].get(key).is_some(), "checks[].{key} is not in the schema");
        }
        let allowed: Vec<&str> = check["properties"]["verdict"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(allowed, ["PASS", "FAIL", "N/A"]);
    }
}
