//! The policy format's unit tests: parsing, errors at their line and column, merging, matching.

use super::*;

fn yaml(text: &str) -> Result<Policy, PolicyError> {
    Policy::from_yaml(Path::new("policy.yaml"), text)
}

fn err(text: &str) -> String {
    yaml(text).expect_err("policy should be rejected").to_string()
}

fn corpus(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

fn ports(list: &[u16]) -> Ports {
    list.iter().copied().collect()
}

fn tcp(list: &[u16]) -> Access {
    Access::tcp(ports(list))
}

#[test]
fn every_malformed_policy_of_the_corpus_is_rejected_with_its_message() {
    let files = corpus("invalid");
    assert!(files.len() >= 40, "the corpus has {} malformed policies", files.len());
    let mut report = String::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} does not start with `# expect: <message>`", file.display()));
        let name = Path::new(file.file_name().unwrap());
        let parsed = match file.extension().unwrap().to_str() {
            Some("txt") => Policy::from_list(name, &text),
            _ => Policy::from_yaml(name, &text),
        };
        let message = match parsed {
            Ok(policy) => panic!("{} was accepted: {policy:?}", file.display()),
            Err(e) => e.to_string(),
        };
        assert!(
            message.contains(expect.trim_end()),
            "{}: expected `{expect}`, got `{message}`",
            file.display()
        );
        report.push_str(&message);
        report.push('\n');
    }
    insta::assert_snapshot!("corpus_errors", report);
}

#[test]
fn errors_name_the_line_and_column_of_the_bad_value() {
    let message = err("version: 1\ndomains:\n  - ok.example.com\n  - bad_name.example.com\n");
    assert!(message.starts_with("policy.yaml:4:5: "), "{message}");
    let message = err("version: 1\ndomains:\n  - domain: a.example.com\n    ports: [443, 0]\n");
    assert!(message.starts_with("policy.yaml:4:18: "), "{message}");
    let message = Policy::from_list(Path::new("extra.txt"), "a.example.com\n\n   b..example.com # x\n")
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("extra.txt:3:4: "), "{message}");
}

#[test]
fn valid_policies_parse_to_normalised_entries() {
    let policy = Policy::read(&corpus("valid")[0]).unwrap();
    let d = |s: &str| DomainPattern::parse(s).unwrap();
    assert_eq!(policy.domains[&d("api.example.com")], tcp(&[80, 443]));
    assert_eq!(policy.domains[&d("*.cdn.example.com")], tcp(&[80, 443]));
    assert_eq!(policy.domains[&DomainPattern::Exact("mixed.case.example.com".into())], tcp(&[80, 443]));
    assert_eq!(policy.domains[&DomainPattern::Exact("xn--bcher-kva.example".into())], tcp(&[80, 443]));
    assert_eq!(policy.domains[&d("internal-proxy")], tcp(&[3128]));
    assert_eq!(policy.domains[&d("models.example.net")], tcp(&[443, 8443]));
    let github = &policy.domains[&d("github.com")];
    // Forwarded (the default): the forwarder's on 443, no SSH.
    assert_eq!((&github.tcp, &github.opaque), (&ports(&[443]), &ports(&[])), "from the github service");
    assert!(policy.domains.contains_key(&d("api.anthropic.com")), "from the anthropic service");
    assert_eq!(policy.cidrs[&"10.20.0.0/16".parse().unwrap()], ports(&[80, 443]));
    assert_eq!(policy.cidrs[&"192.168.1.10/32".parse().unwrap()], ports(&[11434]));
    assert_eq!(policy.cidrs[&"fd00:1234::/32".parse().unwrap()], ports(&[8080]));
    assert_eq!(
        policy.domains[&d("media.example.net")],
        Access {
            tcp: ports(&[443]),
            opaque: ports(&[]),
            udp: ports(&[3478]),
            ech: false,
            upload: None,
            private: false
        }
    );
    assert_eq!(
        policy.domains[&d("ech.example.net")],
        Access { tcp: ports(&[80, 443]), ech: true, ..Access::default() },
        "ECH allowed for one name"
    );
    assert!(!policy.domains[&d("models.example.net")].ech, "and for no other");
    assert_eq!(policy.inbound, ports(&[3000, 5173]));
    assert_eq!(policy.api_settings("gemini").remote_tools, RemoteTools::Allow);
    assert_eq!(policy.api_settings("openai").remote_tools, RemoteTools::Refuse, "the default");
    assert_eq!(policy.services, BTreeSet::from(["anthropic".to_string(), "github".to_string()]));
    let locked = Policy::read(&corpus("valid")[2]).unwrap();
    assert!(locked.domains.is_empty() && locked.cidrs.is_empty());
}

#[test]
fn drop_ins_merge_in_name_order_and_unknown_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let baked = dir.path().join("policy.yaml");
    std::fs::write(&baked, "version: 1\ndomains: [api.example.com]\n").unwrap();
    let drop_ins = dir.path().join("policy.d");
    std::fs::create_dir(&drop_ins).unwrap();
    std::fs::write(drop_ins.join("b.txt"), "api.example.com:8443\n").unwrap();
    std::fs::write(drop_ins.join("a.yml"), "version: 1\ncidrs: [10.0.0.0/8]\n").unwrap();
    std::fs::write(drop_ins.join("notes.md"), "not a policy").unwrap();
    std::fs::write(drop_ins.join(".hidden"), "skipped quietly").unwrap();
    let (policy, skipped) = Policy::load(&baked, &drop_ins).unwrap();
    assert_eq!(policy.domains[&DomainPattern::parse("api.example.com").unwrap()], tcp(&[80, 443, 8443]));
    assert!(policy.cidrs.contains_key(&"10.0.0.0/8".parse().unwrap()));
    assert_eq!(policy.files, vec![baked.clone(), drop_ins.join("a.yml"), drop_ins.join("b.txt")]);
    assert_eq!(skipped, vec![drop_ins.join("notes.md")]);

    std::fs::write(drop_ins.join("c.yaml"), "version: 1\ndomains: [bad_name.example.com]\n").unwrap();
    let message = Policy::load(&baked, &drop_ins).unwrap_err().to_string();
    assert!(message.starts_with(&format!("{}:2:11: ", drop_ins.join("c.yaml").display())), "{message}");

    let missing = Policy::load(&dir.path().join("absent.yaml"), &drop_ins).unwrap_err();
    assert!(matches!(missing, PolicyError::Unreadable { .. }), "{missing}");
    let (alone, _) = Policy::load(&baked, &dir.path().join("no-such-dir")).unwrap();
    assert_eq!(alone.files, vec![baked]);
}

#[test]
fn every_service_bundle_parses_and_names_real_domains() {
    let services = services();
    for name in ["anthropic", "openai", "google", "github", "npm", "pypi"] {
        let service = services.get(name).unwrap_or_else(|| panic!("service `{name}` is missing"));
        assert!(!service.domains.is_empty() && !service.description.is_empty(), "{name}");
    }
}

#[test]
fn the_matcher_handles_exact_wildcard_case_trailing_dot_and_punycode() {
    let policy = yaml(
        "version: 1\ndomains:\n  - api.example.com\n  - \"*.cdn.example.com:8443\"\n  - bücher.example\n  - domain: api.example.com\n    ports: [22]\n",
    )
    .unwrap();
    let allow = Allowlist::new(&policy);
    let port_set = |name: &str| allow.access(name).map(|a| a.tcp);
    assert_eq!(port_set("api.example.com"), Some(ports(&[22, 80, 443])));
    assert_eq!(port_set("API.Example.COM."), Some(ports(&[22, 80, 443])), "case and trailing dot");
    assert_eq!(port_set("a.cdn.example.com"), Some(ports(&[8443])), "one label under the wildcard");
    assert_eq!(port_set("a.b.cdn.example.com"), Some(ports(&[8443])), "two labels under the wildcard");
    assert_eq!(port_set("cdn.example.com"), None, "a wildcard does not match its own apex");
    assert_eq!(port_set("xcdn.example.com"), None, "a suffix match needs a dot");
    assert_eq!(port_set("example.com"), None);
    assert_eq!(port_set("api.example.com.evil.test"), None);
    assert_eq!(port_set("xn--bcher-kva.example"), Some(ports(&[80, 443])), "punycode query");
    assert_eq!(port_set(""), None);
    assert_eq!(port_set("."), None);
}

#[test]
fn an_exact_and_a_wildcard_entry_for_the_same_name_add_their_ports() {
    let policy = yaml("version: 1\ndomains:\n  - a.example.com:22\n  - \"*.example.com\"\n").unwrap();
    let matched = Allowlist::new(&policy).matches("a.example.com").unwrap();
    assert_eq!(matched.access, tcp(&[22, 80, 443]));
    assert_eq!(matched.patterns.len(), 2, "both entries allow it: {:?}", matched.patterns);
    assert!(!matched.only_by_wildcard());
    assert!(Allowlist::new(&policy).matches("b.example.com").unwrap().only_by_wildcard());
}

#[test]
fn opaque_ports_pass_on_the_address_and_cannot_also_be_checked() {
    let policy = yaml("version: 1\ndomains:\n  - domain: git.example.com\n    opaque: [22]\n").unwrap();
    let access = Allowlist::new(&policy).access("git.example.com").unwrap();
    assert_eq!(
        (&access.tcp, &access.opaque),
        (&Ports::new(), &ports(&[22])),
        "no default 80 and 443 beside it"
    );
    assert!(access.opens(Opening::Opaque, 22) && !access.opens(Opening::Checked, 22));
    assert!(access.allows(Protocol::Tcp, 22));
    let both = err("version: 1\ndomains:\n  - domain: git.example.com\n    ports: [22]\n    opaque: [22]\n");
    assert!(both.contains("port 22 is in both `ports` and `opaque`"), "{both}");
}

#[test]
fn udp_is_opened_only_where_an_entry_asks_and_inbound_ports_merge() {
    let policy = yaml("version: 1\ndomains:\n  - a.example.com\n  - domain: b.example.com\n    ports: [443]\n    udp: [443]\n  - domain: turn.example.com\n    udp: [3478]\ninbound: [3000]\n").unwrap();
    let allow = Allowlist::new(&policy);
    assert_eq!(allow.access("a.example.com").unwrap().udp, Ports::new());
    assert!(allow.access("b.example.com").unwrap().allows(Protocol::Udp, 443));
    assert!(!allow.access("b.example.com").unwrap().allows(Protocol::Udp, 80));
    let mut merged = policy.clone();
    merged.merge(yaml("version: 1\ninbound: [8080]\n").unwrap());
    assert_eq!(merged.inbound, ports(&[3000, 8080]));
    assert_eq!(merged.summary(), "3 domains, 0 cidrs, inbound 3000,8080");
    let shown = |name| policy.domains[&DomainPattern::parse(name).unwrap()].to_string();
    assert_eq!(shown("b.example.com"), "443; udp 443");
    // `udp` alone opens no TCP: no default 80 and 443 beside it.
    assert_eq!(shown("turn.example.com"), "udp 3478");
    assert!(!allow.access("turn.example.com").unwrap().allows(Protocol::Tcp, 443));
}

#[test]
fn every_image_policy_in_the_repository_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "services.yaml") {
            continue;
        }
        Policy::read(&path).unwrap_or_else(|e| panic!("{e}"));
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} policies found in {}", dir.display());
}

/// A drop-in may allow an API's remote tools; the baked policy's default (refuse) does not take
/// it back, in either order.
#[test]
fn remote_tools_are_refused_unless_a_policy_allows_them() {
    let refuse = yaml("version: 1\napis:\n  openai: {}\n").unwrap();
    let allow = yaml("version: 1\napis:\n  openai:\n    remote_tools: allow\n").unwrap();
    assert_eq!(refuse.api_settings("openai").remote_tools, RemoteTools::Refuse);
    for (first, second) in [(&refuse, &allow), (&allow, &refuse)] {
        let mut merged = first.clone();
        merged.merge(second.clone());
        assert_eq!(merged.api_settings("openai").remote_tools, RemoteTools::Allow);
        assert_eq!(merged.api_settings("anthropic").remote_tools, RemoteTools::Refuse);
    }
}

#[test]
fn github_and_npm_are_forwarded_unless_a_policy_says_direct() {
    let policy = yaml("version: 1\nservices: [github, npm]\n").unwrap();
    let allowlist = Allowlist::new(&policy);
    // The forwarded hosts: checked TCP on 443 and no more; SSH on 22 is gone.
    // The download hosts too: no front end of GitHub's is reached directly, so none carries a
    // write fronted under its name.
    for host in [
        "github.com",
        "api.github.com",
        "uploads.github.com",
        "codeload.github.com",
        "raw.githubusercontent.com",
        "objects.githubusercontent.com",
        "registry.npmjs.org",
    ] {
        assert_eq!(allowlist.access(host), Some(tcp(&[443])), "{host}");
        assert!(allowlist.is_forwarded(host), "{host}");
    }
    // The wildcards that covered write hosts are gone.
    assert_eq!(allowlist.access("gist.github.com"), None);
    // GitHub's MCP server takes any token and writes: not direct while GitHub is forwarded.
    assert_eq!(allowlist.access("api.githubcopilot.com"), None);
    let hosts: Vec<(String, u16)> = policy.forwarded().into_iter().map(|f| (f.host, f.port)).collect();
    assert_eq!(hosts.len(), 7, "{hosts:?}");
    assert!(hosts.contains(&("github.com".into(), 15110)), "{hosts:?}");

    // A drop-in that says `direct` gives back the bundle as written, 22 included.
    let mut merged = policy.clone();
    merged.merge(yaml("version: 1\nforward:\n  github:\n    direct: true\n").unwrap());
    let allowlist = Allowlist::new(&merged);
    assert!(!allowlist.is_forwarded("github.com"));
    assert!(allowlist.access("github.com").unwrap().opaque.contains(&22));
    assert!(merged.forwarded().iter().all(|f| f.service == "npm"));

    // A wildcard or opaque port a drop-in adds does not reopen a forwarded host.
    let mut widened = policy.clone();
    widened.merge(
        yaml("version: 1\ndomains:\n  - {domain: \"*.github.com\", opaque: [22], udp: [443]}\n").unwrap(),
    );
    assert_eq!(Allowlist::new(&widened).access("api.github.com"), Some(tcp(&[443])));
}

#[test]
fn forward_settings_merge_and_declared_services_get_ports_of_their_own() {
    let policy = yaml(
        "version: 1\nforward:\n  github:\n    write: [Octo/Hello.git]\n    mutations: [createPullRequest]\n  \
         example:\n    host: API.example.com\n    secret: example_token\n    allow: [\"GET,HEAD /v1/**\"]\n",
    )
    .unwrap();
    // Naming github under `forward` allows it.
    assert!(policy.services.contains("github"));
    let github = &policy.forward["github"];
    assert_eq!(github.write.iter().collect::<Vec<_>>(), ["octo/hello"]);
    assert_eq!(github.read, None, "every repository is readable by default");
    let declared = policy.forwarded().into_iter().find(|f| f.service == "example").unwrap();
    assert_eq!((declared.host.as_str(), declared.port, declared.part), ("api.example.com", 15130, None));
    let d = declared.settings.declared.unwrap();
    assert_eq!(
        (d.secret.as_str(), d.header.as_str(), d.prefix.as_str()),
        ("example_token", "authorization", "Bearer ")
    );

    let mut merged = policy.clone();
    merged.merge(yaml("version: 1\nforward:\n  github:\n    write: [octo/other]\n").unwrap());
    assert_eq!(merged.forward["github"].write.len(), 2);
    assert!(err("version: 1\nforward:\n  github:\n    write: [a]\n").starts_with("policy.yaml:4:12:"));
}

#[test]
fn upload_budgets_are_sizes_an_hour_and_entries_widen_them() {
    assert_eq!(parse_size("64MB"), Ok(64_000_000));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert_eq!(parse_size("1000"), Ok(1000));
    for bad in ["", "MB", "1 TB", "-1MB", "0", "99999999999999999999GB"] {
        assert!(parse_size(bad).is_err(), "{bad}");
    }
    let policy =
        yaml("version: 1\ndomains:\n  - {domain: small.test, upload: 1MB}\n  - plain.test\n").unwrap();
    let allowlist = Allowlist::new(&policy);
    assert_eq!(allowlist.access("small.test").unwrap().upload_budget(), 1_000_000);
    assert_eq!(allowlist.access("plain.test").unwrap().upload_budget(), DEFAULT_UPLOAD);
    let mut merged = policy.clone();
    merged.merge(yaml("version: 1\ndomains:\n  - {domain: small.test, upload: 2MB}\n").unwrap());
    assert_eq!(Allowlist::new(&merged).access("small.test").unwrap().upload_budget(), 2_000_000);
    merged.merge(yaml("version: 1\ndomains: [small.test]\n").unwrap());
    assert_eq!(Allowlist::new(&merged).access("small.test").unwrap().upload_budget(), 2_000_000);
    assert!(err("version: 1\ndomains:\n  - {domain: a.test, upload: lots}\n").contains("is not a size"));
}
