//! Registered buffers: what `mscclppCommRegister` and NCCL's `ncclCommRegister` and
//! `ncclCommWindowRegister` record, one table per communicator (`Communicator::registrations`).
//!
//! Registering is local: no peer takes part, so ranks may register different buffers, at different
//! moments. A registration records the range and what identifies the allocation that holds it: the
//! driver's buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`, never reused within a process) and the
//! allocation's base and size. An application may free a registered buffer and get the same address back
//! from a later allocation; `lookup` asks the driver again and compares the ids, so that such a stale
//! entry is never taken for the new memory. Handles are tokens from the same sequence as the
//! communicators' (`abi::handles`), never addresses.
//!
//! The zero-copy collectives (`collective::zero_copy`) look a call's buffers up here; each registration is
//! also exported to the peers when it is made (`Collectives::registered`).

use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, pointer_info};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

/// What a registration was made by: each face's deregistration accepts its own kind only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `mscclppCommRegister` or `ncclCommRegister`.
    Buffer,
    /// `ncclCommWindowRegister`, with its `winFlags`.
    Window { flags: i32 },
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Buffer => "registration",
            Kind::Window { .. } => "window",
        }
    }
}

/// The allocation that holds a registered range, as the driver describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: tells a reallocation at the same address from the original.
    pub buffer_id: u64,
    pub base: DevicePtr,
    pub size: usize,
    pub device: i32,
}

impl Allocation {
    /// Asks the driver about the allocation holding `[ptr, ptr + len)`, which must be device memory and
    /// lie inside it. Without a driver: `UnhandledCuda`.
    pub fn of(ptr: DevicePtr, len: u64, what: &str) -> Result<Allocation> {
        let info = pointer_info(ptr, len, what)?;
        Ok(Allocation {
            buffer_id: info.buffer_id,
            base: info.base,
            size: info.alloc_size,
            device: info.device,
        })
    }
}

/// One registered range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    pub ptr: DevicePtr,
    pub len: usize,
    pub kind: Kind,
    pub allocation: Allocation,
    /// The memory came from the library's own allocator (`ncclMemAlloc`): it cannot be freed behind the
    /// library's back, and it may be exported to peers as it is.
    pub library_memory: bool,
}

impl Registration {
    fn holds(&self, ptr: DevicePtr, len: usize) -> bool {
        ptr >= self.ptr
            && ptr
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.ptr + self.len as u64)
    }
}

/// The registrations of one communicator, by token.
#[derive(Default)]
pub struct Registrations {
    entries: Mutex<HashMap<u64, Registration>>,
    /// Each window's ordinal among the communicator's windows (1 for the first registered, never reused):
    /// NCCL registers windows collectively, so a peer's window of the same ordinal is the same window
    /// (`collective::signal`). The count sits under the same lock.
    window_ordinals: Mutex<(u32, HashMap<u64, u32>)>,
    /// Stale registrations already reported: each gets one WARN line, not one per call that meets it.
    reported_stale: Mutex<HashSet<u64>>,
}

/// Checks the arguments every registration takes, naming them as both faces' headers do.
pub fn check_range(buff: DevicePtr, size: usize) -> Result<()> {
    if buff == 0 {
        return Err(Error::invalid_argument("buff is NULL"));
    }
    if size == 0 {
        return Err(Error::invalid_argument(
            "size is 0; a registration must cover at least one byte",
        ));
    }
    if buff.checked_add(size as u64).is_none() {
        return Err(Error::invalid_argument(format!(
            "buff {buff:#x} + size {size} overflows"
        )));
    }
    Ok(())
}

impl Registrations {
    /// Registers `[buff, buff + size)`: checks the range, asks the driver which allocation holds it, and
    /// returns the new registration's token and what it recorded. `library_memory` says whether the range
    /// lies in memory of the library's own allocator.
    pub fn register(
        &self,
        buff: DevicePtr,
        size: usize,
        kind: Kind,
        library_memory: bool,
    ) -> Result<(u64, Registration)> {
        check_range(buff, size)?;
        let allocation = Allocation::of(buff, size as u64, "buff")?;
        let registration = Registration {
            ptr: buff,
            len: size,
            kind,
            allocation,
            library_memory,
        };
        Ok((self.insert(registration), registration))
    }

    /// Records a registration whose allocation is known (`register`, and tests without a GPU).
    pub fn insert(&self, registration: Registration) -> u64 {
        let token = crate::abi::handles::new_token();
        if let Kind::Window { .. } = registration.kind {
            let mut ordinals = self.window_ordinals.lock();
            ordinals.0 += 1;
            let ordinal = ordinals.0;
            ordinals.1.insert(token, ordinal);
        }
        self.entries.lock().insert(token, registration);
        log::debug!(
            "{} {token:#x}: {} bytes at {:#x} (allocation {:#x}, {} bytes, buffer id {})",
            registration.kind.noun(),
            registration.len,
            registration.ptr,
            registration.allocation.base,
            registration.allocation.size,
            registration.allocation.buffer_id
        );
        token
    }

    /// Removes the registration of `token`, which must be one of this table's of `kind`; `what` names
    /// the handle argument in the error (unknown, made up, already deregistered, or of another kind:
    /// `InvalidUsage`).
    pub fn deregister(&self, token: u64, kind: Kind, what: &str) -> Result<Registration> {
        let mut entries = self.entries.lock();
        match entries.get(&token) {
            Some(r) if std::mem::discriminant(&r.kind) == std::mem::discriminant(&kind) => {}
            Some(r) => {
                return Err(Error::invalid_usage(format!(
                    "{what} {token:#x} is a {} of this communicator, not a {}",
                    r.kind.noun(),
                    kind.noun()
                )));
            }
            None => {
                return Err(Error::invalid_usage(format!(
                    "{what} {token:#x} is not a live {} of this communicator (deregistered already, or never \
                     issued by it)",
                    kind.noun()
                )));
            }
        }
        self.reported_stale.lock().remove(&token);
        self.window_ordinals.lock().1.remove(&token);
        Ok(entries.remove(&token).expect("checked above under the same lock"))
    }

    /// The live registration of `token`, whatever its kind (not checked against the driver).
    pub fn get(&self, token: u64) -> Option<Registration> {
        self.entries.lock().get(&token).copied()
    }

    /// The ordinal of the live window `token` among the communicator's windows (1, 2, ... in the order
    /// they were registered, deregistered ones counted); `None` for anything else.
    pub fn window_ordinal(&self, token: u64) -> Option<u32> {
        self.window_ordinals.lock().1.get(&token).copied()
    }

    /// The registration (its token and itself) that holds all of `[ptr, ptr + len)`, if its allocation is
    /// still the one registered (the driver is asked again). A stale one, whose memory was freed (and perhaps
    /// allocated again at the same address), gives `None` and a log line.
    pub fn lookup(&self, ptr: DevicePtr, len: usize) -> Option<(u64, Registration)> {
        self.lookup_with(ptr, len, |p, l| Allocation::of(p, l, "a registered buffer"))
    }

    /// `lookup` with the allocation query given: the driver's, or a test's.
    pub fn lookup_with(
        &self,
        ptr: DevicePtr,
        len: usize,
        query: impl FnOnce(DevicePtr, u64) -> Result<Allocation>,
    ) -> Option<(u64, Registration)> {
        let (token, found) = self
            .entries
            .lock()
            .iter()
            .find(|(_, r)| r.holds(ptr, len))
            .map(|(t, r)| (*t, *r))?;
        let why = match query(ptr, len as u64) {
            Ok(now) if now.buffer_id == found.allocation.buffer_id && now.base == found.allocation.base => {
                return Some((token, found));
            }
            Ok(now) => format!(
                "the memory there is now another allocation (buffer id {} where {} was registered)",
                now.buffer_id, found.allocation.buffer_id
            ),
            Err(e) => e.message,
        };
        let level = if self.first_report_of_stale(token) {
            log::Level::Warn
        } else {
            log::Level::Debug
        };
        log::log!(
            level,
            "{} {token:#x} of {} bytes at {:#x} is stale: {why}; it is not used, deregister it",
            found.kind.noun(),
            found.len,
            found.ptr
        );
        None
    }

    /// Whether `token`'s staleness is reported for the first time (then at WARN; later calls that meet it
    /// at DEBUG, so that a loop of calls does not repeat the line).
    fn first_report_of_stale(&self, token: u64) -> bool {
        self.reported_stale.lock().insert(token)
    }

    /// Forgets every registration (the communicator's destroy); returns how many there were.
    pub fn clear(&self) -> usize {
        self.reported_stale.lock().clear();
        self.window_ordinals.lock().1.clear();
        let mut entries = self.entries.lock();
        let n = entries.len();
        entries.clear();
        n
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn allocation(buffer_id: u64) -> Allocation {
        Allocation {
            buffer_id,
            base: 0x10_0000,
            size: 1 << 20,
            device: 0,
        }
    }

    fn entry(ptr: DevicePtr, len: usize, kind: Kind) -> Registration {
        Registration {
            ptr,
            len,
            kind,
            allocation: allocation(7),
            library_memory: false,
        }
    }

    #[test]
    fn bad_ranges_are_refused_naming_the_argument() {
        let r = Registrations::default();
        let e = r.register(0, 64, Kind::Buffer, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("buff is NULL"), "{}", e.message);
        let e = r.register(0x1000, 0, Kind::Buffer, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("size is 0"), "{}", e.message);
        let e = check_range(u64::MAX - 3, 8).unwrap_err();
        assert!(e.message.contains("overflows"), "{}", e.message);
        assert!(r.is_empty(), "nothing recorded for refused ranges");
    }

    #[test]
    fn without_a_driver_registering_is_a_cuda_error_after_the_checks() {
        if crate::gpu::ensure_driver().is_ok() {
            return; // a machine with a driver answers about the address instead
        }
        let r = Registrations::default();
        let e = r.register(0x1000, 64, Kind::Buffer, false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Cuda);
        assert!(r.is_empty());
    }

    #[test]
    fn tokens_deregister_once_and_only_for_their_kind() {
        let r = Registrations::default();
        let buffer = r.insert(entry(0x10_0000, 4096, Kind::Buffer));
        let window = r.insert(entry(0x10_1000, 4096, Kind::Window { flags: 1 }));
        assert_ne!(buffer, window);
        assert_eq!(
            buffer & 0xffff_0000_0000_0000,
            0x4d53_0000_0000_0000,
            "a token, not an address"
        );
        assert_eq!(r.len(), 2);
        let e = r.deregister(window, Kind::Buffer, "handle").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("is a window"), "{}", e.message);
        assert_eq!(r.deregister(buffer, Kind::Buffer, "handle").unwrap().ptr, 0x10_0000);
        let e = r.deregister(buffer, Kind::Buffer, "handle").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(
            e.message.contains("handle") && e.message.contains("not a live registration"),
            "{}",
            e.message
        );
        let e = r
            .deregister(0x4d53_0000_dead_0000, Kind::Window { flags: 0 }, "win")
            .unwrap_err();
        assert!(e.message.starts_with("win "), "{}", e.message);
        assert!(r.deregister(window, Kind::Window { flags: 0 }, "win").is_ok());
        assert!(r.is_empty());
    }

    #[test]
    fn windows_are_numbered_in_registration_order_and_the_numbers_never_reused() {
        let r = Registrations::default();
        let first = r.insert(entry(0x10_0000, 4096, Kind::Window { flags: 0 }));
        let buffer = r.insert(entry(0x10_1000, 4096, Kind::Buffer));
        let second = r.insert(entry(0x10_2000, 4096, Kind::Window { flags: 1 }));
        assert_eq!(r.window_ordinal(first), Some(1));
        assert_eq!(r.window_ordinal(buffer), None, "buffers are not windows");
        assert_eq!(r.window_ordinal(second), Some(2));
        assert_eq!(r.get(second).unwrap().ptr, 0x10_2000);
        r.deregister(first, Kind::Window { flags: 0 }, "win").unwrap();
        assert_eq!(r.window_ordinal(first), None);
        assert!(r.get(first).is_none());
        let third = r.insert(entry(0x10_0000, 4096, Kind::Window { flags: 0 }));
        assert_eq!(
            r.window_ordinal(third),
            Some(3),
            "the first's number is not given again"
        );
        r.clear();
        assert_eq!(r.window_ordinal(third), None);
        let fourth = r.insert(entry(0x10_0000, 4096, Kind::Window { flags: 0 }));
        assert_eq!(r.window_ordinal(fourth), Some(4));
    }

    #[test]
    fn lookup_finds_covering_ranges_only_while_the_allocation_is_the_same() {
        let r = Registrations::default();
        r.insert(entry(0x10_0000, 4096, Kind::Buffer));
        let same = |_, _| Ok(allocation(7));
        assert_eq!(r.lookup_with(0x10_0100, 256, same).unwrap().1.len, 4096);
        assert!(
            r.lookup_with(0x10_0f00, 512, same).is_none(),
            "runs past the registered range"
        );
        assert!(r.lookup_with(0x0f_ff00, 512, same).is_none(), "starts before it");
        assert!(
            r.lookup_with(0x10_0000, usize::MAX, same).is_none(),
            "overflowing length"
        );
        // Freed and allocated again at the same address: another buffer id.
        assert!(r.lookup_with(0x10_0000, 64, |_, _| Ok(allocation(8))).is_none());
        // Freed and not reallocated: the driver no longer knows the address.
        assert!(
            r.lookup_with(0x10_0000, 64, |_, _| Err(Error::invalid_argument("not device memory")))
                .is_none()
        );
        assert_eq!(r.len(), 1, "a stale entry stays until it is deregistered");
        assert_eq!(r.clear(), 1);
        assert!(r.lookup_with(0x10_0000, 64, same).is_none());
    }

    #[test]
    fn a_stale_registration_is_reported_once_until_it_goes() {
        let r = Registrations::default();
        let token = r.insert(entry(0x10_0000, 4096, Kind::Buffer));
        let moved = |_, _| Ok(allocation(8));
        assert!(r.lookup_with(0x10_0000, 64, moved).is_none());
        assert!(!r.first_report_of_stale(token), "the first lookup reported it");
        assert!(r.lookup_with(0x10_0000, 64, moved).is_none());
        assert_eq!(r.reported_stale.lock().len(), 1);
        // Deregistered, its token is forgotten; a live registration is never reported.
        r.deregister(token, Kind::Buffer, "handle").unwrap();
        assert!(r.reported_stale.lock().is_empty());
        r.insert(entry(0x10_0000, 4096, Kind::Buffer));
        assert!(r.lookup_with(0x10_0000, 64, |_, _| Ok(allocation(7))).is_some());
        assert!(r.reported_stale.lock().is_empty());
    }
}
