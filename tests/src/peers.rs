//! Peers on the private test networks: servers that answer to allowlisted and blocked names
//! (network aliases), a DNS peer that records every query, networks whose names the DNS peer
//! answers, and helper containers running one probe command.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use bollard::models::{ContainerCreateBody, EndpointSettings, HostConfig, NetworkingConfig};

use crate::docker::{TEST_LABEL, TestNet, container_logs, docker, drop_async, exec, exit_code, force_remove};
use crate::images::{forge_peer_image, peer_image};
use crate::probe::{PROBE, Probe};

/// Every peer serves HTTP on 80 and HTTPS on 443 and 8443 (a certificate for its aliases from
/// the test CA), greets on 2222 as a server-first protocol does, echoes on TCP 7 and UDP 5353.
pub const PEER_HTTP: u16 = 80;
/// Ollama's port, where [`Peer::start_model_server`] serves the mock model API.
pub const MODEL_SERVER_PORT: u16 = 11434;
pub const PEER_TLS: &str = "443,8443";
pub const PEER_GREETER: u16 = 2222;
pub const PEER_ECHO: u16 = 7;
pub const PEER_UDP: u16 = 5353;
/// Where the peer logs every connection (with the bytes it brought), handshake (SNI) and
/// request (Host).
const PEER_LOG: &str = "/tmp/peer.log";

/// A peer on a test network: HTTP, HTTPS, a greeter and echoes (see [`PEER_TLS`]), answering
/// to its aliases through Docker's DNS. Optionally a DNS server too.
pub struct Peer {
    pub id: String,
    pub ipv4: IpAddr,
    pub ipv6: IpAddr,
    /// The peer's certificate and key, mounted at /certs.
    _certs: tempfile::TempDir,
    /// Shared by the tests of a run (world.rs): not removed when one test's handle is dropped.
    kept: bool,
}

const ZONE: &str = "/tmp/zone";
const QUERIES: &str = "/tmp/queries.log";
const ICMP6_LOG: &str = "/tmp/icmp6.log";
/// The forge peer's repositories (git/octo/hello.git, git/octo/secret.git) and npm packages
/// (npm/left-pad-sandbox), made when it starts.
pub const FORGE_DIR: &str = "/tmp/forge";

/// How a peer starts: its names, and what it serves beyond the defaults (see [`PEER_TLS`]).
/// `Peer::start` and its kin are the common specs; a test with an unusual peer builds one.
#[derive(Clone, Debug, Default)]
pub struct PeerSpec {
    aliases: Vec<String>,
    dns: bool,
    files: Option<std::path::PathBuf>,
    options: Vec<String>,
    forge: bool,
    /// The whole of its command, in place of the defaults.
    serving: Option<Vec<String>>,
    /// Shared by the tests of a run: its container's name and labels; its certificates kept.
    kept: Option<(String, Vec<(String, String)>)>,
    /// In place of the probe: an image, the command it runs as root, and a folder at /srv.
    program: Option<(String, Vec<String>, std::path::PathBuf)>,
}

impl PeerSpec {
    /// A peer answering to `aliases` through Docker's DNS.
    pub fn named(aliases: &[&str]) -> PeerSpec {
        PeerSpec { aliases: aliases.iter().map(|a| a.to_string()).collect(), ..Default::default() }
    }

    /// Also a DNS server: it answers from a zone it re-reads per query and logs every query.
    pub fn dns(mut self) -> PeerSpec {
        self.dns = true;
        self
    }

    /// Its HTTP and HTTPS ports serve the files of `dir` instead of a greeting.
    pub fn files(mut self, dir: &std::path::Path) -> PeerSpec {
        self.files = Some(dir.to_path_buf());
        self
    }

    /// Its HTTP and HTTPS ports play GitHub and the npm registry (the probe's forge.rs), from
    /// the base image, which has git: it needs aliases such as github.com, api.github.com,
    /// uploads.github.com and registry.npmjs.org.
    pub fn forge(mut self) -> PeerSpec {
        self.forge = true;
        self
    }

    /// Exactly this `sandbox-probe` command, none of the defaults: a peer of another test world's
    /// layout (sandbox-verify's).
    pub fn serving(mut self, command: &[&str]) -> PeerSpec {
        self.serving = Some(command.iter().map(|s| s.to_string()).collect());
        self
    }

    /// In place of the probe's servers: `command` run as root in `image` (a server of another
    /// stack: the wire suite's Node.js and Python), with `dir` mounted read-only at /srv. Ready
    /// once it prints `peer ready`.
    pub fn program(mut self, image: &str, command: &[&str], dir: &std::path::Path) -> PeerSpec {
        let command = command.iter().map(|s| s.to_string()).collect();
        self.program = Some((image.to_string(), command, dir.to_path_buf()));
        self
    }

    /// A peer the tests of a run share (world.rs): named `container`, with `labels` too, and its
    /// certificates outliving the test that started it.
    pub fn kept(mut self, container: &str, labels: &[(&str, &str)]) -> PeerSpec {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.kept = Some((container.to_string(), labels));
        self
    }

    /// An option of `sandbox-probe serve` (tests/probe/src/peer.rs), such as `--mock-api`.
    pub fn option(mut self, option: &str) -> PeerSpec {
        self.options.push(option.to_string());
        self
    }

    pub async fn start(self, net: &TestNet) -> anyhow::Result<Peer> {
        Peer::start_spec(net, self).await
    }
}

impl Peer {
    pub async fn start(net: &TestNet, aliases: &[&str]) -> anyhow::Result<Peer> {
        PeerSpec::named(aliases).start(net).await
    }

    /// A peer that is also a DNS server: it answers from a zone it re-reads per query and logs
    /// every query it receives.
    pub async fn start_dns(net: &TestNet) -> anyhow::Result<Peer> {
        PeerSpec::named(&["dns-peer"]).dns().start(net).await
    }

    /// A peer whose HTTP and HTTPS ports serve the files of `dir` (a git repository for git's
    /// dumb protocol, say) instead of a greeting.
    pub async fn start_serving(
        net: &TestNet,
        aliases: &[&str],
        dir: &std::path::Path,
    ) -> anyhow::Result<Peer> {
        PeerSpec::named(aliases).files(dir).start(net).await
    }

    /// A peer whose HTTPS port is the mock model API (the probe's mock.rs), under `aliases`
    /// (the real API host names): it logs every request with its credentials and the turn.
    pub async fn start_mock_api(net: &TestNet, aliases: &[&str]) -> anyhow::Result<Peer> {
        PeerSpec::named(aliases).option("--mock-api").start(net).await
    }

    /// A model server of the user's, as `run --model-server` reaches it: the mock model API in
    /// plain HTTP on Ollama's port ([`MODEL_SERVER_PORT`]), named `model-server`.
    pub async fn start_model_server(net: &TestNet) -> anyhow::Result<Peer> {
        PeerSpec::named(&["model-server"])
            .option("--mock-api")
            .option("--http")
            .option(&MODEL_SERVER_PORT.to_string())
            .start(net)
            .await
    }

    /// A forge peer (see [`PeerSpec::forge`]) under `aliases`: git's smart HTTP on the
    /// repositories octo/hello and octo/secret (pushes taken), GitHub's API answering anything,
    /// and an npm registry with the package left-pad-sandbox 1.0.0 (PUTs taken). Its log has a
    /// `forge host=H method=M path=P auth=A status=N bytes=B port=P` line per request.
    pub async fn start_forge(net: &TestNet, aliases: &[&str]) -> anyhow::Result<Peer> {
        PeerSpec::named(aliases).forge().start(net).await
    }

    async fn start_spec(net: &TestNet, spec: PeerSpec) -> anyhow::Result<Peer> {
        let aliases: Vec<&str> = spec.aliases.iter().map(String::as_str).collect();
        let aliases = &aliases[..];
        let image = match &spec.program {
            Some((image, ..)) => image.clone(),
            None if spec.forge => forge_peer_image().await?,
            None => peer_image().await?,
        };
        let docker = docker().await?;
        let certs = tempfile::tempdir()?;
        let (cert, key) = crate::tls::leaf(aliases)?;
        std::fs::write(certs.path().join("cert.pem"), cert)?;
        std::fs::write(certs.path().join("key.pem"), key)?;
        let mut binds = vec![format!("{}:/certs:ro", certs.path().display())];
        let mut cmd: Vec<String> = [
            "serve",
            "--http",
            &PEER_HTTP.to_string(),
            "--tls",
            PEER_TLS,
            "--cert",
            "/certs/cert.pem",
            "--key",
            "/certs/key.pem",
            "--tcp",
            &PEER_GREETER.to_string(),
            "--echo",
            &PEER_ECHO.to_string(),
            "--udp",
            &PEER_UDP.to_string(),
            "--log",
            PEER_LOG,
            "--icmp6",
            ICMP6_LOG,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(dir) = &spec.files {
            binds.push(format!("{}:/files:ro", dir.display()));
            cmd.extend(["--files".into(), "/files".into()]);
        }
        if spec.dns {
            cmd.extend(["--dns".into(), ZONE.into(), QUERIES.into()]);
        }
        if spec.forge {
            cmd.extend(["--forge".into(), FORGE_DIR.into()]);
        }
        cmd.extend(spec.options.iter().cloned());
        if let Some(serving) = spec.serving {
            cmd = serving;
        }
        let mut entrypoint = None;
        if let Some((_, command, dir)) = &spec.program {
            binds.push(format!("{}:/srv:ro", dir.display()));
            entrypoint = Some(command.clone());
            cmd = Vec::new();
        }
        let endpoint = EndpointSettings {
            aliases: Some(aliases.iter().map(|a| a.to_string()).collect()),
            ..Default::default()
        };
        let mut labels = HashMap::from([(TEST_LABEL.to_string(), "peer".to_string())]);
        labels.extend(spec.kept.iter().flat_map(|(_, l)| l.iter().cloned()));
        let body = ContainerCreateBody {
            image: Some(image),
            entrypoint,
            user: spec.program.as_ref().map(|_| "0".to_string()),
            cmd: Some(cmd),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(net.name.clone()),
                binds: Some(binds),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(net.name.clone(), endpoint)])),
            }),
            ..Default::default()
        };
        let options = spec.kept.as_ref().map(|(name, _)| {
            bollard::query_parameters::CreateContainerOptionsBuilder::default().name(name).build()
        });
        let created = docker.create_container(options, body).await?;
        docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        let inspect = docker.inspect_container(&created.id, None).await?;
        let settings = inspect
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&net.name))
            .context("the peer has no address on the test network")?;
        let ipv4: IpAddr = settings.ip_address.context("no IPv4 address")?.parse()?;
        let ipv6: IpAddr = settings.global_ipv6_address.context("no IPv6 address")?.parse()?;
        let kept = spec.kept.is_some();
        let certs = match spec.kept {
            // The peer outlives this test: so must what it was started with.
            Some(_) => tempfile::TempDir::new_in(certs.keep())?,
            None => certs,
        };
        let peer = Peer { id: created.id, ipv4, ipv6, _certs: certs, kept };
        crate::docker::wait_for_log(&peer.id, "peer ready", 5).await?;
        Ok(peer)
    }

    /// A running peer on `net` started by another test of the run (world.rs): its addresses.
    pub async fn of_container(container: &str, net: &TestNet) -> anyhow::Result<Peer> {
        let inspect = docker().await?.inspect_container(container, None).await?;
        let settings = inspect
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&net.name))
            .context("the peer has no address on the shared network")?;
        Ok(Peer {
            id: inspect.id.context("a container without an id")?,
            ipv4: settings.ip_address.context("no IPv4 address")?.parse()?,
            ipv6: settings.global_ipv6_address.context("no IPv6 address")?.parse()?,
            _certs: tempfile::tempdir()?,
            kept: true,
        })
    }

    /// Makes the DNS peer answer `name` with `addr` (A or AAAA by its family) and this TTL.
    pub async fn set_dns(&self, name: &str, addr: IpAddr, ttl: u32) -> anyhow::Result<()> {
        let kind = if addr.is_ipv4() { "A" } else { "AAAA" };
        self.set_zone(name, kind, &addr.to_string(), ttl).await
    }

    /// Makes the DNS peer answer `name` (`*.` for every subdomain) with a record of `kind`:
    /// an address, or for A a range (`100.20.0.0/16`) from which each name gets its own.
    pub async fn set_zone(&self, name: &str, kind: &str, value: &str, ttl: u32) -> anyhow::Result<()> {
        let line = format!("{name} {kind} {value} {ttl}");
        let script = format!(
            "grep -v '^{name} {kind} ' {ZONE} > {ZONE}.new 2>/dev/null; echo '{line}' >> {ZONE}.new; mv {ZONE}.new {ZONE}"
        );
        exec(&self.id, &["sh", "-c", &script], None).await?;
        Ok(())
    }

    /// Every ICMPv6 message that reached the peer, as `type source payload` lines (the payload's
    /// unprintable bytes as `.`).
    pub async fn icmp6_log(&self) -> anyhow::Result<String> {
        let out =
            exec(&self.id, &["sh", "-c", &format!("cat {ICMP6_LOG} 2>/dev/null || true")], None).await?;
        Ok(out.stdout)
    }

    /// The names the DNS peer was asked about, in order.
    pub async fn dns_queries(&self) -> anyhow::Result<Vec<String>> {
        Ok(self.dns_log().await?.into_iter().map(|q| q.name).collect())
    }

    /// Every query the DNS peer received: name, type, id and what else came along, in order.
    pub async fn dns_log(&self) -> anyhow::Result<Vec<LoggedQuery>> {
        let out = exec(&self.id, &["sh", "-c", &format!("cat {QUERIES} 2>/dev/null || true")], None).await?;
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| {
                let mut fields = l.split_whitespace();
                Some(LoggedQuery {
                    name: fields.next()?.trim_end_matches('.').to_string(),
                    kind: fields.next().unwrap_or_default().to_string(),
                    id: fields.next().and_then(|i| i.parse().ok()).unwrap_or(0),
                    extra: fields.next().and_then(|i| i.parse().ok()).unwrap_or(0),
                })
            })
            .collect())
    }

    /// Runs the probe on the peer (as root there): how the rest of the network sees a sandbox.
    pub async fn probe(&self, args: &[&str]) -> anyhow::Result<Probe> {
        let mut cmd = vec![PROBE];
        cmd.extend_from_slice(args);
        Probe::from_output(args, exec(&self.id, &cmd, None).await?)
    }

    /// The probe, as root in the peer, in a task.
    pub fn probe_in_background(&self, args: &[&str]) -> tokio::task::JoinHandle<anyhow::Result<Probe>> {
        crate::probe::spawn(&self.id, false, args)
    }

    /// The peer's log: `conn PORT from=ADDR bytes=N` for every connection (when it ends), `tls
    /// PORT sni=NAME` for every handshake, `http PORT host=NAME path=P [auth=HEADER:VALUE…]` for every request
    /// (a forge peer's: `forge host=H method=M path=P auth=A status=N bytes=B port=P`).
    pub async fn log(&self) -> anyhow::Result<Vec<String>> {
        let out = exec(&self.id, &["sh", "-c", &format!("cat {PEER_LOG} 2>/dev/null || true")], None).await?;
        Ok(out.stdout.lines().map(str::to_string).collect())
    }

    /// Freezes the peer: it receives and answers nothing until [`Peer::unpause`].
    ///
    /// runc freezes the peer's cgroup and gives up when it has not settled within its own
    /// deadline ("unable to freeze"), which a machine the suites keep busy meets now and then
    /// (seen once in a CI run): the pause is asked again, five times at most.
    pub async fn pause(&self) -> anyhow::Result<()> {
        let docker = docker().await?;
        let mut tries = 0;
        loop {
            match docker.pause_container(&self.id).await {
                Ok(()) => return Ok(()),
                Err(e) if tries < 4 && e.to_string().contains("unable to freeze") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn unpause(&self) -> anyhow::Result<()> {
        Ok(docker().await?.unpause_container(&self.id).await?)
    }
}

/// A private network whose names the DNS peer answers: the peer that `names` resolve to, and the
/// DNS peer, which a sandbox started with [`crate::spec::SandboxSpec::resolving_through`]
/// asks (through Docker's DNS) for every name it does not know. Nothing leaves the network.
pub struct ResolvedNet {
    pub net: TestNet,
    pub dns: Peer,
    pub peer: Peer,
}

impl ResolvedNet {
    /// `names`: exact names or `*.` wildcards, each answered with the peer's IPv4 address.
    pub async fn start(test: &str, names: &[&str]) -> anyhow::Result<ResolvedNet> {
        ResolvedNet::on(TestNet::create(test).await?, test, names).await
    }

    /// The same on a network in the engine's own ranges (RFC 1918, unique local): the user's
    /// network, which an answer opens only for an entry with `private: true`.
    pub async fn start_private(test: &str, names: &[&str]) -> anyhow::Result<ResolvedNet> {
        ResolvedNet::on(TestNet::create_private(test).await?, test, names).await
    }

    async fn on(net: TestNet, test: &str, names: &[&str]) -> anyhow::Result<ResolvedNet> {
        let dns = Peer::start_dns(&net).await?;
        let peer = Peer::start(&net, &[&format!("{test}-peer")]).await?;
        for name in names {
            dns.set_dns(name, peer.ipv4, 300).await?;
        }
        Ok(ResolvedNet { net, dns, peer })
    }
}

/// One query as the DNS peer logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedQuery {
    pub name: String,
    pub kind: String,
    pub id: u16,
    /// Records in the other sections and EDNS options that came with the question.
    pub extra: usize,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let id = self.id.clone();
        drop_async(move || force_remove(id));
    }
}

/// A container of the peer image running one probe command (`race-state`, say) with volumes
/// mounted and no network; removed when dropped.
pub struct Helper {
    pub id: String,
}

impl Helper {
    /// `volumes`: (volume name, path in the container).
    pub async fn start(cmd: &[&str], volumes: &[(&str, &str)]) -> anyhow::Result<Helper> {
        Helper::create(
            cmd,
            HostConfig {
                network_mode: Some("none".into()),
                binds: Some(volumes.iter().map(|(v, path)| format!("{v}:{path}")).collect()),
                ..Default::default()
            },
        )
        .await
    }

    /// Runs the probe command `cmd` to its end in the network namespace of `container`, as root
    /// with NET_ADMIN, and gives what it printed; an error if it did not exit 0.
    pub async fn run_in_namespace_of(container: &str, cmd: &[&str]) -> anyhow::Result<String> {
        let host_config = HostConfig {
            network_mode: Some(format!("container:{container}")),
            cap_add: Some(vec!["NET_ADMIN".into()]),
            ..Default::default()
        };
        let helper = Helper::create(cmd, host_config).await?;
        let code = exit_code(&helper.id, Duration::from_secs(60))
            .await?
            .with_context(|| format!("{cmd:?} in the namespace of {container} still ran after 60 s"))?;
        let (stdout, stderr) = container_logs(&helper.id).await?;
        anyhow::ensure!(code == 0, "{cmd:?} in the namespace of {container}: exit {code}\n{stdout}{stderr}");
        Ok(stdout)
    }

    /// A container of the peer image running `cmd`, started.
    async fn create(cmd: &[&str], host_config: HostConfig) -> anyhow::Result<Helper> {
        let docker = docker().await?;
        let body = ContainerCreateBody {
            image: Some(peer_image().await?),
            cmd: Some(cmd.iter().map(|c| c.to_string()).collect()),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "helper".to_string())])),
            host_config: Some(host_config),
            ..Default::default()
        };
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        let helper = Helper { id: created.id };
        docker.start_container(&helper.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        Ok(helper)
    }

    /// Waits until the helper printed `line`.
    pub async fn wait_for(&self, line: &str) -> anyhow::Result<()> {
        for _ in 0..100 {
            if container_logs(&self.id).await?.0.contains(line) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("helper {} never said `{line}`", self.id)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let id = self.id.clone();
        drop_async(move || force_remove(id));
    }
}
