//! The 128 bytes of a unique id (either face's, `abi::UNIQUE_ID_BYTES`): a format tag, the job's random
//! magic, and the root's address.
//!
//! Layout: bytes 0..8 the tag `MSCLPPID`, 8..12 the format version, 12..16 zero, 16..24 the magic,
//! 24..52 the root's socket address (see `wire::encode_addr`), the rest zero.

use super::PROTOCOL_MAGIC;
use super::address::unique_id_root_addr;
use super::root::Root;
use super::wire;
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use log::info;
use std::io::Read;
use std::time::Duration;

const ID_TAG: [u8; 8] = *b"MSCLPPID";
const ID_VERSION: u32 = 1;
const ID_LEN: usize = 128;
/// Where the root's address starts.
const ADDR_AT: usize = 24;

/// The 128 bytes of a unique id: the root's address and the job's magic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueId {
    pub root: std::net::SocketAddr,
    pub magic: u64,
}

impl UniqueId {
    /// Starts a root in this process on an ephemeral port of a local address (see
    /// `address::unique_id_root_addr`) and returns the id that leads the ranks to it.
    pub fn create(timeout: Duration) -> Result<UniqueId> {
        let bind = unique_id_root_addr()?;
        let magic = random_magic();
        let root = Root::listen(bind, magic, timeout)?;
        let id = UniqueId {
            root: root.local_addr(),
            magic,
        };
        info!("unique id: root at {} waits for ranks", id.root);
        // The root thread lives on after this returns, until every rank has the table or it times out.
        drop(root);
        Ok(id)
    }

    pub fn to_bytes(&self) -> [u8; 128] {
        let mut w = Writer::with_capacity(ID_LEN);
        w.bytes(&ID_TAG)
            .u32(ID_VERSION)
            .u32(0)
            .u64(self.magic)
            .bytes(&wire::encode_addr(Some(self.root)))
            .bytes(&[0; ID_LEN - ADDR_AT - wire::ADDR_LEN]);
        w.into_bytes().try_into().expect("an id is 128 bytes")
    }

    /// Reads an id made by `to_bytes`; anything else (an uninitialised or foreign id) is an
    /// `InvalidArgument` error. Its message calls the id `what` and names `made_by`, the exported function
    /// that makes ids: each face passes its own names (what its argument is called, and its function).
    pub fn from_bytes(b: &[u8; 128], what: &'static str, made_by: &str) -> Result<UniqueId> {
        let bad = |why: &str| Error::invalid_argument(format!("{what}: {why} (was it made by {made_by}?)"));
        // The id is 128 bytes, so none of these reads runs past its end.
        let mut r = Reader::new(b, what);
        if r.take::<8>()? != ID_TAG {
            return Err(bad("unknown format tag"));
        }
        let version = r.u32()?;
        if version != ID_VERSION {
            return Err(bad(&format!("format version {version}, expected {ID_VERSION}")));
        }
        let reserved = r.u32()?;
        let magic = r.u64()?;
        let addr = r.take::<{ wire::ADDR_LEN }>()?;
        let tail = r.slice(ID_LEN - ADDR_AT - wire::ADDR_LEN)?;
        r.finish()?;
        if reserved != 0 || tail.iter().any(|&x| x != 0) {
            return Err(bad("reserved bytes are not zero"));
        }
        if magic == 0 {
            return Err(bad("zero magic"));
        }
        let root = match wire::decode_addr(&addr) {
            Ok(Some(addr)) => addr,
            Ok(None) => return Err(bad("no root address")),
            Err(why) => return Err(bad(&why)),
        };
        Ok(UniqueId { root, magic })
    }
}

/// A random magic, never 0 nor the fixed magic of `ip:port` jobs.
fn random_magic() -> u64 {
    let mut bytes = [0u8; 8];
    let from_os = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    let mut magic = match from_os {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => fallback_random(),
    };
    while magic == 0 || magic == PROTOCOL_MAGIC {
        magic = fallback_random();
    }
    magic
}

/// Randomness without /dev/urandom: std's randomly keyed hasher over the time and process id.
fn fallback_random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::net::{SocketAddr, SocketAddrV6};

    #[test]
    fn ids_round_trip_v4_and_v6() {
        for root in [
            "192.0.2.2:40000".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 5, 0, 3)),
            "[fd00::2]:65535".parse().unwrap(),
        ] {
            let id = UniqueId {
                root,
                magic: 0xfeed_beef_0000_0001,
            };
            assert_eq!(
                UniqueId::from_bytes(&id.to_bytes(), "unique id", "UniqueId::create").unwrap(),
                id
            );
        }
    }

    #[test]
    fn garbage_ids_are_invalid_arguments() {
        let good = UniqueId {
            root: "10.0.0.1:1234".parse().unwrap(),
            magic: 99,
        }
        .to_bytes();
        let mut cases: Vec<[u8; 128]> = vec![[0u8; 128], [0xff; 128]];
        for at in [0, 8, 13, 16, 24, 26, 60, 127] {
            let mut b = good;
            b[at] ^= 0x5a;
            if at == 16 {
                // Any non-zero magic is valid; make it zero instead.
                b[16..24].fill(0);
            }
            if at == 26 {
                // Port zero.
                b[26..28].fill(0);
            }
            cases.push(b);
        }
        for (i, b) in cases.iter().enumerate() {
            let e = UniqueId::from_bytes(b, "unique id", "UniqueId::create").expect_err(&format!("case {i}"));
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.starts_with("unique id: "), "{}", e.message);
        }
    }

    #[test]
    fn magics_are_random() {
        let a = random_magic();
        let b = random_magic();
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_ne!(fallback_random(), fallback_random());
    }

    #[test]
    fn create_listens_on_a_real_address() {
        let id = UniqueId::create(Duration::from_millis(300)).unwrap();
        assert_ne!(id.root.port(), 0);
        assert!(!id.root.ip().is_unspecified());
        assert_ne!(id.magic, PROTOCOL_MAGIC);
        assert_eq!(
            UniqueId::from_bytes(&id.to_bytes(), "unique id", "UniqueId::create").unwrap(),
            id
        );
        // The root answers a connection while it waits.
        assert!(std::net::TcpStream::connect(id.root).is_ok());
    }
}
