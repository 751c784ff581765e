//! The one HTTP/1 reader, on the bytes clients and attackers send: heads, framings, and
//! chunked bodies split at every byte.

use super::*;

fn head(text: &str) -> Result<Option<Head<'_>>, &'static str> {
    parse_head(text.as_bytes())
}

#[test]
fn a_head_is_its_request_line_and_fields() {
    let text = "POST /v1/x?a=1 HTTP/1.1\r\nHost: a.example.com\r\nX-Empty:\r\nAccept:  */*\t\r\n\r\nbody";
    let parsed = head(text).unwrap().unwrap();
    assert_eq!((parsed.method, parsed.target, parsed.version), ("POST", "/v1/x?a=1", "HTTP/1.1"));
    assert_eq!(parsed.len, text.len() - 4);
    let fields: Vec<(&str, &str)> = parsed.fields.iter().map(|f| (f.name, f.value)).collect();
    assert_eq!(fields, [("Host", "a.example.com"), ("X-Empty", ""), ("Accept", "*/*")]);
    assert_eq!(parsed.fields[2].line, "Accept:  */*\t");
    assert_eq!(parsed.values("HOST").collect::<Vec<_>>(), ["a.example.com"]);
    assert_eq!(head("GET / HTTP/1.1\r\nHost: a\r\n\r").unwrap(), None, "no blank line yet");
    assert_eq!(head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().fields, []);
}

#[test]
fn what_a_server_could_read_otherwise_is_refused() {
    for bad in [
        "GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n",
        "GET / HTTP/1.1\nHost: a\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\u{85}\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n\tfolded\r\n\r\n",
        "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
        "GET / HTTP/1.1\r\n: a\r\n\r\n",
        "GET / HTTP/1.1\r\nno colon\r\n\r\n",
        "GET / HTTP/1.1\r\nX\"y: a\r\n\r\n",
        "GET  / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1 \r\n\r\n",
        "GET /\tx HTTP/1.1\r\n\r\n",
        "GET /\u{e9} HTTP/1.1\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
        "GET / HTTP/1.2\r\n\r\n",
        "GET / http/1.1\r\n\r\n",
        "GET /\r\n\r\n",
        "G(T / HTTP/1.1\r\n\r\n",
        " GET / HTTP/1.1\r\n\r\n",
        "\r\nGET / HTTP/1.1\r\n\r\n",
    ] {
        assert!(head(bad).is_err(), "{bad:?}");
    }
    assert!(parse_head(b"GET / HTTP/1.1\r\nX: \xff\r\n\r\n").is_err(), "not UTF-8");
}

fn framing(fields: &str) -> Result<Framing, &'static str> {
    let text = format!("POST / HTTP/1.1\r\n{fields}\r\n\r\n");
    parse_head(text.as_bytes()).unwrap().unwrap().framing()
}

#[test]
fn one_length_or_chunked_and_nothing_else() {
    let length = |n| Ok(Framing { body: BodyLength::Length(n), expect_continue: false });
    assert_eq!(framing("Content-Length: 5"), length(5));
    assert_eq!(framing("content-length:007"), length(7));
    assert_eq!(framing("X: y"), length(0));
    assert_eq!(framing("Transfer-Encoding: Chunked").unwrap().body, BodyLength::Chunked);
    assert!(framing("Expect: 100-Continue\r\nContent-Length: 1").unwrap().expect_continue);
    for bad in [
        "Content-Length: 5\r\nContent-Length: 5",
        "Content-Length: 5, 5",
        "Content-Length: +5",
        "Content-Length: -5",
        "Content-Length: 0x5",
        "Content-Length: 5 5",
        "Content-Length:",
        "Content-Length: 1234567890123456789",
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: xchunked",
        "Transfer-Encoding: chunked, identity",
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: identity",
        "Transfer-Encoding: chunked\r\nConnection: close, Transfer-Encoding",
        "Content-Length: 5\r\nConnection: content-length",
        // Found by a red team: a no-break space after the token, which Rust's trim() takes
        // away and a spaces-and-tabs trim keeps: one reader named the header, the other did not.
        "Content-Length: 5\r\nConnection: content-length\u{a0}",
        "Content-Length: 5\r\nConnection: close, \u{3000}content-length",
    ] {
        assert!(framing(bad).is_err(), "{bad:?}");
    }
    let head = "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert!(parse_head(head.as_bytes()).unwrap().unwrap().framing().is_err(), "chunked on HTTP/1.0");
    let named = "GET / HTTP/1.1\r\nConnection: Keep-Alive ,\tX-Trace,,\r\nConnection: close\r\n\r\n";
    assert_eq!(
        parse_head(named.as_bytes()).unwrap().unwrap().connection_tokens().unwrap(),
        ["keep-alive", "x-trace", "close"]
    );
}

/// The pieces `body` yields for `bytes` fed `step` bytes at a time, as `(piece, bytes)`, and
/// the refusal that stopped it, if any.
fn pieces(length: BodyLength, bytes: &[u8], step: usize) -> (Vec<(Piece, Vec<u8>)>, Option<&'static str>) {
    let mut body = Body::new(length);
    let (mut fed, mut at, mut out) = (0, 0, Vec::new());
    loop {
        match body.next(&bytes[at..fed]) {
            Ok(Some((piece, n))) => {
                out.push((piece, bytes[at..at + n].to_vec()));
                at += n;
                if piece == Piece::End {
                    return (out, None);
                }
            }
            Ok(None) if fed == bytes.len() => return (out, None),
            Ok(None) => fed = (fed + step).min(bytes.len()),
            Err(why) => return (out, Some(why)),
        }
    }
}

#[test]
fn a_chunked_body_is_found_piece_by_piece_however_it_is_split() {
    let body =
        b"5\r\nhello\r\n3;ext=1\r\nabc\r\nA ; x\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n";
    for step in [1, 2, 3, 7, 4096] {
        let (found, refused) = pieces(BodyLength::Chunked, body, step);
        assert_eq!(refused, None, "step {step}");
        let data: Vec<u8> =
            found.iter().filter(|(p, _)| *p == Piece::Data).flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(data, b"helloabc0123456789", "step {step}");
        let all: Vec<u8> = found.iter().flat_map(|(_, b)| b.clone()).collect();
        assert!(body.starts_with(&all) && body[all.len()..].starts_with(b"GET"), "step {step}");
        assert_eq!(found.last().unwrap(), &(Piece::End, b"\r\n".to_vec()), "step {step}");
        assert!(found.iter().any(|(p, b)| *p == Piece::Trailer && b == b"X-T: 1\r\n"), "step {step}");
    }
    let (found, _) = pieces(BodyLength::Length(5), b"helloGET", 2);
    let data: Vec<u8> =
        found.iter().filter(|(p, _)| *p == Piece::Data).flat_map(|(_, b)| b.clone()).collect();
    assert_eq!((data.as_slice(), found.last().unwrap().0), (&b"hello"[..], Piece::End));
    assert_eq!(Body::new(BodyLength::Length(0)).next(b"GET").unwrap(), Some((Piece::End, 0)));
}

#[test]
fn a_malformed_chunk_is_refused_wherever_it_is_split() {
    for bad in [
        &b"5\r\nhello!\r\n0\r\n\r\n"[..],
        b"zz\r\nhello\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"5\rhello\r\n",
        b"5 \r\nhello\r\n",
        b" 5\r\nhello\r\n",
        b"+5\r\nhello\r\n",
        b"0x5\r\nhello\r\n",
        b"1000000000000000\r\n",
        b"5;a\x00b\r\nhello\r\n",
        b"5;\xc3\xa9\r\nhello\r\n",
        b"0\r\nno colon\r\n\r\n",
        b"0\r\nX y: 1\r\n\r\n",
        b"0\r\nX: a\nb\r\n\r\n",
        b"0\r\n\n",
        b"\r\n",
    ] {
        for step in [1, 4096] {
            let (_, refused) = pieces(BodyLength::Chunked, bad, step);
            assert!(refused.is_some(), "{bad:?} step {step}");
        }
    }
    let long = format!("5;{}\r\n", "x".repeat(MAX_CHUNK_LINE));
    assert!(pieces(BodyLength::Chunked, long.as_bytes(), 4096).1.is_some());
}
