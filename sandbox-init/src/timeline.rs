//! PID 1's start, phase by phase. Each phase marks its end ([`mark`]); with
//! `SANDBOX_START_TIMELINE=1` PID 1 prints the marks on stderr after the ready line, one line
//! (`sandbox-init: start timeline: policy 0.4 ms, nft table 6.1 ms, …`), which
//! `cargo xtask bench sandbox` reads and prints as per-phase medians, so that time added to the start names its phase.
//! A mark costs a lock and a push: they are kept whether printed or not.

use std::sync::Mutex;
use std::time::Instant;

/// Set to `1`: the timeline is printed.
pub const TIMELINE_ENV: &str = "SANDBOX_START_TIMELINE";

/// The phases that ended, in order, and when.
static MARKS: Mutex<Vec<(&'static str, Instant)>> = Mutex::new(Vec::new());

/// `phase` ended now.
pub fn mark(phase: &'static str) {
    if let Ok(mut marks) = MARKS.lock() {
        marks.push((phase, Instant::now()));
    }
}

/// The timeline since `started`: each phase with the time it took, the time from `started` to
/// the last mark at the end.
pub fn line(started: Instant) -> String {
    let marks = MARKS.lock().map(|m| m.clone()).unwrap_or_default();
    render("start", started, &marks, 1)
}

/// `WHAT timeline: phase N ms, …; in all N ms`, each time with `decimals` decimals (the
/// checker's connections, in microseconds, take 3), the form the bench reads.
pub fn render(what: &str, started: Instant, marks: &[(&'static str, Instant)], decimals: usize) -> String {
    let mut previous = started;
    let mut phases = Vec::with_capacity(marks.len());
    for (phase, at) in marks {
        let ms = at.saturating_duration_since(previous).as_secs_f64() * 1e3;
        phases.push(format!("{phase} {ms:.decimals$} ms"));
        previous = *at;
    }
    let total = previous.saturating_duration_since(started).as_secs_f64() * 1e3;
    format!("{what} timeline: {}; in all {total:.decimals$} ms", phases.join(", "))
}

/// Whether the timeline is to be printed.
pub fn wanted() -> bool {
    std::env::var(TIMELINE_ENV).is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_phase_takes_the_time_since_the_one_before() {
        let t0 = Instant::now();
        let marks =
            [("policy", t0 + Duration::from_micros(400)), ("nft table", t0 + Duration::from_micros(6500))];
        assert_eq!(
            render("start", t0, &marks, 1),
            "start timeline: policy 0.4 ms, nft table 6.1 ms; in all 6.5 ms"
        );
        assert_eq!(render("start", t0, &[], 1), "start timeline: ; in all 0.0 ms");
    }
}
