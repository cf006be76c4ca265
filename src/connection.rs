//! A connection: one side of a (rank, peer, tag) pairing, as `mscclppConnect` records it and
//! `mscclppConnectionSetup` completes it.

use crate::error::{Error, Result};
use crate::gpu::{DeviceAllocation, DevicePtr, GpuContext, IpcExport, SharedHostMemory};
use crate::types::{mscclppBaseConn, mscclppDevConnSignalEpochId};
use std::sync::Arc;

/// How a connection moves data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// Copy engine over NVLink/PCIe, peers' memory mapped with CUDA IPC.
    P2p,
    /// RDMA writes through the named InfiniBand device.
    Ib { device: String },
}

impl TransportKind {
    pub fn code(&self) -> u16 {
        match self {
            TransportKind::P2p => 0,
            TransportKind::Ib { .. } => 2,
        }
    }
}

/// One side's counters.
///
/// The device block: 64 bytes of device memory, as 64-bit words: [0..2) an `mscclppDevConnSignalEpochId`
/// (used unless the struct lives in host memory), [2] `waitEpochId`, [3] the header's count of signals
/// raised (it writes the count into the struct's `device` word, so the device never reads that word
/// across the host link), [4..7) the proxy-free methods' counters (direct signals sent, received, waited
/// for). The header finds the block from `waitEpochId`, and the peer's from `remoteSignalEpochId`.
///
/// A P2P connection's epoch struct lives in host memory shared with the peer (see `HostEpoch`), so that
/// the peer's proxy raises our flag with a CPU store.
pub struct Epochs {
    block: DeviceAllocation,
    host: Option<HostEpoch>,
}

/// An epoch struct in host memory shared between processes.
#[derive(Clone)]
pub struct HostEpoch {
    pub memory: Arc<SharedHostMemory>,
    pub offset: usize,
}

impl HostEpoch {
    /// Bytes per struct in a shared object: one cache line each, so that flags of different
    /// connections never share a line.
    pub const STRIDE: usize = 64;

    /// The struct's `proxy` word, where the peer's proxy writes.
    pub fn proxy_word(&self) -> FlagWord {
        let at = self.offset + 8;
        FlagWord::Host {
            // In range: `place_in_host` and the peer's `open` checked `offset + 16 <= size`.
            cpu: self.memory.host_ptr() as usize + at,
            dev: self.memory.device_ptr() + at as u64,
        }
    }
}

/// Where a proxy raises a peer's flag: the peer's `proxy` epoch word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagWord {
    /// In device memory (mapped with CUDA IPC): written by the copy engine.
    Device(DevicePtr),
    /// In host memory shared with the peer: our mapping's address (`cpu`) for a CPU store, and its
    /// address in our GPU's space (`dev`) for a store ordered behind stream work.
    Host { cpu: usize, dev: DevicePtr },
}

impl Epochs {
    pub const BYTES: usize = 64;
    pub fn new(ctx: &GpuContext) -> Result<Epochs> {
        Ok(Epochs {
            block: DeviceAllocation::zeroed(ctx, Self::BYTES)?,
            host: None,
        })
    }
    /// Moves the epoch struct into shared host memory (before the device connection is handed out).
    pub fn place_in_host(&mut self, host: HostEpoch) -> Result<()> {
        if !host.offset.is_multiple_of(8) || host.offset + 16 > host.memory.size() {
            return Err(Error::internal(format!(
                "epoch struct at +{} does not fit shared memory of {} bytes",
                host.offset,
                host.memory.size()
            )));
        }
        self.host = Some(host);
        Ok(())
    }
    pub fn host(&self) -> Option<&HostEpoch> {
        self.host.as_ref()
    }
    /// Address of `mscclppDevConnSignalEpochId`.
    pub fn signal(&self) -> DevicePtr {
        match &self.host {
            Some(h) => h.memory.device_ptr() + h.offset as u64,
            None => self.block.ptr(),
        }
    }
    /// Address of the device block (the struct's home unless it lives in host memory).
    pub fn block(&self) -> DevicePtr {
        self.block.ptr()
    }
    /// Address of `waitEpochId`.
    pub fn wait(&self) -> DevicePtr {
        self.block.ptr() + std::mem::size_of::<mscclppDevConnSignalEpochId>() as u64
    }
}

/// Where the peer's side of a connection is, once set up.
pub struct RemoteSide {
    pub buff: DevicePtr,
    pub size: u64,
    /// P2P: the peer's device block (the communicator keeps its IPC mapping, if any). IB: the peer's
    /// `mscclppDevConnSignalEpochId`.
    pub epochs: DevicePtr,
    /// P2P: where our proxy raises the peer's flag.
    pub flag: Option<FlagWord>,
}

pub struct Connection {
    pub remote_rank: usize,
    pub tag: i32,
    pub transport: TransportKind,
    pub local_buff: DevicePtr,
    pub local_size: u64,
    pub epochs: Epochs,
    pub remote: Option<RemoteSide>,
}

impl Connection {
    pub fn base_conn(&self) -> mscclppBaseConn {
        let p2p_remote = match (&self.transport, &self.remote) {
            (TransportKind::P2p, Some(r)) => Some(r),
            _ => None,
        };
        mscclppBaseConn {
            remoteRank: self.remote_rank as i32,
            tag: self.tag,
            localBuff: self.local_buff as *mut _,
            localSignalEpochId: self.epochs.signal() as *mut _,
            remoteSignalEpochId: p2p_remote.map_or(std::ptr::null_mut(), |r| r.epochs as *mut _),
            waitEpochId: self.epochs.wait() as *mut _,
            remoteBuff: p2p_remote.map_or(std::ptr::null_mut(), |r| r.buff as *mut _),
        }
    }
}

/// Identifies this process, so that a peer in the same process is reached without CUDA IPC (which
/// cannot open a process's own allocations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub host: u64,
    pub pid: u32,
}

impl ProcessId {
    pub fn this() -> ProcessId {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let mut host: u64 = 0xcbf29ce484222325;
        for b in boot.trim().bytes().chain(hostname_bytes()) {
            host = (host ^ b as u64).wrapping_mul(0x100000001b3);
        }
        ProcessId {
            host,
            pid: std::process::id(),
        }
    }
}

fn hostname_bytes() -> impl Iterator<Item = u8> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = if ok {
        buf.iter().position(|&b| b == 0).unwrap_or(buf.len())
    } else {
        0
    };
    buf.into_iter().take(end)
}

/// What one side sends its peer during set-up, per connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupInfo {
    pub rank: u32,
    pub tag: i32,
    pub transport: u16,
    pub process: ProcessId,
    pub device: i32,
    pub buffer: IpcExport,
    /// The device block of the sender's counters.
    pub epochs: IpcExport,
    /// Where the sender's epoch struct is, if in shared host memory: the object's name and offset.
    pub host_epoch: Option<(String, u32)>,
}

const SETUP_MAGIC: u32 = 0x4d53_4331; // "MSC1"

impl SetupInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&SETUP_MAGIC.to_le_bytes());
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.tag.to_le_bytes());
        v.extend_from_slice(&self.transport.to_le_bytes());
        v.extend_from_slice(&self.process.host.to_le_bytes());
        v.extend_from_slice(&self.process.pid.to_le_bytes());
        v.extend_from_slice(&self.device.to_le_bytes());
        v.extend_from_slice(&self.buffer.to_bytes());
        v.extend_from_slice(&self.epochs.to_bytes());
        let (name, offset) = self.host_epoch.as_ref().map_or(("", 0), |(n, o)| (n.as_str(), *o));
        v.push(name.len() as u8);
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&offset.to_le_bytes());
        v
    }

    /// The longest name of a shared host object that fits the message.
    pub const MAX_NAME: usize = 255;

    pub fn from_bytes(b: &[u8]) -> Result<SetupInfo> {
        const HEAD: usize = 4 + 4 + 4 + 2 + 8 + 4 + 4;
        const FIXED: usize = HEAD + 2 * IpcExport::BYTES;
        let name_len = b.get(FIXED).map_or(0, |&n| n as usize);
        if b.len() != FIXED + 1 + name_len + 4 {
            return Err(Error::remote(format!(
                "connection set-up message of {} bytes is malformed",
                b.len()
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        if u32_at(0) != SETUP_MAGIC {
            return Err(Error::remote("connection set-up message has a wrong magic"));
        }
        Ok(SetupInfo {
            rank: u32_at(4),
            tag: u32_at(8) as i32,
            transport: u16::from_le_bytes(b[12..14].try_into().unwrap()),
            process: ProcessId {
                host: u64::from_le_bytes(b[14..22].try_into().unwrap()),
                pid: u32_at(22),
            },
            device: u32_at(26) as i32,
            buffer: IpcExport::from_bytes(&b[HEAD..HEAD + IpcExport::BYTES])?,
            epochs: IpcExport::from_bytes(&b[HEAD + IpcExport::BYTES..FIXED])?,
            host_epoch: if name_len == 0 {
                None
            } else {
                let name = std::str::from_utf8(&b[FIXED + 1..FIXED + 1 + name_len])
                    .map_err(|_| Error::remote("connection set-up message names shared memory in non-UTF-8"))?;
                Some((name.to_string(), u32_at(FIXED + 1 + name_len)))
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(x: u8) -> IpcExport {
        IpcExport {
            handle: [x; 64],
            offset: x as u64,
            size: 1000 + x as u64,
            address: 0x1000 * x as u64,
        }
    }

    #[test]
    fn setup_info_round_trips() {
        let s = SetupInfo {
            rank: 3,
            tag: -7,
            transport: 0,
            process: ProcessId::this(),
            device: 1,
            buffer: export(1),
            epochs: export(2),
            host_epoch: None,
        };
        assert_eq!(SetupInfo::from_bytes(&s.to_bytes()).unwrap(), s);
        let with_host = SetupInfo {
            host_epoch: Some(("/mscclpp-1-2-3".into(), 128)),
            ..s.clone()
        };
        assert_eq!(SetupInfo::from_bytes(&with_host.to_bytes()).unwrap(), with_host);
        let mut cut = with_host.to_bytes();
        cut.pop();
        assert!(SetupInfo::from_bytes(&cut).is_err());
        let mut bad = s.to_bytes();
        bad[0] ^= 1;
        assert!(SetupInfo::from_bytes(&bad).is_err());
        assert!(SetupInfo::from_bytes(&bad[..20]).is_err());
    }

    #[test]
    fn process_id_is_stable_within_a_process() {
        assert_eq!(ProcessId::this(), ProcessId::this());
    }
}
