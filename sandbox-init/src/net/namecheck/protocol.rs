//! Where and when the checker (checker.rs) and PID 1 (verdicts.rs) talk: the ports nft
//! redirects to, the descriptors and variable PID 1 hands the checker, how long it waits and how
//! often it reports. What they say, the messages on their socketpair (one JSON object a
//! datagram), is sandbox-wire's `namecheck::messages`; the checker's user is in net/uids.rs.

use std::time::Duration;

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
