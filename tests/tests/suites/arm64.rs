//! The arm64 chain under emulation: the shell image (every CI run builds its chain:
//! `xtask::test::EMULATED_IMAGES`) and, in `release::`, claude, an npm agent (`--arm64` builds it
//! too: `xtask::test::ARM64_RELEASE_IMAGES`), built for linux/arm64 by the xtask (cross-built sandbox-init, an
//! arm64 OS layer from mmdebstrap, every build step under qemu-user through binfmt_misc), keep
//! the contract's checks that need no network: their labels, lock entry and the engine's record
//! of their platform; `sandbox ready` with every agent process non-root, holding no capability,
//! with NoNewPrivs, and no setuid, setgid or file-capability program; the CLI answering
//! `--version`; no large file stored twice. Each runs the arm64 image itself, every process an
//! AArch64 one under qemu-user (checked: `uname -m` in the container).
//!
//! The firewall is not among them: qemu-user does not translate netfilter's netlink, so `nft`
//! cannot run in an emulated container. `release::kernel::` proves it in a real arm64 kernel
//! instead: the arm64 shell image's filesystem booted on Debian's arm64 kernel under
//! qemu-system-aarch64 (tests/src/vm.rs), its sandbox-init ready, the allowed peer reached and the
//! blocked one refused by name and by address, with the evidence read on the peers (README:
//! Platforms).

use sandbox_tests::contract::{self, Subject};
use xtask::platform::Platform;

async fn subject(name: &str) -> anyhow::Result<Subject> {
    xtask::emulation::ensure(Platform::Arm64)?;
    Subject::of_repository_for(name, Platform::Arm64).await
}

macro_rules! arm64_contract_tests {
    ($module:ident, $name:literal) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn labels_lock_entry_and_platform() -> anyhow::Result<()> {
                contract::labels_and_lock_entry(&subject($name).await?).await
            }

            #[tokio::test]
            async fn runs_as_aarch64_and_starts_ready_with_an_unprivileged_agent() -> anyhow::Result<()> {
                let subject = subject($name).await?;
                contract::runs_as(&subject, "aarch64").await?;
                contract::starts_ready_with_an_unprivileged_agent(&subject).await
            }

            #[tokio::test]
            async fn agent_command_answers_version_offline() -> anyhow::Result<()> {
                contract::agent_command_answers_version_offline(&subject($name).await?).await
            }

            #[tokio::test]
            async fn no_large_file_is_stored_twice() -> anyhow::Result<()> {
                contract::no_large_file_is_stored_twice(&subject($name).await?).await
            }
        }
    };
}

arm64_contract_tests!(shell, "shell");

/// `agent-sandbox run --platform linux/arm64` finds the arm64 image by its tag, names it as
/// emulated, and runs it (offline: under qemu-user there is no firewall to program); an image of
/// another platform than asked is refused before anything is made.
#[tokio::test]
async fn the_launcher_runs_the_platform_asked_for_and_refuses_another() -> anyhow::Result<()> {
    use sandbox_tests::launcher::{Launcher, Project};
    let arm64 = subject("shell").await?.tag;
    let amd64 = sandbox_tests::images::image("shell").await?;
    let docker = sandbox_tests::docker::docker().await?;
    let arm64_id = docker.inspect_image(&arm64).await?.id;
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let run = launcher
        .ok(&["run", "shell", &project.path, "--detach", "--offline", "--platform", "linux/arm64"])
        .await?;
    assert!(run.stderr.contains(&format!("runs {arm64} on")), "{run:?}");
    assert!(run.stderr.contains("is linux/arm64, not the engine's linux/amd64"), "{run:?}");
    let (id, _) = project.sandbox().await?;
    assert_eq!(docker.inspect_container(&id, None).await?.image, arm64_id);
    let machine = sandbox_tests::docker::exec(&id, &["uname", "-m"], None).await?;
    assert_eq!(machine.stdout.trim(), "aarch64", "{machine:?}");
    // The control: the host's platform is the default, and its image is not named as emulated.
    let (launcher, project) = (Launcher::new()?, Project::new()?);
    let native = launcher.ok(&["run", "shell", &project.path, "--detach", "--offline"]).await?;
    assert!(
        native.stderr.contains(&format!("runs {amd64} on")) && !native.stderr.contains("emulation"),
        "{native:?}"
    );
    let other = Project::new()?;
    let refused = launcher
        .run(&[
            "run",
            "shell",
            &other.path,
            "--detach",
            "--offline",
            "--platform",
            "linux/arm64",
            "--image",
            &amd64,
        ])
        .await?;
    assert_eq!(refused.code, 66, "{refused:?}");
    assert!(
        refused.stderr.contains(&format!("{amd64} is a linux/amd64 image, not linux/arm64")),
        "{refused:?}"
    );
    assert!(other.containers().await?.is_empty(), "a refused run made a container");
    let unknown = launcher.run(&["run", "shell", &other.path, "--platform", "linux/riscv64"]).await?;
    assert!(unknown.code != 0 && unknown.stderr.contains("linux/amd64, linux/arm64"), "{unknown:?}");
    Ok(())
}

/// What the publish workflow's `cargo xtask test --arm64` runs, and `cargo xtask ci` leaves out
/// for its cost: claude's chain, an npm agent's (node's pinned tarballs, the CLI's install; about
/// five minutes of emulated build steps on a cold machine), and the firewall in a real arm64
/// kernel (both cores for a minute or two, as root).
mod release {
    use super::*;

    arm64_contract_tests!(claude, "claude");

    mod kernel {
        use sandbox_tests::vm::{self, ALLOWED, BLOCKED, VmWorld};

        /// The firewall in a real arm64 kernel: sandbox-init of the arm64 shell image as PID 1 of
        /// a network and PID namespace in Debian's arm64 kernel (qemu-system-aarch64), the peers
        /// on the test's private network. Control: before the firewall, the blocked peer answers
        /// from the sandbox's namespace.
        #[tokio::test]
        async fn the_firewall_holds_in_a_real_arm64_kernel() -> anyhow::Result<()> {
            let image = super::super::subject("shell").await?.tag;
            let world = VmWorld::start().await?;
            let run = vm::run(&image, &world).await?;
            let console = &run.console;
            eprintln!("the VM took {:.1} s:\n{console}", run.took.as_secs_f64());
            assert!(run.line("kernel").is_some_and(|k| k.starts_with("aarch64 ")), "{console}");
            assert!(console.contains("sandbox ready:"), "{console}");
            assert_eq!(run.line("control"), Some("exit=0 HTTP/1.1 200"), "{console}");
            assert_eq!(
                run.line("agent"),
                Some("uid=1000 CapEff=0000000000000000 CapPrm=0000000000000000 NoNewPrivs=1"),
                "{console}"
            );
            assert_eq!(run.line("allowed-name"), Some("exit=0 HTTP/1.1 200"), "{console}");
            let flush = run.line("nft-flush").unwrap_or_default();
            assert!(flush.starts_with("exit=1 ") && flush.contains("Operation not permitted"), "{console}");
            for check in ["blocked-name", "blocked-address"] {
                let line = run.line(check).unwrap_or_default();
                assert!(line.starts_with("exit=") && !line.starts_with("exit=0"), "{check}: {console}");
            }
            let denial =
                format!("{{\"address\":\"{}\",\"denied\":\"connection\",\"port\":80", world.blocked.ipv4);
            assert!(
                console.contains(&denial),
                "sandbox-init logged no denial of the blocked address: {console}"
            );
            // The evidence where it lands: the allowed peer served the agent's request; the
            // blocked one served only the control.
            let requests = |log: Vec<String>| -> Vec<String> {
                log.into_iter().filter(|l| l.starts_with("http ")).collect()
            };
            assert_eq!(
                requests(world.allowed.log().await?),
                [format!("http 80 host={ALLOWED} path=/")],
                "{console}"
            );
            assert_eq!(
                requests(world.blocked.log().await?),
                ["http 80 host=control.vm.test path=/"],
                "{console}"
            );
            let asked: Vec<String> =
                world.dns.dns_queries().await?.into_iter().map(|q| q.to_ascii_lowercase()).collect();
            assert!(asked.iter().any(|q| q.starts_with(ALLOWED)), "{asked:?}");
            assert!(!asked.iter().any(|q| q.starts_with(BLOCKED)), "the gate forwarded {BLOCKED}: {asked:?}");
            Ok(())
        }
    }
}
