//! Handles the C side holds: tokens, never pointers we dereference, so that a destroyed or made-up handle
//! is detected instead of read, and tokens are not reused within a process. `Registry` maps the tokens of
//! one kind of object (the communicators of `mscclpp.h`, and those of the NCCL face) to the objects.

use crate::error::{Error, ErrorKind, Result};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// High bits of every token, so that tokens are recognisable and never valid addresses.
const TOKEN_TAG: u64 = 0x4d53_0000_0000_0000;

/// Shared by every registry (and `registration::Registrations`): a token names one object, ever.
static NEXT: AtomicU64 = AtomicU64::new(1);

pub(crate) fn new_token() -> u64 {
    TOKEN_TAG | (NEXT.fetch_add(1, Ordering::Relaxed) << 4)
}

/// The live objects of one kind, by token.
pub struct Registry<T> {
    objects: Lazy<Mutex<HashMap<u64, Arc<T>>>>,
}

impl<T> Registry<T> {
    pub const fn new() -> Registry<T> {
        Registry {
            objects: Lazy::new(Default::default),
        }
    }

    /// Makes `object` reachable through a new token.
    pub fn insert(&self, object: Arc<T>) -> u64 {
        let token = new_token();
        self.objects.lock().insert(token, object);
        token
    }

    /// The object of `token`, or `None` for a removed or made-up token.
    pub fn get(&self, token: u64) -> Option<Arc<T>> {
        self.objects.lock().get(&token).cloned()
    }

    /// The communicator behind a C handle `comm`: NULL is an invalid argument; a handle that names nothing
    /// live (destroyed, aborted, or made up) is an error of kind `unknown`, which each face chooses as its
    /// legacy did (`mscclpp.h`: invalid usage; `nccl.h`: invalid argument, as NCCL's check of a comm).
    pub fn lookup_comm<H>(&self, comm: *const H, unknown: ErrorKind) -> Result<Arc<T>> {
        if comm.is_null() {
            return Err(Error::invalid_argument("comm is NULL"));
        }
        self.get(comm as u64).ok_or_else(|| Error {
            kind: unknown,
            message: format!("comm {comm:p} is not a live communicator (destroyed, aborted, or never created)"),
        })
    }

    /// Removes the token; the object is released when the last call using it returns.
    pub fn remove(&self, token: u64) -> Option<Arc<T>> {
        self.objects.lock().remove(&token)
    }

    /// A live object that `pred` accepts (the first found, in no particular order). `pred` runs without the
    /// registry's lock, so it may take the object's own.
    pub fn find(&self, pred: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        let all: Vec<Arc<T>> = self.objects.lock().values().cloned().collect();
        all.into_iter().find(|o| pred(o))
    }
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_tagged_and_never_reused() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert_eq!(a & 0xffff_0000_0000_0000, TOKEN_TAG);
    }

    #[test]
    fn a_registry_gives_back_what_it_holds_until_removed() {
        let r: Registry<u32> = Registry::new();
        let t = r.insert(Arc::new(7));
        assert_eq!(*r.get(t).unwrap(), 7);
        assert_eq!(*r.remove(t).unwrap(), 7);
        assert!(r.get(t).is_none() && r.remove(t).is_none());
    }

    #[test]
    fn a_comm_handle_is_null_live_or_unknown() {
        let r: Registry<u32> = Registry::new();
        let live = r.insert(Arc::new(3)) as *const u8;
        assert_eq!(*r.lookup_comm(live, ErrorKind::InvalidUsage).unwrap(), 3);
        let e = r
            .lookup_comm(std::ptr::null::<u8>(), ErrorKind::InvalidUsage)
            .unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::InvalidArgument, "comm is NULL")
        );
        r.remove(live as u64);
        let e = r.lookup_comm(live, ErrorKind::InvalidUsage).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("is not a live communicator"), "{}", e.message);
    }
}
