//! The output filter's tests: every payload red teams found, split at every byte and judged
//! by a predicate of its own, and random streams.

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
        through(&[b"a\x1b]8;;https://x.test\x1b\\x.test\x1b]8;;\x1b\\b"]),
        b"ax.testb",
        "a link: its text"
    );
    assert_eq!(through(&[b"a\x1b]52;c;SGVsbG8=\x07b"]), b"ab");
    assert_eq!(through(&[b"\x1b(B\x1b[m\x1b(0qq\x1b(B"]), b"\x1b(B\x1b[m\x1b(0qq\x1b(B", "character sets");
    assert_eq!(
        through(&[b"\x1b]8;id=1;https://x.test/a\x07\x1b[1mx.test\x1b[0m/a\x1b]8;;\x07"]),
        b"\x1b[1mx.test\x1b[0m/a",
        "a web link: its text, with its colours"
    );
    assert_eq!(through(&[b"a\x1b]8;;file:///etc/passwd\x1b\\l\x1b]8;;\x1b\\b"]), b"alb");
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
/// PM or SOS; no window operation (a CSI ending in `t`); every OSC exactly `ESC ] d ;` with d
/// one of 0 1 2 (no link), then no C0 control but its end (BEL, the ESC of ST, or CAN or SUB,
/// which cancel it).
fn unsafe_part(out: &[u8]) -> Option<String> {
    if let Some(part) = window_operation(out) {
        return Some(part);
    }
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
                // The end of a link (`8;;` and nothing), which END sends, opens none.
                let link_end = out.get(i + 2..i + 5) == Some(b"8;;")
                    && matches!(out.get(i + 5), Some(&BEL) | Some(&ESC));
                if !link_end && (head.len() < 2 || !b"012".contains(&head[0]) || head[1] != b';') {
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
                continue;
            }
        }
        i += 1;
    }
    None
}

/// A CSI ending in `t` anywhere in `out`.
fn window_operation(out: &[u8]) -> Option<String> {
    let mut i = 0;
    while let Some(at) = out[i..].windows(2).position(|w| w == b"\x1b[").map(|p| p + i) {
        let end = out[at + 2..].iter().position(|b| (0x40..=0x7e).contains(b)).map(|p| p + at + 2)?;
        if out[end] == b't' {
            return Some(format!("a window operation at {at}"));
        }
        i = end;
    }
    None
}

/// Links (the agent shows one address over another; or to the user's own machine and network),
/// the folder new tabs open in, and window operations (a title report answers with text the
/// agent chose). Each is dropped, its text kept, split at every byte.
#[test]
fn links_and_what_acts_on_the_users_machine_are_dropped() {
    let lying: [&[u8]; 10] = [
        b"\x1b]8;;https://attacker.example/?d=c2VjcmV0\x1b\\https://docs.anthropic.com/en/docs\x1b]8;;\x1b\\",
        b"\x1b]8;;https://attacker.example/?d=c2VjcmV0\x07docs.anthropic.com.attacker.example\x1b]8;;\x07",
        b"\x1b]8;;https://attacker.example/?d=c2VjcmV0\x07attacker.example\x1b[17Ddocs.anthropic.com\x1b]8;;\x07",
        b"\x1b]8;;https://attacker.example/?d=c2VjcmV0\x07attacker.example\r docs.anthropic.com\x1b]8;;\x07",
        b"\x1b]8;;https://attacker.example/?d=c2VjcmV0\x07docs\x1b]8;;https://docs.anthropic.com/\x07docs.anthropic.com\x1b]8;;\x07",
        b"\x1b]8;;https://attacker.example/?d=c2VjcmV0\x07never closed",
        b"\x1b]8;;http://127.0.0.1:8080/admin\x07127.0.0.1\x1b]8;;\x07",
        b"\x1b]8;;http://localhost:3000/\x07localhost\x1b]8;;\x07",
        b"\x1b]8;;http://169.254.169.254/latest\x07169.254.169.254\x1b]8;;\x07",
        b"\x1b]8;;https://docs.anthropic.com@attacker.example/\x07docs.anthropic.com@attacker.example\x1b]8;;\x07",
    ];
    for attack in lying {
        for at in 0..=attack.len() {
            let mut sanitizer = Sanitizer::default();
            let mut out = sanitizer.filter(&attack[..at]);
            out.extend(sanitizer.filter(&attack[at..]));
            out.extend(sanitizer.finish());
            let seen = String::from_utf8_lossy(&out);
            let kept = seen.contains("\x1b]8;");
            assert!(!kept, "{:?} split at {at} kept a link: {seen:?}", String::from_utf8_lossy(attack));
        }
    }
    // Its text stays.
    assert_eq!(through(&[lying[0]]), b"https://docs.anthropic.com/en/docs");
    // No link passes, however honest its text: its cells can be overwritten once it has passed
    // (found by a second red team: the text `https://attacker.example/docs.anthropic.com`, then
    // a carriage return and `See the docs at: https://` over its start, leaves
    // `docs.anthropic.com` on the screen, linked to the attacker). Its text passes.
    let honest =
        b"\x1b]8;;https://docs.anthropic.com/en/docs\x1b\\https://docs.anthropic.com/en/docs\x1b]8;;\x1b\\";
    assert_eq!(through(&[honest]), b"https://docs.anthropic.com/en/docs");
    let overwritten = b"\x1b]8;;https://attacker.example/docs.anthropic.com\x1b\\https://attacker.example/docs.anthropic.com\x1b]8;;\x1b\\\rSee the docs at: https://";
    let shown = through(&[overwritten]);
    assert!(!shown.windows(4).any(|w| w == b"\x1b]8;"), "{:?}", String::from_utf8_lossy(&shown));
    // OSC 7 and window operations: dropped whole, around them the rest passes.
    assert_eq!(through(&[b"a\x1b]7;file://host/workspace\x1b\\b"]), b"ab");
    for window in [&b"\x1b[21t"[..], b"\x1b[8;1;1t", b"\x1b[2t", b"\x1b[>4;1t", b"\x1b[22;0t"] {
        assert_eq!(through(&[b"a", window, b"b"]), b"ab", "{window:?}");
    }
    // Status and attribute queries, cursor moves and modes pass.
    let queries: &[u8] = b"\x1b[6n\x1b[5n\x1b[c\x1b[>c\x1b[?1049h\x1b[10;5H\x1b[?25l\x1b[1;31mx\x1b[m";
    assert_eq!(through(&[queries]), queries);
    // The predicate catches what it must.
    for bad in [lying[0], lying[2], b"\x1b[21t", b"\x1b]7;file:///x\x07"] {
        assert!(unsafe_part(bad).is_some(), "{bad:?}");
    }
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
    assert_eq!(csi.filter(b"\x1b[1;"), b"", "a control sequence is held until its final byte");
    assert_eq!(csi.finish(), b"\x18", "CAN cancels what the terminal may hold");
    assert_eq!(csi.filter(b"ok"), b"ok", "and the filter starts afresh");
}

/// Random streams over the bytes that matter (a fixed seed, so a failure repeats), split at
/// random, with the end appended: the output is always safe.
#[test]
fn random_streams_give_safe_output() {
    const ALPHABET: &[u8] =
        b"\x1b\x07\x18\x1a\x01\x0d\x7f]P_^X\\% @G(#0125789;c:/hs.atmx[\x80\x90\x9c\x9d\xc2\xc3\xe0\xf0\xa0\xbf";
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..200_000 {
        let len = (next() % 40) as usize;
        let stream: Vec<u8> = (0..len).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize]).collect();
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
