//! Forwarded services: hosts the agent reaches only through sandbox-init's forwarder, which
//! holds the user's token and keeps to the policy's method and path rules. GitHub and the npm
//! registry are built in (their hosts, ports and token variables are defined here, once); a
//! policy declares any other HTTPS API under `forward: {NAME: {host, secret, allow}}`. This
//! module is the data and its validation; the rules are applied by sandbox-init's forwarder.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::pattern::DomainPattern;

/// Which of GitHub's hosts a route serves: each has rules of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// github.com: git over HTTP, Git LFS, the web.
    Git,
    /// api.github.com: REST and GraphQL.
    Api,
    /// uploads.github.com: release assets.
    Uploads,
    /// raw.githubusercontent.com and codeload.github.com: a readable repository's files and
    /// archives (paths start `OWNER/REPO`), GET and HEAD only.
    Raw,
    /// objects.githubusercontent.com: release assets and LFS objects by signed URLs, GET and
    /// HEAD only, without the token.
    Objects,
    /// The npm registry.
    Npm,
    /// A model API whose key sandbox-init holds (apis.rs): any request under its base path.
    Model,
}

/// One forwarded host of a built-in service, and the forwarder's port for it on 127.0.0.1.
#[derive(Debug)]
pub struct BuiltinHost {
    pub host: &'static str,
    pub port: u16,
    pub part: Part,
    /// How the token travels to this host: (header, prefix), or Basic with this user name.
    pub auth: Auth,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// `authorization: Bearer TOKEN`.
    Bearer,
    /// `authorization: Basic base64(USER:TOKEN)`, as git sends a token over HTTP.
    Basic(&'static str),
    /// No token: the host serves public files and signed URLs, which a second credential breaks.
    None,
}

/// A service this sandbox-init knows how to forward.
#[derive(Debug)]
pub struct Builtin {
    /// Its bundle's name in policies/services.yaml.
    pub name: &'static str,
    /// Every host of the bundle: while it is forwarded, none is reached directly, so no front
    /// end of the service takes the agent's own token (a write fronted through a read-only
    /// host's name, its Host another host's, is one).
    pub hosts: &'static [BuiltinHost],
    /// Where the user's token may come from: these variables, or the secret files of the same
    /// names in lower case.
    pub token_vars: &'static [&'static str],
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "github",
        hosts: &[
            BuiltinHost {
                host: "github.com",
                port: 15110,
                part: Part::Git,
                auth: Auth::Basic("x-access-token"),
            },
            BuiltinHost { host: "api.github.com", port: 15111, part: Part::Api, auth: Auth::Bearer },
            BuiltinHost { host: "uploads.github.com", port: 15112, part: Part::Uploads, auth: Auth::Bearer },
            BuiltinHost { host: "codeload.github.com", port: 15113, part: Part::Raw, auth: Auth::None },
            BuiltinHost {
                host: "raw.githubusercontent.com",
                port: 15114,
                part: Part::Raw,
                auth: Auth::Bearer,
            },
            BuiltinHost {
                host: "objects.githubusercontent.com",
                port: 15115,
                part: Part::Objects,
                auth: Auth::None,
            },
            // Not *.githubcopilot.com: api.githubcopilot.com/mcp/ is GitHub's MCP server, which
            // takes any token and writes (files, pushes, gists). The copilot image is direct.
        ],
        token_vars: &["GH_TOKEN", "GITHUB_TOKEN"],
    },
    Builtin {
        name: "npm",
        hosts: &[BuiltinHost {
            host: "registry.npmjs.org",
            port: 15120,
            part: Part::Npm,
            auth: Auth::Bearer,
        }],
        token_vars: &["NPM_TOKEN"],
    },
];

/// The first port of the services a policy declares, in the order of their names.
pub const DECLARED_PORTS: u16 = 15130;
/// The most services a policy may declare.
pub const MAX_DECLARED: usize = 60;

/// The built-in service named `name`.
pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// Every variable that may hold a forwarded service's token.
pub fn token_vars() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().flat_map(|b| b.token_vars.iter().copied())
}

/// What a policy says of one forwarded service, under `forward: {NAME: …}`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forward {
    /// `direct: true`: the service's hosts are reached directly, as any allowed name (its write
    /// channel open to the agent's own tokens). Built-in services only.
    pub direct: bool,
    /// GitHub: the repositories the agent may read; None: all.
    pub read: Option<BTreeSet<String>>,
    /// GitHub: the repositories the agent may push to and write through the API.
    pub write: BTreeSet<String>,
    /// GitHub: the GraphQL mutations it may send.
    pub mutations: BTreeSet<String>,
    /// npm: the packages it may publish, unpublish and tag.
    pub publish: BTreeSet<String>,
    /// A declared service: its one host, and the secret file its token is in.
    pub declared: Option<Declared>,
    /// A declared service: `METHOD… PATH` rules, what the agent may ask.
    pub allow: Vec<HttpRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub host: String,
    /// The file under /run/secrets.
    pub secret: String,
    /// The header the token travels in, lower-case, and what comes before it.
    pub header: String,
    pub prefix: String,
    /// The variable the agent's client reads the token from, if any: it gets a placeholder
    /// ([`PLACEHOLDER`]), as a model API's key variable does, so a client that insists on one
    /// runs, and the real token stays the forwarder's.
    pub variable: Option<String>,
}

/// What a declared service's `variable` holds in the agent's session.
pub const PLACEHOLDER: &str = "held-by-agent-sandbox";

/// One rule of a declared service: methods (upper-case, `*` any) and a path pattern (`*` one
/// segment, `**` any number of segments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRule {
    pub methods: Vec<String>,
    pub path: String,
}

impl Forward {
    /// Drop-ins widen, as everywhere in a policy: lists add up, and `direct` stays once set. A
    /// declared service keeps the host and secret of the first file that declared it.
    pub fn merge(&mut self, other: Forward) {
        self.direct |= other.direct;
        self.read = match (self.read.take(), other.read) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            _ => None,
        };
        self.write.extend(other.write);
        self.mutations.extend(other.mutations);
        self.publish.extend(other.publish);
        if self.declared.is_none() {
            self.declared = other.declared;
        }
        for rule in other.allow {
            if !self.allow.contains(&rule) {
                self.allow.push(rule);
            }
        }
    }
}

/// `forward:` as YAML writes it: each service's settings checked by its kind, at its line.
pub(crate) struct ForwardMap(pub(crate) BTreeMap<String, Forward>);

impl<'de> Deserialize<'de> for ForwardMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ForwardMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a mapping of service names to their settings, as in {github: {write: [OWNER/REPO]}}",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ForwardMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    let forward = match name.as_str() {
                        "github" => map.next_value::<GithubForward>()?.0,
                        "npm" => map.next_value::<NpmForward>()?.0,
                        _ => {
                            check_service_name(&name).map_err(de::Error::custom)?;
                            if crate::services().contains_key(&name) {
                                return Err(de::Error::custom(format!(
                                    "`{name}` is a service bundle that is not forwarded: only github and npm \
                                     are built in; declare your own under another name"
                                )));
                            }
                            map.next_value::<DeclaredForward>()?.0
                        }
                    };
                    if out.insert(name.clone(), forward).is_some() {
                        return Err(de::Error::custom(format!("`{name}` is set twice under `forward`")));
                    }
                }
                if out.values().filter(|f| f.declared.is_some()).count() > MAX_DECLARED {
                    return Err(de::Error::custom(format!("more than {MAX_DECLARED} declared services")));
                }
                Ok(ForwardMap(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn check_service_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.as_bytes()[0].is_ascii_lowercase();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a service name: lower-case letters, digits and `-`, starting with a letter"
        ))
    }
}

/// A string value checked by a function, the message at its own line.
macro_rules! checked_string {
    ($name:ident, $check:expr) => {
        struct $name(String);
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                let check: fn(&str) -> Result<String, String> = $check;
                check(&text).map($name).map_err(de::Error::custom)
            }
        }
    };
}

checked_string!(Repo, check_repo);
checked_string!(Mutation, check_mutation);
checked_string!(Package, check_package);
checked_string!(SecretName, check_secret);
checked_string!(HeaderName, check_header);
checked_string!(VariableName, check_variable);

/// `OWNER/REPO`, `OWNER/*` or `*/*`: GitHub's name characters, compared without case.
pub fn check_repo(text: &str) -> Result<String, String> {
    let bad = || format!("`{text}` is not a repository: write OWNER/REPO, OWNER/* or */*");
    let (owner, repo) = text.split_once('/').ok_or_else(bad)?;
    let name = |s: &str, dots: bool| {
        s == "*"
            || (!s.is_empty()
                && s.len() <= 100
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (dots && b == b'.'))
                && s != "."
                && s != "..")
    };
    if !name(owner, false) || !name(repo, true) || (owner == "*" && repo != "*") {
        return Err(bad());
    }
    let repo = repo.strip_suffix(".git").unwrap_or(repo);
    Ok(format!("{owner}/{repo}").to_ascii_lowercase())
}

fn check_mutation(text: &str) -> Result<String, String> {
    let ok = text.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    ok.then(|| text.to_string())
        .ok_or_else(|| format!("`{text}` is not a GraphQL mutation's name, as in createPullRequest"))
}

/// `NAME`, `@SCOPE/NAME` or `@SCOPE/*`, as npm writes names (lower-case).
fn check_package(text: &str) -> Result<String, String> {
    let part = |s: &str| {
        !s.is_empty()
            && s.len() <= 214
            && !s.starts_with('.')
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._~".contains(&b))
    };
    let ok = match text.strip_prefix('@').map(|rest| rest.split_once('/')) {
        Some(Some((scope, name))) => part(scope) && (name == "*" || part(name)),
        Some(None) => false,
        None => part(text),
    };
    ok.then(|| text.to_string()).ok_or_else(|| {
        format!("`{text}` is not an npm package name: NAME, @SCOPE/NAME or @SCOPE/*, in lower case")
    })
}

fn check_secret(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && !text.starts_with('.')
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    ok.then(|| text.to_string()).ok_or_else(|| {
        format!("`{text}` is not a file name under /run/secrets (letters, digits, `_`, `.`, `-`)")
    })
}

fn check_header(text: &str) -> Result<String, String> {
    let lower = text.to_ascii_lowercase();
    let ok = !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    let reserved = ["host", "connection", "content-length", "transfer-encoding", "cookie"];
    if !ok || reserved.contains(&lower.as_str()) {
        return Err(format!(
            "`{text}` cannot carry a token: name a header such as authorization or x-api-key"
        ));
    }
    Ok(lower)
}

/// An environment variable for a token's placeholder: upper-case, and named as tokens are
/// (`…_TOKEN`, `…_KEY`, `…_SECRET`), so that no policy sets `PATH` or `LD_PRELOAD` this way.
fn check_variable(text: &str) -> Result<String, String> {
    let ok = text.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && text.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && ["_TOKEN", "_KEY", "_SECRET"].iter().any(|end| text.ends_with(end))
        && !crate::apis::key_vars().any(|v| v == text);
    ok.then(|| text.to_string()).ok_or_else(|| {
        format!(
            "`{text}` cannot hold a placeholder: name an upper-case variable ending in _TOKEN, _KEY or \
             _SECRET that is not a model API's or built-in service's"
        )
    })
}

/// `GET /v1/items/*`, `GET,HEAD /v1/**`, `* /status`.
pub fn parse_http_rule(text: &str) -> Result<HttpRule, String> {
    let bad = |why: &str| format!("`{text}`: {why}; write METHOD[,METHOD…] /PATH, as in `GET /v1/**`");
    let (methods, path) = text.trim().split_once(' ').ok_or_else(|| bad("no path"))?;
    let methods: Vec<String> = methods.split(',').map(str::to_string).collect();
    if methods.iter().any(|m| m.is_empty() || !(m == "*" || m.bytes().all(|b| b.is_ascii_uppercase()))) {
        return Err(bad("methods are upper-case words or `*`"));
    }
    let path = path.trim();
    if !path.starts_with('/') {
        return Err(bad("the path starts with `/`"));
    }
    for segment in path[1..].split('/') {
        if segment == "." || segment == ".." || (segment.contains('*') && segment != "*" && segment != "**") {
            return Err(bad("`*` and `**` stand for whole segments, and no segment is `.` or `..`"));
        }
        if segment.bytes().any(|b| b <= b' ' || b"%?#\\;".contains(&b)) {
            return Err(bad("a path pattern is written decoded, without `%`, `?`, `#`, `\\` or `;`"));
        }
    }
    Ok(HttpRule { methods, path: path.to_string() })
}

struct HttpRuleValue(HttpRule);

impl<'de> Deserialize<'de> for HttpRuleValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_http_rule(&text).map(HttpRuleValue).map_err(de::Error::custom)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GithubFields {
    #[serde(default)]
    direct: bool,
    #[serde(default)]
    read: Option<Vec<Repo>>,
    #[serde(default)]
    write: Vec<Repo>,
    #[serde(default)]
    mutations: Vec<Mutation>,
}

struct GithubForward(Forward);

impl<'de> Deserialize<'de> for GithubForward {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = GithubFields::deserialize(d)?;
        Ok(GithubForward(Forward {
            direct: f.direct,
            read: f.read.map(|r| r.into_iter().map(|r| r.0).collect()),
            write: f.write.into_iter().map(|r| r.0).collect(),
            mutations: f.mutations.into_iter().map(|m| m.0).collect(),
            ..Forward::default()
        }))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NpmFields {
    #[serde(default)]
    direct: bool,
    #[serde(default)]
    publish: Vec<Package>,
}

struct NpmForward(Forward);

impl<'de> Deserialize<'de> for NpmForward {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = NpmFields::deserialize(d)?;
        Ok(NpmForward(Forward {
            direct: f.direct,
            publish: f.publish.into_iter().map(|p| p.0).collect(),
            ..Forward::default()
        }))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "{host, secret, allow} (header, prefix and variable optional)")]
struct DeclaredFields {
    host: DeclaredHost,
    secret: SecretName,
    #[serde(default)]
    header: Option<HeaderName>,
    #[serde(default)]
    variable: Option<VariableName>,
    #[serde(default)]
    prefix: Option<String>,
    allow: Vec<HttpRuleValue>,
}

struct DeclaredHost(String);

impl<'de> Deserialize<'de> for DeclaredHost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match DomainPattern::parse(&text).map_err(de::Error::custom)? {
            DomainPattern::Exact(host) => {
                if builtin_host(&host).is_some() {
                    return Err(de::Error::custom(format!(
                        "{host} is forwarded by a built-in service already"
                    )));
                }
                Ok(DeclaredHost(host))
            }
            DomainPattern::Subdomains(_) => Err(de::Error::custom(format!(
                "`{text}`: a forwarded service names one host, not a wildcard"
            ))),
        }
    }
}

struct DeclaredForward(Forward);

impl<'de> Deserialize<'de> for DeclaredForward {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = DeclaredFields::deserialize(d)?;
        if f.allow.is_empty() {
            return Err(de::Error::custom("`allow` lists at least one rule, as in `GET /v1/**`"));
        }
        let prefix = f.prefix.unwrap_or_else(|| "Bearer ".into());
        if prefix.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(de::Error::custom("`prefix` holds a control character"));
        }
        Ok(DeclaredForward(Forward {
            declared: Some(Declared {
                host: f.host.0,
                secret: f.secret.0,
                header: f.header.map_or_else(|| "authorization".into(), |h| h.0),
                prefix,
                variable: f.variable.map(|v| v.0),
            }),
            allow: f.allow.into_iter().map(|r| r.0).collect(),
            ..Forward::default()
        }))
    }
}

/// The built-in service and host entry that forward `host`, if one does.
pub fn builtin_host(host: &str) -> Option<(&'static Builtin, &'static BuiltinHost)> {
    BUILTINS.iter().find_map(|b| b.hosts.iter().find(|h| h.host == host).map(|h| (b, h)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_folded() {
        assert_eq!(check_repo("Octo/Hello.git").unwrap(), "octo/hello");
        assert_eq!(check_repo("octo/*").unwrap(), "octo/*");
        assert_eq!(check_repo("*/*").unwrap(), "*/*");
        for bad in ["octo", "*/x", "a/b/c", "o/..", "o/", "/r", "o.x/r", "o/r r"] {
            assert!(check_repo(bad).is_err(), "{bad}");
        }
        assert!(
            check_package("@me/pkg").is_ok() && check_package("@me/*").is_ok() && check_package("x").is_ok()
        );
        for bad in ["@me", "Pkg", ".x", "@me/x/y", "*"] {
            assert!(check_package(bad).is_err(), "{bad}");
        }
        assert!(check_header("Host").is_err() && check_header("x-api-key").is_ok());
        assert!(check_secret("../x").is_err() && check_secret("my_token").is_ok());
        assert!(check_variable("TRACKER_TOKEN").is_ok() && check_variable("JIRA_API_KEY").is_ok());
        for bad in ["PATH", "LD_PRELOAD", "tracker_token", "GH_TOKEN", "OPENAI_API_KEY", "_TOKEN2"] {
            assert!(check_variable(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn http_rules_parse() {
        let rule = parse_http_rule("GET,HEAD /v1/**").unwrap();
        assert_eq!(
            (rule.methods.as_slice(), rule.path.as_str()),
            (&["GET".to_string(), "HEAD".into()][..], "/v1/**")
        );
        for bad in ["GET", "get /x", "GET x", "GET /a/../b", "GET /a*b", "GET /%2e"] {
            assert!(parse_http_rule(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn builtin_ports_and_hosts_are_unique() {
        let mut ports = BTreeSet::new();
        let mut hosts = BTreeSet::new();
        for host in BUILTINS.iter().flat_map(|b| b.hosts) {
            assert!(ports.insert(host.port) && hosts.insert(host.host), "{host:?}");
            assert!(host.port < DECLARED_PORTS && host.port > 15103, "{host:?}");
        }
        for builtin in BUILTINS {
            assert!(crate::services().contains_key(builtin.name), "{} has no bundle", builtin.name);
        }
    }
}
