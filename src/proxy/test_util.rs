//! What the proxy's tests share: a FIFO in host memory, handlers and publishers that record.

use super::fifo::{self, FIFO_SIZE, TriggerRing};
use super::{AbortCause, AbortHook, ProxyThread, TailPublisher, Trigger, TriggerHandler, trigger};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[repr(align(16))]
pub struct Slots(pub [[u64; 2]; FIFO_SIZE as usize + 1 + fifo::CONTROL_SLOTS]);

#[derive(Default)]
pub struct Recorder {
    pub handled: Vec<Trigger>,
    pub syncs: usize,
    pub fail_conn: Option<u16>,
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
pub struct Tails(pub Vec<u64>);
impl TailPublisher for Tails {
    fn publish(&mut self, tail: u64) -> Result<()> {
        self.0.push(tail);
        Ok(())
    }
}

/// A test proxy thread serving `ring` from position 0, whose abort hook records what it is told.
pub fn spawn_test(
    ring: TriggerRing,
    handler: Box<dyn TriggerHandler>,
    publisher: Box<dyn TailPublisher>,
) -> (ProxyThread, Arc<Mutex<Vec<AbortCause>>>) {
    spawn_with_setup(ring, handler, publisher, Box::new(|| Ok(())))
}

/// `spawn_test` with a set-up of the test's own.
pub fn spawn_with_setup(
    ring: TriggerRing,
    handler: Box<dyn TriggerHandler>,
    publisher: Box<dyn TailPublisher>,
    setup: Box<dyn FnOnce() -> Result<()> + Send>,
) -> (ProxyThread, Arc<Mutex<Vec<AbortCause>>>) {
    let causes = Arc::new(Mutex::new(Vec::new()));
    let seen = causes.clone();
    let on_abort: AbortHook = Arc::new(move |c| seen.lock().push(c));
    let p = ProxyThread::spawn("test-proxy".into(), 0, ring, 0, handler, publisher, setup, on_abort).unwrap();
    (p, causes)
}

/// Publishes tails where the test reads them while the thread runs.
pub struct SharedTails(pub Arc<Mutex<Vec<u64>>>);
impl TailPublisher for SharedTails {
    fn publish(&mut self, tail: u64) -> Result<()> {
        self.0.lock().push(tail);
        Ok(())
    }
}

pub fn push(slots: &mut Slots, pos: u64, t: Trigger) {
    slots.0[(pos % FIFO_SIZE) as usize] = t.encode();
}

pub fn flag() -> Trigger {
    Trigger {
        data_size: 1,
        src_offset: 0,
        dst_offset: 0,
        conn_id: 0,
        kind: trigger::TYPE_FLAG,
    }
}

/// A FIFO holding `n` flag triggers from position 0.
pub fn flags(n: u64) -> Box<Slots> {
    let mut slots = Box::new(Slots([[0; 2]; FIFO_SIZE as usize + 1 + fifo::CONTROL_SLOTS]));
    for pos in 0..n {
        push(&mut slots, pos, flag());
    }
    slots
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::yield_now();
    }
}

pub fn all_released(slots: &Slots) -> bool {
    slots.0[..FIFO_SIZE as usize].iter().all(|s| s[0] == 0)
}

/// A recorder whose `abort` is seen from outside the thread.
pub struct Aborting(pub Arc<AtomicU64>);
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
