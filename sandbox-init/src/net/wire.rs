//! The name a client speaks on the wire before any byte reaches the server: the `server_name` of
//! a TLS ClientHello (reassembled across records and segments), or the `Host` of an HTTP/1
//! request. Strict: anything a server might read differently from this parser (a duplicate
//! extension, two names, a Host that disagrees with an absolute URI, folded headers) is refused,
//! because the check is only as good as the agreement between the two readers. Pure: the
//! checker feeds it the bytes read so far.

/// The most bytes read before the name must be known: a ClientHello with post-quantum key
/// shares is under 2 KiB, and real request heads are well under this too.
pub const MAX_FIRST_BYTES: usize = 64 * 1024;
/// A TLS record's payload is at most 2^14 bytes (RFC 8446 §5.1).
const MAX_RECORD: usize = 1 << 14;
const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const EXTENSION_ECH: u16 = 0xfe0d;
/// An HTTP request head longer than this is refused.
const MAX_HEAD: usize = 16 * 1024;

/// What the first bytes of a connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet to decide.
    NeedMore,
    /// A TLS ClientHello naming `name`; `ech` when it carries an encrypted ClientHello, whose
    /// outer name is the one judged.
    Tls { name: String, ech: bool },
    /// An HTTP/1 request for `host`. The connection goes on through [`HttpRequests`], which
    /// checks every later request on it.
    Http { host: String },
    /// Refused, and why.
    Refused(&'static str),
}

/// Decides from the first bytes of a connection.
pub fn sniff(bytes: &[u8]) -> Sniffed {
    match bytes.first() {
        None => Sniffed::NeedMore,
        Some(&CONTENT_HANDSHAKE) => client_hello(bytes),
        Some(_) if looks_like_http(bytes) => http_request(bytes),
        Some(_) if bytes.len() < 8 && METHODS.iter().any(|m| m.as_bytes().starts_with(bytes)) => {
            Sniffed::NeedMore
        }
        Some(_) => Sniffed::Refused("neither a TLS ClientHello nor an HTTP request: no name to check"),
    }
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

fn client_hello(bytes: &[u8]) -> Sniffed {
    let (handshake, complete) = match handshake_bytes(bytes) {
        Ok(parts) => parts,
        Err(why) => return Sniffed::Refused(why),
    };
    if handshake.len() < 4 {
        return Sniffed::NeedMore;
    }
    if handshake[0] != HANDSHAKE_CLIENT_HELLO {
        return Sniffed::Refused("the first handshake message is not a ClientHello");
    }
    let len = usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]);
    if len + 4 > MAX_FIRST_BYTES {
        return Sniffed::Refused("a ClientHello longer than the check reads");
    }
    let Some(body) = handshake.get(4..4 + len) else { return Sniffed::NeedMore };
    if handshake.len() > 4 + len || !complete {
        // Another handshake message after the ClientHello, in its first flight, or a record
        // that goes on past it (longer than the ClientHello, or the header of the next one):
        // not TLS as any client speaks it, and bytes the check would not have read. A second
        // ClientHello sent there after a HelloRetryRequest would reach the server unjudged.
        return Sniffed::Refused("bytes after the ClientHello in its records");
    }
    match server_name(body) {
        Ok((name, ech)) => Sniffed::Tls { name, ech },
        Err(why) => Sniffed::Refused(why),
    }
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
fn valid_host(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| !l.is_empty() && l.len() <= 63)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && name.parse::<std::net::Ipv4Addr>().is_err();
    ok.then(|| name.to_ascii_lowercase())
}

const METHODS: [&str; 8] = ["GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "TRACE "];
/// Methods whose requests carry no body as clients send them; a body on one is refused.
const BODYLESS: [&str; 5] = ["GET", "HEAD", "OPTIONS", "TRACE", "DELETE"];

fn looks_like_http(bytes: &[u8]) -> bool {
    METHODS.iter().any(|m| bytes.starts_with(m.as_bytes()))
}

fn http_request(bytes: &[u8]) -> Sniffed {
    match request_head(bytes) {
        Ok(None) => Sniffed::NeedMore,
        Ok(Some(head)) => Sniffed::Http { host: head.host },
        Err(reason) => Sniffed::Refused(reason),
    }
}

/// One request head, checked.
#[derive(Debug, PartialEq, Eq)]
struct RequestHead {
    host: String,
    /// The head to send: the client's, less the headers that would turn the connection into
    /// another protocol (`Upgrade`, `Connection` and its kin).
    head: Vec<u8>,
    /// How many of the client's bytes the head took.
    len: usize,
    body: Body,
}

/// How a request's body is framed, as a server frames it (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Length(u64),
    Chunked,
}

/// The request head at the start of `bytes`; None while it is incomplete.
fn request_head(bytes: &[u8]) -> Result<Option<RequestHead>, &'static str> {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if bytes.len() > MAX_HEAD { Err("an HTTP request head too long to check") } else { Ok(None) };
    };
    let len = end + 4;
    if len > MAX_HEAD {
        return Err("an HTTP request head too long to check");
    }
    if !looks_like_http(bytes) {
        return Err("an HTTP request of a method that is not checked (CONNECT, PRI, …)");
    }
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| "an HTTP request head that is not text")?;
    // A bare CR or LF is a line break to some servers and not to this reader: a header hidden
    // behind one (a second Host) would be read by the server alone. No control byte but tab.
    if head.split("\r\n").any(|line| line.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)) {
        return Err("a control byte (a bare CR or LF) in an HTTP request head");
    }
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request_line.split(' ').collect();
    let [method, target, version] = parts[..] else { return Err("a malformed HTTP request line") };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err("an HTTP version other than 1.0 and 1.1");
    }
    let (mut host, mut length, mut chunked) = (None, None, false);
    let mut kept = vec![request_line.to_string()];
    for line in lines {
        if line.starts_with([' ', '\t']) {
            return Err("a folded HTTP header");
        }
        let (name, value) = line.split_once(':').ok_or("a malformed HTTP header")?;
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a malformed HTTP header name");
        }
        let value = value.trim_matches([' ', '\t']);
        match name.to_ascii_lowercase().as_str() {
            "host" if host.is_some() => return Err("more than one Host header"),
            "host" => host = Some(value.to_string()),
            "content-length" if length.is_some() => return Err("more than one Content-Length"),
            "content-length" => {
                let digits =
                    !value.is_empty() && value.len() <= 18 && value.bytes().all(|b| b.is_ascii_digit());
                length = Some(
                    digits
                        .then(|| value.parse::<u64>().ok())
                        .flatten()
                        .ok_or("a malformed Content-Length")?,
                );
            }
            // Only plain chunked: any other coding frames the body in a way this reader would
            // have to agree on with the server.
            "transfer-encoding" if chunked || !value.eq_ignore_ascii_case("chunked") => {
                return Err("a Transfer-Encoding other than chunked");
            }
            "transfer-encoding" => chunked = true,
            // Hop-by-hop: nothing of the client's may turn the connection into another protocol.
            "connection" | "keep-alive" | "proxy-connection" | "upgrade" => continue,
            _ => {}
        }
        kept.push(line.to_string());
    }
    let body = match (length, chunked) {
        (Some(_), true) => return Err("both Content-Length and Transfer-Encoding"),
        (Some(length), false) => Body::Length(length),
        (None, true) => Body::Chunked,
        (None, false) => Body::Length(0),
    };
    // A server that ignores the body of a method that has none (or leaves it unread) reads it
    // as the next request, one this reader took for body (CL.0 desync).
    if BODYLESS.contains(&method) && body != Body::Length(0) {
        return Err("a body on a GET, HEAD, OPTIONS, TRACE or DELETE, which a server may read as a request");
    }
    let host = host.ok_or("an HTTP request without a Host header")?;
    let host = authority_host(&host).ok_or("a Host that is not a host name")?;
    // An absolute URI names the host a server must use instead of Host (RFC 9112 §3.2.2),
    // whatever its scheme (nginx and Go take the host of `ws://other/` too): only http and
    // https are taken, and only naming the Host's host; a path or `*` otherwise.
    let absolute = ["http://", "https://"].iter().find_map(|scheme| {
        target.get(..scheme.len()).filter(|s| s.eq_ignore_ascii_case(scheme)).map(|_| &target[scheme.len()..])
    });
    if let Some(rest) = absolute {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority_host(authority).as_deref() != Some(host.as_str()) {
            return Err("an absolute URI naming another host than Host");
        }
    } else if (!target.starts_with('/') || target.starts_with("//")) && target != "*" {
        return Err("an HTTP request target of another form");
    }
    let mut head = kept.join("\r\n").into_bytes();
    head.extend_from_slice(b"\r\n\r\n");
    Ok(Some(RequestHead { host, head, len, body }))
}

/// The client's side of an HTTP/1 connection whose first request was allowed for `host`. Every
/// request head that follows must name the same host; bodies are framed as the server frames
/// them (Content-Length, or chunked), so that the next head is found where the server will read
/// it and no request rides unchecked inside another's body.
#[derive(Debug)]
pub struct HttpRequests {
    host: String,
    state: Framing,
    /// Bytes not yet forwarded because what they are depends on bytes not yet read.
    held: Vec<u8>,
    /// Why the connection ends, once a request broke the rule.
    refused: Option<&'static str>,
    /// The host that request named, if it named one.
    refused_host: Option<String>,
    /// The lines of the body being relayed.
    body: BodyLines,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
}

/// A chunk-size line or a trailer section longer than this is refused.
const MAX_CHUNK_LINE: usize = 1024;

impl HttpRequests {
    pub fn new(host: &str) -> HttpRequests {
        HttpRequests {
            host: host.to_string(),
            state: Framing::Head,
            held: Vec::new(),
            refused: None,
            refused_host: None,
            body: BodyLines::default(),
        }
    }

    /// The host of the request that ended the connection, if one named another host.
    pub fn refused_host(&self) -> Option<&str> {
        self.refused_host.as_deref()
    }

    /// Takes the client's next bytes: those to send on, and, once a request breaks the rule,
    /// why the connection ends there (what came before it still goes on; nothing after).
    pub fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Option<&'static str>) {
        if let Some(reason) = self.refused {
            return (Vec::new(), Some(reason));
        }
        self.held.extend_from_slice(bytes);
        let mut out = Vec::with_capacity(self.held.len());
        let mut at = 0;
        while at < self.held.len() {
            match self.step(at, &mut out) {
                Ok(Some(taken)) => at += taken,
                Ok(None) => break,
                Err(reason) => {
                    self.refused = Some(reason);
                    self.held.clear();
                    return (out, Some(reason));
                }
            }
        }
        self.held.drain(..at);
        (out, None)
    }

    /// One step over the held bytes from `at`: how many it took (adding what goes on to `out`),
    /// None if it needs more.
    fn step(&mut self, at: usize, out: &mut Vec<u8>) -> Result<Option<usize>, &'static str> {
        let rest = &self.held[at..];
        match self.state {
            Framing::Head => {
                let Some(head) = request_head(rest)? else { return Ok(None) };
                if head.host != self.host {
                    self.refused_host = Some(head.host);
                    return Err("a later request on the connection names another host");
                }
                out.extend_from_slice(&head.head);
                self.state = match head.body {
                    Body::Length(0) => Framing::Head,
                    Body::Length(n) => Framing::Body(n),
                    Body::Chunked => Framing::ChunkSize,
                };
                Ok(Some(head.len))
            }
            Framing::Body(left) | Framing::ChunkData(left) => {
                let take = rest.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                self.body.feed(&rest[..take], &self.host, out)?;
                let left = left - take as u64;
                self.state = match (self.state, left) {
                    (Framing::Body(_), 0) => {
                        self.body.end(&self.host, out)?;
                        Framing::Head
                    }
                    (Framing::Body(_), n) => Framing::Body(n),
                    (_, 0) => Framing::ChunkEnd,
                    (_, n) => Framing::ChunkData(n),
                };
                Ok(Some(take))
            }
            Framing::ChunkSize => {
                let Some(end) = line_end(rest, MAX_CHUNK_LINE)? else { return Ok(None) };
                let line = std::str::from_utf8(&rest[..end]).map_err(|_| "a malformed chunk size")?;
                let digits = line.split(';').next().unwrap_or_default().trim_matches([' ', '\t']);
                if digits.is_empty() || digits.len() > 15 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err("a malformed chunk size");
                }
                let size = u64::from_str_radix(digits, 16).map_err(|_| "a malformed chunk size")?;
                out.extend_from_slice(&rest[..end + 2]);
                self.state = if size == 0 { Framing::Trailers } else { Framing::ChunkData(size) };
                Ok(Some(end + 2))
            }
            Framing::ChunkEnd => {
                if rest.len() < 2 {
                    return Ok(None);
                }
                if &rest[..2] != b"\r\n" {
                    return Err("a chunk that does not end where its size says");
                }
                out.extend_from_slice(b"\r\n");
                self.state = Framing::ChunkSize;
                Ok(Some(2))
            }
            Framing::Trailers => {
                let Some(end) = line_end(rest, MAX_CHUNK_LINE)? else { return Ok(None) };
                if end == 0 {
                    self.body.end(&self.host, out)?;
                    self.state = Framing::Head;
                }
                out.extend_from_slice(&rest[..end + 2]);
                Ok(Some(end + 2))
            }
        }
    }
}

/// The lines of a request body, judged as a server would read them if it took the body for the
/// next request (a server that ignores a body, or answers before reading it): a request line,
/// or a `Host` line naming another host than the connection's, ends the connection. A line that
/// might be one is held until it ends, so no byte of it reaches the server before the verdict;
/// any other line goes on as it comes. JSON, compressed and binary bodies have no such lines.
#[derive(Debug, Default)]
struct BodyLines {
    /// The start of the current line, held while it might be a request line or a Host line.
    line: Vec<u8>,
    /// The current line cannot be either: its bytes pass until it ends.
    passing: bool,
}

impl BodyLines {
    fn feed(&mut self, mut bytes: &[u8], host: &str, out: &mut Vec<u8>) -> Result<(), &'static str> {
        while !bytes.is_empty() {
            if self.passing {
                let end = bytes.iter().position(|&b| b == b'\n').map_or(bytes.len(), |i| i + 1);
                out.extend_from_slice(&bytes[..end]);
                self.passing = bytes[end - 1] != b'\n';
                bytes = &bytes[end..];
                continue;
            }
            let b = bytes[0];
            bytes = &bytes[1..];
            self.line.push(b);
            if b == b'\n' {
                judge_body_line(&self.line, host)?;
                out.append(&mut self.line);
            } else if self.line.len() > MAX_HEAD {
                return Err("a line in a body too long to tell from a request");
            } else if !might_be_request_or_host(&self.line) {
                out.append(&mut self.line);
                self.passing = true;
            }
        }
        Ok(())
    }

    /// The body ended: a line held then is judged as it stands. A server that read it as the
    /// start of a request would read the next request's line after it, on the same line; that
    /// line is checked on its own, so the two make no target or Host the check did not see.
    /// A CR in it is refused: a server might end the line there.
    fn end(&mut self, host: &str, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let held = std::mem::take(&mut self.line);
        self.passing = false;
        if held.contains(&b'\r') {
            return Err("a body that ends inside what may be a request or Host line");
        }
        judge_body_line(&held, host)?;
        out.extend_from_slice(&held);
        Ok(())
    }
}

/// Whether a line starting with `start` may be a request line or a Host header line, as a
/// lenient server reads them: a method is any token (nginx proxies PROPFIND, Go takes any
/// token), so a line is held while it starts with a token and
/// what follows a space after it, past any CRs; or with `host:`, in any case.
fn might_be_request_or_host(start: &[u8]) -> bool {
    // Servers skip CRs (and LFs) before a request line (nginx's start state, Node's llhttp).
    let start = skip_crs(start);
    let n = start.len().min(5);
    if start[..n].eq_ignore_ascii_case(&b"host:"[..n]) {
        return true;
    }
    // Any length: nginx takes a method of any length.
    match start.iter().position(|&b| !is_tchar(b)) {
        None => true,
        Some(at) => at > 0 && start[at] == b' ',
    }
}

fn skip_crs(line: &[u8]) -> &[u8] {
    let at = line.iter().position(|&b| b != b'\r').unwrap_or(line.len());
    &line[at..]
}

/// A byte of an HTTP token (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A whole line of a body: refused if a server would take it for a request line (a token, a
/// space, and ` HTTP/` after a target, whatever version or spaces follow: nginx takes
/// `HTTP/1.01`, `HTTP/1.2` and a trailing space), or for a Host header naming another host
/// than `host`.
fn judge_body_line(line: &[u8], host: &str) -> Result<(), &'static str> {
    let text = line.strip_suffix(b"\n").unwrap_or(line);
    let text = skip_crs(text.strip_suffix(b"\r").unwrap_or(text));
    let upper = text.to_ascii_uppercase();
    let method = upper.iter().position(|&b| !is_tchar(b)).unwrap_or(upper.len());
    if method > 0
        && upper.get(method) == Some(&b' ')
        && upper[method..].windows(6).skip(1).any(|w| w == b" HTTP/")
    {
        return Err("a request line hidden in a request body");
    }
    // HTTP/0.9, which nginx still takes for GET: `GET target`, no version, the host from an
    // absolute target.
    if let Some(target) = text.strip_prefix(b"GET ") {
        let target = target.trim_ascii();
        if !target.is_empty()
            && !target.contains(&b' ')
            && (target.starts_with(b"/") || target.windows(3).any(|w| w == b"://"))
        {
            return Err("a request line hidden in a request body");
        }
    }
    if upper.starts_with(b"HOST:") {
        let value = String::from_utf8_lossy(&text[5..]);
        if authority_host(value.trim_matches([' ', '\t'])).as_deref() != Some(host) {
            return Err("a Host line naming another host hidden in a request body");
        }
    }
    Ok(())
}

/// What the checker passes a client's later bytes through once its first request or
/// ClientHello was allowed: those to send on, and why the connection ends, once they break the
/// rule (what came before still goes on; nothing after).
pub trait ClientBytes: Send {
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Option<&'static str>);
    /// The host the bytes that broke the rule named, if they named one.
    fn refused_host(&self) -> Option<&str>;
}

impl ClientBytes for HttpRequests {
    fn feed(&mut self, bytes: &[u8]) -> (Vec<u8>, Option<&'static str>) {
        HttpRequests::feed(self, bytes)
    }
    fn refused_host(&self) -> Option<&str> {
        HttpRequests::refused_host(self)
    }
}

/// Where the CRLF ending the line at the start of `bytes` is; None while it is not there yet.
/// A bare CR or LF, or another control byte, is refused: a server that ends the line there
/// (Go's did, CVE-2025-22871) would read a request the checker took for body.
fn line_end(bytes: &[u8], max: usize) -> Result<Option<usize>, &'static str> {
    for (i, &b) in bytes.iter().enumerate() {
        if i > max {
            return Err("a line too long in a chunked body");
        }
        match b {
            b'\r' => {
                return match bytes.get(i + 1) {
                    Some(b'\n') => Ok(Some(i)),
                    Some(_) => Err("a bare CR in a chunked body's line"),
                    None => Ok(None),
                };
            }
            b'\t' => {}
            0..=0x1f | 0x7f => return Err("a control character in a chunked body's line"),
            _ => {}
        }
    }
    Ok(None)
}

/// The host of `host[:port]`, lower-cased; None for an address literal or anything else.
fn authority_host(authority: &str) -> Option<String> {
    if authority.contains('@') || authority.starts_with('[') {
        return None;
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        Some(_) => return None,
        None => authority,
    };
    valid_host(host.as_bytes())
}

mod retry;

#[cfg(test)]
use retry::HELLO_RETRY_RANDOM;
pub use retry::{TlsRetry, hello_retry};

#[cfg(test)]
mod tests;
