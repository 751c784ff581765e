//! `cargo bench -p sandbox-wire --bench feed`: what the name check's reader of a plain HTTP
//! connection's later bytes (`HttpRequests::feed`) costs per byte, against copying the same
//! bytes once (what a relay that reads nothing does between its read and its write), measured
//! in the same run: one POST of source-like text (every line read for a request hidden in it)
//! and one of binary bytes, fed 64 KiB at a time as the checker reads them.

use std::hint::black_box;
use std::time::{Duration, Instant};

use sandbox_wire::namecheck::HttpRequests;

const CHUNK: usize = 64 * 1024;
const HOST: &str = "api.allowed.test";

/// What is sent, 64 KiB of it: what the sandbox bench's `upload` probe sends (one line of source
/// again and again, or high bytes with no line end), and real source, this crate's ClientHello
/// reader (comments' slashes, short lines; no request line in it, which would be refused).
fn chunk(what: &str) -> Vec<u8> {
    match what {
        "binary" => (0..CHUNK).map(|i| (i % 127) as u8 | 0x80).collect(),
        "the probe's text" => b"fn exfiltrated() -> &'static str { \"the project, line by line\" }\n"
            .repeat(1024)[..CHUNK]
            .to_vec(),
        _ => include_bytes!("../src/tls.rs").repeat(CHUNK / 1000)[..CHUNK].to_vec(),
    }
}

/// The fastest of `runs` passes of `pass`, in MB/s of `bytes`.
fn best(runs: usize, bytes: usize, mut pass: impl FnMut()) -> f64 {
    let fastest = (0..runs)
        .map(|_| {
            let started = Instant::now();
            pass();
            started.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX);
    bytes as f64 / fastest.as_secs_f64() / 1e6
}

fn main() {
    let mb: usize = std::env::var("BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let chunks = mb * 1_000_000 / CHUNK;
    let total = chunks * CHUNK;
    println!("HttpRequests::feed, {mb} MB in 64 KiB pieces, fastest of 5      copied once   fed     ratio");
    for what in ["the probe's text", "tls.rs", "binary"] {
        let piece = chunk(what);
        let copied = best(5, total, || {
            let mut out = Vec::with_capacity(CHUNK);
            for _ in 0..chunks {
                out.clear();
                out.extend_from_slice(black_box(&piece));
                black_box(&out);
            }
        });
        let fed = best(5, total, || {
            let mut requests = HttpRequests::new(HOST);
            let head = format!("POST /upload HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {total}\r\n\r\n");
            let (_, refused) = requests.feed(head.as_bytes());
            assert_eq!(refused, None);
            for _ in 0..chunks {
                let (out, refused) = requests.feed(black_box(&piece));
                assert!(refused.is_none());
                black_box(out);
            }
        });
        println!("  {what:<57} {copied:>7.0} MB/s {fed:>6.0} MB/s  {:.3}", fed / copied);
    }
}
