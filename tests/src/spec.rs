//! How the suites start a sandbox: a `SandboxSpec`, translated once into the engine's
//! `HostConfig` and create body, started by one of three paths that all take that translation:
//! testcontainers (ready at `sandbox ready`, the usual way), bollard with a terminal (which
//! testcontainers cannot give), or run to its end (for the refusals, which testcontainers treats
//! as a failed start). The running sandbox is `sandbox`'s.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use bollard::models::{ContainerCreateBody, HealthConfig, HostConfig};
use testcontainers::core::WaitFor;
use testcontainers::core::logs::LogFrame;
use testcontainers::runners::AsyncRunner as _;
use testcontainers::{GenericImage, ImageExt as _};

use crate::docker::{RemoveOnDrop, TEST_LABEL, TestNet, container_logs, docker, exit_code};
use crate::images::image;
use crate::peers::{Peer, ResolvedNet};
use crate::place::{Need, Shape};
use crate::probe::{PROBE, probe_binary};
use crate::sandbox::{Owner, Sandbox};

/// Set by `cargo xtask test` (and `ci`), which removes the run's shared sandboxes after the run:
/// [`SandboxSpec::start_shared`] shares them only then.
pub use xtask::test::SHARED_ENV;
/// The label of a sandbox shared by a run's tests, its value the nextest run's id.
pub use xtask::test::SHARED_LABEL;

/// The run whose tests share sandboxes and worlds, `PID-RUN` (the xtask's pid, which removes
/// what they shared after it, [`SHARED_ENV`]; the nextest run id's first 8 characters), where
/// `cargo xtask test` runs them.
pub fn shared_run() -> Option<String> {
    let owner = std::env::var(SHARED_ENV).ok()?;
    let run = std::env::var("NEXTEST_RUN_ID").ok()?;
    Some(format!("{owner}-{}", run.chars().take(8).collect::<String>()))
}

/// The image the deep security suites run against: the smallest in the graph.
pub const SMALLEST: &str = "shell";

/// Whether the running test's sandboxes with NET_ADMIN are sidecar mode's pairs: its place
/// says `sidecar` or `gvisor` (place.rs).
pub fn sidecar_shape() -> bool {
    Shape::current() != Shape::Single
}

/// The runtime of the running test's agent containers in sidecar mode: `runsc` where its place
/// says `gvisor`, else the engine's default.
pub fn agent_runtime() -> Option<String> {
    (Shape::current() == Shape::Gvisor).then(|| "runsc".to_string())
}

/// Where the shared folder is, and the agent's container's own run folder (a tmpfs of its own).
const SHARED_DIR: &str = sandbox_init::policy::layout::SHARED_DIR;
const RUN_DIR: &str = sandbox_init::policy::layout::RUN_DIR;

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
    /// Sidecar mode's pair whatever the run's shape (with NET_ADMIN, for the gateway).
    pub sidecar: bool,
    /// Sidecar mode: the agent's container's runtime (`runsc`), whatever the run's.
    pub runtime: Option<String>,
    /// The image's health check every so often, and unhealthy at its first failure (the image
    /// says every 30 s, and after two).
    pub health_every: Option<Duration>,
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
            sidecar: false,
            runtime: None,
            health_every: None,
        }
    }

    /// The image's health check every `interval`, unhealthy at its first failure.
    pub fn health_every(mut self, interval: Duration) -> Self {
        self.health_every = Some(interval);
        self
    }

    /// The image's own health check (an empty test inherits it), at the spec's interval.
    fn healthcheck(&self) -> Option<HealthConfig> {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        self.health_every.map(|every| HealthConfig {
            interval: Some(nanos(every)),
            retries: Some(1),
            ..Default::default()
        })
    }

    /// Sidecar mode with the agent's container under `runtime` (`runsc`: gVisor).
    pub fn under(mut self, runtime: &str) -> Self {
        self.runtime = Some(runtime.into());
        self.sidecar()
    }

    /// Sidecar mode: a gateway with NET_ADMIN and an agent container without any capability in
    /// its network namespace, whatever the test's place says.
    pub fn sidecar(mut self) -> Self {
        self.sidecar = true;
        self.net_admin()
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

    /// The session runs `sleep infinity` instead of the image's agent CLI: for a test that runs
    /// the CLI itself, or only reads the image. A CLI left at its prompt spins while the test
    /// lives (Copilot's took 4.6 CPU-minutes of one suite run, read from the run's process
    /// accounting) and may act beside the test's own run (a sign-in refreshed twice).
    pub fn idle_session(self) -> Self {
        self.env("ASSISTANT_CMD", "sleep infinity")
    }

    /// Mounts a host directory (an absolute path) or a named volume at `target`, read-write.
    pub fn mount(mut self, source: &str, target: &str) -> Self {
        self.mounts.push((source.into(), target.into()));
        self
    }

    /// The spec as the engine takes it, the one translation both ways of starting use: the
    /// probe and the policy drop-ins mounted read-only, the mounts, network, capabilities,
    /// resolver and limits.
    /// What the spec gives must be what the test's place says it needs (place.rs).
    fn check_place(&self) -> anyhow::Result<()> {
        if self.net_admin {
            crate::place::ensure(Need::NetAdmin)?;
        }
        if self.runtime.clone().or_else(agent_runtime).is_some_and(|r| r == "runsc") {
            crate::place::ensure(Need::Runsc)?;
        }
        Ok(())
    }

    fn host_config(&self, probe: &std::path::Path, drop_in_dir: &std::path::Path) -> HostConfig {
        let binds = [
            format!("{}:{PROBE}:ro", probe.display()),
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
        host
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
        self.check_place()?;
        if self.terminal {
            return self.start_with_terminal().await;
        }
        if self.net_admin && (self.sidecar || sidecar_shape()) {
            return self.start_pair().await;
        }
        let drop_ins = self.write_drop_ins()?;
        let host = self.host_config(&probe_binary()?, drop_ins.path());
        let (name, tag) = self.image.rsplit_once(':').context("image without a tag")?;
        // What the container printed, kept for the error: testcontainers removes a container
        // that never gets ready, and its log with it.
        let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = printed.clone();
        let mut request = GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout("sandbox ready"))
            .with_label(TEST_LABEL, "sandbox")
            // Ready takes well under a second alone; CI's two cores under the full suites once
            // took over 30 s to start one.
            .with_startup_timeout(Duration::from_secs(90))
            .with_log_consumer(move |frame: &LogFrame| {
                let bytes = match frame {
                    LogFrame::StdOut(bytes) | LogFrame::StdErr(bytes) => bytes,
                };
                sink.lock().expect("log sink").push_str(&String::from_utf8_lossy(bytes));
            })
            .with_host_config_modifier(move |hc| *hc = overlay(hc, &host));
        for (k, v) in &self.env {
            request = request.with_env_var(k, v);
        }
        if let Some(every) = self.health_every {
            let check = testcontainers::core::Healthcheck::empty().with_interval(every).with_retries(1);
            request = request.with_health_check(check);
        }
        let container = request.start().await.with_context(|| {
            let printed = printed.lock().expect("log sink");
            format!("{} did not reach `sandbox ready`; it printed:\n{printed}", self.image)
        })?;
        Ok(Sandbox::new(container.id().to_string(), Owner::Testcontainers(Box::new(container)), drop_ins))
    }

    /// This spec started once per nextest run under `key`, and shared by every test of the run
    /// that asks for it by that key: tests run in processes of their own, so the first creates
    /// it under a name of the run's, and the others, refused that name, wait until it is ready.
    /// Each test must only read it. Outside `cargo xtask test`, which removes the run's shared
    /// containers after the run ([`SHARED_ENV`], [`SHARED_LABEL`]), it is the test's own.
    pub async fn start_shared(self, key: &str) -> anyhow::Result<Sandbox> {
        let Some(run) = shared_run() else { return self.start().await };
        self.check_place()?;
        anyhow::ensure!(
            !self.net_admin && !self.terminal,
            "only an offline sandbox without a terminal is shared"
        );
        let key: String = key.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        let name = format!("agent-sandbox-shared-{key}-{run}");
        // Its drop-in folder outlives the test that made it: the others read the container.
        let drop_ins = self.write_drop_ins()?;
        let kept = drop_ins.keep();
        let docker = docker().await?;
        let mut body = self.create_body(&kept)?;
        body.labels.get_or_insert_with(HashMap::new).insert(SHARED_LABEL.to_string(), run.clone());
        let options = bollard::query_parameters::CreateContainerOptionsBuilder::default().name(&name).build();
        match docker.create_container(Some(options), body).await {
            Ok(_) => {
                docker
                    .start_container(&name, None::<bollard::query_parameters::StartContainerOptions>)
                    .await?;
            }
            // Another test of the run made it: the same spec, by the same key.
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {}
            Err(e) => return Err(e.into()),
        }
        // The engine refuses the name before the other's container can be looked up by it.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let id = loop {
            match docker.inspect_container(&name, None).await {
                Ok(inspected) => break inspected.id.context("a container without an id")?,
                Err(e) if std::time::Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let sandbox = Sandbox::new(id, Owner::Shared, tempfile::tempdir()?);
        sandbox.wait_for_stdout("sandbox ready", 1).await?;
        Ok(sandbox)
    }

    /// testcontainers cannot give a container a terminal: this one starts through bollard.
    async fn start_with_terminal(self) -> anyhow::Result<Sandbox> {
        let drop_ins = self.write_drop_ins()?;
        let docker = docker().await?;
        let body = ContainerCreateBody { tty: Some(true), ..self.create_body(drop_ins.path())? };
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        let sandbox = Sandbox::new(created.id.clone(), Owner::Engine(RemoveOnDrop(created.id)), drop_ins);
        docker
            .start_container(sandbox.id(), None::<bollard::query_parameters::StartContainerOptions>)
            .await?;
        sandbox.wait_for_stdout("sandbox ready", 1).await?;
        Ok(sandbox)
    }

    /// Sidecar mode, as the launcher makes it: a holder that owns the network namespace and runs
    /// nothing (a pod's pause container), so that the gateway and the agent's container each
    /// restart into it; the gateway in it with NET_ADMIN, the policy, the secrets and the shared
    /// folder; the agent's container in it as the agent, without any capability, its run folder
    /// a tmpfs of its own and the shared folder read-only. Ready when both say so.
    async fn start_pair(self) -> anyhow::Result<Sandbox> {
        let drop_ins = self.write_drop_ins()?;
        let docker = docker().await?;
        let shared = crate::docker::TestVolume::create("shared").await?;
        let probe = probe_binary()?;
        let (secrets, rest): (Vec<_>, Vec<_>) =
            self.mounts.iter().cloned().partition(|(_, target)| target.starts_with("/run/secrets"));
        // A resolv.conf of the test's is the namespace's, and so the holder's.
        let (resolv, mounts): (Vec<_>, Vec<_>) =
            rest.into_iter().partition(|(_, target)| target == "/etc/resolv.conf");
        let label = Some(HashMap::from([(TEST_LABEL.to_string(), "sandbox".to_string())]));
        let create =
            |body| docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body);
        let start = |id: String| {
            let docker = docker.clone();
            async move {
                docker.start_container(&id, None::<bollard::query_parameters::StartContainerOptions>).await?;
                anyhow::Ok(())
            }
        };
        let holder = create(ContainerCreateBody {
            image: Some(self.image.clone()),
            user: Some("65534:65534".into()),
            entrypoint: Some(vec!["/usr/local/bin/sandbox-init".into(), "hold".into()]),
            healthcheck: Some(crate::docker::no_healthcheck()),
            labels: label.clone(),
            host_config: Some(HostConfig {
                binds: Some(resolv.iter().map(|(source, target)| format!("{source}:{target}:ro")).collect()),
                network_mode: self.network.clone(),
                dns: self.dns.map(|dns| vec![dns.to_string()]),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                readonly_rootfs: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .id;
        let holder_guard = RemoveOnDrop(holder.clone());
        start(holder.clone()).await?;
        let in_namespace = Some(format!("container:{holder}"));
        let mut agent_host = HostConfig {
            binds: Some(
                [format!("{}:{PROBE}:ro", probe.display()), format!("{}:{SHARED_DIR}:ro", shared.name)]
                    .into_iter()
                    .chain(mounts.iter().map(|(source, target)| format!("{source}:{target}:rw")))
                    .collect(),
            ),
            tmpfs: Some(HashMap::from([(RUN_DIR.to_string(), "uid=1000,gid=1000,mode=0755".to_string())])),
            network_mode: in_namespace.clone(),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            runtime: self.runtime.clone().or_else(agent_runtime),
            ..Default::default()
        };
        self.limits.apply(&mut agent_host);
        let runtime = agent_host.runtime.clone();
        // Keys and tokens are the gateway's alone.
        let held: Vec<&str> = sandbox_init::policy::key_vars().collect();
        let mut agent_env: Vec<String> = self
            .env
            .iter()
            .filter(|(k, _)| !held.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        agent_env.push("SANDBOX_ROLE=agent".into());
        let agent = create(ContainerCreateBody {
            image: Some(self.image.clone()),
            user: Some("1000:1000".into()),
            env: Some(agent_env),
            // As the launcher makes it: its check would run as the agent's own uid.
            healthcheck: Some(crate::docker::no_healthcheck()),
            labels: label.clone(),
            host_config: Some(agent_host),
            ..Default::default()
        })
        .await?
        .id;
        let agent_guard = RemoveOnDrop(agent.clone());
        let gateway_host = HostConfig {
            binds: Some(
                [
                    format!("{}:{PROBE}:ro", probe.display()),
                    format!("{}:/etc/agent-sandbox/policy.d:ro", drop_ins.path().display()),
                    format!("{}:{SHARED_DIR}:rw", shared.name),
                ]
                .into_iter()
                .chain(secrets.iter().map(|(source, target)| format!("{source}:{target}:rw")))
                .collect(),
            ),
            network_mode: in_namespace,
            // As the launcher gives them: NET_ADMIN and what PID 1 needs, nothing else.
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(sandbox_init::policy::layout::GATEWAY_CAPS.iter().map(|c| c.to_string()).collect()),
            security_opt: Some(vec!["no-new-privileges".into()]),
            ..Default::default()
        };
        let mut gateway_env = self.env_list();
        gateway_env.push("SANDBOX_ROLE=gateway".into());
        match self.dns {
            Some(dns) => gateway_env.push(format!("SANDBOX_DNS={dns}")),
            // The default bridge: the resolvers Docker gave the namespace.
            None => {
                let conf = crate::docker::exec(&holder, &["cat", "/etc/resolv.conf"], None).await?.stdout;
                let resolvers: Vec<String> = sandbox_init::net::dns::resolv_conf_upstreams(&conf)
                    .iter()
                    .filter(|a| !a.is_loopback())
                    .map(ToString::to_string)
                    .collect();
                if !resolvers.is_empty() {
                    gateway_env.push(format!("SANDBOX_DNS={}", resolvers.join(",")));
                }
            }
        }
        let gateway = create(ContainerCreateBody {
            image: Some(self.image.clone()),
            env: Some(gateway_env),
            healthcheck: self.healthcheck(),
            labels: label,
            host_config: Some(gateway_host),
            ..Default::default()
        })
        .await?
        .id;
        let sandbox = Sandbox::pair(
            [agent.clone(), gateway.clone(), holder],
            runtime,
            Owner::Pair(RemoveOnDrop(gateway.clone()), agent_guard, holder_guard, shared),
            drop_ins,
        );
        // Both at once: the agent's container starts its session once the gateway's ready file
        // is there, and runs nothing of the agent's before.
        tokio::try_join!(start(gateway), start(agent.clone()))?;
        let agent_ready = crate::docker::follow_log_until(&agent, 60, |out, _| out.contains("sandbox ready"));
        let (_, (ready, stdout, stderr)) =
            tokio::try_join!(sandbox.wait_for_stdout("sandbox ready", 1), agent_ready)?;
        anyhow::ensure!(ready, "the agent's container did not start its session:\n{stdout}\n{stderr}");
        Ok(sandbox)
    }

    fn create_body(&self, drop_in_dir: &std::path::Path) -> anyhow::Result<ContainerCreateBody> {
        Ok(ContainerCreateBody {
            image: Some(self.image.clone()),
            env: Some(self.env_list()),
            labels: Some(HashMap::from([(TEST_LABEL.to_string(), "sandbox".to_string())])),
            host_config: Some(self.host_config(&probe_binary()?, drop_in_dir)),
            healthcheck: self.healthcheck(),
            ..Default::default()
        })
    }

    /// Runs the sandbox's entrypoint to its end (for the refusals), with bollard: testcontainers
    /// treats a container that exits before it is ready as an error.
    pub async fn run_to_exit(self) -> anyhow::Result<Exited> {
        self.check_place()?;
        let drop_ins = self.write_drop_ins()?;
        let docker = docker().await?;
        let body = self.create_body(drop_ins.path())?;
        let created =
            docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        let id = created.id;
        let guard = RemoveOnDrop(id.clone());
        docker.start_container(&id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        let code = match exit_code(&id, Duration::from_secs(30)).await? {
            Some(code) => code,
            None => {
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

/// `ours` laid over testcontainers' `theirs`: every field the spec sets wins, every other stays
/// as testcontainers made it. Field by field through their JSON, so that a field the spec
/// gains is never left out of this path.
fn overlay(theirs: &HostConfig, ours: &HostConfig) -> HostConfig {
    let mut merged = serde_json::to_value(theirs).expect("a HostConfig serialises");
    if let (Some(merged), serde_json::Value::Object(set)) =
        (merged.as_object_mut(), serde_json::to_value(ours).expect("a HostConfig serialises"))
    {
        merged.extend(set.into_iter().filter(|(_, value)| !value.is_null()));
    }
    serde_json::from_value(merged).expect("a HostConfig deserialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field the spec sets reaches the container whichever way it starts: the overlay
    /// keeps each of them, and what testcontainers set that the spec does not.
    #[test]
    fn the_testcontainers_path_loses_no_field_of_the_spec() {
        let mut spec = SandboxSpec::of("img:1".into()).net_admin().network_mode("none").env("A", "1");
        spec.cap_drop_all = true;
        spec.dns = Some("10.0.0.53".parse().unwrap());
        spec.limits = Limits {
            pids: Some(64),
            memory: Some(1 << 30),
            nofile: Some(512),
            log_options: [("max-size".to_string(), "1m".to_string())].into(),
        };
        spec.mounts.push(("/src".into(), "/workspace".into()));
        let ours = spec.host_config(std::path::Path::new("/probe"), std::path::Path::new("/drop-ins"));
        let theirs = HostConfig { shm_size: Some(64), privileged: Some(false), ..Default::default() };
        let merged = overlay(&theirs, &ours);
        let ours_json = serde_json::to_value(&ours).unwrap();
        let merged_json = serde_json::to_value(&merged).unwrap();
        for (field, value) in ours_json.as_object().unwrap().iter().filter(|(_, v)| !v.is_null()) {
            assert_eq!(&merged_json[field], value, "{field} was lost");
        }
        assert_eq!((merged.shm_size, merged.privileged), (Some(64), Some(false)), "testcontainers' own");
        assert_eq!(merged.ulimits.as_ref().map(Vec::len), Some(1));
    }
}
