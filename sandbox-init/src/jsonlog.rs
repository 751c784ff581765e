//! A JSON-lines log the agent cannot flood: what the agent does decides what is logged, so
//! repeats are folded, lines are rate-limited, and the file is capped and rotated. Lines go to
//! stderr too (the engine's log), under the same limits: all, or those a log picks.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How much a log takes at most.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The file is rotated (to `<file>.1`, replacing the older one) past this many bytes: the
    /// log never takes more than twice this on disk.
    pub max_bytes: u64,
    /// Lines per second, on average; more are dropped and counted.
    pub per_second: u32,
    /// Lines at once after a quiet spell.
    pub burst: u32,
    /// A line with the same key as one written less than this long ago is folded into a count.
    pub fold: Duration,
}

/// Keys remembered for folding; past this, the oldest are forgotten.
const FOLD_KEYS: usize = 4096;

pub struct JsonLog {
    path: Option<PathBuf>,
    limits: Limits,
    state: Mutex<State>,
    /// Which lines go to stderr too (all, unless [`JsonLog::echoing`] says otherwise).
    echo: fn(&serde_json::Value) -> bool,
}

struct State {
    file: Option<std::fs::File>,
    size: u64,
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    folded: HashMap<String, Fold>,
}

struct Fold {
    since: Instant,
    repeats: u64,
}

impl JsonLog {
    /// Logs to stderr and, when it can be opened, to `path`.
    pub fn open(path: &Path, limits: Limits) -> JsonLog {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path);
        let (file, size) = match file {
            Ok(file) => {
                let size = file.metadata().map_or(0, |m| m.len());
                (Some(file), size)
            }
            Err(e) => {
                crate::console::err(format!("sandbox-init: {} goes to stderr only: {e}", path.display()));
                (None, 0)
            }
        };
        JsonLog {
            path: Some(path.to_path_buf()),
            limits,
            state: Mutex::new(State::new(file, size, limits)),
            echo: |_| true,
        }
    }

    /// Only the lines `echo` picks go to stderr as well.
    pub fn echoing(self, echo: fn(&serde_json::Value) -> bool) -> JsonLog {
        JsonLog { echo, ..self }
    }

    /// Logs to stderr only.
    pub fn stderr_only(limits: Limits) -> JsonLog {
        JsonLog { path: None, limits, state: Mutex::new(State::new(None, 0, limits)), echo: |_| true }
    }

    /// Writes the line `make` builds, unless a line with the same `key` was written within the
    /// fold window (then it is counted, and the next line of that key says `"repeats": N`) or the
    /// rate is exceeded (then it is dropped, and the next line written is preceded by one saying
    /// how many were).
    /// Whether the line was written.
    pub fn write(&self, key: &str, make: impl FnOnce() -> serde_json::Value) -> bool {
        self.write_unless(key, false, make)
    }

    /// Writes the line whatever the fold and the rate say (still counted against the rate): for
    /// the few lines a reader must never miss, which the caller bounds itself.
    pub fn write_always(&self, key: &str, make: impl FnOnce() -> serde_json::Value) {
        self.write_unless(key, true, make);
    }

    fn write_unless(&self, key: &str, always: bool, make: impl FnOnce() -> serde_json::Value) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if always {
            state.folded.insert(key.to_string(), Fold { since: now, repeats: 0 });
            state.take_token(now, self.limits);
            let line = make();
            self.emit(&mut state, &line);
            return true;
        }
        let repeats = match state.folded.get_mut(key) {
            Some(fold) if now.duration_since(fold.since) < self.limits.fold => {
                fold.repeats += 1;
                return false;
            }
            Some(fold) => std::mem::replace(fold, Fold { since: now, repeats: 0 }).repeats,
            None => {
                if state.folded.len() >= FOLD_KEYS {
                    let window = self.limits.fold;
                    state.folded.retain(|_, f| now.duration_since(f.since) < window);
                    if state.folded.len() >= FOLD_KEYS {
                        state.folded.clear();
                    }
                }
                state.folded.insert(key.to_string(), Fold { since: now, repeats: 0 });
                0
            }
        };
        if !state.take_token(now, self.limits) {
            state.dropped += 1;
            return false;
        }
        if state.dropped > 0 {
            let dropped = std::mem::take(&mut state.dropped);
            let line = serde_json::json!({
                "time": rfc3339(SystemTime::now()),
                "dropped": dropped,
                "why": "rate limit",
            });
            self.emit(&mut state, &line);
        }
        let mut line = make();
        if repeats > 0
            && let Some(map) = line.as_object_mut()
        {
            map.insert("repeats".into(), repeats.into());
        }
        self.emit(&mut state, &line);
        true
    }

    fn emit(&self, state: &mut State, line: &serde_json::Value) {
        // serde_json writes C1 controls as they are: escaped, a line read raw is plain text.
        let mut text = crate::policy::text::json_safe(&line.to_string()).into_owned();
        text.push('\n');
        if (self.echo)(line) {
            crate::console::err(text.clone());
        }
        let Some(path) = &self.path else { return };
        if state.size + text.len() as u64 > self.limits.max_bytes {
            state.file = None;
            let _ = std::fs::rename(path, rotated(path));
            state.file = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(path).ok();
            state.size = 0;
        }
        if let Some(file) = &mut state.file
            && file.write_all(text.as_bytes()).is_ok()
        {
            state.size += text.len() as u64;
        }
    }
}

impl State {
    fn new(file: Option<std::fs::File>, size: u64, limits: Limits) -> State {
        State {
            file,
            size,
            tokens: f64::from(limits.burst),
            refilled: Instant::now(),
            dropped: 0,
            folded: HashMap::new(),
        }
    }

    fn take_token(&mut self, now: Instant, limits: Limits) -> bool {
        let earned = now.duration_since(self.refilled).as_secs_f64() * f64::from(limits.per_second);
        self.tokens = (self.tokens + earned).min(f64::from(limits.burst));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Where a full log goes: `<file>.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// UTC time as RFC 3339 with milliseconds.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}Z", utc_seconds(since.as_secs() as i64), since.subsec_millis())
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC for a Unix time (days to civil date: Howard Hinnant's
/// algorithm).
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

    fn limits(max_bytes: u64) -> Limits {
        Limits { max_bytes, per_second: 1, burst: 5, fold: Duration::from_secs(60) }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn repeats_are_folded_and_a_flood_is_rate_limited_with_a_count_of_what_was_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = JsonLog::open(&path, limits(1 << 20));
        for _ in 0..1000 {
            log.write("same", || serde_json::json!({"name": "same"}));
        }
        assert_eq!(lines(&path).len(), 1, "a thousand repeats are one line");
        for i in 0..1000 {
            log.write(&format!("k{i}"), || serde_json::json!({ "name": i }));
        }
        let written = lines(&path);
        assert_eq!(written.len(), 5, "the burst, then nothing: {written:?}");
        // A token comes back after a second: the next line is preceded by the count.
        std::thread::sleep(Duration::from_millis(1100));
        log.write("late", || serde_json::json!({"name": "late"}));
        let written = lines(&path);
        assert_eq!(written[5]["dropped"], 996, "{written:?}");
        assert_eq!(written[6]["name"], "late");
    }

    #[test]
    fn a_key_seen_again_after_its_window_says_how_often_it_was_folded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = JsonLog::open(&path, Limits { fold: Duration::from_millis(50), ..limits(1 << 20) });
        for _ in 0..4 {
            log.write("k", || serde_json::json!({"name": "k"}));
        }
        std::thread::sleep(Duration::from_millis(60));
        log.write("k", || serde_json::json!({"name": "k"}));
        let written = lines(&path);
        assert_eq!(written.len(), 2);
        assert_eq!(written[1]["repeats"], 3);
    }

    #[test]
    fn times_are_utc_with_milliseconds() {
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc_seconds(0), "1970-01-01T00:00:00");
    }

    #[test]
    fn the_file_is_rotated_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = JsonLog::open(&path, Limits { per_second: 1000, burst: 1000, ..limits(200) });
        for i in 0..40 {
            log.write(&format!("k{i}"), || serde_json::json!({ "line": i }));
        }
        let current = std::fs::metadata(&path).unwrap().len();
        let older = std::fs::metadata(rotated(&path)).unwrap().len();
        assert!(current <= 200 && older <= 200, "{current} and {older} bytes");
        assert_eq!(lines(&path).last().unwrap()["line"], 39, "the newest line is kept");
    }
}
