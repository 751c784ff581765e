//! This start's ready mark. PID 1 writes this start (the boot's id and PID 1's start time) to
//! `READY_MARK` once the sandbox is ready (the firewall holds, the session runs), and removes
//! the last one as it starts. sandbox-exec runs a command only while the mark names this start: after a
//! restart the container's network namespace is new and has no firewall until PID 1 loads it,
//! and the writable layer still holds the last run's mark, which names another start. So a
//! command run at once after a restart (`agent-sandbox exec`, whose wait a last run's `sandbox
//! ready` line in the log satisfies, or `docker exec C sandbox-exec`) waits for this run's mark
//! instead of reaching the network unfiltered.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::policy::layout::{READY_MARK, RUN_DIR};
use crate::poll::DirWatch;

/// A process's start time, in clock ticks since boot: /proc/PID/stat's 22nd field, read after
/// the command name (which may hold spaces and parentheses: the last `)` ends it).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // The fields after the name start at the 3rd (state): the 22nd is the 20th of these.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Process `pid`'s start time, read from its main thread's stat file: under qemu-user (an image
/// of another platform) a process reading its own /proc/PID/stat gets qemu's made-up fields, and
/// PID 1 would write a start time no other process reads; qemu leaves task/PID/stat alone.
fn start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).ok()?)
}

/// This start of the container: the kernel's boot id (a start time counts from the boot, and a
/// writable layer outlives a reboot) and PID 1's start time. PID 1's, not the writer's: under
/// `docker run --init` sandbox-init is tini's child, and tini is new at each start too.
fn this_start() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let boot = boot.trim();
    Some(format!("{} {}", if boot.is_empty() { "-" } else { boot }, start_time(1)?))
}

/// PID 1's mark: this start, renamed into place (a reader sees a whole mark or none), readable
/// by all.
pub fn mark() -> std::io::Result<()> {
    let start = this_start().ok_or_else(|| std::io::Error::other("cannot read /proc/1/stat"))?;
    let tmp = format!("{READY_MARK}.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{start}")?;
    file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, READY_MARK)
}

/// The last run's mark, removed as PID 1 starts.
pub fn clear() -> std::io::Result<()> {
    match std::fs::remove_file(READY_MARK) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The most a mark holds: a boot id and a number.
const MARK_MAX: u64 = 128;

/// The mark as it is: a regular file, not followed through a link, read without blocking (in
/// sidecar mode's agent container the run folder is the agent's, which could leave a FIFO or a
/// link to /dev/zero there), at most `MARK_MAX` bytes.
fn read_mark(path: &Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.file_type().is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(MARK_MAX).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Whether the mark names this start.
pub fn holds() -> bool {
    let mark = read_mark(Path::new(READY_MARK));
    mark.as_deref().map(str::trim).is_some_and(|m| Some(m.to_string()) == this_start())
}

/// Waits until the mark names this PID 1, woken by the mark's rename into the run folder, for
/// `limit` at most. Whether it does.
pub fn wait(limit: Duration) -> bool {
    if holds() {
        return true;
    }
    let deadline = Instant::now() + limit;
    let watch = DirWatch::new(Path::new(RUN_DIR)).ok();
    loop {
        if holds() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        // Without a watch (no run folder yet: PID 1 has not prepared it), a look every 100 ms.
        match &watch {
            Some(watch) => watch.wait(left.min(Duration::from_secs(1))),
            None => std::thread::sleep(left.min(Duration::from_millis(100))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_the_22nd_field_whatever_the_name_holds() {
        let stat = "1 (sandbox-init) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 1000 100";
        assert_eq!(parse_start_time(stat), Some(4242));
        let tricky = "7 (a) b) c 0 1) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 99 1000 100";
        assert_eq!(parse_start_time(tricky), Some(99));
        assert_eq!(parse_start_time("1 (x) S 0"), None);
        // This process's own: a number, the same read twice, as /proc/PID/stat gives it.
        let pid = std::process::id();
        let own = start_time(pid).expect("this process's start time");
        assert_eq!(start_time(pid), Some(own));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        assert_eq!(parse_start_time(&stat), Some(own));
        // This start: the boot's id and PID 1's start time, whichever process asks.
        let start = this_start().expect("this start");
        let (boot, pid1) = start.split_once(' ').expect("two words");
        assert!(boot == "-" || boot.len() == 36, "{start}");
        assert_eq!(pid1.parse::<u64>().ok(), start_time(1));
    }

    #[test]
    fn a_mark_is_a_regular_file_read_without_blocking_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("ready");
        std::fs::write(&mark, "b 42\n").unwrap();
        assert_eq!(read_mark(&mark).as_deref(), Some("b 42\n"));
        // What the agent could leave in its own run folder in sidecar mode: a link, a FIFO.
        std::fs::remove_file(&mark).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &mark).unwrap();
        assert_eq!(read_mark(&mark), None);
        std::fs::remove_file(&mark).unwrap();
        let path = std::ffi::CString::new(mark.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
        let started = Instant::now();
        assert_eq!(read_mark(&mark), None);
        assert!(started.elapsed() < Duration::from_secs(1), "a FIFO held the read");
        std::fs::remove_file(&mark).unwrap();
        std::fs::write(&mark, "x".repeat(1000)).unwrap();
        assert_eq!(read_mark(&mark).map(|m| m.len()), Some(MARK_MAX as usize));
    }
}
