//! The denial log: one JSON line per refused name or rejected connection, on stderr (so
//! `docker logs` shows it) and in a file under /run that `sandbox-status` tails. The agent
//! decides what is denied, so the log folds repeats, is rate-limited and is capped on disk
//! (jsonlog.rs).

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::jsonlog::{JsonLog, Limits, rfc3339};

pub use crate::policy::layout::DENIAL_LOG;

/// At most 1 MiB on disk (2 MiB with the rotated file), 20 lines a second after a burst of 200,
/// the same denial once per 10 s.
pub const LIMITS: Limits =
    Limits { max_bytes: 1 << 20, per_second: 20, burst: 200, fold: Duration::from_secs(10) };

/// Why a name was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No entry of the policy allows it.
    NotAllowlisted,
    /// A label holds bytes no host name has (a dot, among others).
    NotAHostName,
    /// The name is allowed, the query type is not (only A, AAAA and CNAME leave).
    QueryType,
    /// Allowed only by a wildcard, and longer than names matched by a wildcard may be.
    WildcardNameTooLong,
    /// The address sets are full.
    SetsFull,
    /// A reload removed the name while its answer was on its way.
    PolicyChanged,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAllowlisted => "not allowlisted",
            Reason::NotAHostName => "not a host name",
            Reason::QueryType => "query type",
            Reason::WildcardNameTooLong => "wildcard name too long",
            Reason::SetsFull => "address sets full",
            Reason::PolicyChanged => "policy changed",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// A DNS query that did not leave the container (or whose answer opened nothing).
    Name { name: String, kind: String, reason: Reason },
    /// A packet that reached the end of the output chain and was rejected.
    Connection { protocol: String, addr: IpAddr, port: Option<u16>, uid: Option<u32> },
    /// A connection to a name past its upload budget, refused or cut: `name` is what the budget
    /// is counted for (the name, or the wildcard entry whose names share it).
    Upload { name: String, budget: u64, sent: u64 },
    /// An allowed name's answer pointed into the user's network, at this host or its link, or
    /// at a metadata service (`scope`): those addresses were not opened. Approving the name
    /// would not open them; `private: true` on its entry opens the first kind.
    Inward { name: String, kind: String, scope: crate::policy::address::Scope, addresses: Vec<IpAddr> },
}

/// How the denial log names an answer's address it did not open.
pub fn inward_reason(scope: crate::policy::address::Scope) -> &'static str {
    use crate::policy::address::Scope;
    match scope {
        Scope::Private => "private address",
        Scope::Local => "local address",
        Scope::Metadata => "metadata address",
        Scope::Special => "special address",
        Scope::Public => "public address",
    }
}

impl Denial {
    pub fn to_value(&self, time: SystemTime) -> serde_json::Value {
        let time = rfc3339(time);
        match self {
            Denial::Name { name, kind, reason } => serde_json::json!({
                "time": time, "denied": "dns", "name": name.strip_suffix('.').unwrap_or(name), "type": kind,
                "reason": reason.as_str(),
            }),
            Denial::Connection { protocol, addr, port, uid } => serde_json::json!({
                "time": time, "denied": "connection", "protocol": protocol, "address": addr.to_string(),
                "port": port, "uid": uid,
            }),
            Denial::Upload { name, budget, sent } => serde_json::json!({
                "time": time, "denied": "upload", "name": name, "budget": budget, "sent": sent,
                "reason": "upload budget",
            }),
            Denial::Inward { name, kind, scope, addresses } => serde_json::json!({
                "time": time, "denied": "dns", "name": name.strip_suffix('.').unwrap_or(name), "type": kind,
                "reason": inward_reason(*scope),
                "addresses": addresses.iter().map(IpAddr::to_string).collect::<Vec<_>>(),
            }),
        }
    }

    pub fn to_json(&self, time: SystemTime) -> String {
        self.to_value(time).to_string()
    }

    /// What makes two denials the same for folding.
    fn key(&self) -> String {
        match self {
            Denial::Name { name, kind, reason } => format!("dns {name} {kind} {reason:?}"),
            Denial::Connection { protocol, addr, port, .. } => format!("{protocol} {addr} {port:?}"),
            Denial::Upload { name, .. } => format!("upload {name}"),
            Denial::Inward { name, kind, scope, .. } => format!("dns {name} {kind} {scope:?}"),
        }
    }
}

pub struct DenialLog {
    log: JsonLog,
}

impl DenialLog {
    /// Logs to stderr and, when it can be opened, to `path`.
    pub fn open(path: &Path) -> DenialLog {
        DenialLog { log: JsonLog::open(path, LIMITS) }
    }

    /// Logs to stderr only.
    pub fn stderr_only() -> DenialLog {
        DenialLog { log: JsonLog::stderr_only(LIMITS) }
    }

    pub fn record(&self, denial: Denial) {
        self.log.write(&denial.key(), || denial.to_value(SystemTime::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use std::time::UNIX_EPOCH;

    #[test]
    fn denials_are_json_lines_with_utc_times() {
        let time = UNIX_EPOCH + Duration::from_millis(1_795_996_800_250);
        let name =
            Denial::Name { name: "example.com.".into(), kind: "A".into(), reason: Reason::NotAllowlisted };
        assert_eq!(
            name.to_json(time),
            r#"{"denied":"dns","name":"example.com","reason":"not allowlisted","time":"2026-11-30T00:00:00.250Z","type":"A"}"#
        );
        let conn = Denial::Connection {
            protocol: "tcp".into(),
            addr: "2001:db8::1".parse().unwrap(),
            port: Some(443),
            uid: Some(1000),
        };
        assert_eq!(
            conn.to_json(UNIX_EPOCH),
            r#"{"address":"2001:db8::1","denied":"connection","port":443,"protocol":"tcp","time":"1970-01-01T00:00:00.000Z","uid":1000}"#
        );
    }
}
