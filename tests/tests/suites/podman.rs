//! The launcher against rootful Podman (Debian's 4.3, with runc) through its Docker-compatible
//! API, on an internal network of Podman's: in one container and in sidecar mode the sandbox
//! starts, its agent holds nothing, a name the policy does not list is refused at the gate and
//! queued for approval, `allow` opens it live, and `stop` removes every container. Rootless
//! Podman is checked by hand (docs/sidecar.md#podman): it needs a user with subordinate ids and
//! /dev/net/tun, which these machines do not give one.

use sandbox_tests::images::image;
use sandbox_tests::launcher::Launcher;
use sandbox_tests::podman::Podman;

/// The capability sets, uid and no_new_privs of a /proc status: the agent's must be nothing.
fn assert_holds_nothing(status: &str) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
    };
    assert_eq!(field("Uid:").as_deref(), Some("1000 1000 1000 1000"), "{status}");
    for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(set).as_deref(), Some("0000000000000000"), "{set} {status}");
    }
    assert_eq!(field("NoNewPrivs:").as_deref(), Some("1"), "{status}");
}

net_admin! {
    [single] {
        #[tokio::test]
        async fn the_launcher_runs_both_shapes_on_rootful_podman() -> anyhow::Result<()> {
            let shell = image("shell").await?;
            let podman = Podman::start(&[&shell]).await?;
            let network = format!("agent-sandbox-test-podman-{}", std::process::id());
            let made = podman.command(&["network", "create", "--internal", &network]).output()?;
            anyhow::ensure!(made.status.success(), "{made:?}");
            struct RemoveNetwork<'a>(&'a Podman, String);
            impl Drop for RemoveNetwork<'_> {
                fn drop(&mut self) {
                    let _ = self.0.command(&["network", "rm", "-f", &self.1]).output();
                }
            }
            let _network = RemoveNetwork(&podman, network.clone());
            let launcher = Launcher::new()?.env("DOCKER_HOST", &podman.host);
            let project = tempfile::tempdir()?;
            let project = project.path().to_str().unwrap().to_string();
            // A resolver on TEST-NET: only allowed names are asked upstream, and none is here.
            for shape in [&[][..], &["--sidecar", "--dns", "192.0.2.53"][..]] {
                let run =
                    [&["run", "shell", &project, "--detach", "--image", &shell, "--network", &network][..], shape]
                        .concat();
                launcher.ok(&run).await?;
                let rows: Vec<serde_json::Value> =
                    serde_json::from_str(&launcher.ok(&["ls", "--json"]).await?.stdout)?;
                let name = rows.iter().find(|r| r["project"] == project.as_str()).expect("ls lists it")["name"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let containers = podman.containers()?;
                let expected = if shape.is_empty() { 1 } else { 3 };
                assert_eq!(containers.iter().filter(|c| c.starts_with(&name)).count(), expected, "{containers:?}");

                let status = podman.exec(&name, &["sandbox-exec", "--", "cat", "/proc/self/status"])?;
                assert_holds_nothing(&status.stdout);
                let pid1 = podman.exec(&name, &["cat", "/proc/1/status"])?;
                if !shape.is_empty() {
                    // Sidecar mode: the agent's container's PID 1 holds nothing either.
                    assert_holds_nothing(&pid1.stdout);
                }

                // The agent asks for a name the policy does not list: the gate refuses it and queues it.
                podman.exec(&name, &["sandbox-exec", "--", "getent", "hosts", "blocked.example"])?;
                let pending = launcher.ok(&["pending", &name]).await?;
                assert!(pending.stdout.contains("blocked.example"), "{pending:?}");
                launcher.ok(&["allow", &name, "blocked.example"]).await?;
                let status = launcher.ok(&["status", &name]).await?;
                assert!(
                    status.stdout.contains("blocked.example"),
                    "allow did not reach the policy in force: {status:?}"
                );

                launcher.ok(&["stop", &name]).await?;
                let left: Vec<String> = podman.containers()?.into_iter().filter(|c| c.starts_with(&name)).collect();
                assert!(left.is_empty(), "stop left {left:?}");
            }
            Ok(())
        }
    }
}
