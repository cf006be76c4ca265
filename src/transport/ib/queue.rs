//! A queue pair with the accounting that keeps its send queue and completion queue from overflowing.
//!
//! Every write is signaled, so the number of writes in flight is exactly `posted - completed`: a write is
//! posted only while that is below the send-queue depth, and the completion queue is made at least that
//! deep, so neither queue can be overrun however fast triggers arrive. Completions of a reliable-connected
//! queue pair arrive in posting order, which lets "everything before write n has completed" be a counter.
//!
//! The proxy thread and `mscclppRegisteredBufferWrite` (on the application's thread) share a queue; the
//! lock is held for one post or one poll at a time.

use super::verbs::{Completion, QueuePair, RdmaWrite, WC_SUCCESS, status_name};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// The largest single RDMA write we post; longer ranges are split (ports commonly cap messages at 2 GiB).
pub const MAX_WRITE: u64 = 1 << 30;

/// Who is at each end, for error messages.
#[derive(Clone, Debug)]
pub struct QueueLabel {
    pub rank: usize,
    pub peer: usize,
    pub tag: i32,
    pub device: String,
}

struct QueueState {
    qp: Box<dyn QueuePair>,
    posted: u64,
    completed: u64,
    /// The first failure; the queue pair is unusable after it.
    failure: Option<Error>,
    scratch: Vec<Completion>,
}

pub struct IbQueue {
    label: QueueLabel,
    depth: u64,
    poll_batch: usize,
    /// How long a wait may go without any completion before it gives up (the peer is gone).
    stall_timeout: Duration,
    carries_values: bool,
    state: Mutex<QueueState>,
}

impl IbQueue {
    pub fn new(qp: Box<dyn QueuePair>, label: QueueLabel, poll_batch: usize, stall_timeout: Duration) -> IbQueue {
        // Never more writes in flight than either queue holds.
        let depth = qp.send_depth().min(qp.cq_size()).max(1) as u64;
        IbQueue {
            label,
            depth,
            poll_batch: poll_batch.clamp(1, depth as usize),
            stall_timeout,
            carries_values: qp.max_inline() >= 8,
            state: Mutex::new(QueueState {
                qp,
                posted: 0,
                completed: 0,
                failure: None,
                scratch: Vec::new(),
            }),
        }
    }

    pub fn depth(&self) -> u64 {
        self.depth
    }

    /// Writes posted and not yet completed.
    pub fn in_flight(&self) -> u64 {
        let st = self.state.lock();
        st.posted - st.completed
    }

    pub fn failure(&self) -> Option<Error> {
        self.state.lock().failure.clone()
    }

    /// Runs `f` on the queue pair (set-up: RTR/RTS).
    pub fn with_qp<T>(&self, f: impl FnOnce(&mut dyn QueuePair) -> Result<T>) -> Result<T> {
        f(self.state.lock().qp.as_mut())
    }

    /// Posts a signaled write of `[local, +len)` to `remote`, split into writes of at most `MAX_WRITE`,
    /// waiting for room in the send queue first. Returns the sequence number of the last write: it has
    /// completed once `wait_for` of it returns.
    pub fn write(&self, local: u64, lkey: u32, len: u64, remote: u64, rkey: u32) -> Result<u64> {
        let mut done = 0;
        loop {
            let n = (len - done).min(MAX_WRITE);
            let seq = self.post_one(RdmaWrite {
                wr_id: 0,
                local_addr: local + done,
                lkey,
                len: n as u32,
                remote_addr: remote + done,
                rkey,
                signaled: true,
                inline_value: None,
            })?;
            done += n;
            if done >= len {
                return Ok(seq);
            }
        }
    }

    /// Whether `write_value` may be used: the queue pair carries 8 bytes inline.
    pub fn carries_values(&self) -> bool {
        self.carries_values
    }

    /// Posts a signaled write of `value` (taken now, carried in the work request) to `remote`; as `write`.
    pub fn write_value(&self, value: u64, remote: u64, rkey: u32) -> Result<u64> {
        self.post_one(RdmaWrite {
            wr_id: 0,
            local_addr: 0,
            lkey: 0,
            len: 8,
            remote_addr: remote,
            rkey,
            signaled: true,
            inline_value: Some(value),
        })
    }

    /// Posts `wr` (its `wr_id` becomes the next sequence number) once the send queue has room.
    fn post_one(&self, mut wr: RdmaWrite) -> Result<u64> {
        let mut st = self.state.lock();
        let mut last_progress = Instant::now();
        loop {
            if let Some(f) = &st.failure {
                return Err(f.clone());
            }
            if st.posted - st.completed < self.depth {
                break;
            }
            // The send queue is full: reap completions until a slot frees.
            if self.poll_locked(&mut st)? > 0 {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > self.stall_timeout {
                return Err(self.stalled(&mut st));
            } else {
                std::hint::spin_loop();
            }
        }
        wr.wr_id = st.posted;
        if let Err(e) = st.qp.post_write(&wr) {
            let e = Error::new(
                e.kind,
                format!(
                    "rank {}: posting an RDMA write to rank {} (tag {}, {}) failed: {}",
                    self.label.rank, self.label.peer, self.label.tag, self.label.device, e.message
                ),
            );
            log::error!("{e}");
            st.failure = Some(e.clone());
            return Err(e);
        }
        st.posted += 1;
        Ok(wr.wr_id)
    }

    /// Waits until write `seq` (and so every write before it) has completed.
    pub fn wait_for(&self, seq: u64) -> Result<()> {
        let mut last_progress = Instant::now();
        loop {
            let mut st = self.state.lock();
            if let Some(f) = &st.failure {
                return Err(f.clone());
            }
            if st.completed > seq {
                return Ok(());
            }
            if self.poll_locked(&mut st)? > 0 {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > self.stall_timeout {
                return Err(self.stalled(&mut st));
            } else {
                drop(st);
                std::hint::spin_loop();
            }
        }
    }

    /// Reaps up to one batch of completions. Returns how many succeeded.
    fn poll_locked(&self, st: &mut QueueState) -> Result<usize> {
        let mut out = std::mem::take(&mut st.scratch);
        out.clear();
        let polled = st.qp.poll(&mut out, self.poll_batch);
        let result = match polled {
            Err(e) => {
                let e = Error::new(
                    e.kind,
                    format!(
                        "rank {}: polling the completion queue of the connection to rank {} (tag {}, {}) failed: {}",
                        self.label.rank, self.label.peer, self.label.tag, self.label.device, e.message
                    ),
                );
                log::error!("{e}");
                st.failure = Some(e.clone());
                Err(e)
            }
            Ok(_) => {
                let mut ok = 0;
                let mut result = Ok(0);
                for c in &out {
                    if c.status != WC_SUCCESS {
                        let e = Error::remote(format!(
                            "rank {}: RDMA write to rank {} (tag {}, {}) failed: {} (status {}, vendor error {:#x}, write {})",
                            self.label.rank,
                            self.label.peer,
                            self.label.tag,
                            self.label.device,
                            status_name(c.status),
                            c.status,
                            c.vendor_err,
                            c.wr_id
                        ));
                        log::error!("{e}");
                        if st.failure.is_none() {
                            st.failure = Some(e.clone());
                        }
                        result = Err(st.failure.clone().expect("set above"));
                        break;
                    }
                    if c.wr_id != st.completed {
                        // In-order completion is a property of reliable connections; say so if it breaks.
                        log::warn!(
                            "completion of write {} arrived while {} was expected",
                            c.wr_id,
                            st.completed
                        );
                    }
                    st.completed += 1;
                    ok += 1;
                }
                result.map(|_: usize| ok)
            }
        };
        st.scratch = out;
        result
    }

    fn stalled(&self, st: &mut QueueState) -> Error {
        let e = Error::remote(format!(
            "rank {}: no RDMA completion from the connection to rank {} (tag {}, {}) for {:?}; {} write(s) outstanding",
            self.label.rank,
            self.label.peer,
            self.label.tag,
            self.label.device,
            self.stall_timeout,
            st.posted - st.completed
        ));
        log::error!("{e}");
        st.failure = Some(e.clone());
        e
    }
}
