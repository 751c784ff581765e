//! The network layer: the firewall (nftables), the DNS gate and the sink it writes allowed
//! addresses to, connection tracking, the kernel's log of rejected packets, and what the
//! container's network looks like from inside. Built on the policy, below init.

pub mod dns;
pub mod enforcer;
pub mod firewall;
pub mod forwarder;
pub mod interfaces;
pub mod namecheck;
pub mod uids;
