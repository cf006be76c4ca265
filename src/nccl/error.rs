//! Our errors as `ncclResult_t`, NCCL's strings for them, and the message `ncclGetLastError` returns.

use super::types::ncclResult_t;
use crate::error::{Error, ErrorKind};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char};
use std::sync::atomic::{AtomicU8, Ordering};

/// The NCCL code of an error kind: the kinds are numbered as NCCL numbers its results, a timeout included
/// (`ncclTimeout`, 2.30).
pub fn kind_code(kind: ErrorKind) -> ncclResult_t {
    match kind {
        ErrorKind::Cuda => ncclResult_t::ncclUnhandledCudaError,
        ErrorKind::System => ncclResult_t::ncclSystemError,
        ErrorKind::Internal => ncclResult_t::ncclInternalError,
        ErrorKind::InvalidArgument => ncclResult_t::ncclInvalidArgument,
        ErrorKind::InvalidUsage => ncclResult_t::ncclInvalidUsage,
        ErrorKind::Remote => ncclResult_t::ncclRemoteError,
        ErrorKind::InProgress => ncclResult_t::ncclInProgress,
        ErrorKind::Timeout => ncclResult_t::ncclTimeout,
    }
}

/// The NCCL code of an error.
pub fn code(e: &Error) -> ncclResult_t {
    kind_code(e.kind)
}

/// `ncclGetErrorString`: a static description of any int.
pub fn describe(result: i32) -> &'static CStr {
    match result {
        0 => c"no error",
        // Why a call failed was logged at WARN (the default level) and is kept for ncclGetLastError.
        1 => c"unhandled cuda error (see the WARN line logged for it, or ncclGetLastError)",
        2 => c"unhandled system error (see the WARN line logged for it, or ncclGetLastError)",
        3 => c"internal error - please report this issue to the libmscclpp developers",
        4 => c"invalid argument (the WARN line logged for it, or ncclGetLastError, names the argument)",
        5 => c"invalid usage (the WARN line logged for it, or ncclGetLastError, says why)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"operation timed out (a peer did not answer within the deadline)",
        _ => c"unknown result code",
    }
}

thread_local! {
    /// The message of the last error of a call made on this thread.
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Keeps `e`'s message as this thread's last error, and as the process's.
pub fn record(function: &str, e: &Error) {
    let text = format!("{function}: {}", e.message).replace('\0', "\\0");
    record_in_process(&text);
    LAST.with(|l| *l.borrow_mut() = CString::new(text).unwrap_or_default());
}

/// This thread's last error message (empty when there was none). The pointer stays valid until this
/// thread's next failing call.
pub fn last_on_this_thread() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// The process's last error message, from any thread: what `ncclGetLastError(NULL)` gives where the
/// calling thread has none. NVIDIA's library keeps one message for the process, and PyTorch's watchdog
/// asks for it (with NULL) from a thread whose own calls succeeded, right after `ncclCommGetAsyncError`
/// said a peer failed.
static LAST_IN_PROCESS: Message = Message::new();

/// A message kept in atomic bytes of static storage: the pointer handed out is never freed, and a reader
/// racing a writer sees a mix of two messages at worst, never past the last byte (always NUL).
pub struct Message {
    bytes: [AtomicU8; MESSAGE_BYTES],
    /// Writers one at a time.
    writer: Mutex<()>,
}

const MESSAGE_BYTES: usize = 1024;

impl Default for Message {
    fn default() -> Message {
        Message::new()
    }
}

impl Message {
    pub const fn new() -> Message {
        Message {
            bytes: [const { AtomicU8::new(0) }; MESSAGE_BYTES],
            writer: Mutex::new(()),
        }
    }

    /// Keeps `text`, cut to 1023 bytes.
    pub fn set(&self, text: &str) {
        let _writer = self.writer.lock();
        let n = text.len().min(MESSAGE_BYTES - 1);
        for (slot, &b) in self.bytes.iter().zip(&text.as_bytes()[..n]) {
            slot.store(b, Ordering::Relaxed);
        }
        self.bytes[n].store(0, Ordering::Release);
    }

    /// The message, NUL-terminated; valid as long as `self`.
    pub fn as_ptr(&self) -> *const c_char {
        self.bytes.as_ptr().cast()
    }
}

/// Keeps `text` as the process's last error message.
pub fn record_in_process(text: &str) {
    LAST_IN_PROCESS.set(text);
}

/// The process's last error message (empty when there was none); the pointer is valid for ever.
pub fn last_in_process() -> *const c_char {
    LAST_IN_PROCESS.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_its_nccl_code() {
        // NCCL 2.30's ncclTimeout, which the legacy face reports as a remote error.
        crate::error::assert_codes(8, |k| kind_code(k) as i32);
        for kind in ErrorKind::ALL {
            assert_eq!(code(&Error::new(kind, "x")), kind_code(kind));
        }
    }

    #[test]
    fn every_code_has_its_own_string() {
        let all: Vec<&CStr> = (0..9).map(describe).collect();
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b != a));
        }
        assert_eq!(describe(9).to_str().unwrap(), "unknown result code");
        assert_eq!(describe(-1).to_str().unwrap(), "unknown result code");
        // NVIDIA's strings send the reader to NCCL_DEBUG; here the failing call has already logged why at
        // WARN, the default, so a string points at that line and at ncclGetLastError instead.
        for text in &all {
            let text = text.to_str().unwrap();
            assert!(!text.contains("NCCL_DEBUG"), "{text}");
        }
        for code in [1, 2, 4, 5] {
            assert!(describe(code).to_str().unwrap().contains("ncclGetLastError"));
        }
    }

    #[test]
    fn a_message_is_kept_cut_and_replaced() {
        let m = Message::new();
        // SAFETY: `m` lives, and its last byte is always NUL (for this read and each below).
        assert!(unsafe { CStr::from_ptr(m.as_ptr()) }.to_bytes().is_empty());
        std::thread::scope(|s| {
            s.spawn(|| m.set("ncclSend: rank 3 failed"));
        });
        assert_eq!(
            // SAFETY: as above.
            unsafe { CStr::from_ptr(m.as_ptr()) }.to_str().unwrap(),
            "ncclSend: rank 3 failed"
        );
        m.set(&"x".repeat(5000));
        assert_eq!(
            // SAFETY: as above.
            unsafe { CStr::from_ptr(m.as_ptr()) }.to_bytes().len(),
            MESSAGE_BYTES - 1
        );
        m.set("short");
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(m.as_ptr()) }.to_str().unwrap(), "short");
    }

    #[test]
    fn a_failing_call_is_the_processs_last_error_too() {
        std::thread::spawn(|| record("ncclSend", &Error::remote("rank 7 failed, seen by another thread")))
            .join()
            .unwrap();
        // SAFETY: static storage, always NUL-terminated. Other tests may record meanwhile: only this
        // test's own message could be there unless one did.
        let got = unsafe { CStr::from_ptr(last_in_process()) };
        assert!(!got.to_bytes().is_empty());
    }

    #[test]
    fn the_last_error_is_this_threads() {
        record("ncclAllReduce", &Error::invalid_argument("count is bad"));
        // SAFETY: the pointer is valid until this thread's next record.
        let got = unsafe { CStr::from_ptr(last_on_this_thread()) };
        assert_eq!(got.to_str().unwrap(), "ncclAllReduce: count is bad");
        std::thread::spawn(|| {
            // SAFETY: as above.
            let other = unsafe { CStr::from_ptr(last_on_this_thread()) };
            assert!(other.to_bytes().is_empty());
        })
        .join()
        .unwrap();
    }
}
