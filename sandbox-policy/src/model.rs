//! A model server of the user's (`agent-sandbox run --model-server URL --model NAME`): an Ollama
//! or OpenAI-compatible server on the host or the user's network, which the agent's CLI uses
//! instead of its cloud API. The launcher parses the URL here and gives the sandbox the URL, the
//! model and the server's address; sandbox-init's forwarder alone reaches that address and port
//! (the firewall opens it to the forwarder's uid), and sends on only the model's endpoints
//! ([`ENDPOINTS`]); sandbox-init gives the agent's processes the variables the image declares
//! (`SANDBOX_MODEL_SERVER_ENV`, `NAME=value;…` with `{url}`, the forwarder's address, and
//! `{model}`), after the key scrub, so that a CLI's dummy key (`OPENAI_API_KEY=local`) reaches
//! it. Both check the URL and the name with the same code: they go into variables a CLI may read
//! as JSON or a shell may split, so each is held to characters that mean nothing there.
use std::net::IpAddr;

/// The server's URL as the agent sees it (`http://host.docker.internal:11434`), set by the
/// launcher on the agent's container.
pub const SERVER_ENV: &str = "SANDBOX_MODEL_SERVER";
/// The model's name, as the server knows it (`qwen2.5-coder:7b`).
pub const MODEL_ENV: &str = "SANDBOX_MODEL";
/// The image's declaration: `NAME=value;…`, `{url}` and `{model}` replaced. An image without
/// one has a CLI that cannot use such a server.
pub const VARS_ENV: &str = "SANDBOX_MODEL_SERVER_ENV";
/// The server's address (`192.168.1.20`), set by the launcher beside the URL on the container
/// whose PID 1 holds the firewall: the one address the forwarder connects to for it. Needed
/// where the URL names the server by name.
pub const ADDRESS_ENV: &str = "SANDBOX_MODEL_SERVER_ADDRESS";
/// The forwarder's port on 127.0.0.1 for the model server: what `{url}` points the CLI at.
pub const PORT: u16 = 15109;

/// What the forwarder sends on to a model server, under the URL's path: the model's endpoints
/// of the OpenAI, Anthropic and Ollama APIs, and the reads that list models (and
/// `/v1/models/MODEL`, the user's model's, beside them). Every body must name the user's model,
/// with no tool the server runs itself (`sandbox_wire`'s `Rules::ModelServer`). Nothing else: an
/// Ollama server also pulls and pushes models to a registry a request names (`/api/pull`,
/// `/api/push`), creates and deletes them, which would make the user's server carry the agent's
/// data to a host of its choosing.
pub const ENDPOINTS: &[(&str, &str)] = &[
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/embeddings"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
    ("POST", "/api/embed"),
    ("POST", "/api/embeddings"),
    ("POST", "/api/show"),
    ("GET,HEAD", "/v1/models"),
    ("GET,HEAD", "/api/tags"),
    ("GET,HEAD", "/api/version"),
    ("GET,HEAD", "/api/ps"),
];

/// A model server's URL: `http` or `https`, a host (a name, an IPv4 address or a bracketed IPv6
/// one), a port (the scheme's by default) and a path prefix (the OpenAI API's `/v1` is the
/// image's to add), without user, query or fragment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerUrl {
    pub scheme: &'static str,
    pub host: Host,
    pub port: u16,
    /// Empty, or `/…` without a trailing `/`.
    pub path: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Address(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Address(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Address(IpAddr::V4(v4)) => write!(f, "{v4}"),
        }
    }
}

impl ServerUrl {
    pub fn parse(text: &str) -> Result<ServerUrl, String> {
        let (scheme, rest) = if let Some(rest) = text.strip_prefix("http://") {
            ("http", rest)
        } else if let Some(rest) = text.strip_prefix("https://") {
            ("https", rest)
        } else {
            return Err(format!(
                "`{text}`: give an http:// or https:// URL (Ollama's: http://localhost:11434)"
            ));
        };
        if let Some(bad) = rest.chars().find(|c| !url_char(*c)) {
            return Err(format!("`{text}`: {bad:?} has no place in a model server's URL"));
        }
        if rest.contains(['@', '?', '#']) {
            return Err(format!("`{text}`: a model server's URL has no user, query or fragment"));
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (address, after) = v6.split_once(']').ok_or_else(|| format!("`{text}`: `[` without `]`"))?;
            let address: IpAddr =
                address.parse().map_err(|_| format!("`{text}`: `{address}` is no IPv6 address"))?;
            (Host::Address(address), after.strip_prefix(':'))
        } else {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            let host = match host.parse::<IpAddr>() {
                Ok(address) => Host::Address(address),
                Err(_) => Host::Name(name(host).map_err(|e| format!("`{text}`: {e}"))?),
            };
            (host, port)
        };
        let port = match port {
            None if authority.ends_with(']') || !authority.contains(':') => {
                if scheme == "http" {
                    80
                } else {
                    443
                }
            }
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("`{text}`: `{port}` is no port"))?,
            None => return Err(format!("`{text}`: `{authority}` is no host and port")),
        };
        let path = path.trim_end_matches('/');
        if path.split('/').any(|segment| segment == "." || segment == "..") {
            return Err(format!("`{text}`: a path with `.` or `..` segments"));
        }
        Ok(ServerUrl { scheme, host, port, path: path.to_string() })
    }

    /// The forwarder's URL for this server, with the server's path: what the CLI is pointed at.
    pub fn forwarded(&self) -> String {
        format!("http://127.0.0.1:{PORT}{}", self.path)
    }

    /// `host:port`, as the request's Host.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The URL with `host` in place of its own (the engine's name for the host, for a server on
    /// its loopback).
    pub fn with_host(&self, host: Host) -> ServerUrl {
        ServerUrl { host, ..self.clone() }
    }
}

impl std::fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}{}", self.scheme, self.host, self.port, self.path)
    }
}

/// Characters a URL here may hold: none a shell, JSON or TOML string, or the `;`-separated
/// declaration gives a meaning to.
fn url_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~/:[]%".contains(c)
}

/// A host name: letters, digits, `-` and `.`, in DNS's limits, lower-cased.
fn name(host: &str) -> Result<String, String> {
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !ok {
        return Err(format!("`{host}` is no host name"));
    }
    // A name whose last label is a number is an address in another spelling (`2130706433`,
    // `0x7f.1`, `0177.0.0.1`), which resolvers and clients read differently: one reads it as the
    // address, another asks DNS. Only the dotted form is taken.
    let last = host.rsplit('.').next().unwrap_or(host).to_ascii_lowercase();
    if last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(format!("`{host}` is an address in another form: write it as a.b.c.d"));
    }
    Ok(host.to_ascii_lowercase())
}

/// A model's name as servers spell them (`llama3.2`, `qwen2.5-coder:7b`,
/// `hf.co/org/model:Q4_K_M`, `org/model@rev`): letters, digits and `._:/@+-`, at most 200.
pub fn check_model(model: &str) -> Result<(), String> {
    let ok = !model.is_empty()
        && model.len() <= 200
        // Starting with a letter or digit and ending with no `:`, it is a plain scalar in YAML
        // too (continue's config substitutes it as text), and `..` is no path's step.
        && model.starts_with(|c: char| c.is_ascii_alphanumeric())
        && !model.ends_with(':')
        && !model.contains("..")
        && model.chars().all(|c| c.is_ascii_alphanumeric() || "._:/@+-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "model `{model}`: a model's name is letters, digits and `._:/@+-`, from a letter or digit (such as qwen2.5-coder:7b)"
        ))
    }
}

/// The variables an image's declaration gives for `url` and `model`: each `NAME=value` of
/// `declared`, `{url}` and `{model}` replaced.
pub fn expand(declared: &str, url: &str, model: &str) -> Result<Vec<(String, String)>, String> {
    // The CLI goes through the forwarder, which alone reaches the server.
    let url = ServerUrl::parse(url)?.forwarded();
    check_model(model)?;
    let mut vars = Vec::new();
    for pair in declared.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) =
            pair.split_once('=').ok_or_else(|| format!("{VARS_ENV}: `{pair}` is not NAME=value"))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("{VARS_ENV}: `{name}` is not a variable's name"));
        }
        vars.push((name.to_string(), value.replace("{url}", &url).replace("{model}", model)));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_to_scheme_host_port_and_path() {
        let url = ServerUrl::parse("http://localhost:11434").unwrap();
        assert_eq!(
            url,
            ServerUrl { scheme: "http", host: Host::Name("localhost".into()), port: 11434, path: "".into() }
        );
        let url = ServerUrl::parse("https://GPU.lan/v1/").unwrap();
        assert_eq!(
            (url.host.clone(), url.port, url.path.as_str()),
            (Host::Name("gpu.lan".into()), 443, "/v1")
        );
        assert_eq!(url.to_string(), "https://gpu.lan:443/v1");
        let url = ServerUrl::parse("http://[fd00::5]:8080").unwrap();
        assert_eq!(url.host, Host::Address("fd00::5".parse().unwrap()));
        assert_eq!(url.to_string(), "http://[fd00::5]:8080");
        assert_eq!(ServerUrl::parse("http://[::1]").unwrap().port, 80);
        assert_eq!(
            ServerUrl::parse("http://192.168.1.10:11434").unwrap().host,
            Host::Address([192, 168, 1, 10].into())
        );
    }

    #[test]
    fn urls_with_more_than_a_server_are_refused() {
        for bad in [
            "localhost:11434",
            "ftp://host",
            "http://user@host",
            "http://host/?q=1",
            "http://host:0",
            "http://host:99999",
            "http://host:port",
            "http://ho st",
            "http://host/$(id)",
            "http://host/a;b",
            "http://host/a\"b",
            "http://host/../x",
            "http://-host",
            "http://",
            "http://[::1",
            "http://[nope]:80",
            "http://2130706433:11434",
            "http://0x7f.1",
            "http://0177.0.0.1",
            "http://10.1",
        ] {
            assert!(ServerUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn model_names_are_held_to_what_servers_use() {
        for good in ["llama3.2", "qwen2.5-coder:7b", "hf.co/org/model:Q4_K_M", "org/model@rev", "a+b"] {
            check_model(good).unwrap();
        }
        for bad in [
            "", "-v", "a b", "a;b", "a\"b", "a'b", "$(id)", "a`b", "a\\b", "a{b}", "é", "@x", ":x", ".x",
            "x:", "a/../b",
        ] {
            assert!(check_model(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_declaration_expands_with_the_url_and_the_model() {
        let vars = expand(
            "OPENAI_BASE_URL={url}/v1; OPENAI_API_KEY=local;AIDER_MODEL=openai/{model};",
            "http://host.docker.internal:11434/",
            "qwen2.5-coder:7b",
        )
        .unwrap();
        assert_eq!(
            vars,
            [
                ("OPENAI_BASE_URL".to_string(), "http://127.0.0.1:15109/v1".to_string()),
                ("OPENAI_API_KEY".into(), "local".into()),
                ("AIDER_MODEL".into(), "openai/qwen2.5-coder:7b".into()),
            ]
        );
        assert!(expand("NOEQUALS", "http://h:1", "m").is_err());
        assert!(expand("BAD NAME=x", "http://h:1", "m").is_err());
        assert!(expand("A={model}", "http://h:1", "m;B=x").is_err());
        assert!(expand("A={url}", "http://h:1/;B=x", "m").is_err());
    }
}
