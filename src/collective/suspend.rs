//! Suspending a communicator's collectives (NCCL's suspend and resume, `nccl/suspend.rs`): their device
//! memory released while the communicator is idle, and made again, by every rank together, when it
//! resumes.
//!
//! What a suspend releases: this rank's scratch (one allocation: its two slots and the areas that follow
//! them, send and receive's among them) and the mappings of the peers' scratch (which is what lets a peer's
//! memory go once every rank that mapped it has suspended), the kernels' state words, and one rank's loaded
//! kernels with its signal area of the one-sided calls (made again at its next one). What it keeps, because
//! it holds no device memory of ours or must outlive the suspension, or because making it again would not
//! be safe: the loaded kernels of a communicator of several ranks (`kernels::Units`), the abort
//! word (pinned host memory, so that an abort still ends every wait), this rank's registrations and their
//! export to the peers, the peers' registered buffers mapped here for zero-copy with their table (pinned
//! host memory; the buffers are the peers' own, which their registrations keep alive anyway), and the copy
//! engine's streams.
//!
//! A suspend is local: each rank frees its own. A resume is collective: the scratch is made again as at the
//! set-up (`Scratch::set_up`: the new handles exchanged over the bootstrap), because send and receive need
//! every peer's p2p area mapped before the first of them, which need not involve every rank. Every rank
//! makes its memory zeroed, so the epochs the kernels count on the GPU start again from 0 on every rank
//! alike; the host keeps no count of its own that could then disagree. A resume makes the memory again
//! after a suspend that released nothing (flags 0) as well, so that ranks that passed different flags still
//! meet in the same exchange.
//!
//! CUDA graphs captured before a suspend name the memory and the kernels it released (the addresses of the
//! scratch made again differ): such a graph must not be replayed after the resume; capture it again.

use super::Collectives;
use super::copy_engine::SideStreams;
use super::kernel_args::STATE_ZC_CALLS;
use super::kernels::Units;
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;

/// What a suspend keeps of the collectives' set-up for the resume: the parts that hold no device memory of
/// this rank's. (The peers' registered buffers mapped here stay where they are, with `ZeroCopy`.)
pub(super) struct Kept {
    pub side_streams: SideStreams,
    /// The loaded kernels: loading them again at the resume could not be done before every peer's
    /// kernels may run (`kernels::Units`), and they hold no memory a suspend is asked to release.
    pub units: Units,
}

/// A suspension, until the resume.
pub(super) struct Suspension {
    /// What was kept of the set-up the suspend released; `None` where nothing was set up, or where nothing
    /// was released (flags 0: the set-up is still in `ready`).
    kept: Option<Kept>,
    /// Whether the memory was released (`NCCL_SUSPEND_MEM`).
    released: bool,
}

/// The device memory a communicator's collectives hold (what NCCL's memory statistics report), counted
/// from the allocations themselves. The loaded kernels' code is not counted: the driver does not say how
/// much device memory a loaded module takes (a suspend keeps it, see the module's doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Bytes held now that a suspend releases: the scratch and the state words, or one rank's signal area
    /// (0 while suspended with `NCCL_SUSPEND_MEM`: nothing is left to release).
    pub releasable: u64,
    /// Bytes held now that a suspend keeps.
    pub persistent: u64,
    /// Whether a suspend released the memory and no resume has come since.
    pub released: bool,
}

impl DeviceMemory {
    /// Everything held now.
    pub fn total(&self) -> u64 {
        self.releasable + self.persistent
    }
}

/// The refusal of work on suspended collectives (the face that suspends refuses work first, in its own
/// words; this is for work it queued before).
fn suspended_error() -> Error {
    Error::invalid_usage("comm is suspended: no work may be issued on it until every rank has resumed it")
}

impl Collectives {
    /// Whether the collectives are suspended (from `suspend` until `resume`).
    pub fn suspended(&self) -> bool {
        self.suspended.lock().is_some()
    }

    /// Refuses work while suspended.
    pub fn check_not_suspended(&self) -> Result<()> {
        if self.suspended() {
            return Err(suspended_error());
        }
        Ok(())
    }

    /// Suspends the collectives: every call is refused until `resume`. With `release_memory`, their device
    /// memory is released now: `gpu` (the communicator's context, `None` where it never had one, and so
    /// nothing to release) is synchronized first, so that no kernel of this rank still uses it (the
    /// application has synchronized its work on the communicator, as NCCL asks, and the frees would wait
    /// for the device anyway). Local: no peer is involved.
    pub fn suspend(&self, gpu: Option<&GpuContext>, release_memory: bool) -> Result<()> {
        let mut ready = self.ready.lock();
        let mut suspended = self.suspended.lock();
        if suspended.is_some() {
            return Err(Error::invalid_usage(
                "comm is already suspended; only a resume ends a suspension",
            ));
        }
        let mut kept = None;
        if release_memory {
            let mut solo = self.solo.lock();
            let mut one_sided = self.one_sided_solo.lock();
            if let Some(gpu) = gpu.filter(|_| ready.is_some() || solo.is_some() || one_sided.is_some()) {
                gpu.synchronize()?;
            }
            if let Some(r) = ready.take() {
                match r.scratch.state.read_u64((STATE_ZC_CALLS * 8) as u64) {
                    Ok(0) => {}
                    Ok(n) => log::info!("collectives: {n} call(s) moved their data zero-copy before this suspend"),
                    Err(e) => log::debug!("the zero-copy count could not be read: {e}"),
                }
                let released = r.scratch.device_bytes();
                kept = Some(release(r));
                log::info!("collectives suspended: {released} bytes of device memory released");
            }
            solo.take();
            // One rank's signal area: made again at its next one-sided call.
            one_sided.take();
        } else {
            log::info!("collectives suspended (nothing released: flags 0)");
        }
        *suspended = Some(Suspension {
            kept,
            released: release_memory,
        });
        Ok(())
    }

    /// Resumes suspended collectives: collective, every rank calls it. Their memory is made again as at the
    /// set-up (zeroed, the handles exchanged over the bootstrap) wherever this rank had set them up before,
    /// whatever the suspend released; the kernels loaded before are kept. `gpu` is the communicator's
    /// context (asked before these locks are taken). A failed resume leaves the collectives suspended, and
    /// the executor (`pipeline/execute.rs`) aborts the communicator, so that the peers that may be in the
    /// set-up's exchange are not left waiting for this rank.
    pub fn resume(&self, bootstrap: &Bootstrap, gpu: Result<GpuContext>) -> Result<()> {
        let mut ready = self.ready.lock();
        let mut suspended = self.suspended.lock();
        let Some(suspension) = suspended.take() else {
            return Err(Error::invalid_usage(
                "comm is not suspended: a resume follows a suspend",
            ));
        };
        if ready.is_none() && suspension.kept.is_none() {
            // Nothing was set up on this rank (one rank, or no GPU driver): nothing to make again.
            return Ok(());
        }
        let made = gpu.and_then(|gpu| {
            let kept = match ready.take() {
                // A suspend of flags 0 kept everything: released now, to be made again with the peers'.
                Some(r) => {
                    gpu.synchronize()?;
                    release(r)
                }
                None => suspension
                    .kept
                    .ok_or_else(|| Error::internal("a suspension that kept nothing of a set-up"))?,
            };
            self.set_up(bootstrap, &gpu, Some(kept))
        });
        match made {
            Ok(r) => {
                log::info!(
                    "collectives resumed: {} bytes of device memory made again",
                    r.scratch.device_bytes()
                );
                *ready = Some(r);
                Ok(())
            }
            Err(e) => {
                // What the suspend kept goes, as it would with a set-up that failed.
                self.zero_copy.drop_peers();
                *suspended = Some(Suspension {
                    kept: None,
                    released: ready.is_none(),
                });
                Err(e)
            }
        }
    }

    /// The device memory the collectives hold now (`DeviceMemory`): nothing before they are set up.
    pub fn device_memory(&self) -> DeviceMemory {
        let ready = self.ready.lock();
        let suspended = self.suspended.lock();
        let one_sided = self.one_sided_solo.lock().as_ref().map_or(0, |s| s.device_bytes());
        DeviceMemory {
            releasable: ready.as_ref().map_or(0, |r| r.scratch.device_bytes()) + one_sided,
            persistent: 0,
            released: suspended.as_ref().is_some_and(|s| s.released),
        }
    }
}

/// Frees what a suspend releases of `ready` (the scratch) and keeps the rest (the loaded kernels among it).
fn release(ready: super::Ready) -> Kept {
    drop(ready.scratch);
    Kept {
        side_streams: ready.side_streams,
        units: ready.kernels.into_units(),
    }
}
