//! Whatever the kernel (or anything on the socket) answers a set-element transaction with, the
//! reader of its acknowledgements decides without panicking, and never reports success while
//! an error for one of the transaction's messages is among the answers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_init::net::netlink::{NLMSG_ERROR, messages};
use sandbox_init::net::setelems::outcome;

fuzz_target!(|data: &[u8]| {
    let acked = [1u32, 2, 3];
    if outcome(data, &acked) == Some(Ok(())) {
        let error = messages(data).any(|(kind, _, payload)| {
            kind == NLMSG_ERROR && payload.len() >= 20 && payload[..4] != [0, 0, 0, 0]
        });
        assert!(!error, "success reported over an error");
    }
});
