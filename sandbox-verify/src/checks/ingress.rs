//! The ingress check: a listener the agent opens cannot be reached from the network, by IPv4 or
//! IPv6, from a peer under no name or from an allowed site.

use std::time::Duration;

use super::{Run, first_line, refusal};
use crate::{INBOUND, Outcome, Role, Stage, Verdict, fields};

impl<S: Stage> Run<'_, S> {
    /// A listener the agent opens is not reachable from the network, by IPv4 or IPv6: the
    /// control reaches it from inside.
    pub(super) async fn inbound(&self) -> Result<Outcome, S::Error> {
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
}
