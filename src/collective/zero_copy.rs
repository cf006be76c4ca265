//! Zero-copy collectives, the host side: which calls try them, the descriptors of a call's own buffers,
//! and the table of the peers' registrations the kernels look descriptors up in. The device side is
//! `kernels/collectives/zero_copy.cuh`, the design `docs/ZERO_COPY.md`, the mappings' bookkeeping
//! `peer_buffers.rs`; eager all-gathers and broadcasts may go by the copy engine first (`copy_engine.rs`),
//! which reads the same table through `ZeroCopy::resolve`.
//!
//! A call tries zero-copy on every rank or on none: the choice here depends only on what every rank of the
//! call shares (collective, operator, ranks, size, placement, `MSCCLPP_COLL_ALGO`), never on this rank's
//! registrations. The kernels then vote on whether every rank reaches every buffer; when the vote says no,
//! the same launch runs the scratch algorithm the call would have taken.

use super::algorithm::{Choice, Placement, zero_copy_from};
use super::kernel_args::MAX_RANKS;
use super::peer_buffers::{IpcOpener, MAX_SLOTS, PeerTable};
use super::signal::{PeerWindow, PeerWindows};
use super::{Collective, RedOp};
use crate::bootstrap::Bootstrap;
use crate::error::Result;
use crate::gpu::{DevicePtr, GpuContext, PinnedHostBuffer};
use crate::registration::Registration;
use std::sync::atomic::{Ordering, fence};

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
        Choice::Force(_) => false,
    }
}

/// The zero-copy kernel's name without its operator and type (`mscclpp_<this>[_<op>_<type>]`).
pub fn kernel_base(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "allreduce_zc",
        Collective::ReduceScatter => "reducescatter_zc",
        Collective::Broadcast => "broadcast_zc",
        _ => "allgather_zc",
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

/// The descriptor (tag, offset into the registration) of this rank's `[ptr, ptr + len)`, or (0, 0) when
/// no live registration exported to the peers holds all of it. `lookup` is `Registrations::lookup`;
/// `slot_of` gives an exported registration's slot and generation by token.
pub fn descriptor(
    ptr: DevicePtr,
    len: u64,
    lookup: impl FnOnce(DevicePtr, usize) -> Option<(u64, Registration)>,
    slot_of: impl FnOnce(u64) -> Option<(u32, u32)>,
) -> (u64, u64) {
    if ptr == 0 || len == 0 {
        return (0, 0);
    }
    lookup(ptr, len as usize)
        .and_then(|(token, registration)| {
            let (slot, generation) = slot_of(token)?;
            Some((tag(slot, generation), ptr - registration.ptr))
        })
        .unwrap_or((0, 0))
}

/// The peers' registrations as this rank reaches them, and their copy the kernels read. Dropped with the
/// collectives at the communicator's destroy, after its kernels ended: every mapping closes then.
pub struct ZeroCopy {
    peers: PeerTable<IpcOpener>,
    /// Host memory mapped for the device: `TABLE_BYTES`, rewritten by `refresh`.
    table: PinnedHostBuffer,
    /// What `table` holds, by `[peer][slot]`: (generation, address).
    shadow: Vec<(u32, u64)>,
    /// The peers' windows by ordinal, for the one-sided calls (`signal.rs`), from the same records.
    windows: PeerWindows,
}

impl ZeroCopy {
    pub fn new(gpu: &GpuContext, rank: usize, nranks: usize) -> Result<ZeroCopy> {
        let mut peers = PeerTable::new(rank, nranks, IpcOpener { gpu: *gpu })?;
        peers.hold_closes();
        Ok(ZeroCopy {
            peers,
            table: PinnedHostBuffer::zeroed(gpu, TABLE_BYTES)?,
            shadow: vec![(0, 0); MAX_RANKS * MAX_SLOTS],
            windows: PeerWindows::default(),
        })
    }

    /// `peer`'s window of ordinal `ordinal` as its record described it, and where it is mapped in this
    /// context if it is (`None` where opening it failed, or for a peer of this process, which maps
    /// nothing).
    pub fn window(&self, peer: usize, ordinal: u32) -> Option<(PeerWindow, Option<DevicePtr>)> {
        let w = self.windows.get(peer, ordinal)?;
        Some((w, self.peers.resolve(peer, w.slot, w.generation)))
    }

    /// Where byte `offset` of the peer's registration named by `tag` is in this context, if this rank
    /// holds exactly that generation of it (the host's `zcResolve`).
    pub fn resolve(&self, peer: usize, tag: u64, offset: u64) -> Option<DevicePtr> {
        let (slot, generation) = untag(tag)?;
        self.peers.resolve(peer, slot, generation).map(|base| base + offset)
    }

    /// The table's address for the kernels (`CollArgs::zcTable`).
    pub fn table_ptr(&self) -> DevicePtr {
        self.table.device_ptr()
    }

    /// Takes the records the peers have pushed, applies them and rewrites the table. A mapping a record
    /// removes or replaces is retired, not closed: kernels launched before may still read it. Retired
    /// mappings are closed once the context is idle (`cuCtxSynchronize`, made only when some wait, and not
    /// during a capture, which forbids it: then at the next call outside one).
    pub fn refresh(&mut self, bootstrap: &Bootstrap, gpu: &GpuContext, capturing: bool) -> Result<()> {
        let records = self.peers.take(bootstrap);
        let changed = !records.is_empty();
        for (peer, record) in records {
            self.windows.note(peer, &record);
            self.peers.apply_logged(peer, record);
        }
        if changed {
            self.write_table()?;
        }
        if self.peers.has_retired() && !capturing {
            gpu.synchronize()?;
            let closed = self.peers.release_retired();
            log::debug!("{closed} peer mapping(s) of deregistered buffers closed");
        }
        Ok(())
    }

    /// Makes the table what `peers` holds. An entry changes as the kernels expect (`zcResolve`): its
    /// generation 0 first, then the address, then the new generation.
    fn write_table(&mut self) -> Result<()> {
        let mut wanted = vec![(0u32, 0u64); MAX_RANKS * MAX_SLOTS];
        for (peer, slot, generation, address) in self.peers.device_entries() {
            wanted[peer * MAX_SLOTS + slot as usize] = (generation, address);
        }
        for (i, (&want, have)) in wanted.iter().zip(self.shadow.iter_mut()).enumerate() {
            if want == *have {
                continue;
            }
            self.table.store_u64(i * 16, 0)?;
            fence(Ordering::SeqCst);
            self.table.store_u64(i * 16 + 8, want.1)?;
            fence(Ordering::SeqCst);
            self.table.store_u64(i * 16, want.0 as u64)?;
            *have = want;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::{Allocation, Kind, Registrations};

    #[test]
    fn the_choice_depends_on_what_every_rank_shares() {
        use super::super::algorithm::{Protocol, packet_limit};
        assert!(packet_limit(Collective::AllReduce, 2) < 16 << 20);
        let sum = Some(RedOp::Sum);
        let one = Placement::OneGpu;
        let several = Placement::SeveralGpus;
        let limit = packet_limit(Collective::AllReduce, 2);
        assert!(!attempt(Collective::AllReduce, sum, 2, one, limit, Choice::Auto));
        assert!(
            !attempt(Collective::AllReduce, sum, 2, one, 4 << 20, Choice::Auto),
            "slower at 4 MiB"
        );
        assert!(attempt(Collective::AllReduce, sum, 2, one, 16 << 20, Choice::Auto));
        assert!(attempt(Collective::ReduceScatter, sum, 16, one, 16 << 20, Choice::Auto));
        // Across GPUs only where it measured faster.
        assert!(!attempt(Collective::AllReduce, sum, 2, several, 16 << 20, Choice::Auto));
        assert!(attempt(Collective::AllReduce, sum, 2, several, 64 << 20, Choice::Auto));
        assert!(attempt(Collective::Broadcast, None, 2, several, 16 << 20, Choice::Auto));
        assert!(attempt(Collective::AllGather, None, 2, several, 1 << 30, Choice::Auto));
        assert!(!attempt(
            Collective::AllGather,
            None,
            2,
            several,
            16 << 20,
            Choice::Auto
        ));
        assert!(attempt(Collective::AllGather, None, 2, one, 1 << 30, Choice::Auto));
        assert!(attempt(Collective::AllGather, None, 4, several, 1, Choice::ZeroCopy));
        // Forcing the copy engine forces the kernels too, for what the copy engine does not take (all-reduce,
        // reduce-scatter, captured calls, calls some rank cannot go by it).
        assert!(attempt(Collective::AllReduce, sum, 2, several, 1, Choice::CopyEngine));
        assert!(attempt(Collective::AllGather, None, 2, several, 1, Choice::CopyEngine));
        let copy = Choice::Force(Protocol::Copy);
        assert!(!attempt(Collective::AllGather, None, 4, one, 1 << 30, copy));
        assert!(!attempt(Collective::AllReduce, sum, 1, one, 1 << 30, Choice::ZeroCopy));
        assert!(!attempt(Collective::AllReduce, sum, 2, one, 0, Choice::ZeroCopy));
        for c in [
            Collective::Reduce,
            Collective::Gather,
            Collective::Scatter,
            Collective::AllToAll,
        ] {
            assert!(!attempt(c, sum, 2, one, 1 << 30, Choice::ZeroCopy), "{c:?}");
            assert_eq!(zero_copy_from(c, 2, one), None);
        }
        let premul = RedOp::PreMulSum(super::super::Scalar::Immediate(1));
        assert!(!attempt(
            Collective::AllReduce,
            Some(premul),
            2,
            one,
            1 << 30,
            Choice::ZeroCopy
        ));
    }

    #[test]
    fn tags_name_slot_and_generation() {
        assert_eq!(tag(0, 1), 0x8000_0000_0000_0001);
        assert_eq!(tag(63, 0xffff_ffff), 0x8000_003f_ffff_ffff);
        assert_eq!(untag(tag(63, 0xffff_ffff)), Some((63, 0xffff_ffff)));
        assert_eq!(untag(tag(5, 2)), Some((5, 2)));
        assert_eq!(untag(0), None);
    }

    #[test]
    fn descriptors_of_exported_registrations_only() {
        let registrations = Registrations::default();
        let allocation = Allocation {
            buffer_id: 7,
            base: 0x10_0000,
            size: 1 << 20,
            device: 0,
        };
        let token = registrations.insert(Registration {
            ptr: 0x10_0100,
            len: 4096,
            kind: Kind::Buffer,
            allocation,
            library_memory: false,
        });
        let same = |p: DevicePtr, l: usize| registrations.lookup_with(p, l, |_, _| Ok(allocation));
        let exported = |t: u64| (t == token).then_some((3, 9));
        assert_eq!(descriptor(0x10_0200, 64, same, exported), (tag(3, 9), 0x100));
        assert_eq!(descriptor(0x10_0100, 4096, same, exported), (tag(3, 9), 0));
        // Past the registration's end, not exported, null, empty, or its memory reallocated: not zero-copy.
        assert_eq!(descriptor(0x10_0200, 4096, same, exported), (0, 0));
        assert_eq!(descriptor(0x10_0200, 64, same, |_| None), (0, 0));
        assert_eq!(descriptor(0, 64, same, exported), (0, 0));
        assert_eq!(descriptor(0x10_0200, 0, same, exported), (0, 0));
        let moved = Allocation {
            buffer_id: 8,
            ..allocation
        };
        let reallocated = |p: DevicePtr, l: usize| registrations.lookup_with(p, l, |_, _| Ok(moved));
        assert_eq!(descriptor(0x10_0200, 64, reallocated, exported), (0, 0));
    }
}
