//! A running sandbox: a handle to exec into it as root or as the agent, run the probe and read
//! its reports, its firewall's sets, its log, its drop-ins and signals; removed when dropped.
//! `spec` starts one.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use bollard::exec::StartExecOptions;
use bollard::models::ExecConfig;
use testcontainers::{ContainerAsync, GenericImage};

use crate::docker::{ExecOutput, RemoveOnDrop, TestNet, TestVolume, container_logs, docker, exec};
use crate::probe::{PROBE, Probe, probe_binary};

/// A running sandbox, removed when dropped.
pub struct Sandbox {
    /// The container the agent runs in.
    id: String,
    /// Sidecar mode's gateway, which holds the firewall, the logs and the policy; None: the one
    /// container is both.
    gateway: Option<String>,
    /// Sidecar mode: the agent's container's runtime, where it is not the engine's default.
    runtime: Option<String>,
    /// Sidecar mode: the holder, whose network namespace the other two join (its addresses).
    holder: Option<String>,
    _owner: Owner,
    drop_ins: tempfile::TempDir,
}

/// What removes the container when the sandbox is dropped.
pub(crate) enum Owner {
    Testcontainers(#[allow(dead_code)] Box<ContainerAsync<GenericImage>>),
    Engine(#[allow(dead_code)] RemoveOnDrop),
    /// Sidecar mode: the gateway, the agent's container, the holder and their shared volume.
    Pair(
        #[allow(dead_code)] RemoveOnDrop,
        #[allow(dead_code)] RemoveOnDrop,
        #[allow(dead_code)] RemoveOnDrop,
        #[allow(dead_code)] TestVolume,
    ),
    /// Shared by the tests of one run (`SandboxSpec::start_shared`): the run's end removes it.
    Shared,
}

impl Sandbox {
    pub(crate) fn new(id: String, owner: Owner, drop_ins: tempfile::TempDir) -> Sandbox {
        Sandbox { id, gateway: None, runtime: None, holder: None, _owner: owner, drop_ins }
    }

    /// Sidecar mode's pair: the agent's container `id` behind `gateway`.
    pub(crate) fn pair(
        [id, gateway, holder]: [String; 3],
        runtime: Option<String>,
        owner: Owner,
        drop_ins: tempfile::TempDir,
    ) -> Sandbox {
        Sandbox { id, gateway: Some(gateway), runtime, holder: Some(holder), _owner: owner, drop_ins }
    }

    /// Whether the agent runs under gVisor (sidecar mode, `runsc`): its kernel is gVisor's, whose
    /// /proc tells less, and whose packets the gateway's rules see as root's.
    pub fn under_gvisor(&self) -> bool {
        self.runtime.as_deref() == Some("runsc")
    }

    /// The container that holds the firewall, its logs and PID 1's state: the gateway in sidecar
    /// mode, else the sandbox's one container.
    pub fn root_id(&self) -> &str {
        self.gateway.as_deref().unwrap_or(&self.id)
    }

    /// Whether this sandbox is sidecar mode's pair.
    pub fn is_sidecar(&self) -> bool {
        self.gateway.is_some()
    }

    /// A running sandbox something else started (the launcher), with the probe copied in; removed
    /// when dropped like the others.
    pub async fn adopt(id: &str) -> anyhow::Result<Sandbox> {
        let probe = std::fs::read(probe_binary()?)?;
        crate::docker::copy_in(id, PROBE, &probe, 0o755).await?;
        // Sidecar mode: the agent's container names its gateway, where the firewall is, and is in
        // its holder's network namespace.
        let inspect = docker().await?.inspect_container(id, None).await?;
        let labels = inspect.config.and_then(|c| c.labels);
        let gateway = labels.and_then(|mut l| l.remove(xtask::labels::LAUNCHER_GATEWAY));
        let network = inspect.host_config.and_then(|h| h.network_mode).unwrap_or_default();
        let holder = gateway.as_ref().and(network.strip_prefix("container:")).map(str::to_string);
        if let Some(gateway) = &gateway {
            crate::docker::copy_in(gateway, PROBE, &probe, 0o755).await?;
        }
        Ok(Sandbox {
            id: id.to_string(),
            gateway,
            runtime: None,
            holder,
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
            .stop_container(self.root_id(), None::<bollard::query_parameters::StopContainerOptions>)
            .await?;
        Ok(())
    }

    /// `docker start` of the stopped container: the same writable layer, a new PID 1.
    pub async fn start_again(&self) -> anyhow::Result<()> {
        docker()
            .await?
            .start_container(self.root_id(), None::<bollard::query_parameters::StartContainerOptions>)
            .await?;
        Ok(())
    }

    /// Runs a command as root in the container that holds the firewall (as `docker exec` does):
    /// in sidecar mode, the gateway.
    pub async fn exec(&self, cmd: &[&str]) -> anyhow::Result<ExecOutput> {
        exec(self.root_id(), cmd, None).await
    }

    /// Runs a command in the container the agent runs in, as that container's user: root in one
    /// container, the agent in sidecar mode's agent container.
    pub async fn exec_agent_side(&self, cmd: &[&str]) -> anyhow::Result<ExecOutput> {
        exec(self.id(), cmd, None).await
    }

    /// Runs a command in the container the agent runs in as `user` (`docker exec -u`).
    pub async fn exec_agent_side_as(&self, user: &str, cmd: &[&str]) -> anyhow::Result<ExecOutput> {
        exec(self.id(), cmd, Some(user)).await
    }

    /// Runs a command as the agent, through sandbox-exec, where the agent runs.
    pub async fn as_agent(&self, cmd: &[&str]) -> anyhow::Result<ExecOutput> {
        let mut full = vec!["sandbox-exec", "--"];
        full.extend_from_slice(cmd);
        exec(self.id(), &full, None).await
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

    /// Starts a command in the container and does not wait for it (`docker exec -d`): through
    /// sandbox-exec where the agent runs, else where the firewall is.
    pub async fn exec_detached(&self, cmd: &[&str], user: Option<&str>) -> anyhow::Result<()> {
        let docker = docker().await?;
        let container = if cmd.first() == Some(&"sandbox-exec") { self.id() } else { self.root_id() };
        let created = docker
            .create_exec(
                container,
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
        // Sidecar mode: the namespace's addresses are its holder's.
        let inspect =
            docker().await?.inspect_container(self.holder.as_deref().unwrap_or(self.id()), None).await?;
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
        container_logs(self.root_id()).await
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
        docker.kill_container(self.root_id(), Some(options)).await?;
        Ok(())
    }

    /// PID 1's exit code once the container has stopped; None if it still runs after 10 s.
    pub async fn exit_code(&self) -> anyhow::Result<Option<i64>> {
        let docker = docker().await?;
        for _ in 0..100 {
            let state = docker.inspect_container(self.root_id(), None).await?.state.unwrap_or_default();
            if state.running == Some(false) {
                return Ok(state.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(None)
    }

    /// Waits until PID 1's stdout contains `needle` `count` times.
    pub async fn wait_for_stdout(&self, needle: &str, count: usize) -> anyhow::Result<String> {
        let (found, stdout, stderr) = crate::docker::follow_log_until(self.root_id(), 60, |out, _| {
            out.matches(needle).count() >= count
        })
        .await?;
        anyhow::ensure!(
            found,
            "`{needle}` did not appear {count} times; stdout:\n{stdout}\nstderr:\n{stderr}"
        );
        Ok(stdout)
    }
}
