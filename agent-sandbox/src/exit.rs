//! Every way the launcher fails, and its exit code (the table `agent-sandbox --help` prints and
//! docs/exit-codes.md repeats).

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The engine refused a call.
    Engine = 1,
    /// A bad argument: a domain, `--env`, `--key-file`, the project folder.
    BadArgument = 64,
    /// A policy file is invalid or unreadable.
    BadPolicy = 65,
    /// No image for the agent.
    NoImage = 66,
    /// No key for the agent's API.
    NoKey = 67,
    /// No sandbox, or more than one, matches the name given.
    NoSandbox = 68,
    /// No container engine answers.
    NoEngine = 69,
    /// The sandbox did not start, or did not apply a change.
    Sandbox = 70,
    /// A host sign-in file is missing or unreadable.
    NoLogin = 71,
    /// The project's git files changed while the agent ran: look before running git there.
    GitChanged = 72,
    /// `verify`: a check failed.
    Failed = 73,
    /// The web page's approval: the queue changed since the page showed it; nothing changed.
    Changed = 74,
}

/// A failure with what to do about it.
#[derive(Debug)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl From<sandbox_images::engine::EngineError> for Failure {
    fn from(e: sandbox_images::engine::EngineError) -> Failure {
        let code = match e {
            sandbox_images::engine::EngineError::Unreachable { .. } => Code::NoEngine,
            _ => Code::Engine,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<bollard::errors::Error> for Failure {
    fn from(e: bollard::errors::Error) -> Failure {
        Failure::new(Code::Engine, format!("the engine refused: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, Failure>;
