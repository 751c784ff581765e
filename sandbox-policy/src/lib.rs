//! Policies: the allowlist format, its strict parsing (every error names file, line and column),
//! the built-in service bundles, and the merge of the baked policy with the user's drop-ins.
//! A crate of its own so that the build system (which scaffolds and checks policies) shares the
//! one definition with sandbox-init without compiling sandbox-init's DNS and netlink stack.
//!
//! Per-value checks live in `Deserialize` impls, so the YAML parser reports them at the value's
//! own line and column; only whole-file checks (an empty allowlist) are made after parsing.

pub mod apis;
pub mod layout;
pub mod terminal;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

pub use layout::{BAKED_POLICY, DROP_IN_DIR};
/// The ports a domain or CIDR entry allows when it names none.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// The service bundles, defined once in policies/services.yaml and compiled in, so `check` works
/// offline and every image agrees on what `github` means.
pub const SERVICES_YAML: &str = include_str!("../../policies/services.yaml");
const SERVICES_FILE: &str = "policies/services.yaml";

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file was read but is not a valid policy.
    #[error("{file}:{line}:{column}: {message}")]
    Invalid { file: String, line: usize, column: usize, message: String },
    /// The file could not be read at all.
    #[error("cannot read policy {file}: {source}")]
    Unreadable {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// A domain entry's name: one exact host, or every subdomain of one (`*.example.com`, which does
/// not match `example.com` itself). Stored lowercase, in punycode, without a trailing dot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DomainPattern {
    Exact(String),
    Subdomains(String),
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainPattern::Exact(name) => f.write_str(name),
            DomainPattern::Subdomains(name) => write!(f, "*.{name}"),
        }
    }
}

impl DomainPattern {
    /// Parses a domain as users write it: case-insensitive, an optional trailing dot, Unicode
    /// names mapped to punycode, and `*.` only as the first label.
    pub fn parse(input: &str) -> Result<DomainPattern, String> {
        if input.is_empty() {
            return Err("empty domain name".into());
        }
        if input.contains("://") {
            return Err(format!("`{input}` is a URL: write only its host name"));
        }
        if input.chars().any(char::is_whitespace) {
            return Err(format!("domain `{input}` contains whitespace"));
        }
        if input.contains('/') {
            return Err(format!("domain `{input}` contains `/`: address ranges go under `cidrs`"));
        }
        let (wildcard, rest) = match input.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, input),
        };
        if rest.contains('*') {
            return Err(format!(
                "wildcard in `{input}`: `*` is only allowed as a whole first label, as in `*.example.com`"
            ));
        }
        let rest = rest.strip_suffix('.').unwrap_or(rest);
        if rest.parse::<IpAddr>().is_ok() {
            return Err(format!("`{rest}` is an address, not a domain: list it under `cidrs`"));
        }
        // Also for ASCII input: it validates `xn--` labels.
        let ascii = idna::domain_to_ascii(rest)
            .map_err(|_| format!("`{input}` is not a valid internationalised domain name"))?;
        validate_labels(&ascii).map_err(|why| format!("invalid domain `{input}`: {why}"))?;
        if wildcard {
            if !ascii.contains('.') {
                return Err(format!("`{input}` would allow every name under a top-level domain"));
            }
            Ok(DomainPattern::Subdomains(ascii))
        } else {
            Ok(DomainPattern::Exact(ascii))
        }
    }
}

fn validate_labels(name: &str) -> Result<(), String> {
    if name.len() > 253 {
        return Err(format!("{} characters, more than the 253 DNS allows", name.len()));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > 63 {
            return Err(format!("label `{label}` is {} characters, more than 63", label.len()));
        }
        if let Some(bad) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-')) {
            return Err(format!("label `{label}` contains `{bad}`"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label `{label}` starts or ends with `-`"));
        }
    }
    let last = labels[labels.len() - 1];
    if labels.len() > 1 && last.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("top-level label `{last}` is numeric"));
    }
    Ok(())
}

/// A set of destination ports, never empty.
pub type Ports = BTreeSet<u16>;

/// What a domain entry opens on the addresses its name resolves to. TCP, with the name the
/// client speaks (TLS SNI, HTTP Host) checked before any byte reaches the server; TCP on the
/// address alone only on the `opaque` ports the policy names (SSH carries no name); UDP only
/// where the policy asks, since UDP (QUIC included) passes no check on the name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// TCP ports where the name on the wire is checked.
    pub tcp: Ports,
    /// TCP ports that pass on the address alone.
    pub opaque: Ports,
    pub udp: Ports,
    /// A TLS ClientHello with an encrypted_client_hello extension passes the name check. Off by
    /// default: its inner hello, which the check cannot read, names the site a front end that
    /// serves many (a CDN) picks, so its outer name says nothing of where it goes. The DNS gate
    /// empties HTTPS and SVCB answers, so a client learns no ECH configuration from it: one
    /// that sends ECH brought its own.
    pub ech: bool,
}

impl Access {
    /// Name-checked TCP on `ports`.
    pub fn tcp(ports: Ports) -> Access {
        Access { tcp: ports, ..Access::default() }
    }

    pub fn merge(&mut self, other: &Access) {
        self.tcp.extend(&other.tcp);
        self.opaque.extend(&other.opaque);
        self.udp.extend(&other.udp);
        self.ech |= other.ech;
    }

    /// Whether it opens `port` this way.
    pub fn opens(&self, opening: Opening, port: u16) -> bool {
        match opening {
            Opening::Checked => self.tcp.contains(&port),
            Opening::Opaque => self.opaque.contains(&port),
            Opening::Udp => self.udp.contains(&port),
        }
    }

    /// Whether a connection of `protocol` to `port` may pass, one way or another.
    pub fn allows(&self, protocol: Protocol, port: u16) -> bool {
        match protocol {
            Protocol::Tcp => self.tcp.contains(&port) || self.opaque.contains(&port),
            Protocol::Udp => self.udp.contains(&port),
        }
    }

    /// Every (opening, port) it opens.
    pub fn openings(&self) -> impl Iterator<Item = (Opening, u16)> + '_ {
        let checked = self.tcp.iter().map(|&p| (Opening::Checked, p));
        let opaque = self.opaque.iter().map(|&p| (Opening::Opaque, p));
        checked.chain(opaque).chain(self.udp.iter().map(|&p| (Opening::Udp, p)))
    }
}

impl fmt::Display for Access {
    /// `80,443`, or `80,443; opaque 22; udp 443`, or `udp 3478` alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |ports: &Ports| ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let mut parts = Vec::new();
        if !self.tcp.is_empty() {
            parts.push(list(&self.tcp));
        }
        if !self.opaque.is_empty() {
            parts.push(format!("opaque {}", list(&self.opaque)));
        }
        if !self.udp.is_empty() {
            parts.push(format!("udp {}", list(&self.udp)));
        }
        if self.ech {
            parts.push("ech".into());
        }
        f.write_str(&parts.join("; "))
    }
}

/// How a port is opened on an allowed name's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opening {
    /// TCP, the name on the wire checked first.
    Checked,
    /// TCP on the address alone.
    Opaque,
    Udp,
}

impl Opening {
    pub fn protocol(self) -> Protocol {
        match self {
            Opening::Checked | Opening::Opaque => Protocol::Tcp,
            Opening::Udp => Protocol::Udp,
        }
    }

    /// Its name in logs and in the firewall's set names.
    pub fn name(self) -> &'static str {
        match self {
            Opening::Checked => "checked",
            Opening::Opaque => "opaque",
            Opening::Udp => "udp",
        }
    }
}

/// A transport protocol the firewall opens ports for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// Its name in nft and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }

    /// Its IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        }
    }
}

fn parse_port(text: &str) -> Result<u16, String> {
    let value: u64 = text.trim().parse().map_err(|_| format!("`{text}` is not a port number"))?;
    port_in_range(value)
}

fn port_in_range(value: u64) -> Result<u16, String> {
    match u16::try_from(value) {
        Ok(port) if port != 0 => Ok(port),
        _ => Err(format!("port {value} is out of range (1-65535)")),
    }
}

/// `host`, `host:port` or `host:port,port`: the form of domain entries in YAML strings and
/// `.txt` lists.
pub fn parse_domain_with_ports(text: &str) -> Result<(DomainPattern, Ports), String> {
    if text.contains("://") {
        return Err(format!("`{text}` is a URL: write only its host name"));
    }
    match text.rsplit_once(':') {
        Some((host, ports)) if !host.contains(':') => {
            let ports = ports.split(',').map(parse_port).collect::<Result<Ports, _>>()?;
            Ok((DomainPattern::parse(host)?, ports))
        }
        Some(_) => Err(format!("`{text}` is not a domain (an IPv6 address belongs under `cidrs`)")),
        None => Ok((DomainPattern::parse(text)?, Ports::from(DEFAULT_PORTS))),
    }
}

/// One `domains` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainRule {
    pub pattern: DomainPattern,
    pub access: Access,
}

/// One `cidrs` entry: an address range and the ports allowed in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrRule {
    pub net: IpNet,
    pub ports: Ports,
}

fn parse_cidr(text: &str) -> Result<IpNet, String> {
    let net = match text.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match text.parse::<IpAddr>() {
            Ok(addr) => IpNet::from(addr),
            Err(_) => return Err(format!("`{text}` is not an address range (as in 10.0.0.0/8 or fd00::/8)")),
        },
    };
    if net.trunc() != net {
        return Err(format!("`{text}` has host bits set: did you mean {}?", net.trunc()));
    }
    Ok(net)
}

/// Ports as YAML writes them: a list of numbers, never empty.
struct PortList(Ports);

impl<'de> Deserialize<'de> for PortList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PortList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of port numbers, as in [443, 8443]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PortList, A::Error> {
                let mut ports = Ports::new();
                while let Some(port) = seq.next_element::<Port>()? {
                    ports.insert(port.0);
                }
                if ports.is_empty() {
                    return Err(de::Error::custom("empty port list: leave `ports` out for 80 and 443"));
                }
                Ok(PortList(ports))
            }
        }
        d.deserialize_seq(V)
    }
}

struct Port(u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a port number (1-65535)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Port, E> {
                port_in_range(v).map(Port).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Port, E> {
                Err(E::custom(format!("port {v} is out of range (1-65535)")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A mapping-form entry, `{<key>: …, ports: […]}` (and, for domains, `opaque: […]` and
/// `udp: […]`): the value of `key` parsed by `parse`, and what it opens. `ports` default to 80
/// and 443 when left out.
fn entry_with_ports<'de, A: MapAccess<'de>, T>(
    mut map: A,
    key: &'static str,
    domain: bool,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(T, Access), A::Error> {
    let (mut value, mut ports, mut access) = (None, None, Access::default());
    while let Some(name) = map.next_key::<String>()? {
        if name == key {
            let text: String = map.next_value()?;
            value = Some(parse(&text).map_err(de::Error::custom)?);
        } else if name == "ports" {
            ports = Some(map.next_value::<PortList>()?.0);
        } else if name == "opaque" && domain {
            access.opaque = map.next_value::<PortList>()?.0;
        } else if name == "udp" && domain {
            access.udp = map.next_value::<PortList>()?.0;
        } else if name == "ech" && domain {
            access.ech = map.next_value::<bool>()?;
        } else {
            let expected =
                if domain { format!("{key}, ports, opaque, udp, ech") } else { format!("{key}, ports") };
            return Err(de::Error::custom(format!("unknown key `{name}` (expected one of: {expected})")));
        }
    }
    let value = value.ok_or_else(|| de::Error::custom(format!("entry has `ports` but no `{key}`")))?;
    // Ports listed as opaque are opened for that alone, not also checked.
    access.tcp = match ports {
        Some(ports) => ports,
        None if access.opaque.is_empty() && access.udp.is_empty() => Ports::from(DEFAULT_PORTS),
        None => Ports::new(),
    };
    if let Some(port) = access.tcp.intersection(&access.opaque).next() {
        return Err(de::Error::custom(format!("port {port} is in both `ports` and `opaque`: choose one")));
    }
    if access.ech && access.tcp.is_empty() {
        return Err(de::Error::custom(
            "`ech` concerns the name check of `ports`, and this entry opens none".to_string(),
        ));
    }
    Ok((value, access))
}

impl<'de> Deserialize<'de> for DomainRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DomainRule;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a domain (`api.example.com`, `*.example.com`, `host:8443`) or {domain, ports}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DomainRule, E> {
                let (pattern, ports) = parse_domain_with_ports(v).map_err(E::custom)?;
                Ok(DomainRule { pattern, access: Access::tcp(ports) })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DomainRule, A::Error> {
                let (pattern, access) = entry_with_ports(map, "domain", true, DomainPattern::parse)?;
                Ok(DomainRule { pattern, access })
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for CidrRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CidrRule;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address range (`10.0.0.0/8`) or {cidr, ports}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CidrRule, E> {
                let net = parse_cidr(v).map_err(E::custom)?;
                Ok(CidrRule { net, ports: Ports::from(DEFAULT_PORTS) })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CidrRule, A::Error> {
                let (net, access) = entry_with_ports(map, "cidr", false, parse_cidr)?;
                let ports = access.tcp;
                Ok(CidrRule { net, ports })
            }
        }
        d.deserialize_any(V)
    }
}

/// `version: 1`, the only version this sandbox-init reads.
struct Version;

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let version = u64::deserialize(d)?;
        if version != 1 {
            return Err(de::Error::custom(format!(
                "unsupported policy version {version} (this sandbox-init reads version 1)"
            )));
        }
        Ok(Version)
    }
}

/// `allow: none`: the explicit way to say a policy allows nothing.
struct AllowNone;

impl<'de> Deserialize<'de> for AllowNone {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = String::deserialize(d)?;
        if value != "none" {
            return Err(de::Error::custom(format!("`allow` takes only `none`, not `{value}`")));
        }
        Ok(AllowNone)
    }
}

/// A service name, checked against the bundles.
struct ServiceRef(String);

impl<'de> Deserialize<'de> for ServiceRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        let services = services();
        if !services.contains_key(&name) {
            let known: Vec<&str> = services.keys().map(String::as_str).collect();
            return Err(de::Error::custom(format!("unknown service `{name}` (known: {})", known.join(", "))));
        }
        Ok(ServiceRef(name))
    }
}

/// What a model API's requests may ask of the provider, under `apis: {NAME: …}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Whether a request may name tools that make the provider's servers contact a URL the
    /// request gives (remote MCP servers, URL fetching), carrying what the agent put there.
    #[serde(default)]
    pub remote_tools: RemoteTools,
}

/// `remote_tools: refuse` (the default) or `allow`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteTools {
    #[default]
    Refuse,
    Allow,
}

/// The name of a model API of [`apis::APIS`], checked.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ApiName(String);

impl<'de> Deserialize<'de> for ApiName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if apis::api(&name).is_none() {
            let known: Vec<&str> = apis::APIS.iter().map(|a| a.name).collect();
            return Err(de::Error::custom(format!("unknown API `{name}` (known: {})", known.join(", "))));
        }
        Ok(ApiName(name))
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a policy: a mapping with `version: 1` and `domains`, `services` or `cidrs`"
)]
struct PolicyFile {
    #[allow(dead_code)]
    version: Version,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    domains: Vec<DomainRule>,
    #[serde(default)]
    services: Vec<ServiceRef>,
    #[serde(default)]
    cidrs: Vec<CidrRule>,
    #[serde(default)]
    inbound: Option<PortList>,
    #[serde(default)]
    allow: Option<AllowNone>,
    #[serde(default)]
    apis: BTreeMap<ApiName, ApiSettings>,
}

/// A service bundle of policies/services.yaml.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub description: String,
    pub domains: Vec<DomainRule>,
}

/// The bundles, parsed once. A bad bundle is a build defect, caught by the unit tests.
pub fn services() -> &'static BTreeMap<String, Service> {
    static SERVICES: std::sync::OnceLock<BTreeMap<String, Service>> = std::sync::OnceLock::new();
    SERVICES.get_or_init(|| match yaml_serde::from_str(SERVICES_YAML) {
        Ok(services) => services,
        Err(e) => panic!("{SERVICES_FILE} is invalid: {e}"),
    })
}

/// One policy file, or several merged: every allowed domain and range with the union of its ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub domains: BTreeMap<DomainPattern, Access>,
    /// Address ranges, TCP and UDP on their ports.
    pub cidrs: BTreeMap<IpNet, Ports>,
    /// TCP ports that accept connections from outside the container (a dev server the user
    /// publishes); every other inbound connection is refused.
    pub inbound: Ports,
    pub services: BTreeSet<String>,
    /// The model APIs' settings, by API name; an API not named has the defaults.
    pub apis: BTreeMap<String, ApiSettings>,
    /// The files this policy was read from, in merge order.
    pub files: Vec<PathBuf>,
}

impl Policy {
    /// Parses one YAML policy. `file` names it in errors.
    pub fn from_yaml(file: &Path, text: &str) -> Result<Policy, PolicyError> {
        let invalid = |line, column, message: String| PolicyError::Invalid {
            file: file.display().to_string(),
            line,
            column,
            message,
        };
        let parsed: PolicyFile = yaml_serde::from_str(text).map_err(|e| {
            // Only comments, or nothing: say so rather than "missing field `version`".
            if matches!(yaml_serde::from_str(text), Ok(yaml_serde::Value::Null)) {
                return invalid(1, 1, "empty policy file: write at least `version: 1`".into());
            }
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            invalid(line, column, strip_location(&e.to_string()))
        })?;
        let mut policy = Policy { files: vec![file.to_path_buf()], ..Policy::default() };
        let entries = parsed.domains.len() + parsed.services.len() + parsed.cidrs.len() + parsed.apis.len();
        match (parsed.allow.is_some(), entries) {
            (false, 0) if parsed.inbound.is_none() => {
                return Err(invalid(
                    1,
                    1,
                    "the policy allows nothing: list `domains`, `services`, `cidrs` or `inbound`, or say `allow: none`"
                        .into(),
                ));
            }
            (true, n) if n > 0 => {
                let (line, column) = key_position(text, "allow").unwrap_or((1, 1));
                return Err(invalid(
                    line,
                    column,
                    "`allow: none` contradicts the entries this policy lists".into(),
                ));
            }
            _ => {}
        }
        for rule in parsed.domains {
            policy.add_domain(rule.pattern, &rule.access);
        }
        for ServiceRef(name) in parsed.services {
            for rule in &services()[&name].domains {
                policy.add_domain(rule.pattern.clone(), &rule.access);
            }
            policy.services.insert(name);
        }
        for rule in parsed.cidrs {
            policy.cidrs.entry(rule.net).or_default().extend(rule.ports);
        }
        policy.inbound = parsed.inbound.map(|p| p.0).unwrap_or_default();
        policy.apis = parsed.apis.into_iter().map(|(ApiName(name), settings)| (name, settings)).collect();
        Ok(policy)
    }

    /// Parses a plain domain list: one `host[:port,…]` per line, `#` starts a comment.
    pub fn from_list(file: &Path, text: &str) -> Result<Policy, PolicyError> {
        let mut policy = Policy { files: vec![file.to_path_buf()], ..Policy::default() };
        for (index, line) in text.lines().enumerate() {
            let content = line.split_once('#').map_or(line, |(before, _)| before);
            let entry = content.trim();
            if entry.is_empty() {
                continue;
            }
            let column = content.len() - content.trim_start().len() + 1;
            let (pattern, ports) = parse_domain_with_ports(entry).map_err(|message| {
                PolicyError::Invalid { file: file.display().to_string(), line: index + 1, column, message }
            })?;
            policy.add_domain(pattern, &Access::tcp(ports));
        }
        Ok(policy)
    }

    /// Reads one file, YAML or list by its extension.
    pub fn read(file: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(file)
            .map_err(|source| PolicyError::Unreadable { file: file.display().to_string(), source })?;
        match file.extension().and_then(|e| e.to_str()) {
            Some("txt") => Policy::from_list(file, &text),
            _ => Policy::from_yaml(file, &text),
        }
    }

    /// The baked policy merged with the drop-ins of `drop_in_dir` in name order. Files with
    /// other extensions are skipped and returned, so the caller can warn about them.
    pub fn load(baked: &Path, drop_in_dir: &Path) -> Result<(Policy, Vec<PathBuf>), PolicyError> {
        let mut policy = Policy::read(baked)?;
        let mut skipped = Vec::new();
        let entries = match std::fs::read_dir(drop_in_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((policy, skipped)),
            Err(source) => {
                return Err(PolicyError::Unreadable { file: drop_in_dir.display().to_string(), source });
            }
        };
        let mut files: Vec<PathBuf> = entries
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(|source| PolicyError::Unreadable { file: drop_in_dir.display().to_string(), source })?;
        files.sort();
        for file in files {
            let extension = file.extension().and_then(|e| e.to_str());
            if matches!(extension, Some("yaml" | "yml" | "txt")) {
                policy.merge(Policy::read(&file)?);
            } else if !file.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
                skipped.push(file);
            }
        }
        Ok((policy, skipped))
    }

    pub fn merge(&mut self, other: Policy) {
        for (pattern, access) in other.domains {
            self.add_domain(pattern, &access);
        }
        for (net, ports) in other.cidrs {
            self.cidrs.entry(net).or_default().extend(ports);
        }
        self.inbound.extend(other.inbound);
        self.services.extend(other.services);
        // Drop-ins widen, as with domains: what one file allows stays allowed.
        for (name, settings) in other.apis {
            let merged = self.apis.entry(name).or_default();
            if settings.remote_tools == RemoteTools::Allow {
                merged.remote_tools = RemoteTools::Allow;
            }
        }
        self.files.extend(other.files);
    }

    fn add_domain(&mut self, pattern: DomainPattern, access: &Access) {
        self.domains.entry(pattern).or_default().merge(access);
    }

    /// Whether a range of the policy opens `port` on `addr`.
    pub fn cidr_allows(&self, addr: IpAddr, port: u16) -> bool {
        ranges_allow(&self.cidrs, addr, port)
    }

    /// The settings of the API named `name`.
    pub fn api_settings(&self, name: &str) -> ApiSettings {
        self.apis.get(name).copied().unwrap_or_default()
    }

    /// `N domains, M cidrs`, as the ready line, `check` and the reload line say it.
    pub fn summary(&self) -> String {
        let mut text = format!("{} domains, {} cidrs", self.domains.len(), self.cidrs.len());
        if !self.inbound.is_empty() {
            let ports: Vec<String> = self.inbound.iter().map(u16::to_string).collect();
            text.push_str(&format!(", inbound {}", ports.join(",")));
        }
        text
    }
}

/// Whether one of `ranges` (a policy's `cidrs`) opens `port` on `addr`.
pub fn ranges_allow(ranges: &BTreeMap<IpNet, Ports>, addr: IpAddr, port: u16) -> bool {
    ranges.iter().any(|(net, ports)| net.contains(&addr) && ports.contains(&port))
}

/// yaml_serde appends " at line L column C" to messages; the location is printed first instead.
fn strip_location(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// Where a top-level key is written, for errors about the whole file.
fn key_position(text: &str, key: &str) -> Option<(usize, usize)> {
    text.lines()
        .position(|line| line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with(':')))
        .map(|index| (index + 1, 1))
}

/// Answers "may this name be resolved, and what does it open?" for a merged policy.
#[derive(Clone, Debug, Default)]
pub struct Allowlist {
    exact: std::collections::HashMap<String, Access>,
    subdomains: std::collections::HashMap<String, Access>,
}

/// How a name is allowed: what it opens, and the entries that allow it (its exact entry and
/// every wildcard it falls under).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    pub access: Access,
    pub patterns: Vec<DomainPattern>,
}

impl Match {
    /// Allowed by a wildcard alone, not by an entry of its own.
    pub fn only_by_wildcard(&self) -> bool {
        !self.patterns.iter().any(|p| matches!(p, DomainPattern::Exact(_)))
    }
}

impl Allowlist {
    pub fn new(policy: &Policy) -> Allowlist {
        let mut allowlist = Allowlist::default();
        for (pattern, access) in &policy.domains {
            let (map, name) = match pattern {
                DomainPattern::Exact(name) => (&mut allowlist.exact, name),
                DomainPattern::Subdomains(name) => (&mut allowlist.subdomains, name),
            };
            map.entry(name.clone()).or_default().merge(access);
        }
        allowlist
    }

    /// How a queried name is allowed, or None if it is not. Names are compared without case and
    /// without the trailing dot; a query in Unicode never matches, because DNS carries punycode.
    pub fn matches(&self, name: &str) -> Option<Match> {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let mut found: Option<Match> = None;
        let mut add = |pattern: DomainPattern, access: &Access| {
            let entry =
                found.get_or_insert_with(|| Match { access: Access::default(), patterns: Vec::new() });
            entry.access.merge(access);
            entry.patterns.push(pattern);
        };
        if let Some(access) = self.exact.get(&name) {
            add(DomainPattern::Exact(name.clone()), access);
        }
        let mut rest = name.as_str();
        while let Some((_, parent)) = rest.split_once('.') {
            if let Some(access) = self.subdomains.get(parent) {
                add(DomainPattern::Subdomains(parent.to_string()), access);
            }
            rest = parent;
        }
        found
    }

    /// What a queried name opens, or None if it is not allowed.
    pub fn access(&self, name: &str) -> Option<Access> {
        self.matches(name).map(|m| m.access)
    }

    /// What an entry opens, if this allowlist has it.
    pub fn entry(&self, pattern: &DomainPattern) -> Option<&Access> {
        match pattern {
            DomainPattern::Exact(name) => self.exact.get(name),
            DomainPattern::Subdomains(name) => self.subdomains.get(name),
        }
    }
}

#[cfg(test)]
mod tests;
