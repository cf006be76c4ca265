//! Loading the driver, checking its results, and the context a communicator works in.

use super::DevicePtr;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};
use once_cell::sync::OnceCell;
use std::ffi::CStr;

/// Loads libcuda and initializes it, once per process. The error is kept and returned to every caller.
pub fn ensure_driver() -> Result<()> {
    static LOADED: OnceCell<std::result::Result<(), String>> = OnceCell::new();
    LOADED
        .get_or_init(|| {
            if crate::settings::cuda_hides_every_device() {
                return Err(
                    "CUDA_VISIBLE_DEVICES hides every device from this process: the CUDA driver was not loaded".into(),
                );
            }
            if !driver_present() {
                return Err("the CUDA driver (libcuda.so) is not installed on this machine".into());
            }
            // SAFETY: cuInit may be called any number of times, from any thread.
            let rc = unsafe { sys::cuInit(0) };
            if rc != CUresult::CUDA_SUCCESS {
                return Err(format!("cuInit failed: {}", error_name(rc)));
            }
            Ok(())
        })
        .clone()
        .map_err(Error::cuda)
}

/// Whether CUDA loads kernels lazily, at their first launch (the default since CUDA 12.2). A lazy first
/// launch takes a driver lock and waits for the GPU; if a running kernel waits on the proxy meanwhile,
/// the proxy's next CUDA call waits for that lock: a deadlock the application avoids by loading its
/// kernels up front (`cudaFuncGetAttributes`) or with `CUDA_MODULE_LOADING=EAGER`.
pub fn lazy_loading() -> bool {
    let mut mode = sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING;
    // SAFETY: out-pointer to a local; the driver is initialized by the caller.
    let rc = unsafe { sys::cuModuleGetLoadingMode(&mut mode) };
    rc == CUresult::CUDA_SUCCESS && mode == sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING
}

/// Whether the CUDA driver's library can be loaded (probed once).
fn driver_present() -> bool {
    static PRESENT: OnceCell<bool> = OnceCell::new();
    // SAFETY: probing for the library has no preconditions.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The driver's name for a result code. The driver's table of names needs its library only, not `cuInit`:
/// asking `ensure_driver` here would re-enter its initialisation where `cuInit` itself failed, and wait
/// for itself forever (a machine with the driver and no visible device, `CUDA_VISIBLE_DEVICES=` among
/// them, hung every rank's initialisation so).
pub fn error_name(rc: CUresult) -> String {
    if !driver_present() {
        return format!("CUDA error {}", rc as i32);
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it null.
    unsafe { sys::cuGetErrorName(rc, &mut name) };
    if name.is_null() {
        return format!("CUDA error {}", rc as i32);
    }
    // SAFETY: the driver returned a static NUL-terminated string.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// Turns a driver result into our error, saying what we were doing.
pub fn check(rc: CUresult, what: impl FnOnce() -> String) -> Result<()> {
    if rc == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::cuda(format!("{}: {}", what(), error_name(rc))))
    }
}

/// Puts back, when dropped, the context that was current on the thread when it was made: a call that
/// makes its communicator's context current leaves the application's thread as it found it.
pub struct RestoreContext(Option<usize>);

impl RestoreContext {
    pub fn save() -> RestoreContext {
        if ensure_driver().is_err() {
            return RestoreContext(None);
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the driver is initialized.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        RestoreContext((rc == CUresult::CUDA_SUCCESS && !ctx.is_null()).then_some(ctx as usize))
    }
}

impl Drop for RestoreContext {
    fn drop(&mut self) {
        let Some(saved) = self.0 else { return };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the driver was initialized by `save`.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        if rc == CUresult::CUDA_SUCCESS && ctx as usize != saved {
            // SAFETY: the context was current on this thread when saved, and the application keeps its
            // contexts alive while it calls the library from a thread that has them current.
            unsafe { sys::cuCtxSetCurrent(saved as CUcontext) };
        }
    }
}

/// The CUDA context a communicator works in: the one current on the thread that created it (the
/// runtime's primary context of the device chosen by `cudaSetDevice`), or device 0's primary context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuContext {
    pub device: CUdevice,
    ctx: usize,
    /// Whether we retained device 0's primary context ourselves and must release it.
    retained: bool,
}

impl GpuContext {
    /// Captures the calling thread's current context.
    pub fn current() -> Result<GpuContext> {
        ensure_driver()?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, || "cuCtxGetCurrent".into())?;
        let mut retained = false;
        if ctx.is_null() {
            let mut dev: CUdevice = 0;
            // SAFETY: out-pointers to locals.
            check(unsafe { sys::cuDeviceGet(&mut dev, 0) }, || "cuDeviceGet(0)".into())?;
            // SAFETY: as above; the retained context is released in `release`.
            check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, || {
                "cuDevicePrimaryCtxRetain".into()
            })?;
            retained = true;
        }
        let g = GpuContext {
            device: 0,
            ctx: ctx as usize,
            retained,
        };
        g.make_current()?;
        let mut dev: CUdevice = 0;
        // SAFETY: out-pointer to a local; a context is current.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, || "cuCtxGetDevice".into())?;
        Ok(GpuContext { device: dev, ..g })
    }

    /// The calling thread's current context, if it has one (none is created or retained), or `None`
    /// when the driver is missing or no context is current.
    pub fn current_if_any() -> Option<GpuContext> {
        ensure_driver().ok()?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the driver is initialized.
        let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        if rc != CUresult::CUDA_SUCCESS || ctx.is_null() {
            return None;
        }
        GpuContext::current().ok()
    }

    /// How many CUDA devices this process sees (`cuDeviceGetCount`): what a device ordinal an
    /// application passes is checked against before any rank waits for another.
    pub fn device_count() -> Result<i32> {
        ensure_driver()?;
        let mut n: i32 = 0;
        // SAFETY: out-pointer to a local; the driver is initialized.
        check(unsafe { sys::cuDeviceGetCount(&mut n) }, || "cuDeviceGetCount".into())?;
        Ok(n)
    }

    /// Makes device `ordinal`'s primary context current on the calling thread, as `cudaSetDevice` does,
    /// and returns it (`ncclCommInitAll`, which makes one rank per listed device). The primary context is
    /// retained for the rest of the process, as the CUDA runtime retains it.
    pub fn set_device(ordinal: i32) -> Result<GpuContext> {
        ensure_driver()?;
        let mut dev: CUdevice = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuDeviceGet(&mut dev, ordinal) }, || {
            format!("cuDeviceGet({ordinal})")
        })?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; never released (see above).
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, || {
            format!("cuDevicePrimaryCtxRetain({ordinal})")
        })?;
        // SAFETY: the context was just retained.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, || "cuCtxSetCurrent".into())?;
        GpuContext::current()
    }

    /// Whether `ctx` is this context.
    pub fn is(&self, ctx: CUcontext) -> bool {
        ctx as usize == self.ctx
    }

    /// Makes this context current on the calling thread (proxy threads, and API calls made from
    /// threads other than the creator's).
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: the context stays alive while the communicator that holds this value lives.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx as CUcontext) }, || {
            "cuCtxSetCurrent".into()
        })
    }

    /// Waits until every stream of this context is idle (`cuCtxSynchronize`): before a mapping that
    /// kernels may still read is closed. Not allowed while a stream of the context captures.
    pub fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        // SAFETY: no arguments; this context is current.
        check(unsafe { sys::cuCtxSynchronize() }, || "cuCtxSynchronize".into())
    }

    /// Frees a resource of this context in a `Drop`: makes the context current, runs `free` (the driver
    /// call) and logs a failure, since a destructor cannot report it.
    pub fn free_in_drop(&self, what: &str, free: impl FnOnce() -> CUresult) {
        let _ = self.make_current();
        if let Err(e) = check(free(), || what.into()) {
            log::warn!("{e}");
        }
    }

    /// Releases the primary context if we retained it; called once, when the communicator goes.
    pub fn release(&self) {
        if self.retained {
            // SAFETY: balanced with the retain in `current`.
            unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
        }
    }

    /// Checks that `[ptr, ptr+size)` is device memory inside one allocation on this context's GPU (an
    /// application's buffer, named `what` in the error).
    pub fn check_buffer(&self, ptr: DevicePtr, size: u64, what: &str) -> Result<super::PointerInfo> {
        let info = super::pointer_info(ptr, size, what)?;
        if info.device != self.device {
            return Err(Error::invalid_argument(format!(
                "{what} is on GPU {} but the communicator's GPU is {} (the device current when it was created)",
                info.device, self.device
            )));
        }
        Ok(info)
    }

    /// Lets this context reach directly the memory of the GPU that holds `peer_ptr` (an allocation of
    /// another context of this process). Best effort, and logged at INFO when it fails: on the same
    /// device no peer access is needed, and without a peer path the copy engine still reaches the memory
    /// through the driver.
    pub fn enable_peer_access_to(&self, peer_ptr: DevicePtr) {
        let mut peer_ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the attribute is a context handle, written to a local.
        let rc = unsafe {
            sys::cuPointerGetAttribute(
                (&mut peer_ctx as *mut CUcontext).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                peer_ptr,
            )
        };
        if rc != CUresult::CUDA_SUCCESS || peer_ctx.is_null() {
            return;
        }
        let _ = self.make_current();
        // SAFETY: both contexts are alive (ours is held by the communicator, the peer's holds a live
        // allocation); enabling twice returns an error we accept.
        let rc = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
        if rc != CUresult::CUDA_SUCCESS && rc != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            log::info!("peer access from GPU {} not enabled: {}", self.device, error_name(rc));
        }
    }

    /// The PCI bus id of this context's device, as the driver writes it (`0000:17:00.0`), in lower case
    /// as sysfs names it.
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut bus = [0 as std::ffi::c_char; 32];
        check(
            // SAFETY: the buffer is valid for the length passed.
            unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, self.device) },
            || "cuDeviceGetPCIBusId".into(),
        )?;
        // The driver NUL-terminates within the length it was given; a missing NUL is an error, not a
        // read past the buffer.
        let id = CStr::from_bytes_until_nul(&bus.map(|c| c as u8))
            .map_err(|_| Error::cuda("cuDeviceGetPCIBusId returned an unterminated string"))?
            .to_string_lossy()
            .to_lowercase();
        Ok(id)
    }

    /// Whether streams of this device can write 64-bit values (`cuStreamWriteValue64`).
    pub fn can_write_u64_from_streams(&self) -> Result<bool> {
        Ok(self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)? != 0)
    }

    /// The device's multiprocessors (SMs), by which the collectives size their grids; 0 where the driver
    /// answers a negative count.
    pub fn multiprocessors(&self) -> Result<u32> {
        let count = self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(count.max(0) as u32)
    }

    /// Device attribute query: private, so that the driver's enums stay in `gpu/` (a caller outside it asks
    /// through a method named for what it wants, as `multiprocessors`).
    fn attribute(&self, attr: sys::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, self.device) }, || {
            format!("cuDeviceGetAttribute({attr:?})")
        })?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_loads_or_says_why_not() {
        // Either outcome is legitimate here (machines with and without a GPU run these tests); what
        // matters is that a missing driver is an error with a reason, never a panic, and that the answer
        // does not change.
        let first = ensure_driver();
        if let Err(e) = &first {
            assert_eq!(e.kind, crate::error::ErrorKind::Cuda);
            assert!(!e.message.is_empty());
        }
        assert_eq!(first, ensure_driver());
    }

    #[test]
    fn results_are_named() {
        assert!(check(CUresult::CUDA_SUCCESS, || unreachable!()).is_ok());
        let e = check(CUresult::CUDA_ERROR_INVALID_VALUE, || "doing x".into()).unwrap_err();
        assert!(e.message.starts_with("doing x: "));
    }
}
