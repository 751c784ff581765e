//! The model APIs (the table is `sandbox_policy::apis`, shared with the launcher) and the
//! session's variables file: privileges.rs scrubs the key variables from every process it
//! starts, net/forwarder/keys.rs loads the keys, net/forwarder.rs uses them.

pub use crate::policy::apis::*;
use crate::policy::model;

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

/// A variable of the container's environment, unset when empty.
fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The user's model server as PID 1's forwarder reaches it: its URL, its model, and its one
/// address and port (`SANDBOX_MODEL_SERVER_ADDRESS`, else the URL's own address), of the user's network
/// alone (a public address is every site fronted there; loopback is this container's own, where
/// the agent could listen). None without a server.
pub fn model_server() -> Result<Option<ModelServer>, String> {
    use crate::policy::address::{Scope, scope};
    let var = setting;
    let Some(text) = var(model::SERVER_ENV) else { return Ok(None) };
    let url = model::ServerUrl::parse(&text).map_err(|e| format!("{}: {e}", model::SERVER_ENV))?;
    let address = match (var(model::ADDRESS_ENV), &url.host) {
        (Some(given), _) => given
            .trim()
            .parse::<std::net::IpAddr>()
            .map_err(|_| format!("{}: `{given}` is no IP address", model::ADDRESS_ENV))?,
        (None, model::Host::Address(address)) => *address,
        (None, model::Host::Name(name)) => {
            return Err(format!(
                "{} names {name}: give its address in {} (the launcher does)",
                model::SERVER_ENV,
                model::ADDRESS_ENV
            ));
        }
    };
    if scope(address) != Scope::Private {
        return Err(format!(
            "{}: {address} is {}, which the forwarder does not reach for a model server (only your network's)",
            model::ADDRESS_ENV,
            scope(address).describe()
        ));
    }
    if url.port == 53 {
        return Err(format!("{}: port 53 is DNS's, which the DNS gate alone answers", model::SERVER_ENV));
    }
    let name = var(model::MODEL_ENV)
        .ok_or_else(|| format!("{} is set and {} is not", model::SERVER_ENV, model::MODEL_ENV))?;
    model::check_model(&name).map_err(|e| format!("{}: {e}", model::MODEL_ENV))?;
    Ok(Some(ModelServer { address: std::net::SocketAddr::new(address, url.port), url, model: name }))
}

/// The user's model server as the forwarder reaches it.
pub struct ModelServer {
    pub url: model::ServerUrl,
    /// Its one address and port.
    pub address: std::net::SocketAddr,
    /// The one model the agent's requests may name.
    pub model: String,
}

/// The variables of the user's model server (`SANDBOX_MODEL_SERVER`, `SANDBOX_MODEL`), as the
/// image declares them (`SANDBOX_MODEL_SERVER_ENV`): none without a server. Every process
/// started as the agent gets them after the key scrub (privileges.rs), so that a CLI's dummy key
/// for the server reaches it. PID 1 checks them at start ([`Refusal::BadSetting`] for an error).
///
/// [`Refusal::BadSetting`]: crate::exit::Refusal::BadSetting
pub fn model_server_env() -> Result<Vec<(String, String)>, String> {
    let var = setting;
    let Some(url) = var(model::SERVER_ENV) else { return Ok(Vec::new()) };
    let model = var(model::MODEL_ENV).ok_or_else(|| {
        format!("{} is set and {} is not: name the model too", model::SERVER_ENV, model::MODEL_ENV)
    })?;
    let declared = var(model::VARS_ENV).ok_or_else(|| {
        format!(
            "{}: this image's agent cannot use a model server (it declares no {})",
            model::SERVER_ENV,
            model::VARS_ENV
        )
    })?;
    model::expand(&declared, &url, &model).map_err(|e| format!("{}: {e}", model::SERVER_ENV))
}
