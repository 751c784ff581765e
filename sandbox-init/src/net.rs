//! The network layer: the firewall (nftables), the DNS gate and the sink it writes allowed
//! addresses to, connection tracking, the kernel's log of rejected packets, and what the
//! container's network looks like from inside. Built on the policy, below init.

pub mod budgets;
pub mod check_protocol;
pub mod checker;
pub mod dns;
pub mod enforcer;
pub mod firewall;
pub mod forwarder;
pub mod interfaces;
pub mod relay;
pub mod uids;
pub mod verdicts;
