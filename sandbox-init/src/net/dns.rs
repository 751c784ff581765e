//! The DNS gate on 127.0.0.1:53 (UDP and TCP). A query for a name outside the allowlist is
//! answered REFUSED and logged, and never leaves the container: no DNS exfiltration. A query for
//! an allowed name is forwarded to the container's original resolver under an id of the gate's
//! own, and every A/AAAA address of the answer (following CNAMEs) is added to the firewall's
//! sets before the answer is returned.
//!
//! Below it: its cache of answers (`cache`), the sink it writes allowed addresses to, the
//! firewall's sets under the allowlist in force (`sink`), and its sockets made under a uid of
//! their own in sidecar mode (`owned`).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::console;
use crate::denials::{Denial, DenialLog, Reason};
use crate::net::firewall::{Element, FirewallError};
use crate::policy::layout::REFUSED_FILE;
use crate::policy::{Access, Allowlist};

/// How long an upstream resolver gets to answer before the next one is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// CNAME chains longer than this are not followed (a loop, or an attack).
const MAX_CNAME_CHAIN: usize = 16;
/// The query types that leave the container: the addresses the firewall opens, and CNAME.
/// Every other type (TXT, NULL, ANY, MX, SRV, HTTPS, …) is answered empty without being
/// forwarded: they carry data either way, and the resolvers agents use ask for A and AAAA.
pub const FORWARDED_TYPES: [RecordType; 3] = [RecordType::A, RecordType::AAAA, RecordType::CNAME];
/// A name that only a wildcard allows may be at most this long, and its labels this long: room
/// for real host names (`release-assets.githubusercontent.com`), not for a tunnel's payload.
pub const WILDCARD_MAX_NAME: usize = 100;
pub const WILDCARD_MAX_LABEL: usize = 40;
/// Queries in flight at once: past this, a query is dropped (its client retries) instead of
/// getting a task and a socket.
pub const MAX_IN_FLIGHT: usize = 256;
/// TCP clients served at once: past this, connections wait in the listen backlog.
pub const MAX_TCP_CLIENTS: usize = 32;
/// How long a TCP client may take to send a query.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// What the gate does with one query packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Reply at once with this packet; `refused` says what was denied, for the log.
    Reply { packet: Vec<u8>, refused: Option<Denial> },
    /// Forward `upstream` (the query rebuilt, its id still to be set) to the upstream; on the
    /// answer, open its addresses as `access` says.
    Forward { id: u16, query: Query, access: Access, upstream: Vec<u8> },
}

/// Whether a name may go upstream through a wildcard: short enough to be a host, not a payload.
fn fits_a_wildcard(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.len() <= WILDCARD_MAX_NAME && name.split('.').all(|label| label.len() <= WILDCARD_MAX_LABEL)
}

/// Whether every label of a name is a host name's: letters, digits, `-` and `_`. A label may
/// hold any byte, a dot too; the allowlist matches the name's text, in which the label
/// `evil.attacker.wild` under `test` would pass for a name under `*.wild.test`.
fn is_host_name(name: &Name) -> bool {
    name.iter().all(|label| {
        !label.is_empty() && label.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
    })
}

/// The query that goes upstream, rebuilt from the question and the flags its answer depends
/// on (recursion, checking, EDNS's payload size and DO bit). Nothing else of the client's packet
/// leaves: not its other sections, not its EDNS options, each of which could carry the agent's
/// bytes to the resolvers.
fn upstream_query(message: &Message, query: &Query) -> Option<Vec<u8>> {
    let mut upstream = Message::new();
    upstream
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(message.recursion_desired())
        .set_checking_disabled(message.checking_disabled())
        .add_query(query.clone());
    if let Some(edns) = message.extensions() {
        let mut ours = Edns::new();
        ours.set_max_payload(edns.max_payload().clamp(512, 4096)).set_dnssec_ok(edns.flags().dnssec_ok);
        upstream.set_edns(ours);
    }
    upstream.to_vec().ok()
}

/// Where the gate listens (UDP and TCP), and where resolv.conf, the forwarder and sidecar mode's
/// agent container find it.
pub const GATE_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 53);

/// The name sidecar mode's agent container asks the gate for, to learn that one answers in its
/// network namespace: answered NXDOMAIN, neither forwarded nor logged.
pub const GATE_PROBE_NAME: &str = "gateway.agent-sandbox.invalid.";

/// Decides on a packet from a client. None: not a DNS query at all, dropped without a reply.
pub fn decide(packet: &[u8], allowlist: &Allowlist) -> Option<Decision> {
    let message = Message::from_vec(packet).ok()?;
    if message.message_type() != MessageType::Query {
        return None;
    }
    let answer = |code: ResponseCode| {
        let mut reply = Message::error_msg(message.id(), message.op_code(), code);
        reply.add_queries(message.queries().iter().cloned());
        reply.set_recursion_desired(message.recursion_desired()).set_recursion_available(true);
        reply
    };
    let reply = |code: ResponseCode| answer(code).to_vec().ok();
    if message.op_code() != OpCode::Query {
        return Some(Decision::Reply { packet: reply(ResponseCode::NotImp)?, refused: None });
    }
    let [query] = message.queries() else {
        return Some(Decision::Reply { packet: reply(ResponseCode::FormErr)?, refused: None });
    };
    let name = query.name().to_ascii();
    // Sidecar mode's agent container asking whether a gate answers here (sidecar.rs): the name
    // never resolves (RFC 6761), and its question is no denial to log or to queue for approval.
    if name.eq_ignore_ascii_case(GATE_PROBE_NAME) {
        return Some(Decision::Reply { packet: reply(ResponseCode::NXDomain)?, refused: None });
    }
    // REFUSED, with the reason as an Extended DNS Error (RFC 8914: 18, Prohibited) where the
    // query spoke EDNS (without it, RFC 6891 allows no OPT record in the answer): `dig` and
    // resolvers' logs show its text, so the refusal explains itself where it is seen.
    let denial = |reason| Denial::Name { name: name.clone(), kind: query.query_type().to_string(), reason };
    let refuse = |reason| {
        let denial = denial(reason);
        let mut reply = answer(ResponseCode::Refused);
        if message.extensions().is_some() {
            reply.set_edns(prohibited(&denial));
        }
        Some(Decision::Reply { packet: reply.to_vec().ok()?, refused: Some(denial) })
    };
    if !is_host_name(query.name()) {
        return refuse(Reason::NotAHostName);
    }
    let Some(matched) = allowlist.matches(&name) else {
        return refuse(Reason::NotAllowlisted);
    };
    if matched.only_by_wildcard() && !fits_a_wildcard(&name) {
        return refuse(Reason::WildcardNameTooLong);
    }
    if !FORWARDED_TYPES.contains(&query.query_type()) {
        // NOERROR with no records: "no data of that type", which every resolver takes calmly.
        let refused = Some(denial(Reason::QueryType));
        return Some(Decision::Reply { packet: reply(ResponseCode::NoError)?, refused });
    }
    let upstream = upstream_query(&message, query)?;
    Some(Decision::Forward { id: message.id(), query: query.clone(), access: matched.access, upstream })
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("the upstream's answer is not a DNS message")]
    Malformed,
    #[error("the upstream's answer does not match the query")]
    Mismatch,
}

/// Whether a packet is the answer to `query` sent with `id`: a response with that id and the
/// very question.
fn answers(message: &Message, id: u16, query: &Query) -> bool {
    message.id() == id
        && message.message_type() == MessageType::Response
        && message.queries().len() == 1
        && message.queries()[0].name().eq_case(query.name())
        && message.queries()[0].query_type() == query.query_type()
}

/// The addresses an upstream answer gives for the query's name, with their TTLs: A and AAAA
/// records of the name or of a name its CNAME chain leads to. Records for other names are
/// The most addresses of one answer that are opened.
pub const MAX_ANSWER_ADDRESSES: usize = 64;

/// ignored, so an answer cannot smuggle in an address for a name nobody asked about.
pub fn answer_addresses(answer: &[u8], id: u16, query: &Query) -> Result<Vec<(IpAddr, u32)>, AnswerError> {
    let message = Message::from_vec(answer).map_err(|_| AnswerError::Malformed)?;
    if !answers(&message, id, query) {
        return Err(AnswerError::Mismatch);
    }
    let mut names: HashSet<Name> = HashSet::from([query.name().to_lowercase()]);
    for _ in 0..MAX_CNAME_CHAIN {
        let before = names.len();
        for record in message.answers() {
            if let RData::CNAME(target) = record.data()
                && names.contains(&record.name().to_lowercase())
            {
                names.insert(target.0.to_lowercase());
            }
        }
        if names.len() == before {
            break;
        }
    }
    let mut addresses = Vec::new();
    for record in message.answers() {
        if !names.contains(&record.name().to_lowercase()) {
            continue;
        }
        match record.data() {
            RData::A(a) => addresses.push((IpAddr::V4(a.0), record.ttl())),
            RData::AAAA(aaaa) => addresses.push((IpAddr::V6(aaaa.0), record.ttl())),
            _ => {}
        }
    }
    // An answer the agent's own zone could make as large as a TCP answer allows: the first
    // addresses are opened, the rest refused (no real name needs more).
    addresses.truncate(MAX_ANSWER_ADDRESSES);
    Ok(addresses)
}

/// The EDNS record of a refusal: the Extended DNS Error "Prohibited" (RFC 8914, info-code 18),
/// its text the denial in plain words (the agent's summary's, without the time) and where the
/// recent ones are listed.
fn prohibited(denial: &Denial) -> Edns {
    const EDE: u16 = 15;
    const PROHIBITED: u16 = 18;
    // At most 140 characters of the reason: with the longest question a name allows, the answer
    // stays within the 512 bytes every EDNS client accepts.
    let words = crate::policy::text::one_line(&denial.words(), 140);
    let text = format!("agent-sandbox: {words}; recent refusals: {REFUSED_FILE}");
    let mut data = PROHIBITED.to_be_bytes().to_vec();
    data.extend(text.as_bytes());
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    edns.options_mut().insert(EdnsOption::Unknown(EDE, data));
    edns
}

fn servfail(id: u16, query: &Query) -> Vec<u8> {
    let mut reply = Message::error_msg(id, OpCode::Query, ResponseCode::ServFail);
    reply.add_query(query.clone());
    reply.to_vec().unwrap_or_default()
}

fn refused(id: u16, query: &Query) -> Vec<u8> {
    let mut reply = Message::error_msg(id, OpCode::Query, ResponseCode::Refused);
    reply.add_query(query.clone());
    reply.to_vec().unwrap_or_default()
}

/// A random id for a query the gate sends upstream: an answer must carry it, so one cannot be
/// forged without seeing the query.
fn random_id() -> u16 {
    let mut bytes = [0u8; 2];
    // SAFETY: getrandom into a buffer we own, of its length.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if filled != 2 {
        // The kernel's entropy pool is always initialised in a running container; this only
        // keeps the id from being constant if it ever is not.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return (nanos.subsec_nanos() ^ std::process::id()) as u16;
    }
    u16::from_ne_bytes(bytes)
}

/// What an answer held that it may not open: the scope of the first such address, and the
/// first few of them.
pub type Inward = (crate::policy::address::Scope, Vec<IpAddr>);

/// The most addresses a denial names.
const NAMED_INWARD: usize = 8;

/// An answer's addresses split into those it may open for an entry that does (`private`) or
/// does not say `private: true` (address.rs), and the rest: the scope of the first refused, and
/// the first few refused. What an allowed name's answer says never opens the cloud's metadata
/// service, this host, its link, or (unless the entry says so) the user's network.
pub fn split_inward(addresses: Vec<(IpAddr, u32)>, private: bool) -> (Vec<(IpAddr, u32)>, Option<Inward>) {
    let (open, refused): (Vec<_>, Vec<_>) = addresses
        .into_iter()
        .partition(|(addr, _)| crate::policy::address::scope(*addr).opened_by_answer(private));
    let inward = refused.first().map(|(first, _)| {
        let named = refused.iter().take(NAMED_INWARD).map(|(addr, _)| *addr).collect();
        (crate::policy::address::scope(*first), named)
    });
    (open, inward)
}

/// Why the sink did not allow an answer's addresses.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("the name is no longer allowed (the policy changed while it was resolved)")]
    NotAllowed,
    #[error(
        "the address sets are full ({max} entries): the name is refused (SANDBOX_MAX_ADDRESSES raises the limit)"
    )]
    Full { max: usize },
    #[error(transparent)]
    Firewall(#[from] FirewallError),
}

/// Where allowed addresses go: the firewall's sets (dns/sink.rs), or a recorder in tests. The sink
/// holds the allowlist in force, so that what the gate decides and what the sets admit change
/// together.
pub trait AddressSink: Send + Sync + 'static {
    /// The allowlist queries are decided on.
    fn allowlist(&self) -> Arc<Allowlist>;
    /// Allows the elements resolved for `name`, before the answer is released, if the allowlist
    /// in force at the time of the write still allows them. Blocking.
    fn allow(&self, name: &str, elements: Vec<Element>) -> Result<(), SinkError>;
}

/// The gate: its upstreams, sink, denial log, and the bounds on what a client can make it hold.
pub struct DnsGate {
    upstreams: Vec<SocketAddr>,
    sink: Arc<dyn AddressSink>,
    denials: Arc<DenialLog>,
    in_flight: Arc<Semaphore>,
    tcp_clients: Arc<Semaphore>,
    /// The uid its sockets are made as (dns/owned.rs); None: PID 1's own, root.
    socket_uid: Option<u32>,
    /// Answers asked again within their TTL (cache.rs).
    cache: cache::AnswerCache,
}

impl DnsGate {
    pub fn new(
        upstreams: Vec<SocketAddr>,
        sink: Arc<dyn AddressSink>,
        denials: Arc<DenialLog>,
    ) -> Arc<DnsGate> {
        DnsGate::owned_by(upstreams, sink, denials, None)
    }

    /// The gate of [`DnsGate::new`] whose sockets, listening and upstream, are `uid`'s.
    pub fn owned_by(
        upstreams: Vec<SocketAddr>,
        sink: Arc<dyn AddressSink>,
        denials: Arc<DenialLog>,
        socket_uid: Option<u32>,
    ) -> Arc<DnsGate> {
        Arc::new(DnsGate {
            upstreams,
            sink,
            denials,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            tcp_clients: Arc::new(Semaphore::new(MAX_TCP_CLIENTS)),
            socket_uid,
            cache: cache::AnswerCache::default(),
        })
    }

    /// Binds UDP and TCP on `addr` and serves until the runtime ends.
    pub async fn serve(self: &Arc<Self>, addr: SocketAddr) -> std::io::Result<()> {
        let udp = Arc::new(owned::udp(self.socket_uid, addr)?);
        let tcp = owned::Listener::bind(self.socket_uid, addr)?;
        let gate = self.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(65535);
            loop {
                buf.clear();
                let Ok((_, client)) = udp.recv_buf_from(&mut buf).await else { continue };
                // Full: the query is dropped and its client retries, rather than every query
                // of a flood holding a task and an upstream socket.
                let Ok(permit) = gate.in_flight.clone().try_acquire_owned() else { continue };
                let (gate, udp, packet) = (gate.clone(), udp.clone(), buf.clone());
                tokio::spawn(async move {
                    if let Some(reply) = gate.handle(&packet, Transport::Udp).await {
                        let _ = udp.send_to(&reply, client).await;
                    }
                    drop(permit);
                });
            }
        });
        let gate = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok(permit) = gate.tcp_clients.clone().acquire_owned().await else { return };
                let Ok(stream) = tcp.accept().await else { continue };
                let gate = gate.clone();
                tokio::spawn(async move {
                    gate.serve_tcp(stream).await;
                    drop(permit);
                });
            }
        });
        Ok(())
    }

    async fn serve_tcp(&self, mut stream: TcpStream) {
        loop {
            let Ok(Some(packet)) =
                tokio::time::timeout(TCP_IDLE, read_frame(&mut stream)).await.unwrap_or(Ok(None))
            else {
                return;
            };
            let Some(reply) = self.handle(&packet, Transport::Tcp).await else { return };
            if write_frame(&mut stream, &reply).await.is_err() {
                return;
            }
        }
    }

    /// One query in, at most one reply out.
    pub async fn handle(&self, packet: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let allowlist = self.sink.allowlist();
        match decide(packet, &allowlist)? {
            Decision::Reply { packet, refused } => {
                if let Some(denial) = refused {
                    self.denials.record(denial);
                }
                Some(packet)
            }
            Decision::Forward { id, query, access, upstream } => {
                // The question without its id: the cache's key.
                let question = upstream.get(2..).unwrap_or_default().to_vec();
                if let Some(cached) = self.cache.get(&question, transport, &allowlist, id) {
                    return Some(cached);
                }
                let ours = random_id();
                let mut forwarded = upstream;
                forwarded[..2].copy_from_slice(&ours.to_be_bytes());
                let Some(answer) = self.exchange(&forwarded, ours, &query, transport).await else {
                    return Some(servfail(id, &query));
                };
                let addresses = match answer_addresses(&answer, ours, &query) {
                    Ok(addresses) => addresses,
                    Err(_) => return Some(servfail(id, &query)),
                };
                let (addresses, inward) = split_inward(addresses, access.private);
                if let Some((scope, inward)) = inward {
                    let name = query.name().to_ascii();
                    let kind = query.query_type().to_string();
                    self.denials.record(Denial::Inward { name, kind, scope, addresses: inward });
                    if addresses.is_empty() {
                        return Some(refused(id, &query));
                    }
                }
                let elements: Vec<Element> = addresses
                    .into_iter()
                    .flat_map(|(addr, ttl)| Element::for_answer(addr, &access, ttl))
                    .collect();
                let cacheable = !elements.is_empty();
                if !elements.is_empty() {
                    let (sink, name) = (self.sink.clone(), query.name().to_ascii());
                    let allowed = tokio::task::spawn_blocking(move || sink.allow(&name, elements)).await;
                    let denial = |reason| Denial::Name {
                        name: query.name().to_ascii(),
                        kind: query.query_type().to_string(),
                        reason,
                    };
                    match allowed {
                        Ok(Ok(())) => {}
                        Ok(Err(SinkError::NotAllowed)) => {
                            self.denials.record(denial(Reason::PolicyChanged));
                            return Some(refused(id, &query));
                        }
                        Ok(Err(SinkError::Full { .. })) => {
                            self.denials.record(denial(Reason::SetsFull));
                            return Some(servfail(id, &query));
                        }
                        other => {
                            console::err(format!(
                                "sandbox-init: cannot allow the addresses of {}: {other:?}",
                                query.name()
                            ));
                            return Some(servfail(id, &query));
                        }
                    }
                }
                let mut answer = cache::capped(answer);
                if cacheable {
                    self.cache.put(&question, transport, &allowlist, &answer);
                }
                answer[..2].copy_from_slice(&id.to_be_bytes());
                Some(answer)
            }
        }
    }

    async fn exchange(&self, packet: &[u8], id: u16, query: &Query, transport: Transport) -> Option<Vec<u8>> {
        for upstream in &self.upstreams {
            let answer = match transport {
                Transport::Udp => {
                    tokio::time::timeout(
                        UPSTREAM_TIMEOUT,
                        exchange_udp(self.socket_uid, *upstream, packet, id, query),
                    )
                    .await
                }
                Transport::Tcp => {
                    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange_tcp(self.socket_uid, *upstream, packet))
                        .await
                }
            };
            if let Ok(Ok(answer)) = answer {
                return Some(answer);
            }
        }
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Sends from a fresh socket (a random port the kernel picks) connected to the upstream, so
/// only datagrams from the upstream's address and port arrive; of those, only one with our id
/// and our question is the answer: anything else is not ours (late, or forged) and ignored.
async fn exchange_udp(
    uid: Option<u32>,
    upstream: SocketAddr,
    packet: &[u8],
    id: u16,
    query: &Query,
) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("valid");
    let socket = owned::udp(uid, local)?;
    socket.connect(upstream).await?;
    socket.send(packet).await?;
    let mut buf = Vec::with_capacity(65535);
    loop {
        buf.clear();
        socket.recv_buf(&mut buf).await?;
        if Message::from_vec(&buf).is_ok_and(|m| answers(&m, id, query)) {
            return Ok(buf);
        }
    }
}

async fn exchange_tcp(uid: Option<u32>, upstream: SocketAddr, packet: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = owned::connect(uid, upstream).await?;
    write_frame(&mut stream, packet).await?;
    read_frame(&mut stream).await?.ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into())
}

async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut packet = vec![0u8; u16::from_be_bytes(len).into()];
    stream.read_exact(&mut packet).await?;
    Ok(Some(packet))
}

async fn write_frame(stream: &mut TcpStream, packet: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(packet.len()).map_err(|_| std::io::ErrorKind::InvalidData)?;
    let mut frame = Vec::with_capacity(packet.len() + 2);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(packet);
    stream.write_all(&frame).await
}

/// The resolvers of a resolv.conf, and whether the file is already the gate's own.
pub fn resolv_conf_upstreams(text: &str) -> Vec<IpAddr> {
    // After a container restart the file is ours: the upstreams are in the marker line.
    if let Some(line) = text.lines().find_map(|l| l.strip_prefix(RESOLV_MARKER)) {
        return line.split_whitespace().filter_map(|a| a.parse().ok()).collect();
    }
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

const RESOLV_MARKER: &str = "# agent-sandbox DNS gate; upstream: ";

/// Whether a resolv.conf names the gate and no other resolver: what a Kubernetes pod's
/// `dnsConfig` gives every container, in a file that may be read-only.
pub fn names_only_the_gate(text: &str) -> bool {
    let servers: Vec<&str> =
        text.lines().filter_map(|l| l.trim().strip_prefix("nameserver")).map(str::trim).collect();
    servers == [GATE_ADDR.ip().to_string()]
}

/// resolv.conf pointing at the gate; search and options lines are kept.
pub fn gate_resolv_conf(original: &str, upstreams: &[IpAddr]) -> String {
    let list: Vec<String> = upstreams.iter().map(IpAddr::to_string).collect();
    let mut text = format!("{RESOLV_MARKER}{}\nnameserver 127.0.0.1\n", list.join(" "));
    for line in original.lines() {
        let line = line.trim();
        if line.starts_with("search") || line.starts_with("options") || line.starts_with("domain") {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

mod cache;
pub mod owned;
pub mod sink;
#[cfg(test)]
mod tests;
