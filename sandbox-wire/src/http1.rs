//! HTTP/1 requests as the sandbox reads them: one head parser, one framing rule and one chunked
//! decoder, shared by the name check (which passes the agent's bytes on as they are), the key
//! forwarder's relay (which sends a body upstream as its head frames it) and the body inspection
//! (which reads a body whole). Every rule is strict: what a server could read otherwise than
//! this reader (a bare CR or LF, a folded line, two lengths, a coding other than chunked, a chunk
//! that runs past its size) is refused rather than guessed at, because a request the sandbox
//! judged and a server read differently is how a check is walked round.

/// The longest chunk-size or trailer line read.
pub const MAX_CHUNK_LINE: usize = 1024;

/// A request head: the request line and the field lines, up to and with the blank line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head<'a> {
    pub method: &'a str,
    pub target: &'a str,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: &'a str,
    /// The request line as it came, without its CRLF.
    pub request_line: &'a str,
    pub fields: Vec<Field<'a>>,
    /// How many bytes the head took, its blank line included.
    pub len: usize,
}

/// One header field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// As sent: compare it with [`Field::is`].
    pub name: &'a str,
    /// Without the blanks around it.
    pub value: &'a str,
    /// The whole line as it came, without its CRLF.
    pub line: &'a str,
}

impl Field<'_> {
    /// Whether the field is `name` (ASCII, any case).
    pub fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }
}

/// Where the head at the start of `bytes` ends (past its blank line); None while it has not.
pub fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|end| end + 4)
}

/// A byte of an HTTP token (RFC 9110 §5.6.2): a method, a field name.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether `text` is a token (RFC 9110 §5.6.2): one or more [`is_tchar`] bytes.
pub fn is_token(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(is_tchar)
}

/// The request head at the start of `bytes`, checked; None while its blank line has not come.
///
/// Refused: a head that is not UTF-8; any control character but tab (C0, DEL, C1), so a bare CR
/// or LF, which ends a line to some servers and not to others, and NUL; a request line other than
/// `METHOD SP TARGET SP VERSION` with one space each, a method that is not a token, a target with
/// a byte outside visible ASCII, a version other than HTTP/1.1 and HTTP/1.0; a folded line
/// (obs-fold); a field line without a colon or whose name is not a token (a blank before the
/// colon among them).
pub fn parse_head(bytes: &[u8]) -> Result<Option<Head<'_>>, &'static str> {
    let Some(len) = head_end(bytes) else { return Ok(None) };
    let text =
        std::str::from_utf8(&bytes[..len - 4]).map_err(|_| "an HTTP request head that is not UTF-8")?;
    if text.chars().any(|c| c.is_control() && c != '\t' && c != '\r' && c != '\n')
        || text.split("\r\n").any(|line| line.contains(['\r', '\n']))
    {
        return Err("a control character (a bare CR or LF, a NUL) in an HTTP request head");
    }
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a malformed HTTP request line");
    };
    if !is_token(method) {
        return Err("an HTTP method that is not a token");
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("an HTTP request target with a byte that must be escaped (a tab, a byte past ASCII)");
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err("an HTTP version other than 1.0 and 1.1");
    }
    let mut fields = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) {
            return Err("a folded HTTP header line");
        }
        let (name, value) = line.split_once(':').ok_or("an HTTP header line without a colon")?;
        if !is_token(name) {
            return Err("an HTTP header name that is not a token");
        }
        fields.push(Field { name, value: value.trim_matches([' ', '\t']), line });
    }
    Ok(Some(Head { method, target, version, request_line, fields, len }))
}

/// How a request's body is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    Length(u64),
    Chunked,
}

/// A request's framing, from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub body: BodyLength,
    /// `Expect: 100-continue`: the client waits for a go-ahead before its body.
    pub expect_continue: bool,
}

impl Head<'_> {
    /// The values of every field named `name`.
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s str> + 's {
        self.fields.iter().filter(move |f| f.is(name)).map(|f| f.value)
    }

    /// The tokens of every Connection header, lower-cased: the options and the hop-by-hop
    /// headers the client names. One reader for every user of them: a token is an RFC 9110
    /// token between commas, with spaces and tabs around it and nothing else (a no-break space
    /// that one reader trims and another keeps would name a header to one of them only).
    pub fn connection_tokens(&self) -> Result<Vec<String>, &'static str> {
        let mut tokens = Vec::new();
        for value in self.values("connection") {
            for token in value.split(',').map(|t| t.trim_matches([' ', '\t'])).filter(|t| !t.is_empty()) {
                if !is_token(token) {
                    return Err("a Connection header with an element that is not a token");
                }
                tokens.push(token.to_ascii_lowercase());
            }
        }
        Ok(tokens)
    }

    /// The one framing rule: Content-Length or chunked, never both; one Content-Length, of 1 to
    /// 18 digits (no sign, no list); one Transfer-Encoding, exactly `chunked`, and not on
    /// HTTP/1.0; no Connection header naming either (a hop that drops what Connection names
    /// would leave the body framed by nothing), nor one of an element that is not a token.
    /// Neither: no body.
    pub fn framing(&self) -> Result<Framing, &'static str> {
        let (mut length, mut chunked, mut expect_continue) = (None, false, false);
        for field in &self.fields {
            let value = field.value;
            if field.is("content-length") {
                if length.is_some() {
                    return Err("more than one Content-Length");
                }
                let digits =
                    !value.is_empty() && value.len() <= 18 && value.bytes().all(|b| b.is_ascii_digit());
                length = Some(
                    digits
                        .then(|| value.parse::<u64>().ok())
                        .flatten()
                        .ok_or("a malformed Content-Length")?,
                );
            } else if field.is("transfer-encoding") {
                // Only plain chunked: any other coding frames the body in a way this reader
                // would have to agree on with the server.
                if chunked || !value.eq_ignore_ascii_case("chunked") {
                    return Err("a Transfer-Encoding other than one chunked");
                }
                chunked = true;
            } else if field.is("expect") {
                expect_continue = value.eq_ignore_ascii_case("100-continue");
            }
        }
        let named = self.connection_tokens()?;
        if named
            .iter()
            .any(|t| t.eq_ignore_ascii_case("content-length") || t.eq_ignore_ascii_case("transfer-encoding"))
        {
            return Err("a Connection header naming Content-Length or Transfer-Encoding");
        }
        // HTTP/1.0 has no chunked coding: Go ignores the header there and reads no body, nginx
        // refuses the request (RFC 9112 §6.1: a message to treat as badly framed).
        if chunked && self.version == "HTTP/1.0" {
            return Err("Transfer-Encoding on an HTTP/1.0 request");
        }
        let body = match (length, chunked) {
            (Some(_), true) => return Err("both Content-Length and Transfer-Encoding"),
            (Some(length), false) => BodyLength::Length(length),
            (None, true) => BodyLength::Chunked,
            (None, false) => BodyLength::Length(0),
        };
        Ok(Framing { body, expect_continue })
    }
}

/// A piece of a body on the wire, as [`Body::next`] finds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Bytes of the body itself.
    Data,
    /// A chunk-size line, or the CRLF after a chunk's data.
    Framing,
    /// A trailer field line, after the last chunk.
    Trailer,
    /// The end of the body: the blank line after the last chunk, or no byte for a length.
    End,
}

/// A request body read as its head frames it: a push decoder, given the bytes that follow those
/// of the pieces it found before, that finds the next piece and its length. It owns no buffer:
/// the caller keeps the bytes and passes each piece on, or not, as its job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    SizeLine,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

impl Body {
    pub fn new(length: BodyLength) -> Body {
        let state = match length {
            BodyLength::Length(n) => State::Length(n),
            BodyLength::Chunked => State::SizeLine,
        };
        Body { state }
    }

    /// Whether the body has ended ([`Piece::End`] was found).
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// The next piece at the start of `bytes`, and how many of them it takes; None while they
    /// are too few to tell (never for a length's end, which takes no byte), and once the body is
    /// done. Refused: a chunk size that is not 1 to 15 hex digits (followed by nothing, or by
    /// blanks and `;` and an extension), a chunk whose data does not end with CRLF where its size
    /// says, a trailer line that is not a field line, and in any chunk-size or trailer line a
    /// bare CR or LF, another control character but tab or a byte past ASCII, or more than
    /// [`MAX_CHUNK_LINE`] bytes.
    pub fn next(&mut self, bytes: &[u8]) -> Result<Option<(Piece, usize)>, &'static str> {
        match self.state {
            State::Done => Ok(None),
            State::Length(0) => {
                self.state = State::Done;
                Ok(Some((Piece::End, 0)))
            }
            State::Length(left) | State::Data(left) => {
                if bytes.is_empty() {
                    return Ok(None);
                }
                let take = bytes.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let left = left - take as u64;
                self.state = match self.state {
                    State::Length(_) => State::Length(left),
                    _ if left == 0 => State::DataEnd,
                    _ => State::Data(left),
                };
                Ok(Some((Piece::Data, take)))
            }
            State::DataEnd => match bytes.get(..2) {
                None if bytes.first().is_none_or(|&b| b == b'\r') => Ok(None),
                Some(b"\r\n") => {
                    self.state = State::SizeLine;
                    Ok(Some((Piece::Framing, 2)))
                }
                _ => Err("a chunk that does not end where its size says"),
            },
            State::SizeLine => {
                let Some(end) = chunk_line(bytes)? else { return Ok(None) };
                let size = chunk_size(&bytes[..end])?;
                self.state = if size == 0 { State::Trailers } else { State::Data(size) };
                Ok(Some((Piece::Framing, end + 2)))
            }
            State::Trailers => {
                let Some(end) = chunk_line(bytes)? else { return Ok(None) };
                if end == 0 {
                    self.state = State::Done;
                    return Ok(Some((Piece::End, 2)));
                }
                let line = std::str::from_utf8(&bytes[..end]).map_err(|_| "a malformed trailer")?;
                match line.split_once(':') {
                    Some((name, _)) if is_token(name) => Ok(Some((Piece::Trailer, end + 2))),
                    _ => Err("a malformed trailer"),
                }
            }
        }
    }
}

/// Where the CRLF ending the chunk-size or trailer line at the start of `bytes` is; None while
/// it has not come. A bare CR or LF, or another control byte, is refused: a server that ends the
/// line there (Go's did, CVE-2025-22871) would read a request the reader took for body.
fn chunk_line(bytes: &[u8]) -> Result<Option<usize>, &'static str> {
    for (i, &b) in bytes.iter().enumerate() {
        if i > MAX_CHUNK_LINE {
            return Err("a chunk-size or trailer line too long");
        }
        match b {
            b'\r' => {
                return match bytes.get(i + 1) {
                    Some(b'\n') => Ok(Some(i)),
                    Some(_) => Err("a bare CR in a chunk-size or trailer line"),
                    None => Ok(None),
                };
            }
            b'\t' | 0x20..=0x7e => {}
            _ => return Err("a control character or a byte past ASCII in a chunk-size or trailer line"),
        }
    }
    Ok(None)
}

/// The size a chunk-size line (without its CRLF) gives.
fn chunk_size(line: &[u8]) -> Result<u64, &'static str> {
    let digits = line.iter().position(|b| !b.is_ascii_hexdigit()).unwrap_or(line.len());
    let after = &line[digits..];
    let extension = after.trim_ascii_start();
    if digits == 0 || digits > 15 || !(after.is_empty() || extension.starts_with(b";")) {
        return Err("a malformed chunk size");
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|_| "a malformed chunk size")?;
    u64::from_str_radix(hex, 16).map_err(|_| "a malformed chunk size")
}

#[cfg(test)]
mod tests;
