//! `agent-sandbox ui`: a local web page to watch every sandbox, approve what agents ask for,
//! and see what they connect to. The server (axum) listens on 127.0.0.1 alone; the page, its
//! script and its style are inside the binary (`ui/assets`). `api` answers the page by calling
//! what the commands call (`ls`, `approve`, `stop`): one implementation, two front ends.
//! `connections` follows each sandbox's connection log for it.
//!
//! The page can widen an agent's allowlist, so [`guard`] stands before every route: a request
//! must name this server by its loopback Host (DNS rebinding), carry the token (in the URL for
//! the page and its assets, in a header for the API), and, to change anything, come from the
//! page's own Origin. Every answer carries a Content-Security-Policy that allows the page's own
//! script and nothing else.

mod api;
mod connections;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::engine::Engine;
use crate::exit::{Code, Failure, Result};
use crate::flags::UiFlags;

/// The port `ui` takes when none is given and it is free.
pub const DEFAULT_PORT: u16 = 8750;
/// The header the page's script sends the token in.
pub const TOKEN_HEADER: &str = "x-agent-sandbox-token";
/// No inline script or style, nothing from elsewhere: a name the agent chose cannot run.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
    connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("ui/assets/index.html");
const APP_JS: &str = include_str!("ui/assets/app.js");
const APP_CSS: &str = include_str!("ui/assets/app.css");

/// What every request is checked against.
pub struct Ui {
    pub engine: Engine,
    pub token: String,
    pub port: u16,
    pub logs: connections::Logs,
}

pub async fn run(flags: &UiFlags) -> Result<i32> {
    let engine = Engine::connect().await?;
    let listener = bind(flags.port).await?;
    let port = listener
        .local_addr()
        .map_err(|e| Failure::new(Code::Engine, format!("cannot read the listening address: {e}")))?
        .port();
    let token = new_token()?;
    let url = format!("http://127.0.0.1:{port}/?token={token}");
    println!("agent-sandbox: the page is at {url}");
    eprintln!("agent-sandbox: only this URL opens it (the token is its key); Ctrl-C ends the server");
    if !flags.no_open {
        open_browser(&url);
    }
    let ui = Arc::new(Ui { engine, token, port, logs: connections::Logs::default() });
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("agent-sandbox: the page's server ends");
    };
    axum::serve(listener, router(ui))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| Failure::new(Code::Engine, format!("the page's server failed: {e}")))?;
    Ok(0)
}

/// Binds 127.0.0.1:`port`; with no port given, the default one, or any free one if it is taken.
async fn bind(port: Option<u16>) -> Result<tokio::net::TcpListener> {
    let at = |port| tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    match port {
        Some(port) => at(port).await.map_err(|e| {
            Failure::new(Code::BadArgument, format!("--port {port}: cannot listen on 127.0.0.1:{port}: {e}"))
        }),
        None => match at(DEFAULT_PORT).await {
            Ok(listener) => Ok(listener),
            Err(_) => at(0)
                .await
                .map_err(|e| Failure::new(Code::Engine, format!("cannot listen on 127.0.0.1: {e}"))),
        },
    }
}

/// 32 random bytes from the kernel, as hex.
fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| Failure::new(Code::Engine, format!("cannot draw a random token: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    let spawned = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if spawned.is_err() {
        eprintln!("agent-sandbox: cannot run {opener}: open the URL above yourself");
    }
}

pub fn router(ui: Arc<Ui>) -> Router {
    let api = Router::new()
        .route("/api/sandboxes", get(api::sandboxes))
        .route("/api/sandboxes/{name}/connections", get(api::connections))
        .route("/api/sandboxes/{name}/pending", get(api::pending))
        .route("/api/sandboxes/{name}/policy", get(api::policy))
        .route("/api/sandboxes/{name}/screen", get(api::screen))
        .route("/api/sandboxes/{name}/approve", post(api::approve))
        .route("/api/sandboxes/{name}/dismiss", post(api::dismiss))
        .route("/api/sandboxes/{name}/allow", post(api::allow))
        .route("/api/sandboxes/{name}/deny", post(api::deny))
        .route("/api/sandboxes/{name}/stop", post(api::stop));
    Router::new()
        .route("/", get(index))
        .route("/assets/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/assets/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .merge(api)
        .layer(axum::middleware::from_fn_with_state(ui.clone(), guard))
        .with_state(ui)
}

/// The page, the token in it (for its script's requests and its assets' URLs; no cookie: a
/// cookie would go to every port of 127.0.0.1, an agent's published dev server's too).
async fn index(State(ui): State<Arc<Ui>>) -> Response {
    asset("text/html; charset=utf-8", INDEX.replace("{{TOKEN}}", &ui.token))
}

fn asset(kind: &'static str, body: impl Into<String>) -> Response {
    ([(header::CONTENT_TYPE, kind)], body.into()).into_response()
}

/// Why a request is refused, before any route sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// A Host other than this server's loopback names (a rebound DNS name).
    Host,
    /// No token, or a wrong one.
    Token,
    /// A change from another Origin, or with none.
    Origin,
}

/// The checks of [`guard`], on the request's parts alone.
pub fn check(
    ui_token: &str,
    port: u16,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> std::result::Result<(), Refused> {
    let value = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let hosts = [format!("127.0.0.1:{port}"), format!("localhost:{port}")];
    let host = value(header::HOST).unwrap_or_default();
    if !hosts.iter().any(|h| h == host) {
        return Err(Refused::Host);
    }
    let header_token = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok());
    let token_ok = if path.starts_with("/api/") {
        // The API takes its token from a header alone, which no other page's request carries.
        header_token.is_some_and(|t| same(t, ui_token))
    } else {
        query.split('&').filter_map(|kv| kv.strip_prefix("token=")).any(|t| same(t, ui_token))
    };
    if !token_ok {
        return Err(Refused::Token);
    }
    if method != Method::GET && method != Method::HEAD {
        let origin = value(header::ORIGIN).unwrap_or_default();
        if !hosts.iter().any(|h| origin == format!("http://{h}")) {
            return Err(Refused::Origin);
        }
    }
    Ok(())
}

/// Compares in time independent of where the strings differ.
fn same(given: &str, token: &str) -> bool {
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

async fn guard(State(ui): State<Arc<Ui>>, request: Request, next: Next) -> Response {
    let uri = request.uri();
    let checked = check(
        &ui.token,
        ui.port,
        request.method(),
        uri.path(),
        uri.query().unwrap_or_default(),
        request.headers(),
    );
    let mut response = match checked {
        Ok(()) => next.run(request).await,
        Err(refused) => {
            let (status, why) = match refused {
                Refused::Host => {
                    (StatusCode::FORBIDDEN, "refused: this server answers to 127.0.0.1 and localhost only")
                }
                Refused::Token => (
                    StatusCode::UNAUTHORIZED,
                    "refused: no valid token; open the URL `agent-sandbox ui` printed",
                ),
                Refused::Origin => {
                    (StatusCode::FORBIDDEN, "refused: a change must come from the page itself")
                }
            };
            (status, why).into_response()
        }
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "ab12";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn get(path: &str, query: &str, pairs: &[(&str, &str)]) -> std::result::Result<(), Refused> {
        check(TOKEN, 9000, &Method::GET, path, query, &headers(pairs))
    }

    #[test]
    fn the_page_needs_the_token_in_its_url() {
        assert_eq!(get("/", "token=ab12", &[("host", "127.0.0.1:9000")]), Ok(()));
        assert_eq!(get("/assets/app.js", "token=ab12", &[("host", "localhost:9000")]), Ok(()));
        assert_eq!(
            get("/", "", &[("host", "localhost:9000"), ("cookie", "agent_sandbox_token_9000=ab12")]),
            Err(Refused::Token)
        );
        assert_eq!(get("/", "", &[("host", "127.0.0.1:9000")]), Err(Refused::Token));
        assert_eq!(get("/", "token=ab13", &[("host", "127.0.0.1:9000")]), Err(Refused::Token));
        assert_eq!(get("/", "token=ab1", &[("host", "127.0.0.1:9000")]), Err(Refused::Token));
    }

    #[test]
    fn the_api_takes_its_token_from_the_header_alone() {
        let host = ("host", "127.0.0.1:9000");
        assert_eq!(get("/api/sandboxes", "", &[host, (TOKEN_HEADER, "ab12")]), Ok(()));
        assert_eq!(get("/api/sandboxes", "token=ab12", &[host]), Err(Refused::Token));
        assert_eq!(
            get("/api/sandboxes", "", &[host, ("cookie", "agent_sandbox_token_9000=ab12")]),
            Err(Refused::Token)
        );
    }

    #[test]
    fn a_rebound_host_is_refused_before_the_token_is_looked_at() {
        for host in ["evil.test:9000", "127.0.0.1:9001", "127.0.0.1", "[::1]:9000", ""] {
            assert_eq!(get("/", "token=ab12", &[("host", host)]), Err(Refused::Host), "{host}");
        }
    }

    #[test]
    fn a_change_needs_the_pages_origin() {
        let post = |origin: Option<&str>| {
            let mut pairs = vec![("host", "127.0.0.1:9000"), (TOKEN_HEADER, "ab12")];
            if let Some(origin) = origin {
                pairs.push(("origin", origin));
            }
            check(TOKEN, 9000, &Method::POST, "/api/sandboxes/x/allow", "", &headers(&pairs))
        };
        assert_eq!(post(Some("http://127.0.0.1:9000")), Ok(()));
        assert_eq!(post(Some("http://localhost:9000")), Ok(()));
        assert_eq!(post(Some("http://evil.test")), Err(Refused::Origin));
        assert_eq!(post(Some("null")), Err(Refused::Origin));
        assert_eq!(post(None), Err(Refused::Origin));
    }

    #[test]
    fn tokens_are_64_hex_characters_and_differ() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
