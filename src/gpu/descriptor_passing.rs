//! File descriptors from one process to another of the same machine: how a rank hands the peers of its
//! host the descriptor of its shared memory (`shareable.rs`).
//!
//! Each receiver binds a Unix datagram socket to an abstract address that the kernel picks (autobind: no
//! file, no name to collide with another job's), and sends that address to its peers over the bootstrap. A
//! sender then sends each peer one datagram carrying the descriptor (`SCM_RIGHTS`) and its own rank. A
//! datagram is queued at the receiver when `send` returns, so once every sender has sent and the ranks have
//! met at a barrier of the bootstrap, every descriptor has arrived, and a peer that died before sending has
//! failed the barrier instead.
//!
//! A socket's queue holds only a few datagrams (`net.unix.max_dgram_qlen`, 10 by default): a rank with more
//! peers than that cannot have them all queued at once while it takes nothing. So the inbox takes what
//! arrives on a thread of its own while the rank sends and meets the others (`take_during`): with every
//! rank of 16 sharing one GPU, each rank's eleventh send waited for a peer that would take nothing before
//! the barrier, which that peer's own eleventh send kept it from reaching.
//!
//! Abstract addresses live in the network namespace: processes of one machine reach each other, others
//! never can (and are never sent a descriptor: only ranks of one host share memory).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The bytes of a datagram: the sender's rank.
const PAYLOAD: usize = 4;

/// `sun_path`'s offset in `sockaddr_un`: an address's length counts from the start of the structure.
fn path_offset() -> usize {
    std::mem::offset_of!(libc::sockaddr_un, sun_path)
}

fn os_error(what: &str) -> Error {
    Error::system(format!("{what}: {}", std::io::Error::last_os_error()))
}

/// A socket that receives descriptors, bound to an address of its own.
pub struct DescriptorInbox {
    socket: OwnedFd,
    address: Vec<u8>,
}

impl DescriptorInbox {
    /// A new socket with an abstract address the kernel picks.
    pub fn bind() -> Result<DescriptorInbox> {
        // SAFETY: plain socket creation; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_error("socket(AF_UNIX, SOCK_DGRAM)"));
        }
        // SAFETY: a new descriptor that nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_un is valid; only the family is set.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // Only the family: the kernel binds the socket to a fresh abstract address (autobind).
        let family_only = std::mem::size_of::<libc::sa_family_t>() as libc::socklen_t;
        // SAFETY: `addr` is valid for the length given.
        if unsafe { libc::bind(raw, (&addr as *const libc::sockaddr_un).cast(), family_only) } != 0 {
            return Err(os_error("bind (an abstract Unix address)"));
        }
        let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: `addr` and `len` are valid out-parameters of the length given.
        if unsafe { libc::getsockname(raw, (&mut addr as *mut libc::sockaddr_un).cast(), &mut len) } != 0 {
            return Err(os_error("getsockname"));
        }
        let path_len = (len as usize).saturating_sub(path_offset());
        let address = addr.sun_path[..path_len].iter().map(|&c| c as u8).collect();
        Ok(DescriptorInbox { socket, address })
    }

    /// The address peers send to (`send`): abstract, so it begins with a zero byte.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// Runs `meanwhile` (this rank's sends and the barrier after them) while a thread of this inbox takes
    /// every descriptor that arrives, so that no sender ever waits on a full queue here; then returns
    /// `meanwhile`'s result and the descriptors: exactly `expected` senders', each once, or an error naming
    /// what is missing or unexpected. `meanwhile`'s error comes first (a peer that died fails the barrier).
    pub fn take_during<T>(
        &self,
        expected: &[usize],
        meanwhile: impl FnOnce() -> Result<T>,
    ) -> Result<(T, HashMap<usize, OwnedFd>)> {
        let done = std::sync::atomic::AtomicBool::new(false);
        let (result, taken) = std::thread::scope(|s| {
            let taker = s.spawn(|| self.take_until(expected, &done));
            let result = meanwhile();
            done.store(true, std::sync::atomic::Ordering::Release);
            (result, taker.join().expect("the descriptor inbox's thread panicked"))
        });
        let value = result?;
        let got = taken?;
        let missing: Vec<_> = expected.iter().filter(|r| !got.contains_key(r)).collect();
        if !missing.is_empty() {
            return Err(Error::internal(format!(
                "the memory descriptors of ranks {missing:?} had not arrived after the barrier that follows their \
                 sending"
            )));
        }
        Ok((value, got))
    }

    /// Takes descriptors as they come until `expected` have, or `done` is set (then what is queued).
    fn take_until(&self, expected: &[usize], done: &std::sync::atomic::AtomicBool) -> Result<HashMap<usize, OwnedFd>> {
        let mut got = HashMap::new();
        loop {
            let finishing = done.load(std::sync::atomic::Ordering::Acquire);
            while let Some((sender, fd)) = self.take_one()? {
                if !expected.contains(&sender) || got.contains_key(&sender) {
                    return Err(Error::internal(format!(
                        "a memory descriptor came from rank {sender}, which was not to send one (expected \
                         {expected:?})"
                    )));
                }
                got.insert(sender, fd);
            }
            if finishing || got.len() == expected.len() {
                return Ok(got);
            }
            let mut ready = libc::pollfd {
                fd: self.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // A short wait: `done` is looked at between them. SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut ready, 1, 5) };
        }
    }

    fn take_one(&self) -> Result<Option<(usize, OwnedFd)>> {
        let mut payload = [0u8; PAYLOAD];
        let mut iov = libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: PAYLOAD,
        };
        // Room for one descriptor's control message, aligned as cmsghdr wants.
        let mut control = [0u64; 8];
        // SAFETY: an all-zero msghdr is valid; the pointers set below stay alive across the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` describes buffers valid for their lengths.
        let n = unsafe {
            libc::recvmsg(
                self.socket.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error::system(format!("recvmsg (a memory descriptor): {e}")));
        }
        // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR reads only inside its control buffer.
        let header = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        // SAFETY: `header` (when not null) points into `control`.
        let fd = (!header.is_null()
            && unsafe { (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS })
        .then(|| {
            // SAFETY: an SCM_RIGHTS message's data is the descriptors, one here; read unaligned.
            unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(header) as *const RawFd) }
        });
        let Some(fd) = fd else {
            return Err(Error::internal(
                "a datagram without a memory descriptor reached the descriptor inbox",
            ));
        };
        // SAFETY: the kernel installed a new descriptor for this process.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if n as usize != PAYLOAD || msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(Error::internal(format!(
                "a descriptor datagram of {n} bytes (flags {:#x})",
                msg.msg_flags
            )));
        }
        Ok(Some((u32::from_le_bytes(payload) as usize, fd)))
    }
}

/// Sends `fd` (a duplicate of it arrives) and the sender's rank `from` to the inbox at `address`. While the
/// receiver's queue is full, `still_waiting` is asked between short pauses whether to go on (the bootstrap's
/// word on the peers): a receiver that stopped taking never holds the sender forever.
pub fn send(address: &[u8], from: usize, fd: &OwnedFd, still_waiting: &dyn Fn() -> Result<()>) -> Result<()> {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if address.is_empty() || address.len() > addr.sun_path.len() {
        return Err(Error::internal(format!(
            "a descriptor inbox address of {} bytes",
            address.len()
        )));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(address) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket creation; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(os_error("socket(AF_UNIX, SOCK_DGRAM)"));
    }
    // SAFETY: a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut payload = (from as u32).to_le_bytes();
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: PAYLOAD,
    };
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: an all-zero msghdr is valid; the pointers set below stay alive across the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
    msg.msg_namelen = (path_offset() + address.len()) as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds `space` bytes (at most 64); the header and its data are written
    // inside it.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header) as *mut RawFd, fd.as_raw_fd());
    }
    loop {
        // SAFETY: `msg` describes buffers valid for their lengths.
        if unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) } >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(Error::system(format!(
                "sendmsg (a memory descriptor to a peer of this machine): {e}"
            )));
        }
        still_waiting()?;
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    fn temp_file(text: &[u8]) -> OwnedFd {
        let mut f = std::fs::File::from(
            // SAFETY: memfd_create with a valid name; the result is checked below.
            unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"descriptor-test".as_ptr(), libc::MFD_CLOEXEC)) },
        );
        f.write_all(text).unwrap();
        f.into()
    }

    fn go_on() -> Result<()> {
        Ok(())
    }

    /// What is queued at `inbox` now: exactly `expected` senders', or the error.
    fn take(inbox: &DescriptorInbox, expected: &[usize]) -> Result<HashMap<usize, OwnedFd>> {
        inbox.take_during(expected, || Ok(())).map(|((), got)| got)
    }

    #[test]
    fn more_senders_than_a_queue_holds_all_arrive_while_the_inbox_takes() {
        // Sixteen ranks sharing a GPU: fifteen peers send to one inbox before the barrier. The kernel's
        // queue holds fewer (10 by default): without the taking thread the senders would wait forever.
        let inbox = DescriptorInbox::bind().unwrap();
        let senders: Vec<usize> = (1..=40).collect();
        let ((), mut got) = inbox
            .take_during(&senders, || {
                std::thread::scope(|s| {
                    for &r in &senders {
                        let address = inbox.address().to_vec();
                        s.spawn(move || send(&address, r, &temp_file(format!("from {r}").as_bytes()), &go_on));
                    }
                });
                Ok(())
            })
            .unwrap();
        assert_eq!(got.len(), 40);
        let mut f = std::fs::File::from(got.remove(&17).unwrap());
        f.rewind().unwrap();
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        assert_eq!(text, "from 17");
    }

    #[test]
    fn a_full_queue_that_nobody_takes_ends_the_send_when_told_to() {
        let inbox = DescriptorInbox::bind().unwrap();
        let tries = std::cell::Cell::new(0);
        let give_up = || {
            tries.set(tries.get() + 1);
            if tries.get() > 20 {
                Err(Error::remote("rank 9 failed"))
            } else {
                Ok(())
            }
        };
        let mut ended = None;
        for r in 0..64 {
            if let Err(e) = send(inbox.address(), r, &temp_file(b"x"), &give_up) {
                ended = Some(e);
                break;
            }
        }
        let e = ended.expect("the queue filled up and the send gave up");
        assert!(e.message.contains("rank 9 failed"), "{e}");
    }

    #[test]
    fn descriptors_arrive_with_their_senders_and_name_the_same_file() {
        let inbox = DescriptorInbox::bind().unwrap();
        assert_eq!(inbox.address()[0], 0, "an abstract address");
        assert!(take(&inbox, &[]).unwrap().is_empty());
        send(inbox.address(), 3, &temp_file(b"from three"), &go_on).unwrap();
        send(inbox.address(), 1, &temp_file(b"from one"), &go_on).unwrap();
        let mut got = take(&inbox, &[1, 3]).unwrap();
        for (rank, text) in [(1, "from one"), (3, "from three")] {
            let mut f = std::fs::File::from(got.remove(&rank).unwrap());
            f.rewind().unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            assert_eq!(s, text);
        }
    }

    #[test]
    fn a_missing_or_unexpected_sender_is_an_error_naming_it() {
        let inbox = DescriptorInbox::bind().unwrap();
        send(inbox.address(), 2, &temp_file(b"x"), &go_on).unwrap();
        let e = take(&inbox, &[2, 5]).unwrap_err();
        assert!(e.message.contains("ranks [5]"), "{e}");
        send(inbox.address(), 7, &temp_file(b"x"), &go_on).unwrap();
        let e = take(&inbox, &[2]).unwrap_err();
        assert!(e.message.contains("rank 7"), "{e}");
        let gone = DescriptorInbox::bind().unwrap().address().to_vec();
        let e = send(&gone, 0, &temp_file(b"x"), &go_on).unwrap_err();
        assert!(e.message.contains("sendmsg"), "{e}");
    }
}
