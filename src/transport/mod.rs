//! Transports: how a proxy carries out triggers for a kind of connection.
//!
//! - `p2p`: GPUs of one machine, the copy engine writing into peers' memory mapped with CUDA IPC.
//! - `flag_counts`: the exact flag values a P2P proxy copies into a peer's epoch struct.
//! - `ib`: InfiniBand (and RoCE), RDMA writes from GPU memory through libibverbs loaded at run time.

pub mod flag_counts;
pub mod ib;
pub mod p2p;
