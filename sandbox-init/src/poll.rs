//! Waiting on one descriptor: poll(2) with a limit, for PID 1's waits that the kernel can end
//! (a child's pidfd, an inotify watch, a terminal that takes output again); and `DirWatch`, the
//! inotify watch of a folder.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Whether `fd` has one of `events` (or an error) within `limit`: one poll(2), taken again for
/// what is left of `limit` when a signal interrupts it.
pub fn ready_within(fd: RawFd, events: libc::c_short, limit: Duration) -> std::io::Result<bool> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let millis = left.as_millis().min(i32::MAX as u128) as i32;
        let mut poll = libc::pollfd { fd, events, revents: 0 };
        // SAFETY: one pollfd, valid for the call.
        match unsafe { libc::poll(&mut poll, 1, millis) } {
            0 => return Ok(false),
            n if n > 0 => return Ok(true),
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return Err(std::io::Error::last_os_error()),
        }
    }
}

/// What lands in a folder, told by inotify: the gateway's ready file is renamed into place, and
/// the agent's container's PID 1 wakes then, not at its next look; PID 1's ready mark, and
/// sandbox-exec wakes. Under gVisor a volume's changes made outside the sandbox send no event:
/// there the wait is the look's period alone.
pub struct DirWatch(std::os::fd::OwnedFd);

impl DirWatch {
    pub fn new(dir: &std::path::Path) -> std::io::Result<DirWatch> {
        use std::os::fd::FromRawFd as _;
        use std::os::unix::ffi::OsStrExt as _;
        // SAFETY: inotify_init1 takes flags and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just opened and is owned here alone.
        let watch = DirWatch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        let mask = libc::IN_MOVED_TO | libc::IN_CLOSE_WRITE | libc::IN_CREATE;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        if unsafe { libc::inotify_add_watch(fd, path.as_ptr(), mask) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(watch)
    }

    /// Returns once something landed in the folder, or after `limit`; the events are drained.
    pub fn wait(&self, limit: Duration) {
        use std::os::fd::AsRawFd as _;
        // An error is a wake-up too: the caller looks again, and its own limit holds.
        let _ = ready_within(self.0.as_raw_fd(), libc::POLLIN, limit);
        let mut events = [0u8; 4096];
        // SAFETY: a buffer of that length; the descriptor does not block.
        while unsafe { libc::read(self.0.as_raw_fd(), events.as_mut_ptr().cast(), events.len()) } > 0 {}
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;

    use super::*;

    #[test]
    fn a_descriptor_is_ready_once_it_has_something_and_not_before() {
        let (reader, writer) = std::io::pipe().unwrap();
        assert!(!ready_within(reader.as_raw_fd(), libc::POLLIN, Duration::from_millis(20)).unwrap());
        (&writer).write_all(b"x").unwrap();
        assert!(ready_within(reader.as_raw_fd(), libc::POLLIN, Duration::from_secs(30)).unwrap());
        assert!(ready_within(writer.as_raw_fd(), libc::POLLOUT, Duration::ZERO).unwrap());
    }
}
