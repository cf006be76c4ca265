//! The one argument every collective kernel takes, `KernelArgs`, defined in `kernels/coll_args.rs`, from which
//! build.rs writes the device side's `CollArgs` (`coll_args.cuh`, which asserts every field's offset and
//! size), and the send/receive kernel's, laid out as `SendRecvArgs` in `kernels/collectives/send_recv.cuh`
//! (tests check the offsets the device code relies on).

use crate::gpu::DevicePtr;

include!("../../kernels/coll_args.rs");

/// Bytes of flags at the start of each scratch slot: `[phase (2)][block][source rank]` of 64 bits.
pub const FLAG_BYTES: u64 = 2 * MAX_BLOCKS as u64 * MAX_RANKS as u64 * 8;

/// Words of the kernels' state (`CollArgs::state`, the `STATE_` words of common.cuh): the epoch, the blocks
/// done, the zero-copy decision and count, then every rank's input and output as this rank reaches them.
pub const STATE_WORDS: usize = 4 + 2 * MAX_RANKS;
/// The state word that counts the calls that went zero-copy.
pub const STATE_ZC_CALLS: usize = 3;

/// The most lanes of the channel from one rank to another: a send is cut into up to this many contiguous
/// parts, each streamed through its own lane (by its own block where the launch has blocks enough). How many
/// a communicator has, and the bytes of their slots, is its `send_recv::Shape`.
pub const SENDRECV_MAX_LANES: usize = 64;
/// Sends and receives to or from other ranks one launch carries (one group of one rank): they all run at
/// once, so a group that holds more cannot be split into launches without risking a deadlock.
pub const MAX_SENDRECV_OPS: usize = 64;
/// Channels of one launch: one per peer and direction, and one of copies to this rank itself.
pub const MAX_SENDRECV_CHANNELS: usize = 2 * MAX_RANKS + 1;
/// Bytes of counters at the start of a rank's send/receive area: posted (written by the source), credit (written
/// by the receiver), sent and received (this rank's own), the guard of in-place pairs and the landed count of
/// forwarded receives, each `[rank][lane]` of 64 bits.
pub const SENDRECV_COUNTER_BYTES: u64 = 6 * (MAX_RANKS * SENDRECV_MAX_LANES * 8) as u64;
/// `SendRecvOpArgs::flags`: the buffers are multiples of 16.
pub const SENDRECV_ALIGNED: u32 = 1;
/// `SendRecvOpArgs::flags`: a send and a receive of the same buffer with one peer (an all-to-all in place): the
/// receive overwrites a chunk only once the send has read it (send_recv.cuh).
pub const SENDRECV_GUARDED: u32 = 2;
/// `SendRecvOpArgs::flags`: a receive whose chunks a send of the same launch passes on (a chain's broadcast):
/// it counts each chunk once it has landed.
pub const SENDRECV_FORWARDED: u32 = 4;
/// `SendRecvOpArgs::flags`: a send that passes on what a receive of the same launch lands in the same buffer,
/// each chunk once it has landed; the receive's peer is in the bits from `SENDRECV_PEER_SHIFT` on.
pub const SENDRECV_FORWARD: u32 = 8;
/// `SendRecvOpArgs::flags` of a relay: it receives nothing and sends its `src` (a ring's first step), or it
/// sends nothing and writes the finished reduction into its `ptr` (a ring's last step).
pub const SENDRECV_RELAY_NO_IN: u32 = 16;
pub const SENDRECV_RELAY_NO_OUT: u32 = 32;
/// Where `SendRecvOpArgs::flags` holds a second peer: a forward's source, a relay's destination.
pub const SENDRECV_PEER_SHIFT: u32 = 8;
/// Threads of each block of the send/receive kernel: fewer than the collectives' so that a whole
/// all-to-all of 16 ranks sharing one GPU still has a block per channel.
pub const SENDRECV_THREADS: u32 = 512;

/// What a channel carries: `SendRecvChannelArgs::kind`.
pub const SENDRECV_SEND: u32 = 0;
pub const SENDRECV_RECV: u32 = 1;
/// A channel of copies to this rank itself.
pub const SENDRECV_COPY: u32 = 2;
/// A channel of relays: receives from its peer, each chunk reduced with this rank's operand and sent on to
/// the rank in the op's flags from `SENDRECV_PEER_SHIFT` on (the middle of a chain's reduce).
pub const SENDRECV_RELAY: u32 = 3;

/// One send or receive of a launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendRecvOpArgs {
    /// The application's buffer: read by a send, written by a receive.
    pub ptr: DevicePtr,
    pub bytes: u64,
    /// 16-byte units of each lane but the last (see `send_recv::Shape::split`).
    pub lane_units: u64,
    /// Bytes of each chunk of a lane but its last, a multiple of 16 and at most the slot's.
    pub chunk_bytes: u64,
    pub lanes: u32,
    /// `SENDRECV_ALIGNED`: `ptr` (and `src`) are multiples of 16; `SENDRECV_GUARDED`: half of an in-place pair;
    /// `SENDRECV_FORWARDED` / `SENDRECV_FORWARD` (with the peer it forwards from): the halves of a forward.
    pub flags: u32,
    /// What a copy to this rank itself reads (0 for a send or a receive).
    pub src: DevicePtr,
}

/// The sends to one peer, or the receives from one peer, of a launch: `ops` of `SendRecvArgs::ops` from
/// `first_op` on, in call order, served by `blocks` blocks from `first_block` on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendRecvChannelArgs {
    pub first_op: u32,
    pub ops: u32,
    pub first_block: u32,
    pub blocks: u32,
    pub peer: u32,
    pub kind: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SendRecvArgs {
    pub ops: [SendRecvOpArgs; MAX_SENDRECV_OPS],
    pub channels: [SendRecvChannelArgs; MAX_SENDRECV_CHANNELS],
    /// Every rank's send/receive area (this rank's own too), mapped here.
    pub areas: [DevicePtr; MAX_RANKS],
    pub abort_flag: DevicePtr,
    pub rank: u32,
    pub nranks: u32,
    pub channel_count: u32,
    /// The communicator's `send_recv::Shape`: lanes per ordered pair, slots per lane, bytes per slot.
    pub lanes: u32,
    pub depth: u32,
    pub reserved: u32,
    pub slot_bytes: u64,
}

impl Default for SendRecvArgs {
    fn default() -> Self {
        SendRecvArgs {
            ops: [SendRecvOpArgs::default(); MAX_SENDRECV_OPS],
            channels: [SendRecvChannelArgs::default(); MAX_SENDRECV_CHANNELS],
            areas: [0; MAX_RANKS],
            abort_flag: 0,
            rank: 0,
            nranks: 0,
            channel_count: 0,
            lanes: 0,
            depth: 0,
            reserved: 0,
            slot_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_the_device_struct() {
        assert_eq!(offset_of!(KernelArgs, scratch), 32);
        assert_eq!(offset_of!(KernelArgs, slot_bytes), 32 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, packet_bytes), 40 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, abort_flag), 56 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, rank), 64 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, aligned), 76 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, scalar_bits), 80 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, scalar_ptr), 88 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, zc_send_tag), 96 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, zc_recv_offset), 120 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, zc_table), 128 + 8 * MAX_RANKS);
        assert_eq!(offset_of!(KernelArgs, zc_window), 136 + 8 * MAX_RANKS);
        assert_eq!(size_of::<KernelArgs>(), 144 + 8 * MAX_RANKS);
    }

    #[test]
    fn send_recv_layout_matches_the_device_struct() {
        assert_eq!(size_of::<SendRecvOpArgs>(), 48);
        assert_eq!(offset_of!(SendRecvOpArgs, src), 40);
        assert_eq!(offset_of!(SendRecvOpArgs, lane_units), 16);
        assert_eq!(offset_of!(SendRecvOpArgs, chunk_bytes), 24);
        assert_eq!(offset_of!(SendRecvOpArgs, flags), 36);
        assert_eq!(size_of::<SendRecvChannelArgs>(), 24);
        assert_eq!(offset_of!(SendRecvChannelArgs, kind), 20);
        let channels = 48 * MAX_SENDRECV_OPS;
        let areas = channels + 24 * MAX_SENDRECV_CHANNELS;
        assert_eq!(offset_of!(SendRecvArgs, channels), channels);
        assert_eq!(offset_of!(SendRecvArgs, areas), areas);
        assert_eq!(offset_of!(SendRecvArgs, abort_flag), areas + 8 * MAX_RANKS);
        assert_eq!(offset_of!(SendRecvArgs, rank), areas + 8 * MAX_RANKS + 8);
        assert_eq!(offset_of!(SendRecvArgs, channel_count), areas + 8 * MAX_RANKS + 16);
        assert_eq!(offset_of!(SendRecvArgs, lanes), areas + 8 * MAX_RANKS + 20);
        assert_eq!(offset_of!(SendRecvArgs, slot_bytes), areas + 8 * MAX_RANKS + 32);
        assert_eq!(size_of::<SendRecvArgs>(), areas + 8 * MAX_RANKS + 40);
        // Kernel parameters are limited to 4 KiB on every driver the library supports.
        assert!(size_of::<SendRecvArgs>() <= 4096);
    }

    #[test]
    fn send_recv_constants_match_the_device_code() {
        let kernel = include_str!("../../kernels/collectives/send_recv.cuh");
        for (name, value) in [
            ("MSCCLPP_SENDRECV_MAX_LANES", SENDRECV_MAX_LANES as u64),
            ("MSCCLPP_SENDRECV_MAX_OPS", MAX_SENDRECV_OPS as u64),
            ("MSCCLPP_SENDRECV_MAX_CHANNELS", MAX_SENDRECV_CHANNELS as u64),
            ("MSCCLPP_SENDRECV_THREADS", SENDRECV_THREADS as u64),
            ("MSCCLPP_SENDRECV_SEND", SENDRECV_SEND as u64),
            ("MSCCLPP_SENDRECV_RECV", SENDRECV_RECV as u64),
            ("MSCCLPP_SENDRECV_COPY", SENDRECV_COPY as u64),
            ("MSCCLPP_SENDRECV_RELAY", SENDRECV_RELAY as u64),
            ("MSCCLPP_SENDRECV_RELAY_NO_IN", SENDRECV_RELAY_NO_IN as u64),
            ("MSCCLPP_SENDRECV_RELAY_NO_OUT", SENDRECV_RELAY_NO_OUT as u64),
            ("MSCCLPP_SENDRECV_ALIGNED", SENDRECV_ALIGNED as u64),
            ("MSCCLPP_SENDRECV_GUARDED", SENDRECV_GUARDED as u64),
            ("MSCCLPP_SENDRECV_FORWARDED", SENDRECV_FORWARDED as u64),
            ("MSCCLPP_SENDRECV_FORWARD", SENDRECV_FORWARD as u64),
            ("MSCCLPP_SENDRECV_PEER_SHIFT", SENDRECV_PEER_SHIFT as u64),
        ] {
            assert!(
                kernel.contains(&format!("#define {name} {value}\n")),
                "send_recv.cuh must define {name} as {value}"
            );
        }
        assert_eq!(SENDRECV_COUNTER_BYTES, 49152);
        assert!(kernel.contains(
            "#define MSCCLPP_SENDRECV_COUNTER_BYTES (6 * MSCCLPP_COLL_MAX_RANKS * MSCCLPP_SENDRECV_MAX_LANES * 8)\n"
        ));
    }

    /// The device side's `CollArgs`, as build.rs wrote it from `KernelArgs::FIELDS`.
    const COLL_ARGS_CUH: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels-include/coll_args.cuh"));

    /// The header declares every field in order, under the names the device code uses, with its offset and
    /// size asserted as Rust lays it out, and the limits the Rust side has.
    #[test]
    fn the_device_struct_is_written_from_the_rust_one() {
        let names: Vec<String> = KernelArgs::FIELDS.iter().map(|f| c_field_name(f.name)).collect();
        assert_eq!(
            names,
            [
                "send",
                "recv",
                "bytes",
                "strideBytes",
                "scratch",
                "slotBytes",
                "packetBytes",
                "state",
                "abortFlag",
                "rank",
                "nranks",
                "root",
                "aligned",
                "scalarBits",
                "scalarPtr",
                "zcSendTag",
                "zcSendOffset",
                "zcRecvTag",
                "zcRecvOffset",
                "zcTable",
                "zcWindow"
            ]
        );
        let body = COLL_ARGS_CUH
            .split_once("struct CollArgs {\n")
            .and_then(|(_, rest)| rest.split_once("\n};\n"))
            .expect("coll_args.cuh declares struct CollArgs")
            .0;
        let declared: Vec<&str> = body.lines().map(str::trim).filter(|l| !l.starts_with("//")).collect();
        let expected: Vec<String> = KernelArgs::FIELDS
            .iter()
            .zip(&names)
            .map(|(f, name)| match f.c_type.split_once('[') {
                Some((c_type, count)) => format!("{} {name}[{count};", c_type.trim_end()),
                None => format!("{} {name};", f.c_type),
            })
            .collect();
        assert_eq!(declared, expected);
        assert!(declared.contains(&"char* scratch[MSCCLPP_COLL_MAX_RANKS];"));
        for (f, name) in KernelArgs::FIELDS.iter().zip(&names) {
            let asserted = format!(
                "offsetof(CollArgs, {name}) == {} && sizeof(CollArgs::{name}) == {}",
                f.offset, f.size
            );
            assert!(COLL_ARGS_CUH.contains(&asserted), "coll_args.cuh lacks {asserted}");
        }
        assert_eq!(KernelArgs::FIELDS[4].offset, offset_of!(KernelArgs, scratch));
        assert_eq!(KernelArgs::FIELDS[4].size, 8 * MAX_RANKS);
        assert!(COLL_ARGS_CUH.contains(&format!(
            "static_assert(sizeof(CollArgs) == {},",
            size_of::<KernelArgs>()
        )));
        for (name, value) in [
            ("MSCCLPP_COLL_MAX_RANKS", MAX_RANKS as u64),
            ("MSCCLPP_COLL_MAX_BLOCKS", MAX_BLOCKS as u64),
        ] {
            assert!(
                COLL_ARGS_CUH.contains(&format!("#define {name} {value}\n")),
                "coll_args.cuh must define {name} as {value}"
            );
        }
        // The device code takes the struct from there alone.
        let common = include_str!("../../kernels/collectives/common.cuh");
        assert!(common.contains("#include \"coll_args.cuh\"\n") && !common.contains("struct CollArgs"));
    }

    /// A C++ compiler evaluates the header's assertions: a C type whose size or alignment is not the Rust
    /// field's fails here, with or without nvcc (the build needs a C++ compiler for `src/cxx/` anyway, and
    /// `make` installs g++).
    #[test]
    fn a_host_compiler_holds_the_device_struct_to_the_rust_layout() {
        let dir = std::env::temp_dir().join(format!("mscclpp-coll-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let compile = |text: &str| {
            let path = dir.join("coll_args_check.cpp");
            std::fs::write(&path, text).unwrap();
            // cc's compiler for src/cxx/ on Linux where CXX is unset.
            let cxx = "c++";
            std::process::Command::new(cxx)
                .args(["-std=c++17", "-fsyntax-only"])
                .arg(&path)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {cxx}: {e}"))
        };
        let good = compile(COLL_ARGS_CUH);
        assert!(good.status.success(), "{}", String::from_utf8_lossy(&good.stderr));
        // The same header with one field of another width is refused, naming the field.
        let narrowed = COLL_ARGS_CUH.replacen("  uint64_t slotBytes;", "  uint32_t slotBytes;", 1);
        assert_ne!(narrowed, COLL_ARGS_CUH);
        let bad = compile(&narrowed);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!bad.status.success());
        assert!(
            String::from_utf8_lossy(&bad.stderr)
                .contains("CollArgs::slotBytes is not laid out as KernelArgs::slot_bytes")
        );
    }

    #[test]
    fn c_names_are_the_rust_names_in_camel_case() {
        assert_eq!(c_field_name("zc_send_offset"), "zcSendOffset");
        assert_eq!(c_field_name("send"), "send");
        assert_eq!(c_field_name("abort_flag"), "abortFlag");
    }
}
