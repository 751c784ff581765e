//! The DNS gate on 127.0.0.1:53 (UDP and TCP). A query for a name outside the allowlist is
//! answered REFUSED and logged, and never leaves the container: no DNS exfiltration. A query for
//! an allowed name is forwarded to the container's original resolver, and every A/AAAA address
//! of the answer (following CNAMEs) is added to the firewall's sets before the answer is returned.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::denials::{Denial, DenialLog};
use crate::firewall::{Element, Nft, add_elements, create_elements};
use crate::policy::{Allowlist, Ports};

/// How long an upstream resolver gets to answer before the next one is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// CNAME chains longer than this are not followed (a loop, or an attack).
const MAX_CNAME_CHAIN: usize = 16;

/// What the gate does with one query packet.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Reply at once with this packet; `refused` names the query that was denied.
    Reply { packet: Vec<u8>, refused: Option<(String, String)> },
    /// Forward to the upstream; on the answer, allow its addresses on these ports.
    Forward { id: u16, query: Query, ports: Ports },
}

/// Decides on a packet from a client. None: not a DNS query at all, dropped without a reply.
pub fn decide(packet: &[u8], allowlist: &Allowlist) -> Option<Decision> {
    let message = Message::from_vec(packet).ok()?;
    if message.message_type() != MessageType::Query {
        return None;
    }
    let reply = |code: ResponseCode| {
        let mut reply = Message::error_msg(message.id(), message.op_code(), code);
        reply.add_queries(message.queries().iter().cloned());
        reply.set_recursion_desired(message.recursion_desired()).set_recursion_available(true);
        reply.to_vec().ok()
    };
    if message.op_code() != OpCode::Query {
        return Some(Decision::Reply { packet: reply(ResponseCode::NotImp)?, refused: None });
    }
    let [query] = message.queries() else {
        return Some(Decision::Reply { packet: reply(ResponseCode::FormErr)?, refused: None });
    };
    let name = query.name().to_ascii();
    match allowlist.ports(&name) {
        Some(ports) => Some(Decision::Forward { id: message.id(), query: query.clone(), ports }),
        None => {
            let refused = Some((name, query.query_type().to_string()));
            Some(Decision::Reply { packet: reply(ResponseCode::Refused)?, refused })
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("the upstream's answer is not a DNS message")]
    Malformed,
    #[error("the upstream's answer does not match the query")]
    Mismatch,
}

/// The addresses an upstream answer gives for the query's name, with their TTLs: A and AAAA
/// records of the name or of a name its CNAME chain leads to. Records for other names are
/// ignored, so an answer cannot smuggle in an address for a name nobody asked about.
pub fn answer_addresses(answer: &[u8], id: u16, query: &Query) -> Result<Vec<(IpAddr, u32)>, AnswerError> {
    let message = Message::from_vec(answer).map_err(|_| AnswerError::Malformed)?;
    let matches = message.id() == id
        && message.message_type() == MessageType::Response
        && message.queries().len() == 1
        && message.queries()[0].name().eq_case(query.name())
        && message.queries()[0].query_type() == query.query_type();
    if !matches {
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
    Ok(addresses)
}

fn servfail(id: u16, query: &Query) -> Vec<u8> {
    let mut reply = Message::error_msg(id, OpCode::Query, ResponseCode::ServFail);
    reply.add_query(query.clone());
    reply.to_vec().unwrap_or_default()
}

/// Where allowed addresses go: the firewall's sets, or a recorder in tests.
pub trait AddressSink: Send + Sync + 'static {
    /// Allows the elements, resolved for `name`, before the answer is released. Blocking.
    fn allow(&self, name: &str, elements: Vec<Element>) -> Result<(), String>;
}

/// The firewall's sets, with a record of what was written so repeats within a few seconds do
/// not run nft again.
pub struct NftSink {
    nft: Nft,
    /// Each element written, with its expiry and the name it was resolved for.
    written: Mutex<HashMap<(IpAddr, u16), (Instant, String)>>,
}

/// What one answer's elements need: `new` ones are created with a plain `add` (an nft run of
/// a few ms); `refresh` ones exist and are past half their time, so they get the new timeout
/// by add, delete, add (older kernels keep an existing element's timeout on `add`), which
/// costs a kernel RCU grace period (tens of ms), hence at most once per half-life. The rest
/// were written recently enough: a cached name costs no nft run at all.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Writes {
    pub new: Vec<Element>,
    pub refresh: Vec<Element>,
}

pub fn plan_writes(
    written: &HashMap<(IpAddr, u16), (Instant, String)>,
    elements: Vec<Element>,
    now: Instant,
) -> Writes {
    let mut writes = Writes::default();
    for e in elements {
        match written.get(&(e.addr, e.port)) {
            Some((expiry, _)) if *expiry > now => {
                if *expiry - now < e.timeout / 2 {
                    writes.refresh.push(e);
                }
            }
            _ => writes.new.push(e),
        }
    }
    writes
}

impl NftSink {
    pub fn new(nft: Nft) -> NftSink {
        NftSink { nft, written: Mutex::new(HashMap::new()) }
    }

    /// The elements a new allowlist keeps, with their remaining time: those still unexpired
    /// whose name it still allows on that port. The rest are forgotten, as the table that
    /// replaces the old one will not have them.
    pub fn retain(&self, allowlist: &Allowlist) -> Vec<Element> {
        let now = Instant::now() + Duration::from_secs(1);
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        written.retain(|(_, port), (expiry, name)| {
            *expiry > now && allowlist.ports(name).is_some_and(|ports| ports.contains(port))
        });
        written
            .iter()
            .map(|(&(addr, port), (expiry, _))| Element { addr, port, timeout: *expiry - now })
            .collect()
    }
}

impl AddressSink for NftSink {
    fn allow(&self, name: &str, elements: Vec<Element>) -> Result<(), String> {
        let now = Instant::now();
        let writes = plan_writes(&self.written.lock().unwrap_or_else(|e| e.into_inner()), elements, now);
        if writes.new.is_empty() && writes.refresh.is_empty() {
            return Ok(());
        }
        let script = create_elements(&writes.new) + &add_elements(&writes.refresh);
        self.nft.apply(&script).map_err(|e| e.to_string())?;
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        for e in writes.new.into_iter().chain(writes.refresh) {
            written.insert((e.addr, e.port), (now + e.timeout, name.to_string()));
        }
        Ok(())
    }
}

/// The gate: its allowlist (replaced on reload), upstreams, sink and denial log.
pub struct DnsGate {
    allowlist: RwLock<Arc<Allowlist>>,
    upstreams: Vec<SocketAddr>,
    sink: Arc<dyn AddressSink>,
    denials: Arc<DenialLog>,
}

impl DnsGate {
    pub fn new(
        allowlist: Allowlist,
        upstreams: Vec<SocketAddr>,
        sink: Arc<dyn AddressSink>,
        denials: Arc<DenialLog>,
    ) -> Arc<DnsGate> {
        Arc::new(DnsGate { allowlist: RwLock::new(Arc::new(allowlist)), upstreams, sink, denials })
    }

    pub fn set_allowlist(&self, allowlist: Allowlist) {
        *self.allowlist.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(allowlist);
    }

    fn allowlist(&self) -> Arc<Allowlist> {
        self.allowlist.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Binds UDP and TCP on `addr` and serves until the runtime ends.
    pub async fn serve(self: &Arc<Self>, addr: SocketAddr) -> std::io::Result<()> {
        let udp = Arc::new(UdpSocket::bind(addr).await?);
        let tcp = TcpListener::bind(addr).await?;
        let gate = self.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65535];
            loop {
                let Ok((len, client)) = udp.recv_from(&mut buf).await else { continue };
                let (gate, udp, packet) = (gate.clone(), udp.clone(), buf[..len].to_vec());
                tokio::spawn(async move {
                    if let Some(reply) = gate.handle(&packet, Transport::Udp).await {
                        let _ = udp.send_to(&reply, client).await;
                    }
                });
            }
        });
        let gate = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = tcp.accept().await else { continue };
                let gate = gate.clone();
                tokio::spawn(async move { gate.serve_tcp(stream).await });
            }
        });
        Ok(())
    }

    async fn serve_tcp(&self, mut stream: TcpStream) {
        loop {
            let Ok(Some(packet)) = tokio::time::timeout(Duration::from_secs(10), read_frame(&mut stream))
                .await
                .unwrap_or(Ok(None))
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
        let allowlist = self.allowlist();
        match decide(packet, &allowlist)? {
            Decision::Reply { packet, refused } => {
                if let Some((name, kind)) = refused {
                    self.denials.record(Denial::Name { name, kind });
                }
                Some(packet)
            }
            Decision::Forward { id, query, ports } => {
                let Some(answer) = self.exchange(packet, id, transport).await else {
                    return Some(servfail(id, &query));
                };
                let addresses = match answer_addresses(&answer, id, &query) {
                    Ok(addresses) => addresses,
                    Err(_) => return Some(servfail(id, &query)),
                };
                let elements: Vec<Element> = addresses
                    .into_iter()
                    .flat_map(|(addr, ttl)| Element::for_answer(addr, &ports, ttl))
                    .collect();
                if !elements.is_empty() {
                    let (sink, name) = (self.sink.clone(), query.name().to_ascii());
                    let allowed = tokio::task::spawn_blocking(move || sink.allow(&name, elements)).await;
                    if !matches!(allowed, Ok(Ok(()))) {
                        eprintln!(
                            "sandbox-init: cannot allow the addresses of {}: {allowed:?}",
                            query.name()
                        );
                        return Some(servfail(id, &query));
                    }
                }
                Some(answer)
            }
        }
    }

    async fn exchange(&self, packet: &[u8], id: u16, transport: Transport) -> Option<Vec<u8>> {
        for upstream in &self.upstreams {
            let answer = match transport {
                Transport::Udp => {
                    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange_udp(*upstream, packet, id)).await
                }
                Transport::Tcp => {
                    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange_tcp(*upstream, packet)).await
                }
            };
            if let Ok(Ok(answer)) = answer {
                return Some(answer);
            }
        }
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

async fn exchange_udp(upstream: SocketAddr, packet: &[u8], id: u16) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("valid");
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(packet).await?;
    let mut buf = vec![0u8; 65535];
    loop {
        let len = socket.recv(&mut buf).await?;
        // A datagram with another id is not our answer (late, or spoofed): keep waiting.
        if len >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
            buf.truncate(len);
            return Ok(buf);
        }
    }
}

async fn exchange_tcp(upstream: SocketAddr, packet: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
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

#[cfg(test)]
mod tests;
