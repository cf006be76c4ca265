//! The host side of NCCL's device API (`nccl_device/host.h`, ours in `include/nccl_device/host.h`): what
//! one machine can answer truthfully is answered (the teams, `ncclCommQueryProperties`); what needs NCCL's
//! device kernels (the barrier, GIN and LL all-to-all requirements) or NVLink multicast (multimem
//! pointers, CFT) is refused with `ncclInvalidUsage` and a log line saying why, never a crash. The peer
//! pointers of a window are in `rma.rs`, with the windows' one-sided calls.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::NcclComm;
use super::config::{Header, header};
use super::entry::{OK, entry, with_comm};
use super::types::{
    DevComm, DevCommRequirements, NCCL_CONFIG_MAGIC, NCCL_VERSION_CODE, ncclComm_t, ncclResult_t, ncclWindow_t,
};
use crate::abi::non_null_args;
use crate::ensure_arg;
use crate::error::{Error, Result};
use std::ffi::{c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

/// `ncclTeam_t`: `nRanks` ranks, this one at `rank`, world ranks `stride` apart. Returned by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// What the teams of a communicator that cannot be found, or that this library does not offer, are.
const EMPTY: ncclTeam_t = ncclTeam_t {
    nRanks: 0,
    rank: 0,
    stride: 0,
};

/// `ncclCommProperties_t` of NCCL 2.32 (152 bytes on x86-64): read by its `size`, filled up to it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclCommProperties_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub rank: c_int,
    pub nRanks: c_int,
    pub cudaDev: c_int,
    pub nvmlDev: c_int,
    pub deviceApiSupport: bool,
    pub multimemSupport: bool,
    pub ginType: c_int,
    pub nLsaTeams: c_int,
    pub hostRmaSupport: bool,
    pub railedGinType: c_int,
    pub commHash: u64,
    pub ginMinStride: c_int,
    pub ginConnectionType: c_int,
    pub ginSupport: [bool; 64],
    pub devCommRuntimeVersionSize: usize,
    pub cftSupport: bool,
    pub cftMulticastSupport: bool,
    pub cftCountedSupport: bool,
}

/// The oldest `ncclCommProperties_t` (2.28): up to `nLsaTeams`.
const OLDEST_PROPERTIES: usize = offset_of!(ncclCommProperties_t, hostRmaSupport);

/// The properties of `c` as this library has them.
fn properties(c: &NcclComm) -> Result<ncclCommProperties_t> {
    let (rank, nranks) = c.place()?;
    let core = c.core()?;
    // The same on every rank: a hash of where every rank's bootstrap listened.
    let b = core.bootstrap();
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for peer in 0..nranks {
        for byte in b.peer_addr(peer).map(|a| a.to_string()).unwrap_or_default().bytes() {
            hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(ncclCommProperties_t {
        size: size_of::<ncclCommProperties_t>(),
        magic: NCCL_CONFIG_MAGIC,
        version: NCCL_VERSION_CODE as c_uint,
        rank: rank as c_int,
        nRanks: nranks as c_int,
        cudaDev: c.device.unwrap_or(-1),
        nvmlDev: -1,
        deviceApiSupport: false,
        multimemSupport: false,
        ginType: 0,
        nLsaTeams: 1,
        hostRmaSupport: true,
        railedGinType: 0,
        commHash: hash,
        ginMinStride: 0,
        ginConnectionType: 0,
        ginSupport: [false; 64],
        devCommRuntimeVersionSize: 0,
        cftSupport: false,
        cftMulticastSupport: false,
        cftCountedSupport: false,
    })
}

nccl_export! {
    /// The communicator's properties: its place, its device, and what it offers of the device API (none:
    /// no device communicator, no multicast, no GIN) and of the one-sided calls (host-side RMA: yes).
    fn ncclCommQueryProperties / pncclCommQueryProperties(comm: ncclComm_t, props: *mut ncclCommProperties_t) -> ncclResult_t {
        with_comm("ncclCommQueryProperties", comm, |c| {
            non_null_args!(props);
            // SAFETY: checked non-null; every version of the struct starts with size, magic, version.
            let Header { size, magic, .. } = unsafe { header(props) };
            ensure_arg!(
                magic == NCCL_CONFIG_MAGIC,
                "props' magic is {magic:#x}, not {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_COMM_PROPERTIES_INITIALIZER"
            );
            ensure_arg!(
                size >= OLDEST_PROPERTIES,
                "props' size is {size} bytes; the smallest ncclCommProperties_t has {OLDEST_PROPERTIES}"
            );
            let mine = properties(c)?;
            let n = size.min(size_of::<ncclCommProperties_t>());
            let skip = offset_of!(ncclCommProperties_t, rank);
            // SAFETY: the caller's struct is `size` bytes long (nccl.h's contract, its header checked); only
            // the fields after its header, and within its size, are written.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&mine as *const ncclCommProperties_t).cast::<u8>().add(skip),
                    props.cast::<u8>().add(skip),
                    n - skip,
                )
            };
            OK
        })
    }
}

/// A team of `c` made by `make` from its rank and size; the empty team, with a WARN, where `c` is not a
/// live communicator whose place is known.
fn team(name: &str, comm: ncclComm_t, make: impl FnOnce(usize, usize) -> ncclTeam_t) -> ncclTeam_t {
    let mut made = EMPTY;
    let _ = with_comm(name, comm, |c| {
        let (rank, nranks) = c.place()?;
        made = make(rank, nranks);
        OK
    });
    made
}

nccl_export! {
    /// Every rank of the communicator.
    fn ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamWorld", comm, |rank, nranks| ncclTeam_t { nRanks: nranks as c_int, rank: rank as c_int, stride: 1 })
    }
}

nccl_export! {
    /// The ranks whose memory this one reaches by loads and stores: every rank (they share one machine).
    fn ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamLsa", comm, |rank, nranks| ncclTeam_t { nRanks: nranks as c_int, rank: rank as c_int, stride: 1 })
    }
}

nccl_export! {
    /// The ranks of the same local index on every machine: this rank alone (one machine).
    fn ncclTeamRail / pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
        team("ncclTeamRail", comm, |_, nranks| ncclTeam_t { nRanks: 1, rank: 0, stride: nranks as c_int })
    }
}

/// CFT teams need NVLink multicast, which this library never uses: the empty team, with a WARN.
fn no_cft_team(name: &str, comm: ncclComm_t) -> ncclTeam_t {
    let _ = with_comm(name, comm, |_| {
        Err(not_offered("CFT teams (they need NVLink multicast)"))
    });
    EMPTY
}

nccl_export! {
    /// Not offered: the empty team.
    fn ncclTeamCft / pncclTeamCft(comm: ncclComm_t, mode: c_int) -> ncclTeam_t {
        let _ = mode;
        no_cft_team("ncclTeamCft", comm)
    }
}

nccl_export! {
    /// Not offered: the empty team.
    fn ncclTeamCftMultimem / pncclTeamCftMultimem(comm: ncclComm_t) -> ncclTeam_t {
        no_cft_team("ncclTeamCftMultimem", comm)
    }
}

/// The world rank of `team`'s rank `rank` on `c` (world = LSA here); -1 with a WARN outside the team.
fn team_rank_to_world(name: &str, comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
    let mut world = -1;
    let _ = with_comm(name, comm, |c| {
        let (me, nranks) = c.place()?;
        ensure_arg!(
            team.nRanks > 0 && (0..team.nRanks).contains(&team.rank),
            "team is {{nRanks {}, rank {}, stride {}}}: not a team of this communicator",
            team.nRanks,
            team.rank,
            team.stride
        );
        ensure_arg!(
            (0..team.nRanks).contains(&rank),
            "rank is {rank}; it must be in [0, team.nRanks = {})",
            team.nRanks
        );
        let w = me as i64 + (rank as i64 - team.rank as i64) * team.stride as i64;
        ensure_arg!(
            (0..nranks as i64).contains(&w),
            "team {{nRanks {}, rank {}, stride {}}} does not hold this rank's world rank {me}",
            team.nRanks,
            team.rank,
            team.stride
        );
        world = w as c_int;
        OK
    });
    world
}

nccl_export! {
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
        team_rank_to_world("ncclTeamRankToWorld", comm, team, rank)
    }
}

nccl_export! {
    /// The LSA team is the world here, so an LSA rank is a world rank.
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int) -> c_int {
        team_rank_to_world("ncclTeamRankToLsa", comm, team, rank)
    }
}

/// The error of what this library does not offer.
fn not_offered(what: &str) -> Error {
    Error::invalid_usage(format!(
        "{what}: not offered by this library (it has no device communicator, and never uses NVLink multicast)"
    ))
}

/// A call of the device API's host side that is not offered: `ncclInvalidUsage` naming it.
fn refuse(name: &str, what: &str) -> ncclResult_t {
    entry(name, || Err(not_offered(what)))
}

nccl_export! {
    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(window: ncclWindow_t, offset: usize, outPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (window, offset, outPtr);
        refuse("ncclGetLsaMultimemDevicePointer", "multimem pointers")
    }
}

/// `ncclMultimemHandle_t`: passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclMultimemHandle_t {
    pub mcBasePtr: *mut c_void,
}

nccl_export! {
    fn ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(window: ncclWindow_t, offset: usize, multimem: ncclMultimemHandle_t, outPtr: *mut *mut c_void) -> ncclResult_t {
        let _ = (window, offset, multimem, outPtr);
        refuse("ncclGetMultimemDevicePointer", "multimem pointers")
    }
}

nccl_export! {
    fn ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(window: ncclWindow_t, offset: usize, leId: *mut u32, leOffset: *mut usize) -> ncclResult_t {
        let _ = (window, offset, leId, leOffset);
        refuse("ncclGetMultimemDeviceLeInfo", "CFT")
    }
}

nccl_export! {
    fn ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(window: ncclWindow_t, offset: usize, peerCft: c_int, cftTeam: ncclTeam_t, leId: *mut u32, leOffset: *mut usize) -> ncclResult_t {
        let _ = (window, offset, peerCft, cftTeam, leId, leOffset);
        refuse("ncclGetCftDeviceLeInfo", "CFT")
    }
}

nccl_export! {
    fn ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(window: ncclWindow_t, offset: usize, peerWorld: c_int, leId: *mut u32, leOffset: *mut usize) -> ncclResult_t {
        let _ = (window, offset, peerWorld, leId, leOffset);
        refuse("ncclGetPeerDeviceLeInfo", "CFT")
    }
}

/// The device API's requirement structs: only pointers pass through.
pub type DevResourceRequirements = c_void;
pub type ResourceHandle = c_void;

nccl_export! {
    fn ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(team: ncclTeam_t, nBarriers: c_int, outHandle: *mut ResourceHandle, outReq: *mut DevResourceRequirements) -> ncclResult_t {
        let _ = (team, nBarriers, outHandle, outReq);
        refuse("ncclLsaBarrierCreateRequirement", "device-API barriers")
    }
}

nccl_export! {
    fn ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(comm: ncclComm_t, team: ncclTeam_t, nBarriers: c_int, outHandle: *mut ResourceHandle, outReq: *mut DevResourceRequirements) -> ncclResult_t {
        let _ = (team, nBarriers, outHandle, outReq);
        with_comm("ncclGinBarrierCreateRequirement", comm, |_| {
            Err(not_offered("GIN (device-initiated networking)"))
        })
    }
}

nccl_export! {
    /// The device API's LL all-to-all is not offered: 0 slots, with a WARN.
    fn ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int) -> c_int {
        let _ = (maxElts, maxEltSize);
        refuse("ncclLLA2ACalcSlots", "the device API's LL all-to-all");
        0
    }
}

nccl_export! {
    fn ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(nBlocks: c_int, nSlots: c_int, outHandle: *mut ResourceHandle, outReq: *mut DevResourceRequirements) -> ncclResult_t {
        let _ = (nBlocks, nSlots, outHandle, outReq);
        refuse("ncclLLA2ACreateRequirement", "the device API's LL all-to-all")
    }
}

nccl_export! {
    fn ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(nBlocks: c_int, size_log2: c_int, outHandle: *mut ResourceHandle, outReq: *mut DevResourceRequirements) -> ncclResult_t {
        let _ = (nBlocks, size_log2, outHandle, outReq);
        refuse("ncclGinOutboxCreateRequirement", "GIN (device-initiated networking)")
    }
}

nccl_export! {
    fn ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(peers: ncclTeam_t, nBlocks: c_int, size_log2: c_int, outHandle: *mut ResourceHandle, outReq: *mut DevResourceRequirements) -> ncclResult_t {
        let _ = (peers, nBlocks, size_log2, outHandle, outReq);
        refuse("ncclGinInboxA2ACreateRequirement", "GIN (device-initiated networking)")
    }
}

// ---- NCCL's device API: not offered ----

nccl_export! {
    /// NCCL's device API is not offered: `ncclInvalidUsage`.
    fn ncclDevCommCreate / pncclDevCommCreate(
        comm: ncclComm_t,
        reqs: *const DevCommRequirements,
        outDevComm: *mut DevComm,
    ) -> ncclResult_t {
        let _ = (reqs, outDevComm);
        with_comm("ncclDevCommCreate", comm, |_| {
            Err(Error::invalid_usage("NCCL's device API (ncclDevComm) is not offered by this library"))
        })
    }
}

nccl_export! {
    /// NCCL's device API is not offered: `ncclInvalidUsage`.
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const DevComm) -> ncclResult_t {
        let _ = devComm;
        with_comm("ncclDevCommDestroy", comm, |_| {
            Err(Error::invalid_usage("NCCL's device API (ncclDevComm) is not offered by this library"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::comm as ncomm;

    #[test]
    fn properties_are_laid_out_as_nccls() {
        assert_eq!(size_of::<ncclCommProperties_t>(), 152);
        assert_eq!(size_of::<ncclTeam_t>(), 12);
        let offsets = [
            offset_of!(ncclCommProperties_t, rank),
            offset_of!(ncclCommProperties_t, deviceApiSupport),
            offset_of!(ncclCommProperties_t, ginType),
            offset_of!(ncclCommProperties_t, nLsaTeams),
            offset_of!(ncclCommProperties_t, hostRmaSupport),
            offset_of!(ncclCommProperties_t, railedGinType),
            offset_of!(ncclCommProperties_t, commHash),
            offset_of!(ncclCommProperties_t, ginConnectionType),
            offset_of!(ncclCommProperties_t, ginSupport),
            offset_of!(ncclCommProperties_t, devCommRuntimeVersionSize),
            offset_of!(ncclCommProperties_t, cftCountedSupport),
        ];
        assert_eq!(offsets, [16, 32, 36, 40, 44, 48, 56, 68, 72, 136, 146]);
    }

    #[test]
    fn a_team_rank_maps_to_the_world() {
        let c = ncomm::register(NcclComm::pending(2, 4, None, None));
        let world = ncclTeam_t {
            nRanks: 4,
            rank: 2,
            stride: 1,
        };
        // SAFETY: a registered handle.
        unsafe {
            assert_eq!(ncclTeamRankToWorld(c, world, 0), 0);
            assert_eq!(ncclTeamRankToWorld(c, world, 3), 3);
            assert_eq!(ncclTeamRankToWorld(c, world, 4), -1);
            let rail = ncclTeam_t {
                nRanks: 1,
                rank: 0,
                stride: 4,
            };
            assert_eq!(ncclTeamRankToLsa(c, rail, 0), 2);
            assert_eq!(ncclTeamRankToWorld(c, EMPTY, 0), -1);
            assert_eq!(ncclTeamRankToWorld(std::ptr::null_mut(), world, 0), -1);
        }
        ncomm::unregister(c).unwrap();
    }
}
