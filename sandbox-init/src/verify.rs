//! The start's proof that the firewall holds, from the agent's side: a connection as the agent
//! to an address outside the allowlist is refused at once, and, with the name check, one to an
//! allowed address reaches the checker (and is refused for naming nothing). Run as the agent
//! by `sandbox-init probe` and `probe-checked`; a failure is exit 70, and the agent never starts.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use crate::console;
use crate::exit::{Fatal, Refusal};
use crate::net::firewall::{NftApply, probe_element};
use crate::net::interfaces::probe_targets;
use crate::policy::Policy;
use crate::privileges::AgentPrivileges;
use crate::process;

/// The discard port: never a service anyone allows.
pub const PROBE_PORT: u16 = 9;

/// A connection as the agent to an address outside the allowlist must be refused at once.
/// Returns the address it tried, where there was one to try.
pub fn blocked(policy: &Policy, agent: &AgentPrivileges, program: &Path) -> Result<Option<IpAddr>, Fatal> {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let target = probe_targets(&routes).into_iter().find(|addr| !policy.cidr_allows(*addr, PROBE_PORT));
    let Some(target) = target else {
        console::err("sandbox-init: no IPv4 route to probe; the firewall was verified by reading it back");
        return Ok(None);
    };
    let output = as_agent(agent, program, "probe", SocketAddr::new(target, PROBE_PORT))?;
    passed(&output, &format!("a connection as the agent to {target}:{PROBE_PORT} was not refused"))?;
    Ok(Some(target))
}

/// With the name check: a connection as the agent to an allowed address must reach the checker
/// (which refuses bytes that name nothing), not go out, nor be refused by the firewall as if the
/// kernel had not redirected it. `target` is opened for the test and closed again.
/// Returns the script that deletes the probe's element again, which PID 1 applies once the
/// sandbox is ready: a deletion commits only after an RCU grace period (15 to 35 ms measured),
/// and nft runs take turns with every spawn. Until then the element opens nothing: PID 1
/// refuses every connection to an address the sink did not open.
pub fn name_check(
    nft: &impl NftApply,
    agent: &AgentPrivileges,
    program: &Path,
    target: IpAddr,
) -> Result<String, Fatal> {
    let (add, delete) = probe_element(target, PROBE_PORT);
    nft.apply(&add).map_err(|e| Fatal::new(Refusal::VerificationFailed, e))?;
    let output = as_agent(agent, program, "probe-checked", SocketAddr::new(target, PROBE_PORT))?;
    passed(&output, "a connection as the agent to an allowed address did not reach the name check")?;
    Ok(delete)
}

/// A probe's exit: 0 passed; anything else is `failure`, with what the probe printed.
fn passed(output: &std::process::Output, failure: &str) -> Result<(), Fatal> {
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stdout);
    Err(Fatal::new(Refusal::VerificationFailed, format!("{failure}: {}", said.trim())))
}

/// `sandbox-init <probe> ADDR` as the agent.
fn as_agent(
    agent: &AgentPrivileges,
    program: &Path,
    probe: &str,
    target: SocketAddr,
) -> Result<std::process::Output, Fatal> {
    let mut command = agent.command(program).map_err(|e| Fatal::new(Refusal::SetupFailed, e))?;
    command.arg(probe).arg(target.to_string());
    process::output(&mut command, None)
        .map_err(|e| Fatal::new(Refusal::VerificationFailed, format!("cannot run the probe: {e}")))
}

/// `sandbox-init probe ADDR:PORT`, run as the agent: exit 0 if the connection is refused at
/// once, 1 otherwise, saying what happened.
pub fn probe(target: &str) -> u8 {
    let Ok(addr) = target.parse::<SocketAddr>() else {
        println!("not an address: {target}");
        return 1;
    };
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => 0,
        Err(e) => {
            println!("{e}");
            1
        }
        Ok(_) => {
            println!("connected");
            1
        }
    }
}

/// `sandbox-init probe-checked ADDR:PORT`, run as the agent while ADDR:PORT is open for a name:
/// exit 0 if the connection is taken (by the checker) and then reset for sending no name.
pub fn probe_checked(target: &str) -> u8 {
    use std::io::{Read as _, Write as _};
    let Ok(addr) = target.parse::<SocketAddr>() else {
        println!("not an address: {target}");
        return 1;
    };
    let mut stream = match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(stream) => stream,
        Err(e) => {
            println!("the connection was not taken: {e}");
            return 1;
        }
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.write_all(b"x\r\n");
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
        Ok(_) => {
            println!("an answer came back: the connection was not checked");
            1
        }
        Err(e) => {
            println!("no refusal from the name check: {e}");
            1
        }
    }
}
