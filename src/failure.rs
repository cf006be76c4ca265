//! The communicator's failure state: what it learns of besides the bootstrap's failure (a proxy's), who
//! aborted it, the parts it aborts once at its first failure, and how that failure is reported.
//!
//! The first failure is reported as one `Failed` (`failed`, from `PeerFailure::error_by`, the one place a
//! failure becomes an error): the error every later call returns, and the kind the asynchronous-error
//! queries report: `Remote` once a peer failed (declared dead by this rank or another, or it aborted its
//! communicator); `InvalidUsage` after this rank's own abort (the communicator may no longer be used);
//! otherwise the kind of a proxy's failure (`Internal`, `Cuda`). Each face maps the kinds onto its own
//! codes, so the NCCL face reports what `mscclppResult_t` cannot say (`Timeout`). `comm.rs` has the
//! communicator's side: its failure hook, its abort, its queries.
//!
//! With `MSCCLPP_ABORT_EXIT_TIMEOUT=S`, the failure hook also starts an `ExitWatch`: a library thread that
//! ends the process with `ABORT_EXIT_STATUS` unless the communicator is destroyed within S seconds of the
//! abort, so that a rank whose kernels never look at the abort still ends and its launcher sees it.

use crate::error::{Error, ErrorKind};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The exit status of a process that `MSCCLPP_ABORT_EXIT_TIMEOUT` ends: 75 is `EX_TEMPFAIL` of
/// `sysexits.h`, "a temporary failure; the user is invited to retry", which is what a job launcher should
/// make of a rank whose peer failed; and it is none of the statuses a shell gives a killed process
/// (128 + signal) nor the usual 1 of a failed program.
pub const ABORT_EXIT_STATUS: i32 = 75;

/// What a call that waits on its peers asks between its waits, and what a set-up asks after its exchange:
/// whether the communicator may still be used (`Err`: its first failure's error). The communicator answers
/// (`Communicator::check_usable`); the collectives ask it without knowing the communicator.
pub trait Usable {
    fn check_usable(&self) -> Result<(), Error>;
}

/// Failures the communicator learns of besides the bootstrap's: a proxy's.
#[derive(Default)]
pub struct FailureState {
    /// The first proxy failure seen; never held during anything that can wait.
    proxy: Mutex<Option<Error>>,
    /// Ends the process if the communicator, once aborted, is not destroyed in time.
    exit_watch: ExitWatch,
    /// Who aborted the communicator on this rank (`Communicator::abort`'s `by`), where that abort was its
    /// first failure.
    aborted_by: Mutex<Option<&'static str>>,
    /// What is aborted at the first failure, and whether that has happened.
    aborts: Mutex<Aborts>,
}

/// A part of a communicator aborted at its first failure (the legacy face's transports and proxies).
pub type AbortPart = Box<dyn Fn() + Send>;

#[derive(Default)]
struct Aborts {
    done: bool,
    parts: Vec<AbortPart>,
}

impl FailureState {
    /// Records a proxy's failure (the first one counts), for the asynchronous error: the proxies' abort
    /// hook (`connections::proxy_abort_hook`) calls this as they fail. Each proxy thread has the hook from
    /// its start, so every failure, its set-up's included, is recorded here.
    pub fn report_proxy_failure(&self, e: Error) {
        self.proxy.lock().get_or_insert(e);
    }

    pub fn proxy_failure(&self) -> Option<Error> {
        self.proxy.lock().clone()
    }

    /// Who aborted the communicator on this rank, if an abort was its first failure.
    pub fn aborted_by(&self) -> Option<&'static str> {
        *self.aborted_by.lock()
    }

    /// Records who aborts the communicator on this rank (the first to say counts).
    pub fn set_aborted_by(&self, by: &'static str) {
        self.aborted_by.lock().get_or_insert(by);
    }

    /// Adds `part` to what the first failure aborts; aborts it now if that has happened.
    pub fn on_abort(&self, part: AbortPart) {
        let mut aborts = self.aborts.lock();
        if aborts.done {
            part();
        }
        aborts.parts.push(part);
    }

    /// Aborts the local work, the first time only: `core` (the collectives), then every part, in the
    /// order they were added. Returns whether this call did it. A caller that comes while another does it
    /// returns once that is done, so that every abort returns with the work aborted.
    pub fn abort_once(&self, core: impl FnOnce()) -> bool {
        let mut aborts = self.aborts.lock();
        if aborts.done {
            return false;
        }
        aborts.done = true;
        core();
        for part in &aborts.parts {
            part();
        }
        true
    }

    /// Starts the `ExitWatch` after `failure`, if `MSCCLPP_ABORT_EXIT_TIMEOUT` is set.
    pub fn watch_exit(&self, rank: usize, failure: &crate::bootstrap::PeerFailure) {
        let seconds: u64 = crate::settings::ABORT_EXIT_TIMEOUT.int();
        if seconds == 0 {
            return;
        }
        let cause = cause_of(failure, self.proxy_failure().as_ref(), self.aborted_by());
        self.exit_watch
            .start(rank, failure.detected, Duration::from_secs(seconds), cause, end_process);
    }

    /// The communicator was destroyed: the process is not to be ended (see `ExitWatch`).
    pub fn destroyed(&self) {
        self.exit_watch.cancel();
    }
}

/// `MSCCLPP_ABORT_EXIT_TIMEOUT`: a thread of the library that ends the process if the communicator, once
/// aborted, is not destroyed in time. Only a thread of the library can do it whatever the application's
/// threads do (blocked in `cudaStreamSynchronize` on a kernel that never ends, asleep, never calling the
/// library again). Started at most once; `cancel` (the communicator's destroy) stops it for good.
#[derive(Default)]
pub struct ExitWatch {
    shared: Arc<ExitWatchShared>,
}

#[derive(Default)]
struct ExitWatchShared {
    state: Mutex<ExitWatchState>,
    cancelled: Condvar,
}

#[derive(Default)]
struct ExitWatchState {
    cancelled: bool,
    thread: Option<JoinHandle<()>>,
}

impl ExitWatch {
    /// Unless `cancel` is called first, at `since + timeout` logs one line at WARN naming `rank`, `cause`
    /// and that it ends the process, then calls `end` (`end_process` in the library). Does nothing if the
    /// watch was started or cancelled before.
    pub fn start(
        &self,
        rank: usize,
        since: Instant,
        timeout: Duration,
        cause: String,
        end: impl FnOnce() + Send + 'static,
    ) {
        let mut state = self.shared.state.lock();
        if state.cancelled || state.thread.is_some() {
            return;
        }
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("mscclpp-exit-{rank}"))
            .spawn(move || {
                crate::logging::set_thread_rank(rank);
                let deadline = since + timeout;
                let mut state = shared.state.lock();
                while !state.cancelled {
                    if shared.cancelled.wait_until(&mut state, deadline).timed_out() {
                        break;
                    }
                }
                if state.cancelled {
                    return;
                }
                // The lock stays held: a destroy that comes now waits, and the process ends anyway.
                log::warn!(
                    "rank {rank}: the communicator was aborted {:.1} s ago ({cause}) and not destroyed within \
                     MSCCLPP_ABORT_EXIT_TIMEOUT ({} s): ending the process with exit status {ABORT_EXIT_STATUS}",
                    since.elapsed().as_secs_f64(),
                    timeout.as_secs()
                );
                end();
            });
        match spawned {
            Ok(thread) => state.thread = Some(thread),
            Err(e) => log::warn!("could not start the thread of MSCCLPP_ABORT_EXIT_TIMEOUT: {e}"),
        }
    }

    /// Stops the watch before it ends the process (and for good), and waits for its thread.
    pub fn cancel(&self) {
        let thread = {
            let mut state = self.shared.state.lock();
            state.cancelled = true;
            self.shared.cancelled.notify_all();
            state.thread.take()
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Ends the process at once with `ABORT_EXIT_STATUS`. `_exit`, not `exit`: `exit` would run the atexit
/// handlers and static destructors while the application's threads go on, and CUDA's own (the runtime
/// destroys its contexts) waits for the kernels that keep the process from ending in the first place, so
/// the process could hang right there. `_exit` ends every thread at once; the kernel's driver frees the
/// GPU contexts, and the peers see the closed connections. What the application had buffered in `stdio`
/// is lost (flushing it could wait on a lock a stuck thread holds); the library's own log line is
/// written and flushed before.
fn end_process() {
    // SAFETY: `_exit` takes no pointers and never returns; ending the process is the point.
    unsafe { libc::_exit(ABORT_EXIT_STATUS) }
}

/// The failure, in words, for the line `ExitWatch` logs: a peer's, a proxy's, or this rank's own abort
/// (named by who aborted, `by`, where known).
fn cause_of(failure: &crate::bootstrap::PeerFailure, proxy: Option<&Error>, by: Option<&str>) -> String {
    match proxy {
        Some(e) if failure.is_local_abort() => e.message.clone(),
        _ if failure.is_local_abort() => by.unwrap_or("this rank's own abort").into(),
        _ if failure.rank == failure.observer => format!("declared dead by its peers: {}", failure.how()),
        _ => format!("peer rank {} failed: {}", failure.rank, failure.how()),
    }
}

/// A communicator's first failure, as both faces report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    /// What every later call that needs the peers returns; its message is the one a face keeps for the
    /// query (NCCL's `ncclGetLastError`).
    pub error: Error,
    /// What the asynchronous-error queries report: the error's kind, but for a proxy's own failure, which
    /// aborts the communicator locally and is reported by its own kind.
    pub reported: ErrorKind,
    /// Whether it is an abort, this rank's own or a peer's, rather than a peer's death: a revoked NCCL
    /// communicator reports no error for one.
    pub aborted: bool,
}

/// The first failure, if any, from the bootstrap's (`peer`), a proxy's (`proxy`) and who aborted this rank
/// (`by`, where known): the error is the bootstrap failure's (`PeerFailure::error_by`) or, before the
/// bootstrap has one, the proxy's (the proxy aborts the bootstrap right after it reports).
pub fn failed(peer: Option<&crate::bootstrap::PeerFailure>, proxy: Option<&Error>, by: Option<&str>) -> Option<Failed> {
    match (peer, proxy) {
        (Some(f), _) => {
            let error = f.error_by(by);
            let reported = match proxy {
                Some(e) if f.is_local_abort() => e.kind,
                _ => error.kind,
            };
            Some(Failed {
                error,
                reported,
                aborted: f.is_local_abort() || f.cause == crate::bootstrap::Cause::Aborted,
            })
        }
        (None, Some(e)) => Some(Failed {
            error: e.clone(),
            reported: e.kind,
            aborted: false,
        }),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{Cause, PeerFailure};
    use std::time::Instant;

    fn failure(cause: Cause) -> PeerFailure {
        PeerFailure {
            rank: 1,
            observer: 0,
            cause,
            silent_for: None,
            detected: Instant::now(),
        }
    }

    #[test]
    fn failures_are_reported_by_what_failed_first() {
        use ErrorKind::*;
        let reported =
            |peer: Option<&PeerFailure>, proxy: Option<&Error>| failed(peer, proxy, None).map(|f| f.reported);
        let cuda = Error::cuda("the copy failed");
        assert_eq!(failed(None, None, Some("anAbort")), None);
        assert_eq!(reported(None, Some(&cuda)), Some(Cuda));
        assert_eq!(reported(None, Some(&Error::internal("x"))), Some(Internal));
        let dead = failure(Cause::NoHeartbeat(std::time::Duration::from_secs(3)));
        assert_eq!(reported(Some(&dead), None), Some(Remote));
        assert_eq!(reported(Some(&dead), Some(&cuda)), Some(Remote));
        assert_eq!(reported(Some(&failure(Cause::Aborted)), None), Some(Remote));
        assert_eq!(reported(Some(&failure(Cause::LocalAbort)), None), Some(InvalidUsage));
        assert_eq!(
            reported(Some(&failure(Cause::LocalAbort)), Some(&cuda)),
            Some(Cuda),
            "a proxy's failure aborts locally: its kind is the one to report"
        );
        // What a later call returns is the bootstrap failure's error, worded once (`error_by`).
        let local = failed(Some(&failure(Cause::LocalAbort)), Some(&cuda), Some("anAbort")).unwrap();
        assert_eq!(local.error, failure(Cause::LocalAbort).error_by(Some("anAbort")));
        assert_eq!(failed(Some(&dead), None, Some("anAbort")).unwrap().error, dead.error());
        // Aborts, this rank's or a peer's, are told apart from deaths (a revoked NCCL communicator's test).
        let aborted = |f: &PeerFailure| failed(Some(f), None, None).unwrap().aborted;
        assert!(aborted(&failure(Cause::LocalAbort)) && aborted(&failure(Cause::Aborted)));
        assert!(!aborted(&dead) && !aborted(&failure(Cause::ConnectionClosed("reset".into()))));
        assert!(!failed(None, Some(&cuda), None).unwrap().aborted);
    }

    /// An `ExitWatch` whose `end` reports on a channel instead of ending the test process.
    fn watch(timeout_ms: u64) -> (ExitWatch, std::sync::mpsc::Receiver<Instant>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let w = ExitWatch::default();
        w.start(
            0,
            Instant::now(),
            Duration::from_millis(timeout_ms),
            "a test".into(),
            move || {
                let _ = tx.send(Instant::now());
            },
        );
        (w, rx)
    }

    #[test]
    fn an_exit_watch_ends_at_its_deadline_once() {
        let start = Instant::now();
        let (w, rx) = watch(100);
        // A second start (the failure hook and an abort may both get here) changes nothing.
        w.start(0, start, Duration::from_millis(1), "again".into(), || {
            panic!("started twice")
        });
        let ended = rx.recv_timeout(Duration::from_secs(10)).expect("the watch never ended");
        assert!(
            ended - start >= Duration::from_millis(100),
            "ended early: {:?}",
            ended - start
        );
        w.cancel();
        assert!(rx.try_recv().is_err(), "ended once");
    }

    #[test]
    fn a_cancelled_exit_watch_never_ends_and_leaves_no_thread() {
        let (w, rx) = watch(200);
        w.cancel();
        assert!(w.shared.state.lock().thread.is_none(), "the thread was joined");
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "ended after a cancel"
        );
        // Cancelled for good: a later start does nothing.
        w.start(0, Instant::now(), Duration::ZERO, "late".into(), || {
            panic!("started after a cancel")
        });
        assert!(w.shared.state.lock().thread.is_none());
        // Dropping a watch cancels it too.
        let (w, rx) = watch(200);
        drop(w);
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "ended after a drop"
        );
    }

    #[test]
    fn the_exit_line_names_the_failure() {
        let dead = PeerFailure {
            rank: 3,
            ..failure(Cause::ConnectionClosed("reset".into()))
        };
        assert_eq!(
            cause_of(&dead, None, Some("anAbort")),
            "peer rank 3 failed: connection closed (reset)",
            "who aborts names only this rank's own abort"
        );
        let local = failure(Cause::LocalAbort);
        let mine = PeerFailure {
            rank: 0,
            ..local.clone()
        };
        // Named by who aborted: the face's function, which the face passes.
        assert_eq!(cause_of(&mine, None, Some("anAbort")), "anAbort");
        assert_eq!(cause_of(&mine, None, None), "this rank's own abort");
        let stuck = Error::invalid_usage("rank 0: a kernel's wait() ...");
        assert_eq!(
            cause_of(&local, Some(&stuck), Some("anAbort")),
            stuck.message,
            "a proxy's own abort says why"
        );
        let me = PeerFailure {
            rank: 0,
            ..failure(Cause::NoHeartbeat(Duration::from_secs(2)))
        };
        assert_eq!(
            cause_of(&me, None, None),
            "declared dead by its peers: no heartbeat for 2.0 s"
        );
    }

    #[test]
    fn the_first_proxy_failure_stays() {
        let s = FailureState::default();
        assert_eq!(s.proxy_failure(), None);
        s.report_proxy_failure(Error::cuda("first"));
        s.report_proxy_failure(Error::internal("second"));
        assert_eq!(s.proxy_failure().unwrap().message, "first");
    }
}
