//! Attacks on sidecar mode's own boundaries: the agent's container, which holds no capability,
//! against the gateway beside it (sandbox-init's `gateway` role, with NET_ADMIN, in the same
//! network namespace). Root in the agent's container is the agent too: gVisor's sentry sends
//! everything as uid 0, and a user may run the container as root.

use sandbox_tests::assert::{assert_blocked, assert_reaches, assert_unprivileged, processes};
use sandbox_tests::peers::{Peer, ResolvedNet};
use sandbox_tests::probe::{PROBE, Probe};
use sandbox_tests::sandbox::Sandbox;
use sandbox_tests::spec::SandboxSpec;

use super::ALLOWED;

const BLOCKED: &str = "blocked.test";

/// A pair allowing ALLOWED on a network whose DNS peer (the gateway's `SANDBOX_DNS`) answers
/// both names with the allowed peer's address, and a second peer no name leads to.
async fn pair(test: &str) -> anyhow::Result<(ResolvedNet, Peer, Sandbox)> {
    let world = ResolvedNet::start(test, &[ALLOWED, BLOCKED]).await?;
    let other = Peer::start(&world.net, &[&format!("{test}-other")]).await?;
    let sb = SandboxSpec::smallest()
        .await?
        .sidecar()
        .resolving_through(&world, &format!("{ALLOWED}\n"))
        .start()
        .await?;
    Ok((world, other, sb))
}

/// The probe run as root in the agent's container (`docker exec -u 0`): uid 0 without any
/// capability, as gVisor's sentry and an agent container run as root are.
async fn probe_as_root(sb: &Sandbox, args: &[&str]) -> anyhow::Result<Probe> {
    let mut cmd = vec![PROBE];
    cmd.extend_from_slice(args);
    Probe::from_output(args, sb.exec_agent_side_as("0", &cmd).await?)
}

/// How many processes of the gateway run as `uid`.
async fn processes_of(sb: &Sandbox, uid: &str) -> anyhow::Result<usize> {
    let all = processes(sb).await?;
    Ok(all
        .iter()
        .filter(|p| !p.pid.starts_with("agent:"))
        .filter(|p| p.fields.get("Uid").is_some_and(|u| u.starts_with(&format!("{uid} "))))
        .count())
}

net_admin! {
    [single, gvisor] {
        #[tokio::test]
        async fn the_agents_container_holds_no_capability_and_reaches_none_of_the_gateways_processes_or_files()
        -> anyhow::Result<()> {
            let (_world, _other, sb) = pair("sidecar-boundary").await?;
            let theirs = sb.exec_agent_side(&["sh", "-c", "cat /proc/[0-9]*/status"]).await?.stdout;
            // Every process of the agent's container, its PID 1 included, is the agent, unprivileged.
            let all = processes(&sb).await?;
            let agent_side: Vec<_> = all.iter().filter(|p| p.pid.starts_with("agent:")).collect();
            assert!(agent_side.iter().any(|p| p.pid == "agent:1" && p.name == "sandbox-init"), "{agent_side:?}");
            for p in &agent_side {
                assert_unprivileged(p);
            }
            // Root there is root without any capability either.
            let root = sb
                .exec_agent_side_as("0", &["sh", "-c", "grep -E '^(Uid|Cap(Prm|Eff|Bnd|Amb))' /proc/self/status"])
                .await?;
            // (gVisor reports no ambient set: N/A there.)
            let sets: &[&str] = if sb.under_gvisor() {
                &["CapPrm", "CapEff", "CapBnd"]
            } else {
                &["CapPrm", "CapEff", "CapBnd", "CapAmb"]
            };
            for set in sets {
                assert!(root.stdout.contains(&format!("{set}:\t0000000000000000")), "{set}: {root:?}");
            }
            // The gateway's processes (its PID 1, the name check) are in another PID namespace: the
            // agent sees none of them. The control: the gateway sees its checker.
            assert!(!theirs.contains("65533"), "a process of the checker's uid in the agent's container");
            let gateways = processes_of(&sb, "65533").await?;
            assert_eq!(gateways, 1, "the gateway runs the name check");
            // The shared folder is read-only to the agent and to root beside it; the gateway writes it.
            for user in ["1000", "0"] {
                let write = sb
                    .exec_agent_side_as(
                        user,
                        &["sh", "-c", "echo x >> /run/agent-sandbox/shared/gateway-ready; echo $?"],
                    )
                    .await?;
                assert_ne!(write.stdout.trim(), "0", "uid {user} wrote the gateway's file: {write:?}");
            }
            let control =
                sb.exec(&["sh", "-c", "test -w /run/agent-sandbox/shared/gateway-ready && echo writable"]).await?;
            assert_eq!(control.stdout.trim(), "writable", "{control:?}");
            // The policy, the firewall and the logs are the gateway's: not in the agent's container.
            let look = sb
                .exec_agent_side_as(
                    "0",
                    &[
                        "sh",
                        "-c",
                        "ls /etc/agent-sandbox/policy.d; ls /run/agent-sandbox; nft list ruleset; echo nft=$?",
                    ],
                )
                .await?;
            assert!(!look.stdout.contains("resolved.txt") && !look.stdout.contains("denials.jsonl"), "{look:?}");
            // Refused (1), or no netfilter socket at all under gVisor (3).
            assert!(["nft=1", "nft=3"].iter().any(|code| look.stdout.contains(code)), "{look:?}");
            let control = sb.exec(&["sh", "-c", "ls /etc/agent-sandbox/policy.d /run/agent-sandbox"]).await?;
            assert!(control.stdout.contains("resolved.txt") && control.stdout.contains("status.json"), "{control:?}");
            Ok(())
        }
        #[tokio::test]
        async fn root_in_the_agents_container_is_held_as_the_agent_is() -> anyhow::Result<()> {
            let (world, other, sb) = pair("sidecar-root").await?;
            // The control: root reaches the allowed name as the agent does, through the name check.
            let allowed = probe_as_root(&sb, &["tcp", ALLOWED, "443"]).await?;
            assert_eq!(allowed.outcome(), "connected", "{:?}", allowed.fields);
            let blocked = probe_as_root(&sb, &["tcp", BLOCKED, "443", "--timeout-ms", "3000"]).await?;
            assert_eq!(blocked.outcome(), "dns:refused", "{:?}", blocked.fields);
            let by_address =
                probe_as_root(&sb, &["tcp", &other.ipv4.to_string(), "443", "--timeout-ms", "3000"]).await?;
            assert_eq!(by_address.outcome(), "refused", "{:?}", by_address.fields);
            // Straight to the resolver the gate asks, and to Docker's: uid 0 is not the gate's uid.
            let resolver = world.dns.ipv4.to_string();
            for server in [resolver.as_str(), "127.0.0.11"] {
                let direct =
                    probe_as_root(&sb, &["dns", "exfil.attacker.test", "--server", server, "--timeout-ms", "1000"])
                        .await?;
                assert_eq!(direct.outcome(), "dns:not-permitted", "{server}: {:?}", direct.fields);
            }
            assert!(
                world.dns.dns_queries().await?.iter().all(|q| !q.contains("exfil")),
                "a query of root's reached the resolver"
            );
            Ok(())
        }
        #[tokio::test]
        async fn a_killed_gateway_leaves_the_agent_no_network_and_its_restart_brings_it_back() -> anyhow::Result<()> {
            let (world, other, sb) = pair("sidecar-kill").await?;
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            let address = world.peer.ipv4.to_string();
            sb.signal("KILL").await?;
            anyhow::ensure!(sb.exit_code().await?.is_some(), "the gateway still runs after SIGKILL");
            // Neither the name nor the address it had: no gate answers, no checker relays.
            let by_name = sb.probe(&["tcp", ALLOWED, "443", "--timeout-ms", "3000"]).await?;
            assert_ne!(by_name.outcome(), "connected", "{:?}", by_name.fields);
            let by_address = sb.probe(&["tcp", &address, "443", "--timeout-ms", "3000"]).await?;
            assert_ne!(by_address.outcome(), "connected", "{:?}", by_address.fields);
            let blocked = sb.probe(&["tcp", &other.ipv4.to_string(), "443", "--timeout-ms", "3000"]).await?;
            assert_ne!(blocked.outcome(), "connected", "{:?}", blocked.fields);
            // The session lived on; the gateway comes back into the same namespace, and so does egress.
            sb.start_again().await?;
            sb.wait_for_stdout("sandbox ready", 2).await?;
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            assert_blocked(&sb, &format!("{BLOCKED}:443")).await?;
            let session = sb.as_agent(&["tmux", "has-session", "-t", "agent"]).await?;
            assert_eq!(session.code, 0, "the agent's session ended with its gateway: {session:?}");
            Ok(())
        }
        /// The agent ends its own container (its PID 1 is the agent's) and has it started again, its
        /// gateway killed first (the worst case): a fresh network namespace would have no table. It
        /// joins the holder's again, where the table stays, so until the gateway is back it has no
        /// network (a process run there meanwhile, a `docker exec`, is held too) and no session; the
        /// gateway started again brings both.
        #[tokio::test]
        async fn the_agents_container_started_again_is_held_by_its_gateways_table_until_the_gateway_is_back()
        -> anyhow::Result<()> {
            let (world, other, sb) = pair("sidecar-again").await?;
            let docker = sandbox_tests::docker::docker().await?;
            let logs = || sandbox_tests::docker::container_logs(sb.id());
            let readies = |stdout: &str| stdout.lines().filter(|l| l.starts_with("sandbox ready:")).count();
            sb.signal("KILL").await?;
            anyhow::ensure!(sb.exit_code().await?.is_some(), "the gateway still runs after SIGKILL");
            let killed = sb.as_agent(&["sh", "-c", "kill -TERM 1"]).await?;
            assert_eq!(killed.code, 0, "{killed:?}");
            for _ in 0..100 {
                let state = docker.inspect_container(sb.id(), None).await?.state.unwrap_or_default();
                if state.running == Some(false) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            docker.start_container(sb.id(), None::<bollard::query_parameters::StartContainerOptions>).await?;
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            let (stdout, stderr) = logs().await?;
            assert_eq!(readies(&stdout), 1, "a session started again without a gateway: {stdout}\n{stderr}");
            assert!(stderr.contains("waiting for the gateway's firewall"), "{stderr}");
            // A process run there meanwhile, as the container's user: the table holds it.
            for target in [world.peer.ipv4, other.ipv4] {
                let probe = Probe::from_output(
                    &[],
                    sb.exec_agent_side(&[PROBE, "tcp", &target.to_string(), "443", "--timeout-ms", "2000"]).await?,
                )?;
                assert_ne!(probe.outcome(), "connected", "{target} from the restarted container: {:?}", probe.fields);
            }
            // The control: the gateway started again, the session starts, behind it.
            sb.start_again().await?;
            for _ in 0..100 {
                if readies(&logs().await?.0) == 2 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            let (stdout, stderr) = logs().await?;
            assert_eq!(readies(&stdout), 2, "{stdout}\n{stderr}");
            assert_reaches(&sb, &format!("{ALLOWED}:443")).await?;
            assert_blocked(&sb, &format!("{}:443", other.ipv4)).await?;
            Ok(())
        }
    }
}
