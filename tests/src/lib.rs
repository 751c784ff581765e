//! The harness of the container suites. Below the suites, which use only it (never each other),
//! in layers from the bottom: `place` (what a test may be given and its shape, from its path), `docker` (networks, volumes, exec, cleanup), `tls` (a test CA and
//! certificates for peers), `probe` (the probe binary and its reports), `images` (what the suites run), `peers` (servers and the DNS peer on
//! the test networks), `sandbox` (a running sandbox's handle), `spec` (a sandbox from its spec, one
//! translation for every way of starting it), `assert` (what must hold of a
//! sandbox), `contract` (what every image keeps), `verify` (sandbox-verify's test world, so the
//! attacks:: suite runs the checks `agent-sandbox verify` runs); `kubelet` (a Pod `agent-sandbox k8s` prints, run on
//! the engine as a kubelet would), `podman` (a rootful Podman service of the test's own); `registry` (a registry on loopback) and `launcher` (the
//! `agent-sandbox` binary, on projects that clean up after it) stand apart, as does `browser`
//! (headless Chromium through chromedriver, for the suites that drive a web page), and `vm` (an
//! arm64 image's filesystem booted on Debian's arm64 kernel under qemu-system-aarch64).

pub mod assert;
pub mod browser;
pub mod contract;
pub mod docker;
pub mod images;
pub mod kubelet;
pub mod launcher;
pub mod peers;
pub mod place;
pub mod podman;
pub mod probe;

pub mod registry;
pub mod sandbox;
pub mod scan;
pub mod spec;
pub mod tls;
pub mod verify;
pub mod vm;
pub mod world;

/// The workspace root.
pub fn root() -> std::path::PathBuf {
    xtask::project::root()
}
