//! A rank's receive thread: it accepts connections from higher ranks and checks their handshakes, and it
//! reads frames from every peer into the mailbox. Reading everything as it arrives is what keeps sends
//! from deadlocking: a sender blocks only until the peer's receive thread drains its socket, which never
//! waits on anything else.

use super::handshake::{Greeted, Label, PendingHandshakes};
use super::mailbox::Mailbox;
use super::sys::{self, PollEntry};
use super::wire::{self, FRAME_HEADER_LEN, Greeting, Key, Kind, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use log::{debug, trace, warn};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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

/// What the rank's own threads and its receive thread share.
pub struct Shared {
    pub rank: usize,
    pub nranks: usize,
    pub magic: u64,
    pub mailbox: Mailbox,
    /// The sending half of each peer connection; `None` before it exists and after a send failed.
    pub writers: Vec<Mutex<Option<TcpStream>>>,
    stop: AtomicBool,
    /// Connections this rank opened to lower ranks, waiting to be read by the receive thread.
    outgoing: Mutex<Vec<(usize, TcpStream)>>,
}

/// Owns the receive thread; dropping it stops the thread and closes the listener.
pub struct Receiver {
    shared: Arc<Shared>,
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
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
    ) -> Result<Receiver> {
        let shared = Arc::new(Shared {
            rank,
            nranks,
            magic,
            mailbox: Mailbox::new(rank, nranks),
            writers: (0..nranks).map(|_| Mutex::new(None)).collect(),
            stop: AtomicBool::new(false),
            outgoing: Mutex::new(Vec::new()),
        });
        let context = |what: &str| format!("rank {rank}: {what} for the bootstrap receive thread");
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(context("setting up the listener"), e))?;
        let (waker, wake) = UnixStream::pair().map_err(|e| Error::io(context("creating a wake-up socket"), e))?;
        wake.set_nonblocking(true)
            .map_err(|e| Error::io(context("setting up the wake-up socket"), e))?;
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
            waker,
            thread: Some(thread),
        })
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Hands a connection this rank opened (and finished the handshake of) to the receive thread.
    pub fn add_outgoing(&self, peer: usize, stream: TcpStream) {
        self.shared.outgoing.lock().push((peer, stream));
        self.wake();
    }

    fn wake(&self) {
        // A full wake-up socket already holds a pending wake-up, so a failed write loses nothing.
        let _ = (&self.waker).write(&[1]);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.wake();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            warn!("rank {}: the bootstrap receive thread panicked", self.shared.rank);
        }
        // Close the sending halves now rather than when the last reference goes, so peers see the end.
        for writer in &self.shared.writers {
            if let Some(stream) = writer.lock().take() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
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
                entries.push(PollEntry::readable(listener));
            }
            let first_pending = entries.len();
            entries.extend(self.pending.poll_entries());
            let first_reader = entries.len();
            entries.extend(self.readers.iter().map(|r| PollEntry::readable(&r.stream)));
            let wait = self
                .pending
                .next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now()));
            if let Err(e) = sys::poll(&mut entries, wait) {
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
                if !entries[first_reader + i].ready {
                    continue;
                }
                if let Err(reason) = self.readers[i].on_readable(&self.shared.mailbox) {
                    let reader = self.readers.swap_remove(i);
                    debug!("connection from peer {} ended: {reason}", reader.peer);
                    self.shared.mailbox.close(reader.peer, reason);
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
        *shared.writers[peer].lock() = Some(writer);
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
}

impl FrameReader {
    fn new(peer: usize, stream: TcpStream) -> FrameReader {
        FrameReader {
            peer,
            stream,
            header: [0; FRAME_HEADER_LEN],
            header_filled: 0,
            body: None,
        }
    }

    /// Reads what is available (up to a budget), delivering complete messages. An error ends the
    /// connection; its text says why.
    fn on_readable(&mut self, mailbox: &Mailbox) -> std::result::Result<(), String> {
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
                mailbox.deliver(self.peer, body.key, body.data);
            }
        }
        Ok(())
    }
}
