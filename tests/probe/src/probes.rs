//! Probes a well-behaved agent would make: connect, send, ping, resolve, keep a connection.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use crate::{Args, report};

pub fn outcome_of(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ECONNREFUSED) => "refused".into(),
        Some(libc::ECONNRESET) => "reset".into(),
        _ if error.kind() == std::io::ErrorKind::UnexpectedEof => "reset".into(),
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => "unreachable".into(),
        Some(libc::EPERM) | Some(libc::EACCES) => "not-permitted".into(),
        Some(libc::ETIMEDOUT) | Some(libc::EAGAIN) => "timeout".into(),
        // The sandbox's own refusal, in the protocol spoken: its 403 (`web::get`) or a TLS
        // access_denied alert.
        _ if error.kind() == std::io::ErrorKind::PermissionDenied => "denied".into(),
        _ if error
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .is_some_and(|e| *e == rustls::Error::AlertReceived(rustls::AlertDescription::AccessDenied)) =>
        {
            "denied".into()
        }
        _ if error.kind() == std::io::ErrorKind::TimedOut
            || error.kind() == std::io::ErrorKind::WouldBlock =>
        {
            "timeout".into()
        }
        _ => format!("error:{error}"),
    }
}

/// Resolves HOST through /etc/resolv.conf's first nameserver (the DNS gate in a sandbox), as
/// any program would; an address literal is used as is. Err: the DNS outcome to report.
pub fn resolve(host: &str, timeout: Duration) -> Result<IpAddr, String> {
    if let Ok(addr) = host.parse::<IpAddr>() {
        return Ok(addr);
    }
    let server = nameserver().ok_or("dns:no-nameserver")?;
    let mut last = String::from("dns:no-address");
    for kind in [RecordType::A, RecordType::AAAA] {
        match query(host, kind, server, timeout, None) {
            Ok(reply) if reply.response_code() == ResponseCode::NoError => {
                if let Some(addr) = reply.answers().iter().find_map(|r| match r.data() {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                }) {
                    return Ok(addr);
                }
            }
            Ok(reply) => last = format!("dns:{}", rcode(reply.response_code())),
            Err(e) => last = format!("dns:{e}"),
        }
    }
    Err(last)
}

pub fn rcode(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "noerror".into(),
        ResponseCode::NXDomain => "nxdomain".into(),
        ResponseCode::Refused => "refused".into(),
        ResponseCode::ServFail => "servfail".into(),
        other => format!("rcode{}", u16::from(other)),
    }
}

pub fn nameserver() -> Option<IpAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .ok()?
        .lines()
        .find_map(|l| l.trim().strip_prefix("nameserver").and_then(|a| a.trim().parse().ok()))
}

/// A DNS query for NAME of KIND with this id (default: from the pid).
pub fn query_packet(name: &str, kind: RecordType, id: Option<u16>) -> Result<Vec<u8>, String> {
    let mut message = Message::new();
    message.set_id(id.unwrap_or(std::process::id() as u16)).set_recursion_desired(true);
    message.add_query(Query::query(Name::from_str(name).map_err(|_| "bad-name")?, kind));
    message.to_vec().map_err(|_| "encode".into())
}

pub fn query(
    name: &str,
    kind: RecordType,
    server: IpAddr,
    timeout: Duration,
    id: Option<u16>,
) -> Result<Message, String> {
    exchange(&query_packet(name, kind, id)?, server, timeout)
}

/// Sends one DNS packet over UDP and parses the reply.
pub fn exchange(packet: &[u8], server: IpAddr, timeout: Duration) -> Result<Message, String> {
    let local: SocketAddr = if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
    let socket = UdpSocket::bind(local).map_err(|e| outcome_of(&e))?;
    socket.set_read_timeout(Some(timeout)).ok();
    socket.connect((server, 53)).map_err(|e| outcome_of(&e))?;
    socket.send(packet).map_err(|e| outcome_of(&e))?;
    let mut buf = [0u8; 4096];
    let len = socket.recv(&mut buf).map_err(|e| outcome_of(&e))?;
    Message::from_vec(&buf[..len]).map_err(|_| "malformed".into())
}

/// How `tcp` speaks to a port: TLS on 443 and 8443, HTTP on 80, raw elsewhere (`--raw`,
/// `--http`, `--tls` choose).
fn mode(args: &Args, port: u16) -> &'static str {
    if args.has("--raw") {
        "raw"
    } else if args.has("--tls") || (!args.has("--http") && [443, 8443].contains(&port)) {
        "tls"
    } else if args.has("--http") || port == 80 {
        "http"
    } else {
        "raw"
    }
}

/// `--send`'s text as bytes: `\\r`, `\\n`, `\\t`, `\\\\` and `\\xHH` are what they say (an argument
/// is UTF-8, and an attack's bytes need not be); any other byte is itself.
fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex =
            bytes.get(at + 2..at + 4).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        let (byte, width) = match (bytes[at], bytes.get(at + 1), hex) {
            (b'\\', Some(b'r'), _) => (b'\r', 2),
            (b'\\', Some(b'n'), _) => (b'\n', 2),
            (b'\\', Some(b't'), _) => (b'\t', 2),
            (b'\\', Some(b'\\'), _) => (b'\\', 2),
            (b'\\', Some(b'x'), Some(value)) => (value, 4),
            (other, _, _) => (other, 1),
        };
        out.push(byte);
        at += width;
    }
    out
}

/// `tcp HOST PORT`: connect as any program would, and say what came back. Over TLS (SNI HOST, or
/// `--sni`) and HTTP (Host HOST, or `--host`) a GET /, whose body's first line is the greeting;
/// raw, the server's whole answer, its line breaks written `\n`.
pub fn tcp(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let started = Instant::now();
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let port: u16 = port.parse().unwrap_or(0);
    let target = SocketAddr::new(addr, port);
    let outcome = match TcpStream::connect_timeout(&target, timeout) {
        Ok(mut stream) => {
            stream.set_read_timeout(Some(timeout)).ok();
            let mode = mode(args, port);
            let greeting = if mode == "raw" {
                // A client-first protocol sends first (`--send`); a server-first one waits.
                let sent = match args.flag("--send") {
                    Some(text) => stream.write_all(&unescape(&text)),
                    None => Ok(()),
                };
                // Connected is connected: a server that says nothing (an echo port) times out
                // the read, a refusal after the connect (a reset) is an error.
                let mut greeting = Vec::new();
                sent.and_then(|_| match stream.read_to_end(&mut greeting) {
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut =>
                    {
                        Ok(0)
                    }
                    other => other,
                })
                // One line of the report: the answer's line breaks written as `\n`.
                .and_then(|_| match crate::web::refused_by_sandbox(&greeting) {
                    Some(reason) => Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, reason)),
                    None => Ok(greeting),
                })
                .map(|greeting| {
                    String::from_utf8_lossy(&greeting).trim().replace("\r\n", "\\n").replace('\n', "\\n")
                })
            } else {
                let sni = args.flag("--sni").unwrap_or_else(|| host.clone());
                let http_host = args.flag("--host").unwrap_or_else(|| host.clone());
                crate::web::Client::new(stream, (mode == "tls").then_some(sni.as_str()))
                    .and_then(|mut client| crate::web::get(&mut client, &http_host, "/"))
                    .map(|(line, ..)| line)
            };
            match greeting {
                Ok(greeting) => {
                    report(&[("greeting", greeting)]);
                    "connected".to_string()
                }
                Err(e) => {
                    let outcome = outcome_of(&e);
                    if outcome == "denied" {
                        // What the refusal said: the 403's reason, or the alert.
                        report(&[("refusal", e.to_string())]);
                    }
                    outcome
                }
            }
        }
        Err(e) => outcome_of(&e),
    };
    report(&[
        ("outcome", outcome),
        ("address", addr.to_string()),
        ("ms", format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0)),
    ]);
}

/// `http-pipeline HOST PORT NAME…`: on one plain HTTP connection, a GET / for each NAME (as
/// its Host), all sent at once as a pipelining client does; which names the answers were for.
pub fn http_pipeline(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let names: Vec<String> =
        (3..).map(|i| args.arg(i)).take_while(|a| !a.is_empty() && !a.starts_with("--")).collect();
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let result = TcpStream::connect_timeout(&SocketAddr::new(addr, port.parse().unwrap_or(0)), timeout)
        .and_then(|mut stream| {
            stream.set_read_timeout(Some(timeout))?;
            let requests: String =
                names.iter().map(|name| format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n")).collect();
            stream.write_all(requests.as_bytes())?;
            let mut answers = Vec::new();
            let _ = stream.read_to_end(&mut answers);
            Ok(String::from_utf8_lossy(&answers).into_owned())
        });
    match result {
        Ok(answers) => {
            // Each body is `hello from PEER:PORT for NAME`.
            let served: Vec<&str> = answers.lines().filter_map(|l| l.split(" for ").nth(1)).collect();
            report(&[("outcome", "answered".into()), ("served", served.join(","))]);
        }
        Err(e) => report(&[("outcome", outcome_of(&e))]),
    }
}

/// `first-byte HOST PORT COUNT [--tls]`: COUNT connections one after another, each a GET /;
/// the time from the connect call to the answer's first line, median and 99th percentile.
pub fn first_byte(args: &Args) {
    timed_connections(args, |stream, sni, host, started| {
        crate::web::get(&mut crate::web::Client::new(stream, sni)?, host, "/")?;
        Ok(started.elapsed())
    });
}

/// `HOST PORT COUNT [--tls]`: COUNT connections one after another, each timed by `one` (given
/// the connected stream, the SNI with `--tls`, the host, and when the connect call began).
fn timed_connections(
    args: &Args,
    one: impl Fn(TcpStream, Option<&str>, &str, Instant) -> std::io::Result<Duration>,
) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let count: usize = args.arg(3).parse().unwrap_or(100);
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let target = SocketAddr::new(addr, port.parse().unwrap_or(0));
    let sni = args.has("--tls").then_some(host.as_str());
    let (mut times, mut failed) = (Vec::with_capacity(count), 0);
    for _ in 0..count {
        let started = Instant::now();
        let answered = TcpStream::connect_timeout(&target, timeout).and_then(|stream| {
            stream.set_read_timeout(Some(timeout))?;
            one(stream, sni, &host, started)
        });
        match answered {
            Ok(at) => times.push(at.as_secs_f64() * 1e6),
            Err(_) => failed += 1,
        }
    }
    report_latencies(times, failed);
}

/// `fetch HOST PORT PATH [--tls]`: a whole download, reported as size, digest and throughput.
pub fn fetch(args: &Args) {
    let (host, port, path, timeout) = (args.arg(1), args.arg(2), args.arg(3), args.timeout());
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let result = TcpStream::connect_timeout(&SocketAddr::new(addr, port.parse().unwrap_or(0)), timeout)
        .and_then(|stream| {
            stream.set_read_timeout(Some(Duration::from_secs(60)))?;
            let sni = args.has("--tls").then_some(host.as_str());
            crate::web::get(&mut crate::web::Client::new(stream, sni)?, &host, &path)
        });
    match result {
        Ok((_, bytes, sha256, seconds)) => report(&[
            ("outcome", "fetched".into()),
            ("bytes", bytes.to_string()),
            ("sha256", sha256),
            ("mbytes_per_s", format!("{:.1}", bytes as f64 / seconds / 1e6)),
        ]),
        Err(e) => report(&[("outcome", outcome_of(&e))]),
    }
}

/// `concurrent HOST PORT N [--tls] [--hold-ms M]`: N connections at once, each a GET / (held
/// open M ms after the answer, so that all N are open together); how many completed, and the
/// connect times.
pub fn concurrent(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), Duration::from_secs(30));
    let count: usize = args.arg(3).parse().unwrap_or(100);
    let hold = Duration::from_millis(args.number("--hold-ms", 0));
    let tls = args.has("--tls");
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let target = SocketAddr::new(addr, port.parse().unwrap_or(0));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(count));
    let threads: Vec<_> = (0..count)
        .map(|_| {
            let (host, barrier) = (host.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let started = Instant::now();
                let stream = TcpStream::connect_timeout(&target, timeout)
                    .map_err(|e| format!("connect:{}", outcome_of(&e)))?;
                stream.set_read_timeout(Some(timeout)).ok();
                let sni = tls.then_some(host.as_str());
                let mut client = crate::web::Client::new(stream, sni).map_err(|e| outcome_of(&e))?;
                let (line, ..) = crate::web::get(&mut client, &host, "/").map_err(|e| outcome_of(&e))?;
                let first_byte = started.elapsed();
                std::thread::sleep(hold);
                if line.starts_with("hello from") { Ok(first_byte) } else { Err("garbled".to_string()) }
            })
        })
        .collect();
    let mut failures: std::collections::BTreeMap<String, usize> = Default::default();
    let mut times: Vec<f64> = Vec::new();
    for thread in threads {
        match thread.join().unwrap_or_else(|_| Err("panicked".into())) {
            Ok(first_byte) => times.push(first_byte.as_secs_f64() * 1000.0),
            Err(why) => *failures.entry(why).or_default() += 1,
        }
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| {
        times
            .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    report(&[
        ("completed", times.len().to_string()),
        ("failed", (count - times.len()).to_string()),
        ("failures", failures.iter().map(|(why, n)| format!("{why}:{n}")).collect::<Vec<_>>().join(",")),
        ("p50_ms", format!("{:.2}", at(0.5))),
        ("p99_ms", format!("{:.2}", at(0.99))),
    ]);
}

pub fn udp(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let any: IpAddr =
        if addr.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    let local = SocketAddr::new(any, args.number("--source-port", 0));
    let result = (|| {
        let socket = UdpSocket::bind(local)?;
        socket.set_read_timeout(Some(timeout))?;
        socket.connect((addr, port.parse().unwrap_or(0)))?;
        socket.send(b"probe")?;
        let mut buf = [0u8; 64];
        let len = socket.recv(&mut buf)?;
        Ok::<_, std::io::Error>(buf[..len] == *b"probe")
    })();
    let outcome = match result {
        Ok(true) => "echoed".to_string(),
        Ok(false) => "garbled".to_string(),
        Err(e) => outcome_of(&e),
    };
    report(&[("outcome", outcome), ("address", addr.to_string())]);
}

/// An ICMP echo through an unprivileged ping socket (Docker allows them to every group).
pub fn icmp(args: &Args) {
    let timeout = args.timeout();
    let Ok(addr) = args.arg(1).parse::<IpAddr>() else {
        return report(&[("outcome", "bad-address".into())]);
    };
    let (family, protocol, kind) = match addr {
        IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_ICMP, 8u8),
        IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_ICMPV6, 128u8),
    };
    // SAFETY: a socket we own, closed by the process exit.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM, protocol) };
    if fd < 0 {
        return report(&[("outcome", outcome_of(&std::io::Error::last_os_error()))]);
    }
    // SAFETY: fd is a fresh socket we own.
    let socket = unsafe { <UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    socket.set_read_timeout(Some(timeout)).ok();
    let packet = [kind, 0, 0, 0, 0, 1, 0, 1, b'p', b'r', b'o', b'b', b'e'];
    let result = socket.send_to(&packet, SocketAddr::new(addr, 0)).and_then(|_| {
        let mut buf = [0u8; 128];
        socket.recv(&mut buf)
    });
    let outcome = match result {
        Ok(_) => "reply".to_string(),
        Err(e) => outcome_of(&e),
    };
    report(&[("outcome", outcome)]);
}

/// `hold HOST PORT --ms N [--http]`: a connection to an echo port, kept open for N ms with a ping
/// every 100 ms (with `--http`, a GET on a keep-alive connection). `outcome=held` if it lasted,
/// else `broken` with when and how.
pub fn hold(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let duration = Duration::from_millis(args.number("--ms", 5000));
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let mut stream =
        match TcpStream::connect_timeout(&SocketAddr::new(addr, port.parse().unwrap_or(0)), timeout) {
            Ok(stream) => stream,
            Err(e) => return report(&[("outcome", format!("connect:{}", outcome_of(&e)))]),
        };
    println!("connected={addr}");
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    let started = Instant::now();
    let mut pings = 0;
    // `--http`: each ping is a GET on the one keep-alive connection, checked by its Host.
    let mut web = args.has("--http").then(|| crate::web::Client::Plain(stream.try_clone().expect("a clone")));
    while started.elapsed() < duration {
        let result = match web.as_mut() {
            Some(client) => crate::web::get(client, &host, "/").and_then(|(line, ..)| {
                if line.starts_with("hello from") { Ok(()) } else { Err(std::io::Error::other(line)) }
            }),
            None => stream.write_all(b"ping\n").and_then(|_| {
                let mut buf = [0u8; 5];
                stream.read_exact(&mut buf)
            }),
        };
        if let Err(e) = result {
            return report(&[
                ("outcome", "broken".into()),
                ("how", outcome_of(&e)),
                ("after_ms", started.elapsed().as_millis().to_string()),
                ("pings", pings.to_string()),
            ]);
        }
        pings += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    report(&[("outcome", "held".into()), ("pings", pings.to_string())]);
}

fn record_type(name: &str) -> RecordType {
    RecordType::from_str(&name.to_ascii_uppercase()).unwrap_or(RecordType::A)
}

pub fn dns(args: &Args) {
    let (name, timeout) = (args.arg(1), args.timeout());
    let server = match args.flag("--server").and_then(|s| s.parse().ok()).or_else(nameserver) {
        Some(server) => server,
        None => return report(&[("outcome", "dns:no-nameserver".into())]),
    };
    let kind = record_type(&args.flag("--type").unwrap_or_else(|| "A".into()));
    let id = args.flag("--id").and_then(|i| i.parse().ok());
    // `--edns`: the query offers a 4096-byte answer, as resolvers' clients do.
    let asked = query_packet(&name, kind, id).and_then(|packet| {
        if !args.has("--edns") {
            return Ok(packet);
        }
        let mut message = Message::from_vec(&packet).map_err(|_| "encode".to_string())?;
        let mut edns = hickory_proto::op::Edns::new();
        edns.set_max_payload(4096);
        message.set_edns(edns);
        message.to_vec().map_err(|_| "encode".into())
    });
    match asked.and_then(|packet| exchange(&packet, server, timeout)) {
        Ok(reply) => {
            let answers: Vec<String> = reply
                .answers()
                .iter()
                .filter_map(|r| match r.data() {
                    RData::A(a) => Some(a.0.to_string()),
                    RData::AAAA(a) => Some(a.0.to_string()),
                    _ => None,
                })
                .collect();
            // An Extended DNS Error (RFC 8914, option 15), as `dig` shows it: `CODE:TEXT`.
            let ede = reply
                .extensions()
                .as_ref()
                .and_then(|edns| edns.option(hickory_proto::rr::rdata::opt::EdnsCode::from(15)))
                .map(|option| match option {
                    hickory_proto::rr::rdata::opt::EdnsOption::Unknown(_, data) if data.len() >= 2 => {
                        format!(
                            "{}:{}",
                            u16::from_be_bytes([data[0], data[1]]),
                            String::from_utf8_lossy(&data[2..])
                        )
                    }
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            report(&[
                ("outcome", format!("dns:{}", rcode(reply.response_code()))),
                ("ede", ede),
                ("answers", answers.join(",")),
                ("records", reply.answers().len().to_string()),
                ("id", reply.id().to_string()),
            ]);
        }
        Err(e) => report(&[("outcome", format!("dns:{e}"))]),
    }
}

/// `dns-bench NAME COUNT [--server IP] [--distinct] [--concurrency K] [--for-ms N] [--pace-us P]`:
/// COUNT A queries for NAME (or, with --distinct, for q<i>.NAME, each a new name), K at a time,
/// each of the K waiting P µs between its queries, or as many as N ms allow; prints the median
/// and 90th percentile latency and the rate.
pub fn dns_bench(args: &Args) {
    let name = args.arg(1);
    let count: usize = args.arg(2).parse().unwrap_or(100);
    let distinct = args.has("--distinct");
    let concurrency: usize = args.number("--concurrency", 1);
    let pace = Duration::from_micros(args.number("--pace-us", 0));
    let server = match args.flag("--server").and_then(|s| s.parse().ok()).or_else(nameserver) {
        Some(server) => server,
        None => return report(&[("outcome", "dns:no-nameserver".into())]),
    };
    let started = Instant::now();
    let deadline =
        args.flag("--for-ms").and_then(|m| m.parse().ok()).map(|ms| started + Duration::from_millis(ms));
    let per_thread = count.div_ceil(concurrency);
    let threads: Vec<_> = (0..concurrency)
        .map(|t| {
            let name = name.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::with_capacity(per_thread);
                let mut failures = 0;
                for i in 0..per_thread {
                    if deadline.is_some_and(|d| Instant::now() > d) {
                        break;
                    }
                    let qname = if distinct { format!("q{}-{}.{name}", t, i) } else { name.clone() };
                    let sent = Instant::now();
                    match query(&qname, RecordType::A, server, Duration::from_secs(2), None) {
                        Ok(reply) if reply.response_code() == ResponseCode::NoError => {
                            latencies.push(sent.elapsed().as_secs_f64() * 1e6)
                        }
                        _ => failures += 1,
                    }
                    std::thread::sleep(pace);
                }
                (latencies, failures)
            })
        })
        .collect();
    let (mut latencies, mut failures) = (Vec::new(), 0);
    for thread in threads {
        let (l, f) = thread.join().unwrap_or_default();
        latencies.extend(l);
        failures += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    report(&[
        ("answered", latencies.len().to_string()),
        ("failed", failures.to_string()),
        ("median_us", format!("{:.0}", at(0.5))),
        ("p90_us", format!("{:.0}", at(0.9))),
        ("p95_us", format!("{:.0}", at(0.95))),
        ("qps", format!("{:.0}", latencies.len() as f64 / elapsed)),
    ]);
}

/// `api-first-byte HOST PORT COUNT [--tls]`: COUNT streamed Messages API requests one after
/// another (POST /v1/messages, the placeholder key in `x-api-key`), each on a new connection:
/// connect to the answer's first byte, median and p99, the whole answer read each time.
pub fn api_first_byte(args: &Args) {
    let body = r#"{"model":"m","max_tokens":16,"stream":true,"tools":[{"name":"Write"}],"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: {}\r\nx-api-key: sk-ant-api03-held-by-agent-sandbox\r\n\
         anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        args.arg(1),
        body.len()
    );
    timed_connections(args, |stream, sni, _, started| {
        let mut client = crate::web::Client::new(stream, sni)?;
        client.write_all(request.as_bytes())?;
        client.flush()?;
        let mut first = [0u8; 1];
        client.read_exact(&mut first)?;
        let at = started.elapsed();
        let mut rest = Vec::new();
        let _ = client.read_to_end(&mut rest);
        let answer = String::from_utf8_lossy(&first).to_string() + &String::from_utf8_lossy(&rest);
        if answer.starts_with("HTTP/1.1 200") && answer.contains("event: message_stop") {
            Ok(at)
        } else {
            Err(std::io::Error::other(answer.lines().next().unwrap_or_default().to_string()))
        }
    });
}

/// `failed=N median_us=… p95_us=… p99_us=…` of latencies in µs.
fn report_latencies(mut times: Vec<f64>, failed: usize) {
    times.sort_by(f64::total_cmp);
    let at =
        |q: f64| times.get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1))).copied();
    report(&[
        ("failed", failed.to_string()),
        ("median_us", format!("{:.0}", at(0.5).unwrap_or(f64::NAN))),
        ("p95_us", format!("{:.0}", at(0.95).unwrap_or(f64::NAN))),
        ("p99_us", format!("{:.0}", at(0.99).unwrap_or(f64::NAN))),
    ]);
}
