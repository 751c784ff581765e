//! The key forwarder: `sandbox-init forwarder`, a process of its own user (no capability, no
//! key in its environment or arguments) that holds the API keys for the agent. Per API it
//! serves plain HTTP/1.1 on a loopback port PID 1 bound; each request is sent on over TLS to
//! that API's host and to no other, with the agent's placeholder swapped for the real key, and
//! the answer streams back as it comes.
//!
//! What a request may not do: name another host (an absolute target, a `Host` header, a
//! `CONNECT`), carry more than one request (the upstream is told `Connection: close`), or take
//! the key anywhere (no header the agent sent survives under the key's name). Redirects are not
//! followed: they go back to the agent's CLI, with no key in them, one to another forwarded
//! host pointed at that host's forwarder (only the forwarder reaches it). Unless the policy allows the
//! API's remote tools, a request's body is read whole first (bounded in size and time) and
//! refused if it names one (sandbox-wire's `forwarder::inspect`): the provider would contact a URL of the
//! agent's choosing with it.
//!
//! Below it, PID 1's side: the keys it holds (`keys`), the route of each host it alone reaches,
//! a held key's or a forwarded service's (`routes`), and the process as PID 1 runs it
//! (`service`); and the process's own relay of one request's body (`relay`).

pub mod keys;
pub mod relay;
pub mod routes;
pub mod service;

use std::os::fd::{FromRawFd as _, RawFd};
use std::sync::Arc;
use std::time::Duration;

use sandbox_wire::http1;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

pub use sandbox_wire::forwarder::Refused;
use sandbox_wire::forwarder::inspect::{body_framing, inspected_head, judge_body, judge_head};
use sandbox_wire::forwarder::request::{Route, json_content, redirected, refusal_answer, rewrite_head};
use sandbox_wire::forwarder::rules::Verdict;

use crate::net::forwarder::relay::read_body;

/// The descriptor the configuration arrives on (a memfd PID 1 wrote); listeners follow it.
pub const CONFIG_FD: RawFd = 3;
/// The largest request head the forwarder reads.
const MAX_HEAD: usize = 64 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(60);
const BODY_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// The system's trust store, as Debian's ca-certificates writes it.
pub const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What PID 1 hands the forwarder, over [`CONFIG_FD`].
#[derive(Serialize, Deserialize)]
pub struct Config {
    pub routes: Vec<Route>,
    /// PEM certificates trusted besides the system's (a root-only secret), if any.
    pub extra_ca: Option<String>,
    /// A datagram socket to PID 1, for the [`RefusedRequest`]s it logs in connections.jsonl.
    #[serde(default)]
    pub report_fd: Option<RawFd>,
    /// The resolver it asks: the DNS gate, where the firewall is on (never the file the agent's
    /// container shares in sidecar mode, which root there could rewrite); None: resolv.conf's
    /// first (no gate runs).
    #[serde(default)]
    pub resolver: Option<std::net::IpAddr>,
    /// Every forwarded host and its port on 127.0.0.1: a redirect to one is followed through it.
    #[serde(default)]
    pub forwarded: Vec<(String, u16)>,
}

/// A request the forwarder refused, as it tells PID 1.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedRequest {
    pub host: String,
    /// The forwarder's port the agent asked.
    pub port: u16,
    pub status: u16,
    pub reason: String,
}

/// `sandbox-init forwarder`: serves every route until killed.
pub fn run() -> u8 {
    match serve() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandbox-init forwarder: {e}");
            crate::exit::Refusal::SetupFailed.code()
        }
    }
}

fn serve() -> Result<(), String> {
    // SAFETY: PID 1 passed this descriptor for us alone.
    let mut file = unsafe { std::fs::File::from_raw_fd(CONFIG_FD) };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).map_err(|e| format!("the configuration: {e}"))?;
    drop(file);
    let config: Config = serde_json::from_str(&text).map_err(|e| format!("the configuration: {e}"))?;
    let forwarded = Arc::new(config.forwarded);
    let tls = Arc::new(client_config(config.extra_ca.as_deref())?);
    let reports = config.report_fd.map(|fd| {
        // SAFETY: PID 1 passed this descriptor for us alone.
        let socket = unsafe { std::os::unix::net::UnixDatagram::from_raw_fd(fd) };
        // A report that would block is dropped: the agent's refusals never stall the forwarder.
        let _ = socket.set_nonblocking(true);
        Arc::new(socket)
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let mut tasks = Vec::new();
        for route in config.routes {
            // SAFETY: a listener PID 1 bound and passed at this descriptor.
            let listener = unsafe { std::net::TcpListener::from_raw_fd(route.fd) };
            listener.set_nonblocking(true).map_err(|e| e.to_string())?;
            let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
            let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
            let served = Arc::new(Served {
                route,
                tls: tls.clone(),
                reports: reports.clone(),
                port,
                resolver: config.resolver,
                forwarded: forwarded.clone(),
            });
            tasks.push(tokio::spawn(accept(listener, served)));
        }
        for task in tasks {
            let _ = task.await;
        }
        Ok(())
    })
}

/// The trust the forwarder verifies the API with: the system's store and the extra CA.
pub fn client_config(extra: Option<&str>) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    let system = std::fs::read(SYSTEM_CAS).unwrap_or_default();
    let (added, _) = roots.add_parsable_certificates(CertificateDer::pem_slice_iter(&system).flatten());
    let mut extra_added = 0;
    if let Some(pem) = extra {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("the extra CA: {e}"))?;
            roots.add(cert).map_err(|e| format!("the extra CA: {e}"))?;
            extra_added += 1;
        }
    }
    if added + extra_added == 0 {
        return Err(format!(
            "no CA to verify the APIs with: {SYSTEM_CAS} is missing or empty and no extra CA"
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The most requests the forwarder serves at once, per API: past it, connections wait in the
/// listener's backlog (the agent's flood costs it time, not the forwarder's memory).
const MAX_CONNECTIONS: usize = 256;

/// What each connection of one listener is served with.
struct Served {
    route: Route,
    tls: Arc<rustls::ClientConfig>,
    reports: Option<Arc<std::os::unix::net::UnixDatagram>>,
    port: u16,
    resolver: Option<std::net::IpAddr>,
    forwarded: Arc<Vec<(String, u16)>>,
}

impl Served {
    /// Tells PID 1 of a refusal, for connections.jsonl; dropped if PID 1 is not reading.
    fn report(&self, refused: &Refused) {
        let Some(socket) = &self.reports else { return };
        let refusal = RefusedRequest {
            host: self.route.host.clone(),
            port: self.port,
            status: refused.status(),
            reason: refused.reason().to_string(),
        };
        if let Ok(bytes) = serde_json::to_vec(&refusal) {
            let _ = socket.send(&bytes);
        }
    }
}

async fn accept(listener: TcpListener, served: Arc<Served>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((client, _)) => {
                let served = served.clone();
                tokio::spawn(async move {
                    handle(client, &served).await;
                    drop(slot);
                });
            }
            // Out of descriptors, for one: the next accept may work.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn handle(mut client: TcpStream, served: &Served) {
    let (route, tls) = (&served.route, served.tls.clone());
    let result = async {
        let (raw, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
            Ok(read) => read?,
            Err(_) => return Err(Refused::new(408, "no request head in time")),
        };
        let head = match http1::parse_head(&raw) {
            Ok(Some(head)) => head,
            Ok(None) => return Err(Refused::new(400, "no request head")),
            Err(why) => return Err(Refused::new(400, why)),
        };
        let rewritten = rewrite_head(&head, route)?;
        let verdict = route.rules.judge_head(&rewritten.request())?;
        let api = route.inspect.as_deref();
        let whole = verdict == Verdict::Body || api.is_some();
        let framing = body_framing(&head, whole)?;
        if matches!(rewritten.method.as_str(), "GET" | "HEAD")
            && framing.body != http1::BodyLength::Length(0)
        {
            return Err(Refused::new(400, format!("a {} with a body, which servers read differently", rewritten.method)));
        }
        if verdict == Verdict::Body && !json_content(&head) {
            return Err(Refused::new(415, "a request body the rules read must be sent as JSON (Content-Type: application/json)"));
        }
        if !whole {
            let upstream = connect(route, tls, served.resolver).await.map_err(|e| Refused::new(502, e))?;
            return relay(&mut client, upstream, &rewritten.head, rest, framing.body, served).await;
        }
        if let Some(api) = api {
            judge_head(&head, api)?;
        }
        if framing.expect_continue {
            client.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.map_err(|e| Refused::new(400, e.to_string()))?;
        }
        let body = match tokio::time::timeout(BODY_TIMEOUT, read_body(&mut client, rest, framing.body)).await {
            Ok(body) => body?,
            Err(_) => return Err(Refused::new(408, "no whole request body in time")),
        };
        if verdict == Verdict::Body {
            route.rules.judge_body(&rewritten.request(), &body)?;
        }
        if let Some(api) = api
            && let Some(tool) = judge_body(&route.host, &body)?
        {
            if route.upstream.is_some() {
                return Err(Refused::new(
                    403,
                    format!(
                        "the request names {tool}: your model server, or what it passes the request on to, \
                         would fetch it, at an address of the agent's choosing; a model server's requests \
                         carry their content inline"
                    ),
                ));
            }
            return Err(Refused::new(
                403,
                format!(
                    "the request names {tool}; with the key it holds, the provider would carry the \
                     request's data to an address of the agent's choosing. `apis: {{{api}: {{remote_tools: allow}}}}` \
                     in a policy allows it"
                ),
            ));
        }
        let mut upstream = connect(route, tls, served.resolver).await.map_err(|e| Refused::new(502, e))?;
        let sent = [inspected_head(&rewritten.head, body.len()), body].concat();
        upstream.write_all(&sent).await.map_err(|e| Refused::new(502, format!("{}: {e}", route.host)))?;
        // One request: anything the agent sends after it goes nowhere; the answer streams back.
        let _ = answer(&mut upstream, &mut client, &served.forwarded).await;
        let _ = client.shutdown().await;
        Ok(())
    }
    .await;
    if let Err(refused) = result {
        served.report(&refused);
        let _ = client.write_all(refusal_answer(&refused).as_bytes()).await;
        let _ = client.shutdown().await;
    }
    linger(&mut client).await;
}

/// How long, and how much, a closing connection is read after its answer.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// Reads and drops what the client still sends after its answer (a body no one read: a refused
/// request's, or one the server answered before it came whole), until it closes, for
/// [`LINGER`] at most. Closed with unread bytes, the socket would send a reset, and a reset can
/// destroy the answer the client has not read yet (RFC 9112, 9.6: a lingering close).
async fn linger(client: &mut TcpStream) {
    let drain = async {
        let (mut chunk, mut read) = ([0u8; 8192], 0);
        while read < LINGER_BYTES {
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Sends `head` and the body it frames upstream as the agent's bytes come (relay.rs: that
/// request and no other), while the answer streams back; done when the answer ends.
async fn relay(
    client: &mut TcpStream,
    upstream: Upstream,
    head: &[u8],
    rest: Vec<u8>,
    body: http1::BodyLength,
    served: &Served,
) -> Result<(), Refused> {
    let host = &served.route.host;
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let (mut c_read, mut c_write) = client.split();
    let send = async {
        up_write.write_all(head).await.map_err(|e| Refused::new(502, format!("{host}: {e}")))?;
        crate::net::forwarder::relay::copy_body(&mut c_read, &mut up_write, rest, body).await?;
        up_write.flush().await.map_err(|e| Refused::new(502, format!("{host}: {e}")))
    };
    {
        let answer = answer(&mut up_read, &mut c_write, &served.forwarded);
        tokio::pin!(answer);
        tokio::select! {
            sent = send => {
                sent?;
                let _ = answer.await;
            }
            _ = &mut answer => {}
        }
    }
    let _ = c_write.shutdown().await;
    Ok(())
}

/// The most of an answer's head read to rewrite its `Location`: past it, the answer streams as
/// it is.
const MAX_ANSWER_HEAD: usize = 32 * 1024;

/// Streams the upstream's answer to the client: its head (and any interim 1xx head before it)
/// with a redirect to a forwarded host pointed at that host's forwarder, then the rest as it
/// comes.
async fn answer<R, W>(upstream: &mut R, client: &mut W, forwarded: &[(String, u16)]) -> std::io::Result<u64>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break Some(end + 4);
            }
            if buf.len() > MAX_ANSWER_HEAD {
                break None;
            }
            let n = upstream.read(&mut chunk).await?;
            if n == 0 {
                break None;
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let Some(end) = end else {
            client.write_all(&buf).await?;
            break;
        };
        let rest = buf.split_off(end);
        let interim = buf.starts_with(b"HTTP/1.1 1") && !buf.starts_with(b"HTTP/1.1 101");
        client.write_all(&redirected(&buf, forwarded).unwrap_or(buf)).await?;
        buf = rest;
        if !interim {
            client.write_all(&buf).await?;
            break;
        }
    }
    tokio::io::copy(upstream, client).await
}

/// The head up to and with its blank line, and whatever came after it in the same reads.
async fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), Refused> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = http1::head_end(&buf) {
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(Refused::new(431, format!("a request head over {MAX_HEAD} bytes")));
        }
        let n = client.read(&mut chunk).await.map_err(|e| Refused::new(400, e.to_string()))?;
        if n == 0 {
            return Err(Refused::new(400, "the connection ended inside the request head"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A connection upstream: TLS, or a model server's plain HTTP.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for S {}
type Upstream = Box<dyn Stream>;

/// The route's upstream: TLS to its `host`:443, the address asked of the DNS gate like any
/// process's; or, for a model server of the user's, the one address the launcher named (which
/// the firewall opens to this uid alone), over TLS to its name or in plain HTTP.
async fn connect(
    route: &Route,
    tls: Arc<rustls::ClientConfig>,
    resolver: Option<std::net::IpAddr>,
) -> Result<Upstream, String> {
    let host = route.host.as_str();
    if let Some(fixed) = &route.upstream {
        let address = fixed.address;
        let attempt = async {
            let stream = TcpStream::connect(address)
                .await
                .map_err(|e| format!("cannot connect to {host} ({address}): {e}"))?;
            let _ = stream.set_nodelay(true);
            let Some(name) = &fixed.server_name else { return Ok(Box::new(stream) as Upstream) };
            let name =
                rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| format!("{name}: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS with {host} ({address}): {e}"))?;
            Ok(Box::new(stream) as Upstream)
        };
        return tokio::time::timeout(CONNECT_TIMEOUT, attempt)
            .await
            .map_err(|_| format!("{host} did not answer in time"))?;
    }
    let name =
        rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let attempt = async {
        let addrs = resolve(host, resolver).await?;
        let mut last = format!("{host} resolved to no address");
        for addr in addrs.into_iter().map(|ip| std::net::SocketAddr::new(ip, 443)) {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return tokio_rustls::TlsConnector::from(tls.clone())
                        .connect(name.clone(), stream)
                        .await
                        .map(|s| Box::new(s) as Upstream)
                        .map_err(|e| format!("TLS with {host} ({addr}): {e}"));
                }
                Err(e) => last = format!("cannot connect to {host} ({addr}): {e}"),
            }
        }
        Err(last)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .map_err(|_| format!("{host} did not answer in time"))?
}

/// The addresses of `host`, asked of `resolver` (the DNS gate, which opens them in the firewall
/// as for any process), else of resolv.conf's first: A first, then AAAA.
async fn resolve(host: &str, resolver: Option<std::net::IpAddr>) -> Result<Vec<std::net::IpAddr>, String> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RData, RecordType};
    use std::str::FromStr as _;
    let server: std::net::IpAddr = match resolver {
        Some(gate) => gate,
        None => std::fs::read_to_string("/etc/resolv.conf")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.trim().strip_prefix("nameserver").and_then(|a| a.trim().parse().ok()))
            .ok_or("/etc/resolv.conf names no resolver")?,
    };
    let name = Name::from_str(&format!("{host}.")).map_err(|e| format!("{host}: {e}"))?;
    let mut last = format!("cannot resolve {host}");
    for kind in [RecordType::A, RecordType::AAAA] {
        let mut query = Message::new();
        query.set_id(rand_id()).set_recursion_desired(true).add_query(Query::query(name.clone(), kind));
        let packet = query.to_vec().map_err(|e| e.to_string())?;
        let local = if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let socket = tokio::net::UdpSocket::bind(local).await.map_err(|e| e.to_string())?;
        socket.connect((server, 53)).await.map_err(|e| e.to_string())?;
        socket.send(&packet).await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4096];
        let Ok(Ok(len)) = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf)).await else {
            last = format!("cannot resolve {host}: the resolver did not answer");
            continue;
        };
        let Ok(reply) = Message::from_vec(&buf[..len]) else { continue };
        if reply.id() != query.id() {
            continue;
        }
        let addrs: Vec<std::net::IpAddr> = reply
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(std::net::IpAddr::V6(a.0)),
                _ => None,
            })
            .collect();
        if !addrs.is_empty() {
            return Ok(addrs);
        }
        last = format!("cannot resolve {host}: {}", reply.response_code());
    }
    Err(last)
}

fn rand_id() -> u16 {
    let mut id = [0u8; 2];
    // SAFETY: getrandom into a local buffer of that length.
    unsafe { libc::getrandom(id.as_mut_ptr().cast(), 2, 0) };
    u16::from_ne_bytes(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer reaches the client whole, its head rewritten where it redirects to a
    /// forwarded host, whether it comes in one read or byte by byte.
    #[tokio::test]
    async fn the_answer_streams_whole_with_its_redirect_rewritten() {
        let forwarded = vec![("objects.githubusercontent.com".to_string(), 15115)];
        for (sent, expected) in [
            ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}".to_string(), None),
            (
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 302 Found\r\nLocation: https://objects.githubusercontent.com/a\r\n\r\nrest".to_string(),
                Some("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:15115/a\r\n\r\nrest"),
            ),
            ("no head at all".to_string(), None),
        ] {
            for step in [1, 4096] {
                let (mut up_near, mut up_far) = tokio::io::duplex(64);
                let (mut client_near, mut client_far) = tokio::io::duplex(1 << 16);
                let bytes = sent.clone().into_bytes();
                let writer = tokio::spawn(async move {
                    for chunk in bytes.chunks(step) {
                        up_far.write_all(chunk).await.unwrap();
                    }
                });
                answer(&mut up_near, &mut client_near, &forwarded).await.unwrap();
                writer.await.unwrap();
                drop(client_near);
                let mut got = String::new();
                client_far.read_to_string(&mut got).await.unwrap();
                assert_eq!(got, expected.unwrap_or(&sent), "step {step}");
            }
        }
    }
}
