//! Starting the engine where none answers: through systemd, else dockerd itself, with an
//! environment of its own ([`dockerd_env`]).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::Installer;

/// How long a started engine may take to answer.
const ENGINE_WAIT: Duration = Duration::from_secs(60);

/// The Go runtime's settings dockerd is started with where this command starts it (unless the
/// user set them): its children inherit them. dockerd re-executes itself for each container's
/// network namespace (the prestart hook, `set-ipv6` for each interface, the embedded
/// resolver's rules), and each such run initialises the whole 75 MB binary; containerd, its
/// shims and runc are Go too. With collection put off until a process holds ten times its live
/// heap, and at most 512 MiB, those short runs never collect: measured on 2 cores, 20
/// containers started and removed on an IPv6 network took 1.01 CPU-s each with Go's defaults
/// and 0.75 with these (docs/test.md). The long-lived ones hold more: in a fresh-clone
/// `.ci/run`'s test step, dockerd 349 MiB, containerd 92 and each shim 12.
const DOCKERD_GO_RUNTIME: [(&str, &str); 2] = [("GOGC", "1000"), ("GOMEMLIMIT", "512MiB")];

/// What this command's environment holds that dockerd must not inherit: what cargo and rustup
/// set for the xtask (its `LD_LIBRARY_PATH` names the build's folders, which every process the
/// engine starts would search first for each library) and the loader's other variables.
const NOT_FOR_DOCKERD: [&str; 6] = ["CARGO", "RUSTUP_", "RUSTC", "RUSTDOC", "RUST_", "LD_"];

/// dockerd's environment where this command starts it: this one's (dockerd and what it runs
/// read PATH, the proxies, `DOCKER_RAMDISK`, `SSL_CERT_FILE`, `TMPDIR`, …) but for
/// [`NOT_FOR_DOCKERD`], and [`DOCKERD_GO_RUNTIME`] where the user set neither.
fn dockerd_env(
    ours: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut env: Vec<_> = ours
        .into_iter()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            !NOT_FOR_DOCKERD.iter().any(|prefix| name.starts_with(prefix))
        })
        .collect();
    let user_set = env.iter().any(|(name, _)| DOCKERD_GO_RUNTIME.iter().any(|(go, _)| name == go));
    if !user_set {
        env.extend(DOCKERD_GO_RUNTIME.iter().map(|(name, value)| (name.into(), value.into())));
    }
    env
}

/// Starts the engine: through systemd where it runs, else dockerd itself, detached, its log in
/// a file; then waits until it answers.
pub(super) async fn start_engine(installer: &Installer) -> anyhow::Result<String> {
    if sandbox_images::engine::connect().await.is_ok() {
        return Ok("the engine answers (started before this command, with its own settings)".into());
    }
    let sudo = *installer == Installer::Sudo;
    let how = if Path::new("/run/systemd/system").is_dir() {
        eprintln!("==> systemctl start docker");
        let mut command = std::process::Command::new(if sudo { "sudo" } else { "systemctl" });
        if sudo {
            command.arg("systemctl");
        }
        let status = command.args(["start", "docker"]).status()?;
        anyhow::ensure!(status.success(), "systemctl start docker failed");
        "started the engine (systemctl start docker)".to_string()
    } else {
        anyhow::ensure!(
            rustix::process::geteuid().is_root(),
            "no engine answers and there is no systemd to start one: start dockerd as root"
        );
        let log = std::env::temp_dir().join("agent-sandbox-dockerd.log");
        eprintln!("==> dockerd (its log: {})", log.display());
        let file = std::fs::File::create(&log)?;
        use std::os::unix::process::CommandExt as _;
        let mut dockerd = std::process::Command::new("dockerd");
        dockerd.env_clear().envs(dockerd_env(std::env::vars_os()));
        dockerd
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            // Its own process group: it outlives this command and a ^C to it.
            .process_group(0)
            .spawn()
            .context("cannot start dockerd")?;
        format!("started dockerd (its log: {})", log.display())
    };
    let started = Instant::now();
    while started.elapsed() < ENGINE_WAIT {
        if sandbox_images::engine::connect().await.is_ok() {
            return Ok(how);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("{how}, but it did not answer within {} s", ENGINE_WAIT.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerd_gets_this_environment_but_cargos_and_the_go_settings_unless_the_user_set_them() {
        let env = |ours: &[(&str, &str)]| -> Vec<(String, String)> {
            let ours = ours.iter().map(|(name, value)| (name.into(), value.into()));
            dockerd_env(ours.collect::<Vec<_>>())
                .into_iter()
                .map(|(name, value)| (name.into_string().unwrap(), value.into_string().unwrap()))
                .collect()
        };
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
        };
        let ours = [
            ("PATH", "/usr/bin:/bin"),
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("DOCKER_RAMDISK", "true"),
            ("SSL_CERT_FILE", "/etc/proxy-ca.pem"),
            ("LD_LIBRARY_PATH", "/src/target/debug/deps"),
            ("CARGO", "/home/dev/.cargo/bin/cargo"),
            ("CARGO_MANIFEST_DIR", "/src/xtask"),
            ("RUSTUP_TOOLCHAIN", "stable"),
        ];
        let kept = [
            ("PATH", "/usr/bin:/bin"),
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("DOCKER_RAMDISK", "true"),
            ("SSL_CERT_FILE", "/etc/proxy-ca.pem"),
        ];
        let go = [("GOGC", "1000"), ("GOMEMLIMIT", "512MiB")];
        assert_eq!(env(&ours), pairs(&[&kept[..], &go[..]].concat()));
        // A user's own setting of either is theirs.
        let theirs = [&ours[..], &[("GOGC", "50")][..]].concat();
        assert_eq!(env(&theirs), pairs(&[&kept[..], &[("GOGC", "50")][..]].concat()));
    }
}
