//! The name check's readers, tested on the bytes clients and attackers send: ClientHellos,
//! request heads and bodies, retries, split at every byte where it matters.

use super::*;
use crate::tls::{EXTENSION_ECH, HANDSHAKE_CLIENT_HELLO};

/// A ClientHello handshake message naming `names` (none: no server_name extension), with
/// `extra` extensions after it.
fn hello(names: &[&str], extra: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut extensions = Vec::new();
    if !names.is_empty() {
        let mut list = Vec::new();
        for name in names {
            list.push(0u8);
            list.extend((name.len() as u16).to_be_bytes());
            list.extend(name.as_bytes());
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend(list);
        extensions.extend(0u16.to_be_bytes());
        extensions.extend((data.len() as u16).to_be_bytes());
        extensions.extend(data);
    }
    for (kind, data) in extra {
        extensions.extend(kind.to_be_bytes());
        extensions.extend((data.len() as u16).to_be_bytes());
        extensions.extend(data);
    }
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(0); // session id
    body.extend([0, 2, 0x13, 0x01]); // one cipher suite
    body.extend([1, 0]); // null compression
    body.extend((extensions.len() as u16).to_be_bytes());
    body.extend(extensions);
    let mut message = vec![HANDSHAKE_CLIENT_HELLO];
    message.extend(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend(body);
    message
}

/// The handshake in TLS records, cut at `cuts` (offsets into the handshake).
fn records(handshake: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    for end in cuts.iter().copied().chain([handshake.len()]) {
        out.extend([CONTENT_HANDSHAKE, 3, 1]);
        out.extend(((end - start) as u16).to_be_bytes());
        out.extend(&handshake[start..end]);
        start = end;
    }
    out
}

fn tls(name: &str) -> Sniffed {
    Sniffed::Tls { name: name.into(), ech: false }
}

#[test]
fn the_server_name_of_a_client_hello() {
    assert_eq!(sniff(&records(&hello(&["API.Example.com"], &[]), &[])), tls("api.example.com"));
}

#[test]
fn a_hello_across_records_and_segments_is_reassembled() {
    let handshake = hello(&["api.example.com"], &[(21, vec![0; 1600])]);
    assert!(handshake.len() > 1500);
    let wire = records(&handshake, &[3, 40, 1000]);
    for cut in 0..wire.len() {
        assert_eq!(sniff(&wire[..cut]), Sniffed::NeedMore, "{cut} of {} bytes", wire.len());
    }
    assert_eq!(sniff(&wire), tls("api.example.com"));
}

#[test]
fn no_name_two_names_or_two_extensions_are_refused() {
    let refused = |bytes: Vec<u8>| matches!(sniff(&records(&bytes, &[])), Sniffed::Refused(_));
    assert!(refused(hello(&[], &[(21, vec![0; 8])])), "no server_name");
    assert!(refused(hello(&["a.example.com", "b.example.com"], &[])), "two names in the list");
    let twice = hello(&["a.example.com"], &[(0, hello(&["b.example.com"], &[])[..0].to_vec())]);
    assert!(refused(twice), "a second server_name extension");
    assert!(refused(hello(&["a.example.com."], &[])), "a trailing dot");
    assert!(refused(hello(&["10.0.0.1"], &[])), "an address");
    assert!(refused(hello(&["a\0.example.com"], &[])), "a NUL");
    let mut truncated = records(&hello(&["a.example.com"], &[]), &[]);
    truncated[8] = 0xff; // the handshake claims more than the record, and the record ends
    assert!(matches!(sniff(&truncated), Sniffed::NeedMore | Sniffed::Refused(_)));
}

#[test]
fn an_encrypted_client_hello_is_judged_by_its_outer_name() {
    let wire = records(&hello(&["public.cdn.example"], &[(EXTENSION_ECH, vec![0; 40])]), &[]);
    assert_eq!(sniff(&wire), Sniffed::Tls { name: "public.cdn.example".into(), ech: true });
}

#[test]
fn records_that_are_not_a_client_hello_are_refused() {
    let mut alert_after = records(&hello(&["a.example.com"], &[]), &[10]);
    let first_record_end = 5 + 10;
    alert_after[first_record_end] = 21; // the second record is an alert
    assert!(matches!(sniff(&alert_after), Sniffed::Refused(_)));
    let mut server_hello = hello(&["a.example.com"], &[]);
    server_hello[0] = 2;
    assert!(matches!(sniff(&records(&server_hello, &[])), Sniffed::Refused(_)));
    assert!(matches!(sniff(&[CONTENT_HANDSHAKE, 3, 1, 0x50, 0]), Sniffed::Refused(_)), "a record too long");
    assert!(matches!(sniff(b"SSH-2.0-OpenSSH_9.6\r\n"), Sniffed::Refused(_)));
    assert!(matches!(sniff(b"\x00\x00\x00\x08\x04\xd2\x16\x2f"), Sniffed::Refused(_)), "postgres");
}

fn http(request: &str) -> Sniffed {
    sniff(request.as_bytes())
}

#[test]
fn an_http_request_is_judged_by_its_host_and_loses_its_upgrade_headers() {
    let request = "GET /v1/x HTTP/1.1\r\nHost: API.example.com:8080\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nAccept: */*\r\n\r\n";
    assert_eq!(http(request), Sniffed::Http { host: "api.example.com".into() });
    let mut requests = HttpRequests::new("api.example.com");
    assert_eq!(
        String::from_utf8(requests.feed(request.as_bytes()).0).unwrap(),
        "GET /v1/x HTTP/1.1\r\nHost: API.example.com:8080\r\nAccept: */*\r\n\r\n"
    );
    let absolute = "GET http://api.example.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
    assert!(matches!(http(absolute), Sniffed::Http { .. }));
}

/// Feeds `bytes` in pieces of `step` and returns what went on, or the refusal.
fn through(host: &str, bytes: &str, step: usize) -> Result<String, &'static str> {
    passed(host, bytes, step).1.map_or_else(|| Ok(passed(host, bytes, step).0), Err)
}

/// What went on, in pieces of `step`, and why it stopped if it did.
fn passed(host: &str, bytes: &str, step: usize) -> (String, Option<&'static str>) {
    let mut requests = HttpRequests::new(host);
    let mut out = Vec::new();
    for piece in bytes.as_bytes().chunks(step) {
        let (pass, refused) = requests.feed(piece);
        out.extend(pass);
        if refused.is_some() {
            return (String::from_utf8(out).unwrap(), refused);
        }
    }
    (String::from_utf8(out).unwrap(), None)
}

#[test]
fn every_request_of_a_keep_alive_connection_must_name_the_same_host() {
    let one = "GET /a HTTP/1.1\r\nHost: a.example.com\r\n\r\n";
    let post = "POST /b HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 5\r\n\r\nhello";
    for step in [1, 7, 4096] {
        assert_eq!(
            through("a.example.com", &format!("{one}{post}{one}"), step).unwrap(),
            format!("{one}{post}{one}")
        );
    }
    let other = "GET / HTTP/1.1\r\nHost: other.example.com\r\n\r\n";
    for step in [1, 4096] {
        // The first request goes on; from the other host's on, nothing does.
        assert_eq!(
            passed("a.example.com", &format!("{one}{other}{one}"), step),
            (one.to_string(), Some("a later request on the connection names another host"))
        );
    }
}

#[test]
fn a_body_is_framed_as_the_server_frames_it_and_the_request_after_it_is_checked() {
    let body = "{\"a\": 1}\nGETTING / there\r\nhost-name: x\r\nHost: a.example.com\r\n";
    let sized =
        format!("POST / HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let smuggled = "GET / HTTP/1.1\r\nHost: other.example.com\r\n\r\n";
    for step in [1, 3, 4096] {
        assert_eq!(through("a.example.com", &sized, step).unwrap(), sized);
        assert!(through("a.example.com", &format!("{sized}{smuggled}"), step).is_err());
    }
    let chunked = format!(
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nTransfer-Encoding: chunked\r\n\r\n{:x};ext=1\r\n{body}\r\n0\r\nX-Trailer: t\r\n\r\n",
        body.len()
    );
    for step in [1, 5, 4096] {
        assert_eq!(through("a.example.com", &chunked, step).unwrap(), chunked);
        assert!(through("a.example.com", &format!("{chunked}{smuggled}"), step).is_err());
    }
    // A chunk longer than its size says, and the framings a server could read otherwise.
    let overlong =
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n";
    assert!(through("a.example.com", overlong, 4096).is_err());
    // A chunk line a server could end elsewhere than the checker: at a bare LF or CR (a request
    // would hide in what the checker reads as chunk data), or a size `+a` that some parse.
    let head = "POST / HTTP/1.1\r\nHost: a.example.com\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in [
        "2;x\nGET / HTTP/1.1\r\n",
        "2\rx\r\nab\r\n",
        "+2\r\nab\r\n",
        "2\x00\r\nab\r\n",
        "0\r\nX: a\nb\r\n\r\n",
    ] {
        for step in [1, 4096] {
            assert!(through("a.example.com", &format!("{head}{body}"), step).is_err(), "{body:?}");
        }
    }
    for head in [
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nContent-Length: -3\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: a.example.com\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert!(matches!(http(head), Sniffed::Refused(_)), "{head:?}");
    }
}

#[test]
fn an_http_request_that_could_name_another_host_is_refused() {
    for request in [
        "GET / HTTP/1.1\r\nHost: a.example.com\r\nHost: b.example.com\r\n\r\n",
        "GET http://other.example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.example.com\r\n X-Folded: b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: user@a.example.com\r\n\r\n",
        "GET / HTTP/2.0\r\nHost: a.example.com\r\n\r\n",
        "CONNECT other.example.com:443 HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.example.com\r\nX: y\nHost: b.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.example.com\r\nX: y\rHost: b.example.com\r\n\r\n",
        "GET / HTTP/1.1\nHost: b.example.com\r\nHost2: a.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.example.com\x00\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        // Any scheme's host wins over Host at nginx and Go, not only http's.
        "GET ws://other.example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        "GET git+ssh://other.example.com/x HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        "GET //other.example.com/x HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        "GET other.example.com:80 HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
    ] {
        assert!(matches!(http(request), Sniffed::Refused(_)), "{request:?}: {:?}", http(request));
    }
}

#[test]
fn a_partial_request_waits_and_an_endless_one_is_refused() {
    assert_eq!(http("GE"), Sniffed::NeedMore);
    assert_eq!(http("GET / HTTP/1.1\r\nHost: a.example.com\r\n"), Sniffed::NeedMore);
    let endless = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_HEAD));
    assert!(matches!(http(&endless), Sniffed::Refused(_)));
}

/// A server's first record: a ServerHello with `random`.
fn server_hello(random: [u8; 32]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend(random);
    body.extend([0, 0x13, 0x01, 0]);
    let mut message = vec![2];
    message.extend(&(body.len() as u32).to_be_bytes()[1..]);
    message.extend(body);
    records(&message, &[])
}

#[test]
fn a_hello_retry_request_is_told_from_a_server_hello() {
    let retry = server_hello(HELLO_RETRY_RANDOM);
    assert_eq!(hello_retry(&retry), Some(true));
    assert_eq!(hello_retry(&retry[..20]), None, "too few bytes to tell");
    assert_eq!(hello_retry(&server_hello([9; 32])), Some(false));
    assert_eq!(hello_retry(&[21, 3, 3, 0, 2, 2, 40]), Some(false), "an alert");
}

#[test]
fn after_a_retry_the_second_hello_must_name_the_same_host() {
    let first = records(&hello(&["a.example.com"], &[]), &[]);
    let ccs = [20u8, 3, 3, 0, 1, 1];
    let same = records(&hello(&["A.example.com"], &[]), &[10]);
    let other = records(&hello(&["other.example.com"], &[]), &[]);
    let after = [23u8, 3, 3, 0, 3, 1, 2, 3];
    for step in [1, 4, 4096] {
        let run = |second: &[u8]| {
            let mut retry = TlsRetry::new("a.example.com", &first);
            let stream: Vec<u8> = [&ccs[..], second, &after[..]].concat();
            let mut out = Vec::new();
            for piece in stream.chunks(step) {
                let (pass, refused) = retry.feed(piece);
                out.extend(pass);
                if let Some(reason) = refused {
                    return (out, Some(reason), retry.refused_host().map(str::to_string));
                }
            }
            (out, None, None)
        };
        let stream: Vec<u8> = [&ccs[..], &same, &after[..]].concat();
        assert_eq!(run(&same), (stream, None, None), "step {step}");
        let (out, refused, host) = run(&other);
        assert_eq!(refused, Some("a second ClientHello names another host"), "step {step}");
        assert_eq!(host.as_deref(), Some("other.example.com"));
        assert!(out.is_empty(), "no byte of the refused retry went on: {out:?}");
        assert!(run(&after).1.is_some(), "application data where the second hello belongs");
    }
    // The first bytes ended inside a record: no record header makes the check skip what
    // follows; nothing more goes on.
    let mut retry = TlsRetry::new("a.example.com", &first[..first.len() - 3]);
    let (pass, refused) = retry.feed(&[&first[first.len() - 3..], &other[..]].concat());
    assert_eq!((pass, refused), (vec![], Some("the first ClientHello's records were not whole")));
}

/// A ClientHello whose records go on past it (the header of the next record sent early, or a
/// record longer than the hello) is refused: the second ClientHello of a retry, sent there,
/// would otherwise reach the server unjudged (found by a red team: the check skipped a record
/// its header announced).
#[test]
fn a_hello_whose_records_go_on_past_it_is_refused() {
    let second = hello(&["evil.example.net"], &[]);
    let first = records(&hello(&["a.example.com"], &[]), &[]);
    assert_eq!(sniff(&first), tls("a.example.com"), "the control: the hello alone");
    let mut announced = first.clone();
    announced.extend([CONTENT_HANDSHAKE, 3, 3]);
    announced.extend((second.len() as u16).to_be_bytes());
    for cut in 1..=5 {
        let sent = &announced[..first.len() + cut];
        assert_eq!(sniff(sent), Sniffed::Refused("bytes after the ClientHello in its records"), "{cut}");
    }
    let ch = hello(&["a.example.com"], &[]);
    let mut long = vec![CONTENT_HANDSHAKE, 3, 3];
    long.extend(((ch.len() + second.len()) as u16).to_be_bytes());
    long.extend(&ch);
    assert_eq!(sniff(&long), Sniffed::Refused("bytes after the ClientHello in its records"));
    // And were such bytes ever allowed, the retry's check would judge them, not skip them.
    let mut retry = TlsRetry::new("a.example.com", &announced);
    let (out, refused) = ClientBytes::feed(&mut retry, &second);
    assert!(refused.is_some() && out.is_empty(), "{refused:?} {out:?}");
}

/// OpenSSL's TLS 1.3 server reads on past a `user_canceled` alert to the second hello and picks
/// its site by that hello's name: an alert before the second hello is judged ends the
/// connection, with or without a change_cipher_spec before it, whatever the segments, and
/// nothing of it or after it goes on.
#[test]
fn an_alert_before_the_second_hello_ends_the_connection() {
    let first = records(&hello(&["a.example.com"], &[]), &[]);
    let ccs = [20u8, 3, 3, 0, 1, 1];
    let alert = [21u8, 3, 3, 0, 2, 1, 90];
    let other = records(&hello(&["other.example.com"], &[]), &[]);
    let same = records(&hello(&["a.example.com"], &[]), &[]);
    let orders: [Vec<&[u8]>; 4] = [
        vec![&alert, &other],
        vec![&ccs, &alert, &other],
        vec![&alert, &ccs, &other],
        vec![&ccs, &alert, &same],
    ];
    for order in orders {
        let stream = order.concat();
        for step in [1, 5, 7, 13, 4096] {
            let mut retry = TlsRetry::new("a.example.com", &first);
            let mut out = Vec::new();
            let mut refused = None;
            for piece in stream.chunks(step) {
                let (pass, why) = retry.feed(piece);
                out.extend(pass);
                if why.is_some() {
                    refused = why;
                    break;
                }
            }
            assert_eq!(
                refused,
                Some("an alert before the second ClientHello was judged"),
                "step {step}: {stream:?}"
            );
            assert!(out.is_empty(), "step {step}: bytes went on: {out:?}");
        }
    }
}

/// A server that ignores a body (a GET's, most often) or answers before reading it reads the
/// body as the next request (CL.0): a body on a method that has none is refused, and so is a
/// body with a request line, or a Host line for another host, in it. Nothing of such a line
/// goes on, whatever the segments, and with `Expect: 100-continue` too (the body comes after
/// the server's go-ahead, through the same check).
#[test]
fn a_request_hidden_in_a_body_is_refused() {
    let host = "a.example.com";
    for method in ["GET", "HEAD", "OPTIONS", "TRACE", "DELETE", "get"] {
        for framing in ["Content-Length: 3", "Transfer-Encoding: chunked"] {
            let head = format!("{method} / HTTP/1.1\r\nHost: {host}\r\n{framing}\r\n\r\n");
            assert!(passed(host, &head, 4096).1.is_some(), "{head:?}");
            if method != "get" {
                assert!(matches!(http(&head), Sniffed::Refused(_)), "{head:?}");
            }
        }
    }
    let ok = format!("GET / HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(through(host, &ok, 4096).unwrap(), ok, "an empty body is no body");
    let post = |body: &str, expect: &str| {
        format!("POST /x HTTP/1.1\r\nHost: {host}\r\n{expect}Content-Length: {}\r\n\r\n{body}", body.len())
    };
    for body in [
        "GET / HTTP/1.1\r\nHost: other.example.com\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        "\r\nPOST /y HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "x=1\nHost: other.example.com\n",
        "x=1\r\nhOsT:   other.example.com:80\r\n",
        "get http://other.example.com/ http/1.1\n",
        "GET / HTTP/1.1\r\nHost: a.example",
        "x\r\nHost:",
        // Any token is a method to some server, any version after ` HTTP/` to nginx.
        "PROPFIND http://other.example.com/ HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
        "CONNECT other.example.com:443 HTTP/1.1\r\n\r\n",
        "GET http://other.example.com/ HTTP/1.1 \r\n",
        "GET http://other.example.com/ HTTP/1.01\r\n",
        "GET http://other.example.com/ HTTP/1.2\r\n",
        "GETAWAY / HTTP/1.1\n",
        "GET / HTTP/1.1\r",
        // Found by a second red team: a CR first (nginx and Node skip it), HTTP/0.9 (nginx takes
        // it for GET), and a method longer than the old bound.
        "\rGET http://other.example.com/x HTTP/1.1\r\n",
        "GET http://other.example.com/?d=1\r\n",
        "GET /x\n",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA http://other.example.com/ HTTP/1.1\r\n",
        // Found by a third red team: Node's llhttp serves RTSP/ and ICE/ request lines as HTTP/1.0
        // ones, and Python takes HTTP/0.9's `GET` with any target.
        "GET http://other.example.com/secret RTSP/1.0\r\n\r\n",
        "OPTIONS http://other.example.com/secret rtsp/1.0\r\n\r\n",
        "SOURCE http://other.example.com/secret ICE/1.0\r\n\r\n",
        "GET secret\r\n",
    ] {
        for expect in ["", "Expect: 100-continue\r\n"] {
            let request = post(body, expect);
            let head_len = request.len() - body.len();
            for step in [1, 2, 7, 4096] {
                let (out, refused) = passed(host, &request, step);
                assert!(refused.is_some(), "{body:?} step {step}: {out:?}");
                let sent = &out[head_len.min(out.len())..];
                for line in [
                    "GET",
                    "POST /y",
                    "Host: other",
                    "hOsT",
                    "get http",
                    "Host:",
                    "PROPFIND",
                    "CONNECT",
                    "OPTIONS",
                    "SOURCE",
                ] {
                    assert!(
                        !(sent.starts_with(line) || sent.contains(&format!("\n{line}"))),
                        "{body:?} step {step}: {line} went on: {out:?}"
                    );
                }
            }
        }
    }
    // JSON bodies, and text that only looks like the start of a request, pass.
    for body in [
        "{\"model\": \"x\", \"messages\": [\"GET / HTTP/1.1\"]}",
        "GET",
        "Hostname: b\n",
        // Text that starts like a request line and is none, ending the body without a newline.
        "Put it back",
        "get well soon",
        "Options are fine",
        "hello\nDelete me later",
        "GET / HTTP",
        "get it /here\n",
        "GET the docs\n",
        "Get going\n",
        "RTSP is a protocol, ICE too\n",
    ] {
        let request = post(body, "");
        for step in [1, 4096] {
            assert_eq!(through(host, &request, step).unwrap(), request, "{body:?}");
        }
    }
}

/// A chunked body goes on byte for byte in the order it came, whatever its data's lines look
/// like: data that might start a request line is held until its line ends, and the chunks'
/// framing after it waits behind it (found by the wire suite: the reader sent `5\r\n\r\n0\r\n`
/// before `hello`, and servers read a body other than the agent's).
#[test]
fn a_chunked_body_goes_on_in_order() {
    let host = "a.example.com";
    for body in [
        "5\r\nhello\r\n0\r\n\r\n",
        "3\r\nGET\r\n4\r\n the\r\n5\r\n docs\r\n0\r\n\r\n",
        "2\r\nPO\r\n3;x=1\r\nST \r\n1\r\n/\r\n0\r\nX-Trailer: 1\r\n\r\n",
        "4\r\nx\r\ny\r\n0\r\n\r\n",
    ] {
        let request = format!("POST /x HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n{body}");
        for step in [1, 2, 5, 4096] {
            assert_eq!(through(host, &request, step).unwrap(), request, "{body:?} step {step}");
        }
    }
    // A request line cut across two chunks is judged on the wire, where a server that ignores
    // the body reads it: `GET http://other/ HT` and `TP/1.1` are two lines there.
    let split = "15\r\nGET http://b.test/ HT\r\n8\r\nTP/1.1\r\n\r\n0\r\n\r\n";
    let request = format!("POST /x HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n{split}");
    assert_eq!(through(host, &request, 4096).unwrap(), request);
    // A Host line in the trailers, which some servers merge into the headers, is judged too.
    let trailer = format!(
        "POST /x HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nHost: b.test\r\n\r\n"
    );
    assert!(passed(host, &trailer, 4096).1.is_some());
}

/// Found by a red team: request lines that Python's `http.server` reads in a body it ignores,
/// and the name check did not hold: words split at a tab, a vertical tab, 0x1f or a no-break
/// space, a blank before the method, a chunk-size line with an extension that reads as one, and
/// a Host line after a bare CR. Each is refused before the line goes on; the controls, text
/// that only looks like them, pass.
#[test]
fn a_request_line_as_python_splits_it_is_refused() {
    let host = "a.example.com";
    let post = |body: &[u8]| {
        let head = format!("POST /x HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n", body.len());
        [head.as_bytes(), body].concat()
    };
    let chunked = |body: &[u8]| {
        let head = format!("POST /x HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n");
        [head.as_bytes(), body].concat()
    };
    let fed = |request: &[u8], step: usize| {
        let mut requests = HttpRequests::new(host);
        let mut out = Vec::new();
        for piece in request.chunks(step) {
            let (pass, refused) = requests.feed(piece);
            out.extend(pass);
            if refused.is_some() {
                return (out, refused);
            }
        }
        (out, None)
    };
    for request in [
        post(b"GET\t/secret\tHTTP/1.1\r\nX: a\rHost: other.test\r\n\r\n"),
        post(b" GET /secret HTTP/1.1\r\n\r\n"),
        post(b"\xa0GET\xa0/secret\xa0HTTP/1.1\r\n\r\n"),
        post(b"GET\x1f/secret\x1fHTTP/1.1\r\n\r\n"),
        post(b"GET\x0b/secret\x0bhttp/1.1\r\n\r\n"),
        chunked(b"19;x /secret HTTP/1.1\r\nX: a\rHost: other.test\r\n\r\n\r\n0\r\n\r\n"),
        // Found by a fourth red team: a first word that is no token, which Python takes as a
        // method when the application's handler serves any.
        post(b"{x http://other.test/secret HTTP/1.1\r\nX: y\rHost: other.test\r\n\r\n"),
        post(b"GET/ /secret HTTP/1.1\r\n\r\n"),
        post(b"\xe9 /secret HTTP/1.1\r\n\r\n"),
        post(b"[\t/secret\tHTTP/1.1\r\n\r\n"),
        post(b"{\"x\":1}\n{x /secret HTTP/1.1\r\n\r\n"),
    ] {
        for step in [1, 3, 4096] {
            let (out, refused) = fed(&request, step);
            assert!(refused.is_some(), "{:?} step {step}", String::from_utf8_lossy(&request));
            assert!(
                !out.windows(7).any(|w| w == b"/secret") && !out.windows(10).any(|w| w == b"other.test"),
                "{:?} step {step}: went on: {:?}",
                String::from_utf8_lossy(&request),
                String::from_utf8_lossy(&out)
            );
        }
    }
    for body in
        [&b"GET the docs\n"[..], b"Put it\tback\n", b"{\"k\": \"GET /x HTTP/1.1\"}", b"hello\tworld\n"]
    {
        let request = post(body);
        assert_eq!(fed(&request, 4096), (request.clone(), None), "{:?}", String::from_utf8_lossy(body));
    }
    // Lines of three words or fewer that are no request line go on whole; a compact JSON line,
    // one word, goes on past the longest line Python reads, whatever its length; so does a
    // body that ends in such a line with a CR in it (a blank to Python).
    let long_json = format!("{{\"data\":\"{}\"}}", "x".repeat(3 * PYTHON_MAX_LINE));
    for body in [&b"{\"a\":1}\n[1,\t2]\n}\n"[..], b"{\"a\":1}\r\n\xe9t\xe9\r", long_json.as_bytes()] {
        let request = post(body);
        for step in [1, 4096, 1 << 20] {
            let (out, refused) = fed(&request, step);
            assert!(
                refused.is_none() && out == request,
                "{:?} step {step}",
                String::from_utf8_lossy(&body[..body.len().min(40)])
            );
        }
    }
    // Found by a fifth red team: a line of exactly that length, with no LF, is a request to
    // Python when the connection ends after it: it is held, and refused; one byte more passes.
    let words = ["{x", "http://other.test/secret", "HTTP/1.1"];
    let pad = " ".repeat(PYTHON_MAX_LINE - words.concat().len() - 1);
    let line = format!("{}{pad}{} {}", words[0], words[1], words[2]);
    assert_eq!(line.len(), PYTHON_MAX_LINE);
    for step in [1, 4096, 1 << 20] {
        let (out, refused) = fed(&post(line.as_bytes()), step);
        assert!(refused.is_some() && !out.windows(7).any(|w| w == b"/secret"), "step {step}");
        let mut requests = HttpRequests::new(host);
        let head = format!("POST /x HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n", line.len() + 10);
        let (mut out, _) = requests.feed(head.as_bytes());
        for piece in line.as_bytes().chunks(step) {
            let (pass, refused) = requests.feed(piece);
            assert!(refused.is_none());
            out.extend(pass);
        }
        assert!(!out.windows(7).any(|w| w == b"/secret"), "step {step}: the line went on before it ended");
        let (pass, refused) = requests.feed(b"x");
        assert!(
            refused.is_none() && pass.windows(7).any(|w| w == b"/secret"),
            "step {step}: 65,537 bytes pass"
        );
    }
    // It is not held past that length: what came of it goes on before the line ends.
    let request = post(long_json.as_bytes());
    let (out, refused) = fed(&request[..request.len() - 1], 4096);
    assert!(
        refused.is_none() && out.len() > request.len() - long_json.len() + PYTHON_MAX_LINE,
        "{}",
        out.len()
    );
}

/// The body line judge, as it was before its scans were made fast (every line's words split,
/// every space looked at): the fast judge must give its verdict on every line.
fn judged_the_slow_way(line: &[u8], host: &str) -> Result<(), &'static str> {
    let text = line.strip_suffix(b"\n").unwrap_or(line);
    let text = skip_blanks(text.strip_suffix(b"\r").unwrap_or(text));
    let method = text.iter().position(|&b| !is_tchar(b)).unwrap_or(text.len());
    let protocol = |rest: &[u8]| {
        rest.iter().enumerate().any(|(at, &b)| {
            b == b' '
                && [&b"HTTP/"[..], b"RTSP/", b"ICE/"]
                    .iter()
                    .any(|p| rest[at + 1..].get(..p.len()).is_some_and(|w| w.eq_ignore_ascii_case(p)))
        })
    };
    if method > 0 && text.get(method) == Some(&b' ') && protocol(&text[method + 1..]) {
        return Err("a request line hidden in a request body");
    }
    let mut words = text.split(|&b| is_blank(b)).filter(|w| !w.is_empty());
    let python = match [words.next(), words.next(), words.next(), words.next()] {
        [Some(_), Some(_), Some(version), None] => {
            version.len() >= 5 && version[..5].eq_ignore_ascii_case(b"HTTP/")
        }
        [Some(b"GET"), Some(_), None, None] => true,
        [Some(method), Some(target), None, None] => {
            method.eq_ignore_ascii_case(b"GET")
                && (target.starts_with(b"/") || target.windows(3).any(|w| w == b"://"))
        }
        _ => false,
    };
    if python {
        return Err("a request line hidden in a request body");
    }
    for segment in text.split(|&b| b == b'\r') {
        if segment.len() >= 5 && segment[..5].eq_ignore_ascii_case(b"host:") {
            let value = String::from_utf8_lossy(&segment[5..]);
            if authority_host(value.trim_matches([' ', '\t'])).as_deref() != Some(host) {
                return Err("a Host line naming another host hidden in a request body");
            }
        }
    }
    Ok(())
}

/// Every line of up to four pieces, from the pieces request lines and Host lines are made of
/// and the blanks (single bytes 0x85 and 0xa0 among them) and CRs between them: the fast judge
/// and the slow one agree on each.
#[test]
fn the_fast_body_line_judge_agrees_with_the_slow_one_on_every_line_of_its_pieces() {
    // Bytes, not text: 0x85 and 0xa0 are blanks to Python alone, as single bytes.
    const PIECES: [&[u8]; 23] = [
        b"GET",
        b"get",
        b"POST",
        b"x",
        b"Host:",
        b"hOsT:",
        b" ",
        b"\t",
        b"\r",
        b"\x0b",
        b"/",
        b"//a",
        b"://",
        b"HTTP/1.1",
        b"http/",
        b" HTTP",
        b"RTSP/1.0",
        b"ICE/",
        b"api.example.com",
        b"other.test",
        b"",
        b"\x85",
        b"\xa0",
    ];
    let (host, mut refused, mut lines) = ("api.example.com", 0, 0);
    let n = PIECES.len();
    for i in 0..n.pow(4) {
        let line: Vec<u8> = (0..4).flat_map(|k| PIECES[i / n.pow(k) % n]).copied().collect();
        for ending in [&b""[..], b"\n", b"\r\n"] {
            let line = [&line[..], ending].concat();
            let (fast, slow) = (judge_body_line(&line, host), judged_the_slow_way(&line, host));
            assert_eq!(fast, slow, "{:?}", String::from_utf8_lossy(&line));
            refused += usize::from(fast.is_err());
            lines += 1;
        }
    }
    // Both verdicts are given many times: the pieces make lines of both kinds.
    assert!(refused > lines / 20 && refused < lines - lines / 20, "{refused} of {lines} refused");
}
