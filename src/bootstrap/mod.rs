//! The TCP bootstrap: how ranks find each other and exchange set-up data before any GPU work.
//!
//! CONTRACT (used by `comm.rs`, `connection` set-up and the FFI layer; keep these signatures):
//!
//! - `RootAddress::parse("ip:port" | "ifname:ip:port" | "[v6addr]:port" | "ifname:[v6addr]:port")`
//! - `UniqueId::create()` starts a root listener thread in this process and returns the id to share.
//! - `Bootstrap::connect(root, magic, rank, nranks, timeout)`; rank 0 of an `ip:port` job first calls
//!   `Root::listen(addr, magic, timeout)`. `Bootstrap::connect_to_address` and `connect_to_id` do both.
//! - `all_gather`, `barrier`, `send(peer, tag, bytes)`, `recv(peer, tag) -> bytes`.
//! - Failures: `failure() -> Option<PeerFailure>` (the first: a peer declared dead, how and when, or a
//!   local abort), `on_failure(hook)` (called once with it, on a library thread), `abort()` (a local
//!   abort that tells the peers). After a failure every call above fails at once with its error.
//!
//! Where things are:
//! - `address.rs`: parsing root addresses; which local address a unique id's root uses.
//! - `unique_id.rs`: the 128-byte id.
//! - `root.rs`: the root thread that introduces the ranks to each other.
//! - `endpoint.rs`: a rank's `Bootstrap`: set-up, `send` and `recv`.
//! - `host_collectives.rs`: `all_gather` and `barrier` over the point-to-point messages (host memory; the
//!   GPU collectives are `collective/`).
//! - `receiver.rs`: the thread that accepts peers, reads their messages into the `mailbox.rs`, and watches
//!   over them (`health.rs`: heartbeats, timeouts, the first failure); `outbox.rs`: each connection's
//!   sending side, shared by the rank's threads and that thread.
//! - `handshake.rs`: accepted connections until their greeting is in (for the root and the receivers).
//! - `topology.rs`: who connects to whom at set-up and watches whom (each rank's neighbours, `± 2^k`), how
//!   notices spread, and the tree a shrink's id goes down: pure functions, the same on every rank.
//! - `sim.rs` (tests only): the same choices on a simulated network, for sizes no test machine runs.
//! - `wire.rs`: the bytes on the wire; `sys.rs`: the system calls std lacks (all the unsafe code).

mod address;
mod endpoint;
mod handshake;
mod health;
mod host_collectives;
mod mailbox;
mod outbox;
mod receiver;
mod root;
#[cfg(test)]
mod sim;
mod sys;
mod topology;
mod unique_id;
mod wire;

// Its helpers that start in-process ranks serve other modules' tests too.
#[cfg(test)]
pub(crate) mod tests;

pub use address::RootAddress;
pub use endpoint::Bootstrap;
pub use health::{AbortHandle, Cause, Liveness, PeerFailure};
pub use root::Root;
pub use topology::{are_neighbours, survivor_tree, tree_children, tree_parent};
pub use unique_id::UniqueId;
pub use wire::MAX_RANKS;

use std::time::Duration;

/// Default for `mscclppSetBootstrapConnTimeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The magic of `ip:port` jobs (unique-id jobs use the id's random magic).
pub const PROTOCOL_MAGIC: u64 = 0x4d53_4343_4c50_5030;

/// How long a new connection may take to send its greeting: real ranks send it at once, so this only
/// limits how long a silent stranger holds a slot.
fn handshake_timeout(timeout: Duration) -> Duration {
    timeout.min(Duration::from_secs(10))
}

/// "rank 2", "ranks 1, 2, 5", or the first few and a count for a long list.
pub(crate) fn list_ranks(ranks: &[usize]) -> String {
    const SHOWN: usize = 16;
    let mut s: Vec<String> = ranks.iter().take(SHOWN).map(|r| r.to_string()).collect();
    if ranks.len() > SHOWN {
        s.push(format!("and {} more", ranks.len() - SHOWN));
    }
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{noun} {}", s.join(", "))
}

#[cfg(test)]
mod list_tests {
    use super::list_ranks;

    #[test]
    fn rank_lists_stay_short() {
        assert_eq!(list_ranks(&[2]), "rank 2");
        assert_eq!(list_ranks(&[1, 2, 5]), "ranks 1, 2, 5");
        let many: Vec<usize> = (0..40).collect();
        assert!(list_ranks(&many).ends_with("15, and 24 more"));
    }
}
