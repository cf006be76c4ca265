//! One rank's endpoint: the rendezvous at the root, the connections to its peers, and point-to-point
//! messages. The host collectives built on it (all-gather, barrier) are in `host_collectives.rs`.
//!
//! Set-up: the rank connects to the root, listens on the address of the interface that routes there,
//! sends the root a hello with that address and its host, and receives its own and its neighbours' rows of
//! the table of addresses and hosts (rank 0: every rank's). Then it connects to its lower neighbours
//! (`topology::neighbours`: the ranks `± 2^k` away) and waits until its higher neighbours have connected to
//! it: at most `2 log2 n` TCP connections, each used both ways, which carry the host collectives, the
//! heartbeats and the notices. Last, the whole table comes down the binomial tree of neighbours from rank 0
//! (each rank passes it on to its children), so that every rank knows every rank's host and address while
//! the root sends `O(n log n)` bytes, not `n²`. A message to any other peer
//! makes its connection when it is first sent (`send_frame_as`; the peer may be the first to send as well).

use super::address::RootAddress;
use super::health::Liveness;
use super::receiver::{Receiver, Shared};
use super::root::Root;
use super::unique_id::UniqueId;
use super::wire::{self, Greeting, Key, Kind, MAX_RANKS, Refusal, Space, TABLE_ROW_LEN};
use super::{PROTOCOL_MAGIC, handshake_timeout, list_ranks};
use crate::ensure_arg;
use crate::error::{Error, ErrorKind, Result};
use log::{debug, info, trace};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Messages up to this size go out in one write together with their header.
const COALESCE_LIMIT: usize = 64 << 10;

/// How long past a timeout from its hello a rank waits for the root's answer: the root gives up a timeout
/// after the first hello it got, and says which ranks are missing; the grace lets that answer, not a bare
/// time-out, end the first rank's wait.
const ROOT_ANSWER_GRACE: Duration = Duration::from_secs(1);

/// One rank's endpoint of the bootstrap network.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    receiver: Receiver,
    /// Every rank's listen address, as the root sent it.
    peers: Vec<SocketAddr>,
    /// Every rank's host, as each told the root (`Greeting::host`).
    hosts: Vec<u64>,
    /// The peers connected at set-up (`topology::neighbours`).
    neighbours: Vec<usize>,
    /// The root this rank started (rank 0 of an `ip:port` job); it finishes on its own.
    _root: Option<Root>,
}

impl Bootstrap {
    /// Joins the job whose root is at `root`. `timeout` bounds the wait for the root and for the other
    /// ranks; it does not limit later waits for messages.
    pub fn connect(root: SocketAddr, magic: u64, rank: usize, nranks: usize, timeout: Duration) -> Result<Bootstrap> {
        Self::connect_from(root, None, magic, rank, nranks, timeout)
    }

    /// Joins an `ip:port` job: rank 0 first starts the root at that address.
    pub fn connect_to_address(root: &RootAddress, rank: usize, nranks: usize, timeout: Duration) -> Result<Bootstrap> {
        ensure_arg!(rank < nranks, "rank {rank} out of range for nranks {nranks}");
        let local_ip = root.local_ip()?;
        let started = if rank == 0 {
            Some(Root::listen(root.addr, PROTOCOL_MAGIC, timeout)?)
        } else {
            None
        };
        let mut bootstrap = Self::connect_from(root.addr, local_ip, PROTOCOL_MAGIC, rank, nranks, timeout)?;
        bootstrap._root = started;
        Ok(bootstrap)
    }

    /// Joins the job of a unique id.
    pub fn connect_to_id(id: &UniqueId, rank: usize, nranks: usize, timeout: Duration) -> Result<Bootstrap> {
        Self::connect_from(id.root, None, id.magic, rank, nranks, timeout)
    }

    /// Like `connect`, listening on `local_ip` instead of the address of the interface that routes to
    /// the root.
    pub fn connect_from(
        root: SocketAddr,
        local_ip: Option<IpAddr>,
        magic: u64,
        rank: usize,
        nranks: usize,
        timeout: Duration,
    ) -> Result<Bootstrap> {
        let liveness = Liveness::from_settings();
        Self::connect_watching(root, local_ip, magic, rank, nranks, timeout, liveness)
    }

    /// `connect_from`, with the peers watched as `liveness` says (`MSCCLPP_PEER_TIMEOUT` elsewhere).
    pub(super) fn connect_watching(
        root: SocketAddr,
        local_ip: Option<IpAddr>,
        magic: u64,
        rank: usize,
        nranks: usize,
        timeout: Duration,
        liveness: Liveness,
    ) -> Result<Bootstrap> {
        ensure_arg!(
            (1..=MAX_RANKS).contains(&nranks),
            "nranks {nranks} out of range 1-{MAX_RANKS}"
        );
        ensure_arg!(rank < nranks, "rank {rank} out of range for nranks {nranks}");
        // Log lines of the set-up carry the rank even when the caller did not set it.
        let _scope = crate::logging::RankScope::enter(rank);
        let start = Instant::now();
        let deadline = start + timeout;

        let mut to_root = wire::connect_by(root, deadline).map_err(|e| {
            Error::remote(format!(
                "rank {rank}: cannot reach the bootstrap root at {root} within {timeout:?}: {e}"
            ))
        })?;
        let via = to_root
            .local_addr()
            .map_err(|e| Error::io(format!("rank {rank}: reading the local address"), e))?;
        let bind_addr = match local_ip {
            Some(ip) => with_scope_of(SocketAddr::new(ip, 0), via),
            None => with_scope_of(SocketAddr::new(via.ip(), 0), via),
        };
        let listener = TcpListener::bind(bind_addr)
            .map_err(|e| Error::io(format!("rank {rank}: listening for peers at {bind_addr}"), e))?;
        // Every higher rank connects here at once.
        super::sys::widen_backlog(&listener)
            .map_err(|e| Error::io(format!("rank {rank}: listening for peers at {bind_addr}"), e))?;
        let listen_addr = listener
            .local_addr()
            .map_err(|e| Error::io(format!("rank {rank}: reading the listen address"), e))?;
        let receiver = Receiver::start(listener, rank, nranks, magic, handshake_timeout(timeout), liveness)?;

        let mut hello = Greeting::new(Kind::RootHello, magic, rank, nranks);
        hello.addr = Some(listen_addr);
        hello.host = crate::gpu::ProcessId::this().host;
        to_root
            .write_all(&hello.encode())
            .map_err(|e| Error::remote(format!("rank {rank}: sending the hello to the root at {root}: {e}")))?;
        debug!("joined the root at {root}; listening at {listen_addr}");
        // From the hello, not from `start`: reaching the root may have taken most of the timeout (a root
        // not up yet), and the root counts its own from the first hello.
        let answer_by = Instant::now() + timeout + ROOT_ANSWER_GRACE;
        let (reply, table) = wire::read_reply(&mut to_root, answer_by, nranks * TABLE_ROW_LEN).map_err(|r| {
            // The root closed the connection without a word: it lives in one rank's process (the one that
            // made the unique id, or rank 0's), which may have ended, or it had given up already.
            let gone = matches!(&r, Refusal::Io(e) if matches!(e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset));
            let e = refusal_error(
                r,
                &format!("rank {rank}: waiting at the root {root} for all {nranks} ranks"),
                timeout,
            );
            if gone {
                Error::new(
                    e.kind,
                    format!(
                        "{} without an answer (the root runs in the process that made the unique id, or rank 0's: \
                         that process ended, or the root had already given up or finished)",
                        e.message
                    ),
                )
            } else {
                e
            }
        })?;
        drop(to_root);
        let neighbours = super::topology::neighbours(rank, nranks);
        // Rank 0 gets every rank's row, the others their own and their neighbours'.
        let needed = super::topology::set_up_rows(rank, nranks);
        let bad_table =
            |why: String| Error::remote(format!("rank {rank}: the root at {root} sent a bad peer table: {why}"));
        if reply.nranks as usize != nranks {
            return Err(bad_table(format!("a table for {} ranks, not {nranks}", reply.nranks)));
        }
        let known = decode_table(&table, nranks, &needed, via).map_err(bad_table)?;
        let (own, _) = known[rank].expect("this rank's row is needed");
        if own.ip() != listen_addr.ip() || own.port() != listen_addr.port() {
            return Err(Error::remote(format!(
                "rank {rank}: the root at {root} lists this rank at {own}, not {listen_addr}"
            )));
        }
        info!(
            "all {nranks} ranks arrived at the root {root} after {:?}",
            start.elapsed()
        );

        // Fresh deadline: arriving may legitimately have taken most of the first one.
        let deadline = Instant::now() + timeout;
        // Until the whole table comes, only the rows set-up needs are known (the others unspecified).
        let unknown = SocketAddr::new(listen_addr.ip(), 0);
        let mut bootstrap = Bootstrap {
            rank,
            nranks,
            receiver,
            peers: known.iter().map(|k| k.map_or(unknown, |k| k.0)).collect(),
            hosts: known.iter().map(|k| k.map_or(0, |k| k.1)).collect(),
            neighbours,
            _root: None,
        };
        bootstrap.connect_neighbours(deadline, timeout)?;
        let whole = if rank == 0 {
            table
        } else {
            bootstrap.receive_table(deadline, timeout)?
        };
        for child in super::topology::tree_children(rank, nranks) {
            bootstrap.send_frame(child, TABLE_KEY, &whole)?;
        }
        if rank != 0 {
            let all: Vec<usize> = (0..nranks).collect();
            let parent = super::topology::tree_parent(rank);
            let known = decode_table(&whole, nranks, &all, via).map_err(|why| {
                Error::remote(format!(
                    "rank {rank}: rank {parent} passed down a bad peer table: {why}"
                ))
            })?;
            let (peers, hosts): (Vec<SocketAddr>, Vec<u64>) =
                known.into_iter().map(|k| k.expect("every row is needed")).unzip();
            // Rows the root sent this rank and the table that came down must agree.
            if bootstrap
                .neighbours
                .iter()
                .chain([&rank])
                .any(|&p| peers[p] != bootstrap.peers[p])
            {
                return Err(Error::remote(format!(
                    "rank {rank}: rank {parent} passed down a table that differs from the root's rows"
                )));
            }
            bootstrap.peers = peers;
            bootstrap.hosts = hosts;
        }
        bootstrap.receiver.set_up_complete();
        info!("bootstrap ready with {nranks} ranks after {:?}", start.elapsed());
        Ok(bootstrap)
    }

    /// The whole table, from this rank's parent in the binomial tree of neighbours (rank 0 has it from the
    /// root), within set-up's deadline.
    fn receive_table(&self, deadline: Instant, timeout: Duration) -> Result<Vec<u8>> {
        let parent = super::topology::tree_parent(self.rank);
        self.shared()
            .mailbox
            .take_until(parent, TABLE_KEY, false, Some(deadline))
            .map_err(|e| {
                Error::new(
                    e.kind,
                    format!(
                        "rank {}: waiting {timeout:?} for the peer table from rank {parent}: {}",
                        self.rank, e.message
                    ),
                )
            })
    }

    /// Connects to the lower neighbours and waits for the higher ones to connect.
    fn connect_neighbours(&self, deadline: Instant, timeout: Duration) -> Result<()> {
        let rank = self.rank;
        let lower: Vec<usize> = self.neighbours.iter().copied().filter(|&p| p < rank).collect();
        let higher: Vec<usize> = self.neighbours.iter().copied().filter(|&p| p > rank).collect();
        // Every lower neighbour's connection is opened and greeted first, then the answers are read: the
        // peers answer side by side, where one connection at a time waited for each peer's receive thread in
        // turn.
        let mut greeted = Vec::with_capacity(lower.len());
        for &peer in &lower {
            greeted.push((peer, self.greet_peer(peer, deadline)?));
        }
        for (peer, stream) in greeted {
            let stream = self.answered_by_peer(peer, stream, deadline)?;
            let writer = stream
                .try_clone()
                .map_err(|e| Error::io(format!("rank {rank}: duplicating the socket to peer {peer}"), e))?;
            self.shared().outboxes[peer].connect(writer);
            self.receiver.add_outgoing(peer, stream);
        }
        self.shared()
            .mailbox
            .wait_connected(&higher, deadline)
            .map_err(|missing| match self.failure() {
                Some(f) => Error::new(
                    f.error().kind,
                    format!(
                        "rank {rank}: waiting for {} to connect: {}",
                        list_ranks(&missing),
                        f.error()
                    ),
                ),
                None => Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "rank {rank}: timed out after {timeout:?} waiting for {} to connect",
                        list_ranks(&missing)
                    ),
                ),
            })?;
        Ok(())
    }

    /// Opens the connection to `peer` that a first message to it needs (it is no neighbour, or its
    /// connection was never made): the handshake, then the reading side to the receive thread. Returns the
    /// sending side. A peer whose process ended refuses at once; a stopped one, which never answers, fails
    /// the wait as soon as it is declared dead (or at the handshake's timeout).
    fn connect_lazily(&self, peer: usize) -> Result<TcpStream> {
        let rank = self.rank;
        let shared = self.shared();
        let deadline = Instant::now() + handshake_timeout(super::DEFAULT_TIMEOUT);
        let stream = self.greet_peer(peer, deadline)?;
        // Wait for the answer in slices, so that a peer declared dead meanwhile ends the wait at once.
        loop {
            if shared.is_dead(peer) || shared.mailbox.is_closed(peer) {
                return Err(Error::remote(format!(
                    "{}: rank {peer} is gone ({})",
                    self.connecting_to(peer),
                    self.failure()
                        .map_or_else(|| "it left".to_string(), |f| f.error().message)
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut entry = [super::sys::PollEntry::readable(&stream)];
            let slice = left.min(Duration::from_millis(50));
            if super::sys::poll(&mut entry, Some(slice)).is_ok() && entry[0].ready {
                break;
            }
        }
        let stream = self.answered_by_peer(peer, stream, deadline)?;
        let _ = stream.set_nodelay(true);
        let writer = stream
            .try_clone()
            .map_err(|e| Error::io(format!("rank {rank}: duplicating the socket to peer {peer}"), e))?;
        self.receiver.add_outgoing(peer, stream);
        debug!("rank {rank}: connected to peer {peer} on first use");
        Ok(writer)
    }

    /// Ends this endpoint as a killed process's does: its connections close without a goodbye.
    #[cfg(test)]
    pub(crate) fn vanish(self) {
        self.receiver.no_farewell();
        drop(self);
    }

    /// The peers this rank has a connection with now (its neighbours, and those connected since), for the
    /// tests that count them.
    #[cfg(test)]
    pub(crate) fn connected_peers(&self) -> Vec<usize> {
        (0..self.nranks)
            .filter(|&p| p != self.rank && self.shared().outboxes[p].is_open())
            .collect()
    }

    /// What the errors of the connection to `peer` begin with.
    fn connecting_to(&self, peer: usize) -> String {
        format!("rank {}: connecting to peer {peer} at {}", self.rank, self.peers[peer])
    }

    /// Opens the connection to a lower rank and sends its hello (`answered_by_peer` reads the answer).
    fn greet_peer(&self, peer: usize, deadline: Instant) -> Result<TcpStream> {
        let (addr, magic) = (self.peers[peer], self.shared().magic);
        let what = self.connecting_to(peer);
        let mut stream =
            wire::connect_to_listening(addr, deadline).map_err(|e| Error::remote(format!("{what}: {e}")))?;
        let mut hello = Greeting::new(Kind::PeerHello, magic, self.rank, self.nranks);
        hello.aux = peer as u32;
        stream
            .write_all(&hello.encode())
            .map_err(|e| Error::remote(format!("{what}: {e}")))?;
        Ok(stream)
    }

    /// Reads a lower rank's answer to the hello `greet_peer` sent: the handshake is complete.
    fn answered_by_peer(&self, peer: usize, mut stream: TcpStream, deadline: Instant) -> Result<TcpStream> {
        let magic = self.shared().magic;
        let what = self.connecting_to(peer);
        let timeout = deadline.saturating_duration_since(Instant::now());
        let (reply, _) = wire::read_reply(&mut stream, deadline, 0).map_err(|r| refusal_error(r, &what, timeout))?;
        if reply.rank as usize != peer || reply.magic != magic {
            return Err(Error::remote(format!(
                "{what}: the answer came from rank {} of another job",
                reply.rank
            )));
        }
        Ok(stream)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Every rank's host (`gpu::ProcessId::host`), by rank, as the ranks told the root when they joined.
    pub fn hosts(&self) -> &[u64] {
        &self.hosts
    }

    /// The address each rank listened on during set-up.
    pub fn peer_addr(&self, peer: usize) -> Option<SocketAddr> {
        self.peers.get(peer).copied()
    }

    /// Sends `data` to `peer` under `tag`. Returns once the bytes are handed to the socket; it does not
    /// wait for the peer to call `recv`, so both sides may send first.
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        ensure_arg!(
            peer < self.nranks,
            "peer {peer} out of range for nranks {}",
            self.nranks
        );
        self.send_frame(peer, Key::user(tag), data)
    }

    /// Receives the oldest message from `peer` under `tag`, waiting as long as the peer is connected.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        ensure_arg!(
            peer < self.nranks,
            "peer {peer} out of range for nranks {}",
            self.nranks
        );
        self.recv_frame(peer, Key::user(tag))
    }

    /// Sends `data` to `peer` under `tag` among the messages of communicator splits and shrinks. Unlike
    /// `send` it goes out after a failure too, as long as the connection to `peer` is up: the survivors
    /// of a failure agree on their new communicator through it (see `recv_split`).
    pub fn send_split(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        ensure_arg!(
            peer < self.nranks,
            "peer {peer} out of range for nranks {}",
            self.nranks
        );
        self.send_frame_as(peer, Key::split(tag), data, true)
    }

    /// Receives the oldest message that `peer` sent under `tag` with `send_split`. `despite_failure`
    /// keeps waiting after the job failed, as long as the connection to `peer` is up (or its message came
    /// before it closed); `deadline` bounds the wait.
    pub fn recv_split(
        &self,
        peer: usize,
        tag: u64,
        despite_failure: bool,
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>> {
        ensure_arg!(
            peer < self.nranks,
            "peer {peer} out of range for nranks {}",
            self.nranks
        );
        self.shared()
            .mailbox
            .take_until(peer, Key::split(tag), despite_failure, deadline)
            .map_err(|e| Error::new(e.kind, format!("rank {}: {}", self.rank, e.message)))
    }

    /// Pushes a registration record (of the zero-copy collectives' mappings) to `peer`, which takes it
    /// with `take_registration_records` whenever it likes: nobody waits for it, so a rank registering a
    /// buffer needs no call of its peers. Returns once the bytes are handed to the socket; records to one
    /// peer stay in order. Like `send`, it fails once the job has failed.
    pub fn push_registration_record(&self, peer: usize, record: &[u8]) -> Result<()> {
        ensure_arg!(
            peer < self.nranks,
            "peer {peer} out of range for nranks {}",
            self.nranks
        );
        // A rank maps no registration of its own: a record to self is a caller's mistake.
        ensure_arg!(
            peer != self.rank,
            "peer {peer} is this rank: registration records go to the other ranks only"
        );
        self.send_frame(peer, Key::registration(), record)
    }

    /// Every registration record that `peer` pushed and that has arrived so far, oldest first (none for
    /// self or a peer out of range). Never waits and never fails: after a failure it still gives what had
    /// arrived, and the caller decides what to make of it.
    pub fn take_registration_records(&self, peer: usize) -> Vec<Vec<u8>> {
        self.shared().mailbox.take_all(peer, Key::registration())
    }

    pub(super) fn shared(&self) -> &Shared {
        self.receiver.shared()
    }

    pub(super) fn receiver_shared(&self) -> std::sync::Arc<Shared> {
        self.receiver.shared_arc()
    }

    pub(super) fn send_frame(&self, peer: usize, key: Key, data: &[u8]) -> Result<()> {
        self.send_frame_as(peer, key, data, false)
    }

    /// `send_frame`; `despite_failure` sends after the job failed too.
    fn send_frame_as(&self, peer: usize, key: Key, data: &[u8], despite_failure: bool) -> Result<()> {
        let rank = self.rank;
        if let Some(f) = self.failure()
            && !despite_failure
        {
            return Err(f.error());
        }
        if peer == rank {
            self.shared().mailbox.deliver(rank, key, data.to_vec());
            return Ok(());
        }
        let outbox = &self.shared().outboxes[peer];
        if self.shared().mailbox.is_closed(peer) && !outbox.is_open() {
            return Err(Error::remote(format!(
                "rank {rank}: the connection to peer {peer} is closed"
            )));
        }
        outbox
            .ensure(|| self.connect_lazily(peer))
            .map_err(|e| match self.failure() {
                Some(f) if !despite_failure => f.error(),
                _ => Error::new(e.kind, format!("rank {rank}: sending to peer {peer}: {}", e.message)),
            })?;
        let header = wire::encode_frame_header(key, data.len() as u64);
        match outbox.send_frame(&header, data, data.len() <= COALESCE_LIMIT) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotConnected => {
                return Err(Error::remote(format!(
                    "rank {rank}: the connection to peer {peer} is closed"
                )));
            }
            // A send that failed because the job failed (the socket of a silent peer is shut down) says so.
            Err(_) if self.failure().is_some() && !despite_failure => {
                return Err(self.failure().expect("checked").error());
            }
            Err(e) => {
                return Err(Error::remote(format!(
                    "rank {rank}: sending {} bytes ({:?} tag {}) to peer {peer} at {} failed: {e}",
                    data.len(),
                    key.space,
                    key.tag,
                    self.peers[peer]
                )));
            }
        }
        trace!(
            "sent {} bytes ({:?} tag {}) to peer {peer}",
            data.len(),
            key.space,
            key.tag
        );
        Ok(())
    }

    pub(super) fn recv_frame(&self, peer: usize, key: Key) -> Result<Vec<u8>> {
        self.shared()
            .mailbox
            .take(peer, key)
            .map_err(|e| Error::new(e.kind, format!("rank {}: {}", self.rank, e.message)))
    }
}

/// An error for a greeting that was not accepted. `what` says what we were doing.
fn refusal_error(refusal: Refusal, what: &str, timeout: Duration) -> Error {
    match refusal {
        Refusal::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            Error::new(ErrorKind::Timeout, format!("{what}: timed out after {timeout:?}"))
        }
        Refusal::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::remote(format!("{what}: the other side closed the connection"))
        }
        Refusal::Io(e) => Error::remote(format!("{what}: {e}")),
        Refusal::Garbage(why) => Error::remote(format!("{what}: not a bootstrap answer: {why}")),
        Refusal::Rejected {
            status: wire::STATUS_REJECTED,
            reason,
        } => Error::invalid_usage(format!("{what}: turned away: {reason}")),
        Refusal::Rejected { reason, .. } => Error::remote(format!("{what}: gave up: {reason}")),
    }
}

/// The key of the whole table as it goes down the tree at set-up.
const TABLE_KEY: Key = Key {
    space: Space::Table,
    tag: 0,
};

/// Decodes a table of rows: each rank's address and host where the table has its row, which it must for
/// every rank of `needed` (a row of another rank is kept too). Link-local IPv6 addresses get the scope of
/// our own route to the root, since the sender's interface index means nothing on this machine.
fn decode_table(
    table: &[u8],
    nranks: usize,
    needed: &[usize],
    via: SocketAddr,
) -> std::result::Result<Vec<Option<(SocketAddr, u64)>>, String> {
    let mut known: Vec<Option<(SocketAddr, u64)>> = vec![None; nranks];
    for (r, addr, host) in wire::decode_table_rows(table)? {
        if r >= nranks {
            return Err(format!("a row for rank {r} of {nranks}"));
        }
        if known[r].is_some() {
            return Err(format!("two rows for rank {r}"));
        }
        let addr = addr.ok_or_else(|| format!("no address for rank {r}"))?;
        known[r] = Some((with_scope_of(addr, via), host));
    }
    let missing: Vec<usize> = needed.iter().copied().filter(|&r| known[r].is_none()).collect();
    if !missing.is_empty() {
        return Err(format!("no row for {}", list_ranks(&missing)));
    }
    Ok(known)
}

/// `addr`, with the scope of `via` if `addr` is a link-local IPv6 address.
fn with_scope_of(addr: SocketAddr, via: SocketAddr) -> SocketAddr {
    match (addr, via) {
        (SocketAddr::V6(mut a), SocketAddr::V6(v)) if a.ip().segments()[0] & 0xffc0 == 0xfe80 => {
            a.set_scope_id(v.scope_id());
            SocketAddr::V6(a)
        }
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_addresses_take_the_local_scope() {
        let via = SocketAddr::V6(std::net::SocketAddrV6::new("fe80::9".parse().unwrap(), 1, 0, 3));
        let far = SocketAddr::V6(std::net::SocketAddrV6::new("fe80::5".parse().unwrap(), 2, 0, 44));
        assert!(matches!(with_scope_of(far, via), SocketAddr::V6(a) if a.scope_id() == 3));
        let global: SocketAddr = "[fd00::5]:2".parse().unwrap();
        assert_eq!(with_scope_of(global, via), global);
        let v4: SocketAddr = "1.2.3.4:5".parse().unwrap();
        assert_eq!(with_scope_of(v4, via), v4);
    }
}
