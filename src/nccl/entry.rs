//! What every exported function of the NCCL face does first: `entry` (the logger, the panic boundary, the
//! failure kept for `ncclGetLastError`), `with_comm` (the communicator behind an `ncclComm_t`, its rank
//! in what is logged; `with_comm_reporting`, which `queue::enqueue` uses to fail the open group), and the
//! readers of NCCL's numbers that many calls share: an `ncclDataType_t` into the core's `DataType`, a rank
//! argument checked against the communicator's size.

use super::comm::{self as ncomm, NcclComm};
use super::error::{self as nerror, code};
use super::types::*;
use crate::abi::catch_panic;
use crate::collective::DataType;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::logging::RankScope;
use std::ffi::c_int;
use std::sync::Arc;

/// The entry of every function: installs the logger, runs `body` behind the panic boundary, and keeps a
/// failure's message for `ncclGetLastError`. `body` returns `ncclSuccess` or `ncclInProgress`.
pub(super) fn entry(name: &str, body: impl FnOnce() -> Result<ncclResult_t>) -> ncclResult_t {
    crate::logging::init_for_nccl();
    match catch_panic(name, body) {
        Ok(r) => r,
        Err(e) => {
            nerror::record(name, &e);
            code(&e)
        }
    }
}

/// `entry` with the communicator behind `comm`; what it logs names its rank.
pub(super) fn with_comm(
    name: &str,
    comm: ncclComm_t,
    body: impl FnOnce(&Arc<NcclComm>) -> Result<ncclResult_t>,
) -> ncclResult_t {
    with_comm_reporting(name, comm, body, |_| {})
}

/// `with_comm` that also hands any failure, an unknown or NULL `comm` included, to `report` before it
/// returns (`queue::enqueue` fails the open group with it).
pub(super) fn with_comm_reporting(
    name: &str,
    comm: ncclComm_t,
    body: impl FnOnce(&Arc<NcclComm>) -> Result<ncclResult_t>,
    report: impl FnOnce(&Error),
) -> ncclResult_t {
    let found = ncomm::lookup(comm);
    let _rank = found.as_ref().ok().and_then(|c| c.rank()).map(RankScope::enter);
    entry(name, || found.and_then(|c| body(&c)).inspect_err(report))
}

pub(super) const OK: Result<ncclResult_t> = Ok(ncclResult_t::ncclSuccess);

/// NCCL's name of a type, for messages.
pub(super) fn datatype_name(t: DataType) -> &'static str {
    match t {
        DataType::Int8 => "ncclInt8",
        DataType::Uint8 => "ncclUint8",
        DataType::Int32 => "ncclInt32",
        DataType::Uint32 => "ncclUint32",
        DataType::Int64 => "ncclInt64",
        DataType::Uint64 => "ncclUint64",
        DataType::Float16 => "ncclFloat16",
        DataType::Float32 => "ncclFloat32",
        DataType::Float64 => "ncclFloat64",
        DataType::Bfloat16 => "ncclBfloat16",
        DataType::Float8e4m3 => "ncclFloat8e4m3",
        DataType::Float8e5m2 => "ncclFloat8e5m2",
    }
}

/// The core's type for `v`, an `ncclDataType_t` (the core numbers its types as NCCL does, fp8 included).
pub(super) fn datatype(v: c_int) -> Result<DataType> {
    DataType::from_number(v).ok_or_else(|| {
        Error::invalid_argument(format!(
            "datatype is {v}; it must be an ncclDataType_t, 0 (ncclInt8) to {} (ncclFloat8e5m2)",
            datatype::NUM_TYPES - 1
        ))
    })
}

/// Checks a rank argument (`root`, `peer`) against the communicator's size.
pub(super) fn check_rank(name: &str, v: c_int, comm: &NcclComm) -> Result<()> {
    let nranks = comm.nranks()?;
    ensure_arg!(
        v >= 0 && (v as usize) < nranks,
        "{name} is {v}; it must be in [0, nranks = {nranks})"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn every_nccl_type_is_the_cores_fp8_included() {
        assert_eq!(datatype(10).unwrap(), DataType::Float8e4m3);
        assert_eq!(datatype(11).unwrap(), DataType::Float8e5m2);
        assert_eq!(datatype(9).unwrap(), DataType::Bfloat16);
        for bad in [-1, 12] {
            let e = datatype(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains("to 11 (ncclFloat8e5m2)"), "{e}");
        }
    }
}
