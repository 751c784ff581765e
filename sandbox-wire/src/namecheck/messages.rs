//! What the checker and PID 1 say to each other on their socketpair, one JSON object a
//! datagram: the checker's reports (`Report`: may this connection go on, what it sent) and PID
//! 1's orders (`Order`: a verdict, more of a budget, a cut). Where and when they talk (ports,
//! descriptors, timeouts) is sandbox-init's `net/namecheck/protocol.rs`.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

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

/// From PID 1 to the checker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Order {
    Verdict {
        id: u64,
        allow: bool,
        reason: String,
        /// The bytes the connection may send up before it waits for an [`Order::Allowance`]:
        /// what is left of its name's upload budget, a [`GRANT`](super::budgets::GRANT) at most. None: no budget
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_and_orders_are_tagged_json() {
        let ask = Report::Ask {
            id: 7,
            dst: "203.0.113.7:443".parse().unwrap(),
            check: true,
            name: Some("api.example.com".into()),
            via: "tls".into(),
            ech: false,
            forwarder: false,
            first: 517,
        };
        let text = serde_json::to_string(&ask).unwrap();
        assert!(text.starts_with(r#"{"t":"ask","id":7,"dst":"203.0.113.7:443","check":true"#), "{text}");
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), ask);
        let order = serde_json::to_string(&Order::Close { id: 3 }).unwrap();
        assert_eq!(order, r#"{"t":"close","id":3}"#);
    }
}
