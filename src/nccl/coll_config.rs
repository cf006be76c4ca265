//! The collectives with a per-call configuration (NCCL 2.31: `ncclAllReduceConfig` and its seven
//! siblings, each taking an `ncclCollConfig_t`): the same calls as without one (`collectives::collective`), the
//! config read by its own size and version as `ncclConfig_t` is. What applies here is honoured:
//! `launchCompletionEvent` is recorded on the stream once the call's work is queued there (outside a
//! group). The tuning fields (CTA bounds, cluster size, CTA policy, an algorithm selection, the profiler
//! tag, vendor extensions) are checked and otherwise ignored, with a DEBUG line: our algorithm table
//! chooses its own grid, and its algorithms are not NCCL's.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's
#![allow(clippy::too_many_arguments)] // nccl.h's signatures

use super::collectives;
use super::config::{Header, copy_prefix, header};
use super::entry::{OK, entry};
use super::queue;
use super::types::{NCCL_CONFIG_MAGIC, NCCL_CONFIG_UNDEF_INT, ncclComm_t, ncclResult_t};
use crate::collective::Collective;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::AppStream;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

/// `ncclCollConfig_t` of NCCL 2.32 (72 bytes on x86-64).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub ext: *mut c_void,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub nvlsCTAs: c_int,
    pub cgaClusterSize: c_int,
    pub algSelection: *const c_char,
    pub forceAlgSelection: c_int,
    pub CTAPolicy: c_int,
    pub userProfilerTag: u64,
    pub launchCompletionEvent: *mut c_void,
}

impl ncclCollConfig_t {
    /// What `NCCL_COLLCONFIG_INITIALIZER` makes.
    pub fn initializer() -> ncclCollConfig_t {
        let undef = NCCL_CONFIG_UNDEF_INT;
        ncclCollConfig_t {
            size: size_of::<ncclCollConfig_t>(),
            magic: NCCL_CONFIG_MAGIC,
            version: super::types::NCCL_VERSION_CODE as c_uint,
            ext: std::ptr::null_mut(),
            minCTAs: undef,
            maxCTAs: undef,
            nvlsCTAs: undef,
            cgaClusterSize: undef,
            algSelection: std::ptr::null(),
            forceAlgSelection: 1,
            CTAPolicy: undef,
            userProfilerTag: 0,
            launchCompletionEvent: std::ptr::null_mut(),
        }
    }
}

/// The smallest `ncclCollConfig_t` read: up to `CTAPolicy` (the struct first had its header, `ext`, the
/// CTA bounds and the algorithm selection).
const OLDEST_SIZE: usize = offset_of!(ncclCollConfig_t, userProfilerTag);

/// What a call takes from its config.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CollConfig {
    /// `launchCompletionEvent`, where set.
    pub event: Option<u64>,
}

/// Reads and checks the caller's config (NULL: the defaults), by its own size.
///
/// # Safety
/// `config` is NULL or the caller's `ncclCollConfig_t` (made by `NCCL_COLLCONFIG_INITIALIZER`), at least
/// as long as its `size` says once its magic is right.
pub unsafe fn read(config: *const ncclCollConfig_t) -> Result<CollConfig> {
    if config.is_null() {
        return Ok(CollConfig::default());
    }
    // SAFETY: every version of the struct starts with size, magic and version.
    let Header { size, magic, .. } = unsafe { header(config) };
    ensure_arg!(
        magic == NCCL_CONFIG_MAGIC,
        "config's magic is {magic:#x}, not {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_COLLCONFIG_INITIALIZER"
    );
    ensure_arg!(
        size >= OLDEST_SIZE,
        "config's size is {size} bytes; the smallest ncclCollConfig_t has {OLDEST_SIZE}"
    );
    // SAFETY: the caller's struct is `size` bytes long; `ncclCollConfig_t` is ints and pointers.
    let raw = unsafe { copy_prefix(config, size, ncclCollConfig_t::initializer()) };
    parse(&raw)
}

/// Checks the fields as NCCL does and keeps what applies.
pub fn parse(raw: &ncclCollConfig_t) -> Result<CollConfig> {
    let undef = NCCL_CONFIG_UNDEF_INT;
    for (name, value) in [
        ("minCTAs", raw.minCTAs),
        ("maxCTAs", raw.maxCTAs),
        ("nvlsCTAs", raw.nvlsCTAs),
        ("cgaClusterSize", raw.cgaClusterSize),
    ] {
        ensure_arg!(
            value == undef || value >= 0,
            "config's {name} is {value}; it must not be negative"
        );
        if value != undef {
            log::debug!("ncclCollConfig_t's {name} ({value}) is not used: the algorithm table chooses the grid");
        }
    }
    ensure_arg!(
        raw.minCTAs == undef || raw.maxCTAs == undef || raw.minCTAs <= raw.maxCTAs,
        "config's minCTAs ({}) is larger than its maxCTAs ({})",
        raw.minCTAs,
        raw.maxCTAs
    );
    ensure_arg!(
        matches!(raw.forceAlgSelection, 0 | 1),
        "config's forceAlgSelection is {}; it must be 0 or 1",
        raw.forceAlgSelection
    );
    if !raw.algSelection.is_null() {
        // SAFETY: NULL or a NUL-terminated string (NCCL's contract).
        let selection = unsafe { CStr::from_ptr(raw.algSelection) }.to_string_lossy();
        if !selection.is_empty() {
            log::debug!(
                "ncclCollConfig_t's algSelection \"{selection}\" is not used: this library's algorithms are its own"
            );
        }
    }
    if raw.CTAPolicy != undef || !raw.ext.is_null() || raw.userProfilerTag != 0 {
        log::debug!("ncclCollConfig_t's CTAPolicy, ext and userProfilerTag are not used");
    }
    Ok(CollConfig {
        event: (!raw.launchCompletionEvent.is_null()).then_some(raw.launchCompletionEvent as u64),
    })
}

/// A collective with a config: checked, issued as without one, then its event recorded.
fn configured(
    name: &'static str,
    what: Collective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: ncclComm_t,
    stream: *mut c_void,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    // SAFETY: nccl.h's contract for the config.
    let cfg = match unsafe { read(config) } {
        Ok(c) => c,
        Err(e) => return entry(name, || Err(e)),
    };
    if cfg.event.is_some() && queue::with(&queue::GROUP, |g| g.open()) {
        return entry(name, || {
            Err(Error::invalid_usage(
                "config's launchCompletionEvent inside a group is not carried out by this library: the group's \
                 work is queued at ncclGroupEnd; record an event on the stream after it instead",
            ))
        });
    }
    let r = collectives::collective(name, what, send, recv, count, datatype, op, root, comm, stream);
    match (r, cfg.event) {
        (ncclResult_t::ncclSuccess, Some(event)) => entry(name, || {
            // SAFETY: nccl.h's contract: the stream is the call's, the event a live one of its context.
            unsafe { AppStream::from_raw(stream as u64).record_app_event(event) }?;
            OK
        }),
        (r, _) => r,
    }
}

nccl_export! {
    /// `ncclAllReduce` with a per-call config.
    fn ncclAllReduceConfig / pncclAllReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclAllReduceConfig", Collective::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclBroadcast` with a per-call config.
    fn ncclBroadcastConfig / pncclBroadcastConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclBroadcastConfig", Collective::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclReduce` with a per-call config.
    fn ncclReduceConfig / pncclReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclReduceConfig", Collective::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclAllGather` with a per-call config.
    fn ncclAllGatherConfig / pncclAllGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclAllGatherConfig", Collective::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclReduceScatter` with a per-call config.
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclReduceScatterConfig", Collective::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclAlltoAll` with a per-call config.
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclAlltoAllConfig", Collective::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclGather` with a per-call config.
    fn ncclGatherConfig / pncclGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclGatherConfig", Collective::Gather, sendbuff, recvbuff, count, datatype, None, root, comm, stream, config)
    }
}

nccl_export! {
    /// `ncclScatter` with a per-call config.
    fn ncclScatterConfig / pncclScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: ncclComm_t, stream: *mut c_void, config: *const ncclCollConfig_t) -> ncclResult_t {
        configured("ncclScatterConfig", Collective::Scatter, sendbuff, recvbuff, count, datatype, None, root, comm, stream, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn the_layout_is_nccl_2_32s() {
        assert_eq!(size_of::<ncclCollConfig_t>(), 72);
        assert_eq!(offset_of!(ncclCollConfig_t, algSelection), 40);
        assert_eq!(offset_of!(ncclCollConfig_t, userProfilerTag), 56);
        assert_eq!(offset_of!(ncclCollConfig_t, launchCompletionEvent), 64);
    }

    #[test]
    fn configs_are_checked_and_the_event_kept() {
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read(std::ptr::null()) }.unwrap(), CollConfig::default());
        let mut c = ncclCollConfig_t::initializer();
        // SAFETY: a whole config.
        assert_eq!(unsafe { read(&c) }.unwrap(), CollConfig::default());
        c.launchCompletionEvent = 0x1234 as *mut c_void;
        c.maxCTAs = 8;
        c.algSelection = c"ring".as_ptr();
        // SAFETY: as above.
        assert_eq!(unsafe { read(&c) }.unwrap().event, Some(0x1234));
        c.minCTAs = 16;
        // SAFETY: as above.
        let e = unsafe { read(&c) }.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("minCTAs (16)"), "{e}");
        let mut c = ncclCollConfig_t::initializer();
        c.magic = 1;
        // SAFETY: as above.
        assert!(unsafe { read(&c) }.unwrap_err().message.contains("magic"));
        let mut c = ncclCollConfig_t::initializer();
        c.size = 8;
        // SAFETY: as above (longer than it claims).
        assert!(unsafe { read(&c) }.unwrap_err().message.contains("size is 8"));
        let mut c = ncclCollConfig_t::initializer();
        c.forceAlgSelection = 2;
        // SAFETY: as above.
        assert!(unsafe { read(&c) }.is_err());
    }

    #[test]
    fn a_shorter_config_leaves_the_later_fields_undefined() {
        let mut c = ncclCollConfig_t::initializer();
        c.size = OLDEST_SIZE;
        c.launchCompletionEvent = 0x10 as *mut c_void; // past its size: never read
        // SAFETY: the struct is longer than it claims.
        assert_eq!(unsafe { read(&c) }.unwrap().event, None);
    }
}
