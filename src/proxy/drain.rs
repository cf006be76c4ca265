//! What an aborted proxy does instead of serving: it tells the kernels (the FIFO's control word, and the
//! epochs they wait on, through its handler), raises both copies of the FIFO's tail past any position,
//! then releases every trigger pushed without carrying it out, until it is stopped.
//!
//! Raising the tails is what lets a kernel that never looks at `aborted()` run at GPU speed: a push finds
//! the FIFO never full again (this header's push reads the device copy, the host copy when that one says
//! "full"; the legacy push reads the device copy), and a flush finds its position passed. A tail that no
//! longer counts positions also means pushes no longer wait for the proxy to take the triggers in order,
//! so the drain releases whatever slot holds one: a legacy push still waits for its slot to be empty, and
//! it must never wait for a position the drain would reach only after it. What is in the slots after the
//! abort is never carried out, so triggers that land on one another lose nothing that counts.

use super::fifo::{FIFO_SIZE, TriggerRing};
use super::serve::TailPolicy;
use super::{ProxyShared, TailPublisher, TriggerHandler};

/// The tail an aborted proxy publishes: past any position a kernel can push at (the head counts pushes,
/// 2^62 of them would take centuries), and far from wrapping when the FIFO size is added to it.
pub const ABORTED_TAIL: u64 = 1 << 62;

/// One sweep of an aborted proxy: releases every slot that holds a trigger, without carrying it out;
/// returns how many it released.
pub fn drain(ring: &TriggerRing) -> usize {
    let mut released = 0;
    for pos in 0..FIFO_SIZE {
        if ring.poll(pos).is_some() {
            ring.release(pos);
            released += 1;
        }
    }
    released
}

/// How often a draining proxy releases the kernels' waits again (see `TriggerHandler::abort`).
pub(super) const RELEASE_AGAIN: std::time::Duration = std::time::Duration::from_millis(10);

/// What an aborting proxy does first: tells the kernels built on this library's header (the FIFO's
/// control word), raises both copies of the tail to `ABORTED_TAIL`, and has its handler raise the epochs
/// kernels wait on.
pub(super) fn begin_abort(
    ring: &TriggerRing,
    tail: u64,
    handler: &mut dyn TriggerHandler,
    publisher: &mut dyn TailPublisher,
    policy: &mut TailPolicy,
    shared: &ProxyShared,
) {
    ring.set_aborted();
    ring.set_host_tail(ABORTED_TAIL);
    policy.publish(ABORTED_TAIL, publisher, shared);
    if let Err(e) = handler.abort() {
        log::error!("releasing the kernels' waits failed: {e}");
    }
    log::warn!(
        "proxy aborted at FIFO position {tail}: it moves no more data and drains the FIFO until stopped; \
         data from here on is undefined"
    );
}

#[cfg(test)]
mod tests {
    use super::ABORTED_TAIL;
    use crate::proxy::fifo::{FIFO_SIZE, TriggerRing};
    use crate::proxy::test_util::*;
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn an_aborted_proxy_raises_the_tails_releases_waits_and_drains_without_carrying_out() {
        let mut slots = flags(5);
        let slots_ptr = slots.0.as_mut_ptr();
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots_ptr) };
        let aborts = Arc::new(AtomicU64::new(0));
        let tails = Arc::new(Mutex::new(Vec::new()));
        let (p, _) = spawn_test(
            ring,
            Box::new(Aborting(aborts.clone())),
            Box::new(SharedTails(tails.clone())),
        );
        p.shared().abort();
        wait_until("the aborted proxy did not raise the device tail", || {
            tails.lock().last() == Some(&ABORTED_TAIL)
        });
        // SAFETY: the slots are read as the device would, while the proxy writes them.
        let host_word = |slot: usize| unsafe { std::ptr::read_volatile(slots_ptr.add(slot).cast::<u64>()) };
        wait_until("the aborted proxy did not drain the FIFO", || {
            (0..5).all(|slot| host_word(slot) == 0)
        });
        assert_eq!(
            host_word(FIFO_SIZE as usize),
            ABORTED_TAIL,
            "the host tail is raised too"
        );
        // It releases them again while it drains (a peer's late flag may overwrite a released epoch).
        let first = aborts.load(Ordering::Relaxed);
        wait_until("the draining proxy did not release the waits again", || {
            aborts.load(Ordering::Relaxed) > first
        });
        // A kernel pushing after the abort gets its slot back, wherever it is: pushes no longer wait for
        // positions in order.
        // SAFETY: the slot is written as the device would, while the proxy polls it.
        unsafe { std::ptr::write_volatile(slots_ptr.add(40), flag().encode()) };
        wait_until("a trigger pushed after the abort was not drained", || {
            host_word(40) == 0
        });
        p.stop().unwrap();
        assert_eq!(
            tails.lock().last(),
            Some(&ABORTED_TAIL),
            "the final flush of an aborted proxy keeps the tail raised"
        );
        assert!(aborts.load(Ordering::Relaxed) >= 1, "the handler releases the waits");
        assert!(all_released(&slots), "every slot released");
        assert_ne!(
            slots.0[FIFO_SIZE as usize + 1][0],
            0,
            "kernels see the abort in the control word"
        );
    }
}
