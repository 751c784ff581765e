//! Where an address points, for the DNS gate's answers: a name the policy allows is a public
//! service's, and its answer opens the address it gives; but an answer the agent can steer (a
//! wildcard entry whose zone it controls, a rebinding answer) could point an allowed name at the
//! cloud's metadata service (its credentials) or at the user's own network (the router, a
//! database). So an answer opens a public address; a private one (RFC 1918, unique local,
//! shared address space) only for an entry that says `private: true`; a local one (loopback,
//! link-local, unspecified) or a metadata service's never: a `cidrs` entry that names it opens
//! it, on its own ports, without any name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an address is, as far as an answer may open it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Anywhere else: opened by an allowed name's answer.
    Public,
    /// The user's network: 10/8, 172.16/12, 192.168/16, 100.64/10 (shared address space,
    /// carrier NAT and some clouds), fc00::/7. Opened only for an entry with `private: true`.
    Private,
    /// This host or its link: loopback, link-local (169.254/16, fe80::/10), unspecified
    /// (0.0.0.0/8 and `::`, which connect to this host). Never opened by an answer.
    Local,
    /// A cloud's metadata or host service (AWS, GCP, Azure, OpenStack: 169.254.169.254; AWS's
    /// fd00:ec2::/64 (instance metadata, EKS Pod Identity) and GCP's fd20:ce::/64; Alibaba Cloud: 100.100.100.200; Azure's WireServer
    /// 168.63.129.16; Oracle Cloud Classic: 192.0.0.192). Never opened by an answer.
    Metadata,
    /// Not one host of the internet: multicast, broadcast, the reserved 240/4, IETF protocol
    /// assignments (192.0.0.0/24), Teredo (2001::/32, whose IPv4 is hidden). Never opened.
    Special,
}

impl Scope {
    /// Whether an answer for an entry that does (`private`) or does not say `private: true`
    /// opens an address of this scope.
    pub fn opened_by_answer(self, private: bool) -> bool {
        match self {
            Scope::Public => true,
            Scope::Private => private,
            Scope::Local | Scope::Metadata | Scope::Special => false,
        }
    }

    /// How the denial log and `pending` name it.
    pub fn describe(self) -> &'static str {
        match self {
            Scope::Public => "a public address",
            Scope::Private => "an address of the user's network",
            Scope::Local => "a loopback or link-local address",
            Scope::Metadata => "a cloud metadata service's address",
            Scope::Special => "a multicast, broadcast or reserved address",
        }
    }
}

const METADATA_V4: [Ipv4Addr; 4] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(192, 0, 0, 192),
];
/// The cloud services' IPv6 metadata prefixes, each a /64 whose every address is the service's:
/// AWS's `fd00:ec2::/64` (the instance metadata at `::254`, EKS Pod Identity's credentials at
/// `::23`, DNS at `::253`, time at `::123`) and GCP's `fd20:ce::/64`.
const METADATA_V6: [Ipv6Addr; 2] =
    [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0), Ipv6Addr::new(0xfd20, 0x00ce, 0, 0, 0, 0, 0, 0)];

/// The scope of `addr`. An IPv6 address that carries an IPv4 one is judged by the IPv4 address
/// it carries: IPv4-mapped `::ffff:a.b.c.d` (an IPv6 socket connects to it as that IPv4
/// address), IPv4-compatible `::a.b.c.d`, NAT64's `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4's
/// `2002:a.b.c.d::/48` (a translator or relay forwards them there).
pub fn scope(addr: IpAddr) -> Scope {
    match addr {
        IpAddr::V4(v4) => scope_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => scope_v4(v4),
            None => scope_v6(v6),
        },
    }
}

fn scope_v4(a: Ipv4Addr) -> Scope {
    let [first, second, ..] = a.octets();
    if METADATA_V4.contains(&a) {
        Scope::Metadata
    } else if a.is_loopback() || a.is_link_local() || first == 0 {
        Scope::Local
    } else if a.is_multicast() || first >= 240 || (first == 192 && second == 0 && a.octets()[2] == 0) {
        Scope::Special
    } else if a.is_private() || (first == 100 && (64..128).contains(&second)) {
        Scope::Private
    } else {
        Scope::Public
    }
}

fn scope_v6(a: Ipv6Addr) -> Scope {
    let first = a.segments()[0];
    if METADATA_V6.iter().any(|m| m.segments()[..4] == a.segments()[..4]) {
        Scope::Metadata
    } else if a.is_loopback() || a.is_unspecified() || (first & 0xffc0) == 0xfe80 {
        Scope::Local
    } else if a.is_multicast() || (first == 0x2001 && a.segments()[1] == 0) {
        Scope::Special
    } else if (first & 0xfe00) == 0xfc00 {
        Scope::Private
    } else {
        Scope::Public
    }
}

fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    match s {
        // `::` and `::1` are this host's (loopback, unspecified), not IPv4-compatible.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0xffff | 0, _, _] => Some(v4(s[6], s[7])),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(v4(s[6], s[7])),
        // NAT64's local-use prefix: the IPv4 address in the last 32 bits, as in /96 (RFC 8215).
        [0x64, 0xff9b, 1, ..] => Some(v4(s[6], s[7])),
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(text: &str) -> Scope {
        scope(text.parse().unwrap())
    }

    #[test]
    fn metadata_services_loopback_and_link_local_are_never_opened_by_an_answer() {
        for addr in [
            "169.254.169.254",
            "100.100.100.200",
            "168.63.129.16",
            "192.0.0.192",
            "fd00:ec2::254",
            "fd20:ce::254",
            "fd00:ec2::23",
            "fd00:ec2::253",
            "fd20:ce::1",
            "::ffff:169.254.169.254",
            "::a9fe:a9fe",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
        ] {
            assert_eq!(of(addr), Scope::Metadata, "{addr}");
        }
        for addr in [
            "255.255.255.255",
            "224.0.0.251",
            "239.1.2.3",
            "240.0.0.1",
            "192.0.0.8",
            "ff02::1",
            "ff05::2",
            "2001:0:4136:e378::1",
        ] {
            assert_eq!(of(addr), Scope::Special, "{addr}");
            assert!(!of(addr).opened_by_answer(true), "{addr}");
        }
        for addr in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "169.254.1.1",
            "fe80::1",
            "febf::1",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(of(addr), Scope::Local, "{addr}");
        }
        for scope in [Scope::Local, Scope::Metadata] {
            assert!(!scope.opened_by_answer(true) && !scope.opened_by_answer(false));
        }
    }

    #[test]
    fn the_users_network_is_opened_only_for_an_entry_that_says_so() {
        for addr in [
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "fc00::1",
            "fd12:3456::1",
            "::ffff:192.168.1.1",
        ] {
            assert_eq!(of(addr), Scope::Private, "{addr}");
        }
        assert!(Scope::Private.opened_by_answer(true) && !Scope::Private.opened_by_answer(false));
    }

    #[test]
    fn everything_else_is_public() {
        for addr in [
            "140.82.112.3",
            "172.32.0.1",
            "172.15.255.255",
            "100.63.255.255",
            "100.128.0.1",
            "198.18.0.1",
            "192.0.2.1",
            "169.255.0.1",
            "2606:50c0:8000::153",
            "2001:db8::1",
            "fec0::1",
            "64:ff9b::8c52:7003",
        ] {
            assert_eq!(of(addr), Scope::Public, "{addr}");
        }
    }
}
