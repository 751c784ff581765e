//! The DNS checks: a name outside the policy never reaches the upstream resolver (data leaves in
//! names), the agent cannot ask a resolver directly, and an answer it forges (posing as the
//! resolver on loopback) opens nothing.

use super::{Run, against_control, logged, outcome, refusal};
use crate::{ALLOWED, BLOCKED, Outcome, QUERIES, Role, Stage, UPSTREAM, Verdict};

impl<S: Stage> Run<'_, S> {
    /// A name outside the policy, this run's marker its first label: the gate must not ask the
    /// upstream resolver for it.
    pub(super) async fn exfiltration(&self) -> Result<Outcome, S::Error> {
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
        Ok(Outcome {
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
        })
    }

    /// An allowed name asked of the resolver directly, past the gate.
    pub(super) async fn direct(&self, reached: bool) -> Result<Outcome, S::Error> {
        let dns = self.stage.addr(Role::Dns).to_string();
        let marker = self.marker();
        let direct_name = format!("d{marker}.{ALLOWED}");
        let direct = self.probe(&["dns", &direct_name, "--server", &dns]).await?;
        let leaked = self.stage.read(Role::Dns, QUERIES).await?.contains(&format!("d{marker}"));
        let (verdict, evidence) = against_control(
            reached,
            !leaked && refusal(&outcome(&direct)),
            format!(
                "{direct_name} asked of {dns}:53 directly: {}; the resolver {}",
                outcome(&direct),
                if leaked { "logged it" } else { "never saw it" }
            ),
        );
        Ok(Outcome {
            id: "dns.direct",
            check: "the agent cannot query a resolver directly",
            verdict,
            evidence,
            meaning: "any DNS server is the agent's: names resolve and data leaves past the gate",
        })
    }

    /// The agent poses as the upstream resolver: it binds the resolver's address on loopback
    /// (Docker's 127.0.0.11:53; any user may bind any port in a container) and sends a datagram
    /// from it to every ephemeral port of 127.0.0.1, so that each becomes a connection-tracking
    /// entry whose reply side is a query the gate may send; the gate's next query would then
    /// land on the agent's socket and believe its answer (the listener's address, for the
    /// allowed name).
    pub(super) async fn forged_answer(&self, outside: &str) -> Result<Outcome, S::Error> {
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
}
