//! The C ABI types of `mscclpp.h`, laid out exactly as the legacy MSCCL++ 0.1.0 header lays them out.
//!
//! cbindgen reads this file to generate the header. Types the header must express in C++ that cbindgen
//! cannot (the derived `mscclppDevConn` with its device methods, the FIFO with its device `push`, and the
//! `std::vector` inside `mscclppRegisteredMemory`) are written by hand in `include/` and `kernels/`; their
//! Rust mirrors here are excluded from generation and checked against the C++ layout by `c-tests/`.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

/// Result codes of every `mscclpp*` function.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mscclppResult_t {
    mscclppSuccess = 0,
    mscclppUnhandledCudaError = 1,
    mscclppSystemError = 2,
    mscclppInternalError = 3,
    mscclppInvalidArgument = 4,
    mscclppInvalidUsage = 5,
    mscclppRemoteError = 6,
    mscclppInProgress = 7,
    mscclppNumResults = 8,
}

/// Transport kinds a connection may use.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mscclppTransport_t {
    mscclppTransportP2P = 0,
    /// Reserved by the legacy interface; not implemented there or here.
    mscclppTransportSHM = 1,
    mscclppTransportIB = 2,
}

/// Element types of the collectives (`mscclppAllReduce` and the others), numbered as NCCL numbers them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mscclppDataType_t {
    mscclppInt8 = 0,
    mscclppUint8 = 1,
    mscclppInt32 = 2,
    mscclppUint32 = 3,
    mscclppInt64 = 4,
    mscclppUint64 = 5,
    mscclppFloat16 = 6,
    mscclppFloat32 = 7,
    mscclppFloat64 = 8,
    mscclppBfloat16 = 9,
}

/// Reduction operators of the collectives, numbered as NCCL numbers them. `mscclppAvg` is the sum divided
/// by the number of ranks (truncated for integer types).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mscclppRedOp_t {
    mscclppSum = 0,
    mscclppProd = 1,
    mscclppMax = 2,
    mscclppMin = 3,
    mscclppAvg = 4,
}

/// The epoch counters of one side of a connection (device memory).
///
/// `device` counts the signals this side has raised; `proxy` is written by the peer's proxy with the
/// peer's `device` count, and `wait()` spins on it.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default)]
pub struct mscclppDevConnSignalEpochId {
    pub device: u64,
    pub proxy: u64,
}

/// The host-visible part of a connection, as kernels see it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mscclppBaseConn {
    pub remoteRank: c_int,
    pub tag: c_int,
    pub localBuff: *mut c_void,
    pub localSignalEpochId: *mut mscclppDevConnSignalEpochId,
    pub remoteSignalEpochId: *mut mscclppDevConnSignalEpochId,
    pub waitEpochId: *mut u64,
    pub remoteBuff: *mut c_void,
}

/// One FIFO slot: two 64-bit words written by the device in one 16-byte store.
/// The bit layout is in `proxy::trigger`.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct mscclppTrigger {
    pub value: [u64; 2],
}

/// The device's handle on its proxy's FIFO.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mscclppConcurrentFifo {
    pub triggerFifo: *mut mscclppTrigger,
    pub triggerFifoTail: *mut u64,
    pub triggerFifoHead: *mut u64,
    pub connId: c_int,
}

/// Rust mirror of the header's `struct mscclppDevConn : mscclppBaseConn { mscclppConcurrentFifo fifo; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mscclppDevConn {
    pub base: mscclppBaseConn,
    pub fifo: mscclppConcurrentFifo,
}

/// Opaque 128-byte identifier of a bootstrap root, made by `mscclppGetUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct mscclppUniqueId {
    pub internal: [c_char; 128],
}

/// Memory-region information shared with an InfiniBand peer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mscclppIbMrInfo {
    pub addr: u64,
    pub rkey: u32,
}

/// Opaque verbs memory region (`struct ibv_mr` from libibverbs).
#[repr(C)]
pub struct ibv_mr {
    _private: [u8; 0],
}

/// An InfiniBand memory region as the legacy header exposes it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mscclppIbMr {
    pub mr: *mut ibv_mr,
    pub buff: *mut c_void,
    pub info: mscclppIbMrInfo,
}

/// One peer's view of a registered buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mscclppRegisteredMemoryP2P {
    pub remoteBuff: *mut c_void,
    pub IbMr: *mut mscclppIbMr,
}

/// Opaque here: in C++ it is `struct { std::vector<mscclppRegisteredMemoryP2P> p2p; }`, which only the
/// library's small C++ part (`src/cxx/registered_memory.cpp`) touches.
#[repr(C)]
pub struct mscclppRegisteredMemory {
    _private: [u8; 0],
}

/// Opaque communicator handle.
#[repr(C)]
pub struct mscclppComm {
    _private: [u8; 0],
}

pub type mscclppComm_t = *mut mscclppComm;
pub type mscclppDevConn_t = mscclppDevConn;
/// Log callback: receives one formatted, NUL-terminated line.
pub type mscclppLogHandler_t = Option<unsafe extern "C" fn(msg: *const c_char)>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout_matches_the_legacy_header() {
        assert_eq!(
            (
                size_of::<mscclppDevConnSignalEpochId>(),
                align_of::<mscclppDevConnSignalEpochId>()
            ),
            (16, 16)
        );
        assert_eq!(offset_of!(mscclppDevConnSignalEpochId, proxy), 8);
        assert_eq!((size_of::<mscclppBaseConn>(), align_of::<mscclppBaseConn>()), (48, 8));
        assert_eq!(offset_of!(mscclppBaseConn, tag), 4);
        assert_eq!(offset_of!(mscclppBaseConn, localBuff), 8);
        assert_eq!(offset_of!(mscclppBaseConn, localSignalEpochId), 16);
        assert_eq!(offset_of!(mscclppBaseConn, remoteSignalEpochId), 24);
        assert_eq!(offset_of!(mscclppBaseConn, waitEpochId), 32);
        assert_eq!(offset_of!(mscclppBaseConn, remoteBuff), 40);
        assert_eq!((size_of::<mscclppDevConn>(), align_of::<mscclppDevConn>()), (80, 8));
        assert_eq!(offset_of!(mscclppDevConn, fifo), 48);
        assert_eq!(
            (size_of::<mscclppConcurrentFifo>(), align_of::<mscclppConcurrentFifo>()),
            (32, 8)
        );
        assert_eq!(offset_of!(mscclppConcurrentFifo, triggerFifoTail), 8);
        assert_eq!(offset_of!(mscclppConcurrentFifo, triggerFifoHead), 16);
        assert_eq!(offset_of!(mscclppConcurrentFifo, connId), 24);
        assert_eq!((size_of::<mscclppTrigger>(), align_of::<mscclppTrigger>()), (16, 16));
        assert_eq!((size_of::<mscclppUniqueId>(), align_of::<mscclppUniqueId>()), (128, 1));
        assert_eq!((size_of::<mscclppIbMrInfo>(), align_of::<mscclppIbMrInfo>()), (16, 8));
        assert_eq!((size_of::<mscclppIbMr>(), align_of::<mscclppIbMr>()), (32, 8));
        assert_eq!(offset_of!(mscclppIbMr, info), 16);
        assert_eq!(
            (
                size_of::<mscclppRegisteredMemoryP2P>(),
                align_of::<mscclppRegisteredMemoryP2P>()
            ),
            (16, 8)
        );
        assert_eq!(size_of::<mscclppResult_t>(), 4);
        assert_eq!(size_of::<mscclppTransport_t>(), 4);
        assert_eq!(size_of::<mscclppDataType_t>(), 4);
        assert_eq!(size_of::<mscclppRedOp_t>(), 4);
    }
}
