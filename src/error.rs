//! The library's error type, and its mapping onto `mscclppResult_t`.

use crate::types::mscclppResult_t;
use std::fmt;

/// What went wrong, by the code the C caller sees.
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
    pub fn code(&self) -> mscclppResult_t {
        match self.kind {
            ErrorKind::Cuda => mscclppResult_t::mscclppUnhandledCudaError,
            ErrorKind::System => mscclppResult_t::mscclppSystemError,
            ErrorKind::Internal => mscclppResult_t::mscclppInternalError,
            ErrorKind::InvalidArgument => mscclppResult_t::mscclppInvalidArgument,
            ErrorKind::InvalidUsage => mscclppResult_t::mscclppInvalidUsage,
            ErrorKind::Remote => mscclppResult_t::mscclppRemoteError,
            ErrorKind::InProgress => mscclppResult_t::mscclppInProgress,
            ErrorKind::Timeout => mscclppResult_t::mscclppRemoteError,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_legacy_codes() {
        assert_eq!(Error::cuda("x").code() as i32, 1);
        assert_eq!(Error::system("x").code() as i32, 2);
        assert_eq!(Error::internal("x").code() as i32, 3);
        assert_eq!(Error::invalid_argument("x").code() as i32, 4);
        assert_eq!(Error::invalid_usage("x").code() as i32, 5);
        assert_eq!(Error::remote("x").code() as i32, 6);
        assert_eq!(Error::new(ErrorKind::InProgress, "x").code() as i32, 7);
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
