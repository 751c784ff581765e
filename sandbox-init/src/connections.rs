//! The connection log: one JSON line per connection the agent attempts, allowed or refused, in
//! /run/agent-sandbox/connections.jsonl (refusals on stderr too). An allowed connection's line is written
//! when it closes, with the bytes each way and its duration. Bounded like the denial log: refused
//! attempts are folded, every line is rate-limited, the file is capped and rotated.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::jsonlog::{JsonLog, Limits, rfc3339};

pub const CONNECTION_LOG: &str = "/run/agent-sandbox/connections.jsonl";

/// 4 MiB on disk (8 with the rotated file); 200 lines a second after a burst of 2,000; the same
/// refusal once per 10 s.
pub const LIMITS: Limits =
    Limits { max_bytes: 4 << 20, per_second: 200, burst: 2000, fold: Duration::from_secs(10) };

/// One line of the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub time: String,
    pub protocol: String,
    pub address: String,
    pub port: u16,
    /// The name checked (TLS SNI, HTTP Host), or the policy entry the address was opened for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// How the name was known: `tls`, `http`, `address` (no name on the wire: an opaque port, a
    /// range, UDP), or `firewall` (refused before any name was read).
    pub via: String,
    /// `allowed` or `refused`.
    pub verdict: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    /// How many like it were folded into this line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeats: Option<u64>,
}

impl Connection {
    pub fn new(
        protocol: &str,
        dst: SocketAddr,
        via: &str,
        verdict: &str,
        reason: impl Into<String>,
    ) -> Connection {
        Connection {
            time: rfc3339(SystemTime::now()),
            protocol: protocol.into(),
            address: dst.ip().to_string(),
            port: dst.port(),
            via: via.into(),
            verdict: verdict.into(),
            reason: reason.into(),
            ..Connection::default()
        }
    }

    pub fn named(mut self, name: Option<String>) -> Connection {
        self.name = name;
        self
    }
}

/// Refusals of the name check go to stderr as well; the firewall's are there already, as the
/// denial log's lines; allowed connections go only to the file.
fn refused(line: &serde_json::Value) -> bool {
    line["verdict"] != "allowed" && line["via"] != "firewall"
}

pub struct ConnectionLog {
    log: JsonLog,
}

impl ConnectionLog {
    pub fn open(path: &Path) -> ConnectionLog {
        ConnectionLog { log: JsonLog::open(path, LIMITS).echoing(refused) }
    }

    pub fn stderr_only() -> ConnectionLog {
        ConnectionLog { log: JsonLog::stderr_only(LIMITS).echoing(refused) }
    }

    /// `unique` tells connections apart that must not be folded together (an allowed one's
    /// bytes are its own); refusals of the same destination, name and reason fold.
    pub fn record(&self, line: Connection, unique: Option<u64>) {
        let key = match unique {
            Some(id) => format!("#{id}"),
            None => {
                format!("{} {} {} {:?} {}", line.verdict, line.address, line.port, line.name, line.reason)
            }
        };
        self.log.write(&key, || serde_json::to_value(&line).unwrap_or_default());
    }
}

/// Per name: connections allowed and refused, and bytes, from log lines.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub allowed: u64,
    pub refused: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// The totals per name (the address where no name was known) of `lines`.
pub fn totals(lines: &[Connection]) -> std::collections::BTreeMap<String, Totals> {
    let mut totals: std::collections::BTreeMap<String, Totals> = Default::default();
    for line in lines {
        let key = line.name.clone().unwrap_or_else(|| line.address.clone());
        let entry = totals.entry(key).or_default();
        let count = 1 + line.repeats.unwrap_or(0);
        if line.verdict == "allowed" {
            entry.allowed += count;
        } else {
            entry.refused += count;
        }
        entry.bytes_up += line.bytes_up.unwrap_or(0);
        entry.bytes_down += line.bytes_down.unwrap_or(0);
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_and_totals_add_up_per_name() {
        let dst: SocketAddr = "203.0.113.7:443".parse().unwrap();
        let mut ok =
            Connection::new("tcp", dst, "tls", "allowed", "name allowed").named(Some("a.test".into()));
        ok.bytes_up = Some(100);
        ok.bytes_down = Some(5000);
        let text = serde_json::to_string(&ok).unwrap();
        assert!(
            text.contains(
                r#""address":"203.0.113.7","port":443,"name":"a.test","via":"tls","verdict":"allowed""#
            ),
            "{text}"
        );
        let mut refused =
            Connection::new("tcp", dst, "tls", "refused", "name not allowed").named(Some("b.test".into()));
        refused.repeats = Some(4);
        let lines = vec![ok.clone(), ok, refused, serde_json::from_str(&text).unwrap()];
        let totals = totals(&lines);
        assert_eq!(totals["a.test"], Totals { allowed: 3, refused: 0, bytes_up: 300, bytes_down: 15000 });
        assert_eq!(totals["b.test"].refused, 5);
    }
}
