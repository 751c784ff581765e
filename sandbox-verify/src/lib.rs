//! The checks of `agent-sandbox verify`, which are also the attacks:: suite's: one
//! implementation. Each runs as the agent in a test world, with a positive control, and reads its
//! evidence where it lands (a peer's log, the resolver's log). What builds the world and reaches
//! into it is a [`Stage`]: the launcher's own (bollard, any image a user names), and the test
//! harness's (testcontainers, the shipped images, every shape the suites run in).
//!
//! The world: a peer that answers under an allowed and a blocked name on one address (`site`), a
//! listener under no name (`outside`), an upstream DNS server that logs every query (`dns`), all
//! running the static probe with [`SITE_SERVE`] and [`DNS_SERVE`]; and the image under test as the
//! sandbox, its policy plus [`drop_in`], resolving through `dns`.

mod checks;

use std::collections::HashMap;
use std::net::IpAddr;

use serde::Serialize;

pub use checks::{host_count, refusal};

pub const ALLOWED: &str = "allowed.verify.test";
pub const BLOCKED: &str = "blocked.verify.test";
/// An allowed name that only the upstream resolver knows: the engine's own DNS answers the peer's
/// aliases itself, so the DNS checks' control asks this one.
pub const UPSTREAM: &str = "upstream.verify.test";
pub const PEER_LOG: &str = "/tmp/agent-sandbox-verify-peer.log";
pub const ZONE: &str = "/tmp/agent-sandbox-verify-zone";
pub const QUERIES: &str = "/tmp/agent-sandbox-verify-queries";
/// Where a sandbox takes its held keys from, one root-only file per variable (lower-cased).
pub const SECRETS_DIR: &str = "/run/secrets";
/// The port of the listener the agent opens for the inbound check.
pub const INBOUND: u16 = 8081;
/// The drop-in that allows the world's allowed names, beside the image's own drop-ins.
pub const DROP_IN: &str = "agent-sandbox-verify.yaml";

/// A made-up key for the world to hold: `sk-verify-` and 32 hex digits of this moment.
pub fn made_up_key() -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("sk-verify-{:032x}", nanos ^ (u128::from(std::process::id()) << 64))
}

/// What `site` and `outside` serve: HTTP on 80, an echo on 443 and 53 (a hello comes back as it
/// was sent), UDP echo on 9 and 443; every connection logged as it is accepted, every request,
/// datagram and ICMP echo request as it arrives.
pub const SITE_SERVE: &[&str] = &[
    "serve",
    "--http",
    "80",
    "--echo",
    "443,53",
    "--udp",
    "9,443",
    "--log",
    PEER_LOG,
    "--log-accepts",
    "--icmp",
];
/// What `dns` serves: the zone [`zone`] writes, every query logged.
pub const DNS_SERVE: &[&str] = &["serve", "--dns", ZONE, QUERIES];

/// The upstream resolver's zone: every name of the world at the site's address.
pub fn zone(site: IpAddr) -> String {
    format!("{ALLOWED} A {site} 60\n{BLOCKED} A {site} 60\n*.{BLOCKED} A {site} 60\n{UPSTREAM} A {site} 60\n")
}

/// The subnets a test world's internal network may take, in the order to try them (the next
/// while the engine says one overlaps another network's): an IPv4 /24 of the benchmarking block
/// 198.18.0.0/15 (RFC 2544) and an IPv6 /64 of the documentation prefix 2001:db8::/32, neither
/// routed anywhere, starting where `seed` points. Not the engine's own ranges: those are
/// private (RFC 1918, unique local), which the DNS gate opens only for an entry that says
/// `private: true`, and the world's peers play public services.
pub fn world_subnets(seed: u32) -> impl Iterator<Item = [String; 2]> {
    const BLOCKS: u32 = 512;
    let start = seed.wrapping_mul(2654435761) % BLOCKS;
    (0..BLOCKS).map(move |attempt| {
        let block = (start + attempt) % BLOCKS;
        let v4 = format!("198.{}.{}.0/24", 18 + block / 256, block % 256);
        let v6 = format!("2001:db8:{:x}:{:x}::/64", (seed >> 16) & 0xffff, seed & 0xffff);
        [v4, v6]
    })
}

/// Whether an engine's refusal to create a network says its subnet overlaps another's.
pub fn overlaps(message: &str) -> bool {
    message.contains("overlap")
}

/// The policy drop-in that allows the world's allowed names.
pub fn drop_in() -> String {
    format!(
        "version: 1\ndescription: agent-sandbox verify's test world\ndomains:\n  - {ALLOWED}\n  - {UPSTREAM}\n"
    )
}

/// The containers of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A peer under the allowed and the blocked name, on one address.
    Site,
    /// A listener under no name.
    Outside,
    /// The upstream resolver.
    Dns,
    /// The image under test, with NET_ADMIN and the policy.
    Sandbox,
    /// The image under test without NET_ADMIN (`egress.fail-closed`).
    Closed,
}

/// How the image without NET_ADMIN ended up.
#[derive(Debug)]
pub enum Closed {
    /// It exited with this code; its last log lines.
    Exited { code: i64, log: String },
    /// It runs (an agent with no firewall).
    Running { log: String },
}

/// A world the checks run in. `as_agent` returns what the command printed (stdout then stderr),
/// or why it could not run: a program the image lacks is evidence, not the end of the run.
#[allow(async_fn_in_trait)] // Used through generics alone, awaited where it is called.
pub trait Stage {
    type Error: From<Broken>;
    /// Whether the image's entrypoint is sandbox-init (and the agent runs through sandbox-exec).
    fn sandbox_init(&self) -> bool;
    /// Where the probe is in every container of the world.
    fn probe_path(&self) -> &str;
    fn addr(&self, role: Role) -> IpAddr;
    /// The IPv6 address, where the world's network has IPv6.
    fn addr6(&self, role: Role) -> Option<IpAddr>;
    /// `cmd` as the agent in `role` (Sandbox or Closed).
    async fn as_agent(&self, role: Role, cmd: &[&str]) -> Result<String, Self::Error>;
    /// Starts `cmd` as the agent in the sandbox and does not wait for it.
    async fn as_agent_detached(&self, cmd: &[&str]) -> Result<(), Self::Error>;
    /// `cmd` as root in a peer, or (Sandbox) where the sandbox's firewall and keys are: its
    /// standard output.
    async fn peer_exec(&self, role: Role, cmd: &[&str]) -> Result<String, Self::Error>;
    /// A file of a container's, read through the engine; empty where there is none.
    async fn read(&self, role: Role, path: &str) -> Result<String, Self::Error>;
    /// Starts the image without NET_ADMIN on the world's network and says how it ended up
    /// within 20 s.
    async fn closed(&self) -> Result<Closed, Self::Error>;
    /// The API key the world gave the sandbox to hold, as a root-only file in
    /// [`SECRETS_DIR`]: its variable and value; or why there is none (`keys.held` is N/A).
    fn held_key(&self) -> Result<(String, String), String>;
}

/// A world whose own control failed: no check of it could be trusted.
#[derive(Debug)]
pub struct Broken(pub String);

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the test world's own control failed, so no check could be trusted: {}", self.0)
    }
}

impl std::error::Error for Broken {}

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    #[serde(rename = "N/A")]
    NotApplicable,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NotApplicable => "N/A",
        })
    }
}

/// One line of the scorecard.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub id: &'static str,
    pub check: &'static str,
    pub verdict: Verdict,
    /// What was seen, on the receiving side where there is one: one line.
    pub evidence: String,
    /// What a FAIL means for the user.
    pub meaning: &'static str,
}

/// Every check's id, in the scorecard's order.
pub const CHECKS: &[&str] = &[
    "egress.allowed",
    "egress.blocked-name",
    "names.host",
    "names.second-request",
    "names.sni",
    "egress.address",
    "egress.udp",
    "egress.icmp",
    "egress.address-ipv6",
    "ingress.listener",
    "dns.exfiltration",
    "dns.direct",
    "dns.forged-answer",
    "process.privileges",
    "firewall.tamper",
    "policy.files",
    "egress.fail-closed",
    "keys.held",
];

/// The world's own controls, then every check, in [`CHECKS`]' order.
pub async fn run<S: Stage>(stage: &S) -> Result<Vec<Outcome>, S::Error> {
    checks::Run::new(stage).all().await
}

/// The probe's `key=value` lines.
pub fn fields(out: &str) -> HashMap<String, String> {
    out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `verify S`'s check of a running sandbox's own agent: the processes of `uid` among `status`
/// (every `/proc/PID/status` of the container the agent runs in, one after another, after a
/// `self=PID` line naming the reader, whose own processes are left out) hold no capability in
/// any set, have that uid and gid in all four places, and NoNewPrivs; and there is at least one
/// (the control: the session runs). A kernel's /proc that shows no CapAmb (gVisor's) leaves it
/// bounded by the permitted set, which must be shown empty; one that shows no NoNewPrivs passes
/// only where the engine sets it for every process of the container (`engine_no_new_privs`).
pub fn running_processes(status: &str, uid: u32, engine_no_new_privs: bool) -> Outcome {
    let (id, check) = ("running.processes", "the running sandbox's agent processes hold nothing");
    let meaning = "the agent of this very sandbox holds a capability, or can gain one";
    let uid = uid.to_string();
    let reader = status.lines().find_map(|l| l.strip_prefix("self=")).unwrap_or_default().trim().to_string();
    let mut agent = 0;
    let mut wrong = Vec::new();
    let mut unknown = std::collections::BTreeSet::new();
    for block in status.split("Name:").skip(1) {
        let field = |key: &str| block.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string());
        let name = block.lines().next().unwrap_or_default().trim();
        let pid = field("Pid:").unwrap_or_default();
        let mine = !reader.is_empty() && (pid == reader || field("PPid:").is_some_and(|p| p == reader));
        if mine || !field("Uid:").is_some_and(|ids| ids.split_whitespace().any(|i| i == uid)) {
            continue;
        }
        agent += 1;
        for ids in ["Uid:", "Gid:"] {
            let all = field(ids).unwrap_or_default();
            let all: Vec<&str> = all.split_whitespace().collect();
            if all.len() != 4 || all.iter().any(|i| *i != uid) {
                wrong.push(format!("{name} ({pid}) {ids} {}", all.join(" ")));
            }
        }
        let permitted_empty = field("CapPrm:").is_some_and(|v| v.trim_start_matches('0').is_empty());
        for set in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            match field(set) {
                Some(v) if v.trim_start_matches('0').is_empty() => {}
                Some(v) => wrong.push(format!("{name} ({pid}) {set} {v}")),
                // The ambient set is within the permitted one: empty, if that is shown empty.
                None if set == "CapAmb:" && permitted_empty => {
                    unknown.insert("CapAmb");
                }
                None => wrong.push(format!("{name} ({pid}) shows no {set} line")),
            }
        }
        match field("NoNewPrivs:").as_deref() {
            Some("1") => {}
            Some(v) => wrong.push(format!("{name} ({pid}) NoNewPrivs {v}")),
            None if engine_no_new_privs => {
                unknown.insert("NoNewPrivs");
            }
            None => {
                wrong.push(format!("{name} ({pid}) NoNewPrivs not shown, and the engine does not set it"))
            }
        }
    }
    let unknown: Vec<&str> = unknown.into_iter().collect();
    let verdict = if agent > 0 && wrong.is_empty() { Verdict::Pass } else { Verdict::Fail };
    let evidence = if agent == 0 {
        format!("no process runs as uid {uid}: could not check (is the session up?)")
    } else if !wrong.is_empty() {
        format!("{agent} processes as uid {uid}; {}", wrong.join("; "))
    } else {
        let shown = if unknown.is_empty() {
            "every capability set empty, NoNewPrivs 1".to_string()
        } else {
            format!(
                "every capability set shown empty; this kernel's /proc shows no {} (the ambient set is within \
                 the empty permitted one; the engine sets no-new-privileges for the container)",
                unknown.join(" or ")
            )
        };
        format!("{agent} processes as uid {uid}: {shown}")
    };
    Outcome { id, check, verdict, evidence, meaning }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "Name:\tbash\nPid:\t7\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n\
        CapInh:\t0000000000000000\n\
        CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n\
        CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
    const ROOT: &str =
        "Name:\tsandbox-init\nPid:\t1\nUid:\t0\t0\t0\t0\nCapEff:\t00000000a80425fb\nNoNewPrivs:\t0\n";

    #[test]
    fn the_agents_processes_are_judged_and_roots_are_not() {
        let pass = running_processes(&format!("{ROOT}{AGENT}{AGENT}"), 1000, false);
        assert_eq!(pass.verdict, Verdict::Pass, "{}", pass.evidence);
        assert!(pass.evidence.starts_with("2 processes as uid 1000"), "{}", pass.evidence);
        let held = AGENT.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000001000");
        let fail = running_processes(&format!("{ROOT}{held}"), 1000, true);
        assert_eq!(fail.verdict, Verdict::Fail);
        assert!(fail.evidence.contains("bash (7) CapEff: 0000000000001000"), "{}", fail.evidence);
        let setuid = AGENT.replace("Uid:\t1000\t1000\t1000\t1000", "Uid:\t1000\t0\t0\t0");
        assert_eq!(running_processes(&setuid, 1000, true).verdict, Verdict::Fail, "a saved uid 0");
        let no_caps = AGENT.replace("CapEff:\t0000000000000000\n", "");
        assert_eq!(running_processes(&no_caps, 1000, true).verdict, Verdict::Fail, "no CapEff line");
        // The reader's own processes (the shell and its cat) are no evidence of the session.
        let reader = format!("self=7\n{AGENT}{}", AGENT.replace("Pid:\t7\nPPid:\t1", "Pid:\t8\nPPid:\t7"));
        assert_eq!(running_processes(&reader, 1000, true).verdict, Verdict::Fail, "only the reader");
    }

    #[test]
    fn no_agent_process_is_no_pass_and_a_missing_line_is_named() {
        assert_eq!(running_processes(ROOT, 1000, true).verdict, Verdict::Fail);
        let gvisor = AGENT.replace("CapAmb:\t0000000000000000\n", "").replace("NoNewPrivs:\t1\n", "");
        let outcome = running_processes(&gvisor, 1000, true);
        assert_eq!(outcome.verdict, Verdict::Pass);
        assert!(outcome.evidence.contains("shows no CapAmb or NoNewPrivs"), "{}", outcome.evidence);
        // Without the engine's no-new-privileges, an unshown NoNewPrivs is not a pass.
        let outcome = running_processes(&gvisor, 1000, false);
        assert_eq!(outcome.verdict, Verdict::Fail, "{}", outcome.evidence);
    }
}
