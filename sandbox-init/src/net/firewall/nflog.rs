//! Rejected connections for the denial log: the output chain's last rule sends each rejected
//! packet to an nflog group, read here from a netfilter netlink socket (the kernel log is not
//! readable inside a container). Only the headers are copied; the denial log folds repeats.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crate::connections::{Connection, ConnectionLog};
use crate::console;
use crate::denials::{Denial, DenialLog};
use crate::net::firewall::NFLOG_GROUP;
use crate::net::firewall::netlink::{self, Netfilter};

const NFNL_SUBSYS_ULOG: u8 = 4;
const NFULNL_MSG_PACKET: u8 = 0;
const NFULNL_MSG_CONFIG: u8 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_UID: u16 = 11;

/// Starts the reader on its own thread. Failure only loses connection denials (name denials
/// are logged by the DNS gate), so it warns and returns.
pub fn spawn(log: Arc<DenialLog>, connections: Arc<ConnectionLog>) {
    let socket = match bind(NFLOG_GROUP) {
        Ok(socket) => socket,
        Err(e) => {
            console::err(format!(
                "sandbox-init: rejected connections will not be logged: cannot read nflog: {e}"
            ));
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("nflog".into()).spawn(move || {
        let mut buf = vec![0u8; 65536];
        loop {
            // ENOBUFS: the kernel dropped messages; the next ones still come.
            let Ok(len) = socket.recv(&mut buf) else { continue };
            for denial in parse_messages(&buf[..len]) {
                if let Denial::Connection { protocol, addr, port, .. } = &denial {
                    let dst = std::net::SocketAddr::new(*addr, port.unwrap_or(0));
                    let line = Connection::new(protocol, dst, "firewall", "refused", "not in the allowlist");
                    connections.record(line, None);
                }
                log.record(denial);
            }
        }
    });
    if let Err(e) = spawned {
        console::err(format!("sandbox-init: rejected connections will not be logged: {e}"));
    }
}

fn bind(group: u16) -> std::io::Result<Netfilter> {
    let socket = Netfilter::open()?;
    let mut mode = 128u32.to_be_bytes().to_vec();
    mode.extend([NFULNL_COPY_PACKET, 0]);
    for (attr, payload) in [
        (NFULA_CFG_CMD, vec![NFULNL_CFG_CMD_BIND]),
        (NFULA_CFG_MODE, mode),
        (NFULA_CFG_QTHRESH, 1u32.to_be_bytes().to_vec()),
    ] {
        socket.request(&config_message(group, attr, &payload))?;
    }
    Ok(socket)
}

fn config_message(group: u16, attr: u16, payload: &[u8]) -> Vec<u8> {
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
    let attribute = netlink::attribute(attr, payload);
    netlink::message(NFNL_SUBSYS_ULOG, NFULNL_MSG_CONFIG, flags, libc::AF_UNSPEC as u8, group, &attribute)
}

/// Every packet message of a netlink datagram, as denials.
pub fn parse_messages(data: &[u8]) -> Vec<Denial> {
    let packet = (u16::from(NFNL_SUBSYS_ULOG) << 8) | u16::from(NFULNL_MSG_PACKET);
    netlink::messages(data)
        .filter(|(kind, _, _)| *kind == packet)
        .filter_map(|(_, _, payload)| parse_packet(netlink::netfilter_payload(payload)?.1))
        .collect()
}

fn parse_packet(attrs: &[u8]) -> Option<Denial> {
    let (mut payload, mut uid) = (None, None);
    for (kind, value, _) in netlink::attributes(attrs) {
        match kind {
            NFULA_PAYLOAD => payload = Some(value),
            NFULA_UID if value.len() == 4 => {
                uid = Some(u32::from_be_bytes([value[0], value[1], value[2], value[3]]))
            }
            _ => {}
        }
    }
    let (addr, protocol, l4) = parse_ip(payload?)?;
    let port = match protocol {
        6 | 17 if l4.len() >= 4 => Some(u16::from_be_bytes([l4[2], l4[3]])),
        _ => None,
    };
    let protocol = match protocol {
        6 => "tcp".to_string(),
        17 => "udp".to_string(),
        1 => "icmp".to_string(),
        58 => "icmpv6".to_string(),
        other => other.to_string(),
    };
    Some(Denial::Connection { protocol, addr, port, uid })
}

/// Destination, protocol and transport header of an IPv4 or IPv6 packet.
fn parse_ip(packet: &[u8]) -> Option<(IpAddr, u8, &[u8])> {
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 => {
            let header = usize::from(packet[0] & 0x0f) * 4;
            let addr = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
            Some((IpAddr::V4(addr), packet[9], packet.get(header..).unwrap_or(&[])))
        }
        6 if packet.len() >= 40 => {
            let bytes: [u8; 16] = packet[24..40].try_into().ok()?;
            Some((IpAddr::V6(Ipv6Addr::from(bytes)), packet[6], &packet[40..]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::net::firewall::netlink::attribute as attr;

    fn message(attrs: &[u8]) -> Vec<u8> {
        netlink::message(NFNL_SUBSYS_ULOG, NFULNL_MSG_PACKET, 0, 2, NFLOG_GROUP, attrs)
    }

    #[test]
    fn a_rejected_tcp_syn_becomes_a_connection_denial() {
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 172, 18, 0, 2, 203, 0, 113, 7];
        ip.extend([0xc3, 0x50, 0x01, 0xbb]); // ports 50000 -> 443
        ip.extend([0u8; 16]);
        let mut attrs = attr(NFULA_PAYLOAD, &ip);
        attrs.extend(attr(NFULA_UID, &1000u32.to_be_bytes()));
        let mut datagram = message(&attrs);
        datagram.extend(message(&attr(NFULA_PAYLOAD, &[0x60; 8]))); // a truncated IPv6 packet
        let denials = parse_messages(&datagram);
        assert_eq!(
            denials,
            vec![Denial::Connection {
                protocol: "tcp".into(),
                addr: "203.0.113.7".parse().unwrap(),
                port: Some(443),
                uid: Some(1000)
            }]
        );
    }

    #[test]
    fn an_ipv6_udp_packet_and_garbage() {
        let mut ip = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        ip.extend([0u8; 16]);
        ip.extend("2001:db8::53".parse::<Ipv6Addr>().unwrap().octets());
        ip.extend([0x13, 0x88, 0x00, 0x35, 0, 8, 0, 0]);
        let denials = parse_messages(&message(&attr(NFULA_PAYLOAD, &ip)));
        assert!(
            matches!(&denials[..], [Denial::Connection { port: Some(53), protocol, .. }] if protocol == "udp")
        );
        assert!(parse_messages(&[0xff; 7]).is_empty());
        assert!(parse_messages(&[0xff; 64]).is_empty());
    }
}
