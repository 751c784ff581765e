//! What the launcher prints. Most of it came from inside the sandbox (sandbox-status's report,
//! the container's log, refused names, a check's evidence, file names the agent made, log tails
//! quoted in a failure), which the agent chose byte by byte: everything goes through
//! sandbox-policy's `text` escaping, whether or not the output is a terminal, so that no
//! control of the agent's (ESC, BEL, a C1 control) reaches the user's terminal.

use std::io::Write as _;

use sandbox_policy::text::{escaped, escaped_bytes, json_safe};

/// `text` on standard output, as it is but for its controls.
pub fn out(text: &str) {
    print!("{}", escaped(text));
}

/// One line on standard error.
pub fn line(text: &str) {
    eprintln!("{}", escaped(text));
}

/// Bytes as they come (a followed log): each chunk escaped, what is not UTF-8 as U+FFFD.
pub fn out_bytes(bytes: &[u8]) {
    let mut stdout = std::io::stdout();
    let _ = stdout.write_all(escaped_bytes(bytes).as_bytes());
    let _ = stdout.flush();
}

/// Bytes as they come, on standard error.
pub fn err_bytes(bytes: &[u8]) {
    let _ = std::io::stderr().write_all(escaped_bytes(bytes).as_bytes());
}

/// JSON on standard output, pretty, with the C1 controls serde_json leaves as `\u` escapes.
pub fn json(value: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(value).expect("the launcher's JSON serialises");
    println!("{}", json_safe(&text));
}

/// JSON as another program printed it (sandbox-status's): C1 controls escaped the same way.
pub fn json_text(text: &str) {
    print!("{}", json_safe(text));
}
