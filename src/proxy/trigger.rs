//! The 16-byte trigger a kernel pushes into the FIFO, bit for bit as legacy kernels write it.
//!
//! word 0: bits 0-31 `dataSize`, bits 32-63 `srcDataOffset`
//! word 1: bits 0-31 `dstDataOffset`, bits 32-41 `connId`, bits 42-44 `type` (Data 1, Flag 2, Sync 4)
//! A slot whose word 0 is zero is empty, which is why `signal()` and `flush()` push a size of 1.

use crate::error::{Error, Result};
use std::fmt;

pub const TYPE_DATA: u8 = 1;
pub const TYPE_FLAG: u8 = 2;
pub const TYPE_SYNC: u8 = 4;

/// Number of bits of `connId`: at most 1024 connections per proxy.
pub const CONN_ID_BITS: u32 = 10;
pub const MAX_CONNECTIONS: usize = 1 << CONN_ID_BITS;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    pub data_size: u32,
    pub src_offset: u32,
    pub dst_offset: u32,
    pub conn_id: u16,
    pub kind: u8,
}

impl Trigger {
    pub fn decode(words: [u64; 2]) -> Trigger {
        Trigger {
            data_size: words[0] as u32,
            src_offset: (words[0] >> 32) as u32,
            dst_offset: words[1] as u32,
            conn_id: ((words[1] >> 32) & ((1 << CONN_ID_BITS) - 1)) as u16,
            kind: ((words[1] >> 42) & 0x7) as u8,
        }
    }

    pub fn encode(&self) -> [u64; 2] {
        [
            self.data_size as u64 | (self.src_offset as u64) << 32,
            self.dst_offset as u64 | (self.conn_id as u64) << 32 | ((self.kind & 0x7) as u64) << 42,
        ]
    }

    /// Checks the Data part's ranges against the buffers at both ends; an error (InvalidUsage) means the
    /// trigger is malformed and its data is dropped.
    pub fn check_ranges(&self, local_size: u64, remote_size: u64) -> Result<()> {
        let size = self.data_size as u64;
        let check = |offset: u32, limit: u64, what: &str| {
            let end = offset as u64 + size;
            if end > limit {
                return Err(Error::invalid_usage(format!(
                    "{what} range +{offset}..+{end} is past the end of the {} ({limit} bytes)",
                    if what == "source" {
                        "local buffer"
                    } else {
                        "peer's buffer"
                    }
                )));
            }
            Ok(())
        };
        check(self.src_offset, local_size, "source")?;
        check(self.dst_offset, remote_size, "destination")
    }

    pub fn has_data(&self) -> bool {
        self.kind & TYPE_DATA != 0
    }
    pub fn has_flag(&self) -> bool {
        self.kind & TYPE_FLAG != 0
    }
    pub fn has_sync(&self) -> bool {
        self.kind & TYPE_SYNC != 0
    }
}

impl fmt::Debug for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut kinds = Vec::new();
        if self.has_data() {
            kinds.push("Data");
        }
        if self.has_flag() {
            kinds.push("Flag");
        }
        if self.has_sync() {
            kinds.push("Sync");
        }
        write!(
            f,
            "trigger{{conn {}, {}, size {}, src +{}, dst +{}}}",
            self.conn_id,
            if kinds.is_empty() {
                "no type".to_string()
            } else {
                kinds.join("|")
            },
            self.data_size,
            self.src_offset,
            self.dst_offset
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_example_encodes_bit_for_bit() {
        let t = Trigger {
            data_size: 0x11223344,
            src_offset: 0x55667788,
            dst_offset: 0x99aabbcc,
            conn_id: 0x3ff,
            kind: 5,
        };
        assert_eq!(t.encode(), [0x5566778811223344, 0x000017ff99aabbcc]);
        assert_eq!(Trigger::decode(t.encode()), t);
        assert!(t.has_data() && !t.has_flag() && t.has_sync());
    }

    #[test]
    fn decode_ignores_bits_above_the_type() {
        let t = Trigger::decode([1, u64::MAX]);
        assert_eq!((t.dst_offset, t.conn_id, t.kind), (u32::MAX, 0x3ff, 7));
    }

    #[test]
    fn debug_names_the_types() {
        let t = Trigger {
            data_size: 1,
            src_offset: 0,
            dst_offset: 0,
            conn_id: 2,
            kind: 6,
        };
        assert_eq!(format!("{t:?}"), "trigger{conn 2, Flag|Sync, size 1, src +0, dst +0}");
    }
}
