//! Attacks on the upload budgets: the agent carries the project up to a name the policy allows
//! directly, in one long upload and in many short ones. NET_ADMIN, private networks; the
//! evidence is the bytes the peer received, and the connection log.

use sandbox_tests::docker::TestNet;
use sandbox_tests::peers::Peer;
use sandbox_tests::spec::SandboxSpec;

/// The bytes the peer's port 80 received over the connections logged after the first `skip`
/// lines of its log.
async fn received(peer: &Peer, skip: usize) -> anyhow::Result<(u64, usize)> {
    let log = peer.log().await?;
    let bytes = log[skip.min(log.len())..]
        .iter()
        .filter(|l| l.starts_with("conn 80 "))
        .filter_map(|l| l.split("bytes=").nth(1)?.parse::<u64>().ok())
        .sum();
    Ok((bytes, log.len()))
}

net_admin! {
    [single] {
        /// A name whose entry sets `upload: 1MB`: one upload of 400 MB is cut once the name has
        /// received its budget (the peer gets no byte past it), and the next connection to the name is
        /// refused; ten uploads of 300 KB
        /// in turn get the peer no more than the budget and two connections' worth, and so do eight
        /// names under one wildcard entry, which share its budget. The control: a name with the default
        /// budget takes 40 MB in one connection.
        #[tokio::test]
        async fn an_upload_past_its_budget_is_cut_in_one_connection_and_in_many() -> anyhow::Result<()> {
            let net = TestNet::create("attack-budgets").await?;
            let wild: Vec<String> = (1..=8).map(|i| format!("n{i}.wild.budget.test")).collect();
            let mut aliases = vec!["one.budget.test", "many.budget.test", "free.budget.test"];
            aliases.extend(wild.iter().map(String::as_str));
            let peer = Peer::start(&net, &aliases).await?;
            let policy = "version: 1\ndomains:\n  - {domain: one.budget.test, upload: 1MB}\n  \
                          - {domain: many.budget.test, upload: 1MB}\n  - free.budget.test\n  \
                          - {domain: \"*.wild.budget.test\", upload: 1MB}\n";
            let sb =
                SandboxSpec::smallest().await?.net_admin().on(&net).drop_in("budgets.yaml", policy).start().await?;
            let upload = async |host: &str, bytes: u64| {
                let probe = sb.probe(&["upload", host, "80", &bytes.to_string(), "--timeout-ms", "20000"]).await?;
                let sent: u64 = probe.fields.get("sent").and_then(|s| s.parse().ok()).unwrap_or(0);
                Ok::<_, anyhow::Error>((probe.outcome().to_string(), sent))
            };

            let (_, mark) = received(&peer, 0).await?;
            let (outcome, sent) = upload("free.budget.test", 40_000_000).await?;
            assert_eq!((outcome.as_str(), sent), ("sent", 40_000_000), "the control");

            let (_, mark) = received(&peer, mark).await?;
            let (outcome, sent) = upload("one.budget.test", 400_000_000).await?;
            assert!(sent < 400_000_000, "the long upload was never cut: {outcome}, {sent} bytes");
            // Held to the budget itself, not to what the link carries between two progress reports:
            // the relay sends no byte past what PID 1 granted (the request's head comes on top).
            let (bytes, mark_after) = received(&peer, mark).await?;
            assert!(bytes <= 1_000_000 + 1_000, "one.budget.test received {bytes} bytes in one upload");
            let again = sb.probe(&["tcp", "one.budget.test", "80", "--http"]).await?;
            assert_eq!(again.outcome(), "denied", "a new connection past the budget: {:?}", again.fields);

            // Ten short ones in turn (3 MB in all): what the peer received stops near the budget. (The
            // probe's own count says little: a refused connection's writes fill its socket's buffer
            // before the reset arrives.)
            for _ in 0..10 {
                upload("many.budget.test", 300_000).await?;
            }
            let (bytes, mark) = received(&peer, mark_after).await?;
            assert!(bytes <= 1_000_000 + 2 * 300_100, "many.budget.test received {bytes} bytes of 3,000,000");

            // Eight names under one wildcard (3.2 MB): they share the wildcard's budget, or each name a
            // wildcard allows would bring a budget of its own.
            for name in &wild {
                upload(name, 400_000).await?;
            }
            let (bytes, _) = received(&peer, mark).await?;
            assert!(bytes <= 1_000_000 + 2 * 400_100, "*.wild.budget.test received {bytes} bytes of 3,200,000");

            let connections = sb.exec(&["cat", "/run/agent-sandbox/connections.jsonl"]).await?.stdout;
            let refused = |name: &str| {
                connections.lines().any(|l| {
                    l.contains(&format!("\"name\":\"{name}\""))
                        && l.contains("received its upload budget of 1000000 bytes")
                })
            };
            assert!(refused("one.budget.test") && refused("many.budget.test"), "{connections}");
            Ok(())
        }
    }
}
