//! What an aborted proxy does instead of serving: it tells the kernels (the FIFO's control word, and the
//! epochs they wait on, through its handler), then releases every trigger pushed without carrying it out,
//! so that kernels pushing into a full FIFO and flushing move on, until it is stopped.

use super::fifo::TriggerRing;
use super::serve::TailPolicy;
use super::{ProxyShared, TailPublisher, TriggerHandler};

/// One step of an aborted proxy: releases the trigger at `tail`, if there is one, without carrying it out,
/// and publishes the new tail at once, so that kernels pushing into a full FIFO and flushing move on.
pub fn drain_one(
    ring: &TriggerRing,
    tail: u64,
    publisher: &mut dyn TailPublisher,
    policy: &mut TailPolicy,
    shared: &ProxyShared,
) -> Option<u64> {
    ring.poll(tail)?;
    ring.release(tail);
    let tail = tail + 1;
    ring.set_host_tail(tail);
    policy.publish(tail, publisher, shared);
    Some(tail)
}

/// How often a draining proxy releases the kernels' waits again (see `TriggerHandler::abort`).
pub(super) const RELEASE_AGAIN: std::time::Duration = std::time::Duration::from_millis(10);

/// What an aborting proxy does first: tells the kernels built on this library's header (the FIFO's
/// control word) and its handler (which raises the epochs kernels wait on).
pub(super) fn begin_abort(ring: &TriggerRing, tail: u64, handler: &mut dyn TriggerHandler) {
    ring.set_aborted();
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
    use crate::proxy::fifo::{FIFO_SIZE, TriggerRing};
    use crate::proxy::test_util::*;
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn an_aborted_proxy_releases_waits_once_and_drains_without_carrying_out() {
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
        wait_until("the aborted proxy did not drain the FIFO", || {
            tails.lock().last() == Some(&5)
        });
        // It releases them again while it drains (a peer's late flag may overwrite a released epoch).
        let first = aborts.load(Ordering::Relaxed);
        wait_until("the draining proxy did not release the waits again", || {
            aborts.load(Ordering::Relaxed) > first
        });
        // A kernel pushing after the abort still gets its slot back.
        // SAFETY: the slot is written as the device would, while the proxy polls it.
        unsafe { std::ptr::write_volatile(slots_ptr.add(5), flag().encode()) };
        wait_until("a trigger pushed after the abort was not drained", || {
            tails.lock().last() == Some(&6)
        });
        assert_eq!(p.stop().unwrap(), 6);
        assert!(aborts.load(Ordering::Relaxed) >= 1, "the handler releases the waits");
        assert!(all_released(&slots), "every slot released");
        assert_ne!(
            slots.0[FIFO_SIZE as usize + 1][0],
            0,
            "kernels see the abort in the control word"
        );
        assert_eq!(slots.0[FIFO_SIZE as usize][0], 6, "the host tail follows the drain");
    }
}
