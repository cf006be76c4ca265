//! A connection: one side of a (rank, peer, tag) pairing, as `mscclppConnect` records it and
//! `mscclppConnectionSetup` completes it. What is common to every transport lives here: the peer, the
//! tag, the local buffer, the epoch block and the set-up message's envelope; what a transport adds lives
//! in its folder under `transport/`.

use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::gpu::{DeviceAllocation, DevicePtr, GpuContext};
use crate::types::{mscclppBaseConn, mscclppConcurrentFifo, mscclppDevConn, mscclppDevConnSignalEpochId};

/// How a connection moves data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// Copy engine over NVLink/PCIe, peers' memory mapped with CUDA IPC.
    P2p,
    /// RDMA writes through the named InfiniBand device.
    Ib { device: String },
}

impl TransportKind {
    /// The kind's `mscclppTransport_t`, also sent in set-up messages so that a peer that chose another
    /// transport for the connection is caught.
    pub fn code(&self) -> u16 {
        match self {
            TransportKind::P2p => 0,
            TransportKind::Ib { .. } => 2,
        }
    }
}

/// A connection's epoch block: eight 64-bit words of device memory, the counters of one side of the
/// connection. `localSignalEpochId` and `waitEpochId` point into it, and this header's device code finds
/// the other words from `localSignalEpochId`:
///
/// | word | what | written by |
/// | --- | --- | --- |
/// | 0 | `device`: signals this side raised (`mscclppDevConnSignalEpochId::device`) | our kernels |
/// | 1 | `proxy`: flags the peer's proxy has landed here (`mscclppDevConnSignalEpochId::proxy`) | the peer's proxy |
/// | 2 | `waitEpochId`: the waits this side has done | our kernels |
/// | 3 | address of the fast flag (P2P; 0 without one) | set-up |
/// | 4 | direct signals sent (the proxy-free methods) | our kernels |
/// | 5 | direct signals received | the peer's kernels |
/// | 6 | direct waits done | our kernels |
/// | 7 | the waits' fast-flag mode | our kernels' `wait()` |
pub struct EpochBlock {
    alloc: DeviceAllocation,
}

impl EpochBlock {
    pub const BYTES: usize = 64;
    /// Word index of the peer's proxy's published epoch (`mscclppDevConnSignalEpochId::proxy`).
    pub const PROXY_WORD: u64 = 1;
    /// Word index of the fast flag's address.
    const FAST_FLAG_WORD: u64 = 3;
    /// Word index of the direct signals received from the peer.
    pub const DIRECT_RECEIVED_WORD: u64 = 5;

    /// A zeroed block on `ctx`'s GPU.
    pub fn new(ctx: &GpuContext) -> Result<EpochBlock> {
        Ok(EpochBlock {
            alloc: DeviceAllocation::zeroed(ctx, Self::BYTES)?,
        })
    }
    /// Writes the device address of the connection's fast flag (P2P), where the device code finds it.
    pub fn set_fast_flag_address(&self, address: DevicePtr) -> Result<()> {
        self.alloc.write_u64(Self::FAST_FLAG_WORD * 8, address)
    }
    /// Address of `mscclppDevConnSignalEpochId` (words 0 and 1), the start of the block.
    pub fn signal(&self) -> DevicePtr {
        self.alloc.ptr()
    }
    /// Address of `waitEpochId` (word 2).
    pub fn wait(&self) -> DevicePtr {
        self.alloc.ptr() + std::mem::size_of::<mscclppDevConnSignalEpochId>() as u64
    }
}

/// One connection, as the communicator records it.
pub struct Connection {
    pub remote_rank: usize,
    pub tag: i32,
    pub transport: TransportKind,
    pub local_buff: DevicePtr,
    pub local_size: u64,
    pub epochs: EpochBlock,
}

impl Connection {
    /// The connection's device view with its common part filled: the rank, the tag, our buffer and epoch
    /// block. The transport fills the rest (`Transport::fill_device_connection`); the peer's buffer and
    /// epoch block stay null where kernels cannot reach them, the FIFO is the transport's.
    pub fn device_view(&self, conn: usize) -> mscclppDevConn {
        mscclppDevConn {
            base: mscclppBaseConn {
                remoteRank: self.remote_rank as i32,
                tag: self.tag,
                localBuff: self.local_buff as *mut _,
                localSignalEpochId: self.epochs.signal() as *mut _,
                remoteSignalEpochId: std::ptr::null_mut(),
                waitEpochId: self.epochs.wait() as *mut _,
                remoteBuff: std::ptr::null_mut(),
            },
            fifo: mscclppConcurrentFifo {
                triggerFifo: std::ptr::null_mut(),
                triggerFifoTail: std::ptr::null_mut(),
                triggerFifoHead: std::ptr::null_mut(),
                connId: conn as i32,
            },
        }
    }
}

/// The set-up message of one connection, as the communicator sends it through the bootstrap: who sends
/// it (rank and tag, checked against the connection), the transport it chose, and the transport's own
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupMessage {
    pub rank: u32,
    pub tag: i32,
    pub transport: u16,
    pub payload: Vec<u8>,
}

const SETUP_MAGIC: u32 = 0x4d53_4331; // "MSC1"

/// The largest transport message a set-up message may carry.
const MAX_PAYLOAD: usize = 1 << 16;

impl SetupMessage {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(16 + self.payload.len());
        w.u32(SETUP_MAGIC)
            .u32(self.rank)
            .i32(self.tag)
            .u16(self.transport)
            .string(&self.payload);
        w.into_bytes()
    }

    pub fn from_bytes(b: &[u8]) -> Result<SetupMessage> {
        let mut r = Reader::new(b, "connection set-up message");
        r.magic(SETUP_MAGIC)?;
        let m = SetupMessage {
            rank: r.u32()?,
            tag: r.i32()?,
            transport: r.u16()?,
            payload: r.string(MAX_PAYLOAD)?.to_vec(),
        };
        r.finish()?;
        Ok(m)
    }

    /// Checks that the message is the peer's side of connection (`peer`, `tag`) over `transport`.
    pub fn check(&self, peer: usize, tag: i32, transport: &TransportKind) -> Result<()> {
        if self.rank as usize != peer || self.tag != tag {
            return Err(Error::remote(format!(
                "rank {peer} answered set-up of tag {tag} with rank {} tag {}",
                self.rank, self.tag
            )));
        }
        if self.transport != transport.code() {
            return Err(Error::invalid_usage(format!(
                "connection to rank {peer} tag {tag}: this side uses transport {} but the peer uses {}",
                transport.code(),
                self.transport
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_messages_round_trip_and_garbage_is_refused() {
        let m = SetupMessage {
            rank: 3,
            tag: -7,
            transport: 0,
            payload: vec![1, 2, 3],
        };
        assert_eq!(SetupMessage::from_bytes(&m.to_bytes()).unwrap(), m);
        let mut cut = m.to_bytes();
        cut.pop();
        assert!(SetupMessage::from_bytes(&cut).is_err());
        let mut long = m.to_bytes();
        long.push(0);
        assert!(SetupMessage::from_bytes(&long).is_err());
        let mut bad = m.to_bytes();
        bad[0] ^= 1;
        assert!(SetupMessage::from_bytes(&bad).is_err());
        assert!(SetupMessage::from_bytes(&bad[..10]).is_err());
    }

    #[test]
    fn a_setup_message_must_come_from_the_peer_and_tag_over_the_same_transport() {
        let m = SetupMessage {
            rank: 3,
            tag: -7,
            transport: 0,
            payload: Vec::new(),
        };
        m.check(3, -7, &TransportKind::P2p).unwrap();
        assert!(
            m.check(2, -7, &TransportKind::P2p)
                .unwrap_err()
                .message
                .contains("rank 3 tag -7")
        );
        assert!(m.check(3, 7, &TransportKind::P2p).is_err());
        let ib = TransportKind::Ib {
            device: "mlx5_0".into(),
        };
        let e = m.check(3, -7, &ib).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
        assert!(
            e.message.contains("this side uses transport 2 but the peer uses 0"),
            "{}",
            e.message
        );
    }
}
