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
