//! The sandbox harness: images from the xtask library, private networks with peers that answer to
//! allowlisted and blocked names, a recording DNS peer, a `Sandbox` handle whose readiness is the
//! `sandbox ready` line, and assertions that say what was tried and what happened.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bollard::Docker;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, EndpointSettings, ExecConfig, HostConfig, Ipam, IpamConfig, NetworkCreateRequest,
    NetworkingConfig,
};
use bollard::query_parameters::{
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptions,
};
use futures_util::StreamExt as _;
use testcontainers::core::{AccessMode, Mount, WaitFor};
use testcontainers::runners::AsyncRunner as _;
use testcontainers::{ContainerAsync, GenericImage, ImageExt as _};
use xtask::engine::Engine;

use crate::root;

/// The image the deep security suites run against: the smallest in the graph.
pub const SMALLEST: &str = "shell";
/// Labels every container and network the suites create, for cleanup of leftovers.
pub const TEST_LABEL: &str = "io.github.agent-sandbox.test";
/// Where the probe binary is mounted in sandboxes.
pub const PROBE: &str = "/usr/local/bin/sandbox-probe";
/// TCP ports every peer greets on, its TCP echo port, and its UDP echo port.
pub const PEER_TCP: &str = "80,443,8443";
pub const PEER_ECHO: u16 = 7;
pub const PEER_UDP: u16 = 5353;

/// Whether containers may get NET_ADMIN (`cargo xtask test`), or not (`--ci`).
pub fn full_mode() -> bool {
    std::env::var(xtask::test::MODE_ENV).map_or(true, |mode| mode != "ci")
}

async fn docker() -> anyhow::Result<Docker> {
    Ok(Engine::connect().await?.docker().clone())
}

/// The image `name`, built or found up to date through the xtask library with the settings
/// `cargo xtask test` exported.
pub async fn image(name: &str) -> anyhow::Result<String> {
    let report = built(&[name]).await?;
    report.id(name).context("the build reported no id")?;
    Ok(format!("{}:{}", xtask::project::repository(&report.prefix, name), xtask::project::VERSION))
}

/// The repository's images `names` (all when empty), built or found up to date. Builds are
/// serialised across test processes by a file lock.
pub async fn built(names: &[&str]) -> anyhow::Result<BuiltImages> {
    let root = root();
    let lock_dir = root.join("target/agent-sandbox");
    std::fs::create_dir_all(&lock_dir)?;
    let lock = std::fs::File::create(lock_dir.join("suite-build.lock"))?;
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        lock.lock()?;
        let mut opts = xtask::build::BuildOptions::from_env(&root)?;
        opts.images = names;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let report = rt.block_on(xtask::build::build(&opts))?;
        report.ensure_success()?;
        Ok(BuiltImages { report, prefix: opts.prefix })
    })
    .await?
}

/// A build report and the tag prefix it was built under.
pub struct BuiltImages {
    pub report: xtask::build::BuildReport,
    pub prefix: String,
}

impl std::ops::Deref for BuiltImages {
    type Target = xtask::build::BuildReport;
    fn deref(&self) -> &Self::Target {
        &self.report
    }
}

/// The probe binary, static, built once and cached by the xtask.
pub fn probe_binary() -> anyhow::Result<PathBuf> {
    // Every sandbox mounts it: build or check it once per test process.
    static PROBE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(path) = PROBE.get() {
        return Ok(path.clone());
    }
    let sh = xshell::Shell::new()?;
    let root = root();
    xtask::project::static_binary(&sh, &root, "sandbox-probe", &["tests/probe", "Cargo.lock", "Cargo.toml"])?;
    Ok(PROBE.get_or_init(|| xtask::project::static_binary_path(&root, "sandbox-probe")).clone())
}

/// The peer image: the OS image and the probe binary, tagged by their hash.
pub async fn peer_image() -> anyhow::Result<String> {
    // A test starts several peers: find or build the image once per test process.
    static PEER: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    PEER.get_or_try_init(build_peer_image).await.cloned()
}

async fn build_peer_image() -> anyhow::Result<String> {
    let os = image("os").await?;
    let probe = std::fs::read(probe_binary()?)?;
    let engine = Engine::connect().await?;
    let os_id = engine.image_id(&os).await?.context("the OS image is missing")?;
    let mut context = xtask::context::BuildContext::default();
    context.insert("Dockerfile", 0o644, b"ARG OS\nFROM ${OS}\nCOPY sandbox-probe /usr/local/bin/sandbox-probe\nENTRYPOINT [\"/usr/local/bin/sandbox-probe\"]\n".to_vec());
    context.insert("sandbox-probe", 0o755, probe);
    let args: std::collections::BTreeMap<String, String> = [("OS".to_string(), os_id.clone())].into();
    let hash = context.input_hash(&args, &os_id);
    let tag = format!("localhost/agent-sandbox/test-peer:{}", &hash["sha256:".len()..][..16]);
    if engine.image_id(&tag).await?.is_none() {
        let labels = HashMap::from([(TEST_LABEL.to_string(), "peer".to_string())]);
        let id = engine
            .build(context.to_tar(), &args.into_iter().collect(), &labels, |_| {})
            .await
            .map_err(|e| anyhow::anyhow!("cannot build the peer image: {e}"))?;
        let (repo, tag_name) = tag.split_once(':').expect("tagged");
        engine.tag(&id, repo, tag_name).await?;
    }
    Ok(tag)
}

/// A private internal network (IPv4 and IPv6, no route out). Removing it also removes every
/// container still attached, so nothing is left behind when a test fails.
pub struct TestNet {
    pub name: String,
}

static CREATED: AtomicU32 = AtomicU32::new(0);

impl TestNet {
    pub async fn create(test: &str) -> anyhow::Result<TestNet> {
        let n = CREATED.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let name = format!("agent-sandbox-test-{test}-{pid}-{n}");
        let subnet = format!("fd00:a5:{:x}:{n:x}::/64", pid & 0xffff);
        docker()
            .await?
            .create_network(NetworkCreateRequest {
                name: name.clone(),
                internal: Some(true),
                enable_ipv6: Some(true),
                ipam: Some(Ipam {
                    config: Some(vec![IpamConfig { subnet: Some(subnet), ..Default::default() }]),
                    ..Default::default()
                }),
                labels: Some(HashMap::from([(TEST_LABEL.to_string(), test.to_string())])),
                ..Default::default()
            })
            .await
            .with_context(|| format!("cannot create the network {name}"))?;
        Ok(TestNet { name })
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        remove_blocking(Resource::Network, self.name.clone());
    }
}

/// What a test creates beside its containers, which a container in use keeps alive.
#[derive(Clone, Copy)]
enum Resource {
    Network,
    Volume,
}

/// Removes a network or volume and every container still using it, from synchronous code such
/// as `Drop`, so nothing is left behind when a test fails.
fn remove_blocking(kind: Resource, name: String) {
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(async {
            let docker = docker().await.ok()?;
            let filter = match kind {
                Resource::Network => "network",
                Resource::Volume => "volume",
            };
            let filters = HashMap::from([(filter.to_string(), vec![name.clone()])]);
            let list = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
            for c in docker.list_containers(Some(list)).await.ok()? {
                let force = RemoveContainerOptionsBuilder::default().force(true).build();
                let _ = docker.remove_container(c.id.as_deref()?, Some(force)).await;
            }
            match kind {
                Resource::Network => docker.remove_network(&name).await.ok(),
                Resource::Volume => docker
                    .remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                    .await
                    .ok(),
            }
        })
    })
    .join();
}

/// A named volume, labelled as the suites' and removed (with any container still using it) when
/// dropped.
pub struct TestVolume {
    pub name: String,
}

impl TestVolume {
    pub async fn create(test: &str) -> anyhow::Result<TestVolume> {
        let n = CREATED.fetch_add(1, Ordering::SeqCst);
        let name = format!("agent-sandbox-test-{test}-{}-{n}", std::process::id());
        docker()
            .await?
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(name.clone()),
                labels: Some(HashMap::from([(TEST_LABEL.to_string(), test.to_string())])),
                ..Default::default()
            })
            .await
            .with_context(|| format!("cannot create the volume {name}"))?;
        Ok(TestVolume { name })
    }
}

impl Drop for TestVolume {
    fn drop(&mut self) {
        remove_blocking(Resource::Volume, self.name.clone());
    }
}

/// A peer on a test network: TCP greeters on [`PEER_TCP`], UDP echo on [`PEER_UDP`], answering
/// to its aliases through Docker's DNS. Optionally a DNS server too.
pub struct Peer {
    pub id: String,
    pub ipv4: IpAddr,
    pub ipv6: IpAddr,
}

const ZONE: &str = "/tmp/zone";
const QUERIES: &str = "/tmp/queries.log";

impl Peer {
    pub async fn start(net: &TestNet, aliases: &[&str]) -> anyhow::Result<Peer> {
        Self::start_with(net, aliases, false).await
    }

    /// A peer that is also a DNS server: it answers from a zone it re-reads per query and logs
    /// every query it receives.
    pub async fn start_dns(net: &TestNet) -> anyhow::Result<Peer> {
        Self::start_with(net, &["dns-peer"], true).await
    }

    async fn start_with(net: &TestNet, aliases: &[&str], dns: bool) -> anyhow::Result<Peer> {
        let image = peer_image().await?;
        let docker = docker().await?;
        let mut cmd = vec![
            "serve".to_string(),
            "--tcp".into(),
            PEER_TCP.into(),
            "--echo".into(),
            PEER_ECHO.to_string(),
            "--udp".into(),
            PEER_UDP.to_string(),
        ];
        if dns {
            cmd.extend(["--dns".into(), ZONE.into(), QUERIES.into()]);
        }
        let endpoint = EndpointSettings {
            aliases: Some(aliases.iter().map(|a| a.to_string()).collect()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image),
            cmd: Some(cmd),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "peer".to_string())])),
            host_config: Some(HostConfig { network_mode: Some(net.name.clone()), ..Default::default() }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(net.name.clone(), endpoint)])),
            }),
            ..Default::default()
        };
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        let inspect = docker.inspect_container(&created.id, None).await?;
        let settings = inspect
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&net.name))
            .context("the peer has no address on the test network")?;
        let ipv4: IpAddr = settings.ip_address.context("no IPv4 address")?.parse()?;
        let ipv6: IpAddr = settings.global_ipv6_address.context("no IPv6 address")?.parse()?;
        let peer = Peer { id: created.id, ipv4, ipv6 };
        peer.wait_for_log("peer ready").await?;
        Ok(peer)
    }

    async fn wait_for_log(&self, line: &str) -> anyhow::Result<()> {
        let docker = docker().await?;
        for _ in 0..100 {
            let options = LogsOptionsBuilder::default().stdout(true).build();
            let mut logs = docker.logs(&self.id, Some(options));
            while let Some(Ok(chunk)) = logs.next().await {
                if chunk.to_string().contains(line) {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("peer {} never said `{line}`", self.id)
    }

    /// Makes the DNS peer answer `name` with `addr` (A or AAAA by its family) and this TTL.
    pub async fn set_dns(&self, name: &str, addr: IpAddr, ttl: u32) -> anyhow::Result<()> {
        let kind = if addr.is_ipv4() { "A" } else { "AAAA" };
        self.set_zone(name, kind, &addr.to_string(), ttl).await
    }

    /// Makes the DNS peer answer `name` (`*.` for every subdomain) with a record of `kind`:
    /// an address, or for A a range (`10.99.0.0/16`) from which each name gets its own.
    pub async fn set_zone(&self, name: &str, kind: &str, value: &str, ttl: u32) -> anyhow::Result<()> {
        let line = format!("{name} {kind} {value} {ttl}");
        let script = format!(
            "grep -v '^{name} {kind} ' {ZONE} > {ZONE}.new 2>/dev/null; echo '{line}' >> {ZONE}.new; mv {ZONE}.new {ZONE}"
        );
        exec(&self.id, &["sh", "-c", &script], None).await?;
        Ok(())
    }

    /// The names the DNS peer was asked about, in order.
    pub async fn dns_queries(&self) -> anyhow::Result<Vec<String>> {
        Ok(self.dns_log().await?.into_iter().map(|q| q.name).collect())
    }

    /// Every query the DNS peer received: name, type and id, in order.
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

    /// Freezes the peer: it receives and answers nothing until [`Peer::unpause`].
    pub async fn pause(&self) -> anyhow::Result<()> {
        Ok(docker().await?.pause_container(&self.id).await?)
    }

    pub async fn unpause(&self) -> anyhow::Result<()> {
        Ok(docker().await?.unpause_container(&self.id).await?)
    }
}

/// One query as the DNS peer logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedQuery {
    pub name: String,
    pub kind: String,
    pub id: u16,
}

impl Drop for Peer {
    fn drop(&mut self) {
        remove_container_blocking(self.id.clone());
    }
}

/// Force-removes a container from synchronous code such as `Drop`.
pub fn remove_container_blocking(id: String) {
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        rt.block_on(async {
            let force = RemoveContainerOptionsBuilder::default().force(true).build();
            docker().await.ok()?.remove_container(&id, Some(force)).await.ok()
        })
    })
    .join();
}

/// A container of the peer image running one probe command (`race-state`, say) with volumes
/// mounted and no network; removed when dropped.
pub struct Helper {
    pub id: String,
}

impl Helper {
    /// `volumes`: (volume name, path in the container).
    pub async fn start(cmd: &[&str], volumes: &[(&str, &str)]) -> anyhow::Result<Helper> {
        let docker = docker().await?;
        let body = ContainerCreateBody {
            image: Some(peer_image().await?),
            cmd: Some(cmd.iter().map(|c| c.to_string()).collect()),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "helper".to_string())])),
            host_config: Some(HostConfig {
                network_mode: Some("none".into()),
                binds: Some(volumes.iter().map(|(v, path)| format!("{v}:{path}")).collect()),
                ..Default::default()
            }),
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
        remove_container_blocking(self.id.clone());
    }
}

/// What a command run in a container printed and returned.
#[derive(Debug)]
pub struct ExecOutput {
    pub stdout: String,
    pub stderr: String,
    pub code: i64,
}

/// Runs `cmd` in a container, as `user` if given, and collects its output.
pub async fn exec(container: &str, cmd: &[&str], user: Option<&str>) -> anyhow::Result<ExecOutput> {
    let docker = docker().await?;
    let created = docker
        .create_exec(
            container,
            ExecConfig {
                cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                user: user.map(str::to_string),
                ..Default::default()
            },
        )
        .await?;
    let (stdout, stderr) = match docker.start_exec(&created.id, None::<StartExecOptions>).await? {
        StartExecResults::Attached { output, .. } => split_output(output).await?,
        StartExecResults::Detached => Default::default(),
    };
    let code = docker.inspect_exec(&created.id).await?.exit_code.unwrap_or(-1);
    Ok(ExecOutput { stdout, stderr, code })
}

/// How to start a sandbox.
#[derive(Clone, Debug)]
pub struct SandboxSpec {
    pub image: String,
    pub net_admin: bool,
    pub network: Option<String>,
    /// A resolver for Docker's DNS to forward unknown names to (the DNS peer).
    pub dns: Option<IpAddr>,
    /// policy.d files: (file name, contents).
    pub drop_ins: Vec<(String, String)>,
    pub env: Vec<(String, String)>,
    /// Read-write mounts: (host path or volume name, path in the container).
    pub mounts: Vec<(String, String)>,
    /// `--cap-drop ALL` (NET_ADMIN is still added when asked for).
    pub cap_drop_all: bool,
    /// `--pids-limit`, `--memory` (bytes) and `--log-opt`s.
    pub limits: Limits,
}

/// What the engine bounds for the container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub pids: Option<i64>,
    pub memory: Option<i64>,
    pub log_options: std::collections::BTreeMap<String, String>,
}

impl Limits {
    fn apply(&self, host: &mut HostConfig) {
        host.pids_limit = self.pids;
        host.memory = self.memory;
        if !self.log_options.is_empty() {
            host.log_config = Some(bollard::models::HostConfigLogConfig {
                typ: Some("json-file".into()),
                config: Some(self.log_options.clone().into_iter().collect()),
            });
        }
    }
}

impl SandboxSpec {
    pub async fn smallest() -> anyhow::Result<SandboxSpec> {
        Ok(SandboxSpec::of(image(SMALLEST).await?))
    }

    pub fn of(image: String) -> SandboxSpec {
        SandboxSpec {
            image,
            net_admin: false,
            network: None,
            dns: None,
            drop_ins: Vec::new(),
            env: Vec::new(),
            mounts: Vec::new(),
            cap_drop_all: false,
            limits: Limits::default(),
        }
    }

    pub fn net_admin(mut self) -> Self {
        self.net_admin = true;
        self
    }

    pub fn on(mut self, net: &TestNet) -> Self {
        self.network = Some(net.name.clone());
        self
    }

    pub fn dns(mut self, peer: &Peer) -> Self {
        self.dns = Some(peer.ipv4);
        self
    }

    pub fn drop_in(mut self, file: &str, contents: &str) -> Self {
        self.drop_ins.push((file.into(), contents.into()));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Mounts a host directory (an absolute path) or a named volume at `target`, read-write.
    pub fn mount(mut self, source: &str, target: &str) -> Self {
        self.mounts.push((source.into(), target.into()));
        self
    }

    fn request(
        &self,
        drop_in_dir: &std::path::Path,
    ) -> anyhow::Result<testcontainers::ContainerRequest<GenericImage>> {
        let (name, tag) = self.image.rsplit_once(':').context("image without a tag")?;
        let mut request = GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout("sandbox ready"))
            .with_label(TEST_LABEL, "sandbox")
            .with_mount(
                Mount::bind_mount(probe_binary()?.display().to_string(), PROBE)
                    .with_access_mode(AccessMode::ReadOnly),
            )
            .with_mount(
                Mount::bind_mount(drop_in_dir.display().to_string(), "/etc/agent-sandbox/policy.d")
                    .with_access_mode(AccessMode::ReadOnly),
            )
            .with_startup_timeout(Duration::from_secs(30));
        if self.net_admin {
            request = request.with_cap_add("NET_ADMIN");
        }
        if self.cap_drop_all {
            request = request.with_cap_drop("ALL");
        }
        if let Some(network) = &self.network {
            request = request.with_network(network);
        }
        let (dns, limits) = (self.dns, self.limits.clone());
        request = request.with_host_config_modifier(move |hc| {
            if let Some(dns) = dns {
                hc.dns = Some(vec![dns.to_string()]);
            }
            limits.apply(hc);
        });
        for (k, v) in &self.env {
            request = request.with_env_var(k, v);
        }
        for (source, target) in &self.mounts {
            let mount = if source.starts_with('/') {
                Mount::bind_mount(source, target)
            } else {
                Mount::volume_mount(source, target)
            };
            request = request.with_mount(mount.with_access_mode(AccessMode::ReadWrite));
        }
        Ok(request)
    }

    fn write_drop_ins(&self) -> anyhow::Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        for (file, contents) in &self.drop_ins {
            std::fs::write(dir.path().join(file), contents)?;
        }
        Ok(dir)
    }

    /// Starts the sandbox and waits for `sandbox ready`.
    pub async fn start(self) -> anyhow::Result<Sandbox> {
        let drop_ins = self.write_drop_ins()?;
        let container = self
            .request(drop_ins.path())?
            .start()
            .await
            .with_context(|| format!("{} did not reach `sandbox ready`", self.image))?;
        Ok(Sandbox { container, drop_ins })
    }

    /// Runs the sandbox's entrypoint to its end (for the refusals), with bollard: testcontainers
    /// treats a container that exits before it is ready as an error.
    pub async fn run_to_exit(self) -> anyhow::Result<Exited> {
        let drop_ins = self.write_drop_ins()?;
        let docker = docker().await?;
        let mut host = HostConfig {
            binds: Some(
                [
                    format!("{}:{PROBE}:ro", probe_binary()?.display()),
                    format!("{}:/etc/agent-sandbox/policy.d:ro", drop_ins.path().display()),
                ]
                .into_iter()
                .chain(self.mounts.iter().map(|(source, target)| format!("{source}:{target}:rw")))
                .collect(),
            ),
            network_mode: self.network.clone(),
            ..Default::default()
        };
        if self.net_admin {
            host.cap_add = Some(vec!["NET_ADMIN".into()]);
        }
        if self.cap_drop_all {
            host.cap_drop = Some(vec!["ALL".into()]);
        }
        self.limits.apply(&mut host);
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            env: Some(self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "sandbox".to_string())])),
            host_config: Some(host),
            ..Default::default()
        };
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        let id = created.id;
        let guard = RemoveOnDrop(id.clone());
        docker.start_container(&id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        let mut wait = docker.wait_container(&id, None::<WaitContainerOptions>);
        let code = match tokio::time::timeout(Duration::from_secs(30), wait.next()).await {
            Ok(Some(Ok(response))) => response.status_code,
            Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => code,
            Ok(other) => anyhow::bail!("waiting for {id} failed: {other:?}"),
            Err(_) => {
                let logs = container_logs(&id).await?;
                anyhow::bail!(
                    "{} kept running (it should have exited); its output:\n{}{}",
                    self.image,
                    logs.0,
                    logs.1
                )
            }
        };
        let (stdout, stderr) = container_logs(&id).await?;
        drop(guard);
        Ok(Exited { code, stdout, stderr })
    }
}

/// A sandbox that ran to its end.
#[derive(Debug)]
pub struct Exited {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// Force-removes the container with this id when dropped, whatever the test's outcome.
pub struct RemoveOnDrop(pub String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        remove_container_blocking(self.0.clone());
    }
}

pub async fn container_logs(id: &str) -> anyhow::Result<(String, String)> {
    let docker = docker().await?;
    let options = LogsOptionsBuilder::default().stdout(true).stderr(true).build();
    split_output(docker.logs(id, Some(options))).await
}

/// An engine output stream as (stdout, stderr).
async fn split_output(
    mut output: impl futures_util::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>>
    + Unpin,
) -> anyhow::Result<(String, String)> {
    let (mut stdout, mut stderr) = (String::new(), String::new());
    while let Some(chunk) = output.next().await {
        match chunk? {
            bollard::container::LogOutput::StdErr { message } => {
                stderr.push_str(&String::from_utf8_lossy(&message))
            }
            other => stdout.push_str(&other.to_string()),
        }
    }
    Ok((stdout, stderr))
}

/// A running sandbox, removed when dropped.
pub struct Sandbox {
    pub container: ContainerAsync<GenericImage>,
    drop_ins: tempfile::TempDir,
}

/// What one probe saw, from its `key=value` lines.
#[derive(Debug, Clone)]
pub struct Probe {
    pub what: String,
    pub fields: HashMap<String, String>,
}

impl Probe {
    /// The `key=value` lines of a probe run; an error if the probe itself failed.
    pub fn from_output(args: &[&str], out: ExecOutput) -> anyhow::Result<Probe> {
        let fields = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let probe = Probe { what: args.join(" "), fields };
        anyhow::ensure!(
            out.code == 0,
            "the probe `{}` failed ({}): {}{}",
            probe.what,
            out.code,
            out.stdout,
            out.stderr
        );
        Ok(probe)
    }

    /// A numeric field; NaN when missing.
    pub fn number(&self, key: &str) -> f64 {
        self.fields.get(key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    }

    pub fn outcome(&self) -> &str {
        self.fields.get("outcome").map_or("(no outcome)", String::as_str)
    }

    pub fn ms(&self) -> f64 {
        self.fields.get("ms").and_then(|m| m.parse().ok()).unwrap_or(f64::NAN)
    }
}

impl Sandbox {
    pub fn id(&self) -> &str {
        self.container.id()
    }

    /// Runs a command as root in the container (as `docker exec` does).
    pub async fn exec(&self, cmd: &[&str]) -> anyhow::Result<ExecOutput> {
        exec(self.id(), cmd, None).await
    }

    /// Runs a command as the agent, through sandbox-exec.
    pub async fn as_agent(&self, cmd: &[&str]) -> anyhow::Result<ExecOutput> {
        let mut full = vec!["sandbox-exec", "--"];
        full.extend_from_slice(cmd);
        self.exec(&full).await
    }

    /// Runs the probe as the agent: `tcp HOST PORT`, `udp HOST PORT`, `icmp ADDR`, `dns NAME`,
    /// and the attacks of the probe's attacks.rs.
    pub async fn probe(&self, args: &[&str]) -> anyhow::Result<Probe> {
        let mut cmd = vec![PROBE];
        cmd.extend_from_slice(args);
        Probe::from_output(args, self.as_agent(&cmd).await?)
    }

    /// Starts the probe as the agent and returns at once: the task ends with what it reported.
    pub fn probe_in_background(&self, args: &[&str]) -> tokio::task::JoinHandle<anyhow::Result<Probe>> {
        let id = self.id().to_string();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::spawn(async move {
            let mut cmd = vec!["sandbox-exec", "--", PROBE];
            cmd.extend(args.iter().map(String::as_str));
            let out = exec(&id, &cmd, None).await?;
            Probe::from_output(&cmd[3..], out)
        })
    }

    /// Starts a command in the container and does not wait for it (`docker exec -d`).
    pub async fn exec_detached(&self, cmd: &[&str], user: Option<&str>) -> anyhow::Result<()> {
        let docker = docker().await?;
        let created = docker
            .create_exec(
                self.id(),
                ExecConfig {
                    cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                    user: user.map(str::to_string),
                    ..Default::default()
                },
            )
            .await?;
        docker.start_exec(&created.id, Some(StartExecOptions { detach: true, ..Default::default() })).await?;
        Ok(())
    }

    /// The sandbox's addresses on `net`: (IPv4, IPv6).
    pub async fn addresses(&self, net: &TestNet) -> anyhow::Result<(IpAddr, IpAddr)> {
        let inspect = docker().await?.inspect_container(self.id(), None).await?;
        let settings = inspect
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&net.name))
            .context("the sandbox has no address on the test network")?;
        Ok((
            settings.ip_address.context("no IPv4 address")?.parse()?,
            settings.global_ipv6_address.context("no IPv6 address")?.parse()?,
        ))
    }

    /// The elements of the firewall's sets, as `nft` lists them: (address, protocol, port).
    pub async fn set_elements(&self) -> anyhow::Result<Vec<(IpAddr, String, u16)>> {
        let out = self.exec(&["nft", "-j", "list", "table", "inet", "agent_sandbox"]).await?;
        anyhow::ensure!(out.code == 0, "nft list: {out:?}");
        let table: serde_json::Value = serde_json::from_str(&out.stdout)?;
        let mut elements = Vec::new();
        for item in table["nftables"].as_array().into_iter().flatten() {
            for element in item["set"]["elem"].as_array().into_iter().flatten() {
                let key = element["elem"]["val"]["concat"].as_array().cloned().unwrap_or_default();
                if let [addr, protocol, port] = &key[..] {
                    let protocol = match protocol.as_u64() {
                        Some(6) => "tcp".to_string(),
                        Some(17) => "udp".to_string(),
                        _ => protocol.as_str().unwrap_or_default().to_string(),
                    };
                    elements.push((
                        addr.as_str().unwrap_or_default().parse()?,
                        protocol,
                        port.as_u64().unwrap_or(0) as u16,
                    ));
                }
            }
        }
        Ok(elements)
    }

    /// Everything the container printed so far: (stdout, stderr).
    pub async fn logs(&self) -> anyhow::Result<(String, String)> {
        container_logs(self.id()).await
    }

    /// Replaces a policy.d file (the directory is mounted read-only in the container).
    pub fn write_drop_in(&self, file: &str, contents: &str) -> anyhow::Result<()> {
        Ok(std::fs::write(self.drop_ins.path().join(file), contents)?)
    }

    pub fn remove_drop_in(&self, file: &str) -> anyhow::Result<()> {
        Ok(std::fs::remove_file(self.drop_ins.path().join(file))?)
    }

    /// Sends a signal to PID 1.
    pub async fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let docker = docker().await?;
        let options =
            bollard::query_parameters::KillContainerOptionsBuilder::default().signal(signal).build();
        docker.kill_container(self.id(), Some(options)).await?;
        Ok(())
    }

    /// PID 1's exit code once the container has stopped; None if it still runs after 10 s.
    pub async fn exit_code(&self) -> anyhow::Result<Option<i64>> {
        let docker = docker().await?;
        for _ in 0..100 {
            let state = docker.inspect_container(self.id(), None).await?.state.unwrap_or_default();
            if state.running == Some(false) {
                return Ok(state.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(None)
    }

    /// Waits until PID 1's stdout contains `needle` `count` times.
    pub async fn wait_for_stdout(&self, needle: &str, count: usize) -> anyhow::Result<String> {
        for _ in 0..200 {
            let (stdout, _) = self.logs().await?;
            if stdout.matches(needle).count() >= count {
                return Ok(stdout);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (stdout, stderr) = self.logs().await?;
        anyhow::bail!("`{needle}` did not appear {count} times; stdout:\n{stdout}\nstderr:\n{stderr}")
    }
}

/// The files of the sandbox's own file system that could raise the privileges of a process not
/// under no_new_privs (`docker exec -u agent`, a devcontainer's terminal): setuid or setgid
/// programs, and files carrying a capability. One `setid PATH` or `caps PATH` each.
pub async fn privileged_files(sb: &Sandbox) -> anyhow::Result<Vec<String>> {
    let out = sb.exec(&[PROBE, "privileged-files", "/"]).await?;
    anyhow::ensure!(out.code == 0, "the scan failed: {out:?}");
    let checked: u64 = out.stdout.lines().find_map(|l| l.strip_prefix("checked=")?.parse().ok()).unwrap_or(0);
    // The walk read the image, not an empty directory.
    anyhow::ensure!(checked > 1000, "the scan checked only {checked} files: {out:?}");
    Ok(out
        .stdout
        .lines()
        .filter(|l| l.starts_with("setid ") || l.starts_with("caps "))
        .map(str::to_string)
        .collect())
}

fn split_target(target: &str) -> (&str, &str) {
    target.rsplit_once(':').expect("HOST:PORT")
}

/// The agent can open a TCP connection to `target` (`host:port`), and the peer greets it.
pub async fn assert_reaches(sb: &Sandbox, target: &str) -> anyhow::Result<Probe> {
    let (host, port) = split_target(target);
    let probe = sb.probe(&["tcp", host, port]).await?;
    anyhow::ensure!(
        probe.outcome() == "connected"
            && probe.fields.get("greeting").is_some_and(|g| g.starts_with("hello from")),
        "expected the agent to reach {target}, but: {:?}",
        probe.fields
    );
    Ok(probe)
}

/// The agent's TCP connection to `target` fails, and at once: refused by the firewall (not a
/// timeout), or its name refused by the DNS gate.
pub async fn assert_blocked(sb: &Sandbox, target: &str) -> anyhow::Result<Probe> {
    let (host, port) = split_target(target);
    let probe = sb.probe(&["tcp", host, port, "--timeout-ms", "3000"]).await?;
    let outcome = probe.outcome();
    anyhow::ensure!(
        outcome == "refused" || outcome.starts_with("dns:"),
        "expected {target} to be blocked at once, but the agent's connection ended `{outcome}`: {:?}",
        probe.fields
    );
    if outcome == "refused" {
        anyhow::ensure!(probe.ms() < 1000.0, "{target} was refused, but only after {} ms", probe.ms());
    }
    Ok(probe)
}
