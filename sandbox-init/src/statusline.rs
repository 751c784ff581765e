//! `sandbox-init status-line`: what the session's tmux status line shows on the right, so that
//! the user attached to the session sees refusals as they happen: how many names the sandbox
//! refused for not being in its allowlist (the names waiting for the user's decision) and the
//! newest, read from the agent's summary (`REFUSED_FILE`, which denials.rs writes). tmux runs it
//! every few seconds (`#()` in `status-right`, set by session.rs).
//!
//! The names are the agent's, and tmux reads the line as a format (`#[…]` would restyle it), so
//! only a host name's characters are kept, each other one shown as `?`, at most 40 of them.
//! The agent owns its tmux server and can change the line: it informs, it proves nothing; the
//! host's `agent-sandbox approve` and `why` read the sandbox's own logs.

use crate::policy::layout::REFUSED_FILE;

/// What a line of the summary says of a name refused for not being in the allowlist.
const NOT_ALLOWLISTED: &str = ": refused: not in this sandbox's allowlist";
/// The most characters of the newest name shown.
const MAX_NAME: usize = 40;

/// The status line for the summary's text: `refused N: NAME` (N names, NAME the newest), or
/// nothing when none was refused.
pub fn line(summary: &str) -> String {
    let mut names: Vec<&str> = Vec::new();
    for entry in summary.lines() {
        // `TIME NAME: refused: …`: the name is between the first space and the marker.
        let Some((_, words)) = entry.split_once(' ') else { continue };
        let Some((name, _)) = words.split_once(NOT_ALLOWLISTED) else { continue };
        names.retain(|n| *n != name);
        names.push(name);
    }
    match names.last() {
        None => String::new(),
        Some(last) => format!("refused {}: {} ", names.len(), shown(last)),
    }
}

/// A name as the status line may show it: letters, digits, `.`, `-` and `_`; anything else `?`.
fn shown(name: &str) -> String {
    let mut out: String = name
        .chars()
        .take(MAX_NAME)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '?' })
        .collect();
    if name.chars().nth(MAX_NAME).is_some() {
        out.push('?');
    }
    out
}

/// Prints the line (an unreadable or missing summary: nothing, as with no refusal).
pub fn show() -> u8 {
    let summary = std::fs::read_to_string(REFUSED_FILE).unwrap_or_default();
    print!("{}", line(&summary));
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIME: &str = "2026-12-07T02:00:00Z";

    fn refused(name: &str) -> String {
        format!("{TIME} {name}{NOT_ALLOWLISTED}; only the user decides whether to allow it\n")
    }

    #[test]
    fn counts_each_refused_name_once_and_shows_the_newest() {
        assert_eq!(line(""), "");
        let summary = [
            refused("a.example"),
            format!("{TIME} tcp 10.0.0.1 port 443: refused: no allowed name opened this address\n"),
            refused("b.example"),
            refused("a.example"),
            format!("{TIME} up.example: refused or cut: its upload budget of 1 bytes an hour is spent\n"),
        ]
        .concat();
        assert_eq!(line(&summary), "refused 2: a.example ");
    }

    #[test]
    fn a_hostile_name_cannot_restyle_the_line_or_run_a_command() {
        let summary = refused("x#[fg=red,bg=red]#(touch /tmp/x)\u{1b}]52;c;AA\u{7}.test");
        let shown = line(&summary);
        let name = shown.strip_prefix("refused 1: ").and_then(|s| s.strip_suffix(' ')).expect(&shown);
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '?')),
            "{shown}"
        );
        assert!(name.starts_with("x??fg?red?bg?red???touch??tmp?x"), "{shown}");
        let long = refused(&"a".repeat(100));
        assert_eq!(line(&long), format!("refused 1: {}? ", "a".repeat(MAX_NAME)));
    }
}
