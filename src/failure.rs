//! The communicator's failure state: what `mscclppCommGetAsyncError` reports, what `mscclppCommAbort`
//! does, and how a failure the bootstrap detects reaches the transports.
//!
//! The bootstrap keeps the first failure (`bootstrap::PeerFailure`: a peer declared dead, or a local
//! abort; see `bootstrap/health.rs`). When it happens, the hook installed by `watch_failures` runs on a
//! library thread and calls `Communicator::abort_transports`, the one place where the communicator tells
//! its transports and proxies to abort. From then on every call that needs the peers fails at once with
//! the failure's error (`check_usable`).
//!
//! Async error values: `mscclppSuccess`; `mscclppRemoteError` once a peer failed (declared dead by this
//! rank or another, or it aborted its communicator); `mscclppInvalidUsage` after this rank's own
//! `mscclppCommAbort` (the communicator may no longer be used); otherwise the code of a proxy's failure
//! (`mscclppInternalError`, `mscclppUnhandledCudaError`).

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::types::mscclppResult_t;
use parking_lot::Mutex;
use std::sync::Arc;

/// What `mscclppCommGetAsyncError` gives after this rank's own `mscclppCommAbort`.
pub const LOCAL_ABORT_RESULT: mscclppResult_t = mscclppResult_t::mscclppInvalidUsage;

/// Failures the communicator learns of besides the bootstrap's: a proxy's.
#[derive(Default)]
pub struct FailureState {
    /// The first proxy failure seen; never held during anything that can wait.
    proxy: Mutex<Option<Error>>,
}

impl FailureState {
    /// Records a proxy's failure (the first one counts), for `mscclppCommGetAsyncError`: the proxies' abort
    /// hook (`proxy_abort_hook`) calls this as they fail. Each proxy thread has the hook from its start, so
    /// every failure, its set-up's included, is recorded here.
    pub fn report_proxy_failure(&self, e: Error) {
        self.proxy.lock().get_or_insert(e);
    }

    pub fn proxy_failure(&self) -> Option<Error> {
        self.proxy.lock().clone()
    }
}

/// What a proxy of this communicator calls when it wants the communicator aborted (on the proxy thread,
/// so it takes no lock the application may hold): records why, logs it with the connection's peer and
/// tag (`peers`, by connection index), and aborts the bootstrap, whose failure hook then aborts every
/// transport and whose peers are told.
pub fn proxy_abort_hook(
    rank: usize,
    failures: Arc<FailureState>,
    bootstrap: crate::bootstrap::AbortHandle,
    peers: Vec<(usize, i32)>,
) -> crate::proxy::AbortHook {
    Arc::new(move |cause| {
        let error = match cause {
            crate::proxy::AbortCause::StuckWait(w) => {
                let whose = peers
                    .get(w.conn_id as usize)
                    .map_or(String::from("an unknown peer"), |(peer, tag)| {
                        format!("peer rank {peer}, tag {tag}")
                    });
                Error::invalid_usage(format!(
                    "rank {rank}: a kernel's {w} ({whose}); the communicator is aborted"
                ))
            }
            crate::proxy::AbortCause::Failure(e) => Error::new(
                e.kind,
                format!(
                    "rank {rank}: a proxy failed ({}); the communicator is aborted",
                    e.message
                ),
            ),
        };
        log::warn!("{}", error.message);
        failures.report_proxy_failure(error);
        bootstrap.abort();
    })
}

/// The async error for the bootstrap's failure (if any) and a proxy's failure (if any). A proxy's own
/// failure (or a stuck wait it reported) aborts the bootstrap locally, so its code comes first then.
pub fn async_error(peer: Option<&crate::bootstrap::PeerFailure>, proxy: Option<&Error>) -> mscclppResult_t {
    match (peer, proxy) {
        (Some(f), Some(e)) if f.is_local_abort() => e.code(),
        (Some(f), _) if f.is_local_abort() => LOCAL_ABORT_RESULT,
        (Some(_), _) => mscclppResult_t::mscclppRemoteError,
        (None, Some(e)) => e.code(),
        (None, None) => mscclppResult_t::mscclppSuccess,
    }
}

impl Communicator {
    /// Has the bootstrap's first failure abort this communicator's transports, from the bootstrap's
    /// failure thread. Called once the communicator is shared (it holds only a weak reference, so a
    /// destroyed communicator is left alone).
    pub fn watch_failures(self: &Arc<Self>) {
        let comm = Arc::downgrade(self);
        self.bootstrap().on_failure(move |failure| {
            if let Some(comm) = comm.upgrade() {
                comm.abort_transports(failure);
            }
        });
    }

    /// `mscclppCommAbort`: aborts the bootstrap (every wait fails, the peers are told and abort too) and
    /// the transports. Returns at once; the communicator must still be destroyed.
    pub fn abort(&self) -> Result<()> {
        self.bootstrap().abort();
        let failure = self
            .bootstrap()
            .failure()
            .ok_or_else(|| Error::internal("the bootstrap recorded no failure after an abort"))?;
        self.abort_transports(&failure);
        Ok(())
    }

    /// `mscclppCommGetAsyncError`: never waits.
    pub fn async_error(&self) -> mscclppResult_t {
        async_error(
            self.bootstrap().failure().as_ref(),
            self.failures().proxy_failure().as_ref(),
        )
    }

    /// The first failure's error, if there was one: every call that needs the peers starts with this.
    pub fn check_usable(&self) -> Result<()> {
        match self.bootstrap().failure() {
            Some(f) => Err(f.error()),
            None => Ok(()),
        }
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
    fn async_errors_by_what_failed_first() {
        use mscclppResult_t::*;
        let cuda = Error::cuda("the copy failed");
        assert_eq!(async_error(None, None), mscclppSuccess);
        assert_eq!(async_error(None, Some(&cuda)), mscclppUnhandledCudaError);
        assert_eq!(async_error(None, Some(&Error::internal("x"))), mscclppInternalError);
        let dead = failure(Cause::NoHeartbeat(std::time::Duration::from_secs(3)));
        assert_eq!(async_error(Some(&dead), None), mscclppRemoteError);
        assert_eq!(async_error(Some(&dead), Some(&cuda)), mscclppRemoteError);
        assert_eq!(async_error(Some(&failure(Cause::Aborted)), None), mscclppRemoteError);
        assert_eq!(async_error(Some(&failure(Cause::LocalAbort)), None), LOCAL_ABORT_RESULT);
        assert_eq!(
            async_error(Some(&failure(Cause::LocalAbort)), Some(&cuda)),
            mscclppUnhandledCudaError,
            "a proxy's failure aborts locally: its code is the one to report"
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
