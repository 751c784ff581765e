//! The agent as the adversary: each test performs one attack a prompt-injected agent would try,
//! as uid 1000 through sandbox-exec with a program of the probe binary (never a tool of the
//! images; the attacks on the launcher drive the session's own tmux and shell), and reads the
//! evidence on the receiving side. Each has a positive control in the
//! same test, so it cannot pass because something else broke.
//!
//! `approvals::`, `models::`, `network::`, `names::`, `forwarder::`, `services::`, `budgets::`, `sidecar::`, `terminal::` and `verify::` need NET_ADMIN (the firewall) and are left out of
//! `cargo xtask test --ci`; `process::` and `ui::` need no capability and run in both modes.

mod approvals;
mod budgets;
mod forwarder;
mod models;
mod names;
mod network;
mod process;
mod services;
mod sidecar;
mod terminal;
mod ui;
mod verify;

/// The name the attacks' policies allow, a peer's alias.
const ALLOWED: &str = "api.allowed.test";

/// A policy allowing `names` on the default ports.
fn allow(names: &[&str]) -> String {
    let list: Vec<String> = names.iter().map(|d| format!("  - \"{d}\"\n")).collect();
    format!("version: 1\ndomains:\n{}", list.concat())
}
