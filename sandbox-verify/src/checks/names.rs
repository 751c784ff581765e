//! The name checks: another site on an allowed address is refused, whether it is named by the
//! Host of a first request or of a second on the same connection, or by TLS's SNI.

use super::{Run, against_control, host_count, logged, outcome, refusal};
use crate::{ALLOWED, BLOCKED, Outcome, Stage, Verdict};

impl<S: Stage> Run<'_, S> {
    pub(super) async fn host(&self, reached: bool) -> Result<Outcome, S::Error> {
        let before = host_count(&self.site_log().await?, BLOCKED);
        let fronted = self.probe(&["tcp", ALLOWED, "80", "--http", "--host", BLOCKED]).await?;
        let leaked = host_count(&self.site_log().await?, BLOCKED) > before;
        let (verdict, evidence) = against_control(
            reached,
            !leaked && refusal(&outcome(&fronted)),
            format!(
                "Host: {BLOCKED} to {ALLOWED}'s address: {}; the peer {}",
                outcome(&fronted),
                logged(leaked)
            ),
        );
        Ok(Outcome {
            id: "names.host",
            check: "another site's Host on an allowed address is refused",
            verdict,
            evidence,
            meaning: "any site that shares an address with an allowed one (a CDN) is reachable",
        })
    }

    /// Two requests on one connection, the second for the blocked name.
    pub(super) async fn second_request(&self) -> Result<Outcome, S::Error> {
        let log = self.site_log().await?;
        let (allowed_before, blocked_before) = (host_count(&log, ALLOWED), host_count(&log, BLOCKED));
        let pipelined = self.probe(&["http-pipeline", ALLOWED, "80", ALLOWED, BLOCKED]).await?;
        let log = self.site_log().await?;
        let first = host_count(&log, ALLOWED) > allowed_before;
        let leaked = host_count(&log, BLOCKED) > blocked_before;
        Ok(Outcome {
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
        })
    }

    /// The site's TLS port logs each connection as it accepts it: the control's arrives, the
    /// blocked name's must not.
    pub(super) async fn sni(&self) -> Result<Outcome, S::Error> {
        let opened = |log: &str| log.lines().filter(|l| l.starts_with("open 443 ")).count();
        let before = opened(&self.site_log().await?);
        let hello = self.probe(&["tls-hello", ALLOWED, "443"]).await?;
        let after_control = opened(&self.site_log().await?);
        let fronted = self.probe(&["tls-hello", ALLOWED, "443", "--sni", BLOCKED]).await?;
        let after = opened(&self.site_log().await?);
        self.tls_after_sni.set(after);
        let sni_control = outcome(&hello).starts_with("answered") && after_control > before;
        let refused = refusal(&outcome(&fronted)) && after == after_control;
        Ok(Outcome {
            id: "names.sni",
            check: "another site's SNI on an allowed address is refused",
            verdict: if sni_control && refused { Verdict::Pass } else { Verdict::Fail },
            evidence: format!(
                "SNI {BLOCKED}: {}, the peer {}; the control, SNI {ALLOWED}: {}, {} (the peer echoes what it receives)",
                outcome(&fronted),
                if after > after_control { "accepted the connection" } else { "saw no connection" },
                outcome(&hello),
                if after_control > before {
                    "the peer accepted it"
                } else {
                    "but the peer saw no connection"
                }
            ),
            meaning: "TLS to any site that shares an address with an allowed one is let through",
        })
    }
}
