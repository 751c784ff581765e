//! The launcher, `agent-sandbox`, as the launcher:: suite drives it: the real binary (the one
//! `cargo xtask test` built, else built once per test process), run with a home folder of the
//! test's and none of the user's keys, on projects that take every container and volume the
//! launcher made for them when dropped.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context as _;
use bollard::query_parameters::{ListContainersOptionsBuilder, ListVolumesOptionsBuilder};

use crate::docker::{docker, drop_async, force_remove};
use crate::root;

/// The launcher binary (debug): the one `cargo xtask test` built before the suites started,
/// else built by cargo once per test process.
pub fn binary() -> anyhow::Result<PathBuf> {
    static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(path) = BINARY.get() {
        return Ok(path.clone());
    }
    if let Some(built) =
        std::env::var_os(xtask::project::LAUNCHER_ENV).map(PathBuf::from).filter(|p| p.is_file())
    {
        return Ok(BINARY.get_or_init(|| built).clone());
    }
    let sh = xshell::Shell::new()?;
    let root = root();
    let _dir = sh.push_dir(&root);
    xshell::cmd!(sh, "cargo build --quiet --package agent-sandbox")
        .run()
        .context("cannot build agent-sandbox")?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    Ok(BINARY.get_or_init(|| target.join("debug").join("agent-sandbox")).clone())
}

/// Fails unless the running test's place allows NET_ADMIN, where the launcher gave it to a
/// container of `project` (a sandbox with a network, its gateway).
async fn given_net_admin(project: &str) -> anyhow::Result<()> {
    for (id, _) in containers_of(project).await? {
        let inspected = docker().await?.inspect_container(&id, None).await?;
        let caps = inspected.host_config.and_then(|h| h.cap_add).unwrap_or_default();
        if caps.iter().any(|c| c.trim_start_matches("CAP_") == "NET_ADMIN") {
            return crate::place::ensure(crate::place::Need::NetAdmin);
        }
    }
    Ok(())
}

/// What one run of the launcher printed and returned.
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Standard output, then standard error, as the bytes they were.
    pub raw: Vec<u8>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("code", &self.code)
            .field("stdout", &self.stdout)
            .field("stderr", &self.stderr)
            .finish()
    }
}

/// The launcher with a home folder of its own (for `--login-from-host`, and its locks) and the
/// variables given.
pub struct Launcher {
    pub home: tempfile::TempDir,
    env: HashMap<String, String>,
}

impl Launcher {
    pub fn new() -> anyhow::Result<Launcher> {
        Ok(Launcher { home: tempfile::tempdir()?, env: HashMap::new() })
    }

    pub fn env(mut self, name: &str, value: &str) -> Launcher {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Runs `agent-sandbox ARGS…` to its end, without a terminal, its standard input empty.
    pub async fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<Outcome> {
        self.run_fed(args, None).await
    }

    /// The same, with `input` on its standard input when given.
    pub async fn run_fed<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: &[S],
        input: Option<&[u8]>,
    ) -> anyhow::Result<Outcome> {
        let mut cmd = tokio::process::Command::new(binary()?);
        // The run's shape: sidecar mode's pair where the suites run in it and the sandbox has a
        // network to filter.
        let given: Vec<&std::ffi::OsStr> = args.iter().map(AsRef::as_ref).collect();
        let command = given.first().and_then(|a| a.to_str()).unwrap_or_default();
        let has = |flag: &str| given.iter().any(|a| *a == flag);
        // What the launcher will give: NET_ADMIN to `verify`'s world, runsc where asked; the
        // test's place must say so (place.rs). A sandbox with a network is checked once made.
        if command == "verify" {
            crate::place::ensure(crate::place::Need::NetAdmin)?;
        }
        let gvisor = crate::place::Shape::current() == crate::place::Shape::Gvisor;
        if has("--runtime") || (gvisor && command == "run") {
            crate::place::ensure(crate::place::Need::Runsc)?;
        }
        let shaped = command == "run" && !has("--offline") && !has("--sidecar") && !has("--runtime");
        let sidecar = (crate::spec::sidecar_shape() && shaped).then_some("--sidecar");
        let runtime: &[&str] = if gvisor && shaped { &["--runtime", "runsc"] } else { &[] };
        // The home folder is also where its change locks go (`approve::hold`), so that a
        // sandbox removed by the test, not by `stop`, leaves nothing in the temporary folder.
        cmd.args(args)
            .args(sidecar)
            .args(runtime)
            .env("HOME", self.home.path())
            .env("XDG_RUNTIME_DIR", self.home.path())
            .env("XDG_CACHE_HOME", self.home.path().join(".cache"))
            .stdin(if input.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for var in sandbox_init::apis::key_vars() {
            cmd.env_remove(var);
        }
        cmd.envs(&self.env);
        let mut child = cmd.spawn().context("cannot run agent-sandbox")?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            use tokio::io::AsyncWriteExt as _;
            stdin.write_all(input).await.context("cannot write agent-sandbox's standard input")?;
            // Dropped: the launcher reads the end of its input.
        }
        let out = child.wait_with_output().await.context("cannot run agent-sandbox")?;
        if command == "run"
            && out.status.success()
            && let Some(project) = given.get(2).and_then(|p| std::fs::canonicalize(p).ok())
        {
            given_net_admin(&project.to_string_lossy()).await?;
        }
        Ok(Outcome {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            raw: [out.stdout, out.stderr].concat(),
        })
    }

    /// `run shell PROJECT --detach --offline --image <the shell image> EXTRA…`, the sandbox most
    /// tests drive: its container id.
    pub async fn offline_shell(&self, project: &Project, extra: &[&str]) -> anyhow::Result<String> {
        let shell = crate::images::image("shell").await?;
        let mut args = vec!["run", "shell", &project.path, "--detach", "--offline", "--image", &shell];
        args.extend_from_slice(extra);
        self.ok(&args).await?;
        Ok(project.sandbox().await?.0)
    }

    /// `run shell PROJECT --detach --network NET --image <the shell image>`: a sandbox with its
    /// firewall on a test network; its (id, name).
    pub async fn shell_on(
        &self,
        project: &Project,
        net: &crate::docker::TestNet,
    ) -> anyhow::Result<(String, String)> {
        let shell = crate::images::image("shell").await?;
        self.ok(&["run", "shell", &project.path, "--detach", "--network", &net.name, "--image", &shell])
            .await?;
        project.sandbox().await
    }

    /// Runs it and requires success.
    pub async fn ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<Outcome> {
        let out = self.run(args).await?;
        let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        anyhow::ensure!(out.code == 0, "agent-sandbox {shown:?} exited {}: {}", out.code, out.stderr);
        Ok(out)
    }
}

/// A temporary project folder (its canonical path is what the launcher labels); dropping it
/// removes the containers and volumes the launcher made for it.
pub struct Project {
    pub dir: tempfile::TempDir,
    pub path: String,
}

impl Project {
    pub fn new() -> anyhow::Result<Project> {
        let dir = tempfile::tempdir()?;
        let path = std::fs::canonicalize(dir.path())?.to_string_lossy().into_owned();
        Ok(Project { dir, path })
    }

    /// The containers the launcher made for this project: (id, name).
    pub async fn containers(&self) -> anyhow::Result<Vec<(String, String)>> {
        containers_of(&self.path).await
    }

    /// The one sandbox the launcher made for this project: (id, name); in sidecar mode, the
    /// agent's container (its gateway and the namespace's holder are part of it).
    pub async fn sandbox(&self) -> anyhow::Result<(String, String)> {
        let containers: Vec<_> = self
            .containers()
            .await?
            .into_iter()
            .filter(|(_, name)| !name.ends_with(".gateway") && !name.ends_with(".net"))
            .collect();
        anyhow::ensure!(
            containers.len() == 1,
            "expected one sandbox for {}, found {containers:?}",
            self.path
        );
        Ok(containers[0].clone())
    }

    /// The volumes the launcher made for this project.
    pub async fn volumes(&self) -> anyhow::Result<Vec<String>> {
        volumes_of(&self.path).await
    }
}

fn project_filter(project: &str) -> String {
    format!("{}={project}", xtask::labels::LAUNCHER_PROJECT)
}

async fn containers_of(project: &str) -> anyhow::Result<Vec<(String, String)>> {
    let label = project_filter(project);
    let filters = HashMap::from([("label", vec![label.as_str()])]);
    let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    Ok(docker()
        .await?
        .list_containers(Some(options))
        .await?
        .into_iter()
        .map(|c| {
            let name = c.names.unwrap_or_default().first().cloned().unwrap_or_default();
            (c.id.unwrap_or_default(), name.trim_start_matches('/').to_string())
        })
        .collect())
}

async fn volumes_of(project: &str) -> anyhow::Result<Vec<String>> {
    let label = project_filter(project);
    let filters = HashMap::from([("label", vec![label.as_str()])]);
    let options = ListVolumesOptionsBuilder::default().filters(&filters).build();
    let list = docker().await?.list_volumes(Some(options)).await?;
    Ok(list.volumes.unwrap_or_default().into_iter().map(|v| v.name).collect())
}

impl Drop for Project {
    fn drop(&mut self) {
        let project = self.path.clone();
        drop_async(move || async move {
            for (id, _) in containers_of(&project).await.unwrap_or_default() {
                force_remove(id).await;
            }
            if let Ok(docker) = docker().await {
                for volume in volumes_of(&project).await.unwrap_or_default() {
                    let _ = docker
                        .remove_volume(&volume, None::<bollard::query_parameters::RemoveVolumeOptions>)
                        .await;
                }
            }
        });
    }
}

/// `agent-sandbox ui --no-open --port 0` running for a test: its URL (with the token), ended
/// when dropped.
pub struct UiServer {
    pub url: String,
    pub port: u16,
    pub token: String,
    child: tokio::process::Child,
}

impl Launcher {
    /// Starts the page's server with this launcher's home (and so its change locks).
    pub async fn ui(&self) -> anyhow::Result<UiServer> {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = tokio::process::Command::new(binary()?)
            .args(["ui", "--no-open", "--port", "0"])
            .env("HOME", self.home.path())
            .env("XDG_RUNTIME_DIR", self.home.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start agent-sandbox ui")?;
        let stdout = child.stdout.take().context("ui's stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
            .await
            .context("agent-sandbox ui printed no URL within 20 s")??
            .context("agent-sandbox ui ended before printing its URL")?;
        let url = line.split_whitespace().last().context("no URL")?.to_string();
        let (port, token) = url
            .strip_prefix("http://127.0.0.1:")
            .and_then(|rest| rest.split_once("/?token="))
            .with_context(|| format!("not the page's URL: {line}"))?;
        let (port, token) = (port.parse()?, token.to_string());
        Ok(UiServer { url, port, token, child })
    }
}

impl UiServer {
    /// Sends one raw HTTP/1.1 request to the server, every header as given: (status, body).
    pub async fn raw(&self, request: &str) -> anyhow::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status")?;
        Ok((status, text))
    }

    /// The page's API as its script calls it: the token in its header, the page's Origin.
    pub async fn api(&self, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<(u16, String)> {
        let port = self.port;
        let body = body.unwrap_or_default();
        self.raw(&format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n\
             X-Agent-Sandbox-Token: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.token,
            body.len()
        ))
        .await
    }
}

impl Drop for UiServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
