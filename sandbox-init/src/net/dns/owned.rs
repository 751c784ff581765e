//! Sockets of PID 1 owned by another uid. nft's `meta skuid` reads the filesystem uid of the
//! credentials a socket's file was made with; in sidecar mode uid 0 may be the agent's (gVisor's
//! sentry sends everything as root, and an agent container may be run as root), so the DNS gate's
//! sockets are made under a uid of their own, which the rules alone trust with port 53.
//!
//! The filesystem uid is per thread (the raw syscall, not a libc wrapper that would set it for
//! every thread), and is set and restored around the one syscall that makes the socket's file:
//! `socket` or `accept`. Nothing awaits in between, so no other task runs on the thread meanwhile.

use std::net::SocketAddr;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::{TcpSocket, TcpStream, UdpSocket};

/// Runs `make` with this thread's filesystem uid `uid` (None: as this thread is), then back to 0.
pub fn as_uid<T>(uid: Option<u32>, make: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    let Some(uid) = uid else { return make() };
    // SAFETY: setfsuid with an integer; it returns the previous filesystem uid, and an invalid
    // one (-1) changes nothing and returns the current, which is how success is told.
    let current = unsafe {
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long)
    };
    if current != uid as libc::c_long {
        return Err(std::io::Error::other(format!(
            "cannot make a socket as uid {uid} (setfsuid: no CAP_SETUID?)"
        )));
    }
    let made = make();
    // SAFETY: as above; back to root, whose file capabilities the kernel restores with it.
    unsafe { libc::syscall(libc::SYS_setfsuid, 0 as libc::c_long) };
    made
}

/// A UDP socket bound to `addr`, owned by `uid`.
pub fn udp(uid: Option<u32>, addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = as_uid(uid, || std::net::UdpSocket::bind(addr))?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

/// A TCP connection to `addr` from a socket owned by `uid`.
pub async fn connect(uid: Option<u32>, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = as_uid(uid, || if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() })?;
    socket.connect(addr).await
}

/// A TCP listener whose accepted connections are owned by `uid` (an accepted socket's file is
/// made by `accept`, with the accepting thread's credentials).
pub struct Listener {
    fd: AsyncFd<std::net::TcpListener>,
    uid: Option<u32>,
}

impl Listener {
    pub fn bind(uid: Option<u32>, addr: SocketAddr) -> std::io::Result<Listener> {
        let listener = as_uid(uid, || std::net::TcpListener::bind(addr))?;
        listener.set_nonblocking(true)?;
        // SAFETY: the descriptor is the listener's, which the AsyncFd owns until it is dropped
        // (nothing else closes it or registers it).
        let fd = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Listener { fd, uid })
    }

    pub async fn accept(&self) -> std::io::Result<TcpStream> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| as_uid(self.uid, || fd.get_ref().accept())) {
                Ok(Ok((stream, _))) => {
                    stream.set_nonblocking(true)?;
                    return TcpStream::from_std(stream);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a uid the socket is made as the thread is; the helpers make working sockets.
    #[tokio::test]
    async fn without_a_uid_the_sockets_are_the_threads_own_and_work() {
        let listener = Listener::bind(None, "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = std::net::TcpListener::local_addr(listener.fd.get_ref()).unwrap();
        let (accepted, connected) = tokio::join!(listener.accept(), connect(None, addr));
        assert_eq!(accepted.unwrap().peer_addr().unwrap(), connected.unwrap().local_addr().unwrap());
        let udp = udp(None, "127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(udp.local_addr().unwrap().port() > 0);
    }

    /// Whoever is not root cannot take another uid: the helper says so rather than make the
    /// socket as itself, which the rules would then treat as the agent's (or, as root, trust).
    #[test]
    fn a_uid_that_cannot_be_taken_is_an_error_not_a_socket_of_another_owner() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // Root can: what it makes in between is the uid's.
            let _ = std::fs::remove_file("/tmp/.owned-test");
            let made = as_uid(Some(65531), || std::fs::File::create("/tmp/.owned-test")).unwrap();
            drop(made);
            let meta = std::fs::metadata("/tmp/.owned-test").unwrap();
            let _ = std::fs::remove_file("/tmp/.owned-test");
            assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65531, "the file was made as the uid");
        } else {
            let err = as_uid(Some(65531), || Ok(())).unwrap_err();
            assert!(err.to_string().contains("uid 65531"), "{err}");
        }
    }
}
