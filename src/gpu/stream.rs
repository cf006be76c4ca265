//! CUDA streams owned by the library (the proxy's copy streams).

use super::{DevicePtr, GpuContext, check};
use crate::error::Result;
use cudarc::driver::sys::{self, CUresult, CUstream};

pub struct Stream {
    raw: usize,
    ctx: GpuContext,
}

impl Stream {
    /// A non-blocking stream: it never waits on the application's legacy default stream.
    pub fn new(ctx: &GpuContext) -> Result<Stream> {
        ctx.make_current()?;
        let mut raw: CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: out-pointer to a local; a context is current.
        check(unsafe { sys::cuStreamCreate(&mut raw, flags) }, || {
            "cuStreamCreate".into()
        })?;
        Ok(Stream {
            raw: raw as usize,
            ctx: *ctx,
        })
    }

    pub fn raw(&self) -> CUstream {
        self.raw as CUstream
    }

    /// Queues a copy between two device addresses (peer memory included). Device-to-device, so the
    /// driver need not look up what kind of memory each address is.
    pub fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller checked both ranges against the buffers they belong to.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw()) },
            || format!("copy of {bytes} bytes {src:#x} -> {dst:#x}"),
        )
    }

    /// Queues a 64-bit write of `value` to `dst` (a stream memory operation: no copy engine).
    pub fn write_u64(&self, dst: DevicePtr, value: u64) -> Result<()> {
        // SAFETY: `dst` is an 8-byte aligned device word the library owns.
        check(
            unsafe { sys::cuStreamWriteValue64_v2(self.raw(), dst, value, 0) },
            || format!("stream write to {dst:#x}"),
        )
    }

    /// Queues a store of `value` into the byte at `dst`, `dst + pitch`, ... (`rows` of them).
    pub fn fill_u8_strided(&self, dst: DevicePtr, pitch: usize, value: u8, rows: usize) -> Result<()> {
        // SAFETY: the caller owns the `rows` bytes at `dst + k * pitch`.
        check(
            unsafe { sys::cuMemsetD2D8Async(dst, pitch, value, 1, rows, self.raw()) },
            || format!("strided memset of {rows} bytes at {dst:#x}"),
        )
    }

    /// True once all queued work is done; an error if it failed.
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: valid stream.
        match unsafe { sys::cuStreamQuery(self.raw()) } {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            rc => check(rc, || "cuStreamQuery".into()).map(|_| false),
        }
    }

    /// Spins until the queued work is done (lower latency than a blocking synchronize).
    pub fn spin_until_idle(&self) -> Result<()> {
        while !self.is_idle()? {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: valid stream, destroyed once; pending work completes first per CUDA semantics.
        unsafe { sys::cuStreamDestroy_v2(self.raw()) };
    }
}
