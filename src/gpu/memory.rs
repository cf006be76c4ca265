//! Device allocations and pinned host memory, freed when dropped.

use super::{DevicePtr, GpuContext, check};
use crate::error::{Error, Result};
use cudarc::driver::sys;

/// A `cuMemAlloc` allocation, zeroed at creation.
pub struct DeviceAllocation {
    ptr: DevicePtr,
    size: usize,
    ctx: GpuContext,
}

impl DeviceAllocation {
    /// Allocates `size` bytes in `ctx`, not yet initialized (freed when dropped, as every allocation).
    fn allocate(ctx: &GpuContext, size: usize) -> Result<DeviceAllocation> {
        ctx.make_current()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: out-pointer to a local; a context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, size) }, || {
            format!("cuMemAlloc({size} bytes)")
        })?;
        Ok(DeviceAllocation { ptr, size, ctx: *ctx })
    }
    /// Allocates `size` bytes and returns once they are zero. A memset of device memory returns before it
    /// is done, on the legacy default stream, which work on non-blocking streams (the caller's, the
    /// kernels waiting on a flag here) does not wait for: the legacy stream is synchronized here.
    pub fn zeroed(ctx: &GpuContext, size: usize) -> Result<DeviceAllocation> {
        let alloc = Self::allocate(ctx, size)?;
        // SAFETY: the range was just allocated in the current context.
        check(unsafe { sys::cuMemsetD8_v2(alloc.ptr, 0, size) }, || {
            "cuMemsetD8".into()
        })?;
        // SAFETY: the null stream handle names the current context's legacy default stream.
        check(unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) }, || {
            "cuStreamSynchronize (the legacy default stream, after zeroing)".into()
        })?;
        Ok(alloc)
    }
    /// As `zeroed`, but zeroed on `stream` (the library's own, non-blocking), so that it never touches the
    /// legacy default stream, which a CUDA graph capture on a blocking stream forbids. Returns once the
    /// memory is zero.
    pub fn zeroed_on(ctx: &GpuContext, size: usize, stream: &super::Stream) -> Result<DeviceAllocation> {
        let alloc = Self::allocate(ctx, size)?;
        check(
            // SAFETY: the range was just allocated in this context, and stays so until the stream is idle.
            unsafe { sys::cuMemsetD8Async(alloc.ptr, 0, size, stream.raw()) },
            || "cuMemsetD8Async".into(),
        )?;
        stream.spin_until_idle()?;
        Ok(alloc)
    }
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    pub fn size(&self) -> usize {
        self.size
    }
    /// Writes one 64-bit word at byte `offset` (synchronously: set-up only).
    pub fn write_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.write_words(offset, &[value])
    }
    /// Reads the 64-bit word at byte `offset` (synchronously, against work that may still write it: for
    /// counters read at the end).
    pub fn read_u64(&self, offset: u64) -> Result<u64> {
        if offset.checked_add(8).is_none_or(|end| end > self.size as u64) {
            return Err(Error::internal(format!(
                "a word at +{offset} runs past the end of an allocation of {} bytes",
                self.size
            )));
        }
        self.ctx.make_current()?;
        let mut value = 0u64;
        check(
            // SAFETY: the word lies inside our allocation (checked above); the destination is a local.
            unsafe { sys::cuMemcpyDtoH_v2((&mut value as *mut u64).cast(), self.ptr + offset, 8) },
            || "cuMemcpyDtoH".into(),
        )?;
        Ok(value)
    }
    /// Writes 64-bit words from byte `offset` on (synchronously: set-up only).
    pub fn write_words(&self, offset: u64, words: &[u64]) -> Result<()> {
        let bytes = std::mem::size_of_val(words);
        if offset + bytes as u64 > self.size as u64 {
            return Err(Error::internal(format!(
                "{bytes} bytes at +{offset} run past the end of an allocation of {} bytes",
                self.size
            )));
        }
        self.ctx.make_current()?;
        // SAFETY: the bytes lie inside our allocation (checked above); the source is the caller's slice.
        check(
            unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset, words.as_ptr().cast(), bytes) },
            || "cuMemcpyHtoD".into(),
        )
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in this context and freed once.
        self.ctx
            .free_in_drop("cuMemFree", || unsafe { sys::cuMemFree_v2(self.ptr) });
    }
}

/// Page-locked host memory mapped into the device's address space (the FIFO lives here).
pub struct PinnedHostBuffer {
    host: *mut u8,
    device: DevicePtr,
    size: usize,
    ctx: GpuContext,
}

// SAFETY: the buffer is plain memory shared with the device; access is coordinated by the FIFO
// protocol (the device writes slots, the proxy reads and clears them).
unsafe impl Send for PinnedHostBuffer {}
// SAFETY: as above; `&self` methods only hand out raw pointers.
unsafe impl Sync for PinnedHostBuffer {}

impl PinnedHostBuffer {
    pub fn zeroed(ctx: &GpuContext, size: usize) -> Result<PinnedHostBuffer> {
        ctx.make_current()?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: out-pointer to a local; a context is current.
        check(unsafe { sys::cuMemHostAlloc(&mut host, size, flags) }, || {
            format!("cuMemHostAlloc({size} bytes)")
        })?;
        let mut buf = PinnedHostBuffer {
            host: host.cast(),
            device: 0,
            size,
            ctx: *ctx,
        };
        // SAFETY: `host` points at `size` writable bytes we own.
        unsafe { std::ptr::write_bytes(buf.host, 0, size) };
        buf.device = mapped_device_pointer(buf.host)?;
        Ok(buf)
    }
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }
    pub fn device_ptr(&self) -> DevicePtr {
        self.device
    }
    pub fn size(&self) -> usize {
        self.size
    }

    /// Stores `value` into the 8-byte aligned word at byte `offset`, as one volatile store the device sees
    /// (the device reads the word over the bus).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|end| end > self.size) {
            return Err(Error::internal(format!(
                "word +{offset} is not an aligned word of a pinned buffer of {} bytes",
                self.size
            )));
        }
        // SAFETY: the word lies inside our allocation and is aligned (checked above); the buffer is page
        // aligned.
        unsafe { std::ptr::write_volatile(self.host.add(offset).cast::<u64>(), value) };
        Ok(())
    }
}

/// The device address of page-locked host memory that was allocated or registered with DEVICEMAP.
pub(super) fn mapped_device_pointer(host: *mut u8) -> Result<DevicePtr> {
    let mut device: DevicePtr = 0;
    check(
        // SAFETY: out-pointer to a local; the caller passes memory mapped for the current context's device.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) },
        || "cuMemHostGetDevicePointer".into(),
    )?;
    Ok(device)
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc and freed once.
        self.ctx
            .free_in_drop("cuMemFreeHost", || unsafe { sys::cuMemFreeHost(self.host.cast()) });
    }
}

/// What the driver knows of a pointer the application handed us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    /// Start of the allocation that holds the pointer.
    pub base: DevicePtr,
    /// Size of that allocation.
    pub alloc_size: usize,
    /// The device ordinal the memory lives on.
    pub device: i32,
    /// The driver's id of the allocation (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): unique in the process for its
    /// lifetime, so that memory freed and allocated again at the same address has another.
    pub buffer_id: u64,
}

/// Checks that `[ptr, ptr+size)` is device memory inside one allocation and says where that starts. One
/// driver call (collectives check their buffers at every call).
pub fn pointer_info(ptr: DevicePtr, size: u64, what: &str) -> Result<PointerInfo> {
    use sys::CUpointer_attribute as A;
    // The driver is loaded at run time: without one this is an error, not a call into nothing.
    super::ensure_driver()?;
    let mut mem_type: u32 = 0;
    let mut device: i32 = -1;
    let mut base: DevicePtr = 0;
    let mut alloc_size: usize = 0;
    let mut buffer_id: u64 = 0;
    let mut attributes = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        A::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    ];
    let mut data: [*mut std::ffi::c_void; 5] = [
        (&mut mem_type as *mut u32).cast(),
        (&mut device as *mut i32).cast(),
        (&mut base as *mut DevicePtr).cast(),
        (&mut alloc_size as *mut usize).cast(),
        (&mut buffer_id as *mut u64).cast(),
    ];
    // SAFETY: each data pointer is a local of the attribute's type (32-bit type and ordinal, a device
    // pointer, a size, a 64-bit id); for an address CUDA does not know the driver writes defaults and
    // succeeds.
    let rc = unsafe {
        sys::cuPointerGetAttributes(attributes.len() as u32, attributes.as_mut_ptr(), data.as_mut_ptr(), ptr)
    };
    check(rc, || format!("querying {what} {ptr:#x}"))?;
    if mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 || alloc_size == 0 {
        return Err(Error::invalid_argument(format!(
            "{what} {ptr:#x} is not device memory allocated with cudaMalloc"
        )));
    }
    let end = ptr
        .checked_add(size)
        .ok_or_else(|| Error::invalid_argument(format!("{what}: size {size} overflows")))?;
    if end > base + alloc_size as u64 {
        return Err(Error::invalid_argument(format!(
            "{what} {ptr:#x} + size {size} runs past the end of its allocation ({} bytes left in it)",
            base + alloc_size as u64 - ptr
        )));
    }
    Ok(PointerInfo {
        base,
        alloc_size,
        device,
        buffer_id,
    })
}
