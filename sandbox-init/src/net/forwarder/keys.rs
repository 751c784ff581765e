//! Keys the agent never holds. For each API of apis.rs, sandbox-init takes a key from a secret
//! file the agent cannot read (`/run/secrets/<var>`, as Docker and compose mount secrets; the
//! file judged by secrets.rs) or, failing that, from its own environment, and hands it to the
//! forwarder (forwarder.rs's process) only. The agent's processes get a placeholder and the
//! forwarder's address in the CLI's own variables (apis::SESSION_ENV, which sandbox-exec reads
//! too).

use std::path::{Path, PathBuf};

use crate::apis::{Api, KeyVar};
use crate::exit::{Fatal, Refusal};
use crate::privileges::AgentPrivileges;
use crate::secrets::read_secret;

pub use crate::policy::layout::SECRETS_DIR;
/// An extra CA the forwarder trusts besides the system's (a corporate proxy's, or a test's):
/// a secret file like the keys.
pub const EXTRA_CA_SECRET: &str = "sandbox_api_ca.pem";

/// A key sandbox-init holds, and where it came from (for the start's line; never the key).
pub struct HeldKey {
    pub api: &'static Api,
    pub var: &'static KeyVar,
    pub key: String,
    pub from: String,
    /// Where the forwarder sends: the API's host, or the one the user's base URL names.
    pub host: String,
    /// The path of the user's base URL, which the CLI's requests start with; None: the API's.
    pub base_path: Option<String>,
}

impl HeldKey {
    fn new(api: &'static Api, var: &'static KeyVar, key: String, from: String) -> HeldKey {
        HeldKey { api, var, key, from, host: api.host.to_string(), base_path: None }
    }
}

/// The host and path of `https://HOST[:443][/PATH]`, the path without its trailing slash.
fn https_endpoint(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("https://")?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let host = authority.strip_suffix(":443").unwrap_or(authority).to_ascii_lowercase();
    let valid = !host.is_empty()
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !path.contains(['?', '#']);
    valid.then(|| (host, format!("/{}", path.trim_end_matches('/')).replace("//", "/")))
}

impl std::fmt::Debug for HeldKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeldKey({} {} from {}, {} bytes)", self.api.name, self.var.var, self.from, self.key.len())
    }
}

/// The secret files a variable's key may be in: `/run/secrets/anthropic_api_key`, then the
/// variable's own spelling.
fn secret_paths(dir: &Path, var: &str) -> [PathBuf; 2] {
    [dir.join(var.to_ascii_lowercase()), dir.join(var)]
}

/// The keys for `apis`: per API the first of its variables with a secret file, else the first
/// set in the environment. An API without a key gets no forwarder (its CLI may sign in instead).
/// A base URL the user set for the API (`OPENAI_BASE_URL=https://dashscope…/v1`) moves the
/// forwarder there; one that is not `https://HOST/PATH` is refused.
pub fn load(apis: &[&'static Api], agent: &AgentPrivileges, secrets: &Path) -> Result<Vec<HeldKey>, Fatal> {
    let mut held = Vec::new();
    for api in apis {
        let mut found = None;
        'files: for var in api.keys {
            for path in secret_paths(secrets, var.var) {
                if let Some(key) = read_secret(&path, agent)? {
                    found = Some(HeldKey::new(api, var, key, path.display().to_string()));
                    break 'files;
                }
            }
        }
        if found.is_none() {
            found = api.keys.iter().find_map(|var| {
                let key = std::env::var(var.var).ok().filter(|k| !k.trim().is_empty())?;
                Some(HeldKey::new(api, var, key.trim().to_string(), format!("${}", var.var)))
            });
        }
        if let Some(key) = found.as_mut()
            && let Some((var, value)) =
                api.base_urls.iter().find_map(|(var, _)| Some((*var, std::env::var(var).ok()?)))
        {
            // The user points the CLI at another endpoint of this API (DashScope's for Qwen, a
            // gateway): the forwarder sends there instead, and there only.
            let (host, path) = https_endpoint(&value).ok_or_else(|| {
                Fatal::new(
                    Refusal::BadSetting,
                    format!(
                        "{var}={value}: the key for {} ({}) is held by sandbox-init, whose forwarder sends \
                         to one HTTPS host: give {var} as https://HOST/PATH (port 443)",
                        api.name, key.from
                    ),
                )
            })?;
            key.host = host;
            key.base_path = Some(path);
        }
        held.extend(found);
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::tests::agent;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_base_url_is_an_https_host_and_path() {
        assert_eq!(
            https_endpoint("https://DashScope.aliyuncs.com:443/compatible-mode/v1/"),
            Some(("dashscope.aliyuncs.com".into(), "/compatible-mode/v1".into()))
        );
        assert_eq!(https_endpoint("https://api.example.com"), Some(("api.example.com".into(), "/".into())));
        for bad in [
            "http://api.example.com/v1",
            "https://user@x/v1",
            "https://x:8443/v1",
            "https:///v1",
            "https://x/v1?a",
        ] {
            assert_eq!(https_endpoint(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_file_wins_over_the_environment_and_the_session_gets_placeholders() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("openai_api_key");
        std::fs::write(&path, "sk-from-file").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        let apis = [crate::apis::api("openai").unwrap(), crate::apis::api("anthropic").unwrap()];
        let held = load(&apis, &agent(), dir.path()).unwrap();
        // anthropic: no file, and (in this test process) presumably no variable either.
        let openai = held.iter().find(|k| k.api.name == "openai").unwrap();
        assert_eq!(openai.key, "sk-from-file");
        assert!(!format!("{held:?}").contains("sk-from-file"), "the key in a debug string");
        let policy =
            crate::policy::Policy::from_yaml(Path::new("p.yaml"), "version: 1\nallow: none\n").unwrap();
        let route = held[0].route(&policy);
        assert_eq!(
            (route.host.host.as_str(), route.host.port, route.inspect.as_deref()),
            ("api.openai.com", 15102, Some("openai"))
        );
        assert_eq!(
            route.auth.as_ref().unwrap(),
            &("authorization".to_string(), "Bearer sk-from-file".into())
        );
        // Every route drops the agent's own Authorization and Cookie; Gemini's its key header too.
        let gemini = crate::apis::api("gemini").unwrap();
        let key = HeldKey::new(gemini, &gemini.keys[0], "k".into(), "f".into());
        assert_eq!(key.route(&policy).strip, ["authorization", "cookie", "x-goog-api-key"]);
        let env = route.env;
        assert!(env.contains(&("OPENAI_BASE_URL".into(), "http://127.0.0.1:15102/v1".into())), "{env:?}");
        assert!(env.contains(&("OPENAI_API_KEY".into(), "sk-held-by-agent-sandbox".into())), "{env:?}");
        assert!(!env.iter().any(|(_, v)| v.contains("sk-from-file")));
    }

    #[test]
    fn an_api_that_lists_its_requests_forwards_only_those_until_the_policy_allows_remote_tools() {
        use sandbox_wire::forwarder::rules::{Request, Rules, Verdict};
        let mistral = crate::apis::api("mistral").unwrap();
        let key = HeldKey::new(mistral, &mistral.keys[0], "k".into(), "f".into());
        let refuse =
            crate::policy::Policy::from_yaml(Path::new("p.yaml"), "version: 1\nallow: none\n").unwrap();
        let rules = key.route(&refuse).rules;
        let judge = |rules: &Rules, method, path| rules.judge_head(&Request { method, path, query: "" });
        assert_eq!(judge(&rules, "POST", "/v1/chat/completions"), Ok(Verdict::Pass));
        assert_eq!(judge(&rules, "GET", "/v1/models/mistral-large-latest"), Ok(Verdict::Pass));
        for (method, path) in [
            ("POST", "/v1/connectors"),
            ("POST", "/v1/connectors/x/tools/t/call"),
            ("POST", "/v1/audio/transcriptions"),
            ("POST", "/v1/fine_tuning/jobs"),
            ("POST", "/v1/libraries/l/documents/ingest-from-blob-storage"),
            ("GET", "/v1/chat/completions"),
        ] {
            let refused = judge(&rules, method, path).unwrap_err();
            assert_eq!(refused.status(), 403, "{method} {path}");
            assert!(
                refused.reason().contains("apis: {mistral: {remote_tools: allow}}"),
                "{}",
                refused.reason()
            );
        }
        let allow = "version: 1\ndomains: [example.com]\napis:\n  mistral:\n    remote_tools: allow\n";
        let allow = crate::policy::Policy::from_yaml(Path::new("p.yaml"), allow).unwrap();
        assert_eq!(key.route(&allow).rules, Rules::Any);
        // The APIs that list nothing: any request, the body read for remote tools.
        let openai = crate::apis::api("openai").unwrap();
        let key = HeldKey::new(openai, &openai.keys[0], "k".into(), "f".into());
        assert_eq!(key.route(&refuse).rules, Rules::Any);
    }
}
