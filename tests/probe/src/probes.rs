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
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => "unreachable".into(),
        Some(libc::EPERM) | Some(libc::EACCES) => "not-permitted".into(),
        Some(libc::ETIMEDOUT) | Some(libc::EAGAIN) => "timeout".into(),
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

pub fn tcp(args: &Args) {
    let (host, port, timeout) = (args.arg(1), args.arg(2), args.timeout());
    let started = Instant::now();
    let addr = match resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let target = SocketAddr::new(addr, port.parse().unwrap_or(0));
    let outcome = match TcpStream::connect_timeout(&target, timeout) {
        Ok(mut stream) => {
            stream.set_read_timeout(Some(timeout)).ok();
            let mut greeting = String::new();
            let _ = stream.read_to_string(&mut greeting);
            report(&[("greeting", greeting.trim().to_string())]);
            "connected".to_string()
        }
        Err(e) => outcome_of(&e),
    };
    report(&[
        ("outcome", outcome),
        ("address", addr.to_string()),
        ("ms", format!("{:.1}", started.elapsed().as_secs_f64() * 1000.0)),
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

/// `hold HOST PORT --ms N`: a connection to an echo port, kept open for N ms with a ping every
/// 100 ms. `outcome=held` if it lasted, else `broken` with when and how.
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
    while started.elapsed() < duration {
        let result = stream.write_all(b"ping\n").and_then(|_| {
            let mut buf = [0u8; 5];
            stream.read_exact(&mut buf)
        });
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
    match query(&name, kind, server, timeout, id) {
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
            report(&[
                ("outcome", format!("dns:{}", rcode(reply.response_code()))),
                ("answers", answers.join(",")),
                ("records", reply.answers().len().to_string()),
                ("id", reply.id().to_string()),
            ]);
        }
        Err(e) => report(&[("outcome", format!("dns:{e}"))]),
    }
}

/// `dns-bench NAME COUNT [--server IP] [--distinct] [--concurrency K] [--for-ms N]`: COUNT A
/// queries for NAME (or, with --distinct, for q<i>.NAME, each a new name), K at a time, or as
/// many as N ms allow; prints the median and 90th percentile latency and the rate.
pub fn dns_bench(args: &Args) {
    let name = args.arg(1);
    let count: usize = args.arg(2).parse().unwrap_or(100);
    let distinct = args.has("--distinct");
    let concurrency: usize = args.number("--concurrency", 1);
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
        ("qps", format!("{:.0}", latencies.len() as f64 / elapsed)),
    ]);
}
