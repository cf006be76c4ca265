//! What an `ncclComm_t` names: the core's communicator (`crate::comm::Communicator`, the same one
//! `mscclpp.h` uses) once it exists, and what NCCL's API keeps beside it: the state of a background
//! initialisation, the device, `ncclCommFinalize`, revocation and suspension's refusals, `PreMulSum`
//! operators, the id `ncclCommGetUniqueId` made for a grow (`MadeId`), and the NVIDIA communicator made
//! beside ours under `MSCCLPP_NCCL_FALLBACK` (`fallback.rs`). Registrations and windows are the core's
//! (`Communicator::registrations`).

use super::error::{code, kind_code};
use super::fallback;
use super::types::{NCCL_UNIQUE_ID_BYTES, ncclComm_t, ncclResult_t};
use crate::abi::handles::Registry;
use crate::collective::{DataType, Scalar};
use crate::comm::Communicator;
use crate::error::{Error, ErrorKind, Result};
use once_cell::sync::OnceCell;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// `rank` and `nranks` of a communicator whose place is not known yet (a split still exchanging).
const UNPLACED: usize = usize::MAX;

enum State {
    /// Initialising in the background (non-blocking config, or inside a group).
    Pending,
    Ready(Arc<Communicator>),
    Failed(Error),
}

/// A `PreMulSum` operator made by `ncclRedOpCreatePreMulSum`: the core's `RedOp::PreMulSum` with its
/// scalar, for the one type it was made for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreMulSum {
    pub datatype: DataType,
    /// `ncclScalarHostImmediate`: its bits, read at creation; `ncclScalarDevice`: its device address.
    pub scalar: Scalar,
    /// Its twin on the NVIDIA communicator beside ours, where there is one.
    pub fallback: Option<c_int>,
}

/// The id `ncclCommGetUniqueId` made on a rank, kept with its communicator until a grow
/// (`grow.rs`) takes it.
#[derive(Clone, Debug)]
pub struct MadeId {
    pub bytes: [u8; NCCL_UNIQUE_ID_BYTES],
    pub made: Instant,
}

pub struct NcclComm {
    /// Its rank and size: known at creation, except for a split's, which learns them from the other
    /// ranks (`UNPLACED` until then; see `place`).
    rank: AtomicUsize,
    nranks: AtomicUsize,
    /// The CUDA device of the communicator: the one current when it was made (device 0 where none was,
    /// which the core then picks too); `None` without a CUDA driver.
    pub device: Option<i32>,
    /// `commName` of its config, for log lines.
    pub name: Option<String>,
    state: Mutex<State>,
    ready: Condvar,
    /// `ncclCommAbort` came while the initialisation ran: the communicator is aborted once it exists.
    abandoned: AtomicBool,
    finalized: AtomicBool,
    /// `ncclCommRevoke` (or `ncclCommShrink` with `NCCL_SHRINK_ABORT`) stopped its work.
    revoked: AtomicBool,
    /// Whether its calls block (its config's `blocking`): a split or shrink without a config inherits it.
    blocking: AtomicBool,
    /// Its config's `maxCTAs` (0: none).
    cta_limit: AtomicU32,
    /// How many splits and shrinks of it this rank has started: every rank starts them in the same order,
    /// so that the count tells one's messages from another's.
    splits: AtomicU64,
    shrinks: AtomicU64,
    /// How many grows of it this rank has started (`grow.rs`), counted as the splits are.
    grows: AtomicU64,
    /// The id `ncclCommGetUniqueId` made on this rank, until a grow takes it (`grow.rs`).
    grow_id: Mutex<Option<MadeId>>,
    premul: Mutex<HashMap<c_int, PreMulSum>>,
    next_op: AtomicI32,
    /// The failure's message, kept for `ncclGetLastError` once the communicator has failed.
    failure_message: OnceCell<CString>,
    /// NVIDIA's communicator beside ours (`MSCCLPP_NCCL_FALLBACK`), set before the initialisation ends.
    fallback: OnceCell<Arc<fallback::Comm>>,
}

static COMMS: Registry<NcclComm> = Registry::new();

impl NcclComm {
    /// A communicator whose core is still to be made (`complete` gives it).
    pub fn pending(rank: usize, nranks: usize, device: Option<i32>, name: Option<String>) -> Arc<NcclComm> {
        Arc::new(NcclComm {
            rank: AtomicUsize::new(rank),
            nranks: AtomicUsize::new(nranks),
            device,
            name,
            state: Mutex::new(State::Pending),
            ready: Condvar::new(),
            abandoned: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            revoked: AtomicBool::new(false),
            blocking: AtomicBool::new(true),
            cta_limit: AtomicU32::new(0),
            splits: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            grows: AtomicU64::new(0),
            grow_id: Mutex::new(None),
            premul: Mutex::new(HashMap::new()),
            next_op: AtomicI32::new(super::types::redop::NUM_OPS),
            failure_message: OnceCell::new(),
            fallback: OnceCell::new(),
        })
    }

    /// A communicator whose rank and size its initialisation will tell (a split's).
    pub fn unplaced(device: Option<i32>, name: Option<String>) -> Arc<NcclComm> {
        Self::pending(UNPLACED, UNPLACED, device, name)
    }

    /// Its rank, once known (`place`); `None` before.
    pub fn rank(&self) -> Option<usize> {
        Some(self.rank.load(Ordering::Acquire)).filter(|&r| r != UNPLACED)
    }

    /// Its rank and size: known from its creation, or else once its initialisation has ended (before, the
    /// error of `core`: still initialising, or failed).
    pub fn place(&self) -> Result<(usize, usize)> {
        let nranks = self.nranks.load(Ordering::Acquire);
        if nranks != UNPLACED {
            return Ok((self.rank.load(Ordering::Acquire), nranks));
        }
        self.core().map(|c| (c.rank(), c.nranks()))
    }

    /// Its size (`place`).
    pub fn nranks(&self) -> Result<usize> {
        self.place().map(|(_, n)| n)
    }

    pub fn blocking(&self) -> bool {
        self.blocking.load(Ordering::Relaxed)
    }

    pub fn set_blocking(&self, blocking: bool) {
        self.blocking.store(blocking, Ordering::Relaxed);
    }

    /// Its config's `maxCTAs`, given to the core communicator before its collectives are set up.
    pub fn set_cta_limit(&self, blocks: Option<u32>) {
        self.cta_limit.store(blocks.unwrap_or(0), Ordering::Relaxed);
    }

    /// The limit of `set_cta_limit`, if any.
    pub fn cta_limit(&self) -> Option<u32> {
        Some(self.cta_limit.load(Ordering::Relaxed)).filter(|&n| n != 0)
    }

    /// The number of this rank's next split of this communicator.
    pub fn next_split(&self) -> u64 {
        self.splits.fetch_add(1, Ordering::Relaxed)
    }

    /// The number of this rank's next shrink of this communicator.
    pub fn next_shrink(&self) -> u64 {
        self.shrinks.fetch_add(1, Ordering::Relaxed)
    }

    /// The number of this rank's next grow of this communicator.
    pub fn next_grow(&self) -> u64 {
        self.grows.fetch_add(1, Ordering::Relaxed)
    }

    /// The id `ncclCommGetUniqueId` made on this rank and no grow has taken yet.
    pub fn grow_id(&self) -> parking_lot::MutexGuard<'_, Option<MadeId>> {
        self.grow_id.lock()
    }

    /// Gives the communicator NVIDIA's communicator made beside it; before `complete`, so that every call
    /// that finds the communicator ready finds it too.
    pub fn attach_fallback(&self, f: Option<Arc<fallback::Comm>>) {
        if let Some(f) = f {
            let _ = self.fallback.set(f);
        }
    }

    /// NVIDIA's communicator beside ours, if there is one.
    pub fn fallback(&self) -> Option<&Arc<fallback::Comm>> {
        self.fallback.get()
    }

    /// NVIDIA's communicator where every call goes to it: ranks on several hosts.
    pub fn fallback_for_all(&self) -> Option<&Arc<fallback::Comm>> {
        self.fallback().filter(|f| f.spans_hosts())
    }

    /// Ends the initialisation with its result. A communicator abandoned meanwhile (`ncclCommAbort`) is
    /// aborted and destroyed at once, so that its peers are not left waiting.
    pub fn complete(&self, result: Result<Communicator>) {
        let state = match result {
            Ok(c) => {
                let c = Arc::new(c);
                self.rank.store(c.rank(), Ordering::Release);
                self.nranks.store(c.nranks(), Ordering::Release);
                c.watch_failures();
                if self.abandoned.load(Ordering::Acquire) {
                    let _ = c.abort("ncclCommAbort");
                    c.destroy();
                    if let Some(f) = self.fallback() {
                        let _ = f.abort();
                    }
                }
                State::Ready(c)
            }
            Err(e) => State::Failed(e),
        };
        *self.state.lock() = state;
        self.ready.notify_all();
    }

    /// The core communicator, for a call that needs it.
    pub fn core(&self) -> Result<Arc<Communicator>> {
        match &*self.state.lock() {
            State::Ready(c) => Ok(c.clone()),
            State::Pending => Err(Error::invalid_usage(
                "comm is still being initialised: poll ncclCommGetAsyncError until it returns ncclSuccess",
            )),
            State::Failed(e) => Err(Error::new(
                e.kind,
                format!("comm's initialisation failed: {}", e.message),
            )),
        }
    }

    /// The core communicator for work on it: also refused once finalized or revoked, and while suspended
    /// (`ncclCommSuspend`; a failure, if any, is the better reason then).
    pub fn usable(&self) -> Result<Arc<Communicator>> {
        let c = self.core()?;
        self.check_not_ended()?;
        if c.collectives_suspended() {
            c.check_usable()?;
            return Err(suspended_error());
        }
        Ok(c)
    }

    /// Whether work may go to the communicator's fallback: ready, not failed (a failure aborts NVIDIA's
    /// communicator where the ranks span hosts: the call gets the failure, naming the rank, as ours do), not
    /// finalized, not revoked, and not suspended.
    pub fn open(&self) -> Result<()> {
        let core = self.core()?;
        core.check_usable()?;
        self.check_not_ended()?;
        if core.collectives_suspended() {
            return Err(suspended_error());
        }
        Ok(())
    }

    pub(super) fn check_not_ended(&self) -> Result<()> {
        if self.revoked.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "comm was revoked (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT); only ncclCommShrink, \
                 ncclCommDestroy and ncclCommAbort may follow",
            ));
        }
        if self.finalized.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "comm was finalized (ncclCommFinalize); only ncclCommDestroy may follow",
            ));
        }
        Ok(())
    }

    /// `ncclCommRevoke`: stops the communicator's work on every rank, without freeing it. That is our
    /// abort (`Communicator::abort`: kernels waiting on peers are released, the peers are told and stop
    /// theirs too), with the communicator kept for `ncclCommShrink`, `ncclCommDestroy` or `ncclCommAbort`;
    /// every other call on it is refused from now on. NVIDIA's communicator beside ours, if any, is
    /// revoked too (calls forwarded to it are the communicator's work as well). `by` is the exported
    /// function that revokes (`ncclCommRevoke`, or `ncclCommShrink` with `NCCL_SHRINK_ABORT`), for messages.
    pub fn revoke(&self, by: &'static str) -> Result<()> {
        let core = self.core()?;
        self.revoked.store(true, Ordering::Release);
        if let Some(f) = self.fallback()
            && let Err(e) = f.revoke(0)
        {
            log::info!("{by}: revoking NVIDIA's communicator: {}", e.message);
        }
        core.abort(by)
    }

    pub fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// The core communicator once the initialisation has ended, waiting for it (destroy and abort).
    pub fn wait_core(&self) -> Option<Arc<Communicator>> {
        let mut st = self.state.lock();
        while matches!(*st, State::Pending) {
            self.ready.wait(&mut st);
        }
        match &*st {
            State::Ready(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// `ncclCommGetAsyncError`: `ncclInProgress` while initialising, the initialisation's error, or the
    /// core's asynchronous error (a failed peer: `ncclRemoteError`). Never waits.
    pub fn async_error(&self) -> ncclResult_t {
        let c = match &*self.state.lock() {
            State::Pending => return ncclResult_t::ncclInProgress,
            State::Failed(e) => return code(e),
            State::Ready(c) => c.clone(),
        };
        // A revoked communicator's own abort, and the peers' aborts (they revoke too), are what revoking
        // means, not errors; a peer that died is still one.
        let failed = c.failed();
        if self.revoked() && failed.as_ref().is_none_or(|f| f.aborted) {
            return ncclResult_t::ncclSuccess;
        }
        let Some(failed) = failed else {
            return self.fallback_async_error();
        };
        let _ = self
            .failure_message
            .set(CString::new(failed.error.message.replace('\0', "\\0")).unwrap_or_default());
        kind_code(failed.reported)
    }

    /// NVIDIA's asynchronous error, where there is a fallback; its message is kept as the failure's.
    fn fallback_async_error(&self) -> ncclResult_t {
        let Some(f) = self.fallback() else {
            return ncclResult_t::ncclSuccess;
        };
        let (r, message) = f.async_error();
        if let Some(m) = message {
            let _ = self
                .failure_message
                .set(CString::new(m.replace('\0', "\\0")).unwrap_or_default());
        }
        r
    }

    /// The failure's message, once `async_error` has seen one.
    pub fn failure_message(&self) -> Option<*const c_char> {
        self.failure_message.get().map(|m| m.as_ptr())
    }

    /// Marks the communicator finalized (`ncclCommFinalize`).
    pub fn finalize(&self) -> Result<()> {
        self.open()?;
        if let Some(f) = self.fallback() {
            f.finalize()?;
        }
        self.finalized.store(true, Ordering::Release);
        Ok(())
    }

    /// Frees the fallback's communicator (`ncclCommDestroy`, after the core's).
    pub fn destroy_fallback(&self) -> Result<()> {
        self.fallback().map_or(Ok(()), |f| f.destroy())
    }

    /// Aborts: the core's abort (the peers are told) and its release; a communicator still initialising is
    /// aborted as soon as it exists (`complete`).
    pub fn abort(&self) -> Result<()> {
        self.abandoned.store(true, Ordering::Release);
        let core = match &*self.state.lock() {
            State::Ready(c) => Some(c.clone()),
            _ => None,
        };
        if let Some(f) = self.fallback()
            && let Err(e) = f.abort()
        {
            log::info!("ncclCommAbort: aborting NVIDIA's communicator: {}", e.message);
        }
        if let Some(c) = core {
            c.abort("ncclCommAbort")?;
            c.destroy();
        }
        Ok(())
    }

    /// Adds a `PreMulSum` operator and returns its number.
    pub fn add_premul(&self, op: PreMulSum) -> c_int {
        let n = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.premul.lock().insert(n, op);
        n
    }

    pub fn premul(&self, op: c_int) -> Option<PreMulSum> {
        self.premul.lock().get(&op).copied()
    }

    pub fn remove_premul(&self, op: c_int) -> Option<PreMulSum> {
        self.premul.lock().remove(&op)
    }
}

/// The refusal of work while suspended, naming the call that ends it (`NcclComm::usable`; `suspend.rs`
/// suspends).
fn suspended_error() -> Error {
    Error::invalid_usage(
        "comm is suspended (ncclCommSuspend): no work may be issued on it until every rank has called \
         ncclCommResume",
    )
}

/// Makes `comm` reachable through a new handle.
pub fn register(comm: Arc<NcclComm>) -> ncclComm_t {
    COMMS.insert(comm) as ncclComm_t
}

/// The communicator of a handle: NULL and unknown handles (destroyed, aborted or made up) are invalid
/// arguments, as NCCL's check of a communicator makes them.
pub fn lookup(handle: ncclComm_t) -> Result<Arc<NcclComm>> {
    COMMS.lookup_comm(handle, ErrorKind::InvalidArgument)
}

/// A live communicator that `pred` accepts: what NCCL's calls that name a window but not its communicator
/// (the pointer queries of `rma.rs`) look theirs up with.
pub fn find(pred: impl Fn(&NcclComm) -> bool) -> Option<Arc<NcclComm>> {
    COMMS.find(pred)
}

/// Removes a handle (destroy, abort).
pub fn unregister(handle: ncclComm_t) -> Result<Arc<NcclComm>> {
    lookup(handle)?;
    COMMS
        .remove(handle as u64)
        .ok_or_else(|| Error::invalid_argument("comm was destroyed concurrently"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_pending_comm_reports_in_progress_then_its_outcome() {
        let c = NcclComm::pending(0, 2, None, None);
        assert_eq!(c.async_error(), ncclResult_t::ncclInProgress);
        assert_eq!(c.core().err().unwrap().kind, ErrorKind::InvalidUsage);
        c.complete(Err(Error::remote("peer 1 never came")));
        assert_eq!(c.async_error(), ncclResult_t::ncclRemoteError);
        let e = c.usable().err().unwrap();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(e.message.contains("peer 1 never came"));
        assert!(c.wait_core().is_none());
    }

    #[test]
    fn a_ready_comm_reports_its_cores_failure_by_its_kind_a_timeout_included() {
        let t = std::time::Duration::from_secs(30);
        let id = crate::bootstrap::UniqueId::create(t).unwrap();
        let c = NcclComm::pending(0, 1, None, None);
        c.complete(Communicator::init_by_id(1, &id, 0, t));
        assert_eq!(c.async_error(), ncclResult_t::ncclSuccess);
        assert!(c.failure_message().is_none());
        let core = c.core().unwrap();
        // A part of the core that ran out of time and aborted the communicator: its kind is the one
        // reported, and a timeout is NCCL's (it was a remote error when the core spoke mscclppResult_t).
        core.failures()
            .report_proxy_failure(Error::new(ErrorKind::Timeout, "a wait ran out"));
        core.abort("a test").unwrap();
        assert_eq!(c.async_error(), ncclResult_t::ncclTimeout);
        // SAFETY: kept by `c`, NUL-terminated.
        let message = unsafe { std::ffi::CStr::from_ptr(c.failure_message().unwrap()) };
        assert_eq!(
            message.to_str().unwrap(),
            "rank 0: the communicator was aborted on this rank (by a test)",
            "the message of what later calls return"
        );
        // Revoked, its own abort is what revoking means: no error.
        c.revoke("ncclCommRevoke").unwrap();
        assert_eq!(c.async_error(), ncclResult_t::ncclSuccess);
        core.destroy();
    }

    #[test]
    fn a_split_learns_its_place_from_its_initialisation() {
        let c = NcclComm::unplaced(None, None);
        assert_eq!(c.rank(), None);
        assert_eq!(
            c.place().unwrap_err().kind,
            ErrorKind::InvalidUsage,
            "still initialising"
        );
        c.complete(Err(Error::remote("the leader never sent the id")));
        let e = c.place().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(e.message.contains("the leader never sent the id"), "{}", e.message);
        let c = NcclComm::pending(2, 3, None, None);
        assert_eq!(
            (c.rank(), c.nranks().unwrap()),
            (Some(2), 3),
            "an init's place is known at once"
        );
        assert_eq!((c.next_split(), c.next_split(), c.next_shrink()), (0, 1, 0));
    }

    #[test]
    fn handles_are_checked() {
        let e = lookup(std::ptr::null_mut()).err().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = lookup(0x4d53_0000_0000_0010 as ncclComm_t).err().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let h = register(NcclComm::pending(1, 4, Some(0), None));
        assert_eq!(lookup(h).unwrap().place().unwrap(), (1, 4));
        assert!(unregister(h).is_ok());
        assert!(lookup(h).is_err() && unregister(h).is_err());
    }

    #[test]
    fn premul_operators_are_numbered_from_num_ops() {
        let c = NcclComm::pending(0, 1, None, None);
        let op = PreMulSum {
            datatype: DataType::Float32,
            scalar: Scalar::immediate(&0.5f32.to_le_bytes()),
            fallback: None,
        };
        let a = c.add_premul(op);
        let b = c.add_premul(op);
        assert_eq!((a, b), (5, 6));
        assert_eq!(c.premul(a), Some(op));
        assert_eq!(c.remove_premul(a), Some(op));
        assert!(c.premul(a).is_none() && c.remove_premul(a).is_none());
    }
}
