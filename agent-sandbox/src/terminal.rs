//! Attaching to a sandbox's session: `sandbox-attach` run in the container with a terminal of its
//! own, this terminal in raw mode meanwhile, its size passed on at the start and on every change.
//! The output goes through sandbox-policy's `Sanitizer` here too: sandbox-attach filters it
//! inside the container, and this second pass keeps images older than that filter safe.

use std::io::{IsTerminal as _, Write as _};
use std::os::fd::AsFd as _;

use futures_util::StreamExt as _;
use rustix::termios::tcgetwinsize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use sandbox_policy::terminal::{RawMode, Sanitizer};

use crate::engine::{Resizer, Sandbox, Terminal};
use crate::exit::{Code, Failure, Result};

async fn resize(resizer: &Resizer) {
    if let Ok(size) = tcgetwinsize(std::io::stdout().as_fd()) {
        resizer.resize(size.ws_row, size.ws_col).await;
    }
}

/// Whether standard input and output are a terminal to attach.
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// Attaches this terminal to the sandbox's tmux session until it detaches (C-b d) or the session
/// ends; returns sandbox-attach's status.
pub async fn attach(sandbox: &Sandbox) -> Result<i32> {
    if !interactive() {
        return Err(Failure::new(
            Code::BadArgument,
            "attaching needs a terminal: run this from one (or use `run --detach`, then `agent-sandbox attach` from a terminal)",
        ));
    }
    let mut terminal = sandbox.terminal("sandbox-attach", vec![term()]).await?;
    if let Some(code) = relay(&mut terminal, true).await {
        return Ok(code);
    }
    let code = terminal.status().await?;
    Ok(i32::try_from(code).unwrap_or(1))
}

/// The status when a command's output could not be written: 141 (128 + SIGPIPE) as a shell
/// reports a writer whose reader went away (`exec S -- git log | head -1`); the command is left
/// to end as docker's would, on its next write.
pub const OUTPUT_LOST: i32 = 141;

/// SIGINT, SIGTERM and SIGHUP, caught so that what the command's output switched on in this
/// terminal is switched off before the launcher exits (128 + the signal's number, as a shell
/// reports a process it ended).
pub struct Stops {
    signals: Vec<(i32, tokio::signal::unix::Signal)>,
}

impl Stops {
    pub fn catch() -> Stops {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [(2, SignalKind::interrupt()), (15, SignalKind::terminate()), (1, SignalKind::hangup())];
        Stops { signals: kinds.into_iter().filter_map(|(n, kind)| Some((n, signal(kind).ok()?))).collect() }
    }

    /// The status to exit with, once one of them arrives.
    pub async fn next(&mut self) -> i32 {
        if self.signals.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.signals.iter_mut().map(|(n, s)| {
            let n = *n;
            Box::pin(async move {
                s.recv().await;
                128 + n
            })
        });
        futures_util::future::select_all(waits).await.0
    }
}

/// `TERM=` this terminal's type, for a command given a terminal of its own.
pub fn term() -> String {
    format!("TERM={}", std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into()))
}

/// This terminal on `terminal`'s until its output ends: its size passed on at the start and on
/// every change, the keys typed passed on (in raw mode) when `keys`, and its output through the
/// `Sanitizer`, then `END`. Ends early, with the status to exit with, on a signal ([`Stops`]) or
/// when this terminal cannot be written.
pub async fn relay(terminal: &mut Terminal, keys: bool) -> Option<i32> {
    let mut stops = Stops::catch();
    let mut input = std::mem::replace(&mut terminal.input, Box::pin(tokio::io::sink()));
    let raw = if keys { RawMode::enable() } else { None };
    let resizer = terminal.resizer();
    resize(&resizer).await;
    let keys = keys.then(|| {
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stdin.read(&mut buffer).await {
                if n == 0 || input.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
                let _ = input.flush().await;
            }
        })
    });
    let window = {
        tokio::spawn(async move {
            let Ok(mut changes) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while changes.recv().await.is_some() {
                resize(&resizer).await;
            }
        })
    };
    let mut stdout = std::io::stdout();
    let mut sanitizer = Sanitizer::default();
    let mut ended = None;
    loop {
        let chunk = tokio::select! {
            chunk = terminal.output.next() => chunk,
            code = stops.next() => {
                ended = Some(code);
                break;
            }
        };
        let Some(Ok(chunk)) = chunk else { break };
        let shown = stdout.write_all(&sanitizer.filter(&chunk.into_bytes())).and_then(|()| stdout.flush());
        if shown.is_err() {
            ended = Some(OUTPUT_LOST);
            break;
        }
    }
    // What the agent left open or switched on ends with the session here too: the sandbox's
    // own relay may have been killed before it could say so (its PID 1 gone).
    let _ = stdout.write_all(&sanitizer.finish());
    let _ = stdout.write_all(sandbox_policy::terminal::END);
    let _ = stdout.flush();
    drop(raw);
    if let Some(keys) = keys {
        keys.abort();
    }
    window.abort();
    ended
}
