//! The collective kernels embedded in the library (fatbins that build.rs compiled from
//! `kernels/collectives/`), and the ones loaded into a communicator's context, each module at the first
//! call that needs one of its kernels.

use super::algorithm::resident_share;
use super::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::gpu::{GpuContext, Kernel, Module, RelaxedCapture};
use std::collections::HashMap;

mod embedded {
    // `FATBINS: &[(&str, &[u8])]`: one fatbin per element type (named as `DataType::kernel_name`) and
    // `moving`, for the collectives that only move bytes.
    include!(concat!(env!("OUT_DIR"), "/collective_kernels.rs"));
}

/// The name of the fatbin that holds the kernels of a collective of `datatype` (reducing) or of any type.
fn unit_of(op: Option<RedOp>, datatype: DataType) -> &'static str {
    match op {
        Some(_) => datatype.kernel_name(),
        None => "moving",
    }
}

/// The fatbin named `unit`, if this build has it.
pub fn fatbin(unit: &str) -> Option<&'static [u8]> {
    embedded::FATBINS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, bytes)| *bytes)
}

/// The entry point of an algorithm (`algorithm::kernel_base`, or `ONE_RANK_PREMULSUM`) for an operator and
/// type.
pub fn kernel_name(base: &str, op: Option<RedOp>, datatype: DataType) -> String {
    match op {
        Some(op) => format!("mscclpp_{base}_{}_{}", op.kernel_name(), datatype.kernel_name()),
        None => format!("mscclpp_{base}"),
    }
}

/// A kernel ready to launch, and the most blocks a launch of it may have.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    pub kernel: Kernel,
    /// This rank's share of the blocks of the kernel the GPU holds at once (`algorithm::resident_share`).
    pub max_blocks: u32,
}

/// The kernel of one rank's `PreMulSum` (`mscclpp_scale_premulsum_<type>`): each element of the input times
/// the scalar (the other operators of one rank are a copy).
pub const ONE_RANK_PREMULSUM: &str = "scale";

/// An entry point: the algorithm, and the operator's kernel name and the type where it reduces (the kernels
/// that only move bytes serve every type; a `PreMulSum`'s serves every scalar).
type KernelKey = (&'static str, Option<(&'static str, DataType)>);

fn key(base: &'static str, op: Option<RedOp>, datatype: DataType) -> KernelKey {
    (base, op.map(|op| (op.kernel_name(), datatype)))
}

/// The modules and kernels loaded into one context.
pub struct LoadedKernels {
    gpu: GpuContext,
    /// What `algorithm::resident_share` needs besides the kernel: the fewest multiprocessors of any rank's
    /// context and the most ranks on one GPU (`Scratch`'s).
    multiprocessors: u32,
    gpu_sharers: usize,
    // Kernels are declared before the modules that hold them. Keyed as `key` makes it, so that a call
    // finds its kernel without formatting its name.
    kernels: HashMap<KernelKey, LoadedKernel>,
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
    fn needs_loading(&self, base: &'static str, op: Option<RedOp>, datatype: DataType) -> bool {
        !self.kernels.contains_key(&key(base, op, datatype))
    }

    /// `get`, from a launch path that may be capturing a graph: a first kernel of its type loads a module,
    /// which a capture allows only in the relaxed mode, entered for the load alone.
    pub fn get_capturing(
        &mut self,
        capturing: bool,
        base: &'static str,
        op: Option<RedOp>,
        datatype: DataType,
        threads: u32,
    ) -> Result<LoadedKernel> {
        let _relaxed = (capturing && self.needs_loading(base, op, datatype))
            .then(RelaxedCapture::enter)
            .transpose()?;
        self.get(base, op, datatype, threads)
    }

    /// The kernel of an algorithm for an operator and type, loading its module first if needed; its
    /// occupancy, for blocks of `threads` (the same for every launch of `base`), and the share of blocks it
    /// gives are worked out once. A share below one block is an error here, before any launch.
    pub fn get(
        &mut self,
        base: &'static str,
        op: Option<RedOp>,
        datatype: DataType,
        threads: u32,
    ) -> Result<LoadedKernel> {
        if let Some(k) = self.kernels.get(&key(base, op, datatype)) {
            return Ok(*k);
        }
        let name = kernel_name(base, op, datatype);
        let unit = unit_of(op, datatype);
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
        let kernel = self.modules[unit].kernel(&name)?;
        let per_multiprocessor = kernel.blocks_per_multiprocessor(threads)?;
        // A grid the GPU cannot hold beside the other ranks' would hang.
        let max_blocks = resident_share(&name, self.multiprocessors, per_multiprocessor, self.gpu_sharers)?;
        let loaded = LoadedKernel { kernel, max_blocks };
        log::info!(
            "{name}: {per_multiprocessor} blocks of {threads} threads per multiprocessor, at most {max_blocks} a launch"
        );
        self.kernels.insert(key(base, op, datatype), loaded);
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::algorithm::{Protocol, kernel_base};
    use crate::collective::{Collective, DataType, Scalar};

    /// The names a fatbin's symbol table holds (nvcc keeps entry-point names in the ELF images it embeds).
    fn holds(image: &[u8], name: &str) -> bool {
        let needle = format!("{name}\0");
        image.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    /// Fails, never skips, where the build found nvcc (as `make`'s always does): a build without every kernel
    /// is broken. Skipped only where the build found none (`cfg(built_without_nvcc)`, set by build.rs).
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
        for c in Collective::ALL {
            for p in [Protocol::Packet, Protocol::Copy] {
                let base = kernel_base(c, p);
                let reduces = matches!(
                    c,
                    Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
                );
                for t in DataType::ALL {
                    let ops: Vec<Option<RedOp>> = if reduces {
                        RedOp::BUILT_IN
                            .iter()
                            .copied()
                            .chain([RedOp::PreMulSum(Scalar::Immediate(0))])
                            .map(Some)
                            .collect()
                    } else {
                        vec![None]
                    };
                    for op in ops {
                        let image = fatbin(unit_of(op, t)).expect("a fatbin per type and one for moving");
                        let name = kernel_name(base, op, t);
                        assert!(holds(image, &name), "{name} is not in the {} fatbin", unit_of(op, t));
                    }
                }
            }
        }
        // One rank's PreMulSum, for every type.
        for t in DataType::ALL {
            let op = Some(RedOp::PreMulSum(Scalar::Device(0)));
            let name = kernel_name(ONE_RANK_PREMULSUM, op, t);
            assert!(holds(fatbin(unit_of(op, t)).unwrap(), &name), "{name} is not embedded");
        }
        // Send and receive: one kernel for bytes of any type.
        let moving = fatbin(unit_of(None, DataType::Uint8)).expect("the moving fatbin");
        assert!(
            holds(moving, &kernel_name("send_recv", None, DataType::Uint8)),
            "mscclpp_send_recv is not in the moving fatbin"
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

    #[test]
    fn names() {
        assert_eq!(
            kernel_name("allreduce_packet", Some(RedOp::Avg), DataType::Bfloat16),
            "mscclpp_allreduce_packet_avg_bf16"
        );
        assert_eq!(
            kernel_name("broadcast_copy", None, DataType::Int8),
            "mscclpp_broadcast_copy"
        );
        assert_eq!(unit_of(None, DataType::Float32), "moving");
        assert_eq!(unit_of(Some(RedOp::Sum), DataType::Float32), "f32");
        let premul = RedOp::PreMulSum(Scalar::Immediate(0x3f00_0000));
        assert_eq!(
            kernel_name("reducescatter_copy", Some(premul), DataType::Float32),
            "mscclpp_reducescatter_copy_premulsum_f32"
        );
        assert_eq!(
            kernel_name("allreduce_rsag", Some(RedOp::Max), DataType::Float8e4m3),
            "mscclpp_allreduce_rsag_max_f8e4m3"
        );
        assert_eq!(
            kernel_name(ONE_RANK_PREMULSUM, Some(premul), DataType::Float8e5m2),
            "mscclpp_scale_premulsum_f8e5m2"
        );
        assert_eq!(unit_of(Some(premul), DataType::Float8e5m2), "f8e5m2");
        // Every scalar finds the one kernel its operator and type have.
        let other = RedOp::PreMulSum(Scalar::Device(0x1000));
        assert_eq!(
            key("allreduce_packet", Some(premul), DataType::Bfloat16),
            key("allreduce_packet", Some(other), DataType::Bfloat16)
        );
        assert_ne!(
            key("allreduce_packet", Some(premul), DataType::Bfloat16),
            key("allreduce_packet", Some(RedOp::Sum), DataType::Bfloat16)
        );
    }
}
