//! NCCL 2.32.3's C types and values, as its `nccl.h` lays them out (`include/nccl.h` is ours, written from
//! the same facts; the tests below and the C test check that the two agree).
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `NCCL_VERSION(2, 32, 3)`: the version whose API this face implements (every function of its `nccl.h`
/// and of the host side of its device API is defined).
pub const NCCL_VERSION_CODE: c_int = 23203;

/// `ncclResult_t`. Returned by value; never read from the caller, so an enum is safe here.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    /// From NCCL 2.30.3.
    ncclTimeout = 8,
}

/// `ncclNumResults`: one past the last result code.
pub const NCCL_NUM_RESULTS: c_int = 9;

/// `ncclDataType_t` values. The caller's enum arrives as an int (any int: an out-of-range value is an
/// error, not undefined behaviour). 0 to 9 are the core's `DataType` numbering.
pub mod datatype {
    use std::ffi::c_int;
    pub const FLOAT8E4M3: c_int = 10;
    pub const FLOAT8E5M2: c_int = 11;
    /// `ncclNumTypes`.
    pub const NUM_TYPES: c_int = 12;
}

/// `ncclRedOp_t` values: 0 to 4 are the core's `RedOp` numbering; ops made by `ncclRedOpCreatePreMulSum`
/// are numbered from `NUM_OPS` up.
pub mod redop {
    use std::ffi::c_int;
    /// `ncclNumOps`.
    pub const NUM_OPS: c_int = 5;
}

/// `ncclScalarResidence_t`.
pub const NCCL_SCALAR_DEVICE: c_int = 0;
pub const NCCL_SCALAR_HOST_IMMEDIATE: c_int = 1;

/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_DEFAULT`, `NCCL_SHRINK_ABORT`.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
pub const NCCL_SHRINK_ABORT: c_int = 1;
/// `NCCL_WIN_DEFAULT`, `NCCL_WIN_COLL_SYMMETRIC`.
pub const NCCL_WIN_DEFAULT: c_int = 0;
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 1;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// The communicator behind an `ncclComm_t`: never defined, never dereferenced (handles are tokens).
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}
pub type ncclComm_t = *mut ncclComm;

/// The window behind an `ncclWindow_t`: a token too.
#[repr(C)]
pub struct ncclWindow {
    _opaque: [u8; 0],
}
pub type ncclWindow_t = *mut ncclWindow;

/// `ncclConfig_t.magic`.
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: a field the caller left to us.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `ncclConfig_t` of NCCL 2.32 (`ncclConfig_v23100`), 120 bytes on x86-64; it grew only at its end: 80
/// bytes in 2.28 (up to `nvlinkCentricSched`), 88 in 2.29 (`numRmaCtx`), 96 in 2.30
/// (`graphStreamOrdering`), 112 in 2.31 (`rmaEagerInit`), 120 in 2.32. A caller compiled against an older
/// header passes a prefix of it (its `size` says how long); `config.rs` reads it that way.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
    pub nvlsHostMode: c_int,
}

impl ncclConfig_t {
    /// What `NCCL_CONFIG_INITIALIZER` makes: every field but the header ones undefined.
    pub fn initializer() -> ncclConfig_t {
        let undef = NCCL_CONFIG_UNDEF_INT;
        ncclConfig_t {
            size: std::mem::size_of::<ncclConfig_t>(),
            magic: NCCL_CONFIG_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: undef,
            cgaClusterSize: undef,
            minCTAs: undef,
            maxCTAs: undef,
            netName: std::ptr::null(),
            splitShare: undef,
            trafficClass: undef,
            commName: std::ptr::null(),
            collnetEnable: undef,
            CTAPolicy: undef,
            shrinkShare: undef,
            nvlsCTAs: undef,
            nChannelsPerNetPeer: undef,
            nvlinkCentricSched: undef,
            graphUsageMode: undef,
            numRmaCtx: undef,
            maxP2pPeers: undef,
            graphStreamOrdering: undef,
            launchOrderImplicit: undef,
            numRmaSig: undef,
            rmaEagerInit: undef,
            hostCftMode: undef,
            nvlsHostMode: undef,
        }
    }
}

/// `ncclSimInfo_t.magic`.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `ncclSimInfo_t`: what `ncclGroupSimulateEnd` fills.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub estimatedTime: f32,
}

/// `ncclDevCommRequirements` and `ncclDevComm` of NCCL's device API, which this library does not offer:
/// only pointers to them pass through.
pub type DevCommRequirements = c_void;
pub type DevComm = c_void;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_are_nccl_2_32s() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(size_of::<ncclConfig_t>(), 120);
        let offsets = [
            offset_of!(ncclConfig_t, size),
            offset_of!(ncclConfig_t, magic),
            offset_of!(ncclConfig_t, version),
            offset_of!(ncclConfig_t, blocking),
            offset_of!(ncclConfig_t, cgaClusterSize),
            offset_of!(ncclConfig_t, minCTAs),
            offset_of!(ncclConfig_t, maxCTAs),
            offset_of!(ncclConfig_t, netName),
            offset_of!(ncclConfig_t, splitShare),
            offset_of!(ncclConfig_t, trafficClass),
            offset_of!(ncclConfig_t, commName),
            offset_of!(ncclConfig_t, collnetEnable),
            offset_of!(ncclConfig_t, CTAPolicy),
            offset_of!(ncclConfig_t, shrinkShare),
            offset_of!(ncclConfig_t, nvlsCTAs),
            offset_of!(ncclConfig_t, nChannelsPerNetPeer),
            offset_of!(ncclConfig_t, nvlinkCentricSched),
            offset_of!(ncclConfig_t, graphUsageMode),
            offset_of!(ncclConfig_t, numRmaCtx),
            offset_of!(ncclConfig_t, maxP2pPeers),
            offset_of!(ncclConfig_t, graphStreamOrdering),
            offset_of!(ncclConfig_t, launchOrderImplicit),
            offset_of!(ncclConfig_t, numRmaSig),
            offset_of!(ncclConfig_t, rmaEagerInit),
            offset_of!(ncclConfig_t, hostCftMode),
            offset_of!(ncclConfig_t, nvlsHostMode),
        ];
        assert_eq!(
            offsets,
            [
                0, 8, 12, 16, 20, 24, 28, 32, 40, 44, 48, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 96, 100, 104, 108,
                112
            ]
        );
        assert_eq!(size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(size_of::<ncclResult_t>(), 4);
    }

    #[test]
    fn the_unique_id_holds_ours() {
        assert_eq!(
            crate::bootstrap::UniqueId {
                root: "127.0.0.1:1".parse().unwrap(),
                magic: 1
            }
            .to_bytes()
            .len(),
            NCCL_UNIQUE_ID_BYTES
        );
    }
}
