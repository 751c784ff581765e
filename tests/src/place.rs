//! Where a test sits says what it needs and in which shape it runs: its path, as libtest names
//! its thread (and nextest its process), `firewall::net_admin::sidecar::allowed_names_…`. A
//! test may start a container with NET_ADMIN only under a `net_admin` module; the agent's
//! container under gVisor only under `gvisor`; the arm64 VM only under `arm64::release`. The
//! harness refuses the rest, naming the test, so a need cannot be forgotten in the filters that
//! schedule it (.config/nextest.toml's profiles, `cargo xtask test`'s).
//!
//! The suites put tests there with `net_admin!` (tests/suites/main.rs), which generates a test
//! once per shape it runs in: `net_admin::single::` (one container), `net_admin::sidecar::`
//! (every sandbox with NET_ADMIN is sidecar mode's pair: a gateway, and an agent container
//! without any capability) and `net_admin::gvisor::` (that pair with the agent's container
//! under runsc).

/// The running test's path: the name libtest gives its thread, else the one nextest exports.
pub fn test_path() -> String {
    if let Some(name) = std::thread::current().name().filter(|n| n.contains("::")) {
        return name.to_string();
    }
    std::env::var("NEXTEST_TEST_NAME").unwrap_or_default()
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split("::")
}

/// The shape a test runs in, from its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The sandbox as the test asks for it: one container, unless it asks for a pair.
    Single,
    /// Every sandbox with NET_ADMIN is sidecar mode's pair.
    Sidecar,
    /// Sidecar mode's pair, the agent's container under gVisor (`runsc`).
    Gvisor,
}

impl Shape {
    /// The shape of the test at `path`: the segment after `net_admin`.
    pub fn of(path: &str) -> Shape {
        let mut after = segments(path).skip_while(|s| *s != "net_admin").skip(1);
        match after.next() {
            Some("sidecar") => Shape::Sidecar,
            Some("gvisor") => Shape::Gvisor,
            _ => Shape::Single,
        }
    }

    /// The running test's.
    pub fn current() -> Shape {
        Shape::of(&test_path())
    }

    /// Its module name.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Single => "single",
            Shape::Sidecar => "sidecar",
            Shape::Gvisor => "gvisor",
        }
    }
}

/// What a test may be given, by its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// CAP_NET_ADMIN for a container (a sandbox, a gateway, a launcher's sandbox on a network).
    NetAdmin,
    /// The agent's container under gVisor.
    Runsc,
    /// The arm64 VM (qemu-system-aarch64, as root, both cores).
    Arm64Vm,
}

impl Need {
    /// Whether the test at `path` may be given it.
    pub fn allowed_at(self, path: &str) -> bool {
        let has = |name: &str| segments(path).any(|s| s == name);
        match self {
            Need::NetAdmin => has("net_admin"),
            Need::Runsc => has("net_admin") && has("gvisor"),
            Need::Arm64Vm => path.starts_with("arm64::release::"),
        }
    }

    fn module(self) -> &'static str {
        match self {
            Need::NetAdmin => "a `net_admin` module (tests/suites/main.rs's `net_admin!`)",
            Need::Runsc => "`net_admin::gvisor` (`net_admin!([gvisor] …)`)",
            Need::Arm64Vm => "`arm64::release`",
        }
    }
}

/// Set by a bench (`cargo xtask bench`), which no test filter schedules and which measures
/// every shape by asking for it (`.sidecar()`, `.under("runsc")`): it has no test's place.
static BENCH: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Declares the process a bench: it may be given NET_ADMIN and gVisor, and runs in the shape
/// its sandboxes ask for (one container by default). Not the arm64 VM.
pub fn bench() {
    let _ = BENCH.set(());
}

/// Refuses `need` to the running test unless its place says so.
pub fn ensure(need: Need) -> anyhow::Result<()> {
    if BENCH.get().is_some() && need != Need::Arm64Vm {
        return Ok(());
    }
    let path = test_path();
    anyhow::ensure!(
        need.allowed_at(&path),
        "{path:?} asks for {need:?}, but its place does not say so: put it under {}, so that the \
         filters that schedule tests by their needs schedule it",
        need.module()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tests_shape_and_needs_are_read_from_its_place() {
        let sidecar = "firewall::net_admin::sidecar::allowed_names_are_reachable";
        assert_eq!(Shape::of(sidecar), Shape::Sidecar);
        assert_eq!(Shape::of("keys::net_admin::gvisor::x"), Shape::Gvisor);
        assert_eq!(Shape::of("forward::net_admin::single::x"), Shape::Single);
        assert_eq!(Shape::of("refusals::without_net_admin_the_agent_never_starts"), Shape::Single);
        assert!(Need::NetAdmin.allowed_at(sidecar));
        assert!(!Need::NetAdmin.allowed_at("refusals::without_net_admin_the_agent_never_starts"));
        assert!(!Need::NetAdmin.allowed_at("launcher::net_admin_x"), "a prefix is no place");
        assert!(Need::Runsc.allowed_at("keys::net_admin::gvisor::x"));
        assert!(!Need::Runsc.allowed_at(sidecar));
        assert!(Need::Arm64Vm.allowed_at("arm64::release::kernel::the_firewall_holds"));
        assert!(!Need::Arm64Vm.allowed_at("arm64::shell::labels"));
    }

    /// A bench (no test's place, as `cargo xtask bench` runs it) may be given NET_ADMIN and
    /// gVisor once it says it is one, and not before; never the arm64 VM. Found when `cargo
    /// xtask bench sandbox` failed at its first sandbox after places came in.
    #[test]
    fn a_bench_is_given_what_it_asks_for_once_it_says_so() {
        std::thread::Builder::new()
            .name("main".into())
            .spawn(|| {
                assert!(ensure(Need::NetAdmin).is_err(), "no place yet");
                bench();
                assert!(ensure(Need::NetAdmin).is_ok() && ensure(Need::Runsc).is_ok());
                assert!(ensure(Need::Arm64Vm).is_err());
                assert_eq!(Shape::current(), Shape::Single);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
