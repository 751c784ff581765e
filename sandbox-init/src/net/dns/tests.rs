//! The DNS gate's unit tests: decisions, answers and the upstream, without root.

use super::*;
use crate::policy::{Opening, Policy, Ports};
use hickory_proto::rr::Record;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, TXT};
use std::path::Path;
use std::str::FromStr as _;
use std::sync::{Mutex, RwLock};
use tokio::net::UdpSocket;

fn allowlist() -> Allowlist {
    let policy = Policy::from_yaml(
        Path::new("p.yaml"),
        "version: 1\ndomains:\n  - api.example.com\n  - \"*.cdn.example.com:8443\"\n",
    )
    .unwrap();
    Allowlist::new(&policy)
}

fn query(id: u16, name: &str, kind: RecordType) -> Vec<u8> {
    let mut message = Message::new();
    message.set_id(id).set_recursion_desired(true);
    message.add_query(Query::query(Name::from_str(name).unwrap(), kind));
    message.to_vec().unwrap()
}

fn answer(id: u16, name: &str, kind: RecordType, records: Vec<Record>) -> Vec<u8> {
    let mut message = Message::new();
    message.set_id(id).set_message_type(MessageType::Response);
    message.add_query(Query::query(Name::from_str(name).unwrap(), kind));
    message.add_answers(records);
    message.to_vec().unwrap()
}

fn a(name: &str, ttl: u32, addr: &str) -> Record {
    Record::from_rdata(Name::from_str(name).unwrap(), ttl, RData::A(A(addr.parse().unwrap())))
}

fn cname(name: &str, target: &str) -> Record {
    Record::from_rdata(
        Name::from_str(name).unwrap(),
        300,
        RData::CNAME(CNAME(Name::from_str(target).unwrap())),
    )
}

/// Sidecar mode's probe of the gate: answered, NXDOMAIN, with nothing to log; a name beside it
/// under `.invalid` is refused and logged like any other.
#[test]
fn the_gates_probe_name_is_answered_quietly_and_only_it() {
    let Some(Decision::Reply { packet, refused }) =
        decide(&query(9, "GATEWAY.agent-sandbox.invalid.", RecordType::A), &allowlist())
    else {
        panic!("not answered")
    };
    assert_eq!(refused, None);
    assert_eq!(Message::from_vec(&packet).unwrap().response_code(), ResponseCode::NXDomain);
    let Some(Decision::Reply { refused, .. }) =
        decide(&query(9, "data.gateway.agent-sandbox.invalid.", RecordType::A), &allowlist())
    else {
        panic!("not refused")
    };
    assert!(matches!(refused, Some(Denial::Name { reason: Reason::NotAllowlisted, .. })), "{refused:?}");
}

#[test]
fn a_name_outside_the_allowlist_is_refused_with_its_question() {
    let Some(Decision::Reply { packet, refused }) =
        decide(&query(7, "example.com.", RecordType::A), &allowlist())
    else {
        panic!("not refused")
    };
    assert_eq!(
        refused,
        Some(Denial::Name { name: "example.com.".into(), kind: "A".into(), reason: Reason::NotAllowlisted })
    );
    let reply = Message::from_vec(&packet).unwrap();
    assert_eq!((reply.id(), reply.response_code()), (7, ResponseCode::Refused));
    assert_eq!(reply.message_type(), MessageType::Response);
    assert_eq!(reply.queries()[0].name().to_ascii(), "example.com.");
    // A suffix that only looks like an allowed name, and the wildcard's own apex.
    for name in ["api.example.com.evil.test.", "cdn.example.com.", "xapi.example.com."] {
        assert!(
            matches!(decide(&query(1, name, RecordType::A), &allowlist()), Some(Decision::Reply { .. })),
            "{name}"
        );
    }
}

#[test]
fn an_allowed_name_is_forwarded_with_its_ports_whatever_its_case() {
    let decision = decide(&query(9, "API.Example.COM.", RecordType::AAAA), &allowlist());
    let Some(Decision::Forward { id, query: forwarded, access, .. }) = decision else {
        panic!("not forwarded: {decision:?}")
    };
    assert_eq!((id, forwarded.query_type()), (9, RecordType::AAAA));
    assert_eq!(access, Access::tcp(Ports::from([80, 443])));
    let Some(Decision::Forward { access, .. }) =
        decide(&query(1, "x.y.cdn.example.com.", RecordType::A), &allowlist())
    else {
        panic!("wildcard not forwarded")
    };
    assert_eq!(access, Access::tcp(Ports::from([8443])));
}

#[test]
fn query_types_that_carry_data_never_leave_and_are_answered_empty() {
    for kind in [
        RecordType::TXT,
        RecordType::NULL,
        RecordType::ANY,
        RecordType::MX,
        RecordType::SRV,
        RecordType::HTTPS,
    ] {
        let Some(Decision::Reply { packet, refused }) =
            decide(&query(4, "api.example.com.", kind), &allowlist())
        else {
            panic!("{kind} was forwarded")
        };
        let reply = Message::from_vec(&packet).unwrap();
        assert_eq!((reply.response_code(), reply.answers().len()), (ResponseCode::NoError, 0), "{kind}");
        assert!(
            matches!(refused, Some(Denial::Name { reason: Reason::QueryType, .. })),
            "{kind}: {refused:?}"
        );
    }
    for kind in FORWARDED_TYPES {
        assert!(matches!(
            decide(&query(4, "api.example.com.", kind), &allowlist()),
            Some(Decision::Forward { .. })
        ));
    }
}

#[test]
fn a_name_only_a_wildcard_allows_is_refused_when_it_is_long_enough_to_carry_data() {
    let label = "a".repeat(WILDCARD_MAX_LABEL);
    let fits = format!("{label}.cdn.example.com.");
    assert!(matches!(decide(&query(1, &fits, RecordType::A), &allowlist()), Some(Decision::Forward { .. })));
    let long_label = format!("a{label}.cdn.example.com.");
    let many_labels = format!("{}cdn.example.com.", "abcdefghi.".repeat(10));
    for name in [long_label, many_labels] {
        let Some(Decision::Reply { refused, .. }) = decide(&query(1, &name, RecordType::A), &allowlist())
        else {
            panic!("{name} was forwarded")
        };
        assert!(matches!(refused, Some(Denial::Name { reason: Reason::WildcardNameTooLong, .. })), "{name}");
    }
    // An exact entry is the policy's own choice: no cap.
    let exact = format!("{}.example.com", "b".repeat(60));
    let text = format!("version: 1\ndomains: [\"{exact}\"]\n");
    let own = Allowlist::new(&Policy::from_yaml(Path::new("p.yaml"), &text).unwrap());
    assert!(matches!(decide(&query(1, &exact, RecordType::A), &own), Some(Decision::Forward { .. })));
}

#[test]
fn malformed_packets_and_responses_are_dropped_and_odd_queries_answered() {
    let allow = allowlist();
    assert_eq!(decide(b"", &allow), None);
    assert_eq!(decide(&[0xff; 11], &allow), None);
    let mut truncated = query(1, "api.example.com.", RecordType::A);
    truncated.truncate(truncated.len() - 3);
    assert_eq!(decide(&truncated, &allow), None);
    assert_eq!(decide(&answer(1, "api.example.com.", RecordType::A, vec![]), &allow), None, "a response");

    let mut two = Message::new();
    two.add_query(Query::query(Name::from_str("api.example.com.").unwrap(), RecordType::A));
    two.add_query(Query::query(Name::from_str("example.com.").unwrap(), RecordType::A));
    let Some(Decision::Reply { packet, refused: None }) = decide(&two.to_vec().unwrap(), &allow) else {
        panic!("two questions were not answered FORMERR")
    };
    assert_eq!(Message::from_vec(&packet).unwrap().response_code(), ResponseCode::FormErr);
}

#[test]
fn answers_give_the_addresses_of_the_name_and_its_cname_chain_only() {
    let q = Query::query(Name::from_str("api.example.com.").unwrap(), RecordType::A);
    let packet = answer(
        3,
        "api.example.com.",
        RecordType::A,
        vec![
            cname("api.example.com.", "edge.cdn.test."),
            cname("edge.cdn.test.", "node7.cdn.test."),
            a("node7.cdn.test.", 20, "203.0.113.7"),
            a("NODE7.cdn.test.", 3600, "203.0.113.8"),
            a("unrelated.test.", 300, "198.51.100.66"),
            Record::from_rdata(
                Name::from_str("api.example.com.").unwrap(),
                50,
                RData::AAAA(AAAA("2001:db8::7".parse().unwrap())),
            ),
            Record::from_rdata(
                Name::from_str("api.example.com.").unwrap(),
                50,
                RData::TXT(TXT::new(vec!["x".into()])),
            ),
        ],
    );
    let addresses = answer_addresses(&packet, 3, &q).unwrap();
    assert_eq!(
        addresses,
        vec![
            ("203.0.113.7".parse().unwrap(), 20),
            ("203.0.113.8".parse().unwrap(), 3600),
            ("2001:db8::7".parse().unwrap(), 50)
        ]
    );
    assert_eq!(answer_addresses(&packet, 4, &q), Err(AnswerError::Mismatch), "another id");
    let other = Query::query(Name::from_str("api.example.com.").unwrap(), RecordType::AAAA);
    assert_eq!(answer_addresses(&packet, 3, &other), Err(AnswerError::Mismatch), "another type");
    assert_eq!(answer_addresses(b"\x00\x03", 3, &q), Err(AnswerError::Malformed));

    // An answer with more addresses than any real name has (the agent's own zone, over TCP):
    // the first MAX_ANSWER_ADDRESSES are opened.
    let many: Vec<Record> = (0..200u32)
        .map(|i| a("api.example.com.", 60, &std::net::Ipv4Addr::from(0xc000_0200 + i).to_string()))
        .collect();
    let addresses = answer_addresses(&answer(3, "api.example.com.", RecordType::A, many), 3, &q).unwrap();
    assert_eq!(addresses.len(), MAX_ANSWER_ADDRESSES);
}

#[test]
fn a_cname_loop_ends() {
    let q = Query::query(Name::from_str("api.example.com.").unwrap(), RecordType::A);
    let packet = answer(
        3,
        "api.example.com.",
        RecordType::A,
        vec![
            cname("api.example.com.", "b.test."),
            cname("b.test.", "api.example.com."),
            a("b.test.", 1, "203.0.113.1"),
        ],
    );
    assert_eq!(answer_addresses(&packet, 3, &q).unwrap(), vec![("203.0.113.1".parse().unwrap(), 1)]);
}

#[test]
fn resolv_conf_is_pointed_at_the_gate_and_remembers_the_upstream() {
    let original = "search corp.test\nnameserver 127.0.0.11\noptions ndots:0\n";
    let upstreams = resolv_conf_upstreams(original);
    assert_eq!(upstreams, vec!["127.0.0.11".parse::<IpAddr>().unwrap()]);
    let ours = gate_resolv_conf(original, &upstreams);
    assert_eq!(
        ours,
        "# agent-sandbox DNS gate; upstream: 127.0.0.11\nnameserver 127.0.0.1\nsearch corp.test\noptions ndots:0\n"
    );
    assert_eq!(resolv_conf_upstreams(&ours), upstreams, "after a restart the file is ours");
    assert!(names_only_the_gate(&ours));
    assert!(!names_only_the_gate(original));
    // A pod's dnsConfig: the gate alone, and nothing else.
    assert!(names_only_the_gate(
        "nameserver 127.0.0.1
search default.svc.cluster.local
"
    ));
    assert!(!names_only_the_gate(
        "nameserver 127.0.0.1
nameserver 10.96.0.10
"
    ));
    assert!(!names_only_the_gate(""));
}

/// Records what it was asked to allow, checking names against its allowlist as the real sink.
struct Recorder {
    allowlist: RwLock<Arc<Allowlist>>,
    allowed: Mutex<Vec<Element>>,
}

impl Recorder {
    fn new(allowlist: Allowlist) -> Arc<Recorder> {
        Arc::new(Recorder { allowlist: RwLock::new(Arc::new(allowlist)), allowed: Mutex::new(Vec::new()) })
    }
}

impl AddressSink for Recorder {
    fn allowlist(&self) -> Arc<Allowlist> {
        self.allowlist.read().unwrap().clone()
    }

    fn allow(&self, name: &str, elements: Vec<Element>) -> Result<(), SinkError> {
        self.allowlist().matches(name).ok_or(SinkError::NotAllowed)?;
        self.allowed.lock().unwrap().extend(elements);
        Ok(())
    }
}

/// An upstream on loopback that answers every A query with one address, and logs each query's
/// name and id. With `decoys`, it first sends answers that are not the answer: another id, and
/// the right id with another question.
async fn fake_upstream_with(
    addr: &'static str,
    ttl: u32,
    decoys: bool,
) -> (SocketAddr, Arc<Mutex<Vec<(String, u16)>>>) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let local = socket.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let (len, from) = socket.recv_from(&mut buf).await.unwrap();
            let q = Message::from_vec(&buf[..len]).unwrap();
            let name = q.queries()[0].name().to_ascii();
            log.lock().unwrap().push((name.clone(), q.id()));
            if decoys {
                let forged = "198.51.100.66";
                let wrong_id =
                    answer(q.id().wrapping_add(1), &name, RecordType::A, vec![a(&name, 86400, forged)]);
                socket.send_to(&wrong_id, from).await.unwrap();
                let other = "other.example.com.";
                let wrong_question = answer(q.id(), other, RecordType::A, vec![a(&name, 86400, forged)]);
                socket.send_to(&wrong_question, from).await.unwrap();
            }
            let reply = answer(q.id(), &name, RecordType::A, vec![a(&name, ttl, addr)]);
            socket.send_to(&reply, from).await.unwrap();
        }
    });
    (local, seen)
}

async fn fake_upstream(addr: &'static str, ttl: u32) -> (SocketAddr, Arc<Mutex<Vec<(String, u16)>>>) {
    fake_upstream_with(addr, ttl, false).await
}

fn tcp_elements(addr: &str, ports: &[u16], secs: u64) -> Vec<Element> {
    ports
        .iter()
        .map(|&port| Element {
            addr: addr.parse().unwrap(),
            opening: Opening::Checked,
            port,
            timeout: Duration::from_secs(secs),
        })
        .collect()
}

#[tokio::test]
async fn the_gate_allows_addresses_before_replying_and_never_forwards_refused_names() {
    let (upstream, seen) = fake_upstream("203.0.113.5", 5).await;
    let recorder = Recorder::new(allowlist());
    let gate = DnsGate::new(vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));

    let reply = gate.handle(&query(11, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!((reply.id(), reply.answers().len()), (11, 1), "the client's own id comes back");
    let allowed = recorder.allowed.lock().unwrap().clone();
    let expect = tcp_elements("203.0.113.5", &[80, 443], 60);
    assert_eq!(allowed, expect, "both ports, TCP only, TTL 5 s raised to the 60 s floor, before the reply");

    let refused =
        gate.handle(&query(12, "exfil-c2VjcmV0.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(Message::from_vec(&refused).unwrap().response_code(), ResponseCode::Refused);
    let names: Vec<String> = seen.lock().unwrap().iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(names, vec!["api.example.com.".to_string()], "the refused name never left");
    assert_eq!(gate.handle(b"garbage", Transport::Udp).await, None);
}

#[tokio::test]
async fn upstream_queries_carry_a_random_id_and_only_the_matching_answer_counts() {
    let (upstream, seen) = fake_upstream_with("203.0.113.5", 300, true).await;
    let recorder = Recorder::new(allowlist());
    let mut ids = std::collections::HashSet::new();
    for _ in 0..8 {
        // A gate each time: a second ask of the name would be answered from its cache.
        let gate = DnsGate::new(vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));
        let reply =
            gate.handle(&query(4242, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!(reply.id(), 4242);
        assert_eq!(reply.answers()[0].data(), &RData::A(A("203.0.113.5".parse().unwrap())), "not a decoy's");
        ids.insert(seen.lock().unwrap().last().unwrap().1);
    }
    assert!(ids.len() >= 7 && !ids.contains(&4242), "upstream ids: {ids:?}");
    let allowed = recorder.allowed.lock().unwrap().clone();
    assert!(
        allowed.iter().all(|e| e.addr.to_string() == "203.0.113.5"),
        "a decoy's address was allowed: {allowed:?}"
    );
}

#[tokio::test]
async fn the_gate_answers_servfail_when_no_upstream_answers() {
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let gate = DnsGate::new(
        vec![silent.local_addr().unwrap()],
        Recorder::new(allowlist()),
        Arc::new(DenialLog::stderr_only()),
    );
    tokio::time::pause();
    let reply = gate.handle(&query(5, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(Message::from_vec(&reply).unwrap().response_code(), ResponseCode::ServFail);
}

#[tokio::test]
async fn a_reload_changes_what_the_gate_allows() {
    let (upstream, _) = fake_upstream("203.0.113.6", 300).await;
    let recorder = Recorder::new(allowlist());
    let gate = DnsGate::new(vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));
    let code = |reply: Vec<u8>| Message::from_vec(&reply).unwrap().response_code();
    let q = query(1, "new.example.org.", RecordType::A);
    assert_eq!(code(gate.handle(&q, Transport::Udp).await.unwrap()), ResponseCode::Refused);
    let policy = Policy::from_yaml(Path::new("p.yaml"), "version: 1\ndomains: [new.example.org]\n").unwrap();
    *recorder.allowlist.write().unwrap() = Arc::new(Allowlist::new(&policy));
    assert_eq!(code(gate.handle(&q, Transport::Udp).await.unwrap()), ResponseCode::NoError);
}

#[test]
fn only_the_question_goes_upstream_not_the_clients_other_sections_or_edns_options() {
    let name = Name::from_str("api.example.com.").unwrap();
    let mut client = Message::new();
    client.set_id(5).set_recursion_desired(true);
    client.add_query(Query::query(name.clone(), RecordType::A));
    let smuggled = Name::from_str("exfil-data.attacker.example.").unwrap();
    let txt =
        || Record::from_rdata(smuggled.clone(), 60, RData::TXT(TXT::new(vec!["PASSWORD=hunter2".into()])));
    client.add_answer(txt()).add_name_server(txt()).add_additional(txt());
    let mut edns = Edns::new();
    edns.set_max_payload(1232).set_dnssec_ok(true);
    edns.options_mut()
        .insert(hickory_proto::rr::rdata::opt::EdnsOption::Unknown(65001, b"EDNS-EXFIL".to_vec()));
    client.set_edns(edns);
    let packet = client.to_vec().unwrap();
    let Some(Decision::Forward { upstream, .. }) = decide(&packet, &allowlist()) else {
        panic!("not forwarded")
    };
    let sent = Message::from_vec(&upstream).unwrap();
    assert_eq!(sent.queries(), &[Query::query(name, RecordType::A)]);
    assert!(sent.answers().is_empty() && sent.name_servers().is_empty() && sent.additionals().is_empty());
    let edns = sent.extensions().as_ref().expect("the client's EDNS payload size is kept");
    assert_eq!((edns.max_payload(), edns.flags().dnssec_ok), (1232, true));
    assert!(edns.options().as_ref().is_empty(), "{:?}", edns.options());
    assert!(sent.recursion_desired());
    for bytes in [b"hunter2".as_slice(), b"EDNS-EXFIL", b"attacker"] {
        assert!(
            !upstream.windows(bytes.len()).any(|w| w == bytes),
            "{:?} left",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn a_label_with_a_dot_is_no_host_name_and_matches_no_wildcard() {
    // `evil.attacker.cdn.example` as ONE label under `com`: as text, it passes for a name
    // under `*.cdn.example.com`.
    let labels: [&[u8]; 3] = [b"evil.attacker.cdn", b"example", b"com"];
    let name = Name::from_labels(labels).unwrap();
    assert_eq!(name.to_ascii(), "evil\\.attacker\\.cdn.example.com.");
    let mut message = Message::new();
    message.set_id(3).set_recursion_desired(true);
    message.add_query(Query::query(name, RecordType::A));
    let Some(Decision::Reply { packet, refused }) = decide(&message.to_vec().unwrap(), &allowlist()) else {
        panic!("forwarded")
    };
    assert_eq!(Message::from_vec(&packet).unwrap().response_code(), ResponseCode::Refused);
    assert!(matches!(refused, Some(Denial::Name { reason: Reason::NotAHostName, .. })), "{refused:?}");
    // The control: the same labels, as three, are under the wildcard.
    let fits = query(1, "evil.attacker.cdn.example.com.", RecordType::A);
    assert!(matches!(decide(&fits, &allowlist()), Some(Decision::Forward { .. })));
}

#[tokio::test]
async fn a_name_asked_again_is_answered_from_the_cache_until_a_reload() {
    let (upstream, seen) = fake_upstream("203.0.113.5", 300).await;
    let recorder = Recorder::new(allowlist());
    let gate = DnsGate::new(vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));
    for id in [1, 2, 3] {
        let reply = gate.handle(&query(id, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!(reply.id(), id, "the client's own id");
        assert_eq!(reply.answers()[0].data(), &RData::A(A("203.0.113.5".parse().unwrap())));
    }
    assert_eq!(seen.lock().unwrap().len(), 1, "asked upstream once");
    assert_eq!(recorder.allowed.lock().unwrap().len(), 2, "its elements written once (two ports)");
    // A reload (a new allowlist in force): the cache counts for nothing, and a name the new
    // policy refuses is refused, never answered from it.
    *recorder.allowlist.write().unwrap() = Arc::new(allowlist());
    gate.handle(&query(4, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 2, "asked upstream again after the reload");
    let none =
        Policy::from_yaml(Path::new("p.yaml"), "version: 1\ndomains:\n  - other.example.com\n").unwrap();
    *recorder.allowlist.write().unwrap() = Arc::new(Allowlist::new(&none));
    let refused = gate.handle(&query(5, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(Message::from_vec(&refused).unwrap().response_code(), ResponseCode::Refused);
}

/// An allowed name's answer opens its public addresses; a metadata service's, this host's or
/// its link's never; the user's network's only for an entry with `private: true`.
#[test]
fn an_answer_opens_no_metadata_local_or_private_address_unless_its_entry_says_private() {
    let answer: Vec<(IpAddr, u32)> =
        ["203.0.113.5", "169.254.169.254", "192.168.1.1", "::1", "fd00:ec2::254", "10.1.2.3"]
            .iter()
            .map(|a| (a.parse().unwrap(), 60))
            .collect();
    let addrs = |list: &[(IpAddr, u32)]| list.iter().map(|(a, _)| a.to_string()).collect::<Vec<_>>();
    let (open, inward) = split_inward(answer.clone(), false);
    assert_eq!(addrs(&open), ["203.0.113.5"]);
    let (scope, refused) = inward.unwrap();
    assert_eq!(scope, crate::policy::address::Scope::Metadata, "the first refused names the kind");
    assert_eq!(refused.len(), 5);
    let (open, inward) = split_inward(answer, true);
    assert_eq!(addrs(&open), ["203.0.113.5", "192.168.1.1", "10.1.2.3"]);
    assert_eq!(inward.unwrap().1.len(), 3, "169.254.169.254, ::1, fd00:ec2::254: never");
    assert!(split_inward(vec![("203.0.113.5".parse().unwrap(), 60)], false).1.is_none());
}

/// The whole path: an allowed name answered with a metadata address and the router's is
/// refused to the client and opens nothing; with `private: true` on the entry the router's
/// address opens, and the metadata service's still does not.
#[tokio::test]
async fn a_name_answered_into_the_users_network_opens_nothing_without_its_entrys_say() {
    for (policy, opened) in [
        ("version: 1\ndomains:\n  - api.example.com\n", false),
        ("version: 1\ndomains:\n  - {domain: api.example.com, private: true}\n", true),
    ] {
        let (upstream, _) = fake_upstream("192.168.1.1", 300).await;
        let policy = Policy::from_yaml(Path::new("p.yaml"), policy).unwrap();
        let recorder = Recorder::new(Allowlist::new(&policy));
        let gate = DnsGate::new(vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));
        let reply = gate.handle(&query(1, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
        let code = Message::from_vec(&reply).unwrap().response_code();
        let written = recorder.allowed.lock().unwrap().clone();
        if opened {
            assert_eq!(code, ResponseCode::NoError);
            assert!(
                !written.is_empty() && written.iter().all(|e| e.addr.to_string() == "192.168.1.1"),
                "{written:?}"
            );
        } else {
            assert_eq!(code, ResponseCode::Refused);
            assert!(written.is_empty(), "{written:?}");
        }
    }
    let (upstream, _) = fake_upstream("169.254.169.254", 300).await;
    let policy = Policy::from_yaml(
        Path::new("p.yaml"),
        "version: 1\ndomains:\n  - {domain: api.example.com, private: true}\n",
    )
    .unwrap();
    let recorder = Recorder::new(Allowlist::new(&policy));
    let gate = DnsGate::new(vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));
    let reply = gate.handle(&query(1, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(Message::from_vec(&reply).unwrap().response_code(), ResponseCode::Refused);
    assert!(recorder.allowed.lock().unwrap().is_empty());
}

/// The Extended DNS Error of a refusal, as `dig` shows it: its info-code and text.
fn extended_error(packet: &[u8]) -> Option<(u16, String)> {
    let reply = Message::from_vec(packet).unwrap();
    let edns = reply.extensions().as_ref()?;
    match edns.option(hickory_proto::rr::rdata::opt::EdnsCode::from(15))? {
        hickory_proto::rr::rdata::opt::EdnsOption::Unknown(15, data) => {
            Some((u16::from_be_bytes([data[0], data[1]]), String::from_utf8(data[2..].to_vec()).unwrap()))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_refusal_says_why_in_an_extended_dns_error_where_the_query_spoke_edns() {
    let mut asked = Message::from_vec(&query(7, "blocked.test.", RecordType::A)).unwrap();
    asked.set_edns(Edns::new());
    let Some(Decision::Reply { packet, .. }) = decide(&asked.to_vec().unwrap(), &allowlist()) else {
        panic!("refused with a reply")
    };
    assert_eq!(Message::from_vec(&packet).unwrap().response_code(), ResponseCode::Refused);
    let (code, text) = extended_error(&packet).expect("an Extended DNS Error");
    assert_eq!(code, 18, "Prohibited");
    assert!(text.contains("blocked.test") && text.contains("allowlist"), "{text}");
    assert!(text.contains(crate::policy::layout::REFUSED_FILE), "{text}");
    // Without EDNS in the query, no OPT record in the answer (RFC 6891), and still REFUSED.
    let Some(Decision::Reply { packet, .. }) =
        decide(&query(7, "blocked.test.", RecordType::A), &allowlist())
    else {
        panic!("refused with a reply")
    };
    assert_eq!(Message::from_vec(&packet).unwrap().response_code(), ResponseCode::Refused);
    assert!(Message::from_vec(&packet).unwrap().extensions().is_none());
    // The longest name there is: the answer still fits 512 bytes.
    let label = "a".repeat(63);
    let longest = format!("{label}.{label}.{label}.{}.", "b".repeat(61));
    let mut asked = Message::from_vec(&query(7, &longest, RecordType::A)).unwrap();
    asked.set_edns(Edns::new());
    let Some(Decision::Reply { packet, .. }) = decide(&asked.to_vec().unwrap(), &allowlist()) else {
        panic!("refused with a reply")
    };
    assert!(packet.len() <= 512, "{} bytes", packet.len());
    assert_eq!(extended_error(&packet).expect("an Extended DNS Error").0, 18);
}
