//! What the bootstrap sends over TCP, byte by byte, and the blocking socket helpers with deadlines.
//!
//! Every connection starts with a fixed-size greeting: a rank to the root (`RootHello`), a rank to a peer
//! (`PeerHello`), and the answer to either (`Reply`, followed by `payload_len` bytes: the address table,
//! or the reason for turning the connection away). After a peer handshake, each side sends frames: a
//! 24-byte header (space, tag, length) and the payload. Besides messages (user, all-gather, barrier),
//! frames carry the connection's control: heartbeats, a goodbye before an orderly close, and abort notices
//! (see `Notice`). All integers are little-endian, written and read with the library's codec.

use super::sys;
use crate::codec::{Reader, Writer};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::time::{Duration, Instant};

/// First bytes of every greeting; anything else is a stranger.
pub const GREETING_TAG: [u8; 8] = *b"MSCLBOOT";
/// Bumped whenever the wire format changes (2: heartbeat, goodbye and abort frames; 3: split and
/// registration-record frames, which a version 2 peer would refuse as frames of an unknown kind; 4: hosts in
/// the table; 5: connections between neighbours only at set-up, any other made when first needed, by either
/// rank, and abort notices that name the rank that aborted, passed on from rank to rank; 6: the root's table
/// in rows that name their rank, each rank sent only its own and its neighbours' (rank 0 every one), and the
/// whole table passed down the binomial tree of neighbours in `Table` frames).
pub const PROTOCOL_VERSION: u32 = 6;
pub const GREETING_LEN: usize = 80;
pub const ADDR_LEN: usize = 28;
/// One rank's entry in the root's table: its listen address, then its host (`Greeting::host`).
pub const TABLE_ENTRY_LEN: usize = ADDR_LEN + 8;
/// A row of a table: the rank, then its entry (`encode_table_row`).
pub const TABLE_ROW_LEN: usize = 4 + TABLE_ENTRY_LEN;
pub const FRAME_HEADER_LEN: usize = 24;
/// Longest reason for a rejection we send or accept.
pub const MAX_REASON_LEN: usize = 1024;
/// Most ranks a job may have; bounds the address table a rank allocates.
pub const MAX_RANKS: usize = 1 << 16;
/// Longest frame payload we accept (far above any real all-gather block).
pub const MAX_FRAME_LEN: u64 = 1 << 40;
/// Longest payload of a control frame (heartbeat, goodbye, abort notice).
pub const MAX_CONTROL_LEN: u64 = 4096;

/// What a greeting is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    RootHello = 1,
    PeerHello = 2,
    Reply = 3,
}

/// The status of a `Reply`.
pub const STATUS_OK: u32 = 0;
/// The receiver's arguments disagree with the job (wrong magic, nranks, rank, duplicate).
pub const STATUS_REJECTED: u32 = 1;
/// The root gave up (a rank never came) or was stopped.
pub const STATUS_ABORTED: u32 = 2;

/// The fixed-size message that opens every connection, and answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Greeting {
    pub kind: Kind,
    pub version: u32,
    pub magic: u64,
    pub rank: u32,
    pub nranks: u32,
    /// `PeerHello`: the rank the sender wants to reach. `Reply`: the status.
    pub aux: u32,
    /// Bytes following a `Reply`.
    pub payload_len: u32,
    /// `RootHello`: the sender's listen address.
    pub addr: Option<SocketAddr>,
    /// `RootHello`: the sender's host (`gpu::ProcessId`'s: a hash of the boot id and host name), which the
    /// root's table passes on, so that every rank knows which ranks share its machine without another round.
    pub host: u64,
}

impl Greeting {
    pub fn new(kind: Kind, magic: u64, rank: usize, nranks: usize) -> Greeting {
        Greeting {
            kind,
            version: PROTOCOL_VERSION,
            magic,
            rank: rank as u32,
            nranks: nranks as u32,
            aux: 0,
            payload_len: 0,
            addr: None,
            host: 0,
        }
    }

    pub fn encode(&self) -> [u8; GREETING_LEN] {
        let mut w = Writer::with_capacity(GREETING_LEN);
        w.bytes(&GREETING_TAG)
            .u32(self.version)
            .u32(self.kind as u32)
            .u64(self.magic)
            .u32(self.rank)
            .u32(self.nranks)
            .u32(self.aux)
            .u32(self.payload_len)
            .bytes(&encode_addr(self.addr))
            .u64(self.host)
            .u32(0);
        fixed(w)
    }

    /// Decodes a greeting; the error says why the bytes are not one (a stranger).
    pub fn decode(b: &[u8; GREETING_LEN]) -> Result<Greeting, String> {
        let mut r = Reader::new(b, "bootstrap greeting");
        if r.take::<8>().map_err(why)? != GREETING_TAG {
            return Err("not a bootstrap greeting".into());
        }
        let version = r.u32().map_err(why)?;
        let kind = match r.u32().map_err(why)? {
            1 => Kind::RootHello,
            2 => Kind::PeerHello,
            3 => Kind::Reply,
            k => return Err(format!("unknown greeting kind {k}")),
        };
        let magic = r.u64().map_err(why)?;
        let rank = r.u32().map_err(why)?;
        let nranks = r.u32().map_err(why)?;
        let aux = r.u32().map_err(why)?;
        let payload_len = r.u32().map_err(why)?;
        let addr = decode_addr(&r.take::<ADDR_LEN>().map_err(why)?)?;
        let host = r.u64().map_err(why)?;
        if r.u32().map_err(why)? != 0 {
            return Err("reserved greeting bytes are not zero".into());
        }
        r.finish().map_err(why)?;
        Ok(Greeting {
            kind,
            version,
            magic,
            rank,
            nranks,
            aux,
            payload_len,
            addr,
            host,
        })
    }
}

/// The bytes of a fixed-size message, written by a `Writer` that wrote exactly `N` of them.
fn fixed<const N: usize>(w: Writer) -> [u8; N] {
    w.into_bytes()
        .try_into()
        .unwrap_or_else(|b: Vec<u8>| panic!("a fixed-size message of {N} bytes came out as {}", b.len()))
}

/// The text of a codec error, for the decoders here that report why as a string.
fn why(e: crate::error::Error) -> String {
    e.message
}

/// One rank's entry of the root's table: its listen address and its host.
pub fn encode_table_entry(addr: Option<SocketAddr>, host: u64) -> [u8; TABLE_ENTRY_LEN] {
    let mut w = Writer::with_capacity(TABLE_ENTRY_LEN);
    w.bytes(&encode_addr(addr)).u64(host);
    fixed(w)
}

/// One row of a table the root sends: a rank (4 bytes, little-endian) and its entry (`encode_table_entry`).
/// A table is any set of rows: a rank gets its own and its neighbours' rows from the root, rank 0 every
/// rank's.
pub fn encode_table_row(rank: usize, addr: Option<SocketAddr>, host: u64) -> [u8; TABLE_ROW_LEN] {
    let mut row = [0u8; TABLE_ROW_LEN];
    row[..4].copy_from_slice(&(rank as u32).to_le_bytes());
    row[4..].copy_from_slice(&encode_table_entry(addr, host));
    row
}

/// Every row of a table of `encode_table_row`s: rank, address and host, in the table's order.
pub fn decode_table_rows(table: &[u8]) -> Result<Vec<(usize, Option<SocketAddr>, u64)>, String> {
    if !table.len().is_multiple_of(TABLE_ROW_LEN) {
        return Err(format!(
            "a table of {} bytes is not rows of {TABLE_ROW_LEN}",
            table.len()
        ));
    }
    table
        .chunks_exact(TABLE_ROW_LEN)
        .map(|row| {
            let rank = u32::from_le_bytes(row[..4].try_into().expect("4 bytes")) as usize;
            let (addr, host) = row[4..].split_at(ADDR_LEN);
            let host = u64::from_le_bytes(host.try_into().expect("8 bytes after the address"));
            Ok((rank, decode_addr(addr.try_into().expect("ADDR_LEN bytes"))?, host))
        })
        .collect()
}

/// Rank `rank`'s entry in a table of `encode_table_row`s: its address and host (the tests' fake ranks).
#[cfg(test)]
pub fn decode_table_entry(table: &[u8], rank: usize) -> Result<(Option<SocketAddr>, u64), String> {
    decode_table_rows(table)?
        .into_iter()
        .find(|row| row.0 == rank)
        .map(|(_, addr, host)| (addr, host))
        .ok_or_else(|| format!("no entry for rank {rank} in a table of {} bytes", table.len()))
}

/// Encodes an address in 28 bytes: family (0 none, 4, 6), zero, port, 16 address bytes (an IPv4
/// address in the first 4), scope, flow.
pub fn encode_addr(addr: Option<SocketAddr>) -> [u8; ADDR_LEN] {
    let mut w = Writer::with_capacity(ADDR_LEN);
    match addr {
        None => {
            w.bytes(&[0; ADDR_LEN]);
        }
        Some(SocketAddr::V4(a)) => {
            w.u8(4)
                .u8(0)
                .u16(a.port())
                .bytes(&a.ip().octets())
                .bytes(&[0; 12])
                .u32(0)
                .u32(0);
        }
        Some(SocketAddr::V6(a)) => {
            w.u8(6)
                .u8(0)
                .u16(a.port())
                .bytes(&a.ip().octets())
                .u32(a.scope_id())
                .u32(a.flowinfo());
        }
    }
    fixed(w)
}

/// Decodes `encode_addr`'s bytes; anything it would not have written is an error.
pub fn decode_addr(b: &[u8; ADDR_LEN]) -> Result<Option<SocketAddr>, String> {
    let mut r = Reader::new(b, "socket address");
    let (family, zero, port) = (r.u8().map_err(why)?, r.u8().map_err(why)?, r.u16().map_err(why)?);
    let ip: [u8; 16] = r.take().map_err(why)?;
    let (scope, flow) = (r.u32().map_err(why)?, r.u32().map_err(why)?);
    r.finish().map_err(why)?;
    let addr = match family {
        0 if b.iter().all(|&x| x == 0) => return Ok(None),
        4 if zero == 0 && ip[4..].iter().all(|&x| x == 0) && scope == 0 && flow == 0 => {
            let ip = Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        }
        6 if zero == 0 => SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, flow, scope)),
        _ => return Err("malformed socket address".into()),
    };
    if port == 0 || addr.ip().is_unspecified() {
        return Err(format!("unusable socket address {addr}"));
    }
    Ok(Some(addr))
}

/// Which collective or user message a frame belongs to; keeps internal traffic apart from user tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    User = 0,
    AllGather = 1,
    Barrier = 2,
    /// A sign of life, without payload.
    Heartbeat = 3,
    /// The sender closes the connection on purpose (it destroys its endpoint); without payload.
    Goodbye = 4,
    /// An abort notice (`Notice`).
    Abort = 5,
    /// Messages of communicator splits and shrinks (`Bootstrap::send_split`): the survivors of a failure
    /// agree on their new communicator through them, so they are delivered and may be waited for after
    /// the job failed.
    Split = 6,
    /// Registration records of the zero-copy collectives (`Bootstrap::push_registration_record`): pushed
    /// without being asked for, and taken without waiting, whenever the peer likes, so they have a queue
    /// of their own that no `recv` or collective ever looks at.
    Registration = 7,
    /// The root's whole table (rows of `encode_table_row`), passed down the binomial tree of neighbours from
    /// rank 0 at the end of set-up (`Bootstrap::connect_watching`).
    Table = 8,
}

impl Space {
    /// Control frames are handled by the receive thread and never reach the mailbox.
    pub fn is_control(self) -> bool {
        matches!(self, Space::Heartbeat | Space::Goodbye | Space::Abort)
    }
}

/// The mailbox key of a message: its space and tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub space: Space,
    pub tag: u64,
}

impl Key {
    pub fn user(tag: u64) -> Key {
        Key {
            space: Space::User,
            tag,
        }
    }

    pub fn split(tag: u64) -> Key {
        Key {
            space: Space::Split,
            tag,
        }
    }

    /// The one key of registration records: a peer takes them all, in the order they were pushed.
    pub fn registration() -> Key {
        Key {
            space: Space::Registration,
            tag: 0,
        }
    }
}

pub fn encode_frame_header(key: Key, len: u64) -> [u8; FRAME_HEADER_LEN] {
    let mut w = Writer::with_capacity(FRAME_HEADER_LEN);
    w.u32(key.space as u32).u32(0).u64(key.tag).u64(len);
    fixed(w)
}

/// Decodes a frame header, refusing unknown spaces and lengths past `MAX_FRAME_LEN`.
pub fn decode_frame_header(b: &[u8; FRAME_HEADER_LEN]) -> Result<(Key, u64), String> {
    let mut r = Reader::new(b, "bootstrap frame header");
    let space = match r.u32().map_err(why)? {
        0 => Space::User,
        1 => Space::AllGather,
        2 => Space::Barrier,
        3 => Space::Heartbeat,
        4 => Space::Goodbye,
        5 => Space::Abort,
        6 => Space::Split,
        7 => Space::Registration,
        8 => Space::Table,
        s => return Err(format!("frame of unknown kind {s}")),
    };
    if r.u32().map_err(why)? != 0 {
        return Err("reserved frame bytes are not zero".into());
    }
    let tag = r.u64().map_err(why)?;
    let len = r.u64().map_err(why)?;
    r.finish().map_err(why)?;
    if len > MAX_FRAME_LEN {
        return Err(format!("frame of {len} bytes exceeds the limit of {MAX_FRAME_LEN}"));
    }
    if space.is_control() && len > MAX_CONTROL_LEN {
        return Err(format!(
            "{space:?} frame of {len} bytes exceeds the limit of {MAX_CONTROL_LEN}"
        ));
    }
    Ok((Key { space, tag }, len))
}

/// A whole frame without payload (heartbeat, goodbye).
pub fn control_frame(space: Space) -> Vec<u8> {
    encode_frame_header(Key { space, tag: 0 }, 0).to_vec()
}

/// What an abort notice says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The sender declared rank `rank` dead: `how` says how it noticed, `silent_ms` how long it had not
    /// heard from it then.
    Dead {
        rank: u32,
        how: String,
        silent_ms: Option<u64>,
    },
    /// Rank `rank`'s application aborted its communicator (the sender, or a rank that told it).
    Aborted { rank: u32 },
}

const NOTICE_DEAD: u32 = 1;
const NOTICE_ABORTED: u32 = 2;
/// Longest `how` of a notice.
const MAX_NOTICE_TEXT: usize = 1024;

impl Notice {
    /// The whole frame: header and payload (kind, rank, milliseconds of silence or `u64::MAX`, text).
    pub fn frame(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            Notice::Dead { rank, how, silent_ms } => {
                let mut end = how.len().min(MAX_NOTICE_TEXT);
                while !how.is_char_boundary(end) {
                    end -= 1;
                }
                w.u32(NOTICE_DEAD)
                    .u32(*rank)
                    .u64(silent_ms.unwrap_or(u64::MAX))
                    .string(&how.as_bytes()[..end]);
            }
            Notice::Aborted { rank } => {
                w.u32(NOTICE_ABORTED).u32(*rank).u64(u64::MAX).string(&[]);
            }
        }
        let payload = w.into_bytes();
        let key = Key {
            space: Space::Abort,
            tag: 0,
        };
        let mut frame = encode_frame_header(key, payload.len() as u64).to_vec();
        frame.extend_from_slice(&payload);
        frame
    }

    /// Decodes a notice's payload.
    pub fn decode(payload: &[u8]) -> Result<Notice, String> {
        let mut r = Reader::new(payload, "abort notice");
        let kind = r.u32().map_err(why)?;
        let rank = r.u32().map_err(why)?;
        let silent_ms = Some(r.u64().map_err(why)?).filter(|&ms| ms != u64::MAX);
        let how = String::from_utf8_lossy(r.string(MAX_NOTICE_TEXT).map_err(why)?).into_owned();
        r.finish().map_err(why)?;
        match kind {
            NOTICE_DEAD => Ok(Notice::Dead { rank, how, silent_ms }),
            NOTICE_ABORTED => Ok(Notice::Aborted { rank }),
            k => Err(format!("abort notice of unknown kind {k}")),
        }
    }
}

/// The time left until `deadline`, or a `TimedOut` error once it has passed.
pub fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
    }
    Ok(left)
}

/// Connects to `addr`, retrying while nobody listens there yet, until `deadline`.
pub fn connect_by(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    connect_retrying(addr, deadline, true)
}

/// Connects to a listener known to have been listening (a peer's, whose address came in the root's
/// table: each rank listens before it says hello): a refusal means it is gone (its process ended or its
/// init gave up), so it fails at once instead of being retried until `deadline`.
pub fn connect_to_listening(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    connect_retrying(addr, deadline, false).map_err(|e| {
        if e.kind() == io::ErrorKind::ConnectionRefused {
            io::Error::new(
                e.kind(),
                format!("{e}: it listened there when it joined, so its process ended or its init gave up"),
            )
        } else {
            e
        }
    })
}

fn connect_retrying(addr: SocketAddr, deadline: Instant, retry_refused: bool) -> io::Result<TcpStream> {
    let mut backoff = Duration::from_millis(10);
    loop {
        let left = time_left(deadline)?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) if is_transient(&e) && (retry_refused || e.kind() != io::ErrorKind::ConnectionRefused) => {
                // Keep the last error for the message if the deadline passes while we sleep.
                if deadline.saturating_duration_since(Instant::now()) <= backoff {
                    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("timed out; last attempt: {e}"),
                    ));
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Errors that mean "not there yet": worth retrying until the deadline.
fn is_transient(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | TimedOut
            | Interrupted
            | HostUnreachable
            | NetworkUnreachable
    )
}

/// Fills `buf` from a blocking stream before `deadline`: `TimedOut` past it, `UnexpectedEof` if the
/// other side closes first.
pub fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        stream.set_read_timeout(Some(time_left(deadline)?))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
            }
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    stream.set_read_timeout(None)
}

/// Writes a `Reply`: status, an optional reason or table, and our rank and nranks.
pub fn write_reply(
    stream: &mut TcpStream,
    magic: u64,
    rank: usize,
    nranks: usize,
    status: u32,
    payload: &[u8],
) -> io::Result<()> {
    let mut reply = Greeting::new(Kind::Reply, magic, rank, nranks);
    reply.aux = status;
    reply.payload_len = payload.len() as u32;
    let mut bytes = reply.encode().to_vec();
    bytes.extend_from_slice(payload);
    // A reply is small and goes to a fresh socket, so the write finishes at once unless the other side
    // is a stranger that stopped reading; the timeout bounds that case.
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(&bytes)?;
    // The socket may go on to carry frames, whose writes wait as long as the peer is alive.
    stream.set_write_timeout(None)
}

/// Writes a rejection, truncating the reason to what the receiver accepts.
pub fn write_rejection(stream: &mut TcpStream, magic: u64, status: u32, reason: &str) -> io::Result<()> {
    let mut end = reason.len().min(MAX_REASON_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    write_reply(stream, magic, 0, 0, status, &reason.as_bytes()[..end])
}

/// Reads the answer to a greeting before `deadline`: `Ok(payload)` for an accepted greeting,
/// `Err(Refusal)` for a rejection or for bytes that are not a reply.
pub fn read_reply(
    stream: &mut TcpStream,
    deadline: Instant,
    max_payload: usize,
) -> Result<(Greeting, Vec<u8>), Refusal> {
    let mut head = [0u8; GREETING_LEN];
    read_exact_by(stream, &mut head, deadline).map_err(Refusal::Io)?;
    let reply = Greeting::decode(&head).map_err(Refusal::Garbage)?;
    if reply.kind != Kind::Reply || reply.version != PROTOCOL_VERSION {
        return Err(Refusal::Garbage(format!(
            "expected a version {PROTOCOL_VERSION} reply, got {reply:?}"
        )));
    }
    let limit = if reply.aux == STATUS_OK {
        max_payload
    } else {
        MAX_REASON_LEN
    };
    if reply.payload_len as usize > limit {
        return Err(Refusal::Garbage(format!(
            "reply payload of {} bytes exceeds {limit}",
            reply.payload_len
        )));
    }
    let mut payload = vec![0u8; reply.payload_len as usize];
    read_exact_by(stream, &mut payload, deadline).map_err(Refusal::Io)?;
    match reply.aux {
        STATUS_OK => Ok((reply, payload)),
        status => Err(Refusal::Rejected {
            status,
            reason: String::from_utf8_lossy(&payload).into_owned(),
        }),
    }
}

/// Why a greeting was not accepted.
#[derive(Debug)]
pub enum Refusal {
    Io(io::Error),
    Garbage(String),
    Rejected { status: u32, reason: String },
}

/// Reads a greeting from a socket a poll loop watches, a piece at a time, so that a slow or silent
/// stranger never blocks the loop.
pub struct GreetingReader {
    buf: [u8; GREETING_LEN],
    filled: usize,
}

impl Default for GreetingReader {
    fn default() -> Self {
        GreetingReader {
            buf: [0; GREETING_LEN],
            filled: 0,
        }
    }
}

impl GreetingReader {
    /// Reads what is available: `Ok(Some(bytes))` once all 72 bytes are in, `Ok(None)` to wait for more.
    pub fn advance(&mut self, stream: &TcpStream) -> io::Result<Option<[u8; GREETING_LEN]>> {
        while self.filled < GREETING_LEN {
            match sys::recv_now(stream, &mut self.buf[self.filled..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "closed before finishing its greeting",
                    ));
                }
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(self.buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn greetings_round_trip() {
        let mut g = Greeting::new(Kind::RootHello, 0x1234_5678_9abc_def0, 3, 8);
        g.aux = 9;
        g.payload_len = 100;
        g.addr = Some("10.0.0.1:4242".parse().unwrap());
        assert_eq!(Greeting::decode(&g.encode()).unwrap(), g);
        g.addr = Some(SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 7, 3, 5)));
        assert_eq!(Greeting::decode(&g.encode()).unwrap(), g);
        g.addr = None;
        assert_eq!(Greeting::decode(&g.encode()).unwrap(), g);
    }

    #[test]
    fn the_bytes_are_where_the_format_puts_them() {
        let mut g = Greeting::new(Kind::PeerHello, 0x0102_0304_0506_0708, 9, 10);
        g.aux = 11;
        g.payload_len = 12;
        g.addr = Some("1.2.3.4:258".parse().unwrap());
        let b = g.encode();
        assert_eq!(&b[0..8], b"MSCLBOOT");
        assert_eq!(b[8..12], PROTOCOL_VERSION.to_le_bytes());
        assert_eq!(b[12..16], 2u32.to_le_bytes());
        assert_eq!(b[16..24], 0x0102_0304_0506_0708u64.to_le_bytes());
        for (at, v) in [(24, 9u32), (28, 10), (32, 11), (36, 12)] {
            assert_eq!(b[at..at + 4], v.to_le_bytes(), "offset {at}");
        }
        assert_eq!(b[40..48], [4, 0, 2, 1, 1, 2, 3, 4]);
        assert!(b[48..].iter().all(|&x| x == 0));
        let v6 = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 7, 0x0a0b, 0x0c0d));
        let a = encode_addr(Some(v6));
        assert_eq!(a[0..4], [6, 0, 7, 0]);
        assert_eq!(a[4], 0xfe);
        assert_eq!(a[19], 1);
        assert_eq!(a[20..24], 0x0c0du32.to_le_bytes());
        assert_eq!(a[24..28], 0x0a0bu32.to_le_bytes());
        let h = encode_frame_header(
            Key {
                space: Space::Barrier,
                tag: 0x1122,
            },
            0x33,
        );
        assert_eq!(h[0..8], [2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(h[8..16], 0x1122u64.to_le_bytes());
        assert_eq!(h[16..24], 0x33u64.to_le_bytes());
    }

    #[test]
    fn garbage_greetings_are_refused() {
        let good = Greeting::new(Kind::PeerHello, 1, 0, 2).encode();
        let mut b = good;
        b[0] = b'X';
        assert!(Greeting::decode(&b).unwrap_err().contains("not a bootstrap greeting"));
        let mut b = good;
        b[12] = 77;
        assert!(Greeting::decode(&b).unwrap_err().contains("unknown greeting kind"));
        // The reserved bytes after the host must be zero.
        let mut b = good;
        b[78] = 1;
        assert!(Greeting::decode(&b).is_err());
        // The host travels whole.
        let mut hello = Greeting::new(Kind::RootHello, 1, 0, 2);
        hello.host = 0x0123_4567_89ab_cdef;
        assert_eq!(Greeting::decode(&hello.encode()).unwrap().host, hello.host);
        let mut b = good;
        b[40] = 5;
        assert!(Greeting::decode(&b).unwrap_err().contains("malformed"));
        assert!(Greeting::decode(&[0xAB; GREETING_LEN]).is_err());
    }

    #[test]
    fn table_entries_carry_an_address_and_a_host() {
        let a: SocketAddr = "1.2.3.4:5".parse().unwrap();
        // Rows name their rank: a table holds some ranks, in any order.
        let mut table = encode_table_row(5, Some(a), 7).to_vec();
        table.extend_from_slice(&encode_table_row(0, None, u64::MAX));
        assert_eq!(decode_table_entry(&table, 5).unwrap(), (Some(a), 7));
        assert_eq!(decode_table_entry(&table, 0).unwrap(), (None, u64::MAX));
        assert_eq!(
            decode_table_rows(&table).unwrap(),
            vec![(5, Some(a), 7), (0, None, u64::MAX)]
        );
        assert!(
            decode_table_entry(&table, 2)
                .unwrap_err()
                .contains("no entry for rank 2")
        );
        table.pop();
        assert!(decode_table_rows(&table).unwrap_err().contains("not rows of"));
    }

    #[test]
    fn addresses_refuse_unusable_values() {
        let a: SocketAddr = "1.2.3.4:5".parse().unwrap();
        assert_eq!(decode_addr(&encode_addr(Some(a))).unwrap(), Some(a));
        assert!(decode_addr(&encode_addr(Some("1.2.3.4:0".parse().unwrap()))).is_err());
        assert!(decode_addr(&encode_addr(Some("0.0.0.0:5".parse().unwrap()))).is_err());
        let mut b = encode_addr(Some(a));
        b[10] = 1;
        assert!(decode_addr(&b).is_err());
        let mut b = [0u8; ADDR_LEN];
        b[3] = 1;
        assert!(decode_addr(&b).is_err());
    }

    #[test]
    fn frame_headers_round_trip_and_cap_lengths() {
        let key = Key {
            space: Space::Barrier,
            tag: u64::MAX,
        };
        assert_eq!(decode_frame_header(&encode_frame_header(key, 77)).unwrap(), (key, 77));
        assert_eq!(
            decode_frame_header(&encode_frame_header(Key::user(5), MAX_FRAME_LEN))
                .unwrap()
                .1,
            MAX_FRAME_LEN
        );
        let e = decode_frame_header(&encode_frame_header(key, MAX_FRAME_LEN + 1)).unwrap_err();
        assert!(e.contains("exceeds"));
        // Registration records have a space of their own, numbered after the older ones.
        let h = encode_frame_header(Key::registration(), 58);
        assert_eq!(h[0..4], 7u32.to_le_bytes());
        assert_eq!(decode_frame_header(&h).unwrap(), (Key::registration(), 58));
        assert!(!Space::Registration.is_control());
        let mut b = encode_frame_header(key, 1);
        b[0] = 9;
        assert!(decode_frame_header(&b).unwrap_err().contains("unknown kind"));
        let mut b = encode_frame_header(key, 1);
        b[5] = 1;
        assert!(decode_frame_header(&b).is_err());
    }

    #[test]
    fn control_frames_and_notices_round_trip() {
        for space in [Space::Heartbeat, Space::Goodbye] {
            let f = control_frame(space);
            let (key, len) = decode_frame_header(f.as_slice().try_into().unwrap()).unwrap();
            assert_eq!((key.space, len), (space, 0));
            assert!(space.is_control());
        }
        assert!(!Space::User.is_control());
        for notice in [
            Notice::Dead {
                rank: 7,
                how: "no heartbeat for 2.0 s".into(),
                silent_ms: Some(2000),
            },
            Notice::Dead {
                rank: 0,
                how: String::new(),
                silent_ms: None,
            },
            Notice::Aborted { rank: 3 },
        ] {
            let f = notice.frame();
            let (key, len) = decode_frame_header(f[..FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!((key.space, len as usize), (Space::Abort, f.len() - FRAME_HEADER_LEN));
            assert_eq!(Notice::decode(&f[FRAME_HEADER_LEN..]).unwrap(), notice);
        }
        // A long account is cut at a character boundary; garbage is refused.
        let long = Notice::Dead {
            rank: 1,
            how: "é".repeat(2000),
            silent_ms: None,
        };
        match Notice::decode(&long.frame()[FRAME_HEADER_LEN..]).unwrap() {
            Notice::Dead { how, .. } => assert_eq!(how.len(), MAX_NOTICE_TEXT),
            other => panic!("{other:?}"),
        }
        assert!(Notice::decode(&[1, 2, 3]).is_err());
        let mut bad = Notice::Aborted { rank: 0 }.frame();
        bad[FRAME_HEADER_LEN] = 9;
        assert!(
            Notice::decode(&bad[FRAME_HEADER_LEN..])
                .unwrap_err()
                .contains("unknown kind")
        );
        let big = encode_frame_header(
            Key {
                space: Space::Abort,
                tag: 0,
            },
            MAX_CONTROL_LEN + 1,
        );
        assert!(decode_frame_header(&big).unwrap_err().contains("exceeds"));
    }

    #[test]
    fn read_exact_by_times_out_and_sees_eof() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut a = connect_by(addr, Instant::now() + Duration::from_secs(5)).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 4];
        let e = read_exact_by(&mut a, &mut buf, Instant::now() + Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(2));
        b.write_all(b"ab").unwrap();
        drop(b);
        let e = read_exact_by(&mut a, &mut buf, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn connect_by_gives_up_at_the_deadline() {
        // A port nobody listens on: bind, note it, close.
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let start = Instant::now();
        let e = connect_by(addr, Instant::now() + Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    #[test]
    fn a_listener_that_is_gone_is_refused_at_once() {
        let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let start = Instant::now();
        let e = connect_to_listening(addr, Instant::now() + Duration::from_secs(30)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        assert!(e.to_string().contains("its process ended"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        // One that listens is reached as by connect_by.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        connect_to_listening(listener.local_addr().unwrap(), Instant::now() + Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn replies_carry_rejections() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        write_rejection(&mut b, 7, STATUS_REJECTED, &"x".repeat(5000)).unwrap();
        write_reply(&mut b, 7, 1, 2, STATUS_OK, b"table").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        match read_reply(&mut a, deadline, 100) {
            Err(Refusal::Rejected { status, reason }) => {
                assert_eq!(status, STATUS_REJECTED);
                assert_eq!(reason.len(), MAX_REASON_LEN);
            }
            other => panic!("{other:?}"),
        }
        let (g, payload) = read_reply(&mut a, deadline, 100).unwrap();
        assert_eq!((g.rank, g.nranks, payload.as_slice()), (1, 2, &b"table"[..]));
    }
}
