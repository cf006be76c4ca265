//! The narrow interface between the IB transport and a verbs provider.
//!
//! Everything the transport needs of InfiniBand goes through the four traits here: a library that lists
//! and opens devices, a device (context and protection domain), its memory regions, and its reliable-
//! connected queue pairs, each with its own completion queue. Two implementations exist: `real`, over
//! libibverbs loaded at run time, and `sim` (tests only), a device in host memory that executes RDMA
//! writes, completions and injected failures.

use crate::error::Result;
use std::sync::Arc;

/// Lists and opens RDMA devices.
pub trait VerbsLibrary: Send + Sync {
    /// Names of the devices present (`mlx5_0`, ...).
    fn device_names(&self) -> Result<Vec<String>>;
    /// Opens a device by name (a verbs context and a protection domain).
    fn open(&self, name: &str) -> Result<Arc<dyn VerbsDevice>>;
}

/// An opened device: a verbs context and a protection domain.
pub trait VerbsDevice: Send + Sync {
    fn name(&self) -> &str;
    /// The state and addresses of `port`; `gid_index >= 0` also reads that GID (RoCE).
    fn port(&self, port: u8, gid_index: i32) -> Result<PortInfo>;
    /// Registers `[addr, addr + len)` for local use and remote writes.
    fn register(&self, addr: u64, len: u64) -> Result<Box<dyn MemoryRegion>>;
    /// Creates a reliable-connected queue pair with its own completion queue, moved to INIT on `port`.
    fn create_qp(&self, port: u8, send_depth: u32, cq_size: u32) -> Result<Box<dyn QueuePair>>;
}

/// A registered memory region.
pub trait MemoryRegion: Send + Sync {
    fn addr(&self) -> u64;
    fn size(&self) -> u64;
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    /// The provider's `struct ibv_mr *` (null for the simulated device); handed to applications in
    /// `mscclppIbMr::mr`, never dereferenced by us after registration.
    fn raw(&self) -> usize;
    /// Whether `[addr, addr + len)` lies inside the region.
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr() + self.size())
    }
}

/// A reliable-connected queue pair and its completion queue.
pub trait QueuePair: Send {
    fn qp_num(&self) -> u32;
    /// The send-queue depth the provider granted (at least what was asked).
    fn send_depth(&self) -> u32;
    /// Entries of the completion queue the provider granted.
    fn cq_size(&self) -> u32;
    /// Moves the queue pair through RTR to RTS, towards `remote`.
    fn connect(&mut self, local: &QpEndpoint, remote: &QpEndpoint) -> Result<()>;
    /// Bytes a work request may carry inline (copied into it at post time); 0 if none.
    fn max_inline(&self) -> u32;
    /// Posts one RDMA write. The caller keeps the send queue from overflowing.
    fn post_write(&mut self, wr: &RdmaWrite) -> Result<()>;
    /// Appends up to `max` completions to `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize>;
}

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
}

/// What a queue pair needs to know of its local port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub active: bool,
    pub lid: u16,
    /// `enum ibv_mtu` (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    pub link_layer: LinkLayer,
    /// The GID at the configured index, or zero when addressing by LID.
    pub gid: [u8; 16],
}

/// One side of a queue-pair connection: what the peer needs to reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub port: u8,
    pub lid: u16,
    pub gid: [u8; 16],
    /// `< 0`: route by LID (InfiniBand); otherwise the local GID index used for RoCE.
    pub gid_index: i32,
    pub qpn: u32,
    pub psn: u32,
    pub mtu: u8,
}

/// An RDMA write: `len` bytes from local `[addr, +len)` (covered by `lkey`) to the peer's `remote_addr`,
/// or, with `inline_value`, those 8 bytes carried in the work request itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaWrite {
    pub wr_id: u64,
    pub local_addr: u64,
    pub lkey: u32,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub signaled: bool,
    /// The value to write, copied into the work request when it is posted (`len` is 8; `local_addr` and
    /// `lkey` are unused): the peer receives what it was at post time, not when the adapter runs it.
    pub inline_value: Option<u64>,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// `enum ibv_wc_status`; 0 is success.
    pub status: u32,
    pub vendor_err: u32,
}

pub const WC_SUCCESS: u32 = 0;
pub const WC_WR_FLUSH_ERR: u32 = 5;
pub const WC_LOC_PROT_ERR: u32 = 4;
pub const WC_REM_ACCESS_ERR: u32 = 10;
pub const WC_RETRY_EXC_ERR: u32 = 12;

/// A readable name for an `enum ibv_wc_status`, in the order of rdma-core's `verbs.h`.
pub fn status_name(status: u32) -> &'static str {
    const NAMES: [&str; 24] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "work request flushed",
        "memory window bind error",
        "bad response",
        "local access error",
        "remote invalid request",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation",
        "remote invalid RD request",
        "remote aborted",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout",
        "general error",
        "tag matching error",
        "tag matching rendezvous incomplete",
    ];
    NAMES.get(status as usize).copied().unwrap_or("unknown status")
}

/// Bytes of an `enum ibv_mtu` value.
pub fn mtu_bytes(mtu: u8) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}
