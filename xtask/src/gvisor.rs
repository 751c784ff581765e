//! gVisor's `runsc`, which the suites run sidecar mode's agent containers under: found,
//! installed and registered with the engine by `cargo xtask setup --tests`, asked for by
//! `cargo xtask test`.
//!
//! Debian trixie's build (gVisor release 20240729, one static binary; bookworm's 2022 build
//! cannot start containers here), so on bookworm its package is fetched from trixie's archive
//! alone (trixie.rs). It is registered as `runsc` with
//! `--network=host`: gVisor's own netstack cannot run in a container's namespace under this
//! engine, and with the host's (the namespace's) network the gateway's rules see the agent's
//! packets (as root's: gVisor's sentry sends them).

use std::path::Path;

use anyhow::Context as _;
use xshell::Shell;

/// The runtime's name in the engine, as `docker run --runtime` and the launcher take it.
pub const RUNTIME: &str = "runsc";
/// Where Debian's package puts it.
pub const BINARY: &str = "/usr/bin/runsc";
/// The engine's configuration, which `runtimes` is added to.
pub const DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// `daemon.json` with runsc registered, the rest of it as it was. Pure. An error if the file is
/// not a JSON object (nothing is written then).
pub fn with_runsc(daemon_json: &str) -> anyhow::Result<String> {
    let mut config: serde_json::Value = if daemon_json.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(daemon_json)?
    };
    let object = config.as_object_mut().context("daemon.json is not a JSON object")?;
    let runtimes = object.entry("runtimes").or_insert_with(|| serde_json::json!({}));
    let runtimes = runtimes.as_object_mut().context("daemon.json's `runtimes` is not an object")?;
    runtimes.insert(RUNTIME.into(), serde_json::json!({ "path": BINARY, "runtimeArgs": ["--network=host"] }));
    Ok(serde_json::to_string_pretty(&config)? + "\n")
}

/// Adds runsc to the engine's `daemon.json` and has a running engine read it again (SIGHUP
/// reloads its runtimes).
pub fn register(sh: &Shell, sudo: bool) -> anyhow::Result<()> {
    let as_root = |args: &[&str]| crate::trixie::as_root(sh, sudo, args);
    let current = std::fs::read_to_string(DAEMON_JSON).unwrap_or_default();
    let next = with_runsc(&current).with_context(|| format!("cannot add runsc to {DAEMON_JSON}"))?;
    let staged = tempfile::NamedTempFile::new()?;
    std::fs::write(staged.path(), next)?;
    as_root(&["mkdir", "-p", "/etc/docker"]).run()?;
    as_root(&["install", "-m", "0644", &staged.path().display().to_string(), DAEMON_JSON]).run()?;
    // The engine may not run yet (it reads the file when it starts).
    let _ = as_root(&["pkill", "-HUP", "-x", "dockerd"]).quiet().ignore_status().run();
    Ok(())
}

/// Whether runsc is installed where the registration points.
pub fn installed() -> bool {
    Path::new(BINARY).is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runsc_is_added_to_the_engines_configuration_and_the_rest_stays() {
        let fresh: serde_json::Value = serde_json::from_str(&with_runsc("").unwrap()).unwrap();
        assert_eq!(fresh["runtimes"]["runsc"]["path"], BINARY);
        assert_eq!(fresh["runtimes"]["runsc"]["runtimeArgs"], serde_json::json!(["--network=host"]));
        let kept = with_runsc(r#"{"log-level": "warn", "runtimes": {"kata": {"path": "/k"}}}"#).unwrap();
        let kept: serde_json::Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(kept["log-level"], "warn");
        assert_eq!(kept["runtimes"]["kata"]["path"], "/k");
        assert_eq!(kept["runtimes"]["runsc"]["path"], BINARY);
        assert!(with_runsc("[1]").is_err(), "not an object: nothing to write");
        assert!(with_runsc(r#"{"runtimes": 3}"#).is_err());
    }
}
