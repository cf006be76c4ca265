//! The few system calls the bootstrap needs that std does not offer: `poll`, a receive and a send that do
//! not block on an otherwise blocking socket, and the list of network interfaces. All of the bootstrap's unsafe code
//! is in this file.

use std::ffi::{CStr, CString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// One entry of a `poll` set.
#[derive(Clone, Copy, Debug)]
pub struct PollEntry {
    fd: RawFd,
    events: libc::c_short,
    /// True once `poll` returned with this descriptor ready (as asked), closed or failed.
    pub ready: bool,
}

impl PollEntry {
    /// Waits for input (or hang-up / error) on `fd`.
    pub fn readable(fd: &impl AsRawFd) -> PollEntry {
        PollEntry {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            ready: false,
        }
    }

    /// An entry `poll` ignores (a negative descriptor), keeping the others' places in the list.
    pub fn ignored() -> PollEntry {
        PollEntry {
            fd: -1,
            events: 0,
            ready: false,
        }
    }

    /// Waits for room to write (or hang-up / error) on `fd`.
    pub fn writable(fd: &impl AsRawFd) -> PollEntry {
        PollEntry {
            fd: fd.as_raw_fd(),
            events: libc::POLLOUT,
            ready: false,
        }
    }
}

/// The most connections a listener of the bootstrap keeps waiting to be accepted (the kernel caps it at
/// `net.core.somaxconn`). std listens with 128; a root that every rank of a large job reaches at once, and
/// a rank that every higher rank connects to at once, overflow that: the kernel then resets or drops the
/// connections beyond it, which peers took for a rank gone (256 host-only ranks: "Connection reset by
/// peer" in their init and shrink).
pub const LISTEN_BACKLOG: libc::c_int = 65535;

/// Raises the backlog of `listener` (already listening) to `LISTEN_BACKLOG`.
pub fn widen_backlog(listener: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: `listen` on a descriptor we own that is a bound, listening TCP socket; calling it again only
    // changes the backlog.
    if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until one of `entries` is ready or `timeout` passes (`None`: no limit). Interrupted waits
/// return with nothing ready; callers loop anyway.
pub fn poll(entries: &mut [PollEntry], timeout: Option<Duration>) -> io::Result<()> {
    let mut fds: Vec<libc::pollfd> = entries
        .iter()
        .map(|e| libc::pollfd {
            fd: e.fd,
            events: e.events,
            revents: 0,
        })
        .collect();
    let timeout_ms = match timeout {
        // Round up so that a wait for 0.4 ms does not spin with a zero timeout.
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int,
        None => -1,
    };
    // SAFETY: `fds` is a valid, initialised array of `fds.len()` pollfd structs that lives for the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(());
        }
        return Err(err);
    }
    for (entry, fd) in entries.iter_mut().zip(&fds) {
        entry.ready = fd.revents != 0;
    }
    Ok(())
}

/// Reads what is available from a socket without waiting, even when the socket is in blocking mode.
///
/// Our sockets stay blocking because another thread writes to a duplicate of the same descriptor, and
/// `O_NONBLOCK` would be shared with it; `MSG_DONTWAIT` affects only this one call. Returns
/// `ErrorKind::WouldBlock` when nothing is available, `Ok(0)` at end of stream.
pub fn recv_now(socket: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
        let rc = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Writes what fits into a socket's buffer without waiting, even when the socket is in blocking mode (see
/// `recv_now`); a closed peer is an error, never a SIGPIPE. Returns `ErrorKind::WouldBlock` when nothing
/// fits, else the bytes written, which may be fewer than `buf.len()`.
pub fn send_now(socket: &impl AsRawFd, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the duration of the call.
        let rc = unsafe {
            libc::send(
                socket.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One address of a network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
    /// The interface index, which is the scope of an IPv6 link-local address.
    pub index: u32,
    pub up: bool,
    pub loopback: bool,
}

/// The addresses of this machine's network interfaces, in the order the system lists them.
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`; we free it with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, which stays valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family field is always readable.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says this sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        let flags = ifa.ifa_flags;
        out.push(Interface {
            index: interface_index(&name).unwrap_or(0),
            name,
            addr,
            up: flags & libc::IFF_UP as libc::c_uint != 0,
            loopback: flags & libc::IFF_LOOPBACK as libc::c_uint != 0,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The index of the interface called `name`, if there is one.
pub fn interface_index(name: &str) -> Option<u32> {
    let c_name = CString::new(name).ok()?;
    // SAFETY: `c_name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    (index != 0).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    #[test]
    fn a_widened_listener_holds_hundreds_of_connections_not_yet_accepted() {
        // 300 connections at once, none accepted: std's backlog of 128 drops the ones past it (each connect
        // then times out), the widened one holds them all.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        widen_backlog(&listener).unwrap();
        let addr = listener.local_addr().unwrap();
        let held: Vec<_> = (0..300)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connection {i} of 300: {e}"))
            })
            .collect();
        assert_eq!(held.len(), 300);
    }

    #[test]
    fn loopback_is_listed_and_has_an_index() {
        let all = interfaces().unwrap();
        let lo = all
            .iter()
            .find(|i| i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 is listed");
        assert!(lo.loopback && lo.up);
        assert_eq!(interface_index(&lo.name), Some(lo.index));
        assert_eq!(interface_index("no-such-if0"), None);
        assert_eq!(interface_index("bad\0name"), None);
    }

    #[test]
    fn recv_now_does_not_block_and_poll_wakes_on_data() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(recv_now(&b, &mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);

        let start = Instant::now();
        let mut set = [PollEntry::readable(&b)];
        poll(&mut set, Some(Duration::from_millis(50))).unwrap();
        assert!(!set[0].ready);
        assert!(start.elapsed() >= Duration::from_millis(45));

        a.write_all(b"hi").unwrap();
        poll(&mut set, Some(Duration::from_secs(5))).unwrap();
        assert!(set[0].ready);
        assert_eq!(recv_now(&b, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"hi");

        drop(a);
        poll(&mut set, Some(Duration::from_secs(5))).unwrap();
        assert!(set[0].ready);
        assert_eq!(recv_now(&b, &mut buf).unwrap(), 0);
    }

    #[test]
    fn send_now_fills_a_socket_without_blocking_and_poll_sees_room() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (b, _) = listener.accept().unwrap();
        let chunk = vec![7u8; 1 << 16];
        let mut total = 0;
        // Nobody reads `b`: the buffers fill, and then a send says so instead of waiting.
        let start = Instant::now();
        loop {
            match send_now(&a, &chunk) {
                Ok(n) => total += n,
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(10), "never filled");
        }
        assert!(total > 0);
        let mut set = [PollEntry::writable(&a)];
        poll(&mut set, Some(Duration::from_millis(20))).unwrap();
        assert!(!set[0].ready);
        // Reading makes room.
        let mut sink = vec![0u8; 1 << 20];
        let mut drained = 0;
        while drained < total {
            match recv_now(&b, &mut sink) {
                Ok(n) => drained += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        poll(&mut set, Some(Duration::from_secs(5))).unwrap();
        assert!(set[0].ready);
        // A closed peer is an error, not a SIGPIPE.
        drop(b);
        std::thread::sleep(Duration::from_millis(20));
        let mut failed = false;
        for _ in 0..100 {
            if send_now(&a, b"x").is_err() {
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(failed);
    }
}
