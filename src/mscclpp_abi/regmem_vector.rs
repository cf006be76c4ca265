//! Access to the application's `mscclppRegisteredMemory`, whose `std::vector` only C++ may touch: the
//! small C++ part in `src/cxx/registered_memory.cpp` does it for us.

use crate::error::{Error, Result};
use crate::types::{mscclppIbMr, mscclppRegisteredMemory, mscclppRegisteredMemoryP2P};
use std::ffi::{c_int, c_void};

unsafe extern "C" {
    fn mscclpp_regmem_append(mem: *mut mscclppRegisteredMemory, remote: *mut c_void, ib_mr: *mut mscclppIbMr) -> c_int;
    fn mscclpp_regmem_len(mem: *const mscclppRegisteredMemory) -> usize;
    fn mscclpp_regmem_data(mem: *const mscclppRegisteredMemory) -> *const mscclppRegisteredMemoryP2P;
}

/// Appends one entry to `mem->p2p`.
///
/// # Safety
/// `mem` points at a live `mscclppRegisteredMemory` of the application.
pub unsafe fn append(mem: *mut mscclppRegisteredMemory, entry: mscclppRegisteredMemoryP2P) -> Result<()> {
    // SAFETY: the caller's promise; the C++ side catches allocation failures.
    if unsafe { mscclpp_regmem_append(mem, entry.remoteBuff, entry.IbMr) } != 0 {
        return Err(Error::system("out of memory appending to regMem->p2p"));
    }
    Ok(())
}

/// A copy of `mem->p2p`.
///
/// # Safety
/// `mem` points at a live `mscclppRegisteredMemory` of the application.
pub unsafe fn entries(mem: *const mscclppRegisteredMemory) -> Vec<mscclppRegisteredMemoryP2P> {
    // SAFETY: the caller's promise; data() and size() describe the vector's live elements.
    unsafe {
        let n = mscclpp_regmem_len(mem);
        if n == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(mscclpp_regmem_data(mem), n).to_vec()
        }
    }
}
