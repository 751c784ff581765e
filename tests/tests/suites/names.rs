//! The name check: a TCP connection of the agent to an address opened for an allowed name goes
//! on only if the name it speaks (TLS SNI, HTTP Host) is allowed, or the policy declares the
//! port opaque. A peer serves two names on one address; the agent may name only one. NET_ADMIN,
//! private networks.

use std::time::Duration;

use sandbox_tests::assert::{assert_reaches, processes};
use sandbox_tests::docker::TestNet;
use sandbox_tests::peers::{PEER_GREETER, Peer};
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;
use sandbox_wire::namecheck::answer::not_allowed;

/// The name the policy allows, and another served from the same address.
const ALLOWED: &str = "api.allowed.test";
const OTHER: &str = "other.test";
const CONNECTION_LOG: &str = "/run/agent-sandbox/connections.jsonl";
const CA: &str = "/certs/ca.pem";

/// A network with one peer answering to both names (a certificate for both from the test CA),
/// and a sandbox of `image` that allows `policy` and has the CA's file at [`CA`].
async fn setup(test: &str, image: &str, policy: &str) -> anyhow::Result<(TestNet, Peer, Sandbox)> {
    let net = TestNet::create(test).await?;
    let peer = Peer::start(&net, &[ALLOWED, OTHER]).await?;
    let sb = spec(image, &net, policy).await?.start().await?;
    Ok((net, peer, sb))
}

async fn spec(image: &str, net: &TestNet, policy: &str) -> anyhow::Result<SandboxSpec> {
    let ca = sandbox_tests::tls::ca_file()?;
    Ok(SandboxSpec::of(sandbox_tests::images::image(image).await?)
        .net_admin()
        .on(net)
        .drop_in("names.yaml", policy)
        .mount(&ca.display().to_string(), CA))
}

fn allow(entry: &str) -> String {
    format!("version: 1\ndomains:\n  - {entry}\n")
}

/// The connection log's lines, parsed.
async fn connection_log(sb: &Sandbox) -> anyhow::Result<Vec<serde_json::Value>> {
    let out = sb.exec(&["sh", "-c", &format!("cat {CONNECTION_LOG} 2>/dev/null || true")]).await?;
    Ok(out.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// The log lines of connections to `port` with this verdict.
fn lines<'a>(log: &'a [serde_json::Value], verdict: &str, port: u16) -> Vec<&'a serde_json::Value> {
    log.iter().filter(|l| l["verdict"] == verdict && l["port"] == port).collect()
}

/// What the peer saw of `name`: handshakes, requests.
fn seen(log: &[String], name: &str) -> Vec<String> {
    log.iter().filter(|l| l.contains(&format!("={name}"))).cloned().collect()
}

/// A bare repository (served over dumb HTTP) with one commit, and a file.
fn served_repository() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("hello.txt"), "served over the name check\n")?;
    let work = dir.path().join("work");
    let bare = dir.path().join("repo.git");
    let git = |args: &[&str]| -> anyhow::Result<()> {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=test",
                "-c",
                "user.email=test@example.invalid",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .output()?;
        anyhow::ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    };
    git(&["init", "-q", &work.display().to_string()])?;
    std::fs::write(work.join("README"), "a file\n")?;
    git(&["-C", &work.display().to_string(), "add", "README"])?;
    git(&["-C", &work.display().to_string(), "commit", "-q", "-m", "through the name check"])?;
    git(&["clone", "-q", "--bare", &work.display().to_string(), &bare.display().to_string()])?;
    git(&["-C", &bare.display().to_string(), "update-server-info"])?;
    // World-readable: the peer's server reads them as whatever user the engine maps.
    std::process::Command::new("chmod").args(["-R", "a+rX", &dir.path().display().to_string()]).status()?;
    Ok(dir)
}

/// The checker's process, found in /proc: its own uid, named sandbox-init.
async fn checker_pid(sb: &Sandbox) -> anyhow::Result<Option<String>> {
    Ok(processes(sb)
        .await?
        .into_iter()
        .find(|p| p.fields.get("Uid").is_some_and(|u| u.starts_with("65533 ")))
        .map(|p| p.pid))
}

net_admin! {
    [single, sidecar] {
        /// curl, git and Node, verifying the peer's certificate with the test CA (never in the image's
        /// trust store), reach the allowed name over real TLS, and plain HTTP too.
        #[tokio::test]
        async fn the_allowed_name_works_end_to_end_from_curl_git_and_node() -> anyhow::Result<()> {
            let repo = served_repository()?;
            let net = TestNet::create("names-e2e").await?;
            let _peer = Peer::start_serving(&net, &[ALLOWED, OTHER], repo.path()).await?;
            let sb = spec("node", &net, &allow(ALLOWED)).await?.start().await?;
            let curl = sb
                .as_agent(&[
                    "curl",
                    "-sS",
                    "--cacert",
                    CA,
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    &format!("https://{ALLOWED}/hello.txt"),
                ])
                .await?;
            assert_eq!(curl.stdout, "200", "{curl:?}");
            let plain = sb.as_agent(&["curl", "-sS", &format!("http://{ALLOWED}/hello.txt")]).await?;
            assert_eq!(plain.stdout.trim(), "served over the name check", "{plain:?}");
            let url = format!("https://{ALLOWED}/repo.git");
            let clone = sb
                .as_agent(&["git", "-c", &format!("http.sslCAInfo={CA}"), "clone", "-q", &url, "/tmp/clone"])
                .await?;
            assert_eq!(clone.code, 0, "{clone:?}");
            let head = sb.as_agent(&["git", "-C", "/tmp/clone", "log", "-1", "--format=%s"]).await?;
            assert_eq!(head.stdout.trim(), "through the name check", "{head:?}");
            let script =
                format!("fetch('https://{ALLOWED}/hello.txt').then(r => r.text()).then(t => console.log(t.trim()))");
            let node = sb.as_agent(&["env", &format!("NODE_EXTRA_CA_CERTS={CA}"), "node", "-e", &script]).await?;
            assert_eq!(node.stdout.trim(), "served over the name check", "{node:?}");
            // The control: without the CA, verification fails; nothing was added to the trust store.
            let untrusted =
                sb.as_agent(&["curl", "-sS", "-o", "/dev/null", &format!("https://{ALLOWED}/hello.txt")]).await?;
            assert_eq!(untrusted.code, 60, "curl verified the test CA without being given it: {untrusted:?}");
            Ok(())
        }
        /// The other name lives on the same address: named by SNI, by Host, or by the second request of
        /// a keep-alive connection, it is refused, and no byte of it reaches the peer.
        #[tokio::test]
        async fn another_name_on_the_same_address_is_refused_by_sni_and_by_host() -> anyhow::Result<()> {
            let (_net, peer, sb) = setup("names-other", "shell", &allow(ALLOWED)).await?;
            let by_sni = sb.probe(&["tcp", ALLOWED, "443", "--sni", OTHER]).await?;
            assert_eq!(by_sni.outcome(), "denied", "{:?}", by_sni.fields);
            let by_host = sb.probe(&["tcp", ALLOWED, "80", "--host", OTHER]).await?;
            assert_eq!(by_host.outcome(), "denied", "{:?}", by_host.fields);
            // The refusal explains itself where the agent sees it, to real clients: curl prints
            // the 403's text (the name, and that the policy decides: not PID 1's detail), and
            // names the TLS alert.
            assert_eq!(by_host.fields["refusal"], not_allowed(OTHER), "{:?}", by_host.fields);
            let url = format!("http://{ALLOWED}/hello.txt");
            let plain = sb.as_agent(&["curl", "-sS", "-i", "-H", &format!("Host: {OTHER}"), &url]).await?;
            assert!(plain.stdout.starts_with("HTTP/1.1 403 Forbidden"), "{plain:?}");
            assert!(plain.stdout.contains(&format!("agent-sandbox refused this connection: {}", not_allowed(OTHER))), "{plain:?}");
            let to = format!("{OTHER}:443:{ALLOWED}:443");
            let tls = sb.as_agent(&["curl", "-sS", "--connect-to", &to, &format!("https://{OTHER}/")]).await?;
            assert_eq!(tls.code, 35, "{tls:?}");
            assert!(tls.stderr.contains("alert access denied"), "{tls:?}");
            let pipelined = sb.probe(&["http-pipeline", ALLOWED, "80", ALLOWED, OTHER]).await?;
            assert_eq!(pipelined.fields["served"], ALLOWED, "{:?}", pipelined.fields);
            let log = peer.log().await?;
            assert!(seen(&log, OTHER).is_empty(), "the other name reached the peer: {log:?}");
            // Only the pipelined connection reached the peer, and only with its first request.
            assert_eq!(log.iter().filter(|l| l.starts_with("conn ")).count(), 1, "{log:?}");
            // The control: the allowed name, by both, on the same address.
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            assert_reaches(&sb, &format!("{ALLOWED}:80")).await?;
            let log = peer.log().await?;
            assert!(log.contains(&format!("tls 443 sni={ALLOWED}")), "{log:?}");
            let connections = connection_log(&sb).await?;
            let refused = lines(&connections, "refused", 443);
            assert!(
                refused.iter().any(|l| l["name"] == OTHER
                    && l["via"] == "tls"
                    && l["reason"].as_str().unwrap_or("").contains("not in the allowlist")),
                "{connections:?}"
            );
            assert!(lines(&connections, "refused", 80).iter().any(|l| l["name"] == OTHER), "{connections:?}");
            let allowed = lines(&connections, "allowed", 443);
            assert!(
                allowed.iter().any(|l| l["name"] == ALLOWED && l["bytes_down"].as_u64() > Some(0)),
                "{connections:?}"
            );
            // sandbox-status: the last connections and the totals per name (PID 1 writes them within
            // a fifth of a second), as text and as JSON.
            let mut status = serde_json::Value::Null;
            for _ in 0..30 {
                let out = sb.exec(&["sandbox-status", "--json"]).await?;
                status = serde_json::from_str(&out.stdout)?;
                if status["totals"][ALLOWED]["allowed"].as_u64() >= Some(3) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(status["totals"][ALLOWED]["allowed"].as_u64() >= Some(3), "{status}");
            assert!(status["totals"][ALLOWED]["bytes_down"].as_u64() > Some(0), "{status}");
            assert_eq!(status["totals"][OTHER]["allowed"], 0, "{status}");
            assert!(status["totals"][OTHER]["refused"].as_u64() >= Some(3), "{status}");
            assert!(status["connections"].as_array().is_some_and(|c| !c.is_empty()), "{status}");
            let text = sb.exec(&["sandbox-status"]).await?.stdout;
            assert!(text.contains("recent connections:") && text.contains(&format!("  {OTHER}: 0 / ")), "{text}");
            let wrong = sb.exec(&["sandbox-status", "--jsno"]).await?;
            assert_eq!(wrong.code, 64, "{wrong:?}");
            Ok(())
        }
        /// Real ClientHellos span segments and records, and grow past 1,500 bytes with post-quantum key
        /// shares: all are reassembled and judged. A hello without SNI is refused, and so is an
        /// encrypted one, under an allowed outer name or another.
        #[tokio::test]
        async fn client_hellos_are_reassembled_and_judged_and_no_sni_or_ech_elsewhere_is_refused()
        -> anyhow::Result<()> {
            let (_net, _peer, sb) = setup("names-hello", "shell", &allow(ALLOWED)).await?;
            let hello = |extra: &[&str]| {
                let mut args = vec!["tls-hello", ALLOWED, "443"];
                args.extend_from_slice(extra);
                args.iter().map(|a| a.to_string()).collect::<Vec<_>>()
            };
            for (extra, expected) in [
                (vec![], "answered:handshake"),
                (vec!["--split", "40"], "answered:handshake"),
                (vec!["--pad", "2000"], "answered:handshake"),
                (vec!["--pad", "2000", "--records"], "answered:handshake"),
                // ECH is refused unless the name's entry allows it (attacks::names has the rest).
                (vec!["--ech"], "denied"),
                (vec!["--no-sni"], "denied"),
                (vec!["--ech", "--sni", OTHER], "denied"),
                (vec!["--pad", "2000", "--split", "1400", "--sni", OTHER], "denied"),
            ] {
                let args = hello(&extra);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let probe = sb.probe(&args).await?;
                assert!(probe.outcome().starts_with(expected), "{extra:?}: {:?}", probe.fields);
                if extra.contains(&"--pad") {
                    assert!(probe.number("hello_bytes") > 1500.0, "{:?}", probe.fields);
                }
            }
            let log = connection_log(&sb).await?;
            let refused = lines(&log, "refused", 443);
            assert!(refused.iter().any(|l| l["reason"].as_str().unwrap_or("").contains("no server name")), "{log:?}");
            assert!(refused.iter().any(|l| l["via"] == "tls (ech)" && l["name"] == OTHER), "{log:?}");
            Ok(())
        }
        /// A port that carries no name (SSH, a database) passes on the address alone only where the
        /// policy declares it opaque for that name.
        #[tokio::test]
        async fn an_opaque_port_passes_only_where_the_policy_declares_it() -> anyhow::Result<()> {
            let port = PEER_GREETER.to_string();
            let net = TestNet::create("names-opaque").await?;
            let _peer = Peer::start(&net, &[ALLOWED, OTHER]).await?;
            let declared =
                format!("version: 1\ndomains:\n  - domain: {ALLOWED}\n    ports: [443]\n    opaque: [{port}]\n");
            let sb = spec("shell", &net, &declared).await?.start().await?;
            let greeted = sb.probe(&["tcp", ALLOWED, &port, "--raw"]).await?;
            assert!(
                greeted.fields.get("greeting").is_some_and(|g| g.starts_with("hello from")),
                "{:?}",
                greeted.fields
            );
            // Listed as a checked port instead, the same port carries no name to check: refused.
            let checked = format!("version: 1\ndomains:\n  - domain: {ALLOWED}\n    ports: [443, {port}]\n");
            let sb = spec("shell", &net, &checked).await?.start().await?;
            let refused = sb.probe(&["tcp", ALLOWED, &port, "--raw", "--send", "SSH-2.0-probe\\r\\n"]).await?;
            assert_eq!(refused.outcome(), "reset", "{:?}", refused.fields);
            // And not listed at all, it is not open.
            let sb = spec("shell", &net, &allow(ALLOWED)).await?.start().await?;
            let closed = sb.probe(&["tcp", ALLOWED, &port, "--raw"]).await?;
            assert_eq!(closed.outcome(), "refused", "{:?}", closed.fields);
            Ok(())
        }
        /// A gigabyte through the check arrives whole: the digest the probe computes of what arrived is
        /// the one of the pattern the peer sends, computed here without the network.
        #[tokio::test]
        async fn a_gigabyte_arrives_intact() -> anyhow::Result<()> {
            const SIZE: u64 = 1_000_000_000;
            let (_net, _peer, sb) = setup("names-bulk", "shell", &allow(ALLOWED)).await?;
            let local = std::process::Command::new(sandbox_tests::probe::probe_binary()?)
                .args(["pattern-sha", &SIZE.to_string()])
                .output()?;
            let local = String::from_utf8(local.stdout)?;
            let expected = local.trim().strip_prefix("sha256=").expect("the probe's digest").to_string();
            for tls in [true, false] {
                let port = if tls { "443" } else { "80" };
                let mut args = vec!["fetch", ALLOWED, port, "/bytes/1000000000"];
                if tls {
                    args.push("--tls");
                }
                let fetched = sb.probe(&args).await?;
                assert_eq!(fetched.outcome(), "fetched", "{:?}", fetched.fields);
                assert_eq!(fetched.number("bytes"), SIZE as f64, "{:?}", fetched.fields);
                assert_eq!(fetched.fields["sha256"], expected, "port {port}");
            }
            let log = connection_log(&sb).await?;
            let whole = |port| lines(&log, "allowed", port).iter().any(|l| l["bytes_down"].as_u64() > Some(SIZE));
            assert!(whole(443) && whole(80), "the log counts the bytes: {log:?}");
            Ok(())
        }
        /// The address's element leaves the set when its TTL runs out; a connection opened before goes
        /// on (each request on it checked again), while a new one is refused. The element is deleted
        /// here as its timeout would, without waiting the 60-second floor.
        #[tokio::test]
        async fn a_connection_outlives_its_address_in_the_set() -> anyhow::Result<()> {
            let (_net, peer, sb) = setup("names-ttl", "shell", &allow(ALLOWED)).await?;
            let held = sb.probe_in_background(&["hold", ALLOWED, "80", "--http", "--ms", "5000"]);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let address = peer.ipv4.to_string();
            let elements = sb.set_elements().await?;
            assert!(elements.iter().any(|(a, _, _)| *a == peer.ipv4), "{elements:?}");
            for (addr, set, port) in elements.iter().filter(|(a, _, _)| *a == peer.ipv4) {
                let out = sb
                    .exec(&[
                        "nft",
                        "delete",
                        "element",
                        "inet",
                        "agent_sandbox",
                        set,
                        &format!("{{ {addr} . {port} }}"),
                    ])
                    .await?;
                assert_eq!(out.code, 0, "{out:?}");
            }
            let held = held.await??;
            assert_eq!(held.outcome(), "held", "{:?}", held.fields);
            // A ping every 100 ms or so; gVisor's round trips take longer.
            let pings = if sb.under_gvisor() { 20.0 } else { 30.0 };
            assert!(held.number("pings") >= pings, "{:?}", held.fields);
            // The control: the address is really gone from the sets.
            let refused = sb.probe(&["tcp", &address, "80"]).await?;
            assert_eq!(refused.outcome(), "refused", "{:?}", refused.fields);
            Ok(())
        }
        /// A thousand connections at once, each checked, all complete.
        #[tokio::test]
        async fn a_thousand_concurrent_connections_all_complete() -> anyhow::Result<()> {
            let (_net, _peer, sb) = setup("names-many", "shell", &allow(ALLOWED)).await?;
            for port in ["443", "80"] {
                let mut args = vec!["concurrent", ALLOWED, port, "1000", "--hold-ms", "1000"];
                if port == "443" {
                    args.push("--tls");
                }
                let many = sb.probe(&args).await?;
                assert_eq!(many.fields["completed"], "1000", "port {port}: {:?}", many.fields);
            }
            Ok(())
        }
        /// Stopped (a checker that falls behind) or killed, the checker lets nothing through: the
        /// connections wait, and nothing reaches the peer; killed, it is started again, and no
        /// connection passes unchecked meanwhile.
        #[tokio::test]
        async fn with_the_checker_stopped_or_killed_nothing_passes() -> anyhow::Result<()> {
            let (_net, peer, sb) = setup("names-checker", "shell", &allow(ALLOWED)).await?;
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            let before = peer.log().await?.len();
            let pid = checker_pid(&sb).await?.expect("a checker runs");
            let signal = |signal: &str| format!("kill -{signal} {pid}");
            assert_eq!(sb.exec(&["sh", "-c", &signal("STOP")]).await?.code, 0);
            for port in ["443", "80"] {
                let stalled = sb.probe(&["tcp", ALLOWED, port, "--timeout-ms", "2000"]).await?;
                assert_eq!(
                    stalled.outcome(),
                    "timeout",
                    "port {port} with the checker stopped: {:?}",
                    stalled.fields
                );
            }
            assert_eq!(peer.log().await?.len(), before, "something reached the peer: {:?}", peer.log().await?);
            assert_eq!(sb.exec(&["sh", "-c", &signal("KILL")]).await?.code, 0);
            // Killed: another name on the allowed address waits for a checker, then is refused by it;
            // it never passes unchecked, however soon PID 1 starts the next one.
            let after_kill = sb.probe(&["tcp", ALLOWED, "443", "--sni", OTHER, "--timeout-ms", "2000"]).await?;
            assert_ne!(after_kill.outcome(), "connected", "{:?}", after_kill.fields);
            // (The connections stalled above are checked by the next checker, and being allowed, may
            // reach the peer late; the other name never does.)
            let log = peer.log().await?;
            assert!(!log.iter().any(|l| l.contains(OTHER)), "{OTHER} reached the peer: {log:?}");
            // The control: PID 1 starts a new checker, and the name works again.
            let mut again = None;
            for _ in 0..50 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Some(new) = checker_pid(&sb).await?.filter(|p| *p != pid) {
                    again = Some(new);
                    break;
                }
            }
            assert!(again.is_some(), "no new checker");
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            let (_, stderr) = sb.logs().await?;
            assert!(stderr.contains("the name check runs again"), "{stderr}");
            Ok(())
        }
    }
}
