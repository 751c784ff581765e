//! The egress firewall: one nftables table of our own (`inet`, so IPv4 and IPv6 together),
//! rendered from the policy and loaded by `nft -f -` in one atomic transaction. Other tables,
//! Docker's DNS NAT rules among them, are never flushed or touched.
//!
//! Below it, what else speaks to the kernel's netfilter: the gate's set elements written over
//! netlink (`setelems`), the connections a reload revokes cut (`conntrack`), rejected packets read
//! for the denial log (`nflog`), and the netlink framing the three share (`netlink`); and the
//! table's shape, which the health check compares with the kernel's (`shape`).

pub mod conntrack;
pub mod netlink;
pub mod nflog;
pub mod setelems;
pub mod shape;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::exit::{Fatal, Refusal};
use crate::net::uids::{FORWARDER_UID, GATE_UID};
use crate::policy::{Access, Opening, Policy, Ports};
use crate::process;

pub const TABLE: &str = "agent_sandbox";
/// Docker's embedded DNS server on user-defined networks: reachable only by root (the DNS gate),
/// or the agent could resolve any name around the gate.
pub const DOCKER_DNS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 11);
/// The nflog group the final rules log rejected packets to, for the denial log.
pub const NFLOG_GROUP: u16 = 3074;
/// Set timeouts have a floor, so short-TTL answers do not expire under a connection being set
/// up, and a ceiling, so one answer cannot allow an address for ever.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// The connection-tracking mark of every connection the policy let out (a set or a CIDR): a
/// reload finds them by it and cuts those the new policy no longer allows.
pub const EGRESS_MARK: u32 = 0x0a5b_0001;
/// The connection mark of what the policy's `inbound` ports let in: a reload that closes the
/// port cuts them.
pub const INBOUND_MARK: u32 = 0x0a5b_0002;
/// The most elements (address, protocol, port) the sets hold unless SANDBOX_MAX_ADDRESSES says
/// otherwise: a full set refuses the next name instead of growing without bound.
pub const DEFAULT_SET_SIZE: usize = 65_536;

/// SANDBOX_FIREWALL: `on` (the default), or one of the two loudly warned opt-outs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirewallMode {
    On,
    Off,
    Open,
}

impl FirewallMode {
    pub fn from_env() -> Result<FirewallMode, Fatal> {
        match std::env::var(crate::policy::layout::FIREWALL_ENV).as_deref() {
            Err(_) | Ok("" | "on") => Ok(FirewallMode::On),
            Ok("off") => Ok(FirewallMode::Off),
            Ok("open") => Ok(FirewallMode::Open),
            Ok(other) => Err(Fatal::new(
                Refusal::BadSetting,
                format!("SANDBOX_FIREWALL={other} is not one of on, off, open"),
            )),
        }
    }
}

/// The variable that bounds the address sets.
pub use crate::policy::layout::MAX_ADDRESSES_ENV;

/// SANDBOX_MAX_ADDRESSES: how many (address, protocol, port) elements the sets may hold.
pub fn max_addresses() -> Result<usize, Fatal> {
    match std::env::var(MAX_ADDRESSES_ENV).as_deref() {
        Err(_) | Ok("") => Ok(DEFAULT_SET_SIZE),
        Ok(text) => match text.parse::<usize>() {
            Ok(n) if (1..=1 << 20).contains(&n) => Ok(n),
            _ => Err(Fatal::new(
                Refusal::BadSetting,
                format!("{MAX_ADDRESSES_ENV}={text} is not a number from 1 to 1048576"),
            )),
        },
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("nft is not installed (looked in {0}): the firewall cannot be programmed")]
    NftMissing(String),
    #[error("cannot run {nft}: {source}")]
    NftFailed {
        nft: String,
        #[source]
        source: std::io::Error,
    },
    #[error("nft rejected the ruleset: {0}")]
    Rejected(String),
    #[error("the firewall read back from the kernel is not the one loaded: {0}")]
    Mismatch(String),
}

/// What identifies an element of the sets.
pub type ElementKey = (IpAddr, Opening, u16);

/// An allowed (address, opening, port) with the time it stays allowed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    pub addr: IpAddr,
    pub opening: Opening,
    pub port: u16,
    pub timeout: Duration,
}

impl Element {
    /// Everything `access` opens on `addr`, for a DNS answer with `ttl` seconds.
    pub fn for_answer(addr: IpAddr, access: &Access, ttl: u32) -> impl Iterator<Item = Element> + '_ {
        let timeout = Duration::from_secs(ttl.into()).clamp(MIN_TIMEOUT, MAX_TIMEOUT);
        access.openings().map(move |(opening, port)| Element { addr, opening, port, timeout })
    }

    pub fn key(&self) -> ElementKey {
        (self.addr, self.opening, self.port)
    }

    pub fn set(&self) -> String {
        set_name(self.opening, self.addr.is_ipv4())
    }

    fn render_key(&self) -> String {
        format!("{} . {}", self.addr, self.port)
    }
}

/// `checked_v4`, `opaque_v6`, …: one set per opening and family.
fn set_name(opening: Opening, ipv4: bool) -> String {
    format!("{}_{}", opening.name(), if ipv4 { "v4" } else { "v6" })
}

const OPENINGS: [Opening; 3] = [Opening::Checked, Opening::Opaque, Opening::Udp];

/// The name check: the agent's TCP to allowed addresses is redirected to the checker, which
/// alone connects onwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameCheck {
    /// The checker's uid: its connections are neither redirected nor refused.
    pub uid: u32,
    /// Where connections to `checked` elements go: the name on the wire is checked.
    pub check_port: u16,
    /// Where connections to `opaque` elements and static ranges go: logged, passed on.
    pub pass_port: u16,
    /// Where the key forwarder's connections to `checked` elements go: checked, and known to
    /// be the forwarder's, since nft chose the port by the socket's uid.
    pub forwarder_port: u16,
}

/// Whom the rules trust with DNS: in one container, root, which nothing of the agent's can become
/// (no setuid program, no_new_privs), and Docker's embedded DNS, which forwards as root from
/// inside the namespace. In sidecar mode uid 0 may be the agent's (gVisor's sentry sends as root
/// whatever the agent's uid, and an agent container may be run as root), so only the gate's own
/// uid is trusted, and Docker's DNS is not an upstream at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Shape {
    #[default]
    Single,
    Sidecar,
}

impl Shape {
    /// The uid whose sockets may query the upstreams and send from port 53.
    pub fn gate_uid(self) -> u32 {
        match self {
            Shape::Single => 0,
            Shape::Sidecar => GATE_UID,
        }
    }
}

/// What the ruleset is made from: the policy, the upstream resolvers only the DNS gate may
/// query, and dynamic elements to carry over (on reload).
pub struct Ruleset<'a> {
    pub policy: &'a Policy,
    pub upstreams: &'a [IpAddr],
    pub elements: &'a [Element],
    /// Whether rejected packets go to nflog for the denial log. Off only where the kernel has
    /// no nflog backend (the rule would make the whole table fail to load).
    pub log: bool,
    /// The most elements each set holds.
    pub set_size: usize,
    /// None: the sets admit any process (`SANDBOX_NAME_CHECK=off`).
    pub name_check: Option<NameCheck>,
    pub shape: Shape,
    /// A model server of the user's: its address and port, which the key forwarder alone
    /// reaches (the forwarder sends it the model's endpoints alone).
    pub model_server: Option<std::net::SocketAddr>,
}

impl Ruleset<'_> {
    /// The nft script that replaces our table atomically: creating it first makes the delete
    /// valid on the first run, and the whole file is one transaction.
    pub fn render(&self) -> String {
        format!("table inet {TABLE}\ndelete table inet {TABLE}\n{}", self.table())
    }

    /// The nft script that creates our table where there is none, one transaction that fails
    /// whole where there is one (`create`). It spares a new network namespace the delete, whose
    /// commit waits out an RCU grace period: 10.6 ms against 5.7 ms for `nft -f` of the same
    /// table in a new container (2 cores).
    pub fn render_created(&self) -> String {
        format!("create table inet {TABLE}\n{}", self.table())
    }

    /// The table's block and its carried-over elements.
    fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "table inet {TABLE} {{");
        for opening in OPENINGS {
            for (ipv4, family) in [(true, "ipv4_addr"), (false, "ipv6_addr")] {
                let _ = writeln!(
                    s,
                    "\tset {} {{\n\t\ttype {family} . inet_service\n\t\tflags timeout\n\t\tsize {}\n\t}}",
                    set_name(opening, ipv4),
                    self.set_size
                );
            }
        }
        let mut chains = vec![
            ("output", "filter hook output priority filter", self.rules()),
            ("input", "filter hook input priority filter", self.input_rules()),
        ];
        if self.name_check.is_some() {
            chains.push(("to_checker", "nat hook output priority dstnat", self.redirect_rules()));
        }
        for (chain, hook, rules) in chains {
            let policy = if chain == "to_checker" { "accept" } else { "drop" };
            let _ = writeln!(s, "\tchain {chain} {{\n\t\ttype {hook}; policy {policy};");
            for rule in rules {
                let _ = writeln!(s, "\t\t{rule}");
            }
            s.push_str("\t}\n");
        }
        s.push_str("}\n");
        // The table is new: carried-over elements are simply created.
        s.push_str(&create_elements(self.elements));
        s
    }

    /// The output chain's rules, in order.
    pub fn rules(&self) -> Vec<String> {
        let gate = self.shape.gate_uid();
        let mut rules = vec![
            // First, before replies are accepted as such: nothing but the gate (root, in one
            // container) sends from port 53, so no packet of the agent can pose as a resolver's
            // answer, not even as the reply side of a connection-tracking entry it planted (the
            // gate's next query would then skip Docker's DNAT and land on the agent's socket).
            format!("meta skuid != {gate} meta l4proto {{ tcp, udp }} th sport 53 drop"),
            "ct state established,related accept".to_string(),
            "ct state invalid drop".to_string(),
        ];
        // The user's model server: the forwarder's connections alone, to its one address and
        // port, before the forwarder's refusal of every port but 53 and 443.
        rules.extend(self.model_server.map(|server| {
            let family = if server.is_ipv4() { "ip" } else { "ip6" };
            format!(
                "meta skuid {FORWARDER_UID} {family} daddr {} tcp dport {} accept",
                server.ip(),
                server.port()
            )
        }));
        rules.extend([
            // The key forwarder speaks HTTPS to its API and asks the DNS gate; nothing else, on
            // any address (its connections are name-checked like every other), but the user's
            // model server (above). By the original port: a connection redirected to the
            // checker shows the checker's port here.
            format!(
                "meta skuid {FORWARDER_UID} meta l4proto tcp ct original proto-dst != {{ 53, 443 }} reject with tcp reset"
            ),
            format!(
                "meta skuid {FORWARDER_UID} meta l4proto != tcp th dport != 53 reject with icmpx admin-prohibited"
            ),
            // IPv6 needs neighbour discovery to reach even allowed hosts on the local network
            // (duplicate address detection sends from `::`, so this comes before the next rule).
            "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept".into(),
            // The kernel's own multicast listener reports when an interface comes up: nothing
            // of the agent's, and nothing to log in every IPv6 sandbox's denials. Dropped.
            "ip6 daddr ff02::/16 icmpv6 type { mld-listener-report, mld-listener-done, mld2-listener-report } drop"
                .into(),
            // A packet of this host leaves from an address of this host. IPv6 lets any user send
            // from another (IPV6_FREEBIND); over loopback such a packet would plant a
            // connection-tracking entry whose "reply" side then leaves as established, and a
            // reject would carry it to the forged address inside the ICMP error. Dropped, silently.
            "fib saddr type != local drop".into(),
            // Before the loopback accept: Docker's DNS is on loopback, and it answers any name.
            format!("ip daddr {DOCKER_DNS} meta skuid != {gate} reject with icmpx admin-prohibited"),
            // Loopback is this host talking to itself. A socket bound to `lo` (SO_BINDTODEVICE,
            // open to any user) can route a packet for a foreign address there: its entry would
            // let that address's datagrams in as replies.
            "oifname \"lo\" fib daddr type local accept".to_string(),
            "oifname \"lo\" drop".to_string(),
        ]);
        if let Some(check) = self.name_check {
            // Connections the nat chain redirected to the checker: this hook still sees the
            // device they were routed to before, so they are known by their new destination.
            let ports = format!("{{ {}, {}, {} }}", check.check_port, check.pass_port, check.forwarder_port);
            rules.push(format!("ip daddr 127.0.0.1 tcp dport {ports} accept"));
            rules.push(format!("ip6 daddr ::1 tcp dport {ports} accept"));
        }
        for upstream in self.upstreams.iter().filter(|a| !a.is_loopback()) {
            let family = if upstream.is_ipv4() { "ip" } else { "ip6" };
            rules.push(format!("meta skuid {gate} {family} daddr {upstream} th dport 53 accept"));
        }
        if self.shape == Shape::Single && self.upstreams.contains(&IpAddr::V4(DOCKER_DNS)) {
            // Docker's embedded DNS forwards names it does not know to the host's resolvers
            // from inside this network namespace, as root; which resolvers, only the host knows.
            rules.push("meta skuid 0 meta l4proto { tcp, udp } th dport 53 accept".into());
        }
        let mark = format!("ct mark set {EGRESS_MARK:#010x} accept");
        // With the name check, TCP to allowed addresses leaves only from the checker: any other
        // process's connection there was redirected to it, or is refused below.
        let tcp_from = self.name_check.map(|c| format!("meta skuid {} ", c.uid)).unwrap_or_default();
        for (opening, proto, from) in [
            (Opening::Checked, "tcp", &tcp_from),
            (Opening::Opaque, "tcp", &tcp_from),
            (Opening::Udp, "udp", &String::new()),
        ] {
            for (ipv4, family) in [(true, "ip"), (false, "ip6")] {
                let set = set_name(opening, ipv4);
                rules.push(format!("{from}{family} daddr . {proto} dport @{set} {mark}"));
            }
        }
        for (net, ports) in &self.policy.cidrs {
            let family = if net.addr().is_ipv4() { "ip" } else { "ip6" };
            let ports = port_set(ports);
            rules.push(format!("{tcp_from}{family} daddr {net} tcp dport {ports} {mark}"));
            rules.push(format!("{family} daddr {net} udp dport {ports} {mark}"));
        }
        if self.log {
            rules.push(format!("log group {NFLOG_GROUP}"));
        }
        // Reject, not drop: a blocked connection fails at once instead of hanging.
        rules.push("meta l4proto tcp reject with tcp reset".into());
        rules.push("reject with icmpx admin-prohibited".into());
        rules
    }

    /// The nat chain of the name check: every TCP connection to an allowed address, but the
    /// checker's own, goes to the checker instead; to `checked` elements on the port that checks
    /// the name, to the rest on the port that passes them on.
    pub fn redirect_rules(&self) -> Vec<String> {
        let Some(check) = self.name_check else { return Vec::new() };
        let mut rules = vec![format!("meta skuid {} return", check.uid)];
        for (ipv4, family) in [(true, "ip"), (false, "ip6")] {
            let set = set_name(Opening::Checked, ipv4);
            rules.push(format!(
                "meta skuid {FORWARDER_UID} {family} daddr . tcp dport @{set} redirect to :{}",
                check.forwarder_port
            ));
        }
        for (opening, port) in [(Opening::Checked, check.check_port), (Opening::Opaque, check.pass_port)] {
            for (ipv4, family) in [(true, "ip"), (false, "ip6")] {
                let set = set_name(opening, ipv4);
                rules.push(format!("{family} daddr . tcp dport @{set} redirect to :{port}"));
            }
        }
        for (net, ports) in &self.policy.cidrs {
            let family = if net.addr().is_ipv4() { "ip" } else { "ip6" };
            rules.push(format!(
                "{family} daddr {net} tcp dport {} redirect to :{}",
                port_set(ports),
                check.pass_port
            ));
        }
        rules
    }

    /// The input chain's rules: nothing reaches a listener of the agent from outside but the
    /// ports the policy opens (`inbound`); loopback, and replies to the container's own
    /// connections, pass.
    pub fn input_rules(&self) -> Vec<String> {
        let mut rules = vec![
            "ct state established,related accept".to_string(),
            "ct state invalid drop".to_string(),
            "iifname \"lo\" accept".to_string(),
            // Without neighbour discovery no IPv6 peer could even answer us.
            "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-advert } accept".to_string(),
        ];
        if !self.policy.inbound.is_empty() {
            rules.push(format!(
                "tcp dport {} ct mark set {INBOUND_MARK:#010x} accept",
                port_set(&self.policy.inbound)
            ));
        }
        rules.push("meta l4proto tcp reject with tcp reset".into());
        rules.push("reject with icmpx admin-prohibited".into());
        rules
    }
}

fn port_set(ports: &Ports) -> String {
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!("{{ {} }}", list.join(", "))
}

/// Adds elements; an element already present gets the new timeout. `add` alone keeps an
/// existing element's old timeout on older kernels, so each is added, deleted and added again,
/// all in one transaction: no moment exists in which it is missing.
pub fn add_elements(elements: &[Element]) -> String {
    let mut by_set: BTreeMap<String, Vec<&Element>> = BTreeMap::new();
    for element in elements {
        by_set.entry(element.set()).or_default().push(element);
    }
    let mut s = String::new();
    for (set, elements) in by_set {
        let keys: Vec<String> = elements.iter().map(|e| e.render_key()).collect();
        let timed: Vec<String> =
            elements.iter().map(|e| format!("{} timeout {}s", e.render_key(), e.timeout.as_secs())).collect();
        let _ = writeln!(s, "add element inet {TABLE} {set} {{ {} }}", keys.join(", "));
        let _ = writeln!(s, "delete element inet {TABLE} {set} {{ {} }}", keys.join(", "));
        let _ = writeln!(s, "add element inet {TABLE} {set} {{ {} }}", timed.join(", "));
    }
    s
}

/// Adds elements that are not in the set yet, with their timeouts.
pub fn create_elements(elements: &[Element]) -> String {
    let mut by_set: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in elements {
        by_set.entry(e.set()).or_default().push(format!(
            "{} timeout {}s",
            e.render_key(),
            e.timeout.as_secs()
        ));
    }
    by_set
        .into_iter()
        .map(|(set, items)| format!("add element inet {TABLE} {set} {{ {} }}\n", items.join(", ")))
        .collect()
}

/// The start's probe of the name check opens `target:port` for a moment: the element, and the
/// script that removes it again.
pub fn probe_element(target: IpAddr, port: u16) -> (String, String) {
    let set = set_name(Opening::Checked, target.is_ipv4());
    (
        format!("add element inet {TABLE} {set} {{ {target} . {port} timeout 30s }}\n"),
        format!("delete element inet {TABLE} {set} {{ {target} . {port} }}\n"),
    )
}

/// What loads an nft script as one transaction: the real `nft`, or a recording in tests.
pub trait NftApply {
    fn apply(&self, script: &str) -> Result<(), FirewallError>;
}

impl NftApply for Nft {
    fn apply(&self, script: &str) -> Result<(), FirewallError> {
        Nft::apply(self, script)
    }
}

/// The `nft` program.
#[derive(Clone, Debug)]
pub struct Nft {
    path: PathBuf,
}

const NFT_PATHS: &[&str] = &["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"];

impl Nft {
    /// The program at `path` in nft's place, for tests of what is decided around it.
    #[cfg(test)]
    pub fn at(path: &std::path::Path) -> Nft {
        Nft { path: path.to_path_buf() }
    }

    pub fn find() -> Result<Nft, FirewallError> {
        NFT_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .map(|p| Nft { path: p.to_path_buf() })
            .ok_or_else(|| FirewallError::NftMissing(NFT_PATHS.join(", ")))
    }

    /// Runs a script as one transaction.
    pub fn apply(&self, script: &str) -> Result<(), FirewallError> {
        let output = self.run(&["-f", "-"], Some(script.as_bytes()))?;
        if !output.status.success() {
            return Err(FirewallError::Rejected(String::from_utf8_lossy(&output.stderr).trim().to_string()));
        }
        Ok(())
    }

    /// The table as the kernel holds it, in nft's JSON.
    pub fn read_table(&self) -> Result<serde_json::Value, FirewallError> {
        self.list_table(&["-j", "list", "table", "inet", TABLE])
    }

    /// The table without its sets' contents (`nft -t`), for `sandbox-status --health`: cheap
    /// however many addresses are open.
    pub fn read_table_terse(&self) -> Result<serde_json::Value, FirewallError> {
        self.list_table(&["-j", "-t", "list", "table", "inet", TABLE])
    }

    fn list_table(&self, args: &[&str]) -> Result<serde_json::Value, FirewallError> {
        let output = self.run(args, None)?;
        if !output.status.success() {
            return Err(FirewallError::Mismatch(String::from_utf8_lossy(&output.stderr).trim().to_string()));
        }
        serde_json::from_slice(&output.stdout)
            .map_err(|e| FirewallError::Mismatch(format!("unreadable JSON: {e}")))
    }

    /// The dynamic elements with their remaining time, for `sandbox-status`.
    pub fn list_elements(&self) -> Result<Vec<(String, Duration)>, FirewallError> {
        let table = self.read_table()?;
        let mut elements = Vec::new();
        for item in table["nftables"].as_array().into_iter().flatten() {
            for element in item["set"]["elem"].as_array().into_iter().flatten() {
                let entry = &element["elem"];
                let concat = entry["val"]["concat"].as_array();
                let key: Vec<String> = concat
                    .into_iter()
                    .flatten()
                    .map(|v| v.to_string().trim_matches('"').to_string())
                    .collect();
                let expires = entry["expires"].as_u64().unwrap_or(0);
                // `checked 203.0.113.7 port 443`, after the set's opening
                let opening =
                    item["set"]["name"].as_str().unwrap_or_default().split('_').next().unwrap_or_default();
                let shown = match &key[..] {
                    [addr, port] => format!("{opening} {addr} port {port}"),
                    other => other.join(" "),
                };
                elements.push((shown, Duration::from_secs(expires)));
            }
        }
        Ok(elements)
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<std::process::Output, FirewallError> {
        let mut command = std::process::Command::new(&self.path);
        command.args(args);
        process::output(&mut command, stdin)
            .map_err(|source| FirewallError::NftFailed { nft: self.path.display().to_string(), source })
    }
}

/// Checks that the kernel's table is the one rendered: the output chain hooked with policy drop,
/// both sets, and every rule present.
pub fn verify_table(table: &serde_json::Value, ruleset: &Ruleset) -> Result<(), FirewallError> {
    let items = table["nftables"].as_array().ok_or_else(|| FirewallError::Mismatch("no table".into()))?;
    let mut chains = vec![
        ("output", "output", "drop", ruleset.rules().len()),
        ("input", "input", "drop", ruleset.input_rules().len()),
    ];
    if ruleset.name_check.is_some() {
        chains.push(("to_checker", "output", "accept", ruleset.redirect_rules().len()));
    }
    for (name, hook, policy, expected) in chains {
        let chain = items
            .iter()
            .map(|i| &i["chain"])
            .find(|c| c["name"] == name)
            .ok_or_else(|| FirewallError::Mismatch(format!("the {name} chain is missing")))?;
        if chain["hook"] != hook || chain["policy"] != policy {
            return Err(FirewallError::Mismatch(format!(
                "the {name} chain is not hooked to {hook} with policy {policy}: {chain}"
            )));
        }
        let rules = items.iter().filter(|i| i["rule"]["chain"] == name).count();
        if rules != expected {
            return Err(FirewallError::Mismatch(format!(
                "{rules} rules in the {name} chain, {expected} expected"
            )));
        }
    }
    for set in OPENINGS.into_iter().flat_map(|o| [set_name(o, true), set_name(o, false)]) {
        if !items.iter().any(|i| i["set"]["name"] == set) {
            return Err(FirewallError::Mismatch(format!("set {set} is missing")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_policy() -> Policy {
        Policy::from_yaml(
            Path::new("sample.yaml"),
            "version: 1\ndomains:\n  - api.example.com\n  - domain: media.example.com\n    udp: [3478]\n  - domain: git.example.com\n    ports: [443]\n    opaque: [22]\ncidrs:\n  - 10.20.0.0/16\n  - cidr: fd00:1234::/32\n    ports: [8080, 11434]\ninbound: [3000]\n",
        )
        .unwrap()
    }

    const CHECK: NameCheck =
        NameCheck { uid: 65533, check_port: 15001, pass_port: 15002, forwarder_port: 15003 };

    fn ruleset<'a>(policy: &'a Policy, upstreams: &'a [IpAddr], elements: &'a [Element]) -> Ruleset<'a> {
        Ruleset {
            policy,
            upstreams,
            elements,
            log: true,
            set_size: 1024,
            name_check: Some(CHECK),
            shape: Shape::Single,
            model_server: None,
        }
    }

    #[test]
    fn a_model_server_is_the_forwarders_alone_before_its_refusal_of_other_ports() {
        let policy = sample_policy();
        let ruleset = Ruleset {
            model_server: Some("192.168.1.20:11434".parse().unwrap()),
            ..ruleset(&policy, &[], &[])
        };
        let rules = ruleset.rules();
        let opened = rules
            .iter()
            .position(|r| {
                r == &format!("meta skuid {FORWARDER_UID} ip daddr 192.168.1.20 tcp dport 11434 accept")
            })
            .expect("the forwarder's rule for the server");
        let refused = rules
            .iter()
            .position(|r| r.starts_with(&format!("meta skuid {FORWARDER_UID} meta l4proto tcp")))
            .expect("the forwarder's refusal");
        assert!(opened < refused, "{rules:#?}");
        // No other uid's rule names the address.
        assert_eq!(rules.iter().filter(|r| r.contains("192.168.1.20")).count(), 1, "{rules:#?}");
        assert!(!ruleset.redirect_rules().iter().any(|r| r.contains("192.168.1.20")));
    }

    #[test]
    fn the_ruleset_for_a_sample_policy() {
        let policy = sample_policy();
        let upstreams = ["127.0.0.11".parse().unwrap(), "192.168.65.7".parse().unwrap()];
        let elements = [Element {
            addr: "203.0.113.9".parse().unwrap(),
            opening: Opening::Checked,
            port: 443,
            timeout: Duration::from_secs(75),
        }];
        insta::assert_snapshot!("sample_ruleset", ruleset(&policy, &upstreams, &elements).render());
    }

    #[test]
    fn with_the_name_check_only_the_checker_connects_to_allowed_addresses_by_tcp() {
        let policy = sample_policy();
        let checked = ruleset(&policy, &[], &[]);
        let tcp: Vec<String> = checked
            .rules()
            .into_iter()
            .filter(|r| r.contains(" tcp dport ") && !r.contains("127.0.0.1") && !r.contains("::1"))
            .collect();
        assert!(!tcp.is_empty() && tcp.iter().all(|r| r.starts_with("meta skuid 65533 ")), "{tcp:#?}");
        let redirect = checked.redirect_rules();
        assert_eq!(redirect[0], "meta skuid 65533 return", "the checker's own connections go out");
        assert!(redirect.contains(&"ip daddr . tcp dport @checked_v4 redirect to :15001".to_string()));
        assert!(redirect.contains(&"ip6 daddr . tcp dport @opaque_v6 redirect to :15002".to_string()));
        let off = Ruleset { name_check: None, ..checked };
        assert!(off.redirect_rules().is_empty() && !off.render().contains("chain to_checker"));
        assert!(off.rules().iter().any(|r| r.starts_with("ip daddr . tcp dport @checked_v4")));
    }

    #[test]
    fn the_agent_never_sends_from_port_53_and_that_comes_before_any_accept() {
        let policy = sample_policy();
        let rules = ruleset(&policy, &[], &[]).rules();
        assert_eq!(rules[0], "meta skuid != 0 meta l4proto { tcp, udp } th sport 53 drop");
        assert!(rules[1..].iter().all(|r| !r.contains("sport")), "{rules:?}");
    }

    /// In sidecar mode uid 0 may be the agent's: no rule trusts it, the gate's uid has port 53,
    /// and Docker's DNS (which forwards as root) is no upstream.
    #[test]
    fn in_sidecar_mode_no_rule_trusts_root_and_the_gates_uid_has_port_53() {
        let policy = sample_policy();
        let docker: [IpAddr; 2] = [IpAddr::V4(DOCKER_DNS), "10.0.0.2".parse().unwrap()];
        let single = ruleset(&policy, &docker, &[]);
        let single_rules = single.rules();
        assert!(
            single_rules.contains(&"meta skuid 0 meta l4proto { tcp, udp } th dport 53 accept".to_string())
        );
        let sidecar = Ruleset { shape: Shape::Sidecar, ..single };
        let rules = sidecar.rules();
        let trusts_root: Vec<_> =
            rules.iter().filter(|r| r.contains("skuid 0") || r.contains("skuid != 0")).collect();
        assert!(trusts_root.is_empty(), "{trusts_root:#?}");
        assert_eq!(rules[0], "meta skuid != 65531 meta l4proto { tcp, udp } th sport 53 drop");
        assert!(
            rules.contains(&"meta skuid 65531 ip daddr 10.0.0.2 th dport 53 accept".to_string()),
            "{rules:#?}"
        );
        assert!(rules.contains(
            &"ip daddr 127.0.0.11 meta skuid != 65531 reject with icmpx admin-prohibited".to_string()
        ));
        assert!(
            !rules.iter().any(|r| r.contains("th dport 53 accept") && !r.contains("skuid 65531")),
            "{rules:#?}"
        );
    }

    #[test]
    fn inbound_is_closed_but_for_the_policys_ports() {
        let policy = sample_policy();
        let rules = ruleset(&policy, &[], &[]).input_rules();
        assert!(rules.contains(&"tcp dport { 3000 } ct mark set 0x0a5b0002 accept".to_string()), "{rules:?}");
        let closed =
            Policy::from_yaml(Path::new("p.yaml"), "version: 1\ndomains: [a.example.com]\n").unwrap();
        let rules = ruleset(&closed, &[], &[]).input_rules();
        assert!(!rules.iter().any(|r| r.contains("dport")), "{rules:?}");
        assert_eq!(rules.last().unwrap(), "reject with icmpx admin-prohibited");
    }

    #[test]
    fn without_nflog_the_ruleset_has_no_log_rule_and_still_ends_in_rejects() {
        let policy = sample_policy();
        let logged = ruleset(&policy, &[], &[]);
        let quiet = Ruleset { log: false, ..logged };
        let rules = quiet.rules();
        assert!(!rules.iter().any(|r| r.starts_with("log ")), "{rules:?}");
        assert_eq!(rules.len() + 1, Ruleset { log: true, ..quiet }.rules().len());
        assert_eq!(
            &rules[rules.len() - 2..],
            ["meta l4proto tcp reject with tcp reset", "reject with icmpx admin-prohibited"]
        );
    }

    #[test]
    fn elements_are_tcp_unless_udp_is_asked_for_and_refreshed_per_family_in_one_script() {
        let web = Access::tcp([443, 8443].into());
        let mut elements: Vec<Element> =
            Element::for_answer("203.0.113.9".parse().unwrap(), &web, 5).collect();
        assert!(elements.iter().all(|e| e.opening == Opening::Checked), "{elements:?}");
        let media =
            Access { tcp: [443].into(), opaque: [22].into(), udp: [3478].into(), ..Access::default() };
        elements.extend(Element::for_answer("2001:db8::9".parse().unwrap(), &media, 90_000_000));
        assert_eq!(elements[0].timeout, MIN_TIMEOUT, "TTL floor");
        assert_eq!(elements[2].timeout, MAX_TIMEOUT, "TTL ceiling");
        assert_eq!((elements[3].opening, elements[4].opening), (Opening::Opaque, Opening::Udp));
        insta::assert_snapshot!("refresh_elements", add_elements(&elements));
        insta::assert_snapshot!("create_elements", create_elements(&elements));
    }

    #[test]
    fn the_read_back_check_fails_on_a_weakened_table() {
        let policy = sample_policy();
        let ruleset = ruleset(&policy, &[], &[]);
        let mut items = vec![
            serde_json::json!({"table": {"family": "inet", "name": TABLE}}),
            serde_json::json!({"chain": {"name": "output", "hook": "output", "policy": "drop"}}),
            serde_json::json!({"chain": {"name": "input", "hook": "input", "policy": "drop"}}),
            serde_json::json!({"chain": {"name": "to_checker", "hook": "output", "policy": "accept"}}),
        ];
        for opening in OPENINGS {
            for ipv4 in [true, false] {
                items.push(serde_json::json!({"set": {"name": set_name(opening, ipv4)}}));
            }
        }
        for _ in ruleset.rules() {
            items.push(serde_json::json!({"rule": {"chain": "output"}}));
        }
        for _ in ruleset.input_rules() {
            items.push(serde_json::json!({"rule": {"chain": "input"}}));
        }
        for _ in ruleset.redirect_rules() {
            items.push(serde_json::json!({"rule": {"chain": "to_checker"}}));
        }
        let table = serde_json::json!({ "nftables": items });
        verify_table(&table, &ruleset).unwrap();

        let mut open = table.clone();
        open["nftables"][1]["chain"]["policy"] = "accept".into();
        assert!(
            verify_table(&open, &ruleset).unwrap_err().to_string().contains("output chain is not hooked")
        );
        let mut inbound_open = table.clone();
        inbound_open["nftables"][2]["chain"]["policy"] = "accept".into();
        assert!(verify_table(&inbound_open, &ruleset).unwrap_err().to_string().contains("input chain"));
        let mut fewer = table.clone();
        fewer["nftables"].as_array_mut().unwrap().pop();
        assert!(
            verify_table(&fewer, &ruleset).unwrap_err().to_string().contains("rules in the to_checker chain")
        );
        let mut unchecked = table.clone();
        unchecked["nftables"].as_array_mut().unwrap().retain(|i| i["chain"]["name"] != "to_checker");
        let err = verify_table(&unchecked, &ruleset).unwrap_err().to_string();
        assert!(err.contains("the to_checker chain is missing"), "{err}");
    }
}
