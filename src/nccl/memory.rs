//! Memory: `ncclMemAlloc` / `ncclMemFree` (device memory the library allocates and tracks), and the
//! registrations of buffers (`ncclCommRegister`) and windows (`ncclCommWindowRegister`) in the core's
//! table (`crate::registration`), which the collectives' zero-copy path and the one-sided calls read.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::NcclComm;
use super::entry::{OK, entry, with_comm};
use super::types::*;
use crate::abi::non_null_args;
use crate::ensure_arg;
use crate::error::Result;
use crate::gpu::{DeviceAllocation, GpuContext};
use crate::registration::Kind;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

/// `ncclMemAlloc`'s allocations, by address.
static ALLOCATIONS: Lazy<Mutex<HashMap<u64, DeviceAllocation>>> = Lazy::new(Default::default);

nccl_export! {
    /// Device memory of the current device (size 0: `*ptr` = NULL).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        entry("ncclMemAlloc", || {
            non_null_args!(ptr);
            if size == 0 {
                // SAFETY: checked non-null.
                unsafe { *ptr = std::ptr::null_mut() };
                return OK;
            }
            let alloc = DeviceAllocation::zeroed(&GpuContext::current()?, size)?;
            let address = alloc.ptr();
            ALLOCATIONS.lock().insert(address, alloc);
            // SAFETY: checked non-null.
            unsafe { *ptr = address as *mut c_void };
            OK
        })
    }
}

nccl_export! {
    /// Frees memory of `ncclMemAlloc` (NULL: nothing to do).
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        entry("ncclMemFree", || {
            if ptr.is_null() {
                return OK;
            }
            let alloc = ALLOCATIONS.lock().remove(&(ptr as u64));
            ensure_arg!(alloc.is_some(), "ptr {ptr:p} was not allocated by ncclMemAlloc (or was freed)");
            drop(alloc);
            OK
        })
    }
}

nccl_export! {
    /// Registers a buffer with the communicator (`crate::registration`, as `mscclppCommRegister`): its
    /// allocation recorded so that memory freed and allocated again is told apart, and exported to the peers,
    /// whose collectives then read and write it directly (zero-copy, docs/ZERO_COPY.md).
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> ncclResult_t {
        with_comm("ncclCommRegister", comm, |c| {
            non_null_args!(handle);
            let token = register(c, buff, size, Kind::Buffer)?;
            // SAFETY: checked non-null.
            unsafe { *handle = token as *mut c_void };
            OK
        })
    }
}

nccl_export! {
    /// Forgets a registration. A NULL handle is NCCL's "nothing registered" (what its register gives
    /// without local registration): nothing to do.
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        with_comm("ncclCommDeregister", comm, |c| {
            if !handle.is_null() {
                c.core()?.deregister(handle as u64, Kind::Buffer, "handle")?;
            }
            OK
        })
    }
}

nccl_export! {
    /// Registers a window: a registration of its own kind in the same table, its flags kept.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        win: *mut ncclWindow_t,
        winFlags: c_int,
    ) -> ncclResult_t {
        with_comm("ncclCommWindowRegister", comm, |c| {
            non_null_args!(win);
            ensure_arg!(
                matches!(winFlags, NCCL_WIN_DEFAULT | NCCL_WIN_COLL_SYMMETRIC),
                "winFlags is {winFlags}; it must be NCCL_WIN_DEFAULT (0) or NCCL_WIN_COLL_SYMMETRIC (1)"
            );
            let token = register(c, buff, size, Kind::Window { flags: winFlags })?;
            // SAFETY: checked non-null.
            unsafe { *win = token as ncclWindow_t };
            OK
        })
    }
}

nccl_export! {
    /// Forgets a window (NULL: nothing to do, as `ncclCommDeregister`).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        with_comm("ncclCommWindowDeregister", comm, |c| {
            if !win.is_null() {
                c.core()?.deregister(win as u64, Kind::Window { flags: 0 }, "win")?;
            }
            OK
        })
    }
}

/// Registers `[buff, buff + size)` of `kind` with the core communicator: the arguments first (so that they
/// are reported whatever the communicator's state), then its state (refused once revoked or finalized),
/// then the driver. Memory of `ncclMemAlloc` is marked as the library's own.
fn register(c: &NcclComm, buff: *mut c_void, size: usize, kind: Kind) -> Result<u64> {
    crate::registration::check_range(buff as u64, size)?;
    let core = c.usable()?;
    let start = buff as u64;
    let library_memory = ALLOCATIONS
        .lock()
        .values()
        .any(|a| start >= a.ptr() && start + size as u64 <= a.ptr() + a.size() as u64);
    core.register(start, size, kind, library_memory)
}
