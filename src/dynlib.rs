//! Shared libraries loaded at run time (libibverbs; NVIDIA's NCCL as the NCCL face's fallback): `dlopen`
//! and `dlsym`, with `dlerror`'s text as the error, which each user wraps in a message naming what it
//! loads. Each user keeps its handle and its table of functions.

use std::ffi::{CStr, c_int, c_void};

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
}
