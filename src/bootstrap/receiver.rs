//! A rank's receive thread: it accepts connections from peers (its higher neighbours at set-up, any peer
//! that first sends to it later) and checks their handshakes, and it reads frames from every connection into
//! the mailbox. Reading everything as it arrives is what keeps sends
//! from deadlocking: a sender blocks only until the peer's receive thread drains its socket, which never
//! waits on anything else.
//!
//! The same thread keeps watch over the rank's neighbours (see `health.rs`, `topology.rs`): it sends them
//! heartbeats and passes notices on (never blocking, see `outbox.rs`), declares a peer dead when a
//! connection with it closes without a goodbye or a neighbour stays silent too long, and acts on the notices
//! peers send. A peer declared dead has its connections shut down, which ends any send blocked on them.

use super::handshake::{Greeted, Label, PendingHandshakes};
use super::health::{Cause, Health, Liveness, PeerFailure};
use super::mailbox::Mailbox;
use super::outbox::Outbox;
use super::sys::{self, PollEntry};
use super::topology::{are_neighbours, spread_to};
use super::wire::{self, FRAME_HEADER_LEN, Greeting, Key, Kind, Notice, PROTOCOL_VERSION, Space};
use crate::error::{Error, Result};
use log::{debug, info, trace, warn};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes read from one peer before the loop turns to the others.
const READ_BUDGET: usize = 8 << 20;
/// A message buffer grows by this much at a time, so a length read from the wire never allocates more
/// than this ahead of the bytes that actually arrive.
const ALLOC_STEP: usize = 256 << 20;
/// How long closing the endpoint waits for the goodbyes (and any notices before them) to fit into the
/// sockets: only a peer that stopped reading makes it wait at all.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// What the rank's own threads and its receive thread share.
pub struct Shared {
    pub rank: usize,
    pub nranks: usize,
    pub magic: u64,
    pub mailbox: Mailbox,
    /// The sending side of each peer connection (none for this rank itself).
    pub outboxes: Vec<Outbox>,
    /// The first failure, and the hook waiting for it.
    pub health: Health,
    pub liveness: Liveness,
    stop: AtomicBool,
    /// The ranks declared dead so far (by this rank or a notice), each passed on once.
    dead: Mutex<Vec<bool>>,
    /// Set when a rank is added to `dead`: the receive thread then shuts its connections down.
    dead_changed: AtomicBool,
    /// Connections this rank opened, waiting to be read by the receive thread.
    outgoing: Mutex<Vec<(usize, TcpStream)>>,
    /// Wakes the receive thread.
    waker: UnixStream,
    /// The thread that runs the failure hook.
    hook_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    /// Wakes the receive thread, which then sends what is queued.
    pub fn wake(&self) {
        // A full wake-up socket already holds a pending wake-up, so a failed write loses nothing.
        let _ = (&self.waker).write(&[1]);
    }

    /// Records a failure. A peer's death is passed on once per dead rank (every rank learns of every death,
    /// so that the survivors' waits for a dead rank end at once even without a connection to it), and its
    /// connections are shut down; the first failure of any kind is logged, fails every wait, is passed on
    /// and runs the failure hook on a thread of its own; later aborts are only noted.
    pub fn fail(&self, failure: PeerFailure) {
        let death = matches!(
            failure.cause,
            Cause::ConnectionClosed(_) | Cause::NoHeartbeat(_) | Cause::ReportedBy { .. }
        );
        let newly_dead = death && self.mark_dead(failure.rank);
        let first = self.health.record(failure.clone());
        if first.is_none() && !newly_dead {
            debug!("also: {failure}");
            return;
        }
        // A notice spreads as a dissemination: whoever learns of it first, first-hand or told, tells its
        // neighbours (`spread_to`: the ranks 1, 2, 4, ... before and after it), so every rank hears within
        // log2(n) steps and the notices of one death number at most 2 n log2(n). A death goes on at each rank
        // once per dead rank; an abort only as the rank's first failure (a rank that has failed already needs
        // no more news: its own first failure went the same way), so that survivors that all revoke after a
        // death send nothing. It goes out before anything else is done (the log line, the hook's thread):
        // each step of the spread waits for the one before.
        let notice = match &failure.cause {
            Cause::ConnectionClosed(_) | Cause::NoHeartbeat(_) => Some(Notice::Dead {
                rank: failure.rank as u32,
                how: failure.how(),
                silent_ms: failure.silent_for.map(|d| d.as_millis() as u64),
            }),
            // Passed on as it was told, so every rank names how the first one saw it.
            Cause::ReportedBy { how, .. } => Some(Notice::Dead {
                rank: failure.rank as u32,
                how: how.clone(),
                silent_ms: failure.silent_for.map(|d| d.as_millis() as u64),
            }),
            Cause::LocalAbort | Cause::Aborted => first.is_some().then_some(Notice::Aborted {
                rank: failure.rank as u32,
            }),
        };
        if let Some(notice) = notice {
            let frame = notice.frame();
            for peer in spread_to(self.rank, self.nranks, failure.rank) {
                self.outboxes[peer].queue(&frame);
                // At once where the connection is free (never waiting); else the receive thread's next pump.
                let _ = self.outboxes[peer].pump(false);
            }
        }
        if newly_dead && failure.rank != self.rank {
            self.mailbox.close(failure.rank, failure.error().message);
        }
        if first.is_some() {
            self.mailbox.fail(failure.error());
            warn!("{failure}");
        } else {
            info!("also: {failure}");
        }
        self.wake();
        if let Some(Some(hook)) = first {
            let rank = self.rank;
            let spawned = std::thread::Builder::new()
                .name(format!("mscclpp-failure-{rank}"))
                .spawn(move || {
                    crate::logging::set_thread_rank(rank);
                    hook(&failure);
                });
            match spawned {
                Ok(thread) => *self.hook_thread.lock() = Some(thread),
                Err(e) => warn!("could not start a thread for the failure hook: {e}"),
            }
        }
    }

    /// Adds `rank` to the dead; false if it was there.
    fn mark_dead(&self, rank: usize) -> bool {
        let mut dead = self.dead.lock();
        if dead[rank] {
            return false;
        }
        dead[rank] = true;
        self.dead_changed.store(true, Ordering::SeqCst);
        true
    }

    /// Whether `rank` was declared dead.
    pub fn is_dead(&self, rank: usize) -> bool {
        self.dead.lock()[rank]
    }
}

/// Owns the receive thread; dropping it stops the thread, says goodbye on every connection (once the rank's
/// set-up completed) and closes the connections.
pub struct Receiver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Whether closing says goodbye: only once this rank's set-up completed (`set_up_complete`).
    farewell: AtomicBool,
}

impl Receiver {
    /// Starts the receive thread of `rank`, accepting peers on `listener`. Connections must finish their
    /// handshake within `handshake_timeout`.
    pub fn start(
        listener: TcpListener,
        rank: usize,
        nranks: usize,
        magic: u64,
        handshake_timeout: Duration,
        liveness: Liveness,
    ) -> Result<Receiver> {
        let context = |what: &str| format!("rank {rank}: {what} for the bootstrap receive thread");
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(context("setting up the listener"), e))?;
        let (waker, wake) = UnixStream::pair().map_err(|e| Error::io(context("creating a wake-up socket"), e))?;
        for end in [&waker, &wake] {
            end.set_nonblocking(true)
                .map_err(|e| Error::io(context("setting up the wake-up socket"), e))?;
        }
        let shared = Arc::new(Shared {
            rank,
            nranks,
            magic,
            mailbox: Mailbox::new(rank, nranks),
            outboxes: (0..nranks).map(|_| Outbox::default()).collect(),
            health: Health::default(),
            liveness,
            stop: AtomicBool::new(false),
            dead: Mutex::new(vec![false; nranks]),
            dead_changed: AtomicBool::new(false),
            outgoing: Mutex::new(Vec::new()),
            waker,
            hook_thread: Mutex::new(None),
        });
        let listen_addr = listener
            .local_addr()
            .map_err(|e| Error::io(context("reading the listen address"), e))?;
        let state = Loop {
            shared: shared.clone(),
            wake,
            listener: Some(listener),
            pending: PendingHandshakes::new(
                handshake_timeout,
                Label {
                    prefix: String::new(),
                    stranger: "a connection from ",
                    greeting: "handshake",
                    accept_failed: format!("accepting at {listen_addr} failed"),
                },
            ),
            readers: Vec::new(),
            incoming: std::collections::HashSet::new(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("mscclpp-bootstrap-{rank}"))
            .spawn(move || {
                crate::logging::set_thread_rank(rank);
                state.run();
            })
            .map_err(|e| Error::io(context("spawning a thread"), e))?;
        Ok(Receiver {
            shared,
            thread: Some(thread),
            farewell: AtomicBool::new(false),
        })
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn shared_arc(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// This rank's set-up completed: closing from now on says goodbye. Before, it does not: a peer that
    /// finished its own set-up holds a communicator with this rank in it, and a goodbye would tell it this
    /// rank left in order (only a call waiting on this rank would fail), whereas a close without one fails
    /// its communicator at once.
    pub fn set_up_complete(&self) {
        self.farewell.store(true, Ordering::SeqCst);
    }

    /// Closing will say no goodbye (a test's stand-in for a killed process).
    #[cfg(test)]
    pub fn no_farewell(&self) {
        self.farewell.store(false, Ordering::SeqCst);
    }

    /// Hands a connection this rank opened (and finished the handshake of) to the receive thread.
    pub fn add_outgoing(&self, peer: usize, stream: TcpStream) {
        self.shared.outgoing.lock().push((peer, stream));
        self.shared.wake();
    }
}

/// Joins `thread` unless it is the calling thread (the last owner of an endpoint may be one of its own
/// threads: that one finishes on its own once it returns).
fn join_unless_current(thread: JoinHandle<()>, what: &str, rank: usize) {
    if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
        warn!("rank {rank}: the {what} panicked");
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let rank = self.shared.rank;
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            join_unless_current(thread, "bootstrap receive thread", rank);
        }
        let hook_thread = self.shared.hook_thread.lock().take();
        if let Some(thread) = hook_thread {
            join_unless_current(thread, "failure hook", rank);
        }
        // Close the connections now rather than when the last reference goes, with a goodbye first, so
        // that peers see an orderly end and not a failure (after a failed set-up, without one: a failure).
        let deadline = Instant::now() + CLOSE_WAIT;
        let goodbye = wire::control_frame(Space::Goodbye);
        let farewell = self.farewell.load(Ordering::SeqCst);
        let last: &[u8] = if farewell { &goodbye } else { &[] };
        // The rank that ends its connections says so (a peer sees only that they closed): in order, or, where
        // its set-up did not complete, as a failure its peers will report.
        let peers = self.shared.outboxes.iter().filter(|o| o.is_open()).count();
        if peers > 0 && farewell {
            info!("rank {rank}: closing its connections to {peers} peer(s), with a goodbye (its communicator ends)");
        } else if peers > 0 {
            warn!(
                "rank {rank}: closing its connections to {peers} peer(s) without a goodbye: its communicator's \
                 set-up did not complete, so the peers that finished theirs fail"
            );
        }
        for outbox in &self.shared.outboxes {
            outbox.close_by(last, deadline);
        }
    }
}

/// The receive thread's state.
struct Loop {
    shared: Arc<Shared>,
    wake: UnixStream,
    /// Open for the endpoint's life: any peer may connect when it first sends to this rank.
    listener: Option<TcpListener>,
    pending: PendingHandshakes,
    /// One per connection: a peer may have two (each side opened one at once).
    readers: Vec<FrameReader>,
    /// The peers that opened a connection to this rank: one each.
    incoming: std::collections::HashSet<usize>,
}

impl Loop {
    fn run(mut self) {
        let liveness = self.shared.liveness;
        let mut next_tick = Instant::now() + liveness.period;
        loop {
            if self.shared.stop.load(Ordering::SeqCst) {
                debug!("bootstrap receive thread stopping");
                return;
            }
            let handed_over = std::mem::take(&mut *self.shared.outgoing.lock());
            for (peer, stream) in handed_over {
                if self.shared.mailbox.connect(peer) {
                    let watched = are_neighbours(self.shared.rank, peer, self.shared.nranks);
                    self.readers.push(FrameReader::new(peer, stream, watched));
                } else {
                    debug!("dropped a connection to peer {peer}, which is gone");
                }
            }
            if self.shared.dead_changed.swap(false, Ordering::SeqCst) {
                self.shut_down_the_dead();
            }

            let mut entries = vec![PollEntry::readable(&self.wake)];
            if let Some(listener) = &self.listener {
                // Only while a handshake may start; the connections beyond wait in its backlog.
                entries.push(if self.pending.has_room() {
                    PollEntry::readable(listener)
                } else {
                    PollEntry::ignored()
                });
            }
            let first_pending = entries.len();
            entries.extend(self.pending.poll_entries());
            let first_reader = entries.len();
            entries.extend(self.readers.iter().map(|r| PollEntry::readable(&r.stream)));
            let wake_at = self.pending.next_deadline().map_or(next_tick, |d| d.min(next_tick));
            if let Err(e) = sys::poll(&mut entries, Some(wake_at.saturating_duration_since(Instant::now()))) {
                warn!("bootstrap poll failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }

            if entries[0].ready {
                let mut sink = [0u8; 64];
                while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
            }
            // Readers first: their indices refer to the list as polled.
            for i in (0..self.readers.len()).rev() {
                if entries[first_reader + i].ready {
                    self.read_from(i);
                }
            }
            let greeted = self
                .pending
                .advance(&entries[first_pending..first_reader], Instant::now());
            for p in greeted {
                self.admit(p);
            }
            if let Some(listener) = &self.listener
                && entries[1].ready
            {
                self.pending.accept_from(listener);
            }

            // After reading, so that what arrived while this thread was held up counts as a sign of life.
            let now = Instant::now();
            let tick = now >= next_tick;
            if tick {
                next_tick = now + liveness.period;
                self.check_silence();
            }
            for r in &self.readers {
                // Heartbeats go to the neighbours only: the peers a rank watches, and that watch it.
                let beat = tick && r.watched;
                if let Err(e) = self.shared.outboxes[r.peer].pump(beat) {
                    debug!("sending a control frame to peer {} failed: {e}", r.peer);
                }
            }
        }
    }

    /// Shuts down and drops the connections of the peers declared dead (by this rank or by a notice):
    /// shutting a socket down also ends a send blocked on it (a stopped peer does not read).
    fn shut_down_the_dead(&mut self) {
        let dead = self.shared.dead.lock().clone();
        let before = self.readers.len();
        self.readers.retain(|r| {
            if dead[r.peer] {
                let _ = r.stream.shutdown(Shutdown::Both);
                false
            } else {
                true
            }
        });
        if self.readers.len() < before {
            debug!("closed {} connection(s) of dead peers", before - self.readers.len());
        }
    }

    /// Reads what reader `i` has; removes it if its connection ended, which is a failure unless the peer
    /// said goodbye.
    fn read_from(&mut self, i: usize) {
        let Err(reason) = self.readers[i].on_readable(&self.shared) else {
            return;
        };
        let reader = self.readers.swap_remove(i);
        let peer = reader.peer;
        if reader.left {
            debug!("peer {peer} left");
            self.shared
                .mailbox
                .close(peer, format!("rank {peer} left (it destroyed its communicator)"));
            return;
        }
        debug!("connection from peer {peer} ended: {reason}");
        // (`fail` closes its link, with the failure's words.)
        let now = Instant::now();
        self.shared.fail(PeerFailure {
            rank: peer,
            observer: self.shared.rank,
            cause: Cause::ConnectionClosed(reason),
            silent_for: Some(now.saturating_duration_since(reader.last_heard)),
            detected: now,
        });
    }

    /// Declares the neighbours silent for too long dead: those it watches (a connection made later, to a
    /// peer that is not a neighbour, carries no heartbeats; its neighbours watch it). It goes on after a
    /// failure, so that a rank stopped later is known too (its survivors' shrink waits for no silent rank).
    fn check_silence(&mut self) {
        let liveness = self.shared.liveness;
        let now = Instant::now();
        // Each watched peer's last sign of life: the latest over its connections.
        let mut latest: Vec<(usize, Instant)> = Vec::new();
        for r in self.readers.iter().filter(|r| r.watched && !r.left) {
            match latest.iter_mut().find(|(p, _)| *p == r.peer) {
                Some(entry) => entry.1 = entry.1.max(r.last_heard),
                None => latest.push((r.peer, r.last_heard)),
            }
        }
        for (peer, heard) in latest {
            if liveness.overdue(heard, now).is_none() || self.shared.is_dead(peer) {
                continue;
            }
            // One more look, in case this thread itself was held up: what is there counts.
            for i in (0..self.readers.len()).rev() {
                if i < self.readers.len() && self.readers[i].peer == peer {
                    self.read_from(i);
                }
            }
            let Some(heard) = self
                .readers
                .iter()
                .filter(|r| r.peer == peer)
                .map(|r| r.last_heard)
                .max()
            else {
                continue; // Its connections ended meanwhile: `read_from` said how.
            };
            let now = Instant::now();
            if let Some(silence) = liveness.overdue(heard, now) {
                // This rank ends the connections (`shut_down_the_dead`, once it is marked dead), so it says
                // why, whether or not this is its first failure.
                warn!(
                    "rank {}: closing the connection to peer {peer}: nothing from it for {:.1} s (MSCCLPP_PEER_TIMEOUT)",
                    self.shared.rank,
                    silence.as_secs_f64()
                );
                self.shared.fail(PeerFailure {
                    rank: peer,
                    observer: self.shared.rank,
                    cause: Cause::NoHeartbeat(silence),
                    silent_for: Some(silence),
                    detected: now,
                });
            }
        }
        if self.shared.dead_changed.swap(false, Ordering::SeqCst) {
            self.shut_down_the_dead();
        }
    }

    /// Checks a peer's greeting, answers it, and starts reading from the peer if it is one we expect.
    fn admit(&mut self, mut p: Greeted) {
        let shared = &self.shared;
        let (rank, nranks, magic) = (shared.rank, shared.nranks, shared.magic);
        let g = match Greeting::decode(&p.bytes) {
            Ok(g) if g.kind == Kind::PeerHello => g,
            Ok(g) => {
                warn!(
                    "turned away a connection from {}: unexpected {:?} greeting",
                    p.from, g.kind
                );
                let _ = wire::write_rejection(&mut p.stream, magic, wire::STATUS_REJECTED, "not a peer greeting");
                return;
            }
            Err(why) => {
                warn!("turned away a connection from {}: {why}", p.from);
                return;
            }
        };
        let peer = g.rank as usize;
        let refusal = if g.version != PROTOCOL_VERSION {
            Some(format!(
                "protocol version {} (rank {rank} speaks {PROTOCOL_VERSION})",
                g.version
            ))
        } else if g.magic != magic {
            Some(format!("wrong magic {:#x}: a rank of another job?", g.magic))
        } else if g.nranks as usize != nranks {
            Some(format!("nranks {} but this job has {nranks}", g.nranks))
        } else if g.aux as usize != rank {
            Some(format!("it wants rank {} but this is rank {rank}", g.aux))
        } else if peer >= nranks {
            Some(format!("rank {peer} is out of range for nranks {nranks}"))
        } else if peer == rank {
            Some(format!("rank {peer} is this rank"))
        } else if shared.mailbox.is_closed(peer) {
            Some(format!("rank {peer} has left or was declared dead"))
        } else if self.incoming.contains(&peer) {
            Some(format!("rank {peer} is already connected"))
        } else {
            None
        };
        if let Some(reason) = refusal {
            warn!(
                "turned away a connection from {} claiming rank {peer}: {reason}",
                p.from
            );
            let _ = wire::write_rejection(&mut p.stream, magic, wire::STATUS_REJECTED, &reason);
            return;
        }
        let writer = match p.stream.try_clone() {
            Ok(w) => w,
            Err(e) => {
                warn!("dropped the connection from peer {peer}: {e}");
                return;
            }
        };
        if let Err(e) = wire::write_reply(&mut p.stream, magic, rank, nranks, wire::STATUS_OK, &[]) {
            warn!("could not answer peer {peer} at {}: {e}", p.from);
            return;
        }
        let _ = p.stream.set_nodelay(true);
        shared.outboxes[peer].offer(writer);
        shared.mailbox.connect(peer);
        debug!("peer {peer} connected from {}", p.from);
        self.incoming.insert(peer);
        let watched = are_neighbours(rank, peer, nranks);
        self.readers.push(FrameReader::new(peer, p.stream, watched));
    }
}

/// A message being received.
struct Body {
    key: Key,
    data: Vec<u8>,
    filled: usize,
    len: usize,
}

/// Reads frames from one peer as they arrive.
struct FrameReader {
    peer: usize,
    stream: TcpStream,
    header: [u8; FRAME_HEADER_LEN],
    header_filled: usize,
    body: Option<Body>,
    /// When the last byte arrived (or the connection was made): the peer's last sign of life.
    last_heard: Instant,
    /// The peer said goodbye: its connection closes on purpose.
    left: bool,
    /// The peer is a neighbour: it gets heartbeats, and its silence counts.
    watched: bool,
}

impl FrameReader {
    fn new(peer: usize, stream: TcpStream, watched: bool) -> FrameReader {
        FrameReader {
            peer,
            stream,
            watched,
            header: [0; FRAME_HEADER_LEN],
            header_filled: 0,
            body: None,
            last_heard: Instant::now(),
            left: false,
        }
    }

    /// Reads what is available (up to a budget), delivering complete messages and acting on control
    /// frames. An error ends the connection; its text says why.
    fn on_readable(&mut self, shared: &Shared) -> std::result::Result<(), String> {
        let mut budget = READ_BUDGET;
        while budget > 0 {
            let result = match &mut self.body {
                None => sys::recv_now(&self.stream, &mut self.header[self.header_filled..]),
                Some(body) => {
                    if body.filled == body.data.len() {
                        let grown = body.len.min(body.data.len() + ALLOC_STEP);
                        body.data.resize(grown, 0);
                    }
                    sys::recv_now(&self.stream, &mut body.data[body.filled..])
                }
            };
            let n = match result {
                Ok(0) if self.header_filled == 0 && self.body.is_none() => {
                    return Err("peer closed its connection".into());
                }
                Ok(0) => return Err("peer closed its connection in the middle of a message".into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(format!("receive failed: {e}")),
            };
            self.last_heard = Instant::now();
            budget = budget.saturating_sub(n);
            match &mut self.body {
                None => {
                    self.header_filled += n;
                    if self.header_filled == FRAME_HEADER_LEN {
                        self.header_filled = 0;
                        let (key, len) = wire::decode_frame_header(&self.header)?;
                        let len = len as usize;
                        let data = vec![0u8; len.min(ALLOC_STEP)];
                        self.body = Some(Body {
                            key,
                            data,
                            filled: 0,
                            len,
                        });
                    }
                }
                Some(body) => body.filled += n,
            }
            if self.body.as_ref().is_some_and(|b| b.filled == b.len) {
                let body = self.body.take().expect("checked above");
                trace!(
                    "received {} bytes ({:?} tag {}) from peer {}",
                    body.len, body.key.space, body.key.tag, self.peer
                );
                match body.key.space {
                    Space::Heartbeat => {}
                    Space::Goodbye => self.left = true,
                    Space::Abort => self.on_notice(&body.data, shared)?,
                    _ => shared.mailbox.deliver(self.peer, body.key, body.data),
                }
            }
        }
        Ok(())
    }

    /// Acts on an abort notice from the peer.
    fn on_notice(&self, payload: &[u8], shared: &Shared) -> std::result::Result<(), String> {
        let (cause, rank, silent_for) = match Notice::decode(payload)? {
            Notice::Dead { rank, how, silent_ms } => {
                let rank = rank as usize;
                if rank >= shared.nranks {
                    return Err(format!("abort notice about rank {rank} of {}", shared.nranks));
                }
                let cause = Cause::ReportedBy {
                    reporter: self.peer,
                    how,
                };
                (cause, rank, silent_ms.map(Duration::from_millis))
            }
            Notice::Aborted { rank } => {
                let rank = rank as usize;
                if rank >= shared.nranks {
                    return Err(format!("abort notice about rank {rank} of {}", shared.nranks));
                }
                (Cause::Aborted, rank, None)
            }
        };
        shared.fail(PeerFailure {
            rank,
            observer: shared.rank,
            cause,
            silent_for,
            detected: Instant::now(),
        });
        Ok(())
    }
}
