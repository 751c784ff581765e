//! Where things live in the repository, and facts about it that tags and labels need.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use xshell::{Shell, cmd};

/// The version every image is tagged with: the workspace's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the images' `org.opencontainers.image.source` label points.
pub const SOURCE_URL: &str = env!("CARGO_PKG_REPOSITORY");
pub const LICENSES: &str = env!("CARGO_PKG_LICENSE");
/// Tag prefix used unless `--prefix` (or `--registry` when publishing) says otherwise.
pub const DEFAULT_PREFIX: &str = "localhost/agent-sandbox";
pub const PREFIX_ENV: &str = "AGENT_SANDBOX_PREFIX";

/// The workspace root: the parent of the xtask crate.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// `<prefix>/agent-<name>`
pub fn repository(prefix: &str, name: &str) -> String {
    format!("{}/{}{name}", prefix.trim_end_matches('/'), crate::graph::LOCAL_PREFIX)
}

/// The short commit, with `-dirty` when tracked files other than the lock differ from it;
/// `None` outside a git checkout or before the first commit.
pub fn git_revision(sh: &Shell, root: &Path) -> Option<String> {
    let _dir = sh.push_dir(root);
    let sha = cmd!(sh, "git rev-parse --short=12 HEAD").quiet().ignore_stderr().read().ok()?;
    let dirty = cmd!(sh, "git status --porcelain --untracked-files=no -- . :!images.lock")
        .quiet()
        .ignore_stderr()
        .read()
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    Some(if dirty { format!("{sha}-dirty") } else { sha })
}

/// The host's target triple, for building sandbox-init statically.
pub fn host_triple(sh: &Shell) -> anyhow::Result<String> {
    let info = cmd!(sh, "rustc -vV").quiet().read().context("cannot run rustc -vV")?;
    info.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV printed no host triple")
}

/// Builds sandbox-init as one static binary (glibc with crt-static: no NSS is used, DNS is pure
/// Rust) and returns its bytes.
pub fn build_sandbox_init(sh: &Shell, root: &Path) -> anyhow::Result<Vec<u8>> {
    let _dir = sh.push_dir(root);
    let triple = host_triple(sh)?;
    let _flags = sh.push_env("RUSTFLAGS", "-C target-feature=+crt-static");
    cmd!(sh, "cargo build --quiet --release --package sandbox-init --target {triple}")
        .run()
        .context("cannot build sandbox-init")?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let path = target_dir.join(&triple).join("release").join("sandbox-init");
    std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
}
