//! The trigger FIFO: 128 slots the device writes and the proxy reads and releases in order, with the
//! head (device memory, claimed by device threads) and two copies of the proxy's tail.
//!
//! The device copy of the tail (device memory, what `triggerFifoTail` points at) is refreshed by a
//! stream write, which the GPU may defer while it is busy with other work of the same hardware queue.
//! So the proxy also keeps a host copy, right after the slots in the same pinned allocation, written
//! with a plain store after every trigger; this library's header falls back to it when the device copy
//! says the FIFO is full, so a push never depends on the GPU scheduling the proxy's stream work.
//!
//! Invariant the header relies on: a slot is cleared before either copy of the tail moves past it. A
//! push whose position is below `FIFO_SIZE` + a tail it has read therefore skips reading the slot (a
//! read of host memory, about a microsecond).

use super::TailPublisher;
use crate::error::Result;
use crate::gpu::{DeviceAllocation, DevicePtr, GpuContext, PinnedHostBuffer, Stream};
use crate::types::mscclppConcurrentFifo;

/// Slots in the FIFO (`MSCCLPP_PROXY_FIFO_SIZE`).
pub const FIFO_SIZE: u64 = 128;
/// The device's copy of the tail is refreshed at least this often (`MSCCLPP_PROXY_FIFO_FLUSH_COUNTER`).
pub const FLUSH_COUNTER: u64 = 4;

/// 16-byte slots of control words after the host tail (the header's `mscclppConcurrentFifo::control()`):
/// `[0]` aborted, `[1]` the wait timeout in ns, `[2]` a stuck wait's report header, `[3]` its expected value,
/// `[4]` the value it saw last.
pub const CONTROL_SLOTS: usize = 3;

/// Bytes of the pinned part of a FIFO: the slots, the host copy of the tail (in a 16-byte slot of its
/// own), then the control words.
pub const HOST_BYTES: usize = (FIFO_SIZE as usize + 1 + CONTROL_SLOTS) * 16;

/// What a kernel's wait that spun past `MSCCLPP_WAIT_TIMEOUT` reported (header: `mscclppStuckKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StuckWait {
    pub conn_id: u32,
    /// `true`: a `wait()` (expected epoch, last epoch seen); `false`: a flush (FIFO position, tail seen).
    pub is_wait: bool,
    pub expected: u64,
    pub seen: u64,
}

impl std::fmt::Display for StuckWait {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if self.is_wait {
            write!(
                f,
                "wait() on connection {} for epoch {} spun past MSCCLPP_WAIT_TIMEOUT; the last epoch it saw was {}",
                self.conn_id, self.expected, self.seen
            )
        } else {
            write!(
                f,
                "flush() on connection {} for FIFO position {} spun past MSCCLPP_WAIT_TIMEOUT; the proxy's tail it saw was {}",
                self.conn_id, self.expected, self.seen
            )
        }
    }
}

/// A ring of 16-byte slots in memory the device writes (pinned host memory in production, a plain
/// buffer in tests), followed by the host copy of the tail.
pub struct TriggerRing {
    slots: *mut [u64; 2],
}

// SAFETY: the ring is read and cleared only by the one proxy thread that owns it; the device is the
// only other party and follows the FIFO protocol.
unsafe impl Send for TriggerRing {}

impl TriggerRing {
    /// # Safety
    /// `slots` points at `FIFO_SIZE + 1 + CONTROL_SLOTS` 16-byte-aligned slots (the host tail, then the
    /// control words, after the ring) that outlive the ring.
    pub unsafe fn new(slots: *mut [u64; 2]) -> TriggerRing {
        TriggerRing { slots }
    }

    fn slot(&self, tail: u64) -> *mut [u64; 2] {
        // SAFETY: the index is reduced modulo the ring size.
        unsafe { self.slots.add((tail % FIFO_SIZE) as usize) }
    }

    /// The trigger at `tail`, or `None` while the slot is empty. Both words come from one 16-byte load,
    /// matching the device's single 16-byte store, so a trigger is never seen half written.
    pub fn poll(&self, tail: u64) -> Option<[u64; 2]> {
        let words = load16(self.slot(tail));
        if words[0] == 0 { None } else { Some(words) }
    }

    /// Marks the slot at `tail` empty so the device may reuse it.
    pub fn release(&self, tail: u64) {
        // Everything done for this trigger must be ordered before the device sees the slot free.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: in-bounds, aligned slot; volatile because the device reads it.
        unsafe { std::ptr::write_volatile(self.slot(tail).cast::<u64>(), 0) };
    }

    /// Slot indices whose first word is non-zero (triggers written and not yet released), for the
    /// diagnostics a stalled proxy logs.
    pub fn occupied(&self) -> Vec<u64> {
        (0..FIFO_SIZE).filter(|&i| load16(self.slot(i))[0] != 0).collect()
    }

    /// Control word `i` (see `CONTROL_SLOTS`).
    fn control(&self, i: usize) -> *mut u64 {
        debug_assert!(i < CONTROL_SLOTS * 2);
        // SAFETY: the control slots follow the host tail (see `new`); `i` is within them.
        unsafe { self.slots.add(FIFO_SIZE as usize + 1).cast::<u64>().add(i) }
    }

    /// Tells kernels built on this library's header that the communicator is aborted (their waits return).
    pub fn set_aborted(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: an aligned control word; volatile because the device reads it.
        unsafe { std::ptr::write_volatile(self.control(0), 1) };
    }

    /// Sets how long a kernel's wait may spin before it reports itself (0: never).
    pub fn set_wait_timeout_ns(&self, ns: u64) {
        // SAFETY: an aligned control word; volatile because the device reads it.
        unsafe { std::ptr::write_volatile(self.control(1), ns) };
    }

    /// A stuck wait's report, if a kernel wrote one.
    pub fn stuck_wait(&self) -> Option<StuckWait> {
        // SAFETY: aligned control words the device writes (header last, after a system fence).
        let header = unsafe { std::ptr::read_volatile(self.control(2)) };
        if header >> 63 == 0 {
            return None;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: as above.
        let (expected, seen) = unsafe {
            (
                std::ptr::read_volatile(self.control(3)),
                std::ptr::read_volatile(self.control(4)),
            )
        };
        Some(StuckWait {
            conn_id: (header & 0xffff_ffff) as u32,
            is_wait: (header >> 32) & 0xff == 1,
            expected,
            seen,
        })
    }

    /// Publishes the tail to the host copy, where the device can always see it.
    pub fn set_host_tail(&self, tail: u64) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: the slot after the ring holds the host tail (see `new`).
        unsafe { std::ptr::write_volatile(self.slots.add(FIFO_SIZE as usize).cast::<u64>(), tail) };
    }
}

/// The memory of one FIFO, owned by a communicator (one per P2P proxy and per IB device).
pub struct DeviceFifo {
    host: PinnedHostBuffer,
    head: DeviceAllocation,
    tail: DeviceAllocation,
}

impl DeviceFifo {
    pub fn new(ctx: &GpuContext) -> Result<DeviceFifo> {
        let fifo = DeviceFifo {
            host: PinnedHostBuffer::zeroed(ctx, HOST_BYTES)?,
            head: DeviceAllocation::zeroed(ctx, 8)?,
            tail: DeviceAllocation::zeroed(ctx, 8)?,
        };
        let timeout_s: u64 = crate::settings::WAIT_TIMEOUT.int();
        // SAFETY: the ring is used here only, while `fifo` lives.
        unsafe { fifo.ring() }.set_wait_timeout_ns(timeout_s.saturating_mul(1_000_000_000));
        Ok(fifo)
    }

    /// The device's handle on the FIFO in `fifo` for the connection with index `conn_id`, making the FIFO on
    /// `gpu` first if there is none yet: a transport makes each of its FIFOs with the first connection
    /// that is served through it.
    pub fn view_on_first_use(
        fifo: &mut Option<DeviceFifo>,
        gpu: &GpuContext,
        conn_id: usize,
    ) -> Result<mscclppConcurrentFifo> {
        let fifo = match fifo {
            Some(f) => f,
            None => fifo.insert(DeviceFifo::new(gpu)?),
        };
        Ok(fifo.device_view(conn_id))
    }

    /// The device's handle on this FIFO for the connection with index `conn_id`.
    pub fn device_view(&self, conn_id: usize) -> mscclppConcurrentFifo {
        mscclppConcurrentFifo {
            triggerFifo: self.host.device_ptr() as *mut _,
            triggerFifoTail: self.tail.ptr() as *mut _,
            triggerFifoHead: self.head.ptr() as *mut _,
            connId: conn_id as i32,
        }
    }

    /// The device copy of the tail, which a `TailPublisher` writes.
    pub fn device_tail(&self) -> DevicePtr {
        self.tail.ptr()
    }

    /// The proxy's view of the slots.
    ///
    /// # Safety
    /// The ring must not be used after this FIFO is dropped: stop the proxy first.
    pub unsafe fn ring(&self) -> TriggerRing {
        // SAFETY: the pinned allocation holds HOST_BYTES of aligned slots; the caller keeps it alive.
        unsafe { TriggerRing::new(self.host.host_ptr().cast()) }
    }
}

/// Publishes the tail into the device's copy (for every transport: the copy is in device memory) with a stream write (no copy engine involved), or, where
/// the device cannot do stream memory operations, with an 8-byte copy from pinned memory.
pub struct DeviceTailPublisher {
    stream: Stream,
    device_tail: DevicePtr,
    staging: Option<PinnedHostBuffer>,
}

impl TailPublisher for DeviceTailPublisher {
    fn publish(&mut self, tail: u64) -> Result<()> {
        match &self.staging {
            // SAFETY: the device tail is an aligned word of the FIFO's device memory, which the
            // communicator frees only after the proxy (and so this publisher) has stopped.
            None => unsafe { self.stream.write_u64(self.device_tail, tail) },
            Some(buf) => {
                // SAFETY: an aligned u64 in pinned memory we own; the DMA may read it at any time,
                // and tails only grow, so a later value is as good as this one.
                unsafe { std::ptr::write_volatile(buf.host_ptr().cast::<u64>(), tail) };
                // SAFETY: the staging word is ours, freed (by cuMemFreeHost, which waits for the
                // device's pending work) only with this publisher; the device tail as above.
                unsafe { self.stream.copy(self.device_tail, buf.device_ptr(), 8) }
            }
        }
    }
}

impl DeviceTailPublisher {
    pub fn new(ctx: &GpuContext, device_tail: DevicePtr) -> Result<DeviceTailPublisher> {
        let staging = if ctx.can_write_u64_from_streams()? {
            None
        } else {
            Some(PinnedHostBuffer::zeroed(ctx, 64)?)
        };
        Ok(DeviceTailPublisher {
            stream: Stream::new(ctx)?,
            device_tail,
            staging,
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn load16(p: *const [u64; 2]) -> [u64; 2] {
    use std::arch::x86_64::{__m128i, _mm_extract_epi64};
    let v: __m128i;
    // SAFETY: `p` is a valid 16-byte-aligned slot; MOVDQA is a single 16-byte load, and `asm!` keeps
    // the compiler from caching it across polls.
    unsafe {
        std::arch::asm!("movdqa {v}, [{p}]", p = in(reg) p, v = out(xmm_reg) v, options(nostack, readonly, preserves_flags));
        [_mm_extract_epi64(v, 0) as u64, _mm_extract_epi64(v, 1) as u64]
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn load16(p: *const [u64; 2]) -> [u64; 2] {
    // SAFETY: valid aligned slot; word 0 first, then an acquire fence before word 1.
    unsafe {
        let w0 = std::ptr::read_volatile(p.cast::<u64>());
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        [w0, std::ptr::read_volatile(p.cast::<u64>().add(1))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(align(16))]
    struct Slots([[u64; 2]; FIFO_SIZE as usize + 1]);

    #[test]
    fn empty_slots_poll_none_and_release_clears_word_zero() {
        let mut slots = Box::new(Slots([[0; 2]; FIFO_SIZE as usize + 1]));
        // SAFETY: the box outlives the ring.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        assert_eq!(ring.poll(0), None);
        slots.0[1] = [7, 9];
        assert_eq!(ring.poll(1), Some([7, 9]));
        assert_eq!(
            ring.poll(1 + FIFO_SIZE),
            Some([7, 9]),
            "indices wrap modulo the ring size"
        );
        ring.release(1);
        assert_eq!(ring.poll(1), None);
        assert_eq!(slots.0[1], [0, 9], "only word 0 is cleared");
        slots.0[3] = [1, 0];
        assert_eq!(ring.occupied(), vec![3]);
        ring.set_host_tail(5);
        assert_eq!(slots.0[FIFO_SIZE as usize][0], 5, "the host tail follows the slots");
    }
}
