//! The body of a request the key forwarder inspects: framed strictly from its head (one
//! length, or chunked, never both, nothing compressed), read whole (bounded in size and time),
//! and judged for what would make the provider fetch a URL (`remote_tools`); then sent on with a
//! length of its own. Pure but for `read_body`.

use crate::forwarder::Refused;
use crate::http1::{BodyLength, Framing, Head};

/// The largest request body read whole to look for remote tools: model requests with long
/// contexts and images stay well under it.
pub const MAX_INSPECTED_BODY: usize = 32 << 20;

/// The framing of the agent's request head, by the one rule (`http1`'s: one length, or chunked,
/// never both, no other coding). When the body is to be `inspected`, one compressed is refused
/// too, which could not be read, and one over the size read whole. A body only streamed on
/// (git's gzipped fetch requests, a push's pack) may be compressed and of any size.
pub fn body_framing(head: &Head, inspected: bool) -> Result<Framing, Refused> {
    let framing = head.framing().map_err(|why| Refused::new(400, why))?;
    if !inspected {
        return Ok(framing);
    }
    if let BodyLength::Length(n) = framing.body
        && n > MAX_INSPECTED_BODY as u64
    {
        return Err(Refused::new(413, format!("a request body over {MAX_INSPECTED_BODY} bytes")));
    }
    if head.values("content-encoding").any(|v| !v.eq_ignore_ascii_case("identity")) {
        return Err(Refused::new(415, "a compressed request body, which cannot be read for remote tools"));
    }
    Ok(framing)
}

/// What the request's head says of a body that could not be read for remote fetches, refused:
/// a file uploaded in parts (OpenAI's `/v1/uploads/{id}/parts`, Google's resumable uploads),
/// whose parts are joined only at the provider, where a batch line cut across two parts is
/// whole again; and a body in protobuf (`Content-Type: application/x-protobuf`, `alt=proto`),
/// which Google's APIs take and which names no field by its name.
pub fn judge_head(head: &Head, api: &str) -> Result<(), Refused> {
    let target = head.target.to_ascii_lowercase();
    let path = target.split('?').next().unwrap_or_default();
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let any =
        |name: &str, says: &dyn Fn(&str) -> bool| head.values(name).any(|v| says(&v.to_ascii_lowercase()));
    let in_parts = (path.contains("/uploads/") && path.trim_end_matches('/').ends_with("/parts"))
        || any("x-goog-upload-protocol", &|v| v.contains("resumable"))
        || any("x-goog-upload-command", &|_| true)
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
    let protobuf = any("content-type", &|v| v.contains("proto"))
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
        return Ok(crate::forwarder::remote_tools::named(&value, host));
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
                if let Some(found) = crate::forwarder::remote_tools::named(&value, host) {
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
                if let Some(key) = crate::forwarder::remote_tools::fetch_word(&text) {
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
pub(crate) fn strict_json(bytes: &[u8]) -> Result<serde_json::Value, serde_json::Error> {
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

    /// `f` of the head `text` (without its blank line), parsed.
    pub(crate) fn with_head<T>(text: &str, f: impl FnOnce(&Head) -> T) -> T {
        let raw = format!("{text}\r\n\r\n");
        f(&crate::http1::parse_head(raw.as_bytes()).unwrap().unwrap())
    }

    #[test]
    fn a_body_is_framed_strictly_before_it_is_read_for_tools() {
        let framing = |head: &str| with_head(head, |h| body_framing(h, true));
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
            ("POST / HTTP/1.1\r\nContent-Encoding: identity\r\nContent-Encoding: gzip", 415),
            ("POST / HTTP/1.1\r\nContent-Length: 999999999999", 413),
        ] {
            assert_eq!(framing(head).unwrap_err().status(), status, "{head}");
        }
        // Streamed on, not read: any size, any coding.
        assert!(
            with_head("POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 999999999999", |h| {
                body_framing(h, false)
            })
            .is_ok()
        );
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
            assert_eq!(with_head(head, |h| judge_head(h, "gemini")).unwrap_err().status(), status, "{head}");
        }
        for head in [
            "POST /v1/messages HTTP/1.1\r\nContent-Type: application/json",
            "POST /v1/files HTTP/1.1\r\nContent-Type: multipart/form-data; boundary=b",
            "POST /v1beta/models/m:streamGenerateContent?alt=sse HTTP/1.1\r\nContent-Type: application/json",
        ] {
            assert!(with_head(head, |h| judge_head(h, "openai")).is_ok(), "{head}");
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
