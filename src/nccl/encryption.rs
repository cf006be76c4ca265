//! `ncclSetEncryption` (NCCL 2.32): encryption of the traffic between hosts with a pre-shared key. This
//! library encrypts nothing (its data moves between GPUs of one machine, its bootstrap over plain TCP), so
//! `NCCL_ENCRYPTION_MODE_NONE` is accepted and a key is refused with the reason, never silently ignored.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::config::{Header, header};
use super::entry::{OK, entry};
use super::types::{NCCL_CONFIG_MAGIC, ncclResult_t};
use crate::abi::non_null_args;
use crate::ensure_arg;
use crate::error::Error;
use std::ffi::{c_char, c_int, c_uint};
use std::mem::offset_of;

/// `ncclEncryptionConfig_t` of NCCL 2.32.
#[repr(C)]
pub struct ncclEncryptionConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub mode: c_int,
    pub psk: *const c_char,
}

/// `NCCL_ENCRYPTION_MODE_NONE`, `NCCL_ENCRYPTION_MODE_PSK`.
pub const MODE_NONE: c_int = 0;
pub const MODE_PSK: c_int = 1;

nccl_export! {
    /// Accepts `NCCL_ENCRYPTION_MODE_NONE`; refuses a pre-shared key (`ncclInvalidUsage`: nothing here
    /// would encrypt with it).
    fn ncclSetEncryption / pncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
        entry("ncclSetEncryption", || {
            non_null_args!(config);
            // SAFETY: checked non-null; the caller's struct, made by NCCL_ENCRYPTION_CONFIG_INITIALIZER, starts
            // with its size, magic and version.
            let Header { size, magic, .. } = unsafe { header(config) };
            ensure_arg!(
                magic == NCCL_CONFIG_MAGIC,
                "config's magic is {magic:#x}, not {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_ENCRYPTION_CONFIG_INITIALIZER"
            );
            let least = offset_of!(ncclEncryptionConfig_t, mode) + 4;
            ensure_arg!(size >= least, "config's size is {size}; it must be at least {least}");
            // SAFETY: the struct holds its mode (checked by its size just above).
            let mode = unsafe { std::ptr::addr_of!((*config).mode).read_unaligned() };
            match mode {
                MODE_NONE => OK,
                MODE_PSK => Err(Error::invalid_usage(
                    "NCCL_ENCRYPTION_MODE_PSK is refused: this library encrypts nothing (its data moves between \
                     the GPUs of one machine and its bootstrap is plain TCP), so a key would protect nothing",
                )),
                other => Err(Error::invalid_argument(format!(
                    "config's mode is {other}; it must be NCCL_ENCRYPTION_MODE_NONE (0) or NCCL_ENCRYPTION_MODE_PSK (1)"
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mode: c_int) -> ncclEncryptionConfig_t {
        ncclEncryptionConfig_t {
            size: std::mem::size_of::<ncclEncryptionConfig_t>(),
            magic: NCCL_CONFIG_MAGIC,
            version: super::super::types::NCCL_VERSION_CODE as c_uint,
            mode,
            psk: std::ptr::null(),
        }
    }

    #[test]
    fn none_is_accepted_a_key_refused() {
        assert_eq!(std::mem::size_of::<ncclEncryptionConfig_t>(), 32);
        // SAFETY: whole configs, or NULL.
        unsafe {
            assert_eq!(ncclSetEncryption(&config(MODE_NONE)), ncclResult_t::ncclSuccess);
            assert_eq!(ncclSetEncryption(&config(MODE_PSK)), ncclResult_t::ncclInvalidUsage);
            assert_eq!(ncclSetEncryption(&config(7)), ncclResult_t::ncclInvalidArgument);
            assert_eq!(ncclSetEncryption(std::ptr::null()), ncclResult_t::ncclInvalidArgument);
            let mut bad = config(MODE_NONE);
            bad.magic = 0;
            assert_eq!(ncclSetEncryption(&bad), ncclResult_t::ncclInvalidArgument);
        }
    }
}
