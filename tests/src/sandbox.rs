//! A sandbox from its spec: started through testcontainers (ready at `sandbox ready`) or run to
//! its end, a handle to exec into it as root or as the agent, and the probe's reports.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use bollard::exec::StartExecOptions;
use bollard::models::{ContainerCreateBody, ExecConfig, HostConfig};
use bollard::query_parameters::WaitContainerOptions;
use futures_util::StreamExt as _;
use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner as _;
use testcontainers::{ContainerAsync, GenericImage, ImageExt as _};

use crate::docker::{ExecOutput, RemoveOnDrop, TEST_LABEL, TestNet, container_logs, docker, exec};
use crate::images::image;
use crate::peers::{Peer, ResolvedNet};
use crate::probe::{PROBE, Probe, probe_binary};

/// The image the deep security suites run against: the smallest in the graph.
pub const SMALLEST: &str = "shell";

/// Whether containers may get NET_ADMIN (`cargo xtask test`), or not (`--ci`).
pub fn full_mode() -> bool {
    std::env::var(xtask::test::MODE_ENV).map_or(true, |mode| mode != "ci")
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
    /// `-t`: the container has a terminal, and the agent's tmux client is attached to it.
    pub terminal: bool,
}

/// What the engine bounds for the container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub pids: Option<i64>,
    pub memory: Option<i64>,
    pub log_options: std::collections::BTreeMap<String, String>,
    /// `--ulimit nofile=N:N`: the descriptors each process may hold.
    pub nofile: Option<i64>,
}

impl Limits {
    fn apply(&self, host: &mut HostConfig) {
        host.pids_limit = self.pids;
        host.memory = self.memory;
        host.ulimits = self.nofile.map(|n| {
            vec![bollard::models::ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(n),
                hard: Some(n),
            }]
        });
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
            terminal: false,
        }
    }

    /// `docker run -t`: a terminal, which PID 1 writes to and the agent's tmux client holds.
    pub fn with_terminal(mut self) -> Self {
        self.terminal = true;
        self
    }

    pub fn net_admin(mut self) -> Self {
        self.net_admin = true;
        self
    }

    pub fn on(mut self, net: &TestNet) -> Self {
        self.network = Some(net.name.clone());
        self
    }

    /// No network but loopback (`--network none`): nothing to filter, and nothing reachable.
    pub fn offline(self) -> Self {
        self.network_mode("none")
    }

    /// Any of Docker's network modes (`none`, `host`, a network's name).
    pub fn network_mode(mut self, mode: &str) -> Self {
        self.network = Some(mode.into());
        self
    }

    pub fn dns(mut self, peer: &Peer) -> Self {
        self.dns = Some(peer.ipv4);
        self
    }

    /// With NET_ADMIN on `world`'s network, resolving through its DNS peer, allowing `policy`
    /// (a `.txt` list).
    pub fn resolving_through(self, world: &ResolvedNet, policy: &str) -> Self {
        self.net_admin().on(&world.net).dns(&world.dns).drop_in("resolved.txt", policy)
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

    /// The spec as the engine takes it, the one translation both ways of starting use: the
    /// probe and the policy drop-ins mounted read-only, the mounts, network, capabilities,
    /// resolver and limits.
    fn host_config(&self, drop_in_dir: &std::path::Path) -> anyhow::Result<HostConfig> {
        let binds = [
            format!("{}:{PROBE}:ro", probe_binary()?.display()),
            format!("{}:/etc/agent-sandbox/policy.d:ro", drop_in_dir.display()),
        ]
        .into_iter()
        .chain(self.mounts.iter().map(|(source, target)| format!("{source}:{target}:rw")))
        .collect();
        let mut host = HostConfig {
            binds: Some(binds),
            network_mode: self.network.clone(),
            cap_add: self.net_admin.then(|| vec!["NET_ADMIN".to_string()]),
            cap_drop: self.cap_drop_all.then(|| vec!["ALL".to_string()]),
            dns: self.dns.map(|dns| vec![dns.to_string()]),
            ..Default::default()
        };
        self.limits.apply(&mut host);
        Ok(host)
    }

    fn env_list(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    fn write_drop_ins(&self) -> anyhow::Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        for (file, contents) in &self.drop_ins {
            std::fs::write(dir.path().join(file), contents)?;
        }
        Ok(dir)
    }

    /// Starts the sandbox and waits for `sandbox ready` (testcontainers: readiness declared,
    /// never slept).
    pub async fn start(self) -> anyhow::Result<Sandbox> {
        if self.terminal {
            return self.start_with_terminal().await;
        }
        let drop_ins = self.write_drop_ins()?;
        let host = self.host_config(drop_ins.path())?;
        let (name, tag) = self.image.rsplit_once(':').context("image without a tag")?;
        let mut request = GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout("sandbox ready"))
            .with_label(TEST_LABEL, "sandbox")
            .with_startup_timeout(Duration::from_secs(30))
            .with_host_config_modifier(move |hc| {
                let host = host.clone();
                hc.binds = host.binds;
                hc.network_mode = host.network_mode;
                hc.cap_add = host.cap_add;
                hc.cap_drop = host.cap_drop;
                hc.dns = host.dns;
                hc.pids_limit = host.pids_limit;
                hc.memory = host.memory;
                hc.ulimits = host.ulimits;
                hc.log_config = host.log_config;
            });
        for (k, v) in &self.env {
            request = request.with_env_var(k, v);
        }
        let container =
            request.start().await.with_context(|| format!("{} did not reach `sandbox ready`", self.image))?;
        Ok(Sandbox {
            id: container.id().to_string(),
            _owner: Owner::Testcontainers(Box::new(container)),
            drop_ins,
        })
    }

    /// testcontainers cannot give a container a terminal: this one starts through bollard.
    async fn start_with_terminal(self) -> anyhow::Result<Sandbox> {
        let drop_ins = self.write_drop_ins()?;
        let docker = docker().await?;
        let body = ContainerCreateBody { tty: Some(true), ..self.create_body(drop_ins.path())? };
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        let sandbox =
            Sandbox { id: created.id.clone(), _owner: Owner::Engine(RemoveOnDrop(created.id)), drop_ins };
        docker.start_container(&sandbox.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        sandbox.wait_for_stdout("sandbox ready", 1).await?;
        Ok(sandbox)
    }

    fn create_body(&self, drop_in_dir: &std::path::Path) -> anyhow::Result<ContainerCreateBody> {
        Ok(ContainerCreateBody {
            image: Some(self.image.clone()),
            env: Some(self.env_list()),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "sandbox".to_string())])),
            host_config: Some(self.host_config(drop_in_dir)?),
            ..Default::default()
        })
    }

    /// Runs the sandbox's entrypoint to its end (for the refusals), with bollard: testcontainers
    /// treats a container that exits before it is ready as an error.
    pub async fn run_to_exit(self) -> anyhow::Result<Exited> {
        let drop_ins = self.write_drop_ins()?;
        let docker = docker().await?;
        let body = self.create_body(drop_ins.path())?;
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

/// A running sandbox, removed when dropped.
pub struct Sandbox {
    id: String,
    _owner: Owner,
    drop_ins: tempfile::TempDir,
}

/// What removes the container when the sandbox is dropped.
enum Owner {
    Testcontainers(#[allow(dead_code)] Box<ContainerAsync<GenericImage>>),
    Engine(#[allow(dead_code)] RemoveOnDrop),
}

impl Sandbox {
    /// A running sandbox something else started (the launcher), with the probe copied in; removed
    /// when dropped like the others.
    pub async fn adopt(id: &str) -> anyhow::Result<Sandbox> {
        let probe = std::fs::read(probe_binary()?)?;
        crate::docker::copy_in(id, PROBE, &probe, 0o755).await?;
        Ok(Sandbox {
            id: id.to_string(),
            _owner: Owner::Engine(RemoveOnDrop(id.to_string())),
            drop_ins: tempfile::tempdir()?,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `docker stop`: SIGTERM to PID 1, SIGKILL 10 s later.
    pub async fn stop(&self) -> anyhow::Result<()> {
        docker()
            .await?
            .stop_container(&self.id, None::<bollard::query_parameters::StopContainerOptions>)
            .await?;
        Ok(())
    }

    /// `docker start` of the stopped container: the same writable layer, a new PID 1.
    pub async fn start_again(&self) -> anyhow::Result<()> {
        docker()
            .await?
            .start_container(&self.id, None::<bollard::query_parameters::StartContainerOptions>)
            .await?;
        Ok(())
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
        crate::probe::spawn(self.id(), true, args)
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

    /// The elements of the firewall's sets, as `nft` lists them: (address, set, port); the set says
    /// how the port is opened (`checked_v4`, `opaque_v6`, `udp_v4`, …).
    pub async fn set_elements(&self) -> anyhow::Result<Vec<(IpAddr, String, u16)>> {
        let out = self.exec(&["nft", "-j", "list", "table", "inet", "agent_sandbox"]).await?;
        anyhow::ensure!(out.code == 0, "nft list: {out:?}");
        let table: serde_json::Value = serde_json::from_str(&out.stdout)?;
        let mut elements = Vec::new();
        for set in table["nftables"].as_array().into_iter().flatten().map(|item| &item["set"]) {
            let name = set["name"].as_str().unwrap_or_default();
            for element in set["elem"].as_array().into_iter().flatten() {
                // With a timeout, an element is {"elem": {"val": …}}; without, the value itself.
                let value = if element["elem"].is_object() { &element["elem"]["val"] } else { element };
                let key = value["concat"].as_array().cloned().unwrap_or_default();
                let [addr, port] = &key[..] else {
                    anyhow::bail!("an element of set {name} of an unknown shape: {element}");
                };
                let port = port.as_u64().with_context(|| format!("a port in set {name}: {element}"))?;
                elements.push((addr.as_str().unwrap_or_default().parse()?, name.to_string(), port as u16));
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

/// A root-only file (mode 600) in `dir` holding `contents`: a secret to mount under
/// /run/secrets (an API key, the forwarder's extra CA). Its path.
pub fn secret_file(dir: &std::path::Path, name: &str, contents: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, contents)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path.display().to_string())
}

/// The test CA as a secret file in `dir`, for the forwarder's /run/secrets/sandbox_api_ca.pem.
pub fn ca_secret_file(dir: &std::path::Path) -> anyhow::Result<String> {
    secret_file(dir, "ca.pem", &std::fs::read_to_string(crate::tls::ca_file()?)?)
}
