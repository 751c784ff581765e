//! `sandbox-init status-line`: what the session's tmux status line shows on the right, so that
//! the user attached to the session sees refusals as they happen: how many names the agent's
//! summary (`REFUSED_FILE`, its last 20 lines, which denials.rs writes) has as refused for not
//! being in the allowlist, and the newest. Recent refusals, not a queue: a name allowed since
//! stays until newer lines push it out (`agent-sandbox approve` has the queue). tmux runs it
//! every few seconds (`#()` in `status-right`, set by session.rs).
//!
//! The names are the agent's, and tmux reads the line as a format (`#[…]` would restyle it), so
//! only a host name's characters are kept, each other one shown as `?`, and of a longer name its
//! last 40 (the end says whose name it is).
//! The agent owns its tmux server and can change the line: it informs, it proves nothing; the
//! host's `agent-sandbox approve` and `why` read the sandbox's own logs.

use crate::denials::NOT_ALLOWLISTED;
use crate::policy::layout::REFUSED_FILE;
/// The most characters of the newest name shown.
const MAX_NAME: usize = 40;

/// The status line for the summary's text: `refused N: NAME` (N names, NAME the newest), or
/// nothing when none was refused.
pub fn line(summary: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    for entry in summary.lines() {
        // `TIME NAME: refused: …`: the name is between the first space and the marker. Names
        // are the same whatever their case, as DNS has them.
        let Some((_, words)) = entry.split_once(' ') else { continue };
        let Some((name, _)) = words.split_once(&format!(": {NOT_ALLOWLISTED}")) else { continue };
        let name = name.to_ascii_lowercase();
        names.retain(|n| *n != name);
        names.push(name);
    }
    match names.last() {
        None => String::new(),
        Some(last) => format!("refused {}: {} ", names.len(), shown(last)),
    }
}

/// A name as the status line may show it: letters, digits, `.`, `-` and `_`, anything else `?`;
/// of a longer name, `?` and its last characters.
fn shown(name: &str) -> String {
    let count = name.chars().count();
    let kept = name
        .chars()
        .skip(count.saturating_sub(MAX_NAME))
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '?' });
    let cut = if count > MAX_NAME { "?" } else { "" };
    format!("{cut}{}", kept.collect::<String>())
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
        format!("{TIME} {name}: {NOT_ALLOWLISTED}; only the user decides whether to allow it\n")
    }

    #[test]
    fn counts_each_refused_name_once_and_shows_the_newest() {
        assert_eq!(line(""), "");
        let summary = [
            refused("a.example"),
            format!("{TIME} tcp 10.0.0.1 port 443: refused: no allowed name opened this address\n"),
            refused("b.example"),
            refused("A.Example"),
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
        assert!(name.ends_with("touch??tmp?x???52?c?aa?.test"), "{shown}");
        // Of a long name, its end: whose name it is.
        let long = refused(&format!("api.anthropic.com.{}.attacker.example", "a".repeat(60)));
        assert_eq!(line(&long), format!("refused 1: ?{}.attacker.example ", "a".repeat(MAX_NAME - 17)));
    }
}
