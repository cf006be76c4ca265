//! Where NVIDIA's `libnccl.so.2` is found when the ranks span hosts and none is named: the engine that
//! carries what crosses hosts (`fallback.rs`). Every GPU cluster has one, and PyTorch's wheels ship one as
//! `nvidia/nccl/lib/libnccl.so.2` in site-packages; since ours is usually the `libnccl.so.2` that the
//! process loaded, the search must skip our own files wherever it meets them: this core's file, and any
//! thin `libnccl.so.2` of ours (a library that needs `libmscclpp.so.0`, read from its file).
//!
//! In order, the first that exists and is not ours:
//! 1. `MSCCLPP_NCCL_FALLBACK`, where it is set (then nothing else is tried);
//! 2. beside a Python package loaded in this process: for each loaded object under a `site-packages` or
//!    `dist-packages` folder (torch's, JAX's or CuPy's libraries), that folder's `nvidia/nccl/lib/`;
//! 3. the folders of `LD_LIBRARY_PATH`, then the system's (`/usr/lib/x86_64-linux-gnu`, `/usr/lib64`,
//!    `/usr/local/lib`, `/usr/local/cuda/lib64`, `/usr/lib`).

use std::collections::HashSet;
use std::ffi::{CStr, c_int, c_void};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The file name every candidate has.
const FILE: &str = "libnccl.so.2";

/// The system's folders, after `LD_LIBRARY_PATH`'s.
const SYSTEM_DIRS: [&str; 5] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
    "/usr/lib",
];

/// How a candidate was found, for the INFO line that names the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Setting,
    BesidePackage(PathBuf),
    LibraryPath,
    System,
}

impl Found {
    pub fn describe(&self) -> String {
        match self {
            Found::Setting => "named by MSCCLPP_NCCL_FALLBACK".into(),
            Found::BesidePackage(object) => format!("beside the loaded Python package of {}", object.display()),
            Found::LibraryPath => "in LD_LIBRARY_PATH".into(),
            Found::System => "in the system's library folders".into(),
        }
    }
}

/// The candidates, in the order of the module's doc, given what the search reads: the loaded objects'
/// paths, `LD_LIBRARY_PATH` and the system's folders (a test passes its own).
pub fn candidates(loaded: &[PathBuf], library_path: Option<&str>, system: &[&str]) -> Vec<(PathBuf, Found)> {
    let mut out = Vec::new();
    for object in loaded {
        let Some(site) = object.ancestors().find(|a| {
            matches!(
                a.file_name().and_then(|n| n.to_str()),
                Some("site-packages" | "dist-packages")
            )
        }) else {
            continue;
        };
        out.push((
            site.join("nvidia/nccl/lib").join(FILE),
            Found::BesidePackage(object.clone()),
        ));
    }
    for dir in library_path.unwrap_or("").split(':').filter(|d| !d.is_empty()) {
        out.push((Path::new(dir).join(FILE), Found::LibraryPath));
    }
    for dir in system {
        out.push((Path::new(dir).join(FILE), Found::System));
    }
    let mut seen = HashSet::new();
    out.retain(|(p, _)| seen.insert(p.clone()));
    out
}

/// The soname of this core, which every thin `libnccl.so.2` of ours needs (the Makefile links it over the
/// core): NVIDIA's never does.
const CORE: &str = "libmscclpp.so.0";

/// Whether the library at `path` is a thin `libnccl.so.2` of ours (of this build or any other).
fn is_thin_face(path: &Path) -> bool {
    crate::dynlib::needed_libraries(path).iter().any(|n| n == CORE)
}

/// The first candidate that exists and is none of ours: not the file `ours` (compared by device and inode,
/// so that a link or another path to our own library is skipped too), and no thin `libnccl.so.2`.
pub fn first_not_ours(candidates: Vec<(PathBuf, Found)>, ours: Option<&Path>) -> Option<(PathBuf, Found)> {
    let identity = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let ours = ours.and_then(identity);
    candidates.into_iter().find(|(p, _)| match identity(p) {
        Some(id) => Some(id) != ours && !is_thin_face(p),
        None => false,
    })
}

/// The paths of the objects loaded in this process (`dl_iterate_phdr`).
fn loaded_objects() -> Vec<PathBuf> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the Vec passed below, for the call's length; `info` is the loader's, valid here.
        unsafe {
            let out = &mut *(data as *mut Vec<PathBuf>);
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let name = CStr::from_ptr(name).to_string_lossy();
                if !name.is_empty() {
                    out.push(PathBuf::from(name.as_ref()));
                }
            }
        }
        0
    }
    let mut out: Vec<PathBuf> = Vec::new();
    // SAFETY: the callback only reads what the loader passes and writes into `out`, alive for the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<PathBuf>).cast()) };
    out
}

/// The file this library was loaded from (`dladdr` of one of its functions).
fn our_file() -> Option<PathBuf> {
    // SAFETY: an all-zero Dl_info is valid for dladdr to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address is a function of this library; `info` is a valid out-parameter.
    let ok = unsafe { libc::dladdr(our_file as *const c_void, &mut info) } != 0;
    if !ok || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, owned by the loader.
    Some(PathBuf::from(
        unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().as_ref(),
    ))
}

/// Searches this process's candidates (steps 2 and 3 of the module's doc).
pub fn search() -> Option<(PathBuf, Found)> {
    let library_path = crate::settings::loader_library_path();
    first_not_ours(
        candidates(&loaded_objects(), library_path.as_deref(), &SYSTEM_DIRS),
        our_file().as_deref(),
    )
}

/// What to install or set, for the error of a job that spans hosts and found no engine.
pub fn not_found_hint() -> String {
    format!(
        "collectives between hosts go through NVIDIA's NCCL, and no libnccl.so.2 other than this library was \
         found (beside a loaded Python package's nvidia/nccl/lib, in LD_LIBRARY_PATH, or in {}): install it \
         (pip install nvidia-nccl-cu13, or cu12; or the system's libnccl2 package) or set MSCCLPP_NCCL_FALLBACK \
         to its path",
        SYSTEM_DIRS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_come_beside_packages_then_the_library_path_then_the_system() {
        let loaded = vec![
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            PathBuf::from("/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so"),
            PathBuf::from("/venv/lib/python3.12/site-packages/torch/lib/libc10.so"),
            PathBuf::from("/usr/lib/python3/dist-packages/cupy/_core.so"),
        ];
        let got = candidates(&loaded, Some("/opt/a::/opt/b"), &["/usr/lib"]);
        let paths: Vec<_> = got.iter().map(|(p, _)| p.to_str().unwrap().to_string()).collect();
        assert_eq!(
            paths,
            [
                "/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
                "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                "/opt/a/libnccl.so.2",
                "/opt/b/libnccl.so.2",
                "/usr/lib/libnccl.so.2",
            ]
        );
        assert_eq!(got[0].1, Found::BesidePackage(loaded[1].clone()));
        assert_eq!(got[2].1, Found::LibraryPath);
        assert_eq!(got[4].1, Found::System);
    }

    #[test]
    fn the_first_existing_file_that_is_not_ours_wins() {
        let dir = std::env::temp_dir().join(format!("engine-search-{}", std::process::id()));
        let (ours, link, thin, theirs) = (dir.join("ours"), dir.join("link"), dir.join("thin"), dir.join("theirs"));
        for d in [&ours, &link, &thin, &theirs] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(ours.join(FILE), b"ours").unwrap();
        std::fs::hard_link(ours.join(FILE), link.join(FILE)).unwrap();
        // A thin libnccl.so.2 (of another build: not the file `ours`); NVIDIA's needs no libmscclpp.
        std::fs::write(thin.join(FILE), crate::dynlib::test_elf::needing(&["libmscclpp.so.0"])).unwrap();
        std::fs::write(theirs.join(FILE), crate::dynlib::test_elf::needing(&["libc.so.6"])).unwrap();
        let cands = |dirs: &[&Path]| -> Vec<(PathBuf, Found)> {
            dirs.iter().map(|d| (d.join(FILE), Found::LibraryPath)).collect()
        };
        let missing = dir.join("missing");
        // Missing files, our own (by any path) and thin libraries of ours are skipped.
        let got = first_not_ours(cands(&[&missing, &ours, &link, &thin, &theirs]), Some(&ours.join(FILE)));
        assert_eq!(got.unwrap().0, theirs.join(FILE));
        assert!(first_not_ours(cands(&[&thin]), None).is_none());
        assert!(first_not_ours(cands(&[&missing, &ours, &link]), Some(&ours.join(FILE))).is_none());
        // Without knowing our file, the first that exists.
        assert_eq!(
            first_not_ours(cands(&[&missing, &ours]), None).unwrap().0,
            ours.join(FILE)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_process_finds_its_own_file_and_never_returns_it() {
        let ours = our_file();
        assert!(ours.as_ref().is_some_and(|p| p.exists()), "{ours:?}");
        if let Some((p, _)) = search() {
            assert_ne!(
                std::fs::canonicalize(&p).ok(),
                ours.as_ref().and_then(|o| std::fs::canonicalize(o).ok())
            );
        }
    }
}
