//! The proxy: a host thread that serves one FIFO of triggers pushed by kernels, whatever the transport.
//!
//! - `fifo`: the FIFO's memory (slots, tails, control words) and the proxy's view of it (`TriggerRing`).
//! - `trigger`: the 16-byte trigger, bit for bit as legacy kernels write it.
//! - `serve`: one step of the serving loop (`serve_one`) and when the device's tail is refreshed.
//! - `drain`: what an aborted proxy does instead: release the kernels' waits and drain the FIFO.
//! - `serve_times`: how long serving each kind of trigger took, reported when the proxy stops.
//! - `thread`: the proxy thread (its loop) and the state it shares with the communicator.
//! - `slot`: the proxy of one FIFO across launches, as a transport holds it.
//! - `affinity`: where the proxy thread runs.
//!
//! Transports plug in through `TriggerHandler`; the device copy of the tail through `TailPublisher`.

pub mod affinity;
pub mod drain;
pub mod fifo;
pub mod serve;
pub mod serve_times;
pub mod slot;
#[cfg(test)]
mod test_util;
pub mod thread;
pub mod trigger;

use crate::error::{Error, Result};
use std::sync::Arc;

pub use serve::{TailPolicy, serve_one};
pub use serve_times::ServeTimes;
pub use slot::ProxySlot;
pub use thread::{ProxyShared, ProxyThread};
pub use trigger::Trigger;

/// What a transport does with triggers.
pub trait TriggerHandler: Send {
    /// Issues the Data and Flag parts of a trigger. An `Err` drops the trigger (after logging).
    fn handle(&mut self, trigger: &Trigger) -> Result<()>;
    /// Completes everything issued so far.
    fn sync(&mut self) -> Result<()>;
    /// The communicator is aborted: stop moving data, and release the kernels waiting on this proxy's
    /// connections by raising the epochs they wait on past anything they can expect (legacy device code
    /// knows no other way out of `wait()`). Called on the proxy thread when it aborts, and again every
    /// `RELEASE_AGAIN` while it drains: a peer's proxy that has not yet learned of the abort may still copy
    /// a flag over a released epoch.
    fn abort(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Why a proxy asks its communicator to abort.
#[derive(Clone, Debug)]
pub enum AbortCause {
    /// A kernel's wait spun past `MSCCLPP_WAIT_TIMEOUT` and reported itself.
    StuckWait(fifo::StuckWait),
    /// The proxy's machinery failed (a CUDA or verbs error): its data can no longer be trusted.
    Failure(Error),
}

/// What the communicator does when one of its proxies asks it to abort (called on the proxy thread).
pub type AbortHook = Arc<dyn Fn(AbortCause) + Send + Sync>;

/// Writes the proxy's tail where the device reads it.
pub trait TailPublisher: Send {
    fn publish(&mut self, tail: u64) -> Result<()>;
}
