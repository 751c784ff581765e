//! The set-element transaction PID 1 sends reads back, strictly, as exactly the elements it was
//! made from, whatever they are and however many (an attribute whose length wrapped would put
//! the rest in another set or without a timeout); and whatever comes back on the socket, the
//! reader of the acknowledgements decides without panicking.
#![no_main]

use std::net::IpAddr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use sandbox_init::net::firewall::Element;
use sandbox_init::net::firewall::setelems::{Op, batch, decode_batch, outcome};
use sandbox_init::policy::Opening;

fuzz_target!(|data: &[u8]| {
    let _ = outcome(data, &[1, 2, 3]);
    // Elements from the input: 24 bytes each (an address, a port, an opening, a timeout),
    // repeated to reach counts an answer could bring.
    let mut elements = Vec::new();
    for chunk in data.chunks_exact(24) {
        let addr = if chunk[0] & 1 == 0 {
            IpAddr::from(<[u8; 4]>::try_from(&chunk[1..5]).unwrap())
        } else {
            IpAddr::from(<[u8; 16]>::try_from(&chunk[1..17]).unwrap())
        };
        let opening = [Opening::Checked, Opening::Opaque, Opening::Udp][usize::from(chunk[17] % 3)];
        let port = u16::from_be_bytes([chunk[18], chunk[19]]);
        let secs = u64::from(u32::from_be_bytes([chunk[20], chunk[21], chunk[22], chunk[23]]));
        let repeat = 1 + usize::from(chunk[0] >> 4) * 10;
        for _ in 0..repeat {
            elements.push(Element { addr, opening, port, timeout: Duration::from_secs(secs) });
        }
        if elements.len() > 300 {
            break;
        }
    }
    let split = data.first().map_or(0, |b| usize::from(*b)).min(elements.len());
    let (new, refresh) = elements.split_at(split);
    let (bytes, _) = batch(new, refresh, 7);
    let read = decode_batch(&bytes).expect("the transaction reads back");
    // What it must say: the new elements added with their timeouts, set by set (in name order,
    // each set's in the order given); then, set by set, the refreshed ones touched, deleted and
    // added again.
    let sets = |list: &[Element]| {
        let mut names: Vec<String> = list.iter().map(Element::set).collect();
        names.sort();
        names.dedup();
        names
    };
    let row = |op: Op, e: &Element| {
        let timeout = (op == Op::Add).then(|| e.timeout.as_millis() as u64);
        (op, e.set(), e.addr, e.port, timeout)
    };
    let mut expected = Vec::new();
    for set in sets(new) {
        expected.extend(new.iter().filter(|e| e.set() == set).map(|e| row(Op::Add, e)));
    }
    for set in sets(refresh) {
        for op in [Op::Touch, Op::Delete, Op::Add] {
            expected.extend(refresh.iter().filter(|e| e.set() == set).map(|e| row(op, e)));
        }
    }
    assert_eq!(read, expected);
});
