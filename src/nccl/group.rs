//! Groups: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`, and the engine behind their outermost
//! end. The work a call queues inside a group (`Op`), the per-thread bookkeeping (`Group`, `GROUP`) and
//! `issue`, which runs work now or queues it, are `queue.rs`'s.
//!
//! - `run_group`: the outermost end issues the queued work: the initialisations all at once
//!   (`init::run_init`), then each communicator's share of our work through the core's pipeline (which
//!   plans its order: `collective/plan.rs`), then NVIDIA's share in one NVIDIA group.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::NcclComm;
use super::entry::{OK, entry};
use super::init::run_init;
use super::queue::{GROUP, Op, with};
use super::types::*;
use crate::abi::non_null_args;
use crate::collective::{Collective, algorithm};
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::pipeline::{self, Submitted, Work};
use std::sync::Arc;

/// Issues a group's work: the initialisations all at once, then each communicator's share of our work
/// through the core's pipeline (`pipeline::submit_groups`: planned, in the same order on every rank, one
/// thread per communicator where there are several), then NVIDIA's share in one NVIDIA group. Returns the
/// first error.
fn run_group(ops: Vec<Op>) -> Result<ncclResult_t> {
    let mut inits = Vec::new();
    let mut by_comm: Vec<(Arc<Communicator>, Vec<Submitted>)> = Vec::new();
    let mut forwarded = Vec::new();
    for op in ops {
        match op {
            Op::Init { comm, gpu, job } => inits.push((comm, gpu, job)),
            Op::Fallback(f) => forwarded.push(f),
            Op::Work { comm, work } => match by_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &comm)) {
                Some((_, queued)) => queued.push(work),
                None => by_comm.push((comm, vec![work])),
            },
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
    if let Err(e) = pipeline::submit_groups(&by_comm) {
        first.get_or_insert(e);
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
        Op::Work { comm, work } => match &work.work {
            Work::Collective { call, sizes } => {
                let nranks = comm.nranks();
                algorithm::estimate_us(call.collective, nranks, call.collective.message(sizes.piece, nranks))
            }
            Work::SendRecv(op) => {
                let bytes = (op.count as u64).saturating_mul(op.datatype.size() as u64);
                algorithm::estimate_us(Collective::AllToAll, 2, bytes.saturating_mul(2))
            }
            Work::OneSided(_) | Work::Resume => 0.0,
        },
        Op::Init { .. } | Op::Fallback(_) => 0.0,
    }
}
