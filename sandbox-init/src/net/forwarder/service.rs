//! The key forwarder as PID 1 runs it, one of its services: at start, the keys and tokens taken
//! and the agent's session pointed at the forwarder (`hold_keys`); the listeners (one per route,
//! bound before the agent starts), the configuration handed over in a memory file, the refusals
//! it reports written to the connection log, and the child, started again when it dies
//! (`Forwarder`).

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::console;
use crate::exit::{Fatal, Refusal};
use crate::net::forwarder::keys;
use crate::net::forwarder::routes::{self, ServiceRoute};
use crate::net::forwarder::{CONFIG_FD, Config, RefusedRequest};
use crate::net::namecheck::verdicts::Verdicts;
use crate::net::uids::FORWARDER_UID;
use crate::policy::Policy;
use crate::policy::forward::Part;
use crate::privileges::AgentPrivileges;
use crate::process::Service as _;

/// The forwarder as PID 1 runs it: the listeners (bound before the agent starts, so no process
/// of the agent's can take the ports first) and the child, started again when it dies.
pub struct Forwarder {
    listeners: Vec<std::net::TcpListener>,
    config: String,
    pid: Mutex<i32>,
    /// PID 1's end of the socket the forwarder reports its refusals on, and the forwarder's
    /// (kept to pass again when it is restarted).
    reports: std::os::unix::net::UnixDatagram,
    its_end: std::os::unix::net::UnixDatagram,
}

impl Forwarder {
    /// Binds one loopback port per route: each held key's API and each forwarded host
    /// (routes.rs's).
    pub fn bind(
        routes: &[ServiceRoute],
        extra_ca: Option<String>,
        resolver: Option<std::net::IpAddr>,
    ) -> std::io::Result<Forwarder> {
        let forwarded = routes.iter().map(|r| (r.host.host.clone(), r.host.port)).collect();
        let mut listeners = Vec::new();
        let mut config_routes = Vec::new();
        for (index, service) in routes.iter().enumerate() {
            let (port, mut route) = service.route();
            listeners.push(std::net::TcpListener::bind(("127.0.0.1", port))?);
            route.fd = CONFIG_FD + 1 + index as i32;
            config_routes.push(route);
        }
        let routes = config_routes;
        let (reports, its_end) = std::os::unix::net::UnixDatagram::pair()?;
        let report_fd = Some(CONFIG_FD + 1 + listeners.len() as i32);
        let config = serde_json::to_string(&Config { routes, extra_ca, report_fd, resolver, forwarded })
            .map_err(std::io::Error::other)?;
        Ok(Forwarder { listeners, config, pid: Mutex::new(0), reports, its_end })
    }
}

impl Forwarder {
    /// Records each refusal the forwarder reports in `log` (connections.jsonl), on a thread of
    /// its own, for as long as PID 1 runs.
    pub fn log_refusals(&self, log: Arc<crate::connections::ConnectionLog>) -> std::io::Result<()> {
        let socket = self.reports.try_clone()?;
        std::thread::Builder::new().name("forwarder-refusals".into()).spawn(move || {
            // Reasons are bounded (inspect::MAX_REASON characters): no report is cut.
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(len) = socket.recv(&mut buf) {
                let Ok(refusal) = serde_json::from_slice::<RefusedRequest>(&buf[..len]) else { continue };
                let dst = std::net::SocketAddr::from(([127, 0, 0, 1], refusal.port));
                let reason = format!("{} {}", refusal.status, refusal.reason);
                let line = crate::connections::Connection::new("tcp", dst, "forwarder", "refused", reason);
                log.record(line.named(Some(refusal.host)), None);
            }
        })?;
        Ok(())
    }
}

impl crate::process::Service for Forwarder {
    fn pid(&self) -> i32 {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the forwarder as its own user with no capability; the configuration (keys
    /// included) travels in a memory file at descriptor 3, never in an argument or variable.
    fn start(&self, program: &Path) -> Result<i32, String> {
        // SAFETY: memfd_create with a static name; the descriptor is owned at once.
        let raw = unsafe { libc::memfd_create(c"forwarder-config".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor, ours alone.
        let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut file = std::fs::File::from(memfd);
        std::io::Write::write_all(&mut file, self.config.as_bytes()).map_err(|e| e.to_string())?;
        std::io::Seek::rewind(&mut file).map_err(|e| e.to_string())?;
        let mut fds = vec![file.as_raw_fd()];
        fds.extend(self.listeners.iter().map(|l| l.as_raw_fd()));
        fds.push(self.its_end.as_raw_fd());
        let mut command = AgentPrivileges::system(FORWARDER_UID)
            .service(program, "sandbox-forwarder")
            .map_err(|e| e.to_string())?;
        command.arg("forwarder");
        let pid = crate::process::spawn_with_fds(&mut command, &fds).map_err(|e| e.to_string())?;
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
        Ok(pid)
    }
}

/// Takes the API keys given to the container (keys.rs) and the forwarded services' tokens
/// (routes.rs), and starts the forwarder that holds them; writes the variables the agent's
/// processes get instead (an empty list without either) and git's `insteadOf`. With the name
/// check, the hosts of the held keys and the forwarded hosts are the forwarder's alone from then
/// on.
pub fn hold_keys(
    agent: &AgentPrivileges,
    policy: &Policy,
    verdicts: Option<&Verdicts>,
    gate: Option<std::net::IpAddr>,
    model_server: Option<&crate::apis::ModelServer>,
) -> Result<Option<Arc<Forwarder>>, Fatal> {
    let secrets = Path::new(keys::SECRETS_DIR);
    let held = keys::load(&crate::apis::APIS.iter().collect::<Vec<_>>(), agent, secrets)?;
    // A held key is a forwarded host like GitHub's: one route type, one forwarder.
    let mut routes: Vec<ServiceRoute> = held.iter().map(|key| key.route(policy)).collect();
    routes.extend(routes::routes(policy, agent, secrets)?);
    let mut env = routes::session_env(&routes);
    // Where GitHub is direct, the agent's CLI signs in with the token itself: said loudly.
    let direct = routes::direct_tokens(policy, agent, secrets)?;
    for (var, _) in &direct {
        console::err(format!(
            "sandbox-init: WARNING: a service is direct (`forward: … direct: true`): the agent's session gets ${var}, \
             and whatever that token may do, the agent may"
        ));
    }
    env.extend(direct);
    let setup =
        |what: &str, e: std::io::Error| Fatal::new(Refusal::SetupFailed, format!("cannot write {what}: {e}"));
    crate::apis::write_session_env(&env).map_err(|e| setup(crate::apis::SESSION_ENV, e))?;
    routes::write_gitconfig(&routes).map_err(|e| setup(routes::GITCONFIG, e))?;
    crate::status::set_forwarded(routes.iter().map(|r| &r.host).filter(|h| h.part != Some(Part::Model)));
    if let Some(verdicts) = verdicts {
        verdicts.hold(routes.iter().map(|r| r.host.host.clone()));
    }
    // The model server is an address no name opens: the firewall gives it to the forwarder alone.
    routes.extend(model_server.map(|m| routes::model_server_route(&m.url, m.address, &m.model)));
    if routes.is_empty() {
        return Ok(None);
    }
    let extra_ca = crate::secrets::read_secret(&secrets.join(keys::EXTRA_CA_SECRET), agent)?;
    let forwarder = Forwarder::bind(&routes, extra_ca, gate)
        .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot listen for the key forwarder: {e}")))?;
    if let Some(verdicts) = verdicts {
        forwarder.log_refusals(verdicts.log()).map_err(|e| {
            Fatal::new(Refusal::SetupFailed, format!("cannot read the key forwarder's refusals: {e}"))
        })?;
    }
    let pid = forwarder
        .start(&crate::process::sandbox_init_exe())
        .map_err(|e| Fatal::new(Refusal::SetupFailed, format!("cannot start the key forwarder: {e}")))?;
    for route in &routes {
        console::err(route.start_line(pid));
    }
    Ok(Some(Arc::new(forwarder)))
}
