//! The page's API: each route calls what the command of the same name calls (`ls`, `pending`,
//! `allow`, `deny`, `stop`), under the same change lock, and answers with its result as JSON,
//! or its failure's message with an HTTP status for its exit code.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Ui;
use super::connections;
use crate::approve;
use crate::engine::{Details, Sandbox};
use crate::exit::{Code, Failure, Result};

/// How long the screen view waits for the session's text, and a sandbox's counts for the list.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// The most of the agent's screen read: its pane can be made as large as it likes.
const SCREEN_BYTES: usize = 256 << 10;
/// The screen's lines shown: the pane's first 200.
const SCREEN_LINES: &str = "199";

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = match self.code {
            Code::BadArgument | Code::BadPolicy => StatusCode::BAD_REQUEST,
            Code::NoSandbox => StatusCode::NOT_FOUND,
            Code::Changed => StatusCode::CONFLICT,
            Code::NoEngine => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({ "error": self.message, "code": self.code as i32 }))).into_response()
    }
}

type Answer<T> = std::result::Result<Json<T>, Failure>;

/// The sandbox the page names, by its container name exactly.
async fn named(ui: &Ui, name: &str) -> Result<Sandbox> {
    let all = ui.engine.sandboxes().await?;
    all.into_iter().find(|s| s.name == name).ok_or_else(|| {
        Failure::new(Code::NoSandbox, format!("no sandbox is named '{name}' (it may have stopped)"))
    })
}

/// The sandbox the page names, with its change lock held (the CLI's `approve::hold`).
async fn held(ui: &Ui, name: &str) -> Result<(Sandbox, approve::Held)> {
    let sandbox = named(ui, name).await?;
    let held = approve::hold(&sandbox).await?;
    Ok((sandbox, held))
}

#[derive(Debug, Serialize)]
pub struct Limits {
    memory_bytes: Option<i64>,
    cpus: Option<f64>,
    pids: Option<i64>,
}

/// One sandbox of the list: `ls`'s columns, and what the page adds.
#[derive(Debug, Serialize)]
pub struct Listed {
    name: String,
    agent: String,
    project: String,
    running: bool,
    state: String,
    uptime_s: Option<i64>,
    image: String,
    image_id: String,
    shape: &'static str,
    limits: Limits,
    allowed: Option<u64>,
    refused: Option<u64>,
}

/// Seconds since an RFC 3339 time of the engine's (UTC, `2026-11-27T16:37:45.123Z`).
fn seconds_since(started: &str) -> Option<i64> {
    Some((crate::clock::now() - crate::clock::epoch_of(started)?).max(0))
}

async fn listed(sandbox: Sandbox) -> Listed {
    let counts =
        async { tokio::time::timeout(TIMEOUT, crate::ls::connections(&sandbox)).await.ok().flatten() };
    let (counts, details) = tokio::join!(counts, sandbox.details());
    let details = details.unwrap_or(Details::default());
    Listed {
        uptime_s: details.started_at.as_deref().and_then(seconds_since),
        limits: Limits { memory_bytes: details.memory_bytes, cpus: details.cpus, pids: details.pids },
        shape: if sandbox.gateway.is_empty() { "one container" } else { "sidecar" },
        allowed: counts.map(|c| c.0),
        refused: counts.map(|c| c.1),
        name: sandbox.name.clone(),
        agent: sandbox.agent.clone(),
        project: sandbox.project.clone(),
        running: sandbox.running,
        state: sandbox.status.clone(),
        image: sandbox.image.clone(),
        image_id: sandbox.image_id.clone(),
    }
}

pub async fn sandboxes(State(ui): State<Arc<Ui>>) -> Answer<serde_json::Value> {
    let all = ui.engine.sandboxes().await?;
    ui.logs.keep_only(&all.iter().filter(|s| s.running).map(|s| s.id.as_str()).collect::<Vec<_>>());
    let rows = futures_util::future::join_all(all.into_iter().map(listed)).await;
    Ok(Json(json!({ "sandboxes": rows })))
}

pub async fn connections(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    Query(query): Query<connections::Query>,
) -> Answer<connections::View> {
    let sandbox = named(&ui, &name).await?;
    sandbox.ensure_running()?;
    Ok(Json(ui.logs.view(&sandbox, &query).await?))
}

pub async fn pending(State(ui): State<Arc<Ui>>, Path(name): Path<String>) -> Answer<serde_json::Value> {
    let sandbox = named(&ui, &name).await?;
    sandbox.ensure_running()?;
    let queue = approve::queue_now(&sandbox).await?;
    Ok(Json(json!({
        "names": queue.names,
        "budgets": queue.budgets,
        "addresses": queue.addresses,
        "unallowable": queue.unallowable
    })))
}

pub async fn policy(State(ui): State<Arc<Ui>>, Path(name): Path<String>) -> Answer<serde_json::Value> {
    let sandbox = named(&ui, &name).await?;
    sandbox.ensure_running()?;
    let (in_force, runtime) = approve::policy_now(&sandbox).await?;
    Ok(Json(json!({ "in_force": in_force, "runtime": runtime })))
}

/// The agent's screen: its session's pane as text, read as the agent (its tmux server is its
/// own; what it answers is bounded in time and size), then through the same filter as
/// `attach`'s, and without any control character left.
pub async fn screen(State(ui): State<Arc<Ui>>, Path(name): Path<String>) -> Answer<serde_json::Value> {
    let sandbox = named(&ui, &name).await?;
    sandbox.ensure_running()?;
    let cmd = ["sandbox-exec", "--", "tmux", "capture-pane", "-p", "-S", "0", "-E", SCREEN_LINES];
    let read = sandbox.exec_capped(&cmd, SCREEN_BYTES);
    let raw = tokio::time::timeout(TIMEOUT, read)
        .await
        .map_err(|_| Failure::new(Code::Sandbox, format!("{name}'s session did not answer within 5 s")))??;
    let text = tokio::task::spawn_blocking(move || screen_text(&raw))
        .await
        .map_err(|e| Failure::new(Code::Engine, format!("the screen's filter failed: {e}")))?;
    Ok(Json(json!({ "text": text })))
}

/// What of the agent's screen text may reach the page: filtered as `attach` filters, then only
/// printable characters, newlines and tabs, without the pane's empty rows at the end.
pub fn screen_text(raw: &[u8]) -> String {
    let mut sanitizer = sandbox_policy::terminal::Sanitizer::default();
    let mut bytes = sanitizer.filter(raw);
    bytes.extend(sanitizer.finish());
    let text: String = String::from_utf8_lossy(&bytes)
        .chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .collect();
    // The pane's empty rows below the last line written are not shown.
    format!("{}\n", text.trim_end())
}

#[derive(Debug, Deserialize)]
pub struct Shown {
    names: Vec<String>,
    /// Sent by the page's dialog alone: a name needing a second look is approved only so.
    #[serde(default)]
    confirmed: bool,
}

pub async fn approve(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    Json(shown): Json<Shown>,
) -> Answer<serde_json::Value> {
    let (sandbox, _held) = held(&ui, &name).await?;
    let approved = approve::approve_shown(&sandbox, &shown.names, shown.confirmed).await?;
    crate::say::line(&format!("agent-sandbox: the page approved {} for {name}", approved.join(", ")));
    Ok(Json(json!({ "approved": approved })))
}

pub async fn dismiss(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    Json(shown): Json<Shown>,
) -> Answer<serde_json::Value> {
    let (sandbox, _held) = held(&ui, &name).await?;
    let dismissed = approve::dismiss_shown(&sandbox, &shown.names).await?;
    Ok(Json(json!({ "dismissed": dismissed })))
}

#[derive(Debug, Deserialize)]
pub struct Domains {
    domains: Vec<String>,
}

pub async fn allow(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    Json(body): Json<Domains>,
) -> Answer<serde_json::Value> {
    if body.domains.is_empty() {
        return Err(Failure::new(Code::BadArgument, "no name to allow"));
    }
    approve::validate("DOMAIN", &body.domains)?;
    let (sandbox, _held) = held(&ui, &name).await?;
    let cautions = approve::typed_cautions(&sandbox, &body.domains).await?;
    if !cautions.is_empty() {
        return Err(Failure::new(
            Code::BadArgument,
            format!(
                "not from the page: `agent-sandbox allow {name} {} --yes {}` allows it, knowing that {}",
                body.domains.join(" "),
                body.domains.len(),
                cautions.join("; ")
            ),
        ));
    }
    approve::allow(&sandbox, &body.domains, None).await?;
    crate::say::line(&format!("agent-sandbox: the page allowed {} for {name}", body.domains.join(", ")));
    Ok(Json(json!({ "allowed": body.domains })))
}

pub async fn deny(
    State(ui): State<Arc<Ui>>,
    Path(name): Path<String>,
    Json(body): Json<Domains>,
) -> Answer<serde_json::Value> {
    if body.domains.is_empty() {
        return Err(Failure::new(Code::BadArgument, "no name to deny"));
    }
    let (sandbox, _held) = held(&ui, &name).await?;
    approve::deny(&sandbox, &body.domains).await?;
    eprintln!("agent-sandbox: the page denied {} for {name}", body.domains.join(", "));
    Ok(Json(json!({ "denied": body.domains })))
}

pub async fn stop(State(ui): State<Arc<Ui>>, Path(name): Path<String>) -> Answer<serde_json::Value> {
    let sandbox = named(&ui, &name).await?;
    let (stopped, git) = crate::stop::stop(&sandbox).await?;
    eprintln!("agent-sandbox: the page {stopped}");
    // The sandbox is gone either way; what changed in the project's git files is the user's to read.
    let warning = git.err().map(|failure| failure.message);
    Ok(Json(json!({ "stopped": sandbox.name, "message": stopped, "warning": warning })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_screen_keeps_text_and_loses_every_sequence() {
        let raw = b"hello \x1b]52;c;c2VjcmV0\x07world\x1b[31m red\x1b[0m\r\n\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\end\x07\n";
        let text = screen_text(raw);
        assert!(text.contains("hello world"), "{text:?}");
        assert!(text.contains(" red"), "{text:?}");
        assert!(text.contains("end"), "{text:?}");
        assert!(!text.contains("52;") && !text.contains("c2VjcmV0") && !text.contains('\x1b'), "{text:?}");
        assert_eq!(screen_text(b"$ ls\nfile\n\n   \n\n"), "$ ls\nfile\n", "the pane's empty rows go");
    }

    #[test]
    fn seconds_since_reads_the_engines_times() {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        let then = seconds_since("1970-01-02T00:00:00.5Z").unwrap();
        assert_eq!(then, now - 86_400);
        assert_eq!(seconds_since("2000-03-01T00:00:00Z").unwrap(), now - 951_868_800);
        assert_eq!(seconds_since("bad"), None);
    }
}
