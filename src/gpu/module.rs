//! Kernels of the library's own: a fatbin loaded into a context (`Module`), its kernels (`Kernel`), and
//! their launch on the application's stream.

use super::{AppStream, GpuContext, check};
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUfunction, CUmodule};
use std::ffi::CString;

/// A module loaded into a context from a fatbin image; unloaded when dropped.
pub struct Module {
    raw: usize,
    ctx: GpuContext,
}

// SAFETY: a module handle may be used from any thread that makes its context current.
unsafe impl Send for Module {}
// SAFETY: as above; the driver's module calls are thread-safe.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `image` (a fatbin, as nvcc writes it) into `ctx`.
    pub fn load(ctx: &GpuContext, image: &[u8], what: &str) -> Result<Module> {
        // The driver reads the image through its header's 8-byte fields: give it an aligned copy.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `aligned` has at least `image.len()` bytes; the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), image.len()) };
        ctx.make_current()?;
        let mut raw: CUmodule = std::ptr::null_mut();
        check(
            // SAFETY: out-pointer to a local; the image is a complete fatbin that lives through the call.
            unsafe { sys::cuModuleLoadData(&mut raw, aligned.as_ptr().cast()) },
            || format!("loading the {what} kernels (cuModuleLoadData)"),
        )?;
        Ok(Module {
            raw: raw as usize,
            ctx: *ctx,
        })
    }

    /// The kernel named `name` (an `extern "C"` entry point).
    /// Loads every kernel of the module now, where the driver would load each at its first use
    /// (`CUDA_MODULE_LOADING=LAZY`, the default): a load waits for the GPU, and a kernel of a peer that
    /// shares this GPU (under MPS) may be spinning on it, waiting for this rank's launch. Gives the number
    /// of kernels.
    pub fn load_every_kernel(&self) -> Result<usize> {
        self.ctx.make_current()?;
        let mut count: std::ffi::c_uint = 0;
        check(
            // SAFETY: out-pointer to a local; the module is loaded.
            unsafe { sys::cuModuleGetFunctionCount(&mut count, self.raw as CUmodule) },
            || "cuModuleGetFunctionCount".into(),
        )?;
        let mut functions: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
        check(
            // SAFETY: `functions` has room for `count` handles; the module is loaded.
            unsafe { sys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, self.raw as CUmodule) },
            || "cuModuleEnumerateFunctions".into(),
        )?;
        for f in &functions {
            // SAFETY: a function handle of this loaded module; loading one that is loaded does nothing.
            check(unsafe { sys::cuFuncLoad(*f) }, || "cuFuncLoad".into())?;
        }
        Ok(functions.len())
    }

    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let c_name = CString::new(name).map_err(|_| Error::internal(format!("kernel name {name:?} has a NUL")))?;
        let mut raw: CUfunction = std::ptr::null_mut();
        self.ctx.make_current()?;
        check(
            // SAFETY: out-pointer to a local; the module is loaded; the name is NUL-terminated.
            unsafe { sys::cuModuleGetFunction(&mut raw, self.raw as CUmodule, c_name.as_ptr()) },
            || format!("finding kernel {name}"),
        )?;
        Ok(Kernel { raw: raw as usize })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by cuModuleLoadData in this context and unloaded once.
        self.ctx.free_in_drop("cuModuleUnload", || unsafe {
            sys::cuModuleUnload(self.raw as CUmodule)
        });
    }
}

/// A kernel of a loaded module: valid while its `Module` lives (the owner keeps both together).
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    raw: usize,
}

impl Kernel {
    /// How many blocks of `threads` threads one multiprocessor can hold at once (registers, threads and
    /// shared memory permitting): the driver's occupancy calculator, for the current context's device.
    pub fn blocks_per_multiprocessor(&self, threads: u32) -> Result<u32> {
        let mut blocks: std::ffi::c_int = 0;
        check(
            // SAFETY: out-pointer to a local; the function handle comes from a loaded module (`Module::kernel`).
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut blocks,
                    self.raw as CUfunction,
                    threads as std::ffi::c_int,
                    0,
                )
            },
            || format!("cuOccupancyMaxActiveBlocksPerMultiprocessor({threads} threads)"),
        )?;
        Ok(blocks.max(0) as u32)
    }

    /// Queues the kernel on `stream` with `grid` blocks of `threads` threads and one argument, `args`, a
    /// plain struct passed by value.
    ///
    /// # Safety
    /// The kernel's one parameter has `A`'s layout, and every address inside `args` is memory the kernel
    /// may use as it does, alive until the kernel has run; the kernel's module is still loaded; `stream`
    /// belongs to the current context.
    pub unsafe fn launch<A: Copy>(&self, grid: u32, threads: u32, stream: AppStream, args: &A) -> Result<()> {
        let mut params = [(args as *const A).cast_mut().cast::<std::ffi::c_void>()];
        // SAFETY: the caller's contract; the driver copies the argument before returning.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.raw as CUfunction,
                    grid,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    stream.raw(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            || format!("launching a kernel of {grid} x {threads} threads"),
        )
    }
}

/// While alive, the calling thread may make calls that a CUDA graph capture in global mode forbids
/// (allocations, synchronous copies, module loads): the thread's capture mode is relaxed, and restored
/// when this is dropped. Set-up that a first collective does inside a capture runs under it.
pub struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    pub fn enter() -> Result<RelaxedCapture> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: in-out pointer to a local.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, || {
            "cuThreadExchangeStreamCaptureMode".into()
        })?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // SAFETY: in-out pointer to a field; restores the mode `enter` replaced.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut self.previous) };
    }
}
