//! CUDA streams: those the library owns (the proxies' copy streams), and the application's, which
//! `mscclppRegisteredBufferWrite` is given.

use super::{DeviceAllocation, DevicePtr, GpuContext, check};
use crate::error::{Error, Result};
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
    ///
    /// # Safety
    /// `[src, +bytes)` and `[dst, +bytes)` are device memory (or mapped memory) that this context
    /// reaches and that stays allocated until the stream has run the copy; nothing else writes
    /// `[dst, +bytes)` meanwhile unless the protocol allows it (a peer's epoch word, written only by us).
    pub unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw()) },
            || format!("copy of {bytes} bytes {src:#x} -> {dst:#x}"),
        )
    }

    /// Queues a 64-bit write of `value` to `dst` (a stream memory operation: no copy engine).
    ///
    /// # Safety
    /// `dst` is an 8-byte aligned word of device memory this context reaches, allocated until the
    /// stream has run the write.
    pub unsafe fn write_u64(&self, dst: DevicePtr, value: u64) -> Result<()> {
        // SAFETY: the caller's contract.
        check(
            unsafe { sys::cuStreamWriteValue64_v2(self.raw(), dst, value, 0) },
            || format!("stream write to {dst:#x}"),
        )
    }

    /// Queues a store of `value` into the bytes at `offset`, `offset + pitch`, ... (`rows` of them) of
    /// `alloc`. Fails, queuing nothing, unless all of them lie inside the allocation.
    pub fn fill_u8_strided(
        &self,
        alloc: &DeviceAllocation,
        offset: u64,
        pitch: usize,
        value: u8,
        rows: usize,
    ) -> Result<()> {
        if !strided_bytes_fit(alloc.size() as u64, offset, pitch as u64, rows as u64) {
            return Err(Error::internal(format!(
                "a strided memset of {rows} bytes {pitch} apart from +{offset} runs past an allocation of {} \
                 bytes",
                alloc.size()
            )));
        }
        let dst = alloc.ptr() + offset;
        // SAFETY: every byte written lies inside `alloc` (checked above), which this context allocated;
        // the allocation is freed with cuMemFree, which waits for work on it to complete.
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

/// A CUDA event without timing, which joins streams: work queued on one after `Stream::record`
/// waits, where another queued `wait` for it, until the work before the record is done.
pub struct Event {
    raw: usize,
    ctx: GpuContext,
}

impl Event {
    pub fn new(ctx: &GpuContext) -> Result<Event> {
        ctx.make_current()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: out-pointer to a local; a context is current.
        check(unsafe { sys::cuEventCreate(&mut raw, flags) }, || {
            "cuEventCreate".into()
        })?;
        Ok(Event {
            raw: raw as usize,
            ctx: *ctx,
        })
    }

    fn raw(&self) -> sys::CUevent {
        self.raw as sys::CUevent
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: a valid event, destroyed once; CUDA lets work that waits on it complete first.
        unsafe { sys::cuEventDestroy_v2(self.raw()) };
    }
}

/// Records `event` on `stream` (both of the current context).
fn record_on(stream: CUstream, event: &Event) -> Result<()> {
    // SAFETY: the event is alive (borrowed); the stream is the caller's, alive while it is used.
    check(unsafe { sys::cuEventRecord(event.raw(), stream) }, || {
        "cuEventRecord".into()
    })
}

/// Makes the work queued on `stream` from now on wait for `event`'s last record.
fn wait_on(stream: CUstream, event: &Event) -> Result<()> {
    // SAFETY: as `record_on`.
    check(unsafe { sys::cuStreamWaitEvent(stream, event.raw(), 0) }, || {
        "cuStreamWaitEvent".into()
    })
}

impl Stream {
    pub fn record(&self, event: &Event) -> Result<()> {
        record_on(self.raw(), event)
    }

    pub fn wait(&self, event: &Event) -> Result<()> {
        wait_on(self.raw(), event)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.make_current();
        // SAFETY: valid stream, destroyed once; pending work completes first per CUDA semantics.
        unsafe { sys::cuStreamDestroy_v2(self.raw()) };
    }
}

/// Whether `rows` bytes at `offset`, `offset + pitch`, ... lie inside `size` bytes (no overflow).
fn strided_bytes_fit(size: u64, offset: u64, pitch: u64, rows: u64) -> bool {
    let Some(last_row) = rows.checked_sub(1) else {
        return true;
    };
    last_row
        .checked_mul(pitch)
        .and_then(|r| r.checked_add(offset))
        .is_some_and(|last| last < size)
}

/// A stream of the application (a `cudaStream_t` passed to `mscclppRegisteredBufferWrite`; 0 is the
/// legacy default stream): borrowed, never destroyed by us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppStream(usize);

impl AppStream {
    /// # Safety
    /// `handle` is 0 or a stream of the context current when the stream is used, alive while this value
    /// is used (the header's contract for the stream arguments of its functions).
    pub unsafe fn from_raw(handle: u64) -> AppStream {
        AppStream(handle as usize)
    }

    pub(super) fn raw(&self) -> CUstream {
        self.0 as CUstream
    }

    /// Fails unless the stream belongs to `gpu`'s context (the legacy and per-thread default streams,
    /// 0 and 2, belong to every context).
    pub fn check_context(&self, gpu: &GpuContext) -> Result<()> {
        if self.0 == 0 || self.0 == 1 || self.0 == 2 {
            return Ok(());
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the stream is `from_raw`'s contract.
        check(unsafe { sys::cuStreamGetCtx(self.raw(), &mut ctx) }, || {
            "stream: cuStreamGetCtx".into()
        })?;
        if !gpu.is(ctx) {
            return Err(Error::invalid_argument(
                "stream belongs to another GPU's context than the communicator's",
            ));
        }
        Ok(())
    }

    /// Whether work queued on the stream is being captured into a CUDA graph.
    pub fn is_capturing(&self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-pointer to a local; the stream is `from_raw`'s contract.
        check(unsafe { sys::cuStreamIsCapturing(self.raw(), &mut status) }, || {
            "asking whether the application's stream is being captured".into()
        })?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Queues a zeroing of `[dst, +bytes)` after the work already queued on the stream.
    ///
    /// # Safety
    /// The range is device memory this context reaches, allocated until the stream has run the write.
    pub unsafe fn zero(&self, dst: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the range is the caller's contract; the stream is `from_raw`'s.
        check(unsafe { sys::cuMemsetD8Async(dst, 0, bytes, self.raw()) }, || {
            format!("zeroing {bytes} bytes at {dst:#x} on the application's stream")
        })
    }

    pub fn record(&self, event: &Event) -> Result<()> {
        record_on(self.raw(), event)
    }

    pub fn wait(&self, event: &Event) -> Result<()> {
        wait_on(self.raw(), event)
    }

    /// Records the application's event (a `cudaEvent_t`, e.g. `ncclCollConfig_t`'s
    /// `launchCompletionEvent`) on the stream, after the work queued so far.
    ///
    /// # Safety
    /// `event` is a live event of the stream's context (the application's contract).
    pub unsafe fn record_app_event(&self, event: u64) -> Result<()> {
        // SAFETY: the caller's contract for the event; the stream is `from_raw`'s.
        check(unsafe { sys::cuEventRecord(event as sys::CUevent, self.raw()) }, || {
            format!("recording the application's event {event:#x} on its stream")
        })
    }

    /// Waits until the work queued on the stream so far is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live stream of the current context, or the default stream (`from_raw`'s contract).
        check(unsafe { sys::cuStreamSynchronize(self.raw()) }, || {
            "waiting for the application's stream".into()
        })
    }

    /// Queues a copy of `bytes` bytes from `src` to `dst`, after the work already queued on the stream.
    ///
    /// # Safety
    /// As `Stream::copy`: both ranges are memory this context reaches, allocated until the stream has
    /// run the copy.
    pub unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the ranges are the caller's contract; the stream is `from_raw`'s.
        check(unsafe { sys::cuMemcpyAsync(dst, src, bytes, self.raw()) }, || {
            format!("copy of {bytes} bytes {src:#x} -> {dst:#x} on the application's stream")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_memsets_must_stay_inside_the_allocation() {
        // The flag count table: 256 words, one byte lane of each.
        assert!(strided_bytes_fit(2048, 7, 8, 256));
        assert!(!strided_bytes_fit(2048, 8, 8, 256), "the last row would be byte 2048");
        assert!(!strided_bytes_fit(2048, 0, 8, 257));
        assert!(strided_bytes_fit(2048, 5000, 8, 0), "nothing written");
        assert!(!strided_bytes_fit(u64::MAX, 1, u64::MAX, 3), "no overflow");
    }
}
