//! A caller's `ncclConfig_t`, read by its own `size` and `version`: a program compiled against an older
//! `nccl.h` passes a shorter struct, whose missing fields count as undefined; one compiled against a newer
//! header passes a longer one, whose fields past ours are not read.

use super::types::{NCCL_CONFIG_MAGIC, NCCL_CONFIG_UNDEF_INT, ncclConfig_t};
use crate::ensure_arg;
use crate::error::Result;
use std::ffi::CStr;
use std::mem::{offset_of, size_of};

/// NCCL 2.14, the first `nccl.h` with `ncclConfig_t`: size, magic, version, blocking, cgaClusterSize,
/// minCTAs, maxCTAs, netName.
const OLDEST_VERSION: u32 = 21400;
const OLDEST_SIZE: usize = offset_of!(ncclConfig_t, splitShare);

/// What the library takes from a config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `blocking = 0`: initialisation returns `ncclInProgress` and finishes in the background.
    pub blocking: bool,
    /// `commName`, for log lines.
    pub name: Option<String>,
    /// `maxCTAs`: the most blocks of a collective's launch (the smallest of every rank's applies).
    pub max_ctas: Option<u32>,
}

impl Config {
    /// The config of a call without one (`config == NULL`, or `ncclCommInitRank`).
    pub fn default_for(blocking_default: bool) -> Config {
        Config {
            blocking: blocking_default,
            name: None,
            max_ctas: None,
        }
    }
}

/// The header every versioned struct of NCCL's API starts with (`ncclConfig_t`, `ncclCollConfig_t`,
/// `ncclCommProperties_t`): its size, magic and version, which tell a reader how much of it the caller knows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
}

/// The header of the caller's struct at `ptr`.
///
/// # Safety
/// `ptr` points to at least `size_of::<Header>()` (16) readable bytes: a versioned struct of NCCL's API.
pub unsafe fn header<T>(ptr: *const T) -> Header {
    // SAFETY: the caller's contract; read unaligned, as the caller's struct need not be.
    unsafe { std::ptr::read_unaligned(ptr.cast::<Header>()) }
}

/// `defaults` with its first `size` bytes (at most `T`'s own) taken from the caller's struct at `ptr`: a
/// shorter struct, of an older header, leaves the later fields as `defaults` has them; a longer one is read
/// up to ours.
///
/// # Safety
/// `ptr` points to at least `size` readable bytes, and `T` is plain integers and pointers, so that any
/// bytes are a value of it.
pub unsafe fn copy_prefix<T>(ptr: *const T, size: usize, mut defaults: T) -> T {
    let n = size.min(size_of::<T>());
    // SAFETY: the caller's contract for `ptr` and for `T`; `n` bytes fit in `defaults`.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&mut defaults as *mut T).cast::<u8>(), n) };
    defaults
}

/// Copies the caller's config into a full `ncclConfig_t`: the bytes its `size` covers, undefined fields
/// beyond. Checks the size and magic first, so that nothing past a bad struct is read.
///
/// # Safety
/// `config` points to at least `size_of::<usize>() + 8` readable bytes, and to `size` of them when its
/// magic is right (the caller's `ncclConfig_t`, made by `NCCL_CONFIG_INITIALIZER`).
pub unsafe fn copy_in(config: *const ncclConfig_t) -> Result<(ncclConfig_t, usize)> {
    // SAFETY: the caller's struct has at least its size, magic and version fields.
    let Header { size, magic, version } = unsafe { header(config) };
    check_header(size, magic, version)?;
    // SAFETY: the caller's struct is `size` bytes long (its header was checked to be sane); `ncclConfig_t`
    // is ints and pointers.
    let full = unsafe { copy_prefix(config, size, ncclConfig_t::initializer()) };
    Ok((full, size))
}

fn check_header(size: usize, magic: u32, version: u32) -> Result<()> {
    ensure_arg!(
        magic == NCCL_CONFIG_MAGIC,
        "config's magic is {magic:#x}, not {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER"
    );
    ensure_arg!(
        version >= OLDEST_VERSION,
        "config's version is {version}; ncclConfig_t exists from NCCL {OLDEST_VERSION} on"
    );
    ensure_arg!(
        size >= OLDEST_SIZE,
        "config's size is {size} bytes; the smallest ncclConfig_t (NCCL 2.14) has {OLDEST_SIZE}"
    );
    Ok(())
}

/// Reads the fields the library uses, checking their values as NCCL does (an out-of-range value is an
/// invalid argument naming the field). `blocking_default` applies where `blocking` is undefined.
pub fn parse(raw: &ncclConfig_t, blocking_default: bool) -> Result<Config> {
    let blocking = match raw.blocking {
        NCCL_CONFIG_UNDEF_INT => blocking_default,
        0 => false,
        1 => true,
        other => {
            return Err(crate::error::Error::invalid_argument(format!(
                "config's blocking is {other}; it must be 0 or 1"
            )));
        }
    };
    for (name, value) in [
        ("cgaClusterSize", raw.cgaClusterSize),
        ("minCTAs", raw.minCTAs),
        ("maxCTAs", raw.maxCTAs),
        ("nvlsCTAs", raw.nvlsCTAs),
        ("nChannelsPerNetPeer", raw.nChannelsPerNetPeer),
    ] {
        ensure_arg!(
            value == NCCL_CONFIG_UNDEF_INT || value >= 0,
            "config's {name} is {value}; it must not be negative"
        );
    }
    for (name, value) in [
        ("splitShare", raw.splitShare),
        ("shrinkShare", raw.shrinkShare),
        ("collnetEnable", raw.collnetEnable),
    ] {
        ensure_arg!(
            matches!(value, NCCL_CONFIG_UNDEF_INT | 0 | 1),
            "config's {name} is {value}; it must be 0 or 1"
        );
    }
    for (name, value) in [
        ("graphUsageMode", raw.graphUsageMode),
        ("numRmaCtx", raw.numRmaCtx),
        ("maxP2pPeers", raw.maxP2pPeers),
        ("numRmaSig", raw.numRmaSig),
    ] {
        ensure_arg!(
            value == NCCL_CONFIG_UNDEF_INT || value >= 0,
            "config's {name} is {value}; it must not be negative"
        );
    }
    for (name, value) in [
        ("graphStreamOrdering", raw.graphStreamOrdering),
        ("launchOrderImplicit", raw.launchOrderImplicit),
        ("rmaEagerInit", raw.rmaEagerInit),
    ] {
        ensure_arg!(
            matches!(value, NCCL_CONFIG_UNDEF_INT | 0 | 1),
            "config's {name} is {value}; it must be 0 or 1"
        );
    }
    // What this library has no use for: its grids come from its algorithm table, it has no network
    // channels, NVLS or CFT, its one-sided calls need no contexts set up in advance, and its calls are
    // always stream-ordered.
    for (name, value) in ignored(raw) {
        log::debug!("config's {name} ({value}) is not used by this library");
    }
    let name = (!raw.commName.is_null()).then(|| {
        // SAFETY: the caller's commName is NULL or a NUL-terminated string (NCCL's contract).
        unsafe { CStr::from_ptr(raw.commName) }.to_string_lossy().into_owned()
    });
    ensure_arg!(
        raw.maxCTAs != 0,
        "config's maxCTAs is 0; it must be at least 1 (or NCCL_CONFIG_UNDEF_INT)"
    );
    let max_ctas = (raw.maxCTAs != NCCL_CONFIG_UNDEF_INT).then_some(raw.maxCTAs as u32);
    Ok(Config {
        blocking,
        name,
        max_ctas,
    })
}

/// The fields a caller set that the library does not use, with their values.
fn ignored(raw: &ncclConfig_t) -> Vec<(&'static str, i32)> {
    [
        ("cgaClusterSize", raw.cgaClusterSize),
        ("minCTAs", raw.minCTAs),
        ("splitShare", raw.splitShare),
        ("trafficClass", raw.trafficClass),
        ("collnetEnable", raw.collnetEnable),
        ("CTAPolicy", raw.CTAPolicy),
        ("shrinkShare", raw.shrinkShare),
        ("nvlsCTAs", raw.nvlsCTAs),
        ("nChannelsPerNetPeer", raw.nChannelsPerNetPeer),
        ("nvlinkCentricSched", raw.nvlinkCentricSched),
        ("graphUsageMode", raw.graphUsageMode),
        ("numRmaCtx", raw.numRmaCtx),
        ("maxP2pPeers", raw.maxP2pPeers),
        ("graphStreamOrdering", raw.graphStreamOrdering),
        ("launchOrderImplicit", raw.launchOrderImplicit),
        ("numRmaSig", raw.numRmaSig),
        ("rmaEagerInit", raw.rmaEagerInit),
        ("hostCftMode", raw.hostCftMode),
        ("nvlsHostMode", raw.nvlsHostMode),
    ]
    .into_iter()
    .filter(|(_, v)| *v != NCCL_CONFIG_UNDEF_INT)
    .collect()
}

/// The config of `config` (NULL: the defaults).
///
/// # Safety
/// `config` is NULL or the caller's `ncclConfig_t` (see `copy_in`).
pub unsafe fn read(config: *const ncclConfig_t, blocking_default: bool) -> Result<Config> {
    if config.is_null() {
        return Ok(Config::default_for(blocking_default));
    }
    // SAFETY: the caller's contract.
    let (raw, _) = unsafe { copy_in(config) }?;
    parse(&raw, blocking_default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn the_initializer_gives_the_defaults() {
        let c = ncclConfig_t::initializer();
        // SAFETY: a whole config.
        let got = unsafe { read(&c, true) }.unwrap();
        assert_eq!(got, Config::default_for(true));
        // SAFETY: as above.
        assert!(!unsafe { read(&c, false) }.unwrap().blocking);
        // SAFETY: NULL is allowed.
        assert!(unsafe { read(std::ptr::null(), true) }.unwrap().blocking);
    }

    #[test]
    fn blocking_and_name_are_read() {
        let mut c = ncclConfig_t::initializer();
        c.blocking = 0;
        c.commName = c"trainer".as_ptr();
        c.maxCTAs = 16;
        // SAFETY: a whole config.
        let got = unsafe { read(&c, true) }.unwrap();
        assert!(!got.blocking);
        assert_eq!(got.name.as_deref(), Some("trainer"));
        assert_eq!(got.max_ctas, Some(16));
        c.maxCTAs = 0;
        // SAFETY: as above.
        assert!(unsafe { read(&c, true) }.unwrap_err().message.contains("maxCTAs is 0"));
        c.maxCTAs = NCCL_CONFIG_UNDEF_INT;
        c.blocking = 2;
        // SAFETY: as above.
        let e = unsafe { read(&c, true) }.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("blocking is 2"), "{}", e.message);
    }

    #[test]
    fn a_wrong_magic_version_or_size_is_an_invalid_argument() {
        let mut c = ncclConfig_t::initializer();
        c.magic = 0;
        // SAFETY: a whole config.
        let e = unsafe { read(&c, true) }.unwrap_err();
        assert!(e.message.contains("magic"), "{}", e.message);
        let mut c = ncclConfig_t::initializer();
        c.version = 21300;
        // SAFETY: as above.
        assert!(unsafe { read(&c, true) }.unwrap_err().message.contains("version"));
        let mut c = ncclConfig_t::initializer();
        c.size = 16;
        // SAFETY: as above (the struct is longer than it claims).
        let e = unsafe { read(&c, true) }.unwrap_err();
        assert!(e.message.contains("size is 16"), "{}", e.message);
        let mut c = ncclConfig_t::initializer();
        c.splitShare = 5;
        // SAFETY: as above.
        assert!(unsafe { read(&c, true) }.unwrap_err().message.contains("splitShare"));
    }

    #[test]
    fn an_older_shorter_config_is_read_by_its_size() {
        // A 2.14 caller: its struct ends after netName; what lies beyond in memory is not its.
        let mut c = ncclConfig_t::initializer();
        c.size = OLDEST_SIZE;
        c.version = 21400;
        c.blocking = 0;
        c.splitShare = 77; // beyond its size: never read
        c.commName = 0x10 as *const std::ffi::c_char; // beyond its size: never read
        // SAFETY: the struct is longer than it claims.
        let (raw, size) = unsafe { copy_in(&c) }.unwrap();
        assert_eq!(size, OLDEST_SIZE);
        assert_eq!(raw.splitShare, NCCL_CONFIG_UNDEF_INT);
        assert!(raw.commName.is_null());
        let got = parse(&raw, true).unwrap();
        assert!(!got.blocking);
    }

    #[test]
    fn torch_2_15s_config_of_96_bytes_is_read_by_its_size() {
        // NCCL 2.30's ncclConfig_t ends after graphStreamOrdering; what lies beyond is not the caller's.
        let mut c = ncclConfig_t::initializer();
        c.size = 96;
        c.version = 23007;
        c.blocking = 0;
        c.graphStreamOrdering = 1;
        c.rmaEagerInit = 77; // beyond its size: never read
        // SAFETY: the struct is longer than it claims.
        let (raw, size) = unsafe { copy_in(&c) }.unwrap();
        assert_eq!(size, 96);
        assert_eq!(raw.rmaEagerInit, NCCL_CONFIG_UNDEF_INT);
        assert_eq!(ignored(&raw), vec![("graphStreamOrdering", 1)]);
        assert!(!parse(&raw, true).unwrap().blocking);
        c.size = size_of::<ncclConfig_t>();
        // SAFETY: a whole config.
        let e = unsafe { read(&c, true) }.unwrap_err();
        assert!(e.message.contains("rmaEagerInit is 77"), "{e}");
    }

    #[test]
    fn a_newer_longer_config_is_read_up_to_ours() {
        #[repr(C)]
        struct Newer {
            base: ncclConfig_t,
            later: [u64; 4],
        }
        let mut n = Newer {
            base: ncclConfig_t::initializer(),
            later: [u64::MAX; 4],
        };
        n.base.size = size_of::<Newer>();
        n.base.version = 23300;
        n.base.blocking = 1;
        // SAFETY: the struct is as long as it claims.
        let got = unsafe { read(&n.base, false) }.unwrap();
        assert!(got.blocking);
    }
}
