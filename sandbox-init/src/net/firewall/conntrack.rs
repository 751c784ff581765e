//! Connection tracking: after a reload, the connections the old policy let out and the new one
//! does not are cut. Their entries are found by the firewall's egress mark and deleted over
//! ctnetlink; the next packet of such a connection is then new to the firewall, which rejects
//! it like any other connection to a destination outside the allowlist.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::net::firewall::netlink::{self, Netfilter};

const SUBSYS_CTNETLINK: u8 = 1;
const MSG_GET: u8 = 1;
const MSG_DELETE: u8 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_MARK: u16 = 8;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;

/// One tracked connection, as much of it as deciding and deleting needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub family: u8,
    pub destination: IpAddr,
    pub protocol: u8,
    pub port: u16,
    pub mark: u32,
    /// The original-direction tuple and zone attributes as the kernel sent them: what a delete
    /// request names the entry by.
    key: Vec<u8>,
}

/// Parses one ctnetlink message payload (after the netlink header).
pub fn parse_flow(payload: &[u8]) -> Option<Flow> {
    let (family, attributes) = netlink::netfilter_payload(payload)?;
    let mut key = Vec::new();
    let (mut destination, mut protocol, mut port, mut mark) = (None, None, None, 0);
    for (kind, value, whole) in netlink::attributes(attributes) {
        match kind {
            CTA_TUPLE_ORIG => {
                key.extend_from_slice(whole);
                if let Some(ip) = netlink::find(value, CTA_TUPLE_IP) {
                    destination = match (netlink::find(ip, CTA_IP_V4_DST), netlink::find(ip, CTA_IP_V6_DST)) {
                        (Some(v4), _) if v4.len() == 4 => {
                            Some(IpAddr::V4(Ipv4Addr::new(v4[0], v4[1], v4[2], v4[3])))
                        }
                        (_, Some(v6)) if v6.len() == 16 => {
                            Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v6).ok()?)))
                        }
                        _ => None,
                    };
                }
                if let Some(proto) = netlink::find(value, CTA_TUPLE_PROTO) {
                    protocol = netlink::find(proto, CTA_PROTO_NUM).and_then(|n| n.first().copied());
                    port = netlink::find(proto, CTA_PROTO_DST_PORT)
                        .filter(|p| p.len() == 2)
                        .map(|p| u16::from_be_bytes([p[0], p[1]]));
                }
            }
            CTA_ZONE => key.extend_from_slice(whole),
            CTA_MARK if value.len() == 4 => {
                mark = u32::from_be_bytes([value[0], value[1], value[2], value[3]])
            }
            _ => {}
        }
    }
    Some(Flow { family, destination: destination?, protocol: protocol?, port: port.unwrap_or(0), mark, key })
}

/// Every tracked connection of this network namespace.
pub fn dump(socket: &Netfilter) -> std::io::Result<Vec<Flow>> {
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    socket.send(&netlink::message(SUBSYS_CTNETLINK, MSG_GET, flags, libc::AF_UNSPEC as u8, 0, &[]))?;
    let mut flows = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let len = socket.recv(&mut buf)?;
        for (kind, _, payload) in netlink::messages(&buf[..len]) {
            match kind {
                netlink::NLMSG_DONE => return Ok(flows),
                netlink::NLMSG_ERROR => {
                    let error = payload.get(..4).map_or(0, |e| i32::from_ne_bytes([e[0], e[1], e[2], e[3]]));
                    if error != 0 {
                        return Err(std::io::Error::from_raw_os_error(-error));
                    }
                }
                _ => flows.extend(parse_flow(payload)),
            }
        }
    }
}

/// Deletes the tracked connections `revoked` picks (by their mark: what the policy let out or
/// in, and where to). Returns how many were cut.
pub fn revoke(revoked: impl Fn(&Flow) -> bool) -> std::io::Result<usize> {
    let socket = Netfilter::open()?;
    let mut cut = 0;
    for flow in dump(&socket)?.into_iter().filter(|f| revoked(f)) {
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        match socket.request(&netlink::message(
            SUBSYS_CTNETLINK,
            MSG_DELETE,
            flags,
            flow.family,
            0,
            &flow.key,
        )) {
            Ok(()) => cut += 1,
            // Ended on its own meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::firewall::netlink::attribute;

    const NESTED: u16 = 0x8000;

    fn tuple(dst: &[u8], kind: u16, protocol: u8, port: u16) -> Vec<u8> {
        let mut ip = attribute(1, &[10, 0, 0, 2]);
        ip.extend(attribute(kind, dst));
        let mut proto = attribute(CTA_PROTO_NUM, &[protocol]);
        proto.extend(attribute(2, &40000u16.to_be_bytes()));
        proto.extend(attribute(CTA_PROTO_DST_PORT, &port.to_be_bytes()));
        let mut t = attribute(CTA_TUPLE_IP | NESTED, &ip);
        t.extend(attribute(CTA_TUPLE_PROTO | NESTED, &proto));
        attribute(CTA_TUPLE_ORIG | NESTED, &t)
    }

    #[test]
    fn a_dumped_entry_gives_its_destination_mark_and_delete_key() {
        let orig = tuple(&[203, 0, 113, 7], CTA_IP_V4_DST, 6, 443);
        let mut attrs = orig.clone();
        attrs.extend(attribute((CTA_TUPLE_ORIG + 1) | NESTED, &[0; 8])); // the reply tuple, ignored
        attrs.extend(attribute(CTA_MARK, &0x0a5b_0001u32.to_be_bytes()));
        let mut payload = vec![libc::AF_INET as u8, 0, 0, 0];
        payload.extend(&attrs);
        let flow = parse_flow(&payload).unwrap();
        assert_eq!(flow.destination, "203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!((flow.protocol, flow.port, flow.mark), (6, 443, 0x0a5b_0001));
        assert_eq!(flow.key, orig, "the delete names the entry by its original tuple");

        let v6 = tuple(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets(), CTA_IP_V6_DST, 17, 3478);
        let mut payload = vec![libc::AF_INET6 as u8, 0, 0, 0];
        payload.extend(&v6);
        let flow = parse_flow(&payload).unwrap();
        assert_eq!(
            (flow.destination.to_string().as_str(), flow.protocol, flow.port, flow.mark),
            ("2001:db8::7", 17, 3478, 0)
        );
        assert_eq!(parse_flow(&[2, 0, 0, 0]), None, "no tuple");
        assert_eq!(parse_flow(&[2]), None);
    }
}
