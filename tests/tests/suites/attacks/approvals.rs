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
    }
}
