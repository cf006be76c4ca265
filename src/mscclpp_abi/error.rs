//! The core's errors as `mscclppResult_t`, the legacy face's codes.

use crate::error::{Error, ErrorKind};
use crate::types::mscclppResult_t;

/// The legacy code of an error kind: the kinds are numbered as `mscclppResult_t` numbers its results, but
/// for a timeout, which MSCCL++ 0.1.0 has no code for: a peer that never answered in time is a remote
/// error there.
pub fn code(kind: ErrorKind) -> mscclppResult_t {
    match kind {
        ErrorKind::Cuda => mscclppResult_t::mscclppUnhandledCudaError,
        ErrorKind::System => mscclppResult_t::mscclppSystemError,
        ErrorKind::Internal => mscclppResult_t::mscclppInternalError,
        ErrorKind::InvalidArgument => mscclppResult_t::mscclppInvalidArgument,
        ErrorKind::InvalidUsage => mscclppResult_t::mscclppInvalidUsage,
        ErrorKind::Remote => mscclppResult_t::mscclppRemoteError,
        ErrorKind::InProgress => mscclppResult_t::mscclppInProgress,
        ErrorKind::Timeout => mscclppResult_t::mscclppRemoteError,
    }
}

/// The result of a call: `mscclppSuccess`, or its error's code.
pub fn result(r: &crate::error::Result<()>) -> mscclppResult_t {
    r.as_ref()
        .map_or_else(|e: &Error| code(e.kind), |()| mscclppResult_t::mscclppSuccess)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_its_legacy_code() {
        // mscclpp.h has no timeout: a remote error.
        crate::error::assert_codes(6, |k| code(k) as i32);
        assert_eq!(result(&Ok(())), mscclppResult_t::mscclppSuccess);
        assert_eq!(
            result(&Err(Error::new(ErrorKind::Timeout, "a peer never came"))),
            mscclppResult_t::mscclppRemoteError
        );
    }
}
