//! The request head as the forwarder passes it on (net/forwarder.rs): one route's rewrite of
//! the agent's head (the host, the key, the headers dropped), the canonical path the rules
//! judge, and the answer a refusal gets. Pure: no socket here.

use serde::{Deserialize, Serialize};
use std::os::fd::RawFd;

use sandbox_policy::text::quoted;

use crate::forwarder::Refused;
use crate::forwarder::rules::{Request, Rules};
use crate::http1::Head;

/// One API or forwarded host: the listener at descriptor `fd` forwards to `host`:443 with
/// `header: value` (no header when `header` is empty: a service used without a token).
#[derive(Serialize, Deserialize)]
pub struct Route {
    pub fd: RawFd,
    pub host: String,
    pub header: String,
    /// The header's whole value: prefix and key.
    pub value: String,
    /// Headers the agent's request loses (every header any key of this API travels in).
    pub strip: Vec<String>,
    /// The path every request must be under: that of the base URL the user gave (a gateway's
    /// `/compatible-mode/v1`), so that the key goes to no other service on that host.
    #[serde(default)]
    pub path: Option<String>,
    /// The API whose remote tools a request's body may not name (`remote_tools`), unless
    /// the policy allows them (None).
    #[serde(default)]
    pub inspect: Option<String>,
    /// What the agent may ask of the host: method and path rules (`rules`).
    pub rules: Rules,
    /// Where the requests go instead of `host`:443 over TLS, asked of the DNS gate: one address
    /// and port the launcher named (a model server of the user's), `host` then the Host sent.
    #[serde(default)]
    pub upstream: Option<Upstream>,
}

/// A route's fixed upstream: an address, over TLS to `server_name` or in plain HTTP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upstream {
    pub address: std::net::SocketAddr,
    /// None: plain HTTP.
    pub server_name: Option<String>,
}

/// The agent's request as it goes upstream, and what the rules judge it by.
pub struct Rewritten {
    pub head: Vec<u8>,
    pub method: String,
    /// The canonical path ([`canonical_path`]) and the raw query.
    pub path: String,
    pub query: String,
}

impl Rewritten {
    pub fn request(&self) -> Request<'_> {
        Request { method: &self.method, path: &self.path, query: &self.query }
    }
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Route(fd {} to {} with {})", self.fd, self.host, self.header)
    }
}

/// The agent's request head (parsed by `http1::parse_head`, which refused what a server could
/// read otherwise) as it goes upstream.
pub fn rewrite_head(head: &Head, route: &Route) -> Result<Rewritten, Refused> {
    let bad = |why: &str| Refused::new(400, why);
    let (method, target) = (head.method, head.target);
    // TRACE echoes the request, key included, at a front end that answers it.
    if !method.bytes().all(|b| b.is_ascii_uppercase()) || matches!(method, "CONNECT" | "TRACE" | "TRACK") {
        return Err(Refused::new(405, format!("the method {} is not forwarded", quoted(method))));
    }
    // What RFC 3986 lets a target hold, and nothing else: a byte some servers take as the end of
    // the target, after the rules judged what follows (`"`, `<`, `\\`, `{`), is refused.
    let uri_byte = |b: u8| b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b);
    if !target.bytes().all(uri_byte) {
        return Err(bad("a request target with a byte that must be escaped"));
    }
    if !target.starts_with('/') || target.starts_with("//") {
        return Err(bad(&format!(
            "only a path is forwarded, to {} alone: {} names a host",
            route.host,
            quoted(target)
        )));
    }
    let scoped = matches!(route.rules, Rules::Npm { .. });
    let path = canonical_path(target, scoped)
        .map_err(|why| Refused::new(400, format!("{}: {why}", quoted(target))))?;
    if let Some(prefix) = route.path.as_deref().filter(|p| *p != "/") {
        let rest = path.strip_prefix(prefix).unwrap_or("x");
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(Refused::new(
                403,
                format!("only paths under {prefix} are forwarded to {}", route.host),
            ));
        }
    }
    let query = target.split_once('?').map(|(_, q)| q.to_string()).unwrap_or_default();
    let target = drop_query_key(target);
    let headers: Vec<(&str, &str)> = head.fields.iter().map(|f| (f.name, f.value)).collect();
    // Headers that Connection names are the agent's hop-by-hop ones: not passed on. Read by
    // `http1`'s one reader of them, the one the framing rule reads too.
    let named = head.connection_tokens().map_err(bad)?;
    // `_` read as `-`, as some servers read header names (X_HTTP_METHOD_OVERRIDE).
    let dropped = |name: &str| {
        let name = name.to_ascii_lowercase().replace('_', "-");
        HOP_BY_HOP.contains(&name.as_str()) || route.strip.contains(&name) || named.contains(&name)
    };
    let mut out = format!("{method} {target} HTTP/1.1\r\nhost: {}\r\n", route.host);
    for (name, value) in headers.iter().filter(|(n, _)| !dropped(n)) {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !route.header.is_empty() {
        out.push_str(&format!("{}: {}\r\n", route.header, route.value));
    }
    out.push_str("connection: close\r\n\r\n");
    Ok(Rewritten { head: out.into_bytes(), method: method.to_string(), path, query })
}

/// The path of a request target as every server reads it, for the rules to match: the query
/// left out, percent-escapes decoded. What servers could read differently from this is refused
/// rather than guessed at: an escaped `/` (but `@scope%2fname` to the `npm` registry), `\`, `.`, `;`, `%`, `?` or `#`, or a control
/// character; a `\` or `;` (a separator to some servers); a `.` or `..` segment, or an empty
/// one (`//`), which some servers remove or merge and others keep.
pub fn canonical_path(target: &str, npm: bool) -> Result<String, &'static str> {
    let raw = target.split_once('?').map_or(target, |(path, _)| path);
    if !raw.starts_with('/') || raw.contains('#') {
        return Err("not a path");
    }
    if raw.contains(['\\', ';']) {
        return Err("a `\\` or `;` in the path, which servers split differently");
    }
    let mut decoded = Vec::with_capacity(raw.len());
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            decoded.push(b);
            continue;
        }
        let hex = [bytes.next(), bytes.next()];
        let value = match hex {
            [Some(h), Some(l)] => {
                std::str::from_utf8(&[h, l]).ok().and_then(|t| u8::from_str_radix(t, 16).ok())
            }
            _ => None,
        };
        // npm's scoped names travel as `@scope%2fname` (`/@s%2fn`, `/-/package/@s%2fn/…`): to
        // the registry alone, that one escaped slash in a segment that starts with `@` splits
        // the name's two parts, as the registry reads it.
        let segment = &decoded[decoded.iter().rposition(|&b| b == b'/').unwrap_or(0)..];
        let scoped = npm && segment.starts_with(b"/@");
        match value {
            None => return Err("a malformed percent-escape in the path"),
            Some(b'/') if scoped => decoded.push(b'/'),
            Some(v) if v < 0x20 || v == 0x7f || b"/\\.;%?#".contains(&v) => {
                return Err("an escaped separator, dot, percent or control character in the path");
            }
            Some(v) => decoded.push(v),
        }
    }
    let path = String::from_utf8(decoded).map_err(|_| "a path that is not UTF-8 once decoded")?;
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    if segments.iter().enumerate().any(|(i, s)| *s == "." || *s == ".." || (s.is_empty() && i != last)) {
        return Err("a `.`, `..` or empty segment in the path");
    }
    Ok(path)
}

/// Headers that concern one hop, or name a host, or change the method a server acts on: never
/// passed on.
const HOP_BY_HOP: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
];

/// A credential in the query is the agent's: `key` (as Google's APIs take a key; the real one
/// goes in the header) and `access_token` (an OAuth token, an account of the agent's own),
/// their names read as a server decodes them (`%6Bey`).
fn drop_query_key(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else { return target.to_string() };
    let credential = |param: &str| {
        let name = param.split_once('=').map_or(param, |(name, _)| name);
        let name = percent_decode_lossy(name).replace('+', " ");
        matches!(name.trim(), "key" | "access_token")
    };
    let kept: Vec<&str> = query.split('&').filter(|p| !credential(p)).collect();
    if kept.is_empty() { path.to_string() } else { format!("{path}?{}", kept.join("&")) }
}

/// `%XX` escapes decoded (a malformed one kept as it is), lower-cased.
fn percent_decode_lossy(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(value)) => {
                out.push(value);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).to_ascii_lowercase()
}

/// Whether the head's Content-Type is JSON (`application/json`, `application/vnd.git-lfs+json`):
/// a body the rules read as JSON is not read by the server as a form.
pub fn json_content(head: &Head) -> bool {
    let types: Vec<String> = head.values("content-type").map(|v| v.to_ascii_lowercase()).collect();
    // One Content-Type, one media type: a server that reads another of two (or of a list)
    // would read the body as a form.
    let [value] = types.as_slice() else { return false };
    let (media, params) = value.split_once(';').unwrap_or((value, ""));
    !value.contains(',')
        && matches!(media.trim(), "application/json" | "application/vnd.git-lfs+json")
        && params.split(';').all(|p| p.trim().is_empty() || p.trim().starts_with("charset="))
}

/// An answer's head (with its blank line) whose `Location` sends the client to one of the
/// forwarded hosts (`https://HOST/…`, port 443 or none) rewritten to that host's forwarder
/// (`http://127.0.0.1:PORT/…`), so that a redirect (a release download from github.com to
/// objects.githubusercontent.com) is followed through the forwarder, which alone reaches those
/// hosts; None if nothing changes. The upstream wrote the head: anything this reader does not
/// understand passes as it is.
pub fn redirected(head: &[u8], forwarded: &[(String, u16)]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    for line in text.split_inclusive("\r\n") {
        let rewritten = line.split_once(':').and_then(|(name, value)| {
            if !name.eq_ignore_ascii_case("location") {
                return None;
            }
            let url = value.trim();
            let rest = url.get(..8).filter(|s| s.eq_ignore_ascii_case("https://")).map(|_| &url[8..])?;
            let (authority, path) = rest.find(['/', '?', '#']).map_or((rest, ""), |i| rest.split_at(i));
            let host = authority.strip_suffix(":443").unwrap_or(authority);
            let (_, port) = forwarded.iter().find(|(h, _)| h.eq_ignore_ascii_case(host))?;
            let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
            Some(format!("{name}: http://127.0.0.1:{port}{path}\r\n"))
        });
        match rewritten {
            Some(line) => {
                out.push_str(&line);
                changed = true;
            }
            None => out.push_str(line),
        }
    }
    changed.then(|| out.into_bytes())
}

/// The answer to a refused request: its line in the body (git shows a text/plain body as
/// `remote: …`), and in the status line's reason too, which is all some clients show (npm's
/// `403 … - PUT URL`): printable ASCII there, on one line.
pub fn refusal_answer(refused: &Refused) -> String {
    let (status, why) = (refused.status(), refused.reason());
    let body = format!("agent-sandbox forwarder: {why}\n");
    let reason: String = format!("agent-sandbox: {why}")
        .chars()
        .map(|c| if c == ' ' || c.is_ascii_graphic() { c } else { '?' })
        .take(400)
        .collect();
    format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forwarder::inspect::body_framing;

    /// The head `head` (without its blank line) as the forwarder takes it: parsed, then
    /// rewritten for `route`.
    fn rewrite_for(head: &str, route: &Route) -> Result<Rewritten, Refused> {
        let raw = format!("{head}\r\n\r\n");
        match crate::http1::parse_head(raw.as_bytes()) {
            Ok(Some(parsed)) => rewrite_head(&parsed, route),
            Ok(None) => panic!("{head:?}: no blank line"),
            Err(why) => Err(Refused::new(400, why)),
        }
    }

    fn parsed<T>(head: &str, f: impl FnOnce(&Head) -> T) -> T {
        let raw = format!("{head}\r\n\r\n");
        f(&crate::http1::parse_head(raw.as_bytes()).unwrap().unwrap())
    }

    fn route() -> Route {
        Route {
            fd: 4,
            host: "api.anthropic.com".into(),
            header: "x-api-key".into(),
            value: "sk-real".into(),
            strip: vec!["x-api-key".into(), "authorization".into()],
            path: None,
            inspect: None,
            rules: Rules::Any,
            upstream: None,
        }
    }

    fn rewrite(head: &str) -> Result<String, Refused> {
        rewrite_for(head, &route()).map(|r| String::from_utf8(r.head).unwrap())
    }

    #[test]
    fn the_placeholder_is_swapped_and_the_host_is_the_apis() {
        let out = rewrite(
            "POST /v1/messages?beta=true HTTP/1.1\r\nHost: evil.test\r\nx-api-key: sk-placeholder\r\n\
             Authorization: Bearer x\r\nContent-Length: 2\r\nConnection: keep-alive, x-trace\r\nx-trace: 1\r\n\
             anthropic-version: 2023-06-01",
        )
        .unwrap();
        assert_eq!(
            out,
            "POST /v1/messages?beta=true HTTP/1.1\r\nhost: api.anthropic.com\r\nContent-Length: 2\r\n\
             anthropic-version: 2023-06-01\r\nx-api-key: sk-real\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn a_request_naming_another_host_is_refused() {
        for head in [
            "GET http://evil.test/ HTTP/1.1\r\nHost: evil.test",
            "GET //evil.test/ HTTP/1.1",
            "CONNECT evil.test:443 HTTP/1.1",
            "GET evil.test HTTP/1.1",
            "GET / HTTP/2.0",
            "GET / HTTP/1.1\r\nHost: a\nX: b",
            "GET / HTTP/1.1\r\nBad Name: b",
            "GET / HTTP/1.1 extra",
            "TRACE / HTTP/1.1",
        ] {
            let refused = rewrite(head).unwrap_err();
            assert!(refused.status() == 400 || refused.status() == 405, "{head:?}: {refused:?}");
        }
    }

    #[test]
    fn with_a_base_path_only_paths_under_it_go() {
        let route = Route { path: Some("/compatible-mode/v1".into()), ..route() };
        let rewrite = |target: &str| rewrite_for(&format!("POST {target} HTTP/1.1"), &route).map(|_| ());
        assert!(rewrite("/compatible-mode/v1/chat/completions").is_ok());
        assert!(rewrite("/compatible-mode/v1?x=1").is_ok());
        for other in
            ["/other-tenant/v1/chat", "/compatible-mode/v10", "/", "/compatible-mode?x=/compatible-mode/v1"]
        {
            assert_eq!(rewrite(other).unwrap_err().status(), 403, "{other}");
        }
        // Ways out of the prefix that a server resolves after the check: dot segments, plain,
        // escaped or doubly escaped, escaped slashes and backslashes, parameters.
        for hidden in [
            "/compatible-mode/v1/../../admin",
            "/compatible-mode/v1/%2e%2e/%2e%2e/other-tenant/x",
            "/compatible-mode/v1/%2E%2E/%2E%2E/other-tenant/x",
            "/compatible-mode/v1/..%2f..%2fother-tenant/x",
            "/compatible-mode/v1/..%5c..%5cother-tenant",
            "/compatible-mode/v1/..\\..\\other-tenant",
            "/compatible-mode/v1/..;/..;/other-tenant",
            "/compatible-mode/v1/%252e%252e/other",
            "/compatible-mode/v1/..?x",
            "/compatible-mode/v1/.",
            "/compatible-mode/v1//x",
            "/compatible-mode/v1/%",
            "/compatible-mode/v1/%00",
        ] {
            let refused = rewrite(hidden).unwrap_err();
            assert!(refused.status() == 400 || refused.status() == 403, "{hidden}: {refused:?}");
        }
        assert!(rewrite("/compatible-mode/v1/models/qwen%2Dmax/").is_ok(), "a harmless escape");
    }

    #[test]
    fn a_framing_header_named_hop_by_hop_and_a_bad_length_are_refused() {
        for head in [
            "POST /x HTTP/1.1\r\nConnection: Content-Length\r\nContent-Length: 5",
            "POST /x HTTP/1.1\r\nConnection: close, transfer-encoding\r\nTransfer-Encoding: chunked",
        ] {
            assert_eq!(parsed(head, |h| body_framing(h, false)).unwrap_err().status(), 400, "{head}");
        }
        for length in ["+5", "0x5", "-0", "5 5", ""] {
            let head = format!("POST /x HTTP/1.1\r\nContent-Length: {length}");
            assert_eq!(parsed(&head, |h| body_framing(h, false)).unwrap_err().status(), 400, "{length:?}");
        }
        assert!(parsed(
            "POST /graphql HTTP/1.1\r\nContent-Type: application/json; charset=utf-8",
            json_content
        ));
        assert!(parsed("POST /b HTTP/1.1\r\ncontent-type: application/vnd.git-lfs+json", json_content));
        for head in [
            "POST /graphql HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded",
            "POST /graphql HTTP/1.1",
            "POST /graphql HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded, application/json",
            "POST /graphql HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Type: application/json",
            "POST /graphql HTTP/1.1\r\nContent-Type: application/jsonp",
            "POST /graphql HTTP/1.1\r\nContent-Type: application/json; boundary=x",
        ] {
            assert!(!parsed(head, json_content), "{head}");
        }
        // A target with a byte servers may end it at: the rules would judge a path the server
        // does not serve.
        for head in ["POST /repos/o/r/hooks\t HTTP/1.1", "GET /\u{9b}2J HTTP/1.1", "GET /a\"b HTTP/1.1"] {
            assert_eq!(rewrite(head).unwrap_err().status(), 400, "{head:?}");
        }
        let out = rewrite("POST /x HTTP/1.1\r\nX_HTTP_METHOD_OVERRIDE: DELETE\r\nContent-Length: 0").unwrap();
        assert!(!out.contains("DELETE"), "{out}");
    }

    /// Found by a red team: a Connection token ending in a no-break space. The rewrite's reader
    /// of Connection trimmed it (and dropped Content-Length as hop-by-hop) while the framing
    /// rule's kept it (and framed the body by the length): the body went upstream unframed, a
    /// second request in it. One reader now, and it refuses an element that is not a token.
    #[test]
    fn a_connection_element_that_is_not_a_token_is_refused() {
        for head in [
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 54\r\nConnection: content-length\u{a0}",
            "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 54\r\nConnection: \u{3000}Content-Length",
        ] {
            assert_eq!(rewrite(head).unwrap_err().status(), 400, "{head:?}");
            assert_eq!(parsed(head, |h| body_framing(h, false)).unwrap_err().status(), 400, "{head:?}");
        }
        let out =
            rewrite("POST /x HTTP/1.1\r\nConnection: keep-alive, X-Trace\r\nX-Trace: 1\r\nContent-Length: 0")
                .unwrap();
        assert!(!out.contains("X-Trace") && out.contains("Content-Length: 0"), "{out}");
    }

    #[test]
    fn an_escaped_slash_is_npms_alone_and_only_in_a_scoped_name() {
        assert_eq!(canonical_path("/@s%2fn", true), Ok("/@s/n".into()));
        assert_eq!(
            canonical_path("/-/package/@s%2Fn/dist-tags/latest", true),
            Ok("/-/package/@s/n/dist-tags/latest".into())
        );
        for (target, npm) in [("/@s%2fn", false), ("/x%2fy", true), ("/@s%2fn%2fm", true), ("/@s%2f..", true)]
        {
            assert!(canonical_path(target, npm).is_err(), "{target} {npm}");
        }
    }

    #[test]
    fn a_refusal_names_its_reason_in_the_status_line_and_the_body() {
        let answer = refusal_answer(&Refused::new(403, "push to o/r is refused:\r\nX: y \u{2026}"));
        let (status, rest) = answer.split_once("\r\n").unwrap();
        assert_eq!(status, "HTTP/1.1 403 agent-sandbox: push to o/r is refused:??X: y ?");
        assert!(
            rest.ends_with("\r\n\r\nagent-sandbox forwarder: push to o/r is refused:??X: y \u{2026}\n"),
            "{rest}"
        );
    }

    /// The agent's method and target come back in the reason, which reaches the user's
    /// terminal through `status` and `logs`: not one control of theirs (C0, C1, DEL) survives,
    /// and a long one is cut.
    #[test]
    fn a_refusal_quotes_the_agents_method_and_target_without_a_control() {
        let route = route();
        for head in [
            "\u{9d}52;c;cHduZWQ=\u{9c} /v1/x HTTP/1.1".to_string(),
            "G\x1b]52;c;cHduZWQ=\x07T /v1/x HTTP/1.1".to_string(),
            format!("{} /v1/x HTTP/1.1", "\u{9b}".repeat(5000)),
            "GET /v1/%2e%2e/\x1b[31m HTTP/1.1".to_string(),
        ] {
            let Err(refused) = rewrite_for(&head, &route) else { panic!("{head:?} passed") };
            let reason = refused.reason();
            assert!(!reason.chars().any(|c| c.is_control()), "{head:?}: {reason:?}");
            assert!(reason.chars().count() <= crate::forwarder::MAX_REASON, "{reason}");
            let answer = refusal_answer(&refused);
            assert!(!answer.chars().any(|c| c.is_control() && c != '\r' && c != '\n'), "{answer:?}");
        }
    }

    /// A redirect to another forwarded host is followed through its forwarder; one anywhere
    /// else, or to a port other than 443, goes back as it came.
    #[test]
    fn a_redirect_to_a_forwarded_host_goes_through_its_forwarder() {
        let forwarded =
            [("objects.githubusercontent.com".to_string(), 15115), ("github.com".to_string(), 15110)];
        let head =
            |location: &str| format!("HTTP/1.1 302 Found\r\nServer: x\r\nLocation: {location}\r\n\r\n");
        let rewritten = |location: &str| {
            redirected(head(location).as_bytes(), &forwarded).map(|h| String::from_utf8(h).unwrap())
        };
        assert_eq!(
            rewritten("https://objects.githubusercontent.com/asset/1?sig=a%2Fb&x=1").as_deref(),
            Some(head("http://127.0.0.1:15115/asset/1?sig=a%2Fb&x=1").as_str())
        );
        assert_eq!(
            rewritten("HTTPS://GitHub.com:443").as_deref(),
            Some(head("http://127.0.0.1:15110/").as_str())
        );
        assert_eq!(
            rewritten("https://github.com?x").as_deref(),
            Some(head("http://127.0.0.1:15110/?x").as_str())
        );
        for kept in [
            "https://evil.test/x",
            "https://github.com.evil.test/x",
            "https://github.com:8443/x",
            "http://github.com/x",
            "/relative/path",
            "https://user@github.com/x",
        ] {
            assert_eq!(rewritten(kept), None, "{kept}");
        }
    }

    #[test]
    fn method_override_headers_are_dropped() {
        let out = rewrite(
            "POST /v1/messages HTTP/1.1\r\nX-HTTP-Method-Override: DELETE\r\nx-http-method: PUT\r\n\
             X-Method-Override: PATCH\r\nContent-Length: 2",
        )
        .unwrap();
        assert!(!out.to_ascii_lowercase().contains("method"), "{out}");
    }

    #[test]
    fn a_key_in_the_query_is_dropped() {
        assert_eq!(
            drop_query_key("/v1beta/models/m:generate?key=abc&alt=sse"),
            "/v1beta/models/m:generate?alt=sse"
        );
        assert_eq!(drop_query_key("/x?key=abc"), "/x");
        assert_eq!(drop_query_key("/x?monkey=1"), "/x?monkey=1");
        // The agent's own credentials, however the name is spelled to a server that decodes it.
        assert_eq!(drop_query_key("/x?%6Bey=abc&alt=sse"), "/x?alt=sse");
        assert_eq!(drop_query_key("/x?access_token=ya29&%61ccess_token=ya29&KEY=1"), "/x");
    }
}
