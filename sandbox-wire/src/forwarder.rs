//! What the key forwarder decides from the agent's request, before and after it reads the body:
//! the head rewritten for its one host (`request`), what the agent may ask of a forwarded host
//! (`rules`), the body's framing and what a model API would be made to fetch (`inspect`,
//! `remote_tools`), and the refusal every one of them answers with ([`Refused`]). Pure: the
//! forwarder's process (sandbox-init's `net/forwarder.rs`) does the sockets.

/// Why a request was not forwarded: the status the agent's CLI gets, and the reason. The
/// reason quotes what the agent sent (a method, a path, a tool's name) and goes to the agent,
/// connections.jsonl, `sandbox-status` and the user's terminal: [`Refused::new`] is the one way
/// to make one, and it leaves no control character in it and bounds it.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    status: u16,
    reason: String,
}

/// The most characters of a refusal's reason (and of what the forwarder reports to PID 1).
pub const MAX_REASON: usize = 400;

impl Refused {
    /// A refusal with `status`; every control character of `reason` (C0, DEL, C1) and every
    /// bidirectional one becomes `?`, and it is cut to [`MAX_REASON`] characters.
    pub fn new(status: u16, reason: impl AsRef<str>) -> Refused {
        Refused { status, reason: sandbox_policy::text::one_line(reason.as_ref(), MAX_REASON) }
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }
}

pub mod inspect;
pub mod remote_tools;
pub mod request;
pub mod rules;
