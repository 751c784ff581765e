//! Image labels: the project's own namespace, declared here once, and the OCI standard keys.

/// Expands to a label key in the project's namespace, e.g. `ns!("image")`.
macro_rules! ns {
    ($key:literal) => {
        concat!("io.github.agent-sandbox.", $key)
    };
}

/// The graph node an image was built from (its folder name under images/).
pub const IMAGE: &str = ns!("image");
/// The input hash images.lock records: the context as the checkout has it, the args, the
/// platform, the parent's input hash. The same on every machine.
pub const INPUTS: &str = ns!("inputs");
/// The platform an image was built for (`linux/amd64`, `linux/arm64`), as `cargo xtask list`
/// shows it.
pub const PLATFORM: &str = ns!("platform");
/// The build key: the hash of exactly what the engine was given (the parent's id, an extra CA).
/// What reuse matches on, with the index tag `inputs:<name>-<key>`.
pub const BUILD: &str = ns!("build");
/// The graph parent's name, absent on roots.
pub const PARENT: &str = ns!("parent");
/// On agent images (set in their Dockerfiles): which agent, and its CLI's pinned version.
pub const AGENT_NAME: &str = ns!("agent.name");
pub const AGENT_VERSION: &str = ns!("agent.version");
/// On agent images whose CLI signs in to a file: those files, home-relative and `:`-separated,
/// that `agent-sandbox run --login-from-host` copies into the state volume.
pub const LOGIN_FILES: &str = ns!("login-files");
/// On the launcher's sandboxes (containers) and state volumes: which agent, the project's
/// canonical path, and the sandbox's (first) state volume.
pub const LAUNCHER_AGENT: &str = ns!("launcher.agent");
pub const LAUNCHER_PROJECT: &str = ns!("launcher.project");
pub const LAUNCHER_STATE: &str = ns!("launcher.state");
/// On the launcher's sandboxes: what the project's git files were at start (the launcher's
/// `gitguard::GitSnapshot`, JSON), for `stop` to compare; absent with `--writable-git-config`.
pub const LAUNCHER_GIT: &str = ns!("launcher.git");
/// Sidecar mode: on the agent's container, its gateway's container name; on the gateway, the
/// agent's container's (the gateway carries no `launcher.agent`, so it is listed as part of its
/// sandbox, not as one).
pub const LAUNCHER_GATEWAY: &str = ns!("launcher.gateway");
pub const LAUNCHER_GATEWAY_OF: &str = ns!("launcher.gateway-of");

pub const OCI_TITLE: &str = "org.opencontainers.image.title";
pub const OCI_VERSION: &str = "org.opencontainers.image.version";
pub const OCI_REVISION: &str = "org.opencontainers.image.revision";
pub const OCI_SOURCE: &str = "org.opencontainers.image.source";
pub const OCI_LICENSES: &str = "org.opencontainers.image.licenses";
pub const OCI_BASE_NAME: &str = "org.opencontainers.image.base.name";
