//! NCCL's API (`nccl.h` of NCCL 2.32.3 and its device API's host side): the second face of the same core,
//! beside `mscclpp.h`'s (`mscclpp_abi/`), over the shared C-ABI base (`abi/`: the panic boundary, handles,
//! argument helpers). The `nccl-abi` feature exports each function, with NCCL's `pnccl` twin, from the core
//! under the prefix `mscclpp_nccl_face_`; the thin `libnccl.so.2` gives them NCCL's names (`nccl_export!`).
//!
//! Its data path is thin: a collective, a send or receive, a one-sided call is checked here and handed to
//! the core's communicator (`crate::comm::Communicator`, the one `mscclpp.h` uses), whose collectives
//! (`crate::collective`) carry it out. What the core does not carry out goes to NVIDIA's library where
//! `MSCCLPP_NCCL_FALLBACK` names it, else fails with `ncclInvalidUsage`, naming the function and the
//! setting.
//!
//! Its control plane is not thin: NCCL's semantics that `mscclpp.h` has no counterpart for live here, over
//! the core: groups (work queued per thread and issued at the outermost end), blocking, non-blocking and
//! grouped initialisation, split, shrink and grow (the ranks' agreement over the parent's bootstrap),
//! revoke, suspend and resume, versioned configs, per-call configs, `PreMulSum` operators, the settings
//! API, the last error's message, and the NVIDIA communicator kept beside ours.
//!
//! An `ncclAllReduce` enters in `collectives.rs` (`collective`: arguments checked, NCCL's type and
//! operator read, the core's `Call` made and submitted as work, `pipeline::Submitted`), is issued or queued
//! by `queue.rs` (`issue`), and reaches its launch through the core's pipeline (`src/pipeline/`).
//!
//! The calls, by file:
//! - `entry.rs`: what every export does first: the panic boundary (`entry`), the communicator behind an
//!   `ncclComm_t` (`with_comm`), NCCL's type numbers and rank arguments read;
//! - `collectives.rs`: `ncclAllReduce`, `ncclAllGather`, `ncclReduceScatter`, `ncclBroadcast`, `ncclBcast`,
//!   `ncclReduce`, `ncclAlltoAll`, `ncclGather`, `ncclScatter`;
//! - `coll_config.rs`: the same collectives with a per-call `ncclCollConfig_t` (`ncclAllReduceConfig`, ...);
//! - `send_recv.rs`: `ncclSend` and `ncclRecv` (their protocol is the core's, in `src/collective/`);
//! - `rma.rs`: the one-sided calls (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, `ncclWinGetUserPtr`)
//!   and the peer pointers of a window;
//! - `operators.rs`: `ncclRedOpCreatePreMulSum`, `ncclRedOpDestroy`, and every call's `ncclRedOp_t` read;
//! - `queue.rs`: the work of a call (`Op`), run now or queued in this thread's group (`issue`, and
//!   `enqueue`, the entry of a call whose failure also fails the group), and the per-thread bookkeeping
//!   (`Group`);
//! - `group.rs`: `ncclGroupStart`, `ncclGroupEnd`, `ncclGroupSimulateEnd`, and the engine that issues a
//!   group's work at its outermost end (`run_group`);
//! - `init.rs`: `ncclGetUniqueId`, `ncclCommInitRank`, `ncclCommInitRankConfig`, `ncclCommInitRankScalable`,
//!   `ncclCommInitAll`, and how every new communicator is made: blocking, non-blocking (a thread of its
//!   own, `ncclInProgress`) or at a group's end (`start`, `start_child`, `finish_init`);
//! - `split.rs`: `ncclCommSplit` and `ncclCommShrink`: how the ranks agree on a new communicator (after a
//!   failure too);
//! - `grow.rs`: `ncclCommGetUniqueId` and `ncclCommGrow`: new ranks joining the ranks of a communicator;
//! - `teardown.rs`: `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`, `ncclCommRevoke`;
//! - `suspend.rs`: `ncclCommSuspend`, `ncclCommResume` and `ncclCommMemStats`: the collectives' device memory
//!   released while the communicator is idle, and made again by every rank together;
//! - `memory.rs`: `ncclMemAlloc`, `ncclMemFree`, and the registrations of buffers and windows
//!   (`ncclCommRegister`, `ncclCommWindowRegister`, their deregistrations) in the core's table;
//! - `queries.rs`: `ncclGetVersion`, `ncclGetErrorString`, `ncclGetLastError`, `ncclCommGetAsyncError`,
//!   `ncclCommCount`, `ncclCommUserRank`, `ncclCommCuDevice`;
//! - `device_host.rs`: the host side of NCCL's device API (`nccl_device/host.h`): teams, properties; what
//!   needs NCCL's device kernels or NVLink multicast refused (`ncclDevCommCreate` among them);
//! - `encryption.rs`: `ncclSetEncryption` (a key is refused: nothing here would encrypt with it);
//! - `params.rs`: NCCL 2.30's settings API (`ncclParam*`) over the library's one table of settings, and
//!   `ncclResetDebugInit`.
//!
//! What they share:
//! - `types.rs`: NCCL's result codes, type and operator numbers, `ncclUniqueId`, `ncclConfig_t`,
//!   `ncclSimInfo_t`;
//! - `config.rs`: a caller's `ncclConfig_t` (and the other versioned structs' header), read by its own
//!   size and version;
//! - `comm.rs`: what an `ncclComm_t` names: the core's communicator and NCCL's bookkeeping beside it;
//! - `error.rs`: our errors as `ncclResult_t`, and the last error's message;
//! - `fallback.rs`: `MSCCLPP_NCCL_FALLBACK`: NVIDIA's library, loaded privately, and its communicator beside
//!   ours, which gets what the core does not carry out.

/// Defines an exported function and its `pnccl` twin (NCCL exports both; profilers interpose the first), or
/// (the second form) a function without a twin. With the `nccl-abi` feature each is exported under
/// `mscclpp_nccl_face_` and its NCCL name (`mscclpp_nccl_face_ncclAllReduce`), never under the NCCL name
/// itself: a program that loads `libmscclpp.so.0` beside NVIDIA's NCCL keeps NVIDIA's functions. The thin
/// `libnccl.so.2` exports the NCCL names, each a jump to the core's function (`scripts/nccl-face.sh` writes
/// them from the core's exports under that prefix).
macro_rules! nccl_export {
    ($(#[$attr:meta])* fn $name:ident / $twin:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        nccl_export! { $(#[$attr])* fn $name($($arg: $ty),*) -> $ret $body }

        nccl_export! {
            #[doc = concat!("`", stringify!($name), "` under NCCL's profiling name.")]
            fn $twin($($arg: $ty),*) -> $ret {
                // SAFETY: the same function, under the same contract.
                unsafe { $name($($arg),*) }
            }
        }
    };
    ($(#[$attr:meta])* fn $name:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$attr])*
        #[cfg_attr(
            feature = "nccl-abi",
            unsafe(export_name = concat!("mscclpp_nccl_face_", stringify!($name)))
        )]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body
    };
}

pub mod coll_config;
pub mod collectives;
pub mod comm;
pub mod config;
pub mod device_host;
pub mod encryption;
pub mod engine_search;
pub mod entry;
pub mod error;
pub mod fallback;
pub mod group;
pub mod grow;
pub mod init;
pub mod memory;
pub mod operators;
pub mod params;
pub mod queries;
pub mod queue;
pub mod rma;
pub mod send_recv;
pub mod split;
pub mod suspend;
pub mod teardown;
pub mod types;
