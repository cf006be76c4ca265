//! The sending side of one peer connection, shared by the rank's threads (messages, blocking) and its
//! receive thread (heartbeats and abort notices, never blocking).
//!
//! A thread sending a message holds the connection for the whole frame, which may take long (a large
//! message to a slow reader, or a stopped peer). The receive thread therefore never waits for it: its
//! control frames go out at once when the connection is free (`pump`, with non-blocking sends; a frame
//! that fits only in part keeps its tail in `unsent`, which goes out before anything else), and otherwise
//! wait in `control` for whichever thread gets the connection next. While a message is being written,
//! its bytes are the sign of life, so no heartbeat is needed.
//!
//! Connections are made where they are needed: a peer that is not one of the rank's neighbours
//! (`topology::neighbours`, connected at set-up) is connected when the rank first sends to it, or when the
//! peer first sends to the rank. Both may do so at once: then the pair has two connections, each side
//! sends on the first it had (so that its messages stay in order) and reads both; the other waits in
//! `offered`, and gets the goodbye too when the rank closes.

use super::sys::{self, PollEntry};
use super::wire::{self, Space};
use parking_lot::Mutex;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Instant;

/// The connection and the tail of a control frame that did not fit at once.
#[derive(Default)]
struct Out {
    stream: Option<TcpStream>,
    unsent: Vec<u8>,
    /// A send failed on the connection: it is unusable, and no other is made (the peer is failing).
    broken: bool,
}

impl Out {
    /// Writes `unsent` and then `queued` (whole control frames), waiting as long as it takes.
    fn write_pending(&mut self, queued: &Mutex<Vec<u8>>) -> io::Result<()> {
        let more = std::mem::take(&mut *queued.lock());
        self.unsent.extend_from_slice(&more);
        if self.unsent.is_empty() {
            return Ok(());
        }
        let stream = self.stream.as_mut().ok_or(io::ErrorKind::NotConnected)?;
        stream.write_all(&self.unsent)?;
        self.unsent.clear();
        Ok(())
    }
}

/// The sending side of one peer connection.
#[derive(Default)]
pub struct Outbox {
    out: Mutex<Out>,
    /// Whole control frames waiting for the connection; locked only briefly, never during I/O.
    control: Mutex<Vec<u8>>,
    /// The sending side of connections the peer opened, not (yet) the one this rank sends on; locked only
    /// briefly, never during I/O, so that the receive thread that accepts them never waits.
    offered: Mutex<Vec<TcpStream>>,
    /// Held by the one thread that makes the connection when the rank first sends to the peer.
    connecting: Mutex<()>,
}

impl Outbox {
    /// Installs the connection once its handshake is done (this rank opened it, and sends on it).
    pub fn connect(&self, stream: TcpStream) {
        self.out.lock().stream = Some(stream);
    }

    /// Offers the sending side of a connection the peer opened: it becomes the one this rank sends on
    /// unless there is one already (the next send or pump looks). Never waits.
    pub fn offer(&self, stream: TcpStream) {
        self.offered.lock().push(stream);
    }

    /// Makes sure there is a connection to send on: one there already, one offered, or, if none, the one
    /// `make` opens (called at most by one thread at a time, without the connection's lock held, so that
    /// the receive thread's pumps go on). `Err(NotConnected)` once a send has failed.
    pub fn ensure(&self, make: impl FnOnce() -> crate::error::Result<TcpStream>) -> crate::error::Result<()> {
        if self.ready()? {
            return Ok(());
        }
        let _one = self.connecting.lock();
        if self.ready()? {
            return Ok(());
        }
        let stream = make()?;
        let mut out = self.out.lock();
        if out.stream.is_none() {
            out.stream = Some(stream);
        } else {
            // Installed meanwhile from an offer: keep this one as a spare, to say goodbye on.
            self.offered.lock().push(stream);
        }
        Ok(())
    }

    /// Whether there is a connection to send on, installing an offered one if needed.
    fn ready(&self) -> crate::error::Result<bool> {
        let mut out = self.out.lock();
        if out.broken {
            return Err(crate::error::Error::remote("the connection is broken"));
        }
        Ok(out.stream.is_some() || install_offered(&mut out, &self.offered))
    }

    /// Writes one frame, `header` then `data` (one write when `coalesce`), after any control bytes
    /// waiting, blocking until it is all handed to the socket. An error leaves the connection unusable
    /// (a partly written frame would garble the stream): later sends fail. `Err(NotConnected)` when there
    /// is no connection.
    pub fn send_frame(&self, header: &[u8], data: &[u8], coalesce: bool) -> io::Result<()> {
        let mut out = self.out.lock();
        if out.stream.is_none() && (out.broken || !install_offered(&mut out, &self.offered)) {
            return Err(io::ErrorKind::NotConnected.into());
        }
        let sent = out.write_pending(&self.control).and_then(|()| {
            // Never `write_vectored`: std's plain `write` passes MSG_NOSIGNAL, so a closed peer is an error
            // and not a SIGPIPE that kills the application.
            let stream = out.stream.as_mut().expect("checked above");
            if coalesce {
                let mut frame = Vec::with_capacity(header.len() + data.len());
                frame.extend_from_slice(header);
                frame.extend_from_slice(data);
                stream.write_all(&frame)
            } else {
                stream.write_all(header).and_then(|()| stream.write_all(data))
            }
        });
        // Control frames queued while this one was being written go right behind it.
        let sent = sent.and_then(|()| out.write_pending(&self.control));
        if sent.is_err() {
            out.stream = None;
            out.broken = true;
        }
        sent
    }

    /// Queues a whole control frame; `pump` or the next message sends it.
    pub fn queue(&self, frame: &[u8]) {
        self.control.lock().extend_from_slice(frame);
    }

    /// Sends what is queued, and a heartbeat if `heartbeat` and nothing else goes out, without ever
    /// waiting: if another thread is writing a message, the queue waits for it. An error means the
    /// connection broke (the reader sees that too).
    pub fn pump(&self, heartbeat: bool) -> io::Result<()> {
        let Some(mut out) = self.out.try_lock() else {
            return Ok(());
        };
        if out.stream.is_none() && (out.broken || !install_offered(&mut out, &self.offered)) {
            return Ok(());
        }
        let more = std::mem::take(&mut *self.control.lock());
        out.unsent.extend_from_slice(&more);
        if heartbeat && out.unsent.is_empty() {
            out.unsent = wire::control_frame(Space::Heartbeat);
        }
        let out = &mut *out;
        let stream = out.stream.as_ref().expect("checked above");
        while !out.unsent.is_empty() {
            match sys::send_now(stream, &out.unsent) {
                Ok(n) => {
                    out.unsent.drain(..n);
                }
                // The peer does not read (stopped, or slow): the rest goes at the next pump.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether a connection is open (made, and not closed yet).
    pub fn is_open(&self) -> bool {
        self.out.lock().stream.is_some() || !self.offered.lock().is_empty()
    }

    /// Sends `last` and everything queued before it, waiting for room in the socket until `deadline` at
    /// the latest (a stopped peer never makes room), then closes the connection both ways.
    pub fn close_by(&self, last: &[u8], deadline: Instant) {
        let mut out = self.out.lock();
        // The spares first (nothing else was sent on them), so that the goodbye on the connection in use
        // comes last.
        for spare in std::mem::take(&mut *self.offered.lock()) {
            write_by(&spare, last.to_vec(), deadline);
        }
        let Some(stream) = out.stream.take() else {
            return;
        };
        let mut unsent = std::mem::take(&mut out.unsent);
        unsent.extend_from_slice(&std::mem::take(&mut *self.control.lock()));
        unsent.extend_from_slice(last);
        write_by(&stream, unsent, deadline);
    }
}

/// Moves the first offered connection into `out`; false if none was offered.
fn install_offered(out: &mut Out, offered: &Mutex<Vec<TcpStream>>) -> bool {
    let mut offered = offered.lock();
    if offered.is_empty() {
        return false;
    }
    out.stream = Some(offered.remove(0));
    true
}

/// Writes `unsent`, waiting for room in the socket until `deadline` at the latest, then shuts the
/// connection down both ways.
fn write_by(stream: &TcpStream, mut unsent: Vec<u8>, deadline: Instant) {
    while !unsent.is_empty() {
        match sys::send_now(stream, &unsent) {
            Ok(n) => {
                unsent.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                let mut entry = [PollEntry::writable(stream)];
                if sys::poll(&mut entry, Some(left)).is_err() {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}
