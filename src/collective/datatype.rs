//! Element types and reduction operators of the collectives, numbered as NCCL numbers them (`ncclInt8 = 0`
//! ... `ncclFloat8e5m2 = 11`, `ncclSum = 0` ... `ncclAvg = 4`). `mscclpp.h`'s `mscclppDataType_t` and
//! `mscclppRedOp_t` are the same numbers without the two fp8 types and without `PreMulSum` operators (NCCL's
//! face reaches those: `DataType::from_number`, `RedOp::PreMulSum`). Each face words its own errors for a
//! number that names nothing, in its own types' names.

use super::variants::Op;
use crate::gpu::DevicePtr;

/// An element type: defined with the kernels' variants (`kernels/variants.rs`), which give its kernels'
/// name, its C type and its size.
pub use super::variants::DataType;

impl DataType {
    /// The type of NCCL's number `value` (`ncclDataType_t`), if it names one.
    pub fn from_number(value: i32) -> Option<DataType> {
        usize::try_from(value).ok().and_then(|i| Self::ALL.get(i)).copied()
    }
}

/// The scalar of a `PreMulSum` operator: one element of the call's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// The element's bytes in the low bytes of the word (little-endian, the rest zero), read when the
    /// operator was made (NCCL's `ncclScalarHostImmediate`).
    Immediate(u64),
    /// Device memory holding the element, read by the kernel when it runs (NCCL's `ncclScalarDevice`), so
    /// that a replayed graph sees the value of the moment.
    Device(DevicePtr),
}

impl Scalar {
    /// An immediate scalar from an element's bytes, as they lie in host memory.
    pub fn immediate(bytes: &[u8]) -> Scalar {
        assert!(bytes.len() <= 8, "a scalar is one element, at most 8 bytes");
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(bytes);
        Scalar::Immediate(u64::from_le_bytes(word))
    }

    /// What the kernel argument carries (`CollArgs::scalarBits` and `scalarPtr`): the bits, or the pointer.
    pub fn kernel_fields(self) -> (u64, DevicePtr) {
        match self {
            Scalar::Immediate(bits) => (bits, 0),
            Scalar::Device(ptr) => (0, ptr),
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
    /// NCCL's `ncclRedOpCreatePreMulSum`: the sum of every rank's input multiplied by the scalar, each
    /// rank's by its own before anything is summed (rounded to the type, as NCCL does); the partial sums are
    /// never scaled.
    PreMulSum(Scalar),
}

impl RedOp {
    /// The operators of `mscclpp.h` (and NCCL's built-in ones), in their numbering.
    pub const BUILT_IN: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The built-in operator of number `value` (`ncclRedOp_t`, `mscclppRedOp_t`), if it names one.
    pub fn from_number(value: i32) -> Option<RedOp> {
        usize::try_from(value).ok().and_then(|i| Self::BUILT_IN.get(i)).copied()
    }

    /// The operator as the kernels know it (a `PreMulSum`'s, whatever its scalar: the scalar travels in the
    /// kernel argument).
    pub fn kernel_op(self) -> Op {
        match self {
            RedOp::Sum => Op::Sum,
            RedOp::Prod => Op::Prod,
            RedOp::Max => Op::Max,
            RedOp::Min => Op::Min,
            RedOp::Avg => Op::Avg,
            RedOp::PreMulSum(_) => Op::PreMulSum,
        }
    }

    /// The scalar the kernel argument carries: a `PreMulSum`'s, else none.
    pub fn scalar(self) -> Option<Scalar> {
        match self {
            RedOp::PreMulSum(s) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_c_value_maps_and_others_are_refused() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::from_number(i as i32), Some(*t));
        }
        assert_eq!(DataType::from_number(10), Some(DataType::Float8e4m3));
        assert_eq!(DataType::from_number(11), Some(DataType::Float8e5m2));
        for bad in [-1, 12, 1000] {
            assert_eq!(DataType::from_number(bad), None);
        }
        for (i, op) in RedOp::BUILT_IN.iter().enumerate() {
            assert_eq!(RedOp::from_number(i as i32), Some(*op));
            // The kernels' tables are indexed by the same numbers.
            assert_eq!(op.kernel_op() as usize, i);
        }
        assert_eq!(RedOp::PreMulSum(Scalar::Immediate(0)).kernel_op(), Op::PreMulSum);
        for bad in [-1, 5, i32::MAX] {
            assert_eq!(RedOp::from_number(bad), None);
        }
    }

    #[test]
    fn sizes() {
        let sizes: Vec<usize> = DataType::ALL.iter().map(|t| t.size()).collect();
        assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1]);
    }

    #[test]
    fn scalars_travel_as_bits_or_as_a_pointer() {
        // An element's bytes in the low bytes of the word, the rest zero: the kernel reads sizeof(T) of them.
        assert_eq!(Scalar::immediate(&0.5f32.to_le_bytes()), Scalar::Immediate(0x3f00_0000));
        assert_eq!(
            Scalar::immediate(&0.25f64.to_le_bytes()),
            Scalar::Immediate(0.25f64.to_bits())
        );
        assert_eq!(Scalar::immediate(&(-1i8).to_le_bytes()), Scalar::Immediate(0xff));
        assert_eq!(Scalar::immediate(&[0x38]), Scalar::Immediate(0x38), "fp8 e4m3 1.0");
        assert_eq!(Scalar::immediate(&0x3c00u16.to_le_bytes()), Scalar::Immediate(0x3c00));
        assert_eq!(Scalar::Immediate(7).kernel_fields(), (7, 0));
        assert_eq!(Scalar::Device(0x7000).kernel_fields(), (0, 0x7000));
        let op = RedOp::PreMulSum(Scalar::Device(0x7000));
        assert_eq!(
            (op.kernel_op(), op.scalar()),
            (Op::PreMulSum, Some(Scalar::Device(0x7000)))
        );
        assert_eq!(RedOp::Sum.scalar(), None);
    }
}
