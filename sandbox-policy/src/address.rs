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
    /// A cloud's metadata service (AWS, GCP, Azure, OpenStack: 169.254.169.254 and
    /// fd00:ec2::254; Alibaba Cloud: 100.100.100.200). Never opened by an answer.
    Metadata,
}

impl Scope {
    /// Whether an answer for an entry that does (`private`) or does not say `private: true`
    /// opens an address of this scope.
    pub fn opened_by_answer(self, private: bool) -> bool {
        match self {
            Scope::Public => true,
            Scope::Private => private,
            Scope::Local | Scope::Metadata => false,
        }
    }

    /// How the denial log and `pending` name it.
    pub fn describe(self) -> &'static str {
        match self {
            Scope::Public => "a public address",
            Scope::Private => "an address of the user's network",
            Scope::Local => "a loopback or link-local address",
            Scope::Metadata => "a cloud metadata service's address",
        }
    }
}

const METADATA_V4: [Ipv4Addr; 2] = [Ipv4Addr::new(169, 254, 169, 254), Ipv4Addr::new(100, 100, 100, 200)];
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)];

/// The scope of `addr`. An IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`,
/// which an IPv6 socket connects to as that IPv4 address; NAT64's `64:ff9b::/96`, which a
/// translator forwards there) is judged by the IPv4 address it carries.
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
    } else if a.is_private() || (first == 100 && (64..128).contains(&second)) {
        Scope::Private
    } else {
        Scope::Public
    }
}

fn scope_v6(a: Ipv6Addr) -> Scope {
    let first = a.segments()[0];
    if METADATA_V6.contains(&a) {
        Scope::Metadata
    } else if a.is_loopback() || a.is_unspecified() || (first & 0xffc0) == 0xfe80 {
        Scope::Local
    } else if (first & 0xfe00) == 0xfc00 {
        Scope::Private
    } else {
        Scope::Public
    }
}

fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let last = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(last()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last()),
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
            "fd00:ec2::254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert_eq!(of(addr), Scope::Metadata, "{addr}");
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
