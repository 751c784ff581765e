//! The method and path rules the loopback HTTP forwarder applies to the agent's requests before
//! sending them on with the user's token: which repositories git and GitHub's REST API may read
//! and write, which GraphQL mutations go through, which npm packages may be published, and what
//! a user-declared HTTPS API allows. Pure: paths arrive canonical (`request::canonical_path`),
//! and anything these rules cannot read the way the server would is refused.

use graphql_parser::query::{Definition, OperationDefinition as Operation, Selection};
use serde::{Deserialize, Serialize};

use sandbox_policy::ForwardedHost;
use sandbox_policy::forward::Part;

use crate::forwarder::Refused;

/// What one forwarded host allows. Travels as JSON from PID 1 to the forwarder process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rules {
    /// A model API: no method or path rule here (its own checks apply elsewhere).
    Any,
    /// One of GitHub's hosts.
    Github { part: GithubPart, access: GithubAccess },
    /// The npm registry.
    Npm { publish: Vec<String> },
    /// A user-declared HTTPS API: only what one of the rules allows.
    Http { allow: Vec<HttpRule> },
    /// A model API whose table lists the requests it forwards while remote tools are refused
    /// (`sandbox_policy::apis::Api::paths`): only those.
    Model { api: String, allow: Vec<HttpRule> },
    /// A model server of the user's: the model's endpoints alone (`allow`), and every request's
    /// body naming `model`, the one the user gave, and no search or fetch tool the server would
    /// run for it (Ollama sends a `web_search` tool, and a model named `…:cloud`, on to
    /// ollama.com with the user's key).
    ModelServer { model: String, allow: Vec<HttpRule> },
}

/// Which of GitHub's hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GithubPart {
    /// github.com: git's smart HTTP, LFS, and web pages.
    Git,
    /// api.github.com: REST and GraphQL.
    Api,
    /// uploads.github.com: release assets.
    Uploads,
    /// raw.githubusercontent.com, codeload.github.com: a readable repository's files and
    /// archives, read only.
    Raw,
    /// objects.githubusercontent.com: downloads by signed URL, read only.
    Objects,
}

/// What the agent may do with the user's GitHub token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GithubAccess {
    /// Repositories the agent may read (clone, fetch, GET under /repos/O/R): `owner/repo` or
    /// `owner/*` or `*/*`; the policy's default is ["*/*"].
    pub read: Vec<String>,
    /// Repositories the agent may write (push, REST writes under /repos/O/R, release uploads, LFS
    /// uploads). Default none.
    pub write: Vec<String>,
    /// GraphQL mutations (top-level field names, e.g. createPullRequest) the agent may send.
    pub mutations: Vec<String>,
}

/// One rule of a user-declared API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRule {
    /// Upper-case methods; "*" is any.
    pub methods: Vec<String>,
    /// A glob over segments: `*` is one segment, `**` (as a whole segment) any number of
    /// segments, zero included; any other segment is literal.
    pub path: String,
}

/// What the rules see of a request: its method, its canonical path, and its query (after `?`).
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Read the whole body and call `judge_body` before forwarding.
    Body,
}

impl Rules {
    /// The rules of one forwarded host, from its service's policy settings: GitHub's read and
    /// write lists and mutations, npm's publish list, a declared API's `allow` rules. The
    /// forwarder keeps to them, and `agent-sandbox policy check` judges by them.
    pub fn for_host(host: &ForwardedHost) -> Rules {
        let s = &host.settings;
        let github = |part| Rules::Github {
            part,
            access: GithubAccess {
                read: s.read.clone().map_or_else(|| vec!["*/*".into()], |r| r.into_iter().collect()),
                write: s.write.iter().cloned().collect(),
                mutations: s.mutations.iter().cloned().collect(),
            },
        };
        match host.part {
            Some(Part::Git) => github(GithubPart::Git),
            Some(Part::Api) => github(GithubPart::Api),
            Some(Part::Uploads) => github(GithubPart::Uploads),
            Some(Part::Raw) => github(GithubPart::Raw),
            Some(Part::Objects) => github(GithubPart::Objects),
            Some(Part::Npm) => Rules::Npm { publish: s.publish.iter().cloned().collect() },
            Some(Part::Model) => Rules::Any,
            None => Rules::Http {
                allow: s
                    .allow
                    .iter()
                    .map(|r| HttpRule { methods: r.methods.clone(), path: r.path.clone() })
                    .collect(),
            },
        }
    }

    /// The verdict on a request's method, path and query, before its body is read.
    pub fn judge_head(&self, req: &Request) -> Result<Verdict, Refused> {
        match self {
            Rules::Any => Ok(Verdict::Pass),
            Rules::Github { part: GithubPart::Git, access } => git_head(access, req),
            Rules::Github { part: GithubPart::Api, access } => api_head(access, req),
            Rules::Github { part: GithubPart::Uploads, access } => uploads_head(access, req),
            Rules::Github { part: GithubPart::Raw, access } => download_head(Some(access), req),
            Rules::Github { part: GithubPart::Objects, .. } => download_head(None, req),
            Rules::Npm { publish } => npm_head(publish, req),
            Rules::Http { allow } => http_head(allow, req),
            Rules::Model { api, allow } => model_head(api, allow, req),
            Rules::ModelServer { allow, .. } => {
                http_head(allow, req)?;
                Ok(if is_read(req.method) { Verdict::Pass } else { Verdict::Body })
            }
        }
    }

    /// The verdict on the whole body of a request `judge_head` answered `Verdict::Body` for. The
    /// head is judged again, so a request it refuses is refused here too.
    pub fn judge_body(&self, req: &Request, body: &[u8]) -> Result<(), Refused> {
        if self.judge_head(req)? == Verdict::Pass {
            return Ok(());
        }
        match self {
            Rules::Github { part: GithubPart::Git, access } => match segments(req.path).as_slice() {
                [owner, name, ..] => lfs_batch(access, &Repo::new(owner, name), body),
                _ => Err(forbidden("an LFS request without a repository".into())),
            },
            Rules::Github { part: GithubPart::Api, access } => graphql(&access.mutations, body),
            Rules::ModelServer { model, .. } => model_server_body(model, body),
            _ => Ok(()),
        }
    }
}

fn forbidden(line: String) -> Refused {
    Refused::new(403, line)
}

fn is_read(method: &str) -> bool {
    matches!(method, "GET" | "HEAD")
}

/// The path's segments, without the leading `/` and one trailing empty segment (`/a/` is `/a`).
fn segments(path: &str) -> Vec<&str> {
    let path = path.strip_prefix('/').unwrap_or(path);
    let path = path.strip_suffix('/').unwrap_or(path);
    if path.is_empty() { Vec::new() } else { path.split('/').collect() }
}

/// `segments` is exactly `words`, ASCII case-insensitively (`_` is any one segment).
fn is(segments: &[&str], words: &[&str]) -> bool {
    segments.len() == words.len()
        && segments.iter().zip(words).all(|(s, w)| *w == "_" || s.eq_ignore_ascii_case(w))
}

/// A repository as a path names it: `.git` (any case) removed from its name once.
struct Repo<'a> {
    owner: &'a str,
    name: &'a str,
}

impl<'a> Repo<'a> {
    fn new(owner: &'a str, name: &'a str) -> Repo<'a> {
        Repo { owner, name: strip_git(name) }
    }
}

impl std::fmt::Display for Repo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

fn strip_git(name: &str) -> &str {
    let n = name.len();
    // `.git` is ASCII, so `n - 4` is a character boundary when the bytes match.
    if n >= 4 && name.as_bytes()[n - 4..].eq_ignore_ascii_case(b".git") { &name[..n - 4] } else { name }
}

/// Whether one of `patterns` (`owner/repo`, `owner/*`, `*/*`) names `repo`; GitHub's names are
/// case-insensitive.
fn allows(patterns: &[String], repo: &Repo) -> bool {
    !repo.owner.is_empty()
        && !repo.name.is_empty()
        && patterns.iter().any(|p| {
            let Some((owner, name)) = p.split_once('/') else { return false };
            let name = strip_git(name);
            (owner == "*" || owner.eq_ignore_ascii_case(repo.owner))
                && (name == "*" || name.eq_ignore_ascii_case(repo.name))
        })
}

#[derive(Clone, Copy)]
enum Need {
    Read,
    Write,
}

/// `subject` (what the agent asked for) passes if `repo` is in the list `need` names.
fn need(access: &GithubAccess, need: Need, repo: &Repo, subject: &str) -> Result<Verdict, Refused> {
    let (list, key, adjective) = match need {
        Need::Read => (&access.read, "read", "readable"),
        Need::Write => (&access.write, "write", "writable"),
    };
    if allows(list, repo) {
        return Ok(Verdict::Pass);
    }
    Err(forbidden(format!(
        "{subject} is refused: {repo} is not {adjective}; `forward: {{github: {{{key}: [{repo}]}}}}` in a policy allows it"
    )))
}

#[derive(PartialEq)]
enum Service {
    Upload,
    Receive,
}

/// The `service` of an `info/refs` query, read as strictly as any server could: `&` and `;`
/// both separate, keys and values are percent-decoded, the key's case is ignored; two services,
/// or one git does not have, are refused.
fn service(query: &str) -> Result<Option<Service>, Refused> {
    let mut found = None;
    for pair in query.strip_prefix('?').unwrap_or(query).split(['&', ';']).filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !decode(key)?.eq_ignore_ascii_case("service") {
            continue;
        }
        if found.is_some() {
            return Err(forbidden("a git request naming two services is refused".into()));
        }
        found = Some(match decode(value)?.as_str() {
            "git-upload-pack" => Service::Upload,
            "git-receive-pack" => Service::Receive,
            other => return Err(forbidden(format!("the git service `{other}` is refused"))),
        });
    }
    Ok(found)
}

/// A query's key or value as a server reads it: `+` is a space, `%XX` a byte.
fn decode(text: &str) -> Result<String, Refused> {
    let malformed = || Refused::new(400, "a malformed percent-escape in the query");
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        out.push(match b {
            b'+' => b' ',
            b'%' => {
                let hex = [bytes.next().ok_or_else(malformed)?, bytes.next().ok_or_else(malformed)?];
                let hex = std::str::from_utf8(&hex).map_err(|_| malformed())?;
                u8::from_str_radix(hex, 16).map_err(|_| malformed())?
            }
            b => b,
        });
    }
    String::from_utf8(out).map_err(|_| Refused::new(400, "a query that is not UTF-8 once decoded"))
}

/// github.com: git's smart HTTP and LFS by the repositories they name; other reads pass.
fn git_head(access: &GithubAccess, req: &Request) -> Result<Verdict, Refused> {
    let (method, path) = (req.method, req.path);
    let seg = segments(path);
    if let [owner, name, rest @ ..] = seg.as_slice() {
        let repo = Repo::new(owner, name);
        let (push, fetch) = (format!("push to {repo}"), format!("fetch from {repo}"));
        if is_read(method) && is(rest, &["info", "refs"]) {
            return match service(req.query)? {
                Some(Service::Receive) => need(access, Need::Write, &repo, &push),
                _ => need(access, Need::Read, &repo, &fetch),
            };
        }
        if method == "POST" && is(rest, &["git-upload-pack"]) {
            return need(access, Need::Read, &repo, &fetch);
        }
        if method == "POST" && is(rest, &["git-receive-pack"]) {
            return need(access, Need::Write, &repo, &push);
        }
        if rest.len() >= 2 && is(&rest[..2], &["info", "lfs"]) {
            if method == "POST" && is(rest, &["info", "lfs", "objects", "batch"]) {
                return Ok(Verdict::Body);
            }
            let subject = format!("an LFS `{method}` to {repo}");
            return need(access, if is_read(method) { Need::Read } else { Need::Write }, &repo, &subject);
        }
    }
    if is_read(method) {
        return Ok(Verdict::Pass);
    }
    Err(forbidden(format!(
        "`{method} {path}` to github.com is refused: only git's own requests (fetch, push, LFS) write through github.com"
    )))
}

#[derive(Deserialize)]
struct LfsBatch {
    operation: String,
}

/// An LFS batch request: a download needs the repository readable, an upload writable. A key
/// spelled `operation` in another case is refused: a server whose JSON reader ignores case
/// could take it for the operation.
fn lfs_batch(access: &GithubAccess, repo: &Repo, body: &[u8]) -> Result<(), Refused> {
    let keys: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).map_err(|e| {
        Refused::new(400, format!("an LFS batch request that is not a JSON object is refused: {e}"))
    })?;
    if keys.keys().any(|k| k.eq_ignore_ascii_case("operation") && k != "operation") {
        return Err(Refused::new(400, "an LFS batch request with `operation` in another case is refused"));
    }
    let batch: LfsBatch = serde_json::from_slice(body).map_err(|e| {
        Refused::new(
            400,
            format!("an LFS batch request that is not JSON with one `operation` is refused: {e}"),
        )
    })?;
    match batch.operation.as_str() {
        "download" => need(access, Need::Read, repo, &format!("an LFS download from {repo}")),
        "upload" => need(access, Need::Write, repo, &format!("an LFS upload to {repo}")),
        other => {
            Err(forbidden(format!("the LFS operation `{other}` is refused: only downloads and uploads are")))
        }
    }
    .map(|_| ())
}

/// A model server's request body: a JSON object whose `model` (Ollama's `name` too, read in any
/// case, as Go's JSON reader matches keys) is the user's model, every one of them; and no tool
/// of a `type` the server runs itself (web search or fetch), at any depth.
fn model_server_body(model: &str, body: &[u8]) -> Result<(), Refused> {
    let value = crate::forwarder::inspect::strict_json(body)
        .map_err(|e| Refused::new(400, format!("a model server's request that is not strict JSON: {e}")))?;
    let serde_json::Value::Object(keys) = &value else {
        return Err(Refused::new(400, "a model server's request that is not a JSON object"));
    };
    let named: Vec<&serde_json::Value> = keys
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("model") || k.eq_ignore_ascii_case("name"))
        .map(|(_, v)| v)
        .collect();
    if named.is_empty() || named.iter().any(|v| v.as_str() != Some(model)) {
        return Err(forbidden(format!(
            "a model server's request for another model than {model}, the one `--model` named: the \
             server could load any, or send the request on (Ollama's `…:cloud` models go to ollama.com)"
        )));
    }
    fn server_tool(value: &serde_json::Value) -> Option<String> {
        match value {
            serde_json::Value::Array(items) => items.iter().find_map(server_tool),
            serde_json::Value::Object(object) => object
                .iter()
                .find_map(|(k, v)| {
                    let kind = v.as_str().map(str::to_ascii_lowercase).unwrap_or_default();
                    (k.eq_ignore_ascii_case("type")
                        && (kind.contains("web_search") || kind.contains("web_fetch")))
                    .then(|| kind.clone())
                })
                .or_else(|| object.values().find_map(server_tool)),
            _ => None,
        }
    }
    match server_tool(&value) {
        Some(tool) => Err(forbidden(format!(
            "a model server's request with a `{tool}` tool, which the server runs itself, at an \
             address of its choosing (Ollama's go to ollama.com)"
        ))),
        None => Ok(()),
    }
}

const COPIES: &str = "it would copy the repository elsewhere";
const REACH: &str = "it would change who can read or reach the repository";
const RUNS: &str = "it would run code with the repository's secrets";
const GUARDS: &str = "it would change the repository's protections or security settings";

/// What comes first after `/repos/O/R/` in a write that no policy allows, and why.
const UNSAFE: &[(&str, &str)] = &[
    ("transfer", COPIES),
    ("forks", COPIES),
    ("generate", COPIES),
    ("collaborators", REACH),
    ("invitations", REACH),
    ("hooks", REACH),
    ("keys", REACH),
    ("pages", REACH),
    ("actions", RUNS),
    ("environments", RUNS),
    ("codespaces", RUNS),
    ("dispatches", RUNS),
    ("deployments", RUNS),
    ("rulesets", GUARDS),
    ("secret-scanning", GUARDS),
    ("dependabot", GUARDS),
    ("security-advisories", GUARDS),
    ("vulnerability-alerts", GUARDS),
    ("automated-security-fixes", GUARDS),
    ("private-vulnerability-reporting", GUARDS),
    ("code-scanning", GUARDS),
];

/// Why a write under `/repos/O/R/{sub}/{rest}` is never forwarded, if it is not.
fn unsafe_write(sub: &str, rest: &[&str]) -> Option<&'static str> {
    if sub.eq_ignore_ascii_case("branches") && rest.iter().any(|s| s.eq_ignore_ascii_case("protection")) {
        return Some(GUARDS);
    }
    // A workflow written through the API, or a check run again, runs code with the secrets.
    let workflow = sub.eq_ignore_ascii_case("contents")
        && rest.first().is_some_and(|s| s.eq_ignore_ascii_case(".github"))
        && rest.get(1).is_some_and(|s| s.eq_ignore_ascii_case("workflows"));
    let rerun = (sub.eq_ignore_ascii_case("check-suites") || sub.eq_ignore_ascii_case("check-runs"))
        && rest.last().is_some_and(|s| s.eq_ignore_ascii_case("rerequest"));
    if workflow || rerun {
        return Some(RUNS);
    }
    UNSAFE.iter().find(|(name, _)| sub.eq_ignore_ascii_case(name)).map(|(_, why)| *why)
}

/// api.github.com: reads by repository, GraphQL by its body, writes only inside a writable
/// repository and never to what would copy it, open it or run its secrets.
fn api_head(access: &GithubAccess, req: &Request) -> Result<Verdict, Refused> {
    let (method, path) = (req.method, req.path);
    let seg = segments(path);
    let never = |why: &str| forbidden(format!("`{method} {path}` is refused: {why}, which no policy allows"));
    if is(&seg, &["graphql"]) {
        return match method {
            "POST" if req.query.is_empty() => Ok(Verdict::Body),
            "POST" => Err(never("a query string on /graphql could carry a second document")),
            _ => Err(never("GraphQL is forwarded by POST alone, where its mutations are checked")),
        };
    }
    if let [repos, owner, name, rest @ ..] = seg.as_slice()
        && repos.eq_ignore_ascii_case("repos")
    {
        let repo = Repo::new(owner, name);
        if is_read(method) {
            return need(access, Need::Read, &repo, &format!("reading {repo}"));
        }
        let Some((sub, rest)) = rest.split_first() else {
            return Err(never("a write to the repository itself could make it public, rename or delete it"));
        };
        if let Some(why) = unsafe_write(sub, rest) {
            return Err(never(why));
        }
        return need(access, Need::Write, &repo, &format!("`{method} {path}`"));
    }
    let first = seg.first().copied().unwrap_or_default();
    if is_read(method) {
        if first.eq_ignore_ascii_case("repositories") && !access.read.iter().any(|p| p == "*/*") {
            return Err(forbidden(format!(
                "`{method} {path}` is refused: a repository by number could be one the policy does not let the agent read; name it as /repos/OWNER/REPO"
            )));
        }
        return Ok(Verdict::Pass);
    }
    if first.eq_ignore_ascii_case("gists") {
        return Err(never("a gist is readable by anyone with its link"));
    }
    Err(forbidden(format!(
        "`{method} {path}` is refused: through api.github.com the agent writes only under /repos/OWNER/REPO/ of a repository in `forward: {{github: {{write: [...]}}}}`"
    )))
}

/// uploads.github.com: release assets, into a writable repository.
fn uploads_head(access: &GithubAccess, req: &Request) -> Result<Verdict, Refused> {
    let (method, path) = (req.method, req.path);
    let seg = segments(path);
    if is_read(method) {
        return Ok(Verdict::Pass);
    }
    if method == "POST" && is(&seg, &["repos", "_", "_", "releases", "_", "assets"]) {
        let repo = Repo::new(seg[1], seg[2]);
        return need(access, Need::Write, &repo, &format!("a release upload to {repo}"));
    }
    Err(forbidden(format!(
        "`{method} {path}` to uploads.github.com is refused: only release assets (POST /repos/OWNER/REPO/releases/ID/assets) are uploaded there"
    )))
}

/// GitHub's download hosts take no write, whatever Host or path the agent names: GET and HEAD
/// only (a body on them is refused before the rules), and where the path names a repository
/// (`OWNER/REPO/…`: `access` given), only a readable one.
fn download_head(access: Option<&GithubAccess>, req: &Request) -> Result<Verdict, Refused> {
    let (method, path) = (req.method, req.path);
    if !is_read(method) {
        return Err(forbidden(format!(
            "`{method} {path}` is refused: GitHub's download hosts are read only (GET and HEAD)"
        )));
    }
    match (access, segments(path).as_slice()) {
        (None, _) => Ok(Verdict::Pass),
        (Some(access), [owner, name, _, ..]) => {
            let repo = Repo::new(owner, name);
            need(access, Need::Read, &repo, &format!("reading {repo}"))
        }
        (Some(_), _) => Err(forbidden(format!("`{method} {path}` names no repository (OWNER/REPO/…)"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GraphqlRequest {
    query: String,
    #[serde(default)]
    #[allow(dead_code)]
    operation_name: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    #[allow(dead_code)]
    variables: Option<serde::de::IgnoredAny>,
}

/// A GraphQL request (one object, or a batch of them): every document parsed, every operation
/// a query or a mutation whose every top-level field is allowed.
fn graphql(mutations: &[String], body: &[u8]) -> Result<(), Refused> {
    let bad = |why: String| Refused::new(400, format!("a GraphQL request is refused: {why}"));
    let batch = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let requests: Vec<GraphqlRequest> = match batch {
        true => serde_json::from_slice(body),
        false => serde_json::from_slice(body).map(|one| vec![one]),
    }
    .map_err(|e| bad(format!("it is not JSON of the form {{\"query\": \"...\"}}: {e}")))?;
    if requests.is_empty() {
        return Err(bad("an empty batch".into()));
    }
    for request in &requests {
        let document = graphql_parser::parse_query::<&str>(&request.query)
            .map_err(|e| bad(format!("its document does not parse: {e}")))?;
        for definition in &document.definitions {
            let mutation = match definition {
                Definition::Fragment(_) => continue,
                Definition::Operation(Operation::Query(_) | Operation::SelectionSet(_)) => continue,
                Definition::Operation(Operation::Subscription(_)) => {
                    return Err(forbidden(
                        "a GraphQL subscription is refused: only queries and allowed mutations are forwarded"
                            .into(),
                    ));
                }
                Definition::Operation(Operation::Mutation(mutation)) => mutation,
            };
            for selection in &mutation.selection_set.items {
                match selection {
                    Selection::Field(field) if mutations.iter().any(|m| m == field.name) => {}
                    Selection::Field(field) => {
                        let name = field.name;
                        return Err(forbidden(format!(
                            "the GraphQL mutation {name} is refused: it is not an allowed mutation; `forward: {{github: {{mutations: [{name}]}}}}` in a policy allows it"
                        )));
                    }
                    _ => {
                        return Err(forbidden(
                            "a fragment at the top of a GraphQL mutation is refused: write each mutation as a field, where it is checked".into(),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The two POSTs `npm audit` sends: reads, whatever their body.
const NPM_AUDITS: [&str; 2] = ["/-/npm/v1/security/advisories/bulk", "/-/npm/v1/security/audits/quick"];

/// A package's name from the segments that start with it (`@scope/name` is two), and the rest.
fn package<'a, 'b>(seg: &'b [&'a str]) -> Option<(String, &'b [&'a str])> {
    match seg {
        [scope, name, rest @ ..] if scope.starts_with('@') => Some((format!("{scope}/{name}"), rest)),
        [name, rest @ ..] if !name.starts_with('@') => Some((name.to_string(), rest)),
        _ => None,
    }
}

/// Whether one of `patterns` (`name`, `@scope/name`, `@scope/*`) names the package; npm's names
/// are compared as written.
fn publishes(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| {
        p == name
            || p.strip_suffix('*').is_some_and(|scope| {
                scope.starts_with('@')
                    && scope.ends_with('/')
                    && name.strip_prefix(scope).is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
            })
    })
}

/// The npm registry: reads and audits pass; publishing, unpublishing and dist-tags only for the
/// packages the policy lists; logins, tokens, orgs and teams never.
fn npm_head(publish: &[String], req: &Request) -> Result<Verdict, Refused> {
    let (method, path) = (req.method, req.path);
    let seg = segments(path);
    let account = matches!(
        seg.as_slice(),
        ["-", "org" | "team" | "user", ..] | ["-", "v1", "login", ..] | ["-", "npm", "v1", "tokens", ..]
    );
    if !account && (is_read(method) || (method == "POST" && NPM_AUDITS.contains(&path))) {
        return Ok(Verdict::Pass);
    }
    let other = || {
        forbidden(format!(
            "`{method} {path}` to the npm registry is refused: the agent only reads, audits, and publishes, unpublishes or tags the packages in `forward: {{npm: {{publish: [...]}}}}`"
        ))
    };
    let (name, action) = match seg.as_slice() {
        ["-", "org" | "team" | "user", ..] | ["-", "v1", "login", ..] | ["-", "npm", "v1", "tokens", ..] => {
            return Err(forbidden(format!(
                "`{method} {path}` to the npm registry is refused: logins, tokens, orgs and teams are not managed from inside the sandbox; run `npm login` on the host and hand the token over as a secret"
            )));
        }
        ["-", "package", rest @ ..] => match package(rest) {
            Some((name, ["dist-tags", _])) if matches!(method, "PUT" | "DELETE") => {
                (name, "changing a dist-tag of")
            }
            _ => return Err(other()),
        },
        ["-", ..] => return Err(other()),
        seg => match (method, package(seg).ok_or_else(other)?) {
            ("PUT", (name, [])) => (name, "publishing"),
            ("PUT", (name, ["-rev", _])) => (name, "changing the published metadata of"),
            ("DELETE", (name, ["-rev", _] | ["-", _, "-rev", _])) => (name, "unpublishing"),
            _ => return Err(other()),
        },
    };
    if publishes(publish, &name) {
        return Ok(Verdict::Pass);
    }
    Err(forbidden(format!(
        "{action} {name} is refused: {name} is not a package the agent may publish; `forward: {{npm: {{publish: [{name}]}}}}` in a policy allows it"
    )))
}

/// A user-declared API: some rule must name the method and match the path.
fn http_head(allow: &[HttpRule], req: &Request) -> Result<Verdict, Refused> {
    let (method, path) = (req.method, req.path);
    let names = |r: &HttpRule| r.methods.iter().any(|m| m == "*" || m.eq_ignore_ascii_case(method));
    if allow.iter().any(|r| names(r) && glob(&r.path, path)) {
        return Ok(Verdict::Pass);
    }
    Err(forbidden(format!(
        "`{method} {path}` is refused: none of the service's `allow` rules matches it; a rule such as `{{methods: [{method}], path: {path}}}` in the service's `allow` in a policy's `forward` allows it"
    )))
}

fn model_head(api: &str, allow: &[HttpRule], req: &Request) -> Result<Verdict, Refused> {
    http_head(allow, req).map_err(|_| {
        forbidden(format!(
            "`{} {}` is not one of the requests the {api} key's forwarder sends on while the API's remote \
             tools are refused: with the key it holds, the API's other endpoints could have the provider \
             carry the request's data to an address of the agent's choosing. `apis: {{{api}: {{remote_tools: allow}}}}` \
             in a policy forwards every request",
            req.method, req.path
        ))
    })
}

/// Whether `path` matches the glob `pattern`, segment by segment, in time linear in each.
fn glob(pattern: &str, path: &str) -> bool {
    fn split(s: &str) -> Vec<&str> {
        s.strip_prefix('/').unwrap_or(s).split('/').collect()
    }
    let (pattern, path) = (split(pattern), split(path));
    // reach[j]: the pattern's segments so far match the path's first j segments.
    let mut reach = vec![false; path.len() + 1];
    reach[0] = true;
    for p in &pattern {
        let mut next = vec![false; path.len() + 1];
        if *p == "**" {
            let mut any = false;
            for (j, slot) in next.iter_mut().enumerate() {
                any |= reach[j];
                *slot = any;
            }
        } else {
            for (j, segment) in path.iter().enumerate() {
                next[j + 1] = reach[j] && (if *p == "*" { !segment.is_empty() } else { p == segment });
            }
        }
        reach = next;
    }
    reach[path.len()]
}

#[cfg(test)]
mod tests;
