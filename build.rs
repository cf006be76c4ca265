//! Build script of libmscclpp:
//!
//! 1. Generates the public headers `mscclpp.h` and `mscclppfifo.h` into `build/include/` (beside
//!    `Cargo.toml`). Each is a template from `include/*.h.in` in which a line
//!    - `@CBINDGEN structs@` becomes cbindgen's plain structs (tag style: `struct X { ... };`),
//!    - `@CBINDGEN api@` becomes cbindgen's enums, typedefs and function declarations (type style:
//!      `typedef enum { ... } X;`, as the legacy header writes them),
//!    - `@SPLICE path@` becomes the file at `path` (the device code in `kernels/`).
//!
//!    cbindgen reads `src/types.rs` and `src/mscclpp_abi/*.rs` with the settings in `cbindgen.toml`.
//! 2. Compiles the library's small C++ part (`src/cxx/*.cpp`) against those headers.
//! 3. Compiles the library's own collective kernels (`kernels/collectives/`) with nvcc into one fatbin per
//!    element type (and one for the kernels that only move bytes), in parallel, for sm_80 and sm_90 with
//!    PTX, cached by content under `target/kernel-cache/`; `src/collective/kernels.rs` embeds them. The
//!    units, their entry points and the library's table of them are generated from `kernels/variants.rs`,
//!    the device side's `CollArgs` from `kernels/coll_args.rs`; `LIBMSCCLPP_KERNEL_TYPES` builds only
//!    some types' kernels (while developing: docs/building.md).
//! 4. Hands the commit the library is built from to the compiler (`LIB_BUILD_COMMIT`, `unknown` outside
//!    a git checkout): the library keeps it as `libmscclpp build commit <hash>;` in its read-only data, where
//!    a benchmark finds which build it measured, and logs it at INFO.
//! 5. Gives the shared library its soname, `libmscclpp.so.0`: the core, with both faces (NCCL's functions
//!    under the prefix `mscclpp_nccl_face_`). The Makefile builds the thin `libnccl.so.2` over it
//!    (`scripts/nccl-face.sh`), so that the crate and its kernels are compiled and embedded once.

use cbindgen::{ItemType, Style};
use std::fs;
use std::path::{Path, PathBuf};

/// Templates in `include/` and the headers made from them.
const HEADERS: [(&str, &str); 2] = [
    ("include/mscclpp.h.in", "mscclpp.h"),
    ("include/mscclppfifo.h.in", "mscclppfifo.h"),
];

/// Where the headers go, relative to the crate root; the Makefile lays the rest of `build/` out around it.
const INCLUDE_OUT: &str = "build/include";

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    for input in [
        "build.rs",
        "cbindgen.toml",
        "include",
        "kernels",
        "src/types.rs",
        "src/mscclpp_abi",
        "src/cxx",
    ] {
        println!("cargo:rerun-if-changed={input}");
    }
    let cxx_dir = root.join("src/cxx");

    let out_dir = root.join(INCLUDE_OUT);
    fs::create_dir_all(&out_dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", out_dir.display()));
    let structs = cbindgen_section(&root, Style::Tag, vec![ItemType::Structs]);
    let api = cbindgen_section(
        &root,
        Style::Type,
        vec![ItemType::Enums, ItemType::Typedefs, ItemType::Functions],
    );
    check_functions(&api);
    for (template, header) in HEADERS {
        let text = render(&root, template, &structs, &api);
        let path = out_dir.join(header);
        if write_if_changed(&path, &text) {
            stamp_as_of_script_start(&path);
        }
        // Regenerate if the output is removed (for example by `make clean`) while target/ survives.
        println!("cargo:rerun-if-changed={INCLUDE_OUT}/{header}");
    }

    // After the headers are written: the C++ part includes mscclpp.h for its structs.
    compile_cxx(&cxx_dir, &out_dir);

    compile_collective_kernels(&root);

    embed_build_commit(&root);

    // Legacy programs link against libmscclpp.so.0; the Makefile installs the library as
    // libmscclpp.so.0.1.0 with the links libmscclpp.so.0 and libmscclpp.so. Programs and PyTorch built
    // for NCCL need libnccl.so.2 (build/lib/nccl/), the thin library that needs this one.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmscclpp.so.0");
}

/// The legacy header's functions that cbindgen declares (the other two are declared by hand).
const LEGACY_FUNCTIONS: [&str; 18] = [
    "mscclppGetUniqueId",
    "mscclppCommInitRank",
    "mscclppCommInitRankFromId",
    "mscclppBootstrapAllGather",
    "mscclppBootstrapBarrier",
    "mscclppCommDestroy",
    "mscclppConnectionSetup",
    "mscclppGetAllDeviceConnections",
    "mscclppGetDeviceConnection",
    "mscclppProxyLaunch",
    "mscclppProxyStop",
    "mscclppCommRank",
    "mscclppCommSize",
    "mscclppSetBootstrapConnTimeout",
    "mscclppDefaultLogHandler",
    "mscclppSetLogHandler",
    "mscclppRegisterBuffer",
    "mscclppRegisteredBufferWrite",
];

/// Functions of ours beyond the legacy header (each documented as an extension in the header).
const EXTENSION_FUNCTIONS: [&str; 4] = [
    "mscclppCommAbort",
    "mscclppCommGetAsyncError",
    "mscclppCommRegister",
    "mscclppCommDeregister",
];

/// Warns when the generated declarations are not exactly the legacy set and our extensions: every exported
/// `extern "C"` function in `src/mscclpp_abi/` lands in the public header, so a helper exported by mistake (or a
/// missing one) shows here.
fn check_functions(api: &str) {
    let declared: Vec<&str> = api
        .lines()
        .filter(|line| !line.starts_with(' ') && !line.starts_with("//") && !line.starts_with("typedef"))
        .filter_map(|line| line.split_once('(').map(|(head, _)| head))
        .filter_map(|head| head.rsplit([' ', '*']).next())
        .filter(|name| !name.is_empty())
        .collect();
    for name in &declared {
        if !LEGACY_FUNCTIONS.contains(name) && !EXTENSION_FUNCTIONS.contains(name) {
            println!(
                "cargo:warning=mscclpp.h declares {name}, which the legacy header does not have and which is \
                 not among the extensions"
            );
        }
    }
    for name in LEGACY_FUNCTIONS.iter().chain(&EXTENSION_FUNCTIONS) {
        if !declared.contains(name) {
            println!("cargo:warning=mscclpp.h lacks {name}: no exported function of that name in src/mscclpp_abi/");
        }
    }
}

/// Runs cbindgen over the ABI sources for one kind of item, in one declaration style.
fn cbindgen_section(root: &Path, style: Style, items: Vec<ItemType>) -> String {
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cannot read cbindgen.toml: {e}"));
    config.style = style;
    config.export.item_types = items;

    let mut builder = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/types.rs"));
    // cbindgen follows `mod` items, so the face's root brings in all of its files once.
    builder = builder.with_src(root.join("src/mscclpp_abi/mod.rs"));
    let bindings = builder.generate().unwrap_or_else(|e| panic!("cbindgen failed: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    let text = String::from_utf8(out).expect("cbindgen writes UTF-8");
    drop_safety_sections(&text).trim_matches('\n').to_string()
}

/// Rust doc comments carry a `# Safety` section for Rust callers; C readers need only what comes before it.
/// cbindgen writes each doc comment as a run of `//` lines, so a section runs to the end of that run.
fn drop_safety_sections(text: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut skipping = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed == "// # Safety" {
            skipping = true;
            // The blank comment line that separated the section from the rest.
            if kept.last().is_some_and(|prev| prev.trim() == "//") {
                kept.pop();
            }
            continue;
        }
        if skipping && trimmed.starts_with("//") {
            continue;
        }
        skipping = false;
        kept.push(line);
    }
    let mut out = kept.join("\n");
    out.push('\n');
    out
}

/// Fills in one template's directives.
fn render(root: &Path, template: &str, structs: &str, api: &str) -> String {
    let source = fs::read_to_string(root.join(template)).unwrap_or_else(|e| panic!("cannot read {template}: {e}"));
    let mut out = String::with_capacity(source.len() + structs.len() + api.len());
    for (number, line) in source.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(directive) = trimmed.strip_prefix('@').and_then(|rest| rest.strip_suffix('@')) {
            match directive.split_once(' ') {
                Some(("CBINDGEN", "structs")) => out.push_str(structs),
                Some(("CBINDGEN", "api")) => out.push_str(api),
                Some(("SPLICE", path)) => {
                    let spliced = fs::read_to_string(root.join(path))
                        .unwrap_or_else(|e| panic!("{template}:{}: cannot read {path}: {e}", number + 1));
                    out.push_str(without_file_note(&spliced).trim_end_matches('\n'));
                }
                _ => panic!("{template}:{}: unknown directive {trimmed}", number + 1),
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// Drops the first comment paragraph of a spliced file: it describes the file, not the code.
fn without_file_note(text: &str) -> &str {
    let mut rest = text;
    while rest.starts_with("//") {
        rest = rest.split_once('\n').map_or("", |(_, tail)| tail);
    }
    rest.strip_prefix('\n').unwrap_or(rest)
}

/// Replaces `path` only when its contents change, so that the Makefile does not rebuild every C and CUDA
/// program after each cargo run; the rename keeps concurrent cargo runs from seeing half a header. Says
/// whether it wrote.
fn write_if_changed(path: &Path, text: &str) -> bool {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return false;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    fs::write(&tmp, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot rename onto {}: {e}", path.display()));
    true
}

/// A header this script writes is also watched (`rerun-if-changed`, so that a removed one is made again).
/// Written now, it would look changed after the script started, and cargo would run the script, and rebuild
/// the crate, once more at the next build (the first `make test` after a fresh `make` did). So it gets the
/// time cargo started the script: that of `invoked.timestamp`, which cargo writes beside OUT_DIR just
/// before it runs the script. Still later than every program built before this run, so make rebuilds those
/// that include it. Where that file is not found, the header keeps the time it was written.
fn stamp_as_of_script_start(path: &Path) {
    let started = std::env::var_os("OUT_DIR")
        .map(PathBuf::from)
        .and_then(|out| out.parent().map(|dir| dir.join("invoked.timestamp")))
        .and_then(|stamp| fs::metadata(stamp).ok())
        .and_then(|meta| meta.modified().ok());
    if let Some(time) = started
        && let Ok(file) = fs::File::options().write(true).open(path)
    {
        let _ = file.set_modified(time);
    }
}

/// Compiles `src/cxx/*.cpp` into the library (they see the generated headers) and links the C++ runtime.
fn compile_cxx(cxx_dir: &Path, include_dir: &Path) {
    let mut sources: Vec<PathBuf> = fs::read_dir(cxx_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", cxx_dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cpp"))
        .collect();
    sources.sort();
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(include_dir)
        .warnings(true)
        .extra_warnings(true)
        .cpp_link_stdlib("stdc++")
        .files(&sources)
        .compile("mscclpp_cxx");
}

/// The GPUs the kernels are built for: machine code for Ampere and Hopper, and Hopper's PTX for later GPUs.
const KERNEL_TARGETS: [&str; 4] = [
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=[sm_90,compute_90]",
];

/// Where nvcc is looked for when `NVCC` is unset: the one `make` installs, then CUDA's usual place.
fn nvcc_places(root: &Path) -> [PathBuf; 2] {
    [
        root.join(".toolchain/cuda/nvidia/cu13/bin/nvcc"),
        PathBuf::from("/usr/local/cuda/bin/nvcc"),
    ]
}

/// nvcc: `$NVCC` (the Makefile sets it), else the first of `nvcc_places` that exists.
fn find_nvcc(root: &Path) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=NVCC");
    if let Some(nvcc) = std::env::var_os("NVCC").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(nvcc));
    }
    nvcc_places(root).into_iter().find(|p| p.is_file())
}

/// A line of progress for whoever runs the build. Cargo shows a build script's output only when it fails (or
/// with `-vv`), so the line goes
/// - to the file `LIBMSCCLPP_BUILD_PROGRESS` names, where that is set: the Makefile sets it and prints the
///   file as it grows (`scripts/with-build-progress.sh`), so that `make` shows each line when it is written,
///   whether make's output is a terminal, a pipe or a log file. The variable is not declared to cargo
///   (`rerun-if-env-changed`): whether it is set changes nothing that is built;
/// - else to cargo's own standard error, where that is a terminal (clearing cargo's progress bar first) or a
///   pipe; never to a file, which opening again would write at the wrong offset.
fn progress(line: &str) {
    use std::io::Write;
    use std::os::unix::fs::FileTypeExt;
    if let Some(file) = std::env::var_os("LIBMSCCLPP_BUILD_PROGRESS").filter(|v| !v.is_empty()) {
        if let Ok(mut f) = fs::OpenOptions::new().append(true).create(true).open(&file) {
            let _ = writeln!(f, "{line}");
        }
        return;
    }
    let path = format!("/proc/{}/fd/2", std::os::unix::process::parent_id());
    let Ok(meta) = fs::metadata(&path) else {
        return;
    };
    let kind = meta.file_type();
    if !(kind.is_char_device() || kind.is_fifo()) {
        return;
    }
    if let Ok(mut f) = fs::OpenOptions::new().append(true).open(&path) {
        let clear = if kind.is_char_device() { "\r\x1b[2K" } else { "" };
        let _ = writeln!(f, "{clear}{line}");
    }
}

/// How long the kernels' compile may go without a progress line: a unit can take longer than this, so a
/// line saying which units are still compiling comes at least this often.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(20);

/// The units still compiling, for a progress line: `f8e4m3, f8e5m2`.
fn unit_names_of(running: &[(&Unit, std::process::Child, std::time::Instant)]) -> String {
    running
        .iter()
        .map(|(unit, _, _)| unit.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernel variants' table, which the library reads too (`collective::variants`).
#[allow(dead_code)]
mod variants {
    include!("kernels/variants.rs");
}
use variants::{DataType, Kernel, Op, TYPES_FILTER, Variant};

/// The collectives' kernel argument, defined once (`collective::kernel_args` reads it too).
#[allow(dead_code)]
mod coll_args {
    type DevicePtr = u64;
    include!("kernels/coll_args.rs");
}

/// The types `LIBMSCCLPP_KERNEL_TYPES` names, with its value, where it is set and not empty.
fn types_filter() -> Option<(String, Vec<DataType>)> {
    println!("cargo:rerun-if-env-changed={TYPES_FILTER}");
    let value = std::env::var(TYPES_FILTER).ok().filter(|v| !v.trim().is_empty())?;
    let types = variants::parse_types_filter(&value).unwrap_or_else(|e| panic!("{e}"));
    Some((value, types))
}

/// `coll_args.cuh`: the device side's `CollArgs`, declared from `KernelArgs::FIELDS` in their order, each
/// field's offset and size asserted as Rust lays them out.
fn coll_args_header() -> String {
    use coll_args::{KernelArgs, MAX_BLOCKS, MAX_RANKS, c_field_name};
    let mut text = String::from(
        "// Generated by build.rs from kernels/coll_args.rs, where the library's KernelArgs is defined: edit that.\n\
         #pragma once\n\n#include <stddef.h>\n#include <stdint.h>\n\n",
    );
    text.push_str(&format!(
        "#define MSCCLPP_COLL_MAX_RANKS {MAX_RANKS}\n#define MSCCLPP_COLL_MAX_BLOCKS {MAX_BLOCKS}\n\n"
    ));
    text.push_str("// The one argument of every collective kernel (KernelArgs).\nstruct CollArgs {\n");
    for field in KernelArgs::FIELDS {
        for line in field.doc {
            text.push_str(&format!("  //{line}\n"));
        }
        let (c_type, array) = match field.c_type.split_once('[') {
            Some((c_type, count)) => (c_type.trim_end(), format!("[{count}")),
            None => (field.c_type, String::new()),
        };
        text.push_str(&format!("  {c_type} {}{array};\n", c_field_name(field.name)));
    }
    text.push_str("};\n\n");
    for field in KernelArgs::FIELDS {
        let name = c_field_name(field.name);
        text.push_str(&format!(
            "static_assert(offsetof(CollArgs, {name}) == {} && sizeof(CollArgs::{name}) == {}, \"CollArgs::{name} is \
             not laid out as KernelArgs::{}\");\n",
            field.offset, field.size, field.name
        ));
    }
    text.push_str(&format!(
        "static_assert(sizeof(CollArgs) == {}, \"CollArgs is not the size of KernelArgs\");\n",
        std::mem::size_of::<KernelArgs>()
    ));
    text
}

/// The translation unit `unit` of `entries` (`variants::entry_points`): an entry point for each of them that
/// it holds.
fn unit_text(unit: &str, entries: &[Variant]) -> String {
    let mut text = format!(
        "// Generated by build.rs from kernels/variants.rs: the {unit} unit of the collectives' kernels.\n\
         #include \"kernels.cuh\"\n\n"
    );
    if let Some(datatype) = DataType::from_kernel_name(unit) {
        text.push_str(&format!(
            "static_assert(sizeof({0}) == {1}, \"{0} is not of {1} bytes\");\n\n",
            datatype.c_type(),
            datatype.size()
        ));
    }
    for variant in entries.iter().filter(|v| v.unit() == unit) {
        let spec = variant.kernel.spec();
        let body = match variant.reducing {
            Some((op, datatype)) => spec
                .body
                .replace("{T}", datatype.c_type())
                .replace("{Op}", op.functor()),
            None => spec.body.to_string(),
        };
        text.push_str(&format!(
            "extern \"C\" __global__ void {} {}({})\n{{\n  {body}(args);\n}}\n",
            spec.bounds,
            variant.entry_name(),
            spec.param
        ));
    }
    text
}

/// The library's table of entry points (`collective::kernels` includes it): for each kernel, operator and
/// type, the entry point that serves it and its unit, `LeftOut` where `LIBMSCCLPP_KERNEL_TYPES` left its type
/// out (`types`), `Absent` where the kernel has no such variant.
fn entry_table(types: &[DataType], filter: Option<&str>) -> String {
    let entry = |variant: Option<Variant>| match variant {
        None => "Entry::Absent".to_string(),
        Some(v) => format!("Entry::Built {{ name: {:?}, unit: {:?} }}", v.entry_name(), v.unit()),
    };
    let mut text = format!(
        "/// `{TYPES_FILTER}` when this library was built (`None`: unset, every type's kernels compiled).\n\
         pub const TYPES_FILTER_VALUE: Option<&str> = {filter:?};\n\n\
         /// The entry point of each reducing kernel, operator and type: `REDUCING[kernel][op][type]`.\n\
         pub static REDUCING: [[[Entry; {}]; {}]; {}] = [\n",
        DataType::ALL.len(),
        Op::ALL.len(),
        Kernel::ALL.len()
    );
    for kernel in Kernel::ALL {
        text.push_str(&format!("    // {kernel:?}\n    [\n"));
        for op in Op::ALL {
            text.push_str("        [\n");
            for datatype in DataType::ALL {
                let served = kernel.serving(Some((op, datatype)));
                let slot = if served.is_some() && !types.contains(&datatype) {
                    "Entry::LeftOut".to_string()
                } else {
                    entry(served)
                };
                text.push_str(&format!("            {slot},\n"));
            }
            text.push_str("        ],\n");
        }
        text.push_str("    ],\n");
    }
    text.push_str(&format!(
        "];\n\n/// The entry point of each kernel that only moves bytes, for every type: `MOVING[kernel]`.\n\
         pub static MOVING: [Entry; {}] = [\n",
        Kernel::ALL.len()
    ));
    for kernel in Kernel::ALL {
        text.push_str(&format!("    {},\n", entry(kernel.serving(None))));
    }
    text.push_str("];\n");
    text
}

/// A unit to compile: its name, its source, and where its fatbin is cached.
struct Unit {
    name: String,
    text: String,
    fatbin: PathBuf,
}

/// Compiles `kernels/collectives/` into fatbins, one per unit of the entry points `kernels/variants.rs`
/// gives (`variants::entry_points`, for the types `LIBMSCCLPP_KERNEL_TYPES` names, every type where it is
/// unset), and writes `collective_kernels.rs` into OUT_DIR: the list of (unit name, fatbin bytes) and the
/// table of entry points (`entry_table`). The device side's `CollArgs` is written first
/// (`coll_args_header`). Without nvcc the list is empty and the library says so when a collective is called;
/// the crate is then compiled with `cfg(built_without_nvcc)` and `LIB_NVCC_LOOKED_FOR` (the places looked at,
/// `:`-separated), so that its kernel test says it has nothing to check instead of failing, and fails where
/// nvcc has appeared at one of those places since. Where nvcc was found, a build without every kernel of its
/// table fails that test.
fn compile_collective_kernels(root: &Path) {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let list = out_dir.join("collective_kernels.rs");
    println!("cargo:rustc-check-cfg=cfg(built_without_nvcc)");
    let filter = types_filter();
    let types = filter
        .as_ref()
        .map_or(DataType::ALL.to_vec(), |(_, types)| types.clone());
    let entries = variants::entry_points(&types);
    let table = entry_table(&types, filter.as_ref().map(|(value, _)| value.as_str()));
    // Written with or without nvcc: the library's tests read it (`kernel_args`).
    let generated = out_dir.join("kernels-include");
    fs::create_dir_all(&generated).unwrap_or_else(|e| panic!("cannot create {}: {e}", generated.display()));
    let header = coll_args_header();
    write_if_changed(&generated.join("coll_args.cuh"), &header);
    let Some(nvcc) = find_nvcc(root) else {
        println!(
            "cargo:warning=nvcc not found (set NVCC, or run make): the library is built without its collective \
             kernels, and mscclppAllReduce and the other collectives will fail saying so"
        );
        println!("cargo:rustc-cfg=built_without_nvcc");
        let places: Vec<String> = nvcc_places(root).iter().map(|p| p.display().to_string()).collect();
        println!("cargo:rustc-env=LIB_NVCC_LOOKED_FOR={}", places.join(":"));
        write_if_changed(
            &list,
            &format!("pub static FATBINS: &[(&str, &[u8])] = &[];\n\n{table}"),
        );
        return;
    };
    let source_dir = root.join("kernels/collectives");

    let mut flags: Vec<String> = ["-fatbin", "-std=c++17", "-O3"].iter().map(|s| s.to_string()).collect();
    flags.extend(KERNEL_TARGETS.iter().map(|s| s.to_string()));
    flags.push(format!("-I{}", source_dir.display()));
    // CCCL's headers (cuda_fp16.h, cuda_bf16.h and cuda_fp8.h include <nv/target>), where this nvcc keeps them
    // apart.
    if let Some(cccl) = nvcc
        .parent()
        .map(|bin| bin.join("../include/cccl"))
        .filter(|p| p.is_dir())
    {
        flags.push(format!("-I{}", cccl.display()));
    }

    // The cache key: the compiler, the flags, every device source and the generated header (not the folder
    // it is in: that is the build's own, and the libnccl build must find the main build's fatbins); each
    // unit's fatbin is named by its name and source as well, so that a build with a filter and one without
    // share the units they have alike.
    use std::hash::{Hash, Hasher};
    let mut key = std::collections::hash_map::DefaultHasher::new();
    nvcc.hash(&mut key);
    fs::metadata(&nvcc).ok().and_then(|m| m.modified().ok()).hash(&mut key);
    flags.hash(&mut key);
    header.hash(&mut key);
    let mut sources: Vec<PathBuf> = fs::read_dir(&source_dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", source_dir.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .collect();
    sources.sort();
    for path in &sources {
        path.file_name().hash(&mut key);
        fs::read(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
            .hash(&mut key);
    }
    flags.push(format!("-I{}", generated.display()));
    // Under the crate root's target/, whatever the target directory: the libnccl build (target/nccl) finds
    // the kernels the main build compiled.
    let cache = root.join("target/kernel-cache").join(format!("{:016x}", key.finish()));
    fs::create_dir_all(&cache).unwrap_or_else(|e| panic!("cannot create {}: {e}", cache.display()));

    let unit_names = DataType::ALL
        .iter()
        .map(|t| t.kernel_name())
        .chain([variants::MOVING_UNIT]);
    let units: Vec<Unit> = unit_names
        .filter(|name| entries.iter().any(|v| v.unit() == *name))
        .map(|name| {
            let text = unit_text(name, &entries);
            let mut unit_key = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut unit_key);
            let fatbin = cache.join(format!("{name}-{:016x}.fatbin", unit_key.finish()));
            Unit {
                name: name.to_string(),
                text,
                fatbin,
            }
        })
        .collect();

    // Compile what the cache lacks, as many units at a time as cargo allows jobs, each starting as soon as
    // one ends (units take unequal times: the fp8 ones, emulated on sm_80, are among the longest).
    let jobs: usize = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(2)
        .max(1);
    let to_compile = units.iter().filter(|u| !u.fatbin.is_file()).count();
    let started = std::time::Instant::now();
    if to_compile > 0 {
        let only = filter
            .as_ref()
            .map_or(String::new(), |(value, _)| format!(", only {TYPES_FILTER}={value}"));
        progress(&format!(
            "mscclpp build: compiling the collectives' CUDA kernels with nvcc: {to_compile} of {} units ({} entry \
             points{only}), {jobs} at a time (about 4 minutes on 2 cores; then cached in target/kernel-cache/)",
            units.len(),
            entries.len()
        ));
    }
    let mut missing = units.iter().filter(|u| !u.fatbin.is_file());
    let mut running: Vec<(&Unit, std::process::Child, std::time::Instant)> = Vec::new();
    let mut done = 0;
    let mut last_line = std::time::Instant::now();
    loop {
        while running.len() < jobs
            && let Some(unit) = missing.next()
        {
            let source = out_dir.join(format!("collectives_{}.cu", unit.name));
            fs::write(&source, &unit.text).unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));
            let child = std::process::Command::new(&nvcc)
                .args(&flags)
                .arg(&source)
                .arg("-o")
                .arg(unit.fatbin.with_extension("fatbin.partial"))
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
            running.push((unit, child, std::time::Instant::now()));
        }
        if running.is_empty() {
            break;
        }
        // The first unit to end; while none does, a line at least every PROGRESS_EVERY.
        let (i, status) = loop {
            let ended = running.iter_mut().enumerate().find_map(|(i, (unit, child, _))| {
                let status = child
                    .try_wait()
                    .unwrap_or_else(|e| panic!("nvcc for {}: {e}", unit.name));
                status.map(|s| (i, s))
            });
            if let Some(e) = ended {
                break e;
            }
            if last_line.elapsed() >= PROGRESS_EVERY {
                progress(&format!(
                    "mscclpp build: kernels: {done} of {to_compile} units done, compiling {} ({:.0} s so far)",
                    unit_names_of(&running),
                    started.elapsed().as_secs_f64()
                ));
                last_line = std::time::Instant::now();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let (unit, _, unit_started) = running.swap_remove(i);
        assert!(
            status.success(),
            "nvcc failed on the {} collective kernels ({status})",
            unit.name
        );
        let partial = unit.fatbin.with_extension("fatbin.partial");
        fs::rename(&partial, &unit.fatbin).unwrap_or_else(|e| panic!("cannot rename {}: {e}", partial.display()));
        done += 1;
        progress(&format!(
            "mscclpp build: kernels: {} compiled in {:.0} s ({done} of {to_compile} units, {:.0} s so far)",
            unit.name,
            unit_started.elapsed().as_secs_f64(),
            started.elapsed().as_secs_f64()
        ));
        last_line = std::time::Instant::now();
    }

    if to_compile > 0 {
        progress(&format!(
            "mscclpp build: the collectives' CUDA kernels compiled in {:.0} s",
            started.elapsed().as_secs_f64()
        ));
    }

    let mut text = String::from("pub static FATBINS: &[(&str, &[u8])] = &[\n");
    for unit in &units {
        text.push_str(&format!(
            "    ({:?}, include_bytes!({:?})),\n",
            unit.name,
            unit.fatbin.display().to_string()
        ));
    }
    text.push_str("];\n\n");
    text.push_str(&table);
    write_if_changed(&list, &text);
}

/// `LIB_BUILD_COMMIT` for the crate (no `MSCCLPP_` name: those are the run-time settings): HEAD's commit
/// (12 hex digits), or `unknown` where git or the checkout is missing. The script runs again when HEAD
/// moves: on a commit to its branch, or another checkout (only files that exist are watched: a missing one
/// would make cargo run it every time).
fn embed_build_commit(root: &Path) {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
        watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    for path in watched.into_iter().flatten().map(|p| root.join(p)) {
        if path.is_file() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .filter(|c| c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=LIB_BUILD_COMMIT={commit}");
}
