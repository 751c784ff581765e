//! The network layer, a folder per subsystem: the firewall (`firewall`: the nftables table, and
//! what else speaks to netfilter), the DNS gate (`dns`, with the sink it writes allowed addresses
//! to), the name check (`namecheck`), the key forwarder (`forwarder`); above them, the enforcement
//! PID 1 keeps (`enforcer`); beside them, what the container's network looks like from inside
//! (`interfaces`) and the services' uids (`uids`). Built on the policy, below init.

pub mod dns;
pub mod enforcer;
pub mod firewall;
pub mod forwarder;
pub mod interfaces;
pub mod namecheck;
pub mod uids;
