//! PID 1: load the policy, program the firewall, start the DNS gate, verify, start the agent's
//! session, then stay as init. Every step fails closed: the agent starts only if all succeed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};

use crate::connections::{CONNECTION_LOG, ConnectionLog};
use crate::console;
use crate::denials::{DENIAL_LOG, DenialLog};
use crate::exit::{Fatal, Refusal};
use crate::net::enforcer::{Enforcement, Logs, Settings, enforce};
use crate::net::firewall::{FirewallMode, Shape, max_addresses, nflog};
use crate::net::forwarder::service::{Forwarder, hold_keys};
use crate::net::interfaces::Network;
use crate::net::namecheck::{self, NAME_CHECK_ENV};
use crate::policy::layout::{GATEWAY_READY, READY_MARK, ROLE_ENV};
use crate::policy::{BAKED_POLICY, DROP_IN_DIR, Policy};
use crate::privileges::{AGENT_USER, AgentPrivileges, CAP_NET_ADMIN, Capabilities};
use crate::process::{self, restart_if_reaped};
use crate::session::{self, RUN_DIR};
use crate::status;
use crate::timeline;

/// How long the session's foreground processes get to end after SIGTERM before the tmux server
/// is closed, which hangs up the rest (an interactive shell ignores SIGTERM, not SIGHUP).
const STOP_GRACE: Duration = Duration::from_secs(2);
/// With a terminal: how long the ready line has to reach the engine before tmux starts.
const TTY_READY_GRACE: Duration = Duration::from_millis(100);

pub fn load_policy() -> Result<Policy, Fatal> {
    let (policy, skipped) = Policy::load(Path::new(BAKED_POLICY), Path::new(DROP_IN_DIR))
        .map_err(|e| Fatal::new(Refusal::for_policy(&e), e))?;
    for file in skipped {
        console::err(format!(
            "sandbox-init: ignoring {}: policy drop-ins end in .yaml, .yml or .txt",
            file.display()
        ));
    }
    Ok(policy)
}

/// What this container is of a sandbox (`SANDBOX_ROLE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// One container: the firewall and the session (the default).
    Whole,
    /// Sidecar mode's firewall: everything but the session, in the network namespace it shares
    /// with the agent's container.
    Gateway,
    /// Sidecar mode's agent container: the session, under a PID 1 without capability.
    Agent,
}

impl Role {
    pub fn from_env() -> Result<Role, Fatal> {
        match std::env::var(ROLE_ENV).as_deref() {
            Err(_) | Ok("") => Ok(Role::Whole),
            Ok("gateway") => Ok(Role::Gateway),
            Ok("agent") => Ok(Role::Agent),
            Ok(other) => Err(Fatal::new(
                Refusal::BadSetting,
                format!("{ROLE_ENV}={other} is not one of gateway, agent"),
            )),
        }
    }
}

/// Runs as PID 1 (or under another init, as a subreaper) until the session ends; the gateway,
/// until it is stopped.
pub fn run() -> Result<u8, Fatal> {
    let started = Instant::now();
    let role = Role::from_env()?;
    // The user's model server: its variables are the agent's processes' (privileges.rs).
    crate::apis::model_server_env().map_err(|e| Fatal::new(Refusal::BadSetting, e))?;
    if role == Role::Agent {
        let started = crate::sidecar::start_session()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot start the runtime: {e}")))?;
        let supervised = Supervised {
            agent: started.agent,
            server: Some(started.server),
            mode: FirewallMode::On,
            ipv6: false,
            enforcement: None,
            forwarder: None,
            role,
        };
        return Ok(runtime.block_on(supervise(supervised)));
    }
    let shape = if role == Role::Gateway { Shape::Sidecar } else { Shape::Single };
    let mode = FirewallMode::from_env()?;
    let set_size = max_addresses()?;
    let name_check = namecheck::wanted()?;
    let policy = load_policy()?;
    timeline::mark("policy");
    let unattended = crate::session::unattended().map_err(|e| Fatal::new(Refusal::BadSetting, e))?;
    // Read once: PID 1's capabilities do not change until it restricts itself.
    let caps = Capabilities::of("self").unwrap_or_default();
    let needs = crate::privileges::INIT_NEEDS;
    let missing = caps.missing(needs);
    if !missing.is_empty() {
        return Err(Fatal::new(
            Refusal::MissingCapability,
            format!(
                "missing {}: sandbox-init needs {} (Docker's defaults) to start the agent unprivileged; \
                 with --cap-drop ALL, --cap-add them back",
                missing.join(", "),
                Capabilities::default().missing(needs).join(", ")
            ),
        ));
    }
    let agent = AgentPrivileges::lookup(AGENT_USER).map_err(|e| Fatal::new(Refusal::SetupFailed, e))?;
    let policy_dir = Path::new(BAKED_POLICY).parent().unwrap_or(Path::new("/"));
    if let Some(why) =
        crate::secrets::policy_writable(policy_dir, Path::new(BAKED_POLICY), Path::new(DROP_IN_DIR), &agent)
    {
        return Err(Fatal::new(
            Refusal::BadSetting,
            format!(
                "{why}: the agent could widen its own allowlist at the next reload; the policy must be \
                 root's alone (owned by root, not writable by others, or mounted read-only, `:ro`)"
            ),
        ));
    }
    timeline::mark("capabilities and user");
    session::prepare_run_dir(&agent, role != Role::Gateway)
        .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot prepare {RUN_DIR}: {e}")))?;
    // Before PID 1 gives up CAP_CHOWN: mounted state volumes become the agent's (the agent's
    // container's, where the gateway has none).
    if role != Role::Gateway {
        crate::state::prepare_from_env(&agent.home, agent.uid, agent.gid);
    }
    // Orphans of the session (the tmux server among them) must be ours to reap, also when
    // another init is PID 1 (`docker run --init`).
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let network = Network::detect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot start the runtime: {e}")))?;
    timeline::mark("run dir, state, runtime");

    let denials = Arc::new(DenialLog::open(
        Path::new(DENIAL_LOG),
        Some(Path::new(crate::policy::layout::REFUSED_FILE)),
    ));
    let connections = Arc::new(ConnectionLog::open(Path::new(CONNECTION_LOG)));
    runtime.spawn(connections.clone().keep_totals_written(Duration::from_millis(200)));
    let logs = Logs { denials: denials.clone(), connections: connections.clone() };
    // The user's model server, which the forwarder alone reaches (apis.rs).
    let model_server = crate::apis::model_server().map_err(|e| Fatal::new(Refusal::BadSetting, e))?;
    let settings = Settings {
        ipv6: network.ipv6,
        set_size,
        name_check,
        shape,
        model_server: model_server.as_ref().map(|m| m.address),
    };
    let mut enforcement = None;
    let mut after_ready = None;
    let summary = match mode {
        FirewallMode::Off | FirewallMode::Open => {
            let name = if mode == FirewallMode::Off { "off" } else { "open" };
            console::err(format!(
                "sandbox-init: WARNING: SANDBOX_FIREWALL={name}: NO EGRESS FIREWALL. The agent can reach any host."
            ));
            format!("firewall {name}, no filtering")
        }
        FirewallMode::On if network.loopback_only() => {
            "no network but loopback, nothing to filter".to_string()
        }
        FirewallMode::On if network.is_hosts() => {
            return Err(Fatal::new(
                Refusal::UnsafeNetwork,
                format!(
                    "this is the host's network namespace (--network host: {} are the host's), whose \
                     firewall is not the sandbox's to program and whose loopback services the agent would \
                     reach; give the container a network of its own",
                    network.host_interfaces.join(", ")
                ),
            ));
        }
        FirewallMode::On => {
            if !caps.has_effective(CAP_NET_ADMIN) {
                return Err(Fatal::new(
                    Refusal::MissingCapability,
                    "no CAP_NET_ADMIN: cannot program the egress firewall, so the agent is not started \
                     (run with --cap-add NET_ADMIN, or --network none, or SANDBOX_FIREWALL=off to run unfiltered)",
                ));
            }
            if !name_check {
                console::err(format!(
                    "sandbox-init: WARNING: {NAME_CHECK_ENV}=off: the agent reaches every site on an allowed address, whatever name it sends"
                ));
            }
            let (enforced, delete_probe) = runtime.block_on(enforce(&policy, &agent, settings, &logs))?;
            (enforcement, after_ready) = (Some(enforced), delete_probe);
            format!("{}, ipv6 {}", policy.summary(), if network.ipv6 { "on" } else { "off" })
        }
    };
    let verdicts = enforcement.as_ref().and_then(|e| e.verdicts.as_deref());
    // The forwarder asks the gate, where there is one, by its address: never a file.
    let gate = enforcement.as_ref().map(|_| crate::net::dns::GATE_ADDR.ip());
    let forwarder = hold_keys(&agent, &policy, verdicts, gate, model_server.as_ref())?;
    timeline::mark("key forwarder");
    let upstreams = enforcement.as_ref().map(|e| e.upstreams.clone()).unwrap_or_default();
    status::write(&status::Status::new(mode, &policy, &upstreams, network.ipv6));

    if enforcement.as_ref().is_some_and(|e| e.loaded.log) {
        nflog::spawn(denials.clone(), connections.clone());
    }

    // The gateway has no session: the agent's container runs it.
    let server = match role {
        Role::Gateway => None,
        _ => Some(
            session::start(&agent, &crate::process::sandbox_init_exe())
                .map_err(|e| Fatal::new(Refusal::SetupFailed, e))?,
        ),
    };
    timeline::mark("status, tmux session");
    // From here PID 1 only updates the firewall, signals the session and runs tmux as the agent.
    if let Err(e) = crate::privileges::restrict_self(crate::privileges::INIT_KEEPS) {
        if let Some(server) = server {
            session::stop_server(server, &agent, libc::SIGKILL);
        }
        return Err(Fatal::new(Refusal::SetupFailed, format!("cannot drop PID 1's own capabilities: {e}")));
    }
    if server.is_some() {
        session::warn_of_a_prompt(unattended);
    }
    // The one line tests and users wait for: the firewall holds and the session runs.
    let gateway = if role == Role::Gateway { "gateway: " } else { "" };
    let ready =
        format!("{}: {gateway}{summary}, {} ms", crate::policy::layout::READY, started.elapsed().as_millis());
    // sandbox-exec runs commands from here on, and not before (ready.rs).
    crate::ready::mark()
        .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot write {READY_MARK}: {e}")))?;
    if role == Role::Gateway {
        // The agent's container starts its session once this is there (sidecar.rs).
        crate::sidecar::write_ready(&ready)
            .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot write {GATEWAY_READY}: {e}")))?;
    }
    console::out(ready);
    timeline::mark("privileges dropped, ready");
    if timeline::wanted() {
        console::err(format!("sandbox-init: {}", timeline::line(started)));
    }
    if let (Some(e), Some(script)) = (&enforcement, after_ready) {
        let nft = e.nft.clone();
        std::thread::spawn(move || nft.apply(&script));
    }
    // SAFETY: isatty on fd 0.
    if server.is_some() && unsafe { libc::isatty(0) } == 1 {
        // The attach relay puts the terminal in raw mode as it starts; the ready line is given
        // a tenth of a second, once, with a terminal only, to be read by the engine first (a
        // tmux client on this terminal used to discard it, seen under load).
        std::thread::sleep(TTY_READY_GRACE);
        session::attach_terminal(&crate::process::sandbox_init_exe())
            .map_err(|e| Fatal::new(Refusal::SetupFailed, e))?;
    }
    let supervised = Supervised { agent, server, mode, ipv6: network.ipv6, enforcement, forwarder, role };
    let code = runtime.block_on(supervise(supervised));
    if role == Role::Gateway {
        crate::sidecar::remove_ready();
    }
    Ok(code)
}

/// What PID 1 watches over once the session runs.
struct Supervised {
    agent: AgentPrivileges,
    /// The tmux server's pid; None for the gateway, which has no session.
    server: Option<i32>,
    mode: FirewallMode,
    ipv6: bool,
    enforcement: Option<Enforcement>,
    forwarder: Option<Arc<Forwarder>>,
    /// The agent's container of sidecar mode has no policy to reload: its gateway reloads.
    role: Role,
}

async fn supervise(supervised: Supervised) -> u8 {
    let Supervised { agent, server, mode, ipv6, enforcement, forwarder, role } = supervised;
    let agent = &agent;
    let (Ok(mut term), Ok(mut int), Ok(mut hup), Ok(mut child)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
        signal(SignalKind::child()),
    ) else {
        console::err("sandbox-init: cannot handle signals");
        return Refusal::SetupFailed.code();
    };
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    let mut stop_signal = 0;
    let mut poll = tokio::time::interval(Duration::from_secs(2));
    loop {
        let deadline =
            stop_deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = child.recv() => {
                let reaped = tokio::task::spawn_blocking(process::reap).await.unwrap_or_default();
                if let Some((_, status)) = reaped.iter().find(|(pid, _)| Some(*pid) == server) {
                    return session_status(stop_signal, *status);
                }
                if let Some(checker) = enforcement.as_ref().and_then(|e| e.checker.clone()) {
                    restart_if_reaped(checker, &reaped, "the name check", "connections wait until it is back");
                }
                if let Some(forwarder) = forwarder.clone() {
                    restart_if_reaped(forwarder, &reaped, "the key forwarder", "requests wait until it is back");
                }
            }
            _ = poll.tick() => {
                // The server may not be our child (another init reaped it): check it lives.
                // SAFETY: kill with signal 0 only checks the pid.
                if server.is_some_and(|server| unsafe { libc::kill(server, 0) } != 0) {
                    return session_status(stop_signal, 0);
                }
            }
            _ = term.recv() => {
                // The gateway has nothing to wind down: its services end with it.
                let Some(server) = server else { return 0 };
                stop_signal = libc::SIGTERM;
                stop_deadline = Some(stop(agent, server, libc::SIGTERM));
            }
            _ = int.recv() => {
                let Some(server) = server else { return 0 };
                stop_signal = libc::SIGINT;
                stop_deadline = Some(stop(agent, server, libc::SIGINT));
            }
            _ = hup.recv(), if role != Role::Agent => reload((mode, ipv6), enforcement.as_ref()).await,
            _ = tokio::time::sleep_until(deadline), if stop_deadline.is_some() => {
                console::err(format!("sandbox-init: the session did not end within {} s of the signal; closing it", STOP_GRACE.as_secs()));
                // SIGTERM is tmux's own way out: it hangs up every pane and exits.
                if let Some(server) = server {
                    session::stop_server(server, agent, libc::SIGTERM);
                }
                stop_deadline = None;
            }
        }
    }
}

fn stop(agent: &AgentPrivileges, server: i32, signal: libc::c_int) -> tokio::time::Instant {
    session::mark_stopping();
    session::signal_panes(server, agent, signal);
    tokio::time::Instant::now() + STOP_GRACE
}

/// The session's exit status as the pane recorded it; 128 + the signal if PID 1 was stopped and
/// the pane recorded nothing.
fn session_status(stop_signal: libc::c_int, server_status: i32) -> u8 {
    if let Some(status) = session::recorded_status() {
        return status;
    }
    if stop_signal != 0 {
        return 128 + stop_signal as u8;
    }
    process::exit_code(server_status)
}

/// SIGHUP: read the policy again and replace the table and the allowlist in one step
/// (`Enforcement::reload`), then write the status. The session is not touched; on any error the
/// current policy stays.
async fn reload((mode, ipv6): (FirewallMode, bool), enforcement: Option<&Enforcement>) {
    let started = Instant::now();
    let policy = match load_policy() {
        Ok(policy) => policy,
        Err(e) => {
            console::err(format!("sandbox-init: reload failed, the current policy stays: {}", e.message));
            return;
        }
    };
    let Some(e) = enforcement else {
        // Nothing to enforce, but the status says what is loaded (the launcher waits for it).
        status::write(&status::Status::new(mode, &policy, &[], ipv6));
        console::err(format!("sandbox-init: policy reloaded; nothing to enforce ({mode:?})"));
        return;
    };
    match e.reload(&policy).await {
        Ok(reloaded) => {
            status::write(&status::Status::new(mode, &policy, &e.upstreams, e.settings.ipv6));
            console::out(format!(
                "{}: {}, {} addresses kept, {} connections cut, {} ms",
                crate::policy::layout::RELOADED,
                policy.summary(),
                reloaded.kept,
                reloaded.cut,
                started.elapsed().as_millis()
            ));
        }
        Err(err) => console::err(format!("sandbox-init: reload failed, the current policy stays: {err}")),
    }
}
