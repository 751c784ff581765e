//! What the container's network looks like from inside: its interfaces, whether IPv6 is up,
//! whether it is the host's own, and an address to prove the firewall with (one that would
//! leave through a real route).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// Interfaces other than loopback.
    pub interfaces: Vec<String>,
    /// Interfaces only a host's network namespace has: physical devices and bridges. A
    /// container's own namespace has only virtual ones (veth, macvlan, ipvlan, tap).
    pub host_interfaces: Vec<String>,
    /// A global IPv6 address is configured on some interface.
    pub ipv6: bool,
}

impl Network {
    pub fn detect() -> Network {
        let mut network = Network::from_sysfs(Path::new("/sys/class/net"));
        network.ipv6 = std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|t| has_global_ipv6(&t));
        network
    }

    /// The interfaces listed in `class_net` (/sys/class/net), each a link into the device tree:
    /// under `devices/virtual/` for a virtual one, with a `bridge` folder for a bridge.
    pub fn from_sysfs(class_net: &Path) -> Network {
        let (mut interfaces, mut host_interfaces) = (Vec::new(), Vec::new());
        for entry in std::fs::read_dir(class_net).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "lo" {
                continue;
            }
            let physical = std::fs::read_link(entry.path())
                .is_ok_and(|target| !target.to_string_lossy().contains("devices/virtual/"));
            if physical || entry.path().join("bridge").is_dir() {
                host_interfaces.push(name.clone());
            }
            interfaces.push(name);
        }
        interfaces.sort();
        host_interfaces.sort();
        Network { interfaces, host_interfaces, ipv6: false }
    }

    /// `--network none`: nothing but loopback, nothing to filter.
    pub fn loopback_only(&self) -> bool {
        self.interfaces.is_empty()
    }

    /// `--network host`: the firewall would be the host's, and the host's services on loopback
    /// the agent's to reach.
    pub fn is_hosts(&self) -> bool {
        !self.host_interfaces.is_empty()
    }
}

/// Whether the agent could pose as this resolver: a loopback address inside the container is
/// the agent's to bind (Docker lets any user bind any port). Docker's embedded DNS, 127.0.0.11,
/// is the exception: its port 53 is Docker's DNAT, and nothing but root sends from port 53.
pub fn impersonable_resolver(addr: &IpAddr) -> bool {
    // An IPv4-mapped address (`::ffff:127.0.0.1`) is the IPv4 address it maps.
    let addr = addr.to_canonical();
    addr.is_loopback() && addr != IpAddr::V4(crate::net::firewall::DOCKER_DNS)
}

/// /proc/net/if_inet6 lines: address, index, prefix length, scope, flags, device. Scope 00 is
/// global.
fn has_global_ipv6(text: &str) -> bool {
    text.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() == 6 && fields[3] == "00" && fields[5] != "lo"
    })
}

/// Addresses to probe the firewall with, in order of preference: documentation addresses when
/// a default route exists (the probe would otherwise leave through it), else an address inside
/// each directly connected network (an internal network has no default route, and an address
/// with no route fails before the firewall sees it).
pub fn probe_targets(route_table: &str) -> Vec<IpAddr> {
    let mut targets = Vec::new();
    let mut networks = Vec::new();
    for line in route_table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 || fields[0] == "lo" {
            continue;
        }
        let (Ok(dest), Ok(mask)) = (u32::from_str_radix(fields[1], 16), u32::from_str_radix(fields[7], 16))
        else {
            continue;
        };
        // /proc/net/route prints the network-order words as native integers.
        let (dest, mask) = (u32::from_be(dest), u32::from_be(mask));
        if mask == 0 {
            targets.extend(
                ["192.0.2.1", "198.51.100.1", "203.0.113.1"].map(|a| a.parse::<IpAddr>().expect("valid")),
            );
        } else if mask != u32::MAX {
            // The last address before broadcast: rarely a real host, and never reached anyway.
            let host = (dest & mask) | (!mask - 1);
            networks.push(IpAddr::V4(Ipv4Addr::from(host)));
        }
    }
    targets.extend(networks);
    targets.dedup();
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_targets_prefer_documentation_addresses_when_a_default_route_exists() {
        let with_default = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t010012AC\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t000012AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
        let targets = probe_targets(with_default);
        assert_eq!(targets[0], "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(targets.last().unwrap(), &"172.18.255.254".parse::<IpAddr>().unwrap());
        let internal = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t000016AC\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0\n";
        assert_eq!(probe_targets(internal), vec!["172.22.15.254".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn physical_devices_and_bridges_mark_the_hosts_namespace() {
        let sys = tempfile::tempdir().unwrap();
        let link =
            |name: &str, target: &str| std::os::unix::fs::symlink(target, sys.path().join(name)).unwrap();
        link("lo", "../../devices/virtual/net/lo");
        link("eth0", "../../devices/virtual/net/eth0");
        let container = Network::from_sysfs(sys.path());
        assert_eq!((container.interfaces.clone(), container.is_hosts()), (vec!["eth0".to_string()], false));

        let bridge = sys.path().join("devices/virtual/net/docker0");
        std::fs::create_dir_all(bridge.join("bridge")).unwrap();
        link("docker0", &bridge.display().to_string());
        link("ens3", "../../devices/pci0000:00/0000:00:03.0/virtio2/net/ens3");
        let host = Network::from_sysfs(sys.path());
        assert_eq!(host.host_interfaces, vec!["docker0".to_string(), "ens3".to_string()]);
        assert!(host.is_hosts());
    }

    #[test]
    fn a_resolver_on_loopback_is_one_the_agent_could_pose_as_but_dockers() {
        for (addr, impersonable) in [
            ("127.0.0.53", true),
            ("127.0.0.1", true),
            ("::1", true),
            ("127.0.0.11", false),
            ("::ffff:127.0.0.53", true),
            ("10.0.0.2", false),
        ] {
            assert_eq!(impersonable_resolver(&addr.parse().unwrap()), impersonable, "{addr}");
        }
    }

    #[test]
    fn only_a_global_address_turns_ipv6_on() {
        let link_local = "fe80000000000000004242fffeac1202 02 40 20 80     eth0\n00000000000000000000000000000001 01 80 10 80       lo\n";
        assert!(!has_global_ipv6(link_local));
        assert!(has_global_ipv6("fd00000000000000000000000000000a 02 40 00 80     eth0\n"));
    }
}
