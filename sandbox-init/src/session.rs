//! The agent's tmux session: started as the agent in /workspace, its pane running
//! `$ASSISTANT_CMD` and then a shell (so the session outlives the agent command), attached to the
//! container's terminal when there is one.

use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _, chown};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use crate::policy::layout::{GATEWAY_READY, SHARED_DIR};
use crate::privileges::{AgentPrivileges, PrivilegeError};
use crate::process;
use crate::procfs::{ProcessInfo, Target};

/// Everything sandbox-init keeps at run time.
pub use crate::policy::layout::RUN_DIR;
/// Root's, holding the file the pane writes the exit status of its last command to, for PID 1
/// to exit with: the agent can write that file but cannot replace it (with a link, a FIFO).
pub use crate::policy::layout::SESSION_DIR;
/// tmux's socket directory (TMUX_TMPDIR), owned by the agent; the image sets the same variable
/// so a plain `tmux attach` as the agent finds the session too.
pub use crate::policy::layout::TMUX_TMPDIR;
/// How long PID 1 waits for a tmux client it runs at start: the server is the agent's (it reads
/// the agent's ~/.tmux.conf), and by the second client the pane runs the agent's command, so the
/// agent can hold PID 1 here this long. That only delays its own start: the firewall, the gate
/// and the name check are in force before the session starts. Generous, since a starved machine
/// is slow: an arm64 image under qemu-user beside a VM took over 5 s to start its server.
const TMUX_LIMIT: Duration = Duration::from_secs(30);
pub use crate::policy::layout::WORKSPACE;

pub fn session_name() -> String {
    std::env::var(crate::policy::layout::TMUX_SESSION_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "agent".into())
}

pub fn assistant_cmd() -> String {
    std::env::var(crate::policy::layout::ASSISTANT_CMD_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "bash".into())
}

/// `SANDBOX_UNATTENDED`: whether the agent command starts with the image's unattended
/// arguments and variables (`SANDBOX_UNATTENDED_ARGS`, `SANDBOX_UNATTENDED_ENV`).
pub use crate::policy::layout::UNATTENDED_ENV;

/// Says so where the session's agent command will wait at its first permission prompt: no
/// terminal, unattended mode not asked for, and an image that declares something to turn on
/// (only such an image has a prompt to wait at).
pub fn warn_of_a_prompt(unattended: bool) {
    let declared = [crate::policy::layout::UNATTENDED_ARGS_ENV, crate::policy::layout::UNATTENDED_VARS_ENV]
        .iter()
        .any(|var| std::env::var(var).is_ok_and(|v| !v.trim().is_empty()));
    // SAFETY: isatty on fd 0.
    if unattended || !declared || unsafe { libc::isatty(0) } == 1 {
        return;
    }
    let (command, _) = agent_command(false);
    let (with, _) = agent_command(true);
    let hint = if with == command { String::new() } else { format!(" (`{with}`)") };
    crate::console::err(format!(
        "sandbox-init: no terminal and {UNATTENDED_ENV} unset: `{command}` will wait at its first permission \
         prompt until someone attaches (sandbox-attach); {UNATTENDED_ENV}=1 starts it unattended{hint}"
    ));
}

/// Whether unattended mode is asked for: `1`/`on`/`true`, or `0`/`off`/`false`/unset.
pub fn unattended() -> Result<bool, String> {
    parse_unattended(std::env::var(UNATTENDED_ENV).ok().as_deref())
}

fn parse_unattended(value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim) {
        None | Some("" | "0" | "off" | "false") => Ok(false),
        Some("1" | "on" | "true") => Ok(true),
        Some(other) => Err(format!("{UNATTENDED_ENV}={other}: write 1 (the agent acts without asking) or 0")),
    }
}

/// The agent command and the variables it gets: with unattended mode, the image's unattended
/// arguments appended and its variables (`NAME=value;…`) set.
pub fn agent_command(unattended: bool) -> (String, Vec<(String, String)>) {
    compose_agent_command(
        &assistant_cmd(),
        unattended,
        &std::env::var(crate::policy::layout::UNATTENDED_ARGS_ENV).unwrap_or_default(),
        &std::env::var(crate::policy::layout::UNATTENDED_VARS_ENV).unwrap_or_default(),
    )
}

fn compose_agent_command(
    command: &str,
    unattended: bool,
    args: &str,
    env: &str,
) -> (String, Vec<(String, String)>) {
    if !unattended {
        return (command.to_string(), Vec::new());
    }
    let command =
        if args.trim().is_empty() { command.to_string() } else { format!("{command} {}", args.trim()) };
    let env = env
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(name, _)| !name.trim().is_empty())
        .map(|(name, value)| (name.trim().to_string(), value.to_string()))
        .collect();
    (command, env)
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Privileges(#[from] PrivilegeError),
    #[error("cannot run tmux: {0}")]
    Tmux(#[source] std::io::Error),
    #[error("tmux new-session failed: {0}")]
    NewSession(String),
    #[error("cannot find the tmux server: {0}")]
    NoServer(String),
    #[error("tmux named {pid} as its server, which is not a child of PID 1 run by the agent")]
    NotOurServer { pid: i32 },
    #[error("cannot attach to the session: {0}")]
    Attach(#[source] std::io::Error),
}

/// The variable that has tmux's libevent wait with select(2), set for every tmux PID 1 runs (the
/// session's server is started by the first). tmux turns libevent's epoll backend off on Linux,
/// which leaves poll(2); under gVisor that spins: once a client has gone (`new-session -d`'s own,
/// at start), its closed descriptor stays in the server's poll set with no events, every poll
/// returns at once with POLLNVAL, and an idle sandbox keeps two cores busy (runsc 20240729, its
/// `--strace`: 15,000 polls in 0.3 s). Under runc the server leaves the descriptor out and sleeps;
/// with select it does under both. A client (sandbox-attach's), attached and idle, did not spin
/// on poll under gVisor and stays on it. The agent's processes do not get the variable: the
/// session's global environment drops it and the pane removes it from the agent command's.
pub const TMUX_EVENT_BACKEND: (&str, &str) = ("EVENT_NOPOLL", "1");

fn tmux(agent: &AgentPrivileges) -> Result<Command, SessionError> {
    let mut command = agent.command("tmux")?;
    command.env("TMUX_TMPDIR", TMUX_TMPDIR).env(TMUX_EVENT_BACKEND.0, TMUX_EVENT_BACKEND.1);
    Ok(command)
}

/// Starts the session detached and returns the tmux server's pid, checked in /proc: a child of
/// PID 1 (tmux daemonises, and PID 1 is the subreaper), owned by the agent.
pub fn start(agent: &AgentPrivileges, sandbox_init: &Path) -> Result<i32, SessionError> {
    let name = session_name();
    let workspace = if Path::new(WORKSPACE).is_dir() { PathBuf::from(WORKSPACE) } else { agent.home.clone() };
    // The status line shows the sandbox's refusals on its right (`sandbox-init status-line`,
    // statusline.rs), every 5 s, beside the time. Set in the same call, by the client that
    // starts the server: a second client would find the server by its socket's path, which is
    // in the agent's folder (a server of the agent's could take its place and hold PID 1).
    let right = format!("#('{}' status-line)%H:%M", sandbox_init.display());
    let mut command = tmux(agent)?;
    command
        // -P -F: the new session's server pid, printed by the call that made it.
        .args(["new-session", "-d", "-P", "-F", "#{pid}", "-s", &name, "-x", "200", "-y", "50", "-c"])
        .arg(&workspace)
        .arg(sandbox_init)
        .arg("pane")
        .args([";", "set-option", "-t", &name, "status-right", &right])
        .args([";", "set-option", "-t", &name, "status-right-length", "80"])
        .args([";", "set-option", "-t", &name, "status-interval", "5"])
        .args([";", "set-environment", "-g", "-u", TMUX_EVENT_BACKEND.0])
        .current_dir(&workspace);
    let output = process::output_within(&mut command, TMUX_LIMIT).map_err(SessionError::Tmux)?;
    let stderr = |output: &std::process::Output| String::from_utf8_lossy(&output.stderr).trim().to_string();
    if !output.status.success() {
        return Err(SessionError::NewSession(stderr(&output)));
    }
    let pid: i32 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| SessionError::NoServer(stderr(&output)))?;
    // SAFETY: getpid has no preconditions.
    let ours = unsafe { libc::getpid() };
    match settled_server(pid, ours, agent.uid) {
        Some(server) if pid > 1 && server.ppid == ours && server.uid == agent.uid => Ok(pid),
        _ => Err(SessionError::NotOurServer { pid }),
    }
}

/// How long PID 1 waits for tmux's daemonising middle process to end (it only forks and exits,
/// but on a machine busy enough to show the race it may wait its turn for seconds).
const DAEMONISING_LIMIT: Duration = Duration::from_secs(10);

/// The tmux server's /proc entry once it is PID 1's child. tmux daemonises with daemon(3): the
/// server is the client's grandchild, and becomes the subreaper's child only when the middle
/// process exits. On a busy machine the client can print the server's pid before that process
/// has run its exit (seen: a start refused as "not a child of PID 1"). So where the server's
/// parent is that middle process (the agent's, and ours since the client ended), PID 1 waits
/// for it to end, [`DAEMONISING_LIMIT`] at most, and reads the server again. Anything else is
/// returned as it is, for the caller's check to refuse. No pid here can be reused meanwhile:
/// PID 1 reaps no child before its supervision loop starts, after the session, so the middle
/// process, ended, stays a zombie holding its pid.
fn settled_server(pid: i32, ours: i32, agent_uid: u32) -> Option<ProcessInfo> {
    let server = ProcessInfo::read(pid)?;
    let parent = ProcessInfo::read(server.ppid);
    if parent.is_some_and(|parent| daemonising(&server, &parent, ours, agent_uid)) {
        process::gone_within(server.ppid, DAEMONISING_LIMIT);
        return ProcessInfo::read(pid);
    }
    Some(server)
}

/// Whether `parent` is tmux's daemonising middle process for `server`: the agent's, PID 1's
/// child (the client that forked it has ended), and the server's parent.
fn daemonising(server: &ProcessInfo, parent: &ProcessInfo, ours: i32, agent_uid: u32) -> bool {
    server.ppid == parent.pid && parent.pid != ours && parent.ppid == ours && parent.uid == agent_uid
}

/// Attaches the container's terminal to the session the way `sandbox-attach` does: a root
/// process of ours (`sandbox-init attach`, on the terminal) runs the agent's tmux client on a pty
/// of its own and relays its output through the terminal filter (attach.rs), so that `docker run
/// -it` gets no more of the agent's control strings than `docker exec -it C sandbox-attach`.
/// Returns the relay's pid.
pub fn attach_terminal(sandbox_init: &Path) -> Result<i32, SessionError> {
    let mut command = Command::new(sandbox_init);
    command.arg("attach");
    for var in crate::apis::key_vars() {
        command.env_remove(var);
    }
    process::spawn(&mut command).map_err(SessionError::Attach)
}

/// Sends `signal` to the session's panes and their foreground process groups, found in /proc
/// (never asked of tmux, whose server the agent controls).
pub fn signal_panes(server: i32, agent: &AgentPrivileges, signal: libc::c_int) {
    for target in crate::procfs::stop_targets(&ProcessInfo::all(), server, agent.uid) {
        // SAFETY: kill with plain integers; stop_targets never yields pid 1 or below.
        unsafe {
            match target {
                Target::Process(pid) => libc::kill(pid, signal),
                Target::Group(group) => libc::kill(-group, signal),
            };
        }
    }
}

/// Ends the tmux server (it hangs up every pane), if `server` still is the agent's process.
pub fn stop_server(server: i32, agent: &AgentPrivileges, signal: libc::c_int) {
    if server > 1 && ProcessInfo::read(server).is_some_and(|p| p.uid == agent.uid) {
        // SAFETY: kill with plain integers.
        unsafe { libc::kill(server, signal) };
    }
}

fn status_file() -> PathBuf {
    Path::new(SESSION_DIR).join("status")
}

/// Prepares PID 1's folders for this start: the run folder and the shared one, root's; and,
/// where the session runs (`with_session`: not in the gateway), tmux's socket folder (the
/// agent's) and the session folder (root's), emptied of what a last run left.
pub fn prepare_run_dir(agent: &AgentPrivileges, with_session: bool) -> std::io::Result<()> {
    for dir in [RUN_DIR, SHARED_DIR] {
        std::fs::create_dir_all(dir)?;
        chown(dir, Some(0), Some(0))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    // From the gateway's last run: the agent's container waits for a new one.
    match std::fs::remove_file(GATEWAY_READY) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // The last run's ready mark (it names another PID 1, but names nothing is plainer).
    crate::ready::clear()?;
    if !with_session {
        return Ok(());
    }
    // Left over from before a container restart: the session is new.
    let _ = std::fs::remove_file(STOPPING);
    // tmux's socket directory is the agent's alone. The session directory is root's: PID 1
    // reads the status file in it, which the agent may write but not replace.
    for (dir, owner, mode) in [(TMUX_TMPDIR, agent.uid, 0o700), (SESSION_DIR, 0, 0o755)] {
        // The agent may have nested directories in it far deeper than a path or a recursive
        // removal reaches: tree::remove holds two descriptors whatever the depth.
        crate::tree::remove(Path::new(dir))?;
        std::fs::create_dir(dir)?;
        chown(dir, Some(owner), Some(if owner == 0 { 0 } else { agent.gid }))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    prepare_status_file(agent.gid)
}

/// Creates the (empty) status file: root's, in root's directory, writable by the agent's group.
pub fn prepare_status_file(gid: u32) -> std::io::Result<()> {
    let path = status_file();
    let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o620).open(&path)?;
    std::os::unix::fs::fchown(&file, Some(0), Some(gid))?;
    // The mode given at creation is masked by the umask.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o620))
}

/// The exit status the pane recorded, if it did. Read only from the file PID 1 created: not
/// through a link, not from a FIFO, and at most a few bytes.
pub fn recorded_status() -> Option<u8> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(status_file())
        .ok()?;
    let meta = file.metadata().ok()?;
    // Root's file; in sidecar mode's agent container, PID 1 is the agent and the file its own.
    // SAFETY: geteuid has no preconditions.
    if !meta.is_file() || (meta.uid() != 0 && meta.uid() != unsafe { libc::geteuid() }) {
        return None;
    }
    let mut text = String::new();
    file.take(16).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Writes the pane's status into the file PID 1 created (never creating one).
fn record_status(status: u8) {
    if let Ok(mut file) = std::fs::OpenOptions::new().write(true).truncate(true).open(status_file()) {
        let _ = writeln!(file, "{status}");
    }
}

/// Present while PID 1 stops the session: the pane then does not start its shell.
pub use crate::policy::layout::STOPPING;

/// Marks the session as stopping, so the pane does not start its shell after the agent command.
pub fn mark_stopping() {
    let _ = std::fs::write(STOPPING, b"");
}

static CHILD: AtomicI32 = AtomicI32::new(0);

/// SIGINT and SIGQUIT from the terminal reach the command already (same process group); the
/// pane only must not die of them. A handler, unlike SIG_IGN, is not inherited by the command.
extern "C" fn ignore(_: libc::c_int) {}

extern "C" fn forward_to_child(signal: libc::c_int) {
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(child, signal) };
    }
}

/// The pane: `$ASSISTANT_CMD`, then (unless the container is stopping) an interactive shell.
/// Runs as the agent inside tmux. Writes the exit status of the last command for PID 1.
pub fn pane() -> u8 {
    // PID 1 checked the setting before the session started.
    let (command, env) = agent_command(unattended().unwrap_or(false));
    // SAFETY: installing handlers that only call kill, or nothing.
    unsafe {
        libc::signal(libc::SIGTERM, forward_to_child as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward_to_child as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t);
        libc::signal(libc::SIGQUIT, ignore as *const () as libc::sighandler_t);
    }
    let mut status =
        run_in_pane(Command::new("bash").arg("-c").arg(&command).envs(env).env_remove(TMUX_EVENT_BACKEND.0));
    // A status from an earlier command of this session is not this one's.
    let _ = std::fs::OpenOptions::new().write(true).truncate(true).open(status_file());
    if !Path::new(STOPPING).exists() {
        println!(
            "\r\n[agent-sandbox] `{command}` exited with status {status}; this shell keeps the session (`exit` ends it)\r"
        );
        let shell = std::env::var_os("SHELL").unwrap_or_else(|| OsString::from("/bin/bash"));
        status = run_in_pane(Command::new(shell).env_remove(TMUX_EVENT_BACKEND.0));
    }
    record_status(status);
    status
}

fn run_in_pane(command: &mut Command) -> u8 {
    let Ok(child) = command.spawn() else { return 127 };
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    let mut wait_status = 0;
    loop {
        // SAFETY: waitpid on our own child with a pointer to a local.
        let pid = unsafe { libc::waitpid(child.id() as i32, &mut wait_status, 0) };
        if pid > 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    CHILD.store(0, Ordering::SeqCst);
    process::exit_code(wait_status)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unattended_mode_adds_the_images_arguments_and_variables() {
        use super::{compose_agent_command, parse_unattended};
        assert_eq!(parse_unattended(None), Ok(false));
        assert_eq!(parse_unattended(Some("1")), Ok(true));
        assert!(parse_unattended(Some("yes please")).unwrap_err().contains("SANDBOX_UNATTENDED=yes please"));
        let (command, env) = compose_agent_command(
            "gemini",
            true,
            " --yolo ",
            "GEMINI_CLI_TRUST_WORKSPACE=true;X={\"a\":\"b\"}",
        );
        assert_eq!(command, "gemini --yolo");
        assert_eq!(
            env,
            [("GEMINI_CLI_TRUST_WORKSPACE".into(), "true".into()), ("X".into(), "{\"a\":\"b\"}".into())]
        );
        assert_eq!(compose_agent_command("gemini", false, "--yolo", "A=b"), ("gemini".into(), vec![]));
    }

    /// tmux's middle process is waited for only where it is the server's parent, the agent's and
    /// PID 1's child; a server whose parent is anything else is refused as before.
    #[test]
    fn only_the_agents_daemonising_middle_process_is_waited_for() {
        use super::{ProcessInfo, daemonising};
        let info = |pid, ppid, uid| ProcessInfo { pid, ppid, pgrp: pid, session: pid, tpgid: -1, uid };
        let (ours, agent) = (1, 1000);
        let server = info(12, 11, agent);
        assert!(daemonising(&server, &info(11, ours, agent), ours, agent));
        // Not the server's parent, not ours, root's, or PID 1 itself.
        assert!(!daemonising(&server, &info(10, ours, agent), ours, agent));
        assert!(!daemonising(&server, &info(11, 7, agent), ours, agent));
        assert!(!daemonising(&server, &info(11, ours, 0), ours, agent));
        assert!(!daemonising(&info(12, ours, agent), &info(ours, 0, 0), ours, agent));
    }
}
