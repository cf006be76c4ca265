//! The abort word of a communicator's collectives: host memory its kernels poll while they wait, raised
//! when the communicator is aborted (and, for every communicator still alive, when the process exits:
//! `process_exit.rs`), so that a kernel waiting for a peer ends instead of spinning.

use crate::error::Result;
use crate::gpu::{DevicePtr, GpuContext, PinnedHostBuffer};
use std::sync::Arc;

/// Host memory the kernels read to learn that the communicator was aborted.
pub struct AbortWord(PinnedHostBuffer);

impl AbortWord {
    pub fn new(gpu: &GpuContext) -> Result<AbortWord> {
        Ok(AbortWord(PinnedHostBuffer::zeroed(gpu, 64)?))
    }
    /// From now on every collective kernel of the communicator stops waiting and ends.
    pub fn raise(&self) {
        if let Err(e) = self.0.store_u64(0, 1) {
            log::error!("the collectives' abort word: {e}");
        }
    }
    pub fn device_ptr(&self) -> DevicePtr {
        self.0.device_ptr()
    }
}

/// What the communicator keeps to abort its collectives without taking any lock.
pub type SharedAbortWord = Arc<AbortWord>;
