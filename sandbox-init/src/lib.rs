//! sandbox-init as a library: the parts the binary is made of, unit-tested without root.

pub mod denials;
pub mod dns;
pub mod firewall;
pub mod policy;
pub mod privileges;
pub mod process;
