//! The communicator: one rank's bootstrap, its connections and the transports that carry them.
//!
//! What is common to every transport lives here: the bootstrap, the connection list (in connect order:
//! a connection's index is the `connId` of its triggers and its place in the array of device views),
//! the epoch blocks, the count of flags carried out per connection, the device views handed to kernels,
//! and the communicator's state machine:
//!
//! - `connect` records connections (never while a proxy runs);
//! - `setup` completes the connections recorded since the last set-up and ends with a barrier (more
//!   `connect` and `setup` calls may follow, while no proxy runs);
//! - `proxy_launch` and `proxy_stop` start and stop the transports' proxies, any number of times;
//! - `register_buffer` and `registered_write` need set-up connections;
//! - `destroy` stops the proxies and releases everything.
//!
//! Everything else is the transports' (`transport::Transport`): the communicator loops over them and
//! names a transport kind only in `new_transport`, where the transport of a new connection is chosen.
//!
//! The core names no face: a call that needs an earlier step words its advice with the names the face
//! gives those steps (`SetupNames`), and whoever aborts the communicator says who it is (`abort`'s `by`).

use crate::bootstrap::{Bootstrap, PeerFailure, RootAddress, UniqueId};
use crate::collective::{Call, Collectives, SendRecvOp};
use crate::connection::{Connection, EpochBlock, SetupMessage, TransportKind};
use crate::error::{Error, Result};
use crate::failure::FailureState;
use crate::gpu::{AppStream, DevicePtr, GpuContext, pointer_info};
use crate::proxy::trigger::MAX_CONNECTIONS;
use crate::registration::{Kind, Registrations};
use crate::transport::ib::IbTransport;
use crate::transport::p2p::P2pTransport;
use crate::transport::{FlagsCarried, RegisteredWrite, Transport};
use crate::types::{mscclppDevConn, mscclppRegisteredMemoryP2P};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Who aborts the communicator when a call fails on this rank after its peers may have started theirs
/// (`abort`'s `by`): the core itself, so that the peers are not left waiting.
const ABORTED_BY_FAILED_CALL: &str = "a call that failed on this rank after its peers may have started it";

/// What a face calls the two steps that make connections, recording them and setting them up: the calls
/// that need them word their advice with these ("call ... first"), so that the core names no face.
#[derive(Clone, Copy, Debug)]
pub struct SetupNames {
    pub connect: &'static str,
    pub setup: &'static str,
}

/// Bootstrap tags of the set-up messages: the kind in the high half, the connection tag in the low.
const TAG_CONNECTION: u64 = 1 << 32;
const TAG_REGISTER: u64 = 2 << 32;

fn message_tag(kind: u64, tag: i32) -> u64 {
    kind | tag as u32 as u64
}

/// The transport that carries connections of `kind` in a new communicator of rank `rank`: the one place
/// that names transport kinds. A new transport adds its arm here (and its folder under `transport/`).
fn new_transport(kind: &TransportKind, rank: usize) -> Box<dyn Transport> {
    match kind {
        TransportKind::P2p => Box::new(P2pTransport::new(rank)),
        TransportKind::Ib { .. } => Box::new(IbTransport::new(rank)),
    }
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
    /// One transport per kind of connection in use, made with the first connection of its kind.
    /// Declared before `connections` so that, when dropped, they release what covers the connections'
    /// memory (IB memory regions) before that memory is freed.
    transports: Vec<Box<dyn Transport>>,
    connections: Vec<Connection>,
    /// Connections `[0, set_up)` have completed their set-up (`setup`).
    set_up: usize,
    dev_conns: DevConnTable,
    /// The number of flags carried out on each set-up connection, by every transport's proxies; it
    /// outlives a proxy's stop, so that a relaunched proxy goes on counting.
    flags: FlagsCarried,
}

impl CommState {
    /// The index of the transport of connections of `kind`, made with the first of them.
    fn transport_for(&mut self, kind: &TransportKind, rank: usize) -> usize {
        match self.transports.iter().position(|t| t.carries(kind)) {
            Some(t) => t,
            None => {
                self.transports.push(new_transport(kind, rank));
                self.transports.len() - 1
            }
        }
    }

    /// The index of the transport of connections of `kind`.
    fn transport_of(&self, kind: &TransportKind) -> Result<usize> {
        self.transports
            .iter()
            .position(|t| t.carries(kind))
            .ok_or_else(|| Error::internal(format!("no transport carries {kind:?}")))
    }

    fn proxy_running(&self) -> bool {
        self.transports.iter().any(|t| t.proxy_running())
    }

    /// The first failure of any transport's proxy, with the transport's name.
    fn proxy_failure(&self) -> Option<(&'static str, Error)> {
        self.transports
            .iter()
            .find_map(|t| t.proxy_failure().map(|e| (t.name(), e)))
    }
}

pub struct Communicator {
    rank: usize,
    nranks: usize,
    bootstrap: Bootstrap,
    state: Mutex<CommState>,
    /// Failures besides the bootstrap's (see `failure.rs`).
    failures: Arc<FailureState>,
    /// The collectives (all-reduce and the others, of both faces), set up at the first call.
    collectives: Collectives,
    /// Buffers registered with it (either face's registrations, and NCCL's windows).
    registrations: Registrations,
}

impl Communicator {
    /// Rank 0 listens at `address`, everyone meets there.
    pub fn init_by_address(nranks: usize, address: &str, rank: usize, timeout: Duration) -> Result<Communicator> {
        let root_addr = RootAddress::parse(address)?;
        let bootstrap = Bootstrap::connect_to_address(&root_addr, rank, nranks, timeout)?;
        Ok(Self::with_bootstrap(bootstrap))
    }

    /// Everyone meets at the root named in the id.
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
            "communicator ready: rank {} of {} (libmscclpp {}, built from commit {})",
            bootstrap.rank(),
            bootstrap.nranks(),
            env!("CARGO_PKG_VERSION"),
            crate::BUILD_COMMIT
        );
        crate::settings::log_in_effect();
        Communicator {
            rank: bootstrap.rank(),
            nranks: bootstrap.nranks(),
            bootstrap,
            state: Mutex::new(state),
            failures: Arc::default(),
            collectives: Collectives::default(),
            registrations: Registrations::default(),
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
    pub(crate) fn failures(&self) -> &FailureState {
        &self.failures
    }
    /// Its registered buffers. Usable in every state, aborted included: registering involves no peer,
    /// and deregistering must stay possible for the application's clean-up.
    pub fn registrations(&self) -> &Registrations {
        &self.registrations
    }

    /// Tells the transports and their proxies to abort, after a peer failed, this rank's abort or a proxy's
    /// own report: the one place where a failure reaches them. Their proxies stop moving data, release the
    /// kernels' waits and drain their FIFOs until stopped (`Transport::abort_proxy`; nothing here waits on
    /// a peer or a thread).
    pub(crate) fn abort_transports(&self, failure: &PeerFailure) {
        self.collectives.abort();
        let mut st = self.state.lock();
        for t in st.transports.iter_mut() {
            t.abort_proxy();
        }
        log::info!("transports aborted after the failure ({})", failure.how());
    }

    /// The first failure of any transport's proxy; later calls report it instead of going on.
    fn check_proxy(st: &CommState) -> Result<()> {
        match st.proxy_failure() {
            Some((name, e)) => Err(Error::new(
                e.kind,
                format!("the {name} proxy failed earlier: {}", e.message),
            )),
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

    /// Records a connection, allocates its epoch block and hands it to its transport.
    pub fn connect(
        &self,
        remote_rank: usize,
        tag: i32,
        buff: DevicePtr,
        size: u64,
        transport: TransportKind,
    ) -> Result<()> {
        self.check_usable()?;
        let mut st = self.state.lock();
        if st.proxy_running() {
            return Err(Error::invalid_usage(
                "a connection cannot be added while the proxy runs: stop the proxy first",
            ));
        }
        if st.connections.len() >= MAX_CONNECTIONS {
            return Err(Error::invalid_usage(format!(
                "a communicator holds at most {MAX_CONNECTIONS} connections (the trigger's connId has 10 bits)"
            )));
        }
        let t = st.transport_for(&transport, self.rank);
        // Fails first, naming what is missing (IB: libibverbs or the device), before any GPU work.
        st.transports[t].check_connect(&transport)?;
        let gpu = Self::gpu(&mut st)?;
        gpu.check_buffer(buff, size, "localBuff")?;
        if size > u32::MAX as u64 {
            log::warn!("buffSize {size} is larger than triggers can address (32-bit offsets and sizes)");
        }
        let conn = st.connections.len();
        let c = Connection {
            remote_rank,
            tag,
            transport,
            local_buff: buff,
            local_size: size,
            epochs: EpochBlock::new(&gpu)?,
        };
        st.transports[t].connect(&gpu, conn, &c)?;
        st.connections.push(c);
        log::info!("connection {conn} recorded: peer {remote_rank}, tag {tag}, {size} bytes");
        Ok(())
    }

    /// Sets the pending connections up: each one's transport makes a message for the peer, sent
    /// through the bootstrap, and completes the connection with the peer's; then the device views are
    /// rebuilt, and a barrier ends it.
    pub fn setup(&self) -> Result<()> {
        self.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.proxy_running() {
            return Err(Error::invalid_usage(
                "connections cannot be set up while the proxy runs: stop the proxy first",
            ));
        }
        let pending = st.set_up..st.connections.len();
        if !pending.is_empty() {
            Self::gpu(&mut st)?;
            let st = &mut *st; // the transports and the connections are borrowed apart below
            for transport in st.transports.iter_mut() {
                let mine: Vec<(usize, &Connection)> = pending
                    .clone()
                    .map(|i| (i, &st.connections[i]))
                    .filter(|(_, c)| transport.carries(&c.transport))
                    .collect();
                if !mine.is_empty() {
                    transport.prepare_setup(&mine)?;
                }
            }
            // Every message is made before any is sent: a rank that fails to make one sends none.
            let mut messages = Vec::with_capacity(pending.len());
            for i in pending.clone() {
                let c = &st.connections[i];
                let t = st.transport_of(&c.transport)?;
                let message = SetupMessage {
                    rank: self.rank as u32,
                    tag: c.tag,
                    transport: c.transport.code(),
                    payload: st.transports[t].setup_message(i)?,
                };
                messages.push((c.remote_rank, c.tag, message.to_bytes()));
            }
            for (peer, tag, bytes) in messages {
                self.bootstrap.send(peer, message_tag(TAG_CONNECTION, tag), &bytes)?;
            }
            for i in pending.clone() {
                let c = &st.connections[i];
                let bytes = self.bootstrap.recv(c.remote_rank, message_tag(TAG_CONNECTION, c.tag))?;
                let message = SetupMessage::from_bytes(&bytes)?;
                message.check(c.remote_rank, c.tag, &c.transport)?;
                let t = st.transport_of(&c.transport)?;
                st.transports[t].complete_setup(i, &message.payload)?;
            }
            st.set_up = st.connections.len();
            st.flags = st.flags.for_connections(st.set_up);
            let mut dev_conns = Vec::with_capacity(st.connections.len());
            for (i, c) in st.connections.iter().enumerate() {
                let mut dev = c.device_view(i);
                let t = st.transport_of(&c.transport)?;
                st.transports[t].fill_device_connection(i, &mut dev)?;
                dev_conns.push(dev);
            }
            st.dev_conns = DevConnTable(dev_conns);
        }
        drop(st);
        self.bootstrap.barrier()?;
        // Every peer has completed its side (P2P removes the name of the shared memory every peer has
        // opened now, so that nothing is left behind if the job dies).
        for t in self.state.lock().transports.iter_mut() {
            t.setup_finished();
        }
        log::info!("connection set-up done");
        Ok(())
    }

    /// The device view of every connection, in connect order. `names` words the advice of its errors.
    pub fn device_connections(&self, names: &SetupNames) -> Result<(*mut mscclppDevConn, usize)> {
        let mut st = self.state.lock();
        if st.connections.is_empty() {
            return Err(Error::invalid_usage(format!(
                "no connections: call {} and {} first",
                names.connect, names.setup
            )));
        }
        if st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(format!(
                "connections are not set up: call {} first",
                names.setup
            )));
        }
        Ok((st.dev_conns.as_mut_ptr(), st.dev_conns.len()))
    }

    /// The first connection to `remote_rank` with `tag`.
    pub fn device_connection(&self, remote_rank: i32, tag: i32, names: &SetupNames) -> Result<*mut mscclppDevConn> {
        let (ptr, n) = self.device_connections(names)?;
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

    /// Starts every transport's proxies. `names` words the advice of its errors.
    pub fn proxy_launch(&self, names: &SetupNames) -> Result<()> {
        self.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.proxy_running() {
            return Err(Error::invalid_usage("the proxy is already running"));
        }
        if st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(format!(
                "connections are not set up: call {} before the proxy is launched",
                names.setup
            )));
        }
        if st.connections.is_empty() {
            log::info!("no connections; no proxy to launch");
            return Ok(());
        }
        Self::gpu(&mut st)?;
        let st = &mut *st; // the transports and the flag counts are borrowed apart below
        let peers = st.connections.iter().map(|c| (c.remote_rank, c.tag)).collect();
        let on_abort =
            crate::failure::proxy_abort_hook(self.rank, self.failures.clone(), self.bootstrap.abort_handle(), peers);
        for t in st.transports.iter_mut() {
            t.launch_proxy(&st.flags, &on_abort)?;
        }
        if st.proxy_running() && crate::gpu::lazy_loading() {
            log::info!(
                "CUDA loads kernels lazily: launch each kernel once (or call cudaFuncGetAttributes) before one \
                 waits on the proxy, or set CUDA_MODULE_LOADING=EAGER; a first launch while a kernel waits on \
                 the proxy deadlocks"
            );
        }
        Ok(())
    }

    /// Stops every transport's proxies, if they run. Returns the first error of a stop, or else the
    /// first failure a proxy had.
    fn stop_proxies(st: &mut CommState) -> Result<()> {
        let mut first = None;
        for t in st.transports.iter_mut() {
            if let Err(e) = t.stop_proxy() {
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Self::check_proxy(st),
        }
    }

    /// Stops the proxies: a barrier (so no rank stops while peers still need it), then the stop. The
    /// proxies stop even when the barrier fails (after a failure it fails at once), and its error is
    /// returned.
    pub fn proxy_stop(&self) -> Result<()> {
        let barrier = self.bootstrap.barrier();
        let stop = Self::stop_proxies(&mut self.state.lock());
        barrier.and(stop)
    }

    /// Exchanges one more buffer with the peer of every connection, through the connection's transport;
    /// returns one entry per connection, in connect order. `names` words the advice of its errors.
    pub fn register_buffer(
        &self,
        ptr: DevicePtr,
        size: u64,
        names: &SetupNames,
    ) -> Result<Vec<mscclppRegisteredMemoryP2P>> {
        self.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.connections.is_empty() || st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(format!(
                "registering a buffer with the peers needs set-up connections: call {} first",
                names.setup
            )));
        }
        Self::gpu(&mut st)?;
        pointer_info(ptr, size, "local_memory")?;
        let st = &mut *st;
        // Every message is made before any is sent, as at set-up.
        let mut messages = Vec::with_capacity(st.connections.len());
        for (i, c) in st.connections.iter().enumerate() {
            let t = st.transport_of(&c.transport)?;
            messages.push(st.transports[t].register_message(i, ptr, size)?);
        }
        for (c, message) in st.connections.iter().zip(&messages) {
            self.bootstrap
                .send(c.remote_rank, message_tag(TAG_REGISTER, c.tag), message)?;
        }
        let mut entries = Vec::with_capacity(st.connections.len());
        for (i, c) in st.connections.iter().enumerate() {
            let bytes = self.bootstrap.recv(c.remote_rank, message_tag(TAG_REGISTER, c.tag))?;
            let t = st.transport_of(&c.transport)?;
            entries.push(st.transports[t].register_remote(i, ptr, size, &bytes)?);
        }
        Ok(entries)
    }

    /// Copies `[src+src_offset, +size)` to every peer's registered
    /// buffer at `dst_offset`, ordered after the work queued on the application's stream, each entry by
    /// the transport that made it.
    pub fn registered_write(
        &self,
        entries: &[mscclppRegisteredMemoryP2P],
        src: DevicePtr,
        size: u64,
        src_offset: u64,
        dst_offset: u64,
        stream: AppStream,
    ) -> Result<()> {
        self.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        Self::gpu(&mut st)?;
        pointer_info(src + src_offset, size, "srcBuff + srcOffset")?;
        for (i, e) in entries.iter().enumerate() {
            let transport = st.transports.iter_mut().find(|t| t.owns_registered(e)).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "regMem->p2p[{i}] was not made by registering a buffer on this communicator"
                ))
            })?;
            let write = RegisteredWrite {
                index: i,
                src,
                size,
                src_offset,
                dst_offset,
                stream,
            };
            transport.registered_write(e, &write)?;
        }
        Ok(())
    }

    /// One collective call of either face on the application's stream (see `collective`); the call carries
    /// the exported function's name for messages. `root` is the application's argument.
    pub fn collective(&self, call: &Call, root: i64, stream: AppStream) -> Result<()> {
        // The calling thread may have another GPU current (a thread that serves several devices).
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = || Self::gpu(&mut self.state.lock());
        self.collectives.run(
            &self.bootstrap,
            gpu,
            || self.check_usable(),
            || {
                let _ = self.abort(ABORTED_BY_FAILED_CALL);
            },
            call,
            root,
            stream,
            &self.registrations,
        )
    }

    /// Registers `[buff, buff + size)` (either face's registrations, and NCCL's windows): recorded
    /// here, and exported to the peers for the zero-copy collectives (`Collectives::registered`).
    pub fn register(&self, buff: DevicePtr, size: usize, kind: Kind, library_memory: bool) -> Result<u64> {
        let (token, registration) = self.registrations.register(buff, size, kind, library_memory)?;
        // Exporting needs the communicator's context current (the calling thread may have another).
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = Self::gpu(&mut self.state.lock());
        match gpu {
            Ok(_) => {
                let window = self.registrations.window_ordinal(token).unwrap_or(0);
                self.collectives
                    .registered(&self.bootstrap, token, &registration, window)
            }
            Err(e) => log::info!("registration {token:#x} is not zero-copy: {}", e.message),
        }
        Ok(token)
    }

    /// Forgets a registration (`Registrations::deregister`); the peers are told.
    pub fn deregister(&self, token: u64, kind: Kind, what: &str) -> Result<()> {
        self.registrations.deregister(token, kind, what)?;
        self.collectives.deregistered(&self.bootstrap, token);
        Ok(())
    }

    /// Sets the collectives up now (collective: every rank calls it), so that send and receive can follow;
    /// see `Collectives::prepare`.
    /// Limits every collective launch to `blocks` blocks (NCCL's `maxCTAs`), from the collectives' set-up
    /// on (`Collectives::limit_ctas`).
    pub fn limit_ctas(&self, blocks: u32) {
        self.collectives.limit_ctas(blocks);
    }

    pub fn prepare_collectives(&self) -> Result<()> {
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = Self::gpu(&mut self.state.lock())?;
        self.collectives.prepare(&self.bootstrap, &gpu)
    }

    /// Suspends the collectives (`Collectives::suspend`), releasing their device memory
    /// where `release_memory` says so. Local: each rank frees its own.
    pub fn suspend_collectives(&self, release_memory: bool) -> Result<()> {
        self.check_usable()?;
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = self.state.lock().gpu;
        self.collectives.suspend(gpu.as_ref(), release_memory)
    }

    /// Resumes the collectives: collective, every rank calls it (`Collectives::resume`). A failure after the peers
    /// may have started theirs aborts the communicator.
    pub fn resume_collectives(&self) -> Result<()> {
        self.check_usable()?;
        let _restore = crate::gpu::RestoreContext::save();
        // Asked before the collectives' locks are taken (`destroy` takes this lock, then theirs); an error
        // matters only where there is memory to make again.
        let gpu = Self::gpu(&mut self.state.lock());
        self.collectives.resume(
            &self.bootstrap,
            move || gpu,
            || {
                let _ = self.abort(ABORTED_BY_FAILED_CALL);
            },
        )
    }

    /// Whether the collectives are suspended.
    pub fn collectives_suspended(&self) -> bool {
        self.collectives.suspended()
    }

    /// The device memory the communicator holds: the collectives' (released by a
    /// suspend), and the connections' epoch blocks (kept).
    pub fn device_memory(&self) -> crate::collective::suspend::DeviceMemory {
        let mut memory = self.collectives.device_memory();
        memory.persistent += (self.state.lock().connections.len() * crate::connection::EpochBlock::BYTES) as u64;
        memory
    }

    /// A one-sided call (a put with a signal, a signal, a wait for signals) on `stream` (see
    /// `collective::signal`).
    pub fn one_sided(&self, op: &crate::collective::signal::OneSided, stream: AppStream) -> Result<()> {
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = || Self::gpu(&mut self.state.lock());
        self.collectives.one_sided(
            &self.bootstrap,
            gpu,
            || self.check_usable(),
            || {
                let _ = self.abort(ABORTED_BY_FAILED_CALL);
            },
            &self.registrations,
            op,
            stream,
        )
    }

    /// Where byte `offset` of rank `peer`'s registration of this rank's window `token` is in this process
    /// (`peer` may be this rank): see `Collectives::window_pointer`.
    pub fn window_pointer(&self, token: u64, offset: u64, peer: usize) -> Result<DevicePtr> {
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = Self::gpu(&mut self.state.lock())?;
        self.collectives.window_pointer(
            &self.bootstrap,
            &gpu,
            || self.check_usable(),
            &self.registrations,
            token,
            offset,
            peer,
        )
    }

    /// One group's sends and receives on this communicator and `stream`, in call
    /// order (see `Collectives::run_send_recv`).
    pub fn send_recv(&self, ops: &[SendRecvOp], stream: AppStream) -> Result<()> {
        let _restore = crate::gpu::RestoreContext::save();
        let gpu = || Self::gpu(&mut self.state.lock());
        self.collectives.run_send_recv(
            &self.bootstrap,
            gpu,
            || self.check_usable(),
            || {
                let _ = self.abort(ABORTED_BY_FAILED_CALL);
            },
            ops,
            stream,
        )
    }

    /// Releases everything: stops the proxies (no barrier: peers may be gone), then the transports
    /// release what they hold (peers' mappings, queue pairs, memory registrations) before the
    /// connections' memory is freed. Safe to call after `proxy_stop`.
    pub fn destroy(&self) -> Result<()> {
        let mut st = self.state.lock();
        let stop = Self::stop_proxies(&mut st);
        if let Some(g) = st.gpu {
            let _ = g.make_current();
        }
        self.collectives.clear();
        st.dev_conns.clear();
        for t in st.transports.iter_mut() {
            // A failure was reported by the stop above.
            let _ = t.clear();
        }
        st.transports.clear();
        st.connections.clear();
        let registered = self.registrations.clear();
        if registered > 0 {
            log::info!("{registered} registration(s) still held were freed with the communicator");
        }
        if let Some(g) = st.gpu.take() {
            g.release();
        }
        // Destroyed: an abort no longer ends the process (`MSCCLPP_ABORT_EXIT_TIMEOUT`).
        self.failures.destroyed();
        stop
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
    fn each_kind_gets_a_transport_that_carries_it_and_no_other() {
        let ib = TransportKind::Ib {
            device: "mlx5_0".into(),
        };
        let p2p = new_transport(&TransportKind::P2p, 0);
        assert!(p2p.carries(&TransportKind::P2p) && !p2p.carries(&ib));
        let ib_transport = new_transport(&ib, 0);
        assert!(ib_transport.carries(&ib) && !ib_transport.carries(&TransportKind::P2p));
        assert!(
            ib_transport.carries(&TransportKind::Ib {
                device: "mlx5_1".into()
            }),
            "one IB transport serves every device"
        );
    }
}
