//! Whatever a client or an upstream sends, the gate decides without panicking: a packet is
//! refused, forwarded, answered, or dropped; a refused name is never forwarded, and nothing but
//! the question of a forwarded one leaves.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sandbox_init::net::dns::{Decision, answer_addresses, decide};
use sandbox_init::policy::{Allowlist, Policy};

fn allowlist() -> &'static Allowlist {
    static ALLOWLIST: OnceLock<Allowlist> = OnceLock::new();
    ALLOWLIST.get_or_init(|| {
        let text = "version: 1\ndomains: [api.example.com, \"*.cdn.example.com:8443\"]\n";
        Allowlist::new(&Policy::from_yaml(Path::new("p.yaml"), text).expect("valid"))
    })
}

fuzz_target!(|data: &[u8]| {
    match decide(data, allowlist()) {
        Some(Decision::Forward { id, query, access, upstream }) => {
            let name = query.name().to_ascii();
            assert!(allowlist().access(&name).is_some(), "forwarded a name outside the allowlist: {name}");
            assert!(!access.tcp.is_empty() || !access.opaque.is_empty() || !access.udp.is_empty());
            // Only the question goes upstream.
            let sent = hickory_proto::op::Message::from_vec(&upstream).expect("the gate's own query parses");
            assert_eq!(sent.queries(), std::slice::from_ref(&query));
            assert!(sent.answers().is_empty() && sent.name_servers().is_empty() && sent.additionals().is_empty());
            // The same bytes as an upstream's answer to that query.
            let _ = answer_addresses(data, id, &query);
        }
        Some(Decision::Reply { packet, .. }) => assert!(!packet.is_empty()),
        None => {}
    }
});
