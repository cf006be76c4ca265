//! NCCL's reduction operators beyond the built-in ones: `ncclRedOpCreatePreMulSum` and `ncclRedOpDestroy`,
//! and `redop`, which reads any `ncclRedOp_t` a call passes (built-in, or made on its communicator) into
//! the core's `RedOp`.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::comm::{NcclComm, PreMulSum};
use super::entry::{OK, datatype, datatype_name, with_comm};
use super::types::*;
use crate::abi::non_null_args;
use crate::collective::{DataType, RedOp, Scalar};
use crate::ensure_arg;
use crate::error::{Error, Result};
use std::ffi::{c_int, c_void};

/// The core's operator for `v`: a built-in `ncclRedOp_t`, or a `PreMulSum` operator made on `comm`, which
/// reduces only the type it was made for (as NCCL's).
pub(super) fn redop(v: c_int, comm: &NcclComm, datatype: DataType) -> Result<RedOp> {
    if let Some(op) = RedOp::from_number(v) {
        return Ok(op);
    }
    let made = comm.premul(v).ok_or_else(|| {
        Error::invalid_argument(format!(
            "op is {v}; it must be an ncclRedOp_t, 0 (ncclSum) to {} (ncclAvg), or an operator made by \
             ncclRedOpCreatePreMulSum on this comm (and not destroyed)",
            redop::NUM_OPS - 1
        ))
    })?;
    ensure_arg!(
        made.datatype == datatype,
        "op {v} was made by ncclRedOpCreatePreMulSum for {}, not for datatype {} of this call",
        datatype_name(made.datatype),
        datatype_name(datatype)
    );
    Ok(RedOp::PreMulSum(made.scalar))
}

nccl_export! {
    /// Makes a `PreMulSum` operator (the sum of every rank's input, each multiplied by its rank's scalar
    /// first), for `datatype` alone: an immediate scalar is copied now, a device one is read by every
    /// kernel that uses the operator. Kept until `ncclRedOpDestroy`.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
        comm: ncclComm_t,
    ) -> ncclResult_t {
        with_comm("ncclRedOpCreatePreMulSum", comm, |c| {
            // The type first: a pointer is read as one value of it.
            let element = self::datatype(datatype)?;
            non_null_args!(op, scalar);
            let size = element.size();
            let core_scalar = match residence {
                NCCL_SCALAR_HOST_IMMEDIATE => {
                    // SAFETY: checked non-null; the caller's scalar is one value of `datatype` in host memory.
                    let bytes = unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), size) };
                    Scalar::immediate(bytes)
                }
                NCCL_SCALAR_DEVICE => {
                    ensure_arg!(
                        (scalar as usize).is_multiple_of(size),
                        "scalar {scalar:p} (ncclScalarDevice) is not aligned to its type {} ({size} bytes)",
                        datatype_name(element)
                    );
                    Scalar::Device(scalar as u64)
                }
                other => {
                    return Err(Error::invalid_argument(format!(
                        "residence is {other}; it must be ncclScalarDevice (0) or ncclScalarHostImmediate (1)"
                    )));
                }
            };
            // Its twin on NVIDIA's communicator, where that carries the collectives (ranks on several hosts).
            let twin = c
                .fallback_for_all()
                // SAFETY: the caller's scalar, under nccl.h's contract (checked non-null).
                .map(|f| unsafe { f.create_premul(scalar, datatype, residence) })
                .transpose()?;
            let n = c.add_premul(PreMulSum {
                datatype: element,
                scalar: core_scalar,
                fallback: twin,
            });
            // SAFETY: checked non-null.
            unsafe { *op = n };
            OK
        })
    }
}

nccl_export! {
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) -> ncclResult_t {
        with_comm("ncclRedOpDestroy", comm, |c| {
            ensure_arg!(
                op >= redop::NUM_OPS,
                "op is {op}, a built-in operator; only operators made by ncclRedOpCreatePreMulSum are destroyed"
            );
            let made = c.remove_premul(op);
            ensure_arg!(
                made.is_some(),
                "op {op} was not made by ncclRedOpCreatePreMulSum on this comm (or was destroyed)"
            );
            if let (Some(f), Some(twin)) = (c.fallback(), made.and_then(|m| m.fallback)) {
                f.destroy_premul(twin)?;
            }
            OK
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn premulsum_operators_become_the_cores_for_their_own_type_only() {
        let c = NcclComm::pending(0, 1, None, None);
        let scalar = Scalar::immediate(&[0x38]);
        let n = c.add_premul(PreMulSum {
            datatype: DataType::Float8e4m3,
            scalar,
            fallback: None,
        });
        assert_eq!(redop(n, &c, DataType::Float8e4m3).unwrap(), RedOp::PreMulSum(scalar));
        assert_eq!(redop(2, &c, DataType::Float8e4m3).unwrap(), RedOp::Max);
        let e = redop(n, &c, DataType::Float8e5m2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message
                .contains("for ncclFloat8e4m3, not for datatype ncclFloat8e5m2"),
            "{e}"
        );
        c.remove_premul(n);
        let e = redop(n, &c, DataType::Float8e4m3).unwrap_err();
        assert!(
            e.message.contains(&format!("op is {n}")) && e.message.contains("not destroyed"),
            "{e}"
        );
        assert!(redop(-1, &c, DataType::Float32).is_err());
    }
}
