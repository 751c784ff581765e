//! Attacks through the user's approval: the agent asks for a name whose approval would give it
//! more than a place to go. gist.github.com is under github.com, which the policy reaches only
//! through the forwarder: approved in one click, the agent's own TLS there would carry a token
//! of its own past the forwarder's rules (a gist of the project). Such a name is approved only
//! with `--yes N` or through the page's dialog, each saying why. NET_ADMIN (the launcher's
//! sandbox on a test network).

use sandbox_tests::assert::{assert_blocked, assert_reaches};
use sandbox_tests::docker::TestNet;
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::peers::Peer;
use sandbox_tests::sandbox::Sandbox;

net_admin! {
    [single] {
        /// The agent asks for gist.github.com: `pending` lists it with why; `allow --pending` refuses it
        /// without `--yes 1` (64), and the page's approval refuses it without its dialog (400), the
        /// name still refused after each. The control: `allow --pending --yes 1` approves it, and the
        /// agent reaches it.
        #[tokio::test]
        async fn a_forwarded_services_other_host_is_approved_only_with_a_second_look() -> anyhow::Result<()> {
            let net = TestNet::create("attack-approval").await?;
            let _gist = Peer::start(&net, &["gist.github.com"]).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let (id, name) = launcher.shell_on(&project, &net).await?;
            let sb = Sandbox::adopt(&id).await?;
            assert_blocked(&sb, "gist.github.com:443").await?;

            let pending = launcher.ok(&["pending", &name]).await?;
            assert!(pending.stdout.contains("gist.github.com *"), "{}", pending.stdout);
            let why = "gist.github.com is GitHub, but not through its forwarder (github.com is): a token of the agent's own works there";
            assert!(pending.stdout.contains(why), "{}", pending.stdout);
            let json = launcher.ok(&["pending", &name, "--json"]).await?;
            assert!(json.stdout.contains(&format!("\"caution\": \"{why}\"")), "{}", json.stdout);

            let plain = launcher.run(&["allow", &name, "--pending"]).await?;
            assert_eq!(plain.code, 64, "{plain:?}");
            assert!(plain.stderr.contains("--yes 1") && plain.stderr.contains(why), "{}", plain.stderr);
            assert_blocked(&sb, "gist.github.com:443").await?;

            let ui = launcher.ui().await?;
            let path = format!("/api/sandboxes/{name}/approve");
            let (status, answer) = ui.api("POST", &path, Some(r#"{"names":["gist.github.com"]}"#)).await?;
            assert_eq!(status, 400, "{answer}");
            assert!(answer.contains("dialog"), "{answer}");
            assert_blocked(&sb, "gist.github.com:443").await?;

            launcher.ok(&["pending", &name]).await?;
            launcher.ok(&["allow", &name, "--pending", "--yes", "1"]).await?;
            assert_reaches(&sb, "gist.github.com:443").await?;
            Ok(())
        }

        /// The agent asks for `upload.pypi.org`, the pypi bundle's write host, left out of it on
        /// purpose (the red team's): pending marks it with why, and `allow --pending` refuses it
        /// without `--yes 1`; typed by the user as the agent asks in its chat, `allow S NAME`
        /// refuses it too, as it does `gist.github.com`, and the page's allow box sends it to
        /// the command line. The control: `--yes 1` allows it.
        #[tokio::test]
        async fn a_write_host_left_out_of_a_bundle_is_approved_only_with_a_second_look() -> anyhow::Result<()> {
            let net = TestNet::create("attack-write-host").await?;
            let _pypi = Peer::start(&net, &["upload.pypi.org", "gist.github.com"]).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let dir = tempfile::tempdir()?;
            let policy = dir.path().join("pypi.yaml");
            std::fs::write(&policy, "version: 1\nservices: [pypi]\n")?;
            let shell = sandbox_tests::images::image("shell").await?;
            let policy = policy.display().to_string();
            launcher
                .ok(&["run", "shell", &project.path, "--detach", "--network", &net.name, "--image", &shell, "--policy", &policy])
                .await?;
            let (id, name) = project.sandbox().await?;
            let sb = Sandbox::adopt(&id).await?;
            assert_blocked(&sb, "upload.pypi.org:443").await?;
            let why = "upload.pypi.org is where the pypi bundle takes writes";
            let pending = launcher.ok(&["pending", &name]).await?;
            assert!(pending.stdout.contains("upload.pypi.org *") && pending.stdout.contains(why), "{}", pending.stdout);
            let plain = launcher.run(&["allow", &name, "--pending"]).await?;
            assert_eq!(plain.code, 64, "{plain:?}");
            for typed in ["upload.pypi.org", "gist.github.com"] {
                let out = launcher.run(&["allow", &name, typed]).await?;
                assert_eq!(out.code, 64, "{typed}: {out:?}");
                assert!(out.stderr.contains("--yes 1"), "{typed}: {out:?}");
            }
            let ui = launcher.ui().await?;
            let (status, answer) =
                ui.api("POST", &format!("/api/sandboxes/{name}/allow"), Some(r#"{"domains":["upload.pypi.org"]}"#)).await?;
            assert_eq!(status, 400, "{answer}");
            assert_blocked(&sb, "upload.pypi.org:443").await?;
            launcher.ok(&["allow", &name, "upload.pypi.org", "--yes", "1"]).await?;
            assert_reaches(&sb, "upload.pypi.org:443").await?;
            Ok(())
        }
    }
}
