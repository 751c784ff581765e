//! What the checker (checker.rs) and PID 1 (verdicts.rs) say to each other, and where:
//! the ports nft redirects to, the descriptors and variable PID 1 hands it, the messages on their
//! socketpair (one JSON object a datagram). The checker's user is in net/uids.rs.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where nft redirects connections whose name is checked, and those passed on the address.
pub const CHECK_PORT: u16 = 15001;
pub const PASS_PORT: u16 = 15002;
/// Where nft redirects the key forwarder's connections, whose name is checked too: the port
/// tells PID 1 that the forwarder made them, which only the kernel (by the socket's uid) can.
pub const FORWARDER_PORT: u16 = 15003;
/// The descriptor of PID 1's socket in the checker.
pub const VERDICT_FD: i32 = 3;
/// The variable that tells the checker its listeners: `FD:check,FD:pass,FD:forwarder,…`.
pub const LISTENERS_ENV: &str = "SANDBOX_CHECKER_LISTENERS";
/// How long the checker waits for PID 1's verdict before it refuses.
pub const VERDICT_TIMEOUT: Duration = Duration::from_secs(5);

/// From the checker to PID 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Report {
    /// May this connection go on? Answered by a [`Order::Verdict`] with the same id. `check`:
    /// it came to a port that checks names; `name` is what the client sent (`via` says how);
    /// `forwarder`: it came to the port of the key forwarder's connections.
    Ask {
        id: u64,
        dst: SocketAddr,
        check: bool,
        name: Option<String>,
        via: String,
        ech: bool,
        #[serde(default)]
        forwarder: bool,
        /// The bytes the checker read before it asked (the hello or request head), which it
        /// sends first if the connection is allowed: counted against the name's budget.
        #[serde(default)]
        first: u64,
    },
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
    /// What an open connection has sent up so far, while it sends (for the upload budgets).
    Progress { id: u64, up: u64 },
}

/// How often the checker reports an open connection's bytes up, while there are new ones.
pub const PROGRESS_PERIOD: Duration = Duration::from_millis(100);

/// Which of the checker's listeners a connection came to, so how nft sent it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The agent's connection to a name-checked port.
    Check,
    /// The agent's connection to an opaque port or a range: passed on the address.
    Pass,
    /// The key forwarder's connection, name-checked.
    Forwarder,
}

impl Listener {
    pub const ALL: [Listener; 3] = [Listener::Check, Listener::Pass, Listener::Forwarder];

    pub fn port(self) -> u16 {
        match self {
            Listener::Check => CHECK_PORT,
            Listener::Pass => PASS_PORT,
            Listener::Forwarder => FORWARDER_PORT,
        }
    }

    /// Its name in [`LISTENERS_ENV`].
    pub fn name(self) -> &'static str {
        match self {
            Listener::Check => "check",
            Listener::Pass => "pass",
            Listener::Forwarder => "forwarder",
        }
    }

    pub fn from_name(name: &str) -> Option<Listener> {
        Listener::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Whether the name the client sends is checked.
    pub fn checks(self) -> bool {
        self != Listener::Pass
    }
}

/// From PID 1 to the checker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Order {
    Verdict {
        id: u64,
        allow: bool,
        reason: String,
        /// The bytes the connection may send up before it waits for an [`Order::Allowance`]:
        /// what is left of its name's upload budget, a
        /// [`GRANT`](sandbox_wire::namecheck::budgets::GRANT) at most. None: no budget
        /// applies (the forwarder's connections, those passed on the address).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allowance: Option<u64>,
    },
    /// Connection `id` may send up to `total` bytes up in all: more of its name's budget,
    /// granted on a [`Report::Progress`].
    Allowance { id: u64, total: u64 },
    /// Cut this connection: the policy no longer allows it.
    Close { id: u64 },
}
