//! Forwarded services: GitHub and the npm registry reached through sandbox-init's forwarder,
//! which holds the user's token and keeps to the policy's rules. Real clients (git, curl, npm)
//! run as the agent; a forge peer on the private network plays github.com, api.github.com,
//! uploads.github.com and registry.npmjs.org (real `git http-backend`, a mock REST API, a mock
//! registry), trusted by the forwarder through the test CA. The evidence is what the peer
//! received and what its repositories hold. NET_ADMIN, private networks.

use sandbox_tests::docker::{TestNet, exec};
use sandbox_tests::launcher::Launcher;
use sandbox_tests::peers::Peer;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::{SandboxSpec, ca_secret_file, secret_file};

const TOKEN: &str = "ghp_REAL-token-of-the-forward-suite-8c1e";
const FORGE: [&str; 4] = ["github.com", "api.github.com", "uploads.github.com", "registry.npmjs.org"];

/// The key as the hunt takes it: in hex, so that its own command line does not hold it.
fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A sandbox of `image` on its own network with the forge, the user's GitHub token as a secret
/// file, and `policy` as a drop-in.
async fn forge(
    test: &str,
    spec: SandboxSpec,
    policy: &str,
) -> anyhow::Result<(TestNet, Peer, Sandbox, tempfile::TempDir)> {
    let net = TestNet::create(test).await?;
    let peer = Peer::start_forge(&net, &FORGE).await?;
    let dir = tempfile::tempdir()?;
    let token = secret_file(dir.path(), "gh_token", TOKEN)?;
    let sb = spec
        .net_admin()
        .on(&net)
        .drop_in("forward.yaml", policy)
        .mount(&token, "/run/secrets/gh_token")
        .mount(&ca_secret_file(dir.path())?, "/run/secrets/sandbox_api_ca.pem")
        .start()
        .await?;
    Ok((net, peer, sb, dir))
}

/// A shell command as the agent, in /tmp; its output, stdout and stderr together.
async fn sh(sb: &Sandbox, script: &str) -> anyhow::Result<(i64, String)> {
    let out = sb.as_agent(&["sh", "-c", &format!("cd /tmp && {{ {script} ; }} 2>&1")]).await?;
    Ok((out.code, out.stdout))
}

/// The commits on `main` of the forge's repository `repo`.
async fn commits(peer: &Peer, repo: &str) -> anyhow::Result<String> {
    let dir = format!("/tmp/forge/git/{repo}.git");
    Ok(exec(&peer.id, &["git", "--git-dir", &dir, "log", "--format=%s", "main"], None).await?.stdout)
}

fn base64_of(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A plain HTTP/1.1 request to the forwarder at `port`, as the agent: the status line and the
/// answer's last line.
async fn ask(sb: &Sandbox, port: u16, request: &str) -> anyhow::Result<(String, String)> {
    let port = port.to_string();
    let probe =
        sb.probe(&["tcp", "127.0.0.1", &port, "--raw", "--send", request, "--timeout-ms", "10000"]).await?;
    let answer = probe.fields.get("greeting").cloned().unwrap_or_default();
    let mut lines = answer.split("\\n").filter(|l| !l.trim().is_empty());
    let status = lines.next().unwrap_or_default().to_string();
    Ok((status, lines.last().unwrap_or_default().to_string()))
}

/// `agent-sandbox policy check --policy FILE` of a raw request as `ask` sends it (its method,
/// path and body) to `host`: whether it says allowed (by its exit status), and what it printed.
async fn check(policy: &std::path::Path, host: &str, request: &str) -> anyhow::Result<(bool, String)> {
    let (head, body) = request.split_once("\\r\\n\\r\\n").unwrap_or((request, ""));
    let mut words = head.split(' ');
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let dir = tempfile::tempdir()?;
    let body_file = dir.path().join("body");
    std::fs::write(&body_file, body)?;
    let policy = policy.to_string_lossy().into_owned();
    let target = format!("{method} https://{host}{path}");
    let args = ["policy", "check", "--policy", &policy, "--body", &body_file.to_string_lossy(), &target];
    let out = Launcher::new()?.run(&args).await?;
    anyhow::ensure!(matches!(out.code, 0 | 1), "policy check {target}: {out:?}");
    Ok((out.code == 0, out.stdout))
}

fn post(path: &str, body: &str, extra: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\\r\\nContent-Type: application/json\\r\\n{extra}Content-Length: {}\\r\\n\\r\\n{body}",
        body.len()
    )
}

net_admin! {
    [single] {
        /// git, the real client, with each of GitHub's URL forms: clones go through the forwarder (the
        /// system configuration's `insteadOf`), a push to the repository the policy lists lands, a push
        /// to another is refused with the rule and the policy key that would allow it, and the forge
        /// sees the user's token on every request and never the agent's. The token is nowhere the agent
        /// can read.
        #[tokio::test]
        async fn git_clones_and_pushes_where_the_policy_allows_and_nowhere_else() -> anyhow::Result<()> {
            let policy = "version: 1\nforward:\n  github:\n    write: [octo/hello]\n";
            let (_net, peer, sb, _dir) = forge("fwd-git", SandboxSpec::smallest().await?, policy).await?;
            let commit = "git -c user.name=agent -c user.email=agent@sandbox commit -q --allow-empty -m";

            let (code, out) = sh(&sb, &format!(
                "git clone -q https://github.com/octo/hello && cd hello && {commit} from-the-sandbox && git push -q origin main"
            ))
            .await?;
            assert_eq!(code, 0, "{out}");
            assert!(commits(&peer, "octo/hello").await?.contains("from-the-sandbox"), "the push did not land");

            // The other forms of the URL, and a repository the policy does not list as writable: it
            // reads, it does not take a push.
            for (form, dir) in [("git@github.com:octo/secret.git", "s1"), ("ssh://git@github.com/octo/secret", "s2")]
            {
                let (code, out) = sh(
                    &sb,
                    &format!(
                        "git clone -q {form} {dir} && cd {dir} && {commit} exfiltrated && git push -q origin main"
                    ),
                )
                .await?;
                assert_ne!(code, 0, "{form}: {out}");
                assert!(out.contains("README") || out.contains("403"), "{form}: {out}");
                assert!(
                    out.contains("forward: {github: {write: [octo/secret]}}"),
                    "{form}: git did not show the rule: {out}"
                );
            }
            assert!(!commits(&peer, "octo/secret").await?.contains("exfiltrated"), "a refused push landed");

            let log = peer.log().await?;
            let requests: Vec<&String> = log.iter().filter(|l| l.contains("forge host=github.com")).collect();
            assert!(requests.len() >= 6, "{log:#?}");
            let basic = format!("auth=Basic {}", base64_of(&format!("x-access-token:{TOKEN}")));
            assert!(
                requests.iter().all(|l| l.contains(&basic)),
                "a request went without the user's token: {requests:#?}"
            );
            assert!(
                !requests.iter().any(|l| l.contains("octo/secret") && l.contains("git-receive-pack")),
                "a push to the unlisted repository reached the forge: {requests:#?}"
            );

            let status = sb.as_agent(&["sandbox-status"]).await?.stdout;
            assert!(status.contains("github.com through 127.0.0.1:15110 (github; write: octo/hello)"), "{status}");

            let hunt = sb.probe(&["find-string", &hex(TOKEN), "/"]).await?;
            assert_eq!(hunt.fields["found"], "", "the agent found the token: {:?}", hunt.fields);
            Ok(())
        }
        /// The REST and GraphQL APIs: reads pass; a write under the writable repository passes; a gist,
        /// a write to another repository and a GraphQL mutation are refused with one line naming the
        /// rule, and never reach the API. A write dressed as a read by a method-override header reaches
        /// the API as what it is. The agent's own token, straight to github.com or api.github.com (on
        /// 443, on 22, and by address with another allowed name), gets nowhere.
        #[tokio::test]
        async fn the_api_keeps_to_the_rules_and_the_agents_own_connections_are_refused() -> anyhow::Result<()> {
            let policy = "version: 1\nforward:\n  github:\n    write: [octo/hello]\n";
            let (_net, peer, sb, dir) = forge("fwd-api", SandboxSpec::smallest().await?, policy).await?;
            let policy_file = dir.path().join("forward.yaml");
            std::fs::write(&policy_file, policy)?;
            let api = 15111;
            // Each refusal names the rule, and the policy key that would allow it where one does.
            let key = "forward: {github:";
            for (request, refusal) in [
                ("GET /user HTTP/1.1\\r\\n\\r\\n".to_string(), None),
                (post("/repos/octo/hello/issues", r#"{"title":"t"}"#, ""), None),
                (post("/graphql", r#"{"query":"query { viewer { login } }"}"#, ""), None),
                (post("/gists", r#"{"files":{"a":{"content":"secret"}}}"#, ""), Some("a gist is readable by anyone")),
                (post("/repos/octo/secret/issues", r#"{"title":"t"}"#, ""), Some(key)),
                (post("/repos/OCTO/Secret.git/issues", r#"{"title":"t"}"#, ""), Some(key)),
                (post("/graphql", r#"{"query":"mutation { createGist(input: {}) { id } }"}"#, ""), Some(key)),
                (
                    post(
                        "/graphql",
                        r#"[{"query":"query { a }"},{"query":"mutation { ok: createIssue(input: {}) { id } }"}]"#,
                        "",
                    ),
                    Some(key),
                ),
                (
                    post(
                        "/graphql",
                        r#"{"query":"query { a } mutation M { deleteRepository(input: {}) { id } }"}"#,
                        "",
                    ),
                    Some(key),
                ),
            ] {
                let (status, line) = ask(&sb, api, &request).await?;
                // `policy check` of the same request, with the same policy, says what the
                // forwarder did.
                let checked = check(&policy_file, "api.github.com", &request).await?;
                assert_eq!(checked.0, refusal.is_none(), "policy check of {request}: {}", checked.1);
                if let Some(why) = refusal {
                    assert!(checked.1.contains(why), "policy check of {request}: {}", checked.1);
                }
                match refusal {
                    None => assert!(status.starts_with("HTTP/1.1 200"), "{request}: {status} {line}"),
                    Some(why) => {
                        assert!(status.starts_with("HTTP/1.1 403"), "{request}: {status} {line}");
                        assert!(
                            line.starts_with("agent-sandbox forwarder:") && line.contains(why),
                            "{request}: {line}"
                        );
                    }
                }
            }
            let (status, _) =
                ask(&sb, api, &post("/repos/octo/hello/issues", "{}", "X-HTTP-Method-Override: DELETE\\r\\n"))
                    .await?;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            let log = peer.log().await?;
            let api_lines: Vec<&String> = log.iter().filter(|l| l.contains("forge host=api.github.com")).collect();
            assert_eq!(api_lines.len(), 4, "only the allowed requests reached the API: {api_lines:#?}");
            assert!(api_lines.iter().all(|l| l.contains(&format!("auth=Bearer {TOKEN}"))), "{api_lines:#?}");
            assert!(!api_lines.iter().any(|l| l.contains("gists") || l.contains("secret")), "{api_lines:#?}");

            // The agent's own connections to the forwarded hosts: by name on 443, by their address
            // under their own name and under a name the policy allows directly, and on 22 and 80.
            for host in ["github.com", "api.github.com"] {
                let own = sb.probe(&["tcp", host, "443", "--tls"]).await?;
                assert_eq!(own.outcome(), "denied", "{host}: {:?}", own.fields);
                let address = own.fields["address"].clone();
                for sni in [host, "codeload.github.com"] {
                    let fronted = sb.probe(&["tcp", &address, "443", "--tls", "--sni", sni]).await?;
                    assert_eq!(fronted.outcome(), "denied", "{sni} at {address}: {:?}", fronted.fields);
                }
            }
            for (port, how) in [("22", "--tls"), ("80", "--http")] {
                let other = sb.probe(&["tcp", "github.com", port, how]).await?;
                assert!(matches!(other.outcome(), "refused" | "denied"), "github.com:{port}: {:?}", other.fields);
            }
            let connections = sb.exec(&["cat", "/run/agent-sandbox/connections.jsonl"]).await?.stdout;
            assert!(connections.contains("reached through the key forwarder alone"), "{connections}");
            // The forwarder's refusals are the user's to see too: one line each, with the rule.
            let refusals: Vec<serde_json::Value> = connections
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|l| l["via"] == "forwarder")
                .collect();
            // (Two of the six have the same reason: a repeated line may be folded.)
            assert!(refusals.len() >= 5, "{connections}");
            assert!(
                refusals.iter().any(|l| l["name"] == "api.github.com"
                    && l["verdict"] == "refused"
                    && l["reason"].as_str().is_some_and(|r| r.starts_with("403 ") && r.contains("gist"))),
                "{refusals:#?}"
            );
            Ok(())
        }
        /// npm, the real client, in the node image: an install from the registry works through the
        /// forwarder (the packument's tarball URL names registry.npmjs.org, which npm sends to the
        /// configured registry), and a publish, with a token of the agent's own, is refused before it
        /// reaches the registry.
        #[tokio::test]
        async fn npm_installs_through_the_forwarder_and_cannot_publish() -> anyhow::Result<()> {
            let node = sandbox_tests::images::image("node").await?;
            let (_net, peer, sb, _dir) =
                forge("fwd-npm", SandboxSpec::of(node), "version: 1\nservices: [npm]\n").await?;
            let (code, out) = sh(&sb, "mkdir -p app && cd app && npm install --no-audit --no-fund left-pad-sandbox && test -f node_modules/left-pad-sandbox/package.json").await?;
            assert_eq!(code, 0, "{out}");
            let (code, out) = sh(
                &sb,
                "mkdir -p pkg && cd pkg && printf '{\"name\":\"exfil-pkg\",\"version\":\"1.0.0\"}' > package.json \
                 && npm publish --//127.0.0.1:15120/:_authToken=npm_the-agents-own-token",
            )
            .await?;
            assert_ne!(code, 0, "{out}");
            assert!(out.contains("403") && out.contains("forward: {npm: {publish: [exfil-pkg]}}"), "{out}");
            let log = peer.log().await?;
            let registry: Vec<&String> = log.iter().filter(|l| l.contains("forge host=registry.npmjs.org")).collect();
            assert!(
                registry.iter().any(|l| l.contains(".tgz")),
                "the tarball did not come through the forwarder: {log:#?}"
            );
            assert!(
                !registry.iter().any(|l| l.contains("method=PUT")),
                "the publish reached the registry: {registry:#?}"
            );
            Ok(())
        }
        /// A service of the user's own, declared in a policy: its token (a root-only secret file) goes
        /// to its one host with the requests its `allow` rules name, and with no other; the agent's own
        /// connection to the host is reset.
        #[tokio::test]
        async fn a_declared_service_gets_its_token_for_the_allowed_requests_alone() -> anyhow::Result<()> {
            const SECRET: &str = "tracker-REAL-token-of-the-declared-service-93b1";
            let net = TestNet::create("fwd-declared").await?;
            let api = Peer::start(&net, &["api.tracker.test", "api.other.test"]).await?;
            let dir = tempfile::tempdir()?;
            let policy = "version: 1\ndomains: [api.other.test]\nforward:\n  tracker:\n    host: api.tracker.test\n    \
                          secret: tracker_token\n    variable: TRACKER_TOKEN\n    \
                          allow: [\"GET,HEAD /v1/**\", \"POST /v1/issues/*/comments\"]\n";
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("tracker.yaml", policy)
                .mount(&secret_file(dir.path(), "tracker_token", SECRET)?, "/run/secrets/tracker_token")
                .mount(&ca_secret_file(dir.path())?, "/run/secrets/sandbox_api_ca.pem")
                .start()
                .await?;
            let env = sb.as_agent(&["sh", "-c", "echo $SANDBOX_FORWARD_API_TRACKER_TEST $TRACKER_TOKEN"]).await?;
            assert_eq!(env.stdout.trim(), "http://127.0.0.1:15130 held-by-agent-sandbox", "{env:?}");
            for (request, allowed) in [
                ("GET /v1/issues/7 HTTP/1.1\\r\\n\\r\\n".to_string(), true),
                (post("/v1/issues/7/comments", "{}", ""), true),
                (post("/v1/issues", r#"{"title":"exfiltrated"}"#, ""), false),
                ("DELETE /v1/issues/7 HTTP/1.1\\r\\n\\r\\n".to_string(), false),
                ("GET /admin HTTP/1.1\\r\\n\\r\\n".to_string(), false),
            ] {
                let (status, line) = ask(&sb, 15130, &request).await?;
                let expected = if allowed { "HTTP/1.1 200" } else { "HTTP/1.1 403" };
                assert!(status.starts_with(expected), "{request}: {status} {line}");
            }
            let log = api.log().await?;
            let requests: Vec<&String> = log.iter().filter(|l| l.starts_with("http 443 ")).collect();
            assert_eq!(requests.len(), 2, "only the allowed requests reached the API: {log:#?}");
            assert!(requests.iter().all(|l| l.contains(SECRET)), "{requests:#?}");
            let own = sb.probe(&["tcp", "api.tracker.test", "443", "--tls"]).await?;
            assert_eq!(own.outcome(), "denied", "{:?}", own.fields);
            let hunt = sb.probe(&["find-string", &hex(SECRET), "/"]).await?;
            assert_eq!(hunt.fields["found"], "", "the agent found the token: {:?}", hunt.fields);

            // A host a reload makes forwarded has no route until the next start, and is no longer
            // reached directly meanwhile (it was, before).
            let direct = sb.probe(&["tcp", "api.other.test", "443", "--tls"]).await?;
            assert_eq!(direct.outcome(), "connected", "the control: {:?}", direct.fields);
            sb.write_drop_in(
                "later.yaml",
                "version: 1\nforward:\n  other:\n    host: api.other.test\n    secret: other_token\n    allow: [\"GET /**\"]\n",
            )?;
            sb.signal("SIGHUP").await?;
            sb.wait_for_stdout("sandbox reloaded", 1).await?;
            let held = sb.probe(&["tcp", "api.other.test", "443", "--tls"]).await?;
            assert_eq!(held.outcome(), "denied", "{:?}", held.fields);
            Ok(())
        }
    }
}
