//! Build contexts: the files an image's build reads, their input hash, and the in-memory tar
//! sent to the engine.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use sha2::{Digest, Sha256};

/// Files of an image's folder that are the tests', not the build's: a change to them rebuilds
/// nothing. `turn.yaml`: the agent CLI's headless turn (the agents:: suite); `signin.yaml`: where
/// its sign-in hosts are read out of the installed CLI (the contract suite).
pub const TEST_ONLY: &[&str] = &["turn.yaml", "signin.yaml"];
/// Endings of files no checkout has: insta's pending snapshots, left by a failed snapshot test
/// in sandbox-init's sources (which are hashed the same way). Read, they made one machine's
/// images.lock differ from a clean clone's.
const NEVER_COMMITTED: &[&str] = &[".snap.new", ".pending-snap"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextFile {
    pub mode: u32,
    pub data: Vec<u8>,
}

/// The files of one build, keyed by their path inside the context ('/'-separated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildContext {
    pub files: BTreeMap<String, ContextFile>,
}

impl BuildContext {
    /// Reads every file under `dir` but [`TEST_ONLY`] and insta's pending snapshots. Symbolic links are refused: the engine
    /// would not follow them, and the hash would not see what they point to.
    pub fn from_dir(dir: &Path) -> anyhow::Result<BuildContext> {
        let mut ctx = BuildContext::default();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(current) = pending.pop() {
            let entries = std::fs::read_dir(&current)
                .with_context(|| format!("cannot read the build context '{}'", current.display()))?;
            for entry in entries {
                let entry = entry.with_context(|| format!("cannot read '{}'", current.display()))?;
                let path = entry.path();
                let meta = std::fs::symlink_metadata(&path)
                    .with_context(|| format!("cannot stat '{}'", path.display()))?;
                if meta.is_dir() {
                    pending.push(path);
                } else if meta.is_file() {
                    let rel = path.strip_prefix(dir).expect("walked from dir");
                    let rel = rel.to_string_lossy().replace('\\', "/");
                    if TEST_ONLY.contains(&rel.as_str()) || NEVER_COMMITTED.iter().any(|e| rel.ends_with(e)) {
                        continue;
                    }
                    let data =
                        std::fs::read(&path).with_context(|| format!("cannot read '{}'", path.display()))?;
                    ctx.files.insert(rel, ContextFile { mode: file_mode(&meta), data });
                } else {
                    anyhow::bail!(
                        "'{}' is not a regular file or folder; build contexts hold only those",
                        path.display()
                    );
                }
            }
        }
        Ok(ctx)
    }

    pub fn insert(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        self.files.insert(path.to_string(), ContextFile { mode, data });
    }

    pub fn dockerfile(&self) -> Option<&str> {
        self.files.get("Dockerfile").and_then(|f| std::str::from_utf8(&f.data).ok())
    }

    /// The hash an image is labelled with: context files (path, mode, bytes), build args and
    /// the exact image it is built on. Two builds with the same hash would read the same inputs.
    pub fn input_hash(&self, build_args: &BTreeMap<String, String>, from: &str) -> String {
        let mut h = Sha256::new();
        let mut field = |tag: &str, bytes: &[u8]| {
            h.update(tag.as_bytes());
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field("agent-sandbox inputs", b"v1");
        for (path, file) in &self.files {
            field("path", path.as_bytes());
            field("mode", format!("{:o}", file.mode).as_bytes());
            field("data", &file.data);
        }
        for (key, value) in build_args {
            field("arg", key.as_bytes());
            field("value", value.as_bytes());
        }
        field("from", from.as_bytes());
        format!("sha256:{:x}", h.finalize())
    }

    /// A tar of the context with fixed owners and times, so the same files give the same bytes.
    pub fn to_tar(&self) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, file) in &self.files {
            let mut header = tar::Header::new_gnu();
            header.set_size(file.data.len() as u64);
            header.set_mode(file.mode);
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, path, file.data.as_slice())
                .expect("writing a tar to memory cannot fail");
        }
        builder.into_inner().expect("writing a tar to memory cannot fail")
    }
}

/// Only the executable bit matters to a build; other bits differ between checkouts (umask).
fn file_mode(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    if meta.permissions().mode() & 0o111 != 0 { 0o755 } else { 0o644 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(files: &[(&str, u32, &str)]) -> BuildContext {
        let mut c = BuildContext::default();
        for (p, m, d) in files {
            c.insert(p, *m, d.as_bytes().to_vec());
        }
        c
    }

    fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn pending_snapshots_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("snapshots")).unwrap();
        std::fs::write(dir.path().join("lib.rs"), "fn main() {}\n").unwrap();
        std::fs::write(dir.path().join("snapshots/a.snap"), "kept\n").unwrap();
        std::fs::write(dir.path().join("snapshots/a.snap.new"), "pending\n").unwrap();
        std::fs::write(dir.path().join("snapshots/.b.pending-snap"), "pending\n").unwrap();
        let read = BuildContext::from_dir(dir.path()).unwrap();
        let names: Vec<&String> = read.files.keys().collect();
        assert_eq!(names, ["lib.rs", "snapshots/a.snap"]);
    }

    #[test]
    fn the_hash_is_stable_and_covers_every_input() {
        let base = ctx(&[("Dockerfile", 0o644, "FROM x\n"), ("bin/tool", 0o755, "#!/bin/sh\n")]);
        let a = args(&[("BASE_IMAGE", "sha256:1")]);
        let h = base.input_hash(&a, "sha256:1");
        assert!(h.starts_with("sha256:") && h.len() == 71, "{h}");
        assert_eq!(h, base.clone().input_hash(&a, "sha256:1"), "same inputs, same hash");

        let changed_content = ctx(&[("Dockerfile", 0o644, "FROM y\n"), ("bin/tool", 0o755, "#!/bin/sh\n")]);
        let changed_mode = ctx(&[("Dockerfile", 0o644, "FROM x\n"), ("bin/tool", 0o644, "#!/bin/sh\n")]);
        let renamed = ctx(&[("Dockerfile", 0o644, "FROM x\n"), ("bin/tool2", 0o755, "#!/bin/sh\n")]);
        let extra =
            ctx(&[("Dockerfile", 0o644, "FROM x\n"), ("bin/tool", 0o755, "#!/bin/sh\n"), ("new", 0o644, "")]);
        let others = [
            changed_content.input_hash(&a, "sha256:1"),
            changed_mode.input_hash(&a, "sha256:1"),
            renamed.input_hash(&a, "sha256:1"),
            extra.input_hash(&a, "sha256:1"),
            base.input_hash(&args(&[("BASE_IMAGE", "sha256:2")]), "sha256:1"),
            base.input_hash(&args(&[]), "sha256:1"),
            base.input_hash(&a, "sha256:2"),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(&h, other, "change {i} did not change the hash");
        }
    }

    #[test]
    fn field_boundaries_are_not_ambiguous() {
        let one = ctx(&[("ab", 0o644, "c")]);
        let two = ctx(&[("a", 0o644, "bc")]);
        assert_ne!(one.input_hash(&args(&[]), ""), two.input_hash(&args(&[]), ""));
    }

    #[test]
    fn from_dir_reads_nested_files_with_modes_and_the_tar_is_deterministic() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM x\n").unwrap();
        std::fs::write(dir.path().join("sub/run.sh"), "echo\n").unwrap();
        std::fs::write(dir.path().join("turn.yaml"), "api: x\n").unwrap();
        std::fs::set_permissions(dir.path().join("sub/run.sh"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let c = BuildContext::from_dir(dir.path()).unwrap();
        assert_eq!(c.files.keys().collect::<Vec<_>>(), ["Dockerfile", "sub/run.sh"]);
        assert_eq!(c.files["sub/run.sh"].mode, 0o755);
        assert_eq!(c.files["Dockerfile"].mode, 0o644);
        assert_eq!(c.dockerfile(), Some("FROM x\n"));
        assert_eq!(c.to_tar(), BuildContext::from_dir(dir.path()).unwrap().to_tar());

        let mut archive = tar::Archive::new(std::io::Cursor::new(c.to_tar()));
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["Dockerfile", "sub/run.sh"]);
    }

    #[test]
    fn symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM x\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let err = BuildContext::from_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("link' is not a regular file"), "{err}");
    }
}
