//! Attaching to a sandbox's session: `sandbox-attach` run in the container with a terminal of its
//! own, this terminal in raw mode meanwhile, its size passed on at the start and on every change.

use std::io::{IsTerminal as _, Write as _};
use std::os::fd::AsFd as _;

use bollard::Docker;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::ResizeExecOptions;
use futures_util::StreamExt as _;
use rustix::termios::{OptionalActions, Termios, tcgetattr, tcgetwinsize, tcsetattr};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::exit::{Code, Failure, Result};

/// What the session sends the user's terminal, less what the agent could use against it. The
/// agent owns its tmux server, so it can turn tmux's own filtering off: OSC 52 (write, or read
/// back, the user's clipboard) and the device-control, application, privacy and start strings
/// (DCS, APC, PM, SOS: passthrough to the outer terminal, vendor commands) are dropped, across
/// chunk boundaries. Everything else (colours, cursor, titles) passes.
#[derive(Debug, Default)]
pub struct Sanitizer {
    state: State,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum State {
    #[default]
    Text,
    /// After ESC.
    Escape,
    /// In an OSC whose number is still being read.
    OscHead(Vec<u8>),
    OscPass,
    OscDrop,
    /// ESC inside an OSC (`pass`: whether it is being passed).
    OscEscape {
        pass: bool,
    },
    /// In a DCS, APC, PM or SOS string, dropped until ST.
    Drop,
    DropEscape,
}

impl Sanitizer {
    pub fn filter(&mut self, input: &[u8]) -> Vec<u8> {
        const ESC: u8 = 0x1b;
        const BEL: u8 = 0x07;
        let mut out = Vec::with_capacity(input.len());
        for &byte in input {
            self.state = match std::mem::take(&mut self.state) {
                State::Text if byte == ESC => State::Escape,
                State::Text => {
                    out.push(byte);
                    State::Text
                }
                State::Escape => match byte {
                    b']' => State::OscHead(Vec::new()),
                    b'P' | b'_' | b'^' | b'X' => State::Drop,
                    ESC => {
                        out.push(ESC);
                        State::Escape
                    }
                    _ => {
                        out.extend_from_slice(&[ESC, byte]);
                        State::Text
                    }
                },
                State::OscHead(mut head) => {
                    if byte.is_ascii_digit() && head.len() < 8 {
                        head.push(byte);
                        State::OscHead(head)
                    } else if head == b"52" {
                        // The clipboard: dropped whole, its terminator too.
                        match byte {
                            BEL => State::Text,
                            ESC => State::OscEscape { pass: false },
                            _ => State::OscDrop,
                        }
                    } else {
                        out.extend_from_slice(&[ESC, b']']);
                        out.extend_from_slice(&head);
                        out.push(byte);
                        match byte {
                            BEL => State::Text,
                            ESC => State::OscEscape { pass: true },
                            _ => State::OscPass,
                        }
                    }
                }
                State::OscPass => {
                    out.push(byte);
                    match byte {
                        BEL => State::Text,
                        ESC => State::OscEscape { pass: true },
                        _ => State::OscPass,
                    }
                }
                State::OscDrop => match byte {
                    BEL => State::Text,
                    ESC => State::OscEscape { pass: false },
                    _ => State::OscDrop,
                },
                State::OscEscape { pass } => {
                    if pass {
                        out.push(byte);
                    }
                    match (byte, pass) {
                        (b'\\', _) => State::Text,
                        (_, true) => State::OscPass,
                        (_, false) => State::OscDrop,
                    }
                }
                State::Drop => {
                    if byte == ESC {
                        State::DropEscape
                    } else {
                        State::Drop
                    }
                }
                State::DropEscape => match byte {
                    b'\\' => State::Text,
                    ESC => State::DropEscape,
                    _ => State::Drop,
                },
            };
        }
        out
    }
}

/// Puts the terminal back as it was, however attaching ends.
struct RawMode(Termios);

impl RawMode {
    fn enable() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw).ok()?;
        Some(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &self.0);
    }
}

async fn resize(docker: &Docker, exec: &str) {
    if let Ok(size) = tcgetwinsize(std::io::stdout().as_fd()) {
        let options = ResizeExecOptions { h: i32::from(size.ws_row), w: i32::from(size.ws_col) };
        let _ = docker.resize_exec(exec, options).await;
    }
}

/// Whether standard input and output are a terminal to attach.
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// Attaches this terminal to the sandbox's tmux session until it detaches (C-b d) or the session
/// ends; returns sandbox-attach's status.
pub async fn attach(docker: &Docker, id: &str) -> Result<i32> {
    if !interactive() {
        return Err(Failure::new(
            Code::BadArgument,
            "attaching needs a terminal: run this from one (or use `run --detach`, then `agent-sandbox attach` from a terminal)",
        ));
    }
    let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
    let config = ExecConfig {
        cmd: Some(vec!["sandbox-attach".into()]),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(true),
        env: Some(vec![format!("TERM={term}")]),
        ..Default::default()
    };
    let exec = docker.create_exec(id, config).await?.id;
    let options = StartExecOptions { detach: false, tty: true, output_capacity: None };
    let StartExecResults::Attached { mut output, mut input } =
        docker.start_exec(&exec, Some(options)).await?
    else {
        return Err(Failure::new(Code::Engine, "the engine did not attach to sandbox-attach"));
    };
    let raw = RawMode::enable();
    resize(docker, &exec).await;
    let keys = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buffer = [0u8; 4096];
        while let Ok(n) = stdin.read(&mut buffer).await {
            if n == 0 || input.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            let _ = input.flush().await;
        }
    });
    let window = {
        let docker = docker.clone();
        let exec = exec.clone();
        tokio::spawn(async move {
            let Ok(mut changes) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            while changes.recv().await.is_some() {
                resize(&docker, &exec).await;
            }
        })
    };
    let mut stdout = std::io::stdout();
    let mut sanitizer = Sanitizer::default();
    while let Some(Ok(chunk)) = output.next().await {
        let _ = stdout.write_all(&sanitizer.filter(&chunk.into_bytes()));
        let _ = stdout.flush();
    }
    drop(raw);
    keys.abort();
    window.abort();
    let code = docker.inspect_exec(&exec).await?.exit_code.unwrap_or(0);
    Ok(i32::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> Vec<u8> {
        let mut sanitizer = Sanitizer::default();
        chunks.iter().flat_map(|c| sanitizer.filter(c)).collect()
    }

    #[test]
    fn the_clipboard_and_passthrough_strings_are_dropped_and_the_rest_passes() {
        let text: &[u8] = b"\x1b[1;31mred\x1b[0m \x1b]0;title\x07 ok";
        assert_eq!(through(&[text]), text, "colours and titles pass");
        assert_eq!(through(&[b"a\x1b]52;c;SGVsbG8=\x07b"]), b"ab");
        assert_eq!(through(&[b"a\x1b]52;c;?\x1b\\b"]), b"ab", "the read-back query too");
        assert_eq!(through(&[b"a\x1bPtmux;\x1b\x1b]52;c;SGk=\x07\x1b\\b"]), b"ab", "tmux passthrough");
        assert_eq!(through(&[b"a\x1b_apc\x1b\\b\x1b^pm\x1b\\c\x1bXsos\x1b\\d"]), b"abcd");
        // Split anywhere, the same.
        let attack: &[u8] = b"x\x1b]52;c;SGVsbG8gZnJvbSB0aGUgYWdlbnQ=\x1b\\y\x1b]2;t\x1b\\z";
        for at in 0..attack.len() {
            assert_eq!(through(&[&attack[..at], &attack[at..]]), b"xy\x1b]2;t\x1b\\z", "split at {at}");
        }
    }
}
