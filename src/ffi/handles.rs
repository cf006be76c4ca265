//! Communicator handles. A handle is a token, never a pointer we dereference: a destroyed or made-up
//! handle is detected instead of read, and tokens are not reused within a process.

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::mscclppComm_t;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// High bits of every token, so that tokens are recognisable and never valid addresses.
const TOKEN_TAG: u64 = 0x4d53_0000_0000_0000;

static COMMS: Lazy<Mutex<HashMap<u64, Arc<Communicator>>>> = Lazy::new(Default::default);
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Makes `comm` reachable through a new handle; from now on a failure the bootstrap detects aborts it.
pub fn register(comm: Communicator) -> mscclppComm_t {
    let token = TOKEN_TAG | (NEXT.fetch_add(1, Ordering::Relaxed) << 4);
    let comm = Arc::new(comm);
    comm.watch_failures();
    COMMS.lock().insert(token, comm);
    token as mscclppComm_t
}

pub fn lookup(handle: mscclppComm_t) -> Result<Arc<Communicator>> {
    if handle.is_null() {
        return Err(Error::invalid_argument("comm is NULL"));
    }
    COMMS.lock().get(&(handle as u64)).cloned().ok_or_else(|| {
        Error::invalid_usage(format!(
            "comm {handle:p} is not a live communicator (destroyed, or never created)"
        ))
    })
}

/// Removes the handle; the communicator is released when the last call using it returns.
pub fn unregister(handle: mscclppComm_t) -> Result<Arc<Communicator>> {
    lookup(handle)?;
    COMMS
        .lock()
        .remove(&(handle as u64))
        .ok_or_else(|| Error::invalid_usage("comm was destroyed concurrently"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_made_up_handles_are_rejected() {
        let e = lookup(std::ptr::null_mut()).err().unwrap();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
        assert!(e.message.contains("comm is NULL"));
        let e = lookup(0x1234 as mscclppComm_t).err().unwrap();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
        assert!(unregister(0x1234 as mscclppComm_t).is_err());
    }

    #[test]
    fn tokens_are_tagged_and_never_reused() {
        let a = TOKEN_TAG | (NEXT.fetch_add(1, Ordering::Relaxed) << 4);
        let b = TOKEN_TAG | (NEXT.fetch_add(1, Ordering::Relaxed) << 4);
        assert_ne!(a, b);
        assert_eq!(a & 0xffff_0000_0000_0000, TOKEN_TAG);
    }
}
