//! The communicator: one rank's bootstrap, its connections, their FIFO and the proxy that serves it.

use crate::bootstrap::{Bootstrap, RootAddress, UniqueId};
use crate::codec::{Reader, Writer};
use crate::connection::{Connection, Epochs, FastFlag, ProcessId, RemoteSide, SetupInfo, TransportKind};
use crate::error::{Error, Result};
use crate::gpu::{AppStream, DevicePtr, GpuContext, IpcExport, IpcMapping, SharedHostMemory, pointer_info};
use crate::proxy::ProxySlot;
use crate::proxy::fifo::DeviceFifo;
use crate::proxy::trigger::MAX_CONNECTIONS;
use crate::transport::ib::IbState;
use crate::transport::p2p::{P2pHandler, P2pOptions, P2pRoute};
use crate::types::{mscclppDevConn, mscclppRegisteredMemoryP2P};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Bootstrap tags of the set-up messages: the kind in the high half, the connection tag in the low.
const TAG_CONNECTION: u64 = 1 << 32;
const TAG_REGISTER: u64 = 2 << 32;
const TAG_IB_CONNECTION: u64 = 3 << 32;

fn message_tag(kind: u64, tag: i32) -> u64 {
    kind | tag as u32 as u64
}

/// A peer's buffer registered with `mscclppRegisterBuffer`, as we see it.
struct RegisteredRemote {
    ptr: DevicePtr,
    size: u64,
}

/// The device views handed to the application. They hold device addresses only, which this process
/// never dereferences, so moving them between threads is safe.
#[derive(Default)]
struct DevConnTable(Vec<mscclppDevConn>);

// SAFETY: see above: the raw pointers inside are device addresses, plain data to the host.
unsafe impl Send for DevConnTable {}

impl std::ops::Deref for DevConnTable {
    type Target = Vec<mscclppDevConn>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
impl std::ops::DerefMut for DevConnTable {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

#[derive(Default)]
struct CommState {
    gpu: Option<GpuContext>,
    /// IB devices, queue pairs, memory regions and proxies. Declared before `connections` so that, when
    /// dropped, memory regions are released before the memory they cover.
    ib: IbState,
    connections: Vec<Connection>,
    /// Connections `[0, set_up)` have completed `mscclppConnectionSetup`.
    set_up: usize,
    dev_conns: DevConnTable,
    /// The P2P proxy (serving `p2p_fifo`; declared first, so that a dropped state stops it first).
    proxy: ProxySlot,
    p2p_fifo: Option<DeviceFifo>,
    /// Peers' allocations mapped into our context, by (peer process, allocation base). They back the
    /// connections' and registered buffers' peer addresses, so they are kept until destroy.
    ipc: HashMap<(ProcessId, DevicePtr), Arc<IpcMapping>>,
    /// Peers' shared host memory (their fast flags), by name; kept until destroy, like `ipc`.
    peer_flags: HashMap<String, Arc<SharedHostMemory>>,
    registered: Vec<RegisteredRemote>,
    /// Flags the P2P proxy has carried out, per connection; they outlive a proxy's stop.
    flags_sent: Arc<Vec<AtomicU64>>,
}

pub struct Communicator {
    rank: usize,
    nranks: usize,
    bootstrap: Bootstrap,
    state: Mutex<CommState>,
}

impl Communicator {
    /// `mscclppCommInitRank`: rank 0 listens at `address`, everyone meets there.
    pub fn init_by_address(nranks: usize, address: &str, rank: usize, timeout: Duration) -> Result<Communicator> {
        let root_addr = RootAddress::parse(address)?;
        let bootstrap = Bootstrap::connect_to_address(&root_addr, rank, nranks, timeout)?;
        Ok(Self::with_bootstrap(bootstrap))
    }

    /// `mscclppCommInitRankFromId`: everyone meets at the root named in the id.
    pub fn init_by_id(nranks: usize, id: &UniqueId, rank: usize, timeout: Duration) -> Result<Communicator> {
        let bootstrap = Bootstrap::connect_to_id(id, rank, nranks, timeout)?;
        Ok(Self::with_bootstrap(bootstrap))
    }

    fn with_bootstrap(bootstrap: Bootstrap) -> Communicator {
        // The communicator's GPU is the one current on the creating thread, if that thread has one;
        // otherwise it is decided by the first call that needs a GPU.
        let gpu = GpuContext::current_if_any();
        let state = CommState {
            gpu,
            ..Default::default()
        };
        log::info!(
            "communicator ready: rank {} of {}",
            bootstrap.rank(),
            bootstrap.nranks()
        );
        crate::settings::log_in_effect();
        Communicator {
            rank: bootstrap.rank(),
            nranks: bootstrap.nranks(),
            bootstrap,
            state: Mutex::new(state),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }

    /// The proxy's first failure, if any; later calls report it instead of going on.
    fn check_proxy(st: &CommState) -> Result<()> {
        match st.proxy.failure().or_else(|| st.ib.failure()) {
            Some(e) => Err(Error::new(e.kind, format!("the proxy failed earlier: {}", e.message))),
            None => Ok(()),
        }
    }

    fn gpu(st: &mut CommState) -> Result<GpuContext> {
        if let Some(g) = st.gpu {
            g.make_current()?;
            return Ok(g);
        }
        let g = GpuContext::current()?;
        st.gpu = Some(g);
        Ok(g)
    }

    /// `mscclppConnect`: records a connection and allocates its epoch counters.
    pub fn connect(
        &self,
        remote_rank: usize,
        tag: i32,
        buff: DevicePtr,
        size: u64,
        transport: TransportKind,
    ) -> Result<()> {
        let mut st = self.state.lock();
        if st.proxy.is_running() || st.ib.is_running() {
            return Err(Error::invalid_usage(
                "mscclppConnect called while the proxy runs; call mscclppProxyStop first",
            ));
        }
        if st.connections.len() >= MAX_CONNECTIONS {
            return Err(Error::invalid_usage(format!(
                "a communicator holds at most {MAX_CONNECTIONS} connections (the trigger's connId has 10 bits)"
            )));
        }
        if let TransportKind::Ib { device } = &transport {
            // Fails first, naming the devices found, when libibverbs or the device is missing.
            st.ib.open_device(device)?;
        }
        let gpu = Self::gpu(&mut st)?;
        let info = pointer_info(buff, size, "localBuff")?;
        if info.device != gpu.device {
            return Err(Error::invalid_argument(format!(
                "localBuff is on GPU {} but the communicator's GPU is {} (the device current when it was created)",
                info.device, gpu.device
            )));
        }
        if size > u32::MAX as u64 {
            log::warn!("buffSize {size} is larger than triggers can address (32-bit offsets and sizes)");
        }
        let epochs = Epochs::new(&gpu)?;
        if let TransportKind::Ib { device } = &transport {
            let conn = st.connections.len();
            st.ib
                .connect(self.rank, conn, device, remote_rank, tag, buff, size, epochs.signal())?;
        }
        st.connections.push(Connection {
            remote_rank,
            tag,
            transport,
            local_buff: buff,
            local_size: size,
            epochs,
            remote: None,
        });
        log::info!(
            "connection {} recorded: peer {remote_rank}, tag {tag}, {size} bytes",
            st.connections.len() - 1
        );
        Ok(())
    }

    /// `mscclppConnectionSetup`: exchanges what each pair needs, maps peers' memory, ends with a barrier.
    pub fn setup(&self) -> Result<()> {
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.proxy.is_running() || st.ib.is_running() {
            return Err(Error::invalid_usage(
                "mscclppConnectionSetup called while the proxy runs",
            ));
        }
        let pending = st.set_up..st.connections.len();
        let mut own_segment = None;
        if !pending.is_empty() {
            let gpu = Self::gpu(&mut st)?;
            if st.p2p_fifo.is_none() {
                st.p2p_fifo = Some(DeviceFifo::new(&gpu)?);
            }
            let me = ProcessId::this();
            own_segment = Self::place_fast_flags(&mut st, &gpu, pending.clone());
            for c in &st.connections[pending.clone()] {
                let info = SetupInfo {
                    rank: self.rank as u32,
                    tag: c.tag,
                    transport: c.transport.code(),
                    process: me,
                    device: gpu.device,
                    buffer: IpcExport::new(c.local_buff, c.local_size, "localBuff")?,
                    epochs: IpcExport::new(c.epochs.signal(), Epochs::BYTES as u64, "epoch counters")?,
                    fast_flag: c
                        .epochs
                        .fast_flag()
                        .map(|f| (f.memory.name().to_string(), f.offset as u32)),
                };
                self.bootstrap
                    .send(c.remote_rank, message_tag(TAG_CONNECTION, c.tag), &info.to_bytes())?;
            }
            // IB connections also send their queue pair and memory regions, in a message of their own.
            for i in pending.clone() {
                let c = &st.connections[i];
                if matches!(c.transport, TransportKind::Ib { .. }) {
                    let msg = st.ib.setup_message(i)?;
                    self.bootstrap
                        .send(c.remote_rank, message_tag(TAG_IB_CONNECTION, c.tag), &msg)?;
                }
            }
            for i in pending.clone() {
                let (peer, tag, kind) = {
                    let c = &st.connections[i];
                    (c.remote_rank, c.tag, c.transport.clone())
                };
                let bytes = self.bootstrap.recv(peer, message_tag(TAG_CONNECTION, tag))?;
                let info = SetupInfo::from_bytes(&bytes)?;
                if info.rank as usize != peer || info.tag != tag {
                    return Err(Error::remote(format!(
                        "rank {peer} answered set-up of tag {tag} with rank {} tag {}",
                        info.rank, info.tag
                    )));
                }
                if info.transport != kind.code() {
                    return Err(Error::invalid_usage(format!(
                        "connection to rank {peer} tag {tag}: this side uses transport {} but the peer uses {}",
                        kind.code(),
                        info.transport
                    )));
                }
                let remote = if matches!(kind, TransportKind::Ib { .. }) {
                    let bytes = self.bootstrap.recv(peer, message_tag(TAG_IB_CONNECTION, tag))?;
                    let (buff, size, epochs) = st.ib.complete_setup(i, &bytes)?;
                    RemoteSide {
                        buff,
                        size,
                        epochs,
                        fast_flag: None,
                    }
                } else {
                    self.map_remote(&mut st, &gpu, &info, me)?
                };
                st.connections[i].remote = Some(remote);
            }
            st.set_up = st.connections.len();
            let counts = (0..st.set_up)
                .map(|i| {
                    AtomicU64::new(
                        st.flags_sent
                            .get(i)
                            .map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed)),
                    )
                })
                .collect();
            st.flags_sent = Arc::new(counts);
            let mut dev_conns = Vec::with_capacity(st.connections.len());
            for i in 0..st.connections.len() {
                // IB connections use the FIFO of their device's proxy.
                let fifo = if matches!(st.connections[i].transport, TransportKind::Ib { .. }) {
                    st.ib.fifo_view(&gpu, i)?
                } else {
                    st.p2p_fifo.as_ref().expect("allocated above").device_view(i)
                };
                dev_conns.push(mscclppDevConn {
                    base: st.connections[i].base_conn(),
                    fifo,
                });
            }
            st.dev_conns = DevConnTable(dev_conns);
        }
        drop(st);
        self.bootstrap.barrier()?;
        // Every peer has opened our shared memory now: its name may go, so that nothing is left behind
        // if the job dies.
        if let Some(m) = own_segment {
            m.unlink();
        }
        log::info!("connection set-up done");
        Ok(())
    }

    /// Gives the pending P2P connections fast flags, in one new object of shared host memory (unless
    /// `MSCCLPP_P2P_FAST_FLAGS=0`). Best effort: without them only the copy engine raises flags, which is
    /// slower. Returns the object, whose name goes once every peer has opened it.
    fn place_fast_flags(
        st: &mut CommState,
        gpu: &GpuContext,
        pending: std::ops::Range<usize>,
    ) -> Option<Arc<SharedHostMemory>> {
        let p2p: Vec<usize> = pending
            .filter(|&i| st.connections[i].transport == TransportKind::P2p)
            .collect();
        if p2p.is_empty() || !P2pOptions::from_env().fast_flags {
            return None;
        }
        let size = (p2p.len() * FastFlag::STRIDE).next_multiple_of(4096);
        let memory = match SharedHostMemory::create(gpu, size) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                log::warn!("no fast flags (only the copy engine raises flags, which is slower): {e}");
                return None;
            }
        };
        for (k, &i) in p2p.iter().enumerate() {
            let fast =
                FastFlag::at(memory.clone(), k * FastFlag::STRIDE).expect("the object holds a word per connection");
            if let Err(e) = st.connections[i].epochs.set_fast_flag(fast) {
                log::warn!("connection {i}: no fast flag: {e}");
            }
        }
        Some(memory)
    }

    /// Maps a peer's buffer, epoch counters and fast flag into our context (directly, if the peer shares
    /// our process).
    fn map_remote(&self, st: &mut CommState, gpu: &GpuContext, info: &SetupInfo, me: ProcessId) -> Result<RemoteSide> {
        let (buff, epochs) = if info.process == me {
            gpu.enable_peer_access_to(info.buffer.address);
            (info.buffer.address, info.epochs.address)
        } else {
            let buf_map = Self::open_ipc(st, gpu, info.process, &info.buffer)?;
            let epoch_map = Self::open_ipc(st, gpu, info.process, &info.epochs)?;
            (
                buf_map.base() + info.buffer.offset,
                epoch_map.base() + info.epochs.offset,
            )
        };
        let fast_flag = match &info.fast_flag {
            None => None,
            Some((name, offset)) => {
                let memory = opened_once(&mut st.peer_flags, name.clone(), || {
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
        Ok(RemoteSide {
            buff,
            size: info.buffer.size,
            epochs,
            fast_flag,
        })
    }

    fn open_ipc(st: &mut CommState, gpu: &GpuContext, peer: ProcessId, e: &IpcExport) -> Result<Arc<IpcMapping>> {
        opened_once(&mut st.ipc, (peer, e.address - e.offset), || {
            IpcMapping::open(gpu, &e.handle)
        })
    }

    /// `mscclppGetAllDeviceConnections`: the device view of every connection, in connect order.
    pub fn device_connections(&self) -> Result<(*mut mscclppDevConn, usize)> {
        let mut st = self.state.lock();
        if st.connections.is_empty() {
            return Err(Error::invalid_usage(
                "no connections: call mscclppConnect and mscclppConnectionSetup first",
            ));
        }
        if st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(
                "connections are not set up: call mscclppConnectionSetup first",
            ));
        }
        Ok((st.dev_conns.as_mut_ptr(), st.dev_conns.len()))
    }

    /// `mscclppGetDeviceConnection`: the first connection to `remote_rank` with `tag`.
    pub fn device_connection(&self, remote_rank: i32, tag: i32) -> Result<*mut mscclppDevConn> {
        let (ptr, n) = self.device_connections()?;
        let st = self.state.lock();
        let i = st.dev_conns[..n]
            .iter()
            .position(|c| c.base.remoteRank == remote_rank && c.base.tag == tag)
            .ok_or_else(|| {
                Error::invalid_argument(format!("no connection to remoteRank {remote_rank} with tag {tag}"))
            })?;
        // SAFETY: `i < n`, the length of the array `ptr` points at.
        Ok(unsafe { ptr.add(i) })
    }

    /// `mscclppProxyLaunch`: starts the proxy thread that serves the P2P connections.
    pub fn proxy_launch(&self) -> Result<()> {
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.proxy.is_running() || st.ib.is_running() {
            return Err(Error::invalid_usage("the proxy is already running"));
        }
        if st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(
                "call mscclppConnectionSetup before mscclppProxyLaunch",
            ));
        }
        if st
            .connections
            .iter()
            .any(|c| matches!(c.transport, TransportKind::Ib { .. }))
        {
            // One proxy per IB device.
            let gpu = Self::gpu(&mut st)?;
            let flags_sent = st.flags_sent.clone();
            st.ib.launch(&gpu, &flags_sent)?;
        }
        let routes: Vec<Option<P2pRoute>> = st
            .connections
            .iter()
            .map(|c| match (&c.transport, &c.remote) {
                (TransportKind::P2p, Some(r)) => Some(P2pRoute {
                    local_buff: c.local_buff,
                    local_size: c.local_size,
                    remote_buff: r.buff,
                    remote_size: r.size,
                    local_epochs: c.epochs.signal(),
                    remote_epochs: r.epochs,
                    fast_flag: r.fast_flag,
                }),
                _ => None,
            })
            .collect();
        if routes.iter().all(|r| r.is_none()) {
            log::info!("no P2P connections; no proxy to launch");
            return Ok(());
        }
        let gpu = Self::gpu(&mut st)?;
        let st = &mut *st; // the FIFO and the proxy are borrowed apart below
        let fifo = st.p2p_fifo.as_ref().expect("set-up allocates the FIFO");
        let options = P2pOptions::from_env();
        log::info!("P2P proxy options: {options:?}");
        let handler = P2pHandler::new(&gpu, routes, options, st.flags_sent.clone())?;
        // SAFETY: `st.p2p_fifo` is dropped only after the proxy is stopped (destroy stops it first).
        unsafe {
            st.proxy.launch(
                format!("mscclpp-proxy-{}", self.rank),
                self.rank,
                gpu,
                fifo,
                Box::new(handler),
            )?
        };
        log::info!("P2P proxy launched");
        if crate::gpu::lazy_loading() {
            log::info!(
                "CUDA loads kernels lazily: launch each kernel once (or call cudaFuncGetAttributes) before one \
                 waits on the proxy, or set CUDA_MODULE_LOADING=EAGER; a first launch while a kernel waits on \
                 the proxy deadlocks"
            );
        }
        Ok(())
    }

    /// Stops the proxy, if it runs. Returns the proxy's failure, if it had one.
    fn stop_proxy(st: &mut CommState) -> Result<()> {
        let ib = st.ib.stop();
        st.proxy.stop("the proxy")?;
        Self::check_proxy(st).and(ib)
    }

    /// `mscclppProxyStop`: a barrier (so no rank stops while peers still need it), then the stop.
    pub fn proxy_stop(&self) -> Result<()> {
        self.bootstrap.barrier()?;
        Self::stop_proxy(&mut self.state.lock())
    }

    /// `mscclppRegisterBuffer`: exchanges one more buffer with the peer of every connection; returns
    /// one entry per connection, in connect order.
    pub fn register_buffer(&self, ptr: DevicePtr, size: u64) -> Result<Vec<mscclppRegisteredMemoryP2P>> {
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.connections.is_empty() || st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(
                "mscclppRegisterBuffer needs set-up connections: call mscclppConnectionSetup first",
            ));
        }
        let gpu = Self::gpu(&mut st)?;
        let export = IpcExport::new(ptr, size, "local_memory")?;
        let me = ProcessId::this();
        let msg = RegisterInfo {
            process: me,
            buffer: export,
        }
        .to_bytes();
        let peers: Vec<(usize, i32, bool)> = st
            .connections
            .iter()
            .map(|c| (c.remote_rank, c.tag, matches!(c.transport, TransportKind::Ib { .. })))
            .collect();
        for (i, &(peer, tag, ib)) in peers.iter().enumerate() {
            // IB peers get our memory region's address and rkey instead of an IPC handle.
            let ib_msg = if ib {
                Some(st.ib.register_message(i, ptr, size)?)
            } else {
                None
            };
            self.bootstrap
                .send(peer, message_tag(TAG_REGISTER, tag), ib_msg.as_deref().unwrap_or(&msg))?;
        }
        let mut entries = Vec::with_capacity(peers.len());
        for (i, &(peer, tag, ib)) in peers.iter().enumerate() {
            let bytes = self.bootstrap.recv(peer, message_tag(TAG_REGISTER, tag))?;
            if ib {
                entries.push(st.ib.register_remote(i, ptr, size, &bytes)?);
                continue;
            }
            let info = RegisterInfo::from_bytes(&bytes)?;
            let remote = if info.process == me {
                gpu.enable_peer_access_to(info.buffer.address);
                info.buffer.address
            } else {
                let m = Self::open_ipc(&mut st, &gpu, info.process, &info.buffer)?;
                m.base() + info.buffer.offset
            };
            st.registered.push(RegisteredRemote {
                ptr: remote,
                size: info.buffer.size,
            });
            entries.push(mscclppRegisteredMemoryP2P {
                remoteBuff: remote as *mut _,
                IbMr: std::ptr::null_mut(),
            });
        }
        Ok(entries)
    }

    /// `mscclppRegisteredBufferWrite`: copies `[src+src_offset, +size)` to every peer's registered
    /// buffer at `dst_offset`, on the application's stream (a `cudaStream_t`, 0 for the default).
    pub fn registered_write(
        &self,
        entries: &[mscclppRegisteredMemoryP2P],
        src: DevicePtr,
        size: u64,
        src_offset: u64,
        dst_offset: u64,
        stream: AppStream,
    ) -> Result<()> {
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        Self::gpu(&mut st)?;
        pointer_info(src + src_offset, size, "srcBuff + srcOffset")?;
        for (i, e) in entries.iter().enumerate() {
            if st.ib.owns(e.IbMr) {
                // An IB peer: an RDMA write into its registered buffer.
                st.ib
                    .registered_write(e.IbMr, src, size, src_offset, dst_offset, stream)?;
                continue;
            }
            let dst = e.remoteBuff as DevicePtr;
            let reg = st.registered.iter().find(|r| r.ptr == dst).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "regMem->p2p[{i}] was not made by mscclppRegisterBuffer on this communicator"
                ))
            })?;
            if dst_offset.checked_add(size).is_none_or(|end| end > reg.size) {
                return Err(Error::invalid_argument(format!(
                    "dstOffset {dst_offset} + size {size} is past the end of peer buffer {i} ({} bytes)",
                    reg.size
                )));
            }
            // SAFETY: the source range lies in one allocation of the application (`pointer_info` above),
            // the destination inside the peer's registered buffer (checked above), which stays mapped
            // until the communicator is destroyed.
            unsafe { stream.copy(dst + dst_offset, src + src_offset, size as usize) }
                .map_err(|e| Error::new(e.kind, format!("copy to peer buffer {i}: {}", e.message)))?;
        }
        Ok(())
    }

    /// Releases everything: stops the proxy (no barrier: peers may be gone), waits for pending copies,
    /// unmaps peers' memory, frees ours. Safe to call after `proxy_stop`.
    pub fn destroy(&self) -> Result<()> {
        let mut st = self.state.lock();
        let stop = Self::stop_proxy(&mut st);
        if let Some(g) = st.gpu {
            let _ = g.make_current();
        }
        st.dev_conns.clear();
        // IB memory regions go before the memory they cover; a failure was reported by the stop above.
        let _ = st.ib.clear();
        st.connections.clear();
        st.registered.clear();
        st.ipc.clear();
        st.peer_flags.clear();
        st.p2p_fifo = None;
        if let Some(g) = st.gpu.take() {
            g.release();
        }
        stop
    }
}

/// One registered buffer, as sent to a peer.
struct RegisterInfo {
    process: ProcessId,
    buffer: IpcExport,
}

const REGISTER_MAGIC: u32 = 0x4d53_5052; // "MSPR"

impl RegisterInfo {
    fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(128);
        w.u32(REGISTER_MAGIC).u64(self.process.host).u32(self.process.pid);
        self.buffer.write(&mut w);
        w.into_bytes()
    }
    fn from_bytes(b: &[u8]) -> Result<RegisterInfo> {
        let mut r = Reader::new(b, "registered-buffer message");
        r.magic(REGISTER_MAGIC)?;
        let info = RegisterInfo {
            process: ProcessId {
                host: r.u64()?,
                pid: r.u32()?,
            },
            buffer: IpcExport::read(&mut r)?,
        };
        r.finish()?;
        Ok(info)
    }
}

/// The peer resource under `key` in `cache`, opened by `open` the first time (several connections and
/// registered buffers share a peer's allocation or shared memory; each is opened once and kept until
/// destroy).
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
    fn message_tags_separate_kinds_and_keep_negative_tags_distinct() {
        assert_ne!(message_tag(TAG_CONNECTION, 5), message_tag(TAG_REGISTER, 5));
        assert_ne!(message_tag(TAG_CONNECTION, -1), message_tag(TAG_CONNECTION, 1));
        assert_eq!(message_tag(TAG_CONNECTION, -1) >> 32, 1);
    }

    #[test]
    fn register_info_round_trips_and_rejects_garbage() {
        let r = RegisterInfo {
            process: ProcessId { host: 9, pid: 7 },
            buffer: IpcExport {
                handle: [4; 64],
                offset: 1,
                size: 2,
                address: 3,
            },
        };
        let back = RegisterInfo::from_bytes(&r.to_bytes()).unwrap();
        assert_eq!((back.process, back.buffer), (r.process, r.buffer));
        assert!(RegisterInfo::from_bytes(&[1, 2, 3]).is_err());
    }
}
