//! The IB proxy's trigger handler: Data is an RDMA write of the buffer range, Flag a write into the
//! peer's `proxy` word on the same queue pair (so it lands after the data of this and earlier
//! triggers), Sync waits for every write issued so far by this proxy.
//!
//! The flag's value is the number of flags this connection has carried out, carried inline in the work
//! request, so it is taken when the flag is posted. The legacy proxy wrote our `device` epoch word
//! instead, which the adapter reads when it runs the write: behind a queue of large writes, that word
//! already counts signals pushed since, whose data is queued behind the flag, and the peer's `wait()`
//! returns before that data lands (the race the P2P transport's `p2p::flag_counts` describes).
//! `MSCCLPP_IB_FLAG=epoch`, or a queue pair without inline data, keeps the legacy write.

use super::queue::IbQueue;
use crate::error::{Error, Result};
use crate::gpu::Stream;
use crate::proxy::{Trigger, TriggerHandler};
use crate::transport::FlagsCarried;
use std::sync::Arc;

/// What an IB flag writes into the peer's `proxy` word (`MSCCLPP_IB_FLAG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IbFlagMode {
    /// The number of flags carried out on the connection, taken when the flag is posted (`count`).
    Count,
    /// Our `device` epoch word, as the adapter finds it when it runs the write (`epoch`, the legacy way).
    Epoch,
}

/// A local or remote memory range and the key that reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyedRange {
    pub addr: u64,
    pub size: u64,
    pub key: u32,
}

/// What the proxy needs of one IB connection.
#[derive(Clone)]
pub struct IbRoute {
    pub queue: Arc<IbQueue>,
    /// Our buffer (lkey).
    pub local_buff: KeyedRange,
    /// The peer's buffer (rkey).
    pub remote_buff: KeyedRange,
    /// Our `mscclppDevConnSignalEpochId` (lkey); its `device` word is at +0.
    pub local_epochs: KeyedRange,
    /// The peer's `mscclppDevConnSignalEpochId` (rkey); its `proxy` word is at +8.
    pub remote_epochs: KeyedRange,
}

/// Offset of `mscclppDevConnSignalEpochId::proxy`.
const PROXY_WORD: u64 = 8;

pub struct IbHandler {
    /// Indexed by connection id; `None` for connections this proxy does not serve.
    pub routes: Vec<Option<IbRoute>>,
    /// Every queue of this proxy, once each (for Sync).
    pub queues: Vec<Arc<IbQueue>>,
    /// The last write posted on each queue since the last Sync, by index into `queues`.
    pending: Vec<Option<u64>>,
    mode: IbFlagMode,
    /// Flags carried out per connection id; kept by the communicator across launches.
    flags: FlagsCarried,
    /// A stream of the proxy's own on the communicator's GPU, for releasing the kernels' waits when the
    /// communicator aborts (`None` in tests without a GPU).
    release: Option<Stream>,
}

impl IbHandler {
    /// The stream `abort` releases the kernels' waits on.
    pub fn set_release_stream(&mut self, stream: Stream) {
        self.release = Some(stream);
    }

    pub fn new(routes: Vec<Option<IbRoute>>, mode: IbFlagMode, flags: FlagsCarried) -> IbHandler {
        let mut queues: Vec<Arc<IbQueue>> = Vec::new();
        for r in routes.iter().flatten() {
            if !queues.iter().any(|q| Arc::ptr_eq(q, &r.queue)) {
                queues.push(r.queue.clone());
            }
        }
        if mode == IbFlagMode::Count && queues.iter().any(|q| !q.carries_values()) {
            log::warn!(
                "a queue pair carries no inline data: its flags write the device epoch word, as the legacy proxy did"
            );
        }
        let pending = vec![None; queues.len()];
        IbHandler {
            routes,
            queues,
            pending,
            mode,
            flags,
            release: None,
        }
    }

    fn note(&mut self, queue: &Arc<IbQueue>, seq: u64) {
        if let Some(i) = self.queues.iter().position(|q| Arc::ptr_eq(q, queue)) {
            self.pending[i] = Some(seq);
        }
    }

    fn raise_flag(&mut self, route: &IbRoute, conn_id: usize) -> Result<()> {
        let count = self.flags.carry_one(conn_id)?;
        let remote = route.remote_epochs.addr + PROXY_WORD;
        let seq = if self.mode == IbFlagMode::Count && route.queue.carries_values() {
            route.queue.write_value(count, remote, route.remote_epochs.key)?
        } else {
            route.queue.write(
                route.local_epochs.addr,
                route.local_epochs.key,
                8,
                remote,
                route.remote_epochs.key,
            )?
        };
        self.note(&route.queue, seq);
        Ok(())
    }
}

impl TriggerHandler for IbHandler {
    fn handle(&mut self, t: &Trigger) -> Result<()> {
        let route = self
            .routes
            .get(t.conn_id as usize)
            .and_then(|r| r.clone())
            .ok_or_else(|| {
                Error::invalid_usage(format!(
                    "connection id {} is not an IB connection served by this proxy",
                    t.conn_id
                ))
            })?;
        crate::transport::carry_out(
            self,
            t,
            || t.check_ranges(route.local_buff.size, route.remote_buff.size),
            |h| {
                let seq = route.queue.write(
                    route.local_buff.addr + t.src_offset as u64,
                    route.local_buff.key,
                    t.data_size as u64,
                    route.remote_buff.addr + t.dst_offset as u64,
                    route.remote_buff.key,
                )?;
                h.note(&route.queue, seq);
                Ok(())
            },
            |h| h.raise_flag(&route, t.conn_id as usize),
        )
    }

    fn sync(&mut self) -> Result<()> {
        let mut first_err = None;
        for (i, q) in self.queues.iter().enumerate() {
            let r = match self.pending[i] {
                Some(seq) => q.wait_for(seq),
                None => q.failure().map_or(Ok(()), Err),
            };
            match r {
                Ok(()) => self.pending[i] = None,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Raises the epochs our kernels wait on (the peer will not raise them any more).
    fn abort(&mut self) -> Result<()> {
        let Some(stream) = &self.release else {
            return Ok(());
        };
        let blocks = self.routes.iter().flatten().map(|r| r.local_epochs.addr);
        // SAFETY: `local_epochs` are our connections' epoch blocks, which the communicator frees only after
        // this proxy is stopped (and the stream idle).
        unsafe { crate::transport::release_waits(stream, blocks) }
    }
}
