//! The C ABI: thin `extern "C"` functions (in `api.rs`) that check their arguments, find the
//! communicator, and call into the safe core, each behind a panic boundary.

pub mod api;
pub mod collectives;
mod handles;

use crate::error::{Error, Result};
use crate::types::mscclppResult_t;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body` for the exported function `name`: installs the logger, turns a panic into
/// `mscclppInternalError`, and logs every error once, naming the function.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<()>) -> mscclppResult_t {
    crate::logging::init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => mscclppResult_t::mscclppSuccess,
        Ok(Err(e)) => {
            log::warn!("{name}: {e}");
            e.code()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            log::error!("{name}: internal error (panic): {what}");
            mscclppResult_t::mscclppInternalError
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
