//! Which algorithm carries a call, and how: the table that picks one by collective and size (or the one
//! `MSCCLPP_COLL_ALGO` forces), the windows a large call is cut into so that each fits the scratch, and the
//! grid. Pure functions, tested without a GPU.
//!
//! | collective     | `packet` (small)                         | `copy` (large)                               |
//! | -------------- | ---------------------------------------- | -------------------------------------------- |
//! | all-reduce     | `allreduce_packet`: one shot, all pairs  | `allreduce_rsag`: reduce-scatter, all-gather |
//! | all-gather     | `allgather_packet`                       | `allgather_copy`                             |
//! | reduce-scatter | `reducescatter_packet`                   | `reducescatter_copy`                         |
//! | broadcast      | `broadcast_packet`                       | `broadcast_copy`                             |
//! | reduce         | `allreduce_packet` (non-roots keep none) | `allreduce_rsag` (non-roots keep none)       |
//! | gather         | `allgather_packet` (non-roots keep none) | `allgather_copy` (non-roots keep none)       |
//! | scatter        | `scatter_packet`                         | `scatter_copy`                               |
//! | all-to-all     | `alltoall_packet`                        | `alltoall_copy`                              |
//!
//! Above these, on buffers every rank registered, all-reduce, all-gather, reduce-scatter and broadcast read
//! the peers' buffers directly (`<collective>_zc`, `zero_copy/`) from the sizes `zero_copy_from` gives.
//!
//! Where the table says copies, `send_recv_collectives.rs` carries gather, scatter, all-to-all and two
//! ranks' broadcast as one launch of send and receive's kernel instead, and two GPUs' all-gather and
//! reductions from the sizes it names.
//!
//! Packets carry 8 data bytes in 16 (the flag travels with the data: one link crossing, no signal), so they
//! win while latency dominates; copies move 16-byte units and signal once per block and phase.

use super::Collective;
use super::kernel_args::MAX_BLOCKS;
use super::variants::Kernel;
use crate::error::{Error, Result};

/// The two families of algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Packet,
    Copy,
}

/// What `MSCCLPP_COLL_ALGO` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The table below.
    Auto,
    Force(Protocol),
    /// Every all-reduce, all-gather, reduce-scatter and broadcast tries the zero-copy path first (at
    /// every size; `Auto` does from the sizes of `zero_copy_from`); `Force(Copy)` never does.
    ZeroCopy,
    /// As `ZeroCopy`, and every eager all-gather and broadcast tries the copy engine first
    /// (`copy_engine.rs`; `Auto` does from the sizes of `copy_engine_from`).
    CopyEngine,
    /// Every call that sends and receives can carry (`send_recv_collectives::applies`) goes that way, at
    /// every size and on any placement (every rank on one GPU too); the others through the scratch as `Auto`
    /// picks, never zero-copy nor by the copy engine. For tests and measurement: it runs those algorithms
    /// where the table would not (small sizes, ranks sharing a GPU).
    SendRecv,
}

impl Choice {
    /// Every choice, in the order of their codes (`code`).
    const ALL: [Choice; 6] = [
        Choice::Auto,
        Choice::Force(Protocol::Packet),
        Choice::Force(Protocol::Copy),
        Choice::ZeroCopy,
        Choice::CopyEngine,
        Choice::SendRecv,
    ];

    /// The setting's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Auto => "auto",
            Choice::Force(Protocol::Packet) => "packet",
            Choice::Force(Protocol::Copy) => "copy",
            Choice::ZeroCopy => "zerocopy",
            Choice::CopyEngine => "copyengine",
            Choice::SendRecv => "sendrecv",
        }
    }

    /// A byte for the collectives' set-up exchange (`plan::PathSettings`).
    pub fn code(self) -> u8 {
        Choice::ALL
            .iter()
            .position(|&c| c == self)
            .expect("every choice is listed") as u8
    }

    pub fn from_code(code: u8) -> Option<Choice> {
        Choice::ALL.get(code as usize).copied()
    }

    /// The setting's value (`auto`, `packet`, `copy`, `zerocopy`, `copyengine`, `sendrecv`), as `settings` has
    /// checked it.
    pub fn parse(value: &str) -> Choice {
        Choice::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(value))
            .unwrap_or(Choice::Auto)
    }
}

/// Largest message (the bytes that cross: all-reduce's and broadcast's buffer, all-gather's output,
/// reduce-scatter's input) that `Choice::Auto` sends in packets among `nranks` ranks.
pub fn packet_limit(collective: Collective, nranks: usize) -> u64 {
    if nranks <= 2 {
        // Two H100s over NVLink (docs/PERFORMANCE.md, "Two GPUs", 2026-11-26), in a CUDA graph, packets
        // against copies: all-reduce 9.8 against 15.9 us at 1 MiB, 16.1 against 18.9 at 2 MiB; all-gather
        // 9.7 against 11.2 at 2 MiB; reduce-scatter 10.6 against 10.9 at 2 MiB; broadcast 14.7 against 16.7
        // at 1 MiB, even at 2 MiB. (Two ranks sharing one H100 under MPS: packets ahead up to 1 MiB.)
        return match collective {
            Collective::Broadcast | Collective::Scatter => 1 << 20,
            // In packets at 1 MiB, torch's eager dist.reduce on our library took 1.06 ms a call (10.1 us in
            // a graph; dist.all_reduce, the same kernel, 32-49 us eager): not understood yet, so reduce keeps
            // the limit under which its eager calls were measured right (30.7 us at 1 MiB in copies).
            Collective::Reduce => 512 << 10,
            _ => 2 << 20,
        };
    }
    // Not measured with a GPU per rank yet: one-shot packets carry n - 1 copies, so more ranks keep the
    // limits found with ranks sharing one H100 (MPS, 2026-11-25: packets 6.7 us at 512 KiB against 10.9
    // for the two shots).
    match collective {
        Collective::AllReduce | Collective::Reduce => 512 << 10,
        Collective::AllGather | Collective::ReduceScatter | Collective::Gather | Collective::AllToAll => 256 << 10,
        Collective::Broadcast | Collective::Scatter => 64 << 10,
    }
}

/// Where the ranks of a communicator run, as every rank sees it alike (`Scratch::gpu_sharers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every rank on one GPU (under MPS): a peer's buffer is this GPU's own memory.
    OneGpu,
    /// Ranks on several GPUs: some peers' buffers are across NVLink or PCIe.
    SeveralGpus,
}

/// The smallest message (see `packet_limit`) that `Choice::Auto` sends zero-copy when every rank registered
/// its buffers (`zero_copy/`); `None`: never. Zero-copy algorithms read or write the peers' buffers.
///
/// Measured in CUDA graphs (docs/PERFORMANCE.md, zero-copy, 2026-11-26), registered against unregistered:
/// - one H100, 2 ranks under MPS: slower at 4 MiB (all-reduce 37.7 against 29.3 us: the vote's two packet
///   rounds and the pulls' barriers), faster from 16 MiB for every collective (all-reduce 67.0 against
///   71.2 us, 1 GiB 472 against 281 GB/s);
/// - two H100s over NVLink: reads of a peer's memory wait a round trip, so small calls lose (all-reduce
///   48.7 against 35.5 us at 4 MiB, 87.0 against 74.5 at 16 MiB; reduce-scatter 50.0 against 46.5 at 16
///   MiB) and large ones win (all-reduce 271 against 260 GB/s at 64 MiB, 315 against 277 at 1 GiB;
///   reduce-scatter 514 against 431 at 64 MiB; broadcast 244 against 217 at 16 MiB, 122 against 118 at 4
///   MiB). All-gather pulling never won there (1 GiB 513 against 516); pushing (2026-11-27, `allgatherZc`),
///   it does from 64 MiB: 128 against 132 us, 256 MiB 457 against 518, 1 GiB 1762 against 2091; at 16 MiB
///   43 against 37.
pub fn zero_copy_from(collective: Collective, nranks: usize, placement: Placement) -> Option<u64> {
    let above_packets = packet_limit(collective, nranks) + 1;
    match (placement, collective) {
        (_, Collective::Reduce | Collective::Gather | Collective::Scatter | Collective::AllToAll) => None,
        (Placement::OneGpu, _) => Some((16 << 20).max(above_packets)),
        // Across GPUs large calls go as sends and receives (`send_recv_collectives.rs`: two ranks' halves,
        // more ranks' rings) on any buffer: the zero-copy launch's fallback, taken whenever a rank did not
        // register, ran its windows one after another (2 x H200, 2026-11-27, at 1 GiB: all-reduce 1.16 times
        // NVIDIA's time, all-gather 1.20 in graphs, reduce-scatter 1.08; 4 x H200, 2026-11-28: all-reduce
        // 1.22, all-gather 1.23-1.30, reduce-scatter 1.16, where the rings take 1.00, 0.95 and 0.94).
        (Placement::SeveralGpus, Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather) => None,
        // Across GPUs a broadcast goes as a chain of sends and receives (`send_recv_collectives.rs`): at the
        // link's speed on any buffer (2 x H200, 2026-11-27: 1 GiB between two as fast as NVIDIA's
        // send/recv), where the zero-copy launch's root wrote every peer's copy over its own links, and its
        // fallback, taken whenever a rank did not register, ran windows one after another (1.27 times
        // NVIDIA's time at 1 GiB on two GPUs; 3.1 times on four).
        (Placement::SeveralGpus, Collective::Broadcast) => None,
    }
}

/// The smallest message that `Choice::Auto` moves with the copy engine (`copy_engine.rs`: eager calls
/// whose every rank registered its output); `None`: never. Each call pays a host exchange among the ranks
/// (two of the bootstrap's all-gathers, about 50 us), so only large calls can win, alike on one GPU and
/// across GPUs (docs/PERFORMANCE.md, 2026-11-27): on one H100 under MPS all-gather 109 us at 16 MiB against
/// 49 for the kernels, 121 against 141 at 64 MiB; on two H100s even at 16 MiB, 125 against 156 at 64 MiB.
/// Across GPUs between two ranks only: among four H200s (2026-11-28, `-R 2`) a registered all-gather by the
/// copy engine took 1.47-1.77 times NVIDIA's time from 64 MiB (3680 us at 1 GiB) where the ring takes 0.95
/// of it, and a broadcast's root would copy the message once per peer over its own links, where the chain
/// sends it once.
pub fn copy_engine_from(collective: Collective, nranks: usize, placement: Placement) -> Option<u64> {
    match collective {
        Collective::AllGather | Collective::Broadcast if nranks == 2 || placement == Placement::OneGpu => {
            Some(64 << 20)
        }
        _ => None,
    }
}

/// The algorithm for a call among `nranks` ranks whose message (see `packet_limit`) has `message` bytes.
/// It depends on nothing else, so every rank of the call picks the same.
pub fn choose(collective: Collective, nranks: usize, message: u64, choice: Choice) -> Protocol {
    match choice {
        Choice::Force(p) => p,
        Choice::Auto | Choice::ZeroCopy | Choice::CopyEngine | Choice::SendRecv
            if message <= packet_limit(collective, nranks) =>
        {
            Protocol::Packet
        }
        Choice::Auto | Choice::ZeroCopy | Choice::CopyEngine | Choice::SendRecv => Protocol::Copy,
    }
}

/// The kernel of a collective's scratch algorithm (its entry point for the call's operator and type is the
/// table's: `kernels::LoadedKernels::get`).
pub fn kernel(collective: Collective, protocol: Protocol) -> Kernel {
    match (collective, protocol) {
        (Collective::AllReduce, Protocol::Packet) => Kernel::AllReducePacket,
        (Collective::AllReduce, Protocol::Copy) => Kernel::AllReduceRsag,
        (Collective::AllGather, Protocol::Packet) => Kernel::AllGatherPacket,
        (Collective::AllGather, Protocol::Copy) => Kernel::AllGatherCopy,
        (Collective::ReduceScatter, Protocol::Packet) => Kernel::ReduceScatterPacket,
        (Collective::ReduceScatter, Protocol::Copy) => Kernel::ReduceScatterCopy,
        (Collective::Broadcast, Protocol::Packet) => Kernel::BroadcastPacket,
        (Collective::Broadcast, Protocol::Copy) => Kernel::BroadcastCopy,
        (Collective::Reduce, p) => kernel(Collective::AllReduce, p),
        (Collective::Gather, p) => kernel(Collective::AllGather, p),
        (Collective::Scatter, Protocol::Packet) => Kernel::ScatterPacket,
        (Collective::Scatter, Protocol::Copy) => Kernel::ScatterCopy,
        (Collective::AllToAll, Protocol::Packet) => Kernel::AllToAllPacket,
        (Collective::AllToAll, Protocol::Copy) => Kernel::AllToAllCopy,
    }
}

/// The most bytes of a piece (see `call::Sizes::piece`) one launch can carry with `data_bytes` in the
/// slot's area of the protocol, a multiple of 16 so that windows keep the buffers' alignment.
pub fn window_bytes(collective: Collective, protocol: Protocol, nranks: usize, data_bytes: u64) -> u64 {
    let n = nranks as u64;
    let raw = match (collective, protocol) {
        // n regions of packets (16 bytes per 8) for the whole buffer.
        (Collective::AllReduce | Collective::Reduce, Protocol::Packet) => data_bytes / (2 * n),
        // A reduce and a gather region of n shards of 1/n of the buffer each.
        (Collective::AllReduce | Collective::Reduce, Protocol::Copy) => data_bytes / 2 / (16 * n) * (16 * n),
        // n regions of one piece, as packets or as they are.
        (
            Collective::AllGather | Collective::ReduceScatter | Collective::Gather | Collective::AllToAll,
            Protocol::Packet,
        ) => data_bytes / (2 * n),
        (
            Collective::AllGather | Collective::ReduceScatter | Collective::Gather | Collective::AllToAll,
            Protocol::Copy,
        ) => data_bytes / n,
        // One region of the receiver's piece.
        (Collective::Broadcast | Collective::Scatter, Protocol::Packet) => data_bytes / 2,
        (Collective::Broadcast | Collective::Scatter, Protocol::Copy) => data_bytes,
    };
    raw / 16 * 16
}

/// The windows `[offset, offset + bytes)` of a piece of `piece` bytes, each at most `window` bytes.
pub fn windows(piece: u64, window: u64) -> impl Iterator<Item = (u64, u64)> {
    assert!(window > 0, "a window holds at least one unit");
    (0..piece.div_ceil(window)).map(move |i| {
        let offset = i * window;
        (offset, window.min(piece - offset))
    })
}

/// A rough model of one call's time in microseconds, for `ncclGroupSimulateEnd`: the algorithm the table
/// picks, a fixed cost per launch, and the bytes each rank's links carry at a rate of that family. The
/// rates are round figures of the order measured between two H200s over NVLink (docs/PERFORMANCE.md), not
/// a measurement of this machine: the model ranks choices, it does not time them.
pub fn estimate_us(collective: Collective, nranks: usize, message: u64) -> f64 {
    const PACKET_LAUNCH_US: f64 = 3.0;
    const COPY_LAUNCH_US: f64 = 8.0;
    // Bytes per microsecond (1 GB/s is 1000 B/µs). Packets carry 8 data bytes in 16.
    const PACKET_BYTES_PER_US: f64 = 100_000.0;
    const COPY_BYTES_PER_US: f64 = 350_000.0;
    let protocol = choose(collective, nranks, message, Choice::Auto);
    let n = nranks.max(1) as f64;
    let others = (n - 1.0) / n;
    // The share of the message each rank's links carry.
    let carried = match (collective, protocol) {
        (Collective::AllReduce | Collective::Reduce, Protocol::Packet) => n - 1.0,
        (Collective::AllReduce | Collective::Reduce, Protocol::Copy) => 2.0 * others,
        (Collective::Broadcast, _) => n - 1.0,
        _ => others,
    };
    let (launch, rate) = match protocol {
        Protocol::Packet => (PACKET_LAUNCH_US, PACKET_BYTES_PER_US),
        Protocol::Copy => (COPY_LAUNCH_US, COPY_BYTES_PER_US),
    };
    if message == 0 || nranks <= 1 {
        return 0.0;
    }
    launch + message as f64 * carried / rate
}

/// Threads of each block of a launch of `protocol` that has more than one block (a one-block launch may
/// have fewer: see `grid`).
pub fn threads(protocol: Protocol) -> u32 {
    match protocol {
        Protocol::Packet => 512,
        Protocol::Copy => 1024,
    }
}

/// The most blocks one launch may have when `sharers` ranks (this one included) run their kernels on the
/// same GPU, which has `multiprocessors` that hold `per_multiprocessor` blocks of the kernel each.
///
/// A block waits for its namesakes on every peer, so every rank's blocks must be resident at once: with
/// ranks sharing a GPU whose kernels run side by side (MPS), blocks of one rank that cannot find room
/// while the others' spin would wait forever. So the ranks of a GPU take half of what it holds between
/// them, never all of it: shares that filled the GPU exactly left no room for any other work, and four
/// PyTorch processes on one H200 under MPS (2026-12-01) hung in every run on a 4 MiB all-reduce of 64
/// blocks each (the GPU holds 264), as they did at 48 blocks each, while 33 and 34 blocks each passed
/// every run (the C programs of the same steps passed at 64). A rank is at most one kernel ahead of its
/// peers, and only after its previous kernel ended, so the shares never add up to more than half the
/// GPU. A rank alone on its GPU may fill it: its blocks wait only for peers on other GPUs. Refused, naming
/// the limit, where a share would not hold one block.
pub fn resident_share(kernel: &str, multiprocessors: u32, per_multiprocessor: u32, sharers: usize) -> Result<u32> {
    let resident = multiprocessors as u64 * per_multiprocessor as u64;
    let usable = if sharers > 1 { resident / 2 } else { resident };
    let share = usable / sharers.max(1) as u64;
    if share == 0 {
        return Err(Error::invalid_usage(format!(
            "{sharers} ranks share this GPU, but it holds only {resident} blocks of {kernel} at once \
             ({multiprocessors} multiprocessors x {per_multiprocessor}): every rank's blocks must be resident \
             together within half of it, so at most {usable} ranks can share it (fewer ranks per GPU, or a \
             larger CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)"
        )));
    }
    Ok(share.min(MAX_BLOCKS as u64) as u32)
}

/// Blocks and threads of a launch that moves a window of `bytes` per piece, with at most `max_blocks`
/// blocks (`resident_share`). The same on every rank (it depends on nothing else, and ranks sharing a GPU
/// share it alike), since a block waits for its namesakes on the peers.
pub fn grid(collective: Collective, protocol: Protocol, nranks: usize, bytes: u64, max_blocks: u32) -> (u32, u32) {
    let threads = threads(protocol) as u64;
    let (unit, per_thread, most) = match protocol {
        // The most blocks: as many as the 128 of MAX_BLOCKS on two H100s over NVLink (2026-11-26, against
        // 32 and 64 before): a packet all-reduce of 1 MiB 9.8 us instead of 13.8, copies of 1 GiB 5-7 %
        // faster (all-reduce 278 GB/s instead of 263, all-gather 527 instead of 495).
        // One packet per thread, not two: below 512 KiB twice the blocks, so more SMs write into the link
        // at once (two H100s, 2026-11-27, graphs: all-reduce f32 16 KiB 3.64 us instead of 4.24-4.29,
        // 64 KiB 3.96 instead of 4.73; reduce-scatter 64 KiB 4.06 instead of 5.13; the same from 1 MiB).
        // Blocks of 128 threads (four times the blocks) gained 0.05-0.07 us more up to 64 KiB and lost from
        // 256 KiB (all-reduce 1 MiB 12.8 us).
        Protocol::Packet => (8u64, 1u64, 128u64),
        Protocol::Copy => (16, 1, 128),
    };
    // The units one block's part is cut from: all-reduce's copy algorithm splits each shard among the
    // blocks.
    let units = match (collective, protocol) {
        (Collective::AllReduce | Collective::Reduce, Protocol::Copy) => bytes.div_ceil(unit).div_ceil(nranks as u64),
        _ => bytes.div_ceil(unit),
    };
    let blocks = units
        .div_ceil(threads * per_thread)
        .clamp(1, most.min(MAX_BLOCKS as u64).min(max_blocks.max(1) as u64));
    let threads = if blocks == 1 {
        units.div_ceil(32).clamp(1, threads / 32) * 32
    } else {
        threads
    };
    (blocks as u32, threads as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_go_in_packets_and_the_setting_forces_either() {
        for c in Collective::ALL {
            for n in [2, 3, 8, 16] {
                let limit = packet_limit(c, n);
                assert_eq!(choose(c, n, 1, Choice::Auto), Protocol::Packet);
                assert_eq!(choose(c, n, limit, Choice::Auto), Protocol::Packet);
                assert_eq!(choose(c, n, limit + 1, Choice::Auto), Protocol::Copy);
                assert_eq!(choose(c, n, 1 << 30, Choice::Force(Protocol::Packet)), Protocol::Packet);
                assert_eq!(choose(c, n, 1, Choice::Force(Protocol::Copy)), Protocol::Copy);
            }
            // More ranks never send more in packets (one-shot packets carry n - 1 copies).
            assert!(packet_limit(c, 8) <= packet_limit(c, 2));
        }
        assert_eq!(Choice::parse("PACKET"), Choice::Force(Protocol::Packet));
        assert_eq!(Choice::parse("copy"), Choice::Force(Protocol::Copy));
        assert_eq!(Choice::parse("auto"), Choice::Auto);
        assert_eq!(Choice::parse("copyengine"), Choice::CopyEngine);
    }

    #[test]
    fn every_window_fits_the_scratch() {
        let data = 32u64 << 20;
        for c in Collective::ALL {
            for p in [Protocol::Packet, Protocol::Copy] {
                for n in [1usize, 2, 3, 4, 8, 16] {
                    let w = window_bytes(c, p, n, data);
                    assert!(w > 0 && w.is_multiple_of(16), "{c:?} {p:?} {n}");
                    let n = n as u64;
                    let one_region = matches!(c, Collective::Broadcast | Collective::Scatter);
                    let need = match (c, p) {
                        (Collective::AllReduce | Collective::Reduce, Protocol::Packet) => n * w.div_ceil(8) * 16,
                        (Collective::AllReduce | Collective::Reduce, Protocol::Copy) => {
                            2 * n * w.div_ceil(16).div_ceil(n) * 16
                        }
                        (_, Protocol::Packet) if !one_region => n * w.div_ceil(8) * 16,
                        (_, Protocol::Copy) if !one_region => n * w.div_ceil(16) * 16,
                        (_, Protocol::Packet) => w.div_ceil(8) * 16,
                        (_, Protocol::Copy) => w.div_ceil(16) * 16,
                    };
                    assert!(need <= data, "{c:?} {p:?} n={n}: {need} > {data}");
                }
            }
        }
    }

    #[test]
    fn windows_cover_the_piece_once() {
        let w: Vec<_> = windows(100, 48).collect();
        assert_eq!(w, [(0, 48), (48, 48), (96, 4)]);
        assert_eq!(windows(0, 16).count(), 0);
        assert_eq!(windows(16, 16).collect::<Vec<_>>(), [(0, 16)]);
    }

    #[test]
    fn grids_stay_within_the_flags_and_warps() {
        for c in Collective::ALL {
            for p in [Protocol::Packet, Protocol::Copy] {
                for bytes in [1u64, 8, 100, 4096, 1 << 20, 1 << 30] {
                    let (blocks, threads) = grid(c, p, 2, bytes, MAX_BLOCKS);
                    assert!((1..=MAX_BLOCKS).contains(&blocks));
                    assert!(threads % 32 == 0 && (32..=1024).contains(&threads));
                    assert!(threads > 2, "the flags need a thread per rank");
                }
            }
        }
        assert_eq!(
            grid(Collective::AllReduce, Protocol::Packet, 2, 1024, MAX_BLOCKS),
            (1, 128)
        );
        assert_eq!(
            grid(Collective::AllReduce, Protocol::Copy, 2, 1 << 30, MAX_BLOCKS).0,
            128
        );
        // A packet per thread: 64 KiB of all-reduce is 8192 packets, 16 blocks of 512 threads.
        assert_eq!(
            grid(Collective::AllReduce, Protocol::Packet, 2, 64 << 10, MAX_BLOCKS),
            (16, 512)
        );
        assert_eq!(
            grid(Collective::AllReduce, Protocol::Packet, 2, 1 << 20, MAX_BLOCKS).0,
            128
        );
    }

    #[test]
    fn estimates_grow_with_size_and_cost_nothing_for_nothing() {
        for c in Collective::ALL {
            assert_eq!(estimate_us(c, 2, 0), 0.0);
            assert_eq!(
                estimate_us(c, 1, 1 << 20),
                0.0,
                "one rank is a copy the model leaves out"
            );
            let small = estimate_us(c, 2, 1024);
            let large = estimate_us(c, 2, 1 << 30);
            assert!(small > 0.0 && large > 100.0 * small, "{c:?}: {small} {large}");
        }
        // 1 GiB all-reduce on 2 ranks, two shots: 8 µs + 1 GiB x 1 / 350 GB/s.
        let t = estimate_us(Collective::AllReduce, 2, 1 << 30);
        assert!((t - (8.0 + (1u64 << 30) as f64 / 350_000.0)).abs() < 1e-6, "{t}");
    }

    #[test]
    fn ranks_sharing_a_gpu_split_its_resident_blocks() {
        // One H100 (132 multiprocessors, two 1024-thread blocks each): alone, a rank may fill it.
        assert_eq!(resident_share("k", 132, 2, 1).unwrap(), MAX_BLOCKS);
        // Ranks sharing it take half of it between them: four ranks 33 blocks each, eight 16 (128 of 264);
        // the copy all-reduce of 1 GiB then has 16.
        assert_eq!(resident_share("k", 132, 2, 4).unwrap(), 33);
        assert_eq!(resident_share("k", 132, 2, 8).unwrap(), 16);
        assert_eq!(grid(Collective::AllReduce, Protocol::Copy, 8, 1 << 30, 16), (16, 1024));
        assert_eq!(resident_share("k", 132, 1, 16).unwrap(), 4);
        assert_eq!(resident_share("k", 132, 1, 66).unwrap(), 1);
        assert!(resident_share("k", 132, 1, 67).is_err());
        // A share below one block is refused, naming the kernel and the numbers.
        let e = resident_share("mscclpp_allgather_copy", 6, 1, 16).unwrap_err();
        assert!(
            e.message.contains("16 ranks share this GPU")
                && e.message.contains("only 6 blocks of mscclpp_allgather_copy")
                && e.message.contains("at most 3 ranks"),
            "{e}"
        );
        // A kernel that cannot run at all with these threads holds no block anywhere.
        assert!(resident_share("k", 132, 0, 1).is_err());
        // However small the share, a launch has at least one block.
        assert_eq!(grid(Collective::AllGather, Protocol::Packet, 2, 1 << 20, 1).0, 1);
    }
}
