//! What both C faces (`mscclpp.h` in `mscclpp_abi/`, `nccl.h` in `nccl/`) need at their boundary, over the
//! core and below either face: the panic boundary, the token handles and their registry, the checks of
//! pointer arguments, and the bytes of a unique id. Neither face imports the other; both import this.

pub mod handles;

use crate::error::{Error, Result};
use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Bytes in a unique id of either face (`mscclppUniqueId`, `ncclUniqueId`): the bootstrap's id fits both.
pub const UNIQUE_ID_BYTES: usize = 128;

/// The panic boundary of every exported function: runs `body`, turns a panic into an `Internal` error, and
/// logs every error once, naming the function `name`. Each face turns the error into its own result type.
/// The logger must be installed by the caller.
pub fn catch_panic<T>(name: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
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

/// Checks that a pointer argument named `what` is not null.
pub fn non_null<T>(p: *const T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::invalid_argument(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Checks that each pointer argument named is not null (`non_null_args!(comm, out)`), in order; the error
/// names the first null one by its C parameter name, so the message cannot drift from the signature.
macro_rules! non_null_args {
    ($($arg:ident),+ $(,)?) => {
        $( $crate::abi::non_null($arg, stringify!($arg))?; )+
    };
}
pub(crate) use non_null_args;

/// The bytes of a unique id as the C caller holds them (`char internal[128]`).
pub fn id_bytes(internal: &[c_char; UNIQUE_ID_BYTES]) -> [u8; UNIQUE_ID_BYTES] {
    std::array::from_fn(|i| internal[i] as u8)
}

/// Writes a unique id's bytes into the caller's `char internal[128]`.
pub fn write_id_bytes(internal: &mut [c_char; UNIQUE_ID_BYTES], bytes: &[u8; UNIQUE_ID_BYTES]) {
    for (o, &b) in internal.iter_mut().zip(bytes) {
        *o = b as c_char;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_panic_becomes_an_internal_error_and_errors_pass_through() {
        let e = catch_panic::<()>("f", || panic!("boom")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert_eq!(e.message, "internal error (panic): boom");
        let e = catch_panic::<()>("f", || Err(Error::invalid_usage("no"))).unwrap_err();
        assert_eq!(e, Error::invalid_usage("no"));
        assert_eq!(catch_panic("f", || Ok(7)), Ok(7));
    }

    #[test]
    fn null_pointers_name_the_argument() {
        let e = non_null(std::ptr::null::<u8>(), "uniqueId").unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::InvalidArgument, "uniqueId is NULL")
        );
        assert!(non_null(&1u8, "x").is_ok());
    }

    #[test]
    fn id_bytes_go_through_the_c_array_unchanged() {
        let bytes: [u8; UNIQUE_ID_BYTES] = std::array::from_fn(|i| (i * 3) as u8);
        let mut internal = [0 as c_char; UNIQUE_ID_BYTES];
        write_id_bytes(&mut internal, &bytes);
        assert_eq!(id_bytes(&internal), bytes);
    }
}
