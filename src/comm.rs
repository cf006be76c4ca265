//! The communicator: one rank's bootstrap, its GPU, its collectives and registered buffers, and what it
//! does at its first failure. Both faces' communicators are this one; the legacy face adds its
//! connections (`connections.rs`), which the core knows only as a part to abort.
//!
//! Its failures (`failure.rs`): the bootstrap keeps the first (`bootstrap::PeerFailure`: a peer declared
//! dead, or a local abort; see `bootstrap/health.rs`). When it happens, the hook installed by
//! `watch_failures` runs on a library thread and aborts the communicator's local work once
//! (`abort_local`): the collectives' kernels are released and every part added with
//! `FailureState::on_abort` (the legacy face's proxies) is aborted. From then on every call that needs the
//! peers fails at once with the failure's error (`check_usable`), and both faces' queries report it
//! (`failed`).
//!
//! The core names no face: whoever aborts the communicator says who it is (`abort`'s `by`, a face's
//! exported function or the core's own reason), and the errors and the exit line name that.

use crate::bootstrap::{Bootstrap, PeerFailure, RootAddress, UniqueId};
use crate::collective::Collectives;
use crate::error::{Error, Result};
use crate::failure::{Failed, FailureState, Usable};
use crate::gpu::{DevicePtr, GpuContext};
use crate::registration::{Kind, Registrations};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

pub struct Communicator {
    rank: usize,
    nranks: usize,
    bootstrap: Bootstrap,
    /// Its GPU: the one current on the creating thread, or else the first call's that needs one.
    gpu: Mutex<Option<GpuContext>>,
    /// Failures besides the bootstrap's (see `failure.rs`).
    failures: Arc<FailureState>,
    /// The collectives (all-reduce and the others, of both faces), set up at the first call.
    collectives: Collectives,
    /// Buffers registered with it (either face's registrations, and NCCL's windows).
    registrations: Registrations,
}

impl Communicator {
    /// Rank 0 listens at `address`, everyone meets there.
    pub fn init_by_address(nranks: usize, address: &str, rank: usize, timeout: Duration) -> Result<Communicator> {
        let root_addr = RootAddress::parse(address)?;
        let bootstrap = Bootstrap::connect_to_address(&root_addr, rank, nranks, timeout)?;
        Ok(Self::with_bootstrap(bootstrap))
    }

    /// Everyone meets at the root named in the id.
    pub fn init_by_id(nranks: usize, id: &UniqueId, rank: usize, timeout: Duration) -> Result<Communicator> {
        let bootstrap = Bootstrap::connect_to_id(id, rank, nranks, timeout)?;
        Ok(Self::with_bootstrap(bootstrap))
    }

    fn with_bootstrap(bootstrap: Bootstrap) -> Communicator {
        // The communicator's GPU is the one current on the creating thread, if that thread has one;
        // otherwise it is decided by the first call that needs a GPU.
        let gpu = GpuContext::current_if_any();
        log::info!(
            "communicator ready: rank {} of {} (libmscclpp {}, built from commit {})",
            bootstrap.rank(),
            bootstrap.nranks(),
            env!("CARGO_PKG_VERSION"),
            crate::BUILD_COMMIT
        );
        crate::settings::log_in_effect();
        Communicator {
            rank: bootstrap.rank(),
            nranks: bootstrap.nranks(),
            bootstrap,
            gpu: Mutex::new(gpu),
            failures: Arc::default(),
            collectives: Collectives::default(),
            registrations: Registrations::default(),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }
    pub fn failures(&self) -> &FailureState {
        &self.failures
    }
    /// Its failures, to be reported from another thread (a proxy's abort hook).
    pub fn failures_arc(&self) -> Arc<FailureState> {
        self.failures.clone()
    }
    /// Its collectives (the executor's, `pipeline/`, which launches every call through them).
    pub(crate) fn collectives(&self) -> &Collectives {
        &self.collectives
    }
    /// Its registered buffers. Usable in every state, aborted included: registering involves no peer,
    /// and deregistering must stay possible for the application's clean-up.
    pub fn registrations(&self) -> &Registrations {
        &self.registrations
    }

    /// Its GPU, made current on the calling thread: the one it has, or else the calling thread's, which
    /// becomes its own.
    pub fn gpu(&self) -> Result<GpuContext> {
        let mut gpu = self.gpu.lock();
        if let Some(g) = *gpu {
            g.make_current()?;
            return Ok(g);
        }
        let g = GpuContext::current()?;
        *gpu = Some(g);
        Ok(g)
    }

    /// Its GPU, if it has one yet (nothing is made current).
    pub fn gpu_if_any(&self) -> Option<GpuContext> {
        *self.gpu.lock()
    }

    /// Has the bootstrap's first failure abort this communicator's local work, from the bootstrap's
    /// failure thread. Called once the communicator is shared (it holds only a weak reference, so a
    /// destroyed communicator is left alone).
    pub fn watch_failures(self: &Arc<Self>) {
        let comm = Arc::downgrade(self);
        self.bootstrap.on_failure(move |failure| {
            if let Some(comm) = comm.upgrade() {
                comm.failures.watch_exit(comm.rank, failure);
                comm.abort_local(failure);
            }
        });
    }

    /// Aborts the communicator's local work after `failure` (a peer's, this rank's abort or a proxy's
    /// report), once whoever comes first (the failure hook, or `abort` on this thread): the collectives'
    /// kernels are released (`Collectives::abort`), then every part added with `FailureState::on_abort`.
    fn abort_local(&self, failure: &PeerFailure) {
        if self.failures.abort_once(|| self.collectives.abort()) {
            log::info!("transports aborted after the failure ({})", failure.how());
        }
    }

    /// Aborts the bootstrap (every wait fails, the peers are told and abort too) and the local work.
    /// Returns at once, the local work aborted; the communicator must still be destroyed. `by` says who
    /// aborts, for the errors of later calls and the exit line: a face's exported function
    /// (`ncclCommAbort`, ...) or the core's own reason (a failed call its peers may have started).
    pub fn abort(&self, by: &'static str) -> Result<()> {
        if self.bootstrap.failure().is_none() {
            self.failures.set_aborted_by(by);
        }
        self.bootstrap.abort();
        let failure = self
            .bootstrap
            .failure()
            .ok_or_else(|| Error::internal("the bootstrap recorded no failure after an abort"))?;
        self.abort_local(&failure);
        Ok(())
    }

    /// The first failure, if any: what the asynchronous-error queries report (`Failed::reported`) and what
    /// every call that needs the peers returns (`check_usable`). Never waits.
    pub fn failed(&self) -> Option<Failed> {
        crate::failure::failed(
            self.bootstrap.failure().as_ref(),
            self.failures.proxy_failure().as_ref(),
            self.failures.aborted_by(),
        )
    }

    /// The first failure's error, if there was one: every call that needs the peers starts with this.
    pub fn check_usable(&self) -> Result<()> {
        self.failed().map_or(Ok(()), |f| Err(f.error))
    }

    /// Registers `[buff, buff + size)` (either face's registrations, and NCCL's windows): recorded
    /// here, and exported to the peers for the zero-copy collectives (`Collectives::registered`).
    pub fn register(&self, buff: DevicePtr, size: usize, kind: Kind, library_memory: bool) -> Result<u64> {
        let (token, registration) = self.registrations.register(buff, size, kind, library_memory)?;
        // Exporting needs the communicator's context current (the calling thread may have another).
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = self.gpu();
        match gpu {
            Ok(_) => {
                let window = self.registrations.window_ordinal(token).unwrap_or(0);
                self.collectives
                    .registered(&self.bootstrap, token, &registration, window)
            }
            Err(e) => log::info!("registration {token:#x} is not zero-copy: {}", e.message),
        }
        Ok(token)
    }

    /// Forgets a registration (`Registrations::deregister`); the peers are told.
    pub fn deregister(&self, token: u64, kind: Kind, what: &str) -> Result<()> {
        self.registrations.deregister(token, kind, what)?;
        self.collectives.deregistered(&self.bootstrap, token);
        Ok(())
    }

    /// Sets the collectives up now (collective: every rank calls it), so that send and receive can follow;
    /// see `Collectives::prepare`.
    /// Limits every collective launch to `blocks` blocks (NCCL's `maxCTAs`), from the collectives' set-up
    /// on (`Collectives::limit_ctas`).
    pub fn limit_ctas(&self, blocks: u32) {
        self.collectives.limit_ctas(blocks);
    }

    pub fn prepare_collectives(&self) -> Result<()> {
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = self.gpu()?;
        self.collectives.prepare(&self.bootstrap, &gpu)
    }

    /// Suspends the collectives (`Collectives::suspend`), releasing their device memory
    /// where `release_memory` says so. Local: each rank frees its own.
    pub fn suspend_collectives(&self, release_memory: bool) -> Result<()> {
        self.check_usable()?;
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = self.gpu_if_any();
        self.collectives.suspend(gpu.as_ref(), release_memory)
    }

    /// Whether the collectives are suspended.
    pub fn collectives_suspended(&self) -> bool {
        self.collectives.suspended()
    }

    /// The device memory the communicator holds: the collectives' (released by a suspend). The legacy
    /// face's connections hold epoch blocks too, but that face reports no memory (NCCL's
    /// `ncclCommMemStats` asks this, and an NCCL communicator has no connections).
    pub fn device_memory(&self) -> crate::collective::suspend::DeviceMemory {
        self.collectives.device_memory()
    }

    /// Where byte `offset` of rank `peer`'s registration of this rank's window `token` is in this process
    /// (`peer` may be this rank): see `Collectives::window_pointer`.
    pub fn window_pointer(&self, token: u64, offset: u64, peer: usize) -> Result<DevicePtr> {
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = self.gpu()?;
        self.collectives
            .window_pointer(&self.bootstrap, &gpu, self, &self.registrations, token, offset, peer)
    }

    /// Releases everything the core holds: the collectives, the registrations still held, the GPU. The
    /// legacy face releases its connections first (`Connections::destroy`).
    pub fn destroy(&self) {
        let mut gpu = self.gpu.lock();
        if let Some(g) = *gpu {
            let _ = g.make_current();
        }
        self.collectives.clear();
        let registered = self.registrations.clear();
        if registered > 0 {
            log::info!("{registered} registration(s) still held were freed with the communicator");
        }
        if let Some(g) = gpu.take() {
            g.release();
        }
        // Destroyed: an abort no longer ends the process (`MSCCLPP_ABORT_EXIT_TIMEOUT`).
        self.failures.destroyed();
    }
}

#[cfg(test)]
impl Communicator {
    /// A communicator of one rank, its failures watched as a face's are (for the core's tests: it needs no
    /// GPU until a call does).
    pub(crate) fn alone() -> Arc<Communicator> {
        let t = Duration::from_secs(30);
        let id = UniqueId::create(t).unwrap();
        let c = Arc::new(Communicator::init_by_id(1, &id, 0, t).unwrap());
        c.watch_failures();
        c
    }
}

impl Usable for Communicator {
    fn check_usable(&self) -> Result<()> {
        Communicator::check_usable(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_local_abort_is_named_by_who_aborted_first() {
        let c = Communicator::alone();
        c.check_usable().unwrap();
        c.abort("anAbort").unwrap();
        let e = c.check_usable().unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("aborted on this rank (by anAbort)"), "{e}");
        c.abort("aSecondAbort").unwrap();
        assert_eq!(c.check_usable().unwrap_err(), e, "the first abort is the one named");
        assert_eq!(c.failures().aborted_by(), Some("anAbort"));
        c.destroy();
    }

    #[test]
    fn a_local_abort_aborts_the_local_work_once() {
        let c = Communicator::alone();
        let aborted = Arc::new(AtomicUsize::new(0));
        let count = aborted.clone();
        c.failures().on_abort(Box::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        // The abort itself, and the failure hook it sets off on the bootstrap's thread: one abort.
        c.abort("anAbort").unwrap();
        assert_eq!(aborted.load(Ordering::SeqCst), 1, "aborted before abort returns");
        c.abort("aSecondAbort").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(aborted.load(Ordering::SeqCst), 1, "aborted once");
        // A part added after the abort is aborted at once.
        let late = Arc::new(AtomicUsize::new(0));
        let count = late.clone();
        c.failures().on_abort(Box::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(late.load(Ordering::SeqCst), 1);
        c.destroy();
    }
}
