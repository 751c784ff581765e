//! Set elements written over netlink: the DNS gate's additions to the `(address . port)` sets as
//! one nftables transaction (a batch of NEWSETELEM and DELSETELEM messages), sent by PID 1 on a
//! netlink socket it keeps, instead of a run of `nft` for each new name (about 2 ms, most of
//! the gate's cost). The messages are what `nft add element` sends; the script
//! (firewall.rs's `create_elements` and `add_elements`) stays the fallback, and the two write
//! the same elements.

use std::net::IpAddr;
use std::time::Duration;

use crate::net::firewall::netlink::{NLMSG_ERROR, Netfilter, attribute, errno_of, message, messages};
use crate::net::firewall::{Element, TABLE};

const NFNL_SUBSYS_NFTABLES: u8 = 10;
const NFNL_MSG_BATCH_BEGIN: u8 = 0x10;
const NFNL_MSG_BATCH_END: u8 = 0x11;
const NFT_MSG_NEWSETELEM: u8 = 12;
const NFT_MSG_DELSETELEM: u8 = 14;
const NFPROTO_INET: u8 = 1;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_DATA_VALUE: u16 = 1;

/// What a message does to the elements it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Adds them with their timeouts (an element present keeps its own on older kernels).
    Add,
    /// Adds them without a timeout: the first step of a refresh, so that the delete after it
    /// never fails on an element that expired meanwhile.
    Touch,
    Delete,
}

/// An element's key as the set stores it: the address, then the port in network order, each
/// in registers of four bytes (`ipv4_addr . inet_service` is 8 bytes, IPv6's 20).
pub fn key(addr: IpAddr, port: u16) -> Vec<u8> {
    let mut key = match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    key.extend(port.to_be_bytes());
    key.extend([0, 0]);
    key
}

/// The most elements one message carries (an IPv6 element is 44 bytes): a set's elements past
/// it go in more messages of the same transaction, as nft splits them, so that no attribute's
/// 16-bit length can wrap.
pub const ELEMENTS_PER_MESSAGE: usize = 64;

/// One message of `op` for `elements`, all of one set, with sequence number `seq`.
fn set_message(op: Op, set: &str, elements: &[&Element], seq: u32) -> Vec<u8> {
    let mut list = Vec::new();
    for element in elements {
        let value = attribute(NFTA_DATA_VALUE, &key(element.addr, element.port));
        let mut item = attribute(NFTA_SET_ELEM_KEY | NLA_F_NESTED, &value);
        if op == Op::Add {
            let ms = u64::try_from(element.timeout.as_millis()).unwrap_or(u64::MAX);
            item.extend(attribute(NFTA_SET_ELEM_TIMEOUT, &ms.to_be_bytes()));
        }
        list.extend(attribute(NFTA_LIST_ELEM | NLA_F_NESTED, &item));
    }
    let mut attributes = attribute(NFTA_SET_ELEM_LIST_TABLE, &c_string(TABLE));
    attributes.extend(attribute(NFTA_SET_ELEM_LIST_SET, &c_string(set)));
    attributes.extend(attribute(NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, &list));
    let (kind, flags) = match op {
        Op::Add | Op::Touch => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE),
        Op::Delete => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
    };
    with_seq(message(NFNL_SUBSYS_NFTABLES, kind, flags, NFPROTO_INET, 0, &attributes), seq)
}

fn c_string(text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

fn with_seq(mut message: Vec<u8>, seq: u32) -> Vec<u8> {
    message[8..12].copy_from_slice(&seq.to_ne_bytes());
    message
}

/// The transaction that writes `new` (not in their sets yet) and refreshes `refresh` (present:
/// added, deleted and added again with the new timeout, as `add_elements` does), and the
/// sequence numbers of its messages that the kernel acknowledges, from `seq` on.
pub fn batch(new: &[Element], refresh: &[Element], seq: u32) -> (Vec<u8>, Vec<u32>) {
    let mut out =
        with_seq(message(0, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES.into(), &[]), seq);
    let mut acked = Vec::new();
    let mut next = seq;
    let mut push = |op: Op, set: &str, elements: &[&Element], out: &mut Vec<u8>| {
        for chunk in elements.chunks(ELEMENTS_PER_MESSAGE) {
            next += 1;
            out.extend(set_message(op, set, chunk, next));
            acked.push(next);
        }
    };
    for (set, elements) in by_set(new) {
        push(Op::Add, &set, &elements, &mut out);
    }
    for (set, elements) in by_set(refresh) {
        for op in [Op::Touch, Op::Delete, Op::Add] {
            push(op, &set, &elements, &mut out);
        }
    }
    out.extend(with_seq(
        message(0, NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES.into(), &[]),
        next + 1,
    ));
    (out, acked)
}

fn by_set(elements: &[Element]) -> std::collections::BTreeMap<String, Vec<&Element>> {
    let mut sets: std::collections::BTreeMap<String, Vec<&Element>> = Default::default();
    for element in elements {
        sets.entry(element.set()).or_default().push(element);
    }
    sets
}

/// One element of a transaction as its messages say it: what is done, to which set, the key's
/// address and port, and the timeout in milliseconds if one is given.
pub type Decoded = (Op, String, IpAddr, u16, Option<u64>);

/// A transaction read back strictly (for tests and the fuzzer): every message and attribute
/// whole, nothing but what [`batch`] writes, every byte accounted for. None if anything is off.
pub fn decode_batch(bytes: &[u8]) -> Option<Vec<Decoded>> {
    let mut out = Vec::new();
    let mut rest = bytes;
    let mut kinds = Vec::new();
    while !rest.is_empty() {
        let len = u32::from_ne_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        if len < 20 || len > rest.len() || !len.is_multiple_of(4) {
            return None;
        }
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        let body = &rest[20..len];
        kinds.push(kind);
        let set_kind = |k: u8| (u16::from(NFNL_SUBSYS_NFTABLES) << 8) | u16::from(k);
        if kind == set_kind(NFT_MSG_NEWSETELEM) || kind == set_kind(NFT_MSG_DELSETELEM) {
            let (mut table, mut set, mut elements) = (None, None, None);
            for (t, value) in strict_attributes(body)? {
                match t & !NLA_F_NESTED {
                    NFTA_SET_ELEM_LIST_TABLE if table.is_none() => table = Some(value),
                    NFTA_SET_ELEM_LIST_SET if set.is_none() => set = Some(value),
                    NFTA_SET_ELEM_LIST_ELEMENTS if elements.is_none() => elements = Some(value),
                    _ => return None,
                }
            }
            if table? != c_string(TABLE).as_slice() {
                return None;
            }
            let set = std::str::from_utf8(set?.strip_suffix(&[0])?).ok()?.to_string();
            for (t, item) in strict_attributes(elements?)? {
                if t != NFTA_LIST_ELEM | NLA_F_NESTED {
                    return None;
                }
                let (mut key, mut timeout) = (None, None);
                for (t, value) in strict_attributes(item)? {
                    match t {
                        k if k == NFTA_SET_ELEM_KEY | NLA_F_NESTED && key.is_none() => {
                            let [(NFTA_DATA_VALUE, data)] = strict_attributes(value)?[..] else {
                                return None;
                            };
                            key = Some(data);
                        }
                        NFTA_SET_ELEM_TIMEOUT if timeout.is_none() => {
                            timeout = Some(u64::from_be_bytes(value.try_into().ok()?));
                        }
                        _ => return None,
                    }
                }
                let key = key?;
                let (addr, port) = match key.len() {
                    8 => (IpAddr::from(<[u8; 4]>::try_from(&key[..4]).ok()?), &key[4..]),
                    20 => (IpAddr::from(<[u8; 16]>::try_from(&key[..16]).ok()?), &key[16..]),
                    _ => return None,
                };
                if port[2..] != [0, 0] {
                    return None;
                }
                let op = match (kind == set_kind(NFT_MSG_DELSETELEM), timeout) {
                    (true, None) => Op::Delete,
                    (false, None) => Op::Touch,
                    (false, Some(_)) => Op::Add,
                    (true, Some(_)) => return None,
                };
                out.push((op, set.clone(), addr, u16::from_be_bytes([port[0], port[1]]), timeout));
            }
        } else if !(kind == u16::from(NFNL_MSG_BATCH_BEGIN) || kind == u16::from(NFNL_MSG_BATCH_END))
            || !body.is_empty()
        {
            return None;
        }
        rest = &rest[len..];
    }
    let framed = kinds.first() == Some(&u16::from(NFNL_MSG_BATCH_BEGIN))
        && kinds.last() == Some(&u16::from(NFNL_MSG_BATCH_END))
        && kinds[1..kinds.len() - 1].iter().all(|k| *k >> 8 == u16::from(NFNL_SUBSYS_NFTABLES));
    framed.then_some(out)
}

/// The attributes of a block, each whole and padded, with nothing left over: (type, value).
fn strict_attributes(mut data: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let len = usize::from(u16::from_ne_bytes([*data.first()?, *data.get(1)?]));
        let kind = u16::from_ne_bytes([*data.get(2)?, *data.get(3)?]);
        let padded = len.next_multiple_of(4);
        if len < 4 || padded > data.len() || data[len..padded].iter().any(|b| *b != 0) {
            return None;
        }
        out.push((kind, &data[4..len]));
        data = &data[padded..];
    }
    Some(out)
}

/// What the kernel answered a transaction: Ok once every message in `acked` is acknowledged,
/// the first error otherwise. `replies` is every datagram read so far.
pub fn outcome(replies: &[u8], acked: &[u32]) -> Option<Result<(), i32>> {
    let mut seen = Vec::new();
    for (kind, _, payload) in messages(replies) {
        if kind != NLMSG_ERROR || payload.len() < 4 + 16 {
            continue;
        }
        let error = i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]);
        let seq = u32::from_ne_bytes([payload[12], payload[13], payload[14], payload[15]]);
        if error != 0 {
            return Some(Err(errno_of(error)));
        }
        seen.push(seq);
    }
    acked.iter().all(|s| seen.contains(s)).then_some(Ok(()))
}

/// PID 1's socket for set elements.
pub struct SetWriter {
    socket: Netfilter,
    seq: u32,
}

/// How long the kernel may take to answer a transaction before it counts as failed.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

impl SetWriter {
    pub fn open() -> std::io::Result<SetWriter> {
        let socket = Netfilter::open()?;
        socket.set_read_timeout(ANSWER_TIMEOUT)?;
        socket.cap_acks()?;
        Ok(SetWriter { socket, seq: 1 })
    }

    /// Writes `new` and refreshes `refresh` in one transaction: all of them, or (on an error,
    /// which it returns) none.
    pub fn write(&mut self, new: &[Element], refresh: &[Element]) -> std::io::Result<()> {
        let (message, acked) = batch(new, refresh, self.seq);
        self.seq = self.seq.wrapping_add(acked.len() as u32 + 2);
        self.socket.send(&message)?;
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let len = self.socket.recv_whole(&mut buf)?;
            replies.extend_from_slice(&buf[..len]);
            match outcome(&replies, &acked) {
                Some(Ok(())) => return Ok(()),
                Some(Err(errno)) => return Err(std::io::Error::from_raw_os_error(errno)),
                None => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::firewall::netlink::{attributes, find, netfilter_payload};
    use crate::policy::Opening;

    fn element(addr: &str, port: u16) -> Element {
        Element {
            addr: addr.parse().unwrap(),
            opening: Opening::Checked,
            port,
            timeout: Duration::from_secs(300),
        }
    }

    #[test]
    fn keys_fill_four_byte_registers() {
        assert_eq!(key("192.0.2.7".parse().unwrap(), 443), [192, 0, 2, 7, 1, 187, 0, 0]);
        let v6 = key("2001:db8::1".parse().unwrap(), 80);
        assert_eq!((v6.len(), &v6[16..]), (20, &[0, 80, 0, 0][..]));
    }

    #[test]
    fn a_batch_is_begin_the_set_messages_and_end_each_acknowledged() {
        let new = [element("192.0.2.7", 443), element("2001:db8::1", 443)];
        let refresh = [element("192.0.2.8", 80)];
        let (bytes, acked) = batch(&new, &refresh, 100);
        let parsed: Vec<(u16, u16, &[u8])> = messages(&bytes).collect();
        let kinds: Vec<u16> = parsed.iter().map(|(k, _, _)| *k).collect();
        let setelem = |kind: u8| (u16::from(NFNL_SUBSYS_NFTABLES) << 8) | u16::from(kind);
        assert_eq!(
            kinds,
            [
                0x10,
                setelem(NFT_MSG_NEWSETELEM),
                setelem(NFT_MSG_NEWSETELEM),
                setelem(NFT_MSG_NEWSETELEM),
                setelem(NFT_MSG_DELSETELEM),
                setelem(NFT_MSG_NEWSETELEM),
                0x11
            ]
        );
        assert_eq!(acked, [101, 102, 103, 104, 105]);
        // The first: checked_v4, one element, its key and a timeout of 300,000 ms.
        let (family, attrs) = netfilter_payload(parsed[1].2).unwrap();
        assert_eq!(family, NFPROTO_INET);
        assert_eq!(find(attrs, NFTA_SET_ELEM_LIST_TABLE), Some(&b"agent_sandbox\0"[..]));
        assert_eq!(find(attrs, NFTA_SET_ELEM_LIST_SET), Some(&b"checked_v4\0"[..]));
        let list = find(attrs, NFTA_SET_ELEM_LIST_ELEMENTS).unwrap();
        let items: Vec<&[u8]> = attributes(list).map(|(_, value, _)| value).collect();
        assert_eq!(items.len(), 1);
        let value = find(find(items[0], NFTA_SET_ELEM_KEY).unwrap(), NFTA_DATA_VALUE).unwrap();
        assert_eq!(value, [192, 0, 2, 7, 1, 187, 0, 0]);
        assert_eq!(find(items[0], NFTA_SET_ELEM_TIMEOUT), Some(&300_000u64.to_be_bytes()[..]));
        // The refresh's first step adds without a timeout; its delete names the key alone.
        let (_, touch) = netfilter_payload(parsed[3].2).unwrap();
        let item = attributes(find(touch, NFTA_SET_ELEM_LIST_ELEMENTS).unwrap()).next().unwrap().1;
        assert_eq!(find(item, NFTA_SET_ELEM_TIMEOUT), None);
    }

    /// Found by review: 1,600 IPv6 elements of one set made one attribute longer than its
    /// 16-bit length, which wrapped, and the kernel read the rest (bytes of the answer's
    /// addresses) as attributes of its own: another set's name, a list without timeouts.
    /// Every element now reads back as written, whatever the count.
    #[test]
    fn any_number_of_elements_reads_back_exactly() {
        let many = |base: &str, n: u32| -> Vec<Element> {
            (0..n)
                .map(|i| {
                    let addr: IpAddr = match base.parse::<IpAddr>().unwrap() {
                        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + i).into()),
                        IpAddr::V6(a) => IpAddr::V6((u128::from(a) + u128::from(i)).into()),
                    };
                    Element { addr, opening: Opening::Checked, port: 443, timeout: Duration::from_secs(60) }
                })
                .collect()
        };
        let mut new = many("2001:db8::", 5000);
        new.extend(many("192.0.2.0", 3000));
        let refresh = many("2001:db8:1::", 1600);
        let (bytes, acked) = batch(&new, &refresh, 1);
        let read = decode_batch(&bytes).expect("the batch reads back");
        let mut expected: Vec<Decoded> = Vec::new();
        let row = |op: Op, e: &Element, t: Option<u64>| (op, e.set(), e.addr, e.port, t);
        let sorted = |mut v: Vec<Element>| {
            v.sort_by_key(|e| e.set());
            v
        };
        for e in &sorted(new.clone()) {
            expected.push(row(Op::Add, e, Some(60_000)));
        }
        for (op, t) in [(Op::Touch, None), (Op::Delete, None), (Op::Add, Some(60_000))] {
            expected.extend(refresh.iter().map(|e| row(op, e, t)));
        }
        assert_eq!(read.len(), expected.len());
        let differs = read.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(differs.map(|i| (&read[i], &expected[i])), None, "at {differs:?}");
        assert_eq!(acked.len(), 5000usize.div_ceil(64) + 3000usize.div_ceil(64) + 3 * 1600usize.div_ceil(64));
    }

    #[test]
    fn the_outcome_waits_for_every_acknowledgement_and_takes_the_first_error() {
        let ack = |seq: u32, error: i32| {
            let mut payload = error.to_ne_bytes().to_vec();
            let mut original = vec![0u8; 16];
            original[8..12].copy_from_slice(&seq.to_ne_bytes());
            payload.extend(original);
            let mut m = ((16 + payload.len()) as u32).to_ne_bytes().to_vec();
            m.extend(NLMSG_ERROR.to_ne_bytes());
            m.extend([0u8; 10]);
            m.extend(payload);
            m
        };
        let mut replies = ack(101, 0);
        assert_eq!(outcome(&replies, &[101, 102]), None);
        replies.extend(ack(102, 0));
        assert_eq!(outcome(&replies, &[101, 102]), Some(Ok(())));
        replies.extend(ack(103, -libc::ENOSPC));
        assert_eq!(outcome(&replies, &[101, 102, 103]), Some(Err(libc::ENOSPC)));
        assert_eq!(outcome(&[1, 2, 3], &[1]), None, "a short datagram");
        // Found by the fuzzer: an error code whose negation overflows.
        assert_eq!(outcome(&ack(101, i32::MIN), &[101]), Some(Err(libc::EPROTO)));
        assert_eq!(outcome(&ack(101, 5), &[101]), Some(Err(libc::EPROTO)));
    }
}
