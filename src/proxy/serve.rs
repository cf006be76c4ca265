//! One step of the proxy's serving loop: take the trigger at the tail, let the transport carry out its
//! Data and Flag parts, complete everything issued so far on a Sync, release the slot, and publish the
//! tail to the device at least every `FLUSH_COUNTER` triggers, after every Sync, and (the thread's loop,
//! through `TailPolicy::publish`) when it falls idle with progress the device has not seen.

use super::fifo::{FIFO_SIZE, FLUSH_COUNTER, TriggerRing};
use super::serve_times::ServeTimes;
use super::{ProxyShared, TailPublisher, Trigger, TriggerHandler};
use crate::error::Error;
use std::sync::atomic::Ordering;

/// Whether an error means the trigger was malformed (dropped, the proxy goes on) rather than a failure
/// of the machinery (recorded and reported by later calls).
fn is_bad_trigger(e: &Error) -> bool {
    e.kind == crate::error::ErrorKind::InvalidUsage
}

/// When the device's copy of the tail is refreshed: every `FLUSH_COUNTER` triggers, after a Sync, and
/// when the proxy has been idle for `IDLE_PUBLISH` with progress the device has not seen. The last keeps
/// a legacy kernel moving that waits on a full FIFO (only the device copy tells it the proxy went on)
/// after the proxy ran out of triggers a few short of a multiple of `FLUSH_COUNTER` (the legacy proxy
/// refreshed only by count and on Sync).
pub struct TailPolicy {
    /// The tail the device holds.
    pub(super) published: u64,
}

/// How long an idle proxy waits before it refreshes a stale device tail.
pub(super) const IDLE_PUBLISH: std::time::Duration = std::time::Duration::from_micros(20);

impl TailPolicy {
    /// `published`: the tail the device already holds.
    pub fn new(published: u64) -> TailPolicy {
        TailPolicy { published }
    }

    /// Publishes `tail` now (a failure fails the proxy).
    pub(super) fn publish(&mut self, tail: u64, publisher: &mut dyn TailPublisher, shared: &ProxyShared) {
        if let Err(e) = publisher.publish(tail) {
            log::error!("publishing the FIFO tail {tail} failed: {e}");
            shared.fail(e);
        }
        self.published = tail;
    }
}

/// One step of the loop: serves the trigger at `tail` if there is one, and returns the new tail. With
/// `times`, adds how long serving it took.
pub fn serve_one(
    ring: &TriggerRing,
    tail: u64,
    handler: &mut dyn TriggerHandler,
    publisher: &mut dyn TailPublisher,
    policy: &mut TailPolicy,
    times: Option<&mut ServeTimes>,
    shared: &ProxyShared,
) -> Option<u64> {
    let words = ring.poll(tail)?;
    let started = times.is_some().then(std::time::Instant::now);
    let trigger = Trigger::decode(words);
    if let Err(e) = handler.handle(&trigger) {
        if is_bad_trigger(&e) {
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            log::error!("dropped {trigger:?} at FIFO position {tail}: {e}");
        } else {
            log::error!("{trigger:?} at FIFO position {tail} failed: {e}");
            shared.fail(e);
        }
    }
    if trigger.has_sync()
        && let Err(e) = handler.sync()
    {
        log::error!("sync for {trigger:?} at FIFO position {tail} failed: {e}");
        shared.fail(e);
    }
    // Clear the slot before either tail moves past it (the header's push relies on this order).
    ring.release(tail);
    let tail = tail + 1;
    ring.set_host_tail(tail);
    shared.processed.fetch_add(1, Ordering::Relaxed);
    if trigger.has_sync() || tail - policy.published >= FLUSH_COUNTER {
        policy.publish(tail, publisher, shared);
    }
    if let (Some(times), Some(started)) = (times, started) {
        times.add(&trigger, started.elapsed());
    }
    Some(tail)
}

/// A proxy that has seen no trigger for a while says where it stands (at DEBUG level), and what the
/// slots hold: written slots other than the next one mean a kernel wrote out of order.
pub(super) fn report_idle(ring: &TriggerRing, tail: u64, idle: std::time::Duration) {
    if idle.as_secs() >= 2 && log::log_enabled!(log::Level::Debug) {
        log::debug!(
            "proxy idle for {:.1} s at FIFO position {tail} (slot {}); slots holding triggers: {:?}",
            idle.as_secs_f64(),
            tail % FIFO_SIZE,
            ring.occupied()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::test_util::*;
    use crate::proxy::trigger;

    #[test]
    fn tail_is_published_every_flush_counter_and_after_sync() {
        let mut slots = Box::new(Slots(
            [[0; 2]; FIFO_SIZE as usize + 1 + crate::proxy::fifo::CONTROL_SLOTS],
        ));
        let data = Trigger {
            data_size: 8,
            src_offset: 0,
            dst_offset: 0,
            conn_id: 0,
            kind: trigger::TYPE_DATA,
        };
        let sync = Trigger {
            data_size: 1,
            kind: trigger::TYPE_SYNC,
            ..data
        };
        for pos in 0..6 {
            push(&mut slots, pos, if pos == 1 { sync } else { data });
        }
        // SAFETY: `slots` outlives the ring.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let (mut h, mut p, shared) = (Recorder::default(), Tails::default(), ProxyShared::default());
        let mut tail = 0;
        let mut policy = TailPolicy::new(0);
        while let Some(t) = serve_one(&ring, tail, &mut h, &mut p, &mut policy, None, &shared) {
            tail = t;
        }
        assert_eq!(tail, 6);
        assert_eq!(h.handled.len(), 6);
        assert_eq!(h.syncs, 1);
        assert_eq!(
            p.0,
            vec![2, 6],
            "after the Sync at position 1, then FLUSH_COUNTER triggers later"
        );
        assert!(
            slots.0[..FIFO_SIZE as usize].iter().all(|s| s[0] == 0),
            "every served slot is released"
        );
        assert_eq!(
            slots.0[FIFO_SIZE as usize][0], 6,
            "the host tail is current after every trigger"
        );
    }

    #[test]
    fn tail_is_published_every_flush_counter_without_syncs() {
        let mut slots = flags(10);
        // SAFETY: `slots` outlives the ring.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let (mut h, mut p, shared) = (Recorder::default(), Tails::default(), ProxyShared::default());
        let (mut policy, mut times) = (TailPolicy::new(0), ServeTimes::default());
        let mut tail = 0;
        while let Some(t) = serve_one(&ring, tail, &mut h, &mut p, &mut policy, Some(&mut times), &shared) {
            tail = t;
        }
        assert_eq!(p.0, vec![4, 8], "the last 2 are left to the idle refresh");
        assert!(
            times.summary().contains("flag only: 10 x"),
            "every trigger served is timed: {}",
            times.summary()
        );
    }

    #[test]
    fn bad_triggers_are_dropped_and_released() {
        let mut slots = Box::new(Slots(
            [[0; 2]; FIFO_SIZE as usize + 1 + crate::proxy::fifo::CONTROL_SLOTS],
        ));
        let bad = Trigger {
            data_size: 8,
            src_offset: 0,
            dst_offset: 0,
            conn_id: 9,
            kind: 3,
        };
        push(&mut slots, 0, bad);
        push(&mut slots, 1, Trigger { conn_id: 0, ..bad });
        // SAFETY: `slots` outlives the ring.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let mut h = Recorder {
            fail_conn: Some(9),
            ..Default::default()
        };
        let (mut p, shared) = (Tails::default(), ProxyShared::default());
        let mut policy = TailPolicy::new(0);
        let t = serve_one(&ring, 0, &mut h, &mut p, &mut policy, None, &shared).unwrap();
        let t = serve_one(&ring, t, &mut h, &mut p, &mut policy, None, &shared).unwrap();
        assert_eq!(t, 2);
        assert_eq!(shared.dropped(), 1);
        assert!(
            shared.failure().is_none(),
            "a malformed trigger is not a failure of the proxy"
        );
        assert_eq!(h.handled.len(), 1);
    }
}
