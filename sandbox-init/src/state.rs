//! Agent state that outlives the container: the directories an image names in
//! `SANDBOX_STATE_DIRS` (its CLI's configuration and credentials, such as `~/.claude`), meant to
//! be mounted as volumes. Before the agent starts, PID 1 creates the missing ones and hands a
//! mounted one that belongs to another user to the agent: a fresh volume is root's, a bind mount
//! keeps the host's owner.
//!
//! The agent wrote these directories in an earlier run, so they are untrusted: the walk never
//! follows a symbolic link, never leaves the agent's home or the directory's file system, and
//! leaves files with other hard links alone. Otherwise a planted link would let root give the
//! agent /etc/agent-sandbox.

use std::io;
use std::os::unix::fs::{MetadataExt as _, lchown};
use std::path::{Component, Path, PathBuf};

/// The image's list of state directories: `:`-separated, absolute or `~/…`.
pub const ENV: &str = "SANDBOX_STATE_DIRS";

/// What [`prepare`] did to one directory.
#[derive(Debug, PartialEq, Eq)]
pub enum Prepared {
    /// It did not exist; it is now the agent's.
    Created,
    /// It was already the agent's: nothing changed.
    Kept,
    /// It belonged to `from_uid`; `entries` entries are now the agent's, and `skipped` were left
    /// alone (other file systems, files with other hard links).
    HandedOver { from_uid: u32, entries: u64, skipped: u64 },
}

/// The directories `value` names, under `home`, and a warning for each entry that is not.
pub fn dirs_from(value: &str, home: &Path) -> (Vec<PathBuf>, Vec<String>) {
    let mut dirs = Vec::new();
    let mut warnings = Vec::new();
    for entry in value.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let path = match entry.strip_prefix('~') {
            Some("") => home.to_path_buf(),
            Some(rest) if rest.starts_with('/') => home.join(rest.trim_start_matches('/')),
            _ => PathBuf::from(entry),
        };
        let inside = path.is_absolute()
            && path.starts_with(home)
            && path != home
            && path.components().all(|c| !matches!(c, Component::ParentDir | Component::CurDir));
        if inside {
            dirs.push(path);
        } else {
            warnings.push(format!(
                "{ENV}: `{entry}` is not a directory inside the agent's home ({}): ignored",
                home.display()
            ));
        }
    }
    (dirs, warnings)
}

/// Makes `dir` (inside `home`) a directory the agent owns: created if missing, handed over if
/// another user owns it.
pub fn prepare(dir: &Path, home: &Path, uid: u32, gid: u32) -> io::Result<Prepared> {
    let relative = dir
        .strip_prefix(home)
        .map_err(|_| io::Error::other(format!("{} is not inside {}", dir.display(), home.display())))?;
    let mut current = home.to_path_buf();
    // One lstat per component; the last one is the directory's own.
    let mut top = real_directory(&current, std::fs::symlink_metadata(&current)?)?;
    let mut created = false;
    for component in relative.components() {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) => top = real_directory(&current, meta)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&current)?;
                lchown(&current, Some(uid), Some(gid))?;
                created = true;
            }
            Err(e) => return Err(e),
        }
    }
    if created {
        return Ok(Prepared::Created);
    }
    if top.uid() == uid {
        return Ok(Prepared::Kept);
    }
    lchown(dir, Some(uid), Some(gid))?;
    let mut walk = Walk { dev: top.dev(), uid, gid, entries: 1, skipped: 0 };
    walk.hand_over(dir)?;
    Ok(Prepared::HandedOver { from_uid: top.uid(), entries: walk.entries, skipped: walk.skipped })
}

/// `meta` (from lstat), if `path` is a directory and not a symbolic link.
fn real_directory(path: &Path, meta: std::fs::Metadata) -> io::Result<std::fs::Metadata> {
    if meta.file_type().is_symlink() {
        return Err(io::Error::other(format!("{} is a symbolic link", path.display())));
    }
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", path.display())));
    }
    Ok(meta)
}

struct Walk {
    dev: u64,
    uid: u32,
    gid: u32,
    entries: u64,
    skipped: u64,
}

impl Walk {
    fn hand_over(&mut self, dir: &Path) -> io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            // DirEntry::metadata does not follow a symbolic link.
            let meta = entry.metadata()?;
            if meta.dev() != self.dev || (!meta.is_dir() && meta.nlink() > 1) {
                self.skipped += 1;
                continue;
            }
            let path = entry.path();
            lchown(&path, Some(self.uid), Some(self.gid))?;
            self.entries += 1;
            if meta.is_dir() {
                self.hand_over(&path)?;
            }
        }
        Ok(())
    }
}

/// Prepares every state directory the environment names, telling the container's log what it
/// did. A directory that cannot be prepared is a warning, not a refusal: the agent then cannot
/// write it, which its CLI reports, but nothing about the sandbox is weaker.
pub fn prepare_from_env(home: &Path, uid: u32, gid: u32) {
    let Ok(value) = std::env::var(ENV) else { return };
    let (dirs, warnings) = dirs_from(&value, home);
    for warning in warnings {
        eprintln!("sandbox-init: WARNING: {warning}");
    }
    for dir in dirs {
        match prepare(&dir, home, uid, gid) {
            Ok(Prepared::Created | Prepared::Kept) => {}
            Ok(Prepared::HandedOver { from_uid, entries, skipped }) => {
                let skipped = if skipped > 0 {
                    format!(", {skipped} left alone (other file systems or hard links)")
                } else {
                    String::new()
                };
                eprintln!(
                    "sandbox-init: state {} belonged to uid {from_uid}: handed {entries} entries to the agent{skipped}",
                    dir.display()
                );
            }
            Err(e) => eprintln!(
                "sandbox-init: WARNING: state {}: cannot make it the agent's (uid {uid}): {e}; \
                 the agent may not be able to write it (chown it to {uid}:{gid} where it lives)",
                dir.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_are_absolute_or_under_the_home_and_never_outside_it() {
        let home = Path::new("/home/agent");
        let (dirs, warnings) =
            dirs_from(" ~/.claude::/home/agent/.config/opencode:~:/etc:.codex:~/../root ", home);
        assert_eq!(
            dirs,
            [PathBuf::from("/home/agent/.claude"), PathBuf::from("/home/agent/.config/opencode")]
        );
        assert_eq!(warnings.len(), 4, "{warnings:#?}");
        assert!(warnings[1].contains("`/etc` is not a directory inside the agent's home (/home/agent)"));
        assert!(dirs_from("", home).0.is_empty());
    }

    fn ids() -> (u32, u32) {
        // SAFETY: getuid/getgid cannot fail.
        unsafe { (libc::getuid(), libc::getgid()) }
    }

    #[test]
    fn a_missing_directory_is_created_with_its_parents() {
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".local/share/opencode");
        let (uid, gid) = ids();
        assert_eq!(prepare(&dir, home.path(), uid, gid).unwrap(), Prepared::Created);
        assert!(dir.is_dir());
        assert_eq!(prepare(&dir, home.path(), uid, gid).unwrap(), Prepared::Kept);
    }

    #[test]
    fn a_symbolic_link_on_the_way_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), home.path().join(".config")).unwrap();
        let (uid, gid) = ids();
        let err = prepare(&home.path().join(".config/opencode"), home.path(), uid, gid).unwrap_err();
        assert!(err.to_string().ends_with(".config is a symbolic link"), "{err}");
        assert!(!elsewhere.path().join("opencode").exists(), "nothing is created through the link");
        std::fs::write(home.path().join(".aider"), "a file").unwrap();
        let err = prepare(&home.path().join(".aider"), home.path(), uid, gid).unwrap_err();
        assert!(err.to_string().ends_with(".aider is not a directory"), "{err}");
    }

    /// Needs root to own files as another user: the container suite covers the rest.
    #[test]
    fn a_foreign_directory_is_handed_over_without_following_links() {
        let (uid, _) = ids();
        if uid != 0 {
            eprintln!("not root: the hand-over is covered by the container suite only");
            return;
        }
        let home = tempfile::tempdir().unwrap();
        let dir = home.path().join(".claude");
        std::fs::create_dir_all(dir.join("projects")).unwrap();
        std::fs::write(dir.join("projects/a.jsonl"), "{}").unwrap();
        std::fs::write(dir.join("linked"), "two names").unwrap();
        std::fs::hard_link(dir.join("linked"), home.path().join("other-name")).unwrap();
        let outside = home.path().join("policy.yaml");
        std::fs::write(&outside, "root's").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("escape")).unwrap();
        let owner = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        for path in [&dir, &dir.join("projects"), &dir.join("projects/a.jsonl"), &dir.join("linked")] {
            lchown(path, Some(4242), Some(4242)).unwrap();
        }
        let prepared = prepare(&dir, home.path(), 1000, 1000).unwrap();
        assert_eq!(prepared, Prepared::HandedOver { from_uid: 4242, entries: 4, skipped: 1 });
        assert_eq!(owner(&dir.join("projects/a.jsonl")), 1000);
        assert_eq!(owner(&dir.join("escape")), 1000, "the link itself");
        assert_eq!(owner(&outside), uid, "not what it points to");
        assert_eq!(owner(&dir.join("linked")), 4242, "a file with another name elsewhere");
    }
}
