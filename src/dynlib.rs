//! Shared libraries loaded at run time (libibverbs; NVIDIA's NCCL as the NCCL face's fallback): `dlopen`
//! and `dlsym`, with `dlerror`'s text as the error, which each user wraps in a message naming what it
//! loads. Each user keeps its handle and its table of functions. And what a library's file needs, read
//! without loading it (`needed_libraries`), by which the NCCL face tells the thin `libnccl.so.2` over this
//! library from NVIDIA's.

use std::ffi::{CStr, c_int, c_void};
use std::path::Path;

/// Opens the library at `path` (a file name searched like any shared library, or a path) with `flags`.
pub fn open(path: &CStr, flags: c_int) -> Result<*mut c_void, String> {
    // SAFETY: a NUL-terminated path; dlopen has no other precondition.
    let handle = unsafe { libc::dlopen(path.as_ptr(), flags) };
    if handle.is_null() {
        Err(dlerror_text())
    } else {
        Ok(handle)
    }
}

/// Whether the library at `path` is already loaded in this process (`RTLD_NOLOAD`). A library loaded again
/// by the same file keeps the flags of its first load, whatever the later `dlopen` asks.
pub fn is_loaded(path: &CStr) -> bool {
    // SAFETY: a NUL-terminated path; with RTLD_NOLOAD nothing is loaded, and a handle returned is one more
    // reference, given back at once.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

/// Opens a private copy of the library at `path`, with `flags`: its bytes copied into an anonymous file
/// (`memfd_create`), so that the loader takes it for another object than the one already loaded from
/// `path` and applies `flags` to it. Its dependencies are the process's, as for any `dlopen`.
pub fn open_private_copy(path: &str, flags: c_int) -> Result<*mut c_void, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(c"nvidia-nccl-private-copy".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a new descriptor that nothing else owns.
    let mut copy = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    let mut source = std::fs::File::open(path).map_err(|e| format!("opening {path}: {e}"))?;
    std::io::copy(&mut source, &mut copy).map_err(|e| format!("copying {path}: {e}"))?;
    let name = std::ffi::CString::new(format!("/proc/self/fd/{}", copy.as_raw_fd())).expect("no NUL in a number");
    // The mapping outlives the descriptor, which goes when `copy` does.
    open(&name, flags)
}

/// The address of `name` in the library behind `handle`.
///
/// # Safety
/// `handle` is a handle `open` returned, not closed since.
pub unsafe fn symbol(handle: *mut c_void, name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: the caller's contract, and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() { Err(dlerror_text()) } else { Ok(p) }
}

/// The libraries the shared object at `path` needs (its dynamic section's `DT_NEEDED` names), read from the
/// file without loading it; none where the file cannot be read or is no 64-bit little-endian ELF object.
pub fn needed_libraries(path: &Path) -> Vec<String> {
    std::fs::File::open(path)
        .ok()
        .and_then(|f| elf_needed(&f))
        .unwrap_or_default()
}

/// `needed_libraries` of an open file: the ELF header, the program headers, the dynamic segment's entries
/// and, through the loadable segment that holds it, the string table they point into.
fn elf_needed(file: &std::fs::File) -> Option<Vec<String>> {
    use std::os::unix::fs::FileExt;
    const PT_LOAD: u64 = 1;
    const PT_DYNAMIC: u64 = 2;
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;
    const DT_STRSZ: u64 = 10;
    // A bound on any one read, far above what a real library's tables take.
    const MOST: u64 = 1 << 24;
    let read = |offset: u64, len: u64| -> Option<Vec<u8>> {
        if len > MOST {
            return None;
        }
        let mut buf = vec![0; len as usize];
        file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    };
    // A little-endian integer of `width` bytes at `at`.
    let int = |b: &[u8], at: usize, width: usize| -> u64 {
        b[at..at + width]
            .iter()
            .rev()
            .fold(0, |v, &byte| (v << 8) | u64::from(byte))
    };
    let header = read(0, 64)?;
    // Class 2 (64-bit), data 1 (little-endian).
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (int(&header, 0x20, 8), int(&header, 0x36, 2), int(&header, 0x38, 2));
    if phentsize < 56 {
        return None;
    }
    let table = read(phoff, phentsize * phnum)?;
    // Each segment's type, offset in the file, address and size in the file.
    let segments: Vec<[u64; 4]> = table
        .chunks_exact(phentsize as usize)
        .map(|p| [int(p, 0, 4), int(p, 8, 8), int(p, 16, 8), int(p, 32, 8)])
        .collect();
    let &[_, dynamic_offset, _, dynamic_size] = segments.iter().find(|s| s[0] == PT_DYNAMIC)?;
    let dynamic = read(dynamic_offset, dynamic_size)?;
    let (mut needed, mut strtab, mut strsz) = (Vec::new(), None, None);
    for entry in dynamic.chunks_exact(16) {
        match (int(entry, 0, 8), int(entry, 8, 8)) {
            (DT_NULL, _) => break,
            (DT_NEEDED, name) => needed.push(name),
            (DT_STRTAB, address) => strtab = Some(address),
            (DT_STRSZ, size) => strsz = Some(size),
            _ => {}
        }
    }
    let (strtab, strsz) = (strtab?, strsz?);
    let end = strtab.checked_add(strsz)?;
    let &[_, offset, address, _] = segments
        .iter()
        .find(|s| s[0] == PT_LOAD && s[2] <= strtab && s[2].checked_add(s[3]).is_some_and(|e| end <= e))?;
    let strings = read(strtab - address + offset, strsz)?;
    Some(
        needed
            .into_iter()
            .filter_map(|at| {
                let s = strings.get(usize::try_from(at).ok()?..)?;
                let end = s.iter().position(|&b| b == 0)?;
                Some(String::from_utf8_lossy(&s[..end]).into_owned())
            })
            .collect(),
    )
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "no detail from dlerror".into()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_and_symbol_say_why() {
        let e = open(c"libmscclpp-no-such-library.so.9", libc::RTLD_NOW | libc::RTLD_LOCAL).unwrap_err();
        assert!(e.contains("libmscclpp-no-such-library.so.9"), "{e}");
        let libc_handle = open(c"libc.so.6", libc::RTLD_NOW | libc::RTLD_LOCAL).expect("libc loads");
        // SAFETY: a handle `open` just returned.
        assert!(unsafe { symbol(libc_handle, c"getpid") }.is_ok());
        // SAFETY: as above.
        let e = unsafe { symbol(libc_handle, c"mscclpp_no_such_symbol") }.unwrap_err();
        assert!(e.contains("mscclpp_no_such_symbol"), "{e}");
    }

    #[test]
    fn a_files_needed_libraries_are_read_without_loading_it() {
        // This test program needs the C library; a made-up file needs what it says; anything else, nothing.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(needed_libraries(&exe).iter().any(|n| n == "libc.so.6"), "{exe:?}");
        let dir = std::env::temp_dir().join(format!("dynlib-needed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("libx.so");
        std::fs::write(&file, test_elf::needing(&["libmscclpp.so.0", "libc.so.6"])).unwrap();
        assert_eq!(needed_libraries(&file), ["libmscclpp.so.0", "libc.so.6"]);
        std::fs::write(&file, test_elf::needing(&[])).unwrap();
        assert!(needed_libraries(&file).is_empty());
        let mut cut = test_elf::needing(&["libmscclpp.so.0"]);
        cut.truncate(cut.len() - 4);
        std::fs::write(&file, cut).unwrap();
        assert!(needed_libraries(&file).is_empty(), "a file cut short");
        std::fs::write(&file, b"not an ELF file").unwrap();
        assert!(needed_libraries(&file).is_empty());
        assert!(needed_libraries(&dir.join("missing")).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Made-up ELF files for the tests (of this file and of `nccl::engine_search`).
#[cfg(test)]
pub(crate) mod test_elf {
    /// A 64-bit little-endian ELF file of one loadable segment (the whole file, at address 0x1000) and a
    /// dynamic segment that needs `names`.
    pub(crate) fn needing(names: &[&str]) -> Vec<u8> {
        let put = |f: &mut Vec<u8>, at: usize, width: usize, v: u64| {
            f[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
        };
        let mut strings = vec![0u8];
        let mut entries: Vec<(u64, u64)> = Vec::new();
        for name in names {
            entries.push((1, strings.len() as u64));
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
        }
        let (base, dynamic_at) = (0x1000u64, 64 + 2 * 56);
        let strings_at = dynamic_at + (entries.len() + 3) * 16;
        entries.extend([(5, base + strings_at as u64), (10, strings.len() as u64), (0, 0)]);
        let mut f = vec![0u8; strings_at];
        f[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        put(&mut f, 0x20, 8, 64);
        put(&mut f, 0x36, 2, 56);
        put(&mut f, 0x38, 2, 2);
        let total = (strings_at + strings.len()) as u64;
        for (i, (kind, offset, size)) in [(1u64, 0u64, total), (2, dynamic_at as u64, entries.len() as u64 * 16)]
            .into_iter()
            .enumerate()
        {
            let p = 64 + i * 56;
            put(&mut f, p, 4, kind);
            put(&mut f, p + 8, 8, offset);
            put(&mut f, p + 16, 8, base + offset);
            put(&mut f, p + 32, 8, size);
        }
        for (i, (tag, value)) in entries.iter().enumerate() {
            put(&mut f, dynamic_at + i * 16, 8, *tag);
            put(&mut f, dynamic_at + i * 16 + 8, 8, *value);
        }
        f.extend_from_slice(&strings);
        f
    }
}
