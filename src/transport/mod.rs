//! Transports: how a proxy carries out triggers for a kind of connection.
//!
//! - `p2p`: GPUs of one machine, the copy engine writing into peers' memory mapped with CUDA IPC.
//! - `ib`: InfiniBand (not built yet; `mscclppConnect` says so).

pub mod p2p;
