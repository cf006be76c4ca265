//! A connection: one side of a (rank, peer, tag) pairing, as `mscclppConnect` records it and
//! `mscclppConnectionSetup` completes it.

use crate::codec::{Reader, Writer};
use crate::error::Result;
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

/// The device memory of one side's counters, as 64-bit words: `mscclppDevConnSignalEpochId` (device,
/// proxy), `waitEpochId`, the address of the fast flag (or 0), the proxy-free methods' counters (direct
/// signals sent, received, waited for), and the waits' fast-flag mode (kept by the device code alone),
/// which the header's device code finds from `localSignalEpochId`.
pub struct Epochs {
    alloc: DeviceAllocation,
    fast: Option<FastFlag>,
}

/// A P2P connection's fast flag: a word in host memory shared with the peer, where the peer's proxy
/// stores the epoch with a CPU store when none of its data is in flight; the header's `wait()` reads it
/// beside the epoch struct's `proxy` word (which the proxy always writes too, for legacy device code).
#[derive(Clone)]
pub struct FastFlag {
    pub memory: Arc<SharedHostMemory>,
    pub offset: usize,
}

impl FastFlag {
    /// Bytes per word in a shared object: a cache line each, so that flags of different connections
    /// never share a line.
    pub const STRIDE: usize = 64;

    /// The word at `offset` of `memory`, if it is an aligned word inside it.
    pub fn at(memory: Arc<SharedHostMemory>, offset: usize) -> Option<FastFlag> {
        (offset.is_multiple_of(8) && offset + 8 <= memory.size()).then_some(FastFlag { memory, offset })
    }

    /// Where the word is for the CPU of this process.
    pub fn host_address(&self) -> usize {
        self.memory.host_ptr() as usize + self.offset
    }

    /// Where the word is for the GPU of the context that registered the memory.
    pub fn device_address(&self) -> DevicePtr {
        self.memory.device_ptr() + self.offset as u64
    }
}

impl Epochs {
    pub const BYTES: usize = 64;
    /// Word index of the fast flag's address.
    const FAST_FLAG_WORD: u64 = 3;

    pub fn new(ctx: &GpuContext) -> Result<Epochs> {
        Ok(Epochs {
            alloc: DeviceAllocation::zeroed(ctx, Self::BYTES)?,
            fast: None,
        })
    }
    /// Gives the connection a fast flag, whose address the device code then finds in the counters.
    pub fn set_fast_flag(&mut self, fast: FastFlag) -> Result<()> {
        self.alloc.write_u64(Self::FAST_FLAG_WORD * 8, fast.device_address())?;
        self.fast = Some(fast);
        Ok(())
    }
    pub fn fast_flag(&self) -> Option<&FastFlag> {
        self.fast.as_ref()
    }
    /// Address of `mscclppDevConnSignalEpochId`.
    pub fn signal(&self) -> DevicePtr {
        self.alloc.ptr()
    }
    /// Address of `waitEpochId`.
    pub fn wait(&self) -> DevicePtr {
        self.alloc.ptr() + std::mem::size_of::<mscclppDevConnSignalEpochId>() as u64
    }
}

/// Where the peer's side of a connection is, once set up.
pub struct RemoteSide {
    pub buff: DevicePtr,
    pub size: u64,
    /// The peer's `mscclppDevConnSignalEpochId` (the communicator keeps its IPC mapping, if any).
    pub epochs: DevicePtr,
    /// P2P: the peer's fast flag, if it has one, as our CPU reaches it.
    pub fast_flag: Option<usize>,
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
    /// The sender's fast flag, if it has one: the shared host object's name and the word's offset.
    pub fast_flag: Option<(String, u32)>,
}

const SETUP_MAGIC: u32 = 0x4d53_4331; // "MSC1"

/// The longest shared-memory name a set-up message may carry (POSIX names are at most `NAME_MAX`).
const MAX_SHM_NAME: usize = 255;

impl SetupInfo {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(256);
        w.u32(SETUP_MAGIC)
            .u32(self.rank)
            .i32(self.tag)
            .u16(self.transport)
            .u64(self.process.host)
            .u32(self.process.pid)
            .i32(self.device);
        self.buffer.write(&mut w);
        self.epochs.write(&mut w);
        let (name, offset) = self.fast_flag.as_ref().map_or(("", 0), |(n, o)| (n.as_str(), *o));
        w.string(name.as_bytes()).u32(offset);
        w.into_bytes()
    }

    pub fn from_bytes(b: &[u8]) -> Result<SetupInfo> {
        let mut r = Reader::new(b, "connection set-up message");
        r.magic(SETUP_MAGIC)?;
        let rank = r.u32()?;
        let tag = r.i32()?;
        let transport = r.u16()?;
        let process = ProcessId {
            host: r.u64()?,
            pid: r.u32()?,
        };
        let device = r.i32()?;
        let buffer = IpcExport::read(&mut r)?;
        let epochs = IpcExport::read(&mut r)?;
        let name = r.string(MAX_SHM_NAME)?;
        let offset = r.u32()?;
        let fast_flag = if name.is_empty() {
            None
        } else {
            let name = std::str::from_utf8(name).map_err(|_| r.malformed("names shared memory in non-UTF-8"))?;
            Some((name.to_string(), offset))
        };
        r.finish()?;
        Ok(SetupInfo {
            rank,
            tag,
            transport,
            process,
            device,
            buffer,
            epochs,
            fast_flag,
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
            fast_flag: None,
        };
        assert_eq!(SetupInfo::from_bytes(&s.to_bytes()).unwrap(), s);
        let with_flag = SetupInfo {
            fast_flag: Some(("/mscclpp-1-2-3".into(), 128)),
            ..s.clone()
        };
        assert_eq!(SetupInfo::from_bytes(&with_flag.to_bytes()).unwrap(), with_flag);
        let mut cut = with_flag.to_bytes();
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
