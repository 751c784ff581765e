//! The approval queue, pure: the names the agent was refused and the upload budgets it spent,
//! read from sandbox-init's denial log against the sandbox's policy, and as `pending` prints
//! them (approve.rs reads the log and the marks from the sandbox).

use std::collections::BTreeMap;

use sandbox_policy::{Allowlist, DomainPattern, Policy};
use serde::Serialize;

/// One name in the approval queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pending {
    pub name: String,
    /// Queries refused (folded repeats counted).
    pub count: u64,
    pub first: String,
    pub last: String,
    /// No entry of the sandbox's policy is under the same site (`example.com` of
    /// `docs.example.com`): a place the agent was never meant to go, rather than another host
    /// of a service it uses.
    pub new_site: bool,
    /// `name`: refused as not allowlisted, which `allow --pending` may approve; `upload`: an
    /// allowed name (or wildcard entry) past its upload budget, its connections refused or cut
    /// (`count`), until `allow NAME --upload SIZE` raises the budget or the hour ends.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<Spent>,
}

/// A spent upload budget, as the last denial of it said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Spent {
    /// Bytes an hour.
    pub budget: u64,
    /// Bytes sent this hour when it was last refused.
    pub sent: u64,
}

/// The site a name belongs to, roughly its registrable domain: the last two labels, or three
/// under a country's generic second level (`example.co.uk`).
fn site(name: &str) -> String {
    let labels: Vec<&str> = name.trim_end_matches('.').split('.').collect();
    let generic = ["co", "com", "net", "org", "gov", "ac", "edu"];
    let take = match labels.as_slice() {
        [.., second, tld] if tld.len() == 2 && generic.contains(second) => 3,
        _ => 2,
    };
    labels[labels.len().saturating_sub(take)..].join(".").to_ascii_lowercase()
}

/// The queue as read: names refused as not allowlisted after the mark.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Queue {
    /// Names that can be allowed, by name.
    pub names: Vec<Pending>,
    /// Upload budgets spent, and not raised since, by name.
    pub budgets: Vec<Pending>,
    /// Refused names that are not domains a policy can hold (`a_b.test`): shown, never approved.
    pub unallowable: Vec<String>,
    /// The time of the last denial read: the mark that empties the queue this far.
    pub newest: Option<String>,
}

/// The queue: names refused as not allowlisted after `after`, not allowed by `policy` now, by
/// name; each marked if no entry of `policy` is under its site.
pub fn queue(lines: &str, after: &str, policy: &Policy) -> Queue {
    let allowlist = Allowlist::new(policy);
    let sites: std::collections::BTreeSet<String> = policy
        .domains
        .keys()
        .map(|pattern| match pattern {
            DomainPattern::Exact(name) | DomainPattern::Subdomains(name) => site(name),
        })
        .collect();
    let mut names: BTreeMap<String, Pending> = BTreeMap::new();
    let mut budgets: BTreeMap<String, Pending> = BTreeMap::new();
    let mut out = Queue::default();
    for line in lines.lines() {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let Some(time) = value["time"].as_str() else { continue };
        if time <= after {
            continue;
        }
        if out.newest.as_deref().is_none_or(|n| time > n) {
            out.newest = Some(time.to_string());
        }
        let count = 1 + value["repeats"].as_u64().unwrap_or(0);
        if let (Some("upload"), Some(name), Some(budget)) =
            (value["denied"].as_str(), value["name"].as_str(), value["budget"].as_u64())
        {
            if budget_now(policy, &allowlist, name).is_some_and(|now| now <= budget) {
                let entry = budgets.entry(name.to_string()).or_insert_with(|| Pending {
                    name: name.to_string(),
                    count: 0,
                    first: time.to_string(),
                    last: String::new(),
                    new_site: false,
                    kind: "upload",
                    upload: None,
                });
                entry.count += count;
                entry.last = time.to_string();
                entry.upload = Some(Spent { budget, sent: value["sent"].as_u64().unwrap_or(budget) });
            }
            continue;
        }
        let (Some("dns"), Some("not allowlisted"), Some(name)) =
            (value["denied"].as_str(), value["reason"].as_str(), value["name"].as_str())
        else {
            continue;
        };
        if allowlist.matches(name).is_some() {
            continue;
        }
        if DomainPattern::parse(name).is_err() {
            if !out.unallowable.iter().any(|n| n == name) {
                out.unallowable.push(name.to_string());
            }
            continue;
        }
        let entry = names.entry(name.to_string()).or_insert_with(|| Pending {
            name: name.to_string(),
            count: 0,
            first: time.to_string(),
            last: String::new(),
            new_site: !sites.contains(&site(name)),
            kind: "name",
            upload: None,
        });
        entry.count += count;
        entry.last = time.to_string();
    }
    out.names = names.into_values().collect();
    out.budgets = budgets.into_values().collect();
    out
}

/// The upload budget `policy` gives what a spent budget was counted for (a name, or the
/// wildcard entry whose names share one); None if it no longer allows it.
pub fn budget_now(policy: &Policy, allowlist: &Allowlist, counted: &str) -> Option<u64> {
    match DomainPattern::parse(counted).ok()? {
        DomainPattern::Exact(name) => allowlist.matches(&name).map(|m| m.access.upload_budget()),
        wildcard => policy.domains.get(&wildcard).map(|access| access.upload_budget()),
    }
}

/// The queue as `pending` prints it: by name, a mark on names under a site no entry of the
/// policy is under, the total.
pub fn render_pending(queue: &[Pending]) -> String {
    let width = queue.iter().map(|p| p.name.len()).max().unwrap_or(0).max(4) + 2;
    let mut text = format!("{:<width$}  {:>5}  {:<24}  LAST REFUSED\n", "NAME", "COUNT", "FIRST REFUSED");
    for p in queue {
        let name = if p.new_site { format!("{} *", p.name) } else { p.name.clone() };
        text.push_str(&format!("{name:<width$}  {:>5}  {:<24}  {}\n", p.count, p.first, p.last));
    }
    let refusals: u64 = queue.iter().map(|p| p.count).sum();
    text.push_str(&format!("{} names, {refusals} refusals", queue.len()));
    if queue.iter().any(|p| p.new_site) {
        text.push_str("; *: no entry of the sandbox's policy is under the same site");
    }
    text.push('\n');
    text
}

/// The spent upload budgets as `pending` prints them.
pub fn render_budgets(budgets: &[Pending]) -> String {
    let width = budgets.iter().map(|p| p.name.len()).max().unwrap_or(0).max(19) + 2;
    let mut text = format!(
        "{:<width$}  {:>5}  {:>14}  {:>14}  LAST REFUSED OR CUT\n",
        "UPLOAD BUDGET SPENT", "COUNT", "BUDGET/HOUR", "SENT"
    );
    for p in budgets {
        let Spent { budget, sent } = p.upload.unwrap_or(Spent { budget: 0, sent: 0 });
        text.push_str(&format!("{:<width$}  {:>5}  {budget:>14}  {sent:>14}  {}\n", p.name, p.count, p.last));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_queue_counts_refused_names_after_the_mark_and_skips_allowed_ones() {
        let lines = [
            r#"{"time":"2026-11-26T10:00:00.000Z","denied":"dns","name":"old.test","type":"A","reason":"not allowlisted"}"#,
            r#"{"time":"2026-11-26T10:00:01.000Z","denied":"dns","name":"evil.test","type":"A","reason":"not allowlisted"}"#,
            r#"{"time":"2026-11-26T10:00:02.000Z","denied":"dns","name":"docs.rs","type":"AAAA","reason":"not allowlisted"}"#,
            r#"{"time":"2026-11-26T10:00:03.000Z","denied":"dns","name":"evil.test","type":"A","reason":"not allowlisted","repeats":4}"#,
            r#"{"time":"2026-11-26T10:00:04.000Z","denied":"dns","name":"a.b.test","type":"TXT","reason":"query type"}"#,
            r#"{"time":"2026-11-26T10:00:04.500Z","denied":"dns","name":"under_score.test","type":"A","reason":"not allowlisted"}"#,
            r#"{"time":"2026-11-26T10:00:05.000Z","denied":"connection","protocol":"tcp","address":"192.0.2.1","port":443}"#,
            r#"{"time":"2026-11-26T10:00:06.000Z","denied":"dns","name":"later.test","type":"A","reason":"not allowlisted"}"#,
            r#"{"time":"2026-11-26T10:00:07.000Z","denied":"upload","name":"docs.rs","budget":1000,"sent":1200,"reason":"upload budget","repeats":2}"#,
            r#"{"time":"2026-11-26T10:00:07.500Z","denied":"upload","name":"raised.test","budget":1000,"sent":1000,"reason":"upload budget"}"#,
            r#"{"time":"2026-11-26T10:00:08.000Z","denied":"upload","name":"gone.test","budget":1000,"sent":1000,"reason":"upload budget"}"#,
            "not json",
        ]
        .join("\n");
        let policy = Policy::from_list(
            Path::new("x.txt"),
            "docs.rs upload=1000\nwww.later.test\nraised.test upload=2000\n",
        )
        .unwrap();
        let read = queue(&lines, "2026-11-26T10:00:00.000Z", &policy);
        let names: Vec<(&str, u64, bool)> =
            read.names.iter().map(|p| (p.name.as_str(), p.count, p.new_site)).collect();
        assert_eq!(names, [("evil.test", 6, true), ("later.test", 1, false)], "by name, new sites marked");
        assert_eq!(
            (read.names[0].first.as_str(), read.names[0].last.as_str()),
            ("2026-11-26T10:00:01.000Z", "2026-11-26T10:00:03.000Z")
        );
        assert_eq!(read.newest.as_deref(), Some("2026-11-26T10:00:08.000Z"));
        // A spent budget is listed until a policy raises it (raised.test) or no longer allows
        // the name (gone.test).
        let spent: Vec<(&str, u64, Option<Spent>)> =
            read.budgets.iter().map(|p| (p.name.as_str(), p.count, p.upload)).collect();
        assert_eq!(spent, [("docs.rs", 3, Some(Spent { budget: 1000, sent: 1200 }))]);
        insta::assert_snapshot!("budgets", render_budgets(&read.budgets));
        assert_eq!(read.unallowable, ["under_score.test"]);
        insta::assert_snapshot!(render_pending(&read.names));
    }

    #[test]
    fn a_site_is_the_registrable_part_of_a_name() {
        assert_eq!(site("docs.anthropic.com"), "anthropic.com");
        assert_eq!(site("a.b.example.co.uk"), "example.co.uk");
        assert_eq!(site("localhost"), "localhost");
        assert_eq!(site("x.y.test."), "y.test");
    }
}
