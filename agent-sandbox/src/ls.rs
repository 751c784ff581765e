//! `agent-sandbox ls`: the sandboxes as the engine lists them, with the connections
//! sandbox-status counts inside each running one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::{Engine, Sandbox};
use crate::exit::Result;
use crate::flags::LsFlags;

/// One row of `ls`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub name: String,
    pub agent: String,
    pub project: String,
    pub running: bool,
    /// The engine's words: `Up 5 minutes`, `Exited (0) 2 hours ago`.
    pub status: String,
    pub state_volume: String,
    pub image: String,
    /// Connections allowed and refused, over the sandbox's connection log; None when it is not
    /// running (or says nothing).
    pub allowed: Option<u64>,
    pub refused: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct Totals {
    #[serde(default)]
    allowed: u64,
    #[serde(default)]
    refused: u64,
}

#[derive(Debug, Default, Deserialize)]
struct StatusReport {
    #[serde(default)]
    totals: BTreeMap<String, Totals>,
}

/// Connections allowed and refused in a running sandbox, from `sandbox-status --json`.
pub async fn connections(sandbox: &Sandbox) -> Option<(u64, u64)> {
    if !sandbox.running {
        return None;
    }
    let out = sandbox.exec(&["sandbox-status", "--json"]).await.ok()?;
    let report: StatusReport = serde_json::from_str(&out.stdout).ok()?;
    Some(report.totals.values().fold((0, 0), |(a, r), t| (a + t.allowed, r + t.refused)))
}

pub async fn run(flags: &LsFlags) -> Result<i32> {
    let rows = rows(&Engine::connect().await?).await?;
    if flags.json {
        crate::say::json_text(&render_json(&rows));
    } else {
        crate::say::out(&render_text(&rows));
    }
    Ok(0)
}

async fn rows(engine: &Engine) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for sandbox in engine.sandboxes().await? {
        let counts = connections(&sandbox).await;
        let sandbox = sandbox.into_found();
        rows.push(Row {
            name: sandbox.name,
            agent: sandbox.agent,
            project: sandbox.project,
            running: sandbox.running,
            status: sandbox.status,
            state_volume: sandbox.state,
            image: sandbox.image,
            allowed: counts.map(|c| c.0),
            refused: counts.map(|c| c.1),
        });
    }
    Ok(rows)
}

fn render_text(rows: &[Row]) -> String {
    if rows.is_empty() {
        return "no sandboxes: `agent-sandbox run AGENT` starts one\n".to_string();
    }
    let header = ["AGENT", "PROJECT", "STATUS", "STATE VOLUME", "ALLOWED", "REFUSED", "NAME"];
    let count = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
    let table: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.agent.clone(),
                r.project.clone(),
                r.status.clone(),
                if r.state_volume.is_empty() { "-".into() } else { r.state_volume.clone() },
                count(r.allowed),
                count(r.refused),
                r.name.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(header.to_vec());
    for row in &table {
        text.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    text
}

fn render_json(rows: &[Row]) -> String {
    let mut text = serde_json::to_string_pretty(rows).expect("rows serialise");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Row> {
        vec![
            Row {
                name: "agent-sandbox-claude-app-1a2b3c4d".into(),
                agent: "claude".into(),
                project: "/home/ana/src/app".into(),
                running: true,
                status: "Up 5 minutes".into(),
                state_volume: "agent-sandbox-claude-app-1a2b3c4d".into(),
                image: "localhost/agent-sandbox/agent-claude:0.1.0".into(),
                allowed: Some(42),
                refused: Some(3),
            },
            Row {
                name: "agent-sandbox-shell-lib-5e6f7a8b".into(),
                agent: "shell".into(),
                project: "/home/ana/src/lib".into(),
                running: false,
                status: "Exited (0) 2 hours ago".into(),
                state_volume: String::new(),
                image: "localhost/agent-sandbox/agent-shell:0.1.0".into(),
                allowed: None,
                refused: None,
            },
        ]
    }

    #[test]
    fn ls_text() {
        insta::assert_snapshot!(render_text(&rows()));
        assert_eq!(render_text(&[]), "no sandboxes: `agent-sandbox run AGENT` starts one\n");
    }

    #[test]
    fn ls_json() {
        insta::assert_snapshot!(render_json(&rows()));
    }
}
