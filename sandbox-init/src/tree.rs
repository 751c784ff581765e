//! Removing a directory tree the agent built. The agent owns tmux's socket directory and can
//! nest directories in it a hundred thousand deep: a recursive removal holds a descriptor per
//! level and fails at the descriptor limit, and a path to the bottom is longer than any path
//! may be. A container whose leftover directory cannot be removed would never start again.
//!
//! [`remove`] holds two descriptors whatever the depth: it moves the grandchildren of the top
//! directory up into it, one level a round, removing each child once it is empty. Every entry
//! is moved once. No link is followed: a link is an entry like a file.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, RenameFlags};

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

fn open_dir(at: impl rustix::fd::AsFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(at, name, flags, Mode::empty())
}

/// The entries of a directory: name, and whether it is a directory (not following a link).
fn entries(dir: &OwnedFd) -> io::Result<Vec<(CString, bool)>> {
    let mut found = Vec::new();
    // A fresh open file description each time: a duplicate would share the offset, and a
    // second listing would start at the end.
    for entry in Dir::read_from(dir).map_err(errno)? {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory),
            _ => false,
        };
        found.push((name.to_owned(), is_dir));
    }
    Ok(found)
}

/// Removes `path` and everything under it; a path that does not exist is already removed.
pub fn remove(path: &Path) -> io::Result<()> {
    let top = match open_dir(CWD, path.as_os_str()) {
        Ok(top) => top,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        // A file or a link where the directory was: removed as it is.
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            return rustix::fs::unlinkat(CWD, path.as_os_str(), AtFlags::empty()).map_err(errno);
        }
        Err(e) => return Err(errno(e)),
    };
    let mut fresh = 0u64;
    loop {
        let children = entries(&top)?;
        if children.is_empty() {
            break;
        }
        for (name, is_dir) in children {
            if !is_dir {
                rustix::fs::unlinkat(&top, name.as_c_str(), AtFlags::empty()).map_err(errno)?;
                continue;
            }
            let child = open_dir(&top, OsStr::from_bytes(name.as_bytes())).map_err(errno)?;
            for (grandchild, _) in entries(&child)? {
                // Up into the top directory under a name of ours; one the agent took is skipped.
                loop {
                    fresh += 1;
                    let moved = format!(".removing-{fresh}");
                    match rustix::fs::renameat_with(
                        &child,
                        grandchild.as_c_str(),
                        &top,
                        moved.as_str(),
                        RenameFlags::NOREPLACE,
                    ) {
                        Ok(()) => break,
                        Err(rustix::io::Errno::EXIST) => continue,
                        Err(e) => return Err(errno(e)),
                    }
                }
            }
            drop(child);
            rustix::fs::unlinkat(&top, name.as_c_str(), AtFlags::REMOVEDIR).map_err(errno)?;
        }
    }
    drop(top);
    rustix::fs::unlinkat(CWD, path.as_os_str(), AtFlags::REMOVEDIR).map_err(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `depth` directories `d` under `dir`, each made relative to the one above.
    fn chain(dir: &Path, depth: usize) {
        let mut at = open_dir(CWD, dir.as_os_str()).unwrap();
        for _ in 0..depth {
            rustix::fs::mkdirat(&at, "d", Mode::from_raw_mode(0o755)).unwrap();
            at = open_dir(&at, OsStr::new("d")).unwrap();
        }
        rustix::fs::openat(&at, "file", OFlags::CREATE | OFlags::WRONLY, Mode::from_raw_mode(0o644)).unwrap();
    }

    #[test]
    fn a_chain_deeper_than_any_path_and_the_descriptor_limit_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("tmux");
        std::fs::create_dir(&top).unwrap();
        // 3000 levels of `d/` are 6000 bytes of path: longer than PATH_MAX.
        chain(&top, 3000);
        std::fs::write(top.join(".removing-2"), "a name the removal would have used").unwrap();
        std::os::unix::fs::symlink("/etc", top.join("link")).unwrap();
        remove(&top).unwrap();
        assert!(!top.exists());
        assert!(Path::new("/etc").exists(), "the link was removed, not followed");
    }

    #[test]
    fn a_missing_path_is_removed_and_a_file_in_its_place_goes() {
        let tmp = tempfile::tempdir().unwrap();
        remove(&tmp.path().join("none")).unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "x").unwrap();
        remove(&file).unwrap();
        assert!(!file.exists());
    }
}
