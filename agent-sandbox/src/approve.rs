//! Live changes to a running sandbox's allowlist, and the approval queue: `allow` and `deny`
//! rewrite the runtime drop-in (a `.txt` list in policy.d, which only root in the container may
//! write) and signal sandbox-init to reload; `pending` reads the denial log PID 1 keeps, from the
//! mark the last approval or dismissal left (queue.rs reads it). The drop-in's parsing is pure;
//! the engine calls are `engine`'s.

use std::path::Path;
use std::time::{Duration, Instant};

use sandbox_policy::{Allowlist, DomainPattern, Policy};
use serde::{Deserialize, Serialize};

use crate::engine::{Entry, Found, Sandbox};
use crate::exit::{Code, Failure, Result};
use crate::queue::{Queue, budget_now, queue};

/// The drop-in `allow` and `deny` write: in the folder sandbox-init reads at every reload,
/// root's (0755) in every image, so the agent can neither write it nor add a file beside it.
/// The time of the last denial approved or dismissed (`PENDING_MARK`) is root's, in PID 1's run
/// folder; so is what the last `pending` showed (`REVIEWED_MARK`: its names, and the time of the
/// last denial it read): `allow --pending` approves those names and no other, so nothing the
/// agent asks for after the user looked, or that the user did not see, is approved unseen.
/// `STATUS_FILE` is what PID 1 wrote at its last (re)load: the policy in force.
pub use sandbox_policy::layout::{PENDING_MARK, REVIEWED_MARK, RUNTIME_DROP_IN, STATUS_FILE};
/// sandbox-init's denial log, and the file it rotates to first.
fn denial_logs() -> [String; 2] {
    let log = sandbox_policy::layout::DENIAL_LOG;
    [format!("{log}.1"), log.to_string()]
}
const HEADER: &str = "# Written by `agent-sandbox allow` and `deny`: names allowed while the sandbox runs.\n";
/// How long a reload may take to show in the status file.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(15);

/// Held while a command changes a sandbox's allowlist or its approval queue: one change at a
/// time, so that two at once (two terminals, a script approving while the user denies) neither
/// lose one another's entries nor wait for a policy the other one replaced.
pub struct Held {
    _lock: std::fs::File,
}

/// Takes the change lock of `sandbox`: an flock on a file named for the container, in a folder
/// of this user's alone ([`lock_dir`]), so it covers every launcher this user runs. It waits,
/// saying so, while another change holds it; the kernel drops it when the process ends.
pub async fn hold(sandbox: &Found) -> Result<Held> {
    use rustix::fs::{FlockOperation, flock};
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = lock_path(sandbox)?;
    // No link followed: in a shared temporary folder, another user could point it anywhere.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(&path)
        .map_err(|e| Failure::new(Code::Engine, format!("cannot open the lock {}: {e}", path.display())))?;
    let failed =
        |e: rustix::io::Errno| Failure::new(Code::Engine, format!("cannot lock {}: {e}", path.display()));
    match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => return Ok(Held { _lock: lock }),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            eprintln!("agent-sandbox: waiting for another change to {} to finish", sandbox.name)
        }
        Err(e) => return Err(failed(e)),
    }
    tokio::task::spawn_blocking(move || flock(&lock, FlockOperation::LockExclusive).map(|()| lock))
        .await
        .map_err(|e| Failure::new(Code::Engine, format!("the lock's wait failed: {e}")))?
        .map(|lock| Held { _lock: lock })
        .map_err(failed)
}

/// O_NOFOLLOW, for `custom_flags`: a link in the last place is refused, not followed.
pub(crate) fn no_follow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

fn lock_path(sandbox: &Found) -> Result<std::path::PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let dir = lock_dir(&base, rustix::process::getuid().as_raw()).map_err(|e| {
        Failure::new(Code::Engine, format!("the launcher's lock folder under {}: {e}", base.display()))
    })?;
    Ok(dir.join(format!("{}.lock", sandbox.id)))
}

/// `BASE/agent-sandbox-UID`, this user's folder of locks: made mode 0700 if missing, and
/// refused unless it is a folder (not a link) that `uid` owns and only it may enter.
fn lock_dir(base: &Path, uid: u32) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let dir = base.join(format!("agent-sandbox-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a folder of uid {uid}'s alone (mode 0700, not a link)",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Removes the change lock of a sandbox that is gone (`stop`): nothing can change it any more.
pub fn forget(sandbox: &Found) {
    if let Ok(path) = lock_path(sandbox) {
        let _ = std::fs::remove_file(path);
    }
}

/// Checks domains as given on the command line (`what` says where: `--allow`, or `DOMAIN`),
/// naming the argument and the character at fault.
pub fn validate(what: &str, domains: &[String]) -> Result<Vec<DomainPattern>> {
    domains
        .iter()
        .enumerate()
        .map(|(index, text)| {
            sandbox_policy::parse_domain_with_ports(text).map(|(pattern, _)| pattern).map_err(|why| {
                let at = text
                    .char_indices()
                    .find(|(_, c)| c.is_whitespace() || c.is_ascii_control() || "/@?#\\\"'<>;=&".contains(*c))
                    .map(|(i, _)| format!(", character {}", text[..i].chars().count() + 1))
                    .unwrap_or_default();
                Failure::new(Code::BadArgument, format!("{what} #{} `{text}`{at}: {why}", index + 1))
            })
        })
        .collect()
}

/// The name an entry of the runtime drop-in is for (`docs.rs:443` of `docs.rs:443 upload=1000`).
fn entry_name(entry: &str) -> &str {
    entry.split_whitespace().next().unwrap_or_default()
}

/// The entries of the runtime drop-in, as written.
fn entries(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_once('#').map_or(l, |(before, _)| before).trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

pub fn render(entries: &[String]) -> String {
    let mut text = HEADER.to_string();
    for entry in entries {
        text.push_str(entry);
        text.push('\n');
    }
    text
}

async fn read_text(sandbox: &Sandbox, path: &str) -> Result<Option<String>> {
    Ok(sandbox.get(path).await?.into_iter().next().map(|(_, b)| String::from_utf8_lossy(&b).into_owned()))
}

/// The policy in the sandbox: its baked policy and drop-ins, read out and loaded as sandbox-init
/// loads them; with `runtime`, as it will be once the runtime drop-in holds those entries.
pub async fn policy_in(sandbox: &Sandbox, runtime: Option<&[String]>) -> Result<Policy> {
    let dir = tempfile::tempdir()
        .map_err(|e| Failure::new(Code::Engine, format!("cannot make a temporary folder: {e}")))?;
    let baked = dir.path().join("policy.yaml");
    let drop_ins = dir.path().join("policy.d");
    let io = |e: std::io::Error| Failure::new(Code::Engine, format!("cannot keep the sandbox's policy: {e}"));
    std::fs::create_dir(&drop_ins).map_err(io)?;
    let text = read_text(sandbox, sandbox_policy::BAKED_POLICY).await?.unwrap_or_default();
    std::fs::write(&baked, text).map_err(io)?;
    let runtime_name = Path::new(RUNTIME_DROP_IN).file_name().expect("a file name");
    for (name, contents) in sandbox.get(sandbox_policy::DROP_IN_DIR).await? {
        let file = Path::new(&name).file_name().map(|f| f.to_owned()).unwrap_or_default();
        if runtime.is_none() || file != runtime_name {
            std::fs::write(drop_ins.join(file), contents).map_err(io)?;
        }
    }
    if let Some(entries) = runtime {
        std::fs::write(drop_ins.join(runtime_name), render(entries)).map_err(io)?;
    }
    Policy::load(&baked, &drop_ins)
        .map(|(policy, _)| policy)
        .map_err(|e| Failure::new(Code::BadPolicy, format!("the sandbox's policy does not load: {e}")))
}

#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    domains: Vec<String>,
    #[serde(default)]
    firewall: String,
}

/// The firewall's mode as PID 1's status file (root's) says it: `on`, `off` or `open`. Without
/// it no answer about the sandbox's reach can be given: the firewall could be off.
pub async fn firewall_mode(sandbox: &Sandbox) -> Result<String> {
    let text = read_text(sandbox, STATUS_FILE).await?.unwrap_or_default();
    let status: Status = serde_json::from_str(&text).unwrap_or_default();
    Some(status.firewall).filter(|f| ["on", "off", "open"].contains(&f.as_str())).ok_or_else(|| {
        Failure::new(
            Code::Sandbox,
            format!(
                "{}'s status file ({STATUS_FILE}) does not say its firewall's mode: no answer",
                sandbox.name
            ),
        )
    })
}

/// The domains of the policy PID 1 last loaded, as its status file lists them.
async fn domains_in_force(sandbox: &Sandbox) -> Result<Vec<String>> {
    let text = read_text(sandbox, STATUS_FILE).await?.unwrap_or_default();
    let status: Status = serde_json::from_str(&text).unwrap_or_default();
    Ok(status.domains)
}

/// The domains of `policy` as sandbox-init's status file lists them.
fn listed(policy: &Policy) -> Vec<String> {
    let mut list: Vec<String> = policy.domains.iter().map(|(d, access)| format!("{d} ({access})")).collect();
    list.sort();
    list
}

/// Writes the runtime drop-in with `new` in it, signals the reload and waits until the status
/// file PID 1 writes at every (re)load lists exactly the domains of `after`, the policy it makes
/// (`policy_in` with `new`).
async fn apply(sandbox: &Sandbox, new: &[String], after: &Policy) -> Result<()> {
    let text = render(new);
    let expected = listed(after);
    let entry =
        Entry { path: RUNTIME_DROP_IN.into(), contents: Some(text.into_bytes()), mode: 0o644, uid: 0 };
    sandbox.put(&[entry]).await?;
    sandbox.signal("HUP").await?;
    let started = Instant::now();
    loop {
        let mut in_force = domains_in_force(sandbox).await?;
        in_force.sort();
        if in_force == expected {
            return Ok(());
        }
        if started.elapsed() > RELOAD_TIMEOUT {
            let log = sandbox.logs(Some(5)).await.unwrap_or_default();
            return Err(Failure::new(
                Code::Sandbox,
                format!(
                    "{} did not apply the change within {} s; its last lines:\n{log}",
                    sandbox.name,
                    RELOAD_TIMEOUT.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `allow`: adds `domains` (checked by the caller) to the running sandbox's runtime drop-in and
/// reloads; with `upload`, each with that upload budget (bytes an hour), in place of an entry
/// the drop-in had for it. Entries widen: the largest budget of a name's entries holds, so a
/// budget given here raises, never lowers.
pub async fn allow(sandbox: &Sandbox, domains: &[String], upload: Option<u64>) -> Result<()> {
    sandbox.ensure_running()?;
    if let Some(bytes) = upload {
        let policy = policy_in(sandbox, None).await?;
        let allowlist = Allowlist::new(&policy);
        let lower: Vec<String> = domains
            .iter()
            .filter_map(|d| {
                let now = budget_now(&policy, &allowlist, d.split(':').next().unwrap_or(d))?;
                (now > bytes).then(|| format!("{d} has {now} bytes an hour"))
            })
            .collect();
        if !lower.is_empty() {
            return Err(Failure::new(
                Code::BadArgument,
                format!(
                    "--upload {bytes} would lower a budget ({}): it raises budgets; a policy file sets a \
                     lower one; nothing changed",
                    lower.join(", ")
                ),
            ));
        }
    }
    let mut current = entries(&read_text(sandbox, RUNTIME_DROP_IN).await?.unwrap_or_default());
    for domain in domains {
        let had = current.iter().any(|e| entry_name(e) == domain);
        match upload {
            Some(bytes) => {
                current.retain(|e| entry_name(e) != domain);
                current.push(format!("{domain} upload={bytes}"));
            }
            None if !had => current.push(domain.clone()),
            None => {}
        }
    }
    let after = policy_in(sandbox, Some(&current)).await?;
    apply(sandbox, &current, &after).await
}

/// `deny`: removes `domains` from the runtime drop-in and reloads. A name the drop-in does not
/// hold, or that another entry would still allow, is refused and nothing changes: `deny` takes
/// back what `allow` gave, and never says a name is closed while it is not.
pub async fn deny(sandbox: &Sandbox, domains: &[String]) -> Result<()> {
    sandbox.ensure_running()?;
    let patterns = validate("DOMAIN", domains)?;
    let current = entries(&read_text(sandbox, RUNTIME_DROP_IN).await?.unwrap_or_default());
    let unknown: Vec<&String> =
        domains.iter().filter(|d| !current.iter().any(|e| entry_name(e) == d.as_str())).collect();
    if !unknown.is_empty() {
        return Err(Failure::new(
            Code::BadArgument,
            format!(
                "{} not allowed by `agent-sandbox allow` (its list: {}); the image's policy and \
                 --policy files stay as they are",
                unknown.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", "),
                if current.is_empty() { "empty".to_string() } else { current.join(", ") }
            ),
        ));
    }
    let kept: Vec<String> =
        current.iter().filter(|e| !domains.iter().any(|d| d == entry_name(e))).cloned().collect();
    let after = policy_in(sandbox, Some(&kept)).await?;
    let still = Allowlist::new(&after);
    let stays: Vec<String> = patterns
        .iter()
        .filter_map(|pattern| {
            let by = match pattern {
                DomainPattern::Exact(name) => still.matches(name).map(|m| m.patterns),
                wildcard => after.domains.contains_key(wildcard).then(|| vec![wildcard.clone()]),
            }?;
            let by: Vec<String> = by.iter().map(|p| format!("`{p}`")).collect();
            Some(format!("`{pattern}` stays allowed by {}", by.join(", ")))
        })
        .collect();
    if !stays.is_empty() {
        return Err(Failure::new(
            Code::BadArgument,
            format!(
                "{}: another entry of the sandbox's policy allows it (the image's, a --policy file's, \
                 or a wildcard `allow` gave); nothing changed",
                stays.join("; ")
            ),
        ));
    }
    apply(sandbox, &kept, &after).await
}

/// Of names typed to `allow`, those that would reopen a write channel the policy closed (a
/// forwarded service's other host, a bundle's write host), each with why: approved only with
/// `--yes N` (the page sends them to the command line). A new site typed is what `allow` is for.
pub async fn typed_cautions(sandbox: &Sandbox, domains: &[String]) -> Result<Vec<String>> {
    let policy = policy_in(sandbox, None).await?;
    Ok(domains
        .iter()
        .filter_map(|domain| {
            let name = domain.split(':').next().unwrap_or(domain).trim_start_matches("*.");
            match crate::queue::caution(name, &policy)? {
                crate::queue::Caution::NewSite { .. } => None,
                caution => Some(caution.why(domain)),
            }
        })
        .collect())
}

/// More names than this, `allow --pending` approves only with `--yes N`.
pub const APPROVE_WITHOUT_YES: usize = 3;

async fn read_mark(sandbox: &Sandbox, path: &str) -> Result<String> {
    Ok(read_text(sandbox, path).await?.unwrap_or_default().trim().to_string())
}

async fn write_mark(sandbox: &Sandbox, path: &str, mark: &str) -> Result<()> {
    let entry = Entry { path: path.into(), contents: Some(mark.as_bytes().to_vec()), mode: 0o644, uid: 0 };
    sandbox.put(&[entry]).await
}

/// Both denial logs, read so that no rotation between the two reads loses or repeats lines: the
/// current file read before and after the rotated one must be the same file grown.
async fn denial_lines(sandbox: &Sandbox) -> Result<String> {
    let [rotated, current] = denial_logs();
    let (rotated, current) = (rotated.as_str(), current.as_str());
    for _ in 0..5 {
        let before = read_text(sandbox, current).await?.unwrap_or_default();
        let old = read_text(sandbox, rotated).await?.unwrap_or_default();
        let after = read_text(sandbox, current).await?.unwrap_or_default();
        if after.starts_with(&before) {
            return Ok(old + &after);
        }
    }
    Err(Failure::new(
        Code::Sandbox,
        format!("{}'s denial log rotated under every read; try again", sandbox.name),
    ))
}

/// The sandbox's policy in force and everything its denial log holds, read as the queue reads
/// it but from the start (`why`).
pub async fn record(sandbox: &Sandbox) -> Result<(Policy, Queue)> {
    let lines = denial_lines(sandbox).await?;
    let policy = policy_in(sandbox, None).await?;
    let record = queue(&lines, "", &policy);
    Ok((policy, record))
}

/// The sandbox's approval queue: refused names after the mark, not allowed now.
async fn read_queue(sandbox: &Sandbox) -> Result<Queue> {
    let lines = denial_lines(sandbox).await?;
    let mark = read_mark(sandbox, PENDING_MARK).await?;
    let policy = policy_in(sandbox, None).await?;
    Ok(queue(&lines, &mark, &policy))
}

/// What the last `pending` showed: exactly the names `allow --pending` may approve, and how
/// far it read (the mark approving or dismissing moves to).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Review {
    until: String,
    names: Vec<String>,
}

async fn read_review(sandbox: &Sandbox) -> Result<Option<Review>> {
    let mark = read_mark(sandbox, PENDING_MARK).await?;
    let text = read_mark(sandbox, REVIEWED_MARK).await?;
    let review: Review = serde_json::from_str(&text).unwrap_or_default();
    Ok((!review.until.is_empty() && review.until > mark).then_some(review))
}

fn nothing_reviewed(sandbox: &Found, what: &str) -> Failure {
    Failure::new(
        Code::BadArgument,
        format!(
            "nothing reviewed to {what}: `agent-sandbox pending {}` shows the queue, then --pending \
             approves (or --dismiss drops) exactly what it showed",
            sandbox.name
        ),
    )
}

/// `pending`: the queue, which the user has now seen: its names are what `allow --pending` may
/// approve, and nothing else.
pub async fn pending(sandbox: &Sandbox) -> Result<Queue> {
    let queue = read_queue(sandbox).await?;
    if let Some(newest) = &queue.newest {
        let review =
            Review { until: newest.clone(), names: queue.names.iter().map(|p| p.name.clone()).collect() };
        write_mark(sandbox, REVIEWED_MARK, &serde_json::to_string(&review).expect("serialises")).await?;
    }
    Ok(queue)
}

/// `pending --dismiss`: drops what the last `pending` showed, as far as it read.
pub async fn dismiss(sandbox: &Sandbox) -> Result<usize> {
    let review = read_review(sandbox).await?.ok_or_else(|| nothing_reviewed(sandbox, "dismiss"))?;
    write_mark(sandbox, PENDING_MARK, &review.until).await?;
    Ok(review.names.len())
}

/// `allow --pending`: allows the names the last `pending` showed (and `extra`) that are still
/// not allowed, nothing the agent asked for since or the user did not see; more than
/// [`APPROVE_WITHOUT_YES`] only with `yes` saying how many.
pub async fn allow_pending(sandbox: &Sandbox, extra: &[String], yes: Option<usize>) -> Result<Vec<String>> {
    sandbox.ensure_running()?;
    let review = read_review(sandbox).await?.ok_or_else(|| nothing_reviewed(sandbox, "approve"))?;
    let policy = policy_in(sandbox, None).await?;
    let allowlist = Allowlist::new(&policy);
    let mut domains = extra.to_vec();
    domains.extend(review.names.into_iter().filter(|name| allowlist.matches(name).is_none()));
    let cautions: Vec<String> =
        domains.iter().filter_map(|name| crate::queue::caution(name, &policy).map(|c| c.why(name))).collect();
    if (domains.len() > APPROVE_WITHOUT_YES || !cautions.is_empty()) && yes != Some(domains.len()) {
        let why = if cautions.is_empty() { String::new() } else { format!("\n  {}", cautions.join("\n  ")) };
        return Err(Failure::new(
            Code::BadArgument,
            format!(
                "this would approve {} names ({}): add --yes {} to approve exactly these, or allow \
                 some by name; nothing changed{why}",
                domains.len(),
                domains.join(", "),
                domains.len()
            ),
        ));
    }
    if !domains.is_empty() {
        allow(sandbox, &domains, None).await?;
    }
    write_mark(sandbox, PENDING_MARK, &review.until).await?;
    Ok(domains)
}

/// The web page's approval: the queue as it is now must hold exactly the names the page showed
/// (`shown`), or nothing changes ([`Code::Changed`]: the page looks again). Then it is what
/// `pending` and `allow --pending --yes N` would do, in one step under the caller's hold: a name
/// that arrived after the page looked waits for the next look.
/// A name that needs a second look ([`crate::queue::Caution`]), or more than
/// [`APPROVE_WITHOUT_YES`] names, are approved only `confirmed`: the page sends that from its
/// dialog alone, which lists each with why.
pub async fn approve_shown(sandbox: &Sandbox, shown: &[String], confirmed: bool) -> Result<Vec<String>> {
    sandbox.ensure_running()?;
    review_shown(sandbox, shown).await?;
    if !confirmed {
        let policy = policy_in(sandbox, None).await?;
        let mut cautions: Vec<String> = shown
            .iter()
            .filter_map(|name| crate::queue::caution(name, &policy).map(|c| c.why(name)))
            .collect();
        if shown.len() > APPROVE_WITHOUT_YES {
            cautions.push(format!("{} names at once", shown.len()));
        }
        if !cautions.is_empty() {
            return Err(Failure::new(
                Code::BadArgument,
                format!("approved only through the dialog, which says why: {}", cautions.join("; ")),
            ));
        }
    }
    allow_pending(sandbox, &[], Some(shown.len())).await
}

/// The web page's dismissal: as [`approve_shown`], then `pending --dismiss`.
pub async fn dismiss_shown(sandbox: &Sandbox, shown: &[String]) -> Result<usize> {
    review_shown(sandbox, shown).await?;
    dismiss(sandbox).await
}

/// Writes the review `pending` would, of exactly `shown` and as far as the one read that found
/// them, unless the queue now holds other names.
async fn review_shown(sandbox: &Sandbox, shown: &[String]) -> Result<()> {
    let queue = read_queue(sandbox).await?;
    let now: Vec<&str> = queue.names.iter().map(|p| p.name.as_str()).collect();
    let mut sorted_shown: Vec<&str> = shown.iter().map(String::as_str).collect();
    sorted_shown.sort();
    let mut sorted_now = now.clone();
    sorted_now.sort();
    if sorted_shown.is_empty() || sorted_shown != sorted_now {
        return Err(Failure::new(
            Code::Changed,
            format!(
                "{}'s queue changed since it was shown (now: {}); nothing changed: look again",
                sandbox.name,
                if now.is_empty() { "empty".to_string() } else { now.join(", ") }
            ),
        ));
    }
    let until = queue.newest.unwrap_or_default();
    let review = Review { until, names: shown.to_vec() };
    write_mark(sandbox, REVIEWED_MARK, &serde_json::to_string(&review).expect("serialises")).await
}

/// The queue as it is, for a page that shows it: unlike [`pending`], reading it marks nothing.
pub async fn queue_now(sandbox: &Sandbox) -> Result<Queue> {
    read_queue(sandbox).await
}

/// The policy in force (as PID 1's status lists it) and the runtime drop-in's entries (what
/// `allow` gave, what `deny` takes back).
pub async fn policy_now(sandbox: &Sandbox) -> Result<(Vec<String>, Vec<String>)> {
    let in_force = domains_in_force(sandbox).await?;
    let runtime = entries(&read_text(sandbox, RUNTIME_DROP_IN).await?.unwrap_or_default());
    Ok((in_force, runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_folder_is_this_users_alone_and_no_link_is_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let dir = lock_dir(base.path(), uid).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(lock_dir(base.path(), uid).unwrap(), dir, "found again");
        // Opened by another user first, or widened: refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(lock_dir(base.path(), uid).is_err());
        assert!(lock_dir(base.path(), uid + 1).is_err(), "a folder of another uid");
        // A link where the folder should be: refused.
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path(), base.path().join(format!("agent-sandbox-{}", uid + 2)))
            .unwrap();
        assert!(lock_dir(base.path(), uid + 2).is_err());
        // A link where the lock should be: not followed.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let target = other.path().join("target");
        std::os::unix::fs::symlink(&target, dir.join("x.lock")).unwrap();
        use std::os::unix::fs::OpenOptionsExt as _;
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .custom_flags(no_follow())
            .open(dir.join("x.lock"));
        assert!(opened.is_err() && !target.exists(), "the link was followed");
    }

    #[test]
    fn a_bad_domain_names_its_argument_and_character() {
        let err = validate("--allow", &["docs.rs".into(), "exa mple.com".into()]).unwrap_err();
        assert_eq!(err.code, Code::BadArgument);
        assert!(err.message.starts_with("--allow #2 `exa mple.com`, character 4: "), "{err}");
        let err = validate("DOMAIN", &["https://docs.rs".into()]).unwrap_err();
        assert!(err.message.starts_with("DOMAIN #1 `https://docs.rs`, character 7: "), "{err}");
        assert!(validate("DOMAIN", &["*.python.org".into(), "pypi.org:443".into()]).is_ok());
    }

    #[test]
    fn the_drop_in_round_trips_its_entries() {
        let text = render(&["docs.rs".into(), "*.python.org:443".into()]);
        assert!(text.starts_with("# Written by"));
        assert_eq!(entries(&text), ["docs.rs", "*.python.org:443"]);
        assert!(Policy::from_list(Path::new(RUNTIME_DROP_IN), &text).is_ok());
    }
}
