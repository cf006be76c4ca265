//! The collectives of `mscclpp.h` (`MSCCLPP_HAS_COLLECTIVES`): NCCL's shape, on the application's stream.
//! The header declares them by hand (it takes `mscclppDataType_t`, `mscclppRedOp_t` and `cudaStream_t`
//! where these take ints and a pointer, so that an out-of-range value is an error, not undefined).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the contract of each function is the header's

use super::api::with_comm;
use crate::collective::{Call, Collective, DataType, RedOp};
use crate::gpu::AppStream;
use crate::types::mscclppComm_t;
use crate::types::mscclppResult_t;
use std::ffi::{c_int, c_void};

/// Checks the type and operator and runs the call on `comm`.
#[allow(clippy::too_many_arguments)]
fn collective(
    collective: Collective,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: mscclppComm_t,
    stream: *mut c_void,
) -> mscclppResult_t {
    with_comm(collective.function(), comm, |c| {
        let call = Call {
            collective,
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype: DataType::from_c(datatype)?,
            op: op.map(RedOp::from_c).transpose()?,
            root: root.max(0) as usize,
        };
        // SAFETY: the header's contract: `stream` is 0 or a live stream of the communicator's GPU.
        let stream = unsafe { AppStream::from_raw(stream as u64) };
        c.collective(&call, root as i64, stream)
    })
}

/// All-reduce of `count` elements: `recvbuff` gets the reduction of every rank's `sendbuff`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: mscclppComm_t,
    stream: *mut c_void,
) -> mscclppResult_t {
    collective(
        Collective::AllReduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        Some(op),
        0,
        comm,
        stream,
    )
}

/// All-gather of `sendcount` elements per rank into `recvbuff` (`nranks * sendcount` elements).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: mscclppComm_t,
    stream: *mut c_void,
) -> mscclppResult_t {
    collective(
        Collective::AllGather,
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        None,
        0,
        comm,
        stream,
    )
}

/// Reduce-scatter: `recvbuff` (`recvcount` elements) gets this rank's piece of the reduction of every
/// rank's `sendbuff` (`nranks * recvcount` elements).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: mscclppComm_t,
    stream: *mut c_void,
) -> mscclppResult_t {
    collective(
        Collective::ReduceScatter,
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        Some(op),
        0,
        comm,
        stream,
    )
}

/// Broadcast of `count` elements from `root`'s `sendbuff` into every rank's `recvbuff`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: mscclppComm_t,
    stream: *mut c_void,
) -> mscclppResult_t {
    collective(
        Collective::Broadcast,
        sendbuff,
        recvbuff,
        count,
        datatype,
        None,
        root,
        comm,
        stream,
    )
}
