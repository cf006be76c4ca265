//! The C ABI: thin `extern "C"` functions (in `api.rs`) that check their arguments, find the
//! communicator, and call into the safe core, each behind a panic boundary.
//!
//! The `mscclpp.h` functions are compiled only with the `mscclpp-abi` feature (the default): the build of
//! `libnccl.so.2` leaves them out, so that it exports NCCL's names alone (`crate::nccl`), and preloading it
//! never interposes `libmscclpp`'s. The panic boundary and the handles here serve both faces.

#[cfg(feature = "mscclpp-abi")]
pub mod api;
#[cfg(feature = "mscclpp-abi")]
pub mod collectives;
pub mod handles;
#[cfg(feature = "mscclpp-abi")]
pub mod registration;

use crate::error::{Error, Result};
use crate::types::mscclppResult_t;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body` for the exported function `name`: installs the logger, turns a panic into
/// `mscclppInternalError`, and logs every error once, naming the function.
#[cfg_attr(not(feature = "mscclpp-abi"), allow(dead_code))]
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<()>) -> mscclppResult_t {
    crate::logging::init();
    match catch_panic(name, body) {
        Ok(()) => mscclppResult_t::mscclppSuccess,
        Err(e) => e.code(),
    }
}

/// The panic boundary itself: runs `body`, turns a panic into an `Internal` error, and logs every error
/// once, naming the function `name`. The logger must be installed by the caller.
pub(crate) fn catch_panic<T>(name: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            log::warn!("{name}: {e}");
            Err(e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            log::error!("{name}: internal error (panic): {what}");
            Err(Error::internal(format!("internal error (panic): {what}")))
        }
    }
}

/// Checks that an out-pointer is not null.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::invalid_argument(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}
