//! Whatever a client sends first, the name check's readers decide without panicking; a name
//! they take is a host name; and the HTTP reader passes the same bytes and stops at the same
//! request however the bytes are split across reads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_wire::namecheck::{HttpRequests, Sniffed, sniff};

fn host_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// What the reader passes of `data` fed in `pieces`, and whether it refused.
fn through(data: &[u8], pieces: &[&[u8]]) -> (Vec<u8>, bool) {
    let _ = data;
    let mut requests = HttpRequests::new("a.example.com");
    let mut passed = Vec::new();
    for piece in pieces {
        let (pass, refused) = requests.feed(piece);
        passed.extend(pass);
        if refused.is_some() {
            return (passed, true);
        }
    }
    (passed, false)
}

fuzz_target!(|data: &[u8]| {
    match sniff(data) {
        Sniffed::Tls { name, .. } | Sniffed::Http { host: name } => assert!(host_name(&name), "{name:?}"),
        Sniffed::NeedMore | Sniffed::Refused(_) => {}
    }
    let split = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    let whole = through(data, &[data]);
    let parts = through(data, &[&data[..split], &data[split..]]);
    assert_eq!(whole, parts, "split at {split}");
});
