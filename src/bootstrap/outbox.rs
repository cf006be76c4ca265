//! The sending side of one peer connection, shared by the rank's threads (messages, blocking) and its
//! receive thread (heartbeats and abort notices, never blocking).
//!
//! A thread sending a message holds the connection for the whole frame, which may take long (a large
//! message to a slow reader, or a stopped peer). The receive thread therefore never waits for it: its
//! control frames go out at once when the connection is free (`pump`, with non-blocking sends; a frame
//! that fits only in part keeps its tail in `unsent`, which goes out before anything else), and otherwise
//! wait in `control` for whichever thread gets the connection next. While a message is being written,
//! its bytes are the sign of life, so no heartbeat is needed.

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
}

impl Outbox {
    /// Installs the connection once its handshake is done.
    pub fn connect(&self, stream: TcpStream) {
        self.out.lock().stream = Some(stream);
    }

    /// Writes one frame, `header` then `data` (one write when `coalesce`), after any control bytes
    /// waiting, blocking until it is all handed to the socket. An error leaves the connection unusable
    /// (a partly written frame would garble the stream): later sends fail. `Err(NotConnected)` when there
    /// is no connection.
    pub fn send_frame(&self, header: &[u8], data: &[u8], coalesce: bool) -> io::Result<()> {
        let mut out = self.out.lock();
        if out.stream.is_none() {
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
        if out.stream.is_none() {
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

    /// Whether the connection is open (made, and not closed yet).
    pub fn is_open(&self) -> bool {
        self.out.lock().stream.is_some()
    }

    /// Sends `last` and everything queued before it, waiting for room in the socket until `deadline` at
    /// the latest (a stopped peer never makes room), then closes the connection both ways.
    pub fn close_by(&self, last: &[u8], deadline: Instant) {
        let mut out = self.out.lock();
        let Some(stream) = out.stream.take() else {
            return;
        };
        let mut unsent = std::mem::take(&mut out.unsent);
        unsent.extend_from_slice(&std::mem::take(&mut *self.control.lock()));
        unsent.extend_from_slice(last);
        while !unsent.is_empty() {
            match sys::send_now(&stream, &unsent) {
                Ok(n) => {
                    unsent.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let mut entry = [PollEntry::writable(&stream)];
                    if sys::poll(&mut entry, Some(left)).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = stream.shutdown(Shutdown::Both);
    }
}
