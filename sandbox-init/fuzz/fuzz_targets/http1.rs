//! sandbox-wire's HTTP/1 reader on any bytes: the head parser, the framing rule and the chunked
//! decoder never panic; a decoder's pieces never take more bytes than it was given; and a head
//! it parsed, written out again field by field, parses to the same request line, fields and
//! framing (so what the forwarder rewrites from a parsed head frames the body as the agent's
//! did). Seeds: the corpus (`cargo run -p sandbox-wire --example seeds -- DIR`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_wire::http1::{Body, BodyLength, Head, parse_head};

fn fields<'a>(head: &Head<'a>) -> Vec<(&'a str, &'a str)> {
    head.fields.iter().map(|f| (f.name, f.value)).collect()
}

fuzz_target!(|data: &[u8]| {
    // The decoder alone, both ways, on the bytes as they are.
    for length in [BodyLength::Chunked, BodyLength::Length(data.len() as u64 / 2)] {
        let (mut body, mut at) = (Body::new(length), 0);
        while let Ok(Some((_, n))) = body.next(&data[at..]) {
            at += n;
            assert!(at <= data.len());
            if body.done() {
                break;
            }
        }
    }
    let Ok(Some(head)) = parse_head(data) else { return };
    assert!(head.len <= data.len());
    let mut again = format!("{}\r\n", head.request_line);
    for field in &head.fields {
        again.push_str(&format!("{}: {}\r\n", field.name, field.value));
    }
    again.push_str("\r\n");
    let reparsed = parse_head(again.as_bytes()).expect("a head written from a parsed one parses").expect("whole");
    assert_eq!((reparsed.method, reparsed.target, reparsed.version), (head.method, head.target, head.version));
    assert_eq!(fields(&reparsed), fields(&head));
    assert_eq!(reparsed.framing(), head.framing());
});
