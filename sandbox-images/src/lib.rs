//! What the build system (xtask) and the launcher (agent-sandbox) share about the images: their
//! labels, how they are named and tagged, images.lock and the local record beside it, and the
//! engine connection with the pull of an image by its pinned digest. Its own crate so that the
//! launcher a user installs does not bring the build system with it.

pub mod engine;
pub mod labels;
pub mod lock;
pub mod naming;
pub mod platform;

/// Where this user's caches live: `$XDG_CACHE_HOME`, else `~/.cache`. The launcher keeps the
/// images' baked policies under it, the build the static binaries, the suites trivy's layers.
pub fn cache_home() -> Option<std::path::PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|home| home.join(".cache")))
}
