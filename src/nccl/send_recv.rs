//! `ncclSend` and `ncclRecv`: checked here, then queued for the core's send/recv
//! (`Communicator::send_recv`, whose protocol lives in `src/collective/`), a group's together in one launch
//! per communicator (`group.rs`), or forwarded to NVIDIA's communicator where that carries every call.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::entry::{check_rank, datatype};
use super::fallback;
use super::queue::{enqueue, forward, submit};
use super::types::*;
use crate::collective::{SendRecvKind, SendRecvOp};
use crate::pipeline::Submitted;
use std::ffi::{c_int, c_void};

/// Send and Recv: checked here; carried out by the core (a group's together, in one step of the core's plan: `collective/plan.rs`), any type
/// (fp8 too: bytes), or on NVIDIA's communicator where ours sends everything there (ranks on several hosts).
#[allow(clippy::too_many_arguments)]
fn point_to_point(
    name: &'static str,
    kind: SendRecvKind,
    buffer: u64,
    count: usize,
    datatype_value: c_int,
    peer: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> ncclResult_t {
    enqueue(name, comm, |c| {
        let datatype = datatype(datatype_value)?;
        check_rank("peer", peer, c)?;
        if let Some(f) = c.fallback_for_all() {
            c.open()?;
            let call = match kind {
                SendRecvKind::Send => fallback::Call::Send {
                    buf: buffer,
                    count,
                    datatype: datatype_value,
                    peer,
                },
                SendRecvKind::Recv => fallback::Call::Recv {
                    buf: buffer,
                    count,
                    datatype: datatype_value,
                    peer,
                },
            };
            return forward(f, call, stream);
        }
        let core = c.usable()?;
        let op = SendRecvOp {
            kind,
            function: name,
            peer: peer as usize,
            buffer,
            count,
            datatype,
        };
        submit(core, stream, |core, stream| Submitted::send_recv(core, op, stream))
    })
}

nccl_export! {
    /// Sends `count` elements of `sendbuff` to `peer`, which receives them with `ncclRecv` (in the same
    /// group where both must progress together).
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        point_to_point("ncclSend", SendRecvKind::Send, sendbuff as u64, count, datatype, peer, comm, stream)
    }
}

nccl_export! {
    /// Receives `count` elements from `peer`'s `ncclSend` into `recvbuff`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        point_to_point("ncclRecv", SendRecvKind::Recv, recvbuff as u64, count, datatype, peer, comm, stream)
    }
}
