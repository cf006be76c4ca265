//! What the bootstrap sends over TCP, byte by byte, and the blocking socket helpers with deadlines.
//!
//! Every connection starts with a fixed-size greeting: a rank to the root (`RootHello`), a rank to a peer
//! (`PeerHello`), and the answer to either (`Reply`, followed by `payload_len` bytes: the address table,
//! or the reason for turning the connection away). After a peer handshake, each side sends frames: a
//! 24-byte header (space, tag, length) and the payload. All integers are little-endian.

use super::sys;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::time::{Duration, Instant};

/// First bytes of every greeting; anything else is a stranger.
pub const GREETING_TAG: [u8; 8] = *b"MSCLBOOT";
/// Bumped whenever the wire format changes.
pub const PROTOCOL_VERSION: u32 = 1;
pub const GREETING_LEN: usize = 72;
pub const ADDR_LEN: usize = 28;
pub const FRAME_HEADER_LEN: usize = 24;
/// Longest reason for a rejection we send or accept.
pub const MAX_REASON_LEN: usize = 1024;
/// Most ranks a job may have; bounds the address table a rank allocates.
pub const MAX_RANKS: usize = 1 << 16;
/// Longest frame payload we accept (far above any real all-gather block).
pub const MAX_FRAME_LEN: u64 = 1 << 40;

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
        }
    }

    pub fn encode(&self) -> [u8; GREETING_LEN] {
        let mut b = [0u8; GREETING_LEN];
        b[0..8].copy_from_slice(&GREETING_TAG);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.magic.to_le_bytes());
        b[24..28].copy_from_slice(&self.rank.to_le_bytes());
        b[28..32].copy_from_slice(&self.nranks.to_le_bytes());
        b[32..36].copy_from_slice(&self.aux.to_le_bytes());
        b[36..40].copy_from_slice(&self.payload_len.to_le_bytes());
        b[40..68].copy_from_slice(&encode_addr(self.addr));
        b
    }

    /// Decodes a greeting; the error says why the bytes are not one (a stranger).
    pub fn decode(b: &[u8; GREETING_LEN]) -> Result<Greeting, String> {
        if b[0..8] != GREETING_TAG {
            return Err("not a bootstrap greeting".into());
        }
        let kind = match u32_at(b, 12) {
            1 => Kind::RootHello,
            2 => Kind::PeerHello,
            3 => Kind::Reply,
            k => return Err(format!("unknown greeting kind {k}")),
        };
        if b[68..72] != [0; 4] {
            return Err("reserved greeting bytes are not zero".into());
        }
        let addr = decode_addr(b[40..68].try_into().expect("28 bytes"))?;
        Ok(Greeting {
            kind,
            version: u32_at(b, 8),
            magic: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            rank: u32_at(b, 24),
            nranks: u32_at(b, 28),
            aux: u32_at(b, 32),
            payload_len: u32_at(b, 36),
            addr,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Encodes an address in 28 bytes: family (0 none, 4, 6), zero, port, 16 address bytes, scope, flow.
pub fn encode_addr(addr: Option<SocketAddr>) -> [u8; ADDR_LEN] {
    let mut b = [0u8; ADDR_LEN];
    match addr {
        None => {}
        Some(SocketAddr::V4(a)) => {
            b[0] = 4;
            b[2..4].copy_from_slice(&a.port().to_le_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
        }
        Some(SocketAddr::V6(a)) => {
            b[0] = 6;
            b[2..4].copy_from_slice(&a.port().to_le_bytes());
            b[4..20].copy_from_slice(&a.ip().octets());
            b[20..24].copy_from_slice(&a.scope_id().to_le_bytes());
            b[24..28].copy_from_slice(&a.flowinfo().to_le_bytes());
        }
    }
    b
}

/// Decodes `encode_addr`'s bytes; anything it would not have written is an error.
pub fn decode_addr(b: &[u8; ADDR_LEN]) -> Result<Option<SocketAddr>, String> {
    let port = u16::from_le_bytes([b[2], b[3]]);
    let addr = match b[0] {
        0 if b.iter().all(|&x| x == 0) => return Ok(None),
        4 if b[1] == 0 && b[8..].iter().all(|&x| x == 0) => {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        }
        6 if b[1] == 0 => {
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&b[4..20]).expect("16 bytes"));
            let scope = u32_at(b, 20);
            let flow = u32_at(b, 24);
            SocketAddr::V6(SocketAddrV6::new(ip, port, flow, scope))
        }
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
}

pub fn encode_frame_header(key: Key, len: u64) -> [u8; FRAME_HEADER_LEN] {
    let mut b = [0u8; FRAME_HEADER_LEN];
    b[0..4].copy_from_slice(&(key.space as u32).to_le_bytes());
    b[8..16].copy_from_slice(&key.tag.to_le_bytes());
    b[16..24].copy_from_slice(&len.to_le_bytes());
    b
}

/// Decodes a frame header, refusing unknown spaces and lengths past `MAX_FRAME_LEN`.
pub fn decode_frame_header(b: &[u8; FRAME_HEADER_LEN]) -> Result<(Key, u64), String> {
    let space = match u32_at(b, 0) {
        0 => Space::User,
        1 => Space::AllGather,
        2 => Space::Barrier,
        s => return Err(format!("frame of unknown kind {s}")),
    };
    if u32_at(b, 4) != 0 {
        return Err("reserved frame bytes are not zero".into());
    }
    let tag = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if len > MAX_FRAME_LEN {
        return Err(format!("frame of {len} bytes exceeds the limit of {MAX_FRAME_LEN}"));
    }
    Ok((Key { space, tag }, len))
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
    let mut backoff = Duration::from_millis(10);
    loop {
        let left = time_left(deadline)?;
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                return Ok(stream);
            }
            Err(e) if is_transient(&e) => {
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
    fn garbage_greetings_are_refused() {
        let good = Greeting::new(Kind::PeerHello, 1, 0, 2).encode();
        let mut b = good;
        b[0] = b'X';
        assert!(Greeting::decode(&b).unwrap_err().contains("not a bootstrap greeting"));
        let mut b = good;
        b[12] = 77;
        assert!(Greeting::decode(&b).unwrap_err().contains("unknown greeting kind"));
        let mut b = good;
        b[70] = 1;
        assert!(Greeting::decode(&b).is_err());
        let mut b = good;
        b[40] = 5;
        assert!(Greeting::decode(&b).unwrap_err().contains("malformed"));
        assert!(Greeting::decode(&[0xAB; GREETING_LEN]).is_err());
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
        let mut b = encode_frame_header(key, 1);
        b[0] = 9;
        assert!(decode_frame_header(&b).unwrap_err().contains("unknown kind"));
        let mut b = encode_frame_header(key, 1);
        b[5] = 1;
        assert!(decode_frame_header(&b).is_err());
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
