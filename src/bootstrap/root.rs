//! The root: a thread that listens where every rank can find it, collects each rank's hello (rank,
//! nranks, magic and listen address), sends every rank the rows of the table it needs to set up (its own
//! and its neighbours': `2 log2 n + 1` at most) and rank 0 the whole table, and exits. Rank 0 passes the
//! whole table down the binomial tree of neighbours once they are connected (`Bootstrap::connect_watching`),
//! so the root sends about `n (2 log2 n + 2)` rows in all, where a whole table to every rank was `n²`.
//!
//! It learns nranks from the first hello and turns away any hello that disagrees (another job, a wrong
//! rank, a duplicate) with a reason, and strangers that send garbage or nothing, with a warning. Handshakes
//! are read a piece at a time in one poll loop, so a silent stranger never holds up real ranks. If not
//! every rank has arrived `timeout` after the first one did, the root tells the waiting ranks which are
//! missing; ranks of the job that come later are told the same for another `timeout`, then it exits.
//!
//! A rank that joined and then closed its connection before the table was sent (its process ended, or its
//! init gave up) fails the job at once: the root tells every waiting rank which rank left and which had not
//! arrived, rather than leave them waiting out the timeout for a rank that will not come back (a rank never
//! joins twice). Until the timeout it answers any rank of the job that arrives later with the same reason.

use super::handshake::{Greeted, Label, PendingHandshakes};
use super::sys::{self, PollEntry};
use super::wire::{self, Greeting, Kind, MAX_RANKS, PROTOCOL_VERSION};
use super::{handshake_timeout, list_ranks};
use crate::error::{Error, Result};
use log::{debug, info, warn};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running root. Dropping it lets the thread finish on its own: once every rank has the table, or
/// after `timeout` without a new rank.
pub struct Root {
    addr: SocketAddr,
    /// The bytes of the table rows the root has written to the ranks (for the tests that bound them).
    table_bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Root {
    /// Binds `addr` (port 0 picks a free port) and starts the root thread for a job with `magic`.
    pub fn listen(addr: SocketAddr, magic: u64, timeout: Duration) -> Result<Root> {
        let listener =
            TcpListener::bind(addr).map_err(|e| Error::io(format!("bootstrap root: cannot listen at {addr}"), e))?;
        let context = |what: &str| format!("bootstrap root at {addr}: {what}");
        // Every rank of the job says hello here at once.
        super::sys::widen_backlog(&listener).map_err(|e| Error::io(context("setting up the listener"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(context("setting up the listener"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(context("reading the listen address"), e))?;
        let (waker, wake) = UnixStream::pair().map_err(|e| Error::io(context("creating a wake-up socket"), e))?;
        wake.set_nonblocking(true)
            .map_err(|e| Error::io(context("setting up the wake-up socket"), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table_bytes = Arc::new(AtomicU64::new(0));
        let state = RootLoop {
            addr,
            table_bytes: table_bytes.clone(),
            listener,
            wake,
            stop: stop.clone(),
            magic,
            timeout,
            nranks: None,
            ranks: Vec::new(),
            joined: 0,
            pending: PendingHandshakes::new(
                handshake_timeout(timeout),
                Label {
                    prefix: format!("bootstrap root at {addr}: "),
                    stranger: "",
                    greeting: "hello",
                    accept_failed: "accept failed".into(),
                },
            ),
            idle_deadline: Instant::now() + timeout,
            failed: None,
            wake_open: true,
        };
        let thread = std::thread::Builder::new()
            .name("mscclpp-bootstrap-root".into())
            .spawn(move || state.run())
            .map_err(|e| Error::io(context("spawning the root thread"), e))?;
        info!("bootstrap root listening at {addr}");
        Ok(Root {
            addr,
            table_bytes,
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// Where the root listens (with the real port when bound with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bytes of table rows sent to the ranks so far (what the tests bound).
    pub fn table_bytes_sent(&self) -> u64 {
        self.table_bytes.load(Ordering::SeqCst)
    }

    /// True once the root thread has exited.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the root to finish on its own.
    pub fn join(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Stops the root now; ranks still waiting for the table are told so.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&self.waker).write(&[1]);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A rank that has said hello and waits for the table.
struct Joined {
    stream: TcpStream,
    from: SocketAddr,
    listen: SocketAddr,
    host: u64,
}

struct RootLoop {
    addr: SocketAddr,
    table_bytes: Arc<AtomicU64>,
    listener: TcpListener,
    wake: UnixStream,
    stop: Arc<AtomicBool>,
    magic: u64,
    timeout: Duration,
    /// Set by the first valid hello.
    nranks: Option<usize>,
    ranks: Vec<Option<Joined>>,
    joined: usize,
    pending: PendingHandshakes,
    /// When the root gives up: `timeout` after it started, until the first rank arrives; then `timeout`
    /// after that rank's hello, about when the first rank's own wait ends (each rank waits `timeout` plus
    /// a grace for the root's answer, so the root's reason, naming the ranks missing, reaches it first).
    /// Once the job failed: when it stops answering.
    idle_deadline: Instant,
    /// Why the root gave up before the table was sent (a joined rank left, or ranks did not arrive in
    /// time). Ranks of the job that come later are told so, until `idle_deadline`.
    failed: Option<String>,
    /// False once the `Root` was dropped: its end of the wake-up socket is closed, which `poll` would
    /// report as readable on every round.
    wake_open: bool,
}

impl RootLoop {
    fn run(mut self) {
        loop {
            if self.stop.load(Ordering::SeqCst) {
                self.abort("the root was stopped".into());
                return;
            }
            if self.failed.is_none() && self.nranks == Some(self.joined) {
                self.send_table();
                return;
            }
            let now = Instant::now();
            if now >= self.idle_deadline {
                if self.failed.is_some() {
                    debug!(
                        "bootstrap root at {}: exiting, {:?} after it gave up",
                        self.addr, self.timeout
                    );
                    return;
                }
                let mut reason = match self.nranks {
                    None => format!("no rank arrived within {:?}", self.timeout),
                    Some(_) => format!(
                        "{} did not arrive within {:?}",
                        list_ranks(&self.missing()),
                        self.timeout
                    ),
                };
                // A rank whose process ended as it started looks like that, not like one never started.
                let lost = self.pending.take_lost();
                if !lost.is_empty() {
                    reason.push_str(&format!(
                        "; connections that ended before their hello (a rank whose process ended as it \
                         started?): {}",
                        lost.join("; ")
                    ));
                }
                self.give_up(reason);
                continue;
            }

            let wake = if self.wake_open {
                PollEntry::readable(&self.wake)
            } else {
                PollEntry::ignored()
            };
            // The listener only while a handshake may start; the connections beyond wait in its backlog.
            let listening = if self.pending.has_room() {
                PollEntry::readable(&self.listener)
            } else {
                PollEntry::ignored()
            };
            let mut entries = vec![wake, listening];
            entries.extend(self.pending.poll_entries());
            let first_joined = entries.len();
            let joined: Vec<usize> = (0..self.ranks.len()).filter(|&r| self.ranks[r].is_some()).collect();
            entries.extend(
                joined
                    .iter()
                    .map(|&r| PollEntry::readable(&self.ranks[r].as_ref().expect("joined").stream)),
            );
            let wait = self
                .pending
                .next_deadline()
                .map_or(self.idle_deadline, |d| d.min(self.idle_deadline));
            if let Err(e) = sys::poll(&mut entries, Some(wait.saturating_duration_since(now))) {
                warn!("bootstrap root at {}: poll failed: {e}", self.addr);
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }

            if entries[0].ready {
                let mut sink = [0u8; 64];
                while let Ok(n) = (&self.wake).read(&mut sink) {
                    if n == 0 {
                        self.wake_open = false;
                        break;
                    }
                }
            }
            for (i, &r) in joined.iter().enumerate() {
                if entries[first_joined + i].ready {
                    self.check_joined(r);
                }
            }
            let greeted = self.pending.advance(&entries[2..first_joined], Instant::now());
            for p in greeted {
                self.admit(p);
            }
            if entries[1].ready {
                self.pending.accept_from(&self.listener);
            }
        }
    }

    /// Checks a hello and records the rank, or turns the connection away.
    fn admit(&mut self, mut p: Greeted) {
        let g = match Greeting::decode(&p.bytes) {
            Ok(g) => g,
            Err(why) => {
                warn!("bootstrap root at {}: turned away {}: {why}", self.addr, p.from);
                return;
            }
        };
        let (rank, nranks) = (g.rank as usize, g.nranks as usize);
        let refusal = if g.kind != Kind::RootHello {
            Some(format!("a {:?} greeting is not a hello to the root", g.kind))
        } else if g.version != PROTOCOL_VERSION {
            Some(format!(
                "protocol version {} (the root speaks {PROTOCOL_VERSION})",
                g.version
            ))
        } else if g.magic != self.magic {
            Some(format!("wrong magic {:#x}: a rank of another job?", g.magic))
        } else if nranks == 0 || nranks > MAX_RANKS {
            Some(format!("nranks {nranks} out of range 1-{MAX_RANKS}"))
        } else if self.nranks.is_some_and(|n| n != nranks) {
            Some(format!("nranks {nranks} but this job has {}", self.nranks.unwrap_or(0)))
        } else if rank >= nranks {
            Some(format!("rank {rank} out of range for nranks {nranks}"))
        } else if g.addr.is_none() {
            Some("the hello has no listen address".into())
        } else {
            self.ranks
                .get(rank)
                .and_then(Option::as_ref)
                .map(|j| format!("rank {rank} already joined from {}", j.from))
        };
        if let Some(reason) = refusal {
            warn!(
                "bootstrap root at {}: turned away {} (rank {rank}): {reason}",
                self.addr, p.from
            );
            let _ = wire::write_rejection(&mut p.stream, self.magic, wire::STATUS_REJECTED, &reason);
            return;
        }
        if let Some(reason) = &self.failed {
            warn!(
                "bootstrap root at {}: rank {rank} from {} arrived after the job failed: {reason}",
                self.addr, p.from
            );
            let _ = wire::write_rejection(&mut p.stream, self.magic, wire::STATUS_ABORTED, reason);
            return;
        }
        if self.nranks.is_none() {
            self.nranks = Some(nranks);
            self.ranks = (0..nranks).map(|_| None).collect();
            self.idle_deadline = Instant::now() + self.timeout;
        }
        let listen = g.addr.expect("checked above");
        self.ranks[rank] = Some(Joined {
            stream: p.stream,
            from: p.from,
            listen,
            host: g.host,
        });
        self.joined += 1;
        info!(
            "bootstrap root at {}: rank {rank} joined from {} ({} of {nranks})",
            self.addr, p.from, self.joined
        );
    }

    /// A joined rank's socket became readable: it left (or broke protocol) before the table was sent, so
    /// the job cannot complete. Every waiting rank is told why now; later ones until the timeout.
    fn check_joined(&mut self, rank: usize) {
        let Some(j) = &self.ranks[rank] else { return };
        let mut byte = [0u8; 1];
        let why = match sys::recv_now(&j.stream, &mut byte) {
            Ok(0) => "closed its connection (its process ended, or its init gave up)".to_string(),
            Ok(_) => "sent unexpected bytes".to_string(),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => e.to_string(),
        };
        let mut reason = format!(
            "rank {rank} (from {}) left before all {} ranks arrived: {why}",
            j.from,
            self.ranks.len()
        );
        let missing = self.missing();
        if !missing.is_empty() {
            reason.push_str(&format!("; {} had not arrived", list_ranks(&missing)));
        }
        self.give_up(reason);
    }

    /// The ranks that have not joined.
    fn missing(&self) -> Vec<usize> {
        (0..self.ranks.len()).filter(|&r| self.ranks[r].is_none()).collect()
    }

    /// Tells every waiting rank why the job failed, and answers the job's later ranks the same until a
    /// timeout from now (rather than leave them to wait out theirs for a root that is gone).
    fn give_up(&mut self, reason: String) {
        self.abort(reason.clone());
        self.ranks.iter_mut().for_each(|j| *j = None);
        self.joined = 0;
        self.failed = Some(reason);
        self.idle_deadline = Instant::now() + self.timeout;
    }

    /// Each rank's rows: its own and its neighbours' (what its set-up connects), every rank's for rank 0,
    /// which passes the whole table on down the tree of neighbours.
    fn send_table(&mut self) {
        let n = self.ranks.len();
        let rows: Vec<[u8; wire::TABLE_ROW_LEN]> = self
            .ranks
            .iter()
            .enumerate()
            .map(|(r, j)| {
                let j = j.as_ref().expect("every rank joined");
                wire::encode_table_row(r, Some(j.listen), j.host)
            })
            .collect();
        let whole = rows.concat();
        for (rank, j) in self.ranks.iter_mut().enumerate() {
            let j = j.as_mut().expect("every rank joined");
            let table = if rank == 0 {
                whole.clone()
            } else {
                super::topology::set_up_rows(rank, n)
                    .into_iter()
                    .flat_map(|r| rows[r])
                    .collect()
            };
            self.table_bytes.fetch_add(table.len() as u64, Ordering::SeqCst);
            if let Err(e) = wire::write_reply(&mut j.stream, self.magic, rank, n, wire::STATUS_OK, &table) {
                warn!(
                    "bootstrap root at {}: sending the table to rank {rank} at {} failed: {e}",
                    self.addr, j.from
                );
            }
        }
        info!(
            "bootstrap root at {}: all {n} ranks arrived; sent their rows ({} bytes) and exiting",
            self.addr,
            self.table_bytes.load(Ordering::SeqCst)
        );
    }

    /// Tells every waiting rank why the root gives up.
    fn abort(&mut self, reason: String) {
        warn!("bootstrap root at {}: giving up: {reason}", self.addr);
        for j in self.ranks.iter_mut().flatten() {
            let _ = wire::write_rejection(&mut j.stream, self.magic, wire::STATUS_ABORTED, &reason);
        }
        debug!("bootstrap root at {}: exiting", self.addr);
    }
}
