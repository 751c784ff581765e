//! Waiting on one descriptor: poll(2) with a limit, for PID 1's waits that the kernel can end
//! (a child's pidfd, an inotify watch, a terminal that takes output again).

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
