//! The checks, each run as the agent in the test world with a positive control, its evidence
//! read where it lands: one `Outcome` each, in the scorecard's order.

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use crate::{
    ALLOWED, BLOCKED, Broken, Closed, INBOUND, Outcome, PEER_LOG, QUERIES, Role, SECRETS_DIR, Stage,
    UPSTREAM, Verdict, fields,
};

/// A run of the checks on one stage.
pub(crate) struct Run<'a, S: Stage> {
    stage: &'a S,
    /// Makes this run's names and files its own.
    nanos: u128,
    /// What reached the listener under no name once the world's own controls were done, and
    /// what of it since the checks saw arrive (each a leak they failed): more at the end is a
    /// late arrival.
    baseline: Cell<usize>,
    seen: Cell<usize>,
    /// The site's TLS port's connections once the SNI check was done.
    tls_after_sni: Cell<usize>,
    /// The requests for the blocked name at the site when the checks last read its log.
    blocked_seen: Cell<usize>,
}

impl<'a, S: Stage> Run<'a, S> {
    pub(crate) fn new(stage: &'a S) -> Self {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Run {
            stage,
            nanos,
            baseline: Cell::new(0),
            seen: Cell::new(0),
            tls_after_sni: Cell::new(0),
            blocked_seen: Cell::new(0),
        }
    }

    pub(crate) async fn all(&self) -> Result<Vec<Outcome>, S::Error> {
        self.controls().await?;
        self.baseline.set(self.outside_arrivals().await?);
        let mut out = Vec::new();
        let outcome =
            |f: &HashMap<String, String>| f.get("outcome").cloned().unwrap_or_else(|| "(none)".into());
        let site_log = || self.site_log();
        let outside = self.stage.addr(Role::Outside).to_string();
        let dns = self.stage.addr(Role::Dns).to_string();

        // The control of every egress check: the allowed name, reached.
        // Counted from now: a log the image left in the peer proves nothing.
        let before = host_count(&site_log().await?, ALLOWED);
        let allowed = self.probe(&["tcp", ALLOWED, "80", "--http"]).await?;
        let reached = host_count(&site_log().await?, ALLOWED) > before;
        out.push(Outcome {
            id: "egress.allowed",
            check: "an allowed name is reachable (the control of the egress checks)",
            verdict: if reached { Verdict::Pass } else { Verdict::Fail },
            evidence: format!("{ALLOWED}:80: {}; the peer {}", outcome(&allowed), logged(reached)),
            meaning: "the allowlist lets nothing through: the agent cannot work, and the refusals below prove nothing",
        });
        // A refusal counts when nothing arrived where the evidence lands and the probe saw a
        // refusal it knows: anything else (a probe that did not run, an answer) is a FAIL.
        let control = |refused: bool, evidence: String| {
            if !reached {
                (Verdict::Fail, format!("{evidence}; but the control (the allowed name) failed"))
            } else {
                (if refused { Verdict::Pass } else { Verdict::Fail }, evidence)
            }
        };

        let before = host_count(&site_log().await?, BLOCKED);
        let blocked = self.probe(&["tcp", BLOCKED, "80", "--http"]).await?;
        let leaked = host_count(&site_log().await?, BLOCKED) > before;
        let (verdict, evidence) = control(
            !leaked && refusal(&outcome(&blocked)),
            format!("{BLOCKED}:80: {}; the peer {}", outcome(&blocked), logged(leaked)),
        );
        out.push(Outcome {
            id: "egress.blocked-name",
            check: "a name the policy does not list is refused",
            verdict,
            evidence,
            meaning: "the agent reaches names outside the allowlist",
        });

        let before = host_count(&site_log().await?, BLOCKED);
        let fronted = self.probe(&["tcp", ALLOWED, "80", "--http", "--host", BLOCKED]).await?;
        let leaked = host_count(&site_log().await?, BLOCKED) > before;
        let (verdict, evidence) = control(
            !leaked && refusal(&outcome(&fronted)),
            format!(
                "Host: {BLOCKED} to {ALLOWED}'s address: {}; the peer {}",
                outcome(&fronted),
                logged(leaked)
            ),
        );
        out.push(Outcome {
            id: "names.host",
            check: "another site's Host on an allowed address is refused",
            verdict,
            evidence,
            meaning: "any site that shares an address with an allowed one (a CDN) is reachable",
        });

        // Two requests on one connection, the second for the blocked name.
        let log = site_log().await?;
        let (allowed_before, blocked_before) = (host_count(&log, ALLOWED), host_count(&log, BLOCKED));
        let pipelined = self.probe(&["http-pipeline", ALLOWED, "80", ALLOWED, BLOCKED]).await?;
        let log = site_log().await?;
        let first = host_count(&log, ALLOWED) > allowed_before;
        let leaked = host_count(&log, BLOCKED) > blocked_before;
        out.push(Outcome {
            id: "names.second-request",
            check: "a second request on one connection, for another site, is refused",
            verdict: match (first, leaked) {
                (true, false) => Verdict::Pass,
                _ => Verdict::Fail,
            },
            evidence: format!(
                "GET for {ALLOWED}, then for {BLOCKED}, on one connection: {}; the peer logged the first {}, the second {}",
                outcome(&pipelined),
                if first { "(the control)" } else { "not at all (the control failed)" },
                if leaked { "too" } else { "not" }
            ),
            meaning: "a site that shares an address with an allowed one is reached after a first allowed request",
        });

        // The site's TLS port logs each connection as it accepts it: the control's arrives, the
        // blocked name's must not.
        let opened = |log: &str| log.lines().filter(|l| l.starts_with("open 443 ")).count();
        let before = opened(&site_log().await?);
        let hello = self.probe(&["tls-hello", ALLOWED, "443"]).await?;
        let after_control = opened(&site_log().await?);
        let fronted = self.probe(&["tls-hello", ALLOWED, "443", "--sni", BLOCKED]).await?;
        let after = opened(&site_log().await?);
        self.tls_after_sni.set(after);
        let sni_control = outcome(&hello).starts_with("answered") && after_control > before;
        let refused = refusal(&outcome(&fronted)) && after == after_control;
        out.push(Outcome {
            id: "names.sni",
            check: "another site's SNI on an allowed address is refused",
            verdict: if sni_control && refused { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "SNI {BLOCKED}: {}, the peer {}; the control, SNI {ALLOWED}: {}, {} (the peer echoes what it receives)",
                outcome(&fronted),
                if after > after_control { "accepted the connection" } else { "saw no connection" },
                outcome(&hello),
                if after_control > before { "the peer accepted it" } else { "but the peer saw no connection" }
            ),
            meaning: "TLS to any site that shares an address with an allowed one is let through",
        });

        let (mut refused, mut said, mut leaked) = (true, Vec::new(), false);
        for port in ["80", "53"] {
            let before = self.outside_arrivals().await?;
            let direct = self.probe(&["tcp", &outside, port, "--http"]).await?;
            leaked |= self.arrived_since(before).await?;
            refused &= refusal(&outcome(&direct));
            said.push(format!("{port}: {}", outcome(&direct)));
        }
        let (verdict, evidence) = control(
            !leaked && refused,
            format!(
                "TCP to {outside}, an address under no allowed name, port {}; the listener {}",
                said.join(", port "),
                logged(leaked)
            ),
        );
        out.push(Outcome {
            id: "egress.address",
            check: "an address no allowed name resolves to is refused",
            verdict,
            evidence,
            meaning: "the agent connects to any address by its number, past every name",
        });

        let (mut refused, mut said, mut leaked) = (true, Vec::new(), false);
        for port in ["9", "443"] {
            let before = self.outside_arrivals().await?;
            let udp = self.probe(&["udp", &outside, port]).await?;
            leaked |= self.arrived_since(before).await?;
            refused &= refusal(&outcome(&udp));
            said.push(format!("{port}: {}", outcome(&udp)));
        }
        let (verdict, evidence) = control(
            !leaked && refused,
            format!(
                "UDP to {outside}, port {}; the listener, which logs each datagram, {}",
                said.join(", port "),
                if leaked { "received one" } else { "received none" }
            ),
        );
        out.push(Outcome {
            id: "egress.udp",
            check: "UDP to an address outside the policy is refused",
            verdict,
            evidence,
            meaning: "datagrams leave to any address (QUIC, a tunnel)",
        });

        let before = self.outside_arrivals().await?;
        let icmp = self.probe(&["icmp", &outside]).await?;
        let leaked = self.arrived_since(before).await?;
        let (verdict, evidence) = control(
            !leaked && refusal(&outcome(&icmp)),
            format!(
                "an ICMP echo to {outside}: {}; the listener, which logs each echo request, {}",
                outcome(&icmp),
                if leaked { "received it" } else { "received none" }
            ),
        );
        out.push(Outcome {
            id: "egress.icmp",
            check: "ICMP to an address outside the policy is refused",
            verdict,
            evidence,
            meaning: "pings carry data to any address (an ICMP tunnel)",
        });

        let ipv6_meaning = "the agent leaves over IPv6, past a firewall that filters IPv4 alone";
        out.push(match self.stage.addr6(Role::Outside) {
            Some(outside6) => {
                let outside6 = outside6.to_string();
                let before = self.outside_arrivals().await?;
                let direct = self.probe(&["tcp", &outside6, "80", "--http"]).await?;
                let leaked = self.arrived_since(before).await?;
                let (verdict, evidence) = control(
                    !leaked && refusal(&outcome(&direct)),
                    format!("[{outside6}]:80: {}; the listener {}", outcome(&direct), logged(leaked)),
                );
                Outcome {
                    id: "egress.address-ipv6",
                    check: "an IPv6 address no allowed name resolves to is refused",
                    verdict,
                    evidence,
                    meaning: ipv6_meaning,
                }
            }
            None => Outcome {
                id: "egress.address-ipv6",
                check: "an IPv6 address no allowed name resolves to is refused",
                verdict: Verdict::NotApplicable,
                evidence: "the engine gave the test world's network no IPv6".into(),
                meaning: ipv6_meaning,
            },
        });

        out.push(self.inbound().await?);

        let marker = self.marker();
        let exfil = format!("{marker}.{BLOCKED}");
        let asked = self.probe(&["dns", &exfil]).await?;
        // The control: the gate asks upstream for an allowed name now (one more query of it in
        // the resolver's log) and brings back its answer.
        let upstream_asked =
            |log: &str| log.lines().filter(|l| l.starts_with(&format!("{UPSTREAM}. "))).count();
        let before = upstream_asked(&self.stage.read(Role::Dns, QUERIES).await?);
        let control_asked = self.probe(&["dns", UPSTREAM]).await?;
        let queries = self.stage.read(Role::Dns, QUERIES).await?;
        let leaked = queries.contains(&marker);
        let upstream_control = upstream_asked(&queries) > before && outcome(&control_asked) == "dns:noerror";
        out.push(Outcome {
            id: "dns.exfiltration",
            check: "a query for a name outside the policy never reaches the upstream resolver",
            verdict: if upstream_control && !leaked && refusal(&outcome(&asked)) {
                Verdict::Pass
            } else {
                Verdict::Fail
            },
            evidence: format!(
                "{exfil}: {}; the resolver {}; the control, {UPSTREAM} (allowed): {}, {}",
                outcome(&asked),
                if leaked { "logged it" } else { "never saw it" },
                outcome(&control_asked),
                if upstream_control { "asked upstream" } else { "never reached the resolver" }
            ),
            meaning: "the agent sends data out in DNS names, to whoever runs that domain's servers",
        });

        let direct_name = format!("d{marker}.{ALLOWED}");
        let direct = self.probe(&["dns", &direct_name, "--server", &dns]).await?;
        let leaked = self.stage.read(Role::Dns, QUERIES).await?.contains(&format!("d{marker}"));
        let (verdict, evidence) = control(
            !leaked && refusal(&outcome(&direct)),
            format!(
                "{direct_name} asked of {dns}:53 directly: {}; the resolver {}",
                outcome(&direct),
                if leaked { "logged it" } else { "never saw it" }
            ),
        );
        out.push(Outcome {
            id: "dns.direct",
            check: "the agent cannot query a resolver directly",
            verdict,
            evidence,
            meaning: "any DNS server is the agent's: names resolve and data leaves past the gate",
        });

        out.push(self.forged_answer(&outside).await?);
        out.push(self.capabilities().await?);
        out.push(self.tamper(&outside, reached).await?);
        out.push(self.policy_files().await?);
        out.push(self.fail_closed(&outside).await?);
        out.push(self.held_key().await?);
        self.late_arrivals(&mut out).await?;
        Ok(out)
    }

    /// A request held past its probe's timeout (by a proxy, say) would land after its check read
    /// the log. After a wait longer than any probe's, the logs are read again: a request for the
    /// blocked name at the site at all, a connection to its TLS port since the SNI check, more
    /// at the listener than the checks saw arrive, or a marker of the DNS checks at the
    /// resolver, fails the checks it could be, that had passed.
    async fn late_arrivals(&self, out: &mut [Outcome]) -> Result<(), S::Error> {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let site = self.stage.read(Role::Site, PEER_LOG).await?;
        let late_site = host_count(&site, BLOCKED) > self.blocked_seen.get();
        let late_tls = site.lines().filter(|l| l.starts_with("open 443 ")).count() > self.tls_after_sni.get();
        let late_outside = self.outside_arrivals().await? > self.baseline.get() + self.seen.get();
        let queries = self.stage.read(Role::Dns, QUERIES).await?;
        let marker = self.marker();
        let late_exfil = queries.contains(&format!("{marker}.{BLOCKED}"));
        let late_direct = queries.contains(&format!("d{marker}"));
        for o in out.iter_mut().filter(|o| o.verdict == Verdict::Pass) {
            let late = match o.id {
                "egress.blocked-name" | "names.host" | "names.second-request" => late_site,
                "names.sni" => late_tls,
                "egress.address"
                | "egress.udp"
                | "egress.icmp"
                | "egress.address-ipv6"
                | "firewall.tamper"
                | "egress.fail-closed"
                | "dns.forged-answer" => late_outside,
                "dns.exfiltration" => late_exfil,
                "dns.direct" => late_direct,
                _ => false,
            };
            if late {
                o.verdict = Verdict::Fail;
                o.evidence.push_str("; but it arrived where the check looks after the check read it");
            }
        }
        Ok(())
    }

    /// This run's DNS marker: the first label of the names the DNS checks ask.
    fn marker(&self) -> String {
        format!("x{:x}", self.nanos)
    }

    /// A listener the agent opens is not reachable from the network, by IPv4 or IPv6: the
    /// control reaches it from inside.
    async fn inbound(&self) -> Result<Outcome, S::Error> {
        let meaning = "anything on the network reaches what the agent serves (a shell, a tunnel's far end)";
        let check = "a listener of the agent's cannot be reached from the network";
        let port = INBOUND.to_string();
        let log = format!("/tmp/agent-sandbox-verify-inbound-{:x}.log", self.nanos);
        self.stage
            .as_agent_detached(&[
                self.stage.probe_path(),
                "serve",
                "--tcp",
                &port,
                "--log",
                &log,
                "--log-accepts",
            ])
            .await?;
        let mut inside = String::new();
        for _ in 0..50 {
            inside = self.as_agent(&[self.stage.probe_path(), "tcp", "127.0.0.1", &port, "--raw"]).await?;
            if inside.contains("outcome=connected") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !inside.contains("outcome=connected") {
            return Ok(Outcome {
                id: "ingress.listener",
                check,
                verdict: Verdict::Fail,
                evidence: format!(
                    "could not check: the agent's listener did not come up (the probe as the agent): {}",
                    first_line(&inside)
                ),
                meaning,
            });
        }
        // From the listener under no name and from the site (an address the policy allows), by
        // each of the sandbox's addresses; the listener logs every connection it accepts.
        let mut said = Vec::new();
        let mut reached = false;
        let targets = [Some(self.stage.addr(Role::Sandbox)), self.stage.addr6(Role::Sandbox)];
        for (peer, addr) in [Role::Outside, Role::Site]
            .into_iter()
            .flat_map(|p| targets.into_iter().flatten().map(move |a| (p, a)))
        {
            let from = self
                .stage
                .peer_exec(peer, &[self.stage.probe_path(), "tcp", &addr.to_string(), &port, "--raw"])
                .await?;
            let outcome = fields(&from).get("outcome").cloned().unwrap_or_else(|| "(none)".into());
            reached |= !refusal(&outcome);
            let to = std::net::SocketAddr::new(addr, INBOUND);
            said.push(format!(
                "{to} from {}: {outcome}",
                if peer == Role::Site { "the site" } else { "the listener" }
            ));
        }
        let accepted = self.stage.read(Role::Sandbox, &log).await?;
        let loopback = |from: &str| {
            from.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().to_canonical().is_loopback())
        };
        let from_outside = accepted
            .lines()
            .filter_map(|l| l.strip_prefix("open ")?.split_once(" from=").map(|(_, from)| from))
            .filter(|from| !loopback(from.trim()))
            .count();
        reached |= from_outside > 0;
        Ok(Outcome {
            id: "ingress.listener",
            check,
            verdict: if reached { Verdict::Fail } else { Verdict::Pass },
            evidence: format!(
                "{}; the agent's listener accepted {from_outside} connections from outside; the control, from inside: connected",
                said.join("; ")
            ),
            meaning,
        })
    }

    async fn capabilities(&self) -> Result<Outcome, S::Error> {
        let fields = self.probe(&["caps"]).await?;
        let zero = |k: &str| fields.get(k).is_some_and(|v| v.trim_start_matches('0').is_empty());
        // Real, effective, saved and filesystem ids, each not root's.
        let ids = |k: &str| {
            fields.get(k).map_or_else(String::new, |v| v.split_whitespace().collect::<Vec<_>>().join(","))
        };
        let not_root = |k: &str| {
            let all: Vec<String> =
                fields.get(k).map(|v| v.split_whitespace().map(str::to_string).collect()).unwrap_or_default();
            all.len() == 4 && all.iter().all(|id| id != "0")
        };
        let (uid, gid) = (ids("Uid"), ids("Gid"));
        let no_new = fields.get("NoNewPrivs").map(String::as_str) == Some("1");
        let sets = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
        let held: Vec<&str> = sets.iter().copied().filter(|s| !zero(s)).collect();
        let good = held.is_empty() && not_root("Uid") && not_root("Gid") && no_new;
        Ok(Outcome {
            id: "process.privileges",
            check: "the agent is not root, holds no capability, and cannot gain one (NoNewPrivs)",
            verdict: if good { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "uids {uid}; gids {gid}; capability sets {}; NoNewPrivs {}",
                if held.is_empty() {
                    "all empty".to_string()
                } else {
                    format!("{} not empty", held.join(", "))
                },
                fields.get("NoNewPrivs").map_or("unknown", String::as_str)
            ) + &fields
                .get("derived")
                .map_or(String::new(), |d| format!(" (/proc has no line for them: {d})")),
            meaning: "the agent can change the firewall, or become root through a setuid program",
        })
    }

    async fn tamper(&self, outside: &str, reached: bool) -> Result<Outcome, S::Error> {
        let flushed = self.as_agent(&["nft", "flush", "ruleset"]).await?;
        let before = self.outside_arrivals().await?;
        let again = self.probe(&["tcp", outside, "80", "--http"]).await?;
        let leaked = self.arrived_since(before).await?;
        let said = flushed.lines().next().unwrap_or("no output").trim().to_string();
        // The flush ran and the kernel refused it, and the listener is still out of reach.
        // gVisor has no nftables netlink at all: its refusal is the protocol's.
        let refused_flush = flushed.contains("Operation not permitted")
            || flushed.contains("Unable to initialize Netlink socket: Protocol not supported");
        let still = again.get("outcome").is_some_and(|o| refusal(o));
        Ok(Outcome {
            id: "firewall.tamper",
            check: "the agent cannot change the firewall",
            verdict: if refused_flush && !leaked && still && reached { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "`nft flush ruleset` as the agent: {said}; then {outside}:80: {}",
                again.get("outcome").map_or("(none)", String::as_str)
            ),
            meaning: "the agent turns the firewall off",
        })
    }

    async fn policy_files(&self) -> Result<Outcome, S::Error> {
        if !self.stage.sandbox_init() {
            return Ok(Outcome {
                id: "policy.files",
                check: "the agent cannot change the policy",
                verdict: Verdict::NotApplicable,
                evidence: "the image has no sandbox-init, and so no policy files".into(),
                meaning: "the agent widens its own allowlist",
            });
        }
        // New files of the agent's (never one verify mounted): beside the policy, and a
        // drop-in. The control: the same write to /tmp works.
        let meaning = "the agent widens its own allowlist at the next reload or start";
        let name = format!("agent-sandbox-verify-{:x}.yaml", self.nanos);
        let write = |dir: &str| format!("set -C; echo 'domains: [example.com]' > {dir}/{name} && echo WROTE");
        let control = self.as_agent(&["sh", "-c", &write("/tmp")]).await?;
        if !control.contains("WROTE") {
            return Ok(Outcome {
                id: "policy.files",
                check: "the agent cannot change the policy",
                verdict: Verdict::Fail,
                evidence: format!(
                    "could not check: the control, a write to /tmp as the agent: {}",
                    first_line(&control)
                ),
                meaning,
            });
        }
        let mut written = Vec::new();
        let mut said = Vec::new();
        for dir in ["/etc/agent-sandbox", "/etc/agent-sandbox/policy.d"] {
            let out = self.as_agent(&["sh", "-c", &write(dir)]).await?;
            let there = !self.stage.read(Role::Sandbox, &format!("{dir}/{name}")).await?.is_empty();
            if out.contains("WROTE") || there {
                written.push(dir);
            } else if !(out.contains("Permission denied") || out.contains("Read-only file system")) {
                said.push(format!("{dir}: {}", first_line(&out)));
            }
        }
        // The files already there: none may be the agent's to write (access(2), as the agent: a
        // file it owns, or one whose mode or access list lets it).
        let writable = "for f in /etc/agent-sandbox/* /etc/agent-sandbox/policy.d/*; do \
                        [ -f \"$f\" ] && [ -w \"$f\" ] && echo \"WRITABLE $f\"; done; echo LOOKED";
        let existing = self.as_agent(&["sh", "-c", writable]).await?;
        let open: Vec<&str> = existing.lines().filter_map(|l| l.strip_prefix("WRITABLE ")).collect();
        if !existing.contains("LOOKED") {
            said.push(format!("the existing files: {}", first_line(&existing)));
        }
        let verdict = if written.is_empty() && open.is_empty() && said.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        };
        Ok(Outcome {
            id: "policy.files",
            check: "the agent cannot change the policy",
            verdict,
            evidence: if !open.is_empty() {
                format!("the agent may write {}", open.join(", "))
            } else if !written.is_empty() {
                format!("the agent wrote a new file in {}", written.join(" and "))
            } else if !said.is_empty() {
                format!("could not check: {}", said.join("; "))
            } else {
                "a new file beside the policy and a new drop-in, as the agent: permission denied; no file there \
                 is the agent's to write; the control, /tmp: written"
                    .into()
            },
            meaning,
        })
    }

    /// The image without NET_ADMIN (the engine's default capabilities): it must not start an
    /// agent with an open network.
    async fn fail_closed(&self, outside: &str) -> Result<Outcome, S::Error> {
        let id = "egress.fail-closed";
        let check = "without NET_ADMIN the sandbox does not start";
        let meaning =
            "without the capability to program its firewall the sandbox runs the agent with an open network";
        let log = match self.stage.closed().await? {
            Closed::Exited { code, log } => {
                // sandbox-init's refusal (77: a capability it needs is missing) before the agent
                // ever started; any other end proves nothing.
                let refused = self.stage.sandbox_init() && code == 77 && !log.contains("sandbox ready");
                return Ok(Outcome {
                    id,
                    check,
                    verdict: if refused { Verdict::Pass } else { Verdict::Fail },
                    evidence: format!("exited {code}: {}", last_lines(&log)),
                    meaning,
                });
            }
            Closed::Running { log } => log,
        };
        let before = self.outside_arrivals().await?;
        let out = self
            .stage
            .as_agent(Role::Closed, &[self.stage.probe_path(), "tcp", outside, "80", "--http"])
            .await?;
        let leaked = self.arrived_since(before).await?;
        Ok(Outcome {
            id,
            check,
            verdict: Verdict::Fail,
            evidence: format!(
                "it runs without NET_ADMIN ({}); {outside}:80 from it: {}{}",
                last_lines(&log),
                fields(&out).get("outcome").map_or("(none)", String::as_str),
                if leaked { ", and the listener logged it" } else { "" }
            ),
            meaning,
        })
    }

    /// The agent poses as the upstream resolver: it binds the resolver's address on loopback
    /// (Docker's 127.0.0.11:53; any user may bind any port in a container) and sends a datagram
    /// from it to every ephemeral port of 127.0.0.1, so that each becomes a connection-tracking
    /// entry whose reply side is a query the gate may send; the gate's next query would then
    /// land on the agent's socket and believe its answer (the listener's address, for the
    /// allowed name).
    async fn forged_answer(&self, outside: &str) -> Result<Outcome, S::Error> {
        let id = "dns.forged-answer";
        let check = "an answer forged by the agent opens nothing";
        let meaning = "the agent makes the sandbox believe an allowed name is at an address of its choice, and connects there";
        let site = self.stage.addr(Role::Site).to_string();
        let attack = self
            .probe(&[
                "forge-dns",
                "--bind",
                "127.0.0.11:53",
                "--spray",
                "127.0.0.1",
                "--name",
                ALLOWED,
                "--answer",
                outside,
            ])
            .await?;
        let get = |k: &str| attack.get(k).map_or("(none)", String::as_str);
        if let Some(bind) = get("outcome").strip_prefix("bind:") {
            // The agent may bind no port below 1024 (gVisor, a kernel's default): the attack ends
            // at its first step. The allowed name's control is egress.allowed's.
            return Ok(Outcome {
                id,
                check,
                verdict: if refusal(bind) { Verdict::Pass } else { Verdict::Fail },
                evidence: format!("binding 127.0.0.11:53 as the agent: {bind}"),
                meaning,
            });
        }
        let before = self.outside_arrivals().await?;
        let after = self.probe(&["tcp", ALLOWED, "80", "--http"]).await?;
        let leaked = self.arrived_since(before).await?;
        let true_answer = get("answers") == site;
        let good = get("sprayed") == "0" && get("hijacked") == "0" && true_answer && !leaked;
        Ok(Outcome {
            id,
            check,
            verdict: if good { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "datagrams sprayed from port 53: {}; queries of the gate that reached the agent: {}; \
                 {ALLOWED} answered {} (the site is {site}); then {ALLOWED}:80: {}, the listener {}",
                get("sprayed"),
                get("hijacked"),
                get("answers"),
                after.get("outcome").map_or("(none)", String::as_str),
                logged(leaked)
            ),
            meaning,
        })
    }

    /// The agent hunts for the key the sandbox holds: every file it can read, every process's
    /// environment, command line and memory file (PID 1's among them). The control: root, where
    /// the keys are, finds the secret file the same way.
    async fn held_key(&self) -> Result<Outcome, S::Error> {
        let (id, check) = ("keys.held", "a held API key is invisible to the agent");
        let meaning = "the agent reads the API key and can spend it, or send it anywhere it reaches";
        let (var, key) = match self.stage.held_key() {
            Ok(held) => held,
            Err(why) => {
                return Ok(Outcome { id, check, verdict: Verdict::NotApplicable, evidence: why, meaning });
            }
        };
        let hex = |text: &str| -> String { text.bytes().map(|b| format!("{b:02x}")).collect() };
        // The hunt's own control: a decoy in the environment of a process of the agent's, which
        // the same hunt must find there.
        let decoy = format!("decoy-{:x}", self.nanos);
        let env = format!("AGENT_SANDBOX_VERIFY_DECOY={decoy}");
        self.stage.as_agent_detached(&["env", &env, "sleep", "60"]).await?;
        let mut decoy_found = false;
        for _ in 0..10 {
            let hunt = self.probe(&["find-string", &hex(&decoy), "/proc"]).await?;
            decoy_found = hunt.get("found").is_some_and(|f| f.split(',').any(|p| p.ends_with("/environ")));
            if decoy_found {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let hex = hex(&key);
        let hunt = self.probe(&["find-string", &hex, "/"]).await?;
        let secret = format!("{SECRETS_DIR}/{}", var.to_ascii_lowercase());
        let root = self
            .stage
            .peer_exec(Role::Sandbox, &[self.stage.probe_path(), "find-string", &hex, SECRETS_DIR])
            .await?;
        let control = fields(&root).get("found").is_some_and(|f| f.split(',').any(|p| p == secret));
        let found = hunt.get("found").map_or("(no answer)", String::as_str);
        let read: u64 = hunt.get("read").and_then(|r| r.parse().ok()).unwrap_or(0);
        // The hunt looked: it read a real file system's worth, and found nothing.
        let good = control && decoy_found && found.is_empty() && read >= 100;
        Ok(Outcome {
            id,
            check,
            verdict: if good { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "{var}, held as {secret}: the agent's hunt read {read} files and process memories and found it {}; \
                 the controls: root {}, and the same hunt {} a decoy in an agent process's environment",
                if found.is_empty() { "nowhere".to_string() } else { format!("in {found}") },
                if control {
                    "found the secret file".to_string()
                } else {
                    format!("did not find the secret file ({})", first_line(&root))
                },
                if decoy_found { "found" } else { "did not find" }
            ),
            meaning,
        })
    }

    /// The probe as the agent in the sandbox: its `key=value` lines.
    /// Runs the probe as the agent. A run that reported nothing at all (an exec the engine lost
    /// under load, seen under gVisor) is run once more: no report is no outcome to judge.
    async fn probe(&self, args: &[&str]) -> Result<HashMap<String, String>, S::Error> {
        let cmd = [&[self.stage.probe_path()], args].concat();
        let first = fields(&self.as_agent(&cmd).await?);
        if !first.is_empty() {
            return Ok(first);
        }
        Ok(fields(&self.as_agent(&cmd).await?))
    }

    async fn as_agent(&self, cmd: &[&str]) -> Result<String, S::Error> {
        self.stage.as_agent(Role::Sandbox, cmd).await
    }

    /// The site's log, as a check reads it: what it shows of the blocked name is what the
    /// checks saw.
    async fn site_log(&self) -> Result<String, S::Error> {
        let log = self.stage.read(Role::Site, PEER_LOG).await?;
        self.blocked_seen.set(host_count(&log, BLOCKED));
        Ok(log)
    }

    /// What has reached the listener under no name: each connection as it was accepted, each
    /// datagram and each echo request, one line each.
    async fn outside_arrivals(&self) -> Result<usize, S::Error> {
        let log = self.stage.read(Role::Outside, PEER_LOG).await?;
        Ok(log.lines().filter(|l| ["open ", "udp ", "icmp "].iter().any(|k| l.starts_with(k))).count())
    }

    /// Whether anything reached the listener since it had `before`; what did is counted as seen.
    async fn arrived_since(&self, before: usize) -> Result<bool, S::Error> {
        let now = self.outside_arrivals().await?;
        self.seen.set(self.seen.get() + now.saturating_sub(before));
        Ok(now > before)
    }

    /// The world's own controls, from the site peer as root: the listener under no name logs a
    /// request (by IPv4, and IPv6 where there is one) and answers UDP and ICMP, and the resolver
    /// answers a direct query. A world where one fails would make a refusal look like a PASS:
    /// the run stops instead.
    async fn controls(&self) -> Result<(), S::Error> {
        let probe = self.stage.probe_path();
        let field = |out: &str, key: &str| fields(out).get(key).cloned().unwrap_or_else(|| "(none)".into());
        let outside = self.stage.addr(Role::Outside).to_string();
        let mut targets = vec![outside.clone()];
        targets.extend(self.stage.addr6(Role::Outside).map(|a| a.to_string()));
        for (target, port) in targets.iter().flat_map(|t| [(t, "80"), (t, "53")]) {
            let before = self.outside_arrivals().await?;
            let out = self.stage.peer_exec(Role::Site, &[probe, "tcp", target, port, "--http"]).await?;
            if self.outside_arrivals().await? <= before {
                return Err(Broken(format!(
                    "the listener at {target}:{port} logged no connection ({})",
                    field(&out, "outcome")
                ))
                .into());
            }
        }
        // Each arrives, and the listener logs it (the UDP and ICMP checks' evidence).
        let before = self.outside_arrivals().await?;
        let udp = self.stage.peer_exec(Role::Site, &[probe, "udp", &outside, "9"]).await?;
        let icmp = self.stage.peer_exec(Role::Site, &[probe, "icmp", &outside]).await?;
        // The ICMP watcher logs beside the kernel's own reply, and may log after it arrived.
        let mut logged = false;
        for _ in 0..30 {
            logged = self.outside_arrivals().await? >= before + 2;
            if logged {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if field(&udp, "outcome") != "echoed" || field(&icmp, "outcome") != "reply" || !logged {
            return Err(Broken(format!(
                "the listener does not answer and log UDP ({}) or ICMP ({})",
                field(&udp, "outcome"),
                field(&icmp, "outcome")
            ))
            .into());
        }
        let dns = self.stage.addr(Role::Dns).to_string();
        let name = format!("control.{UPSTREAM}");
        self.stage.peer_exec(Role::Site, &[probe, "dns", &name, "--server", &dns]).await?;
        if !self.stage.read(Role::Dns, QUERIES).await?.contains(&name) {
            return Err(Broken("the resolver logged no direct query".into()).into());
        }
        Ok(())
    }
}

/// The last two lines of a log that say something.
pub(crate) fn last_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(2)..].join(" | ")
}

/// A probe's outcome that is a refusal it knows: anything else (an answer, a probe that did not
/// run, an error of its own) is not evidence of one.
pub fn refusal(outcome: &str) -> bool {
    let outcome = outcome.strip_prefix("dns:").unwrap_or(outcome);
    matches!(
        outcome,
        "refused" | "reset" | "unreachable" | "not-permitted" | "timeout" | "nxdomain" | "servfail"
    )
}

/// Requests for `name` in a peer's log: each `http` line's Host, lower-cased, its port and a
/// trailing dot taken off, compared whole.
pub fn host_count(log: &str, name: &str) -> usize {
    log.lines()
        .filter(|l| l.starts_with("http "))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("host=")))
        .map(|h| match h.rsplit_once(':') {
            Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => h,
        })
        .filter(|h| h.trim_end_matches('.').eq_ignore_ascii_case(name))
        .count()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("no output").trim()
}

fn logged(yes: bool) -> &'static str {
    if yes { "logged the request" } else { "logged nothing" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refusal_the_probe_knows_counts() {
        for outcome in
            ["refused", "reset", "timeout", "not-permitted", "unreachable", "dns:refused", "dns:nxdomain"]
        {
            assert!(refusal(outcome), "{outcome}");
        }
        for outcome in [
            "connected",
            "echoed",
            "garbled",
            "reply",
            "answered:handshake",
            "(none)",
            "error:x",
            "dns:noerror",
            "dns:malformed",
            "",
        ] {
            assert!(!refusal(outcome), "{outcome}");
        }
    }

    #[test]
    fn a_host_is_counted_however_it_is_written_and_never_by_a_longer_name() {
        let log = "http 80 host=Blocked.Verify.Test path=/\n\
                   http 80 host=blocked.verify.test:80 path=/\n\
                   http 80 host=blocked.verify.test. path=/\n\
                   http 80 host=x.blocked.verify.test path=/\n\
                   conn 80 from=1.2.3.4 bytes=3 host=blocked.verify.test\n";
        assert_eq!(host_count(log, "blocked.verify.test"), 3);
        assert_eq!(host_count(log, "verify.test"), 0);
    }
}
