//! images.lock: what every build produced, per image, in a stable, diff-friendly order.
//!
//! Only the version tag is locked: the `sha-<commit>` tag names a commit, and the commit that
//! checks the lock in cannot name itself.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = "images.lock";
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagesLock {
    pub version: u32,
    /// Keyed by image name (its folder under images/).
    pub images: BTreeMap<String, LockedImage>,
}

impl Default for ImagesLock {
    fn default() -> Self {
        ImagesLock { version: FORMAT_VERSION, images: BTreeMap::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedImage {
    /// The image id: the digest of its configuration.
    pub id: String,
    /// The graph parent, absent on roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Exactly what the image was built on: the parent's id, or an external reference.
    pub from: String,
    /// The input hash the image is labelled with.
    pub inputs: String,
    pub tags: Vec<String>,
    /// The Dockerfile's own ARG defaults (the CLI versions an image pins), not the parent's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, String>,
    /// `repository@sha256:…` as served by the registry, once published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

impl ImagesLock {
    /// Reads the lock; a missing file is an empty lock.
    pub fn read(path: &Path) -> anyhow::Result<ImagesLock> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ImagesLock::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let lock: ImagesLock = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column()))?;
        if lock.version != FORMAT_VERSION {
            anyhow::bail!(
                "{}: lock format version {} is not supported (this xtask writes {FORMAT_VERSION})",
                path.display(),
                lock.version
            );
        }
        Ok(lock)
    }

    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("the lock serialises");
        text.push('\n');
        text
    }

    /// Writes through a temporary file and a rename, so a crash never leaves half a lock.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let tmp = path.with_extension("lock.tmp");
        std::fs::write(&tmp, self.render()).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str) -> LockedImage {
        LockedImage {
            id: id.into(),
            parent: Some("os".into()),
            from: "sha256:os".into(),
            inputs: "sha256:in".into(),
            tags: vec!["localhost/agent-sandbox/agent-base:0.1.0".into()],
            args: BTreeMap::new(),
            pinned: None,
        }
    }

    #[test]
    fn round_trips_in_a_stable_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut lock = ImagesLock::default();
        lock.images.insert("shell".into(), entry("sha256:2"));
        lock.images.insert("base".into(), entry("sha256:1"));
        lock.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.find("\"base\"").unwrap() < text.find("\"shell\"").unwrap());
        assert!(!text.contains("pinned"), "unset fields are left out");
        assert_eq!(ImagesLock::read(&path).unwrap(), lock);
    }

    #[test]
    fn a_missing_lock_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ImagesLock::read(&dir.path().join("nope")).unwrap(), ImagesLock::default());
    }

    #[test]
    fn a_broken_lock_names_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{\n  \"version\": 1,\n  \"images\": {},\n  \"extra\": 2\n}\n").unwrap();
        let err = ImagesLock::read(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:4:", path.display())), "{err}");
        assert!(err.contains("unknown field `extra`"), "{err}");
    }
}
