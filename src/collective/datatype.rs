//! Element types and reduction operators of the collectives, as the C interface numbers them (NCCL's
//! numbering: `mscclppInt8 = 0` ... `mscclppBfloat16 = 9`, `mscclppSum = 0` ... `mscclppAvg = 4`).

use crate::error::{Error, Result};
use crate::types::{mscclppDataType_t, mscclppRedOp_t};

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
}

impl DataType {
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];

    /// The type an application passed (a `mscclppDataType_t` as an int), or an error naming the value.
    pub fn from_c(value: i32) -> Result<DataType> {
        use mscclppDataType_t::*;
        Ok(match value {
            v if v == mscclppInt8 as i32 => DataType::Int8,
            v if v == mscclppUint8 as i32 => DataType::Uint8,
            v if v == mscclppInt32 as i32 => DataType::Int32,
            v if v == mscclppUint32 as i32 => DataType::Uint32,
            v if v == mscclppInt64 as i32 => DataType::Int64,
            v if v == mscclppUint64 as i32 => DataType::Uint64,
            v if v == mscclppFloat16 as i32 => DataType::Float16,
            v if v == mscclppFloat32 as i32 => DataType::Float32,
            v if v == mscclppFloat64 as i32 => DataType::Float64,
            v if v == mscclppBfloat16 as i32 => DataType::Bfloat16,
            v => {
                return Err(Error::invalid_argument(format!(
                    "datatype is {v}; it must be a mscclppDataType_t, 0 (mscclppInt8) to {} (mscclppBfloat16)",
                    mscclppBfloat16 as i32
                )));
            }
        })
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name the kernels of this type carry (`mscclpp_<algorithm>_<op>_<name>`); also the name of the
    /// fatbin that holds them (build.rs's `KERNEL_TYPES`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            DataType::Int8 => "i8",
            DataType::Uint8 => "u8",
            DataType::Int32 => "i32",
            DataType::Uint32 => "u32",
            DataType::Int64 => "i64",
            DataType::Uint64 => "u64",
            DataType::Float16 => "f16",
            DataType::Float32 => "f32",
            DataType::Float64 => "f64",
            DataType::Bfloat16 => "bf16",
        }
    }
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    /// The sum divided by the number of ranks (integers: truncated).
    Avg,
}

impl RedOp {
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The operator an application passed (a `mscclppRedOp_t` as an int), or an error naming the value.
    pub fn from_c(value: i32) -> Result<RedOp> {
        use mscclppRedOp_t::*;
        Ok(match value {
            v if v == mscclppSum as i32 => RedOp::Sum,
            v if v == mscclppProd as i32 => RedOp::Prod,
            v if v == mscclppMax as i32 => RedOp::Max,
            v if v == mscclppMin as i32 => RedOp::Min,
            v if v == mscclppAvg as i32 => RedOp::Avg,
            v => {
                return Err(Error::invalid_argument(format!(
                    "op is {v}; it must be a mscclppRedOp_t, 0 (mscclppSum) to {} (mscclppAvg)",
                    mscclppAvg as i32
                )));
            }
        })
    }

    /// The name the kernels of this operator carry.
    pub fn kernel_name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_c_value_maps_and_others_are_refused() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::from_c(i as i32).unwrap(), *t);
        }
        for bad in [-1, 10, 1000] {
            let e = DataType::from_c(bad).unwrap_err();
            assert!(e.message.contains("datatype is") && e.message.contains(&bad.to_string()));
        }
        for (i, op) in RedOp::ALL.iter().enumerate() {
            assert_eq!(RedOp::from_c(i as i32).unwrap(), *op);
        }
        for bad in [-1, 5, i32::MAX] {
            assert!(RedOp::from_c(bad).unwrap_err().message.starts_with("op is"));
        }
    }

    #[test]
    fn sizes() {
        let sizes: Vec<usize> = DataType::ALL.iter().map(|t| t.size()).collect();
        assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2]);
    }
}
