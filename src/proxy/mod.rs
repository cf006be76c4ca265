//! The proxy: a host thread that serves one FIFO of triggers pushed by kernels.
//!
//! The loop is the same for every transport: take the trigger at the tail, let the transport carry out
//! its Data and Flag parts, complete everything issued so far on a Sync, release the slot, and publish
//! the tail to the device at least every `FLUSH_COUNTER` triggers, after every Sync, when it falls idle
//! with progress the device has not seen, and on stop.
//! Transports plug in through `TriggerHandler`; the device copy of the tail through `TailPublisher`.

pub mod affinity;
pub mod fifo;
pub mod trigger;

use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use fifo::{DeviceFifo, DeviceTailPublisher, FLUSH_COUNTER, TriggerRing};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
pub use trigger::Trigger;

/// What a transport does with triggers.
pub trait TriggerHandler: Send {
    /// Issues the Data and Flag parts of a trigger. An `Err` drops the trigger (after logging).
    fn handle(&mut self, trigger: &Trigger) -> Result<()>;
    /// Completes everything issued so far.
    fn sync(&mut self) -> Result<()>;
    /// The communicator is aborted: stop moving data, and release the kernels waiting on this proxy's
    /// connections by raising the epochs they wait on past anything they can expect (legacy device code
    /// knows no other way out of `wait()`). Called on the proxy thread when it aborts, and again every
    /// `RELEASE_AGAIN` while it drains: a peer's proxy that has not yet learned of the abort may still copy
    /// a flag over a released epoch.
    fn abort(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Why a proxy asks its communicator to abort.
#[derive(Clone, Debug)]
pub enum AbortCause {
    /// A kernel's wait spun past `MSCCLPP_WAIT_TIMEOUT` and reported itself.
    StuckWait(fifo::StuckWait),
    /// The proxy's machinery failed (a CUDA or verbs error): its data can no longer be trusted.
    Failure(Error),
}

/// What the communicator does when one of its proxies asks it to abort (called on the proxy thread).
pub type AbortHook = Arc<dyn Fn(AbortCause) + Send + Sync>;

/// Writes the proxy's tail where the device reads it.
pub trait TailPublisher: Send {
    fn publish(&mut self, tail: u64) -> Result<()>;
}

/// State shared between a proxy thread and the communicator.
#[derive(Default)]
pub struct ProxyShared {
    stop: AtomicBool,
    /// Set when the communicator aborts: the proxy stops moving data and drains the FIFO until stopped.
    abort: AtomicBool,
    /// Told when this proxy wants the communicator aborted (a stuck wait, a failure).
    abort_hook: Mutex<Option<AbortHook>>,
    /// The first error that makes the proxy's work unreliable (a CUDA failure); reported by later calls.
    failure: Mutex<Option<Error>>,
    /// Triggers dropped because they were malformed (bad connection id, out-of-bounds range).
    dropped: AtomicU64,
    /// Triggers carried out, for tests and statistics.
    processed: AtomicU64,
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
    fn fail(&self, e: Error) {
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
    pub fn set_abort_hook(&self, hook: AbortHook) {
        *self.abort_hook.lock() = Some(hook);
    }
    /// Aborts this proxy at once and tells the communicator (which aborts the others and the peers).
    fn ask_abort(&self, cause: AbortCause) {
        self.abort();
        let hook = self.abort_hook.lock().clone();
        if let Some(h) = hook {
            h(cause);
        }
    }
}

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
    published: u64,
}

/// How long an idle proxy waits before it refreshes a stale device tail.
const IDLE_PUBLISH: std::time::Duration = std::time::Duration::from_micros(20);

impl TailPolicy {
    /// `published`: the tail the device already holds.
    pub fn new(published: u64) -> TailPolicy {
        TailPolicy { published }
    }

    fn publish(&mut self, tail: u64, publisher: &mut dyn TailPublisher, shared: &ProxyShared) {
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
const RELEASE_AGAIN: std::time::Duration = std::time::Duration::from_millis(10);

/// What an aborting proxy does first: tells the kernels built on this library's header (the FIFO's
/// control word) and its handler (which raises the epochs kernels wait on).
fn begin_abort(ring: &TriggerRing, tail: u64, handler: &mut dyn TriggerHandler) {
    ring.set_aborted();
    if let Err(e) = handler.abort() {
        log::error!("releasing the kernels' waits failed: {e}");
    }
    log::warn!(
        "proxy aborted at FIFO position {tail}: it moves no more data and drains the FIFO until stopped; \
         data from here on is undefined"
    );
}

/// A proxy that has seen no trigger for a while says where it stands (at DEBUG level), and what the
/// slots hold: written slots other than the next one mean a kernel wrote out of order.
fn report_idle(ring: &TriggerRing, tail: u64, idle: std::time::Duration) {
    if idle.as_secs() >= 2 && log::log_enabled!(log::Level::Debug) {
        log::debug!(
            "proxy idle for {:.1} s at FIFO position {tail} (slot {}); slots holding triggers: {:?}",
            idle.as_secs_f64(),
            tail % fifo::FIFO_SIZE,
            ring.occupied()
        );
    }
}

/// How long the proxy took to serve each trigger (from seeing it to releasing its slot), by kind: the
/// CPU cost of issuing the transport's work, which lies on the path of every signal.
#[derive(Default)]
pub struct ServeTimes {
    /// Per class (see `class_of`): count, total, max.
    classes: [(u64, std::time::Duration, std::time::Duration); 5],
}

impl ServeTimes {
    const NAMES: [&'static str; 5] = [
        "flag only",
        "data <= 64 KiB",
        "data <= 4 MiB",
        "data > 4 MiB",
        "with sync",
    ];

    fn class_of(t: &Trigger) -> usize {
        if t.has_sync() {
            4
        } else if !t.has_data() {
            0
        } else if t.data_size <= 64 << 10 {
            1
        } else if t.data_size <= 4 << 20 {
            2
        } else {
            3
        }
    }

    fn add(&mut self, t: &Trigger, d: std::time::Duration) {
        let c = &mut self.classes[Self::class_of(t)];
        c.0 += 1;
        c.1 += d;
        c.2 = c.2.max(d);
    }

    fn summary(&self) -> String {
        let parts: Vec<String> = self
            .classes
            .iter()
            .zip(Self::NAMES)
            .filter(|((n, _, _), _)| *n > 0)
            .map(|((n, total, max), name)| {
                format!(
                    "{name}: {n} x {:.2} us (max {:.1})",
                    total.as_secs_f64() * 1e6 / *n as f64,
                    max.as_secs_f64() * 1e6
                )
            })
            .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!("; time to serve a trigger: {}", parts.join(", "))
        }
    }
}

/// CPU time the calling thread has used (the proxy polls, so this shows what the polling costs).
fn thread_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage is valid, and getrusage fills it.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A running proxy thread.
pub struct ProxyThread {
    shared: Arc<ProxyShared>,
    join: Option<JoinHandle<u64>>,
}

impl ProxyThread {
    /// Starts serving `ring` from `tail`. `setup` runs first on the new thread (binding it to the GPU's
    /// context and NUMA node).
    pub fn spawn(
        name: String,
        rank: usize,
        ring: TriggerRing,
        mut tail: u64,
        mut handler: Box<dyn TriggerHandler>,
        mut publisher: Box<dyn TailPublisher>,
        setup: Box<dyn FnOnce() -> Result<()> + Send>,
    ) -> Result<ProxyThread> {
        let shared = Arc::new(ProxyShared::default());
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
                            begin_abort(&ring, tail, handler.as_mut());
                            released_at = std::time::Instant::now();
                        }
                        match drain_one(&ring, tail, publisher.as_mut(), &mut policy, &s) {
                            Some(t) => tail = t,
                            None => std::thread::sleep(std::time::Duration::from_micros(50)),
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
                // An aborted proxy completes nothing more: its peers may be gone.
                let finish = if draining {
                    publisher.publish(tail)
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

/// The proxy of one FIFO across launches: the running thread, where the last one stopped (the next
/// resumes there, since the device head lives on), and the last one's shared state (kept after it stops,
/// so that its failure is still reported).
#[derive(Default)]
pub struct ProxySlot {
    thread: Option<ProxyThread>,
    tail: u64,
    shared: Option<Arc<ProxyShared>>,
    abort_hook: Option<AbortHook>,
    aborted: bool,
}

impl ProxySlot {
    pub fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// The failure of the running or last proxy, if it had one.
    pub fn failure(&self) -> Option<Error> {
        self.shared.as_ref().and_then(|s| s.failure())
    }

    /// Starts a thread named `name` serving `fifo` with `handler`, on `gpu`'s context and near it.
    ///
    /// # Safety
    /// `fifo` must outlive the thread: keep it until `stop` has returned (or this slot is dropped).
    pub unsafe fn launch(
        &mut self,
        name: String,
        rank: usize,
        gpu: GpuContext,
        fifo: &DeviceFifo,
        handler: Box<dyn TriggerHandler>,
    ) -> Result<()> {
        let publisher = DeviceTailPublisher::new(&gpu, fifo.device_tail())?;
        // SAFETY: the caller keeps `fifo` until the thread is stopped (this function's contract).
        let ring = unsafe { fifo.ring() };
        let thread = ProxyThread::spawn(
            name,
            rank,
            ring,
            self.tail,
            handler,
            Box::new(publisher),
            Box::new(move || {
                gpu.make_current()?;
                affinity::bind_proxy_thread(&gpu);
                Ok(())
            }),
        )?;
        if let Some(hook) = &self.abort_hook {
            thread.shared().set_abort_hook(hook.clone());
        }
        if self.aborted {
            thread.shared().abort();
        }
        self.shared = Some(thread.shared().clone());
        self.thread = Some(thread);
        Ok(())
    }

    /// What the proxies launched from here on call when they want the communicator aborted.
    pub fn set_abort_hook(&mut self, hook: AbortHook) {
        if let Some(s) = &self.shared {
            s.set_abort_hook(hook.clone());
        }
        self.abort_hook = Some(hook);
    }

    /// Aborts the running proxy (it stops moving data, releases the kernels' waits and drains the FIFO)
    /// and any launched later.
    pub fn abort(&mut self) {
        self.aborted = true;
        if let Some(s) = &self.shared {
            s.abort();
        }
    }

    /// Stops the thread, if it runs, and warns if `what` (the proxy, for the log) dropped triggers.
    pub fn stop(&mut self, what: &str) -> Result<()> {
        if let Some(thread) = self.thread.take() {
            self.tail = thread.stop()?;
            if let Some(s) = &self.shared
                && s.dropped() > 0
            {
                log::warn!(
                    "{what} dropped {} malformed trigger(s); see the errors logged",
                    s.dropped()
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fifo::FIFO_SIZE;

    #[repr(align(16))]
    struct Slots([[u64; 2]; FIFO_SIZE as usize + 1 + fifo::CONTROL_SLOTS]);

    #[derive(Default)]
    struct Recorder {
        handled: Vec<Trigger>,
        syncs: usize,
        fail_conn: Option<u16>,
    }
    impl TriggerHandler for Recorder {
        fn handle(&mut self, t: &Trigger) -> Result<()> {
            if Some(t.conn_id) == self.fail_conn {
                return Err(Error::invalid_usage("no such connection"));
            }
            self.handled.push(*t);
            Ok(())
        }
        fn sync(&mut self) -> Result<()> {
            self.syncs += 1;
            Ok(())
        }
    }
    #[derive(Default)]
    struct Tails(Vec<u64>);
    impl TailPublisher for Tails {
        fn publish(&mut self, tail: u64) -> Result<()> {
            self.0.push(tail);
            Ok(())
        }
    }

    /// A test proxy thread serving `ring` from position 0.
    fn spawn_test(
        ring: TriggerRing,
        handler: Box<dyn TriggerHandler>,
        publisher: Box<dyn TailPublisher>,
    ) -> ProxyThread {
        ProxyThread::spawn("test-proxy".into(), 0, ring, 0, handler, publisher, Box::new(|| Ok(()))).unwrap()
    }

    /// Publishes tails where the test reads them while the thread runs.
    struct SharedTails(Arc<Mutex<Vec<u64>>>);
    impl TailPublisher for SharedTails {
        fn publish(&mut self, tail: u64) -> Result<()> {
            self.0.lock().push(tail);
            Ok(())
        }
    }

    fn push(slots: &mut Slots, pos: u64, t: Trigger) {
        slots.0[(pos % FIFO_SIZE) as usize] = t.encode();
    }

    fn flag() -> Trigger {
        Trigger {
            data_size: 1,
            src_offset: 0,
            dst_offset: 0,
            conn_id: 0,
            kind: trigger::TYPE_FLAG,
        }
    }

    /// A FIFO holding `n` flag triggers from position 0.
    fn flags(n: u64) -> Box<Slots> {
        let mut slots = Box::new(Slots([[0; 2]; FIFO_SIZE as usize + 1 + fifo::CONTROL_SLOTS]));
        for pos in 0..n {
            push(&mut slots, pos, flag());
        }
        slots
    }

    #[test]
    fn tail_is_published_every_flush_counter_and_after_sync() {
        let mut slots = Box::new(Slots([[0; 2]; FIFO_SIZE as usize + 1 + fifo::CONTROL_SLOTS]));
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
        let mut slots = Box::new(Slots([[0; 2]; FIFO_SIZE as usize + 1 + fifo::CONTROL_SLOTS]));
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

    #[test]
    fn serve_times_summarise_each_kind() {
        let mut st = ServeTimes::default();
        assert_eq!(st.summary(), "", "nothing to say before the first trigger");
        let t = |kind, data_size| Trigger {
            data_size,
            src_offset: 0,
            dst_offset: 0,
            conn_id: 0,
            kind,
        };
        let us = std::time::Duration::from_micros;
        st.add(&t(trigger::TYPE_FLAG, 1), us(1));
        st.add(&t(trigger::TYPE_FLAG, 1), us(3));
        st.add(&t(trigger::TYPE_DATA | trigger::TYPE_FLAG, 1 << 20), us(5));
        st.add(&t(trigger::TYPE_SYNC, 1), us(7));
        assert_eq!(
            st.summary(),
            "; time to serve a trigger: flag only: 2 x 2.00 us (max 3.0), data <= 4 MiB: 1 x 5.00 us (max 5.0), \
             with sync: 1 x 7.00 us (max 7.0)"
        );
    }

    #[test]
    fn idle_thread_refreshes_a_stale_device_tail() {
        let mut slots = flags(3);
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let tails = Arc::new(Mutex::new(Vec::new()));
        let p = spawn_test(
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

    /// A recorder whose `abort` is seen from outside the thread.
    struct Aborting(Arc<AtomicU64>);
    impl TriggerHandler for Aborting {
        fn handle(&mut self, _: &Trigger) -> Result<()> {
            Err(Error::internal("an aborted proxy must not carry triggers out"))
        }
        fn sync(&mut self) -> Result<()> {
            Err(Error::internal("an aborted proxy must not sync"))
        }
        fn abort(&mut self) -> Result<()> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn an_aborted_proxy_releases_waits_once_and_drains_without_carrying_out() {
        let mut slots = flags(5);
        let slots_ptr = slots.0.as_mut_ptr();
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots_ptr) };
        let aborts = Arc::new(AtomicU64::new(0));
        let tails = Arc::new(Mutex::new(Vec::new()));
        let p = spawn_test(
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

    fn all_released(slots: &Slots) -> bool {
        slots.0[..FIFO_SIZE as usize].iter().all(|s| s[0] == 0)
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
        let causes = Arc::new(Mutex::new(Vec::new()));
        let p = spawn_test(ring, Box::new(Recorder::default()), Box::new(Tails::default()));
        let seen = causes.clone();
        let shared = p.shared().clone();
        p.shared().set_abort_hook(Arc::new(move |c| {
            seen.lock().push(c);
            shared.abort();
        }));
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
    fn thread_serves_until_stopped_and_returns_its_tail() {
        let mut slots = flags(3);
        // SAFETY: `slots` outlives the thread, which is stopped below.
        let ring = unsafe { TriggerRing::new(slots.0.as_mut_ptr()) };
        let p = spawn_test(ring, Box::new(Recorder::default()), Box::new(Tails::default()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while p.shared().processed() < 3 {
            assert!(std::time::Instant::now() < deadline, "proxy did not serve the triggers");
            std::thread::yield_now();
        }
        assert_eq!(p.stop().unwrap(), 3);
    }
}
