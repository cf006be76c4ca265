//! Every `MSCCLPP_*` environment setting, declared once: its name, default, how it parses, what a bad
//! value does, and one line of documentation. Nothing else in the library reads the environment.
//!
//! The process environment is read once, at the first use of any setting, and kept: a setting means the
//! same thing for the whole life of the process. A bad value is either warned about (the warning names the
//! variable and the value, and the default applies) or, where running on could corrupt data or silently
//! talk past peers, an error naming the variable (`OnBadValue`). docs/settings.md's table lists every
//! setting; a test below fails when the table and this one differ, or when code elsewhere reads the
//! environment.
//!
//! To add a setting: declare a `pub static` here, add it to `ALL`, add a row to docs/settings.md's table, and
//! read it through `Setting::flag` / `int` / `choice` (a setting that warns), `checked_int` / `checked_choice`
//! (one whose bad value is an error), `text` / `text_value` (or a `Source` in tests).
//!
//! A setting's default is written once, in its declaration: the accessors return it where the variable is
//! unset or (for a setting that warns) bad, so that no caller writes a default of its own; a test below fails
//! where one does (a fallback after an accessor that can return none), and where docs/settings.md's default
//! column says another.
//!
//! Our settings carry the `MSCCLPP_` prefix. The few `NCCL_*` variables the NCCL face (`crate::nccl`)
//! honours are declared here too, under their NCCL names, since programs written for NCCL set them.

use crate::error::{Error, Result};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

/// How a setting's value is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// `1` or `0`.
    Flag,
    /// A whole number in `[min, max]`.
    Int { min: i64, max: i64 },
    /// One of the words (matched without regard to case).
    Choice(&'static [&'static str]),
    /// Any text (a path, a CPU list, an interface name); its user checks what it means.
    Text,
}

/// What a value that does not parse does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnBadValue {
    /// A warning naming the variable and the value; the default applies.
    Warn,
    /// An error naming the variable: running on could corrupt data or mismatch peers.
    Error,
}

/// A default that depends on the number of ranks of the communicator: above `ranks`, `value`; up to it,
/// the setting's `default`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Above {
    pub ranks: usize,
    pub value: &'static str,
}

/// One environment setting.
#[derive(Debug)]
pub struct Setting {
    pub name: &'static str,
    /// The value in effect when the variable is unset or empty (`""`: none); where `above` is given, among up
    /// to `above.ranks` ranks.
    pub default: &'static str,
    /// The default among more ranks, where it differs (read with `Source::int_among`).
    pub above: Option<Above>,
    pub values: Values,
    pub on_bad: OnBadValue,
    pub doc: &'static str,
}

macro_rules! setting {
    ($id:ident, $name:literal, $default:literal, $values:expr, $on_bad:ident, $doc:literal) => {
        pub static $id: Setting = Setting {
            name: $name,
            default: $default,
            above: None,
            values: $values,
            on_bad: OnBadValue::$on_bad,
            doc: $doc,
        };
    };
    // A default that depends on the number of ranks: `$default` up to `$ranks`, `$above` among more.
    ($id:ident, $name:literal, $default:literal, above $ranks:literal: $above:literal, $values:expr, $on_bad:ident,
     $doc:literal) => {
        pub static $id: Setting = Setting {
            name: $name,
            default: $default,
            above: Some(Above {
                ranks: $ranks,
                value: $above,
            }),
            values: $values,
            on_bad: OnBadValue::$on_bad,
            doc: $doc,
        };
    };
}

// ---- logging ----
setting!(
    DEBUG,
    "MSCCLPP_DEBUG",
    "WARN",
    Values::Choice(&["OFF", "NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"]),
    Warn,
    "log level"
);
setting!(
    DEBUG_FILE,
    "MSCCLPP_DEBUG_FILE",
    "",
    Values::Text,
    Warn,
    "file the default log handler writes to (`%h`: host name, `%p`: process id); standard error if unset"
);
// ---- bootstrap and failures ----
setting!(
    SOCKET_IFNAME,
    "MSCCLPP_SOCKET_IFNAME",
    "",
    Values::Text,
    Error,
    "network interface a unique id's root listens on (default: the first non-loopback IPv4 interface that is up)"
);
setting!(
    PEER_TIMEOUT,
    "MSCCLPP_PEER_TIMEOUT",
    "30",
    Values::Int { min: 1, max: 86400 },
    Warn,
    "seconds without a sign of life after which a peer rank is declared dead and the communicator aborted"
);
setting!(
    WAIT_TIMEOUT,
    "MSCCLPP_WAIT_TIMEOUT",
    "0",
    Values::Int { min: 0, max: 86400 },
    Warn,
    "seconds a kernel's `wait()` or `flush()` (built on this header) may spin before the communicator aborts with a report of it; 0: never"
);
setting!(
    ABORT_EXIT_TIMEOUT,
    "MSCCLPP_ABORT_EXIT_TIMEOUT",
    "0",
    Values::Int { min: 0, max: 86400 },
    Warn,
    "seconds after a communicator's abort within which it must be destroyed, or the library ends the process with exit status 75; 0: never"
);
// ---- proxies ----
setting!(
    PROXY_CPUS,
    "MSCCLPP_PROXY_CPUS",
    "",
    Values::Text,
    Warn,
    "CPUs the proxy threads run on, as a list like `0-7,16` (default: the GPU's NUMA node)"
);
setting!(
    P2P_FAST_FLAGS,
    "MSCCLPP_P2P_FAST_FLAGS",
    "1",
    Values::Flag,
    Warn,
    "`1`: P2P connections also get a fast flag in host memory shared with the peer; `0`: none"
);
setting!(
    P2P_FLAG,
    "MSCCLPP_P2P_FLAG",
    "copy",
    Values::Choice(&["copy", "epoch"]),
    Warn,
    "what a P2P flag writes: `copy`, the exact count by the copy engine; `epoch`, the legacy copy of the device epoch"
);
// ---- collectives ----
setting!(
    COLL_ALGO,
    "MSCCLPP_COLL_ALGO",
    "auto",
    Values::Choice(&["auto", "packet", "copy", "zerocopy", "copyengine", "sendrecv"]),
    Warn,
    "the algorithm of every collective: `auto`, by size (the table in src/collective/algorithm.rs), zero-copy on registered buffers at large sizes (zero_copy_from); `packet` or `copy` forces one through the scratch (for measurement); `zerocopy` tries zero-copy at every size; `copyengine` also tries the copy engine for every eager all-gather and broadcast; `sendrecv` sends every call that sends and receives can carry that way, at every size and on any placement (for tests and measurement)"
);
setting!(
    COLL_SCRATCH_MB,
    "MSCCLPP_COLL_SCRATCH_MB",
    "64",
    Values::Int { min: 1, max: 4096 },
    Warn,
    "MiB of data in each of the two slots of a communicator's scratch buffer, which peers write collectives' data into; larger calls are cut into windows of it"
);
setting!(
    DETERMINISTIC,
    "MSCCLPP_DETERMINISTIC",
    "0",
    Values::Flag,
    Error,
    "`1`: every reduction computes each element as one fixed expression of the ranks' values, in rank order, whatever the size, algorithm, buffer or mode (README, \"Reproducible reductions\"): reductions never take the rings and chains of sends and receives; the same on every rank"
);
// The lanes' default among up to four ranks and among more: why, at `send_recv::Shape::from_source`.
setting!(
    SENDRECV_LANES,
    "MSCCLPP_SENDRECV_LANES",
    "64",
    above 4: "32",
    Values::Int { min: 1, max: 64 },
    Warn,
    "lanes from each rank to each other for send and receive (and the collectives built on them): a large send is cut into this many parts streamed at once, each by its own block; the same on every rank"
);
setting!(
    SENDRECV_DEPTH,
    "MSCCLPP_SENDRECV_DEPTH",
    "2",
    Values::Int { min: 2, max: 8 },
    Warn,
    "slots of each send/receive lane in the receiver's memory: how many chunks a sender may be ahead of the receiver's copying out; the same on every rank"
);
setting!(
    SENDRECV_CHUNK_KB,
    "MSCCLPP_SENDRECV_CHUNK_KB",
    "512",
    Values::Int { min: 16, max: 4096 },
    Warn,
    "KiB of each slot of a send/receive lane, the largest chunk that crosses at once (smaller where many ranks would make the area exceed 128 MiB); the same on every rank"
);
// ---- InfiniBand ----
setting!(
    IB_PORT,
    "MSCCLPP_IB_PORT",
    "1",
    Values::Int { min: 1, max: 255 },
    Error,
    "port of the InfiniBand device (1-based)"
);
setting!(
    IB_GID_INDEX,
    "MSCCLPP_IB_GID_INDEX",
    "-1",
    Values::Int { min: -1, max: 255 },
    Error,
    "`-1`: address peers by LID (InfiniBand); `>= 0`: by that GID (RoCE)"
);
setting!(
    IB_CQ_SIZE,
    "MSCCLPP_IB_CQ_SIZE",
    "1024",
    Values::Int { min: 1, max: 1 << 22 },
    Error,
    "entries of each IB connection's completion queue"
);
setting!(
    IB_CQ_POLL_BATCH,
    "MSCCLPP_IB_CQ_POLL_BATCH",
    "16",
    Values::Int { min: 1, max: 4096 },
    Error,
    "completions the IB proxy takes per poll"
);
setting!(
    IB_QP_DEPTH,
    "MSCCLPP_IB_QP_DEPTH",
    "256",
    Values::Int { min: 1, max: 1 << 16 },
    Error,
    "send work requests each IB queue pair holds"
);
setting!(
    IBV_SO,
    "MSCCLPP_IBV_SO",
    "libibverbs.so.1",
    Values::Text,
    Error,
    "the libibverbs to load"
);
setting!(
    IB_FLAG,
    "MSCCLPP_IB_FLAG",
    "count",
    Values::Choice(&["count", "epoch"]),
    Error,
    "what an IB flag writes: `count`, the exact count inline; `epoch`, the legacy RDMA write of the device epoch"
);
// ---- NCCL's variables, honoured by the NCCL face ----
setting!(
    NCCL_DEBUG,
    "NCCL_DEBUG",
    "WARN",
    Values::Choice(&["VERSION", "WARN", "INFO", "ABORT", "TRACE"]),
    Warn,
    "the NCCL face's log level when `MSCCLPP_DEBUG` is unset: `INFO` and `TRACE` as ours, the others `WARN`"
);
setting!(
    NCCL_DEBUG_FILE,
    "NCCL_DEBUG_FILE",
    "",
    Values::Text,
    Warn,
    "the NCCL face's log file when `MSCCLPP_DEBUG_FILE` is unset (same `%h` and `%p`)"
);
setting!(
    NCCL_COMM_ID,
    "NCCL_COMM_ID",
    "",
    Values::Text,
    Error,
    "`ip:port` where rank 0 of every communicator listens; the unique id is then not used"
);
setting!(
    NCCL_COMM_BLOCKING,
    "NCCL_COMM_BLOCKING",
    "1",
    Values::Flag,
    Warn,
    "`0`: communicators whose `ncclConfig_t` leaves `blocking` undefined initialise in the background"
);
setting!(
    NCCL_FALLBACK,
    "MSCCLPP_NCCL_FALLBACK",
    "",
    Values::Text,
    Warn,
    "path of NVIDIA's libnccl.so.2 (2.28 or later): the NCCL face makes an NVIDIA communicator beside each of its own and sends it what it does not carry out, and every collective of ranks on several hosts"
);

// ---- the Python package ----
setting!(
    PYTHON_FASTCALL,
    "MSCCLPP_PYTHON_FASTCALL",
    "1",
    Values::Flag,
    Warn,
    "read by the Python package at import (the library only logs it): `0` turns off the collectives' compiled fast path (`mscclpp._fastcall`), every call then going through ctypes; `1`: on where it was built"
);

/// Every setting, in the order docs/settings.md lists them.
pub static ALL: &[&Setting] = &[
    &DEBUG,
    &DEBUG_FILE,
    &SOCKET_IFNAME,
    &PEER_TIMEOUT,
    &WAIT_TIMEOUT,
    &ABORT_EXIT_TIMEOUT,
    &PROXY_CPUS,
    &P2P_FAST_FLAGS,
    &P2P_FLAG,
    &COLL_ALGO,
    &COLL_SCRATCH_MB,
    &DETERMINISTIC,
    &SENDRECV_LANES,
    &SENDRECV_DEPTH,
    &SENDRECV_CHUNK_KB,
    &IB_PORT,
    &IB_GID_INDEX,
    &IB_CQ_SIZE,
    &IB_CQ_POLL_BATCH,
    &IB_QP_DEPTH,
    &IBV_SO,
    &IB_FLAG,
    &NCCL_DEBUG,
    &NCCL_DEBUG_FILE,
    &NCCL_COMM_ID,
    &NCCL_COMM_BLOCKING,
    &NCCL_FALLBACK,
    &PYTHON_FASTCALL,
];

/// The process environment's values of the declared settings, read once.
static ENVIRONMENT: Lazy<HashMap<&'static str, String>> = Lazy::new(|| {
    ALL.iter()
        .filter_map(|s| std::env::var(s.name).ok().map(|v| (s.name, v)))
        .collect()
});

/// Whether CUDA's `CUDA_VISIBLE_DEVICES` hides every device from this process: set and empty, or its first
/// entry a negative number (CUDA stops at the first entry that names no device). Not a setting of ours: the
/// driver is then not loaded at all, since it could show no device, and loading it costs a host-only
/// process (a control-plane job, a launcher) a quarter of a second of CPU or more; a thousand of them on
/// sixteen cores spent 18 s in it (docs/PERFORMANCE.md). Read here so that this file stays the one place that
/// reads the environment.
pub fn cuda_hides_every_device() -> bool {
    hides_every_device(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref())
}

fn hides_every_device(visible: Option<&str>) -> bool {
    let Some(visible) = visible else { return false };
    let first = visible.split(',').next().unwrap_or("").trim();
    first.is_empty() || first.parse::<i64>().is_ok_and(|i| i < 0)
}

/// The dynamic loader's `LD_LIBRARY_PATH`, read now: not a setting of ours, but where the search for
/// NVIDIA's library between hosts looks (`nccl/engine_search.rs`), after the Python packages' folders. Read
/// here so that this file stays the one place that reads the environment.
pub fn loader_library_path() -> Option<String> {
    std::env::var("LD_LIBRARY_PATH").ok()
}

/// Settings already warned about, so that a bad value is reported once, not at every read.
static WARNED: Lazy<Mutex<HashSet<&'static str>>> = Lazy::new(Default::default);

/// Looks a variable up by name.
type Lookup<'a> = Box<dyn Fn(&str) -> Option<String> + 'a>;

/// Where values come from: the process environment (read once), or a lookup (tests).
pub struct Source<'a> {
    lookup: Lookup<'a>,
}

impl Source<'static> {
    /// The process environment, as read at the first use of any setting.
    pub fn process() -> Source<'static> {
        Source {
            lookup: Box::new(|name| ENVIRONMENT.get(name).cloned()),
        }
    }
}

impl Source<'static> {
    /// The process environment as it is now, not as it was first read: only for the log level, which
    /// `ncclResetDebugInit` asks to read again (programs set `NCCL_DEBUG` after loading the library).
    pub fn live() -> Source<'static> {
        Source {
            lookup: Box::new(|name| std::env::var(name).ok()),
        }
    }
}

impl<'a> Source<'a> {
    pub fn from_fn(lookup: impl Fn(&str) -> Option<String> + 'a) -> Source<'a> {
        Source {
            lookup: Box::new(lookup),
        }
    }

    /// The value set for `s`, trimmed; `None` when unset or empty.
    pub fn raw(&self, s: &Setting) -> Option<String> {
        (self.lookup)(s.name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// Applies `policy` to a value of `s` that does not parse: a warning and `default` (`shown` in the
    /// warning), or an error naming the variable.
    fn bad<T>(
        &self,
        s: &'static Setting,
        policy: OnBadValue,
        value: &str,
        why: &str,
        (default, shown): (T, &str),
    ) -> Result<T> {
        match policy {
            OnBadValue::Error => Err(Error::invalid_argument(format!("{}=\"{value}\" is {why}", s.name))),
            OnBadValue::Warn => {
                if WARNED.lock().insert(s.name) {
                    log::warn!("{}=\"{value}\" is {why}; using the default {shown:?}", s.name);
                }
                Ok(default)
            }
        }
    }

    fn parse_flag(&self, s: &'static Setting, policy: OnBadValue) -> Result<bool> {
        debug_assert_eq!(s.values, Values::Flag, "{}", s.name);
        let default = s.default == "1";
        match self.raw(s).as_deref() {
            None => Ok(default),
            Some("1") => Ok(true),
            Some("0") => Ok(false),
            Some(v) => self.bad(s, policy, v, "not 1 or 0", (default, s.default)),
        }
    }

    /// The number set for `s`, in its range, else `default` (one of its declared defaults).
    fn parse_int(&self, s: &'static Setting, policy: OnBadValue, default: &'static str) -> Result<i64> {
        let Values::Int { min, max } = s.values else {
            panic!("{} is not a number setting", s.name);
        };
        let n: i64 = default.parse().expect("declared defaults parse");
        match self.raw(s) {
            None => Ok(n),
            Some(v) => match v.parse::<i64>() {
                Ok(set) if (min..=max).contains(&set) => Ok(set),
                _ => self.bad(s, policy, &v, &format!("not a number in [{min}, {max}]"), (n, default)),
            },
        }
    }

    fn parse_choice(&self, s: &'static Setting, policy: OnBadValue) -> Result<&'static str> {
        let Values::Choice(words) = s.values else {
            panic!("{} is not a choice setting", s.name);
        };
        let default = words
            .iter()
            .copied()
            .find(|w| w.eq_ignore_ascii_case(s.default))
            .expect("declared defaults are among the choices");
        match self.raw(s) {
            None => Ok(default),
            Some(v) => match words.iter().copied().find(|w| w.eq_ignore_ascii_case(&v)) {
                Some(w) => Ok(w),
                None => self.bad(
                    s,
                    policy,
                    &v,
                    &format!("not one of {}", words.join(", ")),
                    (default, s.default),
                ),
            },
        }
    }

    /// A `Values::Flag` setting that warns (`OnBadValue::Warn`): the value set, else the declared default
    /// (where it is unset, or bad: after a warning).
    pub fn flag(&self, s: &'static Setting) -> bool {
        read_as(s, OnBadValue::Warn);
        warned(self.parse_flag(s, OnBadValue::Warn))
    }

    /// A `Values::Int` setting that warns, as `flag` does, converted to `T` (which its range fits).
    pub fn int<T: TryFrom<i64>>(&self, s: &'static Setting) -> T {
        debug_assert!(
            s.above.is_none(),
            "{}: its default depends on the ranks (int_among)",
            s.name
        );
        self.warned_int(s, s.default)
    }

    /// A `Values::Int` setting that warns, among `nranks` ranks: the value set, else the declared default
    /// for `nranks` (`Setting::above`).
    pub fn int_among<T: TryFrom<i64>>(&self, s: &'static Setting, nranks: usize) -> T {
        self.warned_int(s, s.default_among(nranks))
    }

    fn warned_int<T: TryFrom<i64>>(&self, s: &'static Setting, default: &'static str) -> T {
        read_as(s, OnBadValue::Warn);
        let n = warned(self.parse_int(s, OnBadValue::Warn, default));
        T::try_from(n).unwrap_or_else(|_| panic!("{}: {n} does not fit the type it is read as", s.name))
    }

    /// A `Values::Choice` setting that warns, as `flag` does: the declared word (in its declared case).
    pub fn choice(&self, s: &'static Setting) -> &'static str {
        read_as(s, OnBadValue::Warn);
        warned(self.parse_choice(s, OnBadValue::Warn))
    }

    /// A `Values::Int` setting whose bad value is an error (`OnBadValue::Error`): the value set, else the
    /// declared default; a bad value, an error naming the variable.
    pub fn checked_int<T: TryFrom<i64>>(&self, s: &'static Setting) -> Result<T> {
        read_as(s, OnBadValue::Error);
        debug_assert!(s.above.is_none(), "{}", s.name);
        let n = self.parse_int(s, OnBadValue::Error, s.default)?;
        T::try_from(n).map_err(|_| Error::internal(format!("{}: {n} does not fit its type", s.name)))
    }

    /// A `Values::Flag` setting whose bad value is an error, as `checked_int`.
    pub fn checked_flag(&self, s: &'static Setting) -> Result<bool> {
        read_as(s, OnBadValue::Error);
        self.parse_flag(s, OnBadValue::Error)
    }

    /// A `Values::Choice` setting whose bad value is an error, as `checked_int`.
    pub fn checked_choice(&self, s: &'static Setting) -> Result<&'static str> {
        read_as(s, OnBadValue::Error);
        self.parse_choice(s, OnBadValue::Error)
    }

    /// A `Values::Text` setting declared without a default: `None` where unset (its reader says what that
    /// means).
    pub fn text(&self, s: &'static Setting) -> Option<String> {
        debug_assert_eq!(s.values, Values::Text, "{}", s.name);
        debug_assert!(
            s.default.is_empty(),
            "{}: it has a default; read it with text_value",
            s.name
        );
        self.raw(s)
    }

    /// A `Values::Text` setting declared with a default: the value set, else the default.
    pub fn text_value(&self, s: &'static Setting) -> String {
        debug_assert_eq!(s.values, Values::Text, "{}", s.name);
        debug_assert!(
            !s.default.is_empty(),
            "{}: it has no default; read it with text",
            s.name
        );
        self.raw(s).unwrap_or_else(|| s.default.to_string())
    }
}

/// Debug builds: `s` is read with an accessor of its policy: `flag`, `int`, `int_among` or `choice` where a bad
/// value warns, `checked_*` where it is an error (a test checks every reader in src/).
fn read_as(s: &Setting, policy: OnBadValue) {
    debug_assert_eq!(
        s.on_bad, policy,
        "{} is read with an accessor of another policy",
        s.name
    );
}

/// The value of a setting that warns: its reading never fails (a bad value yields the default).
fn warned<T>(read: Result<T>) -> T {
    read.unwrap_or_else(|e| unreachable!("a setting that warns read as an error: {}", e.message))
}

impl Setting {
    /// The default among `nranks` ranks.
    pub fn default_among(&self, nranks: usize) -> &'static str {
        match self.above {
            Some(above) if nranks > above.ranks => above.value,
            _ => self.default,
        }
    }

    /// The default as the INFO log and docs/settings.md's table state it (`64`, or `64 up to 4 ranks, 32
    /// above`); `None` where there is none.
    pub fn default_text(&self) -> Option<String> {
        match self.above {
            _ if self.default.is_empty() => None,
            None => Some(self.default.to_string()),
            Some(Above { ranks, value }) => Some(format!("{} up to {ranks} ranks, {value} above", self.default)),
        }
    }

    /// `Source::process().flag(self)`.
    pub fn flag(&'static self) -> bool {
        Source::process().flag(self)
    }
    /// `Source::process().int(self)`.
    pub fn int<T: TryFrom<i64>>(&'static self) -> T {
        Source::process().int(self)
    }
    /// `Source::process().int_among(self, nranks)`.
    pub fn int_among<T: TryFrom<i64>>(&'static self, nranks: usize) -> T {
        Source::process().int_among(self, nranks)
    }
    /// `Source::process().choice(self)`.
    pub fn choice(&'static self) -> &'static str {
        Source::process().choice(self)
    }
    /// `Source::process().checked_int(self)`.
    pub fn checked_int<T: TryFrom<i64>>(&'static self) -> Result<T> {
        Source::process().checked_int(self)
    }
    /// `Source::process().checked_flag(self)`.
    pub fn checked_flag(&'static self) -> Result<bool> {
        Source::process().checked_flag(self)
    }
    /// `Source::process().checked_choice(self)`.
    pub fn checked_choice(&'static self) -> Result<&'static str> {
        Source::process().checked_choice(self)
    }
    /// `Source::process().text(self)`.
    pub fn text(&'static self) -> Option<String> {
        Source::process().text(self)
    }
    /// `Source::process().text_value(self)`.
    pub fn text_value(&'static self) -> String {
        Source::process().text_value(self)
    }
}

/// Logs every setting in effect at INFO (when a communicator is created).
pub fn log_in_effect() {
    if !log::log_enabled!(log::Level::Info) {
        return;
    }
    for line in in_effect(&Source::process()) {
        log::info!("{line}");
    }
}

/// A line per setting: `NAME=value (set)`, `NAME=default (default)` or `NAME unset`.
fn in_effect(env: &Source) -> Vec<String> {
    ALL.iter()
        .map(|s| match (env.raw(s), s.default_text()) {
            (Some(v), _) => format!("{}={v} (set)", s.name),
            (None, None) => format!("{} unset", s.name),
            (None, Some(default)) => format!("{}={default} (default)", s.name),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(pairs: &'static [(&'static str, &'static str)]) -> Source<'static> {
        Source::from_fn(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn defaults_apply_when_unset_or_empty() {
        let env = source(&[("MSCCLPP_IB_PORT", "  ")]);
        assert_eq!(env.checked_int::<u8>(&IB_PORT).unwrap(), 1);
        assert_eq!(env.checked_int::<i32>(&IB_GID_INDEX).unwrap(), -1);
        assert!(env.flag(&P2P_FAST_FLAGS));
        assert_eq!(env.choice(&P2P_FLAG), "copy");
        assert_eq!(env.int::<u64>(&PEER_TIMEOUT), 30);
        assert_eq!(env.text_value(&IBV_SO), "libibverbs.so.1");
        assert_eq!(env.text(&PROXY_CPUS), None);
    }

    #[test]
    fn values_parse_and_choices_ignore_case() {
        let env = source(&[
            ("MSCCLPP_IB_PORT", " 2 "),
            ("MSCCLPP_P2P_FAST_FLAGS", "0"),
            ("MSCCLPP_P2P_FLAG", "EPOCH"),
            ("MSCCLPP_DEBUG", "info"),
        ]);
        assert_eq!(env.checked_int::<u8>(&IB_PORT).unwrap(), 2);
        assert!(!env.flag(&P2P_FAST_FLAGS));
        assert_eq!(env.choice(&P2P_FLAG), "epoch");
        assert_eq!(env.choice(&DEBUG), "INFO");
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_variable_or_a_warning_and_the_default() {
        let env = source(&[
            ("MSCCLPP_IB_PORT", "0"),
            ("MSCCLPP_IB_FLAG", "exact"),
            ("MSCCLPP_PEER_TIMEOUT", "soon"),
            ("MSCCLPP_P2P_FAST_FLAGS", "yes"),
        ]);
        let e = env.checked_int::<u8>(&IB_PORT).unwrap_err();
        assert!(e.message.contains("MSCCLPP_IB_PORT=\"0\""), "{}", e.message);
        assert!(
            env.checked_choice(&IB_FLAG)
                .unwrap_err()
                .message
                .contains("MSCCLPP_IB_FLAG")
        );
        assert_eq!(env.int::<u64>(&PEER_TIMEOUT), 30);
        assert!(env.flag(&P2P_FAST_FLAGS));
    }

    #[test]
    fn every_device_hidden_only_by_an_empty_list_or_a_negative_first_entry() {
        for hidden in ["", " ", "-1", "-1,0", ",0"] {
            assert!(hides_every_device(Some(hidden)), "{hidden:?}");
        }
        for shown in ["0", "1,0", "GPU-5c1e", "MIG-1", "0,-1"] {
            assert!(!hides_every_device(Some(shown)), "{shown:?}");
        }
        assert!(!hides_every_device(None));
    }

    #[test]
    fn declarations_are_consistent() {
        let mut names = HashSet::new();
        for s in ALL {
            assert!(
                s.name.starts_with("MSCCLPP_") || s.name.starts_with("NCCL_"),
                "{}",
                s.name
            );
            assert!(names.insert(s.name), "{} declared twice", s.name);
            assert!(!s.doc.is_empty(), "{} has no documentation", s.name);
            let env = Source::from_fn(|_| None);
            let warns = s.on_bad == OnBadValue::Warn;
            match s.values {
                Values::Flag => assert!(matches!(s.default, "0" | "1"), "{}", s.name),
                Values::Int { min, max } => {
                    for d in std::iter::once(s.default).chain(s.above.map(|a| a.value)) {
                        let d: i64 = d.parse().unwrap();
                        assert!((min..=max).contains(&d), "{}", s.name);
                    }
                    if let Some(above) = s.above {
                        assert!(warns && above.ranks >= 1, "{}", s.name);
                        assert_eq!(env.int_among::<i64>(s, above.ranks), s.default.parse::<i64>().unwrap());
                        assert_eq!(
                            env.int_among::<i64>(s, above.ranks + 1),
                            above.value.parse::<i64>().unwrap()
                        );
                    } else if warns {
                        env.int::<i64>(s);
                    } else {
                        env.checked_int::<i64>(s).unwrap();
                    }
                }
                Values::Choice(_) if warns => {
                    env.choice(s);
                }
                Values::Choice(_) => {
                    env.checked_choice(s).unwrap();
                }
                Values::Text => {}
            }
            assert!(
                s.above.is_none() || matches!(s.values, Values::Int { .. }),
                "{}",
                s.name
            );
        }
    }

    /// Every `.rs` file under `dir`, with its text.
    fn sources(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }

    /// The `MSCCLPP_[A-Z0-9_]+` words of a text.
    fn setting_names(text: &str) -> HashSet<String> {
        let mut out = HashSet::new();
        let mut rest = text;
        while let Some(i) = rest.find("MSCCLPP_") {
            let word: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A name that only ends so (`LIBMSCCLPP_KERNEL_TYPES`, a variable of the build) is no setting.
            let inside_a_name = rest[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            rest = &rest[i + word.len()..];
            // `MSCCLPP_*` in prose names them all, not one.
            if word.len() > "MSCCLPP_".len() && !inside_a_name {
                out.insert(word.trim_end_matches('_').to_string());
            }
        }
        out
    }

    #[test]
    fn the_settings_table_lists_every_setting_and_the_code_reads_no_other() {
        assert_eq!(
            setting_names("LIBMSCCLPP_KERNEL_TYPES, MSCCLPP_DEBUG and MSCCLPP_*"),
            HashSet::from(["MSCCLPP_DEBUG".to_string()])
        );
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let doc = std::fs::read_to_string(root.join("docs/settings.md")).unwrap();
        let table: HashSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter(|l| l.starts_with("MSCCLPP_") || l.starts_with("NCCL_"))
            .map(|l| l[..l.find('`').unwrap()].to_string())
            .collect();
        let declared: HashSet<String> = ALL.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(table, declared, "docs/settings.md's table and settings::ALL differ");

        // The header's macros (`MSCCLPP_PROXY_FIFO_SIZE`, feature macros) are named in comments; they are
        // not settings.
        // So are the macros of the device header build.rs writes (`coll_args.cuh`).
        let mut texts = vec![include_str!(concat!(env!("OUT_DIR"), "/kernels-include/coll_args.cuh")).to_string()];
        for dir in ["include", "kernels", "kernels/collectives"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                texts.push(std::fs::read_to_string(e.unwrap().path()).unwrap_or_default());
            }
        }
        let mut macros = HashSet::new();
        for text in &texts {
            macros.extend(text.lines().filter_map(|l| {
                let name = l.trim().strip_prefix("#define ")?.split_whitespace().next()?;
                Some(name.split('(').next()?.to_string())
            }));
        }
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        for (path, text) in &files {
            if path.ends_with("settings.rs") {
                continue;
            }
            for call in ["env::var(", "env::var_os(", "env::vars(", "getenv("] {
                assert!(
                    !text.contains(call),
                    "{} reads the environment ({call}); declare the setting in settings.rs",
                    path.display()
                );
            }
            for name in setting_names(text) {
                if macros.contains(&name) {
                    continue;
                }
                assert!(
                    declared.contains(&name),
                    "{} names {name}, which is not a declared setting",
                    path.display()
                );
            }
        }
    }

    #[test]
    fn the_info_log_names_each_setting_with_its_value_or_its_default() {
        let lines = in_effect(&source(&[("MSCCLPP_PEER_TIMEOUT", "5")]));
        assert_eq!(lines.len(), ALL.len());
        for line in [
            "MSCCLPP_PEER_TIMEOUT=5 (set)",
            "MSCCLPP_COLL_SCRATCH_MB=64 (default)",
            "MSCCLPP_SENDRECV_LANES=64 up to 4 ranks, 32 above (default)",
            "MSCCLPP_DEBUG_FILE unset",
        ] {
            assert!(lines.iter().any(|l| l == line), "no line {line:?} in {lines:#?}");
        }
    }

    #[test]
    fn docs_settings_md_states_every_declared_default_and_what_a_bad_value_does() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let doc = std::fs::read_to_string(root.join("docs/settings.md")).unwrap();
        let mut rows = 0;
        for line in doc.lines() {
            let Some(row) = line.strip_prefix("| `") else {
                continue;
            };
            let cells: Vec<&str> = row.splitn(4, " | ").map(str::trim).collect();
            let Some(s) = ALL.iter().find(|s| cells[0].strip_suffix('`') == Some(s.name)) else {
                continue;
            };
            rows += 1;
            let bad = match s.on_bad {
                OnBadValue::Warn => "warn",
                OnBadValue::Error => "error",
            };
            assert_eq!(cells[2], bad, "{}: docs/settings.md's bad value column", s.name);
            match s.default_text() {
                Some(default) => assert_eq!(
                    cells[1].replace('`', ""),
                    default,
                    "{}: docs/settings.md's default column and the declared default differ",
                    s.name
                ),
                None => assert!(
                    !cells[1].starts_with('`'),
                    "{} is declared without a default, yet docs/settings.md's default column gives one: {}",
                    s.name,
                    cells[1]
                ),
            }
        }
        assert_eq!(rows, ALL.len());
    }

    /// The settings declared in this file by the name of their `static` (`setting!(ID, "NAME", ...)`).
    fn declared_ids() -> HashMap<String, &'static Setting> {
        let mut ids = HashMap::new();
        for part in include_str!("settings.rs").split("setting!(").skip(1) {
            let mut words = part.split(',').map(str::trim);
            if let (Some(id), Some(name)) = (words.next(), words.next())
                && let Some(s) = ALL.iter().find(|s| name.trim_matches('"') == s.name)
            {
                ids.insert(id.to_string(), *s);
            }
        }
        assert_eq!(ids.len(), ALL.len(), "{:?}", ids.keys());
        ids
    }

    /// What may read a setting, and what it can be read as.
    const ACCESSORS: [&str; 10] = [
        "flag",
        "checked_flag",
        "int",
        "int_among",
        "choice",
        "checked_int",
        "checked_choice",
        "text",
        "text_value",
        "raw",
    ];
    /// What after a reading would put a default of the reader's own beside the declared one.
    const FALLBACKS: [&str; 6] = [
        ".unwrap_or(",
        ".unwrap_or_else(",
        ".unwrap_or_default(",
        ".ok()",
        ".or(",
        ".or_else(",
    ];

    /// Where `text` reads a declared setting (`X.int()`, `env.int(&X)`, `env.int::<u8>(&crate::settings::X)`)
    /// with an accessor that does not fit its declaration, or with a fallback of its own after an accessor
    /// that can return none where the setting has a default: a line for each, and how many reads it found.
    fn misreads(text: &str, ids: &HashMap<String, &'static Setting>) -> (Vec<String>, usize) {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let (mut found, mut reads) = (Vec::new(), 0);
        for accessor in ACCESSORS {
            for call in [format!(".{accessor}("), format!(".{accessor}::<")] {
                for (at, _) in text.match_indices(&call) {
                    let before = text[..at].trim_end();
                    let receiver = &before[before.trim_end_matches(ident).len()..];
                    let open = at + text[at..].find('(').expect("the call's parenthesis");
                    let arg = text[open + 1..].trim_start().trim_start_matches('&');
                    let arg = &arg[..arg.find(|c: char| !ident(c) && c != ':').unwrap_or(arg.len())];
                    let id = if ids.contains_key(receiver) {
                        receiver
                    } else {
                        arg.rsplit("::").next().unwrap_or(arg)
                    };
                    let Some(s) = ids.get(id) else {
                        continue;
                    };
                    reads += 1;
                    let mut depth = 0;
                    let close = open
                        + text[open..]
                            .find(|c| {
                                depth += match c {
                                    '(' => 1,
                                    ')' => -1,
                                    _ => 0,
                                };
                                depth == 0
                            })
                            .expect("the call's closing parenthesis");
                    let after = text[close + 1..].trim_start();
                    let line = text[..at].matches('\n').count() + 1;
                    let warns = s.on_bad == OnBadValue::Warn;
                    let fits = match accessor {
                        "flag" | "choice" => warns,
                        "int" => warns && s.above.is_none(),
                        "int_among" => warns && s.above.is_some(),
                        "checked_int" | "checked_choice" | "checked_flag" => !warns,
                        "text" => s.default.is_empty(),
                        "text_value" => !s.default.is_empty(),
                        _ => true,
                    };
                    if !fits {
                        found.push(format!(
                            "line {line}: {id} is read with {accessor}, which its declaration does not fit"
                        ));
                    }
                    if !s.default.is_empty()
                        && let Some(fallback) = FALLBACKS.iter().find(|f| after.starts_with(**f))
                    {
                        found.push(format!(
                            "line {line}: {id} is read with a default of its own ({fallback}...) beside the declared {:?}",
                            s.default
                        ));
                    }
                }
            }
        }
        (found, reads)
    }

    #[test]
    fn every_reader_takes_the_declared_default_and_writes_none_of_its_own() {
        let ids = declared_ids();
        // What the scan finds, on made-up readers.
        for (reader, wrong) in [
            ("let s: u64 = crate::settings::PEER_TIMEOUT.int().unwrap_or(30);", true),
            ("env.checked_int(&IB_PORT).unwrap_or(1)", true),
            ("env.checked_int::<u8>(\n    &crate::settings::IB_PORT,\n)\n.ok()", true),
            ("crate::settings::IBV_SO\n    .text()", true),
            ("env.int(&IB_CQ_SIZE)", true),
            ("source.int(&SENDRECV_LANES)", true),
            ("env.raw(&COLL_ALGO).unwrap_or_else(|| \"auto\".into())", true),
            ("env.checked_int(&IB_PORT)?", false),
            ("crate::settings::PEER_TIMEOUT.int()", false),
            ("source.int_among(&SENDRECV_LANES, nranks)", false),
            ("SOCKET_IFNAME.text().unwrap_or_default()", false),
            ("env.raw(&crate::settings::DEBUG).is_none()", false),
        ] {
            let (found, reads) = misreads(reader, &ids);
            assert_eq!(reads, 1, "{reader}");
            assert_eq!(!found.is_empty(), wrong, "{reader}: {found:?}");
        }

        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        sources(&root.join("src"), &mut files);
        let (mut found, mut reads) = (Vec::new(), 0);
        for (path, text) in &files {
            // This file's tests hold made-up readers (above).
            let text = match text.find("\n#[cfg(test)]\nmod tests {") {
                Some(end) if path.ends_with("settings.rs") => &text[..end],
                _ => text.as_str(),
            };
            let (mut here, n) = misreads(text, &ids);
            reads += n;
            found.extend(here.drain(..).map(|f| format!("{}: {f}", path.display())));
        }
        assert!(found.is_empty(), "{found:#?}");
        // Every setting's readers outside the tests: the scan sees them (or it proves nothing).
        assert!(reads >= 30, "the scan found {reads} reads of settings in src/");
    }
}
