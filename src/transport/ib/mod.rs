//! The InfiniBand transport: triggers carried out as RDMA writes from GPU memory (GPUDirect RDMA), by
//! one proxy thread and FIFO per IB device, over one reliable-connected queue pair per connection.
//!
//! - `verbs`: the narrow interface to a verbs provider (library, device, memory region, queue pair).
//! - `real` and `sys`: that interface over the system's libibverbs, loaded with `dlopen` at run time.
//!   We write our own minimal bindings instead of using the `ibverbs` crate because that crate builds
//!   rdma-core with cmake and links libibverbs at build time: the library must load, and serve P2P, on
//!   machines without InfiniBand drivers, and `MSCCLPP_IBV_SO` must be able to pick another libibverbs.
//! - `sim` (tests): a simulated fabric in host memory that executes writes and injected failures.
//! - `queue`: a queue pair with the accounting that never overruns its send or completion queue.
//! - `handler`: the proxy's `TriggerHandler` (Data, Flag, Sync).
//! - this file: settings from the environment, the set-up messages, and `IbTransport`, the IB part of a
//!   communicator (devices, connections, FIFOs, proxies, registered buffers), which implements
//!   `Transport`.

pub mod handler;
pub mod queue;
pub mod real;
#[cfg(test)]
pub mod sim;
pub mod sys;
#[cfg(test)]
mod tests;
pub mod verbs;

use super::{FlagsCarried, RegisteredWrite, Transport};
use crate::codec::{Reader, Writer};
use crate::connection::{Connection, TransportKind};
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, GpuContext, Stream};
use crate::proxy::fifo::DeviceFifo;
use crate::proxy::{AbortHook, ProxySlot};
use crate::types::{mscclppDevConn, mscclppIbMr, mscclppIbMrInfo, mscclppRegisteredMemoryP2P};
use handler::{IbFlagMode, IbHandler, IbRoute, KeyedRange};
use queue::{IbQueue, QueueLabel};
use std::sync::Arc;
use std::time::Duration;
use verbs::{LinkLayer, MemoryRegion, PortInfo, QpEndpoint, VerbsDevice, VerbsLibrary};

/// Settings read from the environment when the first IB connection is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbConfig {
    /// `MSCCLPP_IB_PORT`: the device port (1-based).
    pub port: u8,
    /// `MSCCLPP_IB_GID_INDEX`: `-1` addresses peers by LID (InfiniBand); `>= 0` by that GID (RoCE).
    pub gid_index: i32,
    /// `MSCCLPP_IB_CQ_SIZE`: entries of each connection's completion queue.
    pub cq_size: u32,
    /// `MSCCLPP_IB_CQ_POLL_BATCH`: completions taken per poll.
    pub poll_batch: u32,
    /// `MSCCLPP_IB_QP_DEPTH`: send work requests each queue pair holds.
    pub qp_depth: u32,
    /// `MSCCLPP_IBV_SO`: the libibverbs to load.
    pub ibv_so: String,
    /// `MSCCLPP_IB_FLAG=count|epoch`: what a flag writes (`handler`).
    pub flag: IbFlagMode,
}

/// The settings' declared defaults.
impl Default for IbConfig {
    fn default() -> Self {
        IbConfig::from_lookup(|_| None).expect("the declared defaults are valid (the settings' tests)")
    }
}

impl IbConfig {
    pub fn from_env() -> Result<IbConfig> {
        Self::from_source(&crate::settings::Source::process())
    }

    /// Reads the settings; a value that does not parse or is out of range is an error naming the
    /// variable (`settings`: a mismatch between ranks would fail later, far from its cause).
    pub fn from_source(env: &crate::settings::Source) -> Result<IbConfig> {
        use crate::settings::{IB_CQ_POLL_BATCH, IB_CQ_SIZE, IB_FLAG, IB_GID_INDEX, IB_PORT, IB_QP_DEPTH, IBV_SO};
        Ok(IbConfig {
            port: env.checked_int(&IB_PORT)?,
            gid_index: env.checked_int(&IB_GID_INDEX)?,
            cq_size: env.checked_int(&IB_CQ_SIZE)?,
            poll_batch: env.checked_int(&IB_CQ_POLL_BATCH)?,
            qp_depth: env.checked_int(&IB_QP_DEPTH)?,
            ibv_so: env.text_value(&IBV_SO),
            flag: match env.checked_choice(&IB_FLAG)? {
                "epoch" => IbFlagMode::Epoch,
                _ => IbFlagMode::Count,
            },
        })
    }

    /// `from_source` over a lookup function (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<IbConfig> {
        Self::from_source(&crate::settings::Source::from_fn(get))
    }
}

/// What one side of an IB connection sends its peer during `mscclppConnectionSetup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbConnInfo {
    pub rank: u32,
    pub tag: i32,
    pub endpoint: QpEndpoint,
    pub buff: KeyedRange,
    pub epochs: KeyedRange,
}

const CONN_MAGIC: u32 = 0x4d53_4942; // "MSIB"
const REGISTER_MAGIC: u32 = 0x4d53_4952; // "MSIR"

fn put_range(w: &mut Writer, r: &KeyedRange) {
    w.u64(r.addr).u64(r.size).u32(r.key);
}

fn read_range(r: &mut Reader) -> Result<KeyedRange> {
    Ok(KeyedRange {
        addr: r.u64()?,
        size: r.u64()?,
        key: r.u32()?,
    })
}

impl IbConnInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let e = &self.endpoint;
        let mut w = Writer::with_capacity(96);
        w.u32(CONN_MAGIC)
            .u32(self.rank)
            .i32(self.tag)
            .u8(e.port)
            .u16(e.lid)
            .bytes(&e.gid)
            .i32(e.gid_index)
            .u32(e.qpn)
            .u32(e.psn)
            .u8(e.mtu);
        put_range(&mut w, &self.buff);
        put_range(&mut w, &self.epochs);
        w.into_bytes()
    }

    pub fn from_bytes(b: &[u8]) -> Result<IbConnInfo> {
        let mut r = Reader::new(b, "IB connection set-up message");
        r.magic(CONN_MAGIC)?;
        let rank = r.u32()?;
        let tag = r.i32()?;
        let endpoint = QpEndpoint {
            port: r.u8()?,
            lid: r.u16()?,
            gid: r.take()?,
            gid_index: r.i32()?,
            qpn: r.u32()?,
            psn: r.u32()?,
            mtu: r.u8()?,
        };
        let info = IbConnInfo {
            rank,
            tag,
            endpoint,
            buff: read_range(&mut r)?,
            epochs: read_range(&mut r)?,
        };
        r.finish()?;
        Ok(info)
    }
}

fn register_to_bytes(range: &KeyedRange) -> Vec<u8> {
    let mut w = Writer::with_capacity(24);
    w.u32(REGISTER_MAGIC);
    put_range(&mut w, range);
    w.into_bytes()
}

fn register_from_bytes(b: &[u8]) -> Result<KeyedRange> {
    let mut r = Reader::new(b, "IB registered-buffer message");
    r.magic(REGISTER_MAGIC)?;
    let range = read_range(&mut r)?;
    r.finish()?;
    Ok(range)
}

/// One opened IB device and its proxy.
struct IbDevice {
    device: Arc<dyn VerbsDevice>,
    port: PortInfo,
    /// The device's proxy (serving `fifo`; declared first, so that a dropped device stops it first).
    proxy: ProxySlot,
    fifo: Option<DeviceFifo>,
    /// Registered buffers and write sources (besides the connections' own buffers).
    regions: Vec<Box<dyn MemoryRegion>>,
}

/// The IB side of one connection.
struct Endpoint {
    device: usize,
    peer: usize,
    tag: i32,
    queue: Arc<IbQueue>,
    local: QpEndpoint,
    buff: Box<dyn MemoryRegion>,
    epochs: Box<dyn MemoryRegion>,
    /// The peer's buffer and epoch block (its first 16 bytes), once set up.
    remote: Option<(KeyedRange, KeyedRange)>,
}

/// A buffer registered with `mscclppRegisterBuffer`, as one IB connection's entry in `regMem->p2p`.
struct RegisteredIb {
    conn: usize,
    /// Handed to the application as `mscclppRegisteredMemoryP2P::IbMr`; boxed so the address is stable.
    record: Box<mscclppIbMr>,
    remote: KeyedRange,
}

// SAFETY: the raw pointers in `mscclppIbMr` are addresses we hand to the application and only compare;
// we never dereference them.
unsafe impl Send for RegisteredIb {}

/// A region as we reach it (lkey) or as the peer does (rkey).
fn keyed(mr: &dyn MemoryRegion, remote: bool) -> KeyedRange {
    KeyedRange {
        addr: mr.addr(),
        size: mr.size(),
        key: if remote { mr.rkey() } else { mr.lkey() },
    }
}

fn initial_psn(qpn: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ qpn.wrapping_mul(0x9e37_79b9) ^ std::process::id()) & 0x00ff_ffff
}

/// The IB part of a communicator.
pub struct IbTransport {
    library: Option<Arc<dyn VerbsLibrary>>,
    config: Option<IbConfig>,
    rank: usize,
    /// The communicator's GPU, from the first connection on (FIFOs and proxies work on it).
    gpu: Option<GpuContext>,
    devices: Vec<IbDevice>,
    /// By connection index; `None` for connections of other transports.
    endpoints: Vec<Option<Endpoint>>,
    registered: Vec<RegisteredIb>,
    /// How long a wait for completions may see none before the peer is declared gone.
    stall_timeout: Duration,
}

impl Default for IbTransport {
    fn default() -> Self {
        IbTransport {
            library: None,
            config: None,
            rank: 0,
            gpu: None,
            devices: Vec::new(),
            endpoints: Vec::new(),
            registered: Vec::new(),
            stall_timeout: Duration::from_secs(60),
        }
    }
}

impl IbTransport {
    /// The IB transport of rank `rank`'s communicator; libibverbs and the settings are loaded with the
    /// first connection.
    pub fn new(rank: usize) -> IbTransport {
        IbTransport {
            rank,
            ..Default::default()
        }
    }

    /// An IB transport over a given verbs provider and settings (tests use the simulated fabric).
    pub fn with_library(library: Arc<dyn VerbsLibrary>, config: IbConfig, stall_timeout: Duration) -> IbTransport {
        IbTransport {
            library: Some(library),
            config: Some(config),
            stall_timeout,
            ..Default::default()
        }
    }

    fn config(&mut self) -> Result<IbConfig> {
        if self.config.is_none() {
            self.config = Some(IbConfig::from_env()?);
        }
        Ok(self.config.clone().expect("set above"))
    }

    fn library(&mut self) -> Result<Arc<dyn VerbsLibrary>> {
        if let Some(l) = &self.library {
            return Ok(l.clone());
        }
        let so = self.config()?.ibv_so;
        let lib: Arc<dyn VerbsLibrary> = Arc::new(real::RealLibrary::load(&so)?);
        self.library = Some(lib.clone());
        Ok(lib)
    }

    /// Opens `name` (once per communicator) and checks its port; returns its index.
    pub fn open_device(&mut self, name: &str) -> Result<usize> {
        if let Some(i) = self.devices.iter().position(|d| d.device.name() == name) {
            return Ok(i);
        }
        let cfg = self.config()?;
        let lib = self.library()?;
        let device = lib.open(name)?;
        let port = device.port(cfg.port, cfg.gid_index)?;
        if !port.active {
            return Err(Error::system(format!(
                "port {} of InfiniBand device \"{name}\" is not active (MSCCLPP_IB_PORT selects the port)",
                cfg.port
            )));
        }
        if port.link_layer == LinkLayer::Ethernet && cfg.gid_index < 0 {
            return Err(Error::invalid_usage(format!(
                "port {} of \"{name}\" is Ethernet (RoCE): set MSCCLPP_IB_GID_INDEX to the GID index to use",
                cfg.port
            )));
        }
        log::info!(
            "opened InfiniBand device \"{name}\" port {} (LID {}, MTU {} bytes, {})",
            cfg.port,
            port.lid,
            verbs::mtu_bytes(port.mtu),
            if cfg.gid_index >= 0 {
                format!("RoCE GID index {}", cfg.gid_index)
            } else {
                "LID addressing".into()
            }
        );
        self.devices.push(IbDevice {
            device,
            port,
            fifo: None,
            proxy: ProxySlot::default(),
            regions: Vec::new(),
        });
        Ok(self.devices.len() - 1)
    }

    /// `mscclppConnect` over IB: registers the buffer and the epoch block and creates the queue pair.
    #[allow(clippy::too_many_arguments)]
    pub fn open_endpoint(
        &mut self,
        rank: usize,
        conn: usize,
        device: &str,
        peer: usize,
        tag: i32,
        buff: DevicePtr,
        size: u64,
        epochs: DevicePtr,
    ) -> Result<()> {
        self.rank = rank;
        let cfg = self.config()?;
        let d = self.open_device(device)?;
        let dev = &self.devices[d];
        let buff_mr = dev.device.register(buff, size)?;
        let epoch_mr = dev.device.register(epochs, 16)?;
        let qp = dev.device.create_qp(cfg.port, cfg.qp_depth, cfg.cq_size)?;
        let local = QpEndpoint {
            port: cfg.port,
            lid: dev.port.lid,
            gid: dev.port.gid,
            gid_index: cfg.gid_index,
            qpn: qp.qp_num(),
            psn: initial_psn(qp.qp_num()),
            mtu: dev.port.mtu,
        };
        let label = QueueLabel {
            rank,
            peer,
            tag,
            device: format!("device {device}"),
        };
        let queue = Arc::new(IbQueue::new(qp, label, cfg.poll_batch as usize, self.stall_timeout));
        if self.endpoints.len() <= conn {
            self.endpoints.resize_with(conn + 1, || None);
        }
        self.endpoints[conn] = Some(Endpoint {
            device: d,
            peer,
            tag,
            queue,
            local,
            buff: buff_mr,
            epochs: epoch_mr,
            remote: None,
        });
        Ok(())
    }

    fn endpoint(&self, conn: usize) -> Result<&Endpoint> {
        self.endpoints
            .get(conn)
            .and_then(|e| e.as_ref())
            .ok_or_else(|| Error::internal(format!("connection {conn} is not an IB connection")))
    }

    /// The trigger handler of device `d`'s proxy: routes for its set-up connections, by connection id;
    /// `flags` counts the flags carried out per connection id.
    pub fn handler(&self, d: usize, flags: FlagsCarried) -> IbHandler {
        let routes = self
            .endpoints
            .iter()
            .map(|e| match e {
                Some(e) if e.device == d => e.remote.map(|(buff, epochs)| IbRoute {
                    queue: e.queue.clone(),
                    local_buff: keyed(e.buff.as_ref(), false),
                    remote_buff: buff,
                    local_epochs: keyed(e.epochs.as_ref(), false),
                    remote_epochs: epochs,
                }),
                _ => None,
            })
            .collect();
        let mode = self.config.as_ref().map_or(IbFlagMode::Count, |c| c.flag);
        IbHandler::new(routes, mode, flags)
    }

    /// A region of device `d` that covers `[addr, +len)`, registering `register` if none does. Returns
    /// its lkey, rkey and provider handle.
    fn region_for(&mut self, d: usize, addr: u64, len: u64, register: (u64, u64)) -> Result<(u32, u32, usize)> {
        let ids = |mr: &dyn MemoryRegion| (mr.lkey(), mr.rkey(), mr.raw());
        let conn_buff = self
            .endpoints
            .iter()
            .flatten()
            .find(|e| e.device == d && e.buff.contains(addr, len));
        if let Some(e) = conn_buff {
            return Ok(ids(e.buff.as_ref()));
        }
        let dev = &mut self.devices[d];
        if let Some(r) = dev.regions.iter().find(|r| r.contains(addr, len)) {
            return Ok(ids(r.as_ref()));
        }
        let mr = dev.device.register(register.0, register.1)?;
        let r = ids(mr.as_ref());
        dev.regions.push(mr);
        Ok(r)
    }

    /// RDMA-writes `[src, +size)` into the peer's registered buffer of entry `ib_mr` at `dst_offset`, and
    /// waits until the write has completed. `source` is the range to register if no region covers
    /// `[src, +size)` yet (the source's whole allocation, so that later writes from it reuse the region).
    pub fn rdma_write_and_wait(
        &mut self,
        ib_mr: *const mscclppIbMr,
        src: u64,
        size: u64,
        dst_offset: u64,
        source: (u64, u64),
    ) -> Result<()> {
        let r = self
            .registered
            .iter()
            .find(|r| std::ptr::eq(&*r.record, ib_mr))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "regMem entry with IbMr {ib_mr:p} was not made by mscclppRegisterBuffer on this communicator"
                ))
            })?;
        let (conn, remote) = (r.conn, r.remote);
        if dst_offset.checked_add(size).is_none_or(|end| end > remote.size) {
            return Err(Error::invalid_argument(format!(
                "dstOffset {dst_offset} + size {size} is past the end of the peer's registered buffer ({} bytes)",
                remote.size
            )));
        }
        let d = self.endpoint(conn)?.device;
        let (lkey, _, _) = self.region_for(d, src, size, source)?;
        let queue = self.endpoint(conn)?.queue.clone();
        let seq = queue.write(src, lkey, size, remote.addr + dst_offset, remote.key)?;
        queue.wait_for(seq)
    }
}

impl Transport for IbTransport {
    fn name(&self) -> &'static str {
        "IB"
    }

    fn carries(&self, kind: &TransportKind) -> bool {
        matches!(kind, TransportKind::Ib { .. })
    }

    /// Loads libibverbs and opens the device (once per communicator), so that a machine without them
    /// fails here, naming the devices it found.
    fn check_connect(&mut self, kind: &TransportKind) -> Result<()> {
        match kind {
            TransportKind::Ib { device } => self.open_device(device).map(|_| ()),
            other => Err(Error::internal(format!("the IB transport cannot carry {other:?}"))),
        }
    }

    fn connect(&mut self, gpu: &GpuContext, conn: usize, c: &Connection) -> Result<()> {
        let TransportKind::Ib { device } = &c.transport else {
            return Err(Error::internal(format!(
                "the IB transport cannot carry {:?}",
                c.transport
            )));
        };
        self.gpu = Some(*gpu);
        let rank = self.rank;
        self.open_endpoint(
            rank,
            conn,
            device,
            c.remote_rank,
            c.tag,
            c.local_buff,
            c.local_size,
            c.epochs.signal(),
        )
    }

    /// The message that tells the peer of connection `conn` how to reach it.
    fn setup_message(&self, conn: usize) -> Result<Vec<u8>> {
        let e = self.endpoint(conn)?;
        Ok(IbConnInfo {
            rank: self.rank as u32,
            tag: e.tag,
            endpoint: e.local,
            buff: keyed(e.buff.as_ref(), true),
            epochs: keyed(e.epochs.as_ref(), true),
        }
        .to_bytes())
    }

    /// Completes connection `conn` with the peer's set-up message: checks it, and moves the queue pair
    /// through RTR to RTS.
    fn complete_setup(&mut self, conn: usize, peer_message: &[u8]) -> Result<()> {
        let info = IbConnInfo::from_bytes(peer_message)?;
        let e = self.endpoint(conn)?;
        if info.rank as usize != e.peer || info.tag != e.tag {
            return Err(Error::remote(format!(
                "rank {} answered the IB set-up of tag {} with rank {} tag {}",
                e.peer, e.tag, info.rank, info.tag
            )));
        }
        if (info.endpoint.gid_index >= 0) != (e.local.gid_index >= 0) {
            return Err(Error::invalid_usage(format!(
                "connection to rank {} tag {}: one side addresses by GID (RoCE) and the other by LID; set \
                 MSCCLPP_IB_GID_INDEX the same way on every rank",
                e.peer, e.tag
            )));
        }
        if info.epochs.size < 16 {
            return Err(Error::remote("the peer's epoch counters are smaller than 16 bytes"));
        }
        let local = e.local;
        e.queue
            .with_qp(|qp| qp.connect(&local, &info.endpoint))
            .map_err(|err| {
                Error::new(
                    err.kind,
                    format!(
                        "connecting to rank {} (tag {}, queue pair {}, LID {}): {}",
                        info.rank, info.tag, info.endpoint.qpn, info.endpoint.lid, err.message
                    ),
                )
            })?;
        let e = self.endpoints[conn].as_mut().expect("checked above");
        e.remote = Some((info.buff, info.epochs));
        log::info!(
            "IB connection {conn} to rank {} tag {} ready (queue pair {} -> {})",
            e.peer,
            e.tag,
            e.local.qpn,
            info.endpoint.qpn
        );
        Ok(())
    }

    /// The FIFO of the connection's device (allocated on first use); kernels do not reach the peer's
    /// memory, so `remoteBuff` and `remoteSignalEpochId` stay null.
    fn fill_device_connection(&mut self, conn: usize, dev: &mut mscclppDevConn) -> Result<()> {
        let gpu = self
            .gpu
            .ok_or_else(|| Error::internal("the IB transport has no GPU: it has no connection"))?;
        let d = self.endpoint(conn)?.device;
        dev.fifo = DeviceFifo::view_on_first_use(&mut self.devices[d].fifo, &gpu, conn)?;
        Ok(())
    }

    /// One proxy thread per IB device that has connections.
    fn launch_proxy(&mut self, flags: &FlagsCarried, on_abort: &AbortHook) -> Result<()> {
        // A rejected IB connect leaves the transport without connections (and without a GPU).
        if self.endpoints.iter().all(Option::is_none) {
            return Ok(());
        }
        let rank = self.rank;
        let gpu = self
            .gpu
            .ok_or_else(|| Error::internal("the IB transport has no GPU: it has no connection"))?;
        for d in 0..self.devices.len() {
            if self.devices[d].proxy.is_running() || !self.endpoints.iter().flatten().any(|e| e.device == d) {
                continue;
            }
            let mut handler = self.handler(d, flags.clone());
            handler.set_release_stream(Stream::new(&gpu)?);
            let dev = &mut self.devices[d];
            let fifo = dev
                .fifo
                .as_ref()
                .ok_or_else(|| Error::invalid_usage("call mscclppConnectionSetup before mscclppProxyLaunch"))?;
            let name = format!("mscclpp-ib-{rank}-{}", dev.device.name());
            // SAFETY: `dev.fifo` is dropped only after the proxy is stopped (`clear` stops it first, and
            // the proxy slot is declared before the FIFO).
            unsafe { dev.proxy.launch(name, rank, gpu, fifo, Box::new(handler), on_abort)? };
            log::info!("IB proxy for \"{}\" launched", dev.device.name());
        }
        Ok(())
    }

    fn proxy_running(&self) -> bool {
        self.devices.iter().any(|d| d.proxy.is_running())
    }

    fn abort_proxy(&mut self) {
        for dev in &mut self.devices {
            dev.proxy.abort();
        }
    }

    /// Stops every IB proxy; returns the first error any stop had.
    fn stop_proxy(&mut self) -> Result<()> {
        let mut first = None;
        for dev in &mut self.devices {
            let what = format!("the IB proxy of \"{}\"", dev.device.name());
            if let Err(e) = dev.proxy.stop(&what) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The first failure of any IB proxy (a failed queue pair included: its proxy records it).
    fn proxy_failure(&self) -> Option<Error> {
        self.devices.iter().find_map(|d| d.proxy.failure())
    }

    /// Registers `[ptr, +size)` on the device of connection `conn` (once per device) and returns the
    /// message that tells the peer where it is.
    fn register_message(&mut self, conn: usize, ptr: DevicePtr, size: u64) -> Result<Vec<u8>> {
        let d = self.endpoint(conn)?.device;
        let (_, rkey, _) = self.region_for(d, ptr, size, (ptr, size))?;
        Ok(register_to_bytes(&KeyedRange {
            addr: ptr,
            size,
            key: rkey,
        }))
    }

    /// Completes the registration of `[ptr, +size)` with connection `conn`'s peer: the entry for
    /// `regMem->p2p`. Its `IbMr` (owned by us until `clear`) holds our region and buffer, and in `info` the
    /// peer's buffer address and rkey; `remoteBuff` is NULL, as the peer's memory is not mapped here.
    fn register_remote(
        &mut self,
        conn: usize,
        ptr: DevicePtr,
        size: u64,
        peer_message: &[u8],
    ) -> Result<mscclppRegisteredMemoryP2P> {
        let remote = register_from_bytes(peer_message)?;
        let d = self.endpoint(conn)?.device;
        let (_, _, raw) = self.region_for(d, ptr, size, (ptr, size))?;
        let mut record = Box::new(mscclppIbMr {
            mr: raw as *mut _,
            buff: ptr as *mut _,
            info: mscclppIbMrInfo {
                addr: remote.addr,
                rkey: remote.key,
            },
        });
        let entry = mscclppRegisteredMemoryP2P {
            remoteBuff: std::ptr::null_mut(),
            IbMr: &mut *record,
        };
        self.registered.push(RegisteredIb { conn, record, remote });
        Ok(entry)
    }

    fn owns_registered(&self, entry: &mscclppRegisteredMemoryP2P) -> bool {
        self.registered.iter().any(|r| std::ptr::eq(&*r.record, entry.IbMr))
    }

    /// Waits for the application's stream (so that the source is ready), then RDMA-writes the range into
    /// the peer's registered buffer and waits until the write has completed.
    fn registered_write(&mut self, entry: &mscclppRegisteredMemoryP2P, w: &RegisteredWrite) -> Result<()> {
        let info = crate::gpu::pointer_info(w.src + w.src_offset, w.size, "srcBuff + srcOffset")?;
        w.stream.synchronize()?;
        self.rdma_write_and_wait(
            entry.IbMr,
            w.src + w.src_offset,
            w.size,
            w.dst_offset,
            (info.base, info.alloc_size as u64),
        )
    }

    /// Stops the proxies, then destroys queue pairs and deregisters memory (before the memory itself is
    /// freed).
    fn clear(&mut self) -> Result<()> {
        let stopped = self.stop_proxy();
        self.registered.clear();
        self.endpoints.clear();
        self.devices.clear();
        stopped
    }
}
