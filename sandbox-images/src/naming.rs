//! How images are named and tagged: `<prefix>/agent-<folder>:<version>`, the inputs index, the
//! bench's scratch repository.

/// Every image's repository is `agent-<folder>`, and a local parent is named so in a
/// Dockerfile's `ARG` default.
pub const LOCAL_PREFIX: &str = "agent-";
/// The version every image is tagged with: the workspace's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the images' `org.opencontainers.image.source` label points.
pub const SOURCE_URL: &str = env!("CARGO_PKG_REPOSITORY");
pub const LICENSES: &str = env!("CARGO_PKG_LICENSE");
/// Tag prefix used unless `--prefix` (or `--registry` when publishing) says otherwise.
pub const DEFAULT_PREFIX: &str = "localhost/agent-sandbox";
pub const PREFIX_ENV: &str = "AGENT_SANDBOX_PREFIX";

/// Every built image is also tagged `<INPUTS_REPOSITORY>:<name>-<input hash>`: the index by
/// which a later build finds it, whatever prefix either build used.
pub const INPUTS_REPOSITORY: &str = "localhost/agent-sandbox/inputs";
/// Where `cargo xtask bench build` tags its `docker build` copies (`<BENCH_REPOSITORY>/<name>`):
/// it removes them when done, and `prune` takes any it left.
pub const BENCH_REPOSITORY: &str = "agent-sandbox-bench";

pub fn inputs_tag(name: &str, inputs: &str) -> String {
    format!("{INPUTS_REPOSITORY}:{name}-{}", inputs.strip_prefix("sha256:").unwrap_or(inputs))
}

/// `<prefix>/agent-<name>`
pub fn repository(prefix: &str, name: &str) -> String {
    format!("{}/{}{name}", prefix.trim_end_matches('/'), LOCAL_PREFIX)
}
