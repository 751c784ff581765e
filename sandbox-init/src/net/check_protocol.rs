//! What the checker (net/checker.rs) and PID 1 (net/verdicts.rs) say to each other, and where:
//! the checker's user, the ports nft redirects to, the descriptors and variable PID 1 hands it,
//! the messages on their socketpair (one JSON object a datagram).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The checker's uid and gid: not root, not the agent, in no image's passwd.
pub const CHECKER_UID: u32 = 65533;
/// Where nft redirects connections whose name is checked, and those passed on the address.
pub const CHECK_PORT: u16 = 15001;
pub const PASS_PORT: u16 = 15002;
/// The descriptor of PID 1's socket in the checker.
pub const VERDICT_FD: i32 = 3;
/// The variable that tells the checker its listeners: `FD:check,FD:pass,…`.
pub const LISTENERS_ENV: &str = "SANDBOX_CHECKER_LISTENERS";
/// How long the checker waits for PID 1's verdict before it refuses.
pub const VERDICT_TIMEOUT: Duration = Duration::from_secs(5);

/// From the checker to PID 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Report {
    /// May this connection go on? Answered by a [`Order::Verdict`] with the same id. `check`:
    /// it came to the port that checks names; `name` is what the client sent (`via` says how).
    Ask { id: u64, dst: SocketAddr, check: bool, name: Option<String>, via: String, ech: bool },
    /// Refused by the checker itself before a name could be judged.
    /// `name`: the one the client sent, where it sent one (a later request's Host).
    Refused {
        id: u64,
        dst: SocketAddr,
        via: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// An allowed connection ended.
    Closed { id: u64, up: u64, down: u64, ms: u64 },
}

/// From PID 1 to the checker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Order {
    Verdict {
        id: u64,
        allow: bool,
        reason: String,
    },
    /// Cut this connection: the policy no longer allows it.
    Close {
        id: u64,
    },
}
