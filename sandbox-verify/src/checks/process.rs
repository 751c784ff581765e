//! The process check: the agent is not root, holds no capability in any set, and cannot gain
//! one (NoNewPrivs), as its own /proc says.

use super::Run;
use crate::{Outcome, Stage, Verdict};

impl<S: Stage> Run<'_, S> {
    pub(super) async fn capabilities(&self) -> Result<Outcome, S::Error> {
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
}
