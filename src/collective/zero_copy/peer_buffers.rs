//! The peers' registered buffers as this rank reaches them: per peer and slot, the newest generation heard
//! of and its mapping (`PeerTable`), and the copy of it the kernels read (`PeerBuffers`).
//!
//! `PeerTable::resolve` answers "do I hold peer p's slot s at generation g, and where is it?", the question
//! of the kernels' vote and of the copy engine's plan; `device_entries` lists what the device-visible table
//! (`peerBase[peer][slot]` with its generation) is to hold. `PeerBuffers::refresh` takes the records the
//! peers have pushed (`records.rs`) before each zero-copy, copy-engine or one-sided call, applies them, and
//! rewrites that table; a mapping a record removes or replaces is closed only once the kernels that may
//! read it have ended. A peer's allocation is mapped with CUDA IPC (`IpcOpener`, `cuIpcOpenMemHandle`); a
//! peer of this process maps nothing, and is reached at the registration's own address (its record carries
//! it: `PeerBuffers::window`, and `Scratch::in_this_process` for the kernels).

use super::peer_windows::{PeerWindow, PeerWindows};
use super::records::{Exported, Record};
use super::{MAX_SLOTS, TABLE_BYTES, untag};
use crate::bootstrap::Bootstrap;
use crate::collective::kernel_args::MAX_RANKS;
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, GpuContext, IpcMapping, PinnedHostBuffer};
use std::collections::HashMap;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Weak};

/// Opens a peer's exported allocation in this rank's context. The real one calls `cuIpcOpenMemHandle`;
/// dropping its `Mapping` closes it.
pub trait Opener {
    type Mapping;
    /// Maps the allocation of `alloc_size` bytes that `peer` exported as `handle`; gives the mapping and
    /// the address of the allocation's first byte in this context.
    fn open(&self, peer: usize, handle: &[u8], alloc_size: u64) -> Result<(Self::Mapping, u64)>;
}

/// The real `Opener`: a peer's allocation mapped into this rank's context with CUDA IPC.
pub struct IpcOpener {
    pub gpu: GpuContext,
}

impl Opener for IpcOpener {
    type Mapping = IpcMapping;
    fn open(&self, peer: usize, handle: &[u8], _alloc_size: u64) -> Result<(IpcMapping, u64)> {
        let mapping = IpcMapping::open(&self.gpu, ipc_handle(peer, handle)?)?;
        let base = mapping.base();
        Ok((mapping, base))
    }
}

/// `handle` as a CUDA IPC handle, checked before the driver is asked: one of another size is not one.
fn ipc_handle(peer: usize, handle: &[u8]) -> Result<&[u8; 64]> {
    handle.try_into().map_err(|_| {
        Error::invalid_argument(format!(
            "peer {peer}'s exported handle has {} bytes, and a CUDA IPC handle 64",
            handle.len()
        ))
    })
}

/// A peer's registration opened here.
struct Entry<M> {
    // Shared by every registration of the peer in one allocation: an allocation is opened once per
    // context (CUDA IPC refuses a second open of it), and closed when the last of them goes.
    /// Keeps the allocation mapped; dropped (closed) with the entry.
    _mapping: Arc<M>,
    /// The registration's first byte in this context: the mapped base plus its offset in the allocation.
    address: u64,
}

/// One slot of a peer's registrations.
struct PeerSlot<M> {
    /// The newest generation heard of for the slot (0: none), held or not: an `Added` of it or of an older
    /// one is stale, even after its `Gone` or a failed open.
    generation: u32,
    /// The mapping of `generation`, while it is open.
    entry: Option<Entry<M>>,
}

impl<M> Default for PeerSlot<M> {
    fn default() -> Self {
        PeerSlot {
            generation: 0,
            entry: None,
        }
    }
}

/// `records` less every `Added` followed, among them, by the `Gone` of the same peer, slot and generation:
/// that registration ended before this rank could use it, and its memory may be freed already, so opening
/// it would fail (as it did for PyTorch's allocator hook, which registers and deregisters segments as they
/// come and go) or map memory about to go. The `Gone` stays (it finds nothing held, and is ignored).
fn without_finished(records: Vec<(usize, Record)>) -> Vec<(usize, Record)> {
    let finished = |i: usize, peer: usize, record: &Record| {
        matches!(record, Record::Added(_))
            && records[i + 1..].iter().any(|(p, later)| {
                *p == peer
                    && matches!(later, Record::Gone { .. })
                    && (later.slot(), later.generation()) == (record.slot(), record.generation())
            })
    };
    let skip: Vec<bool> = records
        .iter()
        .enumerate()
        .map(|(i, (peer, record))| finished(i, *peer, record))
        .collect();
    let skipped = skip.iter().filter(|&&s| s).count();
    if skipped > 0 {
        log::debug!("{skipped} registration(s) of the peers ended before they were mapped here");
    }
    records
        .into_iter()
        .zip(skip)
        .filter_map(|(r, s)| (!s).then_some(r))
        .collect()
}

/// The peers' registrations as this rank reaches them: per peer and slot, the current generation and its
/// mapping. The owner serializes `apply` and `absorb` (which change it) against the readers.
pub struct PeerTable<O: Opener> {
    rank: usize,
    nranks: usize,
    opener: O,
    /// By peer (this rank's row stays empty), then slot.
    peers: Vec<Vec<PeerSlot<O::Mapping>>>,
    /// `hold_closes`: mappings taken out of their slots stay open here until `release_retired`.
    hold: bool,
    retired: Vec<Entry<O::Mapping>>,
    /// Every open mapping by (peer, the owner's buffer id of the allocation), with its base here: a second
    /// registration in the same allocation shares it.
    open: HashMap<(usize, u64), OpenAllocation<O::Mapping>>,
}

/// An allocation of a peer open here: its mapping while any registration holds it, and its base.
type OpenAllocation<M> = (Weak<M>, u64);

impl<O: Opener> PeerTable<O> {
    /// The table of rank `rank` of `nranks`, empty.
    pub fn new(rank: usize, nranks: usize, opener: O) -> Result<PeerTable<O>> {
        if nranks > MAX_RANKS {
            return Err(Error::invalid_usage(format!(
                "zero-copy collectives span at most {MAX_RANKS} ranks; this communicator has {nranks}"
            )));
        }
        crate::ensure_arg!(rank < nranks, "rank {rank} out of range for nranks {nranks}");
        let peers = (0..nranks)
            .map(|_| (0..MAX_SLOTS).map(|_| PeerSlot::default()).collect())
            .collect();
        Ok(PeerTable {
            rank,
            nranks,
            opener,
            peers,
            hold: false,
            retired: Vec::new(),
            open: HashMap::new(),
        })
    }

    /// Checks that `peer` is another rank of the communicator and `slot` a slot.
    fn check(&self, peer: usize, slot: u32) -> Result<()> {
        crate::ensure_arg!(
            peer < self.nranks,
            "peer {peer} out of range for nranks {}",
            self.nranks
        );
        crate::ensure_arg!(
            peer != self.rank,
            "peer {peer} is this rank: a rank maps no registration of its own"
        );
        crate::ensure_arg!(
            (slot as usize) < MAX_SLOTS,
            "slot {slot} of peer {peer} out of range (at most {MAX_SLOTS} slots)"
        );
        Ok(())
    }

    /// Applies a record pushed by `peer`. An `Added` newer than the slot's generation replaces what the
    /// slot holds (the old mapping is closed) and opens the new one; an older or the same is stale and
    /// ignored. A `Gone` of the held generation closes its mapping; of another generation it is ignored.
    /// A failed open leaves the slot empty and gives the opener's error.
    pub fn apply(&mut self, peer: usize, record: Record) -> Result<()> {
        self.check(peer, record.slot())?;
        if let Some(why) = record.inconsistency() {
            return Err(Error::invalid_argument(format!(
                "registration record from peer {peer} {why}"
            )));
        }
        let slot = record.slot();
        match record {
            Record::Added(Exported {
                generation,
                offset_in_allocation,
                len,
                alloc_size,
                buffer_id,
                handle,
                ..
            }) => {
                let held = &mut self.peers[peer][slot as usize];
                if generation <= held.generation {
                    log::debug!(
                        "peer {peer}'s registration slot {slot}: generation {generation} added, ignored (stale: \
                         generation {} heard of already)",
                        held.generation
                    );
                    return Ok(());
                }
                // The peer reuses a slot only after its registration is gone: the old mapping is closed
                // first (or retired: `hold_closes`), whatever becomes of the new one.
                held.generation = generation;
                let old = held.entry.take();
                self.dispose(old);
                let opened = self
                    .open_shared(peer, buffer_id, &handle, alloc_size)
                    .and_then(|(mapping, base)| match base.checked_add(offset_in_allocation) {
                        Some(address) => Ok((mapping, address)),
                        None => Err(Error::internal(format!(
                            "mapped at {base:#x}, where offset {offset_in_allocation} overflows"
                        ))),
                    });
                match opened {
                    Ok((mapping, address)) => {
                        log::debug!(
                            "peer {peer}'s registration slot {slot} generation {generation}: {len} bytes at \
                             {address:#x} (buffer id {buffer_id})"
                        );
                        self.peers[peer][slot as usize].entry = Some(Entry {
                            _mapping: mapping,
                            address,
                        });
                        Ok(())
                    }
                    // The slot stays empty: the vote answers no for it, and calls take the scratch path. The
                    // caller logs it (absorb: once, at warn).
                    Err(e) => Err(Error::new(
                        e.kind,
                        format!(
                            "{len} bytes cannot be mapped ({}); collectives on them will not be zero-copy",
                            e.message
                        ),
                    )),
                }
            }
            Record::Gone { generation, .. } => {
                let held = &mut self.peers[peer][slot as usize];
                if held.generation == generation && held.entry.is_some() {
                    let old = held.entry.take();
                    self.dispose(old);
                    log::debug!("peer {peer}'s registration slot {slot} generation {generation}: gone, unmapped");
                } else {
                    log::debug!(
                        "peer {peer}'s registration slot {slot}: generation {generation} gone, ignored (generation \
                         {} {})",
                        held.generation,
                        if held.entry.is_some() { "held" } else { "not held" }
                    );
                }
                Ok(())
            }
        }
    }

    #[cfg(test)]
    /// Applies every record the peers have pushed (`publish`) and that has arrived, each peer's in the
    /// order it pushed them, without waiting: `take`, then `apply_logged` of each. Gives how many records
    /// were applied (a stale one, ignored by `apply`, counts: it was taken into account).
    pub fn absorb(&mut self, bootstrap: &Bootstrap) -> usize {
        let records = self.take(bootstrap);
        records
            .into_iter()
            .filter(|(peer, record)| self.apply_logged(*peer, record.clone()))
            .count()
    }

    /// Every record the peers have pushed and that has arrived, decoded, each peer's in the order it pushed
    /// them, without waiting. One that cannot be read is logged and skipped, and so is an `Added` whose
    /// `Gone` arrived with it (`without_finished`).
    pub fn take(&self, bootstrap: &Bootstrap) -> Vec<(usize, Record)> {
        debug_assert_eq!(
            (bootstrap.rank(), bootstrap.nranks()),
            (self.rank, self.nranks),
            "a table takes the records of its own communicator"
        );
        let mut out = Vec::new();
        for peer in (0..self.nranks).filter(|&p| p != self.rank) {
            for message in bootstrap.take_registration_records(peer) {
                match Record::decode(&message) {
                    Ok(record) => out.push((peer, record)),
                    Err(e) => log::warn!(
                        "a registration record from peer {peer} ({} bytes) is skipped: {}",
                        message.len(),
                        e.message
                    ),
                }
            }
        }
        without_finished(out)
    }

    /// `apply`, its error logged (a failed open among others: the registration is then not zero-copy);
    /// gives whether it was applied.
    pub fn apply_logged(&mut self, peer: usize, record: Record) -> bool {
        let what = match &record {
            Record::Added(_) => "added",
            Record::Gone { .. } => "gone",
        };
        let (slot, generation) = (record.slot(), record.generation());
        match self.apply(peer, record) {
            Ok(()) => true,
            Err(e) => {
                log::warn!(
                    "peer {peer}'s registration record \"slot {slot} generation {generation} {what}\" is \
                     skipped: {}",
                    e.message
                );
                false
            }
        }
    }

    /// The mapping of `peer`'s allocation `buffer_id` and its base here: the one open already (for another
    /// registration in it), or a new one.
    fn open_shared(
        &mut self,
        peer: usize,
        buffer_id: u64,
        handle: &[u8],
        alloc_size: u64,
    ) -> Result<(Arc<O::Mapping>, u64)> {
        if let Some((weak, base)) = self.open.get(&(peer, buffer_id))
            && let Some(mapping) = weak.upgrade()
        {
            return Ok((mapping, *base));
        }
        let (mapping, base) = self.opener.open(peer, handle, alloc_size)?;
        let mapping = Arc::new(mapping);
        self.open.retain(|_, (weak, _)| weak.strong_count() > 0);
        self.open.insert((peer, buffer_id), (Arc::downgrade(&mapping), base));
        Ok((mapping, base))
    }

    /// From now on, a mapping that `apply` replaces or removes is not closed at once but retired: it stays
    /// open, no longer resolved, until `release_retired` (kernels launched before may still read it).
    pub fn hold_closes(&mut self) {
        self.hold = true;
    }

    /// Closes the retired mappings (once no kernel may read them); gives how many.
    pub fn release_retired(&mut self) -> usize {
        let n = self.retired.len();
        self.retired.clear();
        n
    }

    /// Whether mappings wait in `retired`.
    pub fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// A mapping taken out of its slot: closed now, or retired (`hold_closes`).
    fn dispose(&mut self, entry: Option<Entry<O::Mapping>>) {
        if let Some(entry) = entry
            && self.hold
        {
            self.retired.push(entry);
        }
    }

    /// The address, in this context, of the first byte of `peer`'s registration in `slot`, only while
    /// exactly `generation` of it is held: what the kernels' vote relies on, and the copy engine's plan.
    pub fn resolve(&self, peer: usize, slot: u32, generation: u32) -> Option<u64> {
        let held = self.peers.get(peer)?.get(slot as usize)?;
        match &held.entry {
            Some(entry) if held.generation == generation => Some(entry.address),
            _ => None,
        }
    }

    /// Every held registration as (peer, slot, generation, address), by peer and then slot: what the
    /// device-visible table is to hold.
    pub fn device_entries(&self) -> Vec<(usize, u32, u32, u64)> {
        let mut out = Vec::new();
        for (peer, slots) in self.peers.iter().enumerate() {
            for (slot, held) in slots.iter().enumerate() {
                if let Some(entry) = &held.entry {
                    out.push((peer, slot as u32, held.generation, entry.address));
                }
            }
        }
        out
    }

    /// Closes every mapping; gives how many there were. The generations heard of are kept, so that a late
    /// record stays stale. (The communicator's destroy drops the table instead, which closes them all.)
    #[cfg(test)]
    pub fn clear(&mut self) -> usize {
        let mut n = self.release_retired();
        for held in self.peers.iter_mut().flatten() {
            n += held.entry.take().is_some() as usize;
        }
        n
    }

    #[cfg(test)]
    /// How many mappings are open.
    pub fn len(&self) -> usize {
        self.peers.iter().flatten().filter(|h| h.entry.is_some()).count()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The peers' registrations as this rank reaches them, and their copy the kernels read. Dropped at the
/// communicator's destroy, after its kernels ended (`ZeroCopy::drop_peers`): every mapping closes then.
pub struct PeerBuffers {
    peers: PeerTable<IpcOpener>,
    /// Host memory mapped for the device: `TABLE_BYTES`, rewritten by `refresh`.
    table: PinnedHostBuffer,
    /// What `table` holds, by `[peer][slot]`: (generation, address).
    shadow: Vec<(u32, u64)>,
    /// The peers' windows by ordinal, for the one-sided calls (`signal.rs`), from the same records.
    windows: PeerWindows,
}

impl PeerBuffers {
    pub fn new(gpu: &GpuContext, rank: usize, nranks: usize) -> Result<PeerBuffers> {
        let mut peers = PeerTable::new(rank, nranks, IpcOpener { gpu: *gpu })?;
        peers.hold_closes();
        Ok(PeerBuffers {
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
mod tests;
