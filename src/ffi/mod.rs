//! The C ABI. Placeholder until the FFI layer lands.

pub mod api;
