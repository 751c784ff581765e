//! sandbox-init: the entrypoint of every agent-sandbox image, and a multi-call binary
//! (`sandbox-exec`, `sandbox-attach`, `sandbox-status` are symlinks to it).

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use sandbox_init::exit::{self, Refusal};
use sandbox_init::policy::{BAKED_POLICY, DROP_IN_DIR, Policy, PolicyError};
use sandbox_init::privileges::{AGENT_USER, AgentPrivileges};
use sandbox_init::session::{self, TMUX_TMPDIR, WORKSPACE};
use sandbox_init::{console, init, status};

fn help() -> String {
    format!(
        "\
sandbox-init {version}: the entrypoint of agent-sandbox images

Usage:
  sandbox-init                 as the container's entrypoint: load the policy, program the
                               firewall, start the DNS gate, verify, then run $ASSISTANT_CMD
                               as `agent` in tmux session $TMUX_SESSION and stay as init
  sandbox-init check [FILE…]   validate policy files offline (.yaml, .yml, or .txt lists);
                               without FILE, the container's own policy and drop-ins
  sandbox-exec [--] CMD [ARG…] run CMD as the agent, without capabilities (docker exec C …),
                               once this start's PID 1 has said `sandbox ready`
  sandbox-attach [SESSION]     attach to the agent's tmux session (docker exec -it C …)
  sandbox-init hold            sidecar mode's network holder: do nothing until SIGTERM or
                               SIGINT, owning the network namespace the gateway and the
                               agent's container join
  sandbox-status [--json]      the policy in force, allowed addresses, recent denials and
                               connections, connections and bytes per name
  sandbox-status --health      the image's HEALTHCHECK: healthy (0) while the firewall holds
  sandbox-init status-line     the session's tmux status line: how many names were refused
                               for not being allowlisted, and the newest

Policy: {BAKED_POLICY}, merged with {DROP_IN_DIR}/*.yaml and *.txt.
Signals to PID 1: SIGHUP reloads the policy; SIGTERM and SIGINT go to the session.

Environment:
  SANDBOX_FIREWALL=on|off|open  off and open run WITHOUT the egress firewall (warned)
  SANDBOX_MAX_ADDRESSES=N       the most (address, port) entries the gate opens
                                (default 65536); past it, a new name is refused
  SANDBOX_NAME_CHECK=on|off     off lets TCP to an allowed address through whatever name the
                                client sends (for measurements; warned)
  SANDBOX_UNATTENDED=1|0        1 starts the agent command with the image's
                                SANDBOX_UNATTENDED_ARGS and _ENV: it acts without asking
  ASSISTANT_CMD                 the agent command (set by each image)
  TMUX_SESSION                  the session name (default: agent)
  SANDBOX_EXEC_WAIT=S           how long sandbox-exec waits for `sandbox ready` (at most and
                                by default 60 s)

Exit codes of sandbox-init (the agent is not started on any of 64-78):
{table}
sandbox-exec exits with the command's status, 126 if it cannot drop privileges or run it, or
the sandbox did not become ready within its wait.
",
        version = env!("CARGO_PKG_VERSION"),
        table = exit::table()
    )
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().collect();
    let mut invoked = tool_name(&args[0]);
    let mut rest: Vec<String> = args.split_off(1);
    // `docker run IMAGE sandbox-status` hands the tool's name to the entrypoint as an argument.
    if invoked == "sandbox-init" && rest.first().is_some_and(|a| a.starts_with("sandbox-")) {
        invoked = tool_name(&rest.remove(0));
    }
    let command = match invoked.as_str() {
        "sandbox-exec" => "exec".to_string(),
        "sandbox-attach" => "attach".to_string(),
        "sandbox-status" => "status".to_string(),
        _ if rest.is_empty() => "init".to_string(),
        _ => rest.remove(0),
    };
    let code = match command.as_str() {
        "init" => run_init(),
        "check" => check(&rest),
        "exec" => exec(&rest),
        "attach" => attach(&rest),
        "status" if rest == ["--health"] => health(),
        "status" => status::show(&rest),
        "status-line" => sandbox_init::statusline::show(),
        "pane" => session::pane(),
        "probe" => sandbox_init::verify::probe(rest.first().map_or("", String::as_str)),
        "probe-checked" => sandbox_init::verify::probe_checked(rest.first().map_or("", String::as_str)),
        "hold" => hold(),
        "checker" => sandbox_init::net::namecheck::checker::run(),
        "forwarder" => sandbox_init::net::forwarder::run(),
        "--version" | "-V" | "version" => {
            println!("sandbox-init {}", env!("CARGO_PKG_VERSION"));
            0
        }
        "--help" | "-h" | "help" => {
            print!("{}", help());
            0
        }
        other => {
            eprintln!("sandbox-init: unknown command `{other}` (see sandbox-init --help)");
            Refusal::Usage.code()
        }
    };
    ExitCode::from(code)
}

/// Sidecar mode's holder: PID 1 of a container that owns the network namespace and runs nothing
/// (a pod's pause container), so that the gateway and the agent's container can each restart into
/// the same namespace, the one the gateway's table is in. Ends on SIGTERM or SIGINT.
fn hold() -> u8 {
    // SAFETY: a signal set on the stack, built and waited on with plain libc calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut signal = 0;
        libc::sigwait(&set, &mut signal);
    }
    0
}

/// `sandbox-status --health`: the image's HEALTHCHECK, for this container's role.
fn health() -> u8 {
    match sandbox_init::init::Role::from_env() {
        Ok(role) => sandbox_init::health::run(role),
        Err(e) => {
            println!("unhealthy: {}", e.message);
            1
        }
    }
}

fn tool_name(arg: &str) -> String {
    Path::new(arg).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn run_init() -> u8 {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if pid != 1 && std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "sandbox-init") {
        eprintln!("sandbox-init: already running as PID 1 in this container (did you mean sandbox-exec?)");
        return Refusal::Usage.code();
    }
    console::start();
    let code = match init::run() {
        Ok(code) => code,
        Err(fatal) => {
            console::err(format!(
                "sandbox-init: {} (exit {}; the agent was not started)",
                fatal.message,
                fatal.refusal.code()
            ));
            fatal.refusal.code()
        }
    };
    console::flush(CONSOLE_FLUSH);
    code
}

/// How long PID 1's last lines may wait for a terminal before it exits without them.
const CONSOLE_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

fn check(files: &[String]) -> u8 {
    let results: Vec<(String, Result<Policy, PolicyError>)> = if files.is_empty() {
        let merged = Policy::load(Path::new(BAKED_POLICY), Path::new(DROP_IN_DIR)).map(|(p, _)| p);
        vec![(format!("{BAKED_POLICY} + {DROP_IN_DIR}"), merged)]
    } else {
        files.iter().map(|f| (f.clone(), Policy::read(Path::new(f)))).collect()
    };
    let mut code = 0;
    for (name, result) in results {
        match result {
            Ok(policy) => println!(
                "{name}: ok ({}{})",
                policy.summary(),
                if policy.services.is_empty() {
                    String::new()
                } else {
                    format!(", services: {}", policy.services.iter().cloned().collect::<Vec<_>>().join(", "))
                }
            ),
            Err(e) => {
                eprintln!("{e}");
                if code == 0 {
                    code = Refusal::for_policy(&e).code();
                }
            }
        }
    }
    code
}

/// How long sandbox-exec waits for this start's ready mark, at most; `SANDBOX_EXEC_WAIT`
/// (seconds) may make it shorter.
const EXEC_WAIT_SECS: u64 = 60;
const EXEC_WAIT_ENV: &str = "SANDBOX_EXEC_WAIT";

fn exec(args: &[String]) -> u8 {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    let Some((program, program_args)) = args.split_first() else {
        eprintln!("sandbox-exec: usage: sandbox-exec [--] CMD [ARG…]");
        return Refusal::Usage.code();
    };
    // Nothing runs before this start's PID 1 says the sandbox is ready: after a restart the
    // firewall is not there until it loads it (ready.rs).
    let limit =
        std::env::var(EXEC_WAIT_ENV).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(EXEC_WAIT_SECS);
    if !sandbox_init::ready::wait(Duration::from_secs(limit.min(EXEC_WAIT_SECS))) {
        eprintln!(
            "sandbox-exec: the sandbox is not ready: this start has not marked it ready ({}) within \
             {} s, and until it does its firewall may not hold: nothing is run. `docker logs` says \
             what sandbox-init is doing",
            sandbox_init::policy::layout::READY_MARK,
            limit.min(EXEC_WAIT_SECS)
        );
        return 126;
    }
    run_as_agent(program, program_args, "sandbox-exec")
}

fn attach(args: &[String]) -> u8 {
    let session = args.first().cloned().unwrap_or_else(session::session_name);
    let tool = "sandbox-attach";
    match agent_command("tmux", &["attach-session".into(), "-t".into(), session], tool) {
        Ok(command) => sandbox_init::attach::attach(command, tool),
        Err(code) => code,
    }
}

/// Replaces this process with `program` as the agent. Returns only on failure.
fn run_as_agent(program: &str, args: &[String], tool: &str) -> u8 {
    let mut command = match agent_command(program, args, tool) {
        Ok(command) => command,
        Err(code) => return code,
    };
    let error = command.exec();
    eprintln!("{tool}: cannot run {program}: {error}");
    if error.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 }
}

/// `program ARGS…` as the agent, in the workspace (else its home), with tmux's socket folder; or
/// the status to exit with, the reason printed.
fn agent_command(program: &str, args: &[String], tool: &str) -> Result<std::process::Command, u8> {
    let agent = AgentPrivileges::lookup(AGENT_USER).map_err(|e| {
        eprintln!("{tool}: {e}");
        126
    })?;
    let mut command = agent.command(program).map_err(|e| {
        eprintln!("{tool}: {e}");
        126
    })?;
    let dir = if Path::new(WORKSPACE).is_dir() { PathBuf::from(WORKSPACE) } else { agent.home.clone() };
    command.args(args).env("TMUX_TMPDIR", TMUX_TMPDIR).current_dir(dir);
    // `docker exec -it` passes no TERM, and tmux will not attach without one.
    if std::env::var_os("TERM").is_none() {
        command.env("TERM", "xterm-256color");
    }
    Ok(command)
}
