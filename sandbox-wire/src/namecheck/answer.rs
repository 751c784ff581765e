//! What the checker says to a connection it refuses, in the protocol the client spoke, so that
//! the refusal explains itself where it is seen (often by an agent reading its tool's output)
//! instead of arriving as a bare reset: a plain HTTP request gets a `403` whose short body names
//! the reason and where the user decides; a TLS ClientHello gets a fatal `access_denied` alert
//! (RFC 8446 §6.2), which clients print as such. Anything else is reset, as before: no reply is
//! written in a protocol the checker did not recognise.
//!
//! The reason is the agent's to read, so it says what the agent sent and which of a few kinds of
//! refusal it met, never PID 1's detailed reason (which patterns opened an address, which names
//! the forwarder holds, what is left of a budget: the user's `agent-sandbox why` says that). It
//! quotes the name, so it is made one line of safe characters for the body and plain ASCII for
//! the header, where no CR or LF can end it early.
//!
//! Any server can send the same bytes: the header is a hint for tools, not proof that the
//! sandbox refused (`verify` takes a refusal only with its peers' logs showing nothing arrived).

use sandbox_policy::text::one_line;

use crate::tls::CONTENT_HANDSHAKE;

/// The header that marks a 403 as the sandbox's refusal rather than a server's, with the reason
/// as its value: probes and `verify` tell the two apart by it.
pub const REFUSED_HEADER: &str = "X-Agent-Sandbox-Refused";

/// A TLS alert record: content type 21, version 3.3 (what TLS 1.2 and 1.3 records carry), two
/// bytes of payload: level fatal (2), description access_denied (49).
pub const ACCESS_DENIED_ALERT: [u8; 7] = [21, 3, 3, 0, 2, 2, 49];

/// The most characters of the reason an answer quotes.
const MAX_REASON: usize = 300;

/// The agent's reason for a connection PID 1 refused by its name: which name, and that the
/// policy decides (the detail is the user's).
pub fn not_allowed(name: &str) -> String {
    format!("{name} is not allowed here by this sandbox's network policy")
}

/// The bytes to answer a refused connection with, given the first bytes it sent and the reason;
/// None: the protocol is not one the checker answers in, so the connection is reset.
pub fn refusal_answer(first: &[u8], reason: &str) -> Option<Vec<u8>> {
    match first.first() {
        Some(&CONTENT_HANDSHAKE) => Some(ACCESS_DENIED_ALERT.to_vec()),
        Some(_) if super::looks_like_http(first) => Some(forbidden(reason, first.starts_with(b"HEAD "))),
        _ => None,
    }
}

/// A complete HTTP/1.1 403 response that closes the connection; to a HEAD, without its body.
fn forbidden(reason: &str, head_only: bool) -> Vec<u8> {
    let reason = one_line(reason, MAX_REASON);
    let header: String = reason.chars().map(|c| if c.is_ascii() { c } else { '?' }).collect();
    let body = format!(
        "agent-sandbox refused this connection: {reason}.\n\
         Only the user decides what this sandbox reaches; on the host, `agent-sandbox why` tells \
         them why this was refused.\n"
    );
    let mut answer = format!(
        "HTTP/1.1 403 Forbidden\r\n\
         Content-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\n\
         Cache-Control: no-store\r\n\
         Connection: close\r\n\
         {REFUSED_HEADER}: {header}\r\n\
         \r\n",
        body.len()
    );
    if !head_only {
        answer.push_str(&body);
    }
    answer.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_request_gets_a_403_that_closes_and_names_the_reason() {
        let answer =
            refusal_answer(b"GET / HTTP/1.1\r\nHost: blocked.test\r\n\r\n", &not_allowed("blocked.test"))
                .expect("an HTTP request is answered");
        let text = String::from_utf8(answer.clone()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{head}");
        assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
        assert!(head.contains(&format!("\r\n{REFUSED_HEADER}: {}", not_allowed("blocked.test"))), "{head}");
        assert!(head.contains(&format!("\r\nContent-Length: {}", body.len())), "{head}");
        assert!(body.contains(&not_allowed("blocked.test")), "{body}");
        assert!(body.contains("agent-sandbox why") && !body.contains("agent-sandbox allow"), "{body}");
        // To a HEAD, the same head and no body.
        let head_only = refusal_answer(b"HEAD / HTTP/1.1\r\nHost: blocked.test\r\n\r\n", "x").unwrap();
        let head_only = String::from_utf8(head_only).unwrap();
        assert!(
            head_only.starts_with("HTTP/1.1 403 Forbidden\r\n") && head_only.ends_with("\r\n\r\n"),
            "{head_only}"
        );
        // Every header a field line of ASCII, as a client's parser reads them.
        for line in head.split("\r\n").skip(1) {
            let (name, value) = line.split_once(": ").expect(line);
            assert!(name.bytes().all(crate::http1::is_tchar) && value.is_ascii(), "{line}");
        }
    }

    #[test]
    fn what_the_agent_put_in_the_reason_cannot_break_the_header_or_the_terminal() {
        let reason = "evil\r\nSet-Cookie: x=1\u{1b}]52;c;AAAA\u{7}\u{202e} é is not in the allowlist";
        let text = String::from_utf8(refusal_answer(b"POST / HTTP/1.1\r\n", reason).unwrap()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(!head.contains("\r\nSet-Cookie"), "{head}");
        assert_eq!(head.matches("\r\n").count(), 5, "{head}");
        let value = head.lines().find_map(|l| l.strip_prefix(&format!("{REFUSED_HEADER}: "))).unwrap();
        assert!(value.is_ascii() && !value.chars().any(|c| c.is_ascii_control()), "{value:?}");
        assert!(
            !body.contains('\u{1b}') && !body.contains('\u{7}') && !body.contains('\u{202e}'),
            "{body:?}"
        );
        assert!(body.contains("é is not in the allowlist"), "{body}");
    }

    #[test]
    fn a_refused_hello_gets_a_fatal_access_denied_alert_and_anything_else_a_reset() {
        assert_eq!(refusal_answer(&[22, 3, 1, 0, 5], "x").unwrap(), [21, 3, 3, 0, 2, 2, 49]);
        assert_eq!(refusal_answer(b"SSH-2.0-OpenSSH\r\n", "x"), None);
        assert_eq!(refusal_answer(b"", "x"), None);
    }
}
