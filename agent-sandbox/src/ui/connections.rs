//! The connection log of each sandbox, followed for the page: sandbox-init writes
//! /run/agent-sandbox/connections.jsonl (rotated to `.1`); each look reads only what was added
//! since the last (`tail -c +N` in the sandbox), across a rotation too, and keeps the lines
//! here. The page asks for the newest lines that match a search and a verdict, and the totals
//! per name over them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use sandbox_policy::layout::CONNECTION_LOG;
use serde::{Deserialize, Serialize};

use crate::engine::Sandbox;
use crate::exit::Result;

/// The most lines kept of one sandbox; the oldest go first.
pub const KEPT: usize = 100_000;
/// The most names whose totals the page gets; the rest add up under [`OTHER_NAMES`].
pub const TOTALS_SHOWN: usize = 500;
/// sandbox-init's own name for the totals past its bound, used here the same way.
pub const OTHER_NAMES: &str = "(other names)";

/// One line of the log, as the page shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Line {
    #[serde(default)]
    pub time: String,
    #[serde(default)]
    pub protocol: String,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub verdict: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub bytes_up: Option<u64>,
    #[serde(default)]
    pub bytes_down: Option<u64>,
    #[serde(default)]
    pub ms: Option<u64>,
    #[serde(default)]
    pub repeats: Option<u64>,
}

/// Totals per name (or address, for a connection without one).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Total {
    pub name: String,
    pub allowed: u64,
    pub refused: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// What the page asked for and gets.
#[derive(Debug, Default, Deserialize)]
pub struct Query {
    #[serde(default)]
    pub q: String,
    #[serde(default)]
    pub verdict: String,
    pub limit: Option<usize>,
}

#[derive(Debug, Default, PartialEq, Serialize)]
pub struct View {
    pub lines_total: usize,
    pub matched: usize,
    pub lines: Vec<Line>,
    pub totals: Vec<Total>,
}

/// One sandbox's log as far as it was read: the file (its inode), how far, and the lines.
#[derive(Debug, Default)]
pub struct Followed {
    inode: u64,
    offset: u64,
    partial: String,
    pub lines: VecDeque<Line>,
}

/// Every sandbox's, by container id.
#[derive(Default)]
pub struct Logs {
    followed: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Followed>>>>,
}

impl Logs {
    /// Forgets the logs of every sandbox but `running` (container ids).
    pub fn keep_only(&self, running: &[&str]) {
        self.followed.lock().expect("the logs' lock").retain(|id, _| running.contains(&id.as_str()));
    }

    /// `sandbox`'s log, read up to now, then viewed as `query` asks.
    pub async fn view(&self, sandbox: &Sandbox, query: &Query) -> Result<View> {
        let followed = {
            let mut all = self.followed.lock().expect("the logs' lock");
            all.entry(sandbox.id.clone()).or_default().clone()
        };
        let mut followed = followed.lock().await;
        followed.catch_up(sandbox).await?;
        Ok(view(&followed.lines, query))
    }
}

/// `inode:size` of a file in the sandbox, if it exists.
fn parse_stat(line: &str) -> Option<(u64, u64)> {
    let (inode, size) = line.trim().split_once(':')?;
    Some((inode.parse().ok()?, size.parse().ok()?))
}

impl Followed {
    async fn catch_up(&mut self, sandbox: &Sandbox) -> Result<()> {
        let rotated = format!("{CONNECTION_LOG}.1");
        let out = sandbox.exec(&["stat", "-c", "%i:%s", CONNECTION_LOG]).await?;
        let Some((inode, size)) = parse_stat(&out.stdout) else {
            return Ok(());
        };
        if inode == self.inode && size >= self.offset {
            if size > self.offset {
                self.read(sandbox, CONNECTION_LOG, self.offset).await?;
            }
            return Ok(());
        }
        // Rotated since the last look (the file read is now `.1`), or never read: what is left
        // of the rotated file first, then the new one from its start.
        let old = sandbox.exec(&["stat", "-c", "%i:%s", &rotated]).await?;
        match parse_stat(&old.stdout) {
            Some((old_inode, _)) if old_inode == self.inode && self.inode != 0 => {
                self.read(sandbox, &rotated, self.offset).await?
            }
            Some(_) => {
                self.lines.clear();
                self.read(sandbox, &rotated, 0).await?
            }
            None => self.lines.clear(),
        }
        self.inode = inode;
        self.offset = 0;
        self.partial.clear();
        self.read(sandbox, CONNECTION_LOG, 0).await
    }

    /// The file from `from` on: its whole lines kept, a last partial one held for the next read.
    async fn read(&mut self, sandbox: &Sandbox, path: &str, from: u64) -> Result<()> {
        let out = sandbox.exec(&["tail", "-c", &format!("+{}", from + 1), path]).await?;
        self.offset = from + out.stdout.len() as u64;
        self.take(&out.stdout);
        Ok(())
    }

    fn take(&mut self, text: &str) {
        let mut text = std::mem::take(&mut self.partial) + text;
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.partial = text.split_off(complete);
        for line in text.lines() {
            if let Ok(line) = serde_json::from_str::<Line>(line) {
                self.lines.push_back(line);
            }
        }
        while self.lines.len() > KEPT {
            self.lines.pop_front();
        }
    }
}

/// The newest `limit` lines that match, and the totals per name over every match.
pub fn view(lines: &VecDeque<Line>, query: &Query) -> View {
    let needle = query.q.trim().as_bytes();
    let verdict = query.verdict.trim();
    let limit = query.limit.unwrap_or(500).min(5_000);
    let port: Option<u16> = query.q.trim().parse().ok();
    // Case-insensitive, without a copy of each field: 100,000 lines are searched at each poll.
    let holds = |field: &str| {
        field.len() >= needle.len()
            && field.as_bytes().windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
    };
    let matches = |line: &Line| {
        (verdict.is_empty() || line.verdict == verdict)
            && (needle.is_empty()
                || [line.name.as_deref().unwrap_or_default(), &line.address, &line.reason, &line.protocol]
                    .iter()
                    .any(|field| holds(field))
                || port == Some(line.port))
    };
    let mut totals: BTreeMap<String, Total> = BTreeMap::new();
    let mut shown = Vec::new();
    let mut matched = 0;
    for line in lines.iter().rev().filter(|l| matches(l)) {
        matched += 1;
        let key = line.name.clone().unwrap_or_else(|| line.address.clone());
        let total = totals.entry(key.clone()).or_insert_with(|| Total { name: key, ..Default::default() });
        let count = line.repeats.unwrap_or(1).max(1);
        if line.verdict == "allowed" {
            total.allowed += count;
        } else {
            total.refused += count;
        }
        total.bytes_up += line.bytes_up.unwrap_or(0);
        total.bytes_down += line.bytes_down.unwrap_or(0);
        if shown.len() < limit {
            shown.push(line.clone());
        }
    }
    let mut totals: Vec<Total> = totals.into_values().collect();
    totals.sort_by(|a, b| (b.allowed + b.refused).cmp(&(a.allowed + a.refused)).then(a.name.cmp(&b.name)));
    if totals.len() > TOTALS_SHOWN {
        let rest = totals.split_off(TOTALS_SHOWN - 1);
        let other =
            rest.into_iter().fold(Total { name: OTHER_NAMES.into(), ..Default::default() }, |mut o, t| {
                o.allowed += t.allowed;
                o.refused += t.refused;
                o.bytes_up += t.bytes_up;
                o.bytes_down += t.bytes_down;
                o
            });
        totals.push(other);
    }
    View { lines_total: lines.len(), matched, lines: shown, totals }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, verdict: &str, up: u64) -> String {
        format!(
            r#"{{"time":"t","protocol":"tcp","address":"10.0.0.1","port":443,"name":"{name}","via":"sni","verdict":"{verdict}","reason":"r","bytes_up":{up}}}"#
        )
    }

    #[test]
    fn lines_split_across_reads_are_joined_and_junk_is_skipped() {
        let mut followed = Followed::default();
        let (a, b) = (line("a.test", "allowed", 5), line("b.test", "refused", 0));
        let text = format!("{a}\nnot json\n{b}\n");
        let (first, rest) = text.split_at(a.len() + 12);
        followed.take(first);
        assert_eq!(followed.lines.len(), 1);
        followed.take(rest);
        let names: Vec<_> = followed.lines.iter().map(|l| l.name.clone().unwrap()).collect();
        assert_eq!(names, ["a.test", "b.test"]);
        assert!(followed.partial.is_empty());
    }

    #[test]
    fn the_view_is_newest_first_filtered_and_totalled() {
        let mut followed = Followed::default();
        let text: String = (0..10)
            .map(|i| {
                line(
                    if i % 2 == 0 { "a.test" } else { "b.test" },
                    if i % 2 == 0 { "allowed" } else { "refused" },
                    i,
                ) + "\n"
            })
            .collect();
        followed.take(&text);
        let all = view(&followed.lines, &Query { limit: Some(3), ..Default::default() });
        assert_eq!((all.lines_total, all.matched, all.lines.len()), (10, 10, 3));
        assert_eq!(all.lines[0].bytes_up, Some(9), "newest first");
        assert_eq!(
            all.totals[0],
            Total { name: "a.test".into(), allowed: 5, refused: 0, bytes_up: 20, bytes_down: 0 }
        );
        let refused = view(&followed.lines, &Query { verdict: "refused".into(), ..Default::default() });
        assert_eq!(refused.matched, 5);
        assert!(refused.lines.iter().all(|l| l.verdict == "refused"));
        let searched = view(&followed.lines, &Query { q: "A.TEST".into(), ..Default::default() });
        assert_eq!(searched.matched, 5);
        assert_eq!(searched.totals.len(), 1);
    }

    #[test]
    fn totals_past_the_bound_add_up_under_other_names() {
        let mut followed = Followed::default();
        let text: String =
            (0..TOTALS_SHOWN + 10).map(|i| line(&format!("n{i}.test"), "refused", 1) + "\n").collect();
        followed.take(&text);
        let view = view(&followed.lines, &Query::default());
        assert_eq!(view.totals.len(), TOTALS_SHOWN);
        let other = view.totals.last().unwrap();
        assert_eq!((other.name.as_str(), other.refused, other.bytes_up), (OTHER_NAMES, 11, 11));
        let searched = super::view(&followed.lines, &Query { q: "N12.TEST".into(), ..Default::default() });
        assert_eq!(searched.matched, 1);
        let by_port = super::view(&followed.lines, &Query { q: "443".into(), ..Default::default() });
        assert_eq!(by_port.matched, TOTALS_SHOWN + 10);
    }

    #[test]
    fn no_more_than_kept_lines_stay() {
        let mut followed = Followed::default();
        let one = line("a.test", "allowed", 1) + "\n";
        followed.take(&one.repeat(KEPT + 10));
        assert_eq!(followed.lines.len(), KEPT);
    }

    #[test]
    fn a_stat_line_reads_as_inode_and_size() {
        assert_eq!(parse_stat("123:456\n"), Some((123, 456)));
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("x:1"), None);
    }
}
