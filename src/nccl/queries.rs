//! What a caller asks of the library and of a communicator: `ncclGetVersion`, `ncclGetErrorString`,
//! `ncclGetLastError`, `ncclCommGetAsyncError`, `ncclCommCount`, `ncclCommUserRank`, `ncclCommCuDevice`.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm as ncomm;
use super::entry::{OK, entry, with_comm};
use super::error as nerror;
use super::types::*;
use crate::abi::non_null_args;
use crate::error::Error;
use std::ffi::{CStr, c_char, c_int};

nccl_export! {
    /// The version of NCCL's API this library implements: 2.32.3 (`NCCL_VERSION_CODE`, 23203).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        entry("ncclGetVersion", || {
            non_null_args!(version);
            // SAFETY: checked non-null.
            unsafe { *version = NCCL_VERSION_CODE };
            OK
        })
    }
}

nccl_export! {
    /// A static description of a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: c_int) -> *const c_char {
        nerror::describe(result).as_ptr()
    }
}

nccl_export! {
    /// The last error's message: the communicator's failure once one was seen, else that of this
    /// thread's last failing call, else (NVIDIA's library keeps one for the process, and PyTorch asks with
    /// NULL from its watchdog thread) the process's last error, a communicator's failure reported by
    /// `ncclCommGetAsyncError` among them ("" when none).
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let failure = (!comm.is_null())
            .then(|| ncomm::lookup(comm).ok())
            .flatten()
            .and_then(|c| {
                c.async_error();
                c.failure_message()
            });
        failure.unwrap_or_else(|| {
            let mine = nerror::last_on_this_thread();
            // SAFETY: a NUL-terminated string of this thread's, valid until its next failing call.
            if unsafe { CStr::from_ptr(mine) }.is_empty() { nerror::last_in_process() } else { mine }
        })
    }
}

nccl_export! {
    /// The communicator's asynchronous error, without blocking: `ncclInProgress` while it initialises,
    /// `ncclRemoteError` once a peer failed, `ncclInvalidUsage` after its own abort.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
        with_comm("ncclCommGetAsyncError", comm, |c| {
            non_null_args!(asyncError);
            let r = c.async_error();
            if !matches!(r, ncclResult_t::ncclSuccess | ncclResult_t::ncclInProgress)
                && let Some(m) = c.failure_message()
            {
                // SAFETY: the communicator's message, a NUL-terminated string it keeps.
                nerror::record_in_process(&unsafe { CStr::from_ptr(m) }.to_string_lossy());
            }
            // SAFETY: checked non-null.
            unsafe { *asyncError = r };
            OK
        })
    }
}

nccl_export! {
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        with_comm("ncclCommCount", comm, |c| {
            non_null_args!(count);
            let n = c.nranks()?;
            // SAFETY: checked non-null.
            unsafe { *count = n as c_int };
            OK
        })
    }
}

nccl_export! {
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        with_comm("ncclCommUserRank", comm, |c| {
            non_null_args!(rank);
            let (r, _) = c.place()?;
            // SAFETY: checked non-null.
            unsafe { *rank = r as c_int };
            OK
        })
    }
}

nccl_export! {
    /// The CUDA device the communicator works on.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        with_comm("ncclCommCuDevice", comm, |c| {
            non_null_args!(device);
            let d = c
                .device
                .ok_or_else(|| Error::cuda("the communicator has no device: the CUDA driver is not installed"))?;
            // SAFETY: checked non-null.
            unsafe { *device = d };
            OK
        })
    }
}
