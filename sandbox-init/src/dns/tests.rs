use super::*;
use crate::policy::Policy;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, TXT};
use hickory_proto::rr::{Record, RecordType};
use std::path::Path;
use std::str::FromStr as _;

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

#[test]
fn a_name_outside_the_allowlist_is_refused_with_its_question() {
    let Some(Decision::Reply { packet, refused }) =
        decide(&query(7, "example.com.", RecordType::A), &allowlist())
    else {
        panic!("not refused")
    };
    assert_eq!(refused, Some(("example.com.".into(), "A".into())));
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
    let Some(Decision::Forward { id, query: forwarded, ports }) = decision else {
        panic!("not forwarded: {decision:?}")
    };
    assert_eq!((id, forwarded.query_type()), (9, RecordType::AAAA));
    assert_eq!(ports, Ports::from([80, 443]));
    let Some(Decision::Forward { ports, .. }) =
        decide(&query(1, "x.y.cdn.example.com.", RecordType::TXT), &allowlist())
    else {
        panic!("wildcard not forwarded")
    };
    assert_eq!(ports, Ports::from([8443]));
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
}

/// Records what it was asked to allow.
#[derive(Default)]
struct Recorder(Mutex<Vec<Element>>);

impl AddressSink for Recorder {
    fn allow(&self, _name: &str, elements: Vec<Element>) -> Result<(), String> {
        self.0.lock().unwrap().extend(elements);
        Ok(())
    }
}

/// An upstream on loopback that answers every A query with one address, and counts queries.
async fn fake_upstream(addr: &'static str, ttl: u32) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
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
            log.lock().unwrap().push(name.clone());
            let reply = answer(q.id(), &name, RecordType::A, vec![a(&name, ttl, addr)]);
            socket.send_to(&reply, from).await.unwrap();
        }
    });
    (local, seen)
}

#[tokio::test]
async fn the_gate_allows_addresses_before_replying_and_never_forwards_refused_names() {
    let (upstream, seen) = fake_upstream("203.0.113.5", 5).await;
    let recorder = Arc::new(Recorder::default());
    let gate =
        DnsGate::new(allowlist(), vec![upstream], recorder.clone(), Arc::new(DenialLog::stderr_only()));

    let reply = gate.handle(&query(11, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!((reply.id(), reply.answers().len()), (11, 1));
    let allowed = recorder.0.lock().unwrap().clone();
    let expect: Vec<Element> = [80, 443]
        .into_iter()
        .map(|port| Element { addr: "203.0.113.5".parse().unwrap(), port, timeout: Duration::from_secs(60) })
        .collect();
    assert_eq!(allowed, expect, "both ports, TTL 5 s raised to the 60 s floor, before the reply");

    let refused =
        gate.handle(&query(12, "exfil-c2VjcmV0.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(Message::from_vec(&refused).unwrap().response_code(), ResponseCode::Refused);
    assert_eq!(*seen.lock().unwrap(), vec!["api.example.com.".to_string()], "the refused name never left");
    assert_eq!(gate.handle(b"garbage", Transport::Udp).await, None);
}

#[tokio::test]
async fn the_gate_answers_servfail_when_no_upstream_answers() {
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let gate = DnsGate::new(
        allowlist(),
        vec![silent.local_addr().unwrap()],
        Arc::new(Recorder::default()),
        Arc::new(DenialLog::stderr_only()),
    );
    tokio::time::pause();
    let reply = gate.handle(&query(5, "api.example.com.", RecordType::A), Transport::Udp).await.unwrap();
    assert_eq!(Message::from_vec(&reply).unwrap().response_code(), ResponseCode::ServFail);
}

#[tokio::test]
async fn a_reload_changes_what_the_gate_allows() {
    let (upstream, _) = fake_upstream("203.0.113.6", 300).await;
    let gate = DnsGate::new(
        allowlist(),
        vec![upstream],
        Arc::new(Recorder::default()),
        Arc::new(DenialLog::stderr_only()),
    );
    let code = |reply: Vec<u8>| Message::from_vec(&reply).unwrap().response_code();
    let q = query(1, "new.example.org.", RecordType::A);
    assert_eq!(code(gate.handle(&q, Transport::Udp).await.unwrap()), ResponseCode::Refused);
    let policy = Policy::from_yaml(Path::new("p.yaml"), "version: 1\ndomains: [new.example.org]\n").unwrap();
    gate.set_allowlist(Allowlist::new(&policy));
    assert_eq!(code(gate.handle(&q, Transport::Udp).await.unwrap()), ResponseCode::NoError);
}

#[test]
fn new_elements_are_created_and_existing_ones_refreshed_only_past_half_their_time() {
    let now = Instant::now();
    let element = |last: u8, secs: u64| Element {
        addr: IpAddr::from([203, 0, 113, last]),
        port: 443,
        timeout: Duration::from_secs(secs),
    };
    let mut written = HashMap::new();
    written.insert((IpAddr::from([203, 0, 113, 2]), 443), (now + Duration::from_secs(100), "a".to_string()));
    written.insert((IpAddr::from([203, 0, 113, 3]), 443), (now + Duration::from_secs(20), "b".to_string()));
    written.insert((IpAddr::from([203, 0, 113, 4]), 443), (now - Duration::from_secs(1), "c".to_string()));
    let writes =
        plan_writes(&written, vec![element(1, 60), element(2, 120), element(3, 60), element(4, 60)], now);
    assert_eq!(writes.new, vec![element(1, 60), element(4, 60)], "absent, and expired");
    assert_eq!(writes.refresh, vec![element(3, 60)], "20 s left of a 60 s timeout");
}
