//! Buffer registration in `mscclpp.h` (`MSCCLPP_HAS_REGISTRATION`), in NCCL's shape; the table itself is
//! `crate::registration`, which NCCL's `ncclCommRegister` and windows use too.
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // the contract of each function is the header's

use super::api::with_comm;
use crate::abi::non_null_args;
use crate::registration::Kind;
use crate::types::{mscclppComm_t, mscclppResult_t};
use std::ffi::c_void;

/// Extension (MSCCLPP_HAS_REGISTRATION). Registers `[buff, buff + size)`, device memory of one
/// allocation, with the communicator, and writes a handle for it to *handle. Local: no peer takes part.
/// Exported to the peers: collectives whose buffers every rank registered move their data directly
/// (zero-copy). Errors: mscclppInvalidArgument for a NULL handle or
/// buff, a size of 0, or a range that is not device memory inside one allocation;
/// mscclppUnhandledCudaError without a CUDA driver. *handle is left alone on error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommRegister(
    comm: mscclppComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> mscclppResult_t {
    with_comm("mscclppCommRegister", comm, |c| {
        non_null_args!(handle);
        let token = c.register(buff as u64, size, Kind::Buffer, false)?;
        // SAFETY: checked non-null; the caller provides a writable void*.
        unsafe { *handle = token as *mut c_void };
        Ok(())
    })
}

/// Extension (MSCCLPP_HAS_REGISTRATION). Forgets the registration `handle` of this communicator; the
/// memory itself is the application's. Allowed after mscclppCommAbort. Errors: mscclppInvalidArgument
/// for a NULL handle, mscclppInvalidUsage for a handle this communicator did not issue or has
/// deregistered already.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCommDeregister(comm: mscclppComm_t, handle: *mut c_void) -> mscclppResult_t {
    with_comm("mscclppCommDeregister", comm, |c| {
        non_null_args!(handle);
        c.deregister(handle as u64, Kind::Buffer, "handle")?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mscclpp_abi::api::tests::one_rank;
    use crate::mscclpp_abi::api::{mscclppCommAbort, mscclppCommDestroy};
    use crate::registration::{Allocation, Registration};
    use mscclppResult_t::*;

    #[test]
    fn bad_arguments_and_unknown_handles_are_refused() {
        let comm = one_rank();
        let mut handle: *mut c_void = 0x77 as *mut c_void;
        let buff = 0x1000 as *mut c_void;
        // SAFETY: null and made-up pointers are what is being tested; none is dereferenced but `handle`.
        unsafe {
            assert_eq!(
                mscclppCommRegister(std::ptr::null_mut(), buff, 8, &mut handle),
                mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommRegister(comm, buff, 8, std::ptr::null_mut()),
                mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommRegister(comm, std::ptr::null_mut(), 8, &mut handle),
                mscclppInvalidArgument
            );
            assert_eq!(mscclppCommRegister(comm, buff, 0, &mut handle), mscclppInvalidArgument);
            assert_eq!(handle, 0x77 as *mut c_void, "left alone on error");
            assert_eq!(
                mscclppCommDeregister(comm, std::ptr::null_mut()),
                mscclppInvalidArgument
            );
            assert_eq!(
                mscclppCommDeregister(comm, 0x4d53_0000_0bad_0000 as *mut c_void),
                mscclppInvalidUsage
            );
            assert_eq!(mscclppCommDestroy(comm), mscclppSuccess);
            assert_eq!(
                mscclppCommRegister(comm, buff, 8, &mut handle),
                mscclppInvalidUsage,
                "destroyed"
            );
        }
    }

    #[test]
    fn a_registration_deregisters_once_also_after_an_abort_and_goes_with_destroy() {
        let comm = one_rank();
        let core = crate::mscclpp_abi::comms::lookup(comm).unwrap();
        // Made without the driver: the bookkeeping is what is tested here.
        let entry = Registration {
            ptr: 0x20_0000,
            len: 4096,
            kind: Kind::Buffer,
            allocation: Allocation {
                buffer_id: 3,
                base: 0x20_0000,
                size: 4096,
                device: 0,
            },
            library_memory: false,
        };
        let a = core.registrations().insert(entry) as *mut c_void;
        let b = core.registrations().insert(entry) as *mut c_void;
        // SAFETY: live communicator and tokens it issued.
        unsafe {
            assert_eq!(mscclppCommDeregister(comm, a), mscclppSuccess);
            assert_eq!(mscclppCommDeregister(comm, a), mscclppInvalidUsage, "twice");
            assert_eq!(mscclppCommAbort(comm), mscclppSuccess);
            assert_eq!(mscclppCommDeregister(comm, b), mscclppSuccess, "after an abort");
            core.registrations().insert(entry);
            assert_eq!(mscclppCommDestroy(comm), mscclppSuccess);
        }
        assert!(
            core.registrations().is_empty(),
            "destroy frees what is still registered"
        );
    }
}
