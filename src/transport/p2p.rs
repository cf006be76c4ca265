//! The P2P transport: kernels' triggers carried out by the copy engine, between GPUs of one machine.
//!
//! Data is a copy from our buffer into the peer's (mapped with CUDA IPC). Flag writes the number of
//! flags carried out on the connection into the peer's `proxy` epoch, once the data of the triggers
//! before it has landed: the peer's epoch struct is in host memory shared with us, so when our streams
//! are idle that is a CPU store; when they are busy the flag waits (`deferred`) until they drain, or,
//! if too many wait, goes on the stream behind the data as a stream memory operation. A peer whose
//! struct is in device memory gets its flag from the copy engine, as the legacy library did. Sync waits
//! for the streams to drain.

use crate::connection::FlagWord;
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, Event, GpuContext, Stream};
use crate::proxy::{Trigger, TriggerHandler};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the proxy needs of one connection; `None` in the plan for connections it does not serve.
#[derive(Clone, Copy, Debug)]
pub struct P2pRoute {
    pub local_buff: DevicePtr,
    pub local_size: u64,
    pub remote_buff: DevicePtr,
    pub remote_size: u64,
    /// Our `mscclppDevConnSignalEpochId` (its `device` word is the first), for `FlagMode::CopyEpoch`.
    pub local_epochs: DevicePtr,
    /// The peer's `proxy` epoch word.
    pub remote_flag: FlagWord,
}

/// Looks up the route of a trigger's connection.
pub fn route_of<'a>(routes: &'a [Option<P2pRoute>], t: &Trigger) -> Result<&'a P2pRoute> {
    routes.get(t.conn_id as usize).and_then(|r| r.as_ref()).ok_or_else(|| {
        Error::invalid_usage(format!(
            "connection id {} is not a P2P connection of this communicator",
            t.conn_id
        ))
    })
}

/// How the proxy raises the flag of a peer whose epoch struct is in device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagMode {
    /// Copy our `device` epoch into the peer's `proxy` epoch with the copy engine (the legacy way). The
    /// value may count signals of other threads whose data is not issued yet.
    CopyEpoch,
    /// Write the number of flags this connection has carried out with a stream memory operation: no copy
    /// engine, and exactly the signals whose data is ordered before it.
    WriteCount,
}

/// Tuning of the P2P proxy, from the environment:
/// - `MSCCLPP_P2P_EPOCHS=host|device` (default `host`): where a connection's epoch struct lives; in host
///   memory shared with the peer, the peer's proxy raises the flag with a CPU store
/// - `MSCCLPP_P2P_FLAG=copy|write` (for epoch structs in device memory) (default `copy`: measured faster when the flag follows data; `write`
///   is exact when many threads signal one connection at once)
/// - `MSCCLPP_P2P_STREAMS=N` copy streams, 1 to 8 (default 1)
/// - `MSCCLPP_P2P_SPLIT_BYTES=B`: a Data trigger of at least B bytes is split across the streams
///   (default 16 MiB)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pOptions {
    pub host_epochs: bool,
    pub flag: FlagMode,
    pub streams: usize,
    pub split_bytes: u64,
}

impl Default for P2pOptions {
    fn default() -> Self {
        P2pOptions {
            host_epochs: true,
            flag: FlagMode::CopyEpoch,
            streams: 1,
            split_bytes: 16 << 20,
        }
    }
}

impl P2pOptions {
    pub fn from_env() -> P2pOptions {
        Self::parse(|k| std::env::var(k).ok())
    }

    pub fn parse(var: impl Fn(&str) -> Option<String>) -> P2pOptions {
        let mut o = P2pOptions::default();
        match var("MSCCLPP_P2P_EPOCHS").as_deref() {
            None | Some("host") => {}
            Some("device") => o.host_epochs = false,
            Some(other) => log::warn!("MSCCLPP_P2P_EPOCHS={other} is not host or device; using host"),
        }
        match var("MSCCLPP_P2P_FLAG").as_deref() {
            None | Some("copy") => {}
            Some("write") => o.flag = FlagMode::WriteCount,
            Some(other) => log::warn!("MSCCLPP_P2P_FLAG={other} is not copy or write; using copy"),
        }
        if let Some(v) = var("MSCCLPP_P2P_STREAMS") {
            match v.parse::<usize>() {
                Ok(n @ 1..=8) => o.streams = n,
                _ => log::warn!("MSCCLPP_P2P_STREAMS={v} is not in 1..=8; using {}", o.streams),
            }
        }
        if let Some(v) = var("MSCCLPP_P2P_SPLIT_BYTES") {
            match v.parse::<u64>() {
                Ok(b) if b > 0 => o.split_bytes = b,
                _ => log::warn!(
                    "MSCCLPP_P2P_SPLIT_BYTES={v} is not a positive number; using {}",
                    o.split_bytes
                ),
            }
        }
        o
    }
}

/// Splits `size` bytes into at most `parts` chunks of whole 64 KiB units: `(offset, len)` pairs.
pub fn split_chunks(size: u64, parts: usize) -> Vec<(u64, u64)> {
    const UNIT: u64 = 64 << 10;
    let per = size.div_ceil(parts as u64).div_ceil(UNIT) * UNIT;
    let mut out = Vec::with_capacity(parts);
    let mut off = 0;
    while off < size {
        let len = per.min(size - off);
        out.push((off, len));
        off += len;
    }
    out
}

/// At most this many flags wait for the streams to drain; more go on the stream (a kernel that keeps
/// the proxy busy must not hold its flags back for long).
const MAX_DEFERRED: usize = 32;

pub struct P2pHandler {
    routes: Vec<Option<P2pRoute>>,
    options: P2pOptions,
    /// Copy streams; flags and small copies go on the first.
    streams: Vec<Stream>,
    /// One event per extra stream, to order the first stream after it.
    events: Vec<Event>,
    /// Extra streams holding data the next flag on the stream must wait for.
    dirty: Vec<bool>,
    /// Work was queued on the streams since they were last seen idle.
    busy: bool,
    /// Host flags (peer's word, count) waiting for the streams to drain, in the order they were raised.
    deferred: Vec<(FlagWord, u64)>,
    /// The device can write 64-bit values from a stream.
    stream_writes: bool,
    /// Flags carried out per connection (`WriteCount` and host flags); kept by the communicator across
    /// launches.
    flags_sent: Arc<Vec<AtomicU64>>,
}

impl P2pHandler {
    pub fn new(
        ctx: &GpuContext,
        routes: Vec<Option<P2pRoute>>,
        mut options: P2pOptions,
        flags_sent: Arc<Vec<AtomicU64>>,
    ) -> Result<P2pHandler> {
        let stream_writes = ctx.can_write_u64_from_streams()?;
        if !stream_writes {
            // Device flags are then copied; host flags always wait for the streams to drain.
            log::info!(
                "GPU {} has no 64-bit stream memory operations; flags are copied or stored instead",
                ctx.device
            );
            options.flag = FlagMode::CopyEpoch;
        }
        let streams = (0..options.streams)
            .map(|_| Stream::new(ctx))
            .collect::<Result<Vec<_>>>()?;
        let events = (0..options.streams)
            .map(|_| Event::new(ctx))
            .collect::<Result<Vec<_>>>()?;
        Ok(P2pHandler {
            routes,
            options,
            dirty: vec![false; streams.len()],
            streams,
            events,
            busy: false,
            deferred: Vec::new(),
            stream_writes,
            flags_sent,
        })
    }

    fn copy_data(&mut self, dst: DevicePtr, src: DevicePtr, size: u64) -> Result<()> {
        self.busy = true;
        if self.streams.len() == 1 || size < self.options.split_bytes {
            return self.streams[0].copy(dst, src, size as usize);
        }
        for (i, (off, len)) in split_chunks(size, self.streams.len()).into_iter().enumerate() {
            self.streams[i].copy(dst + off, src + off, len as usize)?;
            self.dirty[i] = i > 0;
        }
        Ok(())
    }

    /// Makes the first stream wait for the data of every other stream.
    fn join_streams(&mut self) -> Result<()> {
        for i in 1..self.streams.len() {
            if self.dirty[i] {
                self.streams[0].wait_for(&self.streams[i], &self.events[i])?;
                self.dirty[i] = false;
            }
        }
        Ok(())
    }

    fn raise_flag(&mut self, route: &P2pRoute, conn_id: usize) -> Result<()> {
        match route.remote_flag {
            FlagWord::Device(word) => {
                self.join_streams()?;
                self.busy = true;
                match self.options.flag {
                    FlagMode::CopyEpoch => self.streams[0].copy(word, route.local_epochs, 8),
                    FlagMode::WriteCount => {
                        let count = self.flags_sent[conn_id].fetch_add(1, Ordering::Relaxed) + 1;
                        self.streams[0].write_u64(word, count)
                    }
                }
            }
            host @ FlagWord::Host { .. } => {
                let count = self.flags_sent[conn_id].fetch_add(1, Ordering::Relaxed) + 1;
                match plan_host_flag(self.busy, self.deferred.len(), self.stream_writes) {
                    HostFlagPlan::Store => {
                        store_flag(host, count);
                        Ok(())
                    }
                    HostFlagPlan::Defer => {
                        self.deferred.push((host, count));
                        Ok(())
                    }
                    HostFlagPlan::OnStream => {
                        // The waiting flags first, so that every word only grows.
                        self.join_streams()?;
                        for (word, n) in std::mem::take(&mut self.deferred) {
                            self.streams[0].write_u64(device_address(word), n)?;
                        }
                        self.streams[0].write_u64(device_address(host), count)
                    }
                }
            }
        }
    }

    /// Once the streams are idle, raises the flags that waited for them.
    fn release_if_idle(&mut self) -> Result<()> {
        if !self.busy {
            return Ok(());
        }
        for s in &self.streams {
            if !s.is_idle()? {
                return Ok(());
            }
        }
        self.busy = false;
        for (word, n) in self.deferred.drain(..) {
            store_flag(word, n);
        }
        Ok(())
    }
}

/// What to do with a flag for a peer whose epoch struct is in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostFlagPlan {
    /// Nothing of ours is in flight: store it now.
    Store,
    /// Data is in flight: store it once the streams drain.
    Defer,
    /// Too many wait already: queue it (and those waiting) on the stream behind the data.
    OnStream,
}

/// `busy`: work is queued on the streams; `waiting`: flags deferred so far; `stream_writes`: the device
/// can write flags from a stream.
pub fn plan_host_flag(busy: bool, waiting: usize, stream_writes: bool) -> HostFlagPlan {
    if !busy {
        HostFlagPlan::Store
    } else if waiting < MAX_DEFERRED || !stream_writes {
        HostFlagPlan::Defer
    } else {
        HostFlagPlan::OnStream
    }
}

fn device_address(word: FlagWord) -> DevicePtr {
    match word {
        FlagWord::Device(d) | FlagWord::Host { dev: d, .. } => d,
    }
}

/// Stores a flag count into a peer's epoch word in shared host memory.
fn store_flag(word: FlagWord, count: u64) {
    if let FlagWord::Host { cpu, .. } = word {
        // SAFETY: `cpu` is an aligned word of shared host memory that the communicator keeps mapped while
        // its proxy runs (checked to lie inside the object when the connection was set up); the peer's
        // GPU only reads it, and only this proxy writes it.
        let w = unsafe { AtomicU64::from_ptr(cpu as *mut u64) };
        w.store(count, Ordering::Release);
    }
}

impl TriggerHandler for P2pHandler {
    fn handle(&mut self, t: &Trigger) -> Result<()> {
        let route = *route_of(&self.routes, t)?;
        if t.has_data() {
            match t.check_ranges(route.local_size, route.remote_size) {
                Ok(()) => self.copy_data(
                    route.remote_buff + t.dst_offset as u64,
                    route.local_buff + t.src_offset as u64,
                    t.data_size as u64,
                )?,
                Err(e) if t.has_flag() => {
                    // Drop the data but still raise the flag: the device counted this signal, and a
                    // missing flag would leave the peer waiting forever.
                    log::error!("dropped the data of {t:?}: {e}");
                    self.raise_flag(&route, t.conn_id as usize)?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        if t.has_flag() {
            self.raise_flag(&route, t.conn_id as usize)?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        for s in &self.streams {
            s.spin_until_idle()?;
        }
        self.dirty.iter_mut().for_each(|d| *d = false);
        self.release_if_idle()
    }

    fn poll(&mut self) -> Result<()> {
        self.release_if_idle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> P2pRoute {
        P2pRoute {
            local_buff: 0x1000,
            local_size: 100,
            remote_buff: 0x9000,
            remote_size: 50,
            local_epochs: 0,
            remote_flag: FlagWord::Device(0),
        }
    }

    #[test]
    fn ranges_are_checked_against_both_buffers() {
        let t = |src, dst, size| Trigger {
            data_size: size,
            src_offset: src,
            dst_offset: dst,
            conn_id: 0,
            kind: 1,
        };
        assert!(
            t(0, 0, 50)
                .check_ranges(route().local_size, route().remote_size)
                .is_ok()
        );
        assert!(
            t(50, 0, 50)
                .check_ranges(route().local_size, route().remote_size)
                .is_ok()
        );
        assert!(
            t(51, 0, 50)
                .check_ranges(route().local_size, route().remote_size)
                .unwrap_err()
                .message
                .contains("local buffer")
        );
        assert!(
            t(0, 1, 50)
                .check_ranges(route().local_size, route().remote_size)
                .unwrap_err()
                .message
                .contains("peer's buffer")
        );
        assert!(
            t(u32::MAX, 0, u32::MAX)
                .check_ranges(route().local_size, route().remote_size)
                .is_err(),
            "no overflow"
        );
    }

    #[test]
    fn unknown_connections_are_rejected() {
        let routes = vec![Some(route()), None];
        let t = |c| Trigger {
            data_size: 1,
            src_offset: 0,
            dst_offset: 0,
            conn_id: c,
            kind: 2,
        };
        assert!(route_of(&routes, &t(0)).is_ok());
        assert!(route_of(&routes, &t(1)).is_err());
        assert!(route_of(&routes, &t(1023)).is_err());
    }

    #[test]
    fn options_parse_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(P2pOptions::parse(env(&[])), P2pOptions::default());
        let o = P2pOptions::parse(env(&[
            ("MSCCLPP_P2P_EPOCHS", "device"),
            ("MSCCLPP_P2P_FLAG", "write"),
            ("MSCCLPP_P2P_STREAMS", "4"),
            ("MSCCLPP_P2P_SPLIT_BYTES", "1048576"),
        ]));
        assert_eq!(
            o,
            P2pOptions {
                host_epochs: false,
                flag: FlagMode::WriteCount,
                streams: 4,
                split_bytes: 1 << 20
            }
        );
        let o = P2pOptions::parse(env(&[
            ("MSCCLPP_P2P_FLAG", "x"),
            ("MSCCLPP_P2P_STREAMS", "0"),
            ("MSCCLPP_P2P_EPOCHS", "gpu"),
        ]));
        assert_eq!(o, P2pOptions::default(), "bad values keep the defaults");
    }

    #[test]
    fn host_flags_wait_for_data_in_flight() {
        assert_eq!(plan_host_flag(false, 0, true), HostFlagPlan::Store);
        assert_eq!(plan_host_flag(false, 0, false), HostFlagPlan::Store);
        assert_eq!(plan_host_flag(true, 0, true), HostFlagPlan::Defer);
        assert_eq!(plan_host_flag(true, MAX_DEFERRED - 1, true), HostFlagPlan::Defer);
        assert_eq!(plan_host_flag(true, MAX_DEFERRED, true), HostFlagPlan::OnStream);
        // Without stream writes a flag can only wait for the streams to drain.
        assert_eq!(plan_host_flag(true, MAX_DEFERRED, false), HostFlagPlan::Defer);
    }

    #[test]
    fn a_host_flag_is_a_plain_store_and_a_device_flag_is_not() {
        let mut word = 0u64;
        let cpu = &mut word as *mut u64 as usize;
        store_flag(FlagWord::Host { cpu, dev: 0x10 }, 7);
        assert_eq!(word, 7);
        store_flag(FlagWord::Device(cpu as u64), 9);
        assert_eq!(word, 7, "device words are written by the GPU only");
        assert_eq!(device_address(FlagWord::Host { cpu, dev: 0x10 }), 0x10);
        assert_eq!(device_address(FlagWord::Device(0x20)), 0x20);
    }

    #[test]
    fn chunks_cover_the_range_in_64k_units() {
        assert_eq!(split_chunks(1 << 20, 2), vec![(0, 1 << 19), (1 << 19, 1 << 19)]);
        let c = split_chunks((1 << 20) + 5, 4);
        assert_eq!(c.iter().map(|(_, l)| l).sum::<u64>(), (1 << 20) + 5);
        assert!(c.iter().all(|(o, _)| o % (64 << 10) == 0));
        assert!(c.len() <= 4);
        assert_eq!(split_chunks(100, 3), vec![(0, 100)]);
    }
}
