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

pub fn register(comm: Communicator) -> mscclppComm_t {
    let token = TOKEN_TAG | (NEXT.fetch_add(1, Ordering::Relaxed) << 4);
    COMMS.lock().insert(token, Arc::new(comm));
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
