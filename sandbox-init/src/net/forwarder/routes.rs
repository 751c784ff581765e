//! The forwarder's routes (`ServiceRoute`), one per host it alone reaches: a held key's API
//! (keys.rs), or a forwarded service's host (policy's `forward`), with the user's token (a
//! root-only secret file, or for the built-in services the launcher's variables, as for API
//! keys), the header it travels in and the rules the forwarder keeps to; and what the agent's
//! clients are pointed at the forwarder with: git's `insteadOf` (a file the system git
//! configuration includes) and npm's registry.

use std::path::Path;

use crate::exit::Fatal;
use crate::net::forwarder::keys::HeldKey;
use crate::policy::RemoteTools;
use crate::policy::forward::{Auth, Part, builtin};
use crate::policy::{ForwardedHost, Policy, model};
use crate::privileges::AgentPrivileges;
use sandbox_wire::forwarder::request::{Route, Upstream};
use sandbox_wire::forwarder::rules::{HttpRule, Rules};

use crate::secrets::read_secret;

/// The file the base image's system git configuration includes (`include.path`): written at
/// start when GitHub is forwarded, removed otherwise. git ignores an include that is missing.
pub use crate::policy::layout::GITCONFIG;

/// One forwarded host as the forwarder serves it: a forwarded service's, or a model API's with
/// its key held (keys.rs), the same in everything the forwarder does.
pub struct ServiceRoute {
    pub host: ForwardedHost,
    /// The header and its whole value, when a token was given; None: requests go without one
    /// (GitHub's public reads).
    pub auth: Option<(String, String)>,
    /// Where the token came from, for the start's line (never the token).
    pub from: Option<String>,
    /// Headers the agent's requests lose: every header a credential of the service travels in.
    pub strip: Vec<String>,
    /// The path every request must be under: a model API's base URL's, when the user gave one.
    pub path: Option<String>,
    /// The model API whose remote tools a request's body may not name (policy's `apis`).
    pub inspect: Option<String>,
    pub rules: Rules,
    /// What the agent's processes get for this host: the forwarder's address in the variables
    /// its clients read, and a placeholder where the credential would be.
    pub env: Vec<(String, String)>,
    /// A model server of the user's: its one address, instead of the host's name over TLS.
    pub upstream: Option<Upstream>,
}

impl std::fmt::Debug for ServiceRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = self.from.as_deref().unwrap_or("no token");
        write!(f, "ServiceRoute({} on {}, {from}, {:?})", self.host.host, self.host.port, self.rules)
    }
}

impl ServiceRoute {
    /// The forwarder's port and route for this host (its descriptor set when it is bound).
    pub fn route(&self) -> (u16, Route) {
        let (header, value) = self.auth.clone().unwrap_or_default();
        let route = Route {
            fd: -1,
            host: self.host.host.clone(),
            header,
            value,
            strip: self.strip.clone(),
            path: self.path.clone(),
            inspect: self.inspect.clone(),
            rules: self.rules.clone(),
            upstream: self.upstream.clone(),
        };
        (self.host.port, route)
    }

    /// The start's line for this host.
    pub fn start_line(&self, pid: i32) -> String {
        let (host, port) = (&self.host.host, self.host.port);
        if let Some(upstream) = &self.upstream {
            let scheme = if upstream.server_name.is_some() { "https" } else { "http" };
            return format!(
                "sandbox-init: the model server is forwarded (pid {pid}): 127.0.0.1:{port} sends to \
                 {scheme}://{host} at {}, its model endpoints alone",
                upstream.address
            );
        }
        match (self.host.part, &self.from) {
            (Some(Part::Model), from) => format!(
                "sandbox-init: the {} key ({}) is held by the forwarder (pid {pid}): 127.0.0.1:{port} sends to https://{host}",
                self.host.service,
                from.as_deref().unwrap_or("?")
            ),
            (_, from) => {
                let token = from
                    .as_deref()
                    .map_or("without a token".to_string(), |f| format!("with the token of {f}"));
                format!(
                    "sandbox-init: {} is forwarded (pid {pid}): 127.0.0.1:{port} sends to https://{host} {token}, under the policy's rules",
                    self.host.service
                )
            }
        }
    }
}

/// The routes of every forwarded host of `policy`, with the tokens found for them.
pub fn routes(policy: &Policy, agent: &AgentPrivileges, secrets: &Path) -> Result<Vec<ServiceRoute>, Fatal> {
    let mut out = Vec::new();
    for host in policy.forwarded() {
        let (token, auth_kind) = match (builtin(&host.service), &host.settings.declared) {
            (Some(service), _) => {
                let spec = service.hosts.iter().find(|h| h.host == host.host).map(|h| h.auth);
                (token(service.token_vars, agent, secrets)?, spec.unwrap_or(Auth::Bearer))
            }
            (None, Some(declared)) => {
                let path = secrets.join(&declared.secret);
                let token = read_secret(&path, agent)?.map(|t| (t, path.display().to_string()));
                (token, Auth::Bearer)
            }
            (None, None) => continue,
        };
        let token = token.filter(|_| auth_kind != Auth::None);
        let auth = token.as_ref().and_then(|(token, _)| match (auth_kind, &host.settings.declared) {
            (_, Some(d)) => Some((d.header.clone(), format!("{}{token}", d.prefix))),
            (Auth::Basic(user), None) => {
                Some(("authorization".into(), format!("Basic {}", base64(&format!("{user}:{token}")))))
            }
            (Auth::Bearer, None) => Some(("authorization".into(), format!("Bearer {token}"))),
            (Auth::None, None) => None,
        });
        let strip = strip_list(auth.as_ref().map(|(header, _)| header.as_str()));
        let rules = Rules::for_host(&host);
        let env = host_env(&host);
        let from = token.map(|(_, from)| from);
        out.push(ServiceRoute {
            auth,
            from,
            strip,
            path: None,
            inspect: None,
            rules,
            env,
            host,
            upstream: None,
        });
    }
    Ok(out)
}

/// The tokens of the built-in services a policy keeps direct (`forward: {github: {direct:
/// true}}`, the copilot image's): the agent's own CLI signs in with it there, so its session
/// gets it back in the variable it came in (`GH_TOKEN`, or the file's variable).
pub fn direct_tokens(
    policy: &Policy,
    agent: &AgentPrivileges,
    secrets: &Path,
) -> Result<Vec<(String, String)>, Fatal> {
    let mut env = Vec::new();
    for name in &policy.services {
        let Some(service) = builtin(name) else { continue };
        if !policy.forward.get(name).is_some_and(|f| f.direct) {
            continue;
        }
        if let Some((token, from)) = token(service.token_vars, agent, secrets)? {
            let from_file =
                std::path::Path::new(&from).file_name().map(|f| f.to_string_lossy().to_ascii_uppercase());
            let var = service
                .token_vars
                .iter()
                .find(|v| from == format!("${v}") || from_file.as_deref() == Some(**v))
                .unwrap_or(&service.token_vars[0]);
            env.push((var.to_string(), token));
        }
    }
    Ok(env)
}

/// The first of `vars` with a secret file (its name in lower case), else the first set in the
/// environment.
fn token(vars: &[&str], agent: &AgentPrivileges, secrets: &Path) -> Result<Option<(String, String)>, Fatal> {
    for var in vars {
        for name in [var.to_ascii_lowercase(), var.to_string()] {
            let path = secrets.join(name);
            if let Some(token) = read_secret(&path, agent)? {
                return Ok(Some((token, path.display().to_string())));
            }
        }
    }
    Ok(vars.iter().find_map(|var| {
        let value = std::env::var(var).ok().filter(|v| !v.trim().is_empty())?;
        Some((value.trim().to_string(), format!("${var}")))
    }))
}

/// The headers an agent's request loses on a route whose credentials travel in `headers`: those,
/// and the agent's own `Authorization` and `Cookie` on every route, so that it brings no
/// credential of its own (an account of its own at the provider) through the forwarder.
pub fn strip_list<'a>(headers: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut strip = vec!["authorization".to_string(), "cookie".to_string()];
    for header in headers {
        if !strip.iter().any(|h| h == header) {
            strip.push(header.to_string());
        }
    }
    strip
}

/// What the agent's processes get for a forwarded service's host: `SANDBOX_FORWARD_<HOST>` (the
/// forwarder's address), and npm's registry for the registry.
fn host_env(host: &ForwardedHost) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{}", host.port);
    let name: String = host
        .host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect();
    let mut env = vec![(format!("SANDBOX_FORWARD_{name}"), url.clone())];
    if host.part == Some(Part::Npm) {
        env.push(("npm_config_registry".into(), format!("{url}/")));
    }
    if let Some(var) = host.settings.declared.as_ref().and_then(|d| d.variable.clone()) {
        env.push((var, crate::policy::forward::PLACEHOLDER.into()));
    }
    env
}

/// What the agent's processes get for every forwarded host and held key.
pub fn session_env(routes: &[ServiceRoute]) -> Vec<(String, String)> {
    routes.iter().flat_map(|r| r.env.iter().cloned()).collect()
}

/// The git configuration that sends GitHub's three URL forms to the forwarder, or None when
/// github.com is not forwarded.
pub fn gitconfig(routes: &[ServiceRoute]) -> Option<String> {
    let git = routes.iter().find(|r| r.host.part == Some(Part::Git))?;
    let mut text = format!(
        "# Written by sandbox-init at start: GitHub is reached through its forwarder.\n[url \"http://127.0.0.1:{}/\"]\n",
        git.host.port
    );
    for form in ["https://github.com/", "http://github.com/", "git@github.com:", "ssh://git@github.com/"] {
        text.push_str(&format!("\tinsteadOf = {form}\n"));
    }
    Some(text)
}

/// Writes (or removes) [`GITCONFIG`], readable by all, writable by root alone.
pub fn write_gitconfig(routes: &[ServiceRoute]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    match gitconfig(routes) {
        Some(text) => {
            let tmp = format!("{GITCONFIG}.tmp");
            std::fs::write(&tmp, text)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
            std::fs::rename(&tmp, GITCONFIG)
        }
        None => match std::fs::remove_file(GITCONFIG) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    }
}

/// The model server's route's name, where a model API's is its API's.
pub const MODEL_SERVER: &str = "model-server";

/// The route of the user's model server (`SANDBOX_MODEL_SERVER`, apis.rs): the forwarder's port
/// [`model::PORT`] sends the model's endpoints ([`model::ENDPOINTS`], under the URL's path) to
/// the one address the launcher named, with the URL's host as the Host; no credential of the
/// agent's goes with them.
pub fn model_server_route(url: &model::ServerUrl, address: std::net::SocketAddr, name: &str) -> ServiceRoute {
    let mut allow: Vec<HttpRule> = model::ENDPOINTS
        .iter()
        .map(|(methods, path)| HttpRule {
            methods: methods.split(',').map(str::to_string).collect(),
            path: format!("{}{path}", url.path),
        })
        .collect();
    // The user's model's own entry (its name may hold `/`: segments, each literal).
    allow.push(HttpRule {
        methods: vec!["GET".into(), "HEAD".into()],
        path: format!("{}/v1/models/{name}", url.path),
    });
    let server_name = (url.scheme == "https").then(|| match &url.host {
        model::Host::Name(name) => name.clone(),
        model::Host::Address(address) => address.to_string(),
    });
    ServiceRoute {
        host: ForwardedHost {
            service: MODEL_SERVER.into(),
            host: url.authority(),
            port: model::PORT,
            part: None,
            settings: Default::default(),
        },
        auth: None,
        from: None,
        strip: strip_list([]),
        path: None,
        // A body is read whole: a link the server (or what it passes the request to) would
        // fetch is refused, as for a model API's key (remote_tools.rs).
        inspect: Some(MODEL_SERVER.into()),
        rules: Rules::ModelServer { model: name.to_string(), allow },
        env: Vec::new(),
        upstream: Some(Upstream { address, server_name }),
    }
}

fn base64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

impl HeldKey {
    /// The key as the forwarder holds it: a forwarded host of its own (the API's, or the base
    /// URL's), any request under the base path let through, the body read for remote tools
    /// unless `policy` allows them; the agent's processes get the CLI's base-URL variables
    /// pointing at the forwarder, and the placeholder in the key's variable.
    pub fn route(&self, policy: &Policy) -> ServiceRoute {
        let api = self.api;
        let mut env = Vec::new();
        for (var, path) in api.base_urls {
            let path = self.base_path.as_deref().unwrap_or(path).trim_end_matches('/');
            env.push((var.to_string(), format!("http://127.0.0.1:{}{path}", api.port)));
        }
        env.push((self.var.var.to_string(), self.var.placeholder.to_string()));
        env.extend(api.session.iter().map(|(var, value)| (var.to_string(), value.to_string())));
        let refuse = policy.api_settings(api.name).remote_tools == RemoteTools::Refuse;
        ServiceRoute {
            host: api.forwarded_host(self.host.clone()),
            auth: Some((self.var.header.to_string(), format!("{}{}", self.var.prefix, self.key))),
            from: Some(self.from.clone()),
            strip: strip_list(api.keys.iter().map(|k| k.header)),
            path: self.base_path.clone(),
            inspect: refuse.then(|| api.name.to_string()),
            rules: if refuse && !api.paths.is_empty() {
                Rules::Model {
                    api: api.name.to_string(),
                    allow: api
                        .paths
                        .iter()
                        .map(|(method, path)| HttpRule {
                            methods: vec![method.to_string()],
                            path: path.to_string(),
                        })
                        .collect(),
                }
            } else {
                Rules::Any
            },
            env,
            upstream: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn github_gets_the_token_in_each_hosts_form_and_git_is_pointed_at_the_forwarder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gh_token");
        std::fs::write(&path, "ghp_real\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        let policy = Policy::from_yaml(
            Path::new("p.yaml"),
            "version: 1\nservices: [github, npm]\nforward:\n  github:\n    write: [octo/hello]\n",
        )
        .unwrap();
        let agent = AgentPrivileges::system(4242);
        let routes = routes(&policy, &agent, dir.path()).unwrap();
        let by_host = |h: &str| routes.iter().find(|r| r.host.host == h).unwrap();
        let git = by_host("github.com");
        assert_eq!(git.auth.as_ref().unwrap().1, format!("Basic {}", base64("x-access-token:ghp_real")));
        assert_eq!(by_host("api.github.com").auth.as_ref().unwrap().1, "Bearer ghp_real");
        let Rules::Github { access, .. } = &git.rules else { panic!("{:?}", git.rules) };
        assert_eq!(
            (access.read.as_slice(), access.write.as_slice()),
            (&["*/*".to_string()][..], &["octo/hello".to_string()][..])
        );
        // No npm token given: the registry is forwarded all the same, without one.
        assert_eq!(by_host("registry.npmjs.org").auth, None);
        let config = gitconfig(&routes).unwrap();
        assert!(
            config.contains("[url \"http://127.0.0.1:15110/\"]")
                && config.contains("insteadOf = git@github.com:")
        );
        let env = session_env(&routes);
        assert!(env.contains(&("npm_config_registry".into(), "http://127.0.0.1:15120/".into())), "{env:?}");
        assert!(
            env.contains(&("SANDBOX_FORWARD_API_GITHUB_COM".into(), "http://127.0.0.1:15111".into())),
            "{env:?}"
        );
        assert!(!format!("{routes:?}").contains("ghp_real"), "the token in a debug string");
        assert!(direct_tokens(&policy, &agent, dir.path()).unwrap().is_empty(), "forwarded: held");
        let direct =
            Policy::from_yaml(Path::new("p.yaml"), "version: 1\nforward:\n  github:\n    direct: true\n")
                .unwrap();
        assert!(super::routes(&direct, &agent, dir.path()).unwrap().is_empty());
        assert_eq!(
            direct_tokens(&direct, &agent, dir.path()).unwrap(),
            [("GH_TOKEN".to_string(), "ghp_real".to_string())]
        );
    }

    #[test]
    fn a_model_servers_route_sends_the_models_endpoints_alone_to_its_one_address() {
        use sandbox_wire::forwarder::rules::{Request, Verdict};
        let url = model::ServerUrl::parse("http://gpu.lan:8000/openai").unwrap();
        let route = model_server_route(&url, "192.168.1.20:8000".parse().unwrap(), "hf.co/org/m");
        let (port, wire) = route.route();
        assert_eq!(port, model::PORT);
        assert_eq!(wire.host, "gpu.lan:8000");
        assert_eq!(
            wire.upstream.as_ref().map(|u| (u.address.to_string(), u.server_name.clone())),
            Some(("192.168.1.20:8000".into(), None))
        );
        assert!(wire.header.is_empty(), "no credential goes to the server");
        let judge = |method: &str, path: &str| route.rules.judge_head(&Request { method, path, query: "" });
        for (method, path) in [("GET", "/openai/v1/models"), ("GET", "/openai/v1/models/hf.co/org/m")] {
            assert_eq!(judge(method, path).unwrap(), Verdict::Pass, "{method} {path}");
        }
        assert!(judge("GET", "/openai/v1/models/other").is_err());
        // A body is read, and must name the user's model, in every spelling of its key.
        let body = |method: &str, path: &str, body: &str| {
            assert_eq!(judge(method, path).unwrap(), Verdict::Body, "{method} {path}");
            route.rules.judge_body(&Request { method, path, query: "" }, body.as_bytes())
        };
        for (path, text) in [
            ("/openai/v1/chat/completions", r#"{"model":"hf.co/org/m","messages":[]}"#),
            ("/openai/api/chat", r#"{"model":"hf.co/org/m","messages":[],"tools":[{"type":"function"}]}"#),
            ("/openai/api/show", r#"{"name":"hf.co/org/m"}"#),
        ] {
            body("POST", path, text).unwrap_or_else(|e| panic!("{path} {text}: {e:?}"));
        }
        for text in [
            r#"{"model":"gpt-oss:120b:cloud","messages":[]}"#,
            r#"{"model":"hf.co/org/m","MODEL":"x:cloud"}"#,
            r#"{"model":"hf.co/org/m","Name":"other"}"#,
            r#"{"messages":[]}"#,
            r#"{"model":"hf.co/org/m","model":"x:cloud"}"#,
            r#"{"model":"hf.co/org/m","tools":[{"type":"web_search_20250305","name":"web_search"}]}"#,
            r#"{"model":"hf.co/org/m","tools":[{"type":"WEB_SEARCH"}]}"#,
            r#"[{"model":"hf.co/org/m"}]"#,
        ] {
            assert!(body("POST", "/openai/api/chat", text).is_err(), "{text}");
        }
        for (method, path) in [
            ("POST", "/openai/api/pull"),
            ("POST", "/openai/api/push"),
            ("POST", "/openai/api/create"),
            ("DELETE", "/openai/api/delete"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/openai/v1/chat/completions"),
        ] {
            assert!(judge(method, path).is_err(), "{method} {path}");
        }
        let https = model::ServerUrl::parse("https://gpu.lan:8443").unwrap();
        let route = model_server_route(&https, "192.168.1.20:8443".parse().unwrap(), "m");
        assert_eq!(route.upstream.unwrap().server_name.as_deref(), Some("gpu.lan"));
    }
}
