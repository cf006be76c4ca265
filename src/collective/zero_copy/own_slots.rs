//! This rank's registrations as the peers know them: each exported registration holds a slot and a
//! generation. The slot indexes the peers' tables; the generation tells a reuse of the slot from the
//! registration it held before, so that a peer whose mapping is of an older registration never takes it for
//! the new one. Generations start at 1: 0 is never issued, so that an empty entry of the device-visible
//! table (zeroed) never matches a descriptor.
//!
//! Exporting a registration makes its `Added` record (`cuIpcGetMemHandle` of its allocation, `export`);
//! a call's buffers are named to the peers by their descriptor (`OwnSlots::descriptor`: the tag of the
//! registration holding them and the offset into it).

use super::records::Record;
use super::{MAX_SLOTS, tag};
use crate::error::{Error, Result};
use crate::gpu::{DevicePtr, IpcExport};
use crate::registration::Registration;

/// One slot of this rank's own registrations.
#[derive(Clone, Copy, Debug, Default)]
struct OwnSlot {
    /// The generation issued last (0: never used).
    generation: u32,
    /// The registration's token while the slot is in use.
    token: Option<u64>,
}

/// Slot and generation of this rank's own registrations, by registration token.
#[derive(Debug)]
pub struct OwnSlots {
    slots: [OwnSlot; MAX_SLOTS],
}

impl Default for OwnSlots {
    fn default() -> Self {
        OwnSlots {
            slots: [OwnSlot::default(); MAX_SLOTS],
        }
    }
}

impl OwnSlots {
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

    /// The descriptor (tag, offset into the registration) of this rank's `[ptr, ptr + len)`, or (0, 0)
    /// when no live registration exported to the peers holds all of it. `lookup` is
    /// `Registrations::lookup` (a test passes one that needs no driver).
    pub fn descriptor(
        &self,
        ptr: DevicePtr,
        len: u64,
        lookup: impl FnOnce(DevicePtr, usize) -> Option<(u64, Registration)>,
    ) -> (u64, u64) {
        if ptr == 0 || len == 0 {
            return (0, 0);
        }
        lookup(ptr, len as usize)
            .and_then(|(token, registration)| {
                let (slot, generation) = self.get(token)?;
                Some((tag(slot, generation), ptr - registration.ptr))
            })
            .unwrap_or((0, 0))
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

#[cfg(test)]
mod tests;
