//! The CUDA driver, loaded at run time through cudarc, so that the library loads, and its host-only
//! parts work, on machines without a GPU or a driver.
//!
//! Everything the library does on a GPU goes through the types here; no other module calls the driver:
//! a `GpuContext` that the application's thread had current when it made the communicator (with peer
//! access and the device's PCI bus id), device and pinned host buffers, the library's own kernels (modules loaded from embedded fatbins), our streams and the
//! application's (`AppStream`), CUDA IPC handles, device memory shared by file descriptor (`shareable.rs`, the
//! descriptors carried by `descriptor_passing.rs`), and host memory shared between processes. A function
//! whose safety rests on a range it cannot check (a peer's mapped memory) is an `unsafe fn` that says so.

mod descriptor_passing;
mod driver;
mod ipc;
mod memory;
mod module;
mod shareable;
mod shared_host;
mod stream;

pub use descriptor_passing::{DescriptorInbox, send as send_descriptor};
pub use driver::{GpuContext, RestoreContext, check, ensure_driver, lazy_loading};
pub use ipc::{IpcExport, IpcMapping, ProcessId};
pub use memory::{DeviceAllocation, PinnedHostBuffer, PointerInfo, pointer_info};
pub use module::{Kernel, Module, RelaxedCapture};
pub use shareable::{SharedAllocation, SharedMapping, supported as shareable_supported};
pub use shared_host::SharedHostMemory;
pub use stream::{AppStream, Event, Stream};

/// A device address (`CUdeviceptr`). Plain data, so it can cross threads; what it points to is owned
/// elsewhere.
pub type DevicePtr = u64;
