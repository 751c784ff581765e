//! Sidecar mode's agent container: PID 1 is sandbox-init run as the agent, with no capability in
//! any set. It holds nothing and enforces nothing: the gateway (sandbox-init in its `gateway`
//! role, with NET_ADMIN, in the same network namespace) does. It refuses to start where it could
//! hold more than the agent may, waits until the gateway says its firewall holds, then starts the
//! session; init.rs supervises it as in one container.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::console;
use crate::exit::{Fatal, Refusal};
use crate::net::dns::{GATE_ADDR, GATE_PROBE_NAME};
use crate::net::uids::GATE_UID;
use crate::policy::layout::{GATEWAY_READY, RUN_DIR, SHARED_DIR};
use crate::poll::DirWatch;
use crate::privileges::{AGENT_USER, AgentPrivileges, Capabilities};
use crate::session::{self, SESSION_DIR, TMUX_TMPDIR};

/// How long the agent's container waits for its gateway before it gives up (the gateway builds
/// its table, verifies it and starts its services first).
pub const GATEWAY_WAIT: Duration = Duration::from_secs(60);
const GATEWAY_POLL: Duration = Duration::from_millis(25);

/// The session the agent's container started, for init.rs to supervise.
pub struct Started {
    pub agent: AgentPrivileges,
    pub server: i32,
}

/// Written by the gateway once its firewall holds: its ready line, readable by all (the agent's
/// container mounts the shared folder read-only).
pub fn write_ready(line: &str) -> std::io::Result<()> {
    let tmp = format!("{GATEWAY_READY}.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{line}")?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, GATEWAY_READY)
}

/// The gateway, ending: its firewall no longer holds (its table stays, its gate does not).
pub fn remove_ready() {
    let _ = std::fs::remove_file(GATEWAY_READY);
}

/// What the agent's container checks before its session starts: the gateway's ready line, and
/// a gate of the gateway's in this container's network namespace. Err: why not yet.
///
/// A ready file alone could be a stopped gateway's, or one still running in the namespace this
/// container had before it was started again (`docker start` gives it a new one, with no table).
/// So the gate must answer here, on 127.0.0.1:53, now, when nothing of the agent's runs yet in
/// this container to answer in its place; where the kernel shows who listens there
/// (/proc/net/udp: not inside gVisor, whose view is its own), it must be the gate's uid, which no
/// process of the agent's can take.
///
/// The file is read after the gate answered: a gateway removes its last run's file before its
/// gate listens, so the file a gate that answers sees is its own, never the one before.
fn gateway_here(ready: &Path) -> Result<String, String> {
    let missing = || format!("{} is missing", ready.display());
    if !ready.exists() {
        return Err(missing());
    }
    let udp = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    match gate_owner(&udp) {
        Some(uid) if uid != GATE_UID => {
            return Err(format!("{GATE_ADDR} here is uid {uid}'s, not the gateway's gate"));
        }
        _ => {}
    }
    if !gate_answers(GATE_PROBE_WAIT) {
        return Err("no DNS gate answers in this container's network namespace".into());
    }
    let text = std::fs::read_to_string(ready).map_err(|_| missing())?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// How long a gate gets to answer the probe's query.
const GATE_PROBE_WAIT: Duration = Duration::from_millis(300);

/// The uid of whatever listens on 127.0.0.1:53 in this network namespace, as /proc/net/udp shows
/// it; None where nothing is shown.
pub fn gate_owner(proc_net_udp: &str) -> Option<u32> {
    proc_net_udp.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&"0100007F:0035")).then(|| fields.get(7)?.parse().ok()).flatten()
    })
}

/// Whether the gate answers a DNS query within `wait`: a question for its probe name, which it
/// answers NXDOMAIN without a word in its log.
fn gate_answers(wait: Duration) -> bool {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    let id = (std::process::id() as u16) ^ 0x5a5a;
    let Ok(name) = Name::from_ascii(GATE_PROBE_NAME) else { return false };
    let Ok(query) = Message::new().set_id(id).add_query(Query::query(name, RecordType::A)).to_vec() else {
        return false;
    };
    let Ok(socket) = std::net::UdpSocket::bind("127.0.0.1:0") else { return false };
    if socket.set_read_timeout(Some(wait)).is_err() || socket.send_to(&query, GATE_ADDR).is_err() {
        return false;
    }
    let mut answer = [0u8; 512];
    matches!(socket.recv_from(&mut answer), Ok((n, from))
        if from == GATE_ADDR && Message::from_vec(&answer[..n]).is_ok_and(|m| m.id() == id))
}

/// Why this process may not be the agent's PID 1: it holds a capability in some set, or runs as
/// a user other than the agent and root. None if it may.
pub fn too_privileged(caps: &Capabilities, uid: u32, agent_uid: u32) -> Option<String> {
    let held: Vec<String> = [
        ("effective", caps.effective),
        ("permitted", caps.permitted),
        ("inheritable", caps.inheritable),
        ("bounding", caps.bounding),
        ("ambient", caps.ambient),
    ]
    .into_iter()
    .filter(|(_, set)| *set != 0)
    .map(|(name, set)| format!("{name} {set:#x}"))
    .collect();
    if !held.is_empty() {
        return Some(format!(
            "the agent's container holds capabilities ({}): run it with --cap-drop ALL, and only the gateway \
             with NET_ADMIN",
            held.join(", ")
        ));
    }
    if uid != agent_uid {
        return Some(format!(
            "the agent's container runs as uid {uid}: run it as the agent ({agent_uid}, `--user {agent_uid}`)"
        ));
    }
    None
}

/// Checks, prepares the agent's own run folder, waits for the gateway, starts the session.
pub fn start_session() -> Result<Started, Fatal> {
    let started = Instant::now();
    let agent = AgentPrivileges::lookup(AGENT_USER).map_err(|e| Fatal::new(Refusal::SetupFailed, e))?;
    let caps = Capabilities::of("self").map_err(|e| {
        Fatal::new(Refusal::SetupFailed, format!("cannot read this process's capabilities: {e}"))
    })?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if let Some(why) = too_privileged(&caps, uid, agent.uid) {
        return Err(Fatal::new(Refusal::BadSetting, why));
    }
    let unattended = session::unattended().map_err(|e| Fatal::new(Refusal::BadSetting, e))?;
    prepare_own_run_dir().map_err(|e| {
        Fatal::new(
            Refusal::SetupFailed,
            format!(
                "cannot prepare {RUN_DIR} (the agent's container mounts a tmpfs of the agent's there): {e}"
            ),
        )
    })?;
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let gateway = wait_for_gateway(Path::new(GATEWAY_READY), GATEWAY_WAIT)?;
    let server = session::start(&agent, &crate::process::sandbox_init_exe())
        .map_err(|e| Fatal::new(Refusal::SetupFailed, e))?;
    session::warn_of_a_prompt(unattended);
    crate::ready::mark().map_err(|e| {
        Fatal::new(Refusal::SetupFailed, format!("cannot write {}: {e}", crate::policy::layout::READY_MARK))
    })?;
    console::out(format!(
        "{}: agent container, behind the gateway ({}), {} ms",
        crate::policy::layout::READY,
        gateway.trim(),
        started.elapsed().as_millis()
    ));
    Ok(Started { agent, server })
}

/// The gateway's ready line, once it holds for this container ([`gateway_here`]); a refusal
/// after `limit`, with the last reason.
pub fn wait_for_gateway(ready: &Path, limit: Duration) -> Result<String, Fatal> {
    let started = Instant::now();
    let mut said = false;
    // Watched before the first look, so that a file renamed into place between the two wakes it.
    let watch = ready.parent().and_then(|dir| DirWatch::new(dir).ok());
    loop {
        let why = match gateway_here(ready) {
            Ok(line) => return Ok(line),
            Err(why) => why,
        };
        if started.elapsed() >= limit {
            return Err(Fatal::new(
                Refusal::GatewayMissing,
                format!(
                    "no gateway said its firewall holds here within {} s ({why}): start the gateway \
                     (SANDBOX_ROLE=gateway, NET_ADMIN) in this container's network namespace, with {SHARED_DIR} \
                     shared",
                    limit.as_secs()
                ),
            ));
        }
        if !said && started.elapsed() >= Duration::from_secs(1) {
            console::err("sandbox-init: waiting for the gateway's firewall before the session starts");
            said = true;
        }
        match &watch {
            Some(watch) => watch.wait(GATEWAY_POLL),
            None => std::thread::sleep(GATEWAY_POLL),
        }
    }
}

/// The agent's container's run folder is the agent's own (a tmpfs): its tmux folder, its
/// session's status file. The shared folder below it is the gateway's, read-only here.
fn prepare_own_run_dir() -> std::io::Result<()> {
    for (dir, mode) in [(TMUX_TMPDIR, 0o700), (SESSION_DIR, 0o755)] {
        crate::tree::remove(Path::new(dir))?;
        std::fs::create_dir(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    let _ = std::fs::remove_file(session::STOPPING);
    crate::ready::clear()?;
    let status = Path::new(SESSION_DIR).join("status");
    std::fs::File::create(&status)?.set_permissions(std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_renamed_into_the_folder_wakes_the_wait_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let watch = DirWatch::new(dir.path()).unwrap();
        // Nothing lands: the wait takes its whole limit.
        let quiet = Instant::now();
        watch.wait(Duration::from_millis(200));
        assert!(quiet.elapsed() >= Duration::from_millis(190), "{:?}", quiet.elapsed());
        let (tmp, ready) = (dir.path().join("ready.tmp"), dir.path().join("ready"));
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            std::fs::write(&tmp, "sandbox ready\n").unwrap();
            std::fs::rename(&tmp, &ready).unwrap();
        });
        let woken = Instant::now();
        watch.wait(Duration::from_secs(30));
        assert!(
            woken.elapsed() < Duration::from_secs(10),
            "woken by the file, not the limit: {:?}",
            woken.elapsed()
        );
        writer.join().unwrap();
        assert!(dir.path().join("ready").exists());
    }

    #[test]
    fn any_capability_in_any_set_or_a_stranger_uid_is_refused() {
        let none = Capabilities::default();
        assert_eq!(too_privileged(&none, 1000, 1000), None);
        let root = too_privileged(&none, 0, 1000).unwrap();
        assert!(root.contains("uid 0"), "root cannot start the agent without capabilities: {root}");
        let why = too_privileged(&none, 1001, 1000).unwrap();
        assert!(why.contains("uid 1001") && why.contains("--user 1000"), "{why}");
        let bounding = Capabilities { bounding: 1 << 12, ..Capabilities::default() };
        let why = too_privileged(&bounding, 1000, 1000).unwrap();
        assert!(why.contains("bounding 0x1000") && why.contains("--cap-drop ALL"), "{why}");
        let ambient = Capabilities { ambient: 1, ..Capabilities::default() };
        assert!(too_privileged(&ambient, 1000, 1000).unwrap().contains("ambient 0x1"));
    }

    /// A ready file is not enough: a gate must answer here (the case of a container started
    /// again into a new namespace, its gateway still in the old one, or stopped).
    #[test]
    fn the_session_waits_for_a_gateway_here_and_gives_up_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("gateway-ready");
        let fatal = wait_for_gateway(&ready, Duration::from_millis(100)).unwrap_err();
        assert_eq!(fatal.refusal, Refusal::GatewayMissing);
        assert!(fatal.message.contains("gateway-ready is missing"), "{}", fatal.message);
        std::fs::write(&ready, "sandbox ready: gateway: 3 domains\n").unwrap();
        // Nothing answers on 127.0.0.1:53 where the unit tests run (or, as root on a host with a
        // resolver there, not the gate's uid).
        let fatal = wait_for_gateway(&ready, Duration::from_millis(100)).unwrap_err();
        assert!(
            fatal.message.contains("no DNS gate answers") || fatal.message.contains("not the gateway's gate"),
            "{}",
            fatal.message
        );
    }

    #[test]
    fn the_listener_on_the_gates_address_is_known_by_its_uid() {
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n";
        let line = |local: &str, uid: u32| {
            format!(
                "  1: {local} 00000000:0000 07 00000000:00000000 00:00000000 00000000 {uid:>5}        0 1234 2 0000000000000000 0\n"
            )
        };
        assert_eq!(gate_owner(&format!("{header}{}", line("0100007F:0035", 65531))), Some(65531));
        assert_eq!(
            gate_owner(&format!("{header}{}", line("0100007F:0035", 1000))),
            Some(1000),
            "the agent's"
        );
        assert_eq!(gate_owner(&format!("{header}{}", line("0100007F:0036", 65531))), None, "another port");
        assert_eq!(gate_owner(&format!("{header}{}", line("00000000:0035", 65531))), None, "another address");
        assert_eq!(gate_owner(header), None, "nothing shown (gVisor)");
    }
}
