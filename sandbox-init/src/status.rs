//! `sandbox-status`: the policy in force (written by PID 1 at start and on reload), the
//! addresses the DNS gate has allowed with their remaining time, and the last denials.

use std::io::{BufRead as _, BufReader};
use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::denials::DENIAL_LOG;
use crate::net::firewall::{FirewallMode, Nft};
use crate::policy::Policy;

pub const STATUS_FILE: &str = "/run/agent-sandbox/status.json";
const SHOWN_DOMAINS: usize = 40;
const SHOWN_DENIALS: usize = 10;

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
        }
    }
}

pub fn write(status: &Status) {
    let text = serde_json::to_string_pretty(status).unwrap_or_default();
    let tmp = format!("{STATUS_FILE}.tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, STATUS_FILE)) {
        eprintln!("sandbox-init: cannot write {STATUS_FILE}: {e}");
    }
}

/// Prints the status; 1 if sandbox-init has not written one (it is not running, or not ready).
pub fn show() -> u8 {
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
    println!("firewall: {}, ipv6 {}", status.firewall, if status.ipv6 { "on" } else { "off" });
    println!("policy files: {}", status.files.join(", "));
    println!(
        "services: {}",
        if status.services.is_empty() { "none".into() } else { status.services.join(", ") }
    );
    println!("domains ({}):", status.domains.len());
    for domain in status.domains.iter().take(SHOWN_DOMAINS) {
        println!("  {domain}");
    }
    if status.domains.len() > SHOWN_DOMAINS {
        println!("  … and {} more", status.domains.len() - SHOWN_DOMAINS);
    }
    println!("cidrs ({}):", status.cidrs.len());
    for cidr in &status.cidrs {
        println!("  {cidr}");
    }
    println!("upstream resolvers: {}", status.upstreams.join(", "));
    let inbound: Vec<String> = status.inbound.iter().map(u16::to_string).collect();
    println!("inbound tcp ports: {}", if inbound.is_empty() { "none".into() } else { inbound.join(", ") });
    if status.firewall == "on" {
        match Nft::find().and_then(|nft| nft.list_elements()) {
            Ok(elements) => {
                println!("allowed addresses ({}):", elements.len());
                for (element, remaining) in elements {
                    println!("  {element}  expires in {} s", remaining.as_secs());
                }
            }
            Err(e) => println!("allowed addresses: cannot list them: {e}"),
        }
    }
    println!("recent denials:");
    for line in last_lines(Path::new(DENIAL_LOG), SHOWN_DENIALS) {
        println!("  {line}");
    }
    0
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
