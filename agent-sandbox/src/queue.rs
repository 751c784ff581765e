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
    /// Why approving it needs a second look ([`Caution`]), a new site's or a forwarded
    /// service's: approved only with `--yes N` or through the page's dialog, which say this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caution: Option<String>,
    /// `name`: refused as not allowlisted, which `allow --pending` may approve; `upload`: an
    /// allowed name (or wildcard entry) past its upload budget, its connections refused or cut
    /// (`count`), until `allow NAME --upload SIZE` raises the budget or the hour ends;
    /// `address`: an allowed name whose answer pointed where the gate opens nothing (`caution`
    /// says where, `addresses` what): approving it would change nothing.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<Spent>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

/// A spent upload budget, as the last denial of it said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Spent {
    /// Bytes an hour.
    pub budget: u64,
    /// Bytes sent this hour when it was last refused.
    pub sent: u64,
}

/// Suffixes under which each name is a tenant of its own, as the Public Suffix List's private
/// section says of others, that the list lacks (checked against psl 2.1, 2026-11): Alibaba
/// Cloud's OSS buckets are `BUCKET.oss-REGION.aliyuncs.com`, beside DashScope's API.
const SHARED_TENANT_SUFFIXES: &[&str] = &["aliyuncs.com"];

/// The site a name belongs to: its registrable domain by the Public Suffix List, its private
/// section included, so that a shared tenant's host (`bucket.storage.googleapis.com`,
/// `me.github.io`) is a site of its own, not its provider's; a name the list does not know
/// (`x.y.test`) by its last two labels.
pub fn site(name: &str) -> String {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    for suffix in SHARED_TENANT_SUFFIXES {
        if let Some(rest) = name.strip_suffix(suffix).and_then(|r| r.strip_suffix('.')) {
            let tenant = rest.rsplit('.').next().unwrap_or(rest);
            return format!("{tenant}.{suffix}");
        }
    }
    psl::domain_str(&name).map_or(name.clone(), str::to_string)
}

/// Why approving a name needs a second look (`allow --pending --yes N`, the page's dialog).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caution {
    /// It is under the site of a service the policy forwards: approved, the agent's own
    /// connection there would carry a token of its own past the forwarder's rules.
    Forwarded { service: String, host: String },
    /// A host a bundle of the policy leaves out because it takes writes (`upload.pypi.org`):
    /// approved, it is a write channel with a token of the agent's own.
    WriteHost { service: String },
    /// No entry of the policy is under its site: a place the agent was never meant to go.
    NewSite { site: String },
}

impl Caution {
    /// What the dialog and `allow --pending` say of `name`.
    pub fn why(&self, name: &str) -> String {
        match self {
            Caution::Forwarded { service, host } => {
                let service = match service.as_str() {
                    "github" => "GitHub",
                    "npm" => "the npm registry",
                    other => other,
                };
                format!(
                    "{name} is {service}, but not through its forwarder ({host} is): a token of the \
                     agent's own works there"
                )
            }
            Caution::WriteHost { service } => format!(
                "{name} is where the {service} bundle takes writes (left out of it on purpose): approved, \
                 the agent could publish with a token of its own"
            ),
            Caution::NewSite { site } => format!("{name}: no entry of the sandbox's policy is under {site}"),
        }
    }
}

/// Whether approving `name` needs a second look under `policy`: None for another host of a
/// site the policy already reaches directly.
pub fn caution(name: &str, policy: &Policy) -> Option<Caution> {
    let folded = name.trim_end_matches('.').to_ascii_lowercase();
    let bundles = sandbox_policy::services();
    if let Some(service) =
        policy.services.iter().find(|s| bundles.get(*s).is_some_and(|b| b.writes.contains(&folded)))
    {
        return Some(Caution::WriteHost { service: service.clone() });
    }
    let site = site(name);
    if let Some(forwarded) = policy.forwarded().into_iter().find(|f| self::site(&f.host) == site) {
        return Some(Caution::Forwarded { service: forwarded.service, host: forwarded.host });
    }
    let known = policy.domains.keys().any(|pattern| match pattern {
        DomainPattern::Exact(entry) | DomainPattern::Subdomains(entry) => self::site(entry) == site,
    });
    (!known).then_some(Caution::NewSite { site })
}

/// The queue as read: names refused as not allowlisted after the mark.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Queue {
    /// Names that can be allowed, by name.
    pub names: Vec<Pending>,
    /// Upload budgets spent, and not raised since, by name.
    pub budgets: Vec<Pending>,
    /// Allowed names whose answers pointed into the user's network, at this host or its link,
    /// or at a metadata service, which no approval opens, by name.
    pub addresses: Vec<Pending>,
    /// Refused names that are not domains a policy can hold (`a_b.test`): shown, never approved.
    pub unallowable: Vec<String>,
    /// The time of the last denial read: the mark that empties the queue this far.
    pub newest: Option<String>,
}

/// The queue: names refused as not allowlisted after `after`, not allowed by `policy` now, by
/// name; each marked if no entry of `policy` is under its site.
pub fn queue(lines: &str, after: &str, policy: &Policy) -> Queue {
    let allowlist = Allowlist::new(policy);
    let mut names: BTreeMap<String, Pending> = BTreeMap::new();
    let mut budgets: BTreeMap<String, Pending> = BTreeMap::new();
    let mut addresses: BTreeMap<String, Pending> = BTreeMap::new();
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
                    caution: None,
                    kind: "upload",
                    upload: None,
                    addresses: Vec::new(),
                });
                entry.count += count;
                entry.last = time.to_string();
                entry.upload = Some(Spent { budget, sent: value["sent"].as_u64().unwrap_or(budget) });
            }
            continue;
        }
        if let (Some("dns"), Some(reason), Some(name), Some(list)) = (
            value["denied"].as_str(),
            value["reason"].as_str(),
            value["name"].as_str(),
            value["addresses"].as_array(),
        ) {
            let entry = addresses.entry(name.to_string()).or_insert_with(|| Pending {
                name: name.to_string(),
                count: 0,
                first: time.to_string(),
                last: String::new(),
                new_site: false,
                caution: Some(inward_why(reason)),
                kind: "address",
                upload: None,
                addresses: Vec::new(),
            });
            entry.count += count;
            entry.last = time.to_string();
            for addr in list.iter().filter_map(|a| a.as_str()) {
                if !entry.addresses.iter().any(|a| a == addr) && entry.addresses.len() < 8 {
                    entry.addresses.push(addr.to_string());
                }
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
        let entry = names.entry(name.to_string()).or_insert_with(|| {
            let caution = caution(name, policy);
            Pending {
                name: name.to_string(),
                count: 0,
                first: time.to_string(),
                last: String::new(),
                new_site: matches!(caution, Some(Caution::NewSite { .. })),
                caution: caution.map(|c| c.why(name)),
                kind: "name",
                upload: None,
                addresses: Vec::new(),
            }
        });
        entry.count += count;
        entry.last = time.to_string();
    }
    out.names = names.into_values().collect();
    out.budgets = budgets.into_values().collect();
    out.addresses = addresses.into_values().collect();
    out
}

/// What an answer's unopened addresses mean to the user, by the denial log's reason.
fn inward_why(reason: &str) -> String {
    match reason {
        "private address" => "answered with an address of your network: opened only for an entry with \
                              `private: true` (an internal service you name)"
            .into(),
        "metadata address" => "answered with a cloud metadata service's address: never opened by a name \
                               (a `cidrs` entry names such an address, if you must)"
            .into(),
        "local address" => "answered with a loopback or link-local address: never opened by a name".into(),
        "special address" => {
            "answered with a multicast, broadcast or reserved address: never opened by a name".into()
        }
        other => format!("answered where the gate opens nothing ({other})"),
    }
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
        let name = if p.caution.is_some() { format!("{} *", p.name) } else { p.name.clone() };
        text.push_str(&format!("{name:<width$}  {:>5}  {:<24}  {}\n", p.count, p.first, p.last));
    }
    let refusals: u64 = queue.iter().map(|p| p.count).sum();
    text.push_str(&format!("{} names, {refusals} refusals\n", queue.len()));
    let cautions: Vec<&str> = queue.iter().filter_map(|p| p.caution.as_deref()).collect();
    if !cautions.is_empty() {
        text.push_str("*: approved only with --yes N, where N counts every name approved:\n");
        for why in cautions {
            text.push_str(&format!("  {why}\n"));
        }
    }
    text
}

/// The names answered where the gate opens nothing, as `pending` prints them: apart, since
/// approving them would change nothing.
pub fn render_addresses(names: &[Pending]) -> String {
    let mut text =
        String::from("ANSWERED INTO YOUR NETWORK OR A METADATA SERVICE (no approval opens these)\n");
    for p in names {
        text.push_str(&format!(
            "{}  x{}  {}: {}\n",
            p.name,
            p.count,
            p.addresses.join(", "),
            p.caution.as_deref().unwrap_or_default()
        ));
    }
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
            r#"{"time":"2026-11-26T10:00:08.000Z","denied":"dns","name":"docs.rs","type":"A","reason":"metadata address","addresses":["169.254.169.254"]}"#,
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
        // An allowed name answered with a metadata address: apart, never approvable.
        let inward: Vec<(&str, &str, Vec<String>)> =
            read.addresses.iter().map(|p| (p.name.as_str(), p.kind, p.addresses.clone())).collect();
        assert_eq!(inward, [("docs.rs", "address", vec!["169.254.169.254".to_string()])]);
        assert!(
            render_addresses(&read.addresses)
                .contains("docs.rs  x1  169.254.169.254: answered with a cloud metadata")
        );
        insta::assert_snapshot!(render_pending(&read.names));
    }

    #[test]
    fn a_site_is_the_registrable_part_of_a_name() {
        assert_eq!(site("docs.anthropic.com"), "anthropic.com");
        assert_eq!(site("a.b.example.co.uk"), "example.co.uk");
        assert_eq!(site("localhost"), "localhost");
        assert_eq!(site("x.y.test."), "y.test");
        assert_eq!(site("Gist.GitHub.com"), "github.com");
    }

    /// A shared tenant's host is a site of its own (the Public Suffix List's private section, and
    /// the suffixes it lacks): not the provider's, whose API the policy allows.
    #[test]
    fn a_shared_tenant_is_a_site_of_its_own() {
        assert_eq!(site("bucket.storage.googleapis.com"), "storage.googleapis.com");
        assert_ne!(site("bucket.storage.googleapis.com"), site("generativelanguage.googleapis.com"));
        assert_eq!(site("me.github.io"), "me.github.io");
        assert_eq!(site("b.oss-cn-hangzhou.aliyuncs.com"), "oss-cn-hangzhou.aliyuncs.com");
        assert_eq!(site("coding.dashscope.aliyuncs.com"), "dashscope.aliyuncs.com");
    }

    /// gist.github.com is under github.com, which the policy forwards: approving it would let the
    /// agent's own token reach GitHub past the forwarder, so it needs a second look although
    /// github.com is in the policy; so do shared tenants under a bundle's provider. Another host
    /// of a site reached directly does not.
    #[test]
    fn a_forwarded_services_site_and_a_shared_tenant_need_a_second_look() {
        let policy = Policy::from_yaml(
            Path::new("p.yaml"),
            "version: 1\nservices: [github, npm, google, qwen]\ndomains: [docs.example.com]\n",
        )
        .unwrap();
        let why = |name: &str| caution(name, &policy).map(|c| c.why(name));
        assert_eq!(
            why("gist.github.com").as_deref(),
            Some(
                "gist.github.com is GitHub, but not through its forwarder (github.com is): a token of \
                 the agent's own works there"
            )
        );
        assert!(
            why("www.npmjs.org").is_some_and(|w| w.contains("the npm registry")),
            "{:?}",
            why("www.npmjs.org")
        );
        for tenant in ["bucket.storage.googleapis.com", "b.oss-cn-hangzhou.aliyuncs.com", "evil.test"] {
            assert!(matches!(caution(tenant, &policy), Some(Caution::NewSite { .. })), "{tenant}");
        }
        assert_eq!(caution("api.example.com", &policy), None);
        let pypi = Policy::from_yaml(Path::new("p.yaml"), "version: 1\nservices: [pypi]\n").unwrap();
        for upload in ["upload.pypi.org", "UPLOAD.PYPI.ORG.", "test.pypi.org"] {
            assert_eq!(
                caution(upload, &pypi),
                Some(Caution::WriteHost { service: "pypi".into() }),
                "{upload}"
            );
        }
        let direct = Policy::from_yaml(
            Path::new("p.yaml"),
            "version: 1\nservices: [github]\nforward: {github: {direct: true}}\n",
        )
        .unwrap();
        assert_eq!(
            caution("gist.github.com", &direct),
            None,
            "github is direct there: no forwarder to bypass"
        );
    }
}
