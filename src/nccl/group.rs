//! Groups: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`, and the engine behind their outermost
//! end. The work a call queues inside a group (`Op`), the per-thread bookkeeping (`Group`, `GROUP`) and
//! `issue`, which runs work now or queues it, are `queue.rs`'s.
//!
//! - `run_group`: the outermost end issues the queued work: the initialisations all at once
//!   (`init::run_init`), then per communicator its collectives in call order, its sends and receives in one
//!   launch, its one-sided calls (`rma::group_order`; one thread per communicator where there are several),
//!   then NVIDIA's share in one NVIDIA group.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::NcclComm;
use super::entry::{OK, entry};
use super::init::run_init;
use super::queue::{GROUP, Op, with};
use super::types::*;
use crate::abi::non_null_args;
use crate::collective::{Call, Collective, SendRecvOp, algorithm};
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::{AppStream, GpuContext};
use std::sync::Arc;

/// A queued collective's arguments: the call, the application's root, its stream.
type QueuedCall = (Call, i64, u64);

/// A group's work on one communicator: its collectives, then its sends and receives (with their streams).
struct CommWork {
    comm: Arc<Communicator>,
    calls: Vec<QueuedCall>,
    send_recv: Vec<(SendRecvOp, u64)>,
    one_sided: Vec<(crate::collective::signal::OneSided, u64)>,
}

impl CommWork {
    /// `comm`'s entry of `all`, made at its first work.
    fn of(all: &mut Vec<CommWork>, comm: Arc<Communicator>) -> &mut CommWork {
        let i = match all.iter().position(|w| Arc::ptr_eq(&w.comm, &comm)) {
            Some(i) => i,
            None => {
                all.push(CommWork {
                    comm,
                    calls: Vec::new(),
                    send_recv: Vec::new(),
                    one_sided: Vec::new(),
                });
                all.len() - 1
            }
        };
        &mut all[i]
    }
}

/// Issues a group's work: the initialisations all at once, then the collectives, in order per
/// communicator (one thread per communicator when there are several, since a communicator's first call
/// waits for its peers, which may be this thread's other communicators). Returns the first error.
fn run_group(ops: Vec<Op>) -> Result<ncclResult_t> {
    let mut inits = Vec::new();
    let mut by_comm: Vec<CommWork> = Vec::new();
    let mut forwarded = Vec::new();
    for op in ops {
        match op {
            Op::Init { comm, gpu, job } => inits.push((comm, gpu, job)),
            Op::Fallback(f) => forwarded.push(f),
            Op::Collective {
                comm,
                call,
                root,
                stream,
            } => CommWork::of(&mut by_comm, comm).calls.push((call, root, stream)),
            Op::SendRecv { comm, op, stream } => CommWork::of(&mut by_comm, comm).send_recv.push((op, stream)),
            Op::OneSided { comm, op, stream } => CommWork::of(&mut by_comm, comm).one_sided.push((op, stream)),
        }
    }
    let mut first: Option<Error> = None;
    if !inits.is_empty() {
        let comms: Vec<Arc<NcclComm>> = inits.iter().map(|(c, _, _)| c.clone()).collect();
        std::thread::scope(|s| {
            for (comm, gpu, job) in inits {
                s.spawn(move || run_init(&comm, gpu, job));
            }
        });
        first = comms.iter().find_map(|c| c.core().err());
    }
    // Every rank issues a communicator's collectives first, in call order, then its sends and receives
    // in one launch: the same order everywhere, so that no rank's kernel waits behind one its peer
    // queued later.
    let run = |work: &CommWork| -> Result<()> {
        for (call, root, stream) in &work.calls {
            // SAFETY: nccl.h's contract for the stream of each call, kept until the group's end.
            let stream = unsafe { AppStream::from_raw(*stream) };
            work.comm.collective(call, *root, stream)?;
        }
        if let Some((_, stream)) = work.send_recv.first() {
            // Two launches of one group on two streams could each wait for the other's share of the GPU.
            if work.send_recv.iter().any(|(_, s)| s != stream) {
                return Err(Error::invalid_usage(
                    "the sends and receives of one group on one communicator use several streams; this library \
                     carries them out on one stream per communicator and group",
                ));
            }
            let ops: Vec<SendRecvOp> = work.send_recv.iter().map(|(op, _)| *op).collect();
            // SAFETY: as above.
            work.comm.send_recv(&ops, unsafe { AppStream::from_raw(*stream) })?;
        }
        // Then the one-sided calls, their waits last: a wait queued before a put of the same group would
        // hold the stream back from the put its peer may be waiting for.
        for i in super::rma::group_order(&work.one_sided) {
            let (op, stream) = &work.one_sided[i];
            // SAFETY: as above.
            work.comm.one_sided(op, unsafe { AppStream::from_raw(*stream) })?;
        }
        Ok(())
    };
    if by_comm.len() == 1 {
        if let Err(e) = run(&by_comm[0]) {
            first.get_or_insert(e);
        }
    } else if by_comm.len() > 1 {
        let gpu = GpuContext::current_if_any();
        let errors: Vec<Error> = std::thread::scope(|s| {
            let workers: Vec<_> = by_comm
                .iter()
                .map(|work| {
                    s.spawn(move || {
                        if let Some(g) = gpu {
                            let _ = g.make_current();
                        }
                        run(work)
                    })
                })
                .collect();
            workers
                .into_iter()
                .filter_map(|w| {
                    w.join()
                        .unwrap_or_else(|_| Err(Error::internal("a group's thread panicked")))
                        .err()
                })
                .collect()
        });
        if let Some(e) = errors.into_iter().next() {
            first.get_or_insert(e);
        }
    }
    // NVIDIA's share of the group, in one NVIDIA group after ours: within a group NCCL promises no order
    // between operations either, and every rank issues its share in the same place. Issued even after an
    // error of ours, so that the peers' NVIDIA calls are not left waiting.
    if let Some(f) = forwarded.first()
        && let Err(e) = f.comm.library().issue_group(&forwarded)
    {
        first.get_or_insert(e);
    }
    match first {
        Some(e) => Err(e),
        None => OK,
    }
}

// ---- groups' exports ----

nccl_export! {
    /// Opens a group (they nest): work is queued until the outermost `ncclGroupEnd`.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        entry("ncclGroupStart", || {
            with(&GROUP, |g| g.start());
            OK
        })
    }
}

nccl_export! {
    /// Closes a group; the outermost issues the group's work, in order, and returns its first error (or
    /// the error of a call made inside the group, which then issues nothing).
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        entry("ncclGroupEnd", || match with(&GROUP, |g| g.end())? {
            None => OK,
            Some(ended) => run_group(ended?),
        })
    }
}

nccl_export! {
    /// Closes a group as `ncclGroupEnd` does, without issuing its collectives (its initialisations run);
    /// `estimatedTime` is 0 for now: this library makes no estimate yet.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        entry("ncclGroupSimulateEnd", || {
            non_null_args!(simInfo);
            // SAFETY: checked non-null; its header fields come first in every version.
            let info = unsafe { &mut *simInfo };
            ensure_arg!(
                info.magic == NCCL_SIM_INFO_MAGIC,
                "simInfo's magic is {:#x}, not {NCCL_SIM_INFO_MAGIC:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER",
                info.magic
            );
            let (r, estimate) = match with(&GROUP, |g| g.end())? {
                None => (OK, 0.0),
                Some(ended) => {
                    let ops = ended?;
                    let estimate: f64 = ops.iter().map(simulated_us).sum();
                    (run_group(ops.into_iter().filter(|op| matches!(op, Op::Init { .. })).collect()), estimate)
                }
            };
            info.estimatedTime = estimate as f32;
            r
        })
    }
}

/// What `ncclGroupSimulateEnd` reports for one queued call, in microseconds: our algorithm table's choice
/// and its model (`algorithm::estimate_us`); a send or receive as the copy family's share of one message;
/// nothing for initialisations and for calls that go to NVIDIA's library (its own estimate is not asked).
fn simulated_us(op: &Op) -> f64 {
    match op {
        Op::Collective { comm, call, .. } => {
            let piece = (call.count as u64).saturating_mul(call.datatype.size() as u64);
            let nranks = comm.nranks();
            algorithm::estimate_us(call.collective, nranks, call.collective.message(piece, nranks))
        }
        Op::SendRecv { op, .. } => {
            let bytes = (op.count as u64).saturating_mul(op.datatype.size() as u64);
            algorithm::estimate_us(Collective::AllToAll, 2, bytes.saturating_mul(2))
        }
        Op::Init { .. } | Op::Fallback(_) | Op::OneSided { .. } => 0.0,
    }
}
