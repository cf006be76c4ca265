//! Temporary stand-in for the exported functions of `mscclpp.h`, so that the header can be generated
//! before the real FFI layer lands. Every signature is final; every body answers `mscclppInternalError`.
#![allow(non_snake_case, unused_variables)]

use crate::types::{
    mscclppComm_t, mscclppDevConn_t, mscclppLogHandler_t, mscclppRegisteredMemory, mscclppResult_t,
    mscclppUniqueId,
};
use std::ffi::{c_char, c_int, c_void};

const NOT_YET: mscclppResult_t = mscclppResult_t::mscclppInternalError;

/// Creates the id of a new bootstrap root.
///
/// # Safety
/// `uniqueId` must be NULL or point to writable memory for one `mscclppUniqueId`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetUniqueId(uniqueId: *mut mscclppUniqueId) -> mscclppResult_t {
    NOT_YET
}

/// Creates a communicator whose root listens at `ipPortPair`.
///
/// # Safety
/// `comm` must be NULL or writable; `ipPortPair` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommInitRank(
    comm: *mut mscclppComm_t,
    nranks: c_int,
    ipPortPair: *const c_char,
    rank: c_int,
) -> mscclppResult_t {
    NOT_YET
}

/// Creates a communicator from an id made by `mscclppGetUniqueId`.
///
/// # Safety
/// `comm` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommInitRankFromId(
    comm: *mut mscclppComm_t,
    nranks: c_int,
    id: mscclppUniqueId,
    rank: c_int,
) -> mscclppResult_t {
    NOT_YET
}

/// All-gathers `size` bytes per rank through the bootstrap.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `data` must hold `nranks * size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppBootstrapAllGather(
    comm: mscclppComm_t,
    data: *mut c_void,
    size: c_int,
) -> mscclppResult_t {
    NOT_YET
}

/// Waits until every rank has reached the barrier.
///
/// # Safety
/// `comm` must be NULL or a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppBootstrapBarrier(comm: mscclppComm_t) -> mscclppResult_t {
    NOT_YET
}

/// Destroys a communicator.
///
/// # Safety
/// `comm` must be NULL or a live communicator, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommDestroy(comm: mscclppComm_t) -> mscclppResult_t {
    NOT_YET
}

/// Names a result code. Declared by hand in the header, which takes `mscclppResult_t`.
///
/// # Safety
/// Always safe to call; `unsafe` only for uniformity of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetErrorString(result: c_int) -> *const c_char {
    c"internal error".as_ptr()
}

/// Records a connection to `remoteRank`. Declared by hand in the header, which takes
/// `mscclppTransport_t` and defaults `ibDev` to 0.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `ibDev` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppConnect(
    comm: mscclppComm_t,
    remoteRank: c_int,
    tag: c_int,
    localBuff: *mut c_void,
    buffSize: u64,
    transportType: c_int,
    ibDev: *const c_char,
) -> mscclppResult_t {
    NOT_YET
}

/// Sets up every connection recorded by `mscclppConnect`.
///
/// # Safety
/// `comm` must be NULL or a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppConnectionSetup(comm: mscclppComm_t) -> mscclppResult_t {
    NOT_YET
}

/// Returns the host array of device connections, in connect order.
///
/// # Safety
/// `comm` must be NULL or a live communicator; the out-pointers must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetAllDeviceConnections(
    comm: mscclppComm_t,
    devConns: *mut *mut mscclppDevConn_t,
    nConns: *mut c_int,
) -> mscclppResult_t {
    NOT_YET
}

/// Finds the device connection of `(remoteRank, tag)`.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `devConn` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetDeviceConnection(
    comm: mscclppComm_t,
    remoteRank: c_int,
    tag: c_int,
    devConn: *mut *mut mscclppDevConn_t,
) -> mscclppResult_t {
    NOT_YET
}

/// Starts the proxy threads.
///
/// # Safety
/// `comm` must be NULL or a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppProxyLaunch(comm: mscclppComm_t) -> mscclppResult_t {
    NOT_YET
}

/// Stops the proxy threads.
///
/// # Safety
/// `comm` must be NULL or a live communicator.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppProxyStop(comm: mscclppComm_t) -> mscclppResult_t {
    NOT_YET
}

/// Writes the caller's rank.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `rank` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommRank(comm: mscclppComm_t, rank: *mut c_int) -> mscclppResult_t {
    NOT_YET
}

/// Writes the number of ranks.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `size` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommSize(comm: mscclppComm_t, size: *mut c_int) -> mscclppResult_t {
    NOT_YET
}

/// Sets the bootstrap connection timeout, in seconds.
///
/// # Safety
/// Always safe to call; `unsafe` only for uniformity of the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppSetBootstrapConnTimeout(timeout: c_int) -> mscclppResult_t {
    NOT_YET
}

/// The default log handler.
///
/// # Safety
/// `msg` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppDefaultLogHandler(msg: *const c_char) {}

/// Sets the log handler (NULL restores the default).
///
/// # Safety
/// `handler` must be NULL or a function safe to call from any thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppSetLogHandler(handler: mscclppLogHandler_t) -> mscclppResult_t {
    NOT_YET
}

/// Registers a buffer with every connected peer.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `regMem` must be NULL or a live `mscclppRegisteredMemory`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppRegisterBuffer(
    comm: mscclppComm_t,
    local_memory: *mut c_void,
    size: usize,
    regMem: *mut mscclppRegisteredMemory,
) -> mscclppResult_t {
    NOT_YET
}

/// Writes into the peers' registered buffers.
///
/// # Safety
/// `comm` must be NULL or a live communicator; `regMem` must be NULL or a live `mscclppRegisteredMemory`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppRegisteredBufferWrite(
    comm: mscclppComm_t,
    regMem: *mut mscclppRegisteredMemory,
    srcBuff: *mut c_void,
    size: usize,
    srcOffset: u32,
    dstOffset: u32,
    stream: i64,
) -> mscclppResult_t {
    NOT_YET
}
