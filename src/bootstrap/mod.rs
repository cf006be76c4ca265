//! The TCP bootstrap: how ranks find each other and exchange set-up data before any GPU work.
//!
//! CONTRACT (used by `comm.rs`, `connection` set-up and the FFI layer; keep these signatures):
//!
//! - `RootAddress::parse("ip:port" | "ifname:ip:port" | "[v6addr]:port" | "ifname:[v6addr]:port")`
//! - `UniqueId::create()` starts a root listener thread in this process and returns the id to share.
//! - `Bootstrap::connect(root, magic, rank, nranks, timeout)`; rank 0 of an `ip:port` job first calls
//!   `Root::listen(addr, magic, timeout)`.
//! - `all_gather`, `barrier`, `send(peer, tag, bytes)`, `recv(peer, tag) -> bytes`.

use crate::error::Result;
use std::time::Duration;

/// Default for `mscclppSetBootstrapConnTimeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where rank 0's root listener is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootAddress {
    pub addr: std::net::SocketAddr,
    pub ifname: Option<String>,
}

impl RootAddress {
    pub fn parse(_s: &str) -> Result<RootAddress> {
        todo!()
    }
}

/// The 128 bytes of `mscclppUniqueId`: the root's address and the job's magic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueId {
    pub root: std::net::SocketAddr,
    pub magic: u64,
}

impl UniqueId {
    pub fn create(_timeout: Duration) -> Result<UniqueId> {
        todo!()
    }
    pub fn to_bytes(&self) -> [u8; 128] {
        todo!()
    }
    pub fn from_bytes(_b: &[u8; 128]) -> Result<UniqueId> {
        todo!()
    }
}

/// The magic of jobs that meet by `ip:port` (unique-id jobs carry a random one in the id).
pub const PROTOCOL_MAGIC: u64 = 0x4d53_4343_4c50_5030;

/// The rendezvous point: a background thread that collects every rank's address and sends out the
/// table. Rank 0 of an `ip:port` job runs one; `UniqueId::create` runs one for unique-id jobs.
pub struct Root;

impl Root {
    pub fn listen(_addr: std::net::SocketAddr, _magic: u64, _timeout: Duration) -> Result<Root> {
        todo!()
    }
}

/// One rank's endpoint of the bootstrap network.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
}

impl Bootstrap {
    pub fn connect(
        _root: std::net::SocketAddr,
        _magic: u64,
        rank: usize,
        nranks: usize,
        _timeout: Duration,
    ) -> Result<Bootstrap> {
        Ok(Bootstrap { rank, nranks })
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    pub fn all_gather(&self, _data: &mut [u8], _block: usize) -> Result<()> {
        todo!()
    }
    pub fn barrier(&self) -> Result<()> {
        todo!()
    }
    pub fn send(&self, _peer: usize, _tag: u64, _data: &[u8]) -> Result<()> {
        todo!()
    }
    pub fn recv(&self, _peer: usize, _tag: u64) -> Result<Vec<u8>> {
        todo!()
    }
}
