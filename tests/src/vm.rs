//! A real arm64 kernel for the firewall, which qemu-user cannot give (it does not translate
//! netfilter's netlink): Debian's arm64 kernel booted under qemu-system-aarch64 (full-system
//! emulation) with an arm64 image's root filesystem as its initramfs.
//!
//! - The kernel, its modules, kmod and iproute2 come from the Debian archive the OS layer is
//!   bootstrapped from, unpacked without running anything (`mmdebstrap --variant=extract`), once
//!   per machine under target/agent-sandbox/arm64-vm.
//! - The root filesystem is the image's own (`docker export`), plus the modules the network needs
//!   (netfilter, veth, virtio-net; indexed by the host's `depmod -b`), the archive's kmod and ip
//!   and the libraries they need (none of the image's replaced), the VM's init and the agent's
//!   checks (tests/arm64-vm/), a policy drop-in allowing `allowed.vm.test`, and the peers'
//!   addresses. Nothing of the archive runs on the host.
//! - The VM's NIC is user-mode networking (slirp) inside the network namespace of the world's DNS
//!   peer, a container on the test's private network: the VM reaches the peers there and nothing
//!   else. qemu runs as nobody.
//! - Inside, the VM is the host: init puts the sandbox in a network namespace of its own behind a
//!   veth, as an engine would a container, and runs the image's sandbox-init as PID 1 of a PID
//!   namespace; its agent runs the checks and prints `vm: …` lines on the serial console.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use tokio::io::AsyncBufReadExt as _;
use xshell::{Shell, cmd};

use crate::docker::{TestNet, docker};
use crate::peers::Peer;

/// The name the VM's policy allows, and the one it does not; the DNS peer answers both.
pub const ALLOWED: &str = "allowed.vm.test";
pub const BLOCKED: &str = "blocked.vm.test";
/// How long the VM may take to print `vm: done`: booting under TCG and starting the sandbox take
/// a minute or two on two cores.
const DEADLINE: Duration = Duration::from_secs(900);
/// The modules the VM needs, of the kernel's few thousand: depmod over all of them takes a
/// minute under qemu-user, over these a few seconds.
const MODULE_DIRS: &[&str] = &[
    "kernel/lib",
    "kernel/crypto",
    "kernel/net/netfilter",
    "kernel/net/ipv4",
    "kernel/net/ipv6",
    "kernel/net/core",
];
const NIC_MODULES: &[&str] = &["virtio_net", "net_failover", "veth"];

/// The test world: a private network with a DNS peer (whose namespace the VM's NIC lives in)
/// and a peer under each name.
pub struct VmWorld {
    pub dns: Peer,
    pub allowed: Peer,
    pub blocked: Peer,
    _net: TestNet,
}

impl VmWorld {
    pub async fn start() -> anyhow::Result<VmWorld> {
        crate::place::ensure(crate::place::Need::Arm64Vm)?;
        let net = TestNet::create("arm64-vm").await?;
        let dns = Peer::start_dns(&net).await?;
        let allowed = Peer::start(&net, &["allowed-peer"]).await?;
        let blocked = Peer::start(&net, &["blocked-peer"]).await?;
        dns.set_dns(ALLOWED, allowed.ipv4, 60).await?;
        dns.set_dns(BLOCKED, blocked.ipv4, 60).await?;
        Ok(VmWorld { dns, allowed, blocked, _net: net })
    }
}

/// What the VM printed on its serial console, and how long it took.
pub struct VmRun {
    pub console: String,
    pub took: Duration,
}

impl VmRun {
    /// The rest of the first `vm: KEY` line.
    pub fn line(&self, key: &str) -> Option<&str> {
        let prefix = format!("vm: {key}");
        self.console.lines().find_map(|l| l.trim_end().strip_prefix(prefix.as_str())).map(str::trim)
    }
}

/// Boots `image` (an arm64 image's tag) in the VM on `world` and returns its console once the
/// agent's checks are done.
pub async fn run(image: &str, world: &VmWorld) -> anyhow::Result<VmRun> {
    for program in ["qemu-system-aarch64", "cpio", "nsenter", "setpriv", "depmod"] {
        anyhow::ensure!(
            xtask::project::on_path(program),
            "{program} is not installed: `cargo xtask setup --tests` installs what the arm64 VM needs"
        );
    }
    let kernel = kernel_tree().await?;
    let work = tempfile::tempdir()?;
    let vars = format!(
        "VM_RESOLVER={}\nVM_ALLOWED={}\nVM_BLOCKED={}\n",
        world.dns.ipv4, world.allowed.ipv4, world.blocked.ipv4
    );
    let initrd = root_filesystem(image, &kernel, work.path(), &vars).await?;
    // qemu runs as nobody: it reads the kernel and the initramfs from the work folder.
    let vmlinuz = work.path().join("vmlinuz");
    std::fs::copy(self::vmlinuz(&kernel)?, &vmlinuz)?;
    std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let pid = docker()
        .await?
        .inspect_container(&world.dns.id, None)
        .await?
        .state
        .and_then(|s| s.pid)
        .context("the DNS peer has no process")?;
    let started = Instant::now();
    let mut qemu = tokio::process::Command::new("nsenter")
        .args(["--target", &pid.to_string(), "--net"])
        .args(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "qemu-system-aarch64"])
        .args(["-M", "virt", "-cpu", "max", "-smp", "2", "-m", "1536", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyAMA0 rdinit=/init panic=-1 quiet"])
        .args(["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile="])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start qemu-system-aarch64")?;
    let mut lines = tokio::io::BufReader::new(qemu.stdout.take().context("no stdout")?).lines();
    let mut errors = qemu.stderr.take().context("no stderr")?;
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut errors, &mut text).await.ok();
        text
    });
    let mut console = String::new();
    let outcome = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = lines.next_line().await? {
            console.push_str(&line);
            console.push('\n');
            if line.contains("vm: done") || line.contains("Kernel panic") {
                return Ok(());
            }
        }
        anyhow::bail!("qemu ended before the checks were done")
    })
    .await;
    let took = started.elapsed();
    qemu.kill().await.ok();
    let stderr = stderr.await.unwrap_or_default();
    match outcome {
        Ok(Ok(())) => Ok(VmRun { console, took }),
        Ok(Err(e)) => Err(e.context(format!("console:\n{console}\nqemu: {stderr}"))),
        Err(_) => anyhow::bail!("no `vm: done` within {DEADLINE:?}; console:\n{console}\nqemu: {stderr}"),
    }
}

/// The kernel package's tree (with kmod and iproute2), unpacked once per machine.
async fn kernel_tree() -> anyhow::Result<PathBuf> {
    let root = crate::root();
    let mirror = xtask::build::BuildOptions::from_env(&root)?.bootstrap.mirror;
    let base = root.join("target/agent-sandbox/arm64-vm");
    let tree = base.join("kernel");
    if tree.join("boot").is_dir() {
        return Ok(tree);
    }
    tokio::task::spawn_blocking(move || -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(&base)?;
        let sh = Shell::new()?;
        let (tar, partial) = (base.join("kernel.tar"), base.join("kernel.partial"));
        let suite = xtask::os::SUITE;
        cmd!(
            sh,
            "mmdebstrap --quiet --variant=extract --architectures=arm64 --include=linux-image-arm64,kmod,iproute2 {suite} {tar} {mirror}"
        )
        .run()
        .context("mmdebstrap could not fetch Debian's arm64 kernel")?;
        sh.remove_path(&partial)?;
        sh.create_dir(&partial)?;
        cmd!(sh, "tar -xf {tar} -C {partial} ./boot ./usr/lib/modules ./usr/bin/kmod ./usr/bin/ip ./usr/lib/aarch64-linux-gnu")
            .run()?;
        sh.remove_path(&tar)?;
        std::fs::rename(&partial, &tree)?;
        Ok(tree)
    })
    .await?
}

fn vmlinuz(kernel: &Path) -> anyhow::Result<PathBuf> {
    std::fs::read_dir(kernel.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
        .context("the kernel package has no /boot/vmlinuz-*")
}

/// The initramfs: the image's filesystem with what the VM needs added (see the module's
/// documentation): its libraries and programs are kept, the VM's own files written.
async fn root_filesystem(image: &str, kernel: &Path, work: &Path, vars: &str) -> anyhow::Result<PathBuf> {
    let docker = docker().await?;
    let created = docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            bollard::models::ContainerCreateBody { image: Some(image.to_string()), ..Default::default() },
        )
        .await?;
    let _remove = crate::docker::RemoveOnDrop(created.id.clone());
    let export = work.join("image.tar");
    let mut file = tokio::fs::File::create(&export).await?;
    let mut stream = docker.export_container(&created.id);
    while let Some(chunk) = stream.next().await {
        tokio::io::AsyncWriteExt::write_all(&mut file, &chunk?).await?;
    }
    tokio::io::AsyncWriteExt::flush(&mut file).await?;
    let (kernel, work, vars) = (kernel.to_path_buf(), work.to_path_buf(), vars.to_string());
    tokio::task::spawn_blocking(move || -> anyhow::Result<PathBuf> {
        let sh = Shell::new()?;
        let root = work.join("root");
        sh.create_dir(&root)?;
        cmd!(sh, "tar -xf {export} -C {root}").run()?;
        sh.remove_path(&export)?;
        let libs = "usr/lib/aarch64-linux-gnu";
        let (from_libs, to_libs) = (kernel.join(libs).join("."), root.join(libs));
        cmd!(sh, "cp -an {from_libs} {to_libs}").run()?;
        let (kmod, ip, bin) = (kernel.join("usr/bin/kmod"), kernel.join("usr/bin/ip"), root.join("usr/bin"));
        cmd!(sh, "cp -an {kmod} {ip} {bin}").run()?;
        for tool in ["modprobe", "depmod"] {
            std::os::unix::fs::symlink("../bin/kmod", root.join("usr/sbin").join(tool))?;
        }
        let release = std::fs::read_dir(kernel.join("usr/lib/modules"))?
            .flatten()
            .next()
            .context("the kernel package has no modules")?
            .file_name()
            .to_string_lossy()
            .into_owned();
        let (from, to) =
            (kernel.join("usr/lib/modules").join(&release), root.join("usr/lib/modules").join(&release));
        for dir in MODULE_DIRS {
            let parent = to.join(dir).parent().context("a module folder")?.to_path_buf();
            sh.create_dir(&parent)?;
            let source = from.join(dir);
            cmd!(sh, "cp -a {source} {parent}").run()?;
        }
        for index in ["modules.order", "modules.builtin", "modules.builtin.modinfo"] {
            std::fs::copy(from.join(index), to.join(index))?;
        }
        let nics = to.join("kernel/drivers/net");
        sh.create_dir(&nics)?;
        for module in NIC_MODULES {
            let source = from.join(format!("kernel/drivers/net/{module}.ko.xz"));
            cmd!(sh, "cp -a {source} {nics}").run()?;
        }
        cmd!(sh, "depmod -b {root} {release}").run()?;
        let dir = env!("CARGO_MANIFEST_DIR");
        for (name, to) in [("init", "init"), ("checks", "vm-checks")] {
            let target = root.join(to);
            std::fs::copy(Path::new(dir).join("arm64-vm").join(name), &target)?;
        }
        std::fs::write(root.join("etc/vm-peers"), vars)?;
        std::fs::write(root.join("etc/agent-sandbox/policy.d/vm.txt"), format!("{ALLOWED}\n"))?;
        let initrd = work.join("rootfs.cpio");
        let file = std::fs::File::create(&initrd)?;
        let listing = std::process::Command::new("find").arg(".").current_dir(&root).output()?.stdout;
        let mut cpio = std::process::Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(&root)
            .stdin(Stdio::piped())
            .stdout(file)
            .spawn()?;
        std::io::Write::write_all(cpio.stdin.as_mut().context("cpio's stdin")?, &listing)?;
        drop(cpio.stdin.take());
        anyhow::ensure!(cpio.wait()?.success(), "cpio could not pack the root filesystem");
        sh.remove_path(&root)?;
        Ok(initrd)
    })
    .await?
}
