//! This start's ready mark. PID 1 writes its own start time to `READY_MARK` once the sandbox is
//! ready (the firewall holds, the session runs), and removes the last one as it starts.
//! sandbox-exec runs a command only while the mark names the PID 1 that runs now: after a
//! restart the container's network namespace is new and has no firewall until PID 1 loads it,
//! and the writable layer still holds the last run's mark, which names another PID 1. So a
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

fn start_time(pid: &str) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")).ok()?)
}

/// PID 1's mark: this process's start time, renamed into place (a reader sees a whole mark or
/// none), readable by all.
pub fn mark() -> std::io::Result<()> {
    let time = start_time("self").ok_or_else(|| std::io::Error::other("cannot read /proc/self/stat"))?;
    let tmp = format!("{READY_MARK}.tmp");
    let mut file = std::fs::File::create(&tmp)?;
    writeln!(file, "{time}")?;
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

/// Whether the mark names the PID 1 that runs now.
pub fn holds() -> bool {
    let mark = std::fs::read_to_string(READY_MARK).ok().and_then(|t| t.trim().parse::<u64>().ok());
    mark.is_some() && mark == start_time("1")
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
        // This process's own, as PID 1 writes it: a number, the same read twice.
        let own = start_time("self").expect("this process's start time");
        assert_eq!(start_time("self"), Some(own));
    }
}
