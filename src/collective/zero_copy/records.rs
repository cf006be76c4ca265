//! The records a rank pushes to its peers about its registrations, and their wire format
//! (`docs/ZERO_COPY.md`, "Mappings: exchanged once per registration, pushed"): "slot s, generation g is
//! this allocation, exported as this handle" (`Added`), and later "slot s, generation g is gone" (`Gone`).
//! They travel through the bootstrap's one-way registration records (`publish`,
//! `Bootstrap::push_registration_record`), queued at each peer until it takes them
//! (`PeerTable::take`, at the start of each zero-copy, copy-engine or one-sided call): no call waits for an
//! answer, and no peer is ever asked. A window's `Added` also carries its ordinal among the owner's windows,
//! by which the one-sided calls match windows (`signal.rs`), and the owner's address, which a peer of the
//! same process uses as it is (a process cannot open its own IPC handles).

use crate::bootstrap::Bootstrap;
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::registration::Registration;

/// The largest exported handle a record carries: a `cuIpcGetMemHandle` handle is 64 bytes.
pub const MAX_HANDLE_BYTES: usize = 64;

/// The records' format. A peer speaking another one is refused, never half understood. Version 2 added
/// the window ordinal and the owner's address.
pub(super) const FORMAT_VERSION: u8 = 2;
const KIND_ADDED: u8 = 1;
pub(super) const KIND_GONE: u8 = 2;

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
    pub(super) fn inconsistency(&self) -> Option<String> {
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

#[cfg(test)]
pub(super) mod tests;
