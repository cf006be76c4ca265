//! NCCL's API (`nccl.h` of NCCL 2.32.3 and its device API's host side): another face of the same core. One
//! communicator (`crate::comm`), one collectives path (`crate::collective`, through the calls
//! `mscclpp_abi/collectives.rs` makes), one failure path; what the core does not carry out yet goes to NVIDIA's
//! library where `MSCCLPP_NCCL_FALLBACK` names it, else fails with `ncclInvalidUsage`, naming the function
//! and the setting.
//!
//! - `types.rs`: NCCL's result codes, type and operator numbers, `ncclUniqueId`, `ncclConfig_t`,
//!   `ncclSimInfo_t`;
//! - `config.rs`: a caller's `ncclConfig_t`, read by its own size and version;
//! - `comm.rs`: what an `ncclComm_t` names: the core's communicator and NCCL's bookkeeping beside it;
//! - `group.rs`: `ncclGroupStart` / `ncclGroupEnd` bookkeeping (per thread);
//! - `split.rs`: `ncclCommSplit` and `ncclCommShrink`: how the ranks agree on a new communicator (after
//!   a failure too);
//! - `grow.rs`: `ncclCommGetUniqueId` and `ncclCommGrow`: new ranks joining the ranks of a communicator;
//! - `suspend.rs`: `ncclCommSuspend`, `ncclCommResume` and `ncclCommMemStats`: the collectives' device memory
//!   released while the communicator is idle, and made again by every rank together;
//! - `error.rs`: our errors as `ncclResult_t`, and the last error's message;
//! - `fallback.rs`: `MSCCLPP_NCCL_FALLBACK`: NVIDIA's library, loaded privately, and its communicator beside
//!   ours, which gets what the core does not carry out;
//! - `coll_config.rs`: the collectives with a per-call `ncclCollConfig_t` (`ncclAllReduceConfig`, ...);
//! - `device_host.rs`: the host side of NCCL's device API (`nccl_device/host.h`): teams, properties; what
//!   needs NCCL's device kernels or NVLink multicast refused;
//! - `encryption.rs`: `ncclSetEncryption` (a key is refused: nothing here would encrypt with it);
//! - `params.rs`: NCCL 2.30's settings API (`ncclParam*`) over the library's one table of settings, and
//!   `ncclResetDebugInit`;
//! - `rma.rs`: the one-sided calls (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, `ncclWinGetUserPtr`)
//!   and the peer pointers of a window;
//! - `api.rs`: the `extern "C"` functions, exported by the `nccl-abi` feature (`libnccl.so.2`).

/// Defines an exported function and its `pnccl` twin (NCCL exports both; profilers interpose the first).
macro_rules! nccl_export {
    ($(#[$attr:meta])* fn $name:ident / $twin:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$attr])*
        #[cfg_attr(feature = "nccl-abi", unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        #[doc = concat!("`", stringify!($name), "` under NCCL's profiling name.")]
        #[cfg_attr(feature = "nccl-abi", unsafe(no_mangle))]
        pub unsafe extern "C" fn $twin($($arg: $ty),*) -> $ret {
            // SAFETY: the same function, under the same contract.
            unsafe { $name($($arg),*) }
        }
    };
}

pub mod api;
pub mod coll_config;
pub mod comm;
pub mod config;
pub mod device_host;
pub mod encryption;
pub mod error;
pub mod fallback;
pub mod group;
pub mod grow;
pub mod params;
pub mod rma;
pub mod split;
pub mod suspend;
pub mod types;
