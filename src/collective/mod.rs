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
//!   as such launches (gather, scatter, all-to-all, two ranks' broadcast, and two GPUs' all-gather and
//!   reductions at the sizes it names);
//! - `kernels.rs`: the embedded fatbins, loaded into the communicator's context at first use;
//! - `kernel_args.rs`: the kernels' one argument;
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
pub mod kernel_args;
pub mod kernels;
pub mod process_exit;
pub mod scratch;
pub mod send_recv;
pub mod send_recv_collectives;
pub mod signal;
pub mod suspend;
pub mod zero_copy;

pub use call::{Call, Collective};
pub use datatype::{DataType, RedOp, Scalar};
pub use send_recv::{SendRecvKind, SendRecvOp};

use crate::bootstrap::Bootstrap;
use crate::error::Result;
use crate::gpu::{AppStream, GpuContext, RelaxedCapture};
use crate::registration::{Registration, Registrations};
use abort_word::{AbortWord, SharedAbortWord};
use algorithm::{Choice, Protocol};
use copy_engine::SideStreams;
use kernel_args::KernelArgs;
use kernels::{LoadedKernels, ONE_RANK_PREMULSUM};
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
    /// One rank's kernels (a `PreMulSum` of one rank: `ONE_RANK_PREMULSUM`), which need no scratch.
    solo: Mutex<Option<LoadedKernels>>,
    /// Calls whose data the copy engine moved (eager only, so counted here, once each).
    copy_engine_calls: AtomicU64,
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
    choice: Choice,
    side_streams: SideStreams,
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

    /// Runs one collective call: checks it, sets the collectives up at the first call (collectively: every
    /// rank's first call does), and queues its kernels on `stream`.
    ///
    /// `gpu` gives the communicator's context and makes it current (only once the arguments are checked
    /// and the call is not empty, so that those need no GPU), `aborted` is its failure check, and `root`
    /// the application's root argument (checked here). `abort_communicator` is called when the call fails
    /// after its peers may have started it.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        bootstrap: &Bootstrap,
        gpu: impl FnOnce() -> Result<GpuContext>,
        aborted: impl Fn() -> Result<()>,
        abort_communicator: impl FnOnce(),
        call: &Call,
        root: i64,
        stream: AppStream,
        registrations: &Registrations,
    ) -> Result<()> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        let sizes = call.sizes(rank, nranks, root)?;
        aborted()?;
        // Before anything else: a first call's set-up now would wait for peers that are suspended too.
        self.check_not_suspended()?;
        if sizes.piece == 0 {
            return Ok(());
        }
        let gpu = &gpu()?;
        // A broadcast's or a scatter's non-root reads no input, a reduce's or a gather's keeps no output
        // (the size is 0 there).
        if sizes.send > 0 {
            gpu.check_buffer(call.send, sizes.send, "sendbuff")?;
        }
        if sizes.recv > 0 {
            gpu.check_buffer(call.recv, sizes.recv, "recvbuff")?;
        }
        let scalar = call.op.and_then(RedOp::scalar);
        if let Some(Scalar::Device(ptr)) = scalar {
            gpu.check_buffer(ptr, call.datatype.size() as u64, "the PreMulSum operator's scalar")?;
        }
        stream.check_context(gpu)?;
        if nranks == 1 {
            // One rank: the result is the input (an average of one is the value itself; one piece), or for a
            // PreMulSum the input times the scalar.
            if let Some(scalar) = scalar {
                return self.scale_one_rank(gpu, call, sizes.piece, scalar, stream);
            }
            if call.send != call.recv {
                // SAFETY: both ranges were checked above to be device memory of this context.
                unsafe { stream.copy(call.recv, call.send, sizes.piece as usize)? };
            }
            return Ok(());
        }

        let capturing = stream.is_capturing()?;
        // From here on the peers may already be in this call (its set-up, or its kernels waiting for ours):
        // a failure on this rank alone would leave them waiting forever, so it aborts the communicator.
        self.set_up_and_launch(bootstrap, gpu, &aborted, call, &sizes, capturing, stream, registrations)
            .inspect_err(|e| {
                if aborted().is_ok() {
                    log::warn!(
                        "{} failed after its peers may have started it ({}); aborting the communicator",
                        call.function,
                        e.message
                    );
                    abort_communicator();
                }
            })
    }

    #[allow(clippy::too_many_arguments)]
    fn set_up_and_launch(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        aborted: &impl Fn() -> Result<()>,
        call: &Call,
        sizes: &call::Sizes,
        capturing: bool,
        stream: AppStream,
        registrations: &Registrations,
    ) -> Result<()> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        let mut ready = self.ready.lock();
        if ready.is_none() {
            let _relaxed = capturing.then(RelaxedCapture::enter).transpose()?;
            *ready = Some(self.set_up(bootstrap, gpu, None)?);
            // An abort that came during the set-up found no word to raise.
            if aborted().is_err() {
                self.abort();
            }
        }
        let ready = ready.as_mut().expect("set up above");

        let message = call.collective.message(sizes.piece, nranks);
        let protocol = algorithm::choose(call.collective, nranks, message, ready.choice);
        let stride = if call.collective.per_rank_pieces() {
            sizes.piece
        } else {
            0
        };
        // A rank that reads no input or keeps no output passes null, which the kernels go by.
        let send = if sizes.send == 0 { 0 } else { call.send };
        let recv = if sizes.recv == 0 { 0 } else { call.recv };
        let (scalar_bits, scalar_ptr) = call.op.and_then(RedOp::scalar).map_or((0, 0), Scalar::kernel_fields);
        let mut args = KernelArgs {
            send,
            recv,
            scratch: ready.scratch.ptrs,
            slot_bytes: ready.scratch.slot_bytes,
            packet_bytes: ready.scratch.packet_bytes,
            state: ready.scratch.state.ptr(),
            abort_flag: ready.abort.device_ptr(),
            rank: rank as u32,
            nranks: nranks as u32,
            root: call.root as u32,
            aligned: (send.is_multiple_of(16) && recv.is_multiple_of(16) && stride.is_multiple_of(16)) as u32,
            stride_bytes: stride,
            scalar_bits,
            scalar_ptr,
            ..KernelArgs::default()
        };
        let placement = if ready.scratch.gpu_sharers >= nranks {
            algorithm::Placement::OneGpu
        } else {
            algorithm::Placement::SeveralGpus
        };
        if copy_engine::attempt(call.collective, nranks, message, ready.choice, capturing)
            && self.launch_copy_engine(bootstrap, ready, gpu, call, sizes, stream, registrations, &args)?
        {
            self.copy_engine_calls.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if zero_copy::attempt(call.collective, call.op, nranks, placement, message, ready.choice) {
            // One launch, whatever the vote: where it says no, the same kernel runs the scratch algorithm,
            // window by window (zero_copy.cuh, the fallback).
            return self.launch_zero_copy(
                bootstrap,
                ready,
                gpu,
                call,
                sizes,
                capturing,
                stream,
                registrations,
                &args,
            );
        }
        if send_recv_collectives::applies(call.collective, call.op, nranks, placement, message, ready.choice) {
            // Every rank decides alike, by the channels of the rank that needs most.
            let channels = send_recv_collectives::most_channels(call.collective, nranks);
            let mut fits = send_recv::fits(ready, channels, None, capturing)?;
            if let Some(op) = call.op {
                fits &= send_recv::fits(ready, channels, Some((op, call.datatype)), capturing)?;
            }
            if fits {
                let launches = send_recv_collectives::launches(call, rank, nranks, send, recv, sizes.piece)?;
                for l in &launches {
                    send_recv::launch(ready, rank, nranks, &l.work, l.reducing, capturing, stream)?;
                }
                return Ok(());
            }
        }
        // The scratch algorithm, a launch per window.
        let base = algorithm::kernel_base(call.collective, protocol);
        let loaded =
            ready
                .kernels
                .get_capturing(capturing, base, call.op, call.datatype, algorithm::threads(protocol))?;
        let max_blocks = loaded.max_blocks.min(ready.scratch.cta_limit);
        let window = ready.scratch.window(call.collective, protocol, nranks);
        for (offset, bytes) in algorithm::windows(sizes.piece, window) {
            args.send = if send == 0 { 0 } else { send + offset };
            args.recv = if recv == 0 { 0 } else { recv + offset };
            args.bytes = bytes;
            let (blocks, threads) = algorithm::grid(call.collective, protocol, nranks, bytes, max_blocks);
            // SAFETY: the arguments are `CollArgs`'s layout (kernel_args.rs); the application's buffers
            // were checked to hold the bytes the kernel touches (windows stay inside `sizes`); the scratch,
            // the state and the abort word live in `ready` until `clear`, which comes after the
            // application has synchronized; the stream was checked to be of this context.
            unsafe { loaded.kernel.launch(blocks, threads, stream, &args)? };
        }
        Ok(())
    }

    /// The zero-copy launch of a call (`zero_copy/`): the peers' newest records taken in, this rank's
    /// descriptors, and one launch over the whole buffers that votes and, if every rank can, moves the data.
    /// `base` holds the call's arguments as the scratch launches get them (their first window aside).
    #[allow(clippy::too_many_arguments)]
    fn launch_zero_copy(
        &self,
        bootstrap: &Bootstrap,
        ready: &mut Ready,
        gpu: &GpuContext,
        call: &Call,
        sizes: &call::Sizes,
        capturing: bool,
        stream: AppStream,
        registrations: &Registrations,
        base: &KernelArgs,
    ) -> Result<()> {
        {
            // Opening a peer's mapping is not a stream operation, which a capture's global mode refuses.
            let _relaxed = capturing.then(RelaxedCapture::enter).transpose()?;
            self.zero_copy.refresh(bootstrap, gpu, capturing)?;
        }
        let base_name = zero_copy::kernel_base(call.collective);
        let threads = algorithm::threads(Protocol::Copy);
        let loaded = ready
            .kernels
            .get_capturing(capturing, base_name, call.op, call.datatype, threads)?;
        let (zc_send_tag, zc_send_offset) = self.zero_copy.descriptor(registrations, base.send, sizes.send);
        let (zc_recv_tag, zc_recv_offset) = self.zero_copy.descriptor(registrations, base.recv, sizes.recv);
        let nranks = bootstrap.nranks();
        let args = KernelArgs {
            bytes: sizes.piece,
            zc_send_tag,
            zc_send_offset,
            zc_recv_tag,
            zc_recv_offset,
            zc_table: self.zero_copy.table_ptr()?,
            zc_window: ready.scratch.window(call.collective, Protocol::Copy, nranks),
            ..*base
        };
        let (blocks, threads) = algorithm::grid(
            call.collective,
            Protocol::Copy,
            nranks,
            sizes.piece,
            loaded.max_blocks.min(ready.scratch.cta_limit),
        );
        // The vote is made by block 0 with one thread per rank.
        let threads = threads.max(kernel_args::MAX_RANKS as u32);
        // SAFETY: as the scratch launches (`set_up_and_launch`): `CollArgs`'s layout; the application's
        // buffers hold `sizes` bytes; a peer's buffer is touched only where every rank's vote found it in
        // its table, whose mappings stay open until no kernel may read them (`ZeroCopy::refresh`); the
        // table and the scratch live in `ready` until `clear`.
        unsafe { loaded.kernel.launch(blocks, threads, stream, &args) }
    }

    /// The copy-engine path of an eager call (`copy_engine.rs`): agrees with every rank on it and, if all
    /// can, queues the fences and the copies. `false`: some rank cannot reach an output it writes, nothing
    /// was queued, and the call goes on by the other paths.
    #[allow(clippy::too_many_arguments)]
    fn launch_copy_engine(
        &self,
        bootstrap: &Bootstrap,
        ready: &mut Ready,
        gpu: &GpuContext,
        call: &Call,
        sizes: &call::Sizes,
        stream: AppStream,
        registrations: &Registrations,
        base: &KernelArgs,
    ) -> Result<bool> {
        self.zero_copy.refresh(bootstrap, gpu, false)?;
        let own = self.zero_copy.descriptor(registrations, base.recv, sizes.recv);
        let root = call.root;
        let agreed = copy_engine::agree(bootstrap, call.collective, root, own, base.recv, |peer, tag, offset| {
            self.zero_copy.resolve(peer, tag, offset)
        })?;
        let Some(outputs) = agreed else {
            return Ok(false);
        };
        let copies = copy_engine::copies(
            call.collective,
            bootstrap.rank(),
            root,
            sizes.piece,
            base.send,
            &outputs,
        );
        let fence = ready.kernels.get(
            copy_engine::FENCE_KERNEL,
            None,
            DataType::Uint8,
            copy_engine::FENCE_THREADS,
        )?;
        let before = KernelArgs { bytes: 0, ..*base };
        let after = KernelArgs {
            bytes: sizes.piece,
            ..*base
        };
        // SAFETY: `CollArgs`'s layout; a fence touches only the state and the flags of the scratch, which
        // live in `ready` until `clear`; the stream was checked to be of this context.
        unsafe { fence.kernel.launch(1, copy_engine::FENCE_THREADS, stream, &before)? };
        // SAFETY: each copy reads `sizes.piece` bytes of this rank's input, checked to hold them, and writes
        // them into this rank's checked output or a peer's registered output, found mapped here at the
        // generation the peer named for its whole output (an all-gather's piece of this rank at
        // rank * piece, a broadcast's whole). That mapping stays open until a context synchronization after
        // the peer's deregistration (`ZeroCopy::refresh`), which comes after these copies. The first fence
        // has every peer's stream at this call; the second holds it there until these copies are done.
        unsafe { ready.side_streams.queue(stream, &copies)? };
        // SAFETY: as the first fence.
        unsafe { fence.kernel.launch(1, copy_engine::FENCE_THREADS, stream, &after)? };
        Ok(true)
    }

    /// One rank's `PreMulSum`: `recv` gets `send` times the scalar, element-wise, in one launch (no scratch,
    /// no peers: the call's buffers and stream were checked).
    fn scale_one_rank(
        &self,
        gpu: &GpuContext,
        call: &Call,
        bytes: u64,
        scalar: Scalar,
        stream: AppStream,
    ) -> Result<()> {
        let capturing = stream.is_capturing()?;
        let mut solo = self.solo.lock();
        let kernels = match &mut *solo {
            Some(k) => k,
            None => {
                let multiprocessors = gpu.multiprocessors()?;
                solo.insert(LoadedKernels::new(*gpu, multiprocessors.max(1), 1))
            }
        };
        let threads = algorithm::threads(Protocol::Copy);
        let loaded = kernels.get_capturing(capturing, ONE_RANK_PREMULSUM, call.op, call.datatype, threads)?;
        let (scalar_bits, scalar_ptr) = scalar.kernel_fields();
        let args = KernelArgs {
            send: call.send,
            recv: call.recv,
            bytes,
            nranks: 1,
            aligned: (call.send.is_multiple_of(16) && call.recv.is_multiple_of(16)) as u32,
            scalar_bits,
            scalar_ptr,
            ..KernelArgs::default()
        };
        let (blocks, threads) = algorithm::grid(call.collective, Protocol::Copy, 1, bytes, loaded.max_blocks);
        // SAFETY: the arguments are `CollArgs`'s layout; the kernel reads `bytes` of `send` and writes `bytes`
        // of `recv`, both checked to be device memory of this context holding them (one rank's piece is its
        // whole buffer), and reads the scalar, checked likewise where it lies in device memory; the stream was
        // checked to be of this context.
        unsafe { loaded.kernel.launch(blocks, threads, stream, &args) }
    }

    /// Sets the collectives up (collectively): at the first call or `prepare`, and at a resume, which passes
    /// what the suspend kept (`suspend.rs`).
    fn set_up(&self, bootstrap: &Bootstrap, gpu: &GpuContext, kept: Option<suspend::Kept>) -> Result<Ready> {
        let data_mb: u64 = crate::settings::COLL_SCRATCH_MB.int().unwrap_or(64);
        let choice = Choice::parse(crate::settings::COLL_ALGO.choice().unwrap_or("auto"));
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
        let scratch = Scratch::set_up(gpu, bootstrap, data_mb << 20, cta_limit)?;
        log::info!("collectives: algorithm {choice:?}, scratch at {:#x}", scratch.own());
        self.zero_copy.set_up(gpu, bootstrap.rank(), bootstrap.nranks())?;
        let side_streams = match kept {
            Some(k) => k.side_streams,
            None => SideStreams::new(gpu),
        };
        Ok(Ready {
            kernels: LoadedKernels::new(*gpu, scratch.multiprocessors, scratch.gpu_sharers),
            side_streams,
            scratch,
            abort,
            choice,
        })
    }
}
