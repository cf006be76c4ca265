//! Transports: how a proxy carries out triggers for a kind of connection.
//!
//! - `p2p`: GPUs of one machine, the copy engine writing into peers' memory mapped with CUDA IPC.
//! - `ib`: InfiniBand (and RoCE), RDMA writes from GPU memory through libibverbs loaded at run time.

pub mod ib;
pub mod p2p;
