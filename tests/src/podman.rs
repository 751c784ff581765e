//! Podman, rootful, behind its Docker-compatible API, for the podman:: suite: a `podman system
//! service` of the test's own on a socket in a temporary folder, with its own containers.conf
//! (`CONTAINERS_CONF`), and images copied in from the engine the suites build with. Nothing of
//! the machine's Podman configuration is read or changed; what the test loaded is removed when it
//! is dropped.

use std::process::{Child, Command, Stdio};

use anyhow::Context as _;

/// Podman 4.3's compatible API reads `default_ulimits` with the soft and hard limits of nofile
/// swapped, and otherwise gives containers more than a host that cannot raise its limits allows
/// ("error setting rlimits"): equal soft and hard limits, within the test's own, and runc (crun
/// 1.8 refuses a cgroup v1 host in hybrid mode).
fn containers_conf() -> String {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the one struct it is given.
    let hard = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
        && limit.rlim_max != libc::RLIM_INFINITY
    {
        limit.rlim_max.min(1 << 20)
    } else {
        1 << 20
    };
    format!(
        "[containers]\ndefault_ulimits = [\"nofile={hard}:{hard}\", \"nproc=4096:4096\"]\n[engine]\nruntime = \"runc\"\n"
    )
}

pub struct Podman {
    /// `unix://…`, for DOCKER_HOST.
    pub host: String,
    service: Child,
    conf: std::path::PathBuf,
    loaded: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Podman {
    /// Starts the service and copies `images` (references in the suites' engine) into Podman.
    pub async fn start(images: &[&str]) -> anyhow::Result<Podman> {
        // Rootful Podman gives its sandboxes NET_ADMIN (place.rs).
        crate::place::ensure(crate::place::Need::NetAdmin)?;
        let version = Command::new("podman")
            .arg("--version")
            .output()
            .context("podman is not installed: `cargo xtask setup --tests` installs Debian's")?;
        anyhow::ensure!(version.status.success(), "podman --version: {version:?}");
        let dir = tempfile::tempdir()?;
        let conf = dir.path().join("containers.conf");
        std::fs::write(&conf, containers_conf())?;
        let socket = dir.path().join("podman.sock");
        let host = format!("unix://{}", socket.display());
        let service = Command::new("podman")
            .args(["system", "service", "--time=0", &host])
            .env("CONTAINERS_CONF", &conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start `podman system service`")?;
        let mut podman = Podman { host, service, conf, loaded: Vec::new(), _dir: dir };
        for _ in 0..100 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        anyhow::ensure!(socket.exists(), "podman's service made no socket");
        for image in images {
            let save = Command::new("docker").args(["save", image]).stdout(Stdio::piped()).spawn()?;
            let load =
                podman.command(&["load"]).stdin(save.stdout.context("docker save's output")?).output()?;
            anyhow::ensure!(
                load.status.success(),
                "podman load {image}: {}",
                String::from_utf8_lossy(&load.stderr)
            );
            podman.loaded.push(image.to_string());
        }
        Ok(podman)
    }

    /// `podman ARGS…` with this service's configuration.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.args(args).env("CONTAINERS_CONF", &self.conf);
        cmd
    }

    /// `podman exec CONTAINER CMD…`, its output and status.
    pub fn exec(&self, container: &str, cmd: &[&str]) -> anyhow::Result<crate::docker::ExecOutput> {
        let out = self.command(&[&["exec", container][..], cmd].concat()).output()?;
        Ok(crate::docker::ExecOutput {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: i64::from(out.status.code().unwrap_or(-1)),
        })
    }

    /// The names of the containers Podman has, running or not.
    pub fn containers(&self) -> anyhow::Result<Vec<String>> {
        let out = self.command(&["ps", "-a", "--format", "{{.Names}}"]).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // The launcher's containers, should the test have left any, then the images it loaded.
        let label = format!("label={}", xtask::labels::LAUNCHER_PROJECT);
        if let Ok(out) = self.command(&["ps", "-a", "-q", "--filter", &label]).output() {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.command(&["rm", "-f", id]).output();
            }
        }
        for image in &self.loaded {
            let _ = self.command(&["rmi", "-f", image]).output();
        }
        let _ = self.service.kill();
        let _ = self.service.wait();
    }
}
