//! The checker: a process of its own (`sandbox-init checker`), run by PID 1 as an unprivileged
//! user with no capability, to which nft redirects every TCP connection the agent makes to an
//! allowed address. On the checking port it reads the first bytes, takes the name the client
//! speaks (TLS SNI, HTTP Host: sandbox-wire's `namecheck`) and asks PID 1 for a verdict; on the passing port
//! (opaque ports, ranges) it asks on the address alone. Allowed connections are joined to their
//! original destination and relayed; refused ones are answered in their protocol where it is
//! known (a 403 naming the reason to HTTP, an `access_denied` alert to TLS: sandbox-wire's
//! `namecheck::answer`), reset otherwise, and no byte reaches the server.
//!
//! Running apart keeps the parser of untrusted bytes out of PID 1 and without privilege; a
//! checker that dies or stalls stops connections (they wait, unaccepted, in the listeners'
//! backlog, which PID 1 keeps open), it never lets one through unchecked.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd as _, FromRawFd as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream, UnixDatagram};
use tokio::sync::{oneshot, watch};

use crate::net::namecheck::protocol::{
    LISTENERS_ENV, Listener, PROGRESS_PERIOD, VERDICT_FD, VERDICT_TIMEOUT,
};
use sandbox_wire::namecheck::answer::{not_allowed, refusal_answer};
use sandbox_wire::namecheck::messages::{Order, Report};
use sandbox_wire::namecheck::{
    ClientBytes, HttpRequests, MAX_FIRST_BYTES, Sniffed, TlsRetry, hello_retry, sniff,
};

/// How long a client may take to say whom it wants.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the onward connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const RELAY_BUFFER: usize = 64 * 1024;
/// How long a connection that sent its allowance waits for a grant before its upload ends.
const GRANT_WAIT: Duration = Duration::from_secs(10);
/// The most connections checked or relayed at once.
const MAX_CONNECTIONS: usize = 4096;

struct Checker {
    socket: UnixDatagram,
    pending: Mutex<HashMap<u64, oneshot::Sender<Option<Allowance>>>>,
    running: Mutex<HashMap<u64, tokio::task::AbortHandle>>,
    /// Each relayed connection's allowance, as PID 1 last granted it.
    allowances: Mutex<HashMap<u64, watch::Sender<Allowance>>>,
    next_id: AtomicU64,
    connections: Arc<tokio::sync::Semaphore>,
}

/// `sandbox-init checker`, as PID 1 starts it: descriptors 3 (PID 1's socket) and the
/// listeners, privileges already dropped.
pub fn run() -> u8 {
    // One thread: a verdict, a wake-up and a relayed byte never hop between threads, and the
    // memory of a second worker is not held (25 MB with 1,000 connections open, 38 on two).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sandbox-init checker: cannot start: {e}");
            return 71;
        }
    };
    runtime.block_on(async {
        // SAFETY: descriptor 3 is the socket PID 1 passed, ours alone.
        let socket = unsafe { std::os::unix::net::UnixDatagram::from_raw_fd(VERDICT_FD) };
        let listeners = match listeners() {
            Ok(listeners) => listeners,
            Err(e) => {
                eprintln!("sandbox-init checker: {e}");
                return 71;
            }
        };
        let socket = match socket.set_nonblocking(true).and_then(|_| UnixDatagram::from_std(socket)) {
            Ok(socket) => socket,
            Err(e) => {
                eprintln!("sandbox-init checker: no socket to PID 1: {e}");
                return 71;
            }
        };
        let checker = Arc::new(Checker::new(socket));
        for (listener, kind) in listeners {
            let checker = checker.clone();
            tokio::spawn(async move { checker.accept(listener, kind).await });
        }
        checker.orders().await;
        // PID 1 is gone: nothing can be allowed any more.
        0
    })
}

fn listeners() -> Result<Vec<(TcpListener, Listener)>, String> {
    let spec = std::env::var(LISTENERS_ENV).map_err(|_| format!("{LISTENERS_ENV} is not set"))?;
    let mut out = Vec::new();
    for item in spec.split(',').filter(|i| !i.is_empty()) {
        let (fd, kind) = item.split_once(':').ok_or_else(|| format!("{LISTENERS_ENV}: bad item {item}"))?;
        let fd: i32 = fd.parse().map_err(|_| format!("{LISTENERS_ENV}: bad descriptor {fd}"))?;
        let kind = Listener::from_name(kind).ok_or_else(|| format!("{LISTENERS_ENV}: bad kind {kind}"))?;
        // SAFETY: PID 1 passed this descriptor for this listener.
        let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        out.push((TcpListener::from_std(listener).map_err(|e| e.to_string())?, kind));
    }
    Ok(out)
}

impl Checker {
    /// The checker speaking to PID 1 on `socket`, with no connection yet.
    fn new(socket: UnixDatagram) -> Checker {
        Checker {
            socket,
            pending: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            allowances: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        }
    }

    async fn accept(self: Arc<Self>, listener: TcpListener, kind: Listener) {
        loop {
            // At most MAX_CONNECTIONS at once: past it, connections wait in the backlog.
            let Ok(permit) = self.connections.clone().acquire_owned().await else { return };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of descriptors, most likely: give the open connections time to end.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let checker = self.clone();
            let task = tokio::spawn(async move {
                checker.connection(id, stream, kind).await;
                checker.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                checker.allowances.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                drop(permit);
            });
            self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(id, task.abort_handle());
        }
    }

    /// PID 1's verdicts and orders, until its socket closes.
    async fn orders(&self) {
        let mut buf = vec![0u8; 65536];
        while let Ok(len) = self.socket.recv(&mut buf).await {
            match serde_json::from_slice::<Order>(&buf[..len]) {
                Ok(Order::Verdict { id, allow, allowance, .. }) => {
                    if let Some(waiting) = self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)
                    {
                        let _ = waiting.send(allow.then_some(allowance));
                    }
                }
                Ok(Order::Allowance { id, total }) => {
                    if let Some(cap) = self.allowances.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
                        cap.send_if_modified(|cap| {
                            let raise = cap.is_some_and(|c| c < total);
                            if raise {
                                *cap = Some(total);
                            }
                            raise
                        });
                    }
                }
                Ok(Order::Close { id }) => {
                    if let Some(task) = self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
                        task.abort();
                    }
                    self.allowances.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                }
                Err(_) => {}
            }
        }
    }

    async fn report(&self, report: &Report) {
        if let Ok(bytes) = serde_json::to_vec(report) {
            let _ = self.socket.send(&bytes).await;
        }
    }

    /// PID 1's verdict on `ask`: the connection's allowance if it may go on; None, refused (or
    /// no verdict came in time). Given up on, the connection is reported closed with nothing
    /// sent, so that a verdict PID 1 gives late leaves nothing of it open there (its share of a
    /// budget held, a connection logged as open).
    async fn ask(&self, id: u64, ask: &Report) -> Option<Allowance> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        self.report(ask).await;
        let verdict = tokio::time::timeout(VERDICT_TIMEOUT, rx).await;
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        if verdict.is_err() {
            let ms = VERDICT_TIMEOUT.as_millis() as u64;
            self.report(&Report::Closed { id, up: 0, down: 0, ms }).await;
        }
        verdict.ok().and_then(Result::ok).flatten()
    }

    /// How many more bytes connection `id`, having sent `sent` up, may send now: when it has
    /// sent its allowance, it tells PID 1 and waits for a grant, asking again each second
    /// (what other connections held may come free). None: none came in GRANT_WAIT.
    async fn room(&self, id: u64, cap: &mut watch::Receiver<Allowance>, sent: u64) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + GRANT_WAIT;
        loop {
            match *cap.borrow_and_update() {
                None => return Some(u64::MAX),
                Some(total) if total > sent => return Some(total - sent),
                Some(_) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            self.report(&Report::Progress { id, up: sent }).await;
            if let Ok(Err(_)) = tokio::time::timeout(Duration::from_secs(1), cap.changed()).await {
                return None;
            }
        }
    }

    async fn connection(&self, id: u64, mut client: TcpStream, kind: Listener) {
        let trace = Trace::new();
        let Some(dst) = original_destination(&client) else {
            return reset(client);
        };
        let (check, forwarder) = (kind.checks(), kind == Listener::Forwarder);
        if !check {
            let ask = Report::Ask {
                id,
                dst,
                check,
                name: None,
                via: "address".into(),
                ech: false,
                forwarder,
                first: 0,
            };
            match self.ask(id, &ask).await {
                Some(allowance) => {
                    trace.mark("verdict");
                    self.relay(id, client, Way { dst, trace }, Vec::new(), Later::Unchecked, allowance).await
                }
                None => reset(client),
            }
            return;
        }
        let mut first = Vec::with_capacity(4096);
        let deadline = tokio::time::Instant::now() + FIRST_BYTES_TIMEOUT;
        let sniffed = loop {
            let sniffed = sniff(&first);
            if sniffed != Sniffed::NeedMore {
                break sniffed;
            }
            if first.len() >= MAX_FIRST_BYTES {
                break Sniffed::Refused("no name within the first bytes");
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    let reason = "closed before it named a host".to_string();
                    self.report(&Report::Refused { id, dst, via: "unknown".into(), reason, name: None })
                        .await;
                    return;
                }
                Ok(Ok(n)) => first.extend_from_slice(&chunk[..n]),
                Err(_) => {
                    break Sniffed::Refused(
                        "no name within 10 s (a protocol where the server speaks first?)",
                    );
                }
            }
        };
        let (name, via, ech, later) = match sniffed {
            Sniffed::Tls { name, ech } => (name.clone(), "tls", ech, Later::Tls(name)),
            Sniffed::Http { host } => {
                let requests = HttpRequests::new(&host);
                (host, "http", false, Later::Http(requests))
            }
            Sniffed::Refused(reason) => {
                let via = if first.first() == Some(&22) { "tls" } else { "unknown" };
                self.report(&Report::Refused { id, dst, via: via.into(), reason: reason.into(), name: None })
                    .await;
                return refuse(client, &first, reason).await;
            }
            Sniffed::NeedMore => unreachable!("the loop ends on anything else"),
        };
        trace.mark("first bytes");
        let first_len = first.len() as u64;
        let ask = Report::Ask {
            id,
            dst,
            check,
            name: Some(name),
            via: via.into(),
            ech,
            forwarder,
            first: first_len,
        };
        match self.ask(id, &ask).await {
            Some(allowance) => {
                trace.mark("verdict");
                self.relay(id, client, Way { dst, trace }, first, later, allowance).await
            }
            // The agent is told its name and that the policy decides, not PID 1's reason (which
            // patterns opened the address, what the forwarder holds: the user's).
            None => {
                let Report::Ask { name: Some(name), .. } = &ask else { return reset(client) };
                refuse(client, &first, &not_allowed(name)).await
            }
        }
    }

    /// Joins the client to `dst`, sending `first` ahead, and reports the bytes when it ends. The
    /// client's later bytes go through `later`'s check: a later HTTP request, or a second TLS
    /// ClientHello, that names another host ends the connection before it reaches the server.
    async fn relay(
        &self,
        id: u64,
        client: TcpStream,
        way: Way,
        first: Vec<u8>,
        later: Later,
        allowance: Allowance,
    ) {
        let Way { dst, trace } = way;
        let started = Instant::now();
        let budgeted = allowance.is_some();
        let (cap_tx, cap) = watch::channel(allowance);
        self.allowances.lock().unwrap_or_else(|e| e.into_inner()).insert(id, cap_tx);
        let mut budget = Budget { checker: self, id, cap };
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        // Only now: a refused connection never reaches the server, not even by a handshake.
        let server = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst)).await {
            Ok(Ok(server)) => server,
            _ => {
                self.closed(id, &counts, started).await;
                return reset(client);
            }
        };
        trace.mark("server connected");
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        // Cut by PID 1 (this task aborted), the counts so far are still reported.
        let mut guard = ClosedGuard {
            checker_socket: self.socket.as_raw_fd(),
            id,
            counts: counts.clone(),
            started,
            armed: true,
        };
        // The client's bytes end at a request that breaks the rule: what came before it is
        // answered, then the connection closes. Whether the server's first bytes asked a TLS client for a second ClientHello.
        let (retry_tx, mut retry_rx) = tokio::sync::watch::channel(None::<bool>);
        let via = if matches!(later, Later::Tls(_)) { "tls" } else { "http" };
        let up = async {
            let (mut filter, tls_name): (Option<Box<dyn ClientBytes>>, _) = match later {
                Later::Http(requests) => (Some(Box::new(requests)), None),
                Later::Tls(name) => (None, Some(name)),
                Later::Unchecked => (None, None),
            };
            let (first, mut refused) = match filter.as_mut() {
                Some(filter) => filter.feed(&first),
                None => (first, None),
            };
            if server_write.write_all(&first).await.is_ok() {
                trace.mark("sent on");
                counts.0.fetch_add(first.len() as u64, Ordering::Relaxed);
                if let Some(name) = tls_name {
                    // The client says nothing more until the server answers its hello (early
                    // data waits in the socket meanwhile): then it is known what may follow.
                    let retry = retry_rx.wait_for(Option::is_some).await.ok().and_then(|r| *r);
                    if retry == Some(true) {
                        filter = Some(Box::new(TlsRetry::new(&name, &first)));
                    }
                }
                if refused.is_none() {
                    refused = copy(
                        &mut client_read,
                        &mut server_write,
                        &counts.0,
                        filter.as_deref_mut(),
                        Some(&mut budget),
                    )
                    .await;
                }
            }
            // A TLS client refused is cut without a word to the server, so that no answer of
            // the server's to the end of its input can reach the client before the reset.
            if refused.is_none() || via != "tls" {
                let _ = server_write.shutdown().await;
            }
            refused.map(|reason| (reason, filter.and_then(|f| f.refused_host().map(str::to_string))))
        };
        let down = async {
            first_reply(&mut server_read, &mut client_write, &counts.1, &retry_tx, &trace).await;
            drop(retry_tx);
            copy(&mut server_read, &mut client_write, &counts.1, None, None).await;
            let _ = client_write.shutdown().await;
        };
        // While bytes go up, PID 1 hears of them (the upload budgets), and may cut the connection.
        // An idle connection (most of a thousand held open) is looked at less and less often; one
        // no budget applies to (the forwarder's, one passed on its address) is not reported on.
        let progress = async {
            if !budgeted {
                return std::future::pending::<()>().await;
            }
            let (mut reported, mut period) = (0, PROGRESS_PERIOD);
            loop {
                tokio::time::sleep(period).await;
                let up = counts.0.load(Ordering::Relaxed);
                if up == reported {
                    period = (period * 2).min(PROGRESS_PERIOD * 20);
                    continue;
                }
                (reported, period) = (up, PROGRESS_PERIOD);
                self.report(&Report::Progress { id, up }).await;
            }
        };
        let relayed = async {
            tokio::pin!(up, down);
            tokio::select! {
                biased;
                refused = &mut up => {
                    // A TLS client refused mid-handshake is cut at once (a reset, as for a first
                    // hello refused); an HTTP client first gets the answers to what it asked.
                    if refused.is_none() || via != "tls" {
                        (&mut down).await;
                    }
                    refused
                }
                () = &mut down => up.await,
            }
        };
        let refused = {
            tokio::pin!(relayed, progress);
            tokio::select! {
                refused = &mut relayed => refused,
                _ = &mut progress => None,
            }
        };
        if refused.is_some()
            && via == "tls"
            && let Ok(client) = client_read.reunite(client_write)
        {
            reset(client);
        }
        if let Some((reason, name)) = refused {
            self.report(&Report::Refused { id, dst, via: via.into(), reason: reason.into(), name }).await;
        }
        // Ended, not cut: the report waits for room rather than being lost to a full queue.
        guard.armed = false;
        self.closed(id, &counts, started).await;
    }

    async fn closed(&self, id: u64, counts: &(AtomicU64, AtomicU64), started: Instant) {
        let report = closed_report(id, counts, started);
        self.report(&report).await;
    }
}

fn closed_report(id: u64, counts: &(AtomicU64, AtomicU64), started: Instant) -> Report {
    Report::Closed {
        id,
        up: counts.0.load(Ordering::Relaxed),
        down: counts.1.load(Ordering::Relaxed),
        ms: started.elapsed().as_millis() as u64,
    }
}

/// Reports a relay's end however it ends, aborted included (a guard's drop runs then, and
/// cannot await: the datagram is sent without blocking, which a unix socket with room takes).
struct ClosedGuard {
    checker_socket: i32,
    id: u64,
    counts: Arc<(AtomicU64, AtomicU64)>,
    started: Instant,
    /// Whether the drop still has to report (a relay that ends normally reports itself).
    armed: bool,
}

impl Drop for ClosedGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(bytes) = serde_json::to_vec(&closed_report(self.id, &self.counts, self.started)) {
            // SAFETY: send on the socket the checker owns for its whole life.
            unsafe {
                libc::send(self.checker_socket, bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT)
            };
        }
    }
}

/// An allowed connection's way on: where to, and its timeline.
struct Way {
    dst: SocketAddr,
    trace: Trace,
}

/// What the client's bytes after its first request or hello go through.
enum Later {
    /// Plain HTTP: every later request names the same host.
    Http(HttpRequests),
    /// TLS allowed for this name: a second ClientHello, if the server asks for one, names it too.
    Tls(String),
    /// Passed on by address: nothing to check.
    Unchecked,
}

/// One connection's way through the checker, phase by phase, from its accept to its first reply
/// relayed: printed on the checker's stderr (the container's log) with
/// `SANDBOX_START_TIMELINE=1`, which `cargo xtask bench sandbox` reads as the start timeline, so
/// that time the name check adds to a first byte names its phase. Off, it is nothing.
struct Trace {
    marks: Option<Mutex<Marks>>,
}

/// When the connection was accepted, and each phase's end.
type Marks = (Instant, Vec<(&'static str, Instant)>);

impl Trace {
    fn new() -> Trace {
        static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let wanted = *WANTED.get_or_init(crate::timeline::wanted);
        Trace { marks: wanted.then(|| Mutex::new((Instant::now(), Vec::with_capacity(6)))) }
    }

    /// `phase` ended now.
    fn mark(&self, phase: &'static str) {
        if let Some(marks) = &self.marks {
            marks.lock().unwrap_or_else(|e| e.into_inner()).1.push((phase, Instant::now()));
        }
    }

    /// The first reply was relayed: the line, once.
    fn print(&self) {
        let Some(marks) = &self.marks else { return };
        let (accepted, marks) = {
            let mut guard = marks.lock().unwrap_or_else(|e| e.into_inner());
            (guard.0, std::mem::take(&mut guard.1))
        };
        if !marks.is_empty() {
            eprintln!("sandbox-init checker: {}", crate::timeline::render("connection", accepted, &marks, 3));
        }
    }
}

/// Relays the server's first bytes until it is known whether they ask a TLS client for a
/// second ClientHello, and says so on `retry` (nothing said: the server ended first).
async fn first_reply(
    from: &mut OwnedReadHalf,
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    count: &AtomicU64,
    retry: &tokio::sync::watch::Sender<Option<bool>>,
    trace: &Trace,
) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        seen.extend_from_slice(&buf[..n.min(64)]);
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if seen.len() == n.min(64) {
            trace.mark("first reply");
            trace.print();
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(answer) = hello_retry(&seen) {
            let _ = retry.send(Some(answer));
            return;
        }
    }
}

/// What a connection may send up: None, no limit; else the bytes in all, before it asks PID 1
/// for more of its name's upload budget.
type Allowance = Option<u64>;

/// A connection's side of its upload budget: what PID 1 granted it so far.
struct Budget<'a> {
    checker: &'a Checker,
    id: u64,
    cap: watch::Receiver<Allowance>,
}

/// Writes `data` to `to` within the connection's allowance, waiting for grants as it goes;
/// false if the write failed or no grant came.
async fn send(
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    data: &[u8],
    count: &AtomicU64,
    budget: &mut Option<&mut Budget<'_>>,
) -> bool {
    let mut done = 0;
    while done < data.len() {
        let left = (data.len() - done) as u64;
        let take = match budget.as_deref_mut() {
            None => left,
            Some(b) => match b.checker.room(b.id, &mut b.cap, count.load(Ordering::Relaxed)).await {
                Some(room) => room.min(left),
                None => return false,
            },
        } as usize;
        if to.write_all(&data[done..done + take]).await.is_err() {
            return false;
        }
        count.fetch_add(take as u64, Ordering::Relaxed);
        done += take;
    }
    true
}

/// Copies until either side ends; through `filter`, until the client's bytes break the rule
/// (then why, after what came before it); within `budget`, the bytes up a name's upload budget
/// leaves the connection.
async fn copy(
    from: &mut OwnedReadHalf,
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    count: &AtomicU64,
    mut requests: Option<&mut (dyn ClientBytes + 'static)>,
    mut budget: Option<&mut Budget<'_>>,
) -> Option<&'static str> {
    loop {
        // The buffer exists only while bytes flow: an idle connection (most of a thousand held
        // open) holds none. Read into its spare room, it is never zeroed.
        if from.readable().await.is_err() {
            return None;
        }
        let mut buf = Vec::with_capacity(RELAY_BUFFER);
        loop {
            // The checker has one thread: a connection whose bytes keep coming (a body of short
            // lines, each read for a request) gives the others their turn, PID 1's orders too
            // (try_read_buf alone would never yield).
            tokio::task::consume_budget().await;
            buf.clear();
            let n = match from.try_read_buf(&mut buf) {
                Ok(0) => return None,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return None,
            };
            let Some(requests) = requests.as_deref_mut() else {
                if !send(to, &buf[..n], count, &mut budget).await {
                    return None;
                }
                continue;
            };
            let (pass, refused) = requests.feed(&buf[..n]);
            if !send(to, &pass, count, &mut budget).await {
                return None;
            }
            if refused.is_some() {
                return refused;
            }
        }
    }
}

/// Ends a refused connection with the answer its protocol carries (`refusal_answer`: a 403 to
/// HTTP, an access_denied alert to TLS), else a reset. The answer is written, the sending side
/// shut, and what the client still sends (a request body) read and dropped until it closes, for
/// 2 s and 64 KiB at most: closed with bytes unread, the socket would reset and the client could
/// lose the answer. Whatever fails on the way ends in a reset; no byte goes anywhere but back.
async fn refuse(mut client: TcpStream, first: &[u8], reason: &str) {
    let Some(answer) = refusal_answer(first, reason) else { return reset(client) };
    let answered = tokio::time::timeout(REFUSAL_LINGER, async {
        client.write_all(&answer).await?;
        client.shutdown().await?;
        let (mut sink, mut left) = ([0u8; 4096], REFUSAL_DRAIN);
        while left > 0 {
            match client.read(&mut sink).await? {
                0 => return Ok(()),
                n => left = left.saturating_sub(n),
            }
        }
        Err(std::io::Error::other("the client sent more than the drain takes"))
    })
    .await;
    if !matches!(answered, Ok(Ok(()))) {
        reset(client);
    }
}

/// How long a refused connection is held for its answer, and how many of its bytes are read.
const REFUSAL_LINGER: Duration = Duration::from_secs(2);
const REFUSAL_DRAIN: usize = 64 * 1024;

/// Ends a connection with a reset, so that the client sees the refusal at once.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Where the client meant to connect, before nft redirected it here (SO_ORIGINAL_DST). None for
/// a connection made to the checker's own port.
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    let fd = stream.as_raw_fd();
    let local = stream.local_addr().ok()?;
    let dst = if local.is_ipv4() {
        // SAFETY: getsockopt into a zeroed sockaddr_in of its size.
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let got =
            unsafe { libc::getsockopt(fd, libc::SOL_IP, SO_ORIGINAL_DST, (&raw mut addr).cast(), &mut len) };
        if got != 0 {
            return None;
        }
        SocketAddr::new(
            IpAddr::V4(Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr))),
            u16::from_be(addr.sin_port),
        )
    } else {
        // SAFETY: as above, for IPv6 (IP6T_SO_ORIGINAL_DST is the same number).
        let mut addr: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        let got = unsafe {
            libc::getsockopt(fd, libc::SOL_IPV6, SO_ORIGINAL_DST, (&raw mut addr).cast(), &mut len)
        };
        if got != 0 {
            return None;
        }
        SocketAddr::new(IpAddr::V6(Ipv6Addr::from(addr.sin6_addr.s6_addr)), u16::from_be(addr.sin6_port))
    };
    // Not redirected: the client connected to the checker itself.
    (dst != local && !dst.ip().is_loopback()).then_some(dst)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn next(pid_1: &UnixDatagram) -> Report {
        let mut buf = vec![0u8; 65536];
        let len = tokio::time::timeout(Duration::from_secs(1), pid_1.recv(&mut buf))
            .await
            .expect("the checker reported nothing")
            .unwrap();
        serde_json::from_slice(&buf[..len]).unwrap()
    }

    /// Found by a red team: a verdict PID 1 gave after the checker stopped waiting left the
    /// connection open in PID 1's books (its budget share held, logged as allowed and open).
    #[tokio::test(start_paused = true)]
    async fn a_verdict_given_up_on_is_reported_closed_and_one_in_time_is_not() {
        let (ours, pid_1) = UnixDatagram::pair().unwrap();
        let checker = Checker::new(ours);
        let ask = |id| Report::Ask {
            id,
            dst: "192.0.2.1:443".parse().unwrap(),
            check: true,
            name: Some("late.test".into()),
            via: "tls".into(),
            ech: false,
            forwarder: false,
            first: 0,
        };
        assert_eq!(checker.ask(7, &ask(7)).await, None);
        assert_eq!(next(&pid_1).await, ask(7));
        assert_eq!(next(&pid_1).await, Report::Closed { id: 7, up: 0, down: 0, ms: 5000 });
        // The control: answered in time, nothing more is said.
        let answer = async {
            assert_eq!(next(&pid_1).await, ask(8));
            let verdict = Order::Verdict { id: 8, allow: true, reason: String::new(), allowance: Some(10) };
            pid_1.send(&serde_json::to_vec(&verdict).unwrap()).await.unwrap();
        };
        let asked = ask(8);
        let (allowed, ()) = tokio::join!(
            async {
                tokio::select! { a = checker.ask(8, &asked) => a, () = checker.orders() => None }
            },
            answer
        );
        assert_eq!(allowed, Some(Some(10)));
        let mut buf = [0u8; 16];
        assert!(pid_1.try_recv(&mut buf).is_err(), "nothing after a verdict in time");
    }
}
