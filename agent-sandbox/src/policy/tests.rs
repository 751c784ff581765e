//! `policy check`'s judgment, pure: names, ports, ranges, the forwarder's rules, bodies, and
//! the targets a command line names.

use super::*;

const POLICY: &str = "version: 1
domains:
  - docs.rs
  - domain: '*.pythonhosted.org'
  - domain: models.example.net
    ports: [443, 8443]
  - domain: registry.corp.lan
    private: true
cidrs:
  - cidr: 192.168.1.10/32
    ports: [11434]
services: [github]
forward:
  github:
    write: [octo/hello]
  tracker:
    host: api.tracker.example
    secret: tracker_token
    allow:
      - GET,HEAD /v1/**
      - POST /v1/issues/*/comments
";

fn policy() -> Policy {
    Policy::from_yaml(Path::new("team.yaml"), POLICY).expect("the test policy loads")
}

fn one(text: &str) -> Answer {
    let targets = targets(&[text.to_string()], false).unwrap_or_else(|e| panic!("{text}: {e}"));
    judge(&policy(), &targets[0], Some("claude"), None)
}

#[track_caller]
fn allowed(text: &str, says: &str) {
    let answer = one(text);
    assert!(answer.allowed, "{text} is refused: {answer:?}");
    assert!(answer.reason.contains(says), "{text}: {answer:?} does not say {says:?}");
}

#[track_caller]
fn refused(text: &str, says: &str, change: Option<&str>) {
    let answer = one(text);
    assert!(!answer.allowed, "{text} is allowed: {answer:?}");
    assert!(answer.reason.contains(says), "{text}: {answer:?} does not say {says:?}");
    assert_eq!(answer.change.as_deref(), change, "{text}: {answer:?}");
}

#[test]
fn names_are_judged_by_their_entries_and_ports() {
    allowed("https://docs.rs/serde", "the entry docs.rs opens it (80,443)");
    allowed("http://docs.rs/", "docs.rs");
    allowed("https://DOCS.rs./", "docs.rs");
    allowed("https://files.pythonhosted.org/packages/x", "*.pythonhosted.org");
    allowed("models.example.net:8443", "models.example.net");
    refused(
        "https://example.com/",
        "example.com is not in the policy",
        Some("agent-sandbox allow claude example.com"),
    );
    refused(
        "http://docs.rs:8080/",
        "opens docs.rs on 80,443, not on TCP port 8080",
        Some("agent-sandbox allow claude docs.rs:8080"),
    );
    refused("pythonhosted.org:443", "not in the policy", Some("agent-sandbox allow claude pythonhosted.org"));
    // What a name's answer may open is said: the user's network only where the entry says so.
    allowed("https://docs.rs/", "public addresses only");
    allowed("https://registry.corp.lan/", "public addresses and the user's network's");
}

#[test]
fn unicode_names_are_judged_as_the_punycode_dns_carries() {
    let target = &targets(&["https://bücher.example/".into()], false).unwrap()[0];
    assert_eq!(target.host, Host::Name("xn--bcher-kva.example".into()));
    refused(
        "https://bücher.example/",
        "xn--bcher-kva.example is not in the policy",
        Some("agent-sandbox allow claude xn--bcher-kva.example"),
    );
}

#[test]
fn addresses_are_opened_by_ranges_alone() {
    allowed("192.168.1.10:11434", "the range 192.168.1.10/32 opens port 11434");
    allowed("http://192.168.1.10:11434/api/tags", "192.168.1.10/32");
    refused(
        "192.168.1.10:22",
        "no range of the policy",
        Some("a `cidrs:` entry for 192.168.1.10 with port 22, in a policy file"),
    );
    refused("http://169.254.169.254/latest/meta-data/", "a cloud metadata service's address", None);
    refused("[fd00:ec2::254]:80", "a cloud metadata service's address", None);
    refused(
        "10.1.2.3:5432",
        "an address of the user's network",
        Some("a `cidrs:` entry for 10.1.2.3 with port 5432, in a policy file"),
    );
    // The sandbox's own loopback is its own, but for the engine's DNS.
    allowed("[::1]:8080", "the sandbox's own loopback");
    allowed("http://127.0.0.1:3000/", "the sandbox's own loopback");
    refused("127.0.0.11:53", "the engine's DNS, which answers any name", None);
    refused("[::ffff:127.0.0.11]:53", "the engine's DNS", None);
}

#[test]
fn github_is_judged_by_the_forwarders_rules() {
    allowed(
        "https://api.github.com/repos/octo/hello/issues",
        "the forwarder of github lets `GET /repos/octo/hello/issues` through",
    );
    allowed(
        "POST https://api.github.com/repos/octo/hello/issues",
        "lets `POST /repos/octo/hello/issues` through",
    );
    let change = None;
    refused(
        "POST https://api.github.com/repos/octo/other/issues",
        "the forwarder of github refuses it",
        change,
    );
    refused("POST https://api.github.com/gists", "the forwarder of github refuses it", change);
    // The read-only hosts take no writes.
    refused(
        "PUT https://raw.githubusercontent.com/octo/hello/main/x",
        "the forwarder of github refuses it",
        change,
    );
    // What the forwarder refuses before its rules: a method, a target it cannot read as the server would.
    refused("TRACE https://api.github.com/", "the method `TRACE` is not forwarded", change);
    refused("https://api.github.com/repos/octo/hello/%2e%2e/x", "the forwarder of github refuses it", change);
    // Forwarded hosts are reached on 443, over HTTPS, alone.
    refused("http://api.github.com/", "not on TCP port 80 (the forwarder alone reaches it, on 443)", None);
    refused("github.com:22", "not on TCP port 22", None);
    allowed("github.com:443", "through the forwarder of github");
}

#[test]
fn a_body_the_forwarder_reads_is_judged_when_given() {
    let policy = policy();
    let target = &targets(&["POST".into(), "https://api.github.com/graphql".into()], false).unwrap()[0];
    let answer = judge(&policy, target, None, None);
    assert!(!answer.allowed && answer.reason.contains("give it with --body FILE"), "{answer:?}");
    let query = br#"{"query": "query { viewer { login } }"}"#;
    let answer = judge(&policy, target, None, Some(query));
    assert!(answer.allowed, "{answer:?}");
    let mutation = br#"{"query": "mutation { createGist(input: {}) { gist { url } } }"}"#;
    let answer = judge(&policy, target, None, Some(mutation));
    assert!(!answer.allowed && answer.reason.contains("createGist"), "{answer:?}");
}

#[test]
fn a_declared_api_is_judged_by_its_allow_rules() {
    allowed(
        "https://api.tracker.example/v1/issues",
        "the forwarder of tracker lets `GET /v1/issues` through",
    );
    allowed("POST https://api.tracker.example/v1/issues/7/comments", "through");
    refused("DELETE https://api.tracker.example/v1/issues/7", "the forwarder of tracker refuses it", None);
}

#[test]
fn without_a_sandbox_the_change_is_a_policy_files_entry() {
    let target = &targets(&["https://example.com/".into()], false).unwrap()[0];
    let answer = judge(&policy(), target, None, None);
    assert_eq!(answer.change.as_deref(), Some("example.com in a policy file's `domains:`"));
}

#[test]
fn targets_are_urls_methods_and_host_ports_and_nothing_else() {
    let words = |w: &[&str]| targets(&w.iter().map(|s| s.to_string()).collect::<Vec<_>>(), false);
    let both = words(&["POST https://a.example/x?y=1", "PUT", "https://b.example/", "c.example:22"]).unwrap();
    let shown: Vec<_> =
        both.iter().map(|t| (t.method.as_deref(), t.host.to_string(), t.port, t.path.as_str())).collect();
    assert_eq!(
        shown,
        [
            (Some("POST"), "a.example".into(), 443, "/x?y=1"),
            (Some("PUT"), "b.example".into(), 443, "/"),
            (None, "c.example".into(), 22, ""),
        ]
    );
    for bad in [
        &["docs.rs"][..],
        &["ftp://docs.rs/"],
        &["POST"],
        &["POST", "GET", "https://a/"],
        &["POST a.example:22"],
        &["a.example:0"],
        &["https://u:p@a.example/"],
    ] {
        let error = words(bad).expect_err(&format!("{bad:?} is taken"));
        assert!(error.contains("a target is a URL") || error.contains("method"), "{bad:?}: {error}");
    }
}

#[test]
fn a_bare_name_is_a_connection_on_443_where_it_is_taken() {
    let bare = targets(&["docs.rs".into()], true).unwrap();
    assert_eq!(
        (bare[0].host.to_string(), bare[0].port, bare[0].method.clone()),
        ("docs.rs".into(), 443, None)
    );
    assert!(targets(&["docs.rs".into()], false).is_err());
}

#[test]
fn a_range_on_the_port_is_said_where_a_name_is_refused_and_one_of_every_address_allows() {
    let with = |cidr: &str| {
        let text = format!("version: 1\nservices: [github]\ncidrs:\n  - {{cidr: '{cidr}', ports: [443]}}\n");
        Policy::from_yaml(Path::new("r.yaml"), &text).unwrap()
    };
    let target =
        &targets(&["https://gitlab.corp/".into(), "POST https://api.github.com/gists".into()], false)
            .unwrap();
    let corp = with("10.0.0.0/8");
    let answer = judge(&corp, &target[0], None, None);
    assert!(!answer.allowed, "{answer:?}");
    assert!(answer.reason.contains("; but the range 10.0.0.0/8 opens port 443 on the address alone, whatever the name and past any forwarder: where gitlab.corp's address is in one, the agent reaches it there"), "{answer:?}");
    let gist = judge(&corp, &target[1], None, None);
    assert!(
        !gist.allowed
            && gist.reason.contains("the forwarder of github refuses it")
            && gist.reason.contains("past any forwarder"),
        "{gist:?}"
    );
    // A range of every address opens every name's address.
    let all = with("0.0.0.0/0");
    for t in target {
        let answer = judge(&all, t, None, None);
        assert!(answer.allowed && answer.change.is_none(), "{answer:?}");
    }
    // The control: a range on another port changes nothing.
    let other =
        Policy::from_yaml(Path::new("r.yaml"), "version: 1\ncidrs:\n  - {cidr: 0.0.0.0/0, ports: [22]}\n")
            .unwrap();
    let answer = judge(&other, &target[0], None, None);
    assert!(!answer.allowed && !answer.reason.contains("range"), "{answer:?}");
}

#[test]
fn a_sandbox_without_its_firewall_or_name_check_or_network_answers_as_it_runs() {
    let target = &targets(
        &["https://example.com/".into(), "POST https://api.github.com/gists".into(), "[::1]:80".into()],
        false,
    )
    .unwrap();
    let policy = policy();
    let answers = |running: Running| -> Vec<Answer> {
        target.iter().map(|t| running.over(t, judge(&policy, t, Some("claude"), None))).collect()
    };
    let on = Running { firewall: "on".into(), name_check: true, offline: false };
    assert_eq!(answers(on.clone()).iter().map(|a| a.allowed).collect::<Vec<_>>(), [false, false, true]);
    for mode in ["off", "open"] {
        for a in answers(Running { firewall: mode.into(), ..on.clone() }) {
            assert!(
                a.allowed
                    && a.reason.contains(&format!("without its egress firewall (SANDBOX_FIREWALL={mode})")),
                "{a:?}"
            );
        }
    }
    let unchecked = answers(Running { name_check: false, ..on.clone() });
    assert!(!unchecked[0].allowed, "{unchecked:?}");
    assert!(unchecked[1].allowed && unchecked[1].reason.contains("SANDBOX_NAME_CHECK=off"), "{unchecked:?}");
    let offline = answers(Running { offline: true, ..on });
    assert_eq!(offline.iter().map(|a| a.allowed).collect::<Vec<_>>(), [false, false, true], "{offline:?}");
    assert!(offline[1].reason.contains("no network"), "{offline:?}");
}

#[test]
fn what_the_gate_never_answers_is_refused_and_one_trailing_dot_is_the_name() {
    refused("https://a*b.docs.rs/", "is not a host name the DNS gate answers", None);
    refused("https://docs.rs../", "is not a host name the DNS gate answers", None);
    allowed("https://docs.rs./", "docs.rs");
}

#[test]
fn a_model_apis_host_says_that_a_held_key_sends_it_through_the_forwarder() {
    let policy = Policy::from_yaml(Path::new("m.yaml"), "version: 1\ndomains: [api.mistral.ai]\n").unwrap();
    let target = &targets(&["https://api.mistral.ai/v1/agents".into()], false).unwrap()[0];
    let answer = judge(&policy, target, None, None);
    assert!(answer.reason.contains("While the sandbox holds the mistral key"), "{answer:?}");
}
