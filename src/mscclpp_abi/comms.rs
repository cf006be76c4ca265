//! The communicators of `mscclpp.h`: an `mscclppComm_t` is a token of one `Registry`
//! (`crate::abi::handles`), never a pointer we dereference.

use crate::abi::handles::Registry;
use crate::comm::Communicator;
use crate::connections::Connections;
use crate::error::{Error, ErrorKind, Result};
use crate::types::mscclppComm_t;
use std::sync::Arc;

/// What an `mscclppComm_t` names: the core's communicator, and the connections of `mscclppConnect`
/// beside it (the legacy machine, which only this face makes).
pub struct Comm {
    core: Arc<Communicator>,
    pub connections: Connections,
}

impl std::ops::Deref for Comm {
    type Target = Communicator;
    fn deref(&self) -> &Communicator {
        &self.core
    }
}

impl Comm {
    /// `mscclppCommDestroy`: the connections (their proxies stopped), then the core. Returns the first
    /// error of the proxies' stop, or else the first failure a proxy had.
    pub fn destroy(&self) -> Result<()> {
        let stop = self.connections.destroy(&self.core);
        self.core.destroy();
        stop
    }
}

static COMMS: Registry<Comm> = Registry::new();

/// Makes `comm` reachable through a new handle; from now on a failure the bootstrap detects aborts it.
pub fn register(comm: Communicator) -> mscclppComm_t {
    let core = Arc::new(comm);
    core.watch_failures();
    let connections = Connections::new(&core);
    COMMS.insert(Arc::new(Comm { core, connections })) as mscclppComm_t
}

pub fn lookup(handle: mscclppComm_t) -> Result<Arc<Comm>> {
    COMMS.lookup_comm(handle, ErrorKind::InvalidUsage)
}

/// Removes the handle; the communicator is released when the last call using it returns.
pub fn unregister(handle: mscclppComm_t) -> Result<Arc<Comm>> {
    lookup(handle)?;
    COMMS
        .remove(handle as u64)
        .ok_or_else(|| Error::invalid_usage("comm was destroyed concurrently"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_made_up_handles_are_rejected() {
        let e = lookup(std::ptr::null_mut()).err().unwrap();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
        assert!(e.message.contains("comm is NULL"));
        let e = lookup(0x1234 as mscclppComm_t).err().unwrap();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
        assert!(unregister(0x1234 as mscclppComm_t).is_err());
    }
}
