//! The policy parser must reject any input with an error, never panic or hang, and every
//! policy it accepts must be usable by the matcher and the ruleset generator.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sandbox_init::net::firewall::{NameCheck, Ruleset};
use sandbox_init::policy::{Allowlist, Policy};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for parsed in [Policy::from_yaml(Path::new("f.yaml"), text), Policy::from_list(Path::new("f.txt"), text)] {
        if let Ok(policy) = parsed {
            let allowlist = Allowlist::new(&policy);
            for pattern in policy.domains.keys() {
                let name = pattern.to_string().replace("*.", "x.");
                assert!(allowlist.access(&name).is_some(), "{pattern} does not match itself");
            }
            let name_check = Some(NameCheck { uid: 65533, check_port: 15001, pass_port: 15002, forwarder_port: 15003 });
            let ruleset = Ruleset { policy: &policy, upstreams: &[], elements: &[], log: true, set_size: 16, name_check, shape: Default::default(), model_server: None };
            let _ = ruleset.render();
        }
    }
});
