//! The TLS ClientHello as the name check reads it: its records reassembled, and its one server
//! name (RFC 6066), strictly. Anything a server might read differently from this reader (a
//! duplicate extension, two names, bytes past the hello in its records) is refused.

/// The most bytes a ClientHello may take: one with post-quantum key shares is under 2 KiB.
pub const MAX_HELLO: usize = 64 * 1024;
/// A TLS record's payload is at most 2^14 bytes (RFC 8446 §5.1).
const MAX_RECORD: usize = 1 << 14;
pub const CONTENT_HANDSHAKE: u8 = 22;
pub(crate) const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
pub(crate) const EXTENSION_ECH: u16 = 0xfe0d;

/// What a ClientHello names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The server name, lower-cased.
    pub name: String,
    /// It carries an encrypted ClientHello, whose outer name `name` is.
    pub ech: bool,
}

/// The handshake bytes of consecutive handshake records, and whether the records so far are
/// complete.
fn handshake_bytes(mut bytes: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
    let mut handshake = Vec::new();
    loop {
        if bytes.len() < 5 {
            return Ok((handshake, bytes.is_empty()));
        }
        if bytes[0] != CONTENT_HANDSHAKE {
            return Err("a record other than the handshake before the ClientHello ended");
        }
        if bytes[1] != 3 {
            return Err("not a TLS record");
        }
        let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
        if len == 0 || len > MAX_RECORD {
            return Err("a TLS record of impossible length");
        }
        let Some(fragment) = bytes.get(5..5 + len) else {
            handshake.extend_from_slice(&bytes[5..]);
            return Ok((handshake, false));
        };
        handshake.extend_from_slice(fragment);
        bytes = &bytes[5 + len..];
    }
}

/// The ClientHello in the handshake records at the start of `bytes`; None while it is not
/// whole.
pub fn client_hello(bytes: &[u8]) -> Result<Option<Hello>, &'static str> {
    let (handshake, complete) = handshake_bytes(bytes)?;
    if handshake.len() < 4 {
        return Ok(None);
    }
    if handshake[0] != HANDSHAKE_CLIENT_HELLO {
        return Err("the first handshake message is not a ClientHello");
    }
    let len = usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]);
    if len + 4 > MAX_HELLO {
        return Err("a ClientHello longer than the check reads");
    }
    let Some(body) = handshake.get(4..4 + len) else { return Ok(None) };
    if handshake.len() > 4 + len || !complete {
        // Another handshake message after the ClientHello, in its first flight, or a record
        // that goes on past it (longer than the ClientHello, or the header of the next one):
        // not TLS as any client speaks it, and bytes the check would not have read. A second
        // ClientHello sent there after a HelloRetryRequest would reach the server unjudged.
        return Err("bytes after the ClientHello in its records");
    }
    let (name, ech) = server_name(body)?;
    Ok(Some(Hello { name, ech }))
}

/// A reader over a ClientHello body that refuses to run past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if self.0.len() < n {
            return Err("a truncated ClientHello");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one- or two-byte length prefix.
    fn vector(&mut self, prefix: usize) -> Result<&'a [u8], &'static str> {
        let len = if prefix == 1 { usize::from(self.u8()?) } else { usize::from(self.u16()?) };
        self.take(len)
    }
}

/// The ClientHello's server name (RFC 6066 §3): exactly one host_name, in exactly one
/// server_name extension, and whether an encrypted_client_hello extension is present.
fn server_name(body: &[u8]) -> Result<(String, bool), &'static str> {
    let mut r = Reader(body);
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    if r.vector(1)?.len() > 32 {
        return Err("a session id longer than 32 bytes");
    }
    let suites = r.vector(2)?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("malformed cipher suites");
    }
    if r.vector(1)?.is_empty() {
        return Err("no compression methods");
    }
    if r.0.is_empty() {
        return Err("a ClientHello without extensions, so without a server name");
    }
    let extensions = r.vector(2)?;
    if !r.0.is_empty() {
        return Err("bytes after the ClientHello's extensions");
    }
    let mut r = Reader(extensions);
    let mut seen = std::collections::HashSet::new();
    let (mut name, mut ech) = (None, false);
    while !r.0.is_empty() {
        let kind = r.u16()?;
        let data = r.vector(2)?;
        if !seen.insert(kind) {
            return Err("a repeated ClientHello extension");
        }
        match kind {
            EXTENSION_SERVER_NAME => name = Some(host_name(data)?),
            EXTENSION_ECH => ech = true,
            _ => {}
        }
    }
    let name = name.ok_or("no server name (SNI) in the ClientHello")?;
    Ok((name, ech))
}

fn host_name(data: &[u8]) -> Result<String, &'static str> {
    let mut r = Reader(data);
    let list = r.vector(2)?;
    if !r.0.is_empty() {
        return Err("bytes after the server name list");
    }
    let mut r = Reader(list);
    if r.u8()? != 0 {
        return Err("a server name that is not a host name");
    }
    let name = r.vector(2)?;
    if !r.0.is_empty() {
        return Err("more than one server name");
    }
    valid_host(name).ok_or("a server name that is not a valid host name")
}

/// A host name as it may appear on the wire: ASCII letters, digits, `-`, `_` and inner dots,
/// lower-cased; no trailing dot (RFC 6066 forbids it), no address literal.
pub fn valid_host(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| !l.is_empty() && l.len() <= 63)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && name.parse::<std::net::Ipv4Addr>().is_err();
    ok.then(|| name.to_ascii_lowercase())
}
