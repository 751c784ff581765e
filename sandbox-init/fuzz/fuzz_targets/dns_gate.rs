//! Whatever a client or an upstream sends, the gate decides without panicking: a packet is
//! refused, forwarded, answered, or dropped, and a refused name is never forwarded.
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
        Some(Decision::Forward { id, query, access }) => {
            let name = query.name().to_ascii();
            assert!(allowlist().access(&name).is_some(), "forwarded a name outside the allowlist: {name}");
            assert!(!access.tcp.is_empty() || !access.udp.is_empty());
            // The same bytes as an upstream's answer to that query.
            let _ = answer_addresses(data, id, &query);
        }
        Some(Decision::Reply { packet, .. }) => assert!(!packet.is_empty()),
        None => {}
    }
});
