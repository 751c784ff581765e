//! The egress checks: the allowed name reached (the control of the others), and refused: a name
//! the policy does not list, an address under no allowed name by TCP (IPv4 and IPv6), UDP and
//! ICMP, and the image started without NET_ADMIN.

use super::{Run, against_control, host_count, last_lines, logged, outcome, refusal};
use crate::{ALLOWED, BLOCKED, Closed, Outcome, Role, Stage, Verdict, fields};

impl<S: Stage> Run<'_, S> {
    /// The control of every egress check: the allowed name, reached. Counted from now: a log the
    /// image left in the peer proves nothing.
    pub(super) async fn allowed(&self) -> Result<Outcome, S::Error> {
        let before = host_count(&self.site_log().await?, ALLOWED);
        let allowed = self.probe(&["tcp", ALLOWED, "80", "--http"]).await?;
        let reached = host_count(&self.site_log().await?, ALLOWED) > before;
        Ok(Outcome {
            id: "egress.allowed",
            check: "an allowed name is reachable (the control of the egress checks)",
            verdict: if reached { Verdict::Pass } else { Verdict::Fail },
            evidence: format!("{ALLOWED}:80: {}; the peer {}", outcome(&allowed), logged(reached)),
            meaning: "the allowlist lets nothing through: the agent cannot work, and the refusals below prove nothing",
        })
    }

    pub(super) async fn blocked_name(&self, reached: bool) -> Result<Outcome, S::Error> {
        let before = host_count(&self.site_log().await?, BLOCKED);
        let blocked = self.probe(&["tcp", BLOCKED, "80", "--http"]).await?;
        let leaked = host_count(&self.site_log().await?, BLOCKED) > before;
        let (verdict, evidence) = against_control(
            reached,
            !leaked && refusal(&outcome(&blocked)),
            format!("{BLOCKED}:80: {}; the peer {}", outcome(&blocked), logged(leaked)),
        );
        Ok(Outcome {
            id: "egress.blocked-name",
            check: "a name the policy does not list is refused",
            verdict,
            evidence,
            meaning: "the agent reaches names outside the allowlist",
        })
    }

    pub(super) async fn address(&self, outside: &str, reached: bool) -> Result<Outcome, S::Error> {
        let (mut refused, mut said, mut leaked) = (true, Vec::new(), false);
        for port in ["80", "53"] {
            let before = self.outside_arrivals().await?;
            let direct = self.probe(&["tcp", outside, port, "--http"]).await?;
            leaked |= self.arrived_since(before).await?;
            refused &= refusal(&outcome(&direct));
            said.push(format!("{port}: {}", outcome(&direct)));
        }
        let (verdict, evidence) = against_control(
            reached,
            !leaked && refused,
            format!(
                "TCP to {outside}, an address under no allowed name, port {}; the listener {}",
                said.join(", port "),
                logged(leaked)
            ),
        );
        Ok(Outcome {
            id: "egress.address",
            check: "an address no allowed name resolves to is refused",
            verdict,
            evidence,
            meaning: "the agent connects to any address by its number, past every name",
        })
    }

    pub(super) async fn udp(&self, outside: &str, reached: bool) -> Result<Outcome, S::Error> {
        let (mut refused, mut said, mut leaked) = (true, Vec::new(), false);
        for port in ["9", "443"] {
            let before = self.outside_arrivals().await?;
            let udp = self.probe(&["udp", outside, port]).await?;
            leaked |= self.arrived_since(before).await?;
            refused &= refusal(&outcome(&udp));
            said.push(format!("{port}: {}", outcome(&udp)));
        }
        let (verdict, evidence) = against_control(
            reached,
            !leaked && refused,
            format!(
                "UDP to {outside}, port {}; the listener, which logs each datagram, {}",
                said.join(", port "),
                if leaked { "received one" } else { "received none" }
            ),
        );
        Ok(Outcome {
            id: "egress.udp",
            check: "UDP to an address outside the policy is refused",
            verdict,
            evidence,
            meaning: "datagrams leave to any address (QUIC, a tunnel)",
        })
    }

    pub(super) async fn icmp(&self, outside: &str, reached: bool) -> Result<Outcome, S::Error> {
        let before = self.outside_arrivals().await?;
        let icmp = self.probe(&["icmp", outside]).await?;
        let leaked = self.arrived_since(before).await?;
        let (verdict, evidence) = against_control(
            reached,
            !leaked && refusal(&outcome(&icmp)),
            format!(
                "an ICMP echo to {outside}: {}; the listener, which logs each echo request, {}",
                outcome(&icmp),
                if leaked { "received it" } else { "received none" }
            ),
        );
        Ok(Outcome {
            id: "egress.icmp",
            check: "ICMP to an address outside the policy is refused",
            verdict,
            evidence,
            meaning: "pings carry data to any address (an ICMP tunnel)",
        })
    }

    /// N/A where the world's network has no IPv6.
    pub(super) async fn address_ipv6(&self, reached: bool) -> Result<Outcome, S::Error> {
        let ipv6_meaning = "the agent leaves over IPv6, past a firewall that filters IPv4 alone";
        Ok(match self.stage.addr6(Role::Outside) {
            Some(outside6) => {
                let outside6 = outside6.to_string();
                let before = self.outside_arrivals().await?;
                let direct = self.probe(&["tcp", &outside6, "80", "--http"]).await?;
                let leaked = self.arrived_since(before).await?;
                let (verdict, evidence) = against_control(
                    reached,
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
        })
    }

    /// The image without NET_ADMIN (the engine's default capabilities): it must not start an
    /// agent with an open network.
    pub(super) async fn fail_closed(&self, outside: &str) -> Result<Outcome, S::Error> {
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
}
