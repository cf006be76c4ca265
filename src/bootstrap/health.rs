//! Whether the peers are alive, and the record of the first failure.
//!
//! Every rank's receive thread sends each of its neighbours (`topology::neighbours`: the ranks `± 2^k` away,
//! at most `2 log2 n`) a heartbeat frame every `Liveness::period` and counts any byte that arrives from a
//! peer as a sign of life. A peer is declared dead when a connection with it closes without a goodbye (a
//! killed process's sockets close at once: every rank connected to it sees that) or when nothing has arrived
//! from a neighbour for `Liveness::timeout` (a stopped process, a lost host or link): each rank is watched by
//! all its neighbours, so it goes unwatched only if every one of them dies too. Heartbeats come from the
//! library's own thread, so a rank whose application threads are idle or busy for hours stays alive.
//!
//! A death is passed on as a notice (to the neighbours of the rank that learned of it, each of which does
//! the same once per dead rank: `topology::spread_to`), so that every rank learns of every death
//! within log2(n) steps, even from a rank it has no connection with; the waits for a dead rank end then
//! (the mailbox closes its link) and its connections are shut down (which ends a send blocked on a stopped
//! rank). The first failure is kept (`PeerFailure`): every later wait fails with it, and the hook the
//! communicator registered runs once, on a thread of its own. An abort is passed on the same way, as the
//! first failure of the rank passing it on only.

use super::endpoint::Bootstrap;
use crate::error::Error;
use parking_lot::Mutex;
use std::fmt;
use std::time::{Duration, Instant};

/// How often heartbeats go out, and how long a peer may stay silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Silence after which a peer is declared dead.
    pub timeout: Duration,
    /// Time between heartbeats: well below the timeout, so that a few lost wake-ups never cause a false
    /// alarm.
    pub period: Duration,
}

impl Liveness {
    pub fn new(timeout: Duration) -> Liveness {
        Liveness {
            timeout,
            period: (timeout / 4).min(Duration::from_secs(1)),
        }
    }

    /// `MSCCLPP_PEER_TIMEOUT`.
    pub fn from_settings() -> Liveness {
        let seconds: u64 = crate::settings::PEER_TIMEOUT.int();
        Liveness::new(Duration::from_secs(seconds))
    }

    /// How long past the timeout `last_heard` is at `now`: `Some(silence)` once the peer is to be declared
    /// dead.
    pub fn overdue(&self, last_heard: Instant, now: Instant) -> Option<Duration> {
        let silence = now.saturating_duration_since(last_heard);
        (silence >= self.timeout).then_some(silence)
    }
}

/// How a failure was noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The connection closed or broke without a goodbye; the text says how.
    ConnectionClosed(String),
    /// Nothing arrived for this long.
    NoHeartbeat(Duration),
    /// Rank `reporter` declared the rank dead and told this one; `how` is its account.
    ReportedBy { reporter: usize, how: String },
    /// The rank's application aborted its communicator, and the rank said so.
    Aborted,
    /// This rank's application aborted the communicator.
    LocalAbort,
}

/// The ways a rank aborts its own communicator, as its errors name them (the bootstrap knows not which
/// call it was: the communicator's own errors name it, see `Communicator::abort`).
const ABORTED_BY: &str = "by this process: an abort or revoke of the communicator, or the process's exit";

/// The first failure a rank learned of. `Display` gives the line that is logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerFailure {
    /// The rank that failed (this rank itself for `LocalAbort`, and when a peer declared this rank dead).
    pub rank: usize,
    /// The rank that learned of it.
    pub observer: usize,
    pub cause: Cause,
    /// How long this rank had not heard from `rank` when it learned of the failure, where known.
    pub silent_for: Option<Duration>,
    /// When this rank learned of it.
    pub detected: Instant,
}

impl PeerFailure {
    /// How it was detected, in words: "connection closed (...)", "no heartbeat for 2.0 s", ...
    pub fn how(&self) -> String {
        match &self.cause {
            Cause::ConnectionClosed(why) => format!("connection closed ({why})"),
            Cause::NoHeartbeat(d) => format!("no heartbeat for {:.1} s", d.as_secs_f64()),
            Cause::ReportedBy { reporter, how } => format!("rank {reporter} reported it ({how})"),
            Cause::Aborted => "it aborted its communicator".into(),
            Cause::LocalAbort => "this rank's own abort".into(),
        }
    }

    /// What aborts a communicator on its own rank: an abort (NCCL's revoke is an abort that keeps the
    /// communicator), a failed call that its peers may have started, a proxy's failure, and the process's
    /// exit with the communicator alive.
    pub fn is_local_abort(&self) -> bool {
        self.cause == Cause::LocalAbort
    }

    /// The error every later wait of the bootstrap returns: `Remote`, naming the failed rank, or
    /// `InvalidUsage` after a local abort (`error_by`, where who aborted is not known here).
    pub fn error(&self) -> Error {
        self.error_by(None)
    }

    /// The one place where a failure becomes an error: the bootstrap's waits, the communicator's calls and
    /// both faces' asynchronous-error queries all report this (`failure::Failed`). `by` names who aborted
    /// this rank's communicator, where the communicator knows it (a face's function, or the core's own
    /// reason); it words a local abort's error and nothing else.
    pub fn error_by(&self, by: Option<&str>) -> Error {
        if self.is_local_abort() {
            let by = by.map_or_else(|| ABORTED_BY.to_string(), |by| format!("by {by}"));
            Error::invalid_usage(format!(
                "rank {}: the communicator was aborted on this rank ({by})",
                self.observer
            ))
        } else {
            Error::remote(format!(
                "rank {} failed ({}{}); the communicator is aborted",
                self.rank,
                self.how(),
                self.last_sign()
            ))
        }
    }

    fn last_sign(&self) -> String {
        self.silent_for
            .map(|d| format!(", {:.1} s after its last sign of life", d.as_secs_f64()))
            .unwrap_or_default()
    }
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_local_abort() {
            write!(
                f,
                "rank {}: the communicator is aborted on this rank ({ABORTED_BY}); data in flight is undefined",
                self.observer
            )
        } else if self.rank == self.observer {
            write!(
                f,
                "rank {}: declared dead by its peers ({}); the communicator is aborted, data in flight is undefined",
                self.observer,
                self.how()
            )
        } else {
            write!(
                f,
                "rank {}: peer rank {} failed: {}{}; the communicator is aborted, data in flight is undefined",
                self.observer,
                self.rank,
                self.how(),
                self.last_sign()
            )
        }
    }
}

/// Called once with the first failure.
pub type FailureHook = Box<dyn FnOnce(&PeerFailure) + Send>;

/// The first failure and the hook waiting for it.
#[derive(Default)]
pub struct Health {
    state: Mutex<HealthState>,
}

#[derive(Default)]
struct HealthState {
    failure: Option<PeerFailure>,
    hook: Option<FailureHook>,
}

impl Health {
    pub fn failure(&self) -> Option<PeerFailure> {
        self.state.lock().failure.clone()
    }

    /// Keeps `failure` if it is the first. Returns the hook to run (if one is registered) inside
    /// `Some` when it was the first, `None` when a failure was already recorded.
    pub fn record(&self, failure: PeerFailure) -> Option<Option<FailureHook>> {
        let mut state = self.state.lock();
        if state.failure.is_some() {
            return None;
        }
        state.failure = Some(failure);
        Some(state.hook.take())
    }

    /// Registers `hook` for the first failure; if there already is one, returns the hook and the failure
    /// for the caller to run now.
    pub fn on_failure(&self, hook: FailureHook) -> Option<(FailureHook, PeerFailure)> {
        let mut state = self.state.lock();
        match &state.failure {
            Some(f) => Some((hook, f.clone())),
            None => {
                state.hook = Some(hook);
                None
            }
        }
    }
}

impl Bootstrap {
    /// The first failure this rank learned of (a peer declared dead, or `abort`), if any. Once there is
    /// one, `send`, `recv`, `barrier` and `all_gather` fail at once with its `error()`.
    pub fn failure(&self) -> Option<PeerFailure> {
        self.shared().health.failure()
    }

    /// Calls `hook` once with the first failure: on a thread of the bootstrap's own when it happens (so the
    /// hook may block briefly without holding up heartbeats), or now, on this thread, if it already
    /// happened. A later registration replaces an earlier one that has not run.
    pub fn on_failure(&self, hook: impl FnOnce(&PeerFailure) + Send + 'static) {
        if let Some((hook, failure)) = self.shared().health.on_failure(Box::new(hook)) {
            hook(&failure);
        }
    }

    /// Aborts locally (`Communicator::abort`): records a local-abort failure unless a failure is already
    /// recorded, fails every wait, and tells every peer, which then aborts as well.
    pub fn abort(&self) {
        self.abort_handle().abort();
    }

    /// What aborts this bootstrap from elsewhere (a proxy thread): `Bootstrap::abort` without the
    /// bootstrap. Never blocks.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            rank: self.rank(),
            shared: self.receiver_shared(),
        }
    }
}

/// A local abort of one bootstrap, to be done from another thread (see `Bootstrap::abort_handle`).
#[derive(Clone)]
pub struct AbortHandle {
    rank: usize,
    shared: std::sync::Arc<super::receiver::Shared>,
}

impl AbortHandle {
    pub fn abort(&self) {
        self.shared.fail(PeerFailure {
            rank: self.rank,
            observer: self.rank,
            cause: Cause::LocalAbort,
            silent_for: None,
            detected: Instant::now(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn heartbeats_go_out_well_within_the_timeout() {
        assert_eq!(Liveness::new(Duration::from_secs(30)).period, Duration::from_secs(1));
        assert_eq!(Liveness::new(Duration::from_secs(2)).period, Duration::from_millis(500));
        assert_eq!(Liveness::new(Duration::from_secs(1)).period, Duration::from_millis(250));
        let l = Liveness::new(Duration::from_secs(2));
        let t0 = Instant::now();
        assert_eq!(l.overdue(t0, t0 + Duration::from_millis(1999)), None);
        assert_eq!(
            l.overdue(t0, t0 + Duration::from_millis(2500)),
            Some(Duration::from_millis(2500))
        );
        // A clock read before the last sign of life is no silence at all.
        assert_eq!(l.overdue(t0 + Duration::from_secs(5), t0), None);
    }

    fn failure(rank: usize, cause: Cause) -> PeerFailure {
        PeerFailure {
            rank,
            observer: 1,
            cause,
            silent_for: Some(Duration::from_millis(2100)),
            detected: Instant::now(),
        }
    }

    #[test]
    fn failures_name_the_rank_the_cause_and_the_silence() {
        let f = failure(3, Cause::NoHeartbeat(Duration::from_millis(2100)));
        assert_eq!(
            f.to_string(),
            "rank 1: peer rank 3 failed: no heartbeat for 2.1 s, 2.1 s after its last sign of life; \
             the communicator is aborted, data in flight is undefined"
        );
        let e = f.error();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(e.message.starts_with("rank 3 failed (no heartbeat"), "{e}");
        let f = failure(
            0,
            Cause::ReportedBy {
                reporter: 2,
                how: "connection closed (peer closed its connection)".into(),
            },
        );
        assert!(
            f.to_string()
                .contains("peer rank 0 failed: rank 2 reported it (connection closed")
        );
        let f = failure(2, Cause::ConnectionClosed("peer closed its connection".into()));
        assert!(f.error().message.contains("connection closed"));
        let f = failure(
            1,
            Cause::ReportedBy {
                reporter: 0,
                how: "no heartbeat for 2.0 s".into(),
            },
        );
        assert!(f.to_string().contains("declared dead by its peers"), "{f}");
        let mut f = failure(1, Cause::LocalAbort);
        f.silent_for = None;
        assert_eq!(f.error().kind, ErrorKind::InvalidUsage);
        assert!(f.to_string().contains("aborted on this rank (by this process"), "{f}");
        assert!(
            f.error().message.contains("aborted on this rank (by this process"),
            "{f}"
        );
        let e = f.error_by(Some("anAbort"));
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert_eq!(
            e.message,
            "rank 1: the communicator was aborted on this rank (by anAbort)"
        );
        // Who aborted words a local abort only: a peer's failure is the peer's.
        let dead = failure(2, Cause::ConnectionClosed("reset".into()));
        assert_eq!(dead.error_by(Some("anAbort")), dead.error());
    }

    #[test]
    fn only_the_first_failure_counts_and_the_hook_runs_once() {
        let h = Health::default();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = ran.clone();
        assert!(
            h.on_failure(Box::new(move |_| {
                r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }))
            .is_none()
        );
        let first = h.record(failure(2, Cause::Aborted)).expect("the first failure");
        first.expect("the registered hook")(&h.failure().unwrap());
        assert!(h.record(failure(3, Cause::Aborted)).is_none());
        assert_eq!(h.failure().unwrap().rank, 2);
        // A hook registered after the failure is handed back to run at once.
        let (late, f) = h.on_failure(Box::new(|_| {})).expect("already failed");
        late(&f);
        assert_eq!(f.rank, 2);
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
