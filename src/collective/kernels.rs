//! The collective kernels embedded in the library (fatbins that build.rs compiled from
//! `kernels/collectives/`), and the ones loaded into a communicator's context, each module at the first
//! call that needs one of its kernels.

use super::algorithm::resident_share;
use super::variants::{Kernel, TYPES_FILTER};
use super::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, Kernel as GpuKernel, Module, RelaxedCapture};
use std::collections::HashMap;

/// What the table of entry points holds for one kernel, operator and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The entry point that serves it (a folded twin's where the bits are the same) and the unit that holds it.
    Built { name: &'static str, unit: &'static str },
    /// Its type was left out of this build by `LIBMSCCLPP_KERNEL_TYPES`.
    LeftOut,
    /// The kernel has no such variant (an operator it does not reduce with, or an operator where it only
    /// moves bytes).
    Absent,
}

mod embedded {
    use super::Entry;
    // `FATBINS: &[(&str, &[u8])]`: one fatbin per unit (an element type's, named as `DataType::kernel_name`,
    // and `moving`, for the kernels that only move bytes); `REDUCING` and `MOVING`, the entry points, and
    // `TYPES_FILTER_VALUE`, written by build.rs from kernels/variants.rs.
    include!(concat!(env!("OUT_DIR"), "/collective_kernels.rs"));
}

/// The fatbin named `unit`, if this build has it.
pub fn fatbin(unit: &str) -> Option<&'static [u8]> {
    embedded::FATBINS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, bytes)| *bytes)
}

/// What the table holds for a launch of `kernel` with `op` (`None` for a kernel that only moves bytes) on
/// elements of `datatype`.
pub(super) fn entry(kernel: Kernel, op: Option<RedOp>, datatype: DataType) -> Entry {
    match op {
        Some(op) => embedded::REDUCING[kernel as usize][op.kernel_op() as usize][datatype as usize],
        None => embedded::MOVING[kernel as usize],
    }
}

/// The types this build compiled kernels for (`LIBMSCCLPP_KERNEL_TYPES`, every type where it was unset).
#[cfg(test)]
pub(super) fn built_types() -> Vec<DataType> {
    embedded::TYPES_FILTER_VALUE.map_or(DataType::ALL.to_vec(), |v| {
        super::variants::parse_types_filter(v).unwrap()
    })
}

/// The entry point and unit of an entry, or why there is none; `filter` is `LIBMSCCLPP_KERNEL_TYPES`'s value
/// when the library was built.
fn entry_point(
    entry: Entry,
    kernel: Kernel,
    op: Option<RedOp>,
    datatype: DataType,
    filter: Option<&str>,
) -> Result<(&'static str, &'static str)> {
    let op_name = op.map_or("none", |op| op.kernel_op().kernel_name());
    match entry {
        Entry::Built { name, unit } => Ok((name, unit)),
        Entry::LeftOut => Err(Error::internal(format!(
            "this libmscclpp was built without the {} kernels ({TYPES_FILTER}={} when it was built): rebuild \
             it with {TYPES_FILTER} unset, or naming {}",
            datatype.kernel_name(),
            filter.unwrap_or(""),
            datatype.kernel_name()
        ))),
        Entry::Absent => Err(Error::internal(format!(
            "no collective kernel {kernel:?} for operator {op_name} and type {}",
            datatype.kernel_name()
        ))),
    }
}

/// A kernel ready to launch, and the most blocks a launch of it may have.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    pub kernel: GpuKernel,
    /// This rank's share of the blocks of the kernel the GPU holds at once (`algorithm::resident_share`).
    pub max_blocks: u32,
}

/// The modules and kernels loaded into one context.
pub struct LoadedKernels {
    gpu: GpuContext,
    /// What `algorithm::resident_share` needs besides the kernel: the fewest multiprocessors of any rank's
    /// context and the most ranks on one GPU (`Scratch`'s).
    multiprocessors: u32,
    gpu_sharers: usize,
    // Kernels are declared before the modules that hold them. Keyed by their entry point's name (the
    // table's: twins share one).
    kernels: HashMap<&'static str, LoadedKernel>,
    modules: HashMap<&'static str, Module>,
}

/// Every unit of collective kernels, loaded into a context with each of its kernels: what a set-up loads
/// before it meets the peers (`Collectives::set_up`), and what a suspend keeps.
///
/// Why all of them, and then: loading a module waits for the GPU, and under MPS for the kernels of every
/// client of it. A rank that loaded a unit at its first use, while the peers sharing its GPU had launched
/// the same call and spun waiting for it, waited for them for ever (four ranks on one H200, resumed and
/// then all-reducing at different moments: three spun, the fourth sat in `cuModuleLoadData`). A set-up
/// ends in an exchange with every peer, so a unit loaded before it is loaded before any peer's kernel of
/// this communicator can wait on this rank.
pub struct Units {
    modules: HashMap<&'static str, Module>,
}

impl Units {
    /// Loads every embedded unit and every kernel in it (none where the library was built without them:
    /// the first launch then says so).
    pub fn load(gpu: &GpuContext) -> Result<Units> {
        let started = std::time::Instant::now();
        let mut modules = HashMap::new();
        let (mut bytes, mut kernels) = (0usize, 0usize);
        for (unit, image) in embedded::FATBINS {
            let module = Module::load(gpu, image, &format!("collective ({unit})"))?;
            kernels += module.load_every_kernel()?;
            bytes += image.len();
            modules.insert(*unit, module);
        }
        if !modules.is_empty() {
            log::info!(
                "collective kernels loaded: {} units, {kernels} kernels, {bytes} bytes of images, in {:.1} ms",
                modules.len(),
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(Units { modules })
    }
}

impl LoadedKernels {
    pub fn new(gpu: GpuContext, multiprocessors: u32, gpu_sharers: usize) -> LoadedKernels {
        LoadedKernels {
            gpu,
            multiprocessors,
            gpu_sharers,
            kernels: HashMap::new(),
            modules: HashMap::new(),
        }
    }

    /// The kernels of a communicator's collectives, from units loaded before the set-up's exchange.
    pub fn from_units(gpu: GpuContext, multiprocessors: u32, gpu_sharers: usize, units: Units) -> LoadedKernels {
        LoadedKernels {
            modules: units.modules,
            ..LoadedKernels::new(gpu, multiprocessors, gpu_sharers)
        }
    }

    /// The units, for a suspend to keep (the kernels found in them are found again after the resume).
    pub fn into_units(self) -> Units {
        Units { modules: self.modules }
    }

    /// Whether `get` would load a module first (which a graph capture must allow: `RelaxedCapture`, entered
    /// by `get_capturing`).
    fn needs_loading(&self, kernel: Kernel, op: Option<RedOp>, datatype: DataType) -> bool {
        match entry(kernel, op, datatype) {
            Entry::Built { name, .. } => !self.kernels.contains_key(name),
            Entry::LeftOut | Entry::Absent => false,
        }
    }

    /// `get`, from a launch path that may be capturing a graph: a first kernel of its type loads a module,
    /// which a capture allows only in the relaxed mode, entered for the load alone.
    pub fn get_capturing(
        &mut self,
        capturing: bool,
        kernel: Kernel,
        op: Option<RedOp>,
        datatype: DataType,
        threads: u32,
    ) -> Result<LoadedKernel> {
        let _relaxed = (capturing && self.needs_loading(kernel, op, datatype))
            .then(RelaxedCapture::enter)
            .transpose()?;
        self.get(kernel, op, datatype, threads)
    }

    /// The kernel for an operator and type (`op` is `None` for a kernel that only moves bytes, which serves
    /// every type), loading its module first if needed; its occupancy, for blocks of `threads` (the same for
    /// every launch of `kernel`), and the share of blocks it gives are worked out once. A share below one
    /// block is an error here, before any launch.
    pub fn get(&mut self, kernel: Kernel, op: Option<RedOp>, datatype: DataType, threads: u32) -> Result<LoadedKernel> {
        let (name, unit) = entry_point(
            entry(kernel, op, datatype),
            kernel,
            op,
            datatype,
            embedded::TYPES_FILTER_VALUE,
        )?;
        if let Some(k) = self.kernels.get(name) {
            return Ok(*k);
        }
        if !self.modules.contains_key(unit) {
            let image = fatbin(unit).ok_or_else(|| {
                Error::internal(format!(
                    "this libmscclpp was built without its collective kernels ({unit}): nvcc was not found when it \
                     was built; rebuild it with make"
                ))
            })?;
            let module = Module::load(&self.gpu, image, &format!("collective ({unit})"))?;
            log::info!("collective kernels ({unit}, {} bytes) loaded", image.len());
            self.modules.insert(unit, module);
        }
        let gpu_kernel = self.modules[unit].kernel(name)?;
        let per_multiprocessor = gpu_kernel.blocks_per_multiprocessor(threads)?;
        // A grid the GPU cannot hold beside the other ranks' would hang.
        let max_blocks = resident_share(name, self.multiprocessors, per_multiprocessor, self.gpu_sharers)?;
        let loaded = LoadedKernel {
            kernel: gpu_kernel,
            max_blocks,
        };
        log::info!(
            "{name}: {per_multiprocessor} blocks of {threads} threads per multiprocessor, at most {max_blocks} a launch"
        );
        self.kernels.insert(name, loaded);
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Scalar;
    use crate::collective::variants::{self, MOVING_UNIT, Op, Variant, entry_points, parse_types_filter};
    use std::collections::HashSet;

    /// The names a fatbin's symbol table holds (nvcc keeps entry-point names in the ELF images it embeds).
    fn holds(image: &[u8], name: &str) -> bool {
        let needle = format!("{name}\0");
        image.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    /// build.rs's table holds, for every slot, what `Kernel::serving` says, under the name `Variant::entry_name`
    /// gives; a type the filter left out is `LeftOut`.
    #[test]
    fn the_table_is_the_variants_of_kernels_variants_rs() {
        let built = built_types();
        let expected = |v: Option<Variant>, t: Option<DataType>| match v {
            None => "Absent".to_string(),
            Some(_) if t.is_some_and(|t| !built.contains(&t)) => "LeftOut".to_string(),
            Some(v) => format!("{} in {}", v.entry_name(), v.unit()),
        };
        let shown = |e: Entry| match e {
            Entry::Absent => "Absent".to_string(),
            Entry::LeftOut => "LeftOut".to_string(),
            Entry::Built { name, unit } => format!("{name} in {unit}"),
        };
        for kernel in Kernel::ALL {
            assert_eq!(
                shown(embedded::MOVING[kernel as usize]),
                expected(kernel.serving(None), None)
            );
            for op in Op::ALL {
                for t in DataType::ALL {
                    let e = embedded::REDUCING[kernel as usize][op as usize][t as usize];
                    assert_eq!(
                        shown(e),
                        expected(kernel.serving(Some((op, t))), Some(t)),
                        "{kernel:?} {op:?} {t:?}"
                    );
                }
            }
        }
        assert_eq!(
            entry(Kernel::AllReducePacket, Some(RedOp::Avg), DataType::Bfloat16),
            if built.contains(&DataType::Bfloat16) {
                Entry::Built {
                    name: "mscclpp_allreduce_packet_avg_bf16",
                    unit: "bf16",
                }
            } else {
                Entry::LeftOut
            }
        );
        assert_eq!(
            entry(Kernel::BroadcastCopy, None, DataType::Int8),
            Entry::Built {
                name: "mscclpp_broadcast_copy",
                unit: MOVING_UNIT
            }
        );
        assert_eq!(
            entry(Kernel::BroadcastCopy, Some(RedOp::Sum), DataType::Int8),
            Entry::Absent
        );
        assert_eq!(
            entry(
                Kernel::AllReduceZc,
                Some(RedOp::PreMulSum(Scalar::Device(8))),
                DataType::Float32
            ),
            Entry::Absent
        );
        assert_eq!(entry(Kernel::AllReducePacket, None, DataType::Float32), Entry::Absent);
        // Every scalar finds the one entry point its operator and type have.
        let a = RedOp::PreMulSum(Scalar::Immediate(0x3f00_0000));
        let b = RedOp::PreMulSum(Scalar::Device(0x1000));
        assert_eq!(
            entry(Kernel::ReduceScatterCopy, Some(a), DataType::Float32),
            entry(Kernel::ReduceScatterCopy, Some(b), DataType::Float32)
        );
    }

    /// Fails, never skips, where the build found nvcc (as `make`'s always does): a build without every entry
    /// point of its table is broken. Skipped only where the build found none (`cfg(built_without_nvcc)`, set
    /// by build.rs).
    #[test]
    #[cfg_attr(
        built_without_nvcc,
        ignore = "built without nvcc (build.rs found none): the library has no collective kernels to check"
    )]
    fn every_kernel_the_library_launches_is_embedded() {
        assert!(
            !embedded::FATBINS.is_empty(),
            "the build found nvcc, yet embedded no collective kernels (build.rs's compile_collective_kernels)"
        );
        let entries = entry_points(&built_types());
        let units: HashSet<&str> = entries.iter().map(|v| v.unit()).collect();
        let embedded_units: HashSet<&str> = embedded::FATBINS.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            embedded_units, units,
            "the units embedded are not those of the entry points"
        );
        let all = embedded::REDUCING.iter().flatten().flatten().chain(&embedded::MOVING);
        let mut names = HashSet::new();
        for e in all {
            if let Entry::Built { name, unit } = *e {
                let image = fatbin(unit).unwrap_or_else(|| panic!("{name}'s unit {unit} is not embedded"));
                assert!(holds(image, name), "{name} is not in the {unit} fatbin");
                names.insert(name);
            }
        }
        assert_eq!(
            names.len(),
            entries.len(),
            "the table names every entry point compiled, once"
        );
    }

    /// A build without kernels is one where there is no nvcc: where one has appeared at a place the build
    /// looked since (`make` installs one into .toolchain/ after a plain `cargo build` ran without), this build
    /// lacks the kernels `make`'s library has, and its kernel test, skipped, would prove nothing.
    #[cfg(built_without_nvcc)]
    #[test]
    fn a_build_without_kernels_found_no_nvcc_where_there_is_one_now() {
        assert!(embedded::FATBINS.is_empty());
        for place in env!("LIB_NVCC_LOOKED_FOR").split(':') {
            assert!(
                !std::path::Path::new(place).exists(),
                "this build found no nvcc and has no collective kernels, but {place} exists now: `touch build.rs` \
                 and build again, so that the build script looks again and compiles them"
            );
        }
    }

    /// A signed integer type's sums, products and `PreMulSum`s are its unsigned twin's entry points, whose
    /// bits are the same (two's complement); its maxima, minima and averages, and every other type's, are
    /// its own.
    #[test]
    fn folded_twins_share_one_entry_point() {
        let twins = [
            (DataType::Int8, DataType::Uint8),
            (DataType::Int32, DataType::Uint32),
            (DataType::Int64, DataType::Uint64),
        ];
        let mut folded = 0;
        for kernel in Kernel::ALL.into_iter().filter(|k| k.reduces()) {
            for &op in kernel.spec().ops {
                for (signed, unsigned) in twins {
                    let (s, u) = (kernel.serving(Some((op, signed))), kernel.serving(Some((op, unsigned))));
                    let own = Variant {
                        kernel,
                        reducing: Some((op, unsigned)),
                    };
                    assert_eq!(u, Some(own));
                    if op.signless() {
                        assert_eq!(s, u, "{kernel:?} {op:?} {signed:?}");
                        folded += 1;
                    } else {
                        assert_eq!(s.map(|v| v.unit()), Some(signed.kernel_name()), "{kernel:?} {op:?}");
                    }
                }
                for t in DataType::ALL.into_iter().filter(|t| t.unsigned_twin().is_none()) {
                    assert_eq!(kernel.serving(Some((op, t))).and_then(|v| v.reducing), Some((op, t)));
                }
            }
        }
        // 19 kernels and operators of each of the three pairs.
        assert_eq!(folded, 57);
        let unfolded = Kernel::ALL
            .iter()
            .map(|k| k.spec().ops.len().max(1) * if k.reduces() { 12 } else { 1 });
        assert_eq!(unfolded.sum::<usize>(), 494);
        assert_eq!(entry_points(&DataType::ALL).len(), 494 - 57);
        // In the built table, too: an i32 sum launches the u32 sum's entry point, its maximum its own.
        if built_types().contains(&DataType::Int32) {
            for kernel in [Kernel::AllReducePacket, Kernel::AllReduceZc, Kernel::SendRecvReduce] {
                assert_eq!(
                    entry(kernel, Some(RedOp::Sum), DataType::Int32),
                    entry(kernel, Some(RedOp::Sum), DataType::Uint32)
                );
                assert_ne!(
                    entry(kernel, Some(RedOp::Max), DataType::Int32),
                    entry(kernel, Some(RedOp::Max), DataType::Uint32)
                );
            }
            let premul = Some(RedOp::PreMulSum(Scalar::Immediate(3)));
            assert!(matches!(
                entry(Kernel::ScalePreMulSum, premul, DataType::Int64),
                Entry::Built {
                    name: "mscclpp_scale_premulsum_u64",
                    unit: "u64"
                }
            ));
        }
    }

    #[test]
    fn the_filter_builds_only_its_types_and_the_library_refuses_the_rest_naming_it() {
        assert_eq!(
            parse_types_filter("f32, bf16,f32"),
            Ok(vec![DataType::Float32, DataType::Bfloat16])
        );
        let bad = parse_types_filter("f32,float").unwrap_err();
        assert!(
            bad.contains("LIBMSCCLPP_KERNEL_TYPES=f32,float") && bad.contains("\"float\""),
            "{bad}"
        );
        assert!(
            bad.contains("i8,u8,i32,u32,i64,u64,f16,f32,f64,bf16,f8e4m3,f8e5m2"),
            "{bad}"
        );
        assert!(parse_types_filter(" , ").is_err());

        // f32 alone: its unit and the moving one.
        let f32_only = entry_points(&[DataType::Float32]);
        let units: HashSet<&str> = f32_only.iter().map(|v| v.unit()).collect();
        assert_eq!(units, HashSet::from(["f32", MOVING_UNIT]));
        assert_eq!(f32_only.len(), 14 + 40);
        // i32 alone: its sums, products and PreMulSums are compiled in the u32 unit, the rest in its own.
        let i32_only = entry_points(&[DataType::Int32]);
        assert_eq!(i32_only.iter().filter(|v| v.unit() == "u32").count(), 19);
        assert_eq!(i32_only.iter().filter(|v| v.unit() == "i32").count(), 21);
        // Both: the folded ones once.
        assert_eq!(entry_points(&[DataType::Int32, DataType::Uint32]).len(), 14 + 21 + 40);

        let refused = entry_point(
            Entry::LeftOut,
            Kernel::AllReduceRsag,
            Some(RedOp::Max),
            DataType::Float64,
            Some("f32,bf16"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("without the f64 kernels (LIBMSCCLPP_KERNEL_TYPES=f32,bf16 when it was built)"),
            "{refused}"
        );
        let absent = entry_point(
            Entry::Absent,
            Kernel::AllReduceZc,
            Some(RedOp::Sum),
            DataType::Float32,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(absent.contains("AllReduceZc") && absent.contains("sum"), "{absent}");
        let built = Entry::Built {
            name: "mscclpp_allgather_copy",
            unit: MOVING_UNIT,
        };
        assert_eq!(
            entry_point(built, Kernel::AllGatherCopy, None, DataType::Uint8, Some("f32")).unwrap(),
            ("mscclpp_allgather_copy", MOVING_UNIT)
        );
        // The variable's name is the one build.rs reads.
        assert_eq!(variants::TYPES_FILTER, "LIBMSCCLPP_KERNEL_TYPES");
    }
}
