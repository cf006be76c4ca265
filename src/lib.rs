//! libmscclpp: a GPU-driven communication library with the C ABI of MSCCL++ 0.1.0.
//!
//! Where things are:
//! - `ffi/`: the `extern "C"` functions of `mscclpp.h`, each behind a panic boundary.
//! - `types.rs`: the ABI structs and enums the header is generated from.
//! - `bootstrap/`: TCP rendezvous, all-gather, barrier and point-to-point messages between ranks.
//! - `comm.rs`: the communicator, which owns a bootstrap, connections and proxies.
//! - `failure.rs`: what the communicator does when a peer fails or it is aborted, and what it reports.
//! - `connection.rs`: a connection between two ranks, as recorded by `mscclppConnect`.
//! - `transport/`: how a connection moves data (P2P over CUDA IPC; InfiniBand).
//! - `proxy/`: the host thread that serves the device FIFO.
//! - `gpu/`: the CUDA driver, loaded at run time.
//! - `settings.rs`: every `MSCCLPP_*` environment setting, declared and read in one place.
//! - `codec.rs`: the byte codec of set-up and bootstrap messages.
//! - `logging.rs`, `error.rs`: logging with the rank and subsystem, and error codes.

pub mod bootstrap;
pub mod codec;
pub mod comm;
pub mod connection;
pub mod error;
pub mod failure;
pub mod ffi;
pub mod gpu;
pub mod logging;
pub mod proxy;
pub mod registered_memory;
pub mod settings;
pub mod transport;
pub mod types;
