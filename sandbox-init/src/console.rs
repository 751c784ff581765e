//! PID 1's console. With a terminal (`docker run -t`), the agent's tmux client shares it: the
//! agent can stop its output (`tcflow(TCOOFF)`) or leave it non-blocking. A write of PID 1's
//! would then block, holding a lock the DNS gate needs or the loop that applies reloads, or fail
//! with EAGAIN, which `println!` turns into a panic. So what PID 1 says goes through a queue
//! to one writer thread: a stopped terminal delays the lines and, once the queue is full, loses
//! them (counted, and said when the terminal moves again); it never stops PID 1.
//!
//! Before [`start`] (and in the command-line tools) lines are written at once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Stream {
    Out = 1,
    Err = 2,
}

/// Lines that may wait for a stopped terminal; past them, lines are lost.
const QUEUE_LINES: usize = 4096;

static QUEUE: OnceLock<SyncSender<(Stream, String)>> = OnceLock::new();
/// Lines queued and not yet written.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// Lines lost to a full queue since the writer last said so.
static LOST: AtomicU64 = AtomicU64::new(0);

/// Starts the writer thread; from here on no line blocks its caller.
pub fn start() {
    let (sender, receiver) = sync_channel::<(Stream, String)>(QUEUE_LINES);
    if QUEUE.set(sender).is_err() {
        return;
    }
    // Without the thread the receiver is gone, and lines are written at once.
    let _ = std::thread::Builder::new().name("console".into()).spawn(move || {
        for (stream, line) in receiver {
            let lost = LOST.swap(0, Ordering::Relaxed);
            if lost > 0 {
                let note = format!("sandbox-init: {lost} lines were lost while the console was blocked\n");
                write_all(Stream::Err, note.as_bytes());
            }
            write_all(stream, line.as_bytes());
            PENDING.fetch_sub(1, Ordering::Release);
        }
    });
}

/// A line on standard output (the `sandbox ready` and `sandbox reloaded` lines).
pub fn out(line: impl Into<String>) {
    send(Stream::Out, line.into());
}

/// A line on standard error (warnings, the denial log's copy).
pub fn err(line: impl Into<String>) {
    send(Stream::Err, line.into());
}

fn send(stream: Stream, line: String) {
    // Lines quote what the agent chose (names, reasons): no control of theirs reaches the
    // terminal or `docker logs`.
    let mut line = match crate::policy::text::escaped(&line) {
        std::borrow::Cow::Borrowed(_) => line,
        std::borrow::Cow::Owned(escaped) => escaped,
    };
    if !line.ends_with('\n') {
        line.push('\n');
    }
    let Some(queue) = QUEUE.get() else {
        write_all(stream, line.as_bytes());
        return;
    };
    PENDING.fetch_add(1, Ordering::Acquire);
    match queue.try_send((stream, line)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            PENDING.fetch_sub(1, Ordering::Release);
            LOST.fetch_add(1, Ordering::Relaxed);
        }
        Err(TrySendError::Disconnected((stream, line))) => {
            PENDING.fetch_sub(1, Ordering::Release);
            write_all(stream, line.as_bytes());
        }
    }
}

/// Waits, at most `limit`, for the queued lines to be written: before PID 1 exits, so its last
/// words (why it refused, how the session ended) are not lost to a terminal that is merely slow.
pub fn flush(limit: Duration) {
    let deadline = Instant::now() + limit;
    while PENDING.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes all of `bytes`, waiting while the descriptor is non-blocking and full; any other error
/// loses the rest (a closed console is not PID 1's problem).
fn write_all(stream: Stream, mut bytes: &[u8]) {
    let fd = stream as i32;
    while !bytes.is_empty() {
        // SAFETY: write from a live slice to a descriptor number; no memory is handed over.
        let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if written > 0 {
            bytes = &bytes[written as usize..];
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN) => {
                let _ = crate::poll::ready_within(fd, libc::POLLOUT, std::time::Duration::from_secs(1));
            }
            _ => return,
        }
    }
}
