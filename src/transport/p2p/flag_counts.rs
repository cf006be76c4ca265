//! Exact flag values for the copy engine.
//!
//! The legacy proxy raised a flag by copying the connection's `device` epoch, whatever it holds when the
//! copy engine runs. A copy that runs late (the stream busy with earlier data) then also counts signals
//! the device pushed since, whose data is queued behind the flag: the peer's `wait()` returns before
//! that data lands. Measured: in the bidirectional 1 MiB benchmark the kernels' loops ran up to 3 ms ahead
//! of their data. So the proxy copies the number of flags it has carried out on the connection instead,
//! from a small device table: entry j holds j in its low byte and the count's generation (count >> 8) in
//! its upper seven bytes. When the count enters a new generation, a stream-ordered memset rewrites each
//! byte of the entries that changed (one, in 255 of 256 changes), after every copy that read the old
//! value and before every copy that reads the new.

use crate::error::Result;
use crate::gpu::{DeviceAllocation, DevicePtr, GpuContext, Stream};

pub struct FlagCountTable {
    table: DeviceAllocation,
    generation: u64,
}

impl FlagCountTable {
    const INDEX_BITS: u32 = 8;
    const ENTRIES: usize = 1 << Self::INDEX_BITS;

    /// A table ready for the flag after `flags_so_far`.
    pub fn new(ctx: &GpuContext, flags_so_far: u64) -> Result<FlagCountTable> {
        let table = DeviceAllocation::zeroed(ctx, Self::ENTRIES * 8)?;
        let generation = (flags_so_far + 1) >> Self::INDEX_BITS;
        table.write_words(0, &Self::entries(generation))?;
        Ok(FlagCountTable { table, generation })
    }

    /// The table's contents for one generation.
    fn entries(generation: u64) -> Vec<u64> {
        (0..Self::ENTRIES as u64)
            .map(|j| generation << Self::INDEX_BITS | j)
            .collect()
    }

    /// The bytes (1 to 7, little-endian) that differ between the entries of two generations, with the
    /// new value of each.
    fn changed_bytes(old: u64, new: u64) -> impl Iterator<Item = (usize, u8)> {
        let (old, new) = (
            (old << Self::INDEX_BITS).to_le_bytes(),
            (new << Self::INDEX_BITS).to_le_bytes(),
        );
        (1..8).filter(move |&b| old[b] != new[b]).map(move |b| (b, new[b]))
    }

    /// The device word that holds `count` when a copy queued on `stream` now reads it.
    pub fn source(&mut self, stream: &Stream, count: u64) -> Result<DevicePtr> {
        let generation = count >> Self::INDEX_BITS;
        if generation != self.generation {
            for (byte, value) in Self::changed_bytes(self.generation, generation) {
                stream.fill_u8_strided(&self.table, byte as u64, 8, value, Self::ENTRIES)?;
            }
            self.generation = generation;
        }
        Ok(self.table.ptr() + 8 * (count & (Self::ENTRIES as u64 - 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_holds_its_index_and_generation() {
        let e = FlagCountTable::entries(3);
        assert_eq!(e.len(), 256);
        assert_eq!(e[0], 3 << 8);
        assert_eq!(e[0xFF], (3 << 8) | 0xFF);
    }

    #[test]
    fn the_byte_memsets_turn_one_generation_into_the_next() {
        // The transitions of a long run (a carry through several bytes included), and a jump.
        let steps = [
            (0u64, 1u64),
            (1, 2),
            (0xFF, 0x100),
            (0xFFFF, 0x1_0000),
            (0x12_3456, 0xAB_CDEF_0123),
        ];
        for (old, new) in steps {
            let mut table = FlagCountTable::entries(old);
            let changed: Vec<_> = FlagCountTable::changed_bytes(old, new).collect();
            for entry in table.iter_mut() {
                let mut bytes = entry.to_le_bytes();
                for &(b, v) in &changed {
                    bytes[b] = v;
                }
                *entry = u64::from_le_bytes(bytes);
            }
            assert_eq!(table, FlagCountTable::entries(new), "generation {old:#x} -> {new:#x}");
        }
        assert_eq!(
            FlagCountTable::changed_bytes(1, 2).count(),
            1,
            "one memset in the usual case"
        );
        assert_eq!(FlagCountTable::changed_bytes(0xFF, 0x100).count(), 2);
    }
}
