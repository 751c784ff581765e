//! Files that must be root's alone, judged by what the agent could do with them: a secret PID 1
//! reads (a key, a token, an extra CA: `read_secret`) is refused if the agent could read or
//! write it or its folder, and the policy (`policy_writable`) if the agent could write it and so
//! widen its own allowlist at the next reload.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use crate::exit::{Fatal, Refusal};
use crate::privileges::AgentPrivileges;

/// A secret file, if it exists: its contents trimmed. Refused (the key would be the agent's, or
/// the agent could choose it): a file or folder the agent owns (an owner may chmod at will), one
/// whose mode lets the agent read or write it, one with an access control list (whose entries
/// the mode does not show), a link, anything but a regular file; and an empty one.
pub fn read_secret(path: &Path, agent: &AgentPrivileges) -> Result<Option<String>, Fatal> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let unreadable =
        |e: &dyn std::fmt::Display| Fatal::new(Refusal::PolicyUnreadable, format!("{}: {e}", path.display()));
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused(path, "is a symbolic link"));
        }
        Err(e) => return Err(unreadable(&e)),
    };
    let meta = file.metadata().map_err(|e| unreadable(&e))?;
    if !meta.is_file() {
        return Err(refused(path, "is not a regular file"));
    }
    if let Some(why) = agent_reach(&meta, agent, 0o6, "lets the agent read or write it") {
        return Err(refused(path, &why));
    }
    if has_acl(&file) {
        return Err(refused(path, "carries an access control list, whose entries may let the agent read it"));
    }
    // The folder: one the agent could write would let it swap or plant a secret for the next start.
    if let Some(dir) = path.parent()
        && let Ok(dir_meta) = std::fs::symlink_metadata(dir)
        && let Some(why) = agent_reach(&dir_meta, agent, 0o2, "is writable by the agent")
    {
        return Err(refused(dir, &why));
    }
    let mut text = String::new();
    (&file).take(1 << 20).read_to_string(&mut text).map_err(|e| unreadable(&e))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(Fatal::new(Refusal::BadSetting, format!("{} is empty", path.display())));
    }
    Ok(Some(text.to_string()))
}

fn refused(path: &Path, why: &str) -> Fatal {
    Fatal::new(
        Refusal::BadSetting,
        format!(
            "{} {why}: a secret must be root's alone (owned by root, mode 600 or 400, in a folder only \
             root may write; `mode: 0400` for a compose secret)",
            path.display()
        ),
    )
}

/// Why the agent could reach this file or folder with `access` (the "other" bits: 0o6 to read
/// or write it, 0o2 to write it), if it could: as its owner (who may chmod it at will), or by
/// the mode's bits for its group or for others. `how` says what those bits let it do.
fn agent_reach(meta: &std::fs::Metadata, agent: &AgentPrivileges, access: u32, how: &str) -> Option<String> {
    let (mode, uid, gid) = (meta.mode() & 0o7777, meta.uid(), meta.gid());
    let bits = if gid == agent.gid { access << 3 | access } else { access };
    if uid == agent.uid {
        Some(format!("is owned by the agent's uid {uid}, which may change its mode"))
    } else if mode & bits != 0 {
        Some(format!("{how} (owner {uid}, group {gid}, mode {mode:o})"))
    } else {
        None
    }
}

/// The first of the policy's folder, its file and its drop-ins (each followed, as a ConfigMap's
/// links are) that the agent could write, and why: the agent would widen its own allowlist at the
/// next reload. One on a read-only mount (`:ro`) is no one's to write, whoever owns it.
pub fn policy_writable(
    root: &Path,
    baked: &Path,
    drop_ins: &Path,
    agent: &AgentPrivileges,
) -> Option<String> {
    let mut paths = vec![root.to_path_buf(), baked.to_path_buf(), drop_ins.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(drop_ins) {
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        paths.extend(files);
    }
    paths.into_iter().find_map(|path| {
        let file = std::fs::File::open(&path).ok()?;
        let meta = file.metadata().ok()?;
        if read_only_mount(&file) {
            return None;
        }
        let why = agent_reach(&meta, agent, 0o2, "lets the agent write it").or_else(|| {
            has_acl(&file)
                .then(|| "carries an access control list, whose entries may let the agent write it".into())
        })?;
        Some(format!("{} {why}", path.display()))
    })
}

/// Whether the file is on a mount that is read-only (nothing writes it through this mount).
fn read_only_mount(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd as _;
    // SAFETY: fstatvfs fills the struct it is given, from an open descriptor.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let done = unsafe { libc::fstatvfs(file.as_raw_fd(), &mut stat) };
    done == 0 && stat.f_flag & libc::ST_RDONLY != 0
}

/// Whether the file carries a POSIX access control list.
fn has_acl(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd as _;
    // SAFETY: fgetxattr asking only for the size (a null buffer of length 0).
    let size = unsafe {
        libc::fgetxattr(file.as_raw_fd(), c"system.posix_acl_access".as_ptr(), std::ptr::null_mut(), 0)
    };
    size > 0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// An agent of neither this process's uid nor its gid (the keys' tests take it too).
    pub(crate) fn agent() -> AgentPrivileges {
        let mut agent = AgentPrivileges::system(4242);
        agent.gid = 4243;
        agent
    }

    #[test]
    fn a_secret_the_agent_could_read_is_refused_and_one_it_cannot_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("anthropic_api_key");
        std::fs::write(&path, "sk-ant-real\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        let refused = read_secret(&path, &agent()).unwrap_err();
        assert_eq!(refused.refusal, Refusal::BadSetting);
        assert!(
            refused.message.contains("lets the agent read") && refused.message.contains("mode 444"),
            "{}",
            refused.message
        );
        // Owned by the agent: refused whatever the mode, since the owner may chmod it.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        let mut owner = agent();
        owner.uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&path).unwrap());
        let refused = read_secret(&path, &owner).unwrap_err();
        assert!(refused.message.contains("owned by the agent"), "{}", refused.message);
        // A link, even to a good file, and a folder the agent may write.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read_secret(&link, &agent()).unwrap_err().message.contains("symbolic link"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(read_secret(&path, &agent()).unwrap_err().message.contains("is writable by the agent"));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(read_secret(&path, &agent()).unwrap().as_deref(), Some("sk-ant-real"));
        assert_eq!(read_secret(&dir.path().join("none"), &agent()).unwrap(), None);
    }

    #[test]
    fn a_policy_file_or_drop_in_the_agent_could_write_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (baked, drop_ins) = (dir.path().join("policy.yaml"), dir.path().join("policy.d"));
        std::fs::write(&baked, "version: 1\n").unwrap();
        std::fs::create_dir(&drop_ins).unwrap();
        std::fs::set_permissions(&drop_ins, std::fs::Permissions::from_mode(0o755)).unwrap();
        let extra = drop_ins.join("extra.txt");
        std::fs::write(&extra, "example.com\n").unwrap();
        for path in [&baked, &extra] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let writable = || policy_writable(dir.path(), &baked, &drop_ins, &agent());
        assert_eq!(writable(), None, "root's alone");
        std::fs::set_permissions(&extra, std::fs::Permissions::from_mode(0o646)).unwrap();
        let why = writable().unwrap();
        assert!(why.contains("extra.txt lets the agent write it") && why.contains("mode 646"), "{why}");
        std::fs::set_permissions(&extra, std::fs::Permissions::from_mode(0o644)).unwrap();
        // The folder of the drop-ins, and a policy file the agent owns.
        std::fs::set_permissions(&drop_ins, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(writable().unwrap().contains("policy.d lets the agent write it"));
        std::fs::set_permissions(&drop_ins, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut owner = agent();
        owner.uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&baked).unwrap());
        assert!(
            policy_writable(dir.path(), &baked, &drop_ins, &owner).unwrap().contains("owned by the agent")
        );
    }
}
