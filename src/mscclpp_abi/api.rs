//! The exported functions of `mscclpp.h`. Each checks its arguments (naming the bad one), enters the
//! panic boundary, and calls the core. cbindgen generates their declarations from this file.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the contract of each function is the header's

use super::comms as handles;
use super::guard;
use super::regmem_vector;
use crate::abi::{non_null, non_null_args};
use crate::bootstrap::UniqueId;
use crate::comm::Communicator;
use crate::connection::TransportKind;
use crate::connections::SetupNames;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::AppStream;
use crate::logging::RankScope;
use crate::types::*;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// This face's names of the two steps that make connections, for the core's advice ("call ... first").
const SETUP: SetupNames = SetupNames {
    connect: "mscclppConnect",
    setup: "mscclppConnectionSetup",
};

/// Bootstrap connection timeout in milliseconds (`mscclppSetBootstrapConnTimeout`).
static BOOTSTRAP_TIMEOUT_MS: AtomicU64 = AtomicU64::new(crate::bootstrap::DEFAULT_TIMEOUT.as_millis() as u64);

fn bootstrap_timeout() -> Duration {
    Duration::from_millis(BOOTSTRAP_TIMEOUT_MS.load(Ordering::Relaxed))
}

/// Runs `body` with the communicator behind `comm`; everything it logs, errors included, names its rank.
pub(super) fn with_comm(
    name: &str,
    comm: mscclppComm_t,
    body: impl FnOnce(&handles::Comm) -> Result<()>,
) -> mscclppResult_t {
    let _rank = handles::lookup(comm).ok().map(|c| RankScope::enter(c.rank()));
    guard(name, || body(&*handles::lookup(comm)?))
}

fn check_rank_args(nranks: c_int, rank: c_int) -> Result<()> {
    ensure_arg!(nranks > 0, "nranks is {nranks}; it must be at least 1");
    check_in_ranks("rank", rank, nranks)
}

/// A rank argument named `name` must be in `[0, nranks)`.
fn check_in_ranks(name: &str, rank: c_int, nranks: c_int) -> Result<()> {
    ensure_arg!(
        rank >= 0 && rank < nranks,
        "{name} is {rank}; it must be in [0, nranks = {nranks})"
    );
    Ok(())
}

/// Creates a unique id: starts a bootstrap root in this process and describes how to reach it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetUniqueId(uniqueId: *mut mscclppUniqueId) -> mscclppResult_t {
    guard("mscclppGetUniqueId", || {
        non_null_args!(uniqueId);
        let id = UniqueId::create(bootstrap_timeout())?;
        let bytes = id.to_bytes();
        // SAFETY: checked non-null; the caller provides a writable mscclppUniqueId.
        let out = unsafe { &mut *uniqueId };
        crate::abi::write_id_bytes(&mut out.internal, &bytes);
        Ok(())
    })
}

/// Joins `nranks` ranks that meet at rank 0's `ipPortPair`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommInitRank(
    comm: *mut mscclppComm_t,
    nranks: c_int,
    ipPortPair: *const c_char,
    rank: c_int,
) -> mscclppResult_t {
    guard("mscclppCommInitRank", || {
        non_null_args!(comm, ipPortPair);
        check_rank_args(nranks, rank)?;
        // SAFETY: checked non-null; the caller passes a NUL-terminated string.
        let addr = unsafe { CStr::from_ptr(ipPortPair) }
            .to_str()
            .map_err(|_| Error::invalid_argument("ipPortPair is not valid UTF-8"))?;
        let _rank = RankScope::enter(rank as usize);
        let c = Communicator::init_by_address(nranks as usize, addr, rank as usize, bootstrap_timeout())?;
        // SAFETY: checked non-null.
        unsafe { *comm = handles::register(c) };
        Ok(())
    })
}

/// Joins `nranks` ranks that meet at the root named by `id`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommInitRankFromId(
    comm: *mut mscclppComm_t,
    nranks: c_int,
    id: mscclppUniqueId,
    rank: c_int,
) -> mscclppResult_t {
    guard("mscclppCommInitRankFromId", || {
        non_null_args!(comm);
        check_rank_args(nranks, rank)?;
        let bytes = crate::abi::id_bytes(&id.internal);
        let id = UniqueId::from_bytes(&bytes, "unique id", "mscclppGetUniqueId")?;
        let _rank = RankScope::enter(rank as usize);
        let c = Communicator::init_by_id(nranks as usize, &id, rank as usize, bootstrap_timeout())?;
        // SAFETY: checked non-null.
        unsafe { *comm = handles::register(c) };
        Ok(())
    })
}

/// All-gathers `size` bytes per rank through the bootstrap network.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppBootstrapAllGather(
    comm: mscclppComm_t,
    data: *mut c_void,
    size: c_int,
) -> mscclppResult_t {
    with_comm("mscclppBootstrapAllGather", comm, |c| {
        ensure_arg!(size >= 0, "size is {size}; it must not be negative");
        let total = (size as usize)
            .checked_mul(c.nranks())
            .ok_or_else(|| Error::invalid_argument(format!("size {size} x nranks overflows")))?;
        if total == 0 {
            return c.bootstrap().barrier();
        }
        non_null_args!(data);
        // SAFETY: the caller provides `nranks * size` bytes at `data`, as the header documents.
        let buf = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), total) };
        c.bootstrap().all_gather(buf, size as usize)
    })
}

/// Waits until every rank has called it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppBootstrapBarrier(comm: mscclppComm_t) -> mscclppResult_t {
    with_comm("mscclppBootstrapBarrier", comm, |c| c.bootstrap().barrier())
}

/// Stops the proxy if it runs and releases everything the communicator holds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommDestroy(comm: mscclppComm_t) -> mscclppResult_t {
    let _rank = handles::lookup(comm).ok().map(|c| RankScope::enter(c.rank()));
    guard("mscclppCommDestroy", || handles::unregister(comm)?.destroy())
}

/// A static description of a result code.
#[unsafe(no_mangle)]
pub extern "C" fn mscclppGetErrorString(result: c_int) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"no error",
        1 => c"unhandled cuda error",
        2 => c"unhandled system error",
        3 => c"internal error",
        4 => c"invalid argument",
        5 => c"invalid usage",
        6 => c"remote process exited or there was a network error",
        7 => c"operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// Records a connection to `remoteRank` with `tag` over `localBuff`.
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
    with_comm("mscclppConnect", comm, |c| {
        check_in_ranks("remoteRank", remoteRank, c.nranks() as c_int)?;
        ensure_arg!(
            remoteRank as usize != c.rank(),
            "remoteRank is {remoteRank}, this rank itself"
        );
        non_null_args!(localBuff);
        ensure_arg!(buffSize > 0, "buffSize is 0");
        let transport = match transportType {
            0 => {
                if !ibDev.is_null() {
                    log::warn!("mscclppConnect: ibDev is ignored for mscclppTransportP2P");
                }
                TransportKind::P2p
            }
            1 => {
                return Err(Error::invalid_argument(
                    "transportType mscclppTransportSHM is not implemented",
                ));
            }
            2 => {
                non_null(ibDev, "ibDev (required for mscclppTransportIB)")?;
                // SAFETY: checked non-null; the caller passes a NUL-terminated string.
                let dev = unsafe { CStr::from_ptr(ibDev) }.to_string_lossy().into_owned();
                ensure_arg!(!dev.is_empty(), "ibDev is an empty string");
                TransportKind::Ib { device: dev }
            }
            other => {
                return Err(Error::invalid_argument(format!(
                    "transportType {other} is not a mscclppTransport_t"
                )));
            }
        };
        c.connections
            .connect(c, remoteRank as usize, tag, localBuff as u64, buffSize, transport)
    })
}

/// Sets up every connection recorded so far; ends with a barrier.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppConnectionSetup(comm: mscclppComm_t) -> mscclppResult_t {
    with_comm("mscclppConnectionSetup", comm, |c| c.connections.setup(c))
}

/// The host array of every connection's device view, in connect order.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetAllDeviceConnections(
    comm: mscclppComm_t,
    devConns: *mut *mut mscclppDevConn_t,
    nConns: *mut c_int,
) -> mscclppResult_t {
    with_comm("mscclppGetAllDeviceConnections", comm, |c| {
        non_null_args!(devConns, nConns);
        let (ptr, n) = c.connections.device_connections(&SETUP)?;
        // SAFETY: both checked non-null.
        unsafe {
            *devConns = ptr;
            *nConns = n as c_int;
        }
        Ok(())
    })
}

/// The device view of the connection to `remoteRank` with `tag`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppGetDeviceConnection(
    comm: mscclppComm_t,
    remoteRank: c_int,
    tag: c_int,
    devConn: *mut *mut mscclppDevConn_t,
) -> mscclppResult_t {
    with_comm("mscclppGetDeviceConnection", comm, |c| {
        non_null_args!(devConn);
        check_in_ranks("remoteRank", remoteRank, c.nranks() as c_int)?;
        let p = c.connections.device_connection(remoteRank, tag, &SETUP)?;
        // SAFETY: checked non-null.
        unsafe { *devConn = p };
        Ok(())
    })
}

/// Starts the proxy thread(s) serving the connections.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppProxyLaunch(comm: mscclppComm_t) -> mscclppResult_t {
    with_comm("mscclppProxyLaunch", comm, |c| c.connections.proxy_launch(c, &SETUP))
}

/// A barrier, then stops the proxy thread(s). Safe to call twice. The proxies stop even when the barrier
/// fails (on an aborted communicator it fails at once), and its error is returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppProxyStop(comm: mscclppComm_t) -> mscclppResult_t {
    with_comm("mscclppProxyStop", comm, |c| c.connections.proxy_stop(c))
}

/// Extension (MSCCLPP_HAS_ABORT). Aborts the communicator: its proxies stop moving data, every later
/// call that needs the peers fails at once (mscclppInvalidUsage on this rank), and every peer is told, so
/// that its communicator aborts too (it sees mscclppRemoteError naming this rank). Data in flight is
/// undefined. Returns at once, from any thread, also while another thread waits in a call on the same
/// communicator; mscclppCommDestroy must still be called.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommAbort(comm: mscclppComm_t) -> mscclppResult_t {
    with_comm("mscclppCommAbort", comm, |c| c.abort("mscclppCommAbort"))
}

/// Extension (MSCCLPP_HAS_ABORT). Writes the communicator's asynchronous error to *asyncError without
/// ever blocking: mscclppSuccess; mscclppRemoteError once a peer was declared dead (its connection closed,
/// or it sent nothing for MSCCLPP_PEER_TIMEOUT seconds) or aborted, which aborts this communicator;
/// mscclppInvalidUsage after this rank's own mscclppCommAbort; mscclppInternalError or
/// mscclppUnhandledCudaError after a proxy failed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommGetAsyncError(
    comm: mscclppComm_t,
    asyncError: *mut mscclppResult_t,
) -> mscclppResult_t {
    with_comm("mscclppCommGetAsyncError", comm, |c| {
        non_null_args!(asyncError);
        let error = c
            .failed()
            .map_or(mscclppResult_t::mscclppSuccess, |f| super::error::code(f.reported));
        // SAFETY: checked non-null; the caller provides a writable mscclppResult_t.
        unsafe { *asyncError = error };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommRank(comm: mscclppComm_t, rank: *mut c_int) -> mscclppResult_t {
    with_comm("mscclppCommRank", comm, |c| {
        non_null_args!(rank);
        // SAFETY: checked non-null.
        unsafe { *rank = c.rank() as c_int };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommSize(comm: mscclppComm_t, size: *mut c_int) -> mscclppResult_t {
    with_comm("mscclppCommSize", comm, |c| {
        non_null_args!(size);
        // SAFETY: checked non-null.
        unsafe { *size = c.nranks() as c_int };
        Ok(())
    })
}

/// Sets how long (seconds) bootstrap set-up waits for the root and peers.
#[unsafe(no_mangle)]
pub extern "C" fn mscclppSetBootstrapConnTimeout(timeout: c_int) -> mscclppResult_t {
    guard("mscclppSetBootstrapConnTimeout", || {
        ensure_arg!(timeout > 0, "timeout is {timeout} seconds; it must be positive");
        BOOTSTRAP_TIMEOUT_MS.store(timeout as u64 * 1000, Ordering::Relaxed);
        Ok(())
    })
}

/// Writes a log line to `MSCCLPP_DEBUG_FILE`, or to standard error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppDefaultLogHandler(msg: *const c_char) {
    // SAFETY: the caller passes NULL or a NUL-terminated string.
    let _ = std::panic::catch_unwind(|| unsafe { crate::logging::default_handler_c(msg) });
}

/// Sends every log line to `handler` (NULL restores the default).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppSetLogHandler(handler: mscclppLogHandler_t) -> mscclppResult_t {
    guard("mscclppSetLogHandler", || {
        crate::logging::set_handler(handler);
        Ok(())
    })
}

/// Exchanges `local_memory` with the peer of every connection; appends one entry per connection.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppRegisterBuffer(
    comm: mscclppComm_t,
    local_memory: *mut c_void,
    size: usize,
    regMem: *mut mscclppRegisteredMemory,
) -> mscclppResult_t {
    with_comm("mscclppRegisterBuffer", comm, |c| {
        non_null_args!(local_memory, regMem);
        ensure_arg!(size > 0, "size is 0");
        for e in c
            .connections
            .register_buffer(c, local_memory as u64, size as u64, &SETUP)?
        {
            // SAFETY: `regMem` is the caller's mscclppRegisteredMemory (checked non-null).
            unsafe { regmem_vector::append(regMem, e)? };
        }
        Ok(())
    })
}

/// Copies `size` bytes from `srcBuff + srcOffset` into every peer's registered buffer at `dstOffset`.
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
    with_comm("mscclppRegisteredBufferWrite", comm, |c| {
        non_null_args!(regMem, srcBuff);
        if size == 0 {
            return Ok(());
        }
        // SAFETY: `regMem` is the caller's mscclppRegisteredMemory (checked non-null); the entries are
        // copied out before anything else can change the vector.
        let entries = unsafe { regmem_vector::entries(regMem) };
        ensure_arg!(
            !entries.is_empty(),
            "regMem has no entries: call mscclppRegisterBuffer first"
        );
        // SAFETY: the header's contract: `stream` is 0 or a live stream of the communicator's GPU.
        let stream = unsafe { AppStream::from_raw(stream as u64) };
        c.connections.registered_write(
            c,
            &entries,
            srcBuff as u64,
            size as u64,
            srcOffset as u64,
            dstOffset as u64,
            stream,
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A communicator of one rank on a free local port (for the FFI's tests, here and in registration.rs).
    pub(crate) fn one_rank() -> mscclppComm_t {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = std::ffi::CString::new(format!("127.0.0.1:{port}")).unwrap();
        let mut comm: mscclppComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer and string.
        let r = unsafe { mscclppCommInitRank(&mut comm, 1, addr.as_ptr(), 0) };
        assert_eq!(r, mscclppResult_t::mscclppSuccess);
        comm
    }

    #[test]
    fn every_result_code_has_its_own_string() {
        let strings: Vec<&CStr> = (0..8)
            // SAFETY: the function returns a static string for any code.
            .map(|r| unsafe { CStr::from_ptr(mscclppGetErrorString(r)) })
            .collect();
        for (i, a) in strings.iter().enumerate() {
            assert!(!a.to_bytes().is_empty());
            for b in &strings[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // SAFETY: the function returns a static string for any code.
        let unknown = unsafe { CStr::from_ptr(mscclppGetErrorString(99)) };
        assert_eq!(unknown.to_str().unwrap(), "unknown result code");
    }

    #[test]
    fn bad_timeouts_are_rejected_and_good_ones_kept() {
        assert_eq!(
            mscclppSetBootstrapConnTimeout(-1),
            mscclppResult_t::mscclppInvalidArgument
        );
        assert_eq!(
            mscclppSetBootstrapConnTimeout(0),
            mscclppResult_t::mscclppInvalidArgument
        );
        let before = bootstrap_timeout();
        assert_eq!(mscclppSetBootstrapConnTimeout(7), mscclppResult_t::mscclppSuccess);
        assert_eq!(bootstrap_timeout(), Duration::from_secs(7));
        BOOTSTRAP_TIMEOUT_MS.store(before.as_millis() as u64, Ordering::Relaxed);
    }

    #[test]
    fn null_out_pointers_are_invalid_arguments() {
        // SAFETY: null pointers are what is being tested; the functions must not dereference them.
        unsafe {
            assert_eq!(
                mscclppGetUniqueId(std::ptr::null_mut()),
                mscclppResult_t::mscclppInvalidArgument
            );
            let addr = c"127.0.0.1:1";
            assert_eq!(
                mscclppCommInitRank(std::ptr::null_mut(), 1, addr.as_ptr(), 0),
                mscclppResult_t::mscclppInvalidArgument
            );
            let mut comm: mscclppComm_t = std::ptr::null_mut();
            assert_eq!(
                mscclppCommInitRank(&mut comm, 0, addr.as_ptr(), 0),
                mscclppResult_t::mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommInitRank(&mut comm, 2, addr.as_ptr(), 2),
                mscclppResult_t::mscclppInvalidArgument
            );
            assert!(comm.is_null(), "a failed init leaves the handle alone");
        }
    }

    #[test]
    fn abort_and_async_error_check_their_arguments() {
        let mut code = mscclppResult_t::mscclppInProgress;
        // SAFETY: null and made-up handles are what is being tested; the out-pointer is valid.
        unsafe {
            assert_eq!(
                mscclppCommAbort(std::ptr::null_mut()),
                mscclppResult_t::mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommGetAsyncError(std::ptr::null_mut(), &mut code),
                mscclppResult_t::mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommAbort(0x4d53_0000_0000_1230 as mscclppComm_t),
                mscclppResult_t::mscclppInvalidUsage
            );
        }
        assert_eq!(code, mscclppResult_t::mscclppInProgress, "left alone on error");
    }

    #[test]
    fn a_one_rank_communicator_lives_and_dies() {
        let comm = one_rank();
        // SAFETY: valid out-pointers and strings throughout.
        unsafe {
            let (mut rank, mut size) = (-1, -1);
            assert_eq!(mscclppCommRank(comm, &mut rank), mscclppResult_t::mscclppSuccess);
            assert_eq!(mscclppCommSize(comm, &mut size), mscclppResult_t::mscclppSuccess);
            assert_eq!((rank, size), (0, 1));
            let mut data = [7u8; 4];
            assert_eq!(
                mscclppBootstrapAllGather(comm, data.as_mut_ptr().cast(), 4),
                mscclppResult_t::mscclppSuccess
            );
            assert_eq!(data, [7u8; 4]);
            assert_eq!(mscclppBootstrapBarrier(comm), mscclppResult_t::mscclppSuccess);
            let mut code = mscclppResult_t::mscclppInProgress;
            assert_eq!(
                mscclppCommGetAsyncError(comm, std::ptr::null_mut()),
                mscclppResult_t::mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommGetAsyncError(comm, &mut code),
                mscclppResult_t::mscclppSuccess
            );
            assert_eq!(code, mscclppResult_t::mscclppSuccess);
            // An abort makes later calls fail, and the async error says it was this rank's own.
            assert_eq!(mscclppCommAbort(comm), mscclppResult_t::mscclppSuccess);
            assert_eq!(
                mscclppCommGetAsyncError(comm, &mut code),
                mscclppResult_t::mscclppSuccess
            );
            assert_eq!(code, mscclppResult_t::mscclppInvalidUsage);
            assert_eq!(mscclppBootstrapBarrier(comm), mscclppResult_t::mscclppInvalidUsage);
            assert_eq!(mscclppCommAbort(comm), mscclppResult_t::mscclppSuccess);
            assert_eq!(mscclppCommDestroy(comm), mscclppResult_t::mscclppSuccess);
            assert_eq!(mscclppCommRank(comm, &mut rank), mscclppResult_t::mscclppInvalidUsage);
            assert_eq!(mscclppCommDestroy(comm), mscclppResult_t::mscclppInvalidUsage);
        }
    }
}
