//! The connection log: one JSON line per connection the agent attempts, allowed or refused, in
//! /run/agent-sandbox/connections.jsonl (refusals on stderr too). An allowed connection's line is written
//! when it closes, with the bytes each way and its duration. Bounded like the denial log: refused
//! attempts are folded, every line is rate-limited, the file is capped and rotated; but the first
//! line of each new (name, port) is always written, so a flood cannot hide where the agent went
//! first. The totals per name are counted here, in PID 1, from every connection (folded and
//! dropped lines too), and written to /run/agent-sandbox/connection-totals.json.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::jsonlog::{JsonLog, Limits, rfc3339};

pub use crate::policy::layout::CONNECTION_LOG;
/// The totals per name, as PID 1 counts them (`sandbox-status` reads them).
pub use crate::policy::layout::CONNECTION_TOTALS as TOTALS_FILE;
/// The most (name, port) pairs whose first line is always written: past it, a new one is
/// logged like any other line (the agent could otherwise make every line a first).
const FIRSTS: usize = 4096;
/// The most names totalled; past it, the rest count under [`OTHER_NAMES`].
const TOTALLED_NAMES: usize = 10_000;
pub const OTHER_NAMES: &str = "(other names)";
/// The most characters of a logged reason (a forwarder's refusal carries its status too).
const MAX_REASON: usize = 512;
/// The most characters of a logged name: a host name's 253, and room for what is not one.
const MAX_NAME: usize = 260;

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
    /// The (name, port) pairs whose first line was written.
    firsts: Mutex<HashSet<(String, u16)>>,
    totals: Mutex<(BTreeMap<String, Totals>, bool)>,
}

impl ConnectionLog {
    pub fn open(path: &Path) -> ConnectionLog {
        ConnectionLog::with_log(JsonLog::open(path, LIMITS).echoing(refused))
    }

    pub fn stderr_only() -> ConnectionLog {
        ConnectionLog::with_log(JsonLog::stderr_only(LIMITS).echoing(refused))
    }

    fn with_log(log: JsonLog) -> ConnectionLog {
        ConnectionLog { log, firsts: Mutex::default(), totals: Mutex::default() }
    }

    /// `unique` tells connections apart that must not be folded together (an allowed one's
    /// bytes are its own); refusals of the same destination, name and reason fold.
    pub fn record(&self, mut line: Connection, unique: Option<u64>) {
        // The name and reason may come from the checker or the forwarder, which read the agent's
        // bytes: one line each, bounded, whatever they say.
        line.reason = crate::policy::text::one_line(&line.reason, MAX_REASON);
        line.name = line.name.map(|name| crate::policy::text::one_line(&name, MAX_NAME));
        let name = line.name.clone().unwrap_or_else(|| line.address.clone());
        {
            let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            let key = if totals.0.len() < TOTALLED_NAMES || totals.0.contains_key(&name) {
                name.clone()
            } else {
                OTHER_NAMES.to_string()
            };
            totals.0.entry(key).or_default().add(&line);
            totals.1 = true;
        }
        let first = {
            let mut firsts = self.firsts.lock().unwrap_or_else(|e| e.into_inner());
            firsts.len() < FIRSTS && firsts.insert((name, line.port))
        };
        let key = match unique {
            Some(id) => format!("#{id}"),
            None => {
                format!("{} {} {} {:?} {}", line.verdict, line.address, line.port, line.name, line.reason)
            }
        };
        let make = || serde_json::to_value(&line).unwrap_or_default();
        if first {
            self.log.write_always(&key, make);
        } else {
            self.log.write(&key, make);
        }
    }

    /// Writes the totals file if anything was counted since it was last written.
    pub fn write_totals(&self, path: &Path) -> std::io::Result<()> {
        let text = {
            let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            if !std::mem::take(&mut totals.1) {
                return Ok(());
            }
            serde_json::to_string(&totals.0).unwrap_or_default()
        };
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path))
    }

    /// Writes the totals file every `period` while anything changes, until the process ends.
    pub async fn keep_totals_written(self: std::sync::Arc<Self>, period: std::time::Duration) {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            if let Err(e) = self.write_totals(Path::new(TOTALS_FILE)) {
                crate::console::err(format!("sandbox-init: cannot write {TOTALS_FILE}: {e}"));
            }
        }
    }
}

/// Per name: connections allowed and refused, and bytes.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub allowed: u64,
    pub refused: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

impl Totals {
    fn add(&mut self, line: &Connection) {
        let count = 1 + line.repeats.unwrap_or(0);
        if line.verdict == "allowed" {
            self.allowed += count;
        } else {
            self.refused += count;
        }
        self.bytes_up += line.bytes_up.unwrap_or(0);
        self.bytes_down += line.bytes_down.unwrap_or(0);
    }
}

/// The totals PID 1 last wrote; none before the first connection.
pub fn read_totals(path: &Path) -> BTreeMap<String, Totals> {
    std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_lines(path: &Path) -> Vec<Connection> {
        std::fs::read_to_string(path).unwrap().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// The agent floods the log (every line its own connection, past the rate limit), then
    /// connects to a new name: that first line is written, and the totals count every
    /// connection, the dropped ones too.
    #[test]
    fn a_flood_hides_no_first_connection_and_the_totals_count_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("connections.jsonl");
        let log = ConnectionLog::open(&path);
        let dst: SocketAddr = "203.0.113.7:443".parse().unwrap();
        let line = |name: &str| {
            let mut line =
                Connection::new("tcp", dst, "tls", "allowed", "allowed").named(Some(name.to_string()));
            line.bytes_up = Some(10);
            line
        };
        for id in 0..5000 {
            log.record(line("flood.test"), Some(id));
        }
        log.record(line("exfil.test"), Some(9999));
        let written = log_lines(&path);
        assert!(written.len() < 5000, "the flood was rate-limited: {}", written.len());
        assert!(
            written.iter().any(|l| l.name.as_deref() == Some("exfil.test")),
            "the first line was dropped"
        );
        log.write_totals(&dir.path().join("totals.json")).unwrap();
        let totals = read_totals(&dir.path().join("totals.json"));
        assert_eq!(
            totals["flood.test"],
            Totals { allowed: 5000, refused: 0, bytes_up: 50_000, bytes_down: 0 }
        );
        assert_eq!(totals["exfil.test"].allowed, 1);
    }

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
        let dir = tempfile::tempdir().unwrap();
        let log = ConnectionLog::open(&dir.path().join("connections.jsonl"));
        for line in [ok.clone(), ok, refused, serde_json::from_str(&text).unwrap()] {
            log.record(line, None);
        }
        log.write_totals(&dir.path().join("totals.json")).unwrap();
        let totals = read_totals(&dir.path().join("totals.json"));
        assert_eq!(totals["a.test"], Totals { allowed: 3, refused: 0, bytes_up: 300, bytes_down: 15000 });
        assert_eq!(totals["b.test"].refused, 5);
    }
}
