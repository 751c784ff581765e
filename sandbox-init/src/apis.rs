//! The model APIs (the table is `sandbox_policy::apis`, shared with the launcher) and the
//! session's variables file: privileges.rs scrubs the key variables from every process it
//! starts, net/forwarder/keys.rs loads the keys, net/forwarder.rs uses them.

pub use crate::policy::apis::*;

/// The variables every agent process gets (the CLIs' base URLs and placeholders): (name, value)
/// pairs as JSON, root's, readable by all (it holds no key).
pub use crate::policy::layout::SESSION_ENV_FILE as SESSION_ENV;

/// Writes the session's variables for sandbox-exec (no key among them).
pub fn write_session_env(env: &[(String, String)]) -> std::io::Result<()> {
    let tmp = format!("{SESSION_ENV}.tmp");
    std::fs::write(&tmp, serde_json::to_vec(env).unwrap_or_default())?;
    std::fs::rename(&tmp, SESSION_ENV)
}

/// The session's variables, as PID 1 wrote them; none if it did not (no held key, or not ready).
pub fn read_session_env() -> Vec<(String, String)> {
    std::fs::read(SESSION_ENV).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
}
