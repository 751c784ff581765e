//! What reaches the user's terminal from the agent's session: the output filter both ways of
//! attaching apply (sandbox-init's `sandbox-attach`, as root, between the session's terminal and
//! the user's; and the launcher's `attach`, again, on the user's side). A policy like the
//! allowlist: what the agent may send the person watching it.

/// What the session sends the user's terminal, less what the agent could use against it. The
/// agent owns its tmux server, so it can turn tmux's own filtering off; this filter parses the
/// stream as terminals do (ECMA-48: an ESC ends any string, CAN and SUB cancel one; OSC numbers
/// are integers) and lets through:
/// - text, and escape and control sequences (colours, cursor, modes);
/// - OSC 0, 1, 2 (titles), 7 (the working folder) and 8 (hyperlinks), and no other OSC: not 52
///   (the clipboard), 1337, 5113 or 5522 (files), 9 or 777 (notifications);
/// - no DCS, APC, PM or SOS string (passthrough to the outer terminal, graphics, vendor
///   commands); a C1 control, raw or UTF-8 encoded, is judged (and sent) as its 7-bit form.
///
/// It works byte by byte, so a sequence split across chunks is judged whole.
#[derive(Debug, Default)]
pub struct Sanitizer {
    state: State,
    /// UTF-8 continuation bytes still due (a byte 0x80–0x9F that is not one is a C1 control).
    continuation: u8,
    /// A 0xC2 lead held back: followed by 0x80–0x9F it encodes a C1 control.
    lead_c2: bool,
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
    /// In a DCS, APC, PM or SOS string: dropped.
    Dropped,
    DroppedEscape,
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
            // First, C1 controls out, raw or UTF-8 encoded.
            if self.lead_c2 {
                self.lead_c2 = false;
                if (0x80..=0x9f).contains(&byte) {
                    self.continuation = 0;
                    self.c1(byte, &mut out);
                    continue;
                }
                self.step(0xc2, &mut out);
                self.continuation = 1;
            }
            match byte {
                0xc2 => {
                    self.lead_c2 = true;
                    continue;
                }
                0x80..=0xbf if self.continuation > 0 => self.continuation -= 1,
                0x80..=0x9f => {
                    self.c1(byte, &mut out);
                    continue;
                }
                0xc0..=0xdf => self.continuation = 1,
                0xe0..=0xef => self.continuation = 2,
                0xf0..=0xf7 => self.continuation = 3,
                _ => self.continuation = 0,
            }
            self.step(byte, &mut out);
        }
        out
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
                _ => {
                    out.extend_from_slice(&[ESC, byte]);
                    State::Text
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
                    let number = std::str::from_utf8(&head).ok().and_then(|h| h.parse::<u32>().ok());
                    let passes = !head.is_empty() && number.is_some_and(|n| PASSING_OSC.contains(&n));
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
                    if passes {
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
}
