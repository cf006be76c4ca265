//! Where an `ncclAllReduce` enters, and the other collectives of `nccl.h` (`ncclAllGather`,
//! `ncclReduceScatter`, `ncclBroadcast`, `ncclBcast`, `ncclReduce`, `ncclAlltoAll`, `ncclGather`,
//! `ncclScatter`): `collective` checks the arguments, reads NCCL's type and operator, and makes the core's
//! `Call` (carrying the exported function's name for messages), which `queue::issue` hands to
//! the core's pipeline now or at the group's end (`src/pipeline/`); it becomes launches in
//! `Collectives::launch_collective` (`src/collective/launch.rs`). Where NVIDIA's communicator carries every call (ranks on several hosts), the
//! call is forwarded to it instead (`fallback.rs`). `coll_config.rs` has the siblings taking an
//! `ncclCollConfig_t`.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::entry::{check_rank, datatype};
use super::fallback;
use super::operators::redop;
use super::queue::{enqueue, forward, submit};
use super::types::*;
use crate::collective::{Call, Collective};
use crate::error::Error;
use crate::pipeline::Submitted;
use std::ffi::{c_int, c_void};

/// AllReduce, AllGather, ReduceScatter, Broadcast: checked here (nothing touches a GPU before the checks
/// pass), then the core's collective, now or at the group's end.
#[allow(clippy::too_many_arguments)]
pub(super) fn collective(
    name: &'static str,
    collective: Collective,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype_value: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> ncclResult_t {
    enqueue(name, comm, |c| {
        let datatype = datatype(datatype_value)?;
        let core_op = op.map(|o| redop(o, c, datatype)).transpose()?;
        // Ranks on several hosts: NVIDIA's communicator carries every call (ours have no transport there).
        if let Some(f) = c.fallback_for_all() {
            c.open()?;
            if collective.rooted() {
                check_rank("root", root, c)?;
            }
            let op = match op {
                Some(o) if o >= redop::NUM_OPS => c
                    .premul(o)
                    .and_then(|p| p.fallback)
                    .ok_or_else(|| Error::invalid_usage(format!("op {o} has no twin on NVIDIA's communicator")))?,
                Some(o) => o,
                None => 0,
            };
            let call = fallback::Call::Collective {
                collective,
                send: sendbuff as u64,
                recv: recvbuff as u64,
                count,
                datatype: datatype_value,
                op,
                root,
            };
            return forward(f, call, stream);
        }
        let core = c.usable()?;
        let call = Call {
            collective,
            function: name,
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op: core_op,
            root: root.max(0) as usize,
        };
        // Checked once, here (root, sizes, NULL buffers), so that a call queued in a group fails at once.
        submit(core, stream, |core, stream| {
            Submitted::collective(core, call, root as i64, stream)
        })
    })
}

nccl_export! {
    /// `recvbuff` gets the reduction of every rank's `sendbuff` (`count` elements).
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclAllReduce", Collective::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream)
    }
}

nccl_export! {
    /// `recvbuff` (`nranks * sendcount` elements) gets every rank's `sendbuff`, in rank order.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclAllGather", Collective::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream)
    }
}

nccl_export! {
    /// `recvbuff` (`recvcount` elements) gets this rank's piece of the reduction of every `sendbuff`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclReduceScatter", Collective::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream)
    }
}

nccl_export! {
    /// Every rank's `recvbuff` gets `root`'s `sendbuff`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclBroadcast", Collective::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
    }
}

nccl_export! {
    /// `ncclBroadcast` in place.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclBcast", Collective::Broadcast, buff, buff, count, datatype, None, root, comm, stream)
    }
}

nccl_export! {
    /// `root`'s `recvbuff` gets the reduction of every rank's `sendbuff` (the others' is not used).
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclReduce", Collective::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream)
    }
}

nccl_export! {
    /// Rank r's `recvbuff` piece p (`count` elements each) gets rank p's `sendbuff` piece r.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclAlltoAll", Collective::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, comm, stream)
    }
}

nccl_export! {
    /// `root`'s `recvbuff` piece r (`count` elements each) gets rank r's `sendbuff`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclGather", Collective::Gather, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
    }
}

nccl_export! {
    /// Rank r's `recvbuff` (`count` elements) gets piece r of `root`'s `sendbuff`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: *mut c_void,
    ) -> ncclResult_t {
        collective("ncclScatter", Collective::Scatter, sendbuff, recvbuff, count, datatype, None, root, comm, stream)
    }
}
