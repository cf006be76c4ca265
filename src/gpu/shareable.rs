//! Device memory shared between processes that stays valid for as long as any of them maps it: the driver's
//! virtual memory management (`cuMemCreate`), exported as a file descriptor.
//!
//! Why not CUDA IPC (`cuIpcGetMemHandle`, `ipc.rs`) for the library's own memory: an IPC mapping is only
//! valid while the exporter keeps its allocation. When a rank frees it (a suspend, a destroy) or dies (its
//! context goes with the process) while a peer's kernel still writes into it, the peer's kernel faults,
//! and under MPS one client's fault ends every client of the GPU. Memory made by `cuMemCreate` is counted:
//! each process that imported it holds a reference, so its pages stay until the last mapping is gone,
//! whoever goes first. A late write lands in memory nobody reads any more, never in a freed page.
//!
//! - `SharedAllocation`: this process's memory, mapped here, exportable as a descriptor (`export`);
//! - `SharedMapping`: a peer's, imported from the descriptor it passed (`fd_passing.rs` carries them).
//!
//! The descriptors are POSIX file descriptors, so only processes of one machine can share them; the
//! device must support both (`supported`), otherwise callers keep CUDA IPC.

use super::driver::{GpuContext, check};
use super::{DevicePtr, Stream};
use crate::error::Result;
use cudarc::driver::sys;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

/// The allocation properties of every shared allocation: pinned device memory of `device`, exportable as
/// a file descriptor.
fn properties(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is its documented default (no flags, no metadata).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop
}

fn device_attribute(device: sys::CUdevice, attribute: sys::CUdevice_attribute) -> i32 {
    let mut value = 0;
    // SAFETY: out-pointer to a local; an unknown attribute or device is an error code, read as 0.
    let rc = unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) };
    if rc == sys::CUresult::CUDA_SUCCESS { value } else { 0 }
}

/// Whether `gpu`'s device can make shared allocations (virtual memory management and POSIX descriptors).
pub fn supported(gpu: &GpuContext) -> bool {
    use sys::CUdevice_attribute::*;
    device_attribute(gpu.device, CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED) != 0
        && device_attribute(
            gpu.device,
            CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        ) != 0
}

/// `size` rounded up to the device's allocation granularity.
fn rounded(device: sys::CUdevice, size: usize) -> Result<usize> {
    let prop = properties(device);
    let mut granularity = 0usize;
    check(
        // SAFETY: out-pointer to a local; `prop` is a valid property block.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        || "cuMemGetAllocationGranularity".into(),
    )?;
    Ok(size.max(1).div_ceil(granularity.max(1)) * granularity.max(1))
}

/// A reserved address range with `handle`'s memory mapped into it, readable and writable from `device`
/// and every device that can reach it. Unmapped, its range freed and its reference released when dropped.
struct Mapped {
    ptr: DevicePtr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
    ctx: GpuContext,
}

impl Mapped {
    /// Maps `handle` (whose reference this takes over: released on failure too) of `size` bytes.
    fn map(ctx: &GpuContext, handle: sys::CUmemGenericAllocationHandle, size: usize) -> Result<Mapped> {
        let mut mapped = Mapped {
            ptr: 0,
            size,
            handle,
            ctx: *ctx,
        };
        check(
            // SAFETY: out-pointer to a field; no fixed address asked for.
            unsafe { sys::cuMemAddressReserve(&mut mapped.ptr, size, 0, 0, 0) },
            || format!("cuMemAddressReserve({size} bytes)"),
        )?;
        // SAFETY: the range was just reserved with this size; the handle is live.
        if let Err(e) = check(unsafe { sys::cuMemMap(mapped.ptr, size, 0, handle, 0) }, || {
            "cuMemMap".into()
        }) {
            // Not mapped: only the range and the handle to give back (`Drop` would unmap).
            // SAFETY: the range was reserved above with this size, and is freed once.
            unsafe { sys::cuMemAddressFree(mapped.ptr, size) };
            mapped.ptr = 0;
            return Err(e);
        }
        mapped.grant_access()?;
        Ok(mapped)
    }

    /// Read and write access for this context's device and every other device that can reach it as a peer
    /// (ranks of one process on several GPUs reach each other's memory at its own address).
    fn grant_access(&self) -> Result<()> {
        let mut count = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuDeviceGetCount(&mut count) }, || {
            "cuDeviceGetCount".into()
        })?;
        let access = |device: i32| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut descs = vec![access(self.ctx.device)];
        for device in (0..count).filter(|d| *d != self.ctx.device) {
            let mut can = 0;
            // SAFETY: out-pointer to a local; both ordinals are below the count.
            let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, self.ctx.device) };
            if rc == sys::CUresult::CUDA_SUCCESS && can != 0 {
                descs.push(access(device));
            }
        }
        check(
            // SAFETY: the range is mapped with this size; `descs` holds `descs.len()` descriptors.
            unsafe { sys::cuMemSetAccess(self.ptr, self.size, descs.as_ptr(), descs.len()) },
            || format!("cuMemSetAccess ({} devices)", descs.len()),
        )
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: the range was mapped by `map` with this size, and is unmapped once.
            self.ctx
                .free_in_drop("cuMemUnmap", || unsafe { sys::cuMemUnmap(self.ptr, self.size) });
            // SAFETY: as above: reserved by `map`, freed once.
            self.ctx.free_in_drop("cuMemAddressFree", || unsafe {
                sys::cuMemAddressFree(self.ptr, self.size)
            });
        }
        // SAFETY: the reference `map` took over, released once.
        self.ctx
            .free_in_drop("cuMemRelease", || unsafe { sys::cuMemRelease(self.handle) });
    }
}

/// This process's shared memory (see the module's doc).
pub struct SharedAllocation(Mapped);

impl SharedAllocation {
    /// At least `size` bytes on `ctx`'s device (the granularity rounds it up: `size()` says how much),
    /// zeroed on `stream` (the library's own, off the legacy default stream, as `DeviceAllocation::zeroed_on`);
    /// returns once they are zero.
    pub fn zeroed_on(ctx: &GpuContext, size: usize, stream: &Stream) -> Result<SharedAllocation> {
        let shared = SharedAllocation::new(ctx, size)?;
        check(
            // SAFETY: the range is mapped and writable from this device, and stays so until the stream is idle.
            unsafe { sys::cuMemsetD8Async(shared.ptr(), 0, shared.size(), stream.raw()) },
            || "cuMemsetD8Async (shared memory)".into(),
        )?;
        stream.spin_until_idle()?;
        Ok(shared)
    }

    fn new(ctx: &GpuContext, size: usize) -> Result<SharedAllocation> {
        ctx.make_current()?;
        let size = rounded(ctx.device, size)?;
        let prop = properties(ctx.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: out-pointer to a local; `prop` is a valid property block.
            unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) },
            || format!("cuMemCreate({size} bytes, exportable as a file descriptor)"),
        )?;
        Ok(SharedAllocation(Mapped::map(ctx, handle, size)?))
    }

    pub fn ptr(&self) -> DevicePtr {
        self.0.ptr
    }

    pub fn size(&self) -> usize {
        self.0.size
    }

    /// A new file descriptor naming this memory, for a peer process to import (`SharedMapping::import`).
    pub fn export(&self) -> Result<OwnedFd> {
        let mut fd: i32 = -1;
        check(
            // SAFETY: a POSIX descriptor export writes an int to the pointer; the handle is live.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut i32).cast(),
                    self.0.handle,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            || "cuMemExportToShareableHandle".into(),
        )?;
        // SAFETY: the driver returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// A peer process's shared memory mapped here; its pages stay valid while this mapping lives, whatever
/// the peer does.
pub struct SharedMapping(Mapped);

impl SharedMapping {
    /// Imports the memory `fd` names (a peer's `SharedAllocation::export`, `size` bytes) and maps it.
    pub fn import(ctx: &GpuContext, fd: OwnedFd, size: usize) -> Result<SharedMapping> {
        ctx.make_current()?;
        let raw = fd.into_raw_fd();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let rc = check(
            // SAFETY: for POSIX descriptors the driver takes the descriptor's value as the pointer argument.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    raw as isize as *mut std::ffi::c_void,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            || "cuMemImportFromShareableHandle".into(),
        );
        // The import holds its own reference; the descriptor is no longer needed.
        // SAFETY: `raw` came from an OwnedFd given to this function, closed once here.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        rc?;
        Ok(SharedMapping(Mapped::map(ctx, handle, size)?))
    }

    pub fn ptr(&self) -> DevicePtr {
        self.0.ptr
    }
}
