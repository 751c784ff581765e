//! A policy's entries, one value at a time: a domain pattern (exact or `*.` subdomains, checked
//! label by label), the ports and protocols an entry opens (`Access`, `Opening`), a CIDR; each
//! parsed strictly, with the message the YAML parser puts at the value's line and column.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::DEFAULT_PORTS;

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

pub(crate) fn validate_labels(name: &str) -> Result<(), String> {
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
    /// Bytes the agent may send to the name in an hour, over all its connections through the
    /// name check; None: [`DEFAULT_UPLOAD`].
    pub upload: Option<u64>,
    /// `private: true`: an answer for the name may open an address of the user's network
    /// (RFC 1918, unique local, shared space: `address::Scope::Private`), for an internal
    /// service the user names. Off by default: a public service's name is never turned onto
    /// the user's network. Never loopback, link-local or a metadata service (a `cidrs` entry).
    pub private: bool,
}

/// The upload budget of a name whose entries set none: bytes per hour.
pub const DEFAULT_UPLOAD: u64 = 256 << 20;

/// `64MB`, `1GiB`, `512KB`, `1000` (bytes): a size as a policy writes it.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let unit_size: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("`{text}` is not a size: write a number and KB, MB, GB, KiB, MiB or GiB")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a size: it starts with no number"))?;
    match n.checked_mul(unit_size) {
        Some(0) | None => Err(format!("`{text}`: a budget is at least one byte and at most 16 EiB")),
        Some(bytes) => Ok(bytes),
    }
}

impl Access {
    /// The name's upload budget, bytes per hour.
    pub fn upload_budget(&self) -> u64 {
        self.upload.unwrap_or(DEFAULT_UPLOAD)
    }

    /// Name-checked TCP on `ports`.
    pub fn tcp(ports: Ports) -> Access {
        Access { tcp: ports, ..Access::default() }
    }

    pub fn merge(&mut self, other: &Access) {
        self.tcp.extend(&other.tcp);
        self.opaque.extend(&other.opaque);
        self.udp.extend(&other.udp);
        self.ech |= other.ech;
        self.private |= other.private;
        // Entries widen: of the budgets entries set, the larger holds; an entry that sets none
        // leaves it to those that do.
        self.upload = match (self.upload, other.upload) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
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
        if self.private {
            parts.push("private".into());
        }
        if let Some(bytes) = self.upload {
            parts.push(format!("upload {bytes} bytes an hour"));
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

pub(crate) fn parse_port(text: &str) -> Result<u16, String> {
    let value: u64 = text.trim().parse().map_err(|_| format!("`{text}` is not a port number"))?;
    port_in_range(value)
}

pub(crate) fn port_in_range(value: u64) -> Result<u16, String> {
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

pub(crate) fn parse_cidr(text: &str) -> Result<IpNet, String> {
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
