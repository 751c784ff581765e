//! After a HelloRetryRequest: the client's second ClientHello must name the host its first did,
//! judged before a byte of it reaches the server (`TlsRetry`), and how the server's first bytes
//! tell that it asked for one (`hello_retry`).

use super::{CONTENT_HANDSHAKE, ClientBytes, MAX_FIRST_BYTES, Sniffed, sniff};

/// The random of a ServerHello that is a HelloRetryRequest (RFC 8446 §4.1.3).
pub(super) const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91, 0xc2,
    0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];
const CONTENT_CHANGE_CIPHER_SPEC: u8 = 20;
const CONTENT_ALERT: u8 = 21;

/// Whether the server's first bytes are a HelloRetryRequest, which lets the client send a
/// second ClientHello; None while too few have come to tell.
pub fn hello_retry(server: &[u8]) -> Option<bool> {
    match server.first() {
        None => None,
        Some(&CONTENT_HANDSHAKE) if server.len() < 43 => None,
        // Record header (5), handshake header (4), legacy version (2), then the random.
        Some(&CONTENT_HANDSHAKE) => Some(server[5] == 2 && server[11..43] == HELLO_RETRY_RANDOM),
        Some(_) => Some(false),
    }
}

/// A TLS client's bytes after a HelloRetryRequest: the second ClientHello (after an optional
/// change_cipher_spec) must name the host the first did. A server would otherwise pick its site
/// by the second name (OpenSSL asks its name callback again), a name nobody checked.
#[derive(Debug)]
pub struct TlsRetry {
    name: String,
    /// Bytes not yet judged (of which the first `held_sent` were sent on already).
    held: Vec<u8>,
    held_sent: usize,
    done: bool,
    refused: Option<&'static str>,
    refused_host: Option<String>,
}

impl TlsRetry {
    /// After `first` (the first ClientHello's records, and whatever came with them, all sent on
    /// already), for a connection allowed for `name`. [`sniff`] allows a ClientHello only when
    /// its records end where it does; were anything after them, it is held as sent and judged
    /// with what follows, never passed because a record header announced it.
    pub fn new(name: &str, first: &[u8]) -> TlsRetry {
        let mut at = 0;
        while let Some(header) = first.get(at..at + 5) {
            let end = at + 5 + usize::from(u16::from_be_bytes([header[3], header[4]]));
            if end > first.len() {
                break;
            }
            at = end;
        }
        let held = first[at..].to_vec();
        // Bytes of a record begun but not whole: nothing to judge them by.
        let whole = held.is_empty() || held[0] != CONTENT_HANDSHAKE;
        TlsRetry {
            name: name.to_ascii_lowercase(),
            held_sent: held.len(),
            held,
            done: false,
            refused: (!whole).then_some("the first ClientHello's records were not whole"),
            refused_host: None,
        }
    }

    /// Sends on the first `n` held bytes (those not already sent).
    fn release(&mut self, n: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.held[self.held_sent.min(n)..n]);
        self.held_sent = self.held_sent.saturating_sub(n);
        self.held.drain(..n);
    }

    /// Judges the held bytes: a change_cipher_spec is held with the hello after it, so that
    /// nothing of a refused retry reaches the server (which could answer it first).
    fn judge(&mut self, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let mut at = 0;
        while self.held.len() >= at + 5 {
            let rest = &self.held[at..];
            let len = 5 + usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            match rest[0] {
                CONTENT_CHANGE_CIPHER_SPEC if rest.len() >= len => at += len,
                CONTENT_CHANGE_CIPHER_SPEC => return Ok(()),
                CONTENT_HANDSHAKE => {
                    let prefix = handshake_prefix(rest);
                    return match sniff(&rest[..prefix]) {
                        // More handshake records may come, unless another record came after them.
                        Sniffed::NeedMore
                            if self.held.len() < MAX_FIRST_BYTES
                                && rest.get(prefix).is_none_or(|&t| t == CONTENT_HANDSHAKE) =>
                        {
                            Ok(())
                        }
                        Sniffed::Tls { name, .. } if name.eq_ignore_ascii_case(&self.name) => {
                            self.done = true;
                            self.release(self.held.len(), out);
                            Ok(())
                        }
                        Sniffed::Tls { name, .. } => {
                            self.refused_host = Some(name);
                            Err("a second ClientHello names another host")
                        }
                        Sniffed::Refused(why) => Err(why),
                        _ => Err("no second ClientHello within the first bytes"),
                    };
                }
                // Not an end the server must honour: a TLS 1.3 server built on OpenSSL reads
                // past a `user_canceled` alert to the second hello and picks its site by that
                // hello's name. So an alert before the hello has been judged ends the
                // connection, and neither it nor anything after it reaches the server.
                CONTENT_ALERT => return Err("an alert before the second ClientHello was judged"),
                _ => return Err("a record other than the second ClientHello the server asked for"),
            }
        }
        Ok(())
    }
}

/// How far `bytes` are complete handshake records, and the start of one not yet complete.
fn handshake_prefix(bytes: &[u8]) -> usize {
    let mut at = 0;
    while bytes.get(at) == Some(&CONTENT_HANDSHAKE) {
        let Some(len) = bytes.get(at + 3..at + 5) else { return bytes.len() };
        let end = at + 5 + usize::from(u16::from_be_bytes([len[0], len[1]]));
        if end > bytes.len() {
            return bytes.len();
        }
        at = end;
    }
    at
}

impl ClientBytes for TlsRetry {
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Option<&'static str>) {
        if let Some(reason) = self.refused {
            return (Vec::new(), Some(reason));
        }
        if self.done {
            return (bytes.to_vec(), None);
        }
        let mut out = Vec::new();
        self.held.extend_from_slice(bytes);
        if let Err(reason) = self.judge(&mut out) {
            self.refused = Some(reason);
            self.held.clear();
            return (out, Some(reason));
        }
        if self.done {
            let rest = std::mem::take(&mut self.held);
            out.extend_from_slice(&rest[self.held_sent.min(rest.len())..]);
        }
        (out, None)
    }
    fn refused_host(&self) -> Option<&str> {
        self.refused_host.as_deref()
    }
}
