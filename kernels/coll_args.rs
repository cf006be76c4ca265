// The one argument every collective kernel takes, defined once: the Rust struct `KernelArgs` below, and
// `CollArgs` in the device code, which build.rs writes from `KernelArgs::FIELDS` into `coll_args.cuh` (with
// static assertions of every field's offset and size, so that nvcc refuses a device struct laid out
// otherwise). Read by the library (`collective::kernel_args`) and build.rs alike (`include!`, so no `//!`
// here); both define `DevicePtr` (a device address, `u64`) before they include it.

/// Ranks a collective can span: the scratch pointers travel in the kernel argument
/// (`MSCCLPP_COLL_MAX_RANKS`).
pub const MAX_RANKS: usize = 16;
/// Blocks a collective kernel may have: the flags at the start of each scratch slot have room for them
/// (`MSCCLPP_COLL_MAX_BLOCKS`).
pub const MAX_BLOCKS: u32 = 128;

/// A field of a struct the device code shares, as build.rs declares it in C.
#[derive(Clone, Copy, Debug)]
pub struct DeviceField {
    /// The Rust name; the C name is its camelCase (`stride_bytes`: `strideBytes`).
    pub name: &'static str,
    /// The C type, with `[N]` after it for an array (`char* [MSCCLPP_COLL_MAX_RANKS]`).
    pub c_type: &'static str,
    pub offset: usize,
    pub size: usize,
    /// The comment's lines (the Rust doc comment's).
    pub doc: &'static [&'static str],
}

/// A `#[repr(C)]` struct with its fields' C types: the struct, and `FIELDS`, what build.rs declares the
/// device struct from.
macro_rules! device_struct {
    (
        $(#[doc = $doc:literal])*
        pub struct $name:ident {
            $( $(#[doc = $fdoc:literal])* pub $field:ident: $ty:ty => $c_type:literal, )*
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name {
            $( $(#[doc = $fdoc])* pub $field: $ty, )*
        }

        impl $name {
            /// Every field, in order, as the device code declares it.
            pub const FIELDS: &[DeviceField] = &[$(DeviceField {
                name: stringify!($field),
                c_type: $c_type,
                offset: std::mem::offset_of!($name, $field),
                size: std::mem::size_of::<$ty>(),
                doc: &[$($fdoc),*],
            },)*];
        }
    };
}

device_struct! {
    /// `CollArgs`: what a launch of a collective kernel is told.
    pub struct KernelArgs {
        /// This rank's input, at the start of this launch's window.
        pub send: DevicePtr => "const char*",
        /// This rank's output, likewise.
        pub recv: DevicePtr => "char*",
        /// Bytes per piece in this window (the whole buffer for all-reduce and broadcast).
        pub bytes: u64 => "uint64_t",
        /// Bytes between ranks' pieces in the application's buffer (all-gather output, reduce-scatter input).
        pub stride_bytes: u64 => "uint64_t",
        /// Every rank's scratch (this rank's own too), mapped here.
        pub scratch: [DevicePtr; MAX_RANKS] => "char* [MSCCLPP_COLL_MAX_RANKS]",
        /// Bytes of one of the two slots of a scratch buffer.
        pub slot_bytes: u64 => "uint64_t",
        /// Bytes of a slot's packet area, after its flags; the copy area follows.
        pub packet_bytes: u64 => "uint64_t",
        /// This rank's state words (`MSCCLPP_STATE_*`): [0] the epoch of the last call, [1] blocks done with
        /// the current one, ...
        pub state: DevicePtr => "uint64_t*",
        /// Host memory: non-zero once the communicator is aborted.
        pub abort_flag: DevicePtr => "const volatile uint64_t*",
        pub rank: u32 => "uint32_t",
        pub nranks: u32 => "uint32_t",
        pub root: u32 => "uint32_t",
        /// Non-zero when send, recv and strideBytes are multiples of 16.
        pub aligned: u32 => "uint32_t",
        /// A PreMulSum operator's scalar, one element of the call's type (`Scalar::kernel_fields`): read from
        /// `scalarPtr` (device memory) when it is not null, else the element in the low bytes of
        /// `scalarBits`. Unused by the other operators.
        pub scalar_bits: u64 => "uint64_t",
        pub scalar_ptr: DevicePtr => "const void*",
        /// Zero-copy (`zero_copy/`, zero_copy.cuh). This rank's input and output as its peers name them: a tag
        /// (bit 63 set, the registration's slot in bits 32-62, its generation in bits 0-31; 0 when not
        /// registered) and the offset into that registration.
        pub zc_send_tag: u64 => "uint64_t",
        pub zc_send_offset: u64 => "uint64_t",
        pub zc_recv_tag: u64 => "uint64_t",
        pub zc_recv_offset: u64 => "uint64_t",
        /// The peers' registrations mapped here ([peer][slot] of {generation, address}, in host memory the
        /// host rewrites).
        pub zc_table: DevicePtr => "const volatile uint64_t*",
        /// The bytes of a window of the scratch algorithm, which the kernel falls back to where the vote
        /// says no.
        pub zc_window: u64 => "uint64_t",
    }
}

/// The C name of a field (`DeviceField::name` in camelCase).
pub fn c_field_name(rust_name: &str) -> String {
    let mut out = String::with_capacity(rust_name.len());
    let mut upper = false;
    for c in rust_name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}
