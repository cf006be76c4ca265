//! The collectives of `mscclpp.h` (`MSCCLPP_HAS_COLLECTIVES`): NCCL's shape, on the application's stream.
//! The header declares them by hand (it takes `mscclppDataType_t`, `mscclppRedOp_t` and `cudaStream_t`
//! where these take ints and a pointer, so that an out-of-range value is an error, not undefined).
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the contract of each function is the header's

use super::api::with_comm;
use crate::collective::{Call, Collective, DataType, RedOp};
use crate::error::{Error, Result};
use crate::gpu::AppStream;
use crate::pipeline::Submitted;
use crate::types::{mscclppComm_t, mscclppDataType_t, mscclppRedOp_t, mscclppResult_t};
use std::ffi::{c_int, c_void};

/// The type an application passed (a `mscclppDataType_t` as an int: NCCL's numbers before the fp8 ones),
/// or an error naming the value.
fn datatype(value: c_int) -> Result<DataType> {
    let last = mscclppDataType_t::mscclppBfloat16 as c_int;
    match DataType::from_number(value) {
        Some(t) if value <= last => Ok(t),
        _ => Err(Error::invalid_argument(format!(
            "datatype is {value}; it must be a mscclppDataType_t, 0 (mscclppInt8) to {last} (mscclppBfloat16)"
        ))),
    }
}

/// The operator an application passed (a `mscclppRedOp_t` as an int), or an error naming the value.
fn redop(value: c_int) -> Result<RedOp> {
    let last = mscclppRedOp_t::mscclppAvg as c_int;
    RedOp::from_number(value).ok_or_else(|| {
        Error::invalid_argument(format!(
            "op is {value}; it must be a mscclppRedOp_t, 0 (mscclppSum) to {last} (mscclppAvg)"
        ))
    })
}

/// Checks the type and operator and runs the call on `comm`; `function` names it in messages.
#[allow(clippy::too_many_arguments)]
fn collective(
    function: &'static str,
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
    with_comm(function, comm, |c| {
        let call = Call {
            collective,
            function,
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype: self::datatype(datatype)?,
            op: op.map(redop).transpose()?,
            root: root.max(0) as usize,
        };
        // SAFETY: the header's contract: `stream` is 0 or a live stream of the communicator's GPU.
        let stream = unsafe { AppStream::from_raw(stream as u64) };
        c.submit(&[Submitted::collective(c, call, root as i64, stream)?])
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
        "mscclppAllReduce",
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
        "mscclppAllGather",
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
        "mscclppReduceScatter",
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
        "mscclppBroadcast",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_c_value_maps_and_others_are_refused() {
        for (i, t) in DataType::ALL[..10].iter().enumerate() {
            assert_eq!(datatype(i as c_int).unwrap(), *t);
        }
        // mscclpp.h has no fp8 types.
        for bad in [-1, 10, 11, 1000] {
            let e = datatype(bad).unwrap_err();
            assert!(e.message.contains("datatype is") && e.message.contains(&bad.to_string()));
        }
        for (i, op) in RedOp::BUILT_IN.iter().enumerate() {
            assert_eq!(redop(i as c_int).unwrap(), *op);
        }
        for bad in [-1, 5, c_int::MAX] {
            assert!(redop(bad).unwrap_err().message.starts_with("op is"));
        }
    }
}
