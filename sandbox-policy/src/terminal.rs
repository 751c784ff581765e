//! What reaches the user's terminal from the agent's session: the output filter both ways of
//! attaching apply (sandbox-init's `sandbox-attach`, as root, between the session's terminal and
//! the user's; and the launcher's `attach`, again, on the user's side). A policy like the
//! allowlist: what the agent may send the person watching it.

use std::os::fd::AsFd as _;

use rustix::termios::{OptionalActions, Termios, tcgetattr, tcsetattr};

/// What the session sends the user's terminal, less what the agent could use against it. The
/// agent owns its tmux server, so it can turn tmux's own filtering off; this filter parses the
/// stream as terminals do (ECMA-48: an ESC ends any string, CAN and SUB cancel one; OSC numbers
/// are integers) and lets through:
/// - text, and escape and control sequences (colours, cursor, modes);
/// - OSC 0, 1, 2 (titles), 7 (the working folder) and 8 (hyperlinks), and no other OSC: not 52
///   (the clipboard), 1337, 5113 or 5522 (files), 9 or 777 (notifications);
/// - no DCS, APC, PM or SOS string (passthrough to the outer terminal, graphics, vendor
///   commands); a C1 control, raw or UTF-8 encoded, is judged (and sent) as its 7-bit form;
/// - what is not valid UTF-8 as U+FFFD; an ESC only with a byte 0x20 to 0x7E after it (terminals
///   read ESC, a control, then `]` as OSC); an OSC only as one digit and `;`, with no control
///   inside.
///
/// It works byte by byte, so a sequence split across chunks is judged whole.
#[derive(Debug, Default)]
pub struct Sanitizer {
    state: State,
    /// The bytes of a UTF-8 character not complete yet (its lead first).
    pending: Vec<u8>,
    /// How long that character is: 0 when none is pending.
    need: usize,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum State {
    #[default]
    Text,
    /// After ESC.
    Escape,
    /// In an OSC whose number is being read.
    OscHead(Vec<u8>),
    /// In an OSC that passes (`true`) or is dropped.
    Osc(bool),
    /// ESC inside an OSC.
    OscEscape(bool),
    /// In an OSC 8 (a hyperlink), held until it ends: it passes only as an http or https link.
    Link(Vec<u8>),
    /// ESC inside an OSC 8.
    LinkEscape(Vec<u8>),
    /// In an escape sequence that is dropped whole (`ESC %`, `ESC SP`: the terminal's encoding
    /// and its 8-bit controls), until its final byte.
    EscDropped,
    /// In a DCS, APC, PM or SOS string: dropped.
    Dropped,
    DroppedEscape,
}

/// The user's terminal (standard input) in raw mode while attached, every key passed as typed,
/// and put back as it was however attaching ends: the launcher's and sandbox-attach's.
pub struct RawMode(Termios);

impl RawMode {
    /// None when standard input is no terminal.
    pub fn enable() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw).ok()?;
        Some(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &self.0);
    }
}

/// The longest OSC 8 (parameters and link) that passes.
const MAX_LINK: usize = 2048;

/// Sent when the session's output ends (a detach, or the client gone): the hyperlink, mouse
/// reporting, focus reports, bracketed paste, the kitty keyboard protocol, xterm's
/// modifyOtherKeys, win32 input mode, application cursor keys and keypad, insert mode and the
/// keyboard lock off; 7-bit answers, the ASCII character set shifted in, the cursor shown, plain
/// attributes; and back from VT52 mode first, where none of that would be read. Nothing of it
/// moves the cursor or clears anything, so it may follow a clean detach.
pub const END: &[u8] = b"\x1b<\x1b]8;;\x1b\\\x1b[?9l\x1b[?1000l\x1b[?1001l\x1b[?1002l\x1b[?1003l\x1b[?1004l\
\x1b[?1005l\x1b[?1006l\x1b[?1015l\x1b[?1016l\x1b[?2004l\x1b[<99u\x1b[>4m\x1b[?9001l\x1b[?1l\x1b>\x1b[4l\x1b[2l\
\x1b F\x1b(B\x0f\x1b[?25h\x1b[0m";
/// And after a client that did not end cleanly: the full scrolling region and the normal screen
/// (both move the cursor, which a clean detach has put where the user expects it).
pub const END_AFTER_A_CRASH: &[u8] = b"\x1b[r\x1b[?1049l";

/// An OSC 8 body (`params;uri`) goes out only as a link to an http or https address of printable
/// ASCII, or as the empty link that ends one: any other scheme is a file or a program the
/// terminal would open on a click, under text the agent chose.
fn link(body: &[u8], out: &mut Vec<u8>) {
    let printable = |b: &u8| (0x21..=0x7e).contains(b);
    let Some(at) = body.iter().position(|&b| b == b';') else { return };
    let (params, uri) = (&body[..at], &body[at + 1..]);
    let web = uri.starts_with(b"http://") || uri.starts_with(b"https://");
    if params.iter().all(printable) && (uri.is_empty() || (web && uri.iter().all(printable))) {
        out.extend_from_slice(b"\x1b]8;");
        out.extend_from_slice(body);
        out.extend_from_slice(&[ESC, b'\\']);
    }
}

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
/// OSC numbers that pass: titles, the working folder, hyperlinks.
const PASSING_OSC: [u32; 5] = [0, 1, 2, 7, 8];

impl Sanitizer {
    pub fn filter(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len());
        for &byte in input {
            self.byte(byte, &mut out);
        }
        out
    }

    /// What to send when the stream ends: the end of a passing string the agent left open (a
    /// title would swallow what the user types next), and CAN, which cancels a sequence left
    /// half-written (a CSI would take the user's next key as its final byte) and does nothing
    /// otherwise. The filter starts afresh after it.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if matches!(self.state, State::Osc(true) | State::OscEscape(true)) {
            out.extend_from_slice(&[ESC, b'\\']);
        }
        out.push(CAN);
        *self = Sanitizer::default();
        out
    }

    /// Decodes UTF-8 first: a well-formed character goes on (U+0080 to U+009F as the C1 control
    /// it is), anything else becomes U+FFFD, so that no byte 0x80 to 0x9F reaches a terminal
    /// that would read it as a control, hidden as a continuation byte or not.
    fn byte(&mut self, byte: u8, out: &mut Vec<u8>) {
        if self.need > 0 {
            if (0x80..=0xbf).contains(&byte) {
                self.pending.push(byte);
                if self.pending.len() == self.need {
                    self.need = 0;
                    let bytes = std::mem::take(&mut self.pending);
                    match std::str::from_utf8(&bytes) {
                        Ok(_) if bytes[0] == 0xc2 && bytes[1] <= 0x9f => self.c1(bytes[1], out),
                        Ok(_) => bytes.iter().for_each(|&b| self.step(b, out)),
                        Err(_) => self.replacement(out),
                    }
                }
                return;
            }
            // Cut short by a byte that does not continue it.
            self.pending.clear();
            self.need = 0;
            self.replacement(out);
        }
        match byte {
            0x00..=0x7f => self.step(byte, out),
            0x80..=0x9f => self.c1(byte, out),
            0xc2..=0xdf => self.start(byte, 2),
            0xe0..=0xef => self.start(byte, 3),
            0xf0..=0xf4 => self.start(byte, 4),
            // A continuation with no lead, and leads no character has (overlong, too large).
            _ => self.replacement(out),
        }
    }

    fn start(&mut self, lead: u8, need: usize) {
        self.pending.push(lead);
        self.need = need;
    }

    fn replacement(&mut self, out: &mut Vec<u8>) {
        for &b in "\u{fffd}".as_bytes() {
            self.step(b, out);
        }
    }

    /// A C1 control is judged as its 7-bit form (0x9D, OSC, as ESC ]), which is what goes out
    /// if anything does.
    fn c1(&mut self, byte: u8, out: &mut Vec<u8>) {
        self.step(ESC, out);
        self.step(byte - 0x40, out);
    }

    /// The byte after the ESC that ended a string: the terminator's second half, or the start of
    /// the next sequence.
    fn after_string(&mut self, byte: u8, out: &mut Vec<u8>) {
        self.state = State::Escape;
        if byte == b'\\' {
            self.state = State::Text;
        } else {
            self.step(byte, out);
        }
    }

    fn step(&mut self, byte: u8, out: &mut Vec<u8>) {
        self.state = match std::mem::take(&mut self.state) {
            State::Text if byte == ESC => State::Escape,
            State::Text => {
                out.push(byte);
                State::Text
            }
            State::Escape => match byte {
                b']' => State::OscHead(Vec::new()),
                b'P' | b'_' | b'^' | b'X' => State::Dropped,
                // A second ESC cancels the first; a string terminator with no string is nothing.
                ESC => State::Escape,
                b'\\' => State::Text,
                CAN | SUB => {
                    out.push(byte);
                    State::Text
                }
                // Character set designations and line attributes pass. Any other intermediate is
                // dropped with its sequence: `ESC % @` switches a terminal out of UTF-8 (xterm,
                // iTerm2), after which valid UTF-8 such as Ý (C3 9D) carries 8-bit OSC and DCS;
                // `ESC SP G` and the conformance levels ask for 8-bit controls.
                b'(' | b')' | b'*' | b'+' | b'-' | b'.' | b'/' | b'#' => {
                    out.extend_from_slice(&[ESC, byte]);
                    State::Text
                }
                0x20..=0x2f => State::EscDropped,
                // Only ESC and a byte 0x20 to 0x7E is a sequence. Terminals stay in their escape
                // state across C0 controls, DEL and high bytes (tmux, vte), or read 0xA0 to 0xFF
                // as 0x20 to 0x7F (xterm: ESC Ý is ESC ]): the ESC is forgotten, the byte is text.
                0x30..=0x7e => {
                    out.extend_from_slice(&[ESC, byte]);
                    State::Text
                }
                _ => {
                    self.state = State::Text;
                    return self.step(byte, out);
                }
            },
            State::OscHead(mut head) => match byte {
                b'0'..=b'9' if head.len() < 8 => {
                    head.push(byte);
                    State::OscHead(head)
                }
                // Aborted before it said what it is: nothing of it goes out.
                ESC => State::Escape,
                CAN | SUB => State::Text,
                _ => {
                    // One digit, as written, then `;`: terminals read 0000000052 as 52, and skip
                    // C0 controls and DEL between the digits.
                    let passes =
                        byte == b';' && head.len() == 1 && PASSING_OSC.contains(&u32::from(head[0] - b'0'));
                    if passes && head[0] == b'8' {
                        self.state = State::Link(Vec::new());
                        return;
                    }
                    if passes {
                        out.extend_from_slice(&[ESC, b']']);
                        out.extend_from_slice(&head);
                        out.push(byte);
                    }
                    if byte == BEL { State::Text } else { State::Osc(passes) }
                }
            },
            State::Osc(passes) => match byte {
                ESC => State::OscEscape(passes),
                CAN | SUB => {
                    if passes {
                        out.push(byte);
                    }
                    State::Text
                }
                _ => {
                    // Inside the string, C0 controls and DEL are dropped: terminals differ on
                    // them, and a title needs none.
                    if passes && (byte == BEL || (byte >= 0x20 && byte != 0x7f)) {
                        out.push(byte);
                    }
                    if byte == BEL { State::Text } else { State::Osc(passes) }
                }
            },
            State::OscEscape(passes) => {
                if passes {
                    // Closed properly whatever follows: the terminal ends the string here too.
                    out.extend_from_slice(&[ESC, b'\\']);
                }
                return self.after_string(byte, out);
            }
            State::Link(mut body) => match byte {
                ESC => State::LinkEscape(body),
                BEL => {
                    link(&body, out);
                    State::Text
                }
                CAN | SUB => State::Text,
                _ if body.len() >= MAX_LINK => State::Osc(false),
                _ => {
                    body.push(byte);
                    State::Link(body)
                }
            },
            State::LinkEscape(body) => {
                link(&body, out);
                return self.after_string(byte, out);
            }
            State::EscDropped => match byte {
                0x20..=0x2f => State::EscDropped,
                0x30..=0x7e | CAN | SUB => State::Text,
                ESC => State::Escape,
                // Never sent, so the terminal takes what follows as it comes.
                _ => {
                    self.state = State::Text;
                    return self.step(byte, out);
                }
            },
            State::Dropped => match byte {
                ESC => State::DroppedEscape,
                CAN | SUB => State::Text,
                _ => State::Dropped,
            },
            State::DroppedEscape => return self.after_string(byte, out),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> Vec<u8> {
        let mut sanitizer = Sanitizer::default();
        chunks.iter().flat_map(|c| sanitizer.filter(c)).collect()
    }

    #[test]
    fn the_clipboard_and_passthrough_strings_are_dropped_and_the_rest_passes() {
        let text: &[u8] = b"\x1b[1;31mred\x1b[0m \x1b]0;title\x07 ok \xc3\xa9\xe2\x82\xac";
        assert_eq!(through(&[text]), text, "colours, titles and UTF-8 text pass");
        assert_eq!(
            through(&[b"a\x1b]8;;https://x.test\x1b\\link\x1b]8;;\x1b\\b"]),
            b"a\x1b]8;;https://x.test\x1b\\link\x1b]8;;\x1b\\b"
        );
        assert_eq!(through(&[b"a\x1b]52;c;SGVsbG8=\x07b"]), b"ab");
        assert_eq!(
            through(&[b"\x1b(B\x1b[m\x1b(0qq\x1b(B"]),
            b"\x1b(B\x1b[m\x1b(0qq\x1b(B",
            "character sets"
        );
        assert_eq!(
            through(&[b"\x1b]8;id=1;https://x.test/a?b=c\x07l\x1b]8;;\x07"]),
            b"\x1b]8;id=1;https://x.test/a?b=c\x1b\\l\x1b]8;;\x1b\\",
            "a web link, its end made ST"
        );
        assert_eq!(through(&[b"a\x1b]8;;file:///etc/passwd\x1b\\l\x1b]8;;\x1b\\b"]), b"al\x1b]8;;\x1b\\b");
        let long = [b"\x1b]8;;https://x.test/".as_slice(), &[b'a'; 3000], b"\x07b"].concat();
        assert_eq!(through(&[&long]), b"b", "a link too long is dropped");
        assert_eq!(through(&[b"a\x1b%@b\x1b %Gc"]), b"abc", "no encoding switch");
        assert_eq!(through(&[b"a\x1b]52;c;?\x1b\\b"]), b"ab", "the read-back query too");
        assert_eq!(through(&[b"a\x1bPtmux;\x1b\x1b]52;c;SGk=\x07\x1b\\b"]), b"ab", "tmux passthrough");
        assert_eq!(through(&[b"a\x1b_apc\x1b\\b\x1b^pm\x1b\\c\x1bXsos\x1b\\d"]), b"abcd");
        // Split anywhere, the same.
        let attack: &[u8] = b"x\x1b]52;c;SGVsbG8gZnJvbSB0aGUgYWdlbnQ=\x1b\\y\x1b]2;t\x1b\\z";
        for at in 0..attack.len() {
            assert_eq!(through(&[&attack[..at], &attack[at..]]), b"xy\x1b]2;t\x1b\\z", "split at {at}");
        }
    }

    /// What a second red team got past the first filter: terminals read OSC numbers as
    /// integers, end a string at any ESC, cancel one on CAN or SUB, and take C1 controls.
    #[test]
    fn no_way_around_it_gets_a_clipboard_write_or_a_string_out() {
        let attacks: [&[u8]; 12] = [
            b"\x1b]052;c;QQ==\x07",
            b"\x1b]0;t\x1b]52;c;QQ==\x07",
            b"\x1b]0;t\x18\x1b]52;c;QQ==\x07",
            b"\x1b]2;t\x1a\x1b]52;c;QQ==\x1b\\",
            b"\x1b]\x1b]52;c;QQ==\x07",
            b"\x1b]0;t\x1bPtmux;\x1b\x1b]52;c;QQ==\x07\x1b\\",
            b"\x1b]0;t\x1b_Gf=100;QQ==\x1b\\",
            b"\xc2\x9d52;c;QQ==\x07",
            b"\x9d52;c;QQ==\x9c",
            b"\xc2\x90tmux;QQ==\xc2\x9c",
            b"\x1b]1337;File=name=x:QQ==\x07",
            b"\x1b]5113;QQ==\x07\x1b]777;notify;QQ==\x07\x1b]9;QQ==\x07",
        ];
        for attack in attacks {
            for at in 0..=attack.len() {
                let out = through(&[&attack[..at], &attack[at..]]);
                let seen = String::from_utf8_lossy(&out);
                assert!(
                    !seen.contains("QQ==") && !out.iter().any(|b| (0x80..=0x9f).contains(b)),
                    "{:?} split at {at} gave {seen:?}",
                    String::from_utf8_lossy(attack)
                );
            }
        }
    }

    /// Whether `out` is safe for any terminal, judged without the filter's own states: valid
    /// UTF-8 with no C1 control in it; every ESC followed by a byte 0x20 to 0x7E; no DCS, APC,
    /// PM or SOS; every OSC exactly `ESC ] d ;` with d one of 0 1 2 7 8, then no C0 control but
    /// its end (BEL, the ESC of ST, or CAN or SUB, which cancel it), and a link only to the web.
    fn unsafe_part(out: &[u8]) -> Option<String> {
        let text = match std::str::from_utf8(out) {
            Ok(text) => text,
            Err(e) => return Some(format!("not UTF-8: {e}")),
        };
        if text.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)) {
            return Some("a C1 control".into());
        }
        let mut i = 0;
        while i < out.len() {
            if out[i] == ESC {
                let next = out.get(i + 1).copied().unwrap_or(0);
                if !(0x20..=0x7e).contains(&next)
                    || b"P_^X".contains(&next)
                    || ((0x20..=0x2f).contains(&next) && !b"()*+-./#".contains(&next))
                {
                    return Some(format!("ESC {next:#04x} at {i}"));
                }
                if next == b']' {
                    let head = out.get(i + 2..i + 4).unwrap_or_default();
                    if head.len() < 2 || !b"01278".contains(&head[0]) || head[1] != b';' {
                        return Some(format!("OSC {:?} at {i}", String::from_utf8_lossy(head)));
                    }
                    let body = i + 4;
                    i = body;
                    while i < out.len() && ![BEL, ESC, CAN, SUB].contains(&out[i]) {
                        if out[i] < 0x20 || out[i] == 0x7f {
                            return Some(format!("control {:#04x} inside an OSC at {i}", out[i]));
                        }
                        i += 1;
                    }
                    if head[0] == b'8' {
                        let uri = out[body..i].splitn(2, |&b| b == b';').nth(1).unwrap_or_default();
                        if !uri.is_empty() && !uri.starts_with(b"http://") && !uri.starts_with(b"https://") {
                            return Some(format!("a link to {:?}", String::from_utf8_lossy(uri)));
                        }
                    }
                    continue;
                }
            }
            i += 1;
        }
        None
    }

    /// What a third red team got past the second filter, all of it after tmux passthrough has
    /// unwrapped it: terminals stay in their escape state across C0 controls, DEL and high bytes
    /// (xterm reads ESC Ý as ESC ]), read any number of digits (0000000052 is 52), skip controls
    /// between them, and a Latin-1 terminal takes a C1 control hidden as a continuation byte.
    #[test]
    fn what_real_terminals_parse_differently_gets_nothing_out_either() {
        let attacks: [&[u8]; 20] = [
            b"\x1b\x07]52;c;QQ==\x07",
            b"\x1b\x7f]52;c;QQ==\x07",
            b"\x1b\xc3\xa9]52;c;QQ==\x07",
            b"\x1b\xc3\x9d52;c;QQ==\x07",
            b"\x1b\x07Pq#0;QQ==\x1b\x07\\",
            b"\x1b\x07_Gf=100;QQ==\x1b\\",
            b"\x1b]0000000052;c;QQ==\x07",
            b"\x1b]0\x0152;c;QQ==\x07",
            b"\x1b]0;t\x01\x1b\x07]52;c;QQ==\x07",
            b"\xe0\x9d52;c;QQ==\x07",
            b"\xc3\x9d52;c;QQ==\x07",
            b"\xc0\x9d52;c;QQ==\x07",
            b"\xf8\x9d\x9d52;c;QQ==\x07",
            b"\xc3\x1b]52;c;QQ==\x07",
            // A fourth: out of UTF-8, where U+00DD (C3 9D) is C3 and an 8-bit OSC.
            b"\x1b%@\xc3\x9d52;c;QQ==\x07\x1b%G",
            b"\x1b%\x07@\xc3\x90q;QQ==\xc3\x9c",
            b"\x1b G\x1b %@",
            b"\x1b]8;;file:///home/u/proj/run.command\x1b\\https://x.test\x1b]8;;\x1b\\",
            b"\x1b]8;;javascript:QQ==\x07",
            b"\x1b]8;;https://x.test/\x01\x1b]52;c;QQ==\x07",
        ];
        let mut all = Vec::new();
        for attack in attacks {
            all.extend_from_slice(attack);
            for at in 0..=attack.len() {
                let out = through(&[&attack[..at], &attack[at..]]);
                if let Some(part) = unsafe_part(&out) {
                    panic!("{attack:?} split at {at} gave {out:?}: {part}");
                }
            }
        }
        // Together, and after ordinary output: the same.
        let mut stream = b"\x1b[1mbold\x1b[0m \x1b]2;title\x07 \xc3\xa9 ".to_vec();
        stream.extend_from_slice(&all);
        let out = through(&[&stream]);
        assert_eq!(unsafe_part(&out), None, "{out:?}");
        assert!(out.starts_with(b"\x1b[1mbold\x1b[0m \x1b]2;title\x07 \xc3\xa9 "), "{out:?}");
        // The predicate itself catches what it must.
        for bad in [
            &b"\x1b]52;c;QQ==\x07"[..],
            b"\x1b\x07]",
            b"\x1bPq",
            b"\xc2\x9d",
            b"\x9d",
            b"\x1b]0;a\x01b\x07",
            b"\x1b%@",
            b"\x1b G",
            b"\x1b]8;;file:///x\x1b\\",
        ] {
            assert!(unsafe_part(bad).is_some(), "{bad:?}");
        }
    }

    /// A string or a sequence the agent left open when the stream ended is closed, so that it
    /// does not swallow what the user types next.
    #[test]
    fn the_end_closes_what_the_agent_left_open() {
        let mut open = Sanitizer::default();
        assert_eq!(open.filter(b"\x1b]2;never closed"), b"\x1b]2;never closed");
        assert_eq!(open.finish(), b"\x1b\\\x18");
        let mut link = Sanitizer::default();
        assert_eq!(link.filter(b"\x1b]8;;https://x.test/unfinished"), b"", "a link is held until it ends");
        assert_eq!(link.finish(), b"\x18");
        assert!(END.starts_with(b"\x1b<\x1b]8;;\x1b\\"), "the end leaves VT52 and ends a link first");
        // S7C1T (ESC SP F) asks for 7-bit answers: ours to send, never the agent's (dropped).
        let s7c1t = END.windows(3).position(|w| w == b"\x1b F").expect("END sends S7C1T");
        assert_eq!(unsafe_part(&[&END[..s7c1t], &END[s7c1t + 3..]].concat()), None);
        assert_eq!(unsafe_part(END_AFTER_A_CRASH), None);
        let mut csi = Sanitizer::default();
        assert_eq!(csi.filter(b"\x1b[1;"), b"\x1b[1;");
        assert_eq!(csi.finish(), b"\x18", "CAN cancels the CSI");
        assert_eq!(csi.filter(b"ok"), b"ok", "and the filter starts afresh");
    }

    /// Random streams over the bytes that matter (a fixed seed, so a failure repeats), split at
    /// random, with the end appended: the output is always safe.
    #[test]
    fn random_streams_give_safe_output() {
        const ALPHABET: &[u8] =
            b"\x1b\x07\x18\x1a\x01\x7f]P_^X\\% @G(#0125789;c:/hs.a\x80\x90\x9c\x9d\xc2\xc3\xe0\xf0\xa0\xbf";
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200_000 {
            let len = (next() % 40) as usize;
            let stream: Vec<u8> =
                (0..len).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize]).collect();
            let at = (next() as usize) % (len + 1);
            let mut sanitizer = Sanitizer::default();
            let mut out = sanitizer.filter(&stream[..at]);
            out.extend(sanitizer.filter(&stream[at..]));
            out.extend(sanitizer.finish());
            if let Some(part) = unsafe_part(&out) {
                panic!("{stream:?} split at {at} gave {out:?}: {part}");
            }
        }
    }
}
