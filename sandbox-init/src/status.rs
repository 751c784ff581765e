//! `sandbox-status`: the policy in force (written by PID 1 at start and on reload), the
//! addresses the DNS gate has allowed with their remaining time, the last denials and
//! connections, and per-name totals; `--json` for all of it as one object.

use std::io::{BufRead as _, BufReader};
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::connections::{CONNECTION_LOG, Connection, TOTALS_FILE, Totals, read_totals};
use crate::denials::DENIAL_LOG;
use crate::net::firewall::{FirewallMode, Nft};
use crate::policy::Policy;

pub use crate::policy::layout::STATUS_FILE;
const SHOWN_DOMAINS: usize = 40;
const SHOWN_DENIALS: usize = 10;
const SHOWN_CONNECTIONS: usize = 10;

#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub firewall: String,
    pub ipv6: bool,
    pub domains: Vec<String>,
    pub cidrs: Vec<String>,
    pub services: Vec<String>,
    pub files: Vec<String>,
    pub upstreams: Vec<String>,
    #[serde(default)]
    pub inbound: Vec<u16>,
    /// The forwarded hosts (docs/forwarding.md): the host, the forwarder's port, the service
    /// and what the policy lets the agent write there.
    #[serde(default)]
    pub forwarded: Vec<String>,
}

impl Status {
    pub fn new(mode: FirewallMode, policy: &Policy, upstreams: &[IpAddr], ipv6: bool) -> Status {
        let ports =
            |p: &std::collections::BTreeSet<u16>| p.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        Status {
            firewall: format!("{mode:?}").to_lowercase(),
            ipv6,
            domains: policy.domains.iter().map(|(d, access)| format!("{d} ({access})")).collect(),
            cidrs: policy.cidrs.iter().map(|(n, p)| format!("{n} ({})", ports(p))).collect(),
            services: policy.services.iter().cloned().collect(),
            files: policy.files.iter().map(|f| f.display().to_string()).collect(),
            upstreams: upstreams.iter().map(IpAddr::to_string).collect(),
            inbound: policy.inbound.iter().copied().collect(),
            forwarded: FORWARDED.get().cloned().unwrap_or_default(),
        }
    }
}

pub fn write(status: &Status) {
    let text = serde_json::to_string_pretty(status).unwrap_or_default();
    let tmp = format!("{STATUS_FILE}.tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, STATUS_FILE)) {
        crate::console::err(format!("sandbox-init: cannot write {STATUS_FILE}: {e}"));
    }
}

/// What `sandbox-status` shows, gathered once for both forms.
#[derive(Debug, Serialize)]
struct Report {
    #[serde(flatten)]
    status: Status,
    /// The (address . port) elements the gate opened, with the seconds each has left; None when
    /// they cannot be listed (not root, or no firewall).
    addresses: Option<Vec<Address>>,
    denials: Vec<serde_json::Value>,
    connections: Vec<Connection>,
    /// Per name (the address where no name was known), as PID 1 counts them: every connection,
    /// those the log folded or dropped too.
    totals: std::collections::BTreeMap<String, Totals>,
}

#[derive(Debug, Serialize)]
struct Address {
    element: String,
    expires_in: u64,
}

const USAGE: &str = "usage: sandbox-status [--json | --health]";

/// Prints the status (`--json`: as one JSON object); 1 if sandbox-init has not written one (it is
/// not running, or not ready), 64 for an unknown option.
pub fn show(args: &[String]) -> u8 {
    let json = match args {
        [] => false,
        [flag] if flag == "--json" => true,
        [flag] if flag == "--help" || flag == "-h" => {
            println!(
                "{USAGE}\n\nThe policy in force, the addresses the DNS gate opened and for how long, the last\ndenials and connections, and connections and bytes per name.\n\n--health: the image's HEALTHCHECK: whether the firewall holds (its output and input\nchains drop by default), in one line; exit 0 healthy, 1 not."
            );
            return 0;
        }
        _ => {
            eprintln!("sandbox-status: unknown arguments {args:?}\n{USAGE}");
            return crate::exit::Refusal::Usage.code();
        }
    };
    let status: Status = match std::fs::read_to_string(STATUS_FILE).map(|t| serde_json::from_str(&t)) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => {
            eprintln!("sandbox-status: {STATUS_FILE} is unreadable: {e}");
            return 1;
        }
        Err(e) => {
            eprintln!("sandbox-status: no status at {STATUS_FILE} ({e}): is sandbox-init running and ready?");
            return 1;
        }
    };
    let addresses = if status.firewall == "on" {
        Nft::find().and_then(|nft| nft.list_elements()).map_err(|e| e.to_string())
    } else {
        Err("no firewall".to_string())
    };
    let parse = |line: &String| serde_json::from_str::<serde_json::Value>(line).ok();
    let all_connections = connection_lines();
    let report = Report {
        addresses: addresses.as_ref().ok().map(|list| {
            list.iter()
                .map(|(element, left)| Address { element: element.clone(), expires_in: left.as_secs() })
                .collect()
        }),
        denials: last_lines(Path::new(DENIAL_LOG), SHOWN_DENIALS).iter().filter_map(parse).collect(),
        totals: read_totals(Path::new(TOTALS_FILE)),
        connections: all_connections.iter().rev().take(SHOWN_CONNECTIONS).rev().cloned().collect(),
        status,
    };
    // Names, reasons and denial lines quote what the agent sent: escaped, whatever the output
    // is (a pipe often ends in a terminal too).
    if json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        println!("{}", crate::policy::text::json_safe(&text));
        return 0;
    }
    print!("{}", crate::policy::text::escaped(&render_text(&report, addresses.err())));
    0
}

/// Every line of the connection log, the rotated file's first.
fn connection_lines() -> Vec<Connection> {
    let rotated = format!("{CONNECTION_LOG}.1");
    [rotated.as_str(), CONNECTION_LOG]
        .iter()
        .filter_map(|path| std::fs::File::open(path).ok())
        .flat_map(|file| BufReader::new(file).lines().map_while(Result::ok).collect::<Vec<_>>())
        .filter_map(|line| serde_json::from_str::<Connection>(&line).ok())
        .collect()
}

/// The forwarded hosts as the forwarder serves them: its routes are made at start, and a reload
/// does not change them, so neither does it change what the status says of them.
static FORWARDED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Records the forwarded hosts the forwarder serves, once, at start.
pub fn set_forwarded<'a>(hosts: impl IntoIterator<Item = &'a crate::policy::ForwardedHost>) {
    let _ = FORWARDED.set(hosts.into_iter().map(forwarded_line).collect());
}

/// `github.com through 127.0.0.1:15110 (github; write: octo/hello)`.
fn forwarded_line(host: &crate::policy::ForwardedHost) -> String {
    let s = &host.settings;
    let list = |what: &str, items: Vec<&String>| {
        let items: Vec<&str> = items.iter().map(|i| i.as_str()).collect();
        format!("{what}: {}", if items.is_empty() { "none".to_string() } else { items.join(", ") })
    };
    let what = match host.part {
        Some(crate::policy::forward::Part::Npm) => list("publish", s.publish.iter().collect()),
        Some(_) => list("write", s.write.iter().collect()),
        None => format!("allow: {} rules", s.allow.len()),
    };
    format!("{} through 127.0.0.1:{} ({}; {what})", host.host, host.port, host.service)
}

fn render_text(report: &Report, addresses_error: Option<String>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let status = &report.status;
    let _ = writeln!(out, "firewall: {}, ipv6 {}", status.firewall, if status.ipv6 { "on" } else { "off" });
    let _ = writeln!(out, "policy files: {}", status.files.join(", "));
    let _ = writeln!(
        out,
        "services: {}",
        if status.services.is_empty() { "none".into() } else { status.services.join(", ") }
    );
    let _ = writeln!(out, "domains ({}):", status.domains.len());
    for domain in status.domains.iter().take(SHOWN_DOMAINS) {
        let _ = writeln!(out, "  {domain}");
    }
    if status.domains.len() > SHOWN_DOMAINS {
        let _ = writeln!(out, "  … and {} more", status.domains.len() - SHOWN_DOMAINS);
    }
    let _ = writeln!(out, "forwarded ({}):", status.forwarded.len());
    for forwarded in &status.forwarded {
        let _ = writeln!(out, "  {forwarded}");
    }
    let _ = writeln!(out, "cidrs ({}):", status.cidrs.len());
    for cidr in &status.cidrs {
        let _ = writeln!(out, "  {cidr}");
    }
    let _ = writeln!(out, "upstream resolvers: {}", status.upstreams.join(", "));
    let inbound: Vec<String> = status.inbound.iter().map(u16::to_string).collect();
    let _ = writeln!(
        out,
        "inbound tcp ports: {}",
        if inbound.is_empty() { "none".into() } else { inbound.join(", ") }
    );
    match (&report.addresses, addresses_error) {
        (Some(addresses), _) => {
            let _ = writeln!(out, "allowed addresses ({}):", addresses.len());
            for address in addresses {
                let _ = writeln!(out, "  {}  expires in {} s", address.element, address.expires_in);
            }
        }
        (None, Some(e)) if status.firewall == "on" => {
            let _ = writeln!(out, "allowed addresses: cannot list them: {e}");
        }
        (None, _) => {}
    }
    let _ = writeln!(out, "recent denials:");
    for line in &report.denials {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "recent connections:");
    for c in &report.connections {
        let name = c.name.as_deref().unwrap_or("-");
        let bytes = match (c.bytes_up, c.bytes_down, c.ms) {
            (Some(up), Some(down), Some(ms)) => format!(", {up} B up, {down} B down, {ms} ms"),
            _ => String::new(),
        };
        let repeats = c.repeats.map(|n| format!(" (and {n} more)")).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {} {:7} {} {name} ({}:{}) via {}: {}{bytes}{repeats}",
            c.time, c.verdict, c.protocol, c.address, c.port, c.via, c.reason
        );
    }
    let _ = writeln!(out, "connections per name (allowed / refused, bytes up / down):");
    for (name, t) in &report.totals {
        let _ = writeln!(out, "  {name}: {} / {}, {} / {}", t.allowed, t.refused, t.bytes_up, t.bytes_down);
    }
    out
}

fn last_lines(path: &Path, count: usize) -> Vec<String> {
    let Ok(file) = std::fs::File::open(path) else { return Vec::new() };
    let mut lines = std::collections::VecDeque::with_capacity(count + 1);
    for line in BufReader::new(file).lines().map_while(Result::ok) {
        lines.push_back(line);
        if lines.len() > count {
            lines.pop_front();
        }
    }
    lines.into()
}
