//! The tamper checks: the agent cannot change the firewall (`nft flush ruleset` is refused, and
//! the listener under no name stays out of reach) nor the policy (no new file beside it or among
//! its drop-ins, and none there is the agent's to write).

use super::{Run, first_line, refusal};
use crate::{Outcome, Role, Stage, Verdict};

impl<S: Stage> Run<'_, S> {
    pub(super) async fn tamper(&self, outside: &str, reached: bool) -> Result<Outcome, S::Error> {
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

    pub(super) async fn policy_files(&self) -> Result<Outcome, S::Error> {
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
}
