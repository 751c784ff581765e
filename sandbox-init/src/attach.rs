//! `sandbox-attach`: the user's terminal attached to the agent's session through a filter the
//! agent cannot reach. The agent owns its tmux server and can turn tmux's own filtering off
//! (`allow-passthrough`, `set-clipboard`), so the tmux client runs as the agent on a terminal of
//! its own (a pty whose master this root process holds), and what it draws reaches the user's
//! terminal only through `sandbox_policy::terminal::Sanitizer`: no clipboard write, no
//! passthrough string. Keys go the other way unchanged, and the window size follows the user's.
//!
//! Three threads relay: keys (the user's terminal to the master), screen (the master, filtered,
//! to the user's terminal) and window (SIGWINCH, taken with sigwait, to the master's size); the
//! main thread waits for the client. The relay ends with the client, or with the screen (the
//! user's terminal gone, or the client's terminal closed while the client lives on as something
//! else of the agent's: it is then killed), so no root relay outlives its use; whatever the agent
//! still holds of its terminal is cut when the master closes. At the end the filter closes what
//! the agent left open, and the modes that would break the user's terminal are turned off.

use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use rustix::pty::{OpenptFlags, grantpt, ioctl_tiocgptpeer, openpt, ptsname, unlockpt};
use rustix::termios::{isatty, tcgetwinsize, tcsetwinsize};
use sandbox_policy::terminal::{self, RawMode, Sanitizer};

/// How long the screen may still drain once the client has ended, and the client may take to
/// end once the screen has.
const DRAIN: Duration = Duration::from_millis(500);
/// How often the relay looks at the client while the screen runs.
const POLL: Duration = Duration::from_millis(50);

/// A new pty: the master, and the terminal for the client (opened from the master, not by path).
fn pty() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let client = match ioctl_tiocgptpeer(&master, flags) {
        Ok(fd) => fd,
        Err(_) => {
            let path = ptsname(&master, Vec::new())?;
            let oflags = rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC;
            rustix::fs::open(path.as_c_str(), oflags, rustix::fs::Mode::empty())?
        }
    };
    Ok((master, client))
}

/// The user's window size onto the pty (the client's foreground group gets SIGWINCH from it).
fn follow_size(master: &OwnedFd) {
    for fd in [std::io::stdin().as_fd(), std::io::stdout().as_fd()] {
        if isatty(fd)
            && let Ok(size) = tcgetwinsize(fd)
        {
            let _ = tcsetwinsize(master, size);
            return;
        }
    }
}

/// SIGWINCH blocked in this thread and every thread it starts after, so that only sigwait takes it.
fn block_window_changes() -> libc::sigset_t {
    // SAFETY: sigset operations on a local, zeroed set; pthread_sigmask on this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGWINCH);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Runs `tmux attach-session -t SESSION` as the agent on a pty of its own, relaying through the
/// filter; returns the client's status.
pub fn attach(mut command: std::process::Command, tool: &str) -> u8 {
    // In sidecar mode's agent container the relay runs as the agent's own uid (no root there):
    // not dumpable, it cannot be traced, nor its memory or descriptors (the pty's master) read,
    // by the agent's processes, which would then write past the filter. Root's relay is out of
    // their reach anyway. Its children (the tmux client) are dumpable again after exec.
    // SAFETY: geteuid, and prctl with integers.
    if unsafe { libc::geteuid() } != 0 && unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == -1 {
        eprintln!("{tool}: cannot keep the session's relay from being traced");
        return 126;
    }
    let (master, client) = match pty() {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("{tool}: cannot open a terminal for the session: {e}");
            return 126;
        }
    };
    follow_size(&master);
    let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
    let (Ok(input), Ok(output), Ok(errors)) = (stdio(&client), stdio(&client), stdio(&client)) else {
        eprintln!("{tool}: cannot pass the session's terminal on");
        return 126;
    };
    command.stdin(input).stdout(output).stderr(errors);
    let window_changes = block_window_changes();
    // SAFETY: between fork and exec, after the privileges are dropped (the closure registered
    // first): raw syscalls on integers and the set built above. The pty becomes the client's
    // controlling terminal, in a session of its own, so that resizing it signals the client;
    // and SIGWINCH, blocked here for sigwait, is unblocked for it (the mask is inherited).
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() == -1
                || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1
                || libc::sigprocmask(libc::SIG_UNBLOCK, &window_changes, std::ptr::null_mut()) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("{tool}: cannot run tmux: {e}");
            return if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
        }
    };
    // The parent keeps no end of the client's terminal, so the screen sees EIO when it closes.
    drop(command);
    drop(client);
    let raw = RawMode::enable();

    let (Ok(keys_to), Ok(screen_from), Ok(window_of)) =
        (master.try_clone(), master.try_clone(), master.try_clone())
    else {
        let _ = child.kill();
        eprintln!("{tool}: cannot relay the session's terminal");
        return 126;
    };
    std::thread::spawn(move || {
        let mut to = std::fs::File::from(keys_to);
        let mut buffer = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        while let Ok(n) = stdin.read(&mut buffer) {
            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
    });
    let sanitizer = Arc::new(Mutex::new(Sanitizer::default()));
    let (drained, screen_done) = mpsc::channel::<()>();
    let screen_filter = Arc::clone(&sanitizer);
    std::thread::spawn(move || {
        let mut from = std::fs::File::from(screen_from);
        let mut buffer = [0u8; 16384];
        // EIO once no one holds the client's terminal any more.
        while let Ok(n) = from.read(&mut buffer) {
            let mut sanitizer = screen_filter.lock().unwrap_or_else(|e| e.into_inner());
            if n == 0 || write_out(&sanitizer.filter(&buffer[..n])).is_err() {
                break;
            }
        }
        let _ = drained.send(());
    });
    std::thread::spawn(move || {
        loop {
            let mut signal = 0;
            // SAFETY: sigwait on a set built above, into a local.
            if unsafe { libc::sigwait(&window_changes, &mut signal) } != 0 {
                return;
            }
            follow_size(&window_of);
        }
    });

    // The relay ends with the client, or when the screen does (the user's terminal gone, or the
    // agent's client no longer drawing while something of the agent's keeps it alive): the
    // client is then given a moment and killed, so that no root relay outlives its use.
    let mut screen_ended = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        if screen_done.recv_timeout(POLL) != Err(mpsc::RecvTimeoutError::Timeout) {
            screen_ended = true;
            let deadline = std::time::Instant::now() + DRAIN;
            while std::time::Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(POLL);
            }
            let _ = child.kill();
            break child.wait();
        }
    };
    if !screen_ended {
        let _ = screen_done.recv_timeout(DRAIN);
    }
    // Whatever the agent left half-written is closed, and the modes that break the user's
    // terminal are turned off, whatever set them (terminal::END).
    let clean = status.as_ref().is_ok_and(|s| s.code().is_some()) && !screen_ended;
    let mut sanitizer = sanitizer.lock().unwrap_or_else(|e| e.into_inner());
    let mut end = sanitizer.finish();
    end.extend_from_slice(terminal::END);
    if !clean {
        end.extend_from_slice(terminal::END_AFTER_A_CRASH);
    }
    let _ = write_out(&end);
    drop(raw);
    match status {
        Ok(status) => status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1),
        Err(e) => {
            eprintln!("{tool}: lost the session's client: {e}");
            1
        }
    }
}

fn write_out(bytes: &[u8]) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()
}
