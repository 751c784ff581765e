//! The upload budgets' accounting, pure: the bytes each name received this hour, a
//! connection's share of its name's budget, what a name's bytes count against (sandbox-init's
//! net/namecheck/verdicts.rs applies them).

use std::collections::HashMap;
use std::sync::Mutex;

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

/// The bytes each name received from the agent in its current hour (from its first byte).
#[derive(Default)]
pub struct Uploads(pub(crate) Mutex<HashMap<String, (std::time::Instant, u64)>>);

pub const BUDGET_HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

impl Uploads {
    /// Adds `bytes` to `name`'s hour; the total.
    pub fn add(&self, name: &str, bytes: u64) -> u64 {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let entry = map.entry(name.to_string()).or_insert((now, 0));
        if now.duration_since(entry.0) >= BUDGET_HOUR {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(bytes);
        entry.1
    }

    /// What `name` received in its current hour.
    pub fn sent(&self, name: &str) -> u64 {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(name).filter(|(start, _)| start.elapsed() < BUDGET_HOUR).map_or(0, |(_, bytes)| *bytes)
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
        assert_eq!((uploads.add("a.test", 600), uploads.add("a.test", 500)), (600, 1100));
        assert_eq!((uploads.sent("a.test"), uploads.sent("b.test")), (1100, 0));
        // An hour later: a new hour, counted from its first byte.
        let long_ago = std::time::Instant::now() - BUDGET_HOUR;
        uploads.0.lock().unwrap().get_mut("a.test").unwrap().0 = long_ago;
        assert_eq!(uploads.sent("a.test"), 0);
        assert_eq!(uploads.add("a.test", 7), 7);
    }
}
