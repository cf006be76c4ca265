//! NCCL's one-sided calls, the core side: a put of a rank's data into a peer's registration of a window
//! followed by a signal (`ncclPutSignal`), a signal alone (`ncclSignal`), and a wait that consumes signals
//! (`ncclWaitSignal`); and where a peer's registration of a window is in this process (NCCL's peer pointer
//! queries). The device side is `kernels/collectives/signal.cuh`.
//!
//! Windows. NCCL registers windows collectively: every rank registers its windows in the same order, so
//! the n-th window registered on one rank is the n-th on every other (`Registrations::window_ordinal`).
//! Each registration's record, pushed to the peers when it is made (`zero_copy/records.rs`), carries that
//! ordinal; a peer's records are taken in with the zero-copy table's (`ZeroCopy::refresh`), which maps
//! them and notes them by (peer, ordinal) (`zero_copy/peer_windows.rs`). A put resolves its target on the
//! host when it is called, so that a CUDA graph captures the address, as NCCL's does: this rank's window,
//! its ordinal, the peer's window of that ordinal, mapped here (a peer of this process is reached at its
//! own address).
//! A record not arrived yet is waited for, up to the bootstrap's timeout and never past an abort.
//!
//! Signals. Each rank's scratch allocation ends with its signal area (`AREA_BYTES`), which every peer maps
//! with the rest: a 64-bit counter per (source rank, context, signal index). A signal adds 1 to the
//! receiver's counter for this rank, after a system-scope fence; a wait spins until its counter holds the
//! count asked for and takes it off (so a graph replayed N times waits each time for its own replay's
//! signals). The waits end when the communicator is aborted, which the host then reports: a dead peer
//! never leaves a stream waiting forever.
//!
//! A put's data goes by one kernel that copies and signals, up to `KERNEL_COPY_BYTES`; above, by the copy
//! engine (`cuMemcpyAsync` on the stream) and then the signal kernel. Everything is queued on the
//! application's stream, ordered after its earlier work, and capturable; nothing waits for the GPU.

use super::Collectives;
use super::abort_word::AbortWord;
use super::kernel_args::MAX_RANKS;
use super::kernels::LoadedKernels;
use super::variants::Kernel;
use super::zero_copy::PeerWindow;
use super::{DataType, process_exit};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, ErrorKind, Result};
use crate::failure::Usable;
use crate::gpu::{AppStream, DeviceAllocation, DevicePtr, GpuContext, RelaxedCapture, Stream};
use crate::registration::{Kind, Registrations};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Contexts (`ctx`) a signal may name: `[0, MAX_CONTEXTS)`.
pub const MAX_CONTEXTS: usize = 4;
/// Signal indices (`sigIdx`) per context: `[0, MAX_INDICES)`.
pub const MAX_INDICES: usize = 8;
/// Bytes of a rank's signal area: a counter per source rank, context and index.
pub const AREA_BYTES: u64 = (MAX_RANKS * MAX_CONTEXTS * MAX_INDICES * 8) as u64;
/// Counters one wait launch reads (a thread each); a wait on more takes several launches.
pub const MAX_WAITS: usize = 64;
/// Threads of the put kernel's one block.
pub const PUT_THREADS: u32 = 512;
/// The largest put whose data the put kernel copies itself (one launch); larger ones go by the copy engine.
pub const KERNEL_COPY_BYTES: u64 = 64 << 10;
/// How long a put or a pointer query waits for a peer's record of a window.
pub const WINDOW_WAIT: Duration = crate::bootstrap::DEFAULT_TIMEOUT;

/// The argument of the one-sided kernels, laid out as `SignalArgs` in `signal.cuh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SignalArgs {
    pub src: DevicePtr,
    pub dst: DevicePtr,
    /// Bytes the put kernel copies (0: a signal alone, or the copy engine moved them).
    pub bytes: u64,
    /// The receiver's counter for this rank (0: no signal).
    pub signal: DevicePtr,
    pub wait_counters: [DevicePtr; MAX_WAITS],
    pub wait_counts: [u64; MAX_WAITS],
    pub abort_flag: DevicePtr,
    pub waits: u32,
    pub aligned: u32,
}

impl SignalArgs {
    fn new(abort_flag: DevicePtr) -> SignalArgs {
        SignalArgs {
            src: 0,
            dst: 0,
            bytes: 0,
            signal: 0,
            wait_counters: [0; MAX_WAITS],
            wait_counts: [0; MAX_WAITS],
            abort_flag,
            waits: 0,
            aligned: 0,
        }
    }
}

/// A signal's name: its context and index, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SignalId {
    pub ctx: u32,
    pub index: u32,
}

impl SignalId {
    /// `sigIdx` and `ctx` of a call, checked against what the signal areas hold.
    pub fn new(sig_idx: i32, ctx: i32) -> Result<SignalId> {
        crate::ensure_arg!(
            (0..MAX_INDICES as i32).contains(&sig_idx),
            "sigIdx is {sig_idx}; it must be in [0, {MAX_INDICES})"
        );
        crate::ensure_arg!(
            (0..MAX_CONTEXTS as i32).contains(&ctx),
            "ctx is {ctx}; it must be in [0, {MAX_CONTEXTS})"
        );
        Ok(SignalId {
            ctx: ctx as u32,
            index: sig_idx as u32,
        })
    }
}

/// Where, in a rank's signal area, its counter of the signals `source` raised on `id` is.
pub fn counter_offset(source: usize, id: SignalId) -> u64 {
    (((source * MAX_CONTEXTS + id.ctx as usize) * MAX_INDICES + id.index as usize) * 8) as u64
}

/// One wait of `ncclWaitSignal`: `count` signals of `peer` on `signal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub peer: usize,
    pub signal: SignalId,
    pub count: u64,
}

/// A one-sided call, its arguments checked by the face (ranks are checked again here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OneSided {
    /// `bytes` of `src` into `peer`'s registration of this rank's window `window` (a registration token),
    /// at `offset`, then a signal to `peer`.
    Put {
        src: DevicePtr,
        bytes: u64,
        peer: usize,
        window: u64,
        offset: u64,
        signal: SignalId,
    },
    Signal {
        peer: usize,
        signal: SignalId,
    },
    Wait(Vec<Wait>),
}

impl OneSided {
    /// Whether the call waits (a group issues its waits after everything else: `ncclGroupEnd`).
    pub fn waits(&self) -> bool {
        matches!(self, OneSided::Wait(_))
    }

    pub fn check(&self, nranks: usize) -> Result<()> {
        let peers: Vec<usize> = match self {
            OneSided::Put { peer, .. } | OneSided::Signal { peer, .. } => vec![*peer],
            OneSided::Wait(waits) => waits.iter().map(|w| w.peer).collect(),
        };
        for peer in peers {
            crate::ensure_arg!(peer < nranks, "peer is {peer}; it must be in [0, nranks = {nranks})");
        }
        Ok(())
    }
}

/// `waits` with those of one counter added up (a launch then reads each counter once) and the empty ones
/// dropped, in the order of their first appearance.
pub fn merge_waits(waits: &[Wait]) -> Vec<Wait> {
    let mut merged: Vec<Wait> = Vec::new();
    for w in waits.iter().filter(|w| w.count > 0) {
        match merged.iter_mut().find(|m| (m.peer, m.signal) == (w.peer, w.signal)) {
            Some(m) => m.count += w.count,
            None => merged.push(*w),
        }
    }
    merged
}

/// What a communicator of one rank has for the one-sided calls (it has no scratch): its kernels and its
/// signal area.
pub struct Solo {
    // Kernels are unloaded before the memory they may still name is freed.
    kernels: LoadedKernels,
    area: DeviceAllocation,
}

impl Solo {
    /// Bytes of device memory it holds (`ncclCommMemStats`; a suspend releases it, and the next one-sided
    /// call makes it again).
    pub fn device_bytes(&self) -> u64 {
        self.area.size() as u64
    }
}

/// What a launch needs: the kernels, every rank's signal area as this context reaches it, the abort word.
struct Plane<'a> {
    kernels: &'a mut LoadedKernels,
    signals: [DevicePtr; MAX_RANKS],
    abort_flag: DevicePtr,
}

/// This rank's live window `token`, and its ordinal; `what` names the argument.
pub fn own_window(
    registrations: &Registrations,
    token: u64,
    what: &str,
) -> Result<(crate::registration::Registration, u32)> {
    crate::ensure_arg!(token != 0, "{what} is NULL");
    let found = registrations
        .get(token)
        .filter(|r| matches!(r.kind, Kind::Window { .. }))
        .zip(registrations.window_ordinal(token));
    found.ok_or_else(|| {
        Error::invalid_argument(format!(
            "{what} {token:#x} is not a live window of this communicator (deregistered, or registered with another)"
        ))
    })
}

/// A place in a peer's registration of a window: what a put or a pointer query names, and the names of its
/// window and offset arguments for errors.
struct Target {
    token: u64,
    peer: usize,
    offset: u64,
    bytes: u64,
    names: (&'static str, &'static str),
}

/// Checks that `at`'s bytes lie inside the peer's registration (window `ordinal`, `len` bytes).
fn check_bounds(at: &Target, ordinal: u32, len: u64) -> Result<()> {
    let (offset, bytes, peer) = (at.offset, at.bytes, at.peer);
    crate::ensure_arg!(
        offset.checked_add(bytes).is_some_and(|end| end <= len),
        "{} {offset} + {bytes} byte(s) runs past the end of rank {peer}'s registration of window {ordinal} \
         ({len} bytes)",
        at.names.1
    );
    Ok(())
}

fn not_prepared() -> Error {
    Error::invalid_usage(
        "the one-sided calls need the communicator's collectives set up (NCCL's face sets them up when it \
         creates the communicator) and not released (ncclCommSuspend releases them until ncclCommResume)",
    )
}

impl Collectives {
    /// Whether a one-sided call may go: one rank needs nothing, more need the collectives set up
    /// (`prepare`) and not released by a suspend. Refused before anything is queued, without aborting:
    /// nothing of the call reached a peer.
    pub fn check_one_sided_ready(&self, nranks: usize) -> Result<()> {
        if nranks > 1 && self.ready.lock().is_none() {
            return Err(not_prepared());
        }
        Ok(())
    }

    /// Queues one one-sided call, its prologue passed (`pipeline/execute.rs`: its arguments checked, its
    /// source and stream checked against `gpu`, current): resolves a put's target, and queues its copy and
    /// kernels on `stream`. The executor aborts the communicator when this fails (a peer may be waiting
    /// for this rank's signal), but for a bad argument (a target outside the peer's window).
    pub fn launch_one_sided_call(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        usable: &dyn Usable,
        registrations: &Registrations,
        op: &OneSided,
        stream: AppStream,
    ) -> Result<()> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        let capturing = stream.is_capturing()?;
        let target = match op {
            OneSided::Put {
                bytes,
                peer,
                window,
                offset,
                ..
            } if *bytes > 0 => {
                let at = Target {
                    token: *window,
                    peer: *peer,
                    offset: *offset,
                    bytes: *bytes,
                    names: ("peerWin", "peerWinOffset"),
                };
                Some(self.window_address(bootstrap, gpu, capturing, usable, registrations, &at)?)
            }
            _ => None,
        };
        self.launch_one_sided(gpu, rank, nranks, capturing, op, target, stream)
    }

    /// Where byte `offset` of `peer`'s registration of this rank's window `token` is in this process (NCCL's
    /// `ncclGetPeerDevicePointer`): `peer` may be this rank. Waits for the peer's record as a put does.
    #[allow(clippy::too_many_arguments)]
    pub fn window_pointer(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        usable: &dyn Usable,
        registrations: &Registrations,
        token: u64,
        offset: u64,
        peer: usize,
    ) -> Result<DevicePtr> {
        let nranks = bootstrap.nranks();
        crate::ensure_arg!(peer < nranks, "peer is {peer}; it must be in [0, nranks = {nranks})");
        own_window(registrations, token, "window")?;
        usable.check_usable()?;
        self.check_one_sided_ready(nranks)?;
        let at = Target {
            token,
            peer,
            offset,
            bytes: 1,
            names: ("window", "offset"),
        };
        self.window_address(bootstrap, gpu, false, usable, registrations, &at)
    }

    /// Byte `at.offset` of `at.peer`'s registration of this rank's window `at.token`, as this context reaches
    /// it, checked to hold `at.bytes` from there.
    fn window_address(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        capturing: bool,
        usable: &dyn Usable,
        registrations: &Registrations,
        at: &Target,
    ) -> Result<DevicePtr> {
        let (mine, ordinal) = own_window(registrations, at.token, at.names.0)?;
        let peer = at.peer;
        let (len, base) = if peer == bootstrap.rank() {
            (mine.len as u64, mine.ptr)
        } else {
            let (window, base) = self.peer_window(bootstrap, gpu, capturing, usable, peer, ordinal)?;
            (window.len, base)
        };
        check_bounds(at, ordinal, len)?;
        Ok(base + at.offset)
    }

    /// `peer`'s window of ordinal `ordinal` and its first byte as this context reaches it, once its record
    /// has arrived (waited for up to `WINDOW_WAIT`, and never past an abort).
    fn peer_window(
        &self,
        bootstrap: &Bootstrap,
        gpu: &GpuContext,
        capturing: bool,
        usable: &dyn Usable,
        peer: usize,
        ordinal: u32,
    ) -> Result<(PeerWindow, DevicePtr)> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            {
                let mut ready = self.ready.lock();
                let ready = ready.as_mut().ok_or_else(not_prepared)?;
                {
                    // Opening a peer's mapping is no stream operation, which a capture's global mode refuses.
                    let _relaxed = capturing.then(RelaxedCapture::enter).transpose()?;
                    // Mappings a peer's deregistration retired are left for the collectives to close (they
                    // synchronize the context for it): a one-sided call never waits for the GPU.
                    self.zero_copy.refresh(bootstrap, gpu, true)?;
                }
                if let Some((window, mapped)) = self.zero_copy.window(peer, ordinal) {
                    if ready.scratch.in_this_process[peer] {
                        gpu.enable_peer_access_to(window.address);
                        return Ok((window, window.address));
                    }
                    let base = mapped.ok_or_else(|| {
                        Error::invalid_usage(format!(
                            "rank {peer}'s registration of window {ordinal} ({} bytes) could not be mapped here \
                             (the log's warning about its record says why)",
                            window.len
                        ))
                    })?;
                    return Ok((window, base));
                }
            }
            usable.check_usable()?;
            if start.elapsed() >= WINDOW_WAIT {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "rank {peer}'s registration of window {ordinal} did not arrive within {} s: rank {peer} has \
                         not registered it (every rank registers its windows in the same order), or could not \
                         export it (its log says why)",
                        WINDOW_WAIT.as_secs()
                    ),
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Queues a one-sided call whose target (`target`, a put's) is resolved.
    #[allow(clippy::too_many_arguments)]
    fn launch_one_sided(
        &self,
        gpu: &GpuContext,
        rank: usize,
        nranks: usize,
        capturing: bool,
        op: &OneSided,
        target: Option<DevicePtr>,
        stream: AppStream,
    ) -> Result<()> {
        self.with_plane(gpu, nranks, capturing, |plane| {
            let mut args = SignalArgs::new(plane.abort_flag);
            match op {
                OneSided::Put {
                    src,
                    bytes,
                    peer,
                    signal,
                    ..
                } => {
                    args.signal = plane.signals[*peer] + counter_offset(rank, *signal);
                    // A put of nothing is its signal alone.
                    let Some(dst) = target.filter(|_| *bytes > 0) else {
                        return Self::launch(plane.kernels, capturing, Kernel::RmaPut, PUT_THREADS, stream, &args);
                    };
                    if *bytes > KERNEL_COPY_BYTES {
                        // SAFETY: `src` was checked to be device memory of this context holding `bytes`; `dst`
                        // is this rank's window or a peer's registration of it, mapped here and checked to hold
                        // `bytes` from there; a peer's mapping stays open until the collectives close it after
                        // a context synchronization that follows the peer's deregistration; the stream was
                        // checked to be of this context.
                        unsafe { stream.copy(dst, *src, *bytes as usize)? };
                    } else {
                        args.src = *src;
                        args.dst = dst;
                        args.bytes = *bytes;
                        args.aligned = (src.is_multiple_of(16) && dst.is_multiple_of(16)) as u32;
                    }
                    Self::launch(plane.kernels, capturing, Kernel::RmaPut, PUT_THREADS, stream, &args)
                }
                OneSided::Signal { peer, signal } => {
                    args.signal = plane.signals[*peer] + counter_offset(rank, *signal);
                    Self::launch(plane.kernels, capturing, Kernel::RmaPut, PUT_THREADS, stream, &args)
                }
                OneSided::Wait(waits) => {
                    for chunk in merge_waits(waits).chunks(MAX_WAITS) {
                        for (i, w) in chunk.iter().enumerate() {
                            args.wait_counters[i] = plane.signals[rank] + counter_offset(w.peer, w.signal);
                            args.wait_counts[i] = w.count;
                        }
                        args.waits = chunk.len() as u32;
                        Self::launch(
                            plane.kernels,
                            capturing,
                            Kernel::RmaWait,
                            MAX_WAITS as u32,
                            stream,
                            &args,
                        )?;
                    }
                    Ok(())
                }
            }
        })
    }

    /// Launches one block of `kernel`.
    fn launch(
        kernels: &mut LoadedKernels,
        capturing: bool,
        kernel: Kernel,
        threads: u32,
        stream: AppStream,
        args: &SignalArgs,
    ) -> Result<()> {
        let loaded = kernels.get_capturing(capturing, kernel, None, DataType::Uint8, threads)?;
        // SAFETY: the argument is `SignalArgs`'s layout (checked by this module's tests); the put kernel copies
        // `bytes` from `src` to `dst`, both checked by the caller to hold them, and adds to one counter of a
        // signal area; the wait kernel reads and swaps counters of this rank's signal area; the signal areas
        // and the abort word live until the collectives are cleared, after the application synchronized its
        // streams; the stream was checked to be of this context.
        unsafe { loaded.kernel.launch(1, threads, stream, args) }
    }

    /// Runs `f` with what a launch needs: the scratch's signal areas, or for one rank its own (made at its
    /// first one-sided call).
    fn with_plane<R>(
        &self,
        gpu: &GpuContext,
        nranks: usize,
        capturing: bool,
        f: impl FnOnce(Plane<'_>) -> Result<R>,
    ) -> Result<R> {
        if nranks > 1 {
            let mut ready = self.ready.lock();
            let ready = ready.as_mut().ok_or_else(not_prepared)?;
            let plane = Plane {
                kernels: &mut ready.kernels,
                signals: ready.scratch.signals,
                abort_flag: ready.abort.device_ptr(),
            };
            return f(plane);
        }
        let mut solo = self.one_sided_solo.lock();
        // Allocations and a synchronous zeroing, which a capture allows only in the relaxed mode.
        let _relaxed = (capturing && solo.is_none()).then(RelaxedCapture::enter).transpose()?;
        let abort = self
            .abort
            .get_or_try_init(|| {
                let word = Arc::new(AbortWord::new(gpu)?);
                process_exit::raise_at_exit(&word);
                Ok::<_, Error>(word)
            })?
            .clone();
        if solo.is_none() {
            let multiprocessors = gpu.multiprocessors()?;
            let area = DeviceAllocation::zeroed_on(gpu, AREA_BYTES as usize, &Stream::new(gpu)?)?;
            *solo = Some(Solo {
                kernels: LoadedKernels::new(*gpu, multiprocessors.max(1), 1),
                area,
            });
        }
        let solo = solo.as_mut().expect("made above");
        let mut signals = [0; MAX_RANKS];
        signals[0] = solo.area.ptr();
        f(Plane {
            kernels: &mut solo.kernels,
            signals,
            abort_flag: abort.device_ptr(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::variants::MOVING_UNIT;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_the_device_struct() {
        assert_eq!(offset_of!(SignalArgs, signal), 24);
        assert_eq!(offset_of!(SignalArgs, wait_counters), 32);
        assert_eq!(offset_of!(SignalArgs, wait_counts), 32 + 8 * MAX_WAITS);
        assert_eq!(offset_of!(SignalArgs, abort_flag), 32 + 16 * MAX_WAITS);
        assert_eq!(offset_of!(SignalArgs, waits), 40 + 16 * MAX_WAITS);
        assert_eq!(offset_of!(SignalArgs, aligned), 44 + 16 * MAX_WAITS);
        assert_eq!(size_of::<SignalArgs>(), 48 + 16 * MAX_WAITS);
        // Kernel parameters are limited to 4 KiB on every driver the library supports.
        assert!(size_of::<SignalArgs>() <= 4096);
    }

    #[test]
    fn constants_match_the_device_code() {
        let cuh = include_str!("../../kernels/collectives/signal.cuh");
        for (name, value) in [
            ("MSCCLPP_SIGNAL_MAX_CONTEXTS", MAX_CONTEXTS as u64),
            ("MSCCLPP_SIGNAL_MAX_INDICES", MAX_INDICES as u64),
            ("MSCCLPP_SIGNAL_MAX_WAITS", MAX_WAITS as u64),
            ("MSCCLPP_SIGNAL_PUT_THREADS", PUT_THREADS as u64),
        ] {
            assert!(
                cuh.contains(&format!("#define {name} {value}\n")),
                "signal.cuh must define {name} as {value}"
            );
        }
        // The one-sided kernels are of no type, in the moving unit, bounded by the threads they launch with.
        for (kernel, threads) in [
            (Kernel::RmaPut, "MSCCLPP_SIGNAL_PUT_THREADS"),
            (Kernel::RmaWait, "MSCCLPP_SIGNAL_MAX_WAITS"),
        ] {
            assert_eq!(kernel.serving(None).map(|v| v.unit()), Some(MOVING_UNIT));
            let spec = kernel.spec();
            assert_eq!(spec.bounds, format!("__launch_bounds__({threads})"));
            let device_fn = format!("__device__ __forceinline__ void {}(const SignalArgs& a)", spec.body);
            assert!(cuh.contains(&device_fn), "signal.cuh must define {device_fn}");
        }
    }

    #[test]
    fn every_source_context_and_index_has_a_counter_of_its_own() {
        let mut seen = std::collections::HashSet::new();
        for source in 0..MAX_RANKS {
            for ctx in 0..MAX_CONTEXTS as i32 {
                for index in 0..MAX_INDICES as i32 {
                    let off = counter_offset(source, SignalId::new(index, ctx).unwrap());
                    assert!(off + 8 <= AREA_BYTES, "{off}");
                    assert!(off.is_multiple_of(8));
                    assert!(seen.insert(off), "{source} {ctx} {index}");
                }
            }
        }
        assert_eq!(seen.len() as u64, AREA_BYTES / 8);
    }

    #[test]
    fn signal_indices_and_contexts_out_of_range_are_refused_naming_them() {
        for (sig, ctx, named) in [
            (-1, 0, "sigIdx is -1; it must be in [0, 8)"),
            (8, 0, "sigIdx is 8"),
            (0, -3, "ctx is -3; it must be in [0, 4)"),
            (0, 4, "ctx is 4"),
        ] {
            let e = SignalId::new(sig, ctx).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains(named), "{}", e.message);
        }
        assert_eq!(SignalId::new(7, 3).unwrap(), SignalId { ctx: 3, index: 7 });
    }

    #[test]
    fn peers_out_of_range_are_refused_in_every_kind_of_call() {
        let id = SignalId::new(0, 0).unwrap();
        let calls = [
            OneSided::Signal { peer: 2, signal: id },
            OneSided::Put {
                src: 0x1000,
                bytes: 4,
                peer: 5,
                window: 1,
                offset: 0,
                signal: id,
            },
            OneSided::Wait(vec![
                Wait {
                    peer: 0,
                    signal: id,
                    count: 1,
                },
                Wait {
                    peer: 2,
                    signal: id,
                    count: 1,
                },
            ]),
        ];
        for call in calls {
            let e = call.check(2).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains("nranks = 2"), "{}", e.message);
        }
        assert!(OneSided::Signal { peer: 1, signal: id }.check(2).is_ok());
        assert!(OneSided::Wait(Vec::new()).waits());
        assert!(!OneSided::Signal { peer: 1, signal: id }.waits());
    }

    #[test]
    fn waits_on_one_counter_are_added_up_and_empty_ones_dropped() {
        let a = SignalId::new(0, 0).unwrap();
        let b = SignalId::new(1, 0).unwrap();
        let w = |peer, signal, count| Wait { peer, signal, count };
        let merged = merge_waits(&[w(1, a, 2), w(2, a, 1), w(1, b, 0), w(1, a, 3), w(2, b, 4)]);
        assert_eq!(merged, [w(1, a, 5), w(2, a, 1), w(2, b, 4)]);
        assert!(merge_waits(&[w(1, a, 0)]).is_empty());
    }

    #[test]
    fn a_target_must_lie_inside_the_peers_registration() {
        let at = |offset, bytes| Target {
            token: 1,
            peer: 3,
            offset,
            bytes,
            names: ("peerWin", "peerWinOffset"),
        };
        assert!(check_bounds(&at(0, 4096), 2, 4096).is_ok());
        assert!(check_bounds(&at(4095, 1), 2, 4096).is_ok());
        let e = check_bounds(&at(4000, 97), 2, 4096).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(
            e.message,
            "peerWinOffset 4000 + 97 byte(s) runs past the end of rank 3's registration of window 2 (4096 bytes)"
        );
        assert!(check_bounds(&at(u64::MAX, 2), 2, 4096).is_err(), "no overflow");
        let query = Target {
            names: ("window", "offset"),
            ..at(4096, 1)
        };
        let e = check_bounds(&query, 1, 4096).unwrap_err();
        assert!(e.message.starts_with("offset 4096 + 1 byte(s)"), "{}", e.message);
    }

    #[test]
    fn only_live_windows_of_the_communicator_are_targets() {
        use crate::registration::{Allocation, Registration};
        let r = Registrations::default();
        let registration = |kind| Registration {
            ptr: 0x10_0000,
            len: 4096,
            kind,
            allocation: Allocation {
                buffer_id: 1,
                base: 0x10_0000,
                size: 4096,
                device: 0,
            },
            library_memory: true,
        };
        let buffer = r.insert(registration(Kind::Buffer));
        let window = r.insert(registration(Kind::Window { flags: 0 }));
        let (found, ordinal) = own_window(&r, window, "peerWin").unwrap();
        assert_eq!((found.ptr, ordinal), (0x10_0000, 1));
        let e = own_window(&r, 0, "peerWin").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(e.message, "peerWin is NULL");
        let e = own_window(&r, buffer, "window").unwrap_err();
        assert!(
            e.message.starts_with("window 0x") && e.message.contains("not a live window"),
            "{}",
            e.message
        );
        r.deregister(window, Kind::Window { flags: 0 }, "win").unwrap();
        assert!(own_window(&r, window, "peerWin").is_err());
    }
}
