//! The peer side: servers on the private test network that answer to allowlisted and blocked
//! names (network aliases): HTTP and HTTPS (web.rs) logging the names they were asked for, raw
//! greeters and echoes, a DNS server that records every query it receives, and with `--forge`
//! GitHub and the npm registry (forge.rs).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, UdpSocket};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};

/// A listener on every address, with a backlog for a thousand connections at once.
fn listen(port: u16) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.bind(&std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

fn ports(list: &str) -> Vec<u16> {
    list.split(',').filter_map(|p| p.parse().ok()).collect()
}

pub fn serve(args: &[String]) {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_string();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let log = flag("--log").unwrap_or_else(|| "/tmp/peer.log".into());
    let files = flag("--files");
    // The forge's repositories and packages exist before any port answers.
    let forge = flag("--forge");
    if let Some(dir) = &forge {
        crate::forge::prepare(dir);
        println!("forge ready");
    }
    // Every connection, datagram and ping logged as it arrives (verify's peers).
    let log_accepts = args.iter().any(|a| a == "--log-accepts");
    let mut threads = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--log" | "--files" | "--cert" | "--key" | "--forge" => i += 2,
            "--mock-api" | "--ignore-bodies" | "--log-accepts" => i += 1,
            "--icmp" => {
                let log = log.clone();
                threads.push(std::thread::spawn(move || watch_icmp(&log)));
                i += 1;
            }
            "--http" | "--tls" => {
                let tls = (args[i] == "--tls").then(|| {
                    let (cert, key) = (
                        flag("--cert").expect("--tls needs --cert"),
                        flag("--key").expect("--tls needs --key"),
                    );
                    crate::web::tls_server_config(&cert, &key)
                });
                for port in ports(&args[i + 1]) {
                    let listener = listen(port).expect("bind http");
                    let site = crate::web::Site {
                        host: host.clone(),
                        port,
                        tls: tls.clone(),
                        files: files.clone(),
                        log: log.clone(),
                        mock: args.iter().any(|a| a == "--mock-api"),
                        ignores_bodies: args.iter().any(|a| a == "--ignore-bodies"),
                        forge: forge.clone(),
                        log_accepts,
                    };
                    threads.push(std::thread::spawn(move || crate::web::serve(listener, site)));
                }
                i += 2;
            }
            "--tcp" => {
                for port in ports(&args[i + 1]) {
                    let listener = listen(port).expect("bind tcp");
                    let greeting = format!("hello from {host}:{port}\n");
                    let log = log.clone();
                    threads.push(std::thread::spawn(move || {
                        for mut stream in listener.incoming().flatten() {
                            if log_accepts {
                                let from = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                                crate::web::log(&log, &format!("open {port} from={from}"));
                            }
                            let _ = stream.write_all(greeting.as_bytes());
                        }
                    }));
                }
                i += 2;
            }
            "--echo" => {
                for port in ports(&args[i + 1]) {
                    let listener = listen(port).expect("bind tcp echo");
                    let log = log.clone();
                    threads.push(std::thread::spawn(move || {
                        for mut stream in listener.incoming().flatten() {
                            if log_accepts {
                                let from = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                                crate::web::log(&log, &format!("open {port} from={from}"));
                            }
                            std::thread::spawn(move || {
                                let mut buf = [0u8; 16384];
                                while let Ok(len @ 1..) = stream.read(&mut buf) {
                                    if stream.write_all(&buf[..len]).is_err() {
                                        break;
                                    }
                                }
                            });
                        }
                    }));
                }
                i += 2;
            }
            "--udp" => {
                for port in ports(&args[i + 1]) {
                    let socket = UdpSocket::bind(("::", port)).expect("bind udp");
                    let log = log.clone();
                    threads.push(std::thread::spawn(move || {
                        let mut buf = [0u8; 2048];
                        while let Ok((len, from)) = socket.recv_from(&mut buf) {
                            if log_accepts {
                                crate::web::log(&log, &format!("udp {port} from={from} bytes={len}"));
                            }
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
            "--icmp6" => {
                let log = args[i + 1].clone();
                threads.push(std::thread::spawn(move || watch_icmp6(&log)));
                i += 2;
            }
            other => panic!("unknown serve option {other}"),
        }
    }
    println!("peer ready");
    for thread in threads {
        let _ = thread.join();
    }
}

/// Answers from the zone file (`name type address ttl` lines), logging the query first as
/// `name type id extra` (extra: records and EDNS options besides the question).
fn answer(packet: &[u8], zone: &str, log: &str) -> Option<Vec<u8>> {
    let query = Message::from_vec(packet).ok()?;
    let question = query.queries().first()?.clone();
    let name = question.name().to_ascii().to_ascii_lowercase();
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        // What else came with the question: records in the other sections, EDNS options.
        let options = query.extensions().as_ref().map_or(0, |e| e.options().as_ref().len());
        let extra = query.answers().len() + query.name_servers().len() + query.additionals().len() + options;
        let _ = writeln!(file, "{name} {} {} {extra}", question.query_type(), query.id());
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
        // `10.77.0.1+200`: that many addresses in a row, one record each (an answer larger
        // than any real name's).
        if let ("A", RecordType::A, Some((first, count))) =
            (fields[1], question.query_type(), fields[2].split_once('+'))
        {
            let first = u32::from(first.parse::<std::net::Ipv4Addr>().ok()?);
            for i in 0..count.parse::<u32>().ok()? {
                reply.add_answer(Record::from_rdata(owner.clone(), ttl, RData::A(A((first + i).into()))));
            }
            continue;
        }
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

/// Logs every ICMP echo request that reaches this host over IPv4 as `icmp from=ADDR` (`--icmp`):
/// the kernel answers pings itself, and logs nothing.
fn watch_icmp(log: &str) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::ICMPV4))
            .expect("raw ICMP socket (the peer runs as root with NET_RAW)");
    let socket = UdpSocket::from(socket);
    let mut buf = [0u8; 2048];
    while let Ok((len, from)) = socket.recv_from(&mut buf) {
        // The IPv4 header, then the ICMP message: type 8 is an echo request.
        let header = usize::from(buf[0] & 0x0f) * 4;
        if len > header && buf[header] == 8 {
            crate::web::log(log, &format!("icmp from={}", from.ip()));
        }
    }
}

/// Logs every ICMPv6 message that reaches this host as `type from payload` (payload printable,
/// other bytes as `.`): the evidence that a forged packet carried the agent's bytes here.
fn watch_icmp6(log: &str) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::RAW, Some(socket2::Protocol::ICMPV6))
            .expect("raw ICMPv6 socket (the peer runs as root with NET_RAW)");
    let socket = UdpSocket::from(socket);
    let mut buf = [0u8; 2048];
    while let Ok((len, from)) = socket.recv_from(&mut buf) {
        let packet = &buf[..len];
        let printable: String =
            packet.iter().map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
        let line = format!("{} {} {printable}\n", packet.first().copied().unwrap_or(0), from.ip());
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

/// `default-route GATEWAY`: adds a default route via GATEWAY (IPv4 or IPv6) to the main table of
/// this network namespace, by one rtnetlink request (the peer image has no `ip`). For a helper
/// joined to a sandbox's namespace: an internal network of Docker 25 or later gives its
/// containers no default route, where a user's network has one, so that an address outside the
/// network reaches the firewall rather than failing at the routing table. Prints
/// `outcome=added`, `outcome=present` where a default route is there already, or
/// `outcome=error` and the kernel's `errno`.
pub fn default_route(args: &crate::Args) {
    let Ok(gateway) = args.arg(1).parse::<std::net::IpAddr>() else {
        return crate::report(&[("outcome", "error".into()), ("errno", "bad gateway".into())]);
    };
    let (family, address) = match gateway {
        std::net::IpAddr::V4(v4) => (libc::AF_INET as u8, v4.octets().to_vec()),
        std::net::IpAddr::V6(v6) => (libc::AF_INET6 as u8, v6.octets().to_vec()),
    };
    // nlmsghdr (16), rtmsg (12), one rtattr RTA_GATEWAY (4 + the address).
    let length = 16 + 12 + 4 + address.len();
    let mut message = Vec::with_capacity(length);
    message.extend((length as u32).to_ne_bytes());
    message.extend(libc::RTM_NEWROUTE.to_ne_bytes());
    let flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL;
    message.extend((flags as u16).to_ne_bytes());
    message.extend(1u32.to_ne_bytes()); // sequence
    message.extend(0u32.to_ne_bytes()); // port id: the kernel's
    message.extend([family, 0, 0, 0]); // family, dst_len (default), src_len, tos
    message.extend([libc::RT_TABLE_MAIN, libc::RTPROT_BOOT, libc::RT_SCOPE_UNIVERSE, libc::RTN_UNICAST]);
    message.extend(0u32.to_ne_bytes()); // rtm_flags
    message.extend(((4 + address.len()) as u16).to_ne_bytes());
    message.extend(libc::RTA_GATEWAY.to_ne_bytes());
    message.extend(address);
    // SAFETY: a netlink socket of our own, closed below; the buffers outlive the calls.
    let errno = unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
        if fd < 0 {
            -*libc::__errno_location()
        } else {
            let sent = libc::send(fd, message.as_ptr().cast(), message.len(), 0);
            let mut answer = [0u8; 1024];
            let read =
                if sent < 0 { -1 } else { libc::recv(fd, answer.as_mut_ptr().cast(), answer.len(), 0) };
            let errno = if read < 0 {
                -*libc::__errno_location()
            } else if read >= 20 && u16::from_ne_bytes([answer[4], answer[5]]) == libc::NLMSG_ERROR as u16 {
                // The acknowledgement: nlmsgerr's error, 0 or a negative errno.
                i32::from_ne_bytes([answer[16], answer[17], answer[18], answer[19]])
            } else {
                -libc::EPROTO
            };
            libc::close(fd);
            errno
        }
    };
    if errno == 0 {
        crate::report(&[("outcome", "added".into())]);
    } else if errno == -libc::EEXIST {
        // An engine that gave the container a default route (Docker 24 and earlier did).
        crate::report(&[("outcome", "present".into())]);
    } else {
        crate::report(&[("outcome", "error".into()), ("errno", (-errno).to_string())]);
    }
}
