//! Transports: how a proxy carries out triggers for a kind of connection.
//!
//! - `p2p`: GPUs of one machine, the copy engine writing into peers' memory mapped with CUDA IPC.
//! - `flag_counts`: the exact flag values a P2P proxy copies into a peer's epoch struct.
//! - `ib`: InfiniBand (and RoCE), RDMA writes from GPU memory through libibverbs loaded at run time.

pub mod flag_counts;
pub mod ib;
pub mod p2p;

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts one more flag carried out on connection `conn_id` and returns the new count: the value the
/// peer's `proxy` word must hold once this flag has landed (P2P and IB flags carry it, where the legacy
/// proxies sent the `device` epoch).
pub fn count_flag(flags_sent: &[AtomicU64], conn_id: usize) -> Result<u64> {
    let sent = flags_sent
        .get(conn_id)
        .ok_or_else(|| Error::internal(format!("connection {conn_id} has no flag count")))?;
    Ok(sent.fetch_add(1, Ordering::Relaxed) + 1)
}
