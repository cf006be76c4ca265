//! The core's error type. It names no face: each face maps the kinds onto its own codes
//! (`mscclpp_abi/error.rs` onto `mscclppResult_t`, `nccl/error.rs` onto `ncclResult_t`), so that the core
//! can say everything either face reports, a timeout included, which `mscclppResult_t` has no code for.

use std::fmt;

/// What went wrong: one kind for each code either face may return for a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    Cuda,
    System,
    Internal,
    InvalidArgument,
    InvalidUsage,
    Remote,
    InProgress,
    /// A wait with a deadline ran out (a peer that never came within the bootstrap's timeout): NCCL's
    /// `ncclTimeout`; the legacy API has no such code and reports it as a remote error.
    Timeout,
}

impl ErrorKind {
    /// Every kind, for the faces' tests that each maps every one (a kind added here and to no face's table
    /// fails them).
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Cuda,
        ErrorKind::System,
        ErrorKind::Internal,
        ErrorKind::InvalidArgument,
        ErrorKind::InvalidUsage,
        ErrorKind::Remote,
        ErrorKind::InProgress,
        ErrorKind::Timeout,
    ];
}

/// An error with a message that names what was wrong. Logged once, at the FFI boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidUsage, message)
    }
    pub fn system(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::System, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn remote(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Remote, message)
    }
    pub fn cuda(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Cuda, message)
    }
    /// Wraps an I/O error with what we were doing when it happened.
    pub fn io(context: impl fmt::Display, err: std::io::Error) -> Self {
        Self::system(format!("{context}: {err}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Returns early with an `InvalidArgument` error naming the argument.
#[macro_export]
macro_rules! ensure_arg {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::Error::invalid_argument(format!($($fmt)+)));
        }
    };
}

/// For each face's test of its codes: both faces number the kinds alike, 1 to 7 in `ALL`'s order (the
/// legacy header's numbering, which NCCL's keeps), and differ in a timeout, numbered `timeout`.
#[cfg(test)]
pub fn assert_codes(timeout: i32, code: impl Fn(ErrorKind) -> i32) {
    for (i, kind) in ErrorKind::ALL.into_iter().enumerate() {
        let expected = if kind == ErrorKind::Timeout {
            timeout
        } else {
            i as i32 + 1
        };
        assert_eq!(code(kind), expected, "{kind:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a kind sits in `ALL`, by a match without a wildcard: a new kind needs an arm here (or this
    /// fails to compile), the next position, which the test below checks `ALL` against.
    fn position(k: ErrorKind) -> usize {
        match k {
            ErrorKind::Cuda => 0,
            ErrorKind::System => 1,
            ErrorKind::Internal => 2,
            ErrorKind::InvalidArgument => 3,
            ErrorKind::InvalidUsage => 4,
            ErrorKind::Remote => 5,
            ErrorKind::InProgress => 6,
            ErrorKind::Timeout => 7,
        }
    }

    #[test]
    fn all_lists_every_kind_once() {
        let positions: Vec<usize> = ErrorKind::ALL.iter().map(|&k| position(k)).collect();
        assert_eq!(positions, (0..ErrorKind::ALL.len()).collect::<Vec<_>>());
    }

    #[test]
    fn io_errors_keep_their_context() {
        let e = Error::io(
            "connecting to root 1.2.3.4:5",
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        );
        assert_eq!(e.kind, ErrorKind::System);
        assert!(e.message.starts_with("connecting to root 1.2.3.4:5: "));
    }
}
