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
//! read it through `Setting::flag` / `int` / `choice` / `text` (or a `Source` in tests).
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

/// One environment setting.
#[derive(Debug)]
pub struct Setting {
    pub name: &'static str,
    /// The value in effect when the variable is unset or empty (`""`: none).
    pub default: &'static str,
    pub values: Values,
    pub on_bad: OnBadValue,
    pub doc: &'static str,
}

macro_rules! setting {
    ($id:ident, $name:literal, $default:literal, $values:expr, $on_bad:ident, $doc:literal) => {
        pub static $id: Setting = Setting {
            name: $name,
            default: $default,
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
    SENDRECV_LANES,
    "MSCCLPP_SENDRECV_LANES",
    "64",
    Values::Int { min: 1, max: 64 },
    Warn,
    "lanes from each rank to each other for send and receive (and the collectives built on them): a large send is cut into this many parts streamed at once, each by its own block; unset, 64 among up to four ranks and 32 among more; the same on every rank"
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

    /// Applies the setting's policy to a value that does not parse: a warning and the default, or an
    /// error naming the variable.
    fn bad<T>(&self, s: &'static Setting, value: &str, why: &str, default: T) -> Result<T> {
        match s.on_bad {
            OnBadValue::Error => Err(Error::invalid_argument(format!("{}=\"{value}\" is {why}", s.name))),
            OnBadValue::Warn => {
                if WARNED.lock().insert(s.name) {
                    log::warn!("{}=\"{value}\" is {why}; using the default {:?}", s.name, s.default);
                }
                Ok(default)
            }
        }
    }

    /// A `Values::Flag` setting.
    pub fn flag(&self, s: &'static Setting) -> Result<bool> {
        debug_assert_eq!(s.values, Values::Flag, "{}", s.name);
        let default = s.default == "1";
        match self.raw(s).as_deref() {
            None => Ok(default),
            Some("1") => Ok(true),
            Some("0") => Ok(false),
            Some(v) => self.bad(s, v, "not 1 or 0", default),
        }
    }

    /// A `Values::Int` setting, in range and converted to `T`.
    pub fn int<T: TryFrom<i64>>(&self, s: &'static Setting) -> Result<T> {
        let Values::Int { min, max } = s.values else {
            panic!("{} is not a number setting", s.name);
        };
        let convert =
            |v: i64| T::try_from(v).map_err(|_| Error::internal(format!("{}: {v} does not fit its type", s.name)));
        let default: i64 = s.default.parse().expect("declared defaults parse");
        match self.raw(s) {
            None => convert(default),
            Some(v) => match v.parse::<i64>() {
                Ok(n) if (min..=max).contains(&n) => convert(n),
                _ => {
                    let n = self.bad(s, &v, &format!("not a number in [{min}, {max}]"), default)?;
                    convert(n)
                }
            },
        }
    }

    /// A `Values::Choice` setting: the declared word (in its declared case).
    pub fn choice(&self, s: &'static Setting) -> Result<&'static str> {
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
                None => self.bad(s, &v, &format!("not one of {}", words.join(", ")), default),
            },
        }
    }

    /// A `Values::Text` setting; `None` when unset and without a default.
    pub fn text(&self, s: &'static Setting) -> Option<String> {
        debug_assert_eq!(s.values, Values::Text, "{}", s.name);
        self.raw(s)
            .or_else(|| (!s.default.is_empty()).then(|| s.default.to_string()))
    }
}

impl Setting {
    /// `Source::process().flag(self)`.
    pub fn flag(&'static self) -> Result<bool> {
        Source::process().flag(self)
    }
    /// `Source::process().int(self)`.
    pub fn int<T: TryFrom<i64>>(&'static self) -> Result<T> {
        Source::process().int(self)
    }
    /// `Source::process().choice(self)`.
    pub fn choice(&'static self) -> Result<&'static str> {
        Source::process().choice(self)
    }
    /// `Source::process().text(self)`.
    pub fn text(&'static self) -> Option<String> {
        Source::process().text(self)
    }
}

/// Logs every setting in effect at INFO (when a communicator is created).
pub fn log_in_effect() {
    if !log::log_enabled!(log::Level::Info) {
        return;
    }
    let env = Source::process();
    for s in ALL {
        match env.raw(s) {
            Some(v) => log::info!("{}={v} (set)", s.name),
            None if s.default.is_empty() => log::info!("{} unset", s.name),
            None => log::info!("{}={} (default)", s.name, s.default),
        }
    }
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
        assert_eq!(env.int::<u8>(&IB_PORT).unwrap(), 1);
        assert_eq!(env.int::<i32>(&IB_GID_INDEX).unwrap(), -1);
        assert!(env.flag(&P2P_FAST_FLAGS).unwrap());
        assert_eq!(env.choice(&P2P_FLAG).unwrap(), "copy");
        assert_eq!(env.text(&IBV_SO).as_deref(), Some("libibverbs.so.1"));
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
        assert_eq!(env.int::<u8>(&IB_PORT).unwrap(), 2);
        assert!(!env.flag(&P2P_FAST_FLAGS).unwrap());
        assert_eq!(env.choice(&P2P_FLAG).unwrap(), "epoch");
        assert_eq!(env.choice(&DEBUG).unwrap(), "INFO");
    }

    #[test]
    fn a_bad_value_is_an_error_naming_the_variable_or_a_warning_and_the_default() {
        let env = source(&[
            ("MSCCLPP_IB_PORT", "0"),
            ("MSCCLPP_IB_FLAG", "exact"),
            ("MSCCLPP_PEER_TIMEOUT", "soon"),
            ("MSCCLPP_P2P_FAST_FLAGS", "yes"),
        ]);
        let e = env.int::<u8>(&IB_PORT).unwrap_err();
        assert!(e.message.contains("MSCCLPP_IB_PORT=\"0\""), "{}", e.message);
        assert!(env.choice(&IB_FLAG).unwrap_err().message.contains("MSCCLPP_IB_FLAG"));
        assert_eq!(env.int::<u64>(&PEER_TIMEOUT).unwrap(), 30);
        assert!(env.flag(&P2P_FAST_FLAGS).unwrap());
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
            match s.values {
                Values::Flag => assert!(matches!(s.default, "0" | "1"), "{}", s.name),
                Values::Int { min, max } => {
                    let d: i64 = s.default.parse().unwrap();
                    assert!((min..=max).contains(&d), "{}", s.name);
                    env.int::<i64>(s).unwrap();
                }
                Values::Choice(_) => {
                    env.choice(s).unwrap();
                }
                Values::Text => {}
            }
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
            rest = &rest[i + word.len()..];
            // `MSCCLPP_*` in prose names them all, not one.
            if word.len() > "MSCCLPP_".len() {
                out.insert(word.trim_end_matches('_').to_string());
            }
        }
        out
    }

    #[test]
    fn the_settings_table_lists_every_setting_and_the_code_reads_no_other() {
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
        let mut macros = HashSet::new();
        for dir in ["include", "kernels", "kernels/collectives"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let text = std::fs::read_to_string(e.unwrap().path()).unwrap_or_default();
                macros.extend(text.lines().filter_map(|l| {
                    let name = l.trim().strip_prefix("#define ")?.split_whitespace().next()?;
                    Some(name.split('(').next()?.to_string())
                }));
            }
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
}
