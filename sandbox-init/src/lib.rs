//! sandbox-init as a library: the parts the binary is made of, unit-tested without root.

pub mod apis;
pub mod attach;
pub mod connections;
pub mod console;
pub mod denials;
pub mod exit;
pub mod health;
pub mod init;
pub mod jsonlog;
pub mod net;
pub mod poll;
/// The policy types live in their own crate, which the build system shares.
pub use sandbox_policy as policy;
pub mod privileges;
pub mod process;
pub mod procfs;
pub mod ready;
pub mod secrets;
pub mod session;
pub mod sidecar;
pub mod state;
pub mod status;
pub mod statusline;
pub mod timeline;
pub mod tree;
pub mod verify;
