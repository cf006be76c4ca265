//! Logging: the `log` crate's macros everywhere, one logger that formats each line with the rank and the
//! subsystem, and hands it to the handler the application set (`set_handler`), else to the default one.
//!
//! `MSCCLPP_DEBUG=WARN|INFO|TRACE` (also `ERROR`, `DEBUG`, `OFF`; default `WARN`) sets the level.
//! The default handler writes to `MSCCLPP_DEBUG_FILE` when it is set (`%h` becomes the host name and `%p`
//! the process id), else to standard error.
//!
//! Where the NCCL face installs the logger first (`init_for_nccl`: the process's first call into the core is
//! one of `libnccl.so.2`'s, not one of `mscclpp.h`'s), `NCCL_DEBUG` and `NCCL_DEBUG_FILE` stand in for our
//! two when those are unset: a program run with NCCL's settings gets our log lines the way it asked for
//! NCCL's.

use crate::types::mscclppLogHandler_t;
use log::{Level, LevelFilter, Log, Metadata, Record};
use once_cell::sync::{Lazy, OnceCell};
use parking_lot::{Mutex, RwLock};
use std::cell::Cell;
use std::ffi::{CStr, CString, c_char};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// The rank this thread is working for; set at the FFI boundary and in threads a communicator owns.
    static CURRENT_RANK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks the calling thread as working for `rank` until the guard is dropped.
pub struct RankScope(Option<usize>);

impl RankScope {
    pub fn enter(rank: usize) -> RankScope {
        RankScope(CURRENT_RANK.with(|r| r.replace(Some(rank))))
    }
}

impl Drop for RankScope {
    fn drop(&mut self) {
        CURRENT_RANK.with(|r| r.set(self.0));
    }
}

/// Sets the rank of a thread for its whole life (proxy and bootstrap threads).
pub fn set_thread_rank(rank: usize) {
    CURRENT_RANK.with(|r| r.set(Some(rank)));
}

static HANDLER: RwLock<mscclppLogHandler_t> = RwLock::new(None);
/// Whether the logger was installed by the NCCL face, whose settings then stand in for unset ones of ours.
static NCCL_FACE: AtomicBool = AtomicBool::new(false);
static DEBUG_FILE: Lazy<Option<Mutex<File>>> = Lazy::new(|| {
    let pattern = crate::settings::DEBUG_FILE.text().or_else(|| {
        NCCL_FACE
            .load(Ordering::Relaxed)
            .then(|| crate::settings::NCCL_DEBUG_FILE.text())
            .flatten()
    })?;
    let path = debug_file_path(&pattern, &hostname(), std::process::id());
    match File::create(&path) {
        Ok(f) => Some(Mutex::new(f)),
        Err(e) => {
            eprintln!("MSCCLPP WARN cannot open MSCCLPP_DEBUG_FILE {path}: {e}; logging to stderr");
            None
        }
    }
});

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn debug_file_path(pattern: &str, host: &str, pid: u32) -> String {
    pattern.replace("%h", host).replace("%p", &pid.to_string())
}

/// Parses `MSCCLPP_DEBUG`. Unknown values fall back to WARN.
pub fn parse_level(value: Option<&str>) -> LevelFilter {
    match value.map(|v| v.trim().to_ascii_uppercase()).as_deref() {
        Some("OFF") | Some("NONE") => LevelFilter::Off,
        Some("ERROR") => LevelFilter::Error,
        Some("INFO") => LevelFilter::Info,
        Some("DEBUG") => LevelFilter::Debug,
        Some("TRACE") => LevelFilter::Trace,
        _ => LevelFilter::Warn,
    }
}

/// The subsystem of a log target: `mscclpp::bootstrap::socket` -> `BOOTSTRAP`. The C boundary's lines
/// (`abi`, `mscclpp_abi`) keep the name they had before those modules were split out, `FFI`: applications
/// and the documents (docs/mscclpp.md, "Logging") match on it.
fn subsystem(target: &str) -> String {
    let mut parts = target.split("::");
    let first = parts.next().unwrap_or("");
    let name = if first == "mscclpp" {
        parts.next().unwrap_or("CORE")
    } else {
        first
    };
    match name {
        "abi" | "mscclpp_abi" => "FFI".into(),
        _ => name.to_ascii_uppercase(),
    }
}

/// Formats one line as every handler receives it.
pub fn format_line(level: Level, rank: Option<usize>, target: &str, message: &str) -> String {
    let rank = rank.map_or_else(|| "-".to_string(), |r| r.to_string());
    format!("MSCCLPP {} rank {} {}: {}\n", level, rank, subsystem(target), message)
}

struct Logger;

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let rank = CURRENT_RANK.with(|r| r.get());
        let line = format_line(record.level(), rank, record.target(), &record.args().to_string());
        #[cfg(test)]
        tap::keep(record.level(), &line);
        emit(&line);
    }

    fn flush(&self) {}
}

fn emit(line: &str) {
    let handler = *HANDLER.read();
    match handler {
        Some(h) => {
            // A C string only for the application's handler; NULs are escaped, so this cannot fail.
            let Ok(c_line) = CString::new(line.replace('\0', "\\0")) else {
                return;
            };
            // SAFETY: the handler was given to us by the application as a valid function taking a C
            // string; the string lives until the call returns.
            unsafe { h(c_line.as_ptr()) }
        }
        None => default_handler(line),
    }
}

/// Writes a line to the debug file, or to standard error.
pub fn default_handler(line: &str) {
    if let Some(file) = DEBUG_FILE.as_ref() {
        let mut f = file.lock();
        let _ = f.write_all(line.as_bytes());
        let _ = f.flush();
    } else {
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// Installs the logger once per process. Called from every FFI entry point; cheap after the first.
pub fn init() {
    init_once(false);
}

/// `init` for the NCCL face's entry points: `NCCL_DEBUG` and `NCCL_DEBUG_FILE` apply where ours are unset.
pub fn init_for_nccl() {
    init_once(true);
}

fn init_once(nccl_face: bool) {
    static INIT: OnceCell<()> = OnceCell::new();
    INIT.get_or_init(|| {
        NCCL_FACE.store(nccl_face, Ordering::Relaxed);
        // Another logger may already be installed when we are linked into a Rust program; then that
        // one receives our records and we only set nothing. Ours is installed before the level is read,
        // so that a bad `MSCCLPP_DEBUG` is reported.
        if log::set_logger(&Logger).is_ok() {
            OURS.store(true, Ordering::Relaxed);
            log::set_max_level(LevelFilter::Warn);
            set_level_from(&crate::settings::Source::process(), nccl_face);
        }
    });
}

/// Whether our logger is the process's (else another Rust logger was installed first).
static OURS: AtomicBool = AtomicBool::new(false);

/// Sets the level from `MSCCLPP_DEBUG`, or `NCCL_DEBUG` for the NCCL face where ours is unset.
fn set_level_from(env: &crate::settings::Source, nccl_face: bool) {
    let level = if nccl_face && env.raw(&crate::settings::DEBUG).is_none() {
        nccl_level(env.choice(&crate::settings::NCCL_DEBUG))
    } else {
        env.choice(&crate::settings::DEBUG)
    };
    log::set_max_level(parse_level(Some(level)));
}

/// Reads the log level again from the environment as it is now, for the NCCL face's reset of its debug
/// settings (the debug file stays the one opened first).
pub fn reset_level_for_nccl() {
    init_for_nccl();
    if OURS.load(Ordering::Relaxed) {
        set_level_from(&crate::settings::Source::live(), true);
    }
}

/// Our level for a value of `NCCL_DEBUG`: its `INFO` and `TRACE` are ours; `VERSION` (NCCL's banner) and
/// `ABORT` (NCCL aborts at its first warning) log warnings only.
pub fn nccl_level(value: &str) -> &'static str {
    match value.to_ascii_uppercase().as_str() {
        "INFO" => "INFO",
        "TRACE" => "TRACE",
        _ => "WARN",
    }
}

/// Replaces the handler; `None` restores the default.
pub fn set_handler(handler: mscclppLogHandler_t) {
    *HANDLER.write() = handler;
}

/// The body of the default handler, which the mscclpp face exports for applications to call.
///
/// # Safety
/// `msg` is null or a NUL-terminated string.
pub unsafe fn default_handler_c(msg: *const c_char) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    default_handler(&text);
}

/// The unit tests' view of what was logged: every line at WARN or above, kept (the last few thousand) so
/// that a test can check that a failure was said where it happened. Tests of one process share it, so a
/// test looks for lines only its own job can have written (its ranks' ports, its peers' numbers).
#[cfg(test)]
pub mod tap {
    use log::Level;
    use parking_lot::Mutex;

    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    const KEPT: usize = 4096;

    pub(super) fn keep(level: Level, line: &str) {
        if level <= Level::Warn {
            let mut lines = LINES.lock();
            if lines.len() == KEPT {
                lines.remove(0);
            }
            lines.push(line.to_string());
        }
    }

    /// The kept lines that contain every one of `parts`.
    pub fn warned(parts: &[&str]) -> Vec<String> {
        LINES
            .lock()
            .iter()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_case_insensitively_and_default_to_warn() {
        assert_eq!(parse_level(None), LevelFilter::Warn);
        assert_eq!(parse_level(Some("info")), LevelFilter::Info);
        assert_eq!(parse_level(Some("TRACE")), LevelFilter::Trace);
        assert_eq!(parse_level(Some("WARN")), LevelFilter::Warn);
        assert_eq!(parse_level(Some("bogus")), LevelFilter::Warn);
        assert_eq!(parse_level(Some("off")), LevelFilter::Off);
    }

    #[test]
    fn nccl_debug_values_map_onto_ours() {
        assert_eq!(nccl_level("INFO"), "INFO");
        assert_eq!(nccl_level("trace"), "TRACE");
        for other in ["WARN", "VERSION", "ABORT"] {
            assert_eq!(nccl_level(other), "WARN");
        }
    }

    #[test]
    fn lines_name_rank_and_subsystem() {
        let l = format_line(Level::Warn, Some(3), "mscclpp::bootstrap::socket", "hello");
        assert_eq!(l, "MSCCLPP WARN rank 3 BOOTSTRAP: hello\n");
        let l = format_line(Level::Info, None, "mscclpp", "x");
        assert_eq!(l, "MSCCLPP INFO rank - CORE: x\n");
        for boundary in ["mscclpp::abi", "mscclpp::mscclpp_abi::api"] {
            let l = format_line(Level::Warn, None, boundary, "mscclppCommRank: comm is NULL");
            assert_eq!(l, "MSCCLPP WARN rank - FFI: mscclppCommRank: comm is NULL\n");
        }
    }

    #[test]
    fn rank_scope_restores_the_previous_rank() {
        let outer = RankScope::enter(1);
        {
            let _inner = RankScope::enter(2);
            assert_eq!(CURRENT_RANK.with(|r| r.get()), Some(2));
        }
        assert_eq!(CURRENT_RANK.with(|r| r.get()), Some(1));
        drop(outer);
        assert_eq!(CURRENT_RANK.with(|r| r.get()), None);
    }

    #[test]
    fn debug_file_pattern_expands_host_and_pid() {
        assert_eq!(debug_file_path("/tmp/log.%h.%p", "node1", 42), "/tmp/log.node1.42");
    }
}
