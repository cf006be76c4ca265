//! Groups: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`, and the engine behind them.
//!
//! - `Group`: the bookkeeping, per thread as in NCCL: the depth of nesting, the work queued since the
//!   outermost start, and the first error a call inside the group returned (which fails the whole group
//!   at its end, as NCCL does: nothing queued is then issued).
//! - `Op` and `issue`: every call that does work (an initialisation, a collective, a send or receive, a
//!   one-sided call, a call for NVIDIA's communicator) is an `Op`, run now outside a group and queued
//!   inside one.
//! - `run_group`: the outermost end issues the queued work: the initialisations all at once, then per
//!   communicator its collectives in call order, its sends and receives in one launch, its one-sided calls
//!   (one thread per communicator where there are several), then NVIDIA's share in one NVIDIA group.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::NcclComm;
use super::entry::{OK, entry};
use super::fallback::{self, Forwarded};
use super::init::{Job, run_init};
use super::types::*;
use crate::abi::non_null;
use crate::collective::{Call, Collective, P2pOp, algorithm};
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::{AppStream, GpuContext};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// One thread's group state.
#[derive(Debug)]
pub struct Group<Op> {
    depth: usize,
    queue: Vec<Op>,
    error: Option<Error>,
}

impl<Op> Default for Group<Op> {
    fn default() -> Self {
        Group {
            depth: 0,
            queue: Vec::new(),
            error: None,
        }
    }
}

/// What the outermost end hands back: the work to issue, or the error that failed the group.
pub type Ended<Op> = std::result::Result<Vec<Op>, Error>;

impl<Op> Group<Op> {
    pub fn start(&mut self) {
        self.depth += 1;
    }

    /// Whether a group is open (work is queued rather than issued).
    pub fn open(&self) -> bool {
        self.depth > 0
    }

    /// Queues `op` for the outermost end. Only inside a group.
    pub fn queue(&mut self, op: Op) {
        debug_assert!(self.open());
        self.queue.push(op);
    }

    /// Remembers the first error of a call inside the group.
    pub fn fail(&mut self, e: &Error) {
        if self.open() && self.error.is_none() {
            self.error = Some(e.clone());
        }
    }

    /// Ends one level: `Err` when no group is open (`ncclInvalidUsage`), `Ok(None)` for an inner end,
    /// `Ok(Some(..))` for the outermost, with the queued work or the group's error.
    pub fn end(&mut self) -> Result<Option<Ended<Op>>> {
        if self.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd without a matching ncclGroupStart on this thread",
            ));
        }
        self.depth -= 1;
        if self.depth > 0 {
            return Ok(None);
        }
        let queue = std::mem::take(&mut self.queue);
        Ok(Some(match self.error.take() {
            Some(e) => Err(e),
            None => Ok(queue),
        }))
    }
}

/// Runs `f` on this thread's group of `Op`s.
pub fn with<Op: 'static, T>(
    local: &'static std::thread::LocalKey<RefCell<Group<Op>>>,
    f: impl FnOnce(&mut Group<Op>) -> T,
) -> T {
    local.with(|g| f(&mut g.borrow_mut()))
}

// ---- the group engine: what a group queues, and how its outermost end issues it ----

/// Work a group queues, issued at its outermost `ncclGroupEnd`.
pub(super) enum Op {
    /// A communicator's initialisation (`ncclCommInitRank` inside a group): every one of a group runs at
    /// once, so that one thread can make several ranks.
    Init {
        comm: Arc<NcclComm>,
        gpu: Option<GpuContext>,
        job: Job,
    },
    Collective {
        comm: Arc<Communicator>,
        call: Call,
        root: i64,
        stream: u64,
    },
    /// A send or a receive: a group's are issued together, after the group's collectives, in one launch
    /// per communicator (they must progress at the same time).
    P2p {
        comm: Arc<Communicator>,
        op: P2pOp,
        stream: u64,
    },
    /// A call for NVIDIA's communicator beside ours: inside a group, issued at its end inside NVIDIA's own
    /// group.
    Fallback(Forwarded),
    /// A one-sided call (`rma.rs`): a group's are issued after its sends and receives, its puts and
    /// signals first, then its waits, each in call order.
    OneSided {
        comm: Arc<Communicator>,
        op: crate::collective::signal::OneSided,
        stream: u64,
    },
}

/// A queued collective's arguments: the call, the application's root, its stream.
type QueuedCall = (Call, i64, u64);

/// A group's work on one communicator: its collectives, then its sends and receives (with their streams).
struct CommWork {
    comm: Arc<Communicator>,
    calls: Vec<QueuedCall>,
    p2p: Vec<(P2pOp, u64)>,
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
                    p2p: Vec::new(),
                    one_sided: Vec::new(),
                });
                all.len() - 1
            }
        };
        &mut all[i]
    }
}

thread_local! {
    pub(super) static GROUP: RefCell<Group<Op>> = RefCell::new(Group::default());
}

/// Runs one call's work now, or queues it inside a group.
pub(super) fn issue(op: Op) -> Result<ncclResult_t> {
    let op = match with(&GROUP, |g| {
        if g.open() {
            g.queue(op);
            None
        } else {
            Some(op)
        }
    }) {
        None => return OK,
        Some(op) => op,
    };
    match op {
        Op::Collective {
            comm,
            call,
            root,
            stream,
        } => {
            // SAFETY: nccl.h's contract: `stream` is NULL or a live stream of the communicator's GPU.
            comm.collective(&call, root, unsafe { AppStream::from_raw(stream) })?;
            OK
        }
        Op::P2p { comm, op, stream } => {
            // SAFETY: as above.
            comm.send_recv(&[op], unsafe { AppStream::from_raw(stream) })?;
            OK
        }
        Op::Fallback(f) => {
            f.issue()?;
            OK
        }
        Op::OneSided { comm, op, stream } => {
            // SAFETY: as above.
            comm.one_sided(&op, unsafe { AppStream::from_raw(stream) })?;
            OK
        }
        Op::Init { .. } => Err(Error::internal("an initialisation outside a group")),
    }
}

/// Issues `call` on NVIDIA's communicator `f`, now or at the group's end.
pub(super) fn forward(f: &Arc<fallback::Comm>, call: fallback::Call, stream: *mut c_void) -> Result<ncclResult_t> {
    issue(Op::Fallback(Forwarded {
        comm: f.clone(),
        call,
        stream: stream as u64,
    }))
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
            Op::P2p { comm, op, stream } => CommWork::of(&mut by_comm, comm).p2p.push((op, stream)),
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
        if let Some((_, stream)) = work.p2p.first() {
            // Two launches of one group on two streams could each wait for the other's share of the GPU.
            if work.p2p.iter().any(|(_, s)| s != stream) {
                return Err(Error::invalid_usage(
                    "the sends and receives of one group on one communicator use several streams; this library \
                     carries them out on one stream per communicator and group",
                ));
            }
            let ops: Vec<P2pOp> = work.p2p.iter().map(|(op, _)| *op).collect();
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
            non_null(simInfo, "simInfo")?;
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
        Op::P2p { op, .. } => {
            let bytes = (op.count as u64).saturating_mul(op.datatype.size() as u64);
            algorithm::estimate_us(Collective::AllToAll, 2, bytes.saturating_mul(2))
        }
        Op::Init { .. } | Op::Fallback(_) | Op::OneSided { .. } => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn an_end_without_a_start_is_invalid_usage() {
        let mut g: Group<u32> = Group::default();
        assert_eq!(g.end().unwrap_err().kind, ErrorKind::InvalidUsage);
        g.start();
        assert!(g.end().unwrap().is_some());
        assert_eq!(g.end().unwrap_err().kind, ErrorKind::InvalidUsage);
    }

    #[test]
    fn nested_groups_issue_everything_in_order_at_the_outermost_end() {
        let mut g = Group::default();
        g.start();
        g.queue(1);
        g.start();
        g.queue(2);
        g.start();
        g.queue(3);
        assert!(g.end().unwrap().is_none());
        assert!(g.end().unwrap().is_none());
        g.queue(4);
        assert!(g.open());
        assert_eq!(g.end().unwrap().unwrap().unwrap(), vec![1, 2, 3, 4]);
        assert!(!g.open());
        g.start();
        assert!(g.end().unwrap().unwrap().unwrap().is_empty(), "nothing left over");
    }

    #[test]
    fn an_error_inside_fails_the_group_and_drops_its_work() {
        let mut g = Group::default();
        g.start();
        g.queue(1);
        g.fail(&Error::invalid_argument("first"));
        g.fail(&Error::invalid_usage("second"));
        g.queue(2);
        let e = g.end().unwrap().unwrap().unwrap_err();
        assert_eq!(e.message, "first");
        g.start();
        g.queue(3);
        assert_eq!(
            g.end().unwrap().unwrap().unwrap(),
            vec![3],
            "the next group starts clean"
        );
        g.fail(&Error::invalid_argument("outside a group"));
        g.start();
        assert!(g.end().unwrap().unwrap().is_ok(), "errors outside a group are not kept");
    }
}
