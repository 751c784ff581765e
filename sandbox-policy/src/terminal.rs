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
/// - text, and escape and control sequences (colours, cursor, modes), but no window operation
///   (`CSI … t`: moving, resizing, iconifying the window, reporting its title);
/// - OSC 0, 1, 2 (titles), and no other OSC: not 52 (the clipboard), 7 (the folder new tabs
///   open in, on the user's machine), 1337, 5113 or 5522 (files), 9 or 777 (notifications), and
///   not 8 (hyperlinks): a link opens, on a click, an address the agent chose under text it
///   chose, and no filter of the stream can hold the two together, since the text's cells can be
///   overwritten after the link has passed (a cursor move, a carriage return, an insert) while
///   the terminal keeps the link on the cells that remain. The text passes; terminals make a
///   visible address clickable themselves, from what the screen shows when it is clicked;
/// - no DCS, APC, PM or SOS string (passthrough to the outer terminal, graphics, vendor
///   commands); a C1 control, raw or UTF-8 encoded, is judged (and sent) as its 7-bit form;
/// - what is not valid UTF-8 as U+FFFD; an ESC only with a byte 0x20 to 0x7E after it (terminals
///   read ESC, a control, then `]` as OSC); an OSC only as one digit and `;`, with no control
///   inside.
///
/// Queries whose answers the terminal types into the session pass: device attributes (`CSI c`)
/// and status reports (`CSI n`). Their answers have fixed forms that carry nothing the agent
/// chose, and tmux's client and full-screen programs need them to learn the terminal. The one
/// report that would echo the agent's text, the window title's (`CSI 21 t`), is a window
/// operation and dropped.
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
    /// In an escape sequence that is dropped whole (`ESC %`, `ESC SP`: the terminal's encoding
    /// and its 8-bit controls), until its final byte.
    EscDropped,
    /// In a control sequence (`ESC [`), its parameters and intermediates so far, held until its
    /// final byte says what it is; dropped if it grew past [`MAX_CSI`].
    Csi(Vec<u8>),
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

/// The longest control sequence that passes.
const MAX_CSI: usize = 64;

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

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
/// OSC numbers that pass: titles.
const PASSING_OSC: [u32; 3] = [0, 1, 2];

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
                b'[' => State::Csi(Vec::new()),
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
            State::Csi(mut sequence) => match byte {
                // Parameters and intermediates.
                0x20..=0x3f => {
                    sequence.push(byte);
                    State::Csi(sequence)
                }
                // The final byte: a window operation is dropped, anything else goes out whole
                // (a long one is dropped: no terminal needs it, some would misread it).
                0x40..=0x7e => {
                    if byte != b't' && sequence.len() <= MAX_CSI {
                        out.extend_from_slice(&[ESC, b'[']);
                        out.extend_from_slice(&sequence);
                        out.push(byte);
                    }
                    State::Text
                }
                ESC => State::Escape,
                // Cancelled: nothing of it was sent, so nothing is left to cancel.
                CAN | SUB => State::Text,
                // Terminals carry out a C0 control inside a sequence and go on with the sequence.
                0x00..=0x1f => {
                    out.push(byte);
                    State::Csi(sequence)
                }
                // DEL is ignored there; anything else ends it unsent, and is text.
                0x7f => State::Csi(sequence),
                _ => {
                    self.state = State::Text;
                    return self.step(byte, out);
                }
            },
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
mod tests;
