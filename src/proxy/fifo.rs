//! The proxy's side of the trigger FIFO: 128 slots the device writes, read and released in order.

/// Slots in the FIFO (`MSCCLPP_PROXY_FIFO_SIZE`).
pub const FIFO_SIZE: u64 = 128;
/// The device's copy of the tail is refreshed at least this often (`MSCCLPP_PROXY_FIFO_FLUSH_COUNTER`).
pub const FLUSH_COUNTER: u64 = 4;

/// A ring of 16-byte slots in memory the device writes (pinned host memory in production, a plain
/// buffer in tests).
pub struct TriggerRing {
    slots: *mut [u64; 2],
}

// SAFETY: the ring is read and cleared only by the one proxy thread that owns it; the device is the
// only other party and follows the FIFO protocol.
unsafe impl Send for TriggerRing {}

impl TriggerRing {
    /// # Safety
    /// `slots` points at `FIFO_SIZE` 16-byte-aligned slots that outlive the ring.
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
    struct Slots([[u64; 2]; FIFO_SIZE as usize]);

    #[test]
    fn empty_slots_poll_none_and_release_clears_word_zero() {
        let mut slots = Box::new(Slots([[0; 2]; FIFO_SIZE as usize]));
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
    }
}
