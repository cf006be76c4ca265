//! The executor: a plan's steps run one after another, each through the one prologue, then its launches;
//! a launch that fails once the peers may have started theirs aborts the communicator (once), so that no
//! peer is left waiting for this rank.

use super::{Submitted, Work};
use crate::collective::call::Sizes;
use crate::collective::plan::{self, Step};
use crate::collective::send_recv::{self, SendRecvOp};
use crate::collective::signal::{self, OneSided};
use crate::collective::{Call, RedOp, Scalar};
use crate::comm::Communicator;
use crate::error::{Error, ErrorKind, Result};
use crate::gpu::{AppStream, DevicePtr, GpuContext};
use std::borrow::Cow;
use std::sync::Arc;

/// Who aborts the communicator when a call fails on this rank after its peers may have started theirs
/// (`Communicator::abort`'s `by`): the core itself, so that the peers are not left waiting.
const ABORTED_BY_FAILED_CALL: &str = "a call that failed on this rank after its peers may have started it";

/// A buffer the prologue checks: where, how many bytes (0: none, not checked), its name for messages (a
/// literal for the collectives' and one-sided calls' buffers: nothing is allocated on their path).
type Buffer = (DevicePtr, u64, Cow<'static, str>);

impl Communicator {
    /// Runs `work` (a lone call, or this communicator's share of a group) on this thread: planned
    /// (`plan::plan`), then step by step. Returns the first error; the steps after it are not issued.
    pub fn submit(&self, work: &[Submitted]) -> Result<()> {
        let steps = plan::plan(work)?;
        // The calling thread may have another GPU current (a thread that serves several devices).
        let _restore = crate::gpu::RestoreContext::save();
        for step in &steps {
            self.run_step(work, step)?;
        }
        Ok(())
    }

    /// Resumes the collectives (`ncclCommResume`): collective, every rank calls it; submitted as every
    /// call is, so that a failure after the peers may have started theirs aborts the communicator.
    pub fn resume_collectives(&self) -> Result<()> {
        self.submit(&[Submitted::resume()])
    }

    fn run_step(&self, work: &[Submitted], step: &Step) -> Result<()> {
        match step {
            Step::Alone(i) => match &work[*i].work {
                Work::Collective { call, sizes } => self.run_collective(call, sizes, work[*i].stream),
                Work::Resume => self.run_resume(),
                other => Err(Error::internal(format!("a plan's lone step holds {other:?}"))),
            },
            Step::SendRecv(indices) => {
                let ops = indices
                    .iter()
                    .map(|&i| match &work[i].work {
                        Work::SendRecv(op) => Ok(*op),
                        other => Err(Error::internal(format!("a plan's send/receive step holds {other:?}"))),
                    })
                    .collect::<Result<Vec<SendRecvOp>>>()?;
                // `plan` checked that they share one stream.
                self.run_send_recv(&ops, work[indices[0]].stream)
            }
            Step::OneSided(i) => match &work[*i].work {
                Work::OneSided(op) => self.run_one_sided(op, work[*i].stream),
                other => Err(Error::internal(format!("a plan's one-sided step holds {other:?}"))),
            },
        }
    }

    /// The one prologue of every call: the communicator usable and not suspended; nothing more for an
    /// `empty` call (`None`: it needs no GPU, and does nothing); otherwise its GPU made current, each of
    /// `buffers` checked to be device memory of its context, and `stream` checked to be of it.
    fn prologue(&self, empty: bool, buffers: &[Buffer], stream: AppStream) -> Result<Option<GpuContext>> {
        self.check_usable()?;
        self.collectives().check_not_suspended()?;
        if empty {
            return Ok(None);
        }
        let gpu = self.gpu()?;
        for (ptr, bytes, name) in buffers {
            if *bytes > 0 {
                gpu.check_buffer(*ptr, *bytes, name)?;
            }
        }
        stream.check_context(&gpu)?;
        Ok(Some(gpu))
    }

    /// Runs `launch`, which the peers may have started to meet: where it fails and the communicator has
    /// peers, is not failed already and `refusal` does not say that nothing of the call reached a peer, the
    /// communicator is aborted, so that no peer waits forever for this rank's part.
    fn launched(
        &self,
        what: &str,
        refusal: impl Fn(&Error) -> bool,
        launch: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        launch().inspect_err(|e| {
            if self.nranks() > 1 && !refusal(e) && self.check_usable().is_ok() {
                log::warn!(
                    "{what} failed after its peers may have started theirs ({}); aborting the communicator",
                    e.message
                );
                let _ = self.abort(ABORTED_BY_FAILED_CALL);
            }
        })
    }

    fn run_collective(&self, call: &Call, sizes: &Sizes, stream: AppStream) -> Result<()> {
        // A broadcast's or a scatter's non-root reads no input, a reduce's or a gather's keeps no output
        // (the size is 0 there).
        // A PreMulSum's scalar in device memory is read by the kernels too.
        let scalar = match call.op.and_then(RedOp::scalar) {
            Some(Scalar::Device(ptr)) => (ptr, call.datatype.size() as u64),
            _ => (0, 0),
        };
        let buffers: [Buffer; 3] = [
            (call.send, sizes.send, Cow::Borrowed("sendbuff")),
            (call.recv, sizes.recv, Cow::Borrowed("recvbuff")),
            (scalar.0, scalar.1, Cow::Borrowed("the PreMulSum operator's scalar")),
        ];
        let Some(gpu) = self.prologue(sizes.piece == 0, &buffers, stream)? else {
            return Ok(());
        };
        self.launched(
            call.function,
            |_| false,
            || {
                self.collectives().launch_collective(
                    self.bootstrap(),
                    &gpu,
                    self,
                    call,
                    sizes,
                    stream,
                    self.registrations(),
                )
            },
        )
    }

    fn run_send_recv(&self, ops: &[SendRecvOp], stream: AppStream) -> Result<()> {
        let work = send_recv::Work::sort(ops, self.rank(), self.nranks())?;
        let buffers: Vec<Buffer> = work
            .buffers
            .iter()
            .map(|m| (m.buffer, m.bytes, Cow::Owned(m.buffer_name())))
            .collect();
        let Some(_gpu) = self.prologue(work.buffers.is_empty(), &buffers, stream)? else {
            return Ok(());
        };
        // Refused before anything is queued: nothing of this call reached a peer.
        if !work.remote.is_empty() && !self.collectives().prepared() {
            return Err(send_recv::not_prepared());
        }
        let what = work.remote.first().map_or("a send or receive", |m| m.function);
        self.launched(
            what,
            |_| false,
            || {
                self.collectives()
                    .launch_send_recv(self.rank(), self.nranks(), &work, stream)
            },
        )
    }

    fn run_one_sided(&self, op: &OneSided, stream: AppStream) -> Result<()> {
        self.check_usable()?;
        self.collectives().check_one_sided_ready(self.nranks())?;
        let empty = matches!(op, OneSided::Wait(w) if signal::merge_waits(w).is_empty());
        let source: Buffer = match op {
            OneSided::Put { src, bytes, .. } => (*src, *bytes, Cow::Borrowed("localbuff")),
            _ => (0, 0, Cow::Borrowed("localbuff")),
        };
        let Some(gpu) = self.prologue(empty, std::slice::from_ref(&source), stream)? else {
            return Ok(());
        };
        // A bad argument (a put's target outside the peer's window) is refused: no peer counts on it.
        let refusal = |e: &Error| e.kind == ErrorKind::InvalidArgument;
        self.launched("a one-sided call", refusal, || {
            self.collectives()
                .launch_one_sided_call(self.bootstrap(), &gpu, self, self.registrations(), op, stream)
        })
    }

    fn run_resume(&self) -> Result<()> {
        self.check_usable()?;
        if !self.collectives().suspended() {
            return Err(Error::invalid_usage(
                "comm is not suspended: a resume follows a suspend",
            ));
        }
        // Asked before the collectives' locks are taken (`destroy` takes this lock, then theirs); an error
        // matters only where there is memory to make again.
        let gpu = self.gpu();
        self.launched(
            "a resume",
            |_| false,
            || self.collectives().resume(self.bootstrap(), gpu),
        )
    }
}

/// Runs a group's work on several communicators: one thread each where there are several, since a
/// communicator's first call waits for its peers, which may be this thread's other communicators (a
/// process that drives several ranks). Each thread has the caller's GPU current. The first error is returned.
pub fn submit_groups(by_comm: &[(Arc<Communicator>, Vec<Submitted>)]) -> Result<()> {
    match by_comm {
        [] => Ok(()),
        [(comm, work)] => comm.submit(work),
        _ => {
            let gpu = GpuContext::current_if_any();
            let errors: Vec<Error> = std::thread::scope(|s| {
                let workers: Vec<_> = by_comm
                    .iter()
                    .map(|(comm, work)| {
                        s.spawn(move || {
                            if let Some(g) = gpu {
                                let _ = g.make_current();
                            }
                            comm.submit(work)
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
            errors.into_iter().next().map_or(Ok(()), Err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::signal::SignalId;
    use crate::collective::{Collective, DataType, SendRecvKind};

    fn stream() -> AppStream {
        // SAFETY: the legacy default stream; these calls are refused or empty, so it is never used.
        unsafe { AppStream::from_raw(0) }
    }

    /// Every kind of work, each empty, so that none needs a GPU once its prologue passes.
    fn empty_work(c: &Communicator) -> Vec<Submitted> {
        let call = Call {
            collective: Collective::AllReduce,
            function: "anAllReduce",
            send: 0,
            recv: 0,
            count: 0,
            datatype: DataType::Float32,
            op: Some(RedOp::Sum),
            root: 0,
        };
        let send = SendRecvOp {
            kind: SendRecvKind::Send,
            function: "aSend",
            peer: 0,
            buffer: 0,
            count: 0,
            datatype: DataType::Float32,
        };
        vec![
            Submitted::collective(c, call, 0, stream()).unwrap(),
            Submitted::send_recv(c, send, stream()).unwrap(),
            Submitted::one_sided(c, OneSided::Wait(Vec::new()), stream()).unwrap(),
        ]
    }

    #[test]
    fn a_suspended_communicator_refuses_every_call_until_its_resume() {
        let c = Communicator::alone();
        let work = empty_work(&c);
        c.submit(&work).unwrap();
        c.suspend_collectives(false).unwrap();
        for w in &work {
            let e = c.submit(std::slice::from_ref(w)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidUsage, "{w:?}");
            assert!(e.message.contains("suspended"), "{w:?}: {e}");
        }
        c.resume_collectives().unwrap();
        c.submit(&work).unwrap();
        assert!(c.check_usable().is_ok(), "a refusal aborts nothing");
        c.destroy();
    }

    #[test]
    fn a_resume_without_a_suspend_is_refused_and_aborts_nothing() {
        let c = Communicator::alone();
        let e = c.resume_collectives().unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("not suspended"), "{e}");
        assert!(c.check_usable().is_ok());
        c.destroy();
    }

    #[test]
    fn an_aborted_communicator_refuses_every_call_with_its_failure() {
        let c = Communicator::alone();
        let work = empty_work(&c);
        c.abort("anAbort").unwrap();
        for w in &work {
            let e = c.submit(std::slice::from_ref(w)).unwrap_err();
            assert!(e.message.contains("by anAbort"), "{w:?}: {e}");
        }
        c.destroy();
    }

    #[test]
    fn bad_arguments_are_refused_where_the_work_is_made() {
        let c = Communicator::alone();
        let mut call = match &empty_work(&c)[0].work {
            Work::Collective { call, .. } => *call,
            _ => unreachable!(),
        };
        call.collective = Collective::Broadcast;
        let e = Submitted::collective(&c, call, 3, stream()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("root is 3"), "{e}");
        let send = SendRecvOp {
            kind: SendRecvKind::Send,
            function: "aSend",
            peer: 0,
            buffer: 0,
            count: 8,
            datatype: DataType::Float32,
        };
        let e = Submitted::send_recv(&c, send, stream()).unwrap_err();
        assert!(e.message.contains("aSend") && e.message.contains("NULL"), "{e}");
        let far = OneSided::Signal {
            peer: 1,
            signal: SignalId { ctx: 0, index: 0 },
        };
        let e = Submitted::one_sided(&c, far, stream()).unwrap_err();
        assert!(e.message.contains("peer is 1"), "{e}");
        c.destroy();
    }
}
