//! The work of a call, run now or queued: every call that does work (an initialisation, a collective, a
//! send or receive, a one-sided call, a call for NVIDIA's communicator) makes an `Op` and hands it to
//! `issue`, which runs it now outside a group and queues it inside one (`enqueue` is the entry of such a
//! call: a failure inside a group also fails the group).
//!
//! - `Op::Work`: a call of ours, checked by the core where it is made (`pipeline::Submitted`).
//! - `Group`: the bookkeeping, per thread as in NCCL (`GROUP`): the depth of nesting, the work queued since
//!   the outermost start, and the first error a call inside the group returned (which fails the whole
//!   group at its end, as NCCL does: nothing queued is then issued).
//! - `ncclGroupStart`, `ncclGroupEnd` and the engine that issues the queued work at the outermost end are
//!   `group.rs`'s, above this file and above `init.rs` and `rma.rs`, which queue their work here.

use super::comm::NcclComm;
use super::entry::{OK, with_comm_reporting};
use super::fallback::{self, Forwarded};
use super::types::*;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::gpu::{AppStream, GpuContext};
use crate::pipeline::Submitted;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

/// What a new communicator's initialisation runs: an initialisation's, a split's, a shrink's or a
/// grow's way of making the core's communicator, run by `init::start` (now, on a thread, or at a group's
/// end).
pub type Job = Box<dyn FnOnce() -> Result<Communicator> + Send>;

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

/// Work a group queues, issued at its outermost `ncclGroupEnd`.
pub(super) enum Op {
    /// A communicator's initialisation (`ncclCommInitRank` inside a group): every one of a group runs at
    /// once, so that one thread can make several ranks.
    Init {
        comm: Arc<NcclComm>,
        gpu: Option<GpuContext>,
        job: Job,
    },
    /// A call of ours (a collective, a send or receive, a one-sided call), checked: a group's are issued at
    /// its end per communicator, in the order the core's planner gives (`collective::plan`).
    Work { comm: Arc<Communicator>, work: Submitted },
    /// A call for NVIDIA's communicator beside ours: inside a group, issued at its end inside NVIDIA's own
    /// group.
    Fallback(Forwarded),
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
        Op::Work { comm, work } => {
            comm.submit(std::slice::from_ref(&work))?;
            OK
        }
        Op::Fallback(f) => {
            f.issue()?;
            OK
        }
        Op::Init { .. } => Err(Error::internal("an initialisation outside a group")),
    }
}

/// Submits work of ours on `core`, now or at the group's end: `make` checks the call and makes its work
/// (`pipeline::Submitted`'s constructors) with the application's `stream`.
pub(super) fn submit(
    core: Arc<Communicator>,
    stream: *mut c_void,
    make: impl FnOnce(&Communicator, AppStream) -> Result<Submitted>,
) -> Result<ncclResult_t> {
    // SAFETY: nccl.h's contract: `stream` is NULL or a live stream of the communicator's GPU, until the call
    // (or its group) is issued.
    let stream = unsafe { AppStream::from_raw(stream as u64) };
    let work = make(&core, stream)?;
    issue(Op::Work { comm: core, work })
}

/// Issues `call` on NVIDIA's communicator `f`, now or at the group's end.
pub(super) fn forward(f: &Arc<fallback::Comm>, call: fallback::Call, stream: *mut c_void) -> Result<ncclResult_t> {
    issue(Op::Fallback(Forwarded {
        comm: f.clone(),
        call,
        stream: stream as u64,
    }))
}

/// `entry::with_comm` for work that a group queues: a failure inside a group (a NULL or destroyed
/// communicator too) also fails the group's end.
pub(super) fn enqueue(
    name: &str,
    comm: ncclComm_t,
    body: impl FnOnce(&Arc<NcclComm>) -> Result<ncclResult_t>,
) -> ncclResult_t {
    with_comm_reporting(name, comm, body, |e| with(&GROUP, |g| g.fail(e)))
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
