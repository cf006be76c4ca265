//! The proxy thread: its loop (serve while healthy, drain once aborted, report a stuck wait, refresh a
//! stale device tail when idle) and the state it shares with the communicator.

use super::drain::{ABORTED_TAIL, RELEASE_AGAIN, begin_abort, drain};
use super::fifo::TriggerRing;
use super::serve::{IDLE_PUBLISH, TailPolicy, report_idle, serve_one};
use super::serve_times::{ServeTimes, thread_cpu_seconds};
use super::{AbortCause, AbortHook, TailPublisher, TriggerHandler};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

/// State shared between a proxy thread and the communicator.
#[derive(Default)]
pub struct ProxyShared {
    stop: AtomicBool,
    /// Set when the communicator aborts: the proxy stops moving data and drains the FIFO until stopped.
    abort: AtomicBool,
    /// Told when this proxy wants the communicator aborted (a stuck wait, a failure). Given when the
    /// thread is spawned, so that even a failure of the thread's own set-up reaches the communicator.
    abort_hook: Option<AbortHook>,
    /// The first error that makes the proxy's work unreliable (a CUDA failure); reported by later calls.
    failure: Mutex<Option<Error>>,
    /// Triggers dropped because they were malformed (bad connection id, out-of-bounds range).
    pub(super) dropped: AtomicU64,
    /// Triggers carried out, for tests and statistics.
    pub(super) processed: AtomicU64,
}

impl ProxyShared {
    pub fn failure(&self) -> Option<Error> {
        self.failure.lock().clone()
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }
    pub(super) fn fail(&self, e: Error) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(e.clone());
            drop(f);
            self.ask_abort(AbortCause::Failure(e));
        }
    }
    /// Makes the proxy stop moving data, release the kernels' waits and drain the FIFO.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }
    pub fn is_aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
    /// Aborts this proxy at once and tells the communicator (which aborts the others and the peers).
    pub(super) fn ask_abort(&self, cause: AbortCause) {
        self.abort();
        if let Some(h) = &self.abort_hook {
            h(cause);
        }
    }
}

/// A running proxy thread.
pub struct ProxyThread {
    shared: Arc<ProxyShared>,
    join: Option<JoinHandle<u64>>,
}

impl ProxyThread {
    /// Starts serving `ring` from `tail`. `setup` runs first on the new thread (binding it to the GPU's
    /// context and NUMA node). `on_abort` is what the thread calls when it wants the communicator aborted;
    /// it is in place before the thread starts, so that a failed `setup` reaches it too.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        name: String,
        rank: usize,
        ring: TriggerRing,
        mut tail: u64,
        mut handler: Box<dyn TriggerHandler>,
        mut publisher: Box<dyn TailPublisher>,
        setup: Box<dyn FnOnce() -> Result<()> + Send>,
        on_abort: AbortHook,
    ) -> Result<ProxyThread> {
        let shared = Arc::new(ProxyShared {
            abort_hook: Some(on_abort),
            ..Default::default()
        });
        let s = shared.clone();
        let join = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                crate::logging::set_thread_rank(rank);
                let started = std::time::Instant::now();
                if let Err(e) = setup() {
                    log::error!("proxy set-up failed: {e}");
                    s.fail(e);
                }
                let mut idle_spins: u64 = 0;
                let mut idle_since = std::time::Instant::now();
                let mut policy = TailPolicy::new(tail);
                // Time spent serving triggers (issuing copies, syncs), measured only when it will be reported.
                let mut serving = log::log_enabled!(log::Level::Info).then(ServeTimes::default);
                let mut draining = false;
                let mut released_at = std::time::Instant::now();
                let mut stuck_reported = false;
                while !s.stop.load(Ordering::Relaxed) {
                    if s.is_aborted() {
                        if !draining {
                            draining = true;
                            begin_abort(&ring, tail, handler.as_mut(), publisher.as_mut(), &mut policy, &s);
                            released_at = std::time::Instant::now();
                        }
                        if drain(&ring) == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(50));
                        }
                        if released_at.elapsed() >= RELEASE_AGAIN {
                            released_at = std::time::Instant::now();
                            if let Err(e) = handler.abort() {
                                log::debug!("releasing the kernels' waits again failed: {e}");
                            }
                        }
                        continue;
                    }
                    let times = serving.as_mut();
                    match serve_one(
                        &ring,
                        tail,
                        handler.as_mut(),
                        publisher.as_mut(),
                        &mut policy,
                        times,
                        &s,
                    ) {
                        Some(t) => {
                            tail = t;
                            idle_spins = 0;
                        }
                        None => {
                            idle_spins += 1;
                            if idle_spins == 1 {
                                idle_since = std::time::Instant::now();
                            } else if policy.published != tail
                                && idle_spins.is_multiple_of(64)
                                && idle_since.elapsed() >= IDLE_PUBLISH
                            {
                                policy.publish(tail, publisher.as_mut(), &s);
                            } else if idle_spins.is_multiple_of(1 << 22) {
                                report_idle(&ring, tail, idle_since.elapsed());
                            } else if !stuck_reported
                                && idle_spins.is_multiple_of(1 << 12)
                                && let Some(stuck) = ring.stuck_wait()
                            {
                                stuck_reported = true;
                                s.ask_abort(AbortCause::StuckWait(stuck));
                            }
                            std::hint::spin_loop();
                        }
                    }
                }
                // An aborted proxy completes nothing more (its peers may be gone) and leaves the device tail
                // raised: kernels may still push after the stop.
                let finish = if draining {
                    publisher.publish(ABORTED_TAIL)
                } else {
                    handler.sync().and_then(|_| publisher.publish(tail))
                };
                if let Err(e) = finish {
                    log::error!("final flush at FIFO position {tail} failed: {e}");
                    s.fail(e);
                }
                let wall = started.elapsed().as_secs_f64();
                log::info!(
                    "proxy stopped at FIFO position {tail}: {} triggers, {:.3} s of CPU in {wall:.3} s{}",
                    s.processed(),
                    thread_cpu_seconds(),
                    serving.map(|st| st.summary()).unwrap_or_default()
                );
                tail
            })
            .map_err(|e| Error::io("starting the proxy thread", e))?;
        Ok(ProxyThread {
            shared,
            join: Some(join),
        })
    }

    pub fn shared(&self) -> &Arc<ProxyShared> {
        &self.shared
    }

    /// Stops the thread and returns the tail it reached (the next launch resumes there).
    pub fn stop(mut self) -> Result<u64> {
        self.shared.stop.store(true, Ordering::Relaxed);
        let join = self.join.take().expect("joined once");
        join.join().map_err(|_| Error::internal("the proxy thread panicked"))
    }
}

impl Drop for ProxyThread {
    fn drop(&mut self) {
        if let Some(join) = self.join.take() {
            self.shared.stop.store(true, Ordering::Relaxed);
            let _ = join.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::fifo::FIFO_SIZE;
    use crate::proxy::test_util::*;

    #[test]
    fn idle_thread_refreshes_a_stale_device_tail() {
        let mut slots = flags(3);
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let tails = Arc::new(Mutex::new(Vec::new()));
        let (p, _) = spawn_test(
            ring,
            Box::new(Recorder::default()),
            Box::new(SharedTails(tails.clone())),
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while tails.lock().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle proxy never refreshed the tail"
            );
            std::thread::yield_now();
        }
        assert_eq!(
            *tails.lock(),
            vec![3],
            "3 triggers are fewer than FLUSH_COUNTER: refreshed when idle"
        );
        assert_eq!(p.stop().unwrap(), 3);
    }

    #[test]
    fn a_stuck_wait_report_reaches_the_abort_hook_once() {
        let mut slots = flags(0);
        let base = FIFO_SIZE as usize + 1;
        // What the header writes: expected epoch 7, last seen 5, connection 3, kind wait.
        slots.0[base + 1] = [(1 << 63) | (1 << 32) | 3, 7];
        slots.0[base + 2] = [5, 0];
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let (p, causes) = spawn_test(ring, Box::new(Recorder::default()), Box::new(Tails::default()));
        wait_until("the stuck wait was not reported", || !causes.lock().is_empty());
        p.stop().unwrap();
        let causes = causes.lock();
        assert_eq!(causes.len(), 1, "reported once");
        match &causes[0] {
            AbortCause::StuckWait(w) => {
                assert_eq!((w.conn_id, w.is_wait, w.expected, w.seen), (3, true, 7, 5), "{w}");
                assert!(w.to_string().contains("epoch 7"), "{w}");
            }
            other => panic!("expected a stuck wait, got {other:?}"),
        }
    }

    #[test]
    fn a_failed_set_up_of_the_thread_reaches_the_abort_hook() {
        let mut slots = flags(0);
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let (p, causes) = spawn_with_setup(
            ring,
            Box::new(Recorder::default()),
            Box::new(Tails::default()),
            Box::new(|| Err(Error::cuda("no context"))),
        );
        // The hook is there before the thread runs: the failure of its very first step is not lost.
        wait_until("the set-up failure was not reported", || !causes.lock().is_empty());
        assert!(p.shared().is_aborted(), "a failed proxy aborts itself");
        assert_eq!(p.shared().failure().map(|e| e.message), Some("no context".into()));
        p.stop().unwrap();
        match &causes.lock()[..] {
            [AbortCause::Failure(e)] => assert_eq!(e.message, "no context"),
            other => panic!("expected one failure, got {other:?}"),
        }
    }

    #[test]
    fn thread_serves_until_stopped_and_returns_its_tail() {
        let mut slots = flags(3);
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let (p, _) = spawn_test(ring, Box::new(Recorder::default()), Box::new(Tails::default()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while p.shared().processed() < 3 {
            assert!(std::time::Instant::now() < deadline, "proxy did not serve the triggers");
            std::thread::yield_now();
        }
        assert_eq!(p.stop().unwrap(), 3);
    }
}
