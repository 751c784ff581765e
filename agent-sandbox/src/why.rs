//! `agent-sandbox why S NAME|URL…`: whether a running sandbox's agent reaches each target, and
//! why not. What its policy in force says (`policy::judge`, the sandbox's own rules), and what
//! the sandbox recorded that the policy alone does not say (its denial log, read as `pending`
//! reads it): an upload budget spent, an answer that pointed into the user's network, how often
//! and when the name was refused.

use sandbox_policy::DomainPattern;

use crate::exit::{Code, Failure, Result};
use crate::flags::WhyFlags;
use crate::policy::{Answer, Host, Target, judge, show, targets};
use crate::queue::{Pending, Queue, Spent};

pub async fn run(flags: &WhyFlags) -> Result<i32> {
    let targets = targets(&flags.targets, true).map_err(|e| Failure::new(Code::BadArgument, e))?;
    let sandbox = crate::engine::Engine::connect().await?.find(&flags.which.sandbox).await?;
    sandbox.ensure_running()?;
    let (policy, record) = crate::approve::record(&sandbox).await?;
    let answers: Vec<Answer> = targets
        .iter()
        .map(|t| seen(judge(&policy, t, Some(&sandbox.name), None), t, &record, &sandbox.name))
        .collect();
    show(&answers, flags.json);
    Ok(if answers.iter().all(|a| a.allowed) { 0 } else { 1 })
}

/// `answer`, the policy's, with what the sandbox recorded of `target`'s name: a spent upload
/// budget or an answer into the user's network refuses what the policy allows; a name the gate
/// refused says how often, and when last.
pub fn seen(mut answer: Answer, target: &Target, record: &Queue, sandbox: &str) -> Answer {
    let Host::Name(name) = &target.host else { return answer };
    let counted = |p: &&Pending| match DomainPattern::parse(&p.name) {
        Ok(DomainPattern::Subdomains(base)) => name.ends_with(&format!(".{base}")),
        _ => &p.name == name,
    };
    if answer.allowed {
        if let Some(p) = record.budgets.iter().find(counted) {
            let Spent { budget, sent } = p.upload.unwrap_or(Spent { budget: 0, sent: 0 });
            answer.allowed = false;
            answer.reason = format!(
                "{}; but its upload budget of {budget} bytes an hour ({}) was spent: {sent} bytes sent, \
                 {} connection(s) refused or cut, the last at {}. The budget refills within the hour",
                answer.reason, p.name, p.count, p.last
            );
            answer.change =
                Some(format!("agent-sandbox allow {sandbox} {name} --upload SIZE (above {budget})"));
        } else if let Some(p) = record.addresses.iter().find(|p| &p.name == name) {
            answer.allowed = false;
            answer.reason = format!(
                "{}; but its DNS answer pointed at {} ({} time(s), the last at {}): {}",
                answer.reason,
                p.addresses.join(", "),
                p.count,
                p.last,
                p.caution.as_deref().unwrap_or("an address the gate opens nothing for")
            );
            answer.change = None;
        }
    } else if let Some(p) = record.names.iter().find(|p| &p.name == name) {
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
    use sandbox_policy::Policy;
    use std::path::Path;

    const LOG: &str = r#"{"time":"2026-12-06T10:00:00.000Z","denied":"dns","name":"evil.test","type":"A","reason":"not allowlisted"}
{"time":"2026-12-06T10:00:05.000Z","denied":"dns","name":"evil.test","type":"A","reason":"not allowlisted","repeats":2}
{"time":"2026-12-06T10:01:00.000Z","denied":"upload","name":"up.test","budget":1000000,"sent":1048576}
{"time":"2026-12-06T10:02:00.000Z","denied":"dns","name":"in.test","type":"A","reason":"private address","addresses":["10.0.0.5"]}"#;

    fn why(target: &str) -> Answer {
        let policy = Policy::from_yaml(
            Path::new("p.yaml"),
            "version: 1\ndomains:\n  - {domain: up.test, upload: 1MB}\n  - in.test\n  - docs.rs\n",
        )
        .unwrap();
        let record = crate::queue::queue(LOG, "", &policy);
        let target = &targets(&[target.into()], true).unwrap()[0];
        seen(judge(&policy, target, Some("claude"), None), target, &record, "claude")
    }

    #[test]
    fn a_spent_budget_refuses_what_the_policy_allows_and_says_how_to_raise_it() {
        let answer = why("up.test");
        assert!(!answer.allowed, "{answer:?}");
        assert!(answer.reason.contains("upload budget of 1000000 bytes an hour (up.test) was spent: 1048576 bytes sent, 1 connection(s) refused or cut, the last at 2026-12-06T10:01:00.000Z"), "{answer:?}");
        assert_eq!(
            answer.change.as_deref(),
            Some("agent-sandbox allow claude up.test --upload SIZE (above 1000000)")
        );
    }

    #[test]
    fn an_answer_into_the_users_network_refuses_and_no_approval_is_offered() {
        let answer = why("in.test");
        assert!(!answer.allowed && answer.change.is_none(), "{answer:?}");
        assert!(
            answer.reason.contains("pointed at 10.0.0.5") && answer.reason.contains("private: true"),
            "{answer:?}"
        );
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
