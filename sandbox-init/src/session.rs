//! The agent's tmux session: started as the agent in /workspace, its pane running
//! `$ASSISTANT_CMD` and then a shell (so the session outlives the agent command), attached to the
//! container's terminal when there is one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::privileges::AgentPrivileges;
use crate::process;

/// Everything sandbox-init keeps at run time.
pub const RUN_DIR: &str = "/run/agent-sandbox";
/// tmux's socket directory (TMUX_TMPDIR), owned by the agent; the image sets the same variable
/// so a plain `tmux attach` as the agent finds the session too.
pub const TMUX_TMPDIR: &str = "/run/agent-sandbox/tmux";
/// Where the pane writes the exit status of its last command, for PID 1 to exit with.
pub const SESSION_DIR: &str = "/run/agent-sandbox/session";
pub const WORKSPACE: &str = "/workspace";

pub fn session_name() -> String {
    std::env::var("TMUX_SESSION").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "agent".into())
}

pub fn assistant_cmd() -> String {
    std::env::var("ASSISTANT_CMD").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "bash".into())
}

fn tmux(agent: &AgentPrivileges) -> std::io::Result<Command> {
    let mut command = agent.command("tmux").map_err(std::io::Error::other)?;
    command.env("TMUX_TMPDIR", TMUX_TMPDIR);
    Ok(command)
}

/// Starts the session detached and returns the tmux server's pid.
pub fn start(agent: &AgentPrivileges, sandbox_init: &Path) -> Result<i32, String> {
    let name = session_name();
    let workspace = if Path::new(WORKSPACE).is_dir() { PathBuf::from(WORKSPACE) } else { agent.home.clone() };
    let mut command = tmux(agent).map_err(|e| e.to_string())?;
    command
        .args(["new-session", "-d", "-s", &name, "-x", "200", "-y", "50", "-c"])
        .arg(&workspace)
        .arg(sandbox_init)
        .arg("pane")
        .current_dir(&workspace);
    let output = process::output(&mut command, None).map_err(|e| format!("cannot run tmux: {e}"))?;
    if !output.status.success() {
        return Err(format!("tmux new-session failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let mut command = tmux(agent).map_err(|e| e.to_string())?;
    command.args(["display-message", "-p", "-t", &name, "#{pid}"]);
    let output = process::output(&mut command, None).map_err(|e| format!("cannot run tmux: {e}"))?;
    String::from_utf8_lossy(&output.stdout).trim().parse().map_err(|_| {
        format!("cannot find the tmux server: {}", String::from_utf8_lossy(&output.stderr).trim())
    })
}

/// Attaches a tmux client to the container's terminal. Returns the client's pid.
pub fn attach_terminal(agent: &AgentPrivileges) -> Result<i32, String> {
    // The agent must be able to use the terminal it is handed.
    // SAFETY: fchown on fd 0 with plain integers.
    unsafe { libc::fchown(0, agent.uid, agent.gid) };
    let mut command = tmux(agent).map_err(|e| e.to_string())?;
    command.args(["attach-session", "-t", &session_name()]);
    process::spawn(&mut command).map_err(|e| format!("cannot attach to the session: {e}"))
}

/// The pids of the processes in the foreground of each pane: where SIGTERM and SIGINT go.
pub fn pane_process_groups(agent: &AgentPrivileges) -> Vec<i32> {
    let Ok(mut command) = tmux(agent) else { return Vec::new() };
    command.args(["list-panes", "-a", "-F", "#{pane_pid}"]);
    let Ok(output) = process::output(&mut command, None) else { return Vec::new() };
    let mut groups = Vec::new();
    for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        let Ok(pid) = pid.parse::<i32>() else { continue };
        groups.push(pid);
        // Field 8 of /proc/PID/stat: the terminal's foreground process group.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if let Some(Ok(tpgid)) = after_comm.split_whitespace().nth(5).map(str::parse::<i32>)
            && tpgid > 0
            && tpgid != pid
        {
            groups.push(tpgid);
        }
    }
    groups
}

pub fn kill_server(agent: &AgentPrivileges) {
    if let Ok(mut command) = tmux(agent) {
        command.arg("kill-server");
        let _ = process::output(&mut command, None);
    }
}

fn status_file() -> PathBuf {
    Path::new(SESSION_DIR).join("status")
}

/// The exit status the pane recorded, if it did.
pub fn recorded_status() -> Option<u8> {
    std::fs::read_to_string(status_file()).ok()?.trim().parse().ok()
}

/// Present while PID 1 stops the session: the pane then does not start its shell.
pub const STOPPING: &str = "/run/agent-sandbox/stopping";

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
    let command = assistant_cmd();
    // SAFETY: installing handlers that only call kill, or nothing.
    unsafe {
        libc::signal(libc::SIGTERM, forward_to_child as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward_to_child as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t);
        libc::signal(libc::SIGQUIT, ignore as *const () as libc::sighandler_t);
    }
    let mut status = run_in_pane(Command::new("bash").arg("-c").arg(&command));
    let _ = std::fs::remove_file(status_file());
    if !Path::new(STOPPING).exists() {
        println!(
            "\r\n[agent-sandbox] `{command}` exited with status {status}; this shell keeps the session (`exit` ends it)\r"
        );
        let shell = std::env::var_os("SHELL").unwrap_or_else(|| OsString::from("/bin/bash"));
        status = run_in_pane(&mut Command::new(shell));
    }
    let _ = std::fs::write(status_file(), format!("{status}\n"));
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
