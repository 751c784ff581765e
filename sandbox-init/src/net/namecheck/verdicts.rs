//! PID 1's side of the name check: the checker (an unprivileged process, checker.rs) asks,
//! for every connection, whether it may go on; PID 1 answers from the sink (whose lock a reload
//! takes, so a verdict is never given on half a policy), logs the connection, and at a reload
//! tells the checker which open connections to cut. The two talk over a socketpair PID 1 made:
//! nothing else, the agent least of all, can reach it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use tokio::net::{TcpSocket, UnixDatagram};

use crate::connections::{Connection, ConnectionLog};
use crate::denials::{Denial, DenialLog};
use crate::net::dns::AddressSink as _;
use crate::net::dns::sink::NftSink;
use crate::net::namecheck::protocol::Listener;
use crate::policy::{IpNet, Opening, Ports, Protocol};
use crate::privileges::AgentPrivileges;
use sandbox_wire::namecheck::budgets::{FIRST_GRANT, Share, Uploads, budget_of, over_budget};
use sandbox_wire::namecheck::messages::{Order, Report};
use std::net::IpAddr;

/// What a connection asked to do, as PID 1 judges it (at its start, and again at a reload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    pub dst: SocketAddr,
    /// It came to a port that checks names.
    pub check: bool,
    /// The name the client sent.
    pub name: Option<String>,
    /// Its ClientHello carried an encrypted one.
    pub ech: bool,
    /// The key forwarder made it (nft sent it to the forwarder's port by the socket's uid).
    pub forwarder: bool,
}

/// An allowed connection still open: what its log line will say when it closes.
struct Live {
    line: Connection,
    asked: Asked,
    /// Its bytes up already counted against its name's budget.
    counted: u64,
    /// Its part of its name's upload budget, if one applies.
    share: Option<Share>,
}

/// What the open connections counted against `key` (but `except`) were granted and have not
/// sent yet.
fn reserved(live: &HashMap<u64, Live>, key: &str, except: Option<u64>) -> u64 {
    live.iter()
        .filter(|(id, _)| Some(**id) != except)
        .filter_map(|(_, c)| c.share.as_ref().map(|s| (s, c.counted)))
        .filter(|(s, _)| !s.cut && s.key == key)
        .map(|(s, counted)| s.granted.saturating_sub(counted))
        .sum()
}

pub struct Verdicts {
    sink: Arc<NftSink>,
    cidrs: RwLock<BTreeMap<IpNet, Ports>>,
    log: Arc<ConnectionLog>,
    live: Mutex<HashMap<u64, Live>>,
    /// The current checker's end of the socketpair.
    socket: Mutex<Option<Arc<UnixDatagram>>>,
    /// PID 1's own test connection at start, which is not the agent's to log.
    quiet: Quiet,
    /// The hosts the key forwarder holds a key for: only it may connect to them.
    held: RwLock<std::collections::BTreeSet<String>>,
    /// What each name checked received from the agent this hour, against its budget.
    uploads: Uploads,
    /// Where a spent budget is told (`agent-sandbox pending` reads it).
    denials: Arc<DenialLog>,
}

/// Why a connection may go on: the name to log and the reason.
type Allowed = (Option<String>, String);

impl Verdicts {
    pub fn new(
        sink: Arc<NftSink>,
        cidrs: BTreeMap<IpNet, Ports>,
        log: Arc<ConnectionLog>,
        denials: Arc<DenialLog>,
    ) -> Arc<Verdicts> {
        Arc::new(Verdicts {
            denials,
            sink,
            cidrs: RwLock::new(cidrs),
            log,
            live: Mutex::new(HashMap::new()),
            socket: Mutex::new(None),
            quiet: Quiet::default(),
            held: RwLock::new(Default::default()),
            uploads: Uploads::default(),
        })
    }

    /// The connection log the verdicts write to (the forwarder's refusals go there too).
    pub fn log(&self) -> Arc<ConnectionLog> {
        self.log.clone()
    }

    /// The hosts whose keys the forwarder holds: from now on, only its connections reach them.
    pub fn hold(&self, hosts: impl IntoIterator<Item = String>) {
        self.held.write().unwrap_or_else(|e| e.into_inner()).extend(hosts);
    }

    /// Whether a connection to `dst` may go on: on the checking port, the address must be open
    /// (resolved for an allowed name, not expired) and the name the client sent allowed on that
    /// port, and a hello with ECH only where its entry says `ech`; a host whose key the
    /// forwarder holds, from the forwarder alone, and the forwarder to those hosts alone; on the
    /// passing port, the address must be open on an opaque port, or in a range.
    pub fn decide(&self, asked: &Asked) -> Result<Allowed, String> {
        let Asked { dst, check, ech, forwarder, .. } = *asked;
        let opened = self.sink.opened(dst.ip(), dst.port());
        if check {
            let Some((_, entries)) = opened else {
                return Err("the address is not open for an allowed name".into());
            };
            let name = asked.name.as_deref().ok_or("no name")?;
            let port = dst.port();
            // A host a reload made forwarded has no route until the next start: it is held all
            // the same, so that it is never reached directly in the meantime.
            let held = self.held.read().unwrap_or_else(|e| e.into_inner()).contains(name)
                || self.sink.allowlist().is_forwarded(name);
            if held && !forwarder {
                return Err(format!(
                    "{name} is reached through the key forwarder alone: sandbox-init holds its key or \
                     token, and a connection of the agent's own could carry one of its own"
                ));
            }
            if forwarder && !held {
                return Err(format!("the key forwarder holds no key for {name}"));
            }
            return match self.sink.allowlist().matches(name) {
                // The name must be one the address was opened for (by an entry that allows it):
                // an allowed name sent to another allowed name's address would reach whichever
                // site that shared host serves under it, a site the name's DNS never chose.
                Some(m)
                    if m.access.allows(Protocol::Tcp, port)
                        && !m.patterns.iter().any(|p| entries.contains(p)) =>
                {
                    let opened_for: Vec<String> = entries.iter().map(ToString::to_string).collect();
                    Err(format!(
                        "{name} is allowed, but {} was opened for {} only",
                        dst.ip(),
                        opened_for.join(", ")
                    ))
                }
                Some(m) if ech && !m.access.ech && m.access.allows(Protocol::Tcp, port) => Err(format!(
                    "{name} came with an encrypted ClientHello (ECH), whose inner name the check cannot \
                     read; `ech: true` on its domain entry allows it"
                )),
                Some(m) if m.access.allows(Protocol::Tcp, port) => {
                    Ok((Some(name.to_string()), format!("{name} is allowed on port {port}")))
                }
                Some(_) => Err(format!("{name} is not allowed on port {port}")),
                None => Err(format!("{name} is not in the allowlist")),
            };
        }
        match opened {
            Some((Opening::Opaque, entries)) => {
                let entry = entries.first().map(ToString::to_string);
                Ok((entry, "an opaque port of an allowed name".into()))
            }
            _ if self.in_a_range(dst) => Ok((None, "in an allowed range".into())),
            _ => Err("the address is not open on this port without a name check".into()),
        }
    }

    fn in_a_range(&self, dst: SocketAddr) -> bool {
        let cidrs = self.cidrs.read().unwrap_or_else(|e| e.into_inner());
        crate::policy::ranges_allow(&cidrs, dst.ip(), dst.port())
    }

    /// Serves one checker until its socket fails; a new checker gets a new socket.
    pub async fn serve(self: Arc<Self>, socket: UnixDatagram) {
        let socket = Arc::new(socket);
        *self.socket.lock().unwrap_or_else(|e| e.into_inner()) = Some(socket.clone());
        // The connections of an earlier checker died with it.
        self.live.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut buf = vec![0u8; 65536];
        while let Ok(len) = socket.recv(&mut buf).await {
            let Ok(report) = serde_json::from_slice::<Report>(&buf[..len]) else { continue };
            for order in self.handle(report) {
                self.send(&socket, &order).await;
            }
        }
    }

    async fn send(&self, socket: &UnixDatagram, order: &Order) {
        if let Ok(bytes) = serde_json::to_vec(order) {
            let _ = socket.send(&bytes).await;
        }
    }

    /// One report of the checker: a verdict to send back, for an ask; the connections to cut,
    /// for bytes that spent a name's upload budget.
    pub fn handle(&self, report: Report) -> Vec<Order> {
        match report {
            Report::Ask { id, dst, check, name, via, ech, forwarder, first } => {
                let via = match (ech, forwarder) {
                    (true, _) => format!("{via} (ech)"),
                    (false, true) => format!("{via} (key forwarder)"),
                    (false, false) => via,
                };
                let asked = Asked { dst, check, name: name.clone(), ech, forwarder };
                match self.decide(&asked).and_then(|allowed| Ok((allowed, self.admit(id, &asked, first)?))) {
                    Ok(((logged, reason), share)) => {
                        let line = Connection::new("tcp", dst, &via, "allowed", reason.clone()).named(logged);
                        let allowance = share.as_ref().map(|s| s.granted);
                        let counted = if share.is_some() { first } else { 0 };
                        let live = Live { line, asked, counted, share };
                        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(id, live);
                        vec![Order::Verdict { id, allow: true, reason, allowance }]
                    }
                    Err(reason) => {
                        let line = Connection::new("tcp", dst, &via, "refused", reason.clone()).named(name);
                        self.log.record(line, None);
                        vec![Order::Verdict { id, allow: false, reason, allowance: None }]
                    }
                }
            }
            Report::Refused { dst, via, reason, name, .. } => {
                if !self.quiet.takes(dst) {
                    self.log.record(Connection::new("tcp", dst, &via, "refused", reason).named(name), None);
                }
                Vec::new()
            }
            Report::Progress { id, up } => {
                let cut = self.count_upload(id, up);
                if !cut.is_empty() {
                    return cut;
                }
                match self.grant(id, up) {
                    Some(total) => vec![Order::Allowance { id, total }],
                    None => Vec::new(),
                }
            }
            Report::Closed { id, up, down, ms } => {
                let cut = self.count_upload(id, up);
                let Some(live) = self.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) else {
                    return cut;
                };
                let mut line = live.line;
                line.bytes_up = Some(up);
                line.bytes_down = Some(down);
                line.ms = Some(ms);
                self.log.record(line, Some(id));
                cut
            }
        }
    }

    /// Counts what connection `id` sent up since the last count against its name's budget (a
    /// name-checked connection of the agent's; the forwarder's are the user's requests, with the
    /// user's key, and have none). Past the budget, every open connection to the name is cut.
    fn count_upload(&self, id: u64, up: u64) -> Vec<Order> {
        let (name, added) = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            // A connection with no share is one no budget applies to.
            let Some(conn) = live.get_mut(&id).filter(|c| c.share.is_some()) else { return Vec::new() };
            let Some(name) = conn.asked.name.clone() else { return Vec::new() };
            let added = up.saturating_sub(conn.counted);
            conn.counted = conn.counted.max(up);
            (name, added)
        };
        if added == 0 {
            return Vec::new();
        }
        let allowlist = self.sink.allowlist();
        let Some((key, budget)) = allowlist.matches(&name).map(|m| budget_of(&name, &m)) else {
            return Vec::new();
        };
        let sent = self.uploads.add(&key, added, Instant::now());
        if sent < budget {
            return Vec::new();
        }
        self.denials.record(Denial::Upload { name: key.clone(), budget, sent });
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut cut = Vec::new();
        for (id, conn) in live.iter_mut() {
            // Each connection is cut once, however many reports come before its end.
            let Some(share) = conn.share.as_mut().filter(|s| !s.cut && s.key == key) else { continue };
            share.cut = true;
            conn.line.reason = format!("cut: {}", over_budget(&key, budget));
            cut.push(Order::Close { id: *id });
        }
        cut
    }

    /// A new connection's share of its name's upload budget, with its first `first` bytes (the
    /// hello or request head the checker read, which it sends before anything else) counted:
    /// None where no budget applies (the forwarder's connections, those passed on the address).
    /// Refused when the budget is spent or they do not fit in what is left, the other open
    /// connections' grants reserved. A name a reload removed meanwhile gets no room past its
    /// first bytes.
    fn admit(&self, id: u64, asked: &Asked, first: u64) -> Result<Option<Share>, String> {
        let Some(name) = asked.name.as_deref().filter(|_| asked.check && !asked.forwarder) else {
            return Ok(None);
        };
        let Some(m) = self.sink.allowlist().matches(name) else {
            let key = name.to_string();
            return Ok(Some(Share { key, granted: first, step: FIRST_GRANT, cut: false }));
        };
        let (key, budget) = budget_of(name, &m);
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let sent = self.uploads.sent(&key, Instant::now());
        let held = reserved(&live, &key, Some(id));
        if sent >= budget || first > budget - sent {
            self.denials.record(Denial::Upload { name: key.clone(), budget, sent });
            return Err(over_budget(&key, budget));
        }
        let left = budget.saturating_sub(sent).saturating_sub(held);
        if first > left {
            return Err(format!(
                "what is left of {key}'s upload budget ({} bytes this hour) is granted to its open connections",
                budget.saturating_sub(sent)
            ));
        }
        self.uploads.add(&key, first, Instant::now());
        Ok(Some(Share::first(key, first, left)))
    }

    /// More of its name's budget for connection `id`, which has sent `up`: the total it may
    /// send, if that grows. Each grant doubles the last, GRANT at most, and takes no more than
    /// is left once the other connections' grants are reserved.
    fn grant(&self, id: u64, up: u64) -> Option<u64> {
        let allowlist = self.sink.allowlist();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let conn = live.get(&id)?;
        let share = conn.share.as_ref().filter(|s| !s.cut)?;
        let name = conn.asked.name.as_deref()?;
        // A name a reload removed gets no more: recheck cuts it.
        let (key, budget) = budget_of(name, &allowlist.matches(name)?);
        if key != share.key {
            return None;
        }
        let this_hour = self.uploads.sent(&key, Instant::now());
        let left = budget.saturating_sub(this_hour).saturating_sub(reserved(&live, &key, Some(id)));
        let conn = live.get_mut(&id)?;
        let sent = up.max(conn.counted);
        conn.share.as_mut()?.grow(sent, left)
    }

    /// After a reload: the ranges in force, and every open connection judged again; those the
    /// new policy refuses are cut.
    pub async fn recheck(&self, cidrs: BTreeMap<IpNet, Ports>) {
        *self.cidrs.write().unwrap_or_else(|e| e.into_inner()) = cidrs;
        let cut: Vec<u64> = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let mut cut = Vec::new();
            for (id, conn) in live.iter_mut() {
                if let Err(reason) = self.decide(&conn.asked) {
                    conn.line.reason = format!("cut at a reload: {reason}");
                    cut.push(*id);
                }
            }
            cut
        };
        let socket = self.socket.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(socket) = socket {
            for id in cut {
                self.send(&socket, &Order::Close { id }).await;
            }
        }
    }

    /// The next refusal of a connection to `dst` goes unlogged: PID 1's own test at start,
    /// whose report may come after the test itself has returned.
    pub fn quiet(&self, dst: SocketAddr) {
        *self.quiet.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(dst);
    }

    /// How many allowed connections are open.
    pub fn open_connections(&self) -> usize {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// One refusal to leave unlogged, once.
#[derive(Debug, Default)]
struct Quiet(Mutex<Option<SocketAddr>>);

impl Quiet {
    /// Whether a refusal of `dst` is the one to leave unlogged (then no other is).
    fn takes(&self, dst: SocketAddr) -> bool {
        let mut quiet = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let takes = *quiet == Some(dst);
        if takes {
            *quiet = None;
        }
        takes
    }
}

/// The listeners' backlog (the kernel caps it at net.core.somaxconn, 4096 by default).
const LISTEN_BACKLOG: u32 = 4096;

/// The checker process as PID 1 runs it: the listeners (bound once and kept open by PID 1, so
/// that while no checker runs, connections wait unaccepted instead of being refused by a port
/// the agent could take), and the child, started again when it dies.
pub struct CheckerProcess {
    /// The listeners, and which each is.
    listeners: Vec<(std::net::TcpListener, Listener)>,
    verdicts: Arc<Verdicts>,
    pid: Mutex<i32>,
    serving: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl CheckerProcess {
    /// Binds the checker's ports on loopback (IPv6 too, where it is up).
    pub fn bind(verdicts: Arc<Verdicts>, ipv6: bool) -> std::io::Result<CheckerProcess> {
        let mut listeners = Vec::new();
        let mut hosts: Vec<IpAddr> = vec![IpAddr::from([127, 0, 0, 1])];
        if ipv6 {
            hosts.push(IpAddr::from(std::net::Ipv6Addr::LOCALHOST));
        }
        for host in hosts {
            for kind in Listener::ALL {
                let socket = if host.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
                // A gateway restarted into the namespace it shares (sidecar mode) finds its last
                // run's connections in TIME_WAIT on these ports; a listener still bound there
                // keeps refusing it.
                socket.set_reuseaddr(true)?;
                socket.bind(SocketAddr::new(host, kind.port()))?;
                // Room for a burst of connections while the checker accepts: past the backlog
                // the kernel answers with SYN cookies, and a connection whose ACK finds the
                // queue still full is reset.
                listeners.push((socket.listen(LISTEN_BACKLOG)?.into_std()?, kind));
            }
        }
        Ok(CheckerProcess { listeners, verdicts, pid: Mutex::new(0), serving: Mutex::new(None) })
    }
}

impl crate::process::Service for CheckerProcess {
    fn pid(&self) -> i32 {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a checker: a new socketpair, the child with it and the listeners, as the checker's
    /// user with no capability, and the verdict server on PID 1's end.
    fn start(&self, program: &std::path::Path) -> Result<i32, String> {
        use crate::net::namecheck::protocol::{LISTENERS_ENV, VERDICT_FD};
        use crate::net::uids::CHECKER_UID;
        use std::os::fd::AsRawFd as _;
        let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().map_err(|e| e.to_string())?;
        let mut fds = vec![theirs.as_raw_fd()];
        let mut spec = Vec::new();
        for (i, (listener, kind)) in self.listeners.iter().enumerate() {
            fds.push(listener.as_raw_fd());
            spec.push(format!("{}:{}", VERDICT_FD + 1 + i as i32, kind.name()));
        }
        let mut command = AgentPrivileges::system(CHECKER_UID)
            .service(program, "sandbox-checker")
            .map_err(|e| e.to_string())?;
        command.arg("checker").env(LISTENERS_ENV, spec.join(","));
        let pid = crate::process::spawn_with_fds(&mut command, &fds).map_err(|e| e.to_string())?;
        drop(theirs);
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
        ours.set_nonblocking(true).map_err(|e| e.to_string())?;
        let ours = UnixDatagram::from_std(ours).map_err(|e| e.to_string())?;
        let serving = tokio::spawn(self.verdicts.clone().serve(ours));
        if let Some(old) = self.serving.lock().unwrap_or_else(|e| e.into_inner()).replace(serving) {
            old.abort();
        }
        Ok(pid)
    }
}

#[cfg(test)]
mod tests;
