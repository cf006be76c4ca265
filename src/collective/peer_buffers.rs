//! The peers' registered buffers as this rank reaches them: the host-side bookkeeping of the zero-copy
//! collectives' mappings (`docs/ZERO_COPY.md`, "Mappings: exchanged once per registration, pushed").
//!
//! A zero-copy collective reads and writes the peers' registered buffers directly, and its kernels decide
//! on the GPU, by a vote, whether every rank can reach every other's buffers (the host cannot ask the
//! peers per call). What the vote checks is kept here, and how it travels:
//! - `LocalSlots`: each of this rank's registrations gets a slot and a generation. The slot indexes the
//!   peers' tables; the generation tells a reuse of the slot from the registration it held before, so that
//!   a peer whose mapping is of an older registration never takes it for the new one.
//! - `Record`: what a rank pushes to every peer, once per registration, through the bootstrap's one-way
//!   messages: "slot s, generation g is this allocation, exported as this handle" (`Added`), and later
//!   "slot s, generation g is gone" (`Gone`). No call waits for an answer. A window's `Added` also carries
//!   its ordinal among the owner's windows, by which the one-sided calls match windows (`signal.rs`).
//! - `PeerTable`: per peer and slot, the newest generation heard of and its opened mapping. `resolve`
//!   answers "do I hold peer p's slot s at generation g, and where is it?", the question of the kernels'
//!   vote; `device_entries` lists what the device-visible table (`peerBase[peer][slot]` with its
//!   generation) is to hold.
//! - `publish` and `PeerTable::absorb`: a record travels through the bootstrap's registration records
//!   (`Bootstrap::push_registration_record`), queued at each peer until it absorbs them, without waiting,
//!   whenever it likes (at the start of each collective call, once wired in): no peer is ever asked.
//!
//! Generations start at 1: 0 is never issued, so that an empty entry of the device-visible table (zeroed)
//! never matches a descriptor.
//!
//! CUDA IPC's side: `export` makes the `Added` record of a registration (`cuIpcGetMemHandle` of its
//! allocation), and `IpcOpener` maps a peer's (`cuIpcOpenMemHandle`). Neither serves peers in the same
//! process (a process cannot open its own handles): those will take the registration's address as it is.
//!
//! Used by the collectives: `Collectives::registered` / `deregistered` export and publish this rank's
//! records, `ZeroCopy::refresh` (`zero_copy.rs`) absorbs the peers' before a zero-copy or copy-engine call,
//! and closes a peer's mapping only once the kernels that may read it have ended. Peers of this process are
//! reached at the registration's own address (the record carries it).

use super::kernel_args::MAX_RANKS;
use crate::bootstrap::Bootstrap;
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, IpcExport, IpcMapping};
use crate::registration::Registration;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// The most registrations a rank exports at once: the slots of the device-visible table per peer.
pub const MAX_SLOTS: usize = 64;

/// The largest exported handle a record carries: a `cuIpcGetMemHandle` handle is 64 bytes.
pub const MAX_HANDLE_BYTES: usize = 64;

/// The records' format. A peer speaking another one is refused, never half understood. Version 2 added
/// the window ordinal and the owner's address.
const FORMAT_VERSION: u8 = 2;
const KIND_ADDED: u8 = 1;
const KIND_GONE: u8 = 2;

/// The registration in `slot` at `generation`: `len` bytes at `offset_in_allocation` of an allocation of
/// `alloc_size` bytes, exported as `handle` (opaque bytes: 64 for `cuIpcGetMemHandle`). The handle names
/// the whole allocation, hence the offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exported {
    pub slot: u32,
    pub generation: u32,
    pub offset_in_allocation: u64,
    pub len: u64,
    pub alloc_size: u64,
    /// The owner's `CU_POINTER_ATTRIBUTE_BUFFER_ID`: tells two registrations of one allocation.
    pub buffer_id: u64,
    /// The registration's ordinal among the owner's windows (`Registrations::window_ordinal`), 0 for a
    /// buffer: how the one-sided calls find a peer's registration of a window (`signal.rs`).
    pub window: u32,
    /// The registration's first byte in the owner's address space: what a peer in the same process uses
    /// (a process cannot open its own IPC handles).
    pub address: u64,
    pub handle: Vec<u8>,
}

/// What a rank pushes to its peers about one of its registrations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Added(Exported),
    /// The registration in `slot` at `generation` is deregistered (or found stale): its mapping goes.
    Gone {
        slot: u32,
        generation: u32,
    },
}

impl Record {
    /// The `Added` record of `registration`, given its slot, generation and exported handle.
    pub fn added(slot: u32, generation: u32, registration: &Registration, handle: Vec<u8>) -> Result<Record> {
        let allocation = &registration.allocation;
        let offset_in_allocation = registration.ptr.checked_sub(allocation.base).ok_or_else(|| {
            Error::internal(format!(
                "registration at {:#x} starts before its allocation at {:#x}",
                registration.ptr, allocation.base
            ))
        })?;
        let record = Record::Added(Exported {
            slot,
            generation,
            offset_in_allocation,
            len: registration.len as u64,
            alloc_size: allocation.size as u64,
            buffer_id: allocation.buffer_id,
            window: 0,
            address: registration.ptr,
            handle,
        });
        match record.inconsistency() {
            Some(why) => Err(Error::internal(format!("registration record {why}"))),
            None => Ok(record),
        }
    }

    pub fn slot(&self) -> u32 {
        match self {
            Record::Added(Exported { slot, .. }) | Record::Gone { slot, .. } => *slot,
        }
    }

    pub fn generation(&self) -> u32 {
        match self {
            Record::Added(Exported { generation, .. }) | Record::Gone { generation, .. } => *generation,
        }
    }

    /// The message pushed to a peer. A handle over `MAX_HANDLE_BYTES` is written as it is and refused by
    /// the peer's `decode`.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(48 + MAX_HANDLE_BYTES);
        match self {
            Record::Added(e) => {
                w.u8(KIND_ADDED)
                    .u8(FORMAT_VERSION)
                    .u32(e.slot)
                    .u32(e.generation)
                    .u64(e.offset_in_allocation)
                    .u64(e.len)
                    .u64(e.alloc_size)
                    .u64(e.buffer_id)
                    .u32(e.window)
                    .u64(e.address)
                    .string(&e.handle);
            }
            Record::Gone { slot, generation } => {
                w.u8(KIND_GONE).u8(FORMAT_VERSION).u32(*slot).u32(*generation);
            }
        }
        w.into_bytes()
    }

    /// Reads a message written by `encode`. A truncated message, trailing bytes, another format version,
    /// an unknown kind, an oversized handle or a range outside its allocation is a `Remote` error naming
    /// what was wrong.
    pub fn decode(bytes: &[u8]) -> Result<Record> {
        let mut r = Reader::new(bytes, "registration record");
        let kind = r.u8()?;
        let version = r.u8()?;
        // The version first: another format may number its kinds differently.
        if version != FORMAT_VERSION {
            return Err(r.malformed(format!(
                "is of format version {version}, and this library reads version {FORMAT_VERSION} only (ranks \
                 running different library versions?)"
            )));
        }
        let record = match kind {
            KIND_ADDED => {
                let slot = r.u32()?;
                let generation = r.u32()?;
                let offset_in_allocation = r.u64()?;
                let len = r.u64()?;
                let alloc_size = r.u64()?;
                let buffer_id = r.u64()?;
                let window = r.u32()?;
                let address = r.u64()?;
                // Read by hand rather than with `Reader::string`, so that the error names the handle.
                let handle_len = r.u32()? as usize;
                if handle_len > MAX_HANDLE_BYTES {
                    return Err(r.malformed(format!(
                        "has an IPC handle of {handle_len} bytes (at most {MAX_HANDLE_BYTES})"
                    )));
                }
                let handle = r.slice(handle_len)?.to_vec();
                Record::Added(Exported {
                    slot,
                    generation,
                    offset_in_allocation,
                    len,
                    alloc_size,
                    buffer_id,
                    window,
                    address,
                    handle,
                })
            }
            KIND_GONE => Record::Gone {
                slot: r.u32()?,
                generation: r.u32()?,
            },
            other => {
                return Err(r.malformed(format!(
                    "has an unknown kind {other} ({KIND_ADDED}: added, {KIND_GONE}: gone)"
                )));
            }
        };
        if let Some(why) = record.inconsistency() {
            return Err(r.malformed(why));
        }
        r.finish()?;
        Ok(record)
    }

    /// What makes the record unusable whatever the table, said after "registration record".
    fn inconsistency(&self) -> Option<String> {
        if self.generation() == 0 {
            return Some(format!(
                "of slot {} has generation 0, which is never issued",
                self.slot()
            ));
        }
        let Record::Added(Exported {
            slot,
            offset_in_allocation,
            len,
            alloc_size,
            handle,
            ..
        }) = self
        else {
            return None;
        };
        if *len == 0 {
            return Some(format!("of slot {slot} covers 0 bytes"));
        }
        if offset_in_allocation
            .checked_add(*len)
            .is_none_or(|end| end > *alloc_size)
        {
            return Some(format!(
                "of slot {slot} has {len} bytes at offset {offset_in_allocation}, outside its allocation of \
                 {alloc_size} bytes"
            ));
        }
        if handle.len() > MAX_HANDLE_BYTES {
            return Some(format!(
                "of slot {slot} has an IPC handle of {} bytes (at most {MAX_HANDLE_BYTES})",
                handle.len()
            ));
        }
        None
    }
}

/// Pushes `record` to every other rank of `bootstrap`'s job; each absorbs it when it likes
/// (`PeerTable::absorb`). A peer that cannot be reached does not keep the record from the others: every
/// peer is tried, and the first error comes back naming its peer.
pub fn publish(bootstrap: &Bootstrap, record: &Record) -> Result<()> {
    let message = record.encode();
    let mut first: Option<Error> = None;
    let mut failed = 0;
    for peer in (0..bootstrap.nranks()).filter(|&p| p != bootstrap.rank()) {
        if let Err(e) = bootstrap.push_registration_record(peer, &message) {
            failed += 1;
            if first.is_none() {
                first = Some(Error::new(
                    e.kind,
                    format!(
                        "pushing the registration record of slot {} generation {} to peer {peer}: {}",
                        record.slot(),
                        record.generation(),
                        e.message
                    ),
                ));
            } else {
                log::debug!("pushing a registration record to peer {peer} failed too: {}", e.message);
            }
        }
    }
    match first {
        Some(e) if failed > 1 => Err(Error::new(
            e.kind,
            format!("{} (and {} more peers failed)", e.message, failed - 1),
        )),
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// One slot of this rank's own registrations.
#[derive(Clone, Copy, Debug, Default)]
struct LocalSlot {
    /// The generation issued last (0: never used).
    generation: u32,
    /// The registration's token while the slot is in use.
    token: Option<u64>,
}

/// Slot and generation of this rank's own registrations, by registration token.
#[derive(Debug)]
pub struct LocalSlots {
    slots: [LocalSlot; MAX_SLOTS],
}

impl Default for LocalSlots {
    fn default() -> Self {
        LocalSlots {
            slots: [LocalSlot::default(); MAX_SLOTS],
        }
    }
}

impl LocalSlots {
    /// Gives the registration `token` the lowest free slot, at the generation after the slot's last.
    /// A slot whose generation reached `u32::MAX` is retired rather than wrapped to 0 (which would match an
    /// empty entry of a peer's table): out of reach in practice, 2^32 reuses.
    pub fn add(&mut self, token: u64) -> Result<(u32, u32)> {
        if let Some(held) = self.get(token) {
            return Err(Error::internal(format!(
                "registration {token:#x} already holds slot {} (generation {})",
                held.0, held.1
            )));
        }
        let free = self
            .slots
            .iter_mut()
            .enumerate()
            .find(|(_, s)| s.token.is_none() && s.generation < u32::MAX);
        let Some((slot, entry)) = free else {
            let retired = self
                .slots
                .iter()
                .filter(|s| s.token.is_none() && s.generation == u32::MAX)
                .count();
            let retired = if retired > 0 {
                format!(" ({retired} retired after 2^32 - 1 reuses)")
            } else {
                String::new()
            };
            return Err(Error::invalid_usage(format!(
                "a communicator exports at most {MAX_SLOTS} registered buffers at once, and no slot is free\
                 {retired}; deregister buffers first"
            )));
        };
        entry.generation += 1;
        entry.token = Some(token);
        Ok((slot as u32, entry.generation))
    }

    /// Frees the slot of `token`; gives its slot and generation (what the `Gone` record names), or `None`
    /// for a token that holds none.
    pub fn remove(&mut self, token: u64) -> Option<(u32, u32)> {
        let (slot, entry) = self
            .slots
            .iter_mut()
            .enumerate()
            .find(|(_, s)| s.token == Some(token))?;
        entry.token = None;
        Some((slot as u32, entry.generation))
    }

    /// The slot and generation `token` holds.
    pub fn get(&self, token: u64) -> Option<(u32, u32)> {
        self.slots
            .iter()
            .enumerate()
            .find(|(_, s)| s.token == Some(token))
            .map(|(slot, s)| (slot as u32, s.generation))
    }

    #[cfg(test)]
    /// How many slots are in use.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.token.is_some()).count()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

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

/// The `Added` record of this rank's `registration` in `slot` at `generation`: its whole allocation
/// exported for CUDA IPC (a handle names an allocation; the record carries the offset into it). `window`:
/// its ordinal among this rank's windows, 0 for a buffer.
pub fn export(slot: u32, generation: u32, registration: &Registration, window: u32) -> Result<Record> {
    let allocation = &registration.allocation;
    let exported = IpcExport::new(
        allocation.base,
        allocation.size as u64,
        "a registered buffer's allocation",
    )?;
    let mut record = Record::added(slot, generation, registration, exported.handle.to_vec())?;
    if let Record::Added(e) = &mut record {
        e.window = window;
    }
    Ok(record)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::registration::{Allocation, Kind};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    /// What the fake opener saw: every open's arguments, and every mapping closed, by id.
    #[derive(Default)]
    struct Log {
        opened: RefCell<Vec<(usize, Vec<u8>, u64)>>,
        closed: RefCell<Vec<u64>>,
    }

    /// A mapping that records its close.
    struct FakeMapping {
        id: u64,
        log: Rc<Log>,
    }

    impl Drop for FakeMapping {
        fn drop(&mut self) {
            self.log.closed.borrow_mut().push(self.id);
        }
    }

    /// Maps allocation `n` (counting opens from 1) at `0x7f00_0000_0000 + (n << 32)`; fails while `fail` is set.
    struct FakeOpener {
        log: Rc<Log>,
        fail: Cell<bool>,
        next: Cell<u64>,
    }

    impl FakeOpener {
        fn new() -> (FakeOpener, Rc<Log>) {
            let log = Rc::new(Log::default());
            let opener = FakeOpener {
                log: log.clone(),
                fail: Cell::new(false),
                next: Cell::new(1),
            };
            (opener, log)
        }
    }

    fn base_of(id: u64) -> u64 {
        0x7f00_0000_0000 + (id << 32)
    }

    impl Opener for FakeOpener {
        type Mapping = FakeMapping;
        fn open(&self, peer: usize, handle: &[u8], alloc_size: u64) -> Result<(FakeMapping, u64)> {
            self.log.opened.borrow_mut().push((peer, handle.to_vec(), alloc_size));
            if self.fail.get() {
                return Err(Error::cuda("cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (fake)"));
            }
            let id = self.next.get();
            self.next.set(id + 1);
            Ok((
                FakeMapping {
                    id,
                    log: self.log.clone(),
                },
                base_of(id),
            ))
        }
    }

    fn exported(slot: u32, generation: u32) -> Exported {
        Exported {
            slot,
            generation,
            offset_in_allocation: 0x200,
            len: 4096,
            alloc_size: 1 << 20,
            // An allocation of its own per slot and generation (`shared_allocation` shares one).
            buffer_id: 1000 * (slot as u64 + 1) + generation as u64,
            window: 0,
            address: 0x10_0200,
            handle: vec![slot as u8; 64],
        }
    }

    fn added(slot: u32, generation: u32) -> Record {
        Record::Added(exported(slot, generation))
    }

    /// `added(1, 2)` with another range in its allocation of 1 MiB.
    fn ranged(offset_in_allocation: u64, len: u64) -> Record {
        Record::Added(Exported {
            offset_in_allocation,
            len,
            ..exported(1, 2)
        })
    }

    fn gone(slot: u32, generation: u32) -> Record {
        Record::Gone { slot, generation }
    }

    fn table(rank: usize, nranks: usize) -> (PeerTable<FakeOpener>, Rc<Log>) {
        let (opener, log) = FakeOpener::new();
        (PeerTable::new(rank, nranks, opener).unwrap(), log)
    }

    fn closed(log: &Log) -> Vec<u64> {
        log.closed.borrow().clone()
    }

    #[test]
    fn both_kinds_round_trip() {
        let mut handle = vec![0u8; 64];
        handle[0] = 0xab;
        handle[63] = 0xcd;
        let a = Record::Added(Exported {
            slot: 63,
            generation: u32::MAX,
            offset_in_allocation: 0x1000,
            len: (1 << 30) - 0x1000,
            alloc_size: 1 << 30,
            buffer_id: u64::MAX,
            window: 7,
            address: 0x7f00_dead_1000,
            handle,
        });
        let bytes = a.encode();
        assert_eq!(bytes.len(), 2 + 4 + 4 + 4 * 8 + 4 + 8 + 4 + 64);
        assert_eq!(bytes[..2], [KIND_ADDED, FORMAT_VERSION]);
        assert_eq!(Record::decode(&bytes).unwrap(), a);
        let g = gone(5, 7);
        let bytes = g.encode();
        assert_eq!(bytes, [KIND_GONE, FORMAT_VERSION, 5, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(Record::decode(&bytes).unwrap(), g);
        assert_eq!((g.slot(), g.generation()), (5, 7));
    }

    #[test]
    fn an_added_record_is_made_from_a_registration() {
        let registration = Registration {
            ptr: 0x10_0200,
            len: 4096,
            kind: Kind::Buffer,
            allocation: Allocation {
                buffer_id: 4001,
                base: 0x10_0000,
                size: 1 << 20,
                device: 0,
            },
            library_memory: false,
        };
        assert_eq!(Record::added(3, 1, &registration, vec![3; 64]).unwrap(), added(3, 1));
        let before = Registration {
            ptr: 0xf_0000,
            ..registration
        };
        let e = Record::added(3, 1, &before, vec![3; 64]).unwrap_err();
        assert!(e.message.contains("starts before its allocation"), "{}", e.message);
    }

    #[test]
    fn truncated_messages_are_refused_naming_the_record() {
        for record in [added(1, 2), gone(1, 2)] {
            let bytes = record.encode();
            for n in 0..bytes.len() {
                let e = Record::decode(&bytes[..n]).unwrap_err();
                assert_eq!(e.kind, ErrorKind::Remote);
                assert!(
                    e.message.contains("registration record is truncated"),
                    "{n}: {}",
                    e.message
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            let e = Record::decode(&longer).unwrap_err();
            assert!(e.message.contains("1 trailing bytes"), "{}", e.message);
        }
    }

    #[test]
    fn unknown_kinds_and_versions_are_refused() {
        let mut bytes = gone(1, 2).encode();
        bytes[0] = 9;
        let e = Record::decode(&bytes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(e.message.contains("unknown kind 9"), "{}", e.message);
        let mut bytes = added(1, 2).encode();
        bytes[1] = FORMAT_VERSION + 1;
        let e = Record::decode(&bytes).unwrap_err();
        assert!(
            e.message.contains("format version 3") && e.message.contains("version 2 only"),
            "{}",
            e.message
        );
    }

    #[test]
    fn oversized_handles_and_inconsistent_records_are_refused() {
        assert_eq!(
            added(1, 2).encode().len(),
            2 + 4 + 4 + 4 * 8 + 4 + 8 + 4 + MAX_HANDLE_BYTES,
            "64 bytes pass"
        );
        let oversized = Record::Added(Exported {
            offset_in_allocation: 0,
            len: 1,
            alloc_size: 1,
            buffer_id: 1,
            handle: vec![0; MAX_HANDLE_BYTES + 1],
            ..exported(1, 2)
        });
        let e = Record::decode(&oversized.encode()).unwrap_err();
        assert!(
            e.message
                .contains("registration record has an IPC handle of 65 bytes (at most 64)"),
            "{}",
            e.message
        );
        // A length prefix claiming more than the message holds is refused before anything is read.
        let mut bytes = added(1, 2).encode();
        let at = bytes.len() - 64 - 4;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = Record::decode(&bytes).unwrap_err();
        assert!(e.message.contains("IPC handle of 4294967295 bytes"), "{}", e.message);

        let e = Record::decode(&ranged((1 << 20) - 100, 4096).encode()).unwrap_err();
        assert!(e.message.contains("outside its allocation"), "{}", e.message);
        let e = Record::decode(&ranged(u64::MAX, 4096).encode()).unwrap_err();
        assert!(e.message.contains("outside its allocation"), "{}", e.message);
        let e = Record::decode(&ranged(0, 0).encode()).unwrap_err();
        assert!(e.message.contains("covers 0 bytes"), "{}", e.message);
        assert_eq!(
            Record::decode(&ranged(0, 1 << 20).encode()).unwrap(),
            ranged(0, 1 << 20),
            "the whole allocation"
        );
        for record in [added(1, 0), gone(1, 0)] {
            let e = Record::decode(&record.encode()).unwrap_err();
            assert!(e.message.contains("generation 0"), "{}", e.message);
        }
    }

    #[test]
    fn slots_are_the_lowest_free_and_reuse_bumps_the_generation() {
        let mut slots = LocalSlots::default();
        assert_eq!(slots.add(0xa).unwrap(), (0, 1));
        assert_eq!(slots.add(0xb).unwrap(), (1, 1));
        assert_eq!(slots.add(0xc).unwrap(), (2, 1));
        assert_eq!(slots.get(0xb), Some((1, 1)));
        assert_eq!(slots.remove(0xb), Some((1, 1)));
        assert_eq!(slots.remove(0xb), None, "removed once");
        assert_eq!(slots.get(0xb), None);
        assert_eq!(slots.add(0xd).unwrap(), (1, 2), "slot 1 again, at a new generation");
        assert_eq!(slots.remove(0xa), Some((0, 1)));
        assert_eq!(slots.add(0xe).unwrap(), (0, 2));
        assert_eq!(slots.remove(0xd), Some((1, 2)));
        assert_eq!(slots.add(0xf).unwrap(), (1, 3));
        assert_eq!(slots.len(), 3);
        let e = slots.add(0xf).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert!(e.message.contains("already holds slot 1"), "{}", e.message);
    }

    #[test]
    fn a_full_table_is_refused_naming_the_limit_and_the_remedy() {
        let mut slots = LocalSlots::default();
        for token in 0..MAX_SLOTS as u64 {
            assert_eq!(slots.add(token).unwrap(), (token as u32, 1));
        }
        let e = slots.add(1000).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(
            e.message.contains("at most 64 registered buffers") && e.message.contains("deregister buffers first"),
            "{}",
            e.message
        );
        assert_eq!(slots.get(1000), None);
        assert_eq!(slots.remove(17), Some((17, 1)));
        assert_eq!(slots.add(1000).unwrap(), (17, 2));
    }

    #[test]
    fn an_exhausted_slot_is_retired_never_wrapped_to_generation_0() {
        let mut slots = LocalSlots::default();
        slots.slots[0].generation = u32::MAX - 1;
        assert_eq!(slots.add(1).unwrap(), (0, u32::MAX));
        assert_eq!(slots.remove(1), Some((0, u32::MAX)));
        assert_eq!(slots.add(2).unwrap(), (1, 1), "slot 0 is retired");
        for s in &mut slots.slots {
            s.token = None;
            s.generation = u32::MAX;
        }
        let e = slots.add(3).unwrap_err();
        assert!(
            e.message.contains("(64 retired") && e.message.contains("deregister buffers first"),
            "{}",
            e.message
        );
        assert!(slots.is_empty());
    }

    #[test]
    fn added_opens_and_resolves_only_the_exact_generation() {
        let (mut t, log) = table(0, 4);
        t.apply(2, added(5, 3)).unwrap();
        assert_eq!(*log.opened.borrow(), [(2, vec![5u8; 64], 1 << 20)]);
        let address = base_of(1) + 0x200;
        assert_eq!(t.resolve(2, 5, 3), Some(address), "mapped base plus the offset");
        assert_eq!(t.resolve(2, 5, 2), None, "older generation");
        assert_eq!(t.resolve(2, 5, 4), None, "newer generation");
        assert_eq!(t.resolve(1, 5, 3), None, "another peer");
        assert_eq!(t.resolve(2, 4, 3), None, "another slot");
        assert_eq!(t.resolve(0, 5, 3), None, "this rank");
        assert_eq!(t.resolve(9, 5, 3), None, "no such peer");
        assert_eq!(t.resolve(2, MAX_SLOTS as u32, 3), None, "no such slot");
        assert_eq!(t.device_entries(), [(2, 5, 3, address)]);
    }

    #[test]
    fn a_newer_added_replaces_and_closes_the_old_mapping() {
        let (mut t, log) = table(1, 2);
        t.apply(0, added(0, 1)).unwrap();
        t.apply(0, added(0, 2)).unwrap();
        assert_eq!(closed(&log), [1], "generation 1's mapping closed");
        assert_eq!(t.resolve(0, 0, 1), None);
        assert_eq!(t.resolve(0, 0, 2), Some(base_of(2) + 0x200));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn registrations_in_one_allocation_share_its_mapping() {
        let (mut t, log) = table(1, 3);
        let in_one = |slot: u32, generation: u32, offset: u64| {
            Record::Added(Exported {
                offset_in_allocation: offset,
                buffer_id: 7,
                ..exported(slot, generation)
            })
        };
        t.apply(0, in_one(0, 1, 0x200)).unwrap();
        t.apply(0, in_one(1, 1, 0x4000)).unwrap();
        t.apply(2, in_one(0, 1, 0x200)).unwrap();
        assert_eq!(
            log.opened.borrow().len(),
            2,
            "peer 0's allocation opened once, peer 2's once"
        );
        assert_eq!(t.resolve(0, 0, 1), Some(base_of(1) + 0x200));
        assert_eq!(
            t.resolve(0, 1, 1),
            Some(base_of(1) + 0x4000),
            "the same mapping, another offset"
        );
        t.apply(0, gone(0, 1)).unwrap();
        assert!(closed(&log).is_empty(), "still used by slot 1");
        t.apply(0, gone(1, 1)).unwrap();
        assert_eq!(closed(&log), [1], "closed with its last registration");
        // Opened afresh once closed.
        t.apply(0, in_one(0, 2, 0x200)).unwrap();
        assert_eq!(log.opened.borrow().len(), 3);
    }

    #[test]
    fn held_closes_wait_until_released() {
        let (mut t, log) = table(1, 2);
        t.hold_closes();
        t.apply(0, added(0, 1)).unwrap();
        t.apply(0, added(0, 2)).unwrap();
        t.apply(0, added(1, 1)).unwrap();
        t.apply(0, gone(1, 1)).unwrap();
        assert!(
            closed(&log).is_empty(),
            "replaced and gone mappings stay open while kernels may read them"
        );
        assert!(t.has_retired());
        assert_eq!(t.resolve(0, 0, 1), None, "a retired mapping is no longer resolved");
        assert_eq!(t.resolve(0, 1, 1), None);
        assert_eq!(t.resolve(0, 0, 2), Some(base_of(2) + 0x200));
        assert_eq!(t.device_entries().len(), 1);
        assert_eq!(t.release_retired(), 2);
        assert_eq!(closed(&log), [1, 3]);
        assert!(!t.has_retired());
        t.apply(0, gone(0, 2)).unwrap();
        assert_eq!(t.clear(), 1, "clear closes the retired ones too");
        assert_eq!(closed(&log), [1, 3, 2]);
    }

    #[test]
    fn stale_added_is_ignored() {
        let (mut t, log) = table(1, 2);
        t.apply(0, added(3, 5)).unwrap();
        t.apply(0, added(3, 5)).unwrap();
        t.apply(0, added(3, 4)).unwrap();
        assert_eq!(
            log.opened.borrow().len(),
            1,
            "neither the same nor an older generation is opened"
        );
        assert!(closed(&log).is_empty());
        assert_eq!(t.resolve(0, 3, 5), Some(base_of(1) + 0x200));
        // After its Gone, a late Added of the same generation does not map it again.
        t.apply(0, gone(3, 5)).unwrap();
        t.apply(0, added(3, 5)).unwrap();
        assert_eq!(log.opened.borrow().len(), 1);
        assert_eq!(t.resolve(0, 3, 5), None);
    }

    #[test]
    fn gone_drops_only_the_held_generation() {
        let (mut t, log) = table(0, 3);
        t.apply(1, added(2, 4)).unwrap();
        t.apply(1, gone(2, 3)).unwrap();
        t.apply(1, gone(2, 5)).unwrap();
        t.apply(2, gone(2, 4)).unwrap();
        assert!(
            closed(&log).is_empty(),
            "another generation's or another peer's Gone is ignored"
        );
        assert_eq!(t.resolve(1, 2, 4), Some(base_of(1) + 0x200));
        t.apply(1, gone(2, 4)).unwrap();
        assert_eq!(closed(&log), [1]);
        assert_eq!(t.resolve(1, 2, 4), None);
        assert!(t.is_empty());
        t.apply(1, gone(2, 4)).unwrap();
        assert_eq!(closed(&log), [1], "a repeated Gone closes nothing more");
        // The slot is reused at a newer generation.
        t.apply(1, added(2, 5)).unwrap();
        assert_eq!(t.resolve(1, 2, 5), Some(base_of(2) + 0x200));
    }

    #[test]
    fn a_failed_open_leaves_the_slot_empty_and_reports_the_error() {
        let (mut t, log) = table(0, 2);
        t.apply(1, added(7, 1)).unwrap();
        t.opener.fail.set(true);
        let e = t.apply(1, added(7, 2)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Cuda);
        assert!(e.message.contains("cuIpcOpenMemHandle"), "{}", e.message);
        assert_eq!(closed(&log), [1], "the superseded mapping is closed all the same");
        assert_eq!(t.resolve(1, 7, 1), None);
        assert_eq!(t.resolve(1, 7, 2), None);
        assert!(t.device_entries().is_empty());
        let e = t.apply(1, added(8, 1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Cuda);
        assert_eq!(t.resolve(1, 8, 1), None);
        // A later generation opens again once the opener works.
        t.opener.fail.set(false);
        t.apply(1, added(7, 3)).unwrap();
        assert_eq!(t.resolve(1, 7, 3), Some(base_of(2) + 0x200));
    }

    #[test]
    fn a_mapping_that_would_overflow_is_refused() {
        struct AtTheTop;
        impl Opener for AtTheTop {
            type Mapping = ();
            fn open(&self, _: usize, _: &[u8], _: u64) -> Result<((), u64)> {
                Ok(((), u64::MAX - 0x100))
            }
        }
        let mut t = PeerTable::new(0, 2, AtTheTop).unwrap();
        let e = t.apply(1, added(0, 1)).unwrap_err();
        assert!(e.message.contains("overflows"), "{}", e.message);
        assert_eq!(t.resolve(1, 0, 1), None);
    }

    #[test]
    fn every_mapping_is_closed_exactly_once() {
        let (mut t, log) = table(0, 4);
        t.apply(1, added(0, 1)).unwrap(); // 1: replaced
        t.apply(1, added(0, 2)).unwrap(); // 2: gone
        t.apply(2, added(0, 1)).unwrap(); // 3: cleared
        t.apply(3, added(9, 1)).unwrap(); // 4: cleared
        t.apply(1, gone(0, 2)).unwrap();
        assert_eq!(closed(&log), [1, 2]);
        assert_eq!(t.clear(), 2);
        assert_eq!(closed(&log), [1, 2, 3, 4]);
        assert_eq!(t.clear(), 0);
        t.apply(2, added(0, 1)).unwrap();
        assert_eq!(
            log.opened.borrow().len(),
            4,
            "generations are kept across clear: a late Added is stale"
        );
        t.apply(3, added(9, 2)).unwrap(); // 5: dropped with the table
        drop(t);
        assert_eq!(closed(&log), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn device_entries_are_by_peer_then_slot() {
        let (mut t, _log) = table(1, 4);
        t.apply(3, added(1, 1)).unwrap();
        t.apply(0, added(63, 2)).unwrap();
        t.apply(2, added(4, 1)).unwrap();
        t.apply(0, added(2, 9)).unwrap();
        t.apply(3, added(0, 1)).unwrap();
        let entries = t.device_entries();
        let keys: Vec<_> = entries.iter().map(|&(p, s, g, _)| (p, s, g)).collect();
        assert_eq!(keys, [(0, 2, 9), (0, 63, 2), (2, 4, 1), (3, 0, 1), (3, 1, 1)]);
        for (peer, slot, generation, address) in entries {
            assert_eq!(t.resolve(peer, slot, generation), Some(address));
        }
    }

    #[test]
    fn own_rank_and_out_of_range_arguments_are_refused() {
        let (mut t, log) = table(1, 3);
        let e = t.apply(1, added(0, 1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("peer 1 is this rank"), "{}", e.message);
        let e = t.apply(3, added(0, 1)).unwrap_err();
        assert!(e.message.contains("peer 3 out of range for nranks 3"), "{}", e.message);
        let e = t.apply(0, added(MAX_SLOTS as u32, 1)).unwrap_err();
        assert!(e.message.contains("slot 64 of peer 0 out of range"), "{}", e.message);
        let e = t.apply(0, gone(u32::MAX, 1)).unwrap_err();
        assert!(e.message.contains("slot 4294967295"), "{}", e.message);
        let e = t.apply(0, added(0, 0)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("from peer 0") && e.message.contains("generation 0"),
            "{}",
            e.message
        );
        assert!(log.opened.borrow().is_empty(), "nothing opened for refused records");

        let (opener, _) = FakeOpener::new();
        let e = PeerTable::new(2, 2, opener).err().unwrap();
        assert!(e.message.contains("rank 2 out of range for nranks 2"), "{}", e.message);
        let (opener, _) = FakeOpener::new();
        let e = PeerTable::new(0, MAX_RANKS + 1, opener).err().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("at most 16 ranks"), "{}", e.message);
    }

    // ---- pushed through the bootstrap: several in-process ranks ----

    /// A job of `n` in-process ranks (their root is done once all have arrived).
    fn job(n: usize) -> Vec<Bootstrap> {
        use crate::bootstrap::PROTOCOL_MAGIC;
        use crate::bootstrap::tests::{T, local_root, on_ranks};
        let root = local_root(PROTOCOL_MAGIC, T);
        let addr = root.local_addr();
        on_ranks(n, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, n, T).unwrap())
    }

    /// Absorbs into `t` until it holds `peer`'s `slot` at `generation`, waiting up to 5 s.
    fn absorb_until_held(t: &mut PeerTable<FakeOpener>, b: &Bootstrap, peer: usize, slot: u32, generation: u32) {
        let start = std::time::Instant::now();
        while t.resolve(peer, slot, generation).is_none() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "rank {}: peer {peer}'s slot {slot} generation {generation} not held after 5 s",
                b.rank()
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
            t.absorb(b);
        }
    }

    /// Absorbs into `t` until `n` records were applied, waiting up to 5 s for them to arrive.
    fn absorb_until(t: &mut PeerTable<FakeOpener>, b: &Bootstrap, n: usize) -> usize {
        let start = std::time::Instant::now();
        let mut applied = t.absorb(b);
        while applied < n {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "rank {}: {applied} of {n} records applied after 5 s",
                b.rank()
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
            applied += t.absorb(b);
        }
        applied
    }

    #[test]
    fn published_records_are_absorbed_by_every_peer() {
        let bs = job(3);
        let mut tables: Vec<_> = (0..3).map(|r| table(r, 3)).collect();
        publish(&bs[0], &added(0, 1)).unwrap();
        for r in [1, 2] {
            let (t, log) = &mut tables[r];
            assert_eq!(absorb_until(t, &bs[r], 1), 1);
            assert_eq!(*log.opened.borrow(), [(0, vec![0u8; 64], 1 << 20)], "rank {r}");
            assert_eq!(t.resolve(0, 0, 1), Some(base_of(1) + 0x200), "rank {r}");
        }
        assert_eq!(tables[0].0.absorb(&bs[0]), 0, "nothing to self");
        publish(&bs[0], &gone(0, 1)).unwrap();
        for r in [1, 2] {
            let (t, log) = &mut tables[r];
            assert_eq!(absorb_until(t, &bs[r], 1), 1);
            assert_eq!(t.resolve(0, 0, 1), None, "rank {r}");
            assert_eq!(closed(log), [1], "rank {r}");
            assert!(t.is_empty());
            assert_eq!(t.absorb(&bs[r]), 0, "absorbed once");
        }
    }

    #[test]
    fn a_registration_that_ended_before_it_was_taken_is_never_opened() {
        let records = vec![
            (0, added(1, 1)),
            (1, added(1, 1)),
            (0, added(2, 1)),
            (0, gone(1, 1)),
            (0, added(1, 2)),
        ];
        let kept = without_finished(records);
        let kept: Vec<_> = kept
            .iter()
            .map(|(p, r)| (*p, r.slot(), r.generation(), matches!(r, Record::Gone { .. })))
            .collect();
        // Peer 0's slot 1 generation 1 came and went; peer 1's namesake and peer 0's next generation stay.
        assert_eq!(
            kept,
            [(1, 1, 1, false), (0, 2, 1, false), (0, 1, 1, true), (0, 1, 2, false)]
        );
        // A Gone before its Added (of another batch's registration) drops nothing.
        let kept = without_finished(vec![(0, gone(1, 1)), (0, added(1, 1))]);
        assert_eq!(kept.len(), 2);
    }

    #[test]
    fn records_of_different_ranks_are_kept_apart() {
        let bs = job(3);
        publish(&bs[0], &added(4, 1)).unwrap();
        publish(&bs[1], &added(4, 5)).unwrap();
        let (mut t, log) = table(2, 3);
        assert_eq!(absorb_until(&mut t, &bs[2], 2), 2);
        let mut opened: Vec<usize> = log.opened.borrow().iter().map(|o| o.0).collect();
        opened.sort();
        assert_eq!(opened, [0, 1], "one open per peer");
        assert!(t.resolve(0, 4, 1).is_some() && t.resolve(1, 4, 5).is_some());
        assert_eq!(t.resolve(0, 4, 5), None, "rank 1's generation is not rank 0's");
        assert_eq!(t.resolve(1, 4, 1), None);
        // Ranks 0 and 1 each hear of the other's only.
        for (r, peer, generation) in [(0, 1, 5), (1, 0, 1)] {
            let (mut t, _log) = table(r, 3);
            assert_eq!(absorb_until(&mut t, &bs[r], 1), 1);
            assert_eq!(t.device_entries(), [(peer, 4, generation, base_of(1) + 0x200)]);
        }
    }

    #[test]
    fn a_burst_is_applied_in_the_order_it_was_published() {
        let bs = job(3);
        for record in [added(0, 1), gone(0, 1), added(0, 2)] {
            publish(&bs[0], &record).unwrap();
        }
        let (mut t, log) = table(1, 3);
        absorb_until_held(&mut t, &bs[1], 0, 0, 2);
        assert_eq!(
            t.resolve(0, 0, 2),
            Some(base_of(log.opened.borrow().len() as u64) + 0x200)
        );
        assert_eq!(t.resolve(0, 0, 1), None);
        // Generation 1 was opened and closed by its Gone, or, taken in one batch with its Gone, never opened.
        match log.opened.borrow().len() {
            2 => assert_eq!(closed(&log), [1], "generation 1 closed by its Gone"),
            n => assert_eq!((n, closed(&log)), (1, vec![])),
        }
        // A Gone pushed before the Added of its generation leaves it held; after it, it goes. The last
        // record (slot 5) says when all have been taken.
        for record in [gone(1, 1), added(1, 1), added(2, 1), gone(2, 1), added(5, 1)] {
            publish(&bs[0], &record).unwrap();
        }
        absorb_until_held(&mut t, &bs[1], 0, 5, 1);
        assert!(t.resolve(0, 1, 1).is_some());
        assert_eq!(t.resolve(0, 2, 1), None);
        assert_eq!(t.device_entries().len(), 3, "slots 0, 1 and 5");
        let open = log.opened.borrow().len() - closed(&log).len();
        assert_eq!(open, 3, "every mapping but the held ones closed");
    }

    #[test]
    fn a_record_that_cannot_be_read_or_applied_is_skipped_and_the_rest_applied() {
        let bs = job(3);
        let out_of_range = added(MAX_SLOTS as u32, 1).encode();
        let messages: [&[u8]; 5] = [
            b"garbage",
            &[KIND_GONE, FORMAT_VERSION + 1, 0, 0, 0, 0, 1, 0, 0, 0],
            &out_of_range,
            &added(3, 1).encode(),
            &gone(9, 9).encode(),
        ];
        for message in messages {
            bs[0].push_registration_record(1, message).unwrap();
        }
        let (mut t, _log) = table(1, 3);
        assert_eq!(absorb_until(&mut t, &bs[1], 2), 2, "the good Added and Gone");
        assert_eq!(t.resolve(0, 3, 1), Some(base_of(1) + 0x200));
        // A failed open is skipped too; a later record still opens.
        t.opener.fail.set(true);
        publish(&bs[0], &added(5, 1)).unwrap();
        let start = std::time::Instant::now();
        while t.opener.log.opened.borrow().len() < 2 {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "the record never came"
            );
            assert_eq!(t.absorb(&bs[1]), 0);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(t.resolve(0, 5, 1), None);
        t.opener.fail.set(false);
        publish(&bs[0], &added(5, 2)).unwrap();
        assert_eq!(absorb_until(&mut t, &bs[1], 1), 1);
        assert_eq!(t.resolve(0, 5, 2), Some(base_of(2) + 0x200));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn absorbing_when_nothing_came_returns_at_once() {
        let bs = job(3);
        let (mut t, _log) = table(2, 3);
        let start = std::time::Instant::now();
        for _ in 0..100 {
            assert_eq!(t.absorb(&bs[2]), 0);
        }
        assert!(
            start.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn publish_tries_every_peer_and_names_the_one_that_failed() {
        let mut bs = job(3);
        // Rank 1 leaves: pushing to it fails once its socket is gone, and rank 2 still gets every record.
        drop(bs.remove(1));
        let (b0, b2) = (&bs[0], &bs[1]);
        let start = std::time::Instant::now();
        let mut generation = 0;
        let e = loop {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "pushing to the closed rank 1 never failed"
            );
            generation += 1;
            if let Err(e) = publish(b0, &added(0, generation)) {
                break e;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(
            e.message.contains(&format!(
                "pushing the registration record of slot 0 generation {generation} to peer 1: "
            )),
            "{}",
            e.message
        );
        assert!(!e.message.contains("more peers failed"), "{}", e.message);
        let (mut t, log) = table(2, 3);
        assert_eq!(absorb_until(&mut t, b2, generation as usize), generation as usize);
        assert_eq!(t.resolve(0, 0, generation), Some(base_of(generation as u64) + 0x200));
        assert_eq!(log.opened.borrow().len(), generation as usize);
    }

    #[test]
    fn only_64_byte_handles_reach_the_driver() {
        let e = ipc_handle(2, &[0u8; 63]).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("peer 2's exported handle has 63 bytes"),
            "{}",
            e.message
        );
        assert!(ipc_handle(2, &[0u8; 65]).is_err());
        assert_eq!(ipc_handle(2, &[7u8; 64]).unwrap(), &[7u8; 64]);
    }

    #[test]
    fn without_a_driver_exporting_is_a_cuda_error() {
        if crate::gpu::ensure_driver().is_ok() {
            return; // a machine with a driver answers about the address instead
        }
        let registration = Registration {
            ptr: 0x1000,
            len: 64,
            kind: crate::registration::Kind::Buffer,
            allocation: crate::registration::Allocation {
                buffer_id: 1,
                base: 0x1000,
                size: 64,
                device: 0,
            },
            library_memory: false,
        };
        let e = export(0, 1, &registration, 1).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Cuda, "{}", e.message);
    }
}
