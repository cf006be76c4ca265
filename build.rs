//! Build script of libmscclpp:
//!
//! 1. Generates the public headers `mscclpp.h` and `mscclppfifo.h` into `build/include/` (beside
//!    `Cargo.toml`). Each is a template from `include/*.h.in` in which a line
//!    - `@CBINDGEN structs@` becomes cbindgen's plain structs (tag style: `struct X { ... };`),
//!    - `@CBINDGEN api@` becomes cbindgen's enums, typedefs and function declarations (type style:
//!      `typedef enum { ... } X;`, as the legacy header writes them),
//!    - `@SPLICE path@` becomes the file at `path` (the device code in `kernels/`).
//!
//!    cbindgen reads `src/types.rs` and `src/ffi/*.rs` with the settings in `cbindgen.toml`.
//! 2. Compiles the library's small C++ part (`src/cxx/*.cpp`, if any) against those headers.
//! 3. Gives the shared library its soname.

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
        "src/ffi",
    ] {
        println!("cargo:rerun-if-changed={input}");
    }
    let cxx_dir = root.join("src/cxx");
    // Until src/cxx exists, watch all of src so that its creation is noticed.
    println!(
        "cargo:rerun-if-changed={}",
        if cxx_dir.is_dir() { "src/cxx" } else { "src" }
    );

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
        write_if_changed(&path, &text);
        // Regenerate if the output is removed (for example by `make clean`) while target/ survives.
        println!("cargo:rerun-if-changed={INCLUDE_OUT}/{header}");
    }

    // After the headers are written: the C++ part includes mscclpp.h for its structs.
    compile_cxx(&cxx_dir, &out_dir);

    // Legacy programs link against libmscclpp.so.0; the Makefile installs the library as
    // libmscclpp.so.0.1.0 with the links libmscclpp.so.0 and libmscclpp.so.
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
const EXTENSION_FUNCTIONS: [&str; 2] = ["mscclppCommAbort", "mscclppCommGetAsyncError"];

/// Warns when the generated declarations are not exactly the legacy set and our extensions: every exported
/// `extern "C"` function in `src/ffi/` lands in the public header, so a helper exported by mistake (or a
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
            println!("cargo:warning=mscclpp.h lacks {name}: no exported function of that name in src/ffi/");
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
    // cbindgen follows `mod` items, so the FFI module's root brings in all of its files once.
    builder = builder.with_src(root.join("src/ffi/mod.rs"));
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
/// program after each cargo run; the rename keeps concurrent cargo runs from seeing half a header.
fn write_if_changed(path: &Path, text: &str) {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    fs::write(&tmp, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("cannot rename onto {}: {e}", path.display()));
}

/// Compiles `src/cxx/*.cpp` into the library (they see the generated headers) and links the C++ runtime.
fn compile_cxx(cxx_dir: &Path, include_dir: &Path) {
    let Ok(entries) = fs::read_dir(cxx_dir) else {
        return;
    };
    let mut sources: Vec<PathBuf> = entries
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cpp"))
        .collect();
    if sources.is_empty() {
        return;
    }
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
