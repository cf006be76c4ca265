//! A rank's receive thread: it accepts connections from higher ranks and checks their handshakes, and it
//! reads frames from every peer into the mailbox. Reading everything as it arrives is what keeps sends
//! from deadlocking: a sender blocks only until the peer's receive thread drains its socket, which never
//! waits on anything else.
//!
//! The same thread keeps watch over the peers (see `health.rs`): it sends the heartbeats and abort
//! notices (never blocking, see `outbox.rs`), declares a peer dead when its connection closes without a
//! goodbye or stays silent too long, and acts on the notices peers send.

use super::handshake::{Greeted, Label, PendingHandshakes};
use super::health::{Cause, Health, Liveness, PeerFailure};
use super::mailbox::Mailbox;
use super::outbox::Outbox;
use super::sys::{self, PollEntry};
use super::wire::{self, FRAME_HEADER_LEN, Greeting, Key, Kind, Notice, PROTOCOL_VERSION, Space};
use crate::error::{Error, Result};
use log::{debug, info, trace, warn};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
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
    /// Connections this rank opened to lower ranks, waiting to be read by the receive thread.
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

    /// Records a failure. The first one is logged, fails every wait, is passed on to every other peer
    /// when this rank saw it first-hand, and runs the failure hook on a thread of its own; later ones are
    /// only noted.
    pub fn fail(&self, failure: PeerFailure) {
        let Some(hook) = self.health.record(failure.clone()) else {
            debug!("also: {failure}");
            return;
        };
        warn!("{failure}");
        self.mailbox.fail(failure.error());
        // A rank's death spreads as a dissemination: whoever learns of it first, first-hand or told, tells
        // the ranks 1, 2, 4, ... after it (`spread_to`), so every rank hears within log2(n) steps and the
        // notices number at most n log2(n), where a killed rank's peers, each seeing its connection close,
        // used to send n - 2 each (65 thousand notices at 256 ranks, on top of the failure). A rank's own
        // abort goes to every peer at once: it has one source.
        let dead = |how: String| {
            let notice = Notice::Dead {
                rank: failure.rank as u32,
                how,
                silent_ms: failure.silent_for.map(|d| d.as_millis() as u64),
            };
            (Some(notice), spread_to(self.rank, self.nranks, failure.rank))
        };
        let (notice, to) = match &failure.cause {
            Cause::ConnectionClosed(_) | Cause::NoHeartbeat(_) => dead(failure.how()),
            // Passed on as it was told, so every rank names how the first one saw it.
            Cause::ReportedBy { how, .. } => dead(how.clone()),
            Cause::LocalAbort => (
                Some(Notice::Aborted),
                (0..self.nranks).filter(|&p| p != self.rank).collect(),
            ),
            // The aborting rank tells every peer itself.
            Cause::Aborted => (None, Vec::new()),
        };
        if let Some(notice) = notice {
            let frame = notice.frame();
            for peer in to {
                self.outboxes[peer].queue(&frame);
            }
            self.wake();
        }
        if let Some(hook) = hook {
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
}

/// The peers `rank` of `nranks` passes a death of `failed` on to: the ranks 1, 2, 4, ... after it (modulo
/// `nranks`), but itself and `failed`. Every one does so once, when it first learns of it, so a death that
/// one rank saw reaches every other (any distance is a sum of distinct powers of two, and a path that runs
/// through the dead rank has another order of the same steps that does not).
pub(crate) fn spread_to(rank: usize, nranks: usize, failed: usize) -> Vec<usize> {
    let mut to: Vec<usize> = std::iter::successors(Some(1usize), |d| d.checked_mul(2))
        .take_while(|&d| d < nranks)
        .map(|d| (rank + d) % nranks)
        .filter(|&p| p != rank && p != failed)
        .collect();
    to.dedup();
    to
}

/// Owns the receive thread; dropping it stops the thread, says goodbye to every peer (once the rank's
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
            listen_addr,
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
    /// Closed once every higher rank has connected.
    listener: Option<TcpListener>,
    listen_addr: SocketAddr,
    pending: PendingHandshakes,
    readers: Vec<FrameReader>,
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
                    self.readers.push(FrameReader::new(peer, stream));
                } else {
                    warn!("dropped a second connection to peer {peer}");
                }
            }
            if self.listener.is_some() && self.readers.len() + 1 == self.shared.nranks {
                // Every peer is in: nobody legitimate will connect again, so stop listening.
                debug!("all peers connected; closing the listener at {}", self.listen_addr);
                self.listener = None;
                self.pending.clear();
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
                if let Err(e) = self.shared.outboxes[r.peer].pump(tick) {
                    debug!("sending a control frame to peer {} failed: {e}", r.peer);
                }
            }
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
        self.shared.mailbox.close(peer, reason.clone());
        let now = Instant::now();
        self.shared.fail(PeerFailure {
            rank: peer,
            observer: self.shared.rank,
            cause: Cause::ConnectionClosed(reason),
            silent_for: Some(now.saturating_duration_since(reader.last_heard)),
            detected: now,
        });
    }

    /// Declares the first peer silent for too long dead (one failure is enough: the communicator is
    /// aborted either way).
    fn check_silence(&mut self) {
        if self.shared.health.has_failed() {
            return;
        }
        let liveness = self.shared.liveness;
        for i in (0..self.readers.len()).rev() {
            let r = &self.readers[i];
            if r.left || liveness.overdue(r.last_heard, Instant::now()).is_none() {
                continue;
            }
            // One more look, in case this thread itself was held up: what is there counts.
            let before = self.readers.len();
            self.read_from(i);
            if self.readers.len() < before || self.shared.health.has_failed() {
                return;
            }
            let r = &self.readers[i];
            let now = Instant::now();
            if let Some(silence) = liveness.overdue(r.last_heard, now) {
                // Shutting the socket down also ends a send blocked on it (a stopped peer does not read).
                // This rank ends the connection, so it says why, whether or not this is its first failure.
                warn!(
                    "rank {}: closing the connection to peer {}: nothing from it for {:.1} s (MSCCLPP_PEER_TIMEOUT)",
                    self.shared.rank,
                    r.peer,
                    silence.as_secs_f64()
                );
                let _ = r.stream.shutdown(Shutdown::Both);
                self.shared.fail(PeerFailure {
                    rank: r.peer,
                    observer: self.shared.rank,
                    cause: Cause::NoHeartbeat(silence),
                    silent_for: Some(silence),
                    detected: now,
                });
                return;
            }
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
        } else if peer <= rank || peer >= nranks {
            Some(format!(
                "rank {peer} may not connect to rank {rank} (only higher ranks do)"
            ))
        } else if !shared.mailbox.is_waiting_for(peer) {
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
        shared.outboxes[peer].connect(writer);
        shared.mailbox.connect(peer);
        debug!("peer {peer} connected from {}", p.from);
        self.readers.push(FrameReader::new(peer, p.stream));
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
}

impl FrameReader {
    fn new(peer: usize, stream: TcpStream) -> FrameReader {
        FrameReader {
            peer,
            stream,
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
            Notice::Aborted => (Cause::Aborted, self.peer, None),
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
