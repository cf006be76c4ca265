//! The proxy of one FIFO across launches, as a transport holds it.

use super::fifo::{DeviceFifo, DeviceTailPublisher};
use super::{AbortHook, ProxyShared, ProxyThread, TriggerHandler, affinity};
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use std::sync::Arc;

/// The proxy of one FIFO across launches: the running thread, where the last one stopped (the next
/// resumes there, since the device head lives on), and the last one's shared state (kept after it stops,
/// so that its failure is still reported).
#[derive(Default)]
pub struct ProxySlot {
    thread: Option<ProxyThread>,
    tail: u64,
    shared: Option<Arc<ProxyShared>>,
    aborted: bool,
}

impl ProxySlot {
    pub fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// The failure of the running or last proxy, if it had one.
    pub fn failure(&self) -> Option<Error> {
        self.shared.as_ref().and_then(|s| s.failure())
    }

    /// Starts a thread named `name` serving `fifo` with `handler`, on `gpu`'s context and near it; it calls
    /// `on_abort` when it wants the communicator aborted (a stuck wait, its own failure, set-up included).
    ///
    /// # Safety
    /// `fifo` must outlive the thread: keep it until `stop` has returned (or this slot is dropped).
    pub unsafe fn launch(
        &mut self,
        name: String,
        rank: usize,
        gpu: GpuContext,
        fifo: &DeviceFifo,
        handler: Box<dyn TriggerHandler>,
        on_abort: &AbortHook,
    ) -> Result<()> {
        let publisher = DeviceTailPublisher::new(&gpu, fifo.device_tail())?;
        // SAFETY: the caller keeps `fifo` until the thread is stopped (this function's contract).
        let ring = unsafe { fifo.ring() };
        let thread = ProxyThread::spawn(
            name,
            rank,
            ring,
            self.tail,
            handler,
            Box::new(publisher),
            Box::new(move || {
                gpu.make_current()?;
                affinity::bind_proxy_thread(&gpu);
                Ok(())
            }),
            on_abort.clone(),
        )?;
        if self.aborted {
            thread.shared().abort();
        }
        self.shared = Some(thread.shared().clone());
        self.thread = Some(thread);
        Ok(())
    }

    /// Aborts the running proxy (it stops moving data, releases the kernels' waits and drains the FIFO)
    /// and any launched later.
    pub fn abort(&mut self) {
        self.aborted = true;
        if let Some(s) = &self.shared {
            s.abort();
        }
    }

    /// Stops the thread, if it runs, and warns if `what` (the proxy, for the log) dropped triggers.
    pub fn stop(&mut self, what: &str) -> Result<()> {
        if let Some(thread) = self.thread.take() {
            self.tail = thread.stop()?;
            if let Some(s) = &self.shared
                && s.dropped() > 0
            {
                log::warn!(
                    "{what} dropped {} malformed trigger(s); see the errors logged",
                    s.dropped()
                );
            }
        }
        Ok(())
    }
}
