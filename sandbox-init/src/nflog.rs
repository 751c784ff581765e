//! Rejected connections for the denial log: the output chain's last rule sends each rejected
//! packet to an nflog group, read here from a netfilter netlink socket (the kernel log is not
//! readable inside a container). Only the headers are copied; repeats are folded.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::denials::{Denial, DenialLog};
use crate::firewall::NFLOG_GROUP;

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_UID: u16 = 11;
/// The same destination is logged once per this long: a retrying client is one denial.
const FOLD: Duration = Duration::from_secs(10);

/// Starts the reader on its own thread. Failure only loses connection denials (name denials
/// are logged by the DNS gate), so it warns and returns.
pub fn spawn(log: Arc<DenialLog>) {
    let fd = match bind(NFLOG_GROUP) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("sandbox-init: rejected connections will not be logged: cannot read nflog: {e}");
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("nflog".into()).spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut recent: HashMap<(IpAddr, Option<u16>, String), Instant> = HashMap::new();
        loop {
            // SAFETY: recv into a buffer we own, of its length.
            let len = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if len < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // ENOBUFS: the kernel dropped messages; the next ones still come.
                continue;
            }
            for denial in parse_messages(&buf[..len as usize]) {
                let Denial::Connection { addr, port, protocol, .. } = &denial else { continue };
                let key = (*addr, *port, protocol.clone());
                let now = Instant::now();
                if recent.get(&key).is_some_and(|at| now.duration_since(*at) < FOLD) {
                    continue;
                }
                if recent.len() > 4096 {
                    recent.retain(|_, at| now.duration_since(*at) < FOLD);
                }
                recent.insert(key, now);
                log.record(denial);
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("sandbox-init: rejected connections will not be logged: {e}");
    }
}

fn bind(group: u16) -> std::io::Result<libc::c_int> {
    // SAFETY: socket/bind/send with a zeroed sockaddr_nl and buffers we own.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as u16;
        if libc::bind(fd, (&raw const addr).cast(), size_of::<libc::sockaddr_nl>() as u32) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut mode = 128u32.to_be_bytes().to_vec();
        mode.extend([NFULNL_COPY_PACKET, 0]);
        for (attr, payload) in [
            (NFULA_CFG_CMD, vec![NFULNL_CFG_CMD_BIND]),
            (NFULA_CFG_MODE, mode),
            (NFULA_CFG_QTHRESH, 1u32.to_be_bytes().to_vec()),
        ] {
            let message = config_message(group, attr, &payload);
            if libc::send(fd, message.as_ptr().cast(), message.len(), 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut ack = [0u8; 256];
            let len = libc::recv(fd, ack.as_mut_ptr().cast(), ack.len(), 0);
            // An NLMSG_ERROR with a non-zero error: the bind was refused.
            if len >= 20 {
                let error = i32::from_ne_bytes([ack[16], ack[17], ack[18], ack[19]]);
                if error != 0 {
                    return Err(std::io::Error::from_raw_os_error(-error));
                }
            }
        }
        Ok(fd)
    }
}

fn config_message(group: u16, attr: u16, payload: &[u8]) -> Vec<u8> {
    let attr_len = 4 + payload.len();
    let total = 16 + 4 + attr_len.next_multiple_of(4);
    let mut m = Vec::with_capacity(total);
    m.extend((total as u32).to_ne_bytes());
    m.extend(((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG).to_ne_bytes());
    m.extend(((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    m.extend(0u32.to_ne_bytes()); // sequence
    m.extend(0u32.to_ne_bytes()); // port id
    m.extend([libc::AF_UNSPEC as u8, 0]);
    m.extend(group.to_be_bytes());
    m.extend((attr_len as u16).to_ne_bytes());
    m.extend(attr.to_ne_bytes());
    m.extend(payload);
    m.resize(total, 0);
    m
}

/// Every packet message of a netlink datagram, as denials.
pub fn parse_messages(mut data: &[u8]) -> Vec<Denial> {
    let mut denials = Vec::new();
    while data.len() >= 16 {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len < 16 || len > data.len() {
            break;
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if kind == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET
            && len >= 20
            && let Some(denial) = parse_packet(&data[20..len])
        {
            denials.push(denial);
        }
        data = &data[len.next_multiple_of(4).min(data.len())..];
    }
    denials
}

fn parse_packet(mut attrs: &[u8]) -> Option<Denial> {
    let (mut payload, mut uid) = (None, None);
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        let value = &attrs[4..len];
        match kind {
            NFULA_PAYLOAD => payload = Some(value),
            NFULA_UID if value.len() == 4 => {
                uid = Some(u32::from_be_bytes([value[0], value[1], value[2], value[3]]))
            }
            _ => {}
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
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

    fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut a = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        a.extend(kind.to_ne_bytes());
        a.extend(value);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    }

    fn message(attrs: &[u8]) -> Vec<u8> {
        let total = 20 + attrs.len();
        let mut m = (total as u32).to_ne_bytes().to_vec();
        m.extend(((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET).to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend([2, 0, 0x0c, 0x02]);
        m.extend(attrs);
        m
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
