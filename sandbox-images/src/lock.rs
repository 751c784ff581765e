//! images.lock, and the local record beside it.
//!
//! The lock is committed, so it holds only what a checkout determines and what publishing
//! recorded: per image its parent, the Dockerfile's pinned args, its input hash for each platform
//! (its context, args, the platform and its parent's input hash for that platform: the same on
//! every machine, and computed without building, so every platform's is always there) and its
//! registry digest. What one machine's engine made of that (the image id, what exactly it was
//! built on, the build key the engine's index and labels use, whether an extra CA went in, the
//! tags) is local state: one record per platform beside the lock (`images.local.json` for the
//! host's, `images.local.linux-arm64.json` for another), which git ignores.
//!
//! Only the version tag is recorded: the `sha-<commit>` tag names a commit, and the commit that
//! checks the lock in cannot name itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::platform::Platform;

pub const FILE_NAME: &str = "images.lock";
/// The local record of the host's platform, beside the lock.
pub const LOCAL_FILE_NAME: &str = "images.local.json";
/// The lock's format: 3 keys each image's input hash by platform.
const LOCK_VERSION: u32 = 3;
/// The local record's format.
const LOCAL_VERSION: u32 = 2;

/// One entry per image, keyed by its name (its folder under images/), in a versioned file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Images<T> {
    pub version: u32,
    pub images: BTreeMap<String, T>,
}

impl Default for ImagesLock {
    fn default() -> Self {
        Images { version: LOCK_VERSION, images: BTreeMap::new() }
    }
}

impl Default for LocalImages {
    fn default() -> Self {
        Images { version: LOCAL_VERSION, images: BTreeMap::new() }
    }
}

/// images.lock: what the checkout determines.
pub type ImagesLock = Images<LockedImage>;
/// images.local.json: what this machine's engine holds for each image of the lock.
pub type LocalImages = Images<LocalImage>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedImage {
    /// The graph parent, absent on roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The input hash per platform (`linux/amd64`, `linux/arm64`): the context as the checkout
    /// has it, the args, the platform, and the parent's input hash for the same platform (a
    /// root's base reference). No engine id, no extra CA: the same on every machine.
    pub inputs: BTreeMap<String, String>,
    /// The Dockerfile's own ARG defaults (the CLI versions an image pins), not the parent's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, String>,
    /// `repository@sha256:…` as served by the registry, once published from these inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

impl LockedImage {
    /// The input hash for `platform`, if the lock has one.
    pub fn inputs_for(&self, platform: Platform) -> Option<&str> {
        self.inputs.get(platform.name()).map(String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalImage {
    /// The image id: the digest of its configuration.
    pub id: String,
    /// Exactly what the image was built on: the parent's id, or an external reference or id.
    pub from: String,
    /// The build key: the input hash of exactly what the engine was given (the parent's id, the
    /// extra CA). The engine's index tag and the `build` label carry it; an image is reused only
    /// when it matches.
    pub build: String,
    /// Whether `--ca-bundle` put an extra CA into it (or into an ancestor).
    pub extra_ca: bool,
    pub tags: Vec<String>,
}

/// The local record of the host's platform that goes with the lock at `lock`.
pub fn local_path(lock: &Path) -> PathBuf {
    local_path_for(lock, Platform::host())
}

/// The local record of `platform`'s images: `images.local.json` for the host's platform,
/// `images.local.linux-arm64.json` for another.
pub fn local_path_for(lock: &Path, platform: Platform) -> PathBuf {
    if platform == Platform::host() {
        lock.with_file_name(LOCAL_FILE_NAME)
    } else {
        lock.with_file_name(format!("images.local.{}.json", platform.name().replace('/', "-")))
    }
}

impl<T: Serialize + DeserializeOwned> Images<T>
where
    Images<T>: Default,
{
    /// Reads the file at `path`; a missing file is empty.
    fn read_file(path: &Path) -> anyhow::Result<Images<T>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Images::default()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let expected = Images::<T>::default().version;
        let found = serde_json::from_str::<serde_json::Value>(&text).ok().and_then(|v| v["version"].as_u64());
        if let Some(found) = found.filter(|v| *v != u64::from(expected)) {
            anyhow::bail!(
                "{}: format version {found} is not supported (this xtask writes {expected}); \
                 delete it and build again",
                path.display()
            );
        }
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}:{}:{}: {e}", path.display(), e.line(), e.column()))
    }

    /// Writes through a temporary file and a rename, so a crash never leaves half a file.
    fn write_file(&self, path: &Path) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(self).expect("serialises");
        text.push('\n');
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot replace {}", path.display()))
    }
}

impl ImagesLock {
    /// Reads the lock; a missing file is an empty lock.
    pub fn read(path: &Path) -> anyhow::Result<ImagesLock> {
        Self::read_file(path)
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        self.write_file(path)
    }
}

impl LocalImages {
    /// Reads the local record of the host platform's images of the lock at `lock`; missing is
    /// empty.
    pub fn read(lock: &Path) -> anyhow::Result<LocalImages> {
        Self::read_for(lock, Platform::host())
    }

    /// Reads the local record of `platform`'s images; missing is empty.
    pub fn read_for(lock: &Path, platform: Platform) -> anyhow::Result<LocalImages> {
        Self::read_file(&local_path_for(lock, platform))
    }

    pub fn write_for(&self, lock: &Path, platform: Platform) -> anyhow::Result<()> {
        self.write_file(&local_path_for(lock, platform))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(inputs: &str) -> LockedImage {
        let inputs = BTreeMap::from([("linux/amd64".to_string(), inputs.to_string())]);
        LockedImage { parent: Some("os".into()), inputs, args: BTreeMap::new(), pinned: None }
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

        let mut local = LocalImages::default();
        let image = LocalImage {
            id: "sha256:i".into(),
            from: "sha256:p".into(),
            build: "sha256:b".into(),
            extra_ca: true,
            tags: vec!["localhost/agent-sandbox/agent-base:0.1.0".into()],
        };
        local.images.insert("base".into(), image);
        local.write_for(&path, Platform::host()).unwrap();
        assert!(dir.path().join(LOCAL_FILE_NAME).exists());
        assert_eq!(LocalImages::read(&path).unwrap(), local);
        let other = if Platform::host() == Platform::Amd64 { Platform::Arm64 } else { Platform::Amd64 };
        assert_eq!(LocalImages::read_for(&path, other).unwrap(), LocalImages::default(), "one per platform");
        local.write_for(&path, other).unwrap();
        let name = format!("images.local.{}.json", other.name().replace('/', "-"));
        assert!(dir.path().join(name).exists());
        assert_eq!(lock.images["base"].inputs_for(Platform::Amd64), Some("sha256:1"));
        assert_eq!(lock.images["base"].inputs_for(Platform::Arm64), None);
        assert_eq!(ImagesLock::read(&path).unwrap(), lock, "the lock is left alone");
    }

    #[test]
    fn a_missing_lock_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ImagesLock::read(&dir.path().join("nope")).unwrap(), ImagesLock::default());
        assert_eq!(LocalImages::read(&dir.path().join("nope")).unwrap(), LocalImages::default());
    }

    #[test]
    fn a_broken_lock_names_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{\n  \"version\": 3,\n  \"images\": {},\n  \"extra\": 2\n}\n").unwrap();
        let err = ImagesLock::read(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:4:", path.display())), "{err}");
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn an_older_format_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        std::fs::write(&path, "{\"version\": 2, \"images\": {}}\n").unwrap();
        let err = ImagesLock::read(&path).unwrap_err().to_string();
        assert!(err.contains("format version 2 is not supported") && err.contains("build again"), "{err}");
    }
}
