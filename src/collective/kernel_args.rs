//! The one argument every collective kernel takes, laid out as `CollArgs` in
//! `kernels/collectives/common.cuh` (a test checks the offsets the device code relies on).

use crate::gpu::DevicePtr;

/// Ranks a collective can span: the scratch pointers travel in the kernel argument.
pub const MAX_RANKS: usize = 16;
/// Blocks a collective kernel may have: the flags at the start of each scratch slot have room for them.
pub const MAX_BLOCKS: u32 = 128;
/// Bytes of flags at the start of each scratch slot: [phase (2)][block][source rank] of 64 bits.
pub const FLAG_BYTES: u64 = 2 * MAX_BLOCKS as u64 * MAX_RANKS as u64 * 8;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelArgs {
    pub send: DevicePtr,
    pub recv: DevicePtr,
    pub bytes: u64,
    pub stride_bytes: u64,
    pub scratch: [DevicePtr; MAX_RANKS],
    pub slot_bytes: u64,
    pub packet_bytes: u64,
    pub state: DevicePtr,
    pub abort_flag: DevicePtr,
    pub rank: u32,
    pub nranks: u32,
    pub root: u32,
    pub aligned: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_the_device_struct() {
        assert_eq!(offset_of!(KernelArgs, scratch), 32);
        assert_eq!(offset_of!(KernelArgs, slot_bytes), 32 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, packet_bytes), 40 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, abort_flag), 56 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, rank), 64 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, aligned), 76 + 8 * MAX_RANKS);
        assert_eq!(size_of::<KernelArgs>(), 80 + 8 * MAX_RANKS);
    }

    #[test]
    fn constants_match_the_device_code() {
        let common = include_str!("../../kernels/collectives/common.cuh");
        for (name, value) in [
            ("MSCCLPP_COLL_MAX_RANKS", MAX_RANKS as u64),
            ("MSCCLPP_COLL_MAX_BLOCKS", MAX_BLOCKS as u64),
        ] {
            assert!(
                common.contains(&format!("#define {name} {value}\n")),
                "common.cuh must define {name} as {value}"
            );
        }
    }
}
