//! The upload budgets' arithmetic, pure: the bytes each name received this hour (the clock read
//! by the caller and passed in), a connection's share of its name's budget and how its grants
//! grow, what a name's bytes count against. PID 1's verdicts (sandbox-init's
//! `net/namecheck/verdicts.rs`) apply them to the connections the checker reports.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a connection holds of its name's upload budget: the bytes up it may send in all
/// (granted, whether sent or not: reserved, so that connections opened at once cannot each be
/// granted what is left), and the size of its last grant, which doubles from FIRST_GRANT to
/// GRANT while it sends, so that an idle connection reserves little.
pub struct Share {
    pub key: String,
    pub granted: u64,
    pub step: u64,
    /// Cut for the budget: its Close is sent, once.
    pub cut: bool,
}

/// A new connection's first grant.
pub const FIRST_GRANT: u64 = 64 << 10;

/// The most of a budget one grant gives a connection: bytes past a name's budget are at most
/// one grant per open connection to it, and an upload waits for PID 1 once per grant.
pub const GRANT: u64 = 4 << 20;

impl Share {
    /// A new connection's share of `key`'s budget: its first `first` bytes (read before it was
    /// judged, which it sends before anything else), and FIRST_GRANT more at most of the `left`
    /// its name has unreserved, which holds them (`first` ≤ `left`).
    pub fn first(key: String, first: u64, left: u64) -> Share {
        Share { key, granted: first + (left - first).min(FIRST_GRANT), step: FIRST_GRANT, cut: false }
    }

    /// More of its name's budget for a connection that has sent `sent` bytes up, with `left` of
    /// the budget unreserved: the total it may send, if that grows. Each grant doubles the last,
    /// GRANT at most, and takes no more than is left.
    pub fn grow(&mut self, sent: u64, left: u64) -> Option<u64> {
        let step = (self.step * 2).min(GRANT);
        let total = sent.saturating_add(left.min(step));
        if total <= self.granted {
            return None;
        }
        (self.granted, self.step) = (total, step);
        Some(total)
    }
}

/// The bytes each name received from the agent in its current hour (from its first byte).
#[derive(Default)]
pub struct Uploads(pub(crate) Mutex<HashMap<String, (Instant, u64)>>);

pub const BUDGET_HOUR: Duration = Duration::from_secs(3600);

impl Uploads {
    /// Adds `bytes` to `name`'s hour, as of `now`; the total.
    pub fn add(&self, name: &str, bytes: u64, now: Instant) -> u64 {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(name.to_string()).or_insert((now, 0));
        if now.duration_since(entry.0) >= BUDGET_HOUR {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(bytes);
        entry.1
    }

    /// What `name` received in its current hour, as of `now`.
    pub fn sent(&self, name: &str, now: Instant) -> u64 {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(name)
            .filter(|(start, _)| now.duration_since(*start) < BUDGET_HOUR)
            .map_or(0, |(_, bytes)| *bytes)
    }
}

/// What a name's uploads count against, and its budget: its own, or, for a name allowed by a
/// wildcard alone, the wildcard's (`*.example.com`), which every name under it shares; or each
/// name a wildcard allows would bring a budget of its own.
pub fn budget_of(name: &str, m: &sandbox_policy::Match) -> (String, u64) {
    let key = match m.patterns.first() {
        Some(wildcard) if m.only_by_wildcard() => wildcard.to_string(),
        _ => name.to_string(),
    };
    (key, m.access.upload_budget())
}

/// Why a name past its upload budget is refused, and how to raise it.
pub fn over_budget(name: &str, budget: u64) -> String {
    format!(
        "{name} received its upload budget of {budget} bytes this hour; `upload:` on its domain entry \
         in a policy raises it"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_names_uploads_add_up_within_its_hour_and_start_again_after_it() {
        let uploads = Uploads::default();
        let now = Instant::now();
        assert_eq!((uploads.add("a.test", 600, now), uploads.add("a.test", 500, now)), (600, 1100));
        assert_eq!((uploads.sent("a.test", now), uploads.sent("b.test", now)), (1100, 0));
        // An hour later: a new hour, counted from its first byte.
        let long_ago = now - BUDGET_HOUR;
        uploads.0.lock().unwrap().get_mut("a.test").unwrap().0 = long_ago;
        assert_eq!(uploads.sent("a.test", now), 0);
        assert_eq!(uploads.add("a.test", 7, now), 7);
    }

    #[test]
    fn a_connections_grants_double_up_to_grant_and_never_past_what_is_left() {
        let mut share = Share::first("a.test".into(), 500, 10 << 20);
        assert_eq!(share.granted, 500 + FIRST_GRANT, "its first bytes and a first grant");
        assert_eq!(share.grow(share.granted, 10 << 20), Some(500 + FIRST_GRANT + 2 * FIRST_GRANT));
        // Nothing sent since, nothing left: no grant.
        assert_eq!(share.grow(0, 0), None);
        let mut steps = Vec::new();
        while let Some(total) = share.grow(share.granted, u64::MAX) {
            steps.push(share.step);
            if total > 100 << 20 {
                break;
            }
        }
        assert!(steps.iter().all(|s| *s <= GRANT) && steps.last() == Some(&GRANT), "{steps:?}");
        // Only what is left: 1,000 bytes more than it sent.
        let sent = share.granted;
        assert_eq!(share.grow(sent, 1000), Some(sent + 1000));
        // Its first bytes fit in what is left, with no room past them.
        assert_eq!(Share::first("b.test".into(), 700, 700).granted, 700);
    }
}
