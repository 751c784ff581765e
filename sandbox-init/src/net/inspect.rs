//! The body of a request the key forwarder inspects: framed strictly from its head (one
//! length, or chunked, never both, nothing compressed), read whole (bounded in size and time),
//! and judged for what would make the provider fetch a URL (`remote_tools`); then sent on with a
//! length of its own. Pure but for `read_body`.

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

/// Why a request was not forwarded: the status the agent's CLI gets, and the reason. The
/// reason quotes what the agent sent (a method, a path, a tool's name) and goes to the agent,
/// connections.jsonl, `sandbox-status` and the user's terminal: [`Refused::new`] is the one way
/// to make one, and it leaves no control character in it and bounds it.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    status: u16,
    reason: String,
}

/// The most characters of a refusal's reason (and of what the forwarder reports to PID 1).
pub const MAX_REASON: usize = 400;

impl Refused {
    /// A refusal with `status`; every control character of `reason` (C0, DEL, C1) and every
    /// bidirectional one becomes `?`, and it is cut to [`MAX_REASON`] characters.
    pub fn new(status: u16, reason: impl AsRef<str>) -> Refused {
        Refused { status, reason: sandbox_policy::text::one_line(reason.as_ref(), MAX_REASON) }
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// The largest request body read whole to look for remote tools: model requests with long
/// contexts and images stay well under it.
const MAX_INSPECTED_BODY: usize = 32 << 20;

/// How the agent's request frames its body.
#[derive(Debug, PartialEq, Eq)]
pub struct Framing {
    pub body: BodyLength,
    /// `Expect: 100-continue`: the client waits for a go-ahead before its body.
    pub expect_continue: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum BodyLength {
    Length(usize),
    Chunked,
}

/// The framing of the agent's request head (without its blank line). A body this reader could
/// frame otherwise than the server (two lengths, both a length and chunked, another coding) is
/// refused; so is, when it is to be `inspected`, one compressed, which could not be read, or one
/// over the size read whole. A body only streamed on (git's gzipped fetch requests, a push's
/// pack) may be compressed and of any size.
pub fn body_framing(head: &[u8], inspected: bool) -> Result<Framing, Refused> {
    let bad = |why: &str| Refused::new(400, why);
    let text = std::str::from_utf8(head).map_err(|_| bad("the request head is not UTF-8"))?;
    let (mut length, mut chunked, mut expect_continue) = (None, false, false);
    for line in text.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" if length.is_some() => return Err(bad("two Content-Length headers")),
            "content-length" => {
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("a malformed Content-Length"));
                }
                let n = value.parse::<usize>().map_err(|_| bad("a malformed Content-Length"))?;
                if inspected && n > MAX_INSPECTED_BODY {
                    return Err(Refused::new(413, format!("a request body over {MAX_INSPECTED_BODY} bytes")));
                }
                length = Some(n);
            }
            "transfer-encoding" if chunked || !value.eq_ignore_ascii_case("chunked") => {
                return Err(bad("a Transfer-Encoding other than chunked"));
            }
            "transfer-encoding" => chunked = true,
            "content-encoding" if inspected && !value.eq_ignore_ascii_case("identity") => {
                return Err(Refused::new(
                    415,
                    "a compressed request body, which cannot be read for remote tools",
                ));
            }
            "expect" => expect_continue = value.eq_ignore_ascii_case("100-continue"),
            _ => {}
        }
    }
    let body = match (length, chunked) {
        (Some(_), true) => return Err(bad("both Content-Length and Transfer-Encoding")),
        (Some(n), false) => BodyLength::Length(n),
        (None, true) => BodyLength::Chunked,
        (None, false) => BodyLength::Length(0),
    };
    Ok(Framing { body, expect_continue })
}

/// The whole body, from `first` (what came with the head) and the client; chunks decoded.
pub async fn read_body(
    client: &mut TcpStream,
    first: Vec<u8>,
    length: BodyLength,
) -> Result<Vec<u8>, Refused> {
    let mut buf = first;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let done = match length {
            BodyLength::Length(n) => (buf.len() >= n).then(|| Ok(buf[..n].to_vec())),
            BodyLength::Chunked => dechunk(&buf).transpose(),
        };
        if let Some(body) = done {
            return body;
        }
        if buf.len() > MAX_INSPECTED_BODY + 64 * 1024 {
            return Err(Refused::new(413, format!("a request body over {MAX_INSPECTED_BODY} bytes")));
        }
        let n = client.read(&mut chunk).await.map_err(|e| Refused::new(400, e.to_string()))?;
        if n == 0 {
            return Err(Refused::new(400, "the connection ended inside the request body"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A chunked body decoded, once it is whole (None before); strict, so that no server could read
/// the chunks otherwise.
fn dechunk(mut bytes: &[u8]) -> Result<Option<Vec<u8>>, Refused> {
    let bad = |why: &str| Refused::new(400, format!("a malformed chunked body: {why}"));
    let mut body = Vec::new();
    loop {
        let Some(end) = bytes.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let line = std::str::from_utf8(&bytes[..end]).map_err(|_| bad("a size that is not text"))?;
        let digits = line.split(';').next().unwrap_or_default();
        if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("a size that is not hexadecimal"));
        }
        if line.bytes().any(|b| b < 0x20 && b != b'\t') {
            return Err(bad("a control character in a size line"));
        }
        let size = usize::from_str_radix(digits, 16).map_err(|_| bad("a size too large"))?;
        bytes = &bytes[end + 2..];
        if size == 0 {
            // Trailers, if any, then the empty line. They are dropped: the body goes on with a
            // length of its own.
            loop {
                let Some(end) = bytes.windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
                if end == 0 {
                    return Ok(Some(body));
                }
                let line = &bytes[..end];
                if !line.contains(&b':') || line.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                    return Err(bad("a malformed trailer"));
                }
                bytes = &bytes[end + 2..];
            }
        }
        if body.len() + size > MAX_INSPECTED_BODY {
            return Err(Refused::new(413, format!("a request body over {MAX_INSPECTED_BODY} bytes")));
        }
        let Some(data) = bytes.get(..size + 2) else { return Ok(None) };
        if &data[size..] != b"\r\n" {
            return Err(bad("a chunk longer than its size"));
        }
        body.extend_from_slice(&data[..size]);
        bytes = &bytes[size + 2..];
    }
}

/// What the request's head says of a body that could not be read for remote fetches, refused:
/// a file uploaded in parts (OpenAI's `/v1/uploads/{id}/parts`, Google's resumable uploads),
/// whose parts are joined only at the provider, where a batch line cut across two parts is
/// whole again; and a body in protobuf (`Content-Type: application/x-protobuf`, `alt=proto`),
/// which Google's APIs take and which names no field by its name.
pub fn judge_head(head: &[u8], api: &str) -> Result<(), Refused> {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let target = text.split(' ').nth(1).unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default();
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let header = |name: &str| {
        text.split("\r\n").skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n.trim() == name).then(|| v.trim().to_string())
        })
    };
    let in_parts = (path.contains("/uploads/") && path.trim_end_matches('/').ends_with("/parts"))
        || header("x-goog-upload-protocol").is_some_and(|v| v.contains("resumable"))
        || header("x-goog-upload-command").is_some()
        || query.split('&').any(|p| p.starts_with("upload_id="));
    if in_parts {
        return Err(Refused::new(
            403,
            format!(
                "a file uploaded in parts, which cannot be read for remote tools until the provider \
                 joins them; upload it whole, or `apis: {{{api}: {{remote_tools: allow}}}}` in a policy allows it"
            ),
        ));
    }
    let protobuf = header("content-type").is_some_and(|v| v.contains("proto"))
        || query.split('&').any(|p| p == "alt=proto" || p == "$alt=proto" || p == "%24alt=proto");
    if protobuf {
        return Err(Refused::new(415, "a protobuf request body, which cannot be read for remote tools"));
    }
    Ok(())
}

/// The remote fetch the body asks for, if any (`host` is the API's own). A body that looks like
/// JSON must be JSON as strict as any server reads it: no duplicate key, which one server would
/// take first and another last; and plain UTF-8, since a server may read a byte-order mark or
/// UTF-16 as JSON too. Any other body (a file upload) is searched line by line for JSON lines:
/// a batch's input file is one request per line.
pub fn judge_body(host: &str, body: &[u8]) -> Result<Option<String>, Refused> {
    if body.starts_with(b"\xef\xbb\xbf")
        || body.starts_with(b"\xfe\xff")
        || body.starts_with(b"\xff\xfe")
        || body.iter().take(4).any(|&b| b == 0)
    {
        return Err(Refused::new(415, "a request body in another encoding than plain UTF-8"));
    }
    let start = body.iter().find(|b| !b.is_ascii_whitespace());
    if matches!(start, Some(b'{' | b'[')) {
        let value = strict_json(body)
            .map_err(|e| Refused::new(400, format!("a request body that is not strict JSON: {e}")))?;
        return Ok(crate::net::remote_tools::named(&value, host));
    }
    // Lines end at LF or CR, as Python's universal newlines read a batch file.
    for line in body.split(|&b| b == b'\n' || b == b'\r') {
        let line = line.trim_ascii();
        let line = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line);
        if line.first() != Some(&b'{') {
            continue;
        }
        match strict_json(line) {
            Ok(value) => {
                if let Some(found) = crate::net::remote_tools::named(&value, host) {
                    return Ok(Some(format!("{found}, in a line of an uploaded file")));
                }
            }
            // A key twice: one reader takes the first, another the last.
            Err(e) if e.to_string().contains("twice in one object") => {
                return Err(Refused::new(
                    400,
                    format!("a line of an uploaded file that is not strict JSON: {e}"),
                ));
            }
            // Not JSON to this reader, but perhaps to the provider's (NaN, nesting past this
            // reader's limit; found by a red team): refused if it names what a fetch is named by.
            Err(e) => {
                let text = String::from_utf8_lossy(line);
                if let Some(key) = crate::net::remote_tools::fetch_word(&text) {
                    return Err(Refused::new(
                        400,
                        format!("a line of an uploaded file that is not strict JSON ({e}) names {key}"),
                    ));
                }
            }
        }
    }
    Ok(None)
}

/// JSON parsed into a value, refusing a key repeated in one object.
fn strict_json(bytes: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
    use serde::de::{Deserializer as _, Error as _, MapAccess, SeqAccess, Visitor};
    struct Strict;
    impl<'de> Visitor<'de> for Strict {
        type Value = serde_json::Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
            Ok(v.into())
        }
        fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
            Ok(v.into())
        }
        fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
            Ok(v.into())
        }
        fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.into())
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(v.into())
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(serde_json::Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element_seed(StrictSeed)? {
                items.push(item);
            }
            Ok(items.into())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut object = serde_json::Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if object.contains_key(&key) {
                    return Err(A::Error::custom(format!("the key `{key}` twice in one object")));
                }
                let value = map.next_value_seed(StrictSeed)?;
                object.insert(key, value);
            }
            Ok(object.into())
        }
    }
    struct StrictSeed;
    impl<'de> serde::de::DeserializeSeed<'de> for StrictSeed {
        type Value = serde_json::Value;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(Strict)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = (&mut de).deserialize_any(Strict)?;
    de.end()?;
    Ok(value)
}

/// The upstream head of an inspected request: its body, read whole, goes with a length (any
/// `Transfer-Encoding` and `Expect` of the agent's out; the forwarder answered the latter).
pub fn inspected_head(head: &[u8], length: usize) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.trim_end_matches("\r\n").split("\r\n") {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if out.is_empty() || !matches!(name.as_str(), "content-length" | "transfer-encoding" | "expect") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str(&format!("content-length: {length}\r\n\r\n"));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_framed_strictly_before_it_is_read_for_tools() {
        let framing = |head: &str| body_framing(head.as_bytes(), true);
        assert_eq!(
            framing("POST /v1/messages HTTP/1.1\r\nContent-Length: 12\r\nExpect: 100-continue").unwrap(),
            Framing { body: BodyLength::Length(12), expect_continue: true }
        );
        assert_eq!(
            framing("POST / HTTP/1.1\r\ntransfer-encoding: chunked").unwrap().body,
            BodyLength::Chunked
        );
        assert_eq!(framing("GET / HTTP/1.1").unwrap().body, BodyLength::Length(0));
        for (head, status) in [
            ("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2", 400),
            ("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked", 400),
            ("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked", 400),
            ("POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 3", 415),
            ("POST / HTTP/1.1\r\nContent-Length: 999999999999", 413),
        ] {
            assert_eq!(framing(head).unwrap_err().status(), status, "{head}");
        }
    }

    #[test]
    fn chunks_are_decoded_strictly_once_whole() {
        assert_eq!(
            dechunk(b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n").unwrap(),
            Some(b"hello world".to_vec())
        );
        assert_eq!(dechunk(b"5\r\nhel").unwrap(), None, "not whole yet");
        assert_eq!(dechunk(b"5\r\nhello\r\n0\r\n").unwrap(), None);
        assert_eq!(dechunk(b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n").unwrap(), Some(b"hello".to_vec()));
        assert_eq!(dechunk(b"5\r\nhello\r\n0\r\nX-Trailer: 1\r\n").unwrap(), None, "not whole yet");
        for bad in [&b"x\r\n"[..], b"5\r\nhello!\r\n", b"0\r\nX-Trailer 1\r\n\r\n", b"+5\r\nhello\r\n"] {
            assert!(dechunk(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_body_naming_a_remote_tool_is_refused_however_its_json_is_written() {
        let tools = |body: &str| judge_body("api.anthropic.com", body.as_bytes());
        assert!(tools(r#"{"model":"m","mcp_servers":[{"url":"https://x.test"}]}"#).unwrap().is_some());
        assert!(tools(r#" {"model":"m","tools":[{"type":"web_fetch_20250910"}]} "#).unwrap().is_some());
        // The key twice: one server reads the first, another the last.
        assert_eq!(
            tools(r#"{"tools":[{"type":"web_fetch_20250910"}],"tools":[]}"#).unwrap_err().status(),
            400
        );
        assert_eq!(tools(r#"{"model":"m"} trailing"#).unwrap_err().status(), 400);
        assert_eq!(tools(r#"{"model":"m","messages":[]}"#).unwrap(), None);
        assert_eq!(tools("--boundary\r\nContent-Disposition: form-data").unwrap(), None, "an upload");
        // A batch's input file, uploaded: one request per line, each judged.
        let batch = "--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n\
            {\"custom_id\":\"1\",\"body\":{\"model\":\"m\",\"input\":\"hi\"}}\r\n\
            {\"custom_id\":\"2\",\"body\":{\"tools\":[{\"type\":\"mcp\",\"server_url\":\"https://x.test\"}]}}\r\n--b--\r\n";
        assert!(tools(batch).unwrap().is_some_and(|t| t.contains("uploaded file")), "{:?}", tools(batch));
        // JSON a server may read though it is not plain UTF-8 (found by a red team).
        let fetch = r#"{"model":"m","tools":[{"type":"web_fetch_20250910","name":"web_fetch"}]}"#;
        let bom = [b"\xef\xbb\xbf".as_slice(), fetch.as_bytes()].concat();
        let utf16: Vec<u8> = fetch.encode_utf16().flat_map(u16::to_be_bytes).collect();
        let utf16le: Vec<u8> = fetch.encode_utf16().flat_map(u16::to_le_bytes).collect();
        for body in [bom, utf16, utf16le] {
            assert_eq!(judge_body("api.anthropic.com", &body).unwrap_err().status(), 415);
        }
        // Found by a second red team: batch lines ended by a bare CR (two lines to Python's
        // reader), and a key twice in a line.
        let cr = "{\"custom_id\":\"1\"}\r{\"body\":{\"mcp_servers\":[{\"url\":\"https://x.test\"}]}}\r";
        assert!(tools(&format!("--b\r\n\r\n{cr}--b--")).unwrap().is_some());
        let twice = "--b\r\n\r\n{\"body\":{\"tools\":[{\"type\":\"mcp\"}],\"tools\":[]}}\n--b--";
        assert_eq!(tools(twice).unwrap_err().status(), 400);
        // Found by a third: lines Python reads as JSON and this reader does not (NaN, nesting
        // past its limit), naming a fetch. The control: such a line naming none passes, as
        // an uploaded source file's line beginning with `{` does.
        let nan = "--b\r\n\r\n{\"body\":{\"temperature\":NaN,\"messages\":[{\"content\":[{\"type\":\"document_url\",\"document_url\":\"https://x.test\"}]}]}}\n--b--";
        assert_eq!(tools(nan).unwrap_err().status(), 400);
        let deep = format!(
            "--b\r\n\r\n{{\"body\":{}{{\"image_url\":\"https://x.test\"}}{}}}\n--b--",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(tools(&deep).unwrap_err().status(), 400);
        assert_eq!(tools("--b\r\n\r\n{ int main() { return NaN; }\n--b--").unwrap(), None);
    }

    /// Bodies that cannot be read for remote tools, told by the head (found by a second red
    /// team): a file uploaded in parts, joined only at the provider, and protobuf.
    #[test]
    fn a_body_in_parts_or_in_protobuf_is_refused_by_its_head() {
        for (head, status) in [
            ("POST /v1/uploads/upload_abc/parts HTTP/1.1\r\nContent-Type: multipart/form-data", 403),
            ("POST /upload/v1beta/files HTTP/1.1\r\nX-Goog-Upload-Protocol: resumable", 403),
            (
                "POST /upload/v1beta/files?upload_id=x HTTP/1.1\r\nX-Goog-Upload-Command: upload, finalize",
                403,
            ),
            ("POST /v1beta/models/m:generateContent HTTP/1.1\r\nContent-Type: application/x-protobuf", 415),
            (
                "POST /v1beta/models/m:generateContent?alt=proto HTTP/1.1\r\nContent-Type: application/json",
                415,
            ),
        ] {
            assert_eq!(judge_head(head.as_bytes(), "gemini").unwrap_err().status(), status, "{head}");
        }
        for head in [
            "POST /v1/messages HTTP/1.1\r\nContent-Type: application/json",
            "POST /v1/files HTTP/1.1\r\nContent-Type: multipart/form-data; boundary=b",
            "POST /v1beta/models/m:streamGenerateContent?alt=sse HTTP/1.1\r\nContent-Type: application/json",
        ] {
            assert!(judge_head(head.as_bytes(), "openai").is_ok(), "{head}");
        }
    }

    #[test]
    fn an_inspected_request_goes_with_its_length() {
        let head = b"POST /v1/messages HTTP/1.1\r\nhost: api.anthropic.com\r\ntransfer-encoding: chunked\r\nExpect: 100-continue\r\nx-api-key: k\r\nconnection: close\r\n\r\n";
        assert_eq!(
            String::from_utf8(inspected_head(head, 11)).unwrap(),
            "POST /v1/messages HTTP/1.1\r\nhost: api.anthropic.com\r\nx-api-key: k\r\nconnection: close\r\ncontent-length: 11\r\n\r\n"
        );
    }
}
