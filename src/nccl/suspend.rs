//! NCCL 2.29's `ncclCommSuspend`, `ncclCommResume` and `ncclCommMemStats` (PyTorch's ProcessGroupNCCL
//! suspend / resume / memory statistics, and sleep modes built on them): the collectives' device memory
//! released while the communicator is idle, and made again (`crate::collective::suspend`).
//!
//! - `ncclCommSuspend(comm, flags)`: local, each rank frees its own (a GPU gets a rank's memory back once
//!   every rank that mapped it has suspended). `NCCL_SUSPEND_MEM` releases the memory; 0 releases nothing
//!   but suspends all the same. From then on every work call on the communicator (collectives, send and
//!   receive, registrations, splits) is `ncclInvalidUsage` naming `ncclCommResume`; deregistrations, the
//!   queries, finalize, revoke, destroy and abort still work.
//! - `ncclCommResume(comm)`: collective, every rank calls it (each returns once all have): the memory is
//!   made again, zeroed, and mapped between the ranks as at the initialisation, since send and receive need
//!   every peer's memory mapped before the first of them.
//! - `ncclCommMemStats(comm, stat, &value)`: the bytes counted from the allocations themselves; see
//!   `mem_stat`.
//!
//! Where NVIDIA's communicator carries every call (`MSCCLPP_NCCL_FALLBACK` with ranks on several hosts),
//! the three are refused (`ncclInvalidUsage`), not forwarded.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::NcclComm;
use super::entry::{OK, with_comm};
use super::types::{ncclComm_t, ncclResult_t};
use crate::abi::non_null_args;
use crate::ensure_arg;
use crate::error::Result;
use std::ffi::c_int;

/// `ncclCommSuspend`'s flag that releases the communicator's device memory.
pub const NCCL_SUSPEND_MEM: c_int = 0x01;

/// `ncclCommMemStat_t`.
pub const NCCL_STAT_GPU_MEM_SUSPEND: c_int = 0;
pub const NCCL_STAT_GPU_MEM_SUSPENDED: c_int = 1;
pub const NCCL_STAT_GPU_MEM_PERSIST: c_int = 2;
pub const NCCL_STAT_GPU_MEM_TOTAL: c_int = 3;

/// `ncclCommSuspend`'s work, once the handle is found. Where the ranks span hosts ours holds no device memory
/// (our collectives are not set up there) and NVIDIA's communicator keeps its own: the suspend then only
/// refuses work until the resume, the calls that go to NVIDIA's communicator too (`NcclComm::open`).
pub fn suspend(c: &NcclComm, flags: c_int) -> Result<()> {
    ensure_arg!(
        flags & !NCCL_SUSPEND_MEM == 0,
        "flags is {flags:#x}; it must be 0 or NCCL_SUSPEND_MEM (0x01)"
    );
    let core = c.core()?;
    c.check_not_ended()?;
    core.suspend_collectives(flags & NCCL_SUSPEND_MEM != 0)
}

/// `ncclCommResume`'s work, once the handle is found.
pub fn resume(c: &NcclComm) -> Result<()> {
    let core = c.core()?;
    c.check_not_ended()?;
    core.resume_collectives()
}

/// One `ncclCommMemStats` value, in bytes but for `ncclStatGpuMemSuspended`:
/// - `ncclStatGpuMemSuspend`: the device memory held now that a suspend releases (the scratch with its p2p
///   area, and the kernels' state words): 0 while suspended with `NCCL_SUSPEND_MEM`, when nothing is left
///   to release;
/// - `ncclStatGpuMemSuspended`: 1 from an `NCCL_SUSPEND_MEM` suspend to its resume, else 0 (a suspend of
///   flags 0 released nothing);
/// - `ncclStatGpuMemPersist`: the device memory held now that a suspend keeps (none on NCCL's face: the
///   abort word and the zero-copy table are pinned host memory, registered buffers are the application's);
/// - `ncclStatGpuMemTotal`: all the device memory held now, `Suspend + Persist`.
///
/// Nothing is held before the collectives are set up (at the initialisation, where there is a GPU); one
/// rank, which needs no scratch, holds only its one-sided calls' signal area once one of them made it. The
/// loaded kernels are kept by a suspend (loading them again at the resume could wait for ever on a peer's
/// kernel sharing the GPU: `crate::collective::kernels::Units`), and not counted.
pub fn mem_stat(c: &NcclComm, stat: c_int) -> Result<u64> {
    ensure_arg!(
        (NCCL_STAT_GPU_MEM_SUSPEND..=NCCL_STAT_GPU_MEM_TOTAL).contains(&stat),
        "stat is {stat}; it must be an ncclCommMemStat_t, 0 (ncclStatGpuMemSuspend) to 3 (ncclStatGpuMemTotal)"
    );
    let memory = c.core()?.device_memory();
    Ok(match stat {
        NCCL_STAT_GPU_MEM_SUSPEND => memory.releasable,
        NCCL_STAT_GPU_MEM_SUSPENDED => memory.released as u64,
        NCCL_STAT_GPU_MEM_PERSIST => memory.persistent,
        _ => memory.total(),
    })
}

nccl_export! {
    /// Suspends the communicator (local): `NCCL_SUSPEND_MEM` releases its device memory now; work on it is
    /// refused until `ncclCommResume`. The application has synchronized its work on the communicator.
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        with_comm("ncclCommSuspend", comm, |c| {
            suspend(c, flags)?;
            OK
        })
    }
}

nccl_export! {
    /// Resumes a suspended communicator (collective: every rank calls it): its device memory is made again
    /// and mapped between the ranks.
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) -> ncclResult_t {
        with_comm("ncclCommResume", comm, |c| {
            resume(c)?;
            OK
        })
    }
}

nccl_export! {
    /// One of the communicator's memory statistics (`mem_stat`).
    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) -> ncclResult_t {
        with_comm("ncclCommMemStats", comm, |c| {
            non_null_args!(value);
            let v = mem_stat(c, stat)?;
            // SAFETY: checked non-null; nccl.h's contract: a writable uint64_t.
            unsafe { *value = v };
            OK
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::UniqueId;
    use crate::comm::Communicator;
    use crate::error::ErrorKind;
    use crate::nccl::collectives::ncclAllReduce;
    use crate::nccl::comm as ncomm;
    use crate::nccl::memory::ncclCommRegister;
    use crate::nccl::queries::ncclGetLastError;
    use crate::nccl::send_recv::ncclSend;
    use crate::nccl::teardown::ncclCommDestroy;
    use std::ffi::CStr;
    use std::sync::Arc;
    use std::time::Duration;

    const T: Duration = Duration::from_secs(30);

    /// The ranks of one job as NCCL's face holds them, made on threads of this process. No GPU is used:
    /// where the test machine has none, nothing is set up, which is what these tests rely on (the GPU
    /// test, c-tests/nccl-gpu/nccl_suspend_test.cu, checks the memory itself).
    fn comms(n: usize) -> Vec<Arc<NcclComm>> {
        crate::logging::init();
        let id = UniqueId::create(T).unwrap();
        std::thread::scope(|s| {
            let made: Vec<_> = (0..n)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || {
                        let c = NcclComm::pending(r, n, None, None);
                        c.complete(Communicator::init_by_id(n, id, r, T));
                        c
                    })
                })
                .collect();
            made.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn on_ranks<R: Send>(comms: &[Arc<NcclComm>], f: impl Fn(&NcclComm) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let all: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn kind(r: Result<()>) -> ErrorKind {
        r.expect_err("expected an error").kind
    }

    #[test]
    fn flags_other_than_suspend_mem_are_invalid_arguments_and_suspend_nothing() {
        let c = &comms(1)[0];
        for bad in [0x2, 0x3, -1, 0x100] {
            let e = suspend(c, bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad:#x}");
            assert!(e.message.contains("NCCL_SUSPEND_MEM"), "{}", e.message);
        }
        assert!(c.usable().is_ok(), "a refused suspend leaves the communicator usable");
        assert_eq!(mem_stat(c, NCCL_STAT_GPU_MEM_SUSPENDED).unwrap(), 0);
    }

    #[test]
    fn suspend_twice_and_resume_without_suspend_are_invalid_usage() {
        let c = &comms(1)[0];
        let e = resume(c).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("not suspended"), "{}", e.message);
        suspend(c, NCCL_SUSPEND_MEM).unwrap();
        let e = suspend(c, NCCL_SUSPEND_MEM).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("already suspended"), "{}", e.message);
        assert_eq!(
            kind(suspend(c, 0)),
            ErrorKind::InvalidUsage,
            "flags 0 on a suspended comm"
        );
        resume(c).unwrap();
        assert_eq!(kind(resume(c)), ErrorKind::InvalidUsage, "a second resume");
        // Again, after a resume.
        suspend(c, NCCL_SUSPEND_MEM).unwrap();
        resume(c).unwrap();
        assert!(c.usable().is_ok());
    }

    #[test]
    fn work_is_refused_while_suspended_naming_resume() {
        let c = &comms(1)[0];
        for flags in [NCCL_SUSPEND_MEM, 0] {
            suspend(c, flags).unwrap();
            let e = c.usable().err().expect("refused while suspended");
            assert_eq!(e.kind, ErrorKind::InvalidUsage, "flags {flags}");
            assert!(e.message.contains("ncclCommResume"), "{}", e.message);
            // The queries still answer.
            assert_eq!(c.place().unwrap(), (0, 1));
            assert_eq!(
                mem_stat(c, NCCL_STAT_GPU_MEM_SUSPENDED).unwrap(),
                (flags == NCCL_SUSPEND_MEM) as u64,
                "Suspended says whether memory was released (flags {flags})"
            );
            resume(c).unwrap();
            assert!(c.usable().is_ok());
            assert_eq!(mem_stat(c, NCCL_STAT_GPU_MEM_SUSPENDED).unwrap(), 0);
        }
    }

    #[test]
    fn the_exported_calls_refuse_work_and_registration_but_destroy_works() {
        let c = comms(1).remove(0);
        let handle = ncomm::register(c);
        // SAFETY: a live handle of this test; the buffers are never touched (the calls are refused first).
        unsafe {
            assert_eq!(ncclCommSuspend(handle, 4), ncclResult_t::ncclInvalidArgument);
            assert_eq!(ncclCommSuspend(handle, NCCL_SUSPEND_MEM), ncclResult_t::ncclSuccess);
            let buf = 0x1000 as *mut std::ffi::c_void;
            let r = ncclAllReduce(buf, buf, 16, 7, 0, handle, std::ptr::null_mut());
            assert_eq!(r, ncclResult_t::ncclInvalidUsage);
            let message = CStr::from_ptr(ncclGetLastError(std::ptr::null_mut()))
                .to_string_lossy()
                .into_owned();
            assert!(
                message.contains("ncclAllReduce") && message.contains("ncclCommResume"),
                "{message}"
            );
            assert_eq!(
                ncclSend(buf, 16, 7, 0, handle, std::ptr::null_mut()),
                ncclResult_t::ncclInvalidUsage
            );
            let mut reg = std::ptr::null_mut();
            assert_eq!(
                ncclCommRegister(handle, buf, 64, &mut reg),
                ncclResult_t::ncclInvalidUsage
            );
            let mut v = 7u64;
            assert_eq!(
                ncclCommMemStats(handle, NCCL_STAT_GPU_MEM_SUSPENDED, &mut v),
                ncclResult_t::ncclSuccess
            );
            assert_eq!(v, 1);
            assert_eq!(
                ncclCommSuspend(handle, NCCL_SUSPEND_MEM),
                ncclResult_t::ncclInvalidUsage
            );
            // Destroyed while suspended.
            assert_eq!(ncclCommDestroy(handle), ncclResult_t::ncclSuccess);
            assert_eq!(
                ncclCommResume(handle),
                ncclResult_t::ncclInvalidArgument,
                "a dead handle"
            );
        }
    }

    #[test]
    fn mem_stats_check_their_arguments_and_add_up() {
        let c = comms(1).remove(0);
        for bad in [-1, 4, 100] {
            let e = mem_stat(&c, bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad}");
            assert!(e.message.contains("ncclCommMemStat_t"), "{}", e.message);
        }
        let stats = |c: &NcclComm| -> Vec<u64> { (0..4).map(|s| mem_stat(c, s).unwrap()).collect() };
        for flags in [None, Some(NCCL_SUSPEND_MEM)] {
            if let Some(f) = flags {
                suspend(&c, f).unwrap();
            }
            let s = stats(&c);
            assert_eq!(s[3], s[0] + s[2], "Total = Suspend + Persist ({s:?})");
            assert_eq!(s[1], flags.is_some() as u64);
        }
        let handle = ncomm::register(c);
        // SAFETY: a live handle of this test; NULL is what is checked.
        unsafe {
            assert_eq!(
                ncclCommMemStats(handle, NCCL_STAT_GPU_MEM_TOTAL, std::ptr::null_mut()),
                ncclResult_t::ncclInvalidArgument
            );
            let mut v = 0u64;
            assert_eq!(ncclCommMemStats(handle, 9, &mut v), ncclResult_t::ncclInvalidArgument);
            assert_eq!(ncclCommResume(handle), ncclResult_t::ncclSuccess);
            assert_eq!(ncclCommDestroy(handle), ncclResult_t::ncclSuccess);
        }
    }

    #[test]
    fn a_communicator_still_initialising_or_revoked_is_not_suspended() {
        let pending = NcclComm::pending(0, 2, None, None);
        assert_eq!(kind(suspend(&pending, NCCL_SUSPEND_MEM)), ErrorKind::InvalidUsage);
        assert_eq!(kind(resume(&pending)), ErrorKind::InvalidUsage);
        assert!(mem_stat(&pending, NCCL_STAT_GPU_MEM_TOTAL).is_err());
        let all = comms(2);
        on_ranks(&all, |c| suspend(c, NCCL_SUSPEND_MEM).unwrap());
        // Revoked while suspended (our abort, every rank told): only the ending calls are left.
        all[0].revoke("ncclCommRevoke").unwrap();
        let e = resume(&all[0]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("revoked"), "{}", e.message);
        // The peer, aborted by the revoke, reports the failure rather than the suspension.
        let deadline = std::time::Instant::now() + T;
        while all[1].core().unwrap().check_usable().is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let e = all[1].usable().err().expect("refused after the revoke");
        assert!(!e.message.contains("ncclCommResume"), "{}", e.message);
    }

    #[test]
    fn each_rank_suspends_alone_with_its_own_flags_and_resumes() {
        let all = comms(3);
        // A suspend involves no peer: one rank suspends and resumes while the others do nothing.
        suspend(&all[2], NCCL_SUSPEND_MEM).unwrap();
        assert!(all[0].usable().is_ok() && all[2].usable().is_err());
        // Each rank's own flags; the resume meets every rank.
        on_ranks(&all, |c| {
            if c.rank() != Some(2) {
                suspend(c, if c.rank() == Some(0) { 0 } else { NCCL_SUSPEND_MEM }).unwrap();
            }
        });
        for r in on_ranks(&all, resume) {
            r.unwrap();
        }
        assert!(all.iter().all(|c| c.usable().is_ok()));
    }
}
