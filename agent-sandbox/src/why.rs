//! `agent-sandbox why S NAME|URL…`: whether a running sandbox's agent reaches each target, and
//! why not. What its policy in force says (`policy::judge`, the sandbox's own rules), and what
//! the sandbox recorded that the policy alone does not say (its denial log, read as `pending`
//! reads it): an upload budget spent, an answer that pointed into the user's network, how often
//! and when the name was refused.

use sandbox_policy::{Allowlist, Policy};
use sandbox_wire::namecheck::budgets::budget_of;

use crate::exit::{Code, Failure, Result};
use crate::flags::WhyFlags;
use crate::policy::{Answer, Host, Target, judge, show, targets};
use crate::queue::{Queue, Spent};

pub async fn run(flags: &WhyFlags) -> Result<i32> {
    let targets = targets(&flags.targets, true).map_err(|e| Failure::new(Code::BadArgument, e))?;
    let sandbox = crate::engine::Engine::connect().await?.find(&flags.which.sandbox).await?;
    sandbox.ensure_running()?;
    let (policy, record) = crate::approve::record(&sandbox).await?;
    let running = crate::policy::running(&sandbox).await?;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let answers: Vec<Answer> = targets
        .iter()
        .map(|t| {
            let answer =
                seen(judge(&policy, t, Some(&sandbox.name), None), t, &policy, &record, &sandbox.name, now);
            running.over(t, answer)
        })
        .collect();
    show(&answers, flags.json);
    Ok(if answers.iter().all(|a| a.allowed) { 0 } else { 1 })
}

/// A budget is counted by the hour: one spent longer ago than this has refilled.
const BUDGET_HOUR: i64 = 3600;

/// `answer`, the policy's, with what the sandbox recorded of `target`'s name, `now` seconds
/// since the epoch: an upload budget spent within the hour refuses what the policy allows (on
/// the ports a budget counts: checked TCP, not the forwarder's, not opaque); an answer that
/// pointed where the gate opens nothing is said; a name the gate refused says how often, and
/// when last.
pub fn seen(
    mut answer: Answer,
    target: &Target,
    policy: &Policy,
    record: &Queue,
    sandbox: &str,
    now: i64,
) -> Answer {
    let Host::Name(name) = &target.host else { return answer };
    let allowlist = Allowlist::new(policy);
    let matched = allowlist.matches(name);
    if answer.allowed
        && let Some(m) = matched
            .as_ref()
            .filter(|m| !allowlist.is_forwarded(name) && !m.access.opaque.contains(&target.port))
    {
        let (key, _) = budget_of(name, m);
        let spent = record.budgets.iter().find(|p| p.name == key);
        let within = spent.filter(|p| crate::clock::epoch_of(&p.last).is_some_and(|t| now - t < BUDGET_HOUR));
        if let Some(p) = within {
            let Spent { budget, sent } = p.upload.unwrap_or(Spent { budget: 0, sent: 0 });
            answer.allowed = false;
            answer.reason = format!(
                "{}; but its upload budget of {budget} bytes an hour ({key}) was spent: {sent} bytes sent, \
                 {} connection(s) refused or cut, the last at {}. It refills within the hour from then",
                answer.reason, p.count, p.last
            );
            answer.change =
                Some(format!("agent-sandbox allow {sandbox} {name} --upload SIZE (above {budget})"));
        } else if let Some(p) = spent {
            answer.reason = format!(
                "{}; its upload budget ({key}) was spent at {}, over an hour ago: refilled",
                answer.reason, p.last
            );
        }
    }
    if let Some(p) = record.addresses.iter().find(|p| &p.name == name) {
        let now_private = matched.as_ref().is_some_and(|m| m.access.private);
        let opened_now = |a: &String| {
            a.parse().is_ok_and(|addr| {
                policy.cidr_allows(addr, target.port)
                    || now_private
                        && sandbox_policy::address::scope(addr) == sandbox_policy::address::Scope::Private
            })
        };
        if !p.addresses.iter().all(opened_now) {
            answer.reason = format!(
                "{}; note: its DNS answer pointed at {} ({} time(s), the last at {}): {}. Where an answer \
                 holds only such addresses, the agent reaches nothing",
                answer.reason,
                p.addresses.join(", "),
                p.count,
                p.last,
                p.caution.as_deref().unwrap_or("an address the gate opens nothing for")
            );
        }
    }
    if !answer.allowed
        && let Some(p) = record.names.iter().find(|p| &p.name == name)
    {
        answer.reason = format!(
            "{}; the DNS gate refused it {} time(s), first at {}, last at {}",
            answer.reason, p.count, p.first, p.last
        );
        if let Some(caution) = &p.caution {
            answer.reason.push_str(&format!(" ({caution})"));
        }
    }
    answer
}

#[cfg(test)]
mod tests {
    //! What the sandbox recorded, over what the policy says.

    use super::*;
    use std::path::Path;

    const LOG: &str = r#"{"time":"2026-12-06T10:00:00.000Z","denied":"dns","name":"evil.test","type":"A","reason":"not allowlisted"}
{"time":"2026-12-06T10:00:05.000Z","denied":"dns","name":"evil.test","type":"A","reason":"not allowlisted","repeats":2}
{"time":"2026-12-06T10:01:00.000Z","denied":"upload","name":"up.test","budget":1000000,"sent":1048576}
{"time":"2026-12-06T10:01:00.000Z","denied":"upload","name":"*.wild.test","budget":1000000,"sent":1048576}
{"time":"2026-12-06T10:02:00.000Z","denied":"dns","name":"in.test","type":"A","reason":"private address","addresses":["10.0.0.5"]}"#;

    const POLICY: &str = "version: 1
domains:
  - {domain: up.test, upload: 1MB, ports: [80, 443], opaque: [22]}
  - {domain: '*.wild.test', upload: 1MB}
  - {domain: own.wild.test, upload: 1MB}
  - in.test
  - docs.rs
";

    /// `why` at `at` (a log time), with `policy` and LOG.
    fn why_at(target: &str, policy: &str, at: &str) -> Answer {
        why_with(target, policy, LOG, at)
    }

    fn why_with(target: &str, policy: &str, log: &str, at: &str) -> Answer {
        let policy = Policy::from_yaml(Path::new("p.yaml"), policy).unwrap();
        let record = crate::queue::queue(log, "", &policy);
        let target = &targets(&[target.into()], true).unwrap()[0];
        let answer = judge(&policy, target, Some("claude"), None);
        seen(answer, target, &policy, &record, "claude", crate::clock::epoch_of(at).unwrap())
    }

    fn why(target: &str) -> Answer {
        why_at(target, POLICY, "2026-12-06T10:30:00.000Z")
    }

    #[test]
    fn a_budget_spent_within_the_hour_refuses_what_the_policy_allows_and_says_how_to_raise_it() {
        let answer = why("up.test");
        assert!(!answer.allowed, "{answer:?}");
        assert!(answer.reason.contains("upload budget of 1000000 bytes an hour (up.test) was spent: 1048576 bytes sent, 1 connection(s) refused or cut, the last at 2026-12-06T10:01:00.000Z"), "{answer:?}");
        assert_eq!(
            answer.change.as_deref(),
            Some("agent-sandbox allow claude up.test --upload SIZE (above 1000000)")
        );
        // An hour on, it has refilled.
        let later = why_at("up.test", POLICY, "2026-12-06T11:01:01.000Z");
        assert!(later.allowed && later.reason.contains("over an hour ago: refilled"), "{later:?}");
        // An opaque port counts no budget.
        assert!(why("up.test:22").allowed);
    }

    #[test]
    fn a_wildcards_spent_budget_is_its_names_alone() {
        assert!(!why("a.wild.test").allowed, "a name the wildcard alone allows shares its budget");
        // A name with an entry of its own has a budget of its own.
        assert!(why("own.wild.test").allowed);
    }

    #[test]
    fn a_forwarded_hosts_requests_count_no_budget() {
        let policy = "version: 1\nservices: [github]\ndomains:\n  - {domain: '*.github.com', upload: 1MB}\n";
        let log = r#"{"time":"2026-12-06T10:01:00.000Z","denied":"upload","name":"*.github.com","budget":1000000,"sent":1048576}"#;
        let at = "2026-12-06T10:30:00.000Z";
        assert!(why_with("https://api.github.com/user", policy, log, at).allowed);
        // The control: a name the wildcard alone allows, reached directly, shares the spent budget.
        assert!(!why_with("https://pages.github.com/", policy, log, at).allowed);
    }

    #[test]
    fn an_answer_into_the_users_network_is_said_and_a_private_entry_quiets_it() {
        let answer = why("in.test");
        assert!(answer.allowed && answer.change.is_none(), "{answer:?}");
        assert!(
            answer.reason.contains("pointed at 10.0.0.5") && answer.reason.contains("private: true"),
            "{answer:?}"
        );
        let private = POLICY.replace("  - in.test\n", "  - {domain: in.test, private: true}\n");
        let answer = why_at("in.test", &private, "2026-12-06T10:30:00.000Z");
        assert!(!answer.reason.contains("pointed at"), "{answer:?}");
    }

    #[test]
    fn a_refused_name_says_how_often_and_what_allows_it() {
        let answer = why("https://evil.test/x");
        assert!(!answer.allowed, "{answer:?}");
        assert!(
            answer.reason.contains(
                "refused it 4 time(s), first at 2026-12-06T10:00:00.000Z, last at 2026-12-06T10:00:05.000Z"
            ),
            "{answer:?}"
        );
        assert_eq!(answer.change.as_deref(), Some("agent-sandbox allow claude evil.test"));
        // The control: a name allowed with nothing recorded is allowed.
        assert!(why("docs.rs").allowed);
    }
}
