//! The probe, `sandbox-probe`: the static binary every sandbox and peer runs, where it is mounted,
//! and what it reports (`key=value` lines).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::docker::{ExecOutput, exec};
use crate::root;

/// Where the probe binary is mounted in sandboxes (and installed in the peer image).
pub const PROBE: &str = "/usr/local/bin/sandbox-probe";

/// The probe binary, static, built once and cached by the xtask.
pub fn probe_binary() -> anyhow::Result<PathBuf> {
    // Every sandbox mounts it: build or check it once per test process.
    static PROBE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(path) = PROBE.get() {
        return Ok(path.clone());
    }
    // `cargo xtask test` built it before the suites started and says where: no test process
    // needs to hash its sources and toolchain again (a tenth of a CPU-second each).
    let built = std::env::var_os(xtask::project::PROBE_ENV).map(PathBuf::from).filter(|p| p.is_file());
    let path = match built {
        Some(path) => path,
        None => xtask::project::probe_binary(&xshell::Shell::new()?, &root())?,
    };
    Ok(PROBE.get_or_init(|| path).clone())
}

/// Runs the probe in `container` in a task: `as_agent` through sandbox-exec, else as root.
pub fn spawn(
    container: &str,
    as_agent: bool,
    args: &[&str],
) -> tokio::task::JoinHandle<anyhow::Result<Probe>> {
    let id = container.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::spawn(async move {
        let mut cmd = if as_agent { vec!["sandbox-exec", "--"] } else { Vec::new() };
        cmd.push(PROBE);
        let given = cmd.len();
        cmd.extend(args.iter().map(String::as_str));
        let out = exec(&id, &cmd, None).await?;
        Probe::from_output(&cmd[given..], out)
    })
}

/// What one probe saw, from its `key=value` lines.
#[derive(Debug, Clone)]
pub struct Probe {
    pub what: String,
    pub fields: HashMap<String, String>,
}

impl Probe {
    /// The `key=value` lines of a probe run; an error if the probe itself failed.
    pub fn from_output(args: &[&str], out: ExecOutput) -> anyhow::Result<Probe> {
        let fields = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let probe = Probe { what: args.join(" "), fields };
        anyhow::ensure!(
            out.code == 0,
            "the probe `{}` failed ({}): {}{}",
            probe.what,
            out.code,
            out.stdout,
            out.stderr
        );
        Ok(probe)
    }

    /// A numeric field; NaN when missing.
    pub fn number(&self, key: &str) -> f64 {
        self.fields.get(key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    }

    pub fn outcome(&self) -> &str {
        self.fields.get("outcome").map_or("(no outcome)", String::as_str)
    }

    pub fn ms(&self) -> f64 {
        self.fields.get("ms").and_then(|m| m.parse().ok()).unwrap_or(f64::NAN)
    }
}
