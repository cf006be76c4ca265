//! The legacy face's connection machine: `mscclppConnect`'s connections, the transports that carry them
//! and their proxies. Only `mscclpp.h`'s communicators make one (`Connections::new`); the core's
//! communicator (`comm.rs`) knows nothing of it but a part to abort at its first failure, so the NCCL
//! face, whose calls go to the collectives alone, never loads a transport or starts a proxy.
//!
//! What is common to every transport lives here: the connection list (in connect order: a connection's
//! index is the `connId` of its triggers and its place in the array of device views), the epoch blocks,
//! the count of flags carried out per connection, the device views handed to kernels, and the state
//! machine:
//!
//! - `connect` records connections (never while a proxy runs);
//! - `setup` completes the connections recorded since the last set-up and ends with a barrier (more
//!   `connect` and `setup` calls may follow, while no proxy runs);
//! - `proxy_launch` and `proxy_stop` start and stop the transports' proxies, any number of times;
//! - `register_buffer` and `registered_write` need set-up connections;
//! - `destroy` stops the proxies and releases everything.
//!
//! Everything else is the transports' (`transport::Transport`): the machine loops over them and names a
//! transport kind only in `new_transport`, where the transport of a new connection is chosen.
//!
//! It names no face: a call that needs an earlier step words its advice with the names the face gives
//! those steps (`SetupNames`).

use crate::bootstrap::AbortHandle;
use crate::comm::Communicator;
use crate::connection::{Connection, EpochBlock, SetupMessage, TransportKind};
use crate::error::{Error, Result};
use crate::failure::FailureState;
use crate::gpu::{AppStream, DevicePtr, pointer_info};
use crate::proxy::trigger::MAX_CONNECTIONS;
use crate::proxy::{AbortCause, AbortHook};
use crate::transport::ib::IbTransport;
use crate::transport::p2p::P2pTransport;
use crate::transport::{FlagsCarried, RegisteredWrite, Transport};
use crate::types::{mscclppDevConn, mscclppRegisteredMemoryP2P};
use parking_lot::Mutex;
use std::sync::Arc;

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
struct State {
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

impl State {
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

/// One communicator's connections, their transports and proxies. Every call takes the communicator
/// they belong to (its bootstrap, GPU and failures).
pub struct Connections {
    state: Arc<Mutex<State>>,
}

impl Connections {
    /// The connections of `comm`, none yet. Their transports' proxies are part of what `comm` aborts at
    /// its first failure (`FailureState::on_abort`): they stop moving data, release the kernels' waits and
    /// drain their FIFOs until stopped (`Transport::abort_proxy`; nothing there waits on a peer or a
    /// thread).
    pub fn new(comm: &Communicator) -> Connections {
        let state: Arc<Mutex<State>> = Arc::default();
        let weak = Arc::downgrade(&state);
        comm.failures().on_abort(Box::new(move || {
            if let Some(state) = weak.upgrade() {
                for t in state.lock().transports.iter_mut() {
                    t.abort_proxy();
                }
            }
        }));
        Connections { state }
    }

    /// The first failure of any transport's proxy; later calls report it instead of going on.
    fn check_proxy(st: &State) -> Result<()> {
        match st.proxy_failure() {
            Some((name, e)) => Err(Error::new(
                e.kind,
                format!("the {name} proxy failed earlier: {}", e.message),
            )),
            None => Ok(()),
        }
    }

    /// Records a connection, allocates its epoch block and hands it to its transport.
    pub fn connect(
        &self,
        comm: &Communicator,
        remote_rank: usize,
        tag: i32,
        buff: DevicePtr,
        size: u64,
        transport: TransportKind,
    ) -> Result<()> {
        comm.check_usable()?;
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
        let t = st.transport_for(&transport, comm.rank());
        // Fails first, naming what is missing (IB: libibverbs or the device), before any GPU work.
        st.transports[t].check_connect(&transport)?;
        let gpu = comm.gpu()?;
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
    pub fn setup(&self, comm: &Communicator) -> Result<()> {
        comm.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.proxy_running() {
            return Err(Error::invalid_usage(
                "connections cannot be set up while the proxy runs: stop the proxy first",
            ));
        }
        let pending = st.set_up..st.connections.len();
        if !pending.is_empty() {
            comm.gpu()?;
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
                    rank: comm.rank() as u32,
                    tag: c.tag,
                    transport: c.transport.code(),
                    payload: st.transports[t].setup_message(i)?,
                };
                messages.push((c.remote_rank, c.tag, message.to_bytes()));
            }
            for (peer, tag, bytes) in messages {
                comm.bootstrap().send(peer, message_tag(TAG_CONNECTION, tag), &bytes)?;
            }
            for i in pending.clone() {
                let c = &st.connections[i];
                let bytes = comm
                    .bootstrap()
                    .recv(c.remote_rank, message_tag(TAG_CONNECTION, c.tag))?;
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
        comm.bootstrap().barrier()?;
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
    pub fn proxy_launch(&self, comm: &Communicator, names: &SetupNames) -> Result<()> {
        comm.check_usable()?;
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
        comm.gpu()?;
        let st = &mut *st; // the transports and the flag counts are borrowed apart below
        let peers = st.connections.iter().map(|c| (c.remote_rank, c.tag)).collect();
        let on_abort = proxy_abort_hook(comm.rank(), comm.failures_arc(), comm.bootstrap().abort_handle(), peers);
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
    fn stop_proxies(st: &mut State) -> Result<()> {
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
    pub fn proxy_stop(&self, comm: &Communicator) -> Result<()> {
        let barrier = comm.bootstrap().barrier();
        let stop = Self::stop_proxies(&mut self.state.lock());
        barrier.and(stop)
    }

    /// Exchanges one more buffer with the peer of every connection, through the connection's transport;
    /// returns one entry per connection, in connect order. `names` words the advice of its errors.
    pub fn register_buffer(
        &self,
        comm: &Communicator,
        ptr: DevicePtr,
        size: u64,
        names: &SetupNames,
    ) -> Result<Vec<mscclppRegisteredMemoryP2P>> {
        comm.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        if st.connections.is_empty() || st.set_up < st.connections.len() {
            return Err(Error::invalid_usage(format!(
                "registering a buffer with the peers needs set-up connections: call {} first",
                names.setup
            )));
        }
        comm.gpu()?;
        pointer_info(ptr, size, "local_memory")?;
        let st = &mut *st;
        // Every message is made before any is sent, as at set-up.
        let mut messages = Vec::with_capacity(st.connections.len());
        for (i, c) in st.connections.iter().enumerate() {
            let t = st.transport_of(&c.transport)?;
            messages.push(st.transports[t].register_message(i, ptr, size)?);
        }
        for (c, message) in st.connections.iter().zip(&messages) {
            comm.bootstrap()
                .send(c.remote_rank, message_tag(TAG_REGISTER, c.tag), message)?;
        }
        let mut entries = Vec::with_capacity(st.connections.len());
        for (i, c) in st.connections.iter().enumerate() {
            let bytes = comm.bootstrap().recv(c.remote_rank, message_tag(TAG_REGISTER, c.tag))?;
            let t = st.transport_of(&c.transport)?;
            entries.push(st.transports[t].register_remote(i, ptr, size, &bytes)?);
        }
        Ok(entries)
    }

    /// Copies `[src+src_offset, +size)` to every peer's registered
    /// buffer at `dst_offset`, ordered after the work queued on the application's stream, each entry by
    /// the transport that made it.
    // The arguments of `mscclppRegisteredBufferWrite`, one for one, and the communicator.
    #[allow(clippy::too_many_arguments)]
    pub fn registered_write(
        &self,
        comm: &Communicator,
        entries: &[mscclppRegisteredMemoryP2P],
        src: DevicePtr,
        size: u64,
        src_offset: u64,
        dst_offset: u64,
        stream: AppStream,
    ) -> Result<()> {
        comm.check_usable()?;
        let mut st = self.state.lock();
        Self::check_proxy(&st)?;
        comm.gpu()?;
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

    /// Releases everything: stops the proxies (no barrier: peers may be gone), then the transports
    /// release what they hold (peers' mappings, queue pairs, memory registrations) before the
    /// connections' memory is freed, with `comm`'s GPU current. Safe to call after `proxy_stop`; `comm`
    /// is destroyed after. Returns the first error of a stop, or else the first failure a proxy had.
    pub fn destroy(&self, comm: &Communicator) -> Result<()> {
        let mut st = self.state.lock();
        let stop = Self::stop_proxies(&mut st);
        if let Some(g) = comm.gpu_if_any() {
            let _ = g.make_current();
        }
        st.dev_conns.clear();
        for t in st.transports.iter_mut() {
            // A failure was reported by the stop above.
            let _ = t.clear();
        }
        st.transports.clear();
        st.connections.clear();
        stop
    }
}

/// What a proxy of this communicator calls when it wants the communicator aborted (on the proxy thread,
/// so it takes no lock the application may hold): records why, logs it with the connection's peer and
/// tag (`peers`, by connection index), and aborts the bootstrap, whose failure hook then aborts every
/// transport and whose peers are told.
pub fn proxy_abort_hook(
    rank: usize,
    failures: Arc<FailureState>,
    bootstrap: AbortHandle,
    peers: Vec<(usize, i32)>,
) -> AbortHook {
    Arc::new(move |cause| {
        let error = match cause {
            AbortCause::StuckWait(w) => {
                let whose = peers
                    .get(w.conn_id as usize)
                    .map_or(String::from("an unknown peer"), |(peer, tag)| {
                        format!("peer rank {peer}, tag {tag}")
                    });
                Error::invalid_usage(format!(
                    "rank {rank}: a kernel's {w} ({whose}); the communicator is aborted"
                ))
            }
            AbortCause::Failure(e) => Error::new(
                e.kind,
                format!(
                    "rank {rank}: a proxy failed ({}); the communicator is aborted",
                    e.message
                ),
            ),
        };
        log::warn!("{}", error.message);
        failures.report_proxy_failure(error);
        bootstrap.abort();
    })
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
