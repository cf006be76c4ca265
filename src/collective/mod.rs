//! Collectives: all-reduce, all-gather, reduce-scatter and broadcast (and the rest of NCCL's), and send and
//! receive, over any device buffers of the communicator's GPU, on the application's stream, capturable in
//! CUDA graphs.
//!
//! The host side lives here, the device side in `kernels/collectives/` (one file per algorithm, built by
//! `make` into fatbins embedded in the library):
//! - `call.rs`: a call's arguments, checked, and its byte sizes;
//! - `datatype.rs`: element types and reduction operators (NCCL's fp8 types and `PreMulSum` among them);
//! - `algorithm.rs`: the table that picks an algorithm by collective and size, the windows a large call is
//!   cut into, and the grid;
//! - `scratch.rs`: the scratch buffers peers write into, mapped on every rank at the first call (or at
//!   `prepare`), with the send/receive areas of send and receive;
//! - `send_recv.rs`: send and receive: a group's sends and receives checked, matched with themselves where
//!   they name this rank, and carried by one launch; `send_recv_collectives.rs`: the collectives carried
//!   as such launches (gather, scatter, all-to-all, the chains of broadcast and reduce, and two GPUs'
//!   all-gather, reduce-scatter and all-reduce at the sizes it names);
//! - `hosts.rs`: how the ranks sit on hosts (each host's ranks, local indices, rails), for collectives across
//!   hosts;
//! - `plan.rs`: the planner, pure: a group's work in the order it is issued, the paths a collective may
//!   take (the copy engine, zero-copy, sends and receives, the scratch algorithm), its scratch windows;
//! - `launch.rs`: where a checked collective becomes launches (`Collectives::launch_collective`, run by
//!   `pipeline/`): the set-up at the first call, then the first planned path that does not decline;
//! - `variants.rs`: the kernels' variants (types, operators, kernels; `kernels/variants.rs`, which build.rs
//!   generates the kernels' units and the table of their entry points from);
//! - `kernels.rs`: the embedded fatbins, loaded into the communicator's context at first use, and the
//!   entry point of each launch, looked up in that table;
//! - `kernel_args.rs`: the kernels' one argument (defined in `kernels/coll_args.rs`, which the device side's
//!   `CollArgs` is generated from);
//! - `abort_word.rs`: the word the kernels poll while they wait, raised at an abort;
//! - `process_exit.rs`: a process's `exit()` ends the kernels it leaves waiting (it raises their abort words);
//! - `suspend.rs`: their device memory released while the communicator is suspended, and made again at the
//!   resume (NCCL's `ncclCommSuspend` / `ncclCommResume`);
//! - `zero_copy/`: registered buffers exported to the peers, mapped there, and the calls that read and
//!   write them directly (docs/ZERO_COPY.md): `zero_copy/mod.rs` decides which calls try it and owns this
//!   rank's exported slots and the peers' mappings; `copy_engine.rs`: eager all-gathers and broadcasts on
//!   registered buffers whose data the copy engines move;
//! - `signal.rs`: NCCL's one-sided calls (puts into the peers' windows, signals, waits) and the peers'
//!   window pointers.
//!
//! Every launch is one epoch of a counter the kernels keep on the GPU, so that a replayed graph goes on
//! counting; calls on one communicator must be ordered (one stream, or streams the application orders),
//! as with NCCL. A rank with one GPU per rank of the same machine (or several ranks per GPU) is assumed:
//! peers' scratch is reached through CUDA IPC (P2P over NVLink or PCIe); peers on other machines get a
//! "not supported yet" error at the first call.

pub mod abort_word;
pub mod algorithm;
pub mod call;
pub mod copy_engine;
pub mod datatype;
pub mod hosts;
pub mod kernel_args;
#[cfg(test)]
mod kernel_requests;
pub mod kernels;
pub mod launch;
pub mod plan;
pub mod process_exit;
pub mod scratch;
pub mod send_recv;
pub mod send_recv_collectives;
pub mod signal;
pub mod suspend;
pub mod variants;
pub mod zero_copy;

pub use call::{Call, Collective};
pub use datatype::{DataType, RedOp, Scalar};
pub use plan::{Submitted, Work};
pub use send_recv::{SendRecvKind, SendRecvOp};

use crate::bootstrap::Bootstrap;
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::registration::Registration;
use abort_word::{AbortWord, SharedAbortWord};
use algorithm::Choice;
use copy_engine::SideStreams;
use kernels::LoadedKernels;
use once_cell::sync::OnceCell;
use parking_lot::Mutex;
use scratch::Scratch;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use zero_copy::ZeroCopy;

/// A communicator's collectives: nothing until the first call, then its scratch and loaded kernels.
#[derive(Default)]
pub struct Collectives {
    ready: Mutex<Option<Ready>>,
    /// Kept apart from `ready`, so that an abort takes no lock.
    abort: OnceCell<SharedAbortWord>,
    /// This rank's registrations exported to the peers and, once set up, the peers' mapped here.
    zero_copy: ZeroCopy,
    /// One rank's kernels (a `PreMulSum` of one rank: `Kernel::ScalePreMulSum`), which need no scratch.
    solo: Mutex<Option<LoadedKernels>>,
    /// Calls whose data the copy engine moved (eager only, so counted here, once each).
    copy_engine_calls: AtomicU64,
    /// Calls carried as sends and receives (`send_recv_collectives.rs`), a captured one once.
    send_recv_calls: AtomicU64,
    /// One rank's signal area and kernels for the one-sided calls (`signal.rs`; it has no scratch).
    one_sided_solo: Mutex<Option<signal::Solo>>,
    /// Set from a suspend to its resume (`suspend.rs`); locked after `ready`.
    suspended: Mutex<Option<suspend::Suspension>>,
    /// The most blocks this rank lets a collective's launch have (NCCL's `maxCTAs`; 0: no limit), set
    /// before the set-up, which takes the smallest of every rank's (`Scratch::cta_limit`).
    cta_limit: AtomicU32,
}

struct Ready {
    // Kernels are unloaded before the scratch they may still name is freed.
    kernels: LoadedKernels,
    scratch: Scratch,
    abort: SharedAbortWord,
    /// `MSCCLPP_COLL_ALGO` and `MSCCLPP_DETERMINISTIC`, agreed by every rank at the set-up.
    paths: plan::PathSettings,
    side_streams: SideStreams,
}

/// Whether `MSCCLPP_DETERMINISTIC` asks for reproducible reductions (README, "Reproducible reductions"); a
/// bad value is an error naming the variable.
pub fn reproducible_reductions() -> Result<bool> {
    crate::settings::DETERMINISTIC.checked_flag()
}

impl Collectives {
    /// Limits every collective launch to `blocks` blocks (NCCL's `maxCTAs`): before the set-up, which agrees
    /// on the smallest limit of every rank, since a block waits for its namesakes on the peers. Send,
    /// receive and the one-sided calls keep their own grids (they need a block per channel).
    pub fn limit_ctas(&self, blocks: u32) {
        self.cta_limit.store(blocks, Ordering::Relaxed);
    }

    /// After the communicator is aborted: every collective kernel stops waiting and ends.
    pub fn abort(&self) {
        if let Some(word) = self.abort.get() {
            word.raise();
        }
    }

    /// Frees the scratch and unloads the kernels (`mscclppCommDestroy`; the application has synchronized
    /// the streams of its collectives).
    pub fn clear(&self) {
        if let Some(ready) = self.ready.lock().take() {
            let offset = (kernel_args::STATE_ZC_CALLS * 8) as u64;
            match ready.scratch.state.read_u64(offset) {
                Ok(0) => {}
                Ok(n) => log::info!("collectives: {n} call(s) moved their data zero-copy (registered buffers)"),
                Err(e) => log::debug!("the zero-copy count could not be read: {e}"),
            }
            match self.copy_engine_calls.swap(0, Ordering::Relaxed) {
                0 => {}
                n => log::info!("collectives: {n} call(s) moved their data by the copy engine (registered buffers)"),
            }
            match self.send_recv_calls.swap(0, Ordering::Relaxed) {
                0 => {}
                n => log::info!("collectives: {n} call(s) went as sends and receives"),
            }
        }
        self.solo.lock().take();
        self.one_sided_solo.lock().take();
        // What a suspend kept goes with the rest, and the peers' registered buffers mapped here.
        self.suspended.lock().take();
        self.zero_copy.drop_peers();
    }

    /// A buffer was registered (`token`; `window`: its ordinal among the windows, 0 for a buffer): it is
    /// exported, and its record pushed to every peer, which maps it at one of its next calls. A buffer that
    /// cannot be exported stays registered, locally only (its calls take the scratch path), and the log
    /// says why.
    pub fn registered(&self, bootstrap: &Bootstrap, token: u64, registration: &Registration, window: u32) {
        if bootstrap.nranks() == 1 {
            return;
        }
        match self.zero_copy.export(bootstrap, token, registration, window) {
            Ok(()) => log::debug!("registration {token:#x} exported to the peers"),
            // The peers' one-sided calls into it will wait for its record in vain, and fail saying so.
            Err(e) if window != 0 => log::warn!(
                "window {window} ({token:#x}, {} bytes at {:#x}) cannot be reached by the peers: {}",
                registration.len,
                registration.ptr,
                e.message
            ),
            Err(e) => log::info!(
                "registration {token:#x} ({} bytes at {:#x}) is not zero-copy: {}",
                registration.len,
                registration.ptr,
                e.message
            ),
        }
    }

    /// A registration is gone: its peers are told, and close their mappings once their kernels that may
    /// read them have ended.
    pub fn deregistered(&self, bootstrap: &Bootstrap, token: u64) {
        if let Some(Err(e)) = self.zero_copy.withdraw(bootstrap, token) {
            log::warn!(
                "registration {token:#x}: telling the peers it is gone failed: {}",
                e.message
            );
        }
    }

    /// Sets the collectives up now rather than at the first call: collective, every rank calls it in place
    /// of its first call's set-up (NCCL's face does at the communicator's initialisation). Send and receive
    /// need it: every peer's send/receive area must be mapped before the first of them, which need not involve every
    /// rank. Nothing to do for one rank.
    pub fn prepare(&self, bootstrap: &Bootstrap, gpu: &GpuContext) -> Result<()> {
        if bootstrap.nranks() == 1 {
            return Ok(());
        }
        let mut ready = self.ready.lock();
        self.check_not_suspended()?;
        if ready.is_none() {
            *ready = Some(self.set_up(bootstrap, gpu, None)?);
        }
        Ok(())
    }

    /// Sets the collectives up (collectively): at the first call or `prepare`, and at a resume, which passes
    /// what the suspend kept (`suspend.rs`).
    fn set_up(&self, bootstrap: &Bootstrap, gpu: &GpuContext, kept: Option<suspend::Kept>) -> Result<Ready> {
        let data_mb: u64 = crate::settings::COLL_SCRATCH_MB.int();
        let choice = Choice::parse(crate::settings::COLL_ALGO.choice());
        let reproducible = reproducible_reductions()?;
        let abort = self
            .abort
            .get_or_try_init(|| {
                let word = Arc::new(AbortWord::new(gpu)?);
                process_exit::raise_at_exit(&word);
                Ok::<_, crate::error::Error>(word)
            })?
            .clone();
        let cta_limit = match self.cta_limit.load(Ordering::Relaxed) {
            0 => u32::MAX,
            n => n,
        };
        // Every kernel is loaded before the exchange in `Scratch::set_up` (`kernels::Units`); a suspend
        // keeps them.
        let (units, side_streams) = match kept {
            Some(k) => (k.units, k.side_streams),
            None => (kernels::Units::load(gpu)?, SideStreams::new(gpu)),
        };
        let paths = plan::PathSettings { choice, reproducible };
        let scratch = Scratch::set_up(gpu, bootstrap, data_mb << 20, cta_limit, paths)?;
        log::info!(
            "collectives: algorithm {choice:?}{}, scratch at {:#x}",
            if reproducible {
                ", reproducible reductions (in rank order; never by rings or chains)"
            } else {
                ""
            },
            scratch.own()
        );
        self.zero_copy.set_up(gpu, bootstrap.rank(), bootstrap.nranks())?;
        Ok(Ready {
            kernels: LoadedKernels::from_units(*gpu, scratch.multiprocessors, scratch.gpu_sharers, units),
            side_streams,
            scratch,
            abort,
            paths,
        })
    }
}
