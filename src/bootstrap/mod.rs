//! The TCP bootstrap: how ranks find each other and exchange set-up data before any GPU work.
//!
//! CONTRACT (used by `comm.rs`, `connection` set-up and the FFI layer; keep these signatures):
//!
//! - `RootAddress::parse("ip:port" | "ifname:ip:port" | "[v6addr]:port" | "ifname:[v6addr]:port")`
//! - `UniqueId::create()` starts a root listener thread in this process and returns the id to share.
//! - `Bootstrap::connect(root, magic, rank, nranks, timeout)`; rank 0 of an `ip:port` job first calls
//!   `Root::listen(addr, magic, timeout)`. `Bootstrap::connect_to_address` and `connect_to_id` do both.
//! - `all_gather`, `barrier`, `send(peer, tag, bytes)`, `recv(peer, tag) -> bytes`.
//!
//! Where things are:
//! - `address.rs`: parsing root addresses; which local address a unique id's root uses.
//! - `unique_id.rs`: the 128-byte id.
//! - `root.rs`: the root thread that introduces the ranks to each other.
//! - `endpoint.rs`: a rank's `Bootstrap`: set-up, `send` and `recv`.
//! - `collectives.rs`: `all_gather` and `barrier`.
//! - `receiver.rs`: the thread that accepts peers and reads their messages into the `mailbox.rs`.
//! - `handshake.rs`: accepted connections until their greeting is in (for the root and the receivers).
//! - `wire.rs`: the bytes on the wire; `sys.rs`: the system calls std lacks (all the unsafe code).

mod address;
mod collectives;
mod endpoint;
mod handshake;
mod mailbox;
mod receiver;
mod root;
mod sys;
mod unique_id;
mod wire;

#[cfg(test)]
mod tests;

pub use address::RootAddress;
pub use endpoint::Bootstrap;
pub use root::Root;
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
