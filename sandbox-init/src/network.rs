//! What the container's network looks like from inside: its interfaces, whether IPv6 is up, and
//! an address to prove the firewall with (one that would leave through a real route).

use std::net::{IpAddr, Ipv4Addr};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// Interfaces other than loopback.
    pub interfaces: Vec<String>,
    /// A global IPv6 address is configured on some interface.
    pub ipv6: bool,
}

impl Network {
    pub fn detect() -> Network {
        let mut interfaces: Vec<String> = std::fs::read_dir("/sys/class/net")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|name| name != "lo")
            .collect();
        interfaces.sort();
        let ipv6 = std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|t| has_global_ipv6(&t));
        Network { interfaces, ipv6 }
    }

    /// `--network none`: nothing but loopback, nothing to filter.
    pub fn loopback_only(&self) -> bool {
        self.interfaces.is_empty()
    }
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
    fn only_a_global_address_turns_ipv6_on() {
        let link_local = "fe80000000000000004242fffeac1202 02 40 20 80     eth0\n00000000000000000000000000000001 01 80 10 80       lo\n";
        assert!(!has_global_ipv6(link_local));
        assert!(has_global_ipv6("fd00000000000000000000000000000a 02 40 00 80     eth0\n"));
    }
}
