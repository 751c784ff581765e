//! The checks, each run as the agent in the test world with a positive control, its evidence
//! read where it lands: one `Outcome` each, in the scorecard's order. Here the run and what the
//! checks share (the world's own controls, the probe as the agent, the logs read back, the late
//! arrivals); each family of checks is a module of its own.

mod dns;
mod egress;
mod ingress;
mod keys;
mod names;
mod process;
mod tamper;

use std::cell::Cell;
use std::collections::HashMap;
use std::time::Duration;

use crate::{BLOCKED, Broken, Outcome, PEER_LOG, QUERIES, Role, Stage, UPSTREAM, Verdict, fields};

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
        let outside = self.stage.addr(Role::Outside).to_string();
        // The control of every egress check: the allowed name, reached.
        let allowed = self.allowed().await?;
        let reached = allowed.verdict == Verdict::Pass;
        let mut out = vec![
            allowed,
            self.blocked_name(reached).await?,
            self.host(reached).await?,
            self.second_request().await?,
            self.sni().await?,
            self.address(&outside, reached).await?,
            self.udp(&outside, reached).await?,
            self.icmp(&outside, reached).await?,
            self.address_ipv6(reached).await?,
            self.inbound().await?,
            self.exfiltration().await?,
            self.direct(reached).await?,
            self.forged_answer(&outside).await?,
            self.capabilities().await?,
            self.tamper(&outside, reached).await?,
            self.policy_files().await?,
            self.fail_closed(&outside).await?,
            self.held_key().await?,
        ];
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

/// What the probe said happened: its `outcome` field.
fn outcome(fields: &HashMap<String, String>) -> String {
    fields.get("outcome").cloned().unwrap_or_else(|| "(none)".into())
}

/// A refusal counts when nothing arrived where the evidence lands and the probe saw a refusal it
/// knows (`refused`): anything else (a probe that did not run, an answer) is a FAIL, and so is
/// every refusal while the control of the egress checks (`reached`: the allowed name) failed.
fn against_control(reached: bool, refused: bool, evidence: String) -> (Verdict, String) {
    if !reached {
        (Verdict::Fail, format!("{evidence}; but the control (the allowed name) failed"))
    } else {
        (if refused { Verdict::Pass } else { Verdict::Fail }, evidence)
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
        "refused"
            | "denied"
            | "reset"
            | "unreachable"
            | "not-permitted"
            | "timeout"
            | "nxdomain"
            | "servfail"
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
        for outcome in [
            "refused",
            "denied",
            "reset",
            "timeout",
            "not-permitted",
            "unreachable",
            "dns:refused",
            "dns:nxdomain",
        ] {
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
