//! The model APIs whose keys sandbox-init holds for the agent: each one's host, the variables a
//! key arrives in and the header it travels in, and the variables that point a CLI at the
//! forwarder instead. Data only, here so that the launcher (which hands keys over as secret
//! files) and sandbox-init (which scrubs, loads and forwards them) read one table.

/// How a key travels in a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyVar {
    /// The environment variable (and, lower-cased, the secret file under /run/secrets).
    pub var: &'static str,
    /// The header the CLI sends the key in, lower-case.
    pub header: &'static str,
    /// Put before the key in the header's value (`Bearer `), or nothing.
    pub prefix: &'static str,
    /// What the agent's CLI holds instead: shaped like a real key, so that a CLI checking the
    /// form accepts it.
    pub placeholder: &'static str,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Api {
    /// The API's name: the key's secret file and `apis:` in a policy use it.
    pub name: &'static str,
    /// The only host the forwarder sends to (HTTPS, port 443).
    pub host: &'static str,
    /// The forwarder's port on 127.0.0.1.
    pub port: u16,
    /// Where a key may come from, in order of preference.
    pub keys: &'static [KeyVar],
    /// Variables that point a CLI at the forwarder: (variable, path after `http://127.0.0.1:PORT`).
    pub base_urls: &'static [(&'static str, &'static str)],
    /// More variables the agent's processes get while the key is held: what a CLI needs besides
    /// the base URL to use it.
    pub session: &'static [(&'static str, &'static str)],
    /// The requests the forwarder sends on while the API's remote tools are refused (the
    /// policy's default): (method, path glob; `*` one segment). Empty: any request, its body
    /// read for remote tools. An API whose other endpoints take a URL in forms the body check
    /// does not read (a form field, a registered server) lists what its CLIs use.
    pub paths: &'static [(&'static str, &'static str)],
}

pub const APIS: &[Api] = &[
    Api {
        name: "anthropic",
        host: "api.anthropic.com",
        port: 15101,
        keys: &[
            KeyVar {
                var: "ANTHROPIC_API_KEY",
                header: "x-api-key",
                prefix: "",
                placeholder: "sk-ant-api03-held-by-agent-sandbox",
            },
            KeyVar {
                var: "ANTHROPIC_AUTH_TOKEN",
                header: "authorization",
                prefix: "Bearer ",
                placeholder: "held-by-agent-sandbox",
            },
        ],
        base_urls: &[("ANTHROPIC_BASE_URL", "")],
        session: &[],
        paths: &[],
    },
    Api {
        name: "openai",
        host: "api.openai.com",
        port: 15102,
        keys: &[KeyVar {
            var: "OPENAI_API_KEY",
            header: "authorization",
            prefix: "Bearer ",
            placeholder: "sk-held-by-agent-sandbox",
        }],
        base_urls: &[("OPENAI_BASE_URL", "/v1"), ("OPENAI_API_BASE", "/v1")],
        session: &[],
        paths: &[],
    },
    Api {
        name: "gemini",
        host: "generativelanguage.googleapis.com",
        port: 15103,
        keys: &[KeyVar {
            var: "GEMINI_API_KEY",
            header: "x-goog-api-key",
            prefix: "",
            placeholder: "held-by-agent-sandbox",
        }],
        base_urls: &[("GOOGLE_GEMINI_BASE_URL", "")],
        // Gemini CLI takes its base-URL variable only with the API-key sign-in selected: the
        // gemini image's system defaults select it (a user's own settings still win).
        session: &[("GEMINI_CLI_SYSTEM_DEFAULTS_PATH", "/etc/agent-sandbox/gemini-cli-defaults.json")],
        paths: &[],
    },
    Api {
        name: "mistral",
        host: "api.mistral.ai",
        port: 15104,
        keys: &[KeyVar {
            var: "MISTRAL_API_KEY",
            header: "authorization",
            prefix: "Bearer ",
            placeholder: "held-by-agent-sandbox",
        }],
        // Mistral's SDKs take no base-URL variable. Mistral Vibe takes its providers from
        // VIBE_PROVIDERS (JSON, over its defaults): its `mistral` provider, pointed here.
        base_urls: &[],
        session: &[(
            "VIBE_PROVIDERS",
            r#"[{"name":"mistral","api_base":"http://127.0.0.1:15104/v1","api_key_env_var":"MISTRAL_API_KEY","backend":"mistral"}]"#,
        )],
        // What Mistral Vibe asks for: completions, the models, the account, and the connectors
        // it may offer (read). Not Mistral's other endpoints: connectors are registered and
        // called by their server's URL, audio is transcribed from a `file_url` form field,
        // fine-tuning reports to integrations, libraries ingest from a signed URL; with the
        // key, each would have Mistral's servers carry data to an address of the agent's.
        paths: &[
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/fim/completions"),
            ("GET", "/v1/models"),
            ("GET", "/v1/models/*"),
            ("GET", "/v1/users/me"),
            ("GET", "/v1/connectors/bootstrap"),
        ],
    },
];

/// The API named `name`.
pub fn api(name: &str) -> Option<&'static Api> {
    APIS.iter().find(|api| api.name == name)
}

/// Every variable that may hold a key (defined at the crate's root, above this table and the
/// forwarded services').
pub use crate::key_vars;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_names_and_variables_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for api in APIS {
            assert!(seen.insert(api.name) && seen.insert(api.host), "{api:?}");
            assert!(api.port > 15100 && api.port < 15200, "{api:?}");
            // Something points a CLI at the forwarder: a base-URL variable, or a session
            // variable naming the forwarder's own address.
            let here = format!("http://127.0.0.1:{}/", api.port);
            assert!(
                !api.keys.is_empty()
                    && (!api.base_urls.is_empty() || api.session.iter().any(|(_, v)| v.contains(&here))),
                "{api:?}"
            );
        }
        let vars: Vec<&str> = key_vars().collect();
        let unique: std::collections::HashSet<&&str> = vars.iter().collect();
        assert_eq!(vars.len(), unique.len(), "{vars:?}");
        let ports: std::collections::HashSet<u16> = APIS.iter().map(|a| a.port).collect();
        assert_eq!(ports.len(), APIS.len());
    }
}
