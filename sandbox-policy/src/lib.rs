//! Policies: the allowlist format, its strict parsing (every error names file, line and column),
//! the built-in service bundles, and the merge of the baked policy with the user's drop-ins.
//! A crate of its own so that the build system (which scaffolds and checks policies) shares the
//! one definition with sandbox-init without compiling sandbox-init's DNS and netlink stack.
//!
//! Per-value checks live in `Deserialize` impls, so the YAML parser reports them at the value's
//! own line and column; only whole-file checks (an empty allowlist) are made after parsing.

pub mod address;
pub mod apis;
mod file;
pub mod forward;
pub mod layout;
pub mod model;
mod pattern;
pub mod terminal;
pub mod text;

use file::*;
pub use file::{ApiSettings, RemoteTools};
pub use pattern::*;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use ipnet::IpNet;
use serde::Deserialize;

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
    /// The files are valid one by one, and together are not: `files` names them all.
    #[error("{files}: {message}")]
    Conflict { files: String, message: String },
    /// The file could not be read at all.
    #[error("cannot read policy {file}: {source}")]
    Unreadable {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// A service bundle of policies/services.yaml.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub description: String,
    pub domains: Vec<DomainRule>,
    /// Hosts of the service the bundle leaves out because they take writes (a package index's
    /// upload host): an approval of one is a write channel, and the launcher says so.
    #[serde(default)]
    pub writes: Vec<String>,
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
    /// `forward:`, by service name: the built-in services' settings and the declared services.
    pub forward: BTreeMap<String, forward::Forward>,
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
        let forwards = parsed.forward.map(|f| f.0).unwrap_or_default();
        let entries = parsed.domains.len()
            + parsed.services.len()
            + parsed.cidrs.len()
            + parsed.apis.len()
            + forwards.len();
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
            policy.services.insert(name);
        }
        for (name, settings) in forwards {
            // Naming a built-in service under `forward` allows it, as `services` would.
            if forward::builtin(&name).is_some() {
                policy.services.insert(name.clone());
            }
            policy.forward.insert(name, settings);
        }
        policy.apply_services();
        for rule in parsed.cidrs {
            policy.cidrs.entry(rule.net).or_default().extend(rule.ports);
        }
        policy.inbound = parsed.inbound.map(|p| p.0).unwrap_or_default();
        policy.apis = parsed.apis.into_iter().map(|(ApiName(name), settings)| (name, settings)).collect();
        policy.check_budgets_cover_udp()?;
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
            let invalid = |column: usize, message: String| PolicyError::Invalid {
                file: file.display().to_string(),
                line: index + 1,
                column,
                message,
            };
            let (access, attributes) = entry.split_once(char::is_whitespace).unwrap_or((entry, ""));
            let (pattern, ports) = parse_domain_with_ports(access).map_err(|m| invalid(column, m))?;
            let mut access = Access::tcp(ports);
            for attribute in attributes.split_whitespace() {
                let at = column + content.trim_start().find(attribute).unwrap_or(0);
                if attribute == "private" {
                    access.private = true;
                    continue;
                }
                let size = attribute.strip_prefix("upload=").ok_or_else(|| {
                    invalid(
                        at,
                        format!(
                            "`{attribute}`: a line is NAME[:PORTS], then upload=SIZE and `private` at most"
                        ),
                    )
                })?;
                access.upload = Some(parse_size(size).map_err(|m| invalid(at, m))?);
            }
            policy.add_domain(pattern, &access);
        }
        policy.check_budgets_cover_udp()?;
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
        policy.check_budgets_cover_udp()?;
        Ok((policy, skipped))
    }

    /// A name whose entries together set an upload budget and open UDP ports is refused: UDP
    /// passes on the address, past the name check that counts the budget, so the budget would
    /// not hold there (one entry with both is refused as it is parsed).
    pub fn check_budgets_cover_udp(&self) -> Result<(), PolicyError> {
        // A name's entries merge into one access only by widening: with no entry that sets a
        // budget, or none that opens UDP, no name can have both (and a 10,000-name list is
        // not matched name by name, 3.8 ms, at every start).
        let any = |has: fn(&Access) -> bool| self.domains.values().any(has);
        if !any(|a| a.upload.is_some()) || !any(|a| !a.udp.is_empty()) {
            return Ok(());
        }
        let allowlist = Allowlist::new(self);
        for pattern in self.domains.keys() {
            let name = match pattern {
                DomainPattern::Exact(name) => name.clone(),
                DomainPattern::Subdomains(base) => format!("budget-check.{base}"),
            };
            let Some(matched) = allowlist.matches(&name) else { continue };
            if let (Some(budget), Some(port)) = (matched.access.upload, matched.access.udp.first()) {
                return Err(PolicyError::Conflict {
                    files: self.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "),
                    message: format!(
                        "`{pattern}`: its entries set an upload budget ({budget} bytes an hour) and open UDP \
                         port {port}, which passes on the address, past the name check that counts the \
                         budget: allow UDP for other names, or leave out `upload`"
                    ),
                });
            }
        }
        Ok(())
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
        for (name, settings) in other.forward {
            match self.forward.get_mut(&name) {
                Some(merged) => merged.merge(settings),
                None => {
                    self.forward.insert(name, settings);
                }
            }
        }
        self.apply_services();
        self.files.extend(other.files);
    }

    /// The domains of the services the policy names: a forwarded service's hosts on 443 (which
    /// the forwarder alone reaches); any other bundle's domains as written. Again after a merge, since a drop-in may set `direct`. A declared service's host
    /// too, on 443.
    fn apply_services(&mut self) {
        let mut add = Vec::new();
        for name in &self.services {
            match forward::builtin(name) {
                Some(builtin) if !self.forward.get(name).is_some_and(|f| f.direct) => {
                    for host in builtin.hosts {
                        add.push((DomainPattern::Exact(host.host.into()), Access::tcp(Ports::from([443]))));
                    }
                }
                _ => {
                    for rule in &services()[name].domains {
                        add.push((rule.pattern.clone(), rule.access.clone()));
                    }
                }
            }
        }
        for declared in self.forward.values().filter_map(|f| f.declared.as_ref()) {
            add.push((DomainPattern::Exact(declared.host.clone()), Access::tcp(Ports::from([443]))));
        }
        for (pattern, access) in add {
            self.add_domain(pattern, &access);
        }
    }

    /// Every host the forwarder alone reaches, with its port on 127.0.0.1, the service it
    /// belongs to and (for a built-in) its rules' part.
    pub fn forwarded(&self) -> Vec<ForwardedHost> {
        let mut out = Vec::new();
        for name in &self.services {
            let Some(builtin) = forward::builtin(name) else { continue };
            let settings = self.forward.get(name).cloned().unwrap_or_default();
            if settings.direct {
                continue;
            }
            for host in builtin.hosts {
                out.push(ForwardedHost {
                    service: name.clone(),
                    host: host.host.to_string(),
                    port: host.port,
                    part: Some(host.part),
                    settings: settings.clone(),
                });
            }
        }
        let declared = self.forward.iter().filter(|(_, f)| f.declared.is_some());
        for (index, (name, settings)) in declared.enumerate() {
            out.push(ForwardedHost {
                service: name.clone(),
                host: settings.declared.as_ref().map(|d| d.host.clone()).unwrap_or_default(),
                port: forward::DECLARED_PORTS + index as u16,
                part: None,
                settings: settings.clone(),
            });
        }
        out
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

/// Whether `addr` may be given as a resolver (`--dns`, `SANDBOX_DNS`): not on loopback, where the
/// agent could bind it and answer for it, nor unspecified or multicast; an IPv4-mapped address
/// (`::ffff:127.0.0.1`) as the IPv4 address it maps.
pub fn resolver_outside(addr: &std::net::IpAddr) -> bool {
    let addr = addr.to_canonical();
    !(addr.is_loopback() || addr.is_unspecified() || addr.is_multicast())
}

/// Every variable that may hold a key, of every API and forwarded service (`GH_TOKEN`,
/// `NPM_TOKEN`): none reaches a process sandbox-init or sandbox-exec starts.
pub fn key_vars() -> impl Iterator<Item = &'static str> {
    apis::APIS.iter().flat_map(|api| api.keys.iter().map(|k| k.var)).chain(forward::token_vars())
}

impl apis::Api {
    /// The API as a forwarded host, sending to `host` (its own, or the one of the base URL the
    /// user gave): a forwarded service whose credential is the held key and whose rules let any
    /// request under the base path through. Unlike GitHub's or a declared service's, its host is
    /// the forwarder's alone only while a key is held: without one, a CLI signed in by itself
    /// reaches it directly.
    pub fn forwarded_host(&self, host: String) -> ForwardedHost {
        ForwardedHost {
            service: self.name.to_string(),
            host,
            port: self.port,
            part: Some(forward::Part::Model),
            settings: forward::Forward::default(),
        }
    }
}

/// A host the forwarder alone reaches: a forwarded service's (`Policy::forwarded`), or a model
/// API's while its key is held (`apis::Api::forwarded_host`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardedHost {
    pub service: String,
    pub host: String,
    /// The forwarder's port on 127.0.0.1.
    pub port: u16,
    /// None: a declared service, whose `allow` rules apply.
    pub part: Option<forward::Part>,
    pub settings: forward::Forward,
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
    /// The forwarded hosts: name-checked TCP on 443 and nothing more, whatever other entries
    /// (a wildcard, a drop-in's opaque or UDP ports) would open on them.
    forwarded: BTreeSet<String>,
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
        allowlist.forwarded = policy.forwarded().into_iter().map(|f| f.host).collect();
        allowlist
    }

    /// Whether `name` is a forwarded host.
    pub fn is_forwarded(&self, name: &str) -> bool {
        self.forwarded.contains(name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase().as_str())
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
        if let Some(found) = found.as_mut().filter(|_| self.forwarded.contains(&name)) {
            found.access = Access::tcp(Ports::from([443]));
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
