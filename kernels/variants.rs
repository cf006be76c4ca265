// The collectives' kernel variants, in the one table that build.rs and the library both read (`include!`:
// build.rs's `variants` module, the library's `collective::variants`): the element types, the reduction
// operators and the kernels. From it build.rs writes the translation units nvcc compiles, one per element
// type and one (`moving`) for the kernels that only move bytes, and the library's table of entry points
// (`collective_kernels.rs` in OUT_DIR), which `collective::kernels` looks a launch's kernel up in by
// (kernel, operator, type), never building a name. A new algorithm is one more `Kernel` and its `Spec`
// here; its device function lives in `kernels/collectives/` (`kernels.cuh` includes every file).
//
// Twins are folded: where an operator's result has the same bits for a signed integer type and its
// unsigned twin (`Op::signless`: two's complement addition and multiplication), the signed type's launches
// use the unsigned type's entry point, and the signed one is not compiled (`Kernel::serving`).

/// An element type, numbered as NCCL numbers them (`ncclInt8 = 0` ... `ncclFloat8e5m2 = 11`).
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
    /// fp8 with 4 exponent and 3 mantissa bits (no infinities; largest finite 448): CUDA's `__nv_fp8_e4m3`.
    Float8e4m3,
    /// fp8 with 5 exponent and 2 mantissa bits (largest finite 57344): CUDA's `__nv_fp8_e5m2`.
    Float8e5m2,
}

impl DataType {
    /// Every type, in NCCL's numbering (`ALL[i]` is number `i`; checked below).
    pub const ALL: [DataType; 12] = [
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
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// The name its kernels carry (`mscclpp_<kernel>_<op>_<name>`), which is also the name of the unit that
    /// holds them, and what `LIBMSCCLPP_KERNEL_TYPES` names it by.
    pub const fn kernel_name(self) -> &'static str {
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
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }

    /// Its type in the device code (the unit's `T`).
    pub const fn c_type(self) -> &'static str {
        match self {
            DataType::Int8 => "int8_t",
            DataType::Uint8 => "uint8_t",
            DataType::Int32 => "int32_t",
            DataType::Uint32 => "uint32_t",
            DataType::Int64 => "int64_t",
            DataType::Uint64 => "uint64_t",
            DataType::Float16 => "__half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "__nv_bfloat16",
            DataType::Float8e4m3 => "__nv_fp8_e4m3",
            DataType::Float8e5m2 => "__nv_fp8_e5m2",
        }
    }

    /// Bytes of one element (each unit asserts it of its `T`).
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// A signed integer type's unsigned type of the same width, whose entry points serve it for the operators
    /// whose bits do not depend on signedness (`Op::signless`). The unsigned one is kept rather than the
    /// signed: C++ defines its wrap-around, where a signed overflow is undefined (both compile to the same
    /// instructions, which wrap).
    pub const fn unsigned_twin(self) -> Option<DataType> {
        match self {
            DataType::Int8 => Some(DataType::Uint8),
            DataType::Int32 => Some(DataType::Uint32),
            DataType::Int64 => Some(DataType::Uint64),
            _ => None,
        }
    }

    /// The type named `name` (`kernel_name`), if any.
    pub fn from_kernel_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|t| t.kernel_name() == name)
    }
}

/// A reduction operator as the kernels know it (the library's `RedOp` without a `PreMulSum`'s scalar,
/// which travels in the kernel argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum,
}

impl Op {
    /// Every operator, in NCCL's numbering (`PreMulSum` after the built-in ones; checked below).
    pub const ALL: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg, Op::PreMulSum];

    /// The name its kernels carry (`mscclpp_<kernel>_<name>_<type>`).
    pub const fn kernel_name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
            Op::PreMulSum => "premulsum",
        }
    }

    /// Its functor in the device code (`kernels/collectives/reduce.cuh`, the unit's `Op`).
    pub const fn functor(self) -> &'static str {
        match self {
            Op::Sum => "OpSum",
            Op::Prod => "OpProd",
            Op::Max => "OpMax",
            Op::Min => "OpMin",
            Op::Avg => "OpAvg",
            Op::PreMulSum => "OpPreMulSum",
        }
    }

    /// Whether its result has the same bits for a signed integer type and its unsigned twin: sums and
    /// products (a `PreMulSum` is both) are two's complement arithmetic modulo the width, which does not
    /// depend on signedness. Comparisons (max, min) and the average's division do.
    pub const fn signless(self) -> bool {
        matches!(self, Op::Sum | Op::Prod | Op::PreMulSum)
    }
}

/// The operators of the kernels that reduce (every one), those of the zero-copy kernels and of send and
/// receive that reduce (not `PreMulSum`, which stays on the scratch algorithms), one rank's (`PreMulSum`
/// alone: the others of one rank are a copy), and those of the kernels that only move bytes (none).
const EVERY_OP: &[Op] = &Op::ALL;
const BUT_PREMULSUM: &[Op] = &[Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg];
const PREMULSUM: &[Op] = &[Op::PreMulSum];
const MOVES: &[Op] = &[];

/// A kernel: one entry point per operator and type where it reduces, one for every type where it only
/// moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    AllReducePacket,
    AllReduceRsag,
    ReduceScatterPacket,
    ReduceScatterCopy,
    AllReduceZc,
    ReduceScatterZc,
    /// Send and receive whose receives reduce (two ranks' reductions carried as sends and receives).
    SendRecvReduce,
    /// One rank's `PreMulSum`: each element of the input times the scalar.
    ScalePreMulSum,
    AllGatherPacket,
    AllGatherCopy,
    BroadcastPacket,
    BroadcastCopy,
    AllGatherZc,
    BroadcastZc,
    /// The fences around the copy engine's copies.
    CeFence,
    AllToAllPacket,
    AllToAllCopy,
    ScatterPacket,
    ScatterCopy,
    SendRecv,
    /// NCCL's one-sided put (and its signal), and the wait for signals.
    RmaPut,
    RmaWait,
}

/// How build.rs writes a kernel's entry points: `extern "C" __global__ void <bounds> mscclpp_<name>[_<op>_<type>]
/// (<param>) { <body>(args); }`, with `{T}` and `{Op}` in `body` the type's `c_type` and the operator's
/// `functor`.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub name: &'static str,
    /// The operators it has an entry point for, each for every type; none: one entry point, moving bytes.
    pub ops: &'static [Op],
    pub bounds: &'static str,
    pub param: &'static str,
    pub body: &'static str,
}

/// The collectives' blocks: `MSCCLPP_COLL_THREADS` threads, one `CollArgs` (kernels/coll_args.rs).
const COLL_BOUNDS: &str = "__launch_bounds__(MSCCLPP_COLL_THREADS)";
const COLL_PARAM: &str = "CollArgs args";
/// The zero-copy kernels, with the blocks each multiprocessor must hold (nvcc caps the registers to fit
/// them). They run the scratch code too where the vote says no, and the scratch code wants two blocks, the
/// zero-copy loops one (with the registers to spare; two blocks spill). Measured on one H100 with 2 ranks
/// under MPS (docs/PERFORMANCE.md, zero-copy), graphs of 1 GiB, one block / two: all-reduce f32 registered
/// 1541 / 1580 us, unregistered 3735 / 4131; reduce-scatter 1135 / 1224, 2215 / 2314; all-gather 1510 /
/// 1536, 2201 / 2273; broadcast 1248 / 1396, 2612 / 2281: broadcast takes two, the others one.
const ZC_ONE_BLOCK: &str = "__launch_bounds__(MSCCLPP_COLL_THREADS, 1)";
const ZC_TWO_BLOCKS: &str = "__launch_bounds__(MSCCLPP_COLL_THREADS, 2)";
/// `__grid_constant__`: the kernel reads its large argument where it lies, never copying it per thread.
const SENDRECV_BOUNDS: &str = "__launch_bounds__(MSCCLPP_SENDRECV_THREADS)";
const SENDRECV_PARAM: &str = "const __grid_constant__ SendRecvArgs args";
const SIGNAL_PARAM: &str = "const __grid_constant__ SignalArgs args";

const fn coll(name: &'static str, ops: &'static [Op], bounds: &'static str, body: &'static str) -> Spec {
    Spec {
        name,
        ops,
        bounds,
        param: COLL_PARAM,
        body,
    }
}

impl Kernel {
    /// Every kernel, in the order of its enum (`ALL[i] as usize` is `i`; checked below).
    pub const ALL: [Kernel; 22] = [
        Kernel::AllReducePacket,
        Kernel::AllReduceRsag,
        Kernel::ReduceScatterPacket,
        Kernel::ReduceScatterCopy,
        Kernel::AllReduceZc,
        Kernel::ReduceScatterZc,
        Kernel::SendRecvReduce,
        Kernel::ScalePreMulSum,
        Kernel::AllGatherPacket,
        Kernel::AllGatherCopy,
        Kernel::BroadcastPacket,
        Kernel::BroadcastCopy,
        Kernel::AllGatherZc,
        Kernel::BroadcastZc,
        Kernel::CeFence,
        Kernel::AllToAllPacket,
        Kernel::AllToAllCopy,
        Kernel::ScatterPacket,
        Kernel::ScatterCopy,
        Kernel::SendRecv,
        Kernel::RmaPut,
        Kernel::RmaWait,
    ];

    pub const fn spec(self) -> Spec {
        match self {
            Kernel::AllReducePacket => coll("allreduce_packet", EVERY_OP, COLL_BOUNDS, "allreducePacket<{T}, {Op}>"),
            Kernel::AllReduceRsag => coll("allreduce_rsag", EVERY_OP, COLL_BOUNDS, "allreduceRsag<{T}, {Op}>"),
            Kernel::ReduceScatterPacket => coll(
                "reducescatter_packet",
                EVERY_OP,
                COLL_BOUNDS,
                "reducescatterPacket<{T}, {Op}>",
            ),
            Kernel::ReduceScatterCopy => coll(
                "reducescatter_copy",
                EVERY_OP,
                COLL_BOUNDS,
                "reducescatterCopy<{T}, {Op}>",
            ),
            Kernel::AllReduceZc => coll("allreduce_zc", BUT_PREMULSUM, ZC_ONE_BLOCK, "allreduceZc<{T}, {Op}>"),
            Kernel::ReduceScatterZc => coll(
                "reducescatter_zc",
                BUT_PREMULSUM,
                ZC_ONE_BLOCK,
                "reducescatterZc<{T}, {Op}>",
            ),
            Kernel::SendRecvReduce => Spec {
                name: "send_recv_reduce",
                ops: BUT_PREMULSUM,
                bounds: SENDRECV_BOUNDS,
                param: SENDRECV_PARAM,
                body: "sendRecvKernel<SendRecvReduce<{T}, {Op}>>",
            },
            Kernel::ScalePreMulSum => coll("scale", PREMULSUM, COLL_BOUNDS, "scaleOneRank<{T}, {Op}>"),
            Kernel::AllGatherPacket => coll("allgather_packet", MOVES, COLL_BOUNDS, "allgatherPacket"),
            Kernel::AllGatherCopy => coll("allgather_copy", MOVES, COLL_BOUNDS, "allgatherCopy"),
            Kernel::BroadcastPacket => coll("broadcast_packet", MOVES, COLL_BOUNDS, "broadcastPacket"),
            Kernel::BroadcastCopy => coll("broadcast_copy", MOVES, COLL_BOUNDS, "broadcastCopy"),
            Kernel::AllGatherZc => coll("allgather_zc", MOVES, ZC_ONE_BLOCK, "allgatherZc"),
            Kernel::BroadcastZc => coll("broadcast_zc", MOVES, ZC_TWO_BLOCKS, "broadcastZc"),
            Kernel::CeFence => coll("ce_fence", MOVES, COLL_BOUNDS, "ceFence"),
            Kernel::AllToAllPacket => coll("alltoall_packet", MOVES, COLL_BOUNDS, "alltoallPacket"),
            Kernel::AllToAllCopy => coll("alltoall_copy", MOVES, COLL_BOUNDS, "alltoallCopy"),
            Kernel::ScatterPacket => coll("scatter_packet", MOVES, COLL_BOUNDS, "scatterPacket"),
            Kernel::ScatterCopy => coll("scatter_copy", MOVES, COLL_BOUNDS, "scatterCopy"),
            Kernel::SendRecv => Spec {
                name: "send_recv",
                ops: MOVES,
                bounds: SENDRECV_BOUNDS,
                param: SENDRECV_PARAM,
                body: "sendRecvKernel<SendRecvMoveOnly>",
            },
            Kernel::RmaPut => Spec {
                name: "rma_put",
                ops: MOVES,
                bounds: "__launch_bounds__(MSCCLPP_SIGNAL_PUT_THREADS)",
                param: SIGNAL_PARAM,
                body: "rmaPut",
            },
            Kernel::RmaWait => Spec {
                name: "rma_wait",
                ops: MOVES,
                bounds: "__launch_bounds__(MSCCLPP_SIGNAL_MAX_WAITS)",
                param: SIGNAL_PARAM,
                body: "rmaWait",
            },
        }
    }

    /// Whether it reduces: an entry point per operator and type, rather than one for every type.
    pub const fn reduces(self) -> bool {
        !self.spec().ops.is_empty()
    }

    /// The entry point that serves a launch of this kernel for `reducing` (the operator and the type; `None`
    /// for a kernel that only moves bytes): its own, or its unsigned twin's where the operator's bits do not
    /// depend on signedness. `None` where the kernel has no such variant.
    pub const fn serving(self, reducing: Option<(Op, DataType)>) -> Option<Variant> {
        let spec = self.spec();
        let Some((op, datatype)) = reducing else {
            return if spec.ops.is_empty() {
                Some(Variant {
                    kernel: self,
                    reducing: None,
                })
            } else {
                None
            };
        };
        let mut i = 0;
        while i < spec.ops.len() {
            if spec.ops[i] as usize == op as usize {
                let datatype = match datatype.unsigned_twin() {
                    Some(twin) if op.signless() => twin,
                    _ => datatype,
                };
                return Some(Variant {
                    kernel: self,
                    reducing: Some((op, datatype)),
                });
            }
            i += 1;
        }
        None
    }
}

/// One entry point: a kernel and, where it reduces, its operator and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub kernel: Kernel,
    pub reducing: Option<(Op, DataType)>,
}

/// The unit of the kernels that only move bytes.
pub const MOVING_UNIT: &str = "moving";

impl Variant {
    /// The unit that holds it: its type's, or `MOVING_UNIT`.
    pub const fn unit(self) -> &'static str {
        match self.reducing {
            Some((_, datatype)) => datatype.kernel_name(),
            None => MOVING_UNIT,
        }
    }

    /// Its entry point's name, `mscclpp_<kernel>[_<op>_<type>]` (for build.rs, which writes every name into
    /// the library's table, and for tests: the library never builds one).
    pub fn entry_name(self) -> String {
        let base = self.kernel.spec().name;
        match self.reducing {
            Some((op, datatype)) => format!("mscclpp_{base}_{}_{}", op.kernel_name(), datatype.kernel_name()),
            None => format!("mscclpp_{base}"),
        }
    }
}

/// The build-time variable that names the element types whose kernels a build compiles, while developing
/// (`f32,bf16`; unset or empty: every type). The kernels that only move bytes are always compiled; the
/// library refuses a launch of a type left out, naming the variable.
pub const TYPES_FILTER: &str = "LIBMSCCLPP_KERNEL_TYPES";

/// The types a value of `TYPES_FILTER` names (comma-separated `kernel_name`s, in any order), or what is wrong
/// with it.
pub fn parse_types_filter(value: &str) -> Result<Vec<DataType>, String> {
    let mut types = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let datatype = DataType::from_kernel_name(name).ok_or_else(|| {
            let known: Vec<&str> = DataType::ALL.iter().map(|t| t.kernel_name()).collect();
            format!(
                "{TYPES_FILTER}={value}: no type is named {name:?} (the types: {})",
                known.join(",")
            )
        })?;
        if !types.contains(&datatype) {
            types.push(datatype);
        }
    }
    if types.is_empty() {
        return Err(format!(
            "{TYPES_FILTER}={value:?} names no type; unset it to build every type"
        ));
    }
    Ok(types)
}

/// The entry points a build that serves `types` compiles, each once, in the order of `Kernel::ALL`, the
/// operators and the types: every kernel that moves bytes, and every variant that serves a type of `types`
/// (a folded twin's once, in its unsigned type's unit, whichever of the two `types` names).
pub fn entry_points(types: &[DataType]) -> Vec<Variant> {
    let mut out: Vec<Variant> = Vec::new();
    for kernel in Kernel::ALL {
        let requests: Vec<Option<(Op, DataType)>> = if kernel.reduces() {
            let mut r = Vec::new();
            for op in kernel.spec().ops {
                r.extend(
                    DataType::ALL
                        .iter()
                        .filter(|t| types.contains(t))
                        .map(|t| Some((*op, *t))),
                );
            }
            r
        } else {
            vec![None]
        };
        for variant in requests.into_iter().filter_map(|r| kernel.serving(r)) {
            if !out.contains(&variant) {
                out.push(variant);
            }
        }
    }
    out
}

// `ALL[i] as usize == i` for every list, so that the library's tables can be indexed by the enums.
const _: () = {
    let mut i = 0;
    while i < DataType::ALL.len() {
        assert!(DataType::ALL[i] as usize == i);
        i += 1;
    }
    assert!(DataType::ALL.len() == DataType::Float8e5m2 as usize + 1);
    let mut i = 0;
    while i < Op::ALL.len() {
        assert!(Op::ALL[i] as usize == i);
        i += 1;
    }
    assert!(Op::ALL.len() == Op::PreMulSum as usize + 1);
    let mut i = 0;
    while i < Kernel::ALL.len() {
        assert!(Kernel::ALL[i] as usize == i);
        i += 1;
    }
    assert!(Kernel::ALL.len() == Kernel::RmaWait as usize + 1);
};
