//! The name check: with it on, every TCP connection of the agent's to an allowed address is
//! redirected by nft to the checker (`checker`), a process of its own without privilege that
//! reads the name the client sends and asks PID 1 whether the connection may go on; PID 1
//! answers (`verdicts`) from the allowlist in force and the upload budgets (whose arithmetic is
//! sandbox-wire's `namecheck::budgets`). What the two say to each other, and where, is
//! `protocol`. `SANDBOX_NAME_CHECK=off` turns it off (`wanted`).

pub mod checker;
pub mod protocol;
pub mod verdicts;

use crate::exit::{Fatal, Refusal};

/// The variable that turns the name check off (for measurements; loudly warned).
pub use crate::policy::layout::NAME_CHECK_ENV;

/// SANDBOX_NAME_CHECK: `on` (the default) or `off`.
pub fn wanted() -> Result<bool, Fatal> {
    match std::env::var(NAME_CHECK_ENV).as_deref() {
        Err(_) | Ok("" | "on") => Ok(true),
        Ok("off") => Ok(false),
        Ok(other) => {
            Err(Fatal::new(Refusal::BadSetting, format!("{NAME_CHECK_ENV}={other} is not one of on, off")))
        }
    }
}
