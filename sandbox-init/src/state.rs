//! Agent state that outlives the container: the directories an image names in
//! `SANDBOX_STATE_DIRS` (its CLI's configuration and credentials, such as `~/.claude`), meant to
//! be mounted as volumes. Before the agent starts, PID 1 creates the missing ones and hands a
//! mounted one that belongs to another user to the agent: a fresh volume is root's, a bind mount
//! keeps the host's owner.
//!
//! The agent wrote these directories in an earlier run, and another container may be writing
//! them right now, so they are untrusted and changing: every step is taken relative to a
//! directory already open (never by path), every name is opened without following a link, and
//! an entry is checked and changed through the one descriptor, so that swapping a directory for
//! a link between the two cannot redirect root. The walk never leaves the directory's file
//! system and leaves files with other hard links alone.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, Stat, Uid};

use crate::console;

/// The image's list of state directories: `:`-separated, absolute or `~/…`.
pub use crate::policy::layout::STATE_DIRS_ENV as ENV;
/// Deeper than this, a walk hands nothing over: real CLI state is shallow, and a deep tree is
/// only a way to make PID 1 hold a descriptor per level.
const MAX_DEPTH: usize = 64;

/// What [`prepare`] did to one directory.
#[derive(Debug, PartialEq, Eq)]
pub enum Prepared {
    /// It did not exist; it is now the agent's.
    Created,
    /// It was already the agent's: nothing changed.
    Kept,
    /// It belonged to `from_uid`; `entries` entries are now the agent's, and `skipped` were left
    /// alone (other file systems, files with other hard links, too deep).
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

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

/// Opens `name` in `dir` as a directory, refusing a symbolic link.
fn open_dir(dir: impl AsFd, name: &OsStr, path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(&dir, name, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
            // Only for the message: the open has already refused it.
            let link = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink);
            let what = if link { "is a symbolic link" } else { "is not a directory" };
            io::Error::other(format!("{} {what}", path.display()))
        }
        other => errno(other),
    })
}

/// Makes `dir` (inside `home`) a directory the agent owns: created if missing, handed over if
/// another user owns it.
pub fn prepare(dir: &Path, home: &Path, uid: u32, gid: u32) -> io::Result<Prepared> {
    let relative = dir
        .strip_prefix(home)
        .map_err(|_| io::Error::other(format!("{} is not inside {}", dir.display(), home.display())))?;
    let (owner, group) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    let mut current = open_dir(CWD, home.as_os_str(), home)?;
    let home_dev = rustix::fs::fstat(&current).map_err(errno)?.st_dev;
    let mut path = home.to_path_buf();
    let mut created = false;
    let last = relative.components().count();
    for (index, component) in relative.components().enumerate() {
        let name = component.as_os_str();
        path.push(name);
        let mut made = false;
        match rustix::fs::mkdirat(&current, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                rustix::fs::chownat(&current, name, owner, group, AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(errno)?;
                created = true;
                made = true;
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(errno(e)),
        }
        current = open_dir(&current, name, &path)?;
        // A folder between the home and a state directory that the engine made, root's, to mount
        // a volume under (~/.local for ~/.local/state/kilo): the agent's, as the rest of its home
        // is, so that its CLI can make a sibling there (Kilo's ~/.local/state/kilo-sandbox-policy).
        // Only one of the home's own file system: a folder mounted from elsewhere keeps its owner.
        if !made && index + 1 < last {
            let stat = rustix::fs::fstat(&current).map_err(errno)?;
            if stat.st_uid == 0 && uid != 0 && stat.st_dev == home_dev {
                // Where PID 1 may not (sidecar mode's agent container), the folder stays root's.
                let _ = rustix::fs::fchown(&current, owner, group);
            }
        }
    }
    if created {
        return Ok(Prepared::Created);
    }
    let top = rustix::fs::fstat(&current).map_err(errno)?;
    if top.st_uid == uid {
        return Ok(Prepared::Kept);
    }
    rustix::fs::fchown(&current, owner, group).map_err(errno)?;
    let mut walk = Walk { dev: top.st_dev, owner, group, entries: 1, skipped: 0 };
    walk.hand_over(current, 0)?;
    Ok(Prepared::HandedOver { from_uid: top.st_uid, entries: walk.entries, skipped: walk.skipped })
}

struct Walk {
    dev: u64,
    owner: Option<Uid>,
    group: Option<Gid>,
    entries: u64,
    skipped: u64,
}

impl Walk {
    fn hand_over(&mut self, dir: OwnedFd, depth: usize) -> io::Result<()> {
        for entry in Dir::new(dir.try_clone()?).map_err(errno)? {
            let entry = entry.map_err(errno)?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            // O_PATH and no link followed: a handle on the entry itself, whatever it is now.
            // It is checked and changed through that handle, so a swap after the check changes
            // nothing but what was checked.
            let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let handle = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
                Ok(handle) => handle,
                // Gone since the listing: nothing to hand over.
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(errno(e)),
            };
            let meta: Stat = rustix::fs::fstat(&handle).map_err(errno)?;
            let kind = FileType::from_raw_mode(meta.st_mode);
            let is_dir = kind == FileType::Directory;
            if meta.st_dev != self.dev || (!is_dir && meta.st_nlink > 1) || (is_dir && depth >= MAX_DEPTH) {
                self.skipped += 1;
                continue;
            }
            // The inode of the handle (a link itself, not what it points to).
            rustix::fs::chownat(&handle, c"", self.owner, self.group, AtFlags::EMPTY_PATH).map_err(errno)?;
            self.entries += 1;
            if is_dir {
                // "." of the handle: the directory that was checked, even if its name now
                // leads elsewhere.
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
                let sub = rustix::fs::openat(&handle, c".", flags, Mode::empty()).map_err(errno)?;
                self.hand_over(sub, depth + 1)?;
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
        console::err(format!("sandbox-init: WARNING: {warning}"));
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
                console::err(format!(
                    "sandbox-init: state {} belonged to uid {from_uid}: handed {entries} entries to the agent{skipped}",
                    dir.display()
                ));
            }
            Err(e) => console::err(format!(
                "sandbox-init: WARNING: state {}: cannot make it the agent's (uid {uid}): {e}; \
                 the agent may not be able to write it (chown it to {uid}:{gid} where it lives)",
                dir.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, lchown};

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

    /// The engine makes the folders above a volume's mount point, root's (~/.local for a volume
    /// at ~/.local/state/kilo): they become the agent's, and a folder the agent owns already, or
    /// the state directory's own contents, are not walked. Needs root (it owns them first).
    #[test]
    fn the_folders_the_engine_made_above_a_state_directory_become_the_agents() {
        if ids().0 != 0 {
            return;
        }
        let home = tempfile::tempdir().unwrap();
        let state = home.path().join(".local/state/kilo");
        std::fs::create_dir_all(&state).unwrap();
        let (agent, group) = (4321, 4321);
        std::fs::create_dir(home.path().join(".local/state/mine")).unwrap();
        lchown(home.path().join(".local/state/mine"), Some(1234), Some(1234)).unwrap();
        prepare(&state, home.path(), agent, group).unwrap();
        for folder in [".local", ".local/state", ".local/state/kilo"] {
            let owner = std::fs::metadata(home.path().join(folder)).unwrap().uid();
            assert_eq!(owner, agent, "{folder}");
        }
        // A sibling is not the walk's: only the way down is.
        assert_eq!(std::fs::metadata(home.path().join(".local/state/mine")).unwrap().uid(), 1234);
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
