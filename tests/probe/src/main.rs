//! sandbox-probe: one static binary for both sides of the container suites.
//!
//! As a peer (`serve`) it answers on the private test network: TCP ports that greet, UDP ports
//! that echo, and a DNS server that answers from a zone file it re-reads on every query (so a
//! test can move a name mid-test) and appends every query it receives to a log.
//!
//! As a probe, run inside the sandbox as the agent, it tries one thing and prints what happened
//! as `key=value` lines, exiting 0 whatever the outcome: the test decides what is right.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let timeout = Duration::from_millis(
        args.iter()
            .position(|a| a == "--timeout-ms")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(3000),
    );
    match arg(0).as_str() {
        "serve" => serve(&args[1..]),
        "tcp" => tcp(&arg(1), &arg(2), timeout),
        "udp" => udp(&arg(1), &arg(2), timeout),
        "icmp" => icmp(&arg(1), timeout),
        "dns-bench" => dns_bench(&args[1..]),
        "dns" => {
            let server = args.iter().position(|a| a == "--server").and_then(|i| args.get(i + 1)).cloned();
            dns(&arg(1), server, timeout)
        }
        _ => {
            eprintln!(
                "usage: sandbox-probe serve [--tcp P,P] [--udp P,P] [--dns ZONE LOG]\n       \
                 sandbox-probe tcp|udp HOST PORT | icmp ADDR | dns NAME [--server IP] [--timeout-ms MS]"
            );
            std::process::exit(64);
        }
    }
}

fn ports(list: &str) -> Vec<u16> {
    list.split(',').filter_map(|p| p.parse().ok()).collect()
}

fn serve(args: &[String]) {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_string();
    let mut threads = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--tcp" => {
                for port in ports(&args[i + 1]) {
                    let listener = TcpListener::bind(("::", port)).expect("bind tcp");
                    let greeting = format!("hello from {host}:{port}\n");
                    threads.push(std::thread::spawn(move || {
                        for mut stream in listener.incoming().flatten() {
                            let _ = stream.write_all(greeting.as_bytes());
                        }
                    }));
                }
                i += 2;
            }
            "--udp" => {
                for port in ports(&args[i + 1]) {
                    let socket = UdpSocket::bind(("::", port)).expect("bind udp");
                    threads.push(std::thread::spawn(move || {
                        let mut buf = [0u8; 2048];
                        while let Ok((len, from)) = socket.recv_from(&mut buf) {
                            let _ = socket.send_to(&buf[..len], from);
                        }
                    }));
                }
                i += 2;
            }
            "--dns" => {
                let (zone, log) = (args[i + 1].clone(), args[i + 2].clone());
                let socket = UdpSocket::bind(("::", 53)).expect("bind dns");
                threads.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok((len, from)) = socket.recv_from(&mut buf) {
                        if let Some(reply) = answer(&buf[..len], &zone, &log) {
                            let _ = socket.send_to(&reply, from);
                        }
                    }
                }));
                i += 3;
            }
            other => panic!("unknown serve option {other}"),
        }
    }
    println!("peer ready");
    for thread in threads {
        let _ = thread.join();
    }
}

/// Answers from the zone file (`name type address ttl` lines), logging the query first.
fn answer(packet: &[u8], zone: &str, log: &str) -> Option<Vec<u8>> {
    let query = Message::from_vec(packet).ok()?;
    let question = query.queries().first()?.clone();
    let name = question.name().to_ascii().to_ascii_lowercase();
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(file, "{name} {}", question.query_type());
    }
    let mut reply = Message::new();
    reply
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    reply.add_query(question.clone());
    let mut found = false;
    for line in std::fs::read_to_string(zone).unwrap_or_default().lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bare = name.trim_end_matches('.');
        let matches = fields.len() == 4
            && match fields[0].strip_prefix("*.") {
                Some(suffix) => bare.ends_with(&format!(".{suffix}")),
                None => fields[0].trim_end_matches('.') == bare,
            };
        if !matches {
            continue;
        }
        found = true;
        let ttl = fields[3].parse().unwrap_or(60);
        let owner = question.name().clone();
        let record = match (fields[1], question.query_type()) {
            // `10.99.0.0/16`: an address of that range chosen by the name, so every name of a
            // wildcard gets its own.
            ("A", RecordType::A) if fields[2].contains('/') => {
                let (base, _) = fields[2].split_once('/')?;
                let base = u32::from(base.parse::<std::net::Ipv4Addr>().ok()?);
                let hash = bare.bytes().fold(2166136261u32, |h, b| (h ^ u32::from(b)).wrapping_mul(16777619));
                let addr = std::net::Ipv4Addr::from(base | (hash & 0xffff).max(1));
                Record::from_rdata(owner, ttl, RData::A(A(addr)))
            }
            ("A", RecordType::A) => Record::from_rdata(owner, ttl, RData::A(A(fields[2].parse().ok()?))),
            ("AAAA", RecordType::AAAA) => {
                Record::from_rdata(owner, ttl, RData::AAAA(AAAA(fields[2].parse().ok()?)))
            }
            _ => continue,
        };
        reply.add_answer(record);
    }
    if !found {
        reply.set_response_code(ResponseCode::NXDomain);
    }
    reply.to_vec().ok()
}

/// What the probe reports.
fn report(pairs: &[(&str, String)]) {
    for (key, value) in pairs {
        println!("{key}={value}");
    }
}

fn outcome_of(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ECONNREFUSED) => "refused".into(),
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
fn resolve(host: &str, timeout: Duration) -> Result<IpAddr, String> {
    if let Ok(addr) = host.parse::<IpAddr>() {
        return Ok(addr);
    }
    let server = nameserver().ok_or("dns:no-nameserver")?;
    let mut last = String::from("dns:no-address");
    for kind in [RecordType::A, RecordType::AAAA] {
        match query(host, kind, server, timeout) {
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

fn rcode(code: ResponseCode) -> String {
    match code {
        ResponseCode::NoError => "noerror".into(),
        ResponseCode::NXDomain => "nxdomain".into(),
        ResponseCode::Refused => "refused".into(),
        ResponseCode::ServFail => "servfail".into(),
        other => format!("rcode{}", u16::from(other)),
    }
}

fn nameserver() -> Option<IpAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .ok()?
        .lines()
        .find_map(|l| l.trim().strip_prefix("nameserver").and_then(|a| a.trim().parse().ok()))
}

fn query(name: &str, kind: RecordType, server: IpAddr, timeout: Duration) -> Result<Message, String> {
    let mut message = Message::new();
    message.set_id(std::process::id() as u16).set_recursion_desired(true);
    message.add_query(Query::query(Name::from_str(name).map_err(|_| "bad-name")?, kind));
    let packet = message.to_vec().map_err(|_| "encode")?;
    let local: SocketAddr = if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
    let socket = UdpSocket::bind(local).map_err(|e| outcome_of(&e))?;
    socket.set_read_timeout(Some(timeout)).ok();
    socket.connect((server, 53)).map_err(|e| outcome_of(&e))?;
    socket.send(&packet).map_err(|e| outcome_of(&e))?;
    let mut buf = [0u8; 4096];
    let len = socket.recv(&mut buf).map_err(|e| outcome_of(&e))?;
    Message::from_vec(&buf[..len]).map_err(|_| "malformed".into())
}

fn tcp(host: &str, port: &str, timeout: Duration) {
    let started = Instant::now();
    let addr = match resolve(host, timeout) {
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

fn udp(host: &str, port: &str, timeout: Duration) {
    let addr = match resolve(host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome)]),
    };
    let local: SocketAddr = if addr.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().unwrap();
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
fn icmp(addr: &str, timeout: Duration) {
    let Ok(addr) = addr.parse::<IpAddr>() else { return report(&[("outcome", "bad-address".into())]) };
    let (family, protocol, kind) = match addr {
        IpAddr::V4(_) => (libc::AF_INET, libc::IPPROTO_ICMP, 8u8),
        IpAddr::V6(_) => (libc::AF_INET6, libc::IPPROTO_ICMPV6, 128u8),
    };
    // SAFETY: a socket we own, closed by the process exit.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM, protocol) };
    if fd < 0 {
        return report(&[("outcome", outcome_of(&std::io::Error::last_os_error()))]);
    }
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

fn dns(name: &str, server: Option<String>, timeout: Duration) {
    let server = match server.and_then(|s| s.parse().ok()).or_else(nameserver) {
        Some(server) => server,
        None => return report(&[("outcome", "dns:no-nameserver".into())]),
    };
    match query(name, RecordType::A, server, timeout) {
        Ok(reply) => {
            let answers: Vec<String> = reply
                .answers()
                .iter()
                .filter_map(|r| match r.data() {
                    RData::A(a) => Some(a.0.to_string()),
                    _ => None,
                })
                .collect();
            report(&[
                ("outcome", format!("dns:{}", rcode(reply.response_code()))),
                ("answers", answers.join(",")),
            ]);
        }
        Err(e) => report(&[("outcome", format!("dns:{e}"))]),
    }
}

/// `dns-bench NAME COUNT [--server IP] [--distinct] [--concurrency K]`: COUNT A queries for NAME
/// (or, with --distinct, for q<i>.NAME, each a new name), K at a time; prints the median and
/// 90th percentile latency and the rate.
fn dns_bench(args: &[String]) {
    let name = args.first().cloned().unwrap_or_default();
    let count: usize = args.get(1).and_then(|c| c.parse().ok()).unwrap_or(100);
    let flag = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    let distinct = args.iter().any(|a| a == "--distinct");
    let concurrency: usize = flag("--concurrency").and_then(|c| c.parse().ok()).unwrap_or(1);
    let server = match flag("--server").and_then(|s| s.parse().ok()).or_else(nameserver) {
        Some(server) => server,
        None => return report(&[("outcome", "dns:no-nameserver".into())]),
    };
    let started = Instant::now();
    let per_thread = count.div_ceil(concurrency);
    let threads: Vec<_> = (0..concurrency)
        .map(|t| {
            let name = name.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::with_capacity(per_thread);
                let mut failures = 0;
                for i in 0..per_thread {
                    let qname = if distinct { format!("q{}-{}.{name}", t, i) } else { name.clone() };
                    let sent = Instant::now();
                    match query(&qname, RecordType::A, server, Duration::from_secs(2)) {
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
