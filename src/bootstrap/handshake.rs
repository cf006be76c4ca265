//! Connections accepted but not yet past their greeting, shared by the root and each rank's receive
//! thread. Greetings are read a piece at a time from one poll loop, with a bound on how many may be in
//! flight and a deadline for each, so strangers that flood a listener or send nothing never hold up
//! real ranks. What a finished greeting means is the caller's business.

use super::sys::PollEntry;
use super::wire::{GREETING_LEN, GreetingReader};
use log::warn;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// At most this many connections are in their handshake at once; the rest wait in the listener's backlog
/// (`sys::LISTEN_BACKLOG`) until some finish or time out, so that a flood of strangers holds up real ranks
/// only for their deadline, and a job larger than this is let in as its greetings arrive (it was turned
/// away: 512 host-only ranks on two cores, "too many unfinished handshakes" at the root).
const MAX_PENDING: usize = 256;
/// The most connections that ended in their handshake `take_lost` keeps (the latest).
const MAX_LOST: usize = 2;

/// How a caller words its log lines about these connections, so each keeps its own.
pub struct Label {
    /// Starts every line.
    pub prefix: String,
    /// Comes before the remote address, naming what it is.
    pub stranger: &'static str,
    /// What the greeting is called when one does not arrive in time.
    pub greeting: &'static str,
    /// Says that accepting failed; the error follows.
    pub accept_failed: String,
}

/// A connection whose greeting has fully arrived.
pub struct Greeted {
    pub stream: TcpStream,
    pub from: SocketAddr,
    pub bytes: [u8; GREETING_LEN],
}

/// A connection that has not finished its greeting.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    greeting: GreetingReader,
    deadline: Instant,
}

/// The bounded list of connections in their handshake.
pub struct PendingHandshakes {
    pending: Vec<Pending>,
    /// How long a new connection has to send its greeting.
    timeout: Duration,
    label: Label,
    /// The latest connections that ended before their greeting was whole: who and why.
    lost: Vec<String>,
}

impl PendingHandshakes {
    pub fn new(timeout: Duration, label: Label) -> PendingHandshakes {
        PendingHandshakes {
            pending: Vec::new(),
            timeout,
            label,
            lost: Vec::new(),
        }
    }

    /// The connections that ended before their greeting was whole since the last call (the latest
    /// `MAX_LOST`), each as "from ADDR: why": a rank whose process ended as it started looks like that.
    pub fn take_lost(&mut self) -> Vec<String> {
        std::mem::take(&mut self.lost)
    }

    /// One entry per connection, in the order `advance` expects their results.
    pub fn poll_entries(&self) -> impl Iterator<Item = PollEntry> + '_ {
        self.pending.iter().map(|p| PollEntry::readable(&p.stream))
    }

    /// The earliest deadline, which bounds how long the caller may wait in `poll`.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.deadline).min()
    }

    /// Whether another connection may start its handshake: the caller polls its listener only then (the
    /// connections beyond wait in its backlog).
    pub fn has_room(&self) -> bool {
        self.pending.len() < MAX_PENDING
    }

    /// Accepts the connections waiting at `listener` (which is non-blocking), up to the bound.
    pub fn accept_from(&mut self, listener: &TcpListener) {
        let label = &self.label;
        while self.has_room() {
            match listener.accept() {
                Ok((stream, from)) => {
                    // Accepted sockets do not inherit the listener's non-blocking mode; make sure.
                    if let Err(e) = stream.set_nonblocking(false) {
                        warn!("{}dropped {}{from}: {e}", label.prefix, label.stranger);
                        continue;
                    }
                    let deadline = Instant::now() + self.timeout;
                    self.pending.push(Pending {
                        stream,
                        from,
                        greeting: GreetingReader::default(),
                        deadline,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors, most likely: back off instead of spinning on a ready listener.
                    warn!("{}{}: {e}", label.prefix, label.accept_failed);
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            }
        }
    }

    /// Reads from the connections `polled` found ready (one entry each, as from `poll_entries`), and
    /// closes those that failed or ran out of time. Returns the ones whose greeting is complete.
    pub fn advance(&mut self, polled: &[PollEntry], now: Instant) -> Vec<Greeted> {
        let label = &self.label;
        let mut greeted = Vec::new();
        // Backwards, so that removing one leaves the indices still to visit as polled.
        for i in (0..self.pending.len()).rev() {
            let p = &mut self.pending[i];
            if polled[i].ready {
                match p.greeting.advance(&p.stream) {
                    Ok(Some(bytes)) => {
                        let p = self.pending.swap_remove(i);
                        greeted.push(Greeted {
                            stream: p.stream,
                            from: p.from,
                            bytes,
                        });
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let p = self.pending.swap_remove(i);
                        warn!("{}turned away {}{}: {e}", label.prefix, label.stranger, p.from);
                        lose(&mut self.lost, p.from, e.to_string());
                        continue;
                    }
                }
            }
            if now >= p.deadline {
                let p = self.pending.swap_remove(i);
                let why = format!("no {} within {:?}", label.greeting, self.timeout);
                warn!("{}turned away {}{}: {why}", label.prefix, label.stranger, p.from);
                lose(&mut self.lost, p.from, why);
            }
        }
        greeted
    }
}

/// Keeps a connection that ended in its handshake among the latest `MAX_LOST`.
fn lose(lost: &mut Vec<String>, from: SocketAddr, why: String) {
    if lost.len() == MAX_LOST {
        lost.remove(0);
    }
    lost.push(format!("from {from}: {why}"));
}
