//! The denial log: one JSON line per refused name or rejected connection, on stderr (so
//! `docker logs` shows it) and appended to a file under /run that `sandbox-status` tails.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

pub const DENIAL_LOG: &str = "/run/agent-sandbox/denials.jsonl";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// A DNS query for a name outside the allowlist, answered REFUSED.
    Name { name: String, kind: String },
    /// A packet that reached the end of the output chain and was rejected.
    Connection { protocol: String, addr: IpAddr, port: Option<u16>, uid: Option<u32> },
}

impl Denial {
    pub fn to_json(&self, time: SystemTime) -> String {
        let time = rfc3339(time);
        let value = match self {
            Denial::Name { name, kind } => serde_json::json!({
                "time": time, "denied": "dns", "name": name.strip_suffix('.').unwrap_or(name), "type": kind,
            }),
            Denial::Connection { protocol, addr, port, uid } => serde_json::json!({
                "time": time, "denied": "connection", "protocol": protocol, "address": addr.to_string(),
                "port": port, "uid": uid,
            }),
        };
        value.to_string()
    }
}

pub struct DenialLog {
    file: Option<Mutex<std::fs::File>>,
}

impl DenialLog {
    /// Logs to stderr and, when it can be opened, to `path`.
    pub fn open(path: &Path) -> DenialLog {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path);
        match file {
            Ok(file) => DenialLog { file: Some(Mutex::new(file)) },
            Err(e) => {
                eprintln!("sandbox-init: denials go to stderr only: cannot open {}: {e}", path.display());
                DenialLog { file: None }
            }
        }
    }

    /// Logs to stderr only.
    pub fn stderr_only() -> DenialLog {
        DenialLog { file: None }
    }

    pub fn record(&self, denial: Denial) {
        let mut line = denial.to_json(SystemTime::now());
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
        if let Some(file) = &self.file {
            let _ = file.lock().unwrap_or_else(|e| e.into_inner()).write_all(line.as_bytes());
        }
    }
}

/// UTC time as RFC 3339 with milliseconds.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}Z", utc_seconds(since.as_secs() as i64), since.subsec_millis())
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC for a Unix time (days to civil date: Howard Hinnant's
/// algorithm). The xtask stamps the OS image's creation time with it too.
pub fn utc_seconds(epoch: i64) -> String {
    let (days, secs) = (epoch.div_euclid(86_400), epoch.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", secs / 3600, secs % 3600 / 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn denials_are_json_lines_with_utc_times() {
        let time = UNIX_EPOCH + Duration::from_millis(1_795_996_800_250);
        let name = Denial::Name { name: "example.com.".into(), kind: "A".into() };
        assert_eq!(
            name.to_json(time),
            r#"{"denied":"dns","name":"example.com","time":"2026-11-30T00:00:00.250Z","type":"A"}"#
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
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000Z");
    }
}
