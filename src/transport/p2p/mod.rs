//! The P2P transport: GPUs of one machine. Kernels' triggers are carried out by the copy engine, writing
//! into the peers' buffers and epoch blocks, which set-up maps into our context with CUDA IPC (or uses
//! directly, for a peer in this process). Kernels also reach the peer's memory themselves (the header's
//! proxy-free methods), so the device view of a P2P connection names the peer's buffer and epoch block.
//!
//! Each connection also gets a fast flag (unless `MSCCLPP_P2P_FAST_FLAGS=0`): a word in host memory
//! shared with the peer (one POSIX shared-memory object per set-up, named only until every peer has
//! opened it), into which the peer's proxy stores the flag count with a CPU store when none of its data
//! is in flight; this header's `wait()` reads it beside the epoch struct.
//!
//! - `handler`: the proxy's `TriggerHandler` (Data, Flag, Sync) and the proxy's settings.
//! - `flag_counts`: the device table the copy engine copies exact flag values from.
//! - `messages`: what the transport tells a peer at set-up and at `mscclppRegisterBuffer`.
//! - this file: `P2pTransport`, the P2P part of a communicator (connections, peers' mappings, fast
//!   flags, the FIFO and its proxy, registered buffers).

pub mod flag_counts;
pub mod handler;
pub mod messages;

use super::{FlagsCarried, RegisteredWrite, Transport};
use crate::connection::{Connection, EpochBlock, TransportKind};
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, GpuContext, IpcExport, IpcMapping, ProcessId, SharedHostMemory};
use crate::proxy::fifo::DeviceFifo;
use crate::proxy::{AbortHook, ProxySlot};
use crate::types::{mscclppDevConn, mscclppRegisteredMemoryP2P};
use handler::{P2pHandler, P2pOptions, P2pRoute};
use messages::{P2pSetupInfo, RegisterInfo};
use std::collections::HashMap;
use std::sync::Arc;

/// A P2P connection's fast flag: a word in host memory shared with the peer, where the peer's proxy
/// stores the flag count with a CPU store when none of its data is in flight; the header's `wait()`
/// reads it beside the epoch struct's `proxy` word (which the proxy always writes too, for legacy device
/// code).
#[derive(Clone)]
pub struct FastFlag {
    pub memory: Arc<SharedHostMemory>,
    pub offset: usize,
}

impl FastFlag {
    /// Bytes per word in a shared object: a cache line each, so that flags of different connections
    /// never share a line.
    pub const STRIDE: usize = 64;

    /// The word at `offset` of `memory`, if it is an aligned word inside it.
    pub fn at(memory: Arc<SharedHostMemory>, offset: usize) -> Option<FastFlag> {
        (offset.is_multiple_of(8) && offset + 8 <= memory.size()).then_some(FastFlag { memory, offset })
    }

    /// Where the word is for the CPU of this process.
    pub fn host_address(&self) -> usize {
        self.memory.host_ptr() as usize + self.offset
    }

    /// Where the word is for the GPU of the context that registered the memory.
    pub fn device_address(&self) -> DevicePtr {
        self.memory.device_ptr() + self.offset as u64
    }
}

/// Where the peer's side of a P2P connection is, as our context reaches it.
#[derive(Clone, Copy, Debug)]
struct PeerSide {
    buff: DevicePtr,
    size: u64,
    /// The peer's epoch block.
    epochs: DevicePtr,
    /// The peer's fast flag, if it has one, as our CPU reaches it.
    fast_flag: Option<usize>,
}

/// One P2P connection.
struct P2pConnection {
    local_buff: DevicePtr,
    local_size: u64,
    /// Our epoch block.
    local_epochs: DevicePtr,
    /// Our fast flag, if set-up placed one (the peer's proxy stores into it).
    fast_flag: Option<FastFlag>,
    /// The peer's side, once set up.
    peer: Option<PeerSide>,
}

/// A peer's buffer registered with `mscclppRegisterBuffer`, as we reach it.
struct RegisteredRemote {
    ptr: DevicePtr,
    size: u64,
}

/// The P2P part of a communicator.
pub struct P2pTransport {
    /// The communicator's rank (names the proxy thread).
    rank: usize,
    /// This process, as peers see it.
    process: ProcessId,
    /// The proxy (serving `fifo`; declared first, so that a dropped transport stops it first).
    proxy: ProxySlot,
    fifo: Option<DeviceFifo>,
    /// The communicator's GPU, from the first connection on.
    gpu: Option<GpuContext>,
    options: P2pOptions,
    /// By connection index; `None` for connections of other transports.
    connections: Vec<Option<P2pConnection>>,
    /// Peers' allocations mapped into our context, by (peer process, allocation base). They back the
    /// connections' and registered buffers' peer addresses, so they are kept until `clear`.
    ipc: HashMap<(ProcessId, DevicePtr), Arc<IpcMapping>>,
    /// Peers' shared host memory (their fast flags), by name; kept until `clear`, like `ipc`.
    peer_flags: HashMap<String, Arc<SharedHostMemory>>,
    registered: Vec<RegisteredRemote>,
    /// The shared memory of the fast flags placed by the set-up in progress: its name goes once every peer
    /// has opened it (`setup_finished`), so that nothing is left behind if the job dies.
    new_flags: Option<Arc<SharedHostMemory>>,
}

impl P2pTransport {
    /// The P2P transport of rank `rank`'s communicator, with the settings of the environment.
    pub fn new(rank: usize) -> P2pTransport {
        P2pTransport {
            rank,
            process: ProcessId::this(),
            proxy: ProxySlot::default(),
            fifo: None,
            gpu: None,
            options: P2pOptions::from_env(),
            connections: Vec::new(),
            ipc: HashMap::new(),
            peer_flags: HashMap::new(),
            registered: Vec::new(),
            new_flags: None,
        }
    }

    fn gpu(&self) -> Result<GpuContext> {
        self.gpu
            .ok_or_else(|| Error::internal("the P2P transport has no GPU: it has no connection"))
    }

    fn connection(&self, conn: usize) -> Result<&P2pConnection> {
        self.connections
            .get(conn)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::internal(format!("connection {conn} is not a P2P connection")))
    }

    fn connection_mut(&mut self, conn: usize) -> Result<&mut P2pConnection> {
        self.connections
            .get_mut(conn)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::internal(format!("connection {conn} is not a P2P connection")))
    }

    /// Maps the allocation a peer exported into our context, once per allocation.
    fn open_ipc(&mut self, gpu: &GpuContext, peer: ProcessId, e: &IpcExport) -> Result<Arc<IpcMapping>> {
        opened_once(&mut self.ipc, (peer, e.address - e.offset), || {
            IpcMapping::open(gpu, &e.handle)
        })
    }

    /// Where a buffer a peer exported is for our context: its own address if the peer shares our process
    /// (with peer access to its GPU enabled, best effort), else its place in our mapping of the
    /// allocation.
    fn reach(&mut self, gpu: &GpuContext, peer: ProcessId, e: &IpcExport) -> Result<DevicePtr> {
        if peer == self.process {
            gpu.enable_peer_access_to(e.address);
            return Ok(e.address);
        }
        let m = self.open_ipc(gpu, peer, e)?;
        Ok(m.base() + e.offset)
    }

    /// Maps a peer's buffer, epoch block and fast flag into our context.
    fn map_peer(&mut self, gpu: &GpuContext, info: &P2pSetupInfo) -> Result<PeerSide> {
        let buff = self.reach(gpu, info.process, &info.buffer)?;
        let epochs = if info.process == self.process {
            info.epochs.address
        } else {
            self.reach(gpu, info.process, &info.epochs)?
        };
        let fast_flag = match &info.fast_flag {
            None => None,
            Some((name, offset)) => {
                let memory = opened_once(&mut self.peer_flags, name.clone(), || {
                    SharedHostMemory::open(gpu, name, *offset as usize + 8)
                })?;
                let fast = FastFlag::at(memory, *offset as usize).ok_or_else(|| {
                    Error::remote(format!(
                        "the peer's fast flag at +{offset} does not fit its shared memory {name}"
                    ))
                })?;
                Some(fast.host_address())
            }
        };
        Ok(PeerSide {
            buff,
            size: info.buffer.size,
            epochs,
            fast_flag,
        })
    }
}

impl Transport for P2pTransport {
    fn name(&self) -> &'static str {
        "P2P"
    }

    fn carries(&self, kind: &TransportKind) -> bool {
        *kind == TransportKind::P2p
    }

    fn connect(&mut self, gpu: &GpuContext, conn: usize, c: &Connection) -> Result<()> {
        self.gpu = Some(*gpu);
        if self.connections.len() <= conn {
            self.connections.resize_with(conn + 1, || None);
        }
        self.connections[conn] = Some(P2pConnection {
            local_buff: c.local_buff,
            local_size: c.local_size,
            local_epochs: c.epochs.signal(),
            fast_flag: None,
            peer: None,
        });
        Ok(())
    }

    /// Gives the pending connections fast flags, in one new object of shared host memory (unless
    /// `MSCCLPP_P2P_FAST_FLAGS=0`). Best effort: without them only the copy engine raises flags, which is
    /// slower.
    fn prepare_setup(&mut self, pending: &[(usize, &Connection)]) -> Result<()> {
        if pending.is_empty() || !self.options.fast_flags {
            return Ok(());
        }
        let gpu = self.gpu()?;
        let size = (pending.len() * FastFlag::STRIDE).next_multiple_of(4096);
        let memory = match SharedHostMemory::create(&gpu, size) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                log::warn!("no fast flags (only the copy engine raises flags, which is slower): {e}");
                return Ok(());
            }
        };
        for (k, &(conn, c)) in pending.iter().enumerate() {
            let fast =
                FastFlag::at(memory.clone(), k * FastFlag::STRIDE).expect("the object holds a word per connection");
            match c.epochs.set_fast_flag_address(fast.device_address()) {
                Ok(()) => self.connection_mut(conn)?.fast_flag = Some(fast),
                Err(e) => log::warn!("connection {conn}: no fast flag: {e}"),
            }
        }
        self.new_flags = Some(memory);
        Ok(())
    }

    fn setup_message(&self, conn: usize) -> Result<Vec<u8>> {
        let gpu = self.gpu()?;
        let c = self.connection(conn)?;
        Ok(P2pSetupInfo {
            process: self.process,
            device: gpu.device,
            buffer: IpcExport::new(c.local_buff, c.local_size, "localBuff")?,
            epochs: IpcExport::new(c.local_epochs, EpochBlock::BYTES as u64, "epoch block")?,
            fast_flag: c
                .fast_flag
                .as_ref()
                .map(|f| (f.memory.name().to_string(), f.offset as u32)),
        }
        .to_bytes())
    }

    fn complete_setup(&mut self, conn: usize, peer_message: &[u8]) -> Result<()> {
        let gpu = self.gpu()?;
        let info = P2pSetupInfo::from_bytes(peer_message)?;
        self.connection(conn)?;
        let peer = self.map_peer(&gpu, &info)?;
        self.connection_mut(conn)?.peer = Some(peer);
        Ok(())
    }

    fn setup_finished(&mut self) {
        if let Some(m) = self.new_flags.take() {
            m.unlink();
        }
    }

    fn fill_device_connection(&mut self, conn: usize, dev: &mut mscclppDevConn) -> Result<()> {
        let gpu = self.gpu()?;
        dev.fifo = DeviceFifo::view_on_first_use(&mut self.fifo, &gpu, conn)?;
        if let Some(peer) = self.connection(conn)?.peer {
            dev.base.remoteBuff = peer.buff as *mut _;
            dev.base.remoteSignalEpochId = peer.epochs as *mut _;
        }
        Ok(())
    }

    fn launch_proxy(&mut self, flags: &FlagsCarried, on_abort: &AbortHook) -> Result<()> {
        let routes: Vec<Option<P2pRoute>> = self
            .connections
            .iter()
            .map(|c| {
                let c = c.as_ref()?;
                let peer = c.peer?;
                Some(P2pRoute {
                    local_buff: c.local_buff,
                    local_size: c.local_size,
                    remote_buff: peer.buff,
                    remote_size: peer.size,
                    local_epochs: c.local_epochs,
                    remote_epochs: peer.epochs,
                    fast_flag: peer.fast_flag,
                })
            })
            .collect();
        if routes.iter().all(Option::is_none) {
            log::info!("no P2P connection is set up; no P2P proxy to launch");
            return Ok(());
        }
        let gpu = self.gpu()?;
        let fifo = self
            .fifo
            .as_ref()
            .ok_or_else(|| Error::invalid_usage("call mscclppConnectionSetup before mscclppProxyLaunch"))?;
        log::info!("P2P proxy options: {:?}", self.options);
        let handler = P2pHandler::new(&gpu, routes, self.options, flags.clone())?;
        // SAFETY: `self.fifo` is dropped only after the proxy is stopped (`clear` stops it first, and the
        // proxy slot is declared before the FIFO).
        unsafe {
            let rank = self.rank;
            self.proxy.launch(
                format!("mscclpp-proxy-{rank}"),
                rank,
                gpu,
                fifo,
                Box::new(handler),
                on_abort,
            )?
        };
        log::info!("P2P proxy launched");
        Ok(())
    }

    fn proxy_running(&self) -> bool {
        self.proxy.is_running()
    }

    fn stop_proxy(&mut self) -> Result<()> {
        self.proxy.stop("the P2P proxy")
    }

    fn abort_proxy(&mut self) {
        self.proxy.abort();
    }

    fn proxy_failure(&self) -> Option<Error> {
        self.proxy.failure()
    }

    fn register_message(&mut self, _conn: usize, ptr: DevicePtr, size: u64) -> Result<Vec<u8>> {
        Ok(RegisterInfo {
            process: self.process,
            buffer: IpcExport::new(ptr, size, "local_memory")?,
        }
        .to_bytes())
    }

    fn register_remote(
        &mut self,
        _conn: usize,
        _ptr: DevicePtr,
        _size: u64,
        peer_message: &[u8],
    ) -> Result<mscclppRegisteredMemoryP2P> {
        let gpu = self.gpu()?;
        let info = RegisterInfo::from_bytes(peer_message)?;
        let remote = self.reach(&gpu, info.process, &info.buffer)?;
        self.registered.push(RegisteredRemote {
            ptr: remote,
            size: info.buffer.size,
        });
        Ok(mscclppRegisteredMemoryP2P {
            remoteBuff: remote as *mut _,
            IbMr: std::ptr::null_mut(),
        })
    }

    fn owns_registered(&self, entry: &mscclppRegisteredMemoryP2P) -> bool {
        entry.IbMr.is_null() && self.registered.iter().any(|r| r.ptr == entry.remoteBuff as DevicePtr)
    }

    /// A copy on the application's stream into the peer's buffer, mapped in our context.
    fn registered_write(&mut self, entry: &mscclppRegisteredMemoryP2P, w: &RegisteredWrite) -> Result<()> {
        let (i, dst) = (w.index, entry.remoteBuff as DevicePtr);
        let reg = self.registered.iter().find(|r| r.ptr == dst).ok_or_else(|| {
            Error::invalid_argument(format!(
                "regMem->p2p[{i}] was not made by mscclppRegisterBuffer on this communicator"
            ))
        })?;
        if w.dst_offset.checked_add(w.size).is_none_or(|end| end > reg.size) {
            return Err(Error::invalid_argument(format!(
                "dstOffset {} + size {} is past the end of peer buffer {i} ({} bytes)",
                w.dst_offset, w.size, reg.size
            )));
        }
        // SAFETY: the communicator checked that the source range lies in one allocation of the
        // application; the destination lies inside the peer's registered buffer (checked above), which
        // stays mapped until `clear`.
        unsafe { w.stream.copy(dst + w.dst_offset, w.src + w.src_offset, w.size as usize) }
            .map_err(|e| Error::new(e.kind, format!("copy to peer buffer {i}: {}", e.message)))
    }

    fn clear(&mut self) -> Result<()> {
        let stopped = self.stop_proxy();
        self.registered.clear();
        self.connections.clear();
        self.new_flags = None;
        self.ipc.clear();
        self.peer_flags.clear();
        self.fifo = None;
        stopped
    }
}

/// The peer resource under `key` in `cache`, opened by `open` the first time (several connections and
/// registered buffers share a peer's allocation or shared memory; each is opened once and kept until
/// the transport is cleared).
fn opened_once<K: std::hash::Hash + Eq, T>(
    cache: &mut HashMap<K, Arc<T>>,
    key: K,
    open: impl FnOnce() -> Result<T>,
) -> Result<Arc<T>> {
    match cache.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => Ok(e.get().clone()),
        std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(Arc::new(open()?)).clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_resource_is_opened_once_and_shared() {
        let mut cache: HashMap<u32, Arc<String>> = HashMap::new();
        let mut opened = 0;
        let a = opened_once(&mut cache, 1, || {
            opened += 1;
            Ok("one".to_string())
        })
        .unwrap();
        let b = opened_once(&mut cache, 1, || -> Result<String> { unreachable!("opened twice") }).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(opened_once(&mut cache, 2, || -> Result<String> { Err(Error::remote("gone")) }).is_err());
        assert!(!cache.contains_key(&2), "a failed open leaves nothing behind");
        assert_eq!(opened, 1);
    }
}
