//! sandbox-init as a library: the parts the binary is made of, unit-tested without root.

pub mod conntrack;
pub mod denials;
pub mod dns;
pub mod exit;
pub mod firewall;
pub mod init;
pub mod jsonlog;
pub mod netlink;
pub mod network;
pub mod nflog;
pub mod policy;
pub mod privileges;
pub mod process;
pub mod procfs;
pub mod session;
pub mod sink;
pub mod state;
pub mod status;
