//! The HTTP/1 corpus (`sandbox-wire/corpus/http1/`, one sample per file): its format, and what
//! the name check makes of a sample. Shared by the wire suite (tests/, which sends every sample
//! through a real sandbox to real servers), the snapshot of the name check's verdicts, and the
//! fuzz targets' seeds.
//!
//! A sample file is text. A line starting with `#` is a comment (the first says what the sample
//! tries); the file's line breaks are not part of the sample: its bytes are written with escapes,
//! `\r`, `\n`, `\t`, `\0`, `\\`, `\xHH`, and `{host}` stands for the name the sample is sent to,
//! `{other}` for [`OTHER`], a name the policy does not allow (always the same, so that a body's
//! length can count it). A new trick is one new file.

use crate::http1::{self, Body, Piece};
use crate::namecheck::{HttpRequests, Sniffed, sniff};

/// The name `{other}` stands for.
pub const OTHER: &str = "other.test";

/// One sample of the corpus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The file's name, without `.http`.
    pub name: String,
    /// What it tries: its first comment.
    pub about: String,
    text: String,
}

/// Every sample in `dir` (its `*.http` files), by name.
pub fn load(dir: &std::path::Path) -> Result<Vec<Sample>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut samples = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".http"))
        else {
            continue;
        };
        let file = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let about = file.lines().find_map(|l| l.strip_prefix('#')).unwrap_or_default().trim().to_string();
        let text: String = file.lines().filter(|l| !l.starts_with('#')).collect();
        let sample = Sample { name: name.to_string(), about, text };
        sample.bytes("a.test").map_err(|e| format!("{}: {e}", path.display()))?;
        samples.push(sample);
    }
    samples.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(samples)
}

impl Sample {
    /// The sample's bytes, sent to `host`.
    pub fn bytes(&self, host: &str) -> Result<Vec<u8>, String> {
        let text = self.text.replace("{host}", host).replace("{other}", OTHER);
        let mut out = Vec::with_capacity(text.len());
        let mut chars = text.bytes();
        while let Some(b) = chars.next() {
            if b != b'\\' {
                out.push(b);
                continue;
            }
            match chars.next() {
                Some(b'r') => out.push(b'\r'),
                Some(b'n') => out.push(b'\n'),
                Some(b't') => out.push(b'\t'),
                Some(b'0') => out.push(0),
                Some(b'\\') => out.push(b'\\'),
                Some(b'x') => {
                    let hex = [chars.next().unwrap_or(b'?'), chars.next().unwrap_or(b'?')];
                    let value = std::str::from_utf8(&hex).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                    out.push(value.ok_or("a \\x escape without two hex digits")?);
                }
                _ => return Err("an unknown escape (\\r \\n \\t \\0 \\\\ \\xHH)".into()),
            }
        }
        Ok(out)
    }
}

/// One request as a reader took it: what a server acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub method: String,
    pub target: String,
    /// The first Host header's value, if any.
    pub host: Option<String>,
    /// The body's length, decoded (as far as it came, for a request cut short).
    pub body: u64,
    /// Its body ended where its head said: not cut short.
    pub whole: bool,
}

/// The requests `bytes` holds, as `http1` reads them: every whole one, then the one the bytes
/// end inside, its head whole and its body cut short, if they do.
pub fn requests(mut bytes: &[u8]) -> Vec<Parsed> {
    let mut found = Vec::new();
    while let Ok(Some(head)) = http1::parse_head(bytes) {
        let Ok(framing) = head.framing() else { break };
        let mut parsed = Parsed {
            method: head.method.to_string(),
            target: head.target.to_string(),
            host: head.values("host").next().map(str::to_string),
            body: 0,
            whole: false,
        };
        let (mut body, mut at) = (Body::new(framing.body), head.len);
        loop {
            match body.next(&bytes[at..]) {
                Ok(Some((piece, n))) => {
                    at += n;
                    if piece == Piece::Data {
                        parsed.body += n as u64;
                    }
                    if piece == Piece::End {
                        break;
                    }
                }
                _ => {
                    found.push(parsed);
                    return found;
                }
            }
        }
        parsed.whole = true;
        found.push(parsed);
        bytes = &bytes[at..];
    }
    found
}

/// What the name check does with `bytes`, sent at once as a connection's first bytes: the
/// requests it passes on (as [`requests`] reads the bytes it passes: the last may be cut short),
/// and why it ends the connection, if it does: a refusal, or a first request whose head never
/// ends.
pub fn name_check(bytes: &[u8]) -> (Vec<Parsed>, Option<&'static str>) {
    match sniff(bytes) {
        Sniffed::Http { host } => {
            let (out, refused) = HttpRequests::new(&host).feed(bytes);
            (requests(&out), refused)
        }
        Sniffed::Refused(why) => (Vec::new(), Some(why)),
        Sniffed::NeedMore => (Vec::new(), Some("a first request whose head never ends")),
        Sniffed::Tls { .. } => (Vec::new(), Some("a TLS ClientHello, not HTTP")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<Sample> {
        load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/http1")).unwrap()
    }

    /// Every sample's verdict, in one snapshot: a change to what the name check passes or refuses
    /// shows in review, sample by sample.
    #[test]
    fn the_name_checks_verdict_on_every_sample() {
        let samples = corpus();
        assert!(samples.len() >= 100, "{} samples", samples.len());
        let mut verdicts = String::new();
        for sample in &samples {
            let (passed, refused) = name_check(&sample.bytes("a.test").unwrap());
            let cut = |r: &Parsed| if r.whole { "" } else { ", cut short" };
            let passed: Vec<String> =
                passed.iter().map(|r| format!("{} {} ({}{})", r.method, r.target, r.body, cut(r))).collect();
            verdicts.push_str(&format!(
                "{}: passed [{}]{}\n",
                sample.name,
                passed.join(", "),
                refused.map(|r| format!(", then refused: {r}")).unwrap_or_default()
            ));
        }
        insta::assert_snapshot!(verdicts);
    }

    #[test]
    fn a_sample_is_text_with_escapes() {
        let sample = Sample {
            name: "x".into(),
            about: String::new(),
            text: r"GET / HTTP/1.1\r\nHost: {host}\x00\\\t".into(),
        };
        assert_eq!(sample.bytes("a.test").unwrap(), b"GET / HTTP/1.1\r\nHost: a.test\0\\\t");
        let bad = Sample { text: r"\q".into(), ..sample.clone() };
        assert!(bad.bytes("a").is_err());
        let bad = Sample { text: r"\xzz".into(), ..sample };
        assert!(bad.bytes("a").is_err());
    }

    #[test]
    fn requests_are_counted_whole() {
        let two = b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\nGET /c HTTP/1.1\r\n";
        let found = requests(two);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].body, found[1].target.as_str()), (3, "/b"));
        assert!(found.iter().all(|r| r.whole));
        let cut = requests(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\nabc");
        assert_eq!((cut.len(), cut[0].body, cut[0].whole), (1, 3, false));
    }
}
