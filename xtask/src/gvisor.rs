//! gVisor's `runsc`, which the suites run sidecar mode's agent containers under: found,
//! installed and registered with the engine by `cargo xtask setup --tests`, asked for by
//! `cargo xtask test`.
//!
//! Debian trixie's build (gVisor release 20240729, one static binary; bookworm's 2022 build
//! cannot start containers here), so on bookworm its package is fetched from trixie's archive
//! alone, without adding trixie to the machine's sources. It is registered as `runsc` with
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

/// `args` run as root: through sudo, or as they are.
fn as_root<'a>(sh: &'a Shell, sudo: bool, args: &[&str]) -> xshell::Cmd<'a> {
    let (program, rest) = if sudo { ("sudo", args) } else { (args[0], &args[1..]) };
    sh.cmd(program).args(rest)
}

/// Installs trixie's runsc (apt-get on trixie and later; on bookworm its package alone, fetched
/// from trixie's archive into a temporary folder and installed with dpkg).
pub fn install(sh: &Shell, sudo: bool, codename: &str) -> anyhow::Result<()> {
    let as_root = |args: &[&str]| as_root(sh, sudo, args);
    if codename != "bookworm" {
        as_root(&["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "runsc"])
            .run()?;
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().display().to_string();
    std::fs::write(
        dir.path().join("trixie.sources"),
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n\
         Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )?;
    // Only trixie's list, in the temporary folder: the machine's sources and lists stay.
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(dir.path().join(sub))?;
    }
    let options = [
        "-q".to_string(),
        "-o".into(),
        "Dir::Etc::SourceList=/dev/null".into(),
        "-o".into(),
        format!("Dir::Etc::SourceParts={path}"),
        "-o".into(),
        format!("Dir::State::Lists={path}/lists"),
        "-o".into(),
        format!("Dir::Cache={path}/cache"),
        "-o".into(),
        "APT::Sandbox::User=root".into(),
    ];
    let _dir = sh.push_dir(dir.path());
    let apt = |what: &'static str| {
        let mut args: Vec<&str> = vec!["apt-get"];
        args.extend(options.iter().map(String::as_str));
        args.push(what);
        args
    };
    as_root(&apt("update")).run().context("cannot read trixie's package list")?;
    let mut download = apt("download");
    download.push("runsc");
    as_root(&download).run().context("cannot fetch trixie's runsc")?;
    let deb = std::fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no runsc package")?;
    as_root(&["dpkg", "-i", &deb.display().to_string()]).run().context("dpkg could not install runsc")?;
    Ok(())
}

/// Adds runsc to the engine's `daemon.json` and has a running engine read it again (SIGHUP
/// reloads its runtimes).
pub fn register(sh: &Shell, sudo: bool) -> anyhow::Result<()> {
    let as_root = |args: &[&str]| as_root(sh, sudo, args);
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

/// This machine's Debian codename (`VERSION_CODENAME` in /etc/os-release): on bookworm, runsc
/// comes from trixie.
pub fn codename() -> String {
    std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(|c| c.trim_matches('"').to_string()))
        .unwrap_or_default()
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
