//! Zero-copy collectives, the host side: where a call decides to try them, and the one owner of what they
//! need, this rank's registrations exported to the peers and the peers' mapped here (`ZeroCopy`). The
//! device side is `kernels/collectives/zero_copy.cuh`, the design `docs/ZERO_COPY.md`; eager all-gathers
//! and broadcasts may go by the copy engine first (`copy_engine.rs`), which reads the same table through
//! `ZeroCopy::resolve`, and the one-sided calls find the peers' windows here (`ZeroCopy::window`).
//!
//! A call tries zero-copy on every rank or on none: the choice here (`attempt`) depends only on what every
//! rank of the call shares (collective, operator, ranks, size, placement, `MSCCLPP_COLL_ALGO`), never on
//! this rank's registrations. The kernels then vote on whether every rank reaches every buffer; when the
//! vote says no, the same launch runs the scratch algorithm the call would have taken.
//!
//! The files:
//! - `own_slots.rs`: this rank's registrations' slots and generations, their export (`cuIpcGetMemHandle`)
//!   and the descriptors (tag and offset) by which a call names its buffers to the peers;
//! - `records.rs`: the `Added` / `Gone` records pushed to the peers, their wire format, and `publish`;
//! - `peer_buffers.rs`: the peers' registrations as this rank reaches them (`PeerTable`: per peer and slot,
//!   the newest generation and its CUDA IPC mapping) and the device-visible table the kernels read
//!   (`PeerBuffers`);
//! - `peer_windows.rs`: the peers' windows by ordinal, noted from the same records, where the one-sided
//!   calls (`signal.rs`) find a put's target.

mod own_slots;
mod peer_buffers;
mod peer_windows;
mod records;

pub(crate) use peer_windows::PeerWindow;
use records::Record;

use super::algorithm::{Choice, Placement, zero_copy_from};
use super::kernel_args::MAX_RANKS;
use super::variants::Kernel;
use super::{Collective, RedOp};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, GpuContext};
use crate::registration::{Registration, Registrations};
use own_slots::OwnSlots;
use parking_lot::Mutex;
use peer_buffers::PeerBuffers;

/// The most registrations a rank exports at once: the slots of the device-visible table per peer.
pub const MAX_SLOTS: usize = 64;

/// Bytes of the device-visible table: `[peer][slot]` of {generation, address}, 64 bits each.
pub const TABLE_BYTES: usize = MAX_RANKS * MAX_SLOTS * 16;

/// Whether a call tries the zero-copy path (one launch: its kernel votes, then moves the data directly or,
/// where the vote says no, by the scratch algorithm):
/// `Choice::Auto` from the sizes of `algorithm::zero_copy_from`, `Choice::ZeroCopy` at every size.
/// PreMulSum never does: a rank reading a peer's input would scale it by its own scalar.
pub fn attempt(
    collective: Collective,
    op: Option<RedOp>,
    nranks: usize,
    placement: Placement,
    message: u64,
    choice: Choice,
) -> bool {
    let family = matches!(
        collective,
        Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter | Collective::Broadcast
    );
    if !family || matches!(op, Some(RedOp::PreMulSum(_))) || nranks < 2 || message == 0 {
        return false;
    }
    match choice {
        Choice::ZeroCopy | Choice::CopyEngine => true,
        Choice::Auto => zero_copy_from(collective, nranks, placement).is_some_and(|from| message >= from),
        Choice::Force(_) | Choice::SendRecv => false,
    }
}

/// The zero-copy kernel of a collective of the family (`attempt`).
pub fn kernel(collective: Collective) -> Kernel {
    match collective {
        Collective::AllReduce => Kernel::AllReduceZc,
        Collective::ReduceScatter => Kernel::ReduceScatterZc,
        Collective::Broadcast => Kernel::BroadcastZc,
        _ => Kernel::AllGatherZc,
    }
}

/// The tag that names a registration's slot and generation to the peers (`CollArgs::zcSendTag`).
pub fn tag(slot: u32, generation: u32) -> u64 {
    (1 << 63) | ((slot as u64) << 32) | generation as u64
}

/// The slot and generation a tag names (`tag`'s inverse); `None` for 0, "no registration".
pub fn untag(tag: u64) -> Option<(u32, u32)> {
    (tag >> 63 == 1).then_some((((tag >> 32) & 0x7fff_ffff) as u32, tag as u32))
}

/// Zero-copy's state on a communicator, its one owner: this rank's registrations exported to the peers,
/// and the peers' as this rank reaches them with the table its kernels read.
#[derive(Default)]
pub struct ZeroCopy {
    /// Slots and generations of this rank's registrations exported to the peers: from the first
    /// registration on, whether or not the collectives are set up.
    own: Mutex<OwnSlots>,
    /// The peers' registrations mapped here: made at the collectives' set-up (`set_up`), kept across a
    /// suspend, dropped at the communicator's destroy or a failed resume (`drop_peers`). Locked after
    /// `Collectives::ready`, which every call that uses it holds.
    peers: Mutex<Option<PeerBuffers>>,
}

impl ZeroCopy {
    /// Exports this rank's registration `token` (`window`: its ordinal among the windows, 0 for a buffer)
    /// and pushes its record to every peer, which maps it at one of its next calls. A registration that
    /// cannot be exported holds no slot.
    pub fn export(&self, bootstrap: &Bootstrap, token: u64, registration: &Registration, window: u32) -> Result<()> {
        let mut own = self.own.lock();
        let (slot, generation) = own.add(token)?;
        let record = own_slots::export(slot, generation, registration, window).inspect_err(|_| {
            own.remove(token);
        })?;
        records::publish(bootstrap, &record)
    }

    /// This rank's registration `token` is gone: its slot is freed, and the peers are told (`Gone`), who
    /// close their mappings once their kernels that may read them have ended. `None` for a registration
    /// that was never exported.
    pub fn withdraw(&self, bootstrap: &Bootstrap, token: u64) -> Option<Result<()>> {
        let (slot, generation) = self.own.lock().remove(token)?;
        Some(records::publish(bootstrap, &Record::Gone { slot, generation }))
    }

    /// This rank's descriptor of `[ptr, ptr + len)` for the peers (`OwnSlots::descriptor`): its exported
    /// registration's tag and the offset into it, or (0, 0).
    pub fn descriptor(&self, registrations: &Registrations, ptr: DevicePtr, len: u64) -> (u64, u64) {
        self.own.lock().descriptor(ptr, len, |p, l| registrations.lookup(p, l))
    }

    /// At the collectives' set-up: makes the peers' table of rank `rank` of `nranks`, unless a suspend
    /// kept it.
    pub fn set_up(&self, gpu: &GpuContext, rank: usize, nranks: usize) -> Result<()> {
        let mut peers = self.peers.lock();
        if peers.is_none() {
            *peers = Some(PeerBuffers::new(gpu, rank, nranks)?);
        }
        Ok(())
    }

    /// Closes every mapping of the peers' registrations: at the communicator's destroy (after its kernels
    /// ended) or a failed resume.
    pub fn drop_peers(&self) {
        self.peers.lock().take();
    }

    /// Takes in the records the peers have pushed and rewrites the table (`PeerBuffers::refresh`).
    pub fn refresh(&self, bootstrap: &Bootstrap, gpu: &GpuContext, capturing: bool) -> Result<()> {
        let mut peers = self.peers.lock();
        peers
            .as_mut()
            .ok_or_else(not_set_up)?
            .refresh(bootstrap, gpu, capturing)
    }

    /// The table's address for the kernels (`CollArgs::zcTable`).
    pub fn table_ptr(&self) -> Result<DevicePtr> {
        Ok(self.peers.lock().as_ref().ok_or_else(not_set_up)?.table_ptr())
    }

    /// Where byte `offset` of the peer's registration named by `tag` is in this context
    /// (`PeerBuffers::resolve`); `None` before the set-up.
    pub fn resolve(&self, peer: usize, tag: u64, offset: u64) -> Option<DevicePtr> {
        self.peers.lock().as_ref()?.resolve(peer, tag, offset)
    }

    /// `peer`'s window of ordinal `ordinal` and where it is mapped here (`PeerBuffers::window`); `None`
    /// before the set-up.
    pub fn window(&self, peer: usize, ordinal: u32) -> Option<(PeerWindow, Option<DevicePtr>)> {
        self.peers.lock().as_ref()?.window(peer, ordinal)
    }
}

fn not_set_up() -> Error {
    Error::internal("the zero-copy table of the peers' registrations is used before the collectives' set-up")
}

#[cfg(test)]
mod tests;
