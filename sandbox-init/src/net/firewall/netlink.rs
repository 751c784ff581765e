//! Netfilter's netlink sockets: the message and attribute framing that nflog (rejected
//! packets) and conntrack (cutting connections a reload revokes) share.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

const NETLINK_NETFILTER: libc::c_int = 12;
const NLMSG_HEADER: usize = 16;
/// nfgenmsg: family, version, resource id.
const NFGEN_HEADER: usize = 4;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
/// Attribute types carry two flag bits (nested, byte order) above the type itself.
const ATTR_TYPE_MASK: u16 = 0x3fff;

/// A bound NETLINK_NETFILTER socket.
pub struct Netfilter {
    fd: OwnedFd,
}

impl Netfilter {
    pub fn open() -> std::io::Result<Netfilter> {
        // SAFETY: socket and bind with a zeroed sockaddr_nl; the descriptor is owned at once.
        unsafe {
            let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(fd);
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            if libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), size_of::<libc::sockaddr_nl>() as u32) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Netfilter { fd })
        }
    }

    /// How long `recv` waits for a datagram before it fails (EAGAIN).
    pub fn set_read_timeout(&self, timeout: std::time::Duration) -> std::io::Result<()> {
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros().into(),
        };
        // SAFETY: setsockopt with a timeval we own, of its size.
        let result = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                size_of::<libc::timeval>() as u32,
            )
        };
        if result < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn send(&self, message: &[u8]) -> std::io::Result<()> {
        // SAFETY: send from a buffer we own.
        if unsafe { libc::send(self.fd.as_raw_fd(), message.as_ptr().cast(), message.len(), 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Error replies carry the failed request's header only, not the whole request.
    pub fn cap_acks(&self) -> std::io::Result<()> {
        const SOL_NETLINK: libc::c_int = 270;
        const NETLINK_CAP_ACK: libc::c_int = 10;
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with an int we own, of its size.
        let result = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                SOL_NETLINK,
                NETLINK_CAP_ACK,
                (&raw const on).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        if result < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// One datagram whole: one longer than `buf` is an error, not a part of it.
    pub fn recv_whole(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            // SAFETY: recv into a buffer we own, of its length; MSG_TRUNC makes it return the
            // datagram's real length.
            let len = unsafe {
                libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_TRUNC)
            };
            if len >= 0 {
                let len = len as usize;
                if len > buf.len() {
                    return Err(std::io::Error::other(format!("a netlink answer of {len} bytes, cut")));
                }
                return Ok(len);
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINTR) {
                return Err(error);
            }
        }
    }

    /// One datagram (possibly several messages). Retries on EINTR.
    pub fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            // SAFETY: recv into a buffer we own, of its length.
            let len = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if len >= 0 {
                return Ok(len as usize);
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EINTR) {
                return Err(error);
            }
        }
    }

    /// Sends a request with NLM_F_ACK and waits for its acknowledgement: Err with the kernel's
    /// error if it refused.
    pub fn request(&self, message: &[u8]) -> std::io::Result<()> {
        self.send(message)?;
        let mut buf = [0u8; 1024];
        let len = self.recv(&mut buf)?;
        for (kind, _, payload) in messages(&buf[..len]) {
            if kind == NLMSG_ERROR && payload.len() >= 4 {
                let error = i32::from_ne_bytes([payload[0], payload[1], payload[2], payload[3]]);
                if error != 0 {
                    return Err(std::io::Error::from_raw_os_error(errno_of(error)));
                }
            }
        }
        Ok(())
    }
}

/// The errno a netlink error code stands for (the negative errno); one that is not a negative
/// errno (anything may be on a socket) is a protocol error.
pub fn errno_of(error: i32) -> i32 {
    match error.checked_neg() {
        Some(errno) if errno > 0 => errno,
        _ => libc::EPROTO,
    }
}

/// A netfilter message: `kind` of `subsystem`, with an nfgenmsg header and `attributes`.
pub fn message(subsystem: u8, kind: u8, flags: u16, family: u8, res_id: u16, attributes: &[u8]) -> Vec<u8> {
    let total = NLMSG_HEADER + NFGEN_HEADER + attributes.len();
    let mut m = Vec::with_capacity(total);
    m.extend((total as u32).to_ne_bytes());
    m.extend(((u16::from(subsystem) << 8) | u16::from(kind)).to_ne_bytes());
    m.extend(flags.to_ne_bytes());
    m.extend(0u32.to_ne_bytes()); // sequence
    m.extend(0u32.to_ne_bytes()); // port id
    m.extend([family, 0]);
    m.extend(res_id.to_be_bytes());
    m.extend(attributes);
    m
}

/// The most bytes an attribute's value may hold: its length is 16 bits, header included.
pub const MAX_ATTRIBUTE_VALUE: usize = u16::MAX as usize - 4;

/// One attribute, padded to four bytes. A value past [`MAX_ATTRIBUTE_VALUE`] is a bug of the
/// caller's (the length would wrap, and the kernel would read the rest as other attributes):
/// it panics rather than send that.
pub fn attribute(kind: u16, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= MAX_ATTRIBUTE_VALUE, "a netlink attribute of {} bytes", payload.len());
    let mut a = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
    a.extend(kind.to_ne_bytes());
    a.extend(payload);
    a.resize(a.len().next_multiple_of(4), 0);
    a
}

/// The messages of a datagram: (type, flags, payload after the netlink header).
pub fn messages(mut data: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < NLMSG_HEADER {
            return None;
        }
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len < NLMSG_HEADER || len > data.len() {
            return None;
        }
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let flags = u16::from_ne_bytes([data[6], data[7]]);
        let payload = &data[NLMSG_HEADER..len];
        data = &data[len.next_multiple_of(4).min(data.len())..];
        Some((kind, flags, payload))
    })
}

/// The payload of a netfilter message after its nfgenmsg header: (family, attributes).
pub fn netfilter_payload(payload: &[u8]) -> Option<(u8, &[u8])> {
    (payload.len() >= NFGEN_HEADER).then(|| (payload[0], &payload[NFGEN_HEADER..]))
}

/// The attributes of a block: (type without flags, value, the whole attribute as sent).
pub fn attributes(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]) & ATTR_TYPE_MASK;
        if len < 4 || len > data.len() {
            return None;
        }
        let (whole, value) = (&data[..len], &data[4..len]);
        data = &data[len.next_multiple_of(4).min(data.len())..];
        Some((kind, value, whole))
    })
}

/// The value of the first attribute of `kind` in a block.
pub fn find(data: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(data).find(|(k, _, _)| *k == kind).map(|(_, value, _)| value)
}
