//! Text that came from inside the sandbox (a refusal's reason quoting the agent's method, a name,
//! a log line, a screen), made safe for where it goes. The agent chose those bytes: printed
//! raw, an ESC or a C1 control (U+0080 to U+009F, which UTF-8 terminals read as controls too)
//! would let it write the user's terminal: its clipboard (OSC 52), its title, its screen. One
//! rule for every sink:
//! - [`one_line`], where the text is made (a refusal, a log record): every control and every
//!   bidirectional formatting character becomes `?`, and the text is cut to a bound;
//! - [`escaped`], where it is printed (`sandbox-status`, the launcher's `status`, `logs`,
//!   `pending`, its error messages): the same characters shown as escapes (`\x1b`, `\u{202e}`),
//!   lines and tabs kept, whether or not the output is a terminal (a pipe often ends in one);
//! - [`json_safe`], for JSON that a person may read raw: serde_json escapes C0 but writes C1
//!   controls and DEL as they are, so they become `\u` escapes, which read back the same.

use std::borrow::Cow;

/// Whether `c` must never reach a terminal or a log line as itself: C0 and C1 controls, DEL,
/// and the characters that reorder text (bidirectional embeddings, overrides and isolates, and
/// the marks), which make a line read otherwise than it is.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as one line of at most `max_chars` characters: every unsafe character (newlines too)
/// becomes `?`; a longer text is cut and ends in `…`.
pub fn one_line(text: &str, max_chars: usize) -> String {
    let long = text.chars().nth(max_chars).is_some();
    let kept = if long { max_chars.saturating_sub(1) } else { max_chars };
    let mut out: String = text.chars().take(kept).map(|c| if is_unsafe(c) { '?' } else { c }).collect();
    if long {
        out.push('…');
    }
    out
}

/// The most characters of one thing the agent chose that a message quotes.
pub const MAX_QUOTED: usize = 80;

/// Something the agent chose (a method, a path, a tool's name), as a message quotes it: in
/// backticks, one line, at most [`MAX_QUOTED`] characters.
pub fn quoted(text: &str) -> String {
    format!("`{}`", one_line(text, MAX_QUOTED))
}

/// `text` for printing: unsafe characters shown as escapes, `\n` and `\t` kept. Borrowed when
/// there is nothing to escape, which is nearly always.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c) && c != '\n' && c != '\t') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if is_unsafe(c) && (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Bytes for printing: what is not UTF-8 becomes U+FFFD (so no lone byte 0x80 to 0x9F passes),
/// then [`escaped`].
pub fn escaped_bytes(bytes: &[u8]) -> String {
    escaped(&String::from_utf8_lossy(bytes)).into_owned()
}

/// JSON text with every unsafe character that serde_json leaves as it is (C1 controls, DEL, the
/// bidirectional ones) as a `\u` escape. Such characters occur only inside strings, where the
/// escape means the same character, so the JSON reads back unchanged.
pub fn json_safe(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_unsafe) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if is_unsafe(c) && !matches!(c, '\n' | '\t' | '\r') {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte a terminal could act on: ESC, BEL, CSI (U+009B), OSC (U+009D), ST (U+009C), DEL.
    const HOSTILE: &str = "mcp\u{1b}]52;c;cHduZWQ=\u{7}\u{9d}52;c;x\u{9c}\u{9b}31m\u{7f}\u{202e}txt";

    fn has_terminal_controls(text: &str) -> bool {
        text.bytes().any(|b| matches!(b, 0x1b | 0x07 | 0x7f | 0x9b))
            || text.as_bytes().windows(2).any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1]))
    }

    #[test]
    fn one_line_replaces_every_control_and_reordering_character() {
        let line = one_line(HOSTILE, 512);
        assert_eq!(line, "mcp?]52;c;cHduZWQ=??52;c;x??31m??txt");
        assert!(!has_terminal_controls(&line));
        assert_eq!(one_line("a\r\nb", 10), "a??b");
    }

    #[test]
    fn one_line_is_bounded_in_characters() {
        assert_eq!(one_line("abcdef", 4), "abc…");
        assert_eq!(one_line("abcd", 4), "abcd");
        assert_eq!(one_line(&"é".repeat(1000), 80).chars().count(), 80);
    }

    #[test]
    fn escaped_shows_controls_and_keeps_lines() {
        let shown = escaped(HOSTILE);
        assert_eq!(shown, "mcp\\x1b]52;c;cHduZWQ=\\x07\\x9d52;c;x\\x9c\\x9b31m\\x7f\\u{202e}txt");
        assert!(!has_terminal_controls(&shown));
        assert!(matches!(escaped("plain\ttext\n"), Cow::Borrowed("plain\ttext\n")));
        assert_eq!(escaped_bytes(b"a\xc2\x9b1m\x9b2m\n"), "a\\x9b1m\u{fffd}2m\n");
    }

    #[test]
    fn json_safe_reads_back_the_same() {
        let json = serde_json::to_string(&serde_json::json!({"reason": HOSTILE, "n": "a\nb"})).unwrap();
        assert!(has_terminal_controls(&json), "serde_json leaves C1 as it is: {json:?}");
        let safe = json_safe(&json);
        assert!(!has_terminal_controls(&safe), "{safe}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap()["reason"], HOSTILE);
    }
}
