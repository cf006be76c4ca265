//! The face of `mscclpp.h`: thin `extern "C"` functions (in `api.rs`) that check their arguments, find the
//! communicator, and call into the safe core, each behind the panic boundary of `crate::abi`.
//! `collectives.rs` holds the four collectives, `comms.rs` the communicators' tokens, `registration.rs`
//! `mscclppCommRegister` (over the core's table, `crate::registration`), and `regmem_vector.rs` the
//! entries of the application's `mscclppRegisteredMemory` that `mscclppRegisterBuffer` appends and
//! `mscclppRegisteredBufferWrite` reads (a `std::vector` only C++ may touch).
//!
//! Compiled only with the `mscclpp-abi` feature (a default one, beside `nccl-abi`):
//! `--no-default-features --features nccl-abi` builds the core with NCCL's face alone, which `make lint`
//! checks, so that the NCCL face never needs this one.

pub mod api;
pub mod collectives;
pub mod comms;
pub mod error;
pub mod registration;
pub mod regmem_vector;

use crate::abi::catch_panic;
use crate::error::Result;
use crate::types::mscclppResult_t;

/// Runs `body` for the exported function `name`: installs the logger, turns a panic into
/// `mscclppInternalError`, and logs every error once, naming the function.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<()>) -> mscclppResult_t {
    crate::logging::init();
    error::result(&catch_panic(name, body))
}
