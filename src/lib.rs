//! libmscclpp: a GPU-driven communication library with the C ABI of MSCCL++ 0.1.0.
//!
//! Where things are:
//! - `abi/`: what both C faces need at their boundary: the panic boundary, token handles and their
//!   registry, pointer checks, unique-id bytes. Neither face imports the other.
//! - `mscclpp_abi/`: the `extern "C"` functions of `mscclpp.h`, each behind the panic boundary.
//! - `types.rs`: the ABI structs and enums the header is generated from.
//! - `bootstrap/`: TCP rendezvous, all-gather, barrier and point-to-point messages between ranks.
//! - `comm.rs`: the communicator of both faces: its bootstrap, GPU, collectives, registered buffers, and
//!   what it does at its first failure (its failure state is `failure.rs`'s).
//! - `connections.rs`: the legacy face's connection machine (`mscclppConnect`): the connection list, its
//!   state machine and transports, which it loops over (`connections::new_transport` picks the transport
//!   of a new connection), and their proxies; only `mscclpp.h`'s communicators make one.
//! - `registration.rs`: the buffers registered with a communicator (`mscclppCommRegister`, NCCL's
//!   `ncclCommRegister` and windows): their ranges and allocations, checked again at every lookup.
//! - `failure.rs`: the communicator's failure state: a proxy's failure, who aborted it, the parts it aborts
//!   once, and how its first failure is reported (`Failed`).
//! - `connection.rs`: what every connection has: peer, tag, buffer, epoch block, set-up message envelope.
//! - `transport/`: the `Transport` interface and one folder per transport, holding all of its code:
//!   - `transport/p2p/`: GPUs of one machine: copy engine into peers' memory mapped with CUDA IPC, fast
//!     flags in shared host memory, the P2P proxy's trigger handler;
//!   - `transport/ib/`: InfiniBand: libibverbs loaded at run time, queue pairs, memory regions, one proxy
//!     per device.
//!
//!   A new transport is one more folder there and one line in `connections::new_transport`.
//! - `pipeline/`: the one path of every call (collective, send/receive, one-sided, resume): submitted as
//!   work with its stream, planned (`collective/plan.rs`), run through one prologue, launched, and the
//!   communicator aborted where a launch fails after the peers may have started theirs.
//! - `collective/`: all-reduce, all-gather, reduce-scatter, broadcast and the rest of NCCL's collectives, and
//!   send and receive: the host side (checks, the algorithm table, scratch memory, launches); their kernels
//!   are in `kernels/collectives/`, one file per algorithm, compiled by build.rs and embedded.
//! - `nccl/`: NCCL's API (`nccl.h`), another face of the same core, exported by the `nccl-abi` feature under
//!   the prefix `mscclpp_nccl_face_` (the thin `libnccl.so.2` gives them NCCL's names); the `mscclpp-abi`
//!   feature exports `mscclpp_abi/`'s functions. Both are default: one build makes the one core library.
//! - `proxy/`: the host thread that serves a device FIFO, whatever the transport.
//! - `gpu/`: the CUDA driver, loaded at run time; all GPU work goes through its types.
//! - `settings.rs`: every `MSCCLPP_*` environment setting, declared and read in one place.
//! - `codec.rs`: the byte codec of set-up and bootstrap messages.
//! - `dynlib.rs`: shared libraries loaded at run time (libibverbs, NVIDIA's NCCL as a fallback).
//! - `logging.rs`, `error.rs`: logging with the rank and subsystem, and the core's error type, which each
//!   face maps onto its own codes.

// Every unsafe block says why it is sound (`// SAFETY:`): the C faces and the driver calls are most of
// the crate, and a reader checks each block against its comment.
#![warn(clippy::undocumented_unsafe_blocks)]

/// The commit this library was built from (`build.rs`; `unknown` outside a git checkout).
pub const BUILD_COMMIT: &str = env!("LIB_BUILD_COMMIT");

/// `BUILD_COMMIT` as the library's read-only data holds it, `libmscclpp build commit <hash>;` (the `;` ends it
/// where other text follows in the binary), so that a benchmark can tell from the file which build it
/// measures (`examples-c/bench/nccl_tests.sh`).
#[used]
static BUILD_COMMIT_TAG: &str = concat!("libmscclpp build commit ", env!("LIB_BUILD_COMMIT"), ";");

pub mod abi;
pub mod bootstrap;
pub mod codec;
pub mod collective;
pub mod comm;
pub mod connection;
pub mod connections;
pub mod dynlib;
pub mod error;
pub mod failure;
pub mod gpu;
pub mod logging;
#[cfg(feature = "mscclpp-abi")]
pub mod mscclpp_abi;
pub mod nccl;
pub mod pipeline;
pub mod proxy;
pub mod registration;
pub mod settings;
pub mod transport;
pub mod types;

#[cfg(test)]
mod tests {
    #[test]
    fn the_build_commit_is_a_hash_or_unknown() {
        let c = super::BUILD_COMMIT;
        assert!(
            c == "unknown" || (c.len() == 12 && c.bytes().all(|b| b.is_ascii_hexdigit())),
            "{c}"
        );
        assert_eq!(super::BUILD_COMMIT_TAG, format!("libmscclpp build commit {c};"));
    }
}
