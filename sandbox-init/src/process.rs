//! Child processes of PID 1. As init, sandbox-init reaps every orphan with `waitpid(-1)`; that
//! would steal the exit status of a child std is waiting for (an `nft` run), so spawning and
//! reaping take turns under one lock. PID 1's own services (the checker, the forwarder) are
//! started again when they die.

use std::io::Write as _;
use std::os::fd::{AsRawFd, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::console;

static SPAWN_LOCK: Mutex<()> = Mutex::new(());

/// This binary, which PID 1 starts again in other roles (the session's pane, the probe, the
/// checker, the forwarder).
pub fn sandbox_init_exe() -> std::path::PathBuf {
    std::env::current_exe().unwrap_or_else(|_| "/usr/local/bin/sandbox-init".into())
}

/// Runs a command to completion, feeding it `stdin`, and collects its output.
pub fn output(command: &mut Command, stdin: Option<&[u8]>) -> std::io::Result<Output> {
    let _turn = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn()?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input)?;
    }
    child.wait_with_output()
}

/// Like [`output`], but a command that has not ended within `limit` is killed: for programs
/// that talk to something the agent controls (its tmux server), whose answer may never come.
/// For commands with little output (it is read once they end).
pub fn output_within(command: &mut Command, limit: Duration) -> std::io::Result<Output> {
    let _turn = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn()?;
    if !ended_within(&mut child, limit)? {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {} s", limit.as_secs()),
        ));
    }
    child.wait_with_output()
}

/// Whether `child` ends within `limit`: told by its pidfd (the kernel's notification, at once),
/// or, where pidfd_open is missing (an old gVisor), by asking every 5 ms.
fn ended_within(child: &mut std::process::Child, limit: Duration) -> std::io::Result<bool> {
    let deadline = Instant::now() + limit;
    match pidfd_wait(child.id() as libc::pid_t, limit) {
        Ok(false) => return Ok(false),
        // Readable is the kernel's word that it ended; a runtime whose pidfd says so early is
        // checked, and the loop below takes over.
        Ok(true) if child.try_wait()?.is_some() => return Ok(true),
        _ => {}
    }
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(true)
}

/// Whether the process `pid` (not necessarily a child) ends within `limit`, or is already gone:
/// told by its pidfd, or where pidfd_open is missing, by reading /proc every 5 ms (a zombie
/// has ended).
pub fn gone_within(pid: libc::pid_t, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    match pidfd_wait(pid, limit) {
        Ok(ended) => return ended,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return true,
        Err(_) => {}
    }
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        match state.as_deref().map(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z'))) {
            Err(_) | Ok(Some(true)) => return true,
            Ok(_) if Instant::now() > deadline => return false,
            Ok(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Waits for `pid` to end on its pidfd, `limit` at most: whether it ended. An error where no
/// pidfd could be opened (ESRCH: no such process; ENOSYS: a runtime without pidfd_open).
fn pidfd_wait(pid: libc::pid_t, limit: Duration) -> std::io::Result<bool> {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just opened and is owned here alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    crate::poll::ready_within(pidfd.as_raw_fd(), libc::POLLIN, limit)
}

/// Starts a command that the reaper, not the caller, will wait for. Returns its pid.
pub fn spawn(command: &mut Command) -> std::io::Result<i32> {
    let _turn = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let child = command.spawn()?;
    Ok(child.id() as i32)
}

/// Starts `command` with `fds` as its descriptors 3, 4, …, and returns its pid: how PID 1 hands
/// a service of its own (the name checker, the key forwarder) its listeners and sockets.
pub fn spawn_with_fds(command: &mut Command, fds: &[RawFd]) -> std::io::Result<i32> {
    // Copies above any descriptor the child's numbering uses, so that moving them into place
    // cannot overwrite one not yet moved. Not far above: past the 64 descriptors a process
    // starts with, the kernel grows the table, and in a process with threads that waits for an
    // RCU grace period (7 to 14 ms measured, at every start).
    let first_free = 3 + fds.len() as RawFd;
    let copies: Vec<OwnedFd> = fds
        .iter()
        .map(|&fd| {
            // SAFETY: fcntl duplicating a descriptor the caller owns; the copy is owned at once.
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, first_free) };
            if copy < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor, ours alone.
            Ok(unsafe { OwnedFd::from_raw_fd(copy) })
        })
        .collect::<std::io::Result<_>>()?;
    let raw: Vec<RawFd> = copies.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: only dup2 between fork and exec; dup2 clears close-on-exec on the target.
    unsafe {
        command.pre_exec(move || {
            for (i, fd) in raw.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    spawn(command)
}

/// A process of PID 1's own that PID 1 starts again when it dies (the name checker, the key
/// forwarder): its current pid, and how to start it.
pub trait Service: Send + Sync {
    fn pid(&self) -> i32;
    fn start(&self, program: &std::path::Path) -> Result<i32, String>;
}

/// How long PID 1 waits before it starts a service of its own (checker, forwarder) that died.
const SERVICE_RESTART: Duration = Duration::from_secs(1);

/// Starts `service` again, after a pause, if it is among the `reaped`; says so, and what waits
/// (its listeners stay open in PID 1) while it is down.
pub fn restart_if_reaped(
    service: Arc<dyn Service>,
    reaped: &[(i32, i32)],
    what: &'static str,
    meanwhile: &'static str,
) {
    let Some((pid, status)) = reaped.iter().find(|(pid, _)| *pid == service.pid()) else { return };
    console::err(format!(
        "sandbox-init: {what} (pid {pid}) ended with status {}; {meanwhile}",
        exit_code(*status)
    ));
    tokio::spawn(async move {
        tokio::time::sleep(SERVICE_RESTART).await;
        match service.start(&sandbox_init_exe()) {
            Ok(pid) => console::err(format!("sandbox-init: {what} runs again (pid {pid})")),
            Err(e) => console::err(format!("sandbox-init: cannot start {what} again: {e}; {meanwhile}")),
        }
    });
}

/// Waits for every child that has exited, returning each pid with its wait status.
pub fn reap() -> Vec<(i32, i32)> {
    let _turn = SPAWN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut reaped = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer to a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return reaped;
        }
        reaped.push((pid, status));
    }
}

/// The shell convention for a wait status: the exit code, or 128 + the signal.
pub fn exit_code(wait_status: i32) -> u8 {
    if libc::WIFEXITED(wait_status) {
        libc::WEXITSTATUS(wait_status) as u8
    } else if libc::WIFSIGNALED(wait_status) {
        128u8.wrapping_add(libc::WTERMSIG(wait_status) as u8)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    /// A process that ends is told at once, one that runs on is not, one already gone is.
    #[test]
    fn gone_within_tells_an_end_by_the_kernels_word() {
        let mut short = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let start = Instant::now();
        assert!(super::gone_within(short.id() as i32, Duration::from_secs(10)));
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        short.wait().unwrap();

        let mut long = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!super::gone_within(long.id() as i32, Duration::from_millis(100)));
        long.kill().unwrap();
        long.wait().unwrap();
        // Reaped: no such process.
        assert!(super::gone_within(long.id() as i32, Duration::from_millis(100)));
    }
}
