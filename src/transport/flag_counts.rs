//! Exact flag values for the copy engine.
//!
//! The legacy proxy raised a flag by copying the connection's `device` epoch, whatever it holds when the
//! copy engine runs. A copy that runs late (the stream busy with earlier data) then also counts signals
//! the device pushed since, whose data is queued behind the flag: the peer's `wait()` returns before
//! that data lands. Measured: in the bidirectional 1 MiB benchmark the kernels' loops ran up to 3 ms ahead
//! of their data. So the proxy copies the number of flags it has carried out on the connection instead,
//! from a device table: entry j holds j in its low 16 bits and the count's generation (count >> 16) in
//! its upper 48; when the count enters a new generation, stream-ordered memsets rewrite the upper 48
//! bits of every entry, after every copy that read the old ones and before every copy that reads the new.

use crate::error::Result;
use crate::gpu::{DeviceAllocation, DevicePtr, GpuContext, Stream};

pub struct FlagCounts {
    table: DeviceAllocation,
    generation: u64,
}

impl FlagCounts {
    const INDEX_BITS: u32 = 16;
    const ENTRIES: usize = 1 << Self::INDEX_BITS;

    /// A table ready for the flag after `flags_so_far`.
    pub fn new(ctx: &GpuContext, flags_so_far: u64) -> Result<FlagCounts> {
        let table = DeviceAllocation::zeroed(ctx, Self::ENTRIES * 8)?;
        let generation = (flags_so_far + 1) >> Self::INDEX_BITS;
        table.write_words(0, &Self::entries(generation))?;
        Ok(FlagCounts { table, generation })
    }

    /// The table's contents for one generation.
    fn entries(generation: u64) -> Vec<u64> {
        (0..Self::ENTRIES as u64)
            .map(|j| generation << Self::INDEX_BITS | j)
            .collect()
    }

    /// The device word that holds `count` when a copy queued on `stream` now reads it.
    pub fn source(&mut self, stream: &Stream, count: u64) -> Result<DevicePtr> {
        let generation = count >> Self::INDEX_BITS;
        if generation != self.generation {
            // Little-endian: 16-bit lane k of an entry holds bits 16k..16k+16 of its value.
            for lane in 1..4u32 {
                let bits = (generation << Self::INDEX_BITS >> (16 * lane)) as u16;
                stream.fill_u16_strided(self.table.ptr() + 2 * lane as u64, 8, bits, Self::ENTRIES)?;
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
        let e = FlagCounts::entries(3);
        assert_eq!(e.len(), 1 << 16);
        assert_eq!(e[0], 3 << 16);
        assert_eq!(e[0xFFFF], (3 << 16) | 0xFFFF);
        // What the lane memsets write for a generation, put back together, is the same entry.
        let generation: u64 = 0x1234_5678_9ABC;
        let lanes: Vec<u64> = (1..4u32)
            .map(|lane| ((generation << 16 >> (16 * lane)) as u16 as u64) << (16 * lane))
            .collect();
        assert_eq!(lanes.iter().sum::<u64>() | 0x42, generation << 16 | 0x42);
    }
}
