//! NCCL's one-sided calls (2.29): `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, `ncclWinGetUserPtr`, and
//! the pointer queries of `nccl_device/host.h` that name a window's registration on a peer
//! (`ncclGetPeerDevicePointer`, `ncclGetLsaDevicePointer`). Checked here, carried out by the core
//! (`collective::signal`): puts into the peer's registration of the same window (windows are matched by the
//! order every rank registered them in), signals as counters in the peers' memory, waits on the GPU that
//! end when the communicator is aborted.
//!
//! Signals: `sigIdx` in `[0, 8)` and `ctx` in `[0, 4)` (NCCL's default configuration has one of each; the
//! range is what this library's signal areas hold), `flags` 0 (NCCL reserves it). Inside a group the calls
//! are queued and issued at the group's end, after its collectives and its sends and receives: its puts and
//! signals first, then its waits, each in call order, so that a group that both waits and puts never waits
//! for itself.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::{self as ncomm, NcclComm};
use super::entry::{OK, check_rank, datatype, datatype_name, entry, with_comm};
use super::queue::{enqueue, submit};
use super::types::{ncclComm_t, ncclResult_t, ncclWindow_t};
use crate::abi::{non_null, non_null_args};
use crate::collective::signal::{self, OneSided, SignalId, Wait};
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::logging::RankScope;
use crate::pipeline::Submitted;
use std::ffi::{c_int, c_uint, c_void};

/// `ncclWaitSignalDesc_t`: one wait of `ncclWaitSignal`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}

fn check_flags(flags: c_uint) -> Result<()> {
    ensure_arg!(flags == 0, "flags is {flags:#x}; it must be 0 (NCCL reserves it)");
    Ok(())
}

/// Issues `op` on `c` now, or queues it inside a group. A put's window is checked now, so that a group
/// fails at the call that named a bad one.
fn one_sided(c: &NcclComm, op: OneSided, stream: *mut c_void) -> Result<ncclResult_t> {
    if c.fallback_for_all().is_some() {
        c.open()?;
        return Err(Error::invalid_usage(
            "the one-sided calls are not carried out between hosts by this library (its windows are not \
             registered with NVIDIA's communicator)",
        ));
    }
    submit(c.usable()?, stream, |core, stream| {
        Submitted::one_sided(core, op, stream)
    })
}

nccl_export! {
    /// Copies `count` elements of `localbuff` into `peer`'s registration of the window `peerWin` names (the
    /// window every rank registered in the same place of its order), at `peerWinOffset` bytes, then signals
    /// `peer` on (`sigIdx`, `ctx`): ordered after the stream's earlier work; the data is visible to a wait
    /// that has seen the signal.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        peerWin: ncclWindow_t,
        peerWinOffset: usize,
        sigIdx: c_int,
        ctx: c_int,
        flags: c_uint,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        enqueue("ncclPutSignal", comm, |c| {
            let datatype_value = datatype;
            let datatype = self::datatype(datatype_value)?;
            check_rank("peer", peer, c)?;
            ensure_arg!(!peerWin.is_null(), "peerWin is NULL");
            let signal = SignalId::new(sigIdx, ctx)?;
            check_flags(flags)?;
            let bytes = (count as u64).checked_mul(datatype.size() as u64).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "count {count} of {} overflows a byte count",
                    datatype_name(datatype)
                ))
            })?;
            ensure_arg!(bytes == 0 || !localbuff.is_null(), "localbuff is NULL (count = {count})");
            let op = OneSided::Put {
                src: localbuff as u64,
                bytes,
                peer: peer as usize,
                window: peerWin as u64,
                offset: peerWinOffset as u64,
                signal,
            };
            one_sided(c, op, stream)
        })
    }
}

nccl_export! {
    /// Signals `peer` on (`sigIdx`, `ctx`), ordered after the stream's earlier work.
    fn ncclSignal / pncclSignal(
        peer: c_int,
        sigIdx: c_int,
        ctx: c_int,
        flags: c_uint,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        enqueue("ncclSignal", comm, |c| {
            check_rank("peer", peer, c)?;
            let signal = SignalId::new(sigIdx, ctx)?;
            check_flags(flags)?;
            one_sided(c, OneSided::Signal { peer: peer as usize, signal }, stream)
        })
    }
}

/// The waits `descs` describe, each checked (the error names the descriptor).
fn waits(descs: &[ncclWaitSignalDesc_t], nranks: usize) -> Result<Vec<Wait>> {
    descs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            ensure_arg!(
                d.opCnt >= 0,
                "signalDescs[{i}].opCnt is {}; it must not be negative",
                d.opCnt
            );
            ensure_arg!(
                d.peer >= 0 && (d.peer as usize) < nranks,
                "signalDescs[{i}].peer is {}; it must be in [0, nranks = {nranks})",
                d.peer
            );
            let signal = SignalId::new(d.sigIdx, d.ctx)
                .map_err(|e| Error::new(e.kind, format!("signalDescs[{i}].{}", e.message)))?;
            Ok(Wait {
                peer: d.peer as usize,
                signal,
                count: d.opCnt as u64,
            })
        })
        .collect()
}

nccl_export! {
    /// The stream's later work waits until, for every descriptor, `opCnt` signals of `peer` on (`sigIdx`,
    /// `ctx`) have arrived, and takes them (a later wait needs signals of its own). The wait ends, its
    /// signals unconsumed, when the communicator is aborted (`ncclCommGetAsyncError` says why).
    fn ncclWaitSignal / pncclWaitSignal(
        nDesc: c_int,
        signalDescs: *mut ncclWaitSignalDesc_t,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        enqueue("ncclWaitSignal", comm, |c| {
            ensure_arg!(nDesc >= 0, "nDesc is {nDesc}; it must not be negative");
            let descs: &[ncclWaitSignalDesc_t] = if nDesc == 0 {
                &[]
            } else {
                non_null_args!(signalDescs);
                // SAFETY: checked non-null; the caller passes nDesc descriptors.
                unsafe { std::slice::from_raw_parts(signalDescs, nDesc as usize) }
            };
            let waits = waits(descs, c.nranks()?)?;
            one_sided(c, OneSided::Wait(waits), stream)
        })
    }
}

nccl_export! {
    /// The buffer `win` was registered with (`buff` of `ncclCommWindowRegister`).
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) -> ncclResult_t {
        with_comm("ncclWinGetUserPtr", comm, |c| {
            non_null_args!(outUserPtr);
            let (registration, _) = signal::own_window(c.core()?.registrations(), win as u64, "win")?;
            // SAFETY: checked non-null.
            unsafe { *outUserPtr = registration.ptr as *mut c_void };
            OK
        })
    }
}

/// Where byte `offset` of rank `peer`'s registration of `window` is in this process: found through the
/// communicator that registered `window` (the only one that knows it), and waited for as a put's target
/// is (`Communicator::window_pointer`). `peer_name` names the rank argument.
pub(super) fn peer_pointer(window: ncclWindow_t, offset: usize, peer: c_int, peer_name: &str) -> Result<*mut c_void> {
    ensure_arg!(!window.is_null(), "window is NULL");
    let token = window as u64;
    let c = ncomm::find(|c| {
        c.core()
            .is_ok_and(|core| core.registrations().window_ordinal(token).is_some())
    })
    .ok_or_else(|| {
        Error::invalid_argument(format!(
            "window {window:p} is not a live window of any communicator (deregistered, or never registered)"
        ))
    })?;
    let _rank = c.rank().map(RankScope::enter);
    check_rank(peer_name, peer, &c)?;
    let core = c.usable()?;
    Ok(core.window_pointer(token, offset as u64, peer as usize)? as *mut c_void)
}

/// `ncclGetPeerDevicePointer` and `ncclGetLsaDevicePointer`.
fn pointer_query(
    name: &str,
    window: ncclWindow_t,
    offset: usize,
    peer: c_int,
    peer_name: &str,
    out: *mut *mut c_void,
) -> ncclResult_t {
    entry(name, || {
        non_null(out, "outPtr")?;
        let ptr = peer_pointer(window, offset, peer, peer_name)?;
        // SAFETY: checked non-null.
        unsafe { *out = ptr };
        OK
    })
}

nccl_export! {
    /// Byte `offset` of rank `peer`'s registration of `window`, as this process reaches it (a kernel of this
    /// rank may load and store through it); `peer` may be this rank.
    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(window: ncclWindow_t, offset: usize, peer: c_int, outPtr: *mut *mut c_void) -> ncclResult_t {
        pointer_query("ncclGetPeerDevicePointer", window, offset, peer, "peer", outPtr)
    }
}

nccl_export! {
    /// `ncclGetPeerDevicePointer` by LSA rank: the LSA team is every rank here (one machine), so the LSA
    /// rank is the world rank.
    fn ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(window: ncclWindow_t, offset: usize, lsaRank: c_int, outPtr: *mut *mut c_void) -> ncclResult_t {
        pointer_query("ncclGetLsaDevicePointer", window, offset, lsaRank, "lsaRank", outPtr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn wait_descriptors_are_checked_and_named_by_index() {
        let d = |opCnt, peer, sigIdx, ctx| ncclWaitSignalDesc_t {
            opCnt,
            peer,
            sigIdx,
            ctx,
        };
        let good = waits(&[d(3, 1, 0, 0), d(0, 0, 7, 3)], 2).unwrap();
        assert_eq!(good.len(), 2);
        assert_eq!((good[0].peer, good[0].count), (1, 3));
        assert_eq!(good[1].signal, SignalId::new(7, 3).unwrap());
        for (desc, named) in [
            (d(-1, 0, 0, 0), "signalDescs[1].opCnt is -1"),
            (d(1, 2, 0, 0), "signalDescs[1].peer is 2; it must be in [0, nranks = 2)"),
            (d(1, -1, 0, 0), "signalDescs[1].peer is -1"),
            (d(1, 0, 8, 0), "signalDescs[1].sigIdx is 8"),
            (d(1, 0, 0, 4), "signalDescs[1].ctx is 4"),
        ] {
            let e = waits(&[d(1, 0, 0, 0), desc], 2).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains(named), "{}", e.message);
        }
    }

    #[test]
    fn flags_must_be_zero() {
        assert!(check_flags(0).is_ok());
        let e = check_flags(4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("flags is 0x4"), "{}", e.message);
    }

    #[test]
    fn the_descriptor_is_nccls() {
        assert_eq!(std::mem::size_of::<ncclWaitSignalDesc_t>(), 16);
        assert_eq!(std::mem::offset_of!(ncclWaitSignalDesc_t, ctx), 12);
    }

    #[test]
    fn calls_without_a_communicator_or_a_live_window_are_refused() {
        // SAFETY: NULL and made-up handles are what is tested: each is refused before any is read; the
        // out-pointers are NULL or a local.
        let r = unsafe { ncclSignal(0, 9, 0, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(r, ncclResult_t::ncclInvalidArgument, "a NULL comm");
        // SAFETY: as above.
        let r = unsafe { ncclWaitSignal(-1, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        let mut out = std::ptr::null_mut();
        // SAFETY: as above.
        let r = unsafe { ncclGetPeerDevicePointer(std::ptr::null_mut(), 0, 0, &mut out) };
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        // SAFETY: as above.
        let r = unsafe { ncclGetLsaDevicePointer(0x4d53_0000_dead_0000 as ncclWindow_t, 0, 0, &mut out) };
        assert_eq!(r, ncclResult_t::ncclInvalidArgument, "a made-up window");
        // SAFETY: as above.
        let r = unsafe { ncclGetPeerDevicePointer(0x4d53_0000_dead_0000 as ncclWindow_t, 0, 0, std::ptr::null_mut()) };
        assert_eq!(r, ncclResult_t::ncclInvalidArgument, "a NULL outPtr");
        assert!(out.is_null());
    }
}
