//! The harness of the container suites. Below the suites, which use only it (never each other):
//! `images` (what the suites run), `docker` (networks, volumes, peers, exec, cleanup), `sandbox`
//! (a sandbox from its spec, and the probe run inside it), `assert` (what must hold of a
//! sandbox), `contract` (what every image keeps), `registry` (a registry on loopback).

pub mod assert;
pub mod contract;
pub mod docker;
pub mod images;
pub mod registry;
pub mod sandbox;

/// The workspace root.
pub fn root() -> std::path::PathBuf {
    xtask::project::root()
}
