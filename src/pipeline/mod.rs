//! The one path every call takes through the core, as NCCL's enqueue: a face checks a call's arguments and
//! makes its work (`Submitted`: a collective, a send or receive, a one-sided call, a resume), which it
//! submits at once or, inside a group, at the group's end; the core then
//! 1. plans the submitted work (`collective/plan.rs`, pure, tested without a GPU): the order a group's work goes in
//!    (its collectives in call order, its sends and receives in one launch, its one-sided calls, their
//!    waits last) and, for a collective, the paths it may take in order (`plan::paths`) and the scratch
//!    windows it is cut into (`plan::scratch_launches`);
//! 2. runs each step (`execute.rs`): one prologue (the communicator usable, not suspended, its GPU, the
//!    buffers and the stream checked), then the launches (`Collectives`), and owns what happens when a
//!    launch fails after the peers may have started theirs: the communicator is aborted, once, so that no
//!    peer waits forever.
//!
//! The faces only translate: arguments into `Submitted`, the core's `Error` into their codes. A call is
//! checked once, where its work is made (`Submitted::collective` and the others), so that a call queued
//! in a group fails at the call, not at the group's end.

mod execute;

pub use crate::collective::plan::{Submitted, Work};
pub use execute::submit_groups;

use crate::collective::signal::{self, OneSided};
use crate::collective::{Call, SendRecvOp};
use crate::comm::Communicator;
use crate::error::Result;
use crate::gpu::AppStream;

impl Submitted {
    /// A collective call on `comm`: its root and sizes are checked here (`Call::sizes`), once.
    pub fn collective(comm: &Communicator, call: Call, root: i64, stream: AppStream) -> Result<Submitted> {
        let sizes = call.sizes(comm.rank(), comm.nranks(), root)?;
        Ok(Submitted {
            work: Work::Collective { call, sizes },
            stream,
        })
    }

    /// A send or a receive on `comm`: its peer, count and buffer are checked here
    /// (`SendRecvOp::checked_bytes`); what depends on the rest of its group (a send to this rank matched by
    /// a receive from it) when the group is planned.
    pub fn send_recv(comm: &Communicator, op: SendRecvOp, stream: AppStream) -> Result<Submitted> {
        op.checked_bytes(comm.nranks(), || op.function.to_string())?;
        Ok(Submitted {
            work: Work::SendRecv(op),
            stream,
        })
    }

    /// A one-sided call on `comm`: its peers, and a put's window among this rank's, are checked here.
    pub fn one_sided(comm: &Communicator, op: OneSided, stream: AppStream) -> Result<Submitted> {
        op.check(comm.nranks())?;
        if let OneSided::Put { window, .. } = &op {
            signal::own_window(comm.registrations(), *window, "peerWin")?;
        }
        Ok(Submitted {
            work: Work::OneSided(op),
            stream,
        })
    }

    /// The resume of a suspended communicator (no stream: it synchronizes its own work).
    pub fn resume() -> Submitted {
        Submitted {
            work: Work::Resume,
            // SAFETY: the legacy default stream, which is never used by a resume.
            stream: unsafe { AppStream::from_raw(0) },
        }
    }
}
