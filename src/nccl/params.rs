//! NCCL 2.30's settings API (`ncclParamBind`, `ncclParamGet*`, `ncclParamGetParameter`,
//! `ncclParamGetAllParameterKeys`, `ncclParamDumpAll`) over the library's one table of settings
//! (`crate::settings`): a key is a setting's name, `MSCCLPP_*` or one of the `NCCL_*` the face honours
//! (`NCCL_DEBUG`, `NCCL_COMM_ID`, ...); a key without either prefix is tried as `NCCL_<key>`. A value is the
//! one in effect: the environment's as the library read it at its first use, else the default. NCCL's
//! tuning keys that this library does not have (`NCCL_ALGO`, `NCCL_PROTO`, ...) are not found
//! (`ncclInvalidArgument`), as an unknown key is to NCCL. And `ncclResetDebugInit`, which reads the log
//! level again.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::entry::{OK, entry};
use super::types::ncclResult_t;
use crate::abi::{non_null, non_null_args};
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::settings::{ALL, Setting, Source};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};

/// An `ncclParamHandle_t`: the address of a setting of `ALL` (checked against the table before any use,
/// so a made-up handle is an invalid argument, never a dereference).
#[repr(C)]
pub struct ncclParamHandle {
    _opaque: [u8; 0],
}
#[allow(non_camel_case_types)]
pub type ncclParamHandle_t = *mut ncclParamHandle;

/// The setting named `key`.
fn find(key: &str) -> Result<&'static Setting> {
    let prefixed = format!("NCCL_{key}");
    ALL.iter()
        .copied()
        .find(|s| s.name == key || (!key.starts_with("NCCL_") && !key.starts_with("MSCCLPP_") && s.name == prefixed))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "key \"{key}\" is not a setting of this library (its keys: ncclParamGetAllParameterKeys)"
            ))
        })
}

/// The setting behind a handle.
fn setting_of(h: ncclParamHandle_t) -> Result<&'static Setting> {
    ALL.iter()
        .copied()
        .find(|s| std::ptr::eq(*s as *const Setting, h as *const Setting))
        .ok_or_else(|| Error::invalid_argument(format!("h {h:p} is not a handle made by ncclParamBind")))
}

/// The value in effect of `s`: set, else its default (`""` where it has none).
fn value(s: &'static Setting) -> String {
    Source::process().raw(s).unwrap_or_else(|| s.default.to_string())
}

/// Every value handed out, kept for the life of the process (NCCL's strings live as long).
static TEXTS: Lazy<Mutex<HashMap<&'static str, &'static CStr>>> = Lazy::new(Default::default);

/// `s`'s value as a C string that lives for ever (one per setting: the value never changes).
fn text(s: &'static Setting) -> &'static CStr {
    TEXTS.lock().entry(s.name).or_insert_with(|| {
        let c = CString::new(value(s).replace('\0', "")).unwrap_or_default();
        Box::leak(c.into_boxed_c_str())
    })
}

/// `s`'s value as an integer that fits `T`.
fn integer<T: TryFrom<i64>>(s: &'static Setting, width: &str) -> Result<T> {
    let v = value(s);
    let n: i64 = v.trim().parse().map_err(|_| {
        Error::invalid_argument(format!(
            "{} is \"{v}\", not a number (read it with ncclParamGetStr)",
            s.name
        ))
    })?;
    T::try_from(n).map_err(|_| Error::invalid_argument(format!("{} is {n}, which does not fit {width}", s.name)))
}

/// A C string argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn key_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    non_null(p, what)?;
    // SAFETY: checked non-null; the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::invalid_argument(format!("{what} is not UTF-8")))
}

nccl_export! {
    /// A handle of the setting `key`.
    fn ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
        entry("ncclParamBind", || {
            non_null_args!(out);
            // SAFETY: nccl.h's contract: a NUL-terminated key.
            let s = find(unsafe { key_arg(key, "key") }?)?;
            // SAFETY: checked non-null.
            unsafe { *out = s as *const Setting as ncclParamHandle_t };
            OK
        })
    }
}

/// Defines `ncclParamGet<W>` for one integer width.
macro_rules! param_get_int {
    ($name:ident / $twin:ident, $t:ty) => {
        nccl_export! {
            /// The setting's value as this integer type.
            fn $name / $twin(h: ncclParamHandle_t, out: *mut $t) -> ncclResult_t {
                entry(stringify!($name), || {
                    let s = setting_of(h)?;
                    non_null_args!(out);
                    let v: $t = integer(s, stringify!($t))?;
                    // SAFETY: checked non-null.
                    unsafe { *out = v };
                    OK
                })
            }
        }
    };
}

param_get_int!(ncclParamGetI8 / pncclParamGetI8, i8);
param_get_int!(ncclParamGetI16 / pncclParamGetI16, i16);
param_get_int!(ncclParamGetI32 / pncclParamGetI32, i32);
param_get_int!(ncclParamGetI64 / pncclParamGetI64, i64);
param_get_int!(ncclParamGetU8 / pncclParamGetU8, u8);
param_get_int!(ncclParamGetU16 / pncclParamGetU16, u16);
param_get_int!(ncclParamGetU32 / pncclParamGetU32, u32);
param_get_int!(ncclParamGetU64 / pncclParamGetU64, u64);

nccl_export! {
    /// The setting's value as text, valid for the life of the process.
    fn ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
        entry("ncclParamGetStr", || {
            let s = setting_of(h)?;
            non_null_args!(out);
            // SAFETY: checked non-null.
            unsafe { *out = text(s).as_ptr() };
            OK
        })
    }
}

nccl_export! {
    /// The setting's text copied into `out` (at most `maxLen` bytes, its NUL included); `*len` is the bytes
    /// the whole text needs with its NUL. A buffer too short gets what fits (NUL-terminated) and
    /// `ncclInvalidArgument`.
    fn ncclParamGet / pncclParamGet(h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int) -> ncclResult_t {
        entry("ncclParamGet", || {
            let s = setting_of(h)?;
            non_null_args!(len);
            let bytes = text(s).to_bytes_with_nul();
            // SAFETY: checked non-null.
            unsafe { *len = bytes.len() as c_int };
            ensure_arg!(maxLen >= 0, "maxLen is {maxLen}; it must not be negative");
            if maxLen == 0 {
                return OK;
            }
            non_null_args!(out);
            let n = bytes.len().min(maxLen as usize);
            // SAFETY: `out` is non-null and holds `maxLen` bytes (nccl.h's contract); `n` <= maxLen.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), n);
                *out.cast::<u8>().add(n - 1) = 0;
            }
            ensure_arg!(
                n == bytes.len(),
                "maxLen is {maxLen}; {}'s value needs {} bytes",
                s.name,
                bytes.len()
            );
            OK
        })
    }
}

nccl_export! {
    /// The text of the setting `key` and its length (without the NUL).
    fn ncclParamGetParameter / pncclParamGetParameter(key: *const c_char, value: *mut *const c_char, valueLen: *mut c_int) -> ncclResult_t {
        entry("ncclParamGetParameter", || {
            non_null_args!(value, valueLen);
            // SAFETY: nccl.h's contract: a NUL-terminated key.
            let s = find(unsafe { key_arg(key, "key") }?)?;
            let t = text(s);
            // SAFETY: both checked non-null.
            unsafe {
                *value = t.as_ptr();
                *valueLen = t.to_bytes().len() as c_int;
            }
            OK
        })
    }
}

/// The names of every setting, as C strings in a table that lives for ever.
struct KeyTable(Vec<*const c_char>);
// SAFETY: the pointers are to `'static` C strings that are never written.
unsafe impl Send for KeyTable {}
// SAFETY: as above.
unsafe impl Sync for KeyTable {}

static KEYS: Lazy<KeyTable> = Lazy::new(|| {
    KeyTable(
        ALL.iter()
            .map(|s| Box::leak(CString::new(s.name).expect("names have no NUL").into_boxed_c_str()).as_ptr())
            .collect(),
    )
});

nccl_export! {
    /// Every setting's name.
    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(table: *mut *mut *const c_char, tableLen: *mut c_int) -> ncclResult_t {
        entry("ncclParamGetAllParameterKeys", || {
            non_null_args!(table, tableLen);
            // SAFETY: both checked non-null; the table is never written through the pointer handed out.
            unsafe {
                *table = KEYS.0.as_ptr().cast_mut();
                *tableLen = KEYS.0.len() as c_int;
            }
            OK
        })
    }
}

nccl_export! {
    /// Logs every setting and its value at INFO.
    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        let _ = entry("ncclParamDumpAll", || {
            for s in ALL {
                log::info!("{}={}", s.name, value(s));
            }
            OK
        });
    }
}

nccl_export! {
    /// Reads the log level again from the environment as it is now (`NCCL_DEBUG`, `MSCCLPP_DEBUG`).
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        let _ = entry("ncclResetDebugInit", || {
            crate::logging::reset_level_for_nccl();
            OK
        });
    }
}

nccl_export! {
    /// NVIDIA's library exports this name too (without a `pnccl` twin); JAX looks `ncclResetDebugInit` up.
    fn ncclResetDebugInitInternal() -> () {
        let _ = entry("ncclResetDebugInitInternal", || {
            crate::logging::reset_level_for_nccl();
            OK
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn keys_are_the_settings_names_with_or_without_nccls_prefix() {
        assert_eq!(find("MSCCLPP_COLL_SCRATCH_MB").unwrap().name, "MSCCLPP_COLL_SCRATCH_MB");
        assert_eq!(find("NCCL_DEBUG").unwrap().name, "NCCL_DEBUG");
        assert_eq!(find("COMM_ID").unwrap().name, "NCCL_COMM_ID");
        let e = find("NCCL_ALGO").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("NCCL_ALGO"), "{e}");
        assert!(find("no such key").is_err());
    }

    #[test]
    fn handles_are_checked_against_the_table() {
        let s = find("MSCCLPP_COLL_SCRATCH_MB").unwrap();
        let h = s as *const Setting as ncclParamHandle_t;
        assert!(std::ptr::eq(setting_of(h).unwrap(), s));
        assert!(setting_of(std::ptr::null_mut()).is_err());
        assert!(setting_of(0x1000 as ncclParamHandle_t).is_err());
    }

    #[test]
    fn integers_fit_their_width_or_are_refused() {
        // The default of MSCCLPP_COLL_SCRATCH_MB is 64 unless the test's environment sets it.
        let s = find("MSCCLPP_COLL_SCRATCH_MB").unwrap();
        let n: i64 = value(s).parse().unwrap();
        assert_eq!(integer::<i64>(s, "i64").unwrap(), n);
        let big = find("MSCCLPP_PEER_TIMEOUT").unwrap();
        if value(big).parse::<i64>().unwrap() > 127 {
            assert!(integer::<i8>(big, "int8_t").is_err());
        }
        let word = find("MSCCLPP_P2P_FLAG").unwrap();
        let e = integer::<i32>(word, "int32_t").unwrap_err();
        assert!(e.message.contains("not a number"), "{e}");
        assert_eq!(text(word).to_str().unwrap(), value(word));
    }
}
