//! Where a collective call becomes launches, once `pipeline/` has checked it: `launch_collective` sets the
//! collectives up at the first call (every rank's first call does, together), and takes the first path
//! `plan::paths` lists that does not decline: the copy engine (`copy_engine.rs`, eager calls on registered
//! outputs), zero-copy (`zero_copy/`, registered buffers), sends and receives (`send_recv_collectives.rs`),
//! the scratch algorithm the table chose (`algorithm.rs`), a launch per window (`plan::scratch_launches`). A rank whose `PreMulSum` has no peer to reduce with scales its
//! input alone (`scale_one_rank`).

use super::algorithm::{self, Protocol};
use super::kernel_args::{self, KernelArgs};
use super::kernels::LoadedKernels;
use super::plan::{self, Path};
use super::variants::Kernel;
use super::{
    Call, Collectives, DataType, Ready, RedOp, Scalar, call, copy_engine, send_recv, send_recv_collectives, zero_copy,
};
use crate::bootstrap::Bootstrap;
use crate::error::Result;
use crate::failure::Usable;
use crate::gpu::{AppStream, GpuContext, RelaxedCapture};
use crate::registration::Registrations;
use std::sync::atomic::Ordering;

impl Collectives {
    /// Queues one collective call's kernels on `stream`, its prologue passed (`pipeline/execute.rs`: the
    /// communicator usable, the call not empty, its buffers and stream checked against `gpu`, current): sets
    /// the collectives up at the first call (every rank's first call does, together), then takes the first
    /// of the planned paths that does not decline (`pipeline::plan::paths`). From here on the peers may
    /// already be in this call, so the executor aborts the communicator when this fails.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_collective(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        usable: &dyn Usable,
        call: &Call,
        sizes: &call::Sizes,
        stream: AppStream,
        registrations: &Registrations,
    ) -> Result<()> {
        if bootstrap.nranks() == 1 {
            // One rank: the result is the input (an average of one is the value itself; one piece), or for a
            // PreMulSum the input times the scalar.
            if let Some(scalar) = call.op.and_then(RedOp::scalar) {
                return self.scale_one_rank(gpu, call, sizes.piece, scalar, stream);
            }
            if call.send != call.recv {
                // SAFETY: both ranges were checked by the prologue to be device memory of this context.
                unsafe { stream.copy(call.recv, call.send, sizes.piece as usize)? };
            }
            return Ok(());
        }
        let capturing = stream.is_capturing()?;
        self.set_up_and_launch(bootstrap, gpu, usable, call, sizes, capturing, stream, registrations)
    }

    #[allow(clippy::too_many_arguments)]
    fn set_up_and_launch(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        usable: &dyn Usable,
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
            if usable.check_usable().is_err() {
                self.abort();
            }
        }
        let ready = ready.as_mut().expect("set up above");

        let message = call.collective.message(sizes.piece, nranks);
        let stride = if call.collective.per_rank_pieces() {
            sizes.piece
        } else {
            0
        };
        // A rank that reads no input or keeps no output passes null, which the kernels go by.
        let send = if sizes.send == 0 { 0 } else { call.send };
        let recv = if sizes.recv == 0 { 0 } else { call.recv };
        let (scalar_bits, scalar_ptr) = call.op.and_then(RedOp::scalar).map_or((0, 0), Scalar::kernel_fields);
        let args = KernelArgs {
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
        let shape = plan::Shape {
            collective: call.collective,
            op: call.op,
            nranks,
            placement,
            message,
            choice: ready.paths.choice,
            reproducible: ready.paths.reproducible,
            capturing,
        };
        for path in plan::paths(&shape) {
            match path {
                Path::CopyEngine => {
                    if self.launch_copy_engine(bootstrap, ready, gpu, call, sizes, stream, registrations, &args)? {
                        self.copy_engine_calls.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                }
                // One launch, whatever the vote: where it says no, the same kernel runs the scratch algorithm,
                // window by window (zero_copy.cuh, the fallback).
                Path::ZeroCopy => {
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
                Path::SendRecv => {
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
                        self.send_recv_calls.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                }
                Path::Scratch(protocol) => {
                    return self.launch_scratch(ready, call, sizes.piece, protocol, capturing, stream, args);
                }
            }
        }
        Err(crate::error::Error::internal(
            "no path took the collective (the last planned never declines)",
        ))
    }

    /// The scratch algorithm `protocol`, a launch per window (`plan::scratch_launches`).
    #[allow(clippy::too_many_arguments)]
    fn launch_scratch(
        &self,
        ready: &mut Ready,
        call: &Call,
        piece: u64,
        protocol: Protocol,
        capturing: bool,
        stream: AppStream,
        mut args: KernelArgs,
    ) -> Result<()> {
        let (send, recv) = (args.send, args.recv);
        let kernel = algorithm::kernel(call.collective, protocol);
        let loaded =
            ready
                .kernels
                .get_capturing(capturing, kernel, call.op, call.datatype, algorithm::threads(protocol))?;
        let max_blocks = loaded.max_blocks.min(ready.scratch.cta_limit);
        let window = ready.scratch.window(call.collective, protocol, args.nranks as usize);
        for l in plan::scratch_launches(
            call.collective,
            protocol,
            args.nranks as usize,
            piece,
            window,
            max_blocks,
        ) {
            args.send = if send == 0 { 0 } else { send + l.offset };
            args.recv = if recv == 0 { 0 } else { recv + l.offset };
            args.bytes = l.bytes;
            // SAFETY: the arguments are `CollArgs`'s layout (kernel_args.rs); the application's buffers
            // were checked to hold the bytes the kernel touches (windows stay inside the call's sizes); the
            // scratch, the state and the abort word live in `ready` until `clear`, which comes after the
            // application has synchronized; the stream was checked to be of this context.
            unsafe { loaded.kernel.launch(l.blocks, l.threads, stream, &args)? };
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
        let kernel = zero_copy::kernel(call.collective);
        let threads = algorithm::threads(Protocol::Copy);
        let loaded = ready
            .kernels
            .get_capturing(capturing, kernel, call.op, call.datatype, threads)?;
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
        let fence = ready
            .kernels
            .get(Kernel::CeFence, None, DataType::Uint8, copy_engine::FENCE_THREADS)?;
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
        let loaded = kernels.get_capturing(capturing, Kernel::ScalePreMulSum, call.op, call.datatype, threads)?;
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
}
