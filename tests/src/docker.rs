//! The engine as the suites use it: private networks, volumes, `docker exec`, logs, and the one
//! way all of it is removed from `Drop`. The bottom of the harness: it uses nothing of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;
use bollard::Docker;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{ExecConfig, Ipam, IpamConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt as _;
use xtask::engine::Engine;

/// Labels every container and network the suites create, for cleanup of leftovers.
pub const TEST_LABEL: &str = "io.github.agent-sandbox.test";

pub async fn docker() -> anyhow::Result<Docker> {
    Ok(Engine::connect().await?.docker().clone())
}

/// Runs cleanup that must await (removing a container, a network, a tag) from synchronous code
/// such as `Drop`, which cannot: on a thread of its own with its own runtime, so that it works
/// inside a test's runtime too, and waited for, so that nothing outlives the test. Best effort: a
/// failed cleanup must not hide the test's own result. testcontainers-rs does the same in its
/// core/async_drop.rs.
pub fn drop_async<Fut>(cleanup: impl FnOnce() -> Fut + Send + 'static)
where
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
            rt.block_on(cleanup());
        }
    })
    .join();
}

/// The exit status of container `id` once it has exited; None if it still runs after `within`.
pub async fn exit_code(id: &str, within: std::time::Duration) -> anyhow::Result<Option<i64>> {
    let docker = docker().await?;
    let mut wait = docker.wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
    match tokio::time::timeout(within, wait.next()).await {
        Ok(Some(Ok(response))) => Ok(Some(response.status_code)),
        // bollard reports a non-zero exit as an error carrying the status.
        Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => Ok(Some(code)),
        Ok(other) => anyhow::bail!("waiting for {id} failed: {other:?}"),
        Err(_) => Ok(None),
    }
}

/// Force-removes a container.
pub async fn force_remove(id: String) {
    if let Ok(docker) = docker().await {
        let force = RemoveContainerOptionsBuilder::default().force(true).build();
        let _ = docker.remove_container(&id, Some(force)).await;
    }
}

/// An internal network of the test's (IPv4 and IPv6, no route out). Removing it also removes
/// every container still attached, so nothing is left behind when a test fails.
///
/// Its peers play public services (api.openai.com, github.com), so their addresses are not in
/// the user's network's ranges, which the DNS gate opens only for an entry that says `private:
/// true`: IPv4 from the benchmarking block 198.18.0.0/15 (RFC 2544), IPv6 from the
/// documentation prefix 2001:db8::/32, neither routed anywhere. [`TestNet::create_private`]
/// makes one in the engine's own (private) ranges, as a user's compose network is.
pub struct TestNet {
    pub name: String,
    /// Shared by the tests of a run: not removed when one test's handle is dropped (the xtask
    /// removes it after the run).
    keep: bool,
}

static CREATED: AtomicU32 = AtomicU32::new(0);

impl TestNet {
    pub async fn create(test: &str) -> anyhow::Result<TestNet> {
        let n = CREATED.fetch_add(1, Ordering::SeqCst);
        // Test processes run side by side: each starts where its id and count point, and takes
        // the next subnet while the engine says one overlaps another network's.
        let seed = (std::process::id() << 8) ^ n;
        let mut last = None;
        let name = format!("agent-sandbox-test-{test}-{}-{n}", std::process::id());
        for subnets in sandbox_verify::world_subnets(seed) {
            match TestNet::make(&name, test, &subnets, &[]).await {
                Ok(net) => return Ok(net),
                Err(e) if sandbox_verify::overlaps(&e.to_string()) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no free /24 in 198.18.0.0/15")))
    }

    /// A network in the engine's own ranges (RFC 1918 IPv4, a unique local IPv6 /64): the user's
    /// network, whose addresses an answer opens only for an entry with `private: true`.
    pub async fn create_private(test: &str) -> anyhow::Result<TestNet> {
        let n = CREATED.fetch_add(1, Ordering::SeqCst);
        let v6 = format!("fd00:a5:{:x}:{n:x}::/64", std::process::id() & 0xffff);
        let name = format!("agent-sandbox-test-{test}-{}-{n}", std::process::id());
        TestNet::make(&name, test, &[v6], &[]).await
    }

    /// A network named `name` that the tests of a run share, with `labels` too; an error saying
    /// it "already exists" where another test of the run made it ([`TestNet::kept`] then).
    pub async fn create_kept(name: &str, labels: &[(&str, &str)]) -> anyhow::Result<TestNet> {
        let seed = std::process::id() << 8 ^ 0xff;
        let mut last = None;
        for subnets in sandbox_verify::world_subnets(seed) {
            match TestNet::make(name, "shared", &subnets, labels).await {
                Ok(mut net) => {
                    net.keep = true;
                    return Ok(net);
                }
                Err(e) if sandbox_verify::overlaps(&e.to_string()) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no free /24 in 198.18.0.0/15")))
    }

    /// The network's IPv4 gateway (the host's end of its bridge), as the engine records it.
    pub async fn ipv4_gateway(&self) -> anyhow::Result<std::net::Ipv4Addr> {
        let network = docker()
            .await?
            .inspect_network(&self.name, None::<bollard::query_parameters::InspectNetworkOptions>)
            .await?;
        network
            .ipam
            .and_then(|ipam| ipam.config)
            .unwrap_or_default()
            .into_iter()
            .find_map(|c| c.gateway?.parse().ok())
            .with_context(|| format!("the network {} has no IPv4 gateway", self.name))
    }

    /// The shared network `name`, made by another test of the run.
    pub fn kept(name: &str) -> TestNet {
        TestNet { name: name.to_string(), keep: true }
    }

    async fn make(
        name: &str,
        test: &str,
        subnets: &[String],
        labels: &[(&str, &str)],
    ) -> anyhow::Result<TestNet> {
        let name = name.to_string();
        // The gateway named, as the engine names one it chose: `x.y.z.1`, `…::1`.
        let gateway = |subnet: &str| {
            let net = subnet.split('/').next().unwrap_or_default();
            net.strip_suffix(".0")
                .map(|v4| format!("{v4}.1"))
                .or_else(|| net.strip_suffix("::").map(|v6| format!("{v6}::1")))
        };
        let config = subnets.iter().map(|s| IpamConfig {
            subnet: Some(s.clone()),
            gateway: gateway(s),
            ..Default::default()
        });
        docker()
            .await?
            .create_network(NetworkCreateRequest {
                name: name.clone(),
                internal: Some(true),
                enable_ipv6: Some(true),
                ipam: Some(Ipam { config: Some(config.collect()), ..Default::default() }),
                labels: Some(
                    std::iter::once((TEST_LABEL.to_string(), test.to_string()))
                        .chain(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow::anyhow!("cannot create the network {name}: {e}"))?;
        Ok(TestNet { name, keep: false })
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let name = self.name.clone();
        drop_async(move || remove_with_users(Resource::Network, name));
    }
}

/// What a test creates beside its containers, which a container in use keeps alive.
#[derive(Clone, Copy)]
enum Resource {
    Network,
    Volume,
}

/// Removes a network or volume and every container still using it, so nothing is left behind
/// when a test fails.
async fn remove_with_users(kind: Resource, name: String) {
    let Ok(docker) = docker().await else { return };
    let filter = match kind {
        Resource::Network => "network",
        Resource::Volume => "volume",
    };
    let filters = HashMap::from([(filter.to_string(), vec![name.clone()])]);
    let list = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    for c in docker.list_containers(Some(list)).await.unwrap_or_default() {
        if let Some(id) = c.id {
            force_remove(id).await;
        }
    }
    let _ = match kind {
        Resource::Network => docker.remove_network(&name).await,
        Resource::Volume => {
            docker.remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>).await
        }
    };
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

impl TestVolume {
    /// A volume in memory (a tmpfs, mounted with `options`), empty whenever it is first mounted.
    pub async fn create_tmpfs(test: &str, options: &str) -> anyhow::Result<TestVolume> {
        let n = CREATED.fetch_add(1, Ordering::SeqCst);
        let name = format!("agent-sandbox-test-{test}-{}-{n}", std::process::id());
        docker()
            .await?
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(name.clone()),
                driver_opts: Some(HashMap::from([
                    ("type".to_string(), "tmpfs".to_string()),
                    ("device".to_string(), "tmpfs".to_string()),
                    ("o".to_string(), options.to_string()),
                ])),
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
        let name = self.name.clone();
        drop_async(move || remove_with_users(Resource::Volume, name));
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

/// Runs `cmd` as root in a container: everything it printed, stdout then stderr, as the bytes
/// they were (no lossy decoding to hide a byte a terminal would act on).
pub async fn exec_bytes(container: &str, cmd: &[&str]) -> anyhow::Result<Vec<u8>> {
    let docker = docker().await?;
    let config = ExecConfig {
        cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let created = docker.create_exec(container, config).await?;
    match docker.start_exec(&created.id, None::<StartExecOptions>).await? {
        StartExecResults::Attached { output, .. } => output_bytes(output).await,
        StartExecResults::Detached => Ok(Vec::new()),
    }
}

/// A container's whole log as the bytes it was: stdout's, then stderr's.
pub async fn container_log_bytes(id: &str) -> anyhow::Result<Vec<u8>> {
    let options = LogsOptionsBuilder::default().stdout(true).stderr(true).build();
    output_bytes(docker().await?.logs(id, Some(options))).await
}

async fn output_bytes(
    mut output: impl futures_util::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>>
    + Unpin,
) -> anyhow::Result<Vec<u8>> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while let Some(chunk) = output.next().await {
        match chunk? {
            bollard::container::LogOutput::StdErr { message } => stderr.extend_from_slice(&message),
            other => stdout.extend_from_slice(&other.into_bytes()),
        }
    }
    stdout.extend_from_slice(&stderr);
    Ok(stdout)
}

/// Writes a file into a container (root's, with `mode`), as `docker cp` does.
pub async fn copy_in(container: &str, path: &str, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut archive = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(contents.len() as u64);
    header.set_mode(mode);
    archive.append_data(&mut header, path.trim_start_matches('/'), contents)?;
    let options =
        bollard::query_parameters::UploadToContainerOptions { path: "/".into(), ..Default::default() };
    docker()
        .await?
        .upload_to_container(container, Some(options), bollard::body_full(archive.into_inner()?.into()))
        .await?;
    Ok(())
}

/// Force-removes the container with this id when dropped, whatever the test's outcome.
pub struct RemoveOnDrop(pub String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let id = self.0.clone();
        drop_async(move || force_remove(id));
    }
}

/// A container of `image` started with a terminal, as `docker run -it` starts one, with its
/// terminal attached (keys in, the screen out); removed when the guard drops.
pub async fn start_with_terminal(
    image: &str,
    label: &str,
) -> anyhow::Result<(RemoveOnDrop, bollard::container::AttachContainerResults)> {
    use bollard::models::{ContainerCreateBody, HostConfig};
    use bollard::query_parameters::{
        AttachContainerOptionsBuilder, CreateContainerOptions, StartContainerOptions,
    };
    let docker = docker().await?;
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        tty: Some(true),
        open_stdin: Some(true),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        labels: Some([(TEST_LABEL.to_string(), label.to_string())].into()),
        host_config: Some(HostConfig { network_mode: Some("none".into()), ..Default::default() }),
        ..Default::default()
    };
    let id = docker.create_container(None::<CreateContainerOptions>, body).await?.id;
    let guard = RemoveOnDrop(id.clone());
    let options = AttachContainerOptionsBuilder::default().stdin(true).stdout(true).stream(true).build();
    let attached = docker.attach_container(&id, Some(options)).await?;
    docker.start_container(&id, None::<StartContainerOptions>).await?;
    Ok((guard, attached))
}

pub async fn container_logs(id: &str) -> anyhow::Result<(String, String)> {
    let docker = docker().await?;
    let options = LogsOptionsBuilder::default().stdout(true).stderr(true).build();
    split_output(docker.logs(id, Some(options))).await
}

/// Waits up to `seconds` for the container's log (stdout or stderr) to contain `needle`.
pub async fn wait_for_log(id: &str, needle: &str, seconds: u64) -> anyhow::Result<()> {
    let (found, out, err) =
        follow_log_until(id, seconds, |out, err| out.contains(needle) || err.contains(needle)).await?;
    anyhow::ensure!(found, "`{needle}` not in {id}'s log: {out}{err}");
    Ok(())
}

/// Follows the container's log from its start until `found(stdout, stderr)` holds, the log ends
/// (the container stopped) or `seconds` pass: whether it held, and the log read by then. The
/// engine pushes each chunk as it is written, so nothing waits on a timer.
pub async fn follow_log_until(
    id: &str,
    seconds: u64,
    found: impl Fn(&str, &str) -> bool,
) -> anyhow::Result<(bool, String, String)> {
    let docker = docker().await?;
    let options = LogsOptionsBuilder::default().stdout(true).stderr(true).follow(true).build();
    let (mut out, mut err) = (String::new(), String::new());
    let follow = async {
        let mut stream = docker.logs(id, Some(options));
        while let Some(chunk) = stream.next().await {
            match chunk? {
                bollard::container::LogOutput::StdErr { message } => {
                    err.push_str(&String::from_utf8_lossy(&message))
                }
                other => out.push_str(&other.to_string()),
            }
            if found(&out, &err) {
                return anyhow::Ok(true);
            }
        }
        anyhow::Ok(false)
    };
    let held =
        tokio::time::timeout(std::time::Duration::from_secs(seconds), follow).await.unwrap_or(Ok(false))?;
    Ok((held, out, err))
}

/// The environment of the process in the session's pane (the agent's command), read as the
/// container's own user in the agent's container: `NAME=VALUE` entries, NUL-separated.
pub async fn pane_environ(container: &str) -> anyhow::Result<String> {
    let tmux = ["sandbox-exec", "--", "tmux", "display-message", "-p", "-t", "agent", "#{pane_pid}"];
    let pane = exec(container, &tmux, None).await?;
    anyhow::ensure!(pane.code == 0 && !pane.stdout.trim().is_empty(), "{pane:?}");
    Ok(exec(container, &["cat", &format!("/proc/{}/environ", pane.stdout.trim())], None).await?.stdout)
}

/// An engine output stream as (stdout, stderr).
pub async fn split_output(
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

/// The image's HEALTHCHECK turned off, for a container of an agent image that runs something
/// other than a sandbox's PID 1 (a holder, a pause container: a kubelet ignores HEALTHCHECK).
pub fn no_healthcheck() -> bollard::models::HealthConfig {
    bollard::models::HealthConfig { test: Some(vec!["NONE".into()]), ..Default::default() }
}

/// The container's health as the engine last judged it, and the check's last output: `none`
/// where it runs no check.
pub async fn health(id: &str) -> anyhow::Result<(String, String)> {
    let docker = docker().await?;
    let health = docker.inspect_container(id, None).await?.state.and_then(|s| s.health);
    let now = health.as_ref().and_then(|h| h.status).map_or_else(|| "none".to_string(), |s| s.to_string());
    let said = health
        .and_then(|h| h.log)
        .and_then(|log| log.last().and_then(|entry| entry.output.clone()))
        .unwrap_or_default();
    Ok((now, said))
}

/// Waits up to `seconds` for the engine to call the container `status` (`healthy`,
/// `unhealthy`) with a check whose output holds `says`, by its event stream: that output.
pub async fn health_becomes(id: &str, status: &str, says: &str, seconds: u64) -> anyhow::Result<String> {
    let docker = docker().await?;
    let filters = HashMap::from([("container".to_string(), vec![id.to_string()])]);
    let options = bollard::query_parameters::EventsOptions { filters: Some(filters), ..Default::default() };
    // Subscribed before the state is read, so that no change falls between the two.
    let mut events = Box::pin(docker.events(Some(options)));
    let wait = async {
        loop {
            let (now, said) = health(id).await?;
            if now == status && said.contains(says) {
                return anyhow::Ok(said);
            }
            match events.next().await {
                Some(event) => drop(event?),
                None => anyhow::bail!("the engine's event stream ended; {id} was {now}: {said}"),
            }
        }
    };
    match tokio::time::timeout(std::time::Duration::from_secs(seconds), wait).await {
        Ok(result) => result,
        Err(_) => {
            let (now, said) = health(id).await?;
            anyhow::bail!("{id} was not {status} saying `{says}` within {seconds} s: {now}: {said}")
        }
    }
}
