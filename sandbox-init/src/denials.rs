//! The denial log: one JSON line per refused name or rejected connection, on stderr (so
//! `docker logs` shows it) and in a file under /run that `sandbox-status` tails. The agent
//! decides what is denied, so the log folds repeats, is rate-limited and is capped on disk
//! (jsonlog.rs). What the log writes also goes, in plain words, into the agent's summary
//! (`REFUSED_FILE`: the last 20 lines), so that the agent learns why it was refused and that
//! only the user can change it.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::policy::text::one_line;

use crate::jsonlog::{JsonLog, Limits, rfc3339};

pub use crate::policy::layout::DENIAL_LOG;

/// What the agent's summary says of a name refused for not being in the allowlist (the status
/// line, statusline.rs, counts the lines that say it).
pub const NOT_ALLOWLISTED: &str = "refused: not in this sandbox's allowlist";

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

    /// One line of the agent's summary: when, what, why, and what only the user can do. The
    /// name is the agent's: one line, its unsafe characters as `?`.
    pub fn plain(&self, time: SystemTime) -> String {
        format!("{} {}", rfc3339(time), self.words())
    }

    /// [`Denial::plain`] without the time: what, why, and what only the user can do.
    pub fn words(&self) -> String {
        let quoted = |name: &str| one_line(name.strip_suffix('.').unwrap_or(name), 255);
        match self {
            Denial::Name { name, reason: Reason::NotAllowlisted, .. } => {
                format!("{}: {NOT_ALLOWLISTED}; only the user decides whether to allow it", quoted(name))
            }
            Denial::Name { name, kind, reason } => {
                format!("{}: refused ({kind} query): {}", quoted(name), reason.as_str())
            }
            Denial::Connection { protocol, addr, port, .. } => format!(
                "{protocol} {addr}{}: refused: no allowed name opened this address; connect by an allowed name",
                port.map(|p| format!(" port {p}")).unwrap_or_default()
            ),
            Denial::Upload { name, budget, sent } => format!(
                "{}: refused or cut: its upload budget of {budget} bytes an hour is spent ({sent} sent); \
                 only the user can raise it",
                quoted(name)
            ),
            Denial::Inward { name, scope, addresses, .. } => format!(
                "{}: its DNS answer pointed at {} ({}), which is not opened",
                quoted(name),
                scope.describe(),
                addresses.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ")
            ),
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
    /// The agent's summary (`REFUSED_FILE`): the last lines the log wrote, in plain words.
    summary: Option<(PathBuf, Mutex<VecDeque<String>>)>,
}

/// How many refusals the agent's summary keeps.
pub const SUMMARY_LINES: usize = 20;

const SUMMARY_HEADER: &str = "# What this sandbox refused its agent lately, newest last. The sandbox's policy decides, \
and only the user can widen it, from outside (`agent-sandbox why SANDBOX NAME` tells them why). \
Ask the user rather than trying another way out.\n";

impl DenialLog {
    /// Logs to stderr and, when it can be opened, to `path`; with `summary`, keeps the agent's
    /// summary there too.
    pub fn open(path: &Path, summary: Option<&Path>) -> DenialLog {
        let summary = summary.map(|s| (s.to_path_buf(), Mutex::new(VecDeque::new())));
        if let Some((file, _)) = &summary {
            write_summary(file, &VecDeque::new());
        }
        DenialLog { log: JsonLog::open(path, LIMITS), summary }
    }

    /// Logs to stderr only.
    pub fn stderr_only() -> DenialLog {
        DenialLog { log: JsonLog::stderr_only(LIMITS), summary: None }
    }

    /// Logs `denial` (folded and rate-limited), and adds what was written to the summary.
    pub fn record(&self, denial: Denial) {
        let time = SystemTime::now();
        if self.log.write(&denial.key(), || denial.to_value(time))
            && let Some((file, lines)) = &self.summary
        {
            let mut lines = lines.lock().unwrap_or_else(|e| e.into_inner());
            if lines.len() == SUMMARY_LINES {
                lines.pop_front();
            }
            lines.push_back(denial.plain(time));
            write_summary(file, &lines);
        }
    }
}

/// The summary, renamed into place whole, readable by all.
fn write_summary(file: &Path, lines: &VecDeque<String>) {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    let mut text = String::from(SUMMARY_HEADER);
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    let tmp = file.with_extension("txt.tmp");
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
    });
    if written.and_then(|()| std::fs::rename(&tmp, file)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use std::time::Duration;
    use std::time::UNIX_EPOCH;

    #[test]
    fn the_agents_summary_keeps_the_last_refusals_in_plain_words_one_line_each() {
        let dir = tempfile::tempdir().unwrap();
        let (log, summary) = (dir.path().join("denials.jsonl"), dir.path().join("refused.txt"));
        let denials = DenialLog::open(&log, Some(&summary));
        let read = || std::fs::read_to_string(&summary).unwrap();
        assert_eq!(read(), SUMMARY_HEADER, "a new start's summary is empty");
        let name =
            |n: &str| Denial::Name { name: n.into(), kind: "A".into(), reason: Reason::NotAllowlisted };
        denials.record(name("evil\x1b]52;c;aGk=\x07\n.test."));
        denials.record(Denial::Upload { name: "up.test".into(), budget: 1000, sent: 1200 });
        let text = read();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with(" evil?]52;c;aGk=??.test: refused: not in this sandbox's allowlist; only the user decides whether to allow it"), "{text}");
        assert!(
            lines[1].contains(
                "up.test: refused or cut: its upload budget of 1000 bytes an hour is spent (1200 sent)"
            ),
            "{text}"
        );
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
        // A repeat within the fold window is the log's one line, and the summary's.
        denials.record(Denial::Upload { name: "up.test".into(), budget: 1000, sent: 1300 });
        assert_eq!(read().lines().count(), 3);
        // The last SUMMARY_LINES alone, newest last.
        for n in 0..25 {
            denials.record(name(&format!("n{n}.test")));
        }
        let text = read();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(lines.len(), SUMMARY_LINES, "{text}");
        assert!(lines[0].contains(" n5.test: ") && lines[19].contains(" n24.test: "), "{text}");
        assert_eq!(std::fs::metadata(&summary).unwrap().permissions().mode() & 0o777, 0o644);
    }

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
