//! What must hold of a sandbox, checked the way the agent would find out: a real connection
//! from inside, the real processes' /proc status, the files of the image itself.

use crate::probe::{PROBE, Probe};
use crate::sandbox::Sandbox;
use sandbox_init::net::uids::{CHECKER_UID, FORWARDER_UID};

/// One process as /proc/PID/status tells it.
#[derive(Debug)]
pub struct ProcStatus {
    pub pid: String,
    pub name: String,
    pub fields: std::collections::HashMap<String, String>,
    /// Read inside gVisor, whose /proc/PID/status has no CapAmb and no NoNewPrivs line.
    pub gvisor: bool,
}

const STATUSES: &str =
    r#"for s in /proc/[0-9]*/status; do echo "== ${s#/proc/}"; cat "$s" 2>/dev/null; done"#;

/// Every process of the sandbox, from /proc (read as root).
pub async fn processes(sb: &Sandbox) -> anyhow::Result<Vec<ProcStatus>> {
    let mut out = sb.exec(&["sh", "-c", STATUSES]).await?.stdout;
    // Sidecar mode: the agent's container's too, its pids marked as its own.
    if sb.is_sidecar() {
        let theirs = sb.exec_agent_side(&["sh", "-c", &STATUSES.replace("== ", "== agent:")]).await?.stdout;
        out.push_str(&theirs);
    }
    Ok(parse_statuses(&out, |pid| sb.under_gvisor() && pid.starts_with("agent:")))
}

/// Every process of a container that is not a sandbox's handle (a compose service, a pod's
/// container), read as the container's own user.
pub async fn processes_of(container: &str) -> anyhow::Result<Vec<ProcStatus>> {
    let out = crate::docker::exec(container, &["sh", "-c", STATUSES], None).await?.stdout;
    Ok(parse_statuses(&out, |_| false))
}

fn parse_statuses(out: &str, gvisor: impl Fn(&str) -> bool) -> Vec<ProcStatus> {
    let mut list = Vec::new();
    for block in out.split("== ").filter(|b| !b.trim().is_empty()) {
        let mut lines = block.lines();
        let pid = lines.next().unwrap_or_default().trim_end_matches("/status").to_string();
        let fields: std::collections::HashMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.split_whitespace().collect::<Vec<_>>().join(" ")))
            .collect();
        // A process that ended between the listing and its read left nothing to check.
        if !fields.contains_key("Uid") {
            continue;
        }
        let name = fields.get("Name").cloned().unwrap_or_default();
        let gvisor = gvisor(&pid);
        list.push(ProcStatus { pid, name, fields, gvisor });
    }
    list
}

/// uid and gid 1000, every capability set empty, no_new_privs, no supplementary group.
pub fn assert_unprivileged(p: &ProcStatus) {
    assert_unprivileged_as(p, 1000);
}

/// uid and gid `id`, every capability set empty, no_new_privs, no supplementary group.
pub fn assert_unprivileged_as(p: &ProcStatus, id: u32) {
    let ids = format!("{id} {id} {id} {id}");
    assert_eq!(p.fields["Uid"], ids, "{} ({}) uid: {:?}", p.name, p.pid, p.fields);
    assert_eq!(p.fields["Gid"], ids, "{} ({}) gid", p.name, p.pid);
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        if p.gvisor && set == "CapAmb" {
            // gVisor reports no ambient set: N/A there; the four it reports are checked.
            continue;
        }
        assert_eq!(p.fields[set], "0000000000000000", "{} ({}) {set}", p.name, p.pid);
    }
    if p.gvisor {
        // gVisor reports no NoNewPrivs line: N/A there (the container runs with
        // no-new-privileges, and gVisor's own kernel holds the agent).
        assert!(!p.fields.contains_key("NoNewPrivs"), "gVisor reports NoNewPrivs now: check it");
    } else {
        assert_eq!(p.fields["NoNewPrivs"], "1", "{} ({})", p.name, p.pid);
    }
    assert_eq!(p.fields["Groups"], id.to_string(), "{} ({}) supplementary groups", p.name, p.pid);
}

/// Every process of the agent's session holds nothing; and the session is really there (the
/// tmux server, its pane, the agent command). So do the name checker and the forwarder, where
/// they run; returns how many checkers do.
pub async fn assert_agent_processes_unprivileged(sb: &Sandbox) -> anyhow::Result<usize> {
    let uid = |p: &ProcStatus| p.fields.get("Uid").cloned().unwrap_or_default();
    // Right after `sandbox ready` the pane may still be the tmux server's fork, before it runs
    // sandbox-init (seen in CI: two "tmux: server"): read again until the session is whole,
    // for up to 5 s, then judge that reading.
    let whole = |all: &[ProcStatus]| {
        let session: Vec<&str> = all
            .iter()
            .filter(|p| {
                ![0, CHECKER_UID, FORWARDER_UID].iter().any(|id| uid(p).starts_with(&format!("{id} ")))
            })
            .map(|p| p.name.as_str())
            .collect();
        session.contains(&"tmux: server") && session.contains(&"sandbox-init") && session.len() >= 3
    };
    let mut all = processes(sb).await?;
    for _ in 0..50 {
        if whole(&all) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        all = processes(sb).await?;
    }
    let (checkers, agent): (Vec<&ProcStatus>, Vec<&ProcStatus>) = all
        .iter()
        .filter(|p| !uid(p).starts_with("0 "))
        .partition(|p| uid(p).starts_with(&format!("{CHECKER_UID} ")));
    // With the firewall, one name checker (sandbox-init checker), as unprivileged as the agent.
    for checker in &checkers {
        assert_eq!(checker.name, "sandbox-init", "a process of the checker's uid: {:?}", checker.fields);
        assert_unprivileged_as(checker, CHECKER_UID);
    }
    assert!(checkers.len() <= 1, "{} checkers", checkers.len());
    let (forwarders, agent): (Vec<&ProcStatus>, Vec<&ProcStatus>) =
        agent.into_iter().partition(|p| uid(p).starts_with(&format!("{FORWARDER_UID} ")));
    for forwarder in &forwarders {
        assert_eq!(
            forwarder.name, "sandbox-init",
            "a process of the forwarder's uid: {:?}",
            forwarder.fields
        );
        assert_unprivileged_as(forwarder, FORWARDER_UID);
    }
    assert!(forwarders.len() <= 1, "{} forwarders", forwarders.len());
    let names: Vec<&str> = agent.iter().map(|p| p.name.as_str()).collect();
    // The tmux server, the pane (sandbox-init as the agent) and the agent command under it.
    assert!(
        names.contains(&"tmux: server") && names.contains(&"sandbox-init") && names.len() >= 3,
        "the session's processes: {names:?}"
    );
    for p in agent {
        assert_unprivileged(p);
    }
    let init = all.iter().find(|p| p.pid == "1").expect("PID 1");
    assert_eq!(init.name, "sandbox-init");
    Ok(checkers.len())
}

/// The files of the sandbox's own file system that could raise the privileges of a process not
/// under no_new_privs (`docker exec -u agent`, a devcontainer's terminal): setuid or setgid
/// programs, and files carrying a capability. One `setid PATH` or `caps PATH` each.
pub async fn privileged_files(sb: &Sandbox) -> anyhow::Result<Vec<String>> {
    let out = sb.exec(&[PROBE, "privileged-files", "/"]).await?;
    anyhow::ensure!(out.code == 0, "the scan failed: {out:?}");
    let checked: u64 = out.stdout.lines().find_map(|l| l.strip_prefix("checked=")?.parse().ok()).unwrap_or(0);
    // The walk read the image, not an empty directory.
    anyhow::ensure!(checked > 1000, "the scan checked only {checked} files: {out:?}");
    Ok(out
        .stdout
        .lines()
        .filter(|l| l.starts_with("setid ") || l.starts_with("caps "))
        .map(str::to_string)
        .collect())
}

fn split_target(target: &str) -> (&str, &str) {
    target.rsplit_once(':').expect("HOST:PORT")
}

/// The agent can open a TCP connection to `target` (`host:port`), and the peer greets it.
pub async fn assert_reaches(sb: &Sandbox, target: &str) -> anyhow::Result<Probe> {
    let (host, port) = split_target(target);
    let probe = sb.probe(&["tcp", host, port]).await?;
    anyhow::ensure!(
        probe.outcome() == "connected"
            && probe.fields.get("greeting").is_some_and(|g| g.starts_with("hello from")),
        "expected the agent to reach {target}, but: {:?}",
        probe.fields
    );
    Ok(probe)
}

/// The agent's TCP connection to `target` fails, and at once: refused by the firewall (not a
/// timeout), or its name refused by the DNS gate.
pub async fn assert_blocked(sb: &Sandbox, target: &str) -> anyhow::Result<Probe> {
    let (host, port) = split_target(target);
    let probe = sb.probe(&["tcp", host, port, "--timeout-ms", "3000"]).await?;
    let outcome = probe.outcome();
    anyhow::ensure!(
        outcome == "refused" || outcome.starts_with("dns:"),
        "expected {target} to be blocked at once, but the agent's connection ended `{outcome}`: {:?}",
        probe.fields
    );
    if outcome == "refused" {
        anyhow::ensure!(probe.ms() < 1000.0, "{target} was refused, but only after {} ms", probe.ms());
    }
    Ok(probe)
}
