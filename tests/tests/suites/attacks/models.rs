//! A model server of the user's (`run --model-server`) is a hole the user makes in the sandbox
//! on purpose: the agent reaches its address and port, and the attack is to reach more of the
//! user's network through it. NET_ADMIN, private networks.

use sandbox_tests::assert::assert_blocked;
use sandbox_tests::docker::TestNet;
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::peers::{PEER_HTTP, Peer, PeerSpec};
use sandbox_tests::sandbox::Sandbox;

net_admin! {
    [single, sidecar] {
        /// The server's address opens on its port alone: the agent, trying every other way into
        /// the network the server is on, reaches neither the server's other ports (its web page,
        /// an SSH) nor any other host of the network on the server's port or its own, by address
        /// or by the server's network name; and the variables the image declares reach the
        /// agent's processes past the key scrub (a dummy key among them). Positive control: the
        /// server's port answers the agent's request.
        #[tokio::test]
        async fn a_model_server_opens_its_address_and_port_and_nothing_else_of_the_network() -> anyhow::Result<()> {
            let shell = sandbox_tests::images::image("shell").await?;
            // The user's network: the engine's private ranges.
            let net = TestNet::create_private("model-server").await?;
            let dns = Peer::start_dns(&net).await?;
            let server = PeerSpec::named(&["model-server"])
                .option("--mock-api")
                .option("--http")
                .option("11434")
                .start(&net)
                .await?;
            // Another host of the network, listening on the server's port too: a connection let
            // through would be answered, and logged.
            let lan = PeerSpec::named(&["lan-host"]).option("--http").option("11434").start(&net).await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            // What no sandbox opens, even for the user: a server at a cloud's metadata service,
            // a link-local address, a URL with more than a server in it, or one for an agent
            // whose CLI cannot use one. Refused before anything is made.
            let gemini = sandbox_tests::images::image("gemini").await?;
            for (image, url, said) in [
                (&shell, "http://169.254.169.254".to_string(), "a cloud metadata service's address"),
                (&shell, "http://169.254.10.1:11434".into(), "a loopback or link-local address"),
                (&shell, format!("http://{}:11434/$(id)", server.ipv4), "has no place in a model server's URL"),
                // This host's loopback, spelt as a number some clients read as a name.
                (&shell, "http://2130706433:11434".into(), "an address in another form"),
                (&shell, "http://[fd00:ec2::23]".into(), "a cloud metadata service's address"),
                (&shell, format!("http://{}:53", server.ipv4), "port 53 is DNS's"),
                // A public address, opened with no name checked, is every site fronted there.
                (&shell, "http://198.51.100.7:11434".into(), "is a public address"),
                (&gemini, format!("http://{}:11434", server.ipv4), "cannot use a model server of yours"),
            ] {
                let out = launcher
                    .run(&[
                        "run", "shell", &project.path, "--detach", "--network", &net.name, "--image", image,
                        "--model-server", &url, "--model", "coder:7b",
                    ])
                    .await?;
                assert_eq!(out.code, 64, "{url}: {out:?}");
                assert!(out.stderr.contains(said), "{url}: {out:?}");
                assert!(project.containers().await?.is_empty(), "{url}: a refused run left a container");
            }
            let url = format!("http://{}:11434", server.ipv4);
            launcher
                .ok(&[
                    "run", "shell", &project.path, "--detach", "--network", &net.name, "--dns",
                    &dns.ipv4.to_string(), "--image", &shell, "--model-server", &url, "--model", "coder:7b",
                ])
                .await?;
            let (id, name) = project.sandbox().await?;
            let sb = Sandbox::adopt(&id).await?;

            // Positive control: the server's own port, for the CLI's request.
            let asked = sb.probe(&["fetch", &server.ipv4.to_string(), "11434", "/v1/models"]).await?;
            assert!(
                server.log().await?.iter().any(|l| l.starts_with("http 11434 ") && l.contains("path=/v1/models")),
                "the agent's request did not reach the server's port: {:?}",
                asked.fields
            );
            let env = launcher
                .ok(&["exec", &name, "--", "sh", "-c", "echo $OPENAI_BASE_URL $OPENAI_API_KEY $OPENAI_MODEL"])
                .await?;
            assert_eq!(env.stdout.trim(), format!("{url}/v1 local coder:7b"), "{env:?}");

            // The attack: the rest of the server, and the rest of the network.
            for target in [
                format!("{}:{PEER_HTTP}", server.ipv4),
                format!("{}:443", server.ipv4),
                format!("{}:11434", lan.ipv4),
                format!("{}:{PEER_HTTP}", lan.ipv4),
                "model-server:11434".to_string(),
                "lan-host:80".to_string(),
            ] {
                assert_blocked(&sb, &target).await?;
            }
            assert!(
                !lan.log().await?.iter().any(|l| l.starts_with("http ")),
                "a request reached the other host: {:?}",
                lan.log().await?
            );
            Ok(())
        }
    }
}
