//! The agent as the adversary: each test performs one attack a prompt-injected agent would try,
//! as uid 1000 through sandbox-exec with a program of the probe binary (never a tool of the
//! images; the attacks on the launcher drive the session's own tmux and shell), and reads the
//! evidence on the receiving side. Each has a positive control in the
//! same test, so it cannot pass because something else broke.
//!
//! `network::` needs NET_ADMIN (the firewall) and is left out of `cargo xtask test --ci`;
//! `process::` needs no capability and runs in both modes.

mod network;
mod process;
