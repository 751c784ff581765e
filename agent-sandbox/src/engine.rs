//! Every engine call the launcher makes (bollard), behind two handles: [`Engine`] (finding its
//! sandboxes by label, the image's facts, volumes, creating a container) and [`Sandbox`] (one
//! container: files into and out of it as tar archives, commands in it, its log, signals, the
//! terminal of `sandbox-attach`). The rest of the launcher is logic on what these return.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bollard::Docker;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, ExecConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, DownloadFromContainerOptions, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder, ResizeExecOptions,
    StopContainerOptionsBuilder, UploadToContainerOptions,
};
use futures_util::StreamExt as _;
use sandbox_images::labels;
use sandbox_images::platform::Platform;

use crate::exit::{Code, Failure, Result};
use crate::identity::folder_name;

/// The engine the launcher talks to.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    /// The engine's version, asked once: each GET /version costs 6 to 8 ms (curl on the socket),
    /// and a run wants it twice (Podman or not, the platform).
    version: std::sync::Arc<tokio::sync::OnceCell<bollard::models::SystemVersion>>,
}

/// One of the launcher's containers: what the engine listed of it, and its calls.
#[derive(Clone)]
pub struct Sandbox {
    docker: Docker,
    found: Found,
}

impl Sandbox {
    pub fn into_found(self) -> Found {
        self.found
    }
}

impl std::ops::Deref for Sandbox {
    type Target = Found;
    fn deref(&self) -> &Found {
        &self.found
    }
}

/// One of the launcher's sandboxes, as the engine lists it.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub id: String,
    pub name: String,
    pub agent: String,
    pub project: String,
    pub state: String,
    /// What the project's git files were at start (JSON), or empty if they were not guarded.
    pub git: String,
    pub running: bool,
    /// The engine's words: `Up 5 minutes`, `Exited (0) 2 hours ago`.
    pub status: String,
    pub image: String,
    /// Sidecar mode: the gateway's container name, which holds the firewall, the policy, the keys
    /// and the logs; empty when the one container holds them.
    pub gateway: String,
    /// The image's id (`sha256:…`) the container was made from.
    pub image_id: String,
}

/// What the engine says of a container beyond its listing: when it started and its limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Details {
    /// RFC 3339, as the engine gives it; None when it is not running.
    pub started_at: Option<String>,
    pub memory_bytes: Option<i64>,
    pub cpus: Option<f64>,
    pub pids: Option<i64>,
    /// The engine's network mode (`none`: no network, `--offline`).
    pub network_mode: Option<String>,
}

impl Found {
    /// Fails, saying how to start it again, unless the sandbox runs.
    pub fn ensure_running(&self) -> Result<()> {
        if self.running {
            return Ok(());
        }
        Err(Failure::new(
            Code::NoSandbox,
            format!(
                "{} is not running ({}): `agent-sandbox run {}` starts it again",
                self.name, self.status, self.agent
            ),
        ))
    }
}

impl Engine {
    pub async fn connect() -> Result<Engine> {
        Ok(Engine { docker: sandbox_images::engine::connect().await?, version: Default::default() })
    }

    async fn version(&self) -> Result<&bollard::models::SystemVersion> {
        Ok(self.version.get_or_try_init(|| self.docker.version()).await?)
    }

    /// The engine's API itself, for what only `verify` does (networks, containers of any image).
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Whether the engine is Podman behind its Docker-compatible API, which takes a few
    /// settings otherwise (`SandboxSpec::for_podman`).
    pub async fn is_podman(&self) -> Result<bool> {
        let version = self.version().await?;
        Ok(version.components.iter().flatten().any(|c| c.name.contains("Podman")))
    }

    /// The arguments the engine gives the runtime `name` (`runtimeArgs` in daemon.json); None
    /// if it has no such runtime.
    pub async fn runtime_args(&self, name: &str) -> Result<Option<Vec<String>>> {
        let info = self.docker.info().await?;
        let mut runtimes = info.runtimes.unwrap_or_default();
        Ok(runtimes.remove(name).map(|runtime| runtime.runtime_args.unwrap_or_default()))
    }

    /// Every container the launcher started, running or not.
    pub async fn sandboxes(&self) -> Result<Vec<Sandbox>> {
        let docker = &self.docker;
        let filters = HashMap::from([("label", vec![labels::LAUNCHER_AGENT])]);
        let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        let mut found: Vec<Found> = docker
            .list_containers(Some(options))
            .await?
            .into_iter()
            .map(|c| {
                let labels = c.labels.unwrap_or_default();
                let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
                Found {
                    id: c.id.unwrap_or_default(),
                    name: c
                        .names
                        .and_then(|n| n.into_iter().next())
                        .map(|n| n.trim_start_matches('/').to_string())
                        .unwrap_or_default(),
                    agent: label(labels::LAUNCHER_AGENT),
                    project: label(labels::LAUNCHER_PROJECT),
                    state: label(labels::LAUNCHER_STATE),
                    git: label(labels::LAUNCHER_GIT),
                    running: c.state == Some(ContainerSummaryStateEnum::RUNNING),
                    status: c.status.unwrap_or_default(),
                    image: c.image.unwrap_or_default(),
                    gateway: label(labels::LAUNCHER_GATEWAY),
                    image_id: c.image_id.unwrap_or_default(),
                }
            })
            .collect();
        found.sort_by(|a, b| (&a.agent, &a.project).cmp(&(&b.agent, &b.project)));
        Ok(found.into_iter().map(|found| self.sandbox(found)).collect())
    }

    /// The sandbox `which` names: its container name, its agent, or its project's folder name (or
    /// path). Exactly one must match.
    pub async fn find(&self, which: &str) -> Result<Sandbox> {
        let all = self.sandboxes().await?.into_iter().map(|s| s.found).collect();
        Ok(self.sandbox(pick(all, which)?))
    }

    /// The handle of a container the engine listed (or this launcher just created).
    pub fn sandbox(&self, found: Found) -> Sandbox {
        Sandbox { docker: self.docker.clone(), found }
    }
}

/// Removes a volume; one that is not there is removed already.
async fn remove_volume(docker: &Docker, name: &str) -> Result<()> {
    match docker.remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>).await {
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        other => Ok(other?),
    }
}

fn pick(all: Vec<Found>, which: &str) -> Result<Found> {
    let by_name: Vec<&Found> = all.iter().filter(|s| s.name == which || s.id.starts_with(which)).collect();
    let matches: Vec<&Found> = if by_name.len() == 1 {
        by_name
    } else {
        all.iter()
            .filter(|s| s.agent == which || s.project == which || folder_name(Path::new(&s.project)) == which)
            .collect()
    };
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(Failure::new(
            Code::NoSandbox,
            format!("no sandbox is named '{which}': `agent-sandbox ls` lists them by agent and project"),
        )),
        many => Err(Failure::new(
            Code::NoSandbox,
            format!(
                "'{which}' names {} sandboxes ({}): name one by its container name",
                many.len(),
                many.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// What the launcher needs of an image: its environment, its labels, its entrypoint, and its
/// platform as the engine records it (`linux/arm64/v8`).
pub struct ImageFacts {
    /// The image's id (`sha256:` of its configuration, which names its layers' contents).
    pub id: String,
    pub env: Vec<String>,
    pub labels: HashMap<String, String>,
    pub entrypoint: Vec<String>,
    pub platform: String,
}

impl ImageFacts {
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env.iter().find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
    }

    /// The image's state folders (`SANDBOX_STATE_DIRS`), those under the agent's home.
    pub fn state_dirs(&self) -> Vec<String> {
        let dirs = self.env_var(sandbox_policy::layout::STATE_DIRS_ENV).unwrap_or_default();
        dirs.split(':')
            .filter(|d| d.starts_with(sandbox_policy::layout::AGENT_HOME))
            .map(str::to_string)
            .collect()
    }
}

impl Engine {
    /// The image `reference`, or `None` when the engine has none by that name.
    pub async fn image(&self, reference: &str) -> Result<Option<ImageFacts>> {
        match self.docker.inspect_image(reference).await {
            Ok(image) => {
                let platform = [image.os, image.architecture, image.variant]
                    .into_iter()
                    .flatten()
                    .filter(|part| !part.is_empty())
                    .collect::<Vec<_>>()
                    .join("/");
                let config = image.config.unwrap_or_default();
                Ok(Some(ImageFacts {
                    id: image.id.unwrap_or_default(),
                    env: config.env.unwrap_or_default(),
                    labels: config.labels.unwrap_or_default(),
                    entrypoint: config.entrypoint.unwrap_or_default(),
                    platform,
                }))
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Pulls `reference` (an image by its pinned digest) unless the engine has it; with a
    /// platform, always, so that an index gives that platform's manifest.
    pub async fn pull(&self, reference: &str, platform: Option<Platform>) -> Result<()> {
        match platform {
            None => sandbox_images::engine::ensure_pulled(&self.docker, reference).await?,
            Some(platform) => {
                sandbox_images::engine::pull(&self.docker, reference, Some(platform.name())).await?
            }
        };
        Ok(())
    }

    /// The engine's own platform (its architecture), None for one this project builds nothing for.
    pub async fn platform(&self) -> Result<Option<Platform>> {
        let version = self.version().await?;
        Ok(version.arch.as_deref().and_then(|arch| arch.parse().ok()))
    }

    /// Creates the container `found` describes (its name, agent, project, state volume, git
    /// snapshot), from `body`; not started.
    pub async fn create(&self, mut found: Found, body: ContainerCreateBody) -> Result<Sandbox> {
        let options = CreateContainerOptionsBuilder::default().name(&found.name).build();
        found.id = self.docker.create_container(Some(options), body).await?.id;
        Ok(self.sandbox(found))
    }

    /// The file at `path` in the image `reference`, read from a container created for it (never
    /// started) and removed again; None where the image has no such file.
    pub async fn file_in_image(&self, reference: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let body = ContainerCreateBody {
            image: Some(reference.to_string()),
            network_disabled: Some(true),
            ..Default::default()
        };
        let id = self
            .docker
            .create_container(None::<bollard::query_parameters::CreateContainerOptions>, body)
            .await?
            .id;
        let reader = self.sandbox(Found { id: id.clone(), name: id, ..Default::default() });
        let read = reader.get(path).await;
        reader.remove(0).await?;
        Ok(read?.into_iter().next().map(|(_, bytes)| bytes))
    }

    /// Removes a volume (one the launcher made and no container uses); one that is not there is
    /// removed already.
    pub async fn remove_volume(&self, name: &str) -> Result<()> {
        remove_volume(&self.docker, name).await
    }

    /// Creates the volume unless it exists, labelled as the launcher's; whether it made it.
    pub async fn ensure_volume(&self, name: &str, labels: HashMap<String, String>) -> Result<bool> {
        if self.docker.inspect_volume(name).await.is_ok() {
            return Ok(false);
        }
        let request = bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..Default::default()
        };
        self.docker.create_volume(request).await?;
        Ok(true)
    }
}

/// A file to put into a container, with its owner and mode (a directory when `contents` is None).
/// Its `Debug` shows no contents: they are keys and sign-in files.
#[derive(Clone)]
pub struct Entry {
    pub path: String,
    pub contents: Option<Vec<u8>>,
    pub mode: u32,
    pub uid: u64,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let size = self.contents.as_ref().map_or("folder".to_string(), |c| format!("{} bytes", c.len()));
        write!(f, "{} {:o} uid {} ({size})", self.path, self.mode, self.uid)
    }
}

/// What a command run in the container printed, and its status.
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i64,
}

impl Sandbox {
    /// The container that holds the firewall, the policy and the logs: the gateway in sidecar
    /// mode, else the sandbox's one container. Files, commands, signals and logs go there; the
    /// terminal goes to the agent's.
    pub fn firewall(&self) -> &str {
        if self.gateway.is_empty() { &self.id } else { &self.gateway }
    }

    /// The handle of the agent's own container alone (sidecar mode's, before its gateway runs).
    pub fn agent_side(&self) -> Sandbox {
        Sandbox { docker: self.docker.clone(), found: Found { gateway: String::new(), ..self.found.clone() } }
    }

    pub async fn start(&self) -> Result<()> {
        let (docker, id) = (&self.docker, self.id.as_str());
        docker.start_container(id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        Ok(())
    }

    /// Stops (SIGTERM, SIGKILL after `grace` seconds) and removes the container; in sidecar
    /// mode the agent's first, then its gateway, the namespace's holder and their shared volume.
    pub async fn remove(&self, grace: i32) -> Result<()> {
        let docker = &self.docker;
        let stop = StopContainerOptionsBuilder::default().t(grace).build();
        let force = RemoveContainerOptionsBuilder::default().force(true).build();
        let _ = docker.stop_container(&self.id, Some(stop.clone())).await;
        docker.remove_container(&self.id, Some(force.clone())).await?;
        if !self.gateway.is_empty() {
            for container in [self.gateway.clone(), crate::identity::holder_name(&self.name)] {
                let _ = docker.stop_container(&container, Some(stop.clone())).await;
                match docker.remove_container(&container, Some(force.clone())).await {
                    Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
                    other => other?,
                }
            }
            remove_volume(docker, &crate::identity::shared_volume(&self.name)).await?;
        }
        Ok(())
    }

    pub async fn signal(&self, signal: &str) -> Result<()> {
        let (docker, id) = (&self.docker, self.firewall());
        docker
            .kill_container(id, Some(KillContainerOptionsBuilder::default().signal(signal).build()))
            .await?;
        Ok(())
    }

    /// Writes `entries` (paths relative to /) into the container, running or only created, with
    /// the owners and modes given: one tar archive, which the engine extracts as root.
    pub async fn put(&self, entries: &[Entry]) -> Result<()> {
        // An empty archive changes nothing, and the call costs 40 ms (2 cores).
        if entries.is_empty() {
            return Ok(());
        }
        let (docker, id) = (&self.docker, self.firewall());
        let mut archive = tar::Builder::new(Vec::new());
        for entry in entries {
            let mut header = tar::Header::new_gnu();
            header.set_uid(entry.uid);
            header.set_gid(entry.uid);
            header.set_mode(entry.mode);
            header.set_mtime(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            );
            let contents = entry.contents.as_deref().unwrap_or_default();
            header.set_entry_type(if entry.contents.is_some() {
                tar::EntryType::Regular
            } else {
                tar::EntryType::Directory
            });
            header.set_size(contents.len() as u64);
            archive
                .append_data(&mut header, entry.path.trim_start_matches('/'), contents)
                .map_err(|e| Failure::new(Code::Engine, format!("cannot pack {}: {e}", entry.path)))?;
        }
        let bytes =
            archive.into_inner().map_err(|e| Failure::new(Code::Engine, format!("cannot pack: {e}")))?;
        let options = UploadToContainerOptions { path: "/".into(), ..Default::default() };
        docker.upload_to_container(id, Some(options), bollard::body_full(bytes.into())).await?;
        Ok(())
    }

    /// The files under `path` in the container (one file, or a folder's files), by their path
    /// relative to `path`'s parent; none when `path` does not exist.
    ///
    /// The engine tars a file by its size at `lstat` and then copies what `open` finds: when
    /// sandbox-init renames a new status file over the old one in between, the archive ends
    /// short ("unexpected EOF"). Files here are replaced whole, never written in place, so a
    /// second read sees one version or the other; a torn archive is read again, a few times.
    pub async fn get(&self, path: &str) -> Result<Vec<(String, Vec<u8>)>> {
        const TRIES: u32 = 4;
        let mut attempt = 1;
        loop {
            let Some(bytes) = self.archive(path).await? else { return Ok(Vec::new()) };
            match unpack(&bytes) {
                Ok(files) => return Ok(files),
                Err(_) if attempt < TRIES => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    return Err(Failure::new(
                        Code::Engine,
                        format!("cannot read {path} from the sandbox: {e}"),
                    ));
                }
            }
        }
    }

    /// The engine's tar archive of `path` in the firewall's container; `None` when it does not exist.
    async fn archive(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let (docker, id) = (&self.docker, self.firewall());
        let options = DownloadFromContainerOptions { path: path.to_string() };
        let mut stream = docker.download_from_container(id, Some(options));
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Some(bytes))
    }

    /// Runs `cmd` as root in the container and collects its output.
    pub async fn exec(&self, cmd: &[&str]) -> Result<Output> {
        self.exec_as(None, cmd).await
    }

    /// Runs `cmd` as root in the agent's container and collects at most `cap` bytes of its
    /// standard output (the web page's screen: what the agent's tmux server answers is the
    /// agent's to make as large as it likes); its status is not waited for.
    pub async fn exec_capped(&self, cmd: &[&str], cap: usize) -> Result<Vec<u8>> {
        let config = ExecConfig {
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            attach_stdout: Some(true),
            ..Default::default()
        };
        let created = self.docker.create_exec(&self.id, config).await?;
        let mut collected = Vec::new();
        if let StartExecResults::Attached { mut output, .. } =
            self.docker.start_exec(&created.id, None::<StartExecOptions>).await?
        {
            while let Some(chunk) = output.next().await {
                collected.extend_from_slice(&chunk?.into_bytes());
                if collected.len() >= cap {
                    collected.truncate(cap);
                    break;
                }
            }
        }
        Ok(collected)
    }

    /// Runs `cmd` in the container as `user` (the image's user when None) and collects its output.
    pub async fn exec_as(&self, user: Option<&str>, cmd: &[&str]) -> Result<Output> {
        let (docker, id) = (&self.docker, self.firewall());
        let config = ExecConfig {
            user: user.map(str::to_string),
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let created = docker.create_exec(id, config).await?;
        let (mut stdout, mut stderr) = (String::new(), String::new());
        if let StartExecResults::Attached { mut output, .. } =
            docker.start_exec(&created.id, None::<StartExecOptions>).await?
        {
            while let Some(chunk) = output.next().await {
                match chunk? {
                    bollard::container::LogOutput::StdErr { message } => {
                        stderr.push_str(&String::from_utf8_lossy(&message))
                    }
                    other => stdout.push_str(&other.to_string()),
                }
            }
        }
        let code = docker.inspect_exec(&created.id).await?.exit_code.unwrap_or(-1);
        Ok(Output { stdout, stderr, code })
    }

    /// Starts `cmd` in the container as `user` and returns at once (`verify`'s listener).
    pub async fn exec_detached(&self, user: Option<&str>, cmd: &[&str]) -> Result<()> {
        let (docker, id) = (&self.docker, self.firewall());
        let config = ExecConfig {
            user: user.map(str::to_string),
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        let created = docker.create_exec(id, config).await?;
        let options = StartExecOptions { detach: true, ..Default::default() };
        docker.start_exec(&created.id, Some(options)).await?;
        Ok(())
    }

    /// The container's log (stdout and stderr as they came), all of it or the last `tail` lines.
    pub async fn logs(&self, tail: Option<usize>) -> Result<String> {
        let (docker, id) = (&self.docker, self.firewall());
        let mut options = LogsOptionsBuilder::default().stdout(true).stderr(true);
        if let Some(tail) = tail {
            options = options.tail(&tail.to_string());
        }
        let mut stream = docker.logs(id, Some(options.build()));
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            text.push_str(&chunk?.to_string());
        }
        Ok(text)
    }

    /// Follows the container's log from its start until its output has a line that starts with
    /// `prefix` (true), or the log ends because the container stopped (false); with all the log
    /// read so far. The engine pushes each line as it comes: nothing is polled.
    pub async fn follow_until(&self, prefix: &str) -> Result<(bool, String)> {
        let (docker, id) = (&self.docker, self.firewall());
        let options = LogsOptionsBuilder::default().stdout(true).stderr(true).follow(true).build();
        let mut stream = docker.logs(id, Some(options));
        // Lines are looked for in the output alone, whole: a chunk of stderr may come between
        // two parts of one.
        let (mut text, mut out, mut looked) = (String::new(), String::new(), 0);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            let piece = chunk.to_string();
            text.push_str(&piece);
            if matches!(chunk, bollard::container::LogOutput::StdErr { .. }) {
                continue;
            }
            out.push_str(&piece);
            if has_line(&out, &mut looked, prefix) {
                return Ok((true, text));
            }
        }
        Ok((false, text))
    }

    /// Copies the container's log to stdout and stderr, and keeps following it.
    pub async fn follow_logs(&self) -> Result<()> {
        let (docker, id) = (&self.docker, self.firewall());
        let options = LogsOptionsBuilder::default().stdout(true).stderr(true).follow(true).build();
        let mut stream = docker.logs(id, Some(options));
        while let Some(chunk) = stream.next().await {
            match chunk? {
                bollard::container::LogOutput::StdErr { message } => crate::say::err_bytes(&message),
                other => crate::say::out_bytes(&other.into_bytes()),
            }
        }
        Ok(())
    }

    /// The agent's container's start time and limits (the web page's list).
    pub async fn details(&self) -> Result<Details> {
        let inspected = self
            .docker
            .inspect_container(&self.id, None::<bollard::query_parameters::InspectContainerOptions>)
            .await?;
        let state = inspected.state.unwrap_or_default();
        let host = inspected.host_config.unwrap_or_default();
        let positive = |n: Option<i64>| n.filter(|n| *n > 0);
        Ok(Details {
            started_at: if state.running == Some(true) { state.started_at } else { None },
            memory_bytes: positive(host.memory),
            cpus: positive(host.nano_cpus).map(|n| n as f64 / 1e9),
            pids: positive(host.pids_limit),
            network_mode: host.network_mode,
        })
    }

    /// Whether the container runs, and its exit code when it does not.
    pub async fn exited(&self) -> Result<Option<i64>> {
        let (docker, id) = (&self.docker, self.firewall());
        let state = docker
            .inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>)
            .await?
            .state;
        let state = state.unwrap_or_default();
        Ok(if state.running == Some(true) { None } else { Some(state.exit_code.unwrap_or(-1)) })
    }
}

/// Whether the whole lines of `out` from `looked` on have one that starts with `prefix`;
/// `looked` moves past them, so that a line is looked at once, when it has ended.
fn has_line(out: &str, looked: &mut usize, prefix: &str) -> bool {
    let Some(end) = out[*looked..].rfind('\n').map(|at| *looked + at) else { return false };
    let found = out[*looked..end].lines().any(|l| l.starts_with(prefix));
    *looked = end + 1;
    found
}

/// A command run in the container, attached (with a terminal of its own, or without): what it
/// prints and what it reads.
pub struct Terminal {
    docker: Docker,
    exec: String,
    pub output: std::pin::Pin<
        Box<
            dyn futures_util::Stream<
                    Item = std::result::Result<bollard::container::LogOutput, bollard::errors::Error>,
                > + Send,
        >,
    >,
    pub input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

impl Sandbox {
    /// Runs `cmd` as the image's user with a terminal (the variables `env` set) and attaches
    /// to it.
    pub async fn terminal(&self, cmd: &str, env: Vec<String>) -> Result<Terminal> {
        self.attached(&[cmd.to_string()], env, true, true).await
    }

    /// Runs `cmd` in the agent's container as the image's user (the variables `env` set) and
    /// attaches to its output, to its input when `stdin`, with a terminal of its own when `tty`
    /// (its output then comes as one stream).
    pub async fn attached(
        &self,
        cmd: &[String],
        env: Vec<String>,
        stdin: bool,
        tty: bool,
    ) -> Result<Terminal> {
        let config = ExecConfig {
            cmd: Some(cmd.to_vec()),
            attach_stdin: Some(stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(tty),
            env: Some(env),
            ..Default::default()
        };
        let exec = self.docker.create_exec(&self.id, config).await?.id;
        let options = StartExecOptions { detach: false, tty, output_capacity: None };
        let StartExecResults::Attached { output, input } =
            self.docker.start_exec(&exec, Some(options)).await?
        else {
            let shown = cmd.first().map_or("", String::as_str);
            return Err(Failure::new(Code::Engine, format!("the engine did not attach to {shown}")));
        };
        Ok(Terminal { docker: self.docker.clone(), exec, output, input })
    }
}

/// Resizes a [`Terminal`]; kept apart from it so that a task can resize while another reads.
#[derive(Clone)]
pub struct Resizer {
    docker: Docker,
    exec: String,
}

impl Resizer {
    pub async fn resize(&self, rows: u16, columns: u16) {
        let options = ResizeExecOptions { h: i32::from(rows), w: i32::from(columns) };
        let _ = self.docker.resize_exec(&self.exec, options).await;
    }
}

impl Terminal {
    pub fn resizer(&self) -> Resizer {
        Resizer { docker: self.docker.clone(), exec: self.exec.clone() }
    }

    /// The command's exit status, once its output has ended (0 when the engine recorded none:
    /// the session's client, killed with its container).
    pub async fn status(&self) -> Result<i64> {
        Ok(self.docker.inspect_exec(&self.exec).await?.exit_code.unwrap_or(0))
    }

    /// The command's exit status, once its output has ended. The engine may close the output a
    /// moment before it records the status, and a command may close its output and run on: it
    /// is asked again until it has one (never taken as 0), the pause growing to half a second.
    pub async fn exit_code(&self) -> Result<i64> {
        let mut pause = Duration::from_millis(10);
        loop {
            let inspected = self.docker.inspect_exec(&self.exec).await?;
            if inspected.running != Some(true)
                && let Some(code) = inspected.exit_code
            {
                return Ok(code);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
}

/// The regular files of a tar archive, by name.
fn unpack(bytes: &[u8]) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut files = Vec::new();
    for entry in tar::Archive::new(bytes).entries()? {
        let mut entry = entry?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let mut contents = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut contents)?;
        if (contents.len() as u64) < entry.header().size()? {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("{name} ends short")));
        }
        files.push((name, contents));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_found_once_whole_however_the_chunks_split_it() {
        let feed = |chunks: &[&str]| {
            let (mut out, mut looked) = (String::new(), 0);
            chunks.iter().any(|chunk| {
                out.push_str(chunk);
                has_line(&out, &mut looked, "sandbox ready")
            })
        };
        // A chunk without a line's end after a whole line (the red team's panic: "a\n", then "b").
        assert!(!feed(&["a\n", "b"]));
        assert!(feed(&["a\n", "b", "c\nsandbox ready: 1 domain\n"]));
        assert!(feed(&["sandbox re", "ady: x", "\n"]));
        // Only at a line's start, and only once the line has ended.
        assert!(!feed(&["x sandbox ready\n", "sandbox ready"]));
        assert!(!feed(&["sandbox", " not ready\n"]));
    }

    fn sandbox(name: &str, agent: &str, project: &str) -> Found {
        Found {
            id: format!("{name}-id"),
            name: name.into(),
            agent: agent.into(),
            project: project.into(),
            state: String::new(),
            git: String::new(),
            running: true,
            status: String::new(),
            image: String::new(),
            gateway: String::new(),
            image_id: String::new(),
        }
    }

    #[test]
    fn a_sandbox_is_named_by_container_agent_or_project() {
        let all = || {
            vec![
                sandbox("agent-sandbox-claude-app-1", "claude", "/src/app"),
                sandbox("agent-sandbox-codex-app-2", "codex", "/src/app"),
                sandbox("agent-sandbox-claude-lib-3", "claude", "/src/lib"),
            ]
        };
        assert_eq!(pick(all(), "codex").unwrap().name, "agent-sandbox-codex-app-2");
        assert_eq!(pick(all(), "lib").unwrap().name, "agent-sandbox-claude-lib-3");
        assert_eq!(pick(all(), "agent-sandbox-claude-app-1").unwrap().agent, "claude");
        let many = pick(all(), "claude").unwrap_err();
        assert_eq!(many.code, Code::NoSandbox);
        assert!(many.message.contains("agent-sandbox-claude-app-1, agent-sandbox-claude-lib-3"), "{many}");
        assert_eq!(pick(all(), "gemini").unwrap_err().code, Code::NoSandbox);
    }

    #[test]
    fn a_torn_archive_is_an_error_and_a_whole_one_is_read() {
        let mut archive = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(40);
        header.set_mode(0o644);
        archive.append_data(&mut header, "status.json", &[b'x'; 40][..]).unwrap();
        let whole = archive.into_inner().unwrap();
        assert_eq!(unpack(&whole).unwrap(), vec![("status.json".to_string(), vec![b'x'; 40])]);
        // What the engine sends when the file it copies ends before the size it announced.
        let torn = &whole[..512 + 20];
        assert!(unpack(torn).is_err());
    }
}
