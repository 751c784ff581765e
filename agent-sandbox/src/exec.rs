//! `agent-sandbox exec`: a command run as the agent, beside the session rather than in it:
//! `sandbox-exec -- CMD…` in the agent's container (the one container, or sidecar mode's and
//! gVisor's agent container), so as uid 1000 with no capability, in /workspace, with the
//! session's environment, once the sandbox's firewall holds. What it prints is the sandbox's and
//! may be the agent's: on a terminal it goes through the `Sanitizer` as `attach`'s output does;
//! into a pipe or a file it passes as it came, which is what scripts need.

use std::io::{IsTerminal as _, Write};

use futures_util::StreamExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use sandbox_policy::terminal::Sanitizer;

use crate::engine::Engine;
use crate::exit::{Code, Failure, Result};
use crate::flags::ExecFlags;
use crate::terminal::{OUTPUT_LOST, Stops};

pub async fn run(flags: &ExecFlags) -> Result<i32> {
    if flags.tty && !std::io::stdout().is_terminal() {
        return Err(Failure::new(
            Code::BadArgument,
            "--tty gives the command a terminal, and this output is not one: leave out -t to pipe its output",
        ));
    }
    if flags.tty && flags.interactive && !std::io::stdin().is_terminal() {
        return Err(Failure::new(
            Code::BadArgument,
            "-it passes the keys of a terminal, and this input is not one: use -i alone to pass a pipe or a file",
        ));
    }
    let sandbox = Engine::connect().await?.find(&flags.which.sandbox).await?;
    sandbox.ensure_running()?;
    // A sandbox still starting has no firewall yet: the command waits for it, as the agent does.
    crate::run::wait_ready(&sandbox).await?;
    let cmd: Vec<String> =
        ["sandbox-exec", "--"].iter().map(|s| s.to_string()).chain(flags.command.clone()).collect();
    let env = if flags.tty { vec![crate::terminal::term()] } else { Vec::new() };
    let mut attached = sandbox.attached(&cmd, env, flags.interactive, flags.tty).await?;
    let mut stops = Stops::catch();
    let ended = if flags.tty {
        crate::terminal::relay(&mut attached, flags.interactive).await
    } else {
        let input = std::mem::replace(&mut attached.input, Box::pin(tokio::io::sink()));
        let feeding = flags.interactive.then(|| tokio::spawn(feed(input)));
        let mut stdout = Screen::new(std::io::stdout());
        let mut stderr = Screen::new(std::io::stderr());
        let mut ended = None;
        loop {
            let chunk = tokio::select! {
                chunk = attached.output.next() => chunk,
                code = stops.next() => {
                    ended = Some(code);
                    break;
                }
            };
            let shown = match chunk {
                None => break,
                Some(Err(e)) => {
                    stdout.finish();
                    stderr.finish();
                    return Err(Failure::new(Code::Engine, format!("the command's output broke off: {e}")));
                }
                Some(Ok(bollard::container::LogOutput::StdErr { message })) => stderr.write(&message),
                Some(Ok(bollard::container::LogOutput::StdIn { .. })) => Ok(()),
                Some(Ok(other)) => stdout.write(&other.into_bytes()),
            };
            if let Err(e) = shown {
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    crate::say::line(&format!("agent-sandbox: cannot write the command's output: {e}"));
                }
                ended = Some(OUTPUT_LOST);
                break;
            }
        }
        stdout.finish();
        stderr.finish();
        if let Some(feeding) = feeding {
            feeding.abort();
        }
        ended
    };
    if let Some(code) = ended {
        return Ok(code);
    }
    // A command that closed its output may run on; a signal still ends the wait.
    tokio::select! {
        code = attached.exit_code() => Ok(i32::try_from(code?).unwrap_or(1)),
        code = stops.next() => Ok(code),
    }
}

/// This process's standard input to the command, then its end (the command reads end of file).
async fn feed(mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(n) = stdin.read(&mut buffer).await {
        if n == 0 || input.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = input.shutdown().await;
}

/// One of this process's outputs: filtered when it is a terminal, else as it came.
struct Screen<W: Write> {
    out: W,
    sanitizer: Option<Sanitizer>,
}

impl<W: Write + std::io::IsTerminal> Screen<W> {
    fn new(out: W) -> Screen<W> {
        let sanitizer = out.is_terminal().then(Sanitizer::default);
        Screen { out, sanitizer }
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.sanitizer {
            Some(sanitizer) => self.out.write_all(&sanitizer.filter(bytes))?,
            None => self.out.write_all(bytes)?,
        }
        self.out.flush()
    }

    /// What the command left open or switched on ends with it, on a terminal.
    fn finish(&mut self) {
        if let Some(sanitizer) = &mut self.sanitizer {
            let _ = self.out.write_all(&sanitizer.finish());
            let _ = self.out.write_all(sandbox_policy::terminal::END);
            let _ = self.out.flush();
        }
    }
}
