//! Ending a communicator: `ncclCommFinalize` (no more work), `ncclCommDestroy` (freed), `ncclCommAbort`
//! (every rank stopped, then freed) and `ncclCommRevoke` (its work stopped, the communicator kept for
//! `ncclCommShrink`, see `split.rs`).
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm as ncomm;
use super::entry::{OK, with_comm};
use super::types::*;
use crate::ensure_arg;
use std::ffi::c_int;

nccl_export! {
    /// Ends the communicator's work: later calls on it but `ncclCommDestroy` are refused. Its work is
    /// stream-ordered on the application's streams, so nothing is left to flush.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        with_comm("ncclCommFinalize", comm, |c| {
            c.finalize()?;
            OK
        })
    }
}

nccl_export! {
    /// Frees the communicator (waiting for an initialisation still running). NULL: nothing to do.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        if comm.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        with_comm("ncclCommDestroy", comm, |_| {
            let c = ncomm::unregister(comm)?;
            if let Some(core) = c.wait_core() {
                core.destroy();
            }
            c.destroy_fallback()?;
            OK
        })
    }
}

nccl_export! {
    /// Aborts the communicator on every rank (also while another thread waits in a call on it, which then
    /// returns) and frees it. NULL: nothing to do.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        if comm.is_null() {
            return ncclResult_t::ncclSuccess;
        }
        with_comm("ncclCommAbort", comm, |_| {
            ncomm::unregister(comm)?.abort()?;
            OK
        })
    }
}

nccl_export! {
    /// Stops the communicator's work without freeing it (`NcclComm::revoke`: our abort, the peers told);
    /// afterwards only `ncclCommShrink`, `ncclCommDestroy`, `ncclCommAbort` and the queries work on it,
    /// and `ncclCommGetAsyncError` reports `ncclSuccess` unless a peer died. Where the ranks span hosts,
    /// NVIDIA's communicator beside ours is revoked too, then aborted with ours.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        with_comm("ncclCommRevoke", comm, |c| {
            ensure_arg!(revokeFlags == 0, "revokeFlags is {revokeFlags}; it must be 0 (NCCL_REVOKE_DEFAULT)");
            // Where the ranks span hosts too: our revoke revokes NVIDIA's communicator beside ours, then aborts.
            c.revoke("ncclCommRevoke")?;
            OK
        })
    }
}
