//! Attacks on the user's terminal: the agent's bytes carried out of the sandbox in what it logs
//! and reports. A forwarder's refusal quotes what the agent sent (an LFS operation, a tool's
//! type, both JSON-decoded, so `\u001b` arrives as ESC), and `agent-sandbox status`, `logs`,
//! `pending`, `ls` and `docker exec … sandbox-status` print it where the user reads. The
//! evidence is every byte they print: no terminal control of the agent's, and the refusal line
//! itself (the positive control: the text did come through, escaped). NET_ADMIN, in both shapes.

use sandbox_tests::docker::{TestNet, container_log_bytes, exec_bytes};
use sandbox_tests::launcher::{Launcher, Project};
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::{SandboxSpec, ca_secret_file, secret_file};

/// OSC 52 (set the clipboard to "pwned") as the agent writes it in JSON: ESC … BEL, and its
/// 8-bit form, C1's OSC … ST.
const OSC52: &str = "\\u001b]52;c;cHduZWQ=\\u0007";
const OSC52_C1: &str = "\\u009d52;c;cHduZWQ=\\u009c";
/// Each as a refusal shows it once escaped: every control a `?`.
const SHOWN: &str = "?]52;c;cHduZWQ=?";
const SHOWN_C1: &str = "?52;c;cHduZWQ=?";

/// Where `bytes` hold something a terminal would act on: ESC, BEL, CSI as one byte (0x9B), or a
/// C1 control encoded as UTF-8 (C2 80 to C2 9F). Each with what surrounds it, for the message.
fn terminal_controls(bytes: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        let c1 = b == 0xc2 && bytes.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n));
        if matches!(b, 0x1b | 0x07 | 0x9b) || c1 {
            let around = &bytes[i.saturating_sub(40)..(i + 40).min(bytes.len())];
            found.push(format!("{:?}", String::from_utf8_lossy(around)));
        }
    }
    found
}

fn assert_clean(what: &str, bytes: &[u8]) {
    let found = terminal_controls(bytes);
    assert!(found.is_empty(), "{what} printed the agent's terminal controls: {found:?}");
}

/// A JSON POST as the agent, raw, to the forwarder on `port`: the answer's status line.
async fn post(sb: &Sandbox, port: u16, path: &str, content_type: &str, body: &str) -> anyhow::Result<String> {
    let request = format!(
        "POST {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: {content_type}\\r\\nContent-Length: {}\\r\\n\\r\\n{body}",
        body.len()
    );
    let port = port.to_string();
    let probe =
        sb.probe(&["tcp", "127.0.0.1", &port, "--raw", "--send", &request, "--timeout-ms", "10000"]).await?;
    Ok(probe.fields.get("greeting").and_then(|g| g.split("\\n").next()).unwrap_or_default().to_string())
}

/// The port of GitHub's forwarded host `host`.
fn github_port(host: &str) -> u16 {
    let github = sandbox_init::policy::forward::builtin("github").expect("github is built in");
    github.hosts.iter().find(|h| h.host == host).expect("a forwarded host").port
}

net_admin! {
    [single, sidecar] {
        /// Without any key, in a sandbox the launcher ran: an LFS batch whose operation is OSC 52, in
        /// both forms, to the GitHub forwarder (refused, and the refusal quotes the operation); a
        /// request line with C1 controls in its method; a DNS question whose label is OSC 52. Then
        /// everything the launcher prints of the sandbox, and sandbox-status run by `docker exec` where
        /// the firewall is, is free of controls, and the refusal is there, escaped.
        #[tokio::test]
        async fn the_launchers_output_carries_no_control_of_the_agents() -> anyhow::Result<()> {
            let net = TestNet::create("attack-terminal").await?;
            let (launcher, project) = (Launcher::new()?, Project::new()?);
            let shell = sandbox_tests::images::image("shell").await?;
            let run = vec!["run", "shell", &project.path, "--detach", "--network", &net.name, "--image", &shell];
            launcher.ok(&run).await?;
            let (id, name) = project.sandbox().await?;
            let sb = Sandbox::adopt(&id).await?;

            let git = github_port("github.com");
            for operation in [OSC52, OSC52_C1] {
                let body = format!("{{\"operation\":\"{operation}\",\"objects\":[]}}");
                let status =
                    post(&sb, git, "/octo/hello.git/info/lfs/objects/batch", "application/vnd.git-lfs+json", &body)
                        .await?;
                assert!(status.starts_with("HTTP/1.1 403"), "{status}");
                assert_clean("the forwarder's answer to the agent", status.as_bytes());
            }
            let method = "\u{9b}2J\u{9d}52;c;cHduZWQ=\u{9c}";
            let request = format!("{method} / HTTP/1.1\\r\\n\\r\\n");
            let port = github_port("api.github.com").to_string();
            sb.probe(&["tcp", "127.0.0.1", &port, "--raw", "--send", &request, "--timeout-ms", "10000"]).await?;
            sb.probe(&["dns-crafted", "x\u{1b}]52;c;cHduZWQ=\u{7}|attacker|test"]).await?;

            // PID 1 logs the forwarder's reports as they come: the status shows both refusals.
            let started = std::time::Instant::now();
            let status = loop {
                let status = launcher.ok(&["status", &name]).await?;
                if status.stdout.matches("the LFS operation").count() == 2 {
                    break status;
                }
                anyhow::ensure!(started.elapsed().as_secs() < 20, "the refusals never showed: {}", status.stdout);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            };
            assert_clean("agent-sandbox status", &status.raw);
            assert!(status.stdout.contains(&format!("the LFS operation `{SHOWN}` is refused")), "{}", status.stdout);
            assert!(
                status.stdout.contains(&format!("the LFS operation `{SHOWN_C1}` is refused")),
                "{}",
                status.stdout
            );
            for args in [
                vec!["status", &name, "--json"],
                vec!["logs", &name],
                vec!["pending", &name],
                vec!["pending", &name, "--json"],
                vec!["ls"],
                vec!["ls", "--json"],
            ] {
                let out = launcher.run(&args).await?;
                assert_eq!(out.code, 0, "agent-sandbox {args:?}: {}", out.stderr);
                assert_clean(&format!("agent-sandbox {args:?}"), &out.raw);
            }
            let json = launcher.ok(&["status", &name, "--json"]).await?;
            let report: serde_json::Value = serde_json::from_str(&json.stdout)?;
            let reasons: Vec<&str> =
                report["connections"].as_array().into_iter().flatten().filter_map(|c| c["reason"].as_str()).collect();
            assert!(reasons.iter().any(|r| r.contains(SHOWN_C1)), "{reasons:?}");
            let logs = launcher.ok(&["logs", &name]).await?;
            assert!(logs.stdout.contains(SHOWN), "{}", logs.stdout);

            let firewall = sb.root_id();
            for cmd in [&["sandbox-status"][..], &["sandbox-status", "--json"]] {
                let out = exec_bytes(firewall, cmd).await?;
                assert!(String::from_utf8_lossy(&out).contains(SHOWN_C1), "{cmd:?}");
                assert_clean(&format!("docker exec {cmd:?}"), &out);
            }
            assert_clean("docker logs", &container_log_bytes(firewall).await?);
            Ok(())
        }
        /// With a model API's key held: a tool whose type is OSC 52 (refused as a remote tool, the
        /// reason quoting the type) and a link whose URL carries it. sandbox-status and the container's
        /// log show the refusals, escaped. The control: the refusal is there.
        #[tokio::test]
        async fn a_refused_tools_name_reaches_no_terminal() -> anyhow::Result<()> {
            let net = TestNet::create("attack-terminal-key").await?;
            let dir = tempfile::tempdir()?;
            let api = sandbox_init::apis::APIS.iter().find(|a| a.name == "anthropic").expect("anthropic");
            let spec = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("api.yaml", &format!("version: 1\ndomains: [{}]\n", api.host))
                .mount(&secret_file(dir.path(), "key", "sk-ant-terminal-attack")?, "/run/secrets/anthropic_api_key")
                .mount(&ca_secret_file(dir.path())?, "/run/secrets/sandbox_api_ca.pem");
            let sb = spec.start().await?;
            for kind in [OSC52, OSC52_C1] {
                let body = format!("{{\"model\":\"m\",\"tools\":[{{\"type\":\"mcp{kind}\"}}]}}");
                let status = post(&sb, api.port, "/v1/messages", "application/json", &body).await?;
                assert!(status.starts_with("HTTP/1.1 403"), "{status}");
                assert_clean("the forwarder's answer to the agent", status.as_bytes());
            }
            let started = std::time::Instant::now();
            let text = loop {
                let text = exec_bytes(sb.root_id(), &["sandbox-status"]).await?;
                let shown = String::from_utf8_lossy(&text).into_owned();
                if shown.matches("tool (the provider fetches").count() == 2 {
                    break shown;
                }
                anyhow::ensure!(started.elapsed().as_secs() < 20, "the refusals never showed: {shown}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            };
            assert_clean("sandbox-status", text.as_bytes());
            assert!(text.contains(&format!("`mcp{SHOWN}`")) && text.contains(&format!("`mcp{SHOWN_C1}`")), "{text}");
            assert_clean("sandbox-status --json", &exec_bytes(sb.root_id(), &["sandbox-status", "--json"]).await?);
            let log = container_log_bytes(sb.root_id()).await?;
            assert!(String::from_utf8_lossy(&log).contains(SHOWN_C1), "the refusal is not in the log");
            assert_clean("docker logs", &log);
            Ok(())
        }
    }
}
