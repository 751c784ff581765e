//! The name a client speaks on the wire before any byte reaches the server: the `server_name` of
//! a TLS ClientHello (reassembled across records and segments), or the `Host` of an HTTP/1
//! request. Strict: anything a server might read differently from this parser (a duplicate
//! extension, two names, a Host that disagrees with an absolute URI, folded headers) is refused,
//! because the check is only as good as the agreement between the two readers. Pure: the
//! checker feeds it the bytes read so far.
//!
//! Below it, what else of the name check is pure: what a refused connection is answered
//! (`answer`), the upload budgets' arithmetic (`budgets`) and the messages between the checker
//! and PID 1 (`messages`).

use crate::http1::{self, Body, BodyLength, Piece, is_tchar};
use crate::tls::{self, CONTENT_HANDSHAKE, valid_host};

/// The most bytes read before the name must be known: a ClientHello with post-quantum key
/// shares is under 2 KiB, and real request heads are well under this too.
pub const MAX_FIRST_BYTES: usize = tls::MAX_HELLO;
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
        Some(&CONTENT_HANDSHAKE) => match tls::client_hello(bytes) {
            Ok(None) => Sniffed::NeedMore,
            Ok(Some(hello)) => Sniffed::Tls { name: hello.name, ech: hello.ech },
            Err(why) => Sniffed::Refused(why),
        },
        Some(_) if looks_like_http(bytes) => http_request(bytes),
        Some(_) if bytes.len() < 8 && METHODS.iter().any(|m| m.as_bytes().starts_with(bytes)) => {
            Sniffed::NeedMore
        }
        Some(_) => Sniffed::Refused("neither a TLS ClientHello nor an HTTP request: no name to check"),
    }
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
    body: BodyLength,
}

/// The request head at the start of `bytes` (parsed by [`http1::parse_head`], framed by its one
/// rule), judged for the name check; None while it is incomplete.
fn request_head(bytes: &[u8]) -> Result<Option<RequestHead>, &'static str> {
    let too_long = "an HTTP request head too long to check";
    let Some(head) = http1::parse_head(bytes)? else {
        return if bytes.len() > MAX_HEAD { Err(too_long) } else { Ok(None) };
    };
    if head.len > MAX_HEAD {
        return Err(too_long);
    }
    if !looks_like_http(bytes) {
        return Err("an HTTP request of a method that is not checked (CONNECT, PRI, …)");
    }
    let mut hosts = head.values("host");
    let host = hosts.next().ok_or("an HTTP request without a Host header")?;
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    let body = head.framing()?.body;
    // A server that ignores the body of a method that has none (or leaves it unread) reads it
    // as the next request, one this reader took for body (CL.0 desync).
    if BODYLESS.contains(&head.method) && body != BodyLength::Length(0) {
        return Err("a body on a GET, HEAD, OPTIONS, TRACE or DELETE, which a server may read as a request");
    }
    let host = authority_host(host).ok_or("a Host that is not a host name")?;
    // An absolute URI names the host a server must use instead of Host (RFC 9112 §3.2.2),
    // whatever its scheme (nginx and Go take the host of `ws://other/` too): only http and
    // https are taken, and only naming the Host's host; a path or `*` otherwise.
    let target = head.target;
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
    // Hop-by-hop: nothing of the client's may turn the connection into another protocol.
    let hop = ["connection", "keep-alive", "proxy-connection", "upgrade"];
    let kept = head.fields.iter().filter(|f| !hop.iter().any(|h| f.is(h))).map(|f| f.line);
    let mut out =
        std::iter::once(head.request_line).chain(kept).collect::<Vec<_>>().join("\r\n").into_bytes();
    out.extend_from_slice(b"\r\n\r\n");
    Ok(Some(RequestHead { host, head: out, len: head.len, body }))
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

/// Where the connection is: between requests, or in a body read by its framing.
#[derive(Debug)]
enum Framing {
    Head,
    Body(Body),
}

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
        // The bytes are read where they lie; only what a step could not yet take is kept, for
        // the next feed (held, the new bytes join it).
        let mut held = std::mem::take(&mut self.held);
        let data: &[u8] = if held.is_empty() {
            bytes
        } else {
            held.extend_from_slice(bytes);
            &held
        };
        let mut out = Vec::with_capacity(data.len());
        let mut at = 0;
        while at < data.len() {
            match self.step(&data[at..], &mut out) {
                Ok(Some(taken)) => at += taken,
                Ok(None) => break,
                Err(reason) => {
                    self.refused = Some(reason);
                    return (out, Some(reason));
                }
            }
        }
        if held.is_empty() {
            held.extend_from_slice(&bytes[at..]);
        } else {
            held.drain(..at);
        }
        self.held = held;
        (out, None)
    }

    /// One step over `rest`, the bytes not yet taken: how many it took (adding what goes on to
    /// `out`), None if it needs more.
    fn step(&mut self, rest: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, &'static str> {
        match self.state {
            Framing::Head => {
                let Some(head) = request_head(rest)? else { return Ok(None) };
                if head.host != self.host {
                    self.refused_host = Some(head.host);
                    return Err("a later request on the connection names another host");
                }
                out.extend_from_slice(&head.head);
                if head.body != BodyLength::Length(0) {
                    self.state = Framing::Body(Body::new(head.body));
                }
                Ok(Some(head.len))
            }
            Framing::Body(ref mut reader) => {
                let Some((piece, n)) = reader.next(rest)? else { return Ok(None) };
                // Every byte of the body in the order it came, the chunks' framing and trailers
                // too: their lines are what a server that ignores the body reads, and a line the
                // lines' judge holds back must not fall behind the framing after it.
                // A chunk-size or trailer line that starts a line is a whole line: judged as one
                // whatever it starts with (`19;x /secret HTTP/1.1` is a request line to Python).
                if matches!(piece, Piece::Framing | Piece::Trailer) && self.body.at_line_start() {
                    judge_body_line(&rest[..n], &self.host)?;
                }
                self.body.feed(&rest[..n], &self.host, out)?;
                // A length's end takes no byte: it is found as soon as its last byte is.
                if piece == Piece::End || reader.next(&[])? == Some((Piece::End, 0)) {
                    self.body.end(&self.host, out)?;
                    self.state = Framing::Head;
                }
                Ok(Some(n))
            }
        }
    }
}

/// The lines of a request body, judged as a server would read them if it took the body for the
/// next request (a server that ignores a body, or answers before reading it): a request line,
/// or a `Host` line naming another host than the connection's, ends the connection. A line that
/// might be one is held until it ends, so no byte of it reaches the server before the verdict;
/// any other line goes on as it comes. JSON, compressed and binary bodies have no such lines.
/// The lines are the body's bytes as they are on the wire, a chunked body's framing among them:
/// a server that ignores the body reads those, not the decoded data.
#[derive(Debug, Default)]
struct BodyLines {
    /// The start of the current line, held while it might be a request line or a Host line.
    line: Vec<u8>,
    /// The current line cannot be either: its bytes pass until it ends.
    passing: bool,
    /// Python's words on the current line so far.
    words: Words,
}

/// The longest line Python's `http.server` reads as a request line, its LF counted, or without
/// one where the connection ends after it: it reads `readline(65537)` and answers 414 to more.
const PYTHON_MAX_LINE: usize = 65536;

/// What a line may be, as far as it has come.
enum Line {
    /// Neither a request line nor a Host line to any server: it passes as it comes.
    Passes,
    /// Maybe one: held until it ends.
    Held,
    /// A line that may be a request line to nginx or Go, longer than the check holds.
    TooLong,
}

/// Python's words on a line, counted as its bytes come: a held line is never read twice, so a
/// line fed a byte at a time costs what it costs in one piece.
#[derive(Debug, Default)]
struct Words {
    /// How much of the line was counted.
    read: usize,
    count: u8,
    in_word: bool,
    /// The line was found to start with neither a token and a blank nor `host:`: as bytes
    /// come it cannot again, so it is not asked again (a held line is read once).
    untokened: bool,
}

impl Words {
    /// What the current line, as far as it has come (`start`), may be: held while it may be a
    /// request line as nginx or Go reads one, or a Host line ([`might_be_request_or_host`]),
    /// and refused if such a line grows past what a server reads in a request's head; held
    /// also while Python may read it as a request line: any word is a method to an application
    /// whose handler serves every method, so any line of three words or fewer, up to Python's
    /// longest line (a compact JSON body is one word, and goes on past that length).
    fn what(&mut self, start: &[u8]) -> Line {
        if !self.untokened && might_be_request_or_host(start) {
            return if start.len() > MAX_HEAD { Line::TooLong } else { Line::Held };
        }
        self.untokened = true;
        // Python reads 65,537 bytes of a line at most and answers a line that long 414; a line
        // no longer than 65,536 bytes is a request to it at the connection's end too.
        if start.len() > PYTHON_MAX_LINE || self.more_than_three(start) { Line::Passes } else { Line::Held }
    }

    /// Whether `line`, the current line as far as it has come, has more than three words.
    fn more_than_three(&mut self, line: &[u8]) -> bool {
        for &b in &line[self.read.min(line.len())..] {
            self.read += 1;
            if is_blank(b) {
                self.in_word = false;
            } else if !self.in_word {
                self.in_word = true;
                self.count += 1;
                if self.count > 3 {
                    return true;
                }
            }
        }
        false
    }
}

impl BodyLines {
    /// Whether the next byte starts a line.
    fn at_line_start(&self) -> bool {
        self.line.is_empty() && !self.passing
    }

    fn feed(&mut self, mut bytes: &[u8], host: &str, out: &mut Vec<u8>) -> Result<(), &'static str> {
        while !bytes.is_empty() {
            if self.passing {
                let end = memchr::memchr(b'\n', bytes).map_or(bytes.len(), |i| i + 1);
                out.extend_from_slice(&bytes[..end]);
                self.passing = bytes[end - 1] != b'\n';
                bytes = &bytes[end..];
                continue;
            }
            // Up to the line's end, or all there is: whether the line is held is decided on
            // all of it at once (a line that cannot be a request or Host line stays so however
            // long it grows), not byte by byte.
            let end = memchr::memchr(b'\n', bytes);
            let (piece, rest) = bytes.split_at(end.map_or(bytes.len(), |i| i + 1));
            bytes = rest;
            // A line that starts here is decided where it lies, and copied once.
            let line = if self.line.is_empty() {
                piece
            } else {
                self.line.extend_from_slice(piece);
                &self.line[..]
            };
            let start = line.strip_suffix(b"\n").unwrap_or(line);
            match self.words.what(start) {
                Line::Passes => self.passing = end.is_none(),
                Line::TooLong => return Err("a line in a body too long to tell from a request"),
                Line::Held if end.is_some() => judge_body_line(line, host)?,
                Line::Held => {
                    if self.line.is_empty() {
                        self.line.extend_from_slice(piece);
                    }
                    continue;
                }
            }
            self.words = Words::default();
            if self.line.is_empty() {
                out.extend_from_slice(piece);
            } else {
                out.append(&mut self.line);
            }
        }
        Ok(())
    }

    /// The body ended: a line held then is judged as it stands. A server that read it as the
    /// start of a request would read the next request's line after it, on the same line; that
    /// line is checked on its own, so the two make no target or Host the check did not see.
    /// A CR in a line nginx or Node might read is refused: they might end the line there. To
    /// Python, which alone reads the other lines held, a CR is a blank, and the next request's
    /// line after a word or more makes four words or more, which it does not take.
    fn end(&mut self, host: &str, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let held = std::mem::take(&mut self.line);
        self.passing = false;
        self.words = Words::default();
        if held.contains(&b'\r') && might_be_request_or_host(&held) {
            return Err("a body that ends inside what may be a request or Host line");
        }
        judge_body_line(&held, host)?;
        out.extend_from_slice(&held);
        Ok(())
    }
}

/// Whether a line starting with `start` may be a request line or a Host header line, as a
/// lenient server reads them: a method is any token (nginx proxies PROPFIND, Go takes any
/// token), so a line is held while it starts with a token and what follows a blank after it;
/// or with `host:`, in any case. Blanks as Python's `http.server` reads a request line
/// (`str.split()`: a tab, a vertical tab, a form feed, 0x1c to 0x1f, 0x85, a no-break space, a
/// space), before the method too; nginx and Node skip CRs and LFs there.
fn might_be_request_or_host(start: &[u8]) -> bool {
    let start = skip_blanks(start);
    let n = start.len().min(5);
    if start[..n].eq_ignore_ascii_case(&b"host:"[..n]) {
        return true;
    }
    // Any length: nginx takes a method of any length.
    match start.iter().position(|&b| !is_tchar(b)) {
        None => true,
        Some(at) => at > 0 && is_blank(start[at]),
    }
}

/// A byte that separates the words of a request line to some server: Python's whitespace on
/// the line decoded as Latin-1, which takes in nginx's and Go's space and tab.
fn is_blank(b: u8) -> bool {
    BLANKS[b as usize]
}

/// [`is_blank`] as a table: it is asked of nearly every byte of a text body.
static BLANKS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = matches!(b as u8, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f | b' ' | 0x85 | 0xa0);
        b += 1;
    }
    table
};

fn skip_blanks(line: &[u8]) -> &[u8] {
    let at = line.iter().position(|&b| !is_blank(b)).unwrap_or(line.len());
    &line[at..]
}

/// A whole line of a body: refused if a server would take it for a request line, or for a
/// Host header naming another host than `host`. A request line to nginx: a token, a space, and
/// ` HTTP/` after a target, whatever version or spaces follow (nginx takes `HTTP/1.01`,
/// `HTTP/1.2` and a trailing space); to Python's `http.server`: three words split at any of its
/// blanks, the last starting with `HTTP/`; and HTTP/0.9's `GET target` to both. A Host line
/// also where a bare CR starts one, as Python's header parser splits lines.
fn judge_body_line(line: &[u8], host: &str) -> Result<(), &'static str> {
    let text = line.strip_suffix(b"\n").unwrap_or(line);
    let text = skip_blanks(text.strip_suffix(b"\r").unwrap_or(text));
    // Every way below a line is refused needs a slash (a protocol's name, a target), a CR (a
    // Host line after one), or the line to start with `GET` or `host:`: most lines of text have
    // none of these, and are passed on one search.
    let starts = |word: &[u8]| text.get(..word.len()).is_some_and(|w| w.eq_ignore_ascii_case(word));
    if memchr::memchr2(b'/', b'\r', text).is_none() && !starts(b"GET") && !starts(b"host:") {
        return Ok(());
    }
    // Letters' case aside, as the servers compare: no copy of the line, which every line of
    // source text that starts with a word comes to.
    let method = text.iter().position(|&b| !is_tchar(b)).unwrap_or(text.len());
    if method > 0 && text.get(method) == Some(&b' ') && names_a_protocol(&text[method + 1..]) {
        return Err("a request line hidden in a request body");
    }
    // Python's words: only whether there are two or three matters, so no more than four are read.
    let python = match first_words(text) {
        // Any word is a method to Python (an application's catch-all handler serves it).
        (3, [_, _, version]) => version.len() >= 5 && version[..5].eq_ignore_ascii_case(b"HTTP/"),
        // HTTP/0.9: Python takes `GET` (so spelt) with any target, `GET secret` too.
        (2, [b"GET", _, _]) => true,
        (2, [method, target, _]) => {
            method.eq_ignore_ascii_case(b"GET")
                && (target.starts_with(b"/") || memchr::memmem::find(target, b"://").is_some())
        }
        _ => false,
    };
    if python {
        return Err("a request line hidden in a request body");
    }
    // Lines as Python's header parser splits them: at every CR too.
    let segments = std::iter::once(0).chain(memchr::memchr_iter(b'\r', text).map(|at| at + 1));
    for start in segments {
        let segment = &text[start..];
        let segment = &segment[..memchr::memchr(b'\r', segment).unwrap_or(segment.len())];
        if segment.len() >= 5 && segment[..5].eq_ignore_ascii_case(b"host:") {
            let value = String::from_utf8_lossy(&segment[5..]);
            if authority_host(value.trim_matches([' ', '\t'])).as_deref() != Some(host) {
                return Err("a Host line naming another host hidden in a request body");
            }
        }
    }
    Ok(())
}

/// How many words `text` has, split at [`is_blank`] bytes, counted to four at most, and the
/// first three. A source line of many words is read only to the start of its fourth.
fn first_words(text: &[u8]) -> (usize, [&[u8]; 3]) {
    let (mut count, mut words, mut start) = (0, [&text[..0]; 3], None);
    for (at, &b) in text.iter().enumerate() {
        match (is_blank(b), start) {
            (true, Some(from)) => {
                words[count - 1] = &text[from..at];
                start = None;
            }
            (false, None) => {
                if count == 3 {
                    return (4, words);
                }
                count += 1;
                start = Some(at);
            }
            _ => {}
        }
    }
    if let Some(from) = start {
        words[count - 1] = &text[from..];
    }
    (count, words)
}

/// Whether `rest`, what follows a request line's method and its space, names a protocol after
/// a target: ` HTTP/` (nginx, whatever version follows), or ` RTSP/` and ` ICE/`, which Node's
/// llhttp takes in their place (it serves `GET http://other/ RTSP/1.0` as an HTTP/1.0 GET).
fn names_a_protocol(rest: &[u8]) -> bool {
    // Each ends in a slash, rarer in text than a space: found by memchr, the words before it read.
    let ends = |before: &[u8], name: &[u8]| {
        before.len() > name.len()
            && before[before.len() - name.len() - 1] == b' '
            && before[before.len() - name.len()..].eq_ignore_ascii_case(name)
    };
    memchr::memchr_iter(b'/', rest).any(|at| {
        let before = &rest[..at];
        ends(before, b"HTTP") || ends(before, b"RTSP") || ends(before, b"ICE")
    })
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

pub mod answer;
pub mod budgets;
pub mod messages;
mod retry;

#[cfg(test)]
use retry::HELLO_RETRY_RANDOM;
pub use retry::{TlsRetry, hello_retry};

#[cfg(test)]
mod tests;
