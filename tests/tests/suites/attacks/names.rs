//! Attacks on the name check: what the agent puts on the wire to reach a site its policy does not
//! name through a connection opened for one it does. NET_ADMIN, private networks; the evidence
//! is what the peer read.

use std::time::Duration;

use sandbox_tests::assert::assert_reaches;
use sandbox_tests::docker::{TestNet, container_logs};
use sandbox_tests::peers::{Peer, PeerSpec};
use sandbox_tests::probe::Probe;
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;

use super::{ALLOWED, allow};

/// How many bytes the one TLS connection that `peer` logged after its line `before` read.
async fn bytes_the_peer_read(peer: &Peer, before: usize) -> anyhow::Result<String> {
    let mut ended = Vec::new();
    for _ in 0..50 {
        ended = peer.log().await?[before..].iter().filter(|l| l.starts_with("conn 443 ")).cloned().collect();
        if !ended.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::ensure!(ended.len() == 1, "one connection ended at the peer: {ended:?}");
    Ok(ended[0].rsplit_once(" bytes=").map(|(_, n)| n.to_string()).unwrap_or_default())
}

/// What `sb`'s agent reads after sending `text` (the probe's escapes) to the allowed name's port 80.
async fn send_raw(sb: &Sandbox, text: &str) -> anyhow::Result<Probe> {
    sb.probe(&["tcp", ALLOWED, "80", "--raw", "--send", text, "--timeout-ms", "1500"]).await
}

net_admin! {
    [single, sidecar] {
        /// The name check's ways round, each as the agent tried them: a request line whose scheme is
        /// not http (`ws://other/`, whose host nginx and Go take over Host), a TLS client that sends a
        /// second ClientHello naming another site after the server asked for a retry, and an allowed
        /// name sent to the address of another allowed name (a shared host serves whatever site claims
        /// that name there). Each is reset before a byte of it reaches the peer; the same moves with
        /// the allowed name, and the other allowed name at its own address, go through.
        #[tokio::test]
        async fn the_name_check_takes_no_scheme_second_hello_or_borrowed_address() -> anyhow::Result<()> {
            const OTHER: &str = "other.test";
            const FAR: &str = "far.test";
            let net = TestNet::create("attack-names").await?;
            let shared = Peer::start(&net, &[ALLOWED, OTHER]).await?;
            let _far = Peer::start(&net, &[FAR]).await?;
            let spec =
                SandboxSpec::smallest().await?.net_admin().on(&net).drop_in("test.yaml", &allow(&[ALLOWED, FAR]));
            let sb = spec.start().await?;
            let request = |target: &str, host: &str| {
                format!("GET {target} HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n")
            };
            let raw = |host: &'static str, send: String| {
                let sb = &sb;
                async move { sb.probe(&["tcp", host, "80", "--raw", "--send", &send]).await }
            };
            // Another scheme's host in the request line.
            for target in [format!("ws://{OTHER}/"), format!("git+ssh://{OTHER}/x")] {
                let probe = raw(ALLOWED, request(&target, ALLOWED)).await?;
                assert_eq!(probe.outcome(), "denied", "{target}: {:?}", probe.fields);
            }
            let control = raw(ALLOWED, request(&format!("http://{ALLOWED}/"), ALLOWED)).await?;
            assert!(
                control.fields.get("greeting").is_some_and(|g| g.starts_with("HTTP/1.1 200")),
                "{:?}",
                control.fields
            );
            // A second ClientHello after a HelloRetryRequest.
            let before = shared.log().await?.len();
            let again = sb.probe(&["tls-hello", ALLOWED, "443", "--retry", OTHER]).await?;
            assert_eq!((again.fields["retry"].as_str(), again.outcome()), ("yes", "reset"), "{:?}", again.fields);
            // The server got the first hello and not a byte more: the change_cipher_spec before the
            // second waited with it, and went nowhere.
            assert_eq!(
                bytes_the_peer_read(&shared, before).await?,
                again.fields["hello_bytes"],
                "{:?}",
                again.fields
            );
            let same = sb.probe(&["tls-hello", ALLOWED, "443", "--retry", ALLOWED]).await?;
            assert_eq!(
                (same.fields["retry"].as_str(), same.outcome()),
                ("yes", "answered:handshake"),
                "{:?}",
                same.fields
            );
            // An allowed name at an address opened only for another: by Host, and by SNI.
            let borrowed = sb.probe(&["tcp", ALLOWED, "80", "--host", FAR]).await?;
            assert_eq!(borrowed.outcome(), "denied", "{:?}", borrowed.fields);
            let borrowed = sb.probe(&["tcp", ALLOWED, "443", "--sni", FAR]).await?;
            assert_eq!(borrowed.outcome(), "denied", "{:?}", borrowed.fields);
            assert_reaches(&sb, &format!("{FAR}:80")).await?;
            assert_reaches(&sb, &format!("{FAR}:443")).await?;
            let log = shared.log().await?;
            assert!(
                !log.iter().any(|l| l.contains(OTHER) || l.contains(FAR)),
                "another name reached the peer: {log:?}"
            );
            Ok(())
        }
        /// After the server's HelloRetryRequest, the agent sends a `user_canceled` alert and then the
        /// second ClientHello naming another site: a TLS 1.3 server built on OpenSSL reads past the
        /// alert and serves the site the second hello names. Before the fix, any alert there ended the
        /// check and everything after it went on. Now the alert ends the connection: before or after
        /// the change_cipher_spec, in the hello's segment or apart, the server reads the first hello
        /// and not a byte more (read on the peer's side, since the suite's rustls peer would refuse the
        /// changed name by itself). The control: the same retry naming the allowed name is answered.
        #[tokio::test]
        async fn an_alert_before_the_second_hello_does_not_turn_the_name_check_off() -> anyhow::Result<()> {
            const OTHER: &str = "other.test";
            let net = TestNet::create("attack-alert").await?;
            let shared = Peer::start(&net, &[ALLOWED, OTHER]).await?;
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("test.yaml", &allow(&[ALLOWED]))
                .start()
                .await?;
            for alert in
                [&["--alert", "first"][..], &["--alert", "after-ccs"], &["--alert", "after-ccs", "--alert-apart"]]
            {
                let before = shared.log().await?.len();
                let args = [&["tls-hello", ALLOWED, "443", "--retry", OTHER][..], alert].concat();
                let attack = sb.probe(&args).await?;
                assert_eq!(
                    (attack.fields["retry"].as_str(), attack.outcome()),
                    ("yes", "reset"),
                    "{alert:?}: {:?}",
                    attack.fields
                );
                let read = bytes_the_peer_read(&shared, before).await?;
                assert_eq!(read, attack.fields["hello_bytes"], "{alert:?}: the server read past the first hello");
            }
            // The second hello as the payload of a record whose header went with the first (found by
            // a red team: the check skipped the record its header announced): refused at the first.
            let before = shared.log().await?.len();
            let announced = sb.probe(&["tls-hello", ALLOWED, "443", "--retry", OTHER, "--announce"]).await?;
            assert_eq!(
                (announced.fields["retry"].as_str(), announced.outcome()),
                ("no", "denied"),
                "{:?}",
                announced.fields
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            let reached: Vec<String> =
                shared.log().await?[before..].iter().filter(|l| l.starts_with("conn 443 ")).cloned().collect();
            assert!(reached.is_empty(), "the first flight reached the server: {reached:?}");
            let same = sb.probe(&["tls-hello", ALLOWED, "443", "--retry", ALLOWED]).await?;
            assert_eq!(
                (same.fields["retry"].as_str(), same.outcome()),
                ("yes", "answered:handshake"),
                "{:?}",
                same.fields
            );
            assert!(!shared.log().await?.iter().any(|l| l.contains(OTHER)), "the other name reached the peer");
            Ok(())
        }
        /// The agent hides a request for another site in a request's body: a server that ignores a
        /// GET's body, or answers a POST before reading its body, reads the body as the next request
        /// (CL.0), which the check had taken for body. The peer here is such a server. A body on a GET
        /// is refused outright; a POST's body with a request line or a Host line for another name in
        /// it ends the connection before that line reaches the server (with `Expect: 100-continue`
        /// too). The control: a POST with a JSON body, and a GET without one, are served.
        #[tokio::test]
        async fn a_request_hidden_in_a_body_reaches_no_other_site() -> anyhow::Result<()> {
            const OTHER: &str = "other.test";
            let net = TestNet::create("attack-cl0").await?;
            let shared = PeerSpec::named(&[ALLOWED, OTHER]).option("--ignore-bodies").start(&net).await?;
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("test.yaml", &allow(&[ALLOWED]))
                .start()
                .await?;
            let smuggled = format!("GET /smuggled HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n");
            let with_body = |method: &str, extra: &str, body: &str| {
                let length = body.replace("\\r\\n", "\r\n").len();
                format!(
                    "{method} /carrier HTTP/1.1\\r\\nHost: {ALLOWED}\\r\\n{extra}Content-Length: {length}\\r\\n\\r\\n{body}"
                )
            };
            let send = |text: String| {
                let sb = &sb;
                async move { sb.probe(&["tcp", ALLOWED, "80", "--raw", "--send", &text, "--timeout-ms", "1500"]).await }
            };
            for attack in [
                with_body("GET", "", &smuggled),
                with_body("POST", "", &smuggled),
                with_body("POST", "Expect: 100-continue\\r\\n", &smuggled),
                with_body("POST", "", &format!("a=1\\r\\nHost: {OTHER}\\r\\n\\r\\n")),
            ] {
                let probe = send(attack.clone()).await?;
                assert!(
                    !probe.fields.get("greeting").is_some_and(|g| g.contains(OTHER)),
                    "{attack}: {:?}",
                    probe.fields
                );
            }
            // The controls, on the same peer.
            let json = with_body("POST", "Content-Type: application/json\\r\\n", "{\"model\": \"m\", \"x\": [1, 2]}");
            let served = send(json).await?;
            assert!(
                served.fields.get("greeting").is_some_and(|g| g.starts_with("HTTP/1.1 200")),
                "{:?}",
                served.fields
            );
            assert_reaches(&sb, &format!("{ALLOWED}:80")).await?;
            let log = shared.log().await?;
            assert!(log.iter().any(|l| l.contains(&format!("host={ALLOWED} path=/carrier"))), "{log:?}");
            assert!(
                !log.iter().any(|l| l.contains(OTHER) || l.contains("/smuggled")),
                "a hidden request was served: {log:?}"
            );
            Ok(())
        }
        /// Found by a fourth red team: a request line hidden in a POST's body whose method is no
        /// token (`{x`, `GET/`, a Latin-1 letter), which Python's `http.server` serves when the
        /// application's handler takes every method and ignores the body; the check held only lines
        /// starting with a token, so the line went on. The peer here is that server. Each is reset
        /// before the line reaches it. The controls: a JSON body, and a body of short lines, are
        /// served; and without the name check the same body is a request to the other site there,
        /// so the peer is one the attack fools.
        #[tokio::test]
        async fn a_request_line_python_reads_in_a_body_reaches_no_other_site() -> anyhow::Result<()> {
            const OTHER: &str = "other.test";
            let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire");
            let net = TestNet::create("attack-python-cl0").await?;
            let python = PeerSpec::named(&[ALLOWED, OTHER])
                .program(
                    &sandbox_tests::images::image("python").await?,
                    &["python3", "/srv/python.py", "--ignore-bodies"],
                    &fixtures,
                )
                .start(&net)
                .await?;
            let spec = || async {
                anyhow::Ok(SandboxSpec::smallest().await?.net_admin().on(&net).drop_in("test.yaml", &allow(&[ALLOWED])))
            };
            let sb = spec().await?.start().await?;
            // The probe's `--send` takes `\r`, `\n` and `\xHH` escapes: each is one byte.
            let post = |body: &str| {
                let length = body.len() - body.matches("\\r").count() - body.matches("\\n").count() - 3 * body.matches("\\x").count();
                format!("POST /carrier HTTP/1.1\\r\\nHost: {ALLOWED}\\r\\nContent-Length: {length}\\r\\n\\r\\n{body}")
            };
            let attacks = [
                format!("{{x http://{OTHER}/secret HTTP/1.1\\r\\nX: y\\rHost: {OTHER}\\r\\n\\r\\n"),
                format!("GET/ /secret HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n"),
                format!("\\xe9 /secret HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n"),
            ];
            for attack in &attacks {
                send_raw(&sb, &post(attack)).await?;
            }
            for control in ["{\"model\": \"m\", \"x\": [1, 2]}", "{\"a\":1}\\n}\\n"] {
                let served = send_raw(&sb, &post(control)).await?;
                assert!(
                    served.fields.get("greeting").is_some_and(|g| g.starts_with("HTTP/1.1 200")),
                    "{control}: {:?}",
                    served.fields
                );
            }
            let log: Vec<String> = container_logs(&python.id).await?.0.lines().map(str::to_string).collect();
            assert!(!log.iter().any(|l| l.contains(OTHER) || l.contains("secret")), "a hidden request was served: {log:?}");
            // The same body without the name check: Python serves the hidden request.
            let unchecked = spec().await?.env("SANDBOX_NAME_CHECK", "off").start().await?;
            send_raw(&unchecked, &post(&attacks[0])).await?;
            let log: Vec<String> = container_logs(&python.id).await?.0.lines().map(str::to_string).collect();
            assert!(
                log.iter().any(|l| l.contains(&format!("\"host\": \"{OTHER}\"")) && l.contains("/secret")),
                "the peer is not fooled by the attack, so it proves nothing: {log:?}"
            );
            Ok(())
        }
        /// The agent brings its own ECH configuration (the DNS gate empties HTTPS and SVCB answers, so
        /// no real client learns one from it) and sends an encrypted ClientHello whose outer name is an
        /// allowed one: an ECH front end would serve whatever site the inner hello names, which the
        /// check cannot read. It is refused before a byte reaches the server, and the log says why. The
        /// control: the same hello without ECH passes, and once the policy says `ech: true` for the
        /// name, the ECH hello passes too.
        #[tokio::test]
        async fn an_encrypted_client_hello_under_an_allowed_name_is_refused() -> anyhow::Result<()> {
            let net = TestNet::create("attack-ech").await?;
            let peer = Peer::start(&net, &[ALLOWED]).await?;
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("test.yaml", &allow(&[ALLOWED]))
                .start()
                .await?;
            let ech = sb.probe(&["tls-hello", ALLOWED, "443", "--ech"]).await?;
            assert_eq!(ech.outcome(), "denied", "{:?}", ech.fields);
            let plain = sb.probe(&["tls-hello", ALLOWED, "443"]).await?;
            assert_eq!(plain.outcome(), "answered:handshake", "{:?}", plain.fields);
            let log = peer.log().await?;
            assert_eq!(
                log.iter().filter(|l| l.starts_with("conn 443 ")).count(),
                1,
                "only the plain hello reached the peer: {log:?}"
            );
            let connections = sb.exec(&["cat", "/run/agent-sandbox/connections.jsonl"]).await?.stdout;
            assert!(
                connections
                    .lines()
                    .any(|l| l.contains("\"tls (ech)\"") && l.contains("\"refused\"") && l.contains("ech: true")),
                "{connections}"
            );
            // Allowed for the name, by the policy.
            sb.write_drop_in("ech.yaml", &format!("version: 1\ndomains:\n  - domain: {ALLOWED}\n    ech: true\n"))?;
            sb.signal("SIGHUP").await?;
            sb.wait_for_stdout("sandbox reloaded", 1).await?;
            let allowed = sb.probe(&["tls-hello", ALLOWED, "443", "--ech"]).await?;
            assert!(allowed.outcome().starts_with("answered"), "{:?}", allowed.fields);
            Ok(())
        }
        /// A blocked name written as a server may still read it as itself: in another case, with a
        /// trailing dot (`BLOCKED.test.`), in a DNS question, a ClientHello's SNI and an HTTP Host, the
        /// last two on the address of an allowed name that the same server serves. Each is refused, and
        /// the server reads none of them. The controls: the allowed name in upper case and with its dot
        /// is resolved, and reached by SNI and by Host.
        #[tokio::test]
        async fn a_blocked_name_in_another_case_or_with_a_trailing_dot_is_refused() -> anyhow::Result<()> {
            const BLOCKED: &str = "blocked.test";
            let net = TestNet::create("attack-case-dot").await?;
            let shared = Peer::start(&net, &[ALLOWED, BLOCKED]).await?;
            let spec =
                SandboxSpec::smallest().await?.net_admin().on(&net).drop_in("test.yaml", &allow(&[ALLOWED]));
            let sb = spec.start().await?;
            let spellings = ["BLOCKED.TEST", "Blocked.Test.", "blocked.test.", "BLOCKED.test."];
            for name in spellings {
                let asked = sb.probe(&["dns", name]).await?;
                assert_eq!(asked.outcome(), "dns:refused", "{name}: {:?}", asked.fields);
            }
            let upper = ALLOWED.to_uppercase();
            for name in [upper.clone(), format!("{upper}."), format!("{ALLOWED}.")] {
                let asked = sb.probe(&["dns", &name]).await?;
                assert_eq!(asked.outcome(), "dns:noerror", "the control, {name}: {:?}", asked.fields);
            }
            let addr = shared.ipv4.to_string();
            let before = shared.log().await?.len();
            for name in spellings {
                let hello = sb.probe(&["tls-hello", &addr, "443", "--sni", name]).await?;
                assert_eq!(hello.outcome(), "denied", "SNI {name}: {:?}", hello.fields);
                let request = format!("GET / HTTP/1.1\\r\\nHost: {name}\\r\\nConnection: close\\r\\n\\r\\n");
                let asked = sb.probe(&["tcp", &addr, "80", "--raw", "--send", &request]).await?;
                assert_eq!(asked.outcome(), "denied", "Host {name}: {:?}", asked.fields);
            }
            let read: Vec<String> = shared.log().await?.split_off(before);
            assert!(read.is_empty(), "the server read something of a refused connection: {read:?}");
            let hello = sb.probe(&["tls-hello", &addr, "443", "--sni", &upper]).await?;
            assert_eq!(hello.outcome(), "answered:handshake", "the control, SNI {upper}: {:?}", hello.fields);
            let request = format!("GET / HTTP/1.1\\r\\nHost: {upper}\\r\\nConnection: close\\r\\n\\r\\n");
            let asked = sb.probe(&["tcp", &addr, "80", "--raw", "--send", &request]).await?;
            let greeting = asked.fields.get("greeting").cloned().unwrap_or_default();
            assert!(greeting.starts_with("HTTP/1.1 200"), "the control, Host {upper}: {:?}", asked.fields);
            Ok(())
        }
    }
}
