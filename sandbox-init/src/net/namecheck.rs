//! The name check: with it on, every TCP connection of the agent's to an allowed address is
//! redirected by nft to the checker (`checker`), a process of its own without privilege that
//! reads the name the client sends and asks PID 1 whether the connection may go on; PID 1
//! answers (`verdicts`) from the allowlist in force and the upload budgets (`budgets`). What the
//! two say to each other, and where, is `protocol`.

pub mod budgets;
pub mod checker;
pub mod protocol;
pub mod verdicts;
