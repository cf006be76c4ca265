//! Send and receive (NCCL's `ncclSend` and `ncclRecv`): the sends and receives one rank made in one group on
//! one communicator and stream (or a single call outside a group), carried out together.
//!
//! - Checked first (peers, sizes, null buffers, buffers of the communicator's GPU, the stream); nothing is
//!   queued on an error. Calls of 0 elements do nothing.
//! - Sends to this rank and receives from it are matched in call order (the k-th send with the k-th
//!   receive, of the same size) and become copies on the stream.
//! - The others go into one launch of `mscclpp_send_recv` (`kernels/collectives/send_recv.cuh` describes the protocol):
//!   the sends to one peer, and the receives from one peer, form a channel with blocks of its own, so that
//!   every channel progresses at once and no order of calls inside a group can deadlock. Splitting a group
//!   into several launches could (a later launch may hold what a peer's earlier one waits for), so a group
//!   is refused beyond `MAX_SENDRECV_OPS` such calls, or beyond a block per channel in the launch's share of
//!   the GPU (`algorithm::resident_share`).
//!
//! The kernel moves data through every receiver's send/receive area, set up with the scratch (`scratch.rs`) before
//! any send or receive: `Collectives::prepare`.

use super::kernel_args::{
    MAX_RANKS, MAX_SENDRECV_OPS, SENDRECV_ALIGNED, SENDRECV_COPY, SENDRECV_COUNTER_BYTES, SENDRECV_FORWARD,
    SENDRECV_FORWARDED, SENDRECV_GUARDED, SENDRECV_MAX_LANES, SENDRECV_PEER_SHIFT, SENDRECV_RECV, SENDRECV_RELAY,
    SENDRECV_RELAY_NO_IN, SENDRECV_RELAY_NO_OUT, SENDRECV_SEND, SENDRECV_THREADS, SendRecvArgs, SendRecvChannelArgs,
    SendRecvOpArgs,
};
use super::kernels::LoadedKernel;
use super::variants::Kernel;
use super::{Collectives, DataType, Ready, RedOp};
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::{AppStream, DevicePtr};
use crate::settings::{SENDRECV_CHUNK_KB, SENDRECV_DEPTH, SENDRECV_LANES, Source};

/// Any type serves the kernel that only moves bytes (`Kernel::SendRecv`).
const BYTES: DataType = DataType::Uint8;

/// A send or a receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendRecvKind {
    Send,
    Recv,
}

impl SendRecvKind {
    pub fn buffer_name(self) -> &'static str {
        match self {
            SendRecvKind::Send => "sendbuff",
            SendRecvKind::Recv => "recvbuff",
        }
    }
}

/// One send or receive as the application called it: `count` elements of `datatype` from `buffer` to
/// `peer`, or from `peer` into `buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRecvOp {
    pub kind: SendRecvKind,
    /// The exported function the application called (`ncclSend`, or the collective carried as sends and
    /// receives), for messages: the face names it.
    pub function: &'static str,
    pub peer: usize,
    pub buffer: DevicePtr,
    pub count: usize,
    pub datatype: DataType,
}

impl SendRecvOp {
    /// Checks what one call can be checked for without a GPU or the rest of its group (its peer, its byte
    /// count, its buffer): its bytes, `None` for an empty call. `name` names the call in messages.
    pub fn checked_bytes(&self, nranks: usize, name: impl Fn() -> String) -> Result<Option<u64>> {
        ensure_arg!(
            self.peer < nranks,
            "{}: peer is {}; it must be in [0, nranks = {nranks})",
            name(),
            self.peer
        );
        let bytes = (self.count as u64)
            .checked_mul(self.datatype.size() as u64)
            .filter(|b| *b < 1u64 << 63)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{}: count = {} elements of {} bytes overflow a 64-bit byte count",
                    name(),
                    self.count,
                    self.datatype.size()
                ))
            })?;
        if bytes == 0 {
            return Ok(None);
        }
        ensure_arg!(
            self.buffer != 0,
            "{}: {} is NULL (count = {})",
            name(),
            self.kind.buffer_name(),
            self.count
        );
        Ok(Some(bytes))
    }
}

/// A non-empty send or receive, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    pub kind: SendRecvKind,
    /// As `SendRecvOp::function`.
    pub function: &'static str,
    pub peer: usize,
    pub buffer: DevicePtr,
    pub bytes: u64,
    /// A receive's own operand, reduced with what arrives into `buffer` (`send_recv_collectives.rs`, two
    /// ranks' reductions); 0: the receive only moves. Always 0 for the application's calls.
    pub reduce_with: DevicePtr,
    /// How it depends on another send or receive of its launch; never for the application's calls.
    pub pairing: Pairing,
}

/// How a send or receive of a collective carried as sends and receives depends on another of its launch
/// (send_recv.cuh says how the kernel keeps each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pairing {
    #[default]
    Alone,
    /// Half of an in-place pair (`kernel_args::SENDRECV_GUARDED`): an all-to-all in place, whose receive
    /// overwrites a chunk only once the send to the same peer has read it.
    Guarded,
    /// A receive whose chunks a send of the launch passes on (`SENDRECV_FORWARDED`): it counts each chunk
    /// that has landed.
    Forwarded,
    /// A send that passes on, chunk by chunk as each lands, what the receive from `from` writes into the
    /// same buffer (`SENDRECV_FORWARD`): the middle of a broadcast's chain.
    Forward { from: usize },
    /// A step of a relay channel (`SENDRECV_RELAY`), from the op's peer to rank `to`: it receives each chunk,
    /// reduces it with `reduce_with` and writes the result straight into `to`'s slot (the middle of a
    /// reduce's chain, a ring's middle steps; no buffer of its own). With `receives` false it sends
    /// `reduce_with` alone (a ring's first step); with `sends` false it writes the finished reduction into
    /// `buffer` (a ring's last step). Its launch reduces; every relay of a launch sends to one rank.
    Relay { to: usize, receives: bool, sends: bool },
}

impl Pairing {
    /// A relay that receives and sends on to `to`.
    pub fn relay(to: usize) -> Pairing {
        Pairing::Relay {
            to,
            receives: true,
            sends: true,
        }
    }

    /// Its bits of `SendRecvOpArgs::flags`.
    fn flags(self) -> u32 {
        match self {
            Pairing::Alone => 0,
            Pairing::Guarded => SENDRECV_GUARDED,
            Pairing::Forwarded => SENDRECV_FORWARDED,
            Pairing::Forward { from } => SENDRECV_FORWARD | (from as u32) << SENDRECV_PEER_SHIFT,
            Pairing::Relay { to, receives, sends } => {
                (to as u32) << SENDRECV_PEER_SHIFT
                    | if receives { 0 } else { SENDRECV_RELAY_NO_IN }
                    | if sends { 0 } else { SENDRECV_RELAY_NO_OUT }
            }
        }
    }
}

impl Moved {
    pub fn buffer_name(&self) -> String {
        let direction = match self.kind {
            SendRecvKind::Send => "to",
            SendRecvKind::Recv => "from",
        };
        format!(
            "{} of the {} {direction} rank {}",
            self.kind.buffer_name(),
            self.function,
            self.peer
        )
    }
}

/// A send to this rank with its matching receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelfCopy {
    pub dst: DevicePtr,
    pub src: DevicePtr,
    pub bytes: u64,
}

/// A group's calls sorted out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Every non-empty call, in call order (their buffers are checked).
    pub buffers: Vec<Moved>,
    pub copies: Vec<SelfCopy>,
    /// The calls to and from other ranks, in call order: the kernel's.
    pub remote: Vec<Moved>,
    /// How each call is cut, where a collective cuts it otherwise than plain sends and receives do.
    pub cut: Cut,
}

/// How a collective cuts each of its calls where not as `Shape::split` cuts plain sends and receives. Only a
/// collective sets it, the same on every rank, so that both ends of each transfer cut it alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// The most lanes, where fewer than the shape's (`None`: the shape's).
    pub most_lanes: Option<u32>,
    /// The fewest bytes of a lane (`None`: `MIN_LANE_BYTES`): fewer, longer lanes.
    pub least_lane_bytes: Option<u64>,
    /// A chain's: each lane in at least this many chunks, where that makes them smaller than plain sends'
    /// and no smaller than `CHAIN_LEAST_CHUNK_BYTES`. Each rank of a chain past the first passes a chunk on
    /// once it has landed, so every hop adds a chunk's time to the call's; smaller chunks shorten it, and
    /// cost a handshake each.
    pub least_chunks: Option<u32>,
}

/// "1st", "2nd", ...
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

impl Work {
    /// Checks what can be checked without a GPU, drops empty calls and matches this rank's sends to itself
    /// with its receives from itself.
    pub fn sort(ops: &[SendRecvOp], rank: usize, nranks: usize) -> Result<Work> {
        let mut work = Work::default();
        // Names the call in messages (built only for one).
        let call = |i: usize, op: &SendRecvOp| {
            if ops.len() == 1 {
                op.function.to_string()
            } else {
                format!("{} (call {} of {} in the group)", op.function, i + 1, ops.len())
            }
        };
        for (i, op) in ops.iter().enumerate() {
            let Some(bytes) = op.checked_bytes(nranks, || call(i, op))? else {
                continue;
            };
            let moved = Moved {
                kind: op.kind,
                function: op.function,
                peer: op.peer,
                buffer: op.buffer,
                bytes,
                reduce_with: 0,
                pairing: Pairing::Alone,
            };
            work.buffers.push(moved);
            if op.peer != rank {
                work.remote.push(moved);
            }
        }
        if work.remote.len() > MAX_SENDRECV_OPS {
            return Err(Error::invalid_usage(format!(
                "a group holds {} sends and receives to and from other ranks; at most {MAX_SENDRECV_OPS} are carried \
                 out together (they must run at once: split into several groups only where no send or receive of \
                 a later group is what a peer waits for in an earlier one)",
                work.remote.len()
            )));
        }
        let to_self = |kind| {
            work.buffers
                .iter()
                .filter(move |m| m.peer == rank && m.kind == kind)
                .copied()
        };
        let sends: Vec<Moved> = to_self(SendRecvKind::Send).collect();
        let recvs: Vec<Moved> = to_self(SendRecvKind::Recv).collect();
        ensure_arg!(
            sends.len() == recvs.len(),
            "this rank sends to itself {} time(s) and receives from itself {} time(s) (non-empty calls); each \
             send to itself needs a receive from itself in the same group",
            sends.len(),
            recvs.len()
        );
        for (k, (send, recv)) in sends.iter().zip(&recvs).enumerate() {
            ensure_arg!(
                send.bytes == recv.bytes,
                "the {nth} ncclSend to this rank itself has {} bytes but the {nth} ncclRecv from itself has {}: \
                 they are matched in call order and must have the same size",
                send.bytes,
                recv.bytes,
                nth = ordinal(k + 1)
            );
            work.copies.push(SelfCopy {
                dst: recv.buffer,
                src: send.buffer,
                bytes: send.bytes,
            });
        }
        Ok(work)
    }

    /// The copies to this rank itself that move bytes (one onto its own place has nothing to do), for a launch.
    pub fn moving_copies(&self) -> Vec<SelfCopy> {
        self.copies.iter().filter(|c| c.dst != c.src).copied().collect()
    }

    /// Queues the copies of the sends to this rank.
    fn copy_to_self(&self, stream: AppStream) -> Result<()> {
        copy_on_stream(&self.copies, stream)
    }
}

/// Queues `copies` (sends to this rank with their receives, checked buffers of `work`) on `stream`.
fn copy_on_stream(copies: &[SelfCopy], stream: AppStream) -> Result<()> {
    for c in copies.iter().filter(|c| c.dst != c.src) {
        // SAFETY: both ranges were checked to be device memory of the communicator's context
        // (`GpuContext::check_buffer`), which the stream belongs to.
        unsafe { stream.copy(c.dst, c.src, c.bytes as usize)? };
    }
    Ok(())
}

/// The shape of every rank's send/receive area, the same on every rank (`Scratch::set_up` checks it): each ordered
/// pair of ranks has `lanes` lanes of `depth` slots of `slot_bytes` in the receiver's area. A send is cut
/// into lanes, each lane into chunks of at most a slot; chunk c of a lane goes through slot c % depth, so
/// the sender can be `depth` chunks ahead of the receiver's copying out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub lanes: u32,
    pub depth: u32,
    pub slot_bytes: u64,
}

/// How one send (and its receive: the same on both sides, since it depends on the byte count and the
/// shape alone) is cut: lane `l` covers bytes `[l * lane_units * 16, (l + 1) * lane_units * 16)` of `[0,
/// bytes)`, in chunks of `chunk_bytes` (the last one of a lane may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub lanes: u32,
    pub lane_units: u64,
    pub chunk_bytes: u64,
}

/// The fewest bytes a lane is given: below it a send uses fewer lanes (each lane costs a handshake).
const MIN_LANE_BYTES: u64 = 16 << 10;
/// The fewest bytes of a chunk, below the whole lane: smaller chunks pay more handshakes than they overlap.
const MIN_CHUNK_BYTES: u64 = 16 << 10;
/// The fewest bytes of a chain's chunk cut smaller than plain sends' (`Cut::least_chunks`): among four
/// H200s (2026-11-28, docs/PERFORMANCE.md "Chains' chunks and all-to-all's lanes among four GPUs") 128 KiB
/// chunks made a reduce at 64 MiB 11 % faster than 256 KiB, and 64 KiB chunks were slower than either at
/// every size from 16 MiB.
pub const CHAIN_LEAST_CHUNK_BYTES: u64 = 128 << 10;
/// The most bytes of every source's lanes together in one rank's area: with many ranks the slots shrink.
const AREA_CAP: u64 = 128 << 20;

impl Shape {
    /// The shape for `nranks` ranks from the settings `MSCCLPP_SENDRECV_LANES`, `_DEPTH` and `_CHUNK_KB`
    /// (`lanes`, `depth`, `chunk_kib`), the slots made smaller where `nranks` sources' lanes would take more
    /// than `AREA_CAP` of each rank's memory.
    pub fn new(nranks: usize, lanes: u32, depth: u32, chunk_kib: u64) -> Shape {
        let lanes = lanes.clamp(1, SENDRECV_MAX_LANES as u32);
        let depth = depth.max(2);
        let per_source = AREA_CAP / nranks.max(1) as u64;
        let fits = per_source / (lanes as u64 * depth as u64) / 16 * 16;
        let slot_bytes = (chunk_kib.max(1) << 10).min(fits).max(MIN_CHUNK_BYTES);
        Shape {
            lanes,
            depth,
            slot_bytes,
        }
    }

    /// The shape the settings ask for.
    pub fn from_settings(nranks: usize) -> Shape {
        Shape::from_source(nranks, &Source::process())
    }

    /// The shape `source`'s settings ask for (`from_settings`).
    fn from_source(nranks: usize, source: &Source) -> Shape {
        // The lanes' default (the settings' table's, `SENDRECV_LANES`): 64 lanes among up to four ranks, the
        // largest communicator 64 were measured on. Between two (2 x H200, 2026-11-28, docs/PERFORMANCE.md
        // "Two GPUs at every size"): at 1 GiB send/recv, scatter, broadcast, all-reduce and reduce-scatter
        // fastest at 64, gather and reduce within 2 % of NVIDIA's where 32 lanes were 5-8 % behind. Among four
        // (4 x H200, "Four GPUs: rings, 64 lanes and the table's choices across GPUs"): every source's lanes
        // share a rank's area, so 64 lanes get half the slot of 32 (256 KiB), and still the chains, send/recv,
        // hypercube and the rings were 2-5 % faster from 16 MiB, the chains 19-26 % at 1 MiB. Among more
        // ranks 32 (the slots would shrink further; not measured).
        Shape::new(
            nranks,
            source.int_among(&SENDRECV_LANES, nranks),
            source.int(&SENDRECV_DEPTH),
            source.int(&SENDRECV_CHUNK_KB),
        )
    }

    /// The largest send that is written whole into the receiver's slots, whether or not its receiver runs
    /// (see `split`).
    pub fn buffered_bytes(&self) -> u64 {
        self.lanes as u64 * self.depth as u64 * self.slot_bytes
    }

    /// Bytes of one rank's send/receive area with `nranks` ranks: the counters, then every source's lanes.
    pub fn area_bytes(&self, nranks: usize) -> u64 {
        SENDRECV_COUNTER_BYTES + nranks as u64 * self.lanes as u64 * self.depth as u64 * self.slot_bytes
    }

    /// How a send of `bytes` is cut: a lane per `MIN_LANE_BYTES` up to `lanes`, every lane starting on a
    /// 16-byte unit; chunks of a `depth`-th of a lane (at least `MIN_CHUNK_BYTES` or the lane, at most a
    /// slot), so that the receiver copies one out while the sender writes the next, and a send that fits the
    /// lanes' slots is written whole before its receiver need start (a send and a receive outside a group,
    /// in either order on both ranks, do not deadlock up to that size: `buffered_bytes`).
    pub fn split(&self, bytes: u64) -> Split {
        self.split_as(bytes, &Cut::default())
    }

    /// How a collective's call of `bytes` is cut (`split`, then `cut`'s own limits).
    pub fn split_as(&self, bytes: u64, cut: &Cut) -> Split {
        let most_lanes = cut.most_lanes.map_or(self.lanes, |n| n.clamp(1, self.lanes));
        let lanes = bytes
            .div_ceil(cut.least_lane_bytes.unwrap_or(MIN_LANE_BYTES).max(16))
            .clamp(1, most_lanes as u64);
        let lane_units = bytes.div_ceil(16).div_ceil(lanes);
        let lane_bytes = lane_units * 16;
        let mut chunk_bytes = lane_bytes
            .div_ceil(self.depth as u64)
            .max(MIN_CHUNK_BYTES)
            .min(lane_bytes)
            .min(self.slot_bytes);
        if let Some(parts) = cut.least_chunks {
            // Never larger than plain sends' chunk: a chain cuts finer, never coarser.
            chunk_bytes = chunk_bytes.min(lane_bytes.div_ceil(parts.max(1) as u64).max(CHAIN_LEAST_CHUNK_BYTES));
        }
        let chunk_bytes = chunk_bytes.div_ceil(16) * 16;
        Split {
            lanes: lanes as u32,
            lane_units,
            chunk_bytes,
        }
    }
}

/// What a channel of a launch carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelKind {
    Send,
    Recv,
    /// This rank's sends to itself, copied by blocks of the launch while the other channels move theirs.
    Copy,
    /// Receives from the channel's peer whose reduced chunks go on to another rank (`Pairing::Relay`).
    Relay,
}

impl ChannelKind {
    fn of(m: &Moved) -> ChannelKind {
        match (m.kind, m.pairing) {
            (SendRecvKind::Recv, Pairing::Relay { .. }) => ChannelKind::Relay,
            (SendRecvKind::Send, _) => ChannelKind::Send,
            (SendRecvKind::Recv, _) => ChannelKind::Recv,
        }
    }

    fn device_kind(self) -> u32 {
        match self {
            ChannelKind::Send => SENDRECV_SEND,
            ChannelKind::Recv => SENDRECV_RECV,
            ChannelKind::Copy => SENDRECV_COPY,
            ChannelKind::Relay => SENDRECV_RELAY,
        }
    }
}

/// The sends to one peer, or the receives from one, or the copies to this rank itself, of a launch: `ops`
/// (indices into the launch's calls or copies, in call order) served by `blocks` blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channel {
    pub kind: ChannelKind,
    pub peer: usize,
    pub ops: Vec<usize>,
    pub blocks: u32,
}

/// The channels of a launch of `remote` and `copies`, in order of their first call and the copies last,
/// with blocks for each within `max_blocks` (`fit_blocks`).
pub fn channels(
    remote: &[Moved],
    copies: &[SelfCopy],
    shape: &Shape,
    cut: &Cut,
    max_blocks: u32,
) -> Result<Vec<Channel>> {
    let mut channels: Vec<Channel> = Vec::new();
    for (i, m) in remote.iter().enumerate() {
        let kind = ChannelKind::of(m);
        match channels.iter_mut().find(|c| c.kind == kind && c.peer == m.peer) {
            Some(c) => c.ops.push(i),
            None => channels.push(Channel {
                kind,
                peer: m.peer,
                ops: vec![i],
                blocks: 0,
            }),
        }
    }
    if !copies.is_empty() {
        channels.push(Channel {
            kind: ChannelKind::Copy,
            peer: usize::MAX,
            ops: (0..copies.len()).collect(),
            blocks: 0,
        });
    }
    let bytes = |c: &Channel, i: usize| match c.kind {
        ChannelKind::Copy => copies[i].bytes,
        ChannelKind::Send | ChannelKind::Recv | ChannelKind::Relay => remote[i].bytes,
    };
    // A block per lane of the channel's widest call: more would have nothing to do.
    let wanted: Vec<u32> = channels
        .iter()
        .map(|c| {
            c.ops
                .iter()
                .map(|&i| shape.split_as(bytes(c, i), cut).lanes)
                .max()
                .unwrap_or(1)
        })
        .collect();
    for (c, blocks) in channels.iter_mut().zip(fit_blocks(&wanted, max_blocks)?) {
        c.blocks = blocks;
    }
    Ok(channels)
}

/// Blocks for channels that would each use `wanted[i]`, in all at most `max_blocks`: the largest cap on
/// every channel that fits, and at least one block each. Refused, naming the numbers, where there are more
/// channels than blocks.
pub fn fit_blocks(wanted: &[u32], max_blocks: u32) -> Result<Vec<u32>> {
    if wanted.len() as u64 > max_blocks as u64 {
        return Err(Error::invalid_usage(format!(
            "a group's sends and receives need a block per peer and direction, {} here, but a launch of \
             mscclpp_send_recv may have at most {max_blocks} on this GPU (its share of the blocks the GPU holds \
             beside the other ranks sharing it): fewer peers per group, or fewer ranks per GPU",
            wanted.len()
        )));
    }
    let total = |cap: u32| wanted.iter().map(|&w| w.clamp(1, cap) as u64).sum::<u64>();
    let most = wanted.iter().copied().max().unwrap_or(1).max(1);
    let cap = (1..=most)
        .rev()
        .find(|&cap| total(cap) <= max_blocks as u64)
        .unwrap_or(1);
    Ok(wanted.iter().map(|&w| w.clamp(1, cap)).collect())
}

/// The kernel's argument for `remote` and `copies` carried by `channels`, and the launch's blocks.
#[allow(clippy::too_many_arguments)]
pub fn kernel_args(
    remote: &[Moved],
    copies: &[SelfCopy],
    channels: &[Channel],
    shape: &Shape,
    cut: &Cut,
    areas: &[DevicePtr; MAX_RANKS],
    abort_flag: DevicePtr,
    rank: usize,
    nranks: usize,
) -> (SendRecvArgs, u32) {
    let mut args = SendRecvArgs {
        areas: *areas,
        abort_flag,
        rank: rank as u32,
        nranks: nranks as u32,
        channel_count: channels.len() as u32,
        // Where a slot lies depends on the layout's lanes, whatever lanes a call is cut into (send_recv.cuh).
        lanes: shape.lanes,
        depth: shape.depth,
        slot_bytes: shape.slot_bytes,
        ..SendRecvArgs::default()
    };
    let (mut op, mut block) = (0usize, 0u32);
    for (slot, c) in args.channels.iter_mut().zip(channels) {
        *slot = SendRecvChannelArgs {
            first_op: op as u32,
            ops: c.ops.len() as u32,
            first_block: block,
            blocks: c.blocks,
            peer: c.peer as u32,
            kind: c.kind.device_kind(),
        };
        for &i in &c.ops {
            // A copy writes `ptr` from `src`; a send reads `ptr`, a receive writes it.
            let (ptr, src, bytes, pairing) = match c.kind {
                ChannelKind::Copy => (copies[i].dst, copies[i].src, copies[i].bytes, Pairing::Alone),
                ChannelKind::Send | ChannelKind::Recv | ChannelKind::Relay => {
                    let m = &remote[i];
                    (m.buffer, m.reduce_with, m.bytes, m.pairing)
                }
            };
            let split = shape.split_as(bytes, cut);
            args.ops[op] = SendRecvOpArgs {
                ptr,
                bytes,
                lane_units: split.lane_units,
                chunk_bytes: split.chunk_bytes,
                lanes: split.lanes,
                flags: if ptr.is_multiple_of(16) && src.is_multiple_of(16) {
                    SENDRECV_ALIGNED
                } else {
                    0
                } | pairing.flags(),
                src,
            };
            op += 1;
        }
        block += c.blocks;
    }
    (args, block)
}

/// The kernel's argument for `work`'s calls to other ranks and `copies` (those of its copies the launch
/// carries), and the launch's blocks: `channels` and `kernel_args` with each call cut as `work.cut` says,
/// the slots laid out as `shape` has them.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    work: &Work,
    copies: &[SelfCopy],
    shape: &Shape,
    max_blocks: u32,
    areas: &[DevicePtr; MAX_RANKS],
    abort_flag: DevicePtr,
    rank: usize,
    nranks: usize,
) -> Result<(SendRecvArgs, u32)> {
    let channels = channels(&work.remote, copies, shape, &work.cut, max_blocks)?;
    Ok(kernel_args(
        &work.remote,
        copies,
        &channels,
        shape,
        &work.cut,
        areas,
        abort_flag,
        rank,
        nranks,
    ))
}

impl Collectives {
    /// Carries one group's sends and receives (sorted: `Work::sort`), their prologue passed
    /// (`pipeline/execute.rs`: the buffers and the stream checked against the current context): the
    /// copies to this rank, then, where any call names a peer, one launch. From the launch on the peers'
    /// kernels may already wait for this one, so the executor aborts the communicator when it fails.
    pub fn launch_send_recv(&self, rank: usize, nranks: usize, work: &Work, stream: AppStream) -> Result<()> {
        if work.remote.is_empty() {
            return work.copy_to_self(stream);
        }
        let capturing = stream.is_capturing()?;
        let mut ready = self.ready.lock();
        let ready = ready.as_mut().ok_or_else(not_prepared)?;
        launch(ready, rank, nranks, work, None, capturing, stream)
    }

    /// Whether the collectives are set up (`prepare`): sends and receives to peers need it.
    pub fn prepared(&self) -> bool {
        self.ready.lock().is_some()
    }
}

/// The operator and type of a launch whose receives reduce (`Moved::reduce_with`); `None`: it only moves.
pub type Reducing = Option<(RedOp, DataType)>;

fn kernel(ready: &mut Ready, reducing: Reducing, capturing: bool) -> Result<LoadedKernel> {
    let (kernel, op, datatype) = match reducing {
        Some((op, datatype)) => (Kernel::SendRecvReduce, Some(op), datatype),
        None => (Kernel::SendRecv, None, BYTES),
    };
    ready
        .kernels
        .get_capturing(capturing, kernel, op, datatype, SENDRECV_THREADS)
}

/// Whether one launch of the kernel can hold `channels` channels (a block each within its share of the
/// GPU; a group beyond it is refused by `launch`).
pub(super) fn fits(ready: &mut Ready, channels: usize, reducing: Reducing, capturing: bool) -> Result<bool> {
    Ok(channels as u64 <= kernel(ready, reducing, capturing)?.max_blocks as u64)
}

/// Queues `work`'s copies to this rank and one launch of the kernel for the rest on `stream`.
pub(super) fn launch(
    ready: &mut Ready,
    rank: usize,
    nranks: usize,
    work: &Work,
    reducing: Reducing,
    capturing: bool,
    stream: AppStream,
) -> Result<()> {
    let loaded = kernel(ready, reducing, capturing)?;
    let max_blocks = loaded.max_blocks;
    let shape = ready.scratch.send_recv_shape;
    // The copies to this rank itself run in the launch, beside the transfers, as far as the argument holds
    // them; the rest go on the stream before it.
    let copies = work.moving_copies();
    let in_launch = copies.len().min(MAX_SENDRECV_OPS - work.remote.len());
    let (copies, on_stream) = copies.split_at(in_launch);
    let (args, blocks) = plan(
        work,
        copies,
        &shape,
        max_blocks,
        &ready.scratch.send_recv,
        ready.abort.device_ptr(),
        rank,
        nranks,
    )?;
    copy_on_stream(on_stream, stream)?;
    // SAFETY: the argument is `SendRecvArgs`'s layout (kernel_args.rs); every buffer was checked to hold the
    // bytes its call moves; the send/receive areas and the abort word live in `ready` until `clear`, which comes
    // after the application has synchronized; the stream was checked to be of this context.
    unsafe { loaded.kernel.launch(blocks, SENDRECV_THREADS, stream, &args) }
}

pub(crate) fn not_prepared() -> Error {
    Error::invalid_usage(
        "send and receive need the communicator's collectives set up first, by every rank at once \
         (Collectives::prepare, called as the communicator is created)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn op(kind: SendRecvKind, peer: usize, buffer: DevicePtr, count: usize) -> SendRecvOp {
        SendRecvOp {
            kind,
            function: match kind {
                SendRecvKind::Send => "ncclSend",
                SendRecvKind::Recv => "ncclRecv",
            },
            peer,
            buffer,
            count,
            datatype: DataType::Float32,
        }
    }
    use SendRecvKind::{Recv, Send};

    #[test]
    fn calls_are_checked_before_anything_else() {
        let e = Work::sort(&[op(Send, 4, 0x1000, 1)], 0, 4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("ncclSend: peer is 4") && e.message.contains("nranks = 4"),
            "{e}"
        );
        let e = Work::sort(&[op(Send, 1, 0x1000, 1), op(Recv, 1, 0, 3)], 0, 2).unwrap_err();
        assert!(
            e.message
                .contains("ncclRecv (call 2 of 2 in the group): recvbuff is NULL (count = 3)"),
            "{e}"
        );
        let e = Work::sort(&[op(Recv, 1, 0x1000, usize::MAX / 2)], 0, 2).unwrap_err();
        assert!(e.message.contains("overflow"), "{e}");
        // Empty calls do nothing, whatever their buffer; a peer out of range is still refused.
        let w = Work::sort(&[op(Send, 1, 0, 0), op(Recv, 0, 0, 0)], 0, 2).unwrap();
        assert_eq!(w, Work::default());
        assert!(Work::sort(&[op(Send, 2, 0, 0)], 0, 2).is_err());
    }

    #[test]
    fn sends_to_self_are_matched_with_receives_from_self_in_call_order() {
        let w = Work::sort(
            &[
                op(Recv, 1, 0xa000, 8),
                op(Send, 1, 0xb000, 8),
                op(Send, 1, 0x1000, 4),
                op(Recv, 1, 0x2000, 4),
                op(Recv, 1, 0x3000, 2),
                op(Send, 1, 0x4000, 2),
                op(Send, 0, 0xc000, 1),
            ],
            1,
            2,
        )
        .unwrap();
        // A receive before its send still matches it (they are paired by order among their kind).
        assert_eq!(
            w.copies,
            [
                SelfCopy {
                    dst: 0xa000,
                    src: 0xb000,
                    bytes: 32
                },
                SelfCopy {
                    dst: 0x2000,
                    src: 0x1000,
                    bytes: 16
                },
                SelfCopy {
                    dst: 0x3000,
                    src: 0x4000,
                    bytes: 8
                },
            ]
        );
        assert_eq!(w.buffers.len(), 7, "every buffer is checked");
        assert_eq!(
            w.remote.iter().map(|m| (m.kind, m.peer, m.buffer)).collect::<Vec<_>>(),
            [(Send, 0, 0xc000)],
            "only calls to other ranks go to the kernel"
        );

        let e = Work::sort(&[op(Send, 0, 0x1000, 4), op(Recv, 0, 0x2000, 2)], 0, 2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("1st ncclSend to this rank itself has 16 bytes")
                && e.message.contains("1st ncclRecv from itself has 8"),
            "{e}"
        );
        let e = Work::sort(&[op(Send, 0, 0x1000, 4)], 0, 1).unwrap_err();
        assert!(
            e.message
                .contains("sends to itself 1 time(s) and receives from itself 0"),
            "{e}"
        );
        // A receive of 0 elements does not match a send.
        let e = Work::sort(&[op(Send, 0, 0x1000, 4), op(Recv, 0, 0x2000, 0)], 0, 1).unwrap_err();
        assert!(e.message.contains("receives from itself 0"), "{e}");
        assert_eq!(ordinal(2), "2nd");
        assert_eq!(ordinal(12), "12th");
        assert_eq!(ordinal(23), "23rd");
    }

    #[test]
    fn a_group_beyond_the_launch_limit_is_refused_without_counting_self() {
        let mut ops: Vec<SendRecvOp> = (0..MAX_SENDRECV_OPS).map(|i| op(Send, 1 + i % 3, 0x1000, 1)).collect();
        ops.push(op(Send, 0, 0x1000, 1));
        ops.push(op(Recv, 0, 0x2000, 1));
        ops.push(op(Recv, 2, 0x2000, 0));
        assert_eq!(Work::sort(&ops, 0, 4).unwrap().remote.len(), MAX_SENDRECV_OPS);
        ops.push(op(Recv, 2, 0x2000, 1));
        let e = Work::sort(&ops, 0, 4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(
            e.message.contains(&format!("holds {} sends", MAX_SENDRECV_OPS + 1))
                && e.message.contains(&format!("at most {MAX_SENDRECV_OPS}")),
            "{e}"
        );
    }

    /// A shape of two ranks with 32 lanes, the cuts the tests below work out by hand.
    fn shape() -> Shape {
        Shape::new(2, 32, 2, 512)
    }

    #[test]
    fn lanes_cover_every_byte_once_from_aligned_starts() {
        for shape in [
            shape(),
            Shape::new(16, 32, 4, 1024),
            Shape::new(2, 1, 2, 16),
            Shape::new(2, 64, 2, 512),
            Shape::new(4, 48, 2, 512),
        ] {
            let slot = shape.slot_bytes;
            let sizes = [
                1u64,
                15,
                16,
                17,
                4096,
                MIN_LANE_BYTES + 1,
                slot - 1,
                slot,
                slot + 1,
                3 * slot + 5,
                8 * slot,
                8 * slot + 16,
                (1 << 30) + 3,
                (1 << 40) + 7,
            ];
            for bytes in sizes {
                let split = shape.split(bytes);
                assert!((1..=shape.lanes).contains(&split.lanes), "{bytes}");
                assert_eq!(
                    split.lanes as u64,
                    bytes.div_ceil(MIN_LANE_BYTES).min(shape.lanes as u64)
                );
                assert!(
                    split.chunk_bytes.is_multiple_of(16) && split.chunk_bytes > 0 && split.chunk_bytes <= slot,
                    "{bytes}: {split:?}"
                );
                let mut covered = 0;
                for lane in 0..split.lanes as u64 {
                    // As the kernel computes a lane's range.
                    let begin = lane * split.lane_units * 16;
                    let end = (begin + split.lane_units * 16).min(bytes);
                    assert_eq!(begin, covered, "{bytes}: lane {lane} starts where the previous ended");
                    assert!(
                        begin.is_multiple_of(16) && end > begin,
                        "{bytes}: lane {lane} [{begin}, {end})"
                    );
                    covered = end;
                }
                assert_eq!(covered, bytes, "{bytes}: the lanes cover the whole buffer");
            }
        }
        // Large sends fill every lane with chunks of a whole slot; small ones keep one chunk of their size.
        let s = shape();
        assert_eq!(s.split(1 << 30).chunk_bytes, s.slot_bytes);
        assert_eq!(s.split(1 << 30).lanes, s.lanes);
        assert_eq!(s.split(4096).chunk_bytes, 4096);
        assert_eq!(s.split(4096).lanes, 1);
        // Up to what the slots hold, every lane takes at most `depth` chunks: a send outside a group is
        // written whole before its receiver starts (nccl_gpu_test's send_recv_alone_outside_a_group_up_to_1MiB).
        for shape in [
            s,
            Shape::new(2, 16, 4, 128),
            Shape::new(16, 32, 2, 512),
            Shape::new(2, 1, 3, 16),
        ] {
            for bytes in [
                1u64 << 20,
                shape.buffered_bytes(),
                shape.buffered_bytes() / 3 + 5,
                100_000,
            ] {
                let split = shape.split(bytes.min(shape.buffered_bytes()));
                let lane_bytes = split.lane_units * 16;
                assert!(
                    lane_bytes.div_ceil(split.chunk_bytes) <= shape.depth as u64,
                    "{shape:?} {bytes}: {split:?}"
                );
            }
        }
        assert!(s.buffered_bytes() >= 1 << 20);
    }

    #[test]
    fn the_lanes_default_to_64_among_up_to_four_ranks_and_32_among_more() {
        let shape_with = |nranks: usize, vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Shape::from_source(
                nranks,
                &Source::from_fn(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())),
            )
        };
        assert_eq!(shape_with(2, &[]), Shape::new(2, 64, 2, 512));
        assert_eq!(
            shape_with(2, &[]).slot_bytes,
            512 << 10,
            "two ranks' 64 lanes keep whole slots"
        );
        assert_eq!(shape_with(1, &[]).lanes, 64);
        for nranks in [3, 4] {
            assert_eq!(shape_with(nranks, &[]), Shape::new(nranks, 64, 2, 512), "{nranks}");
        }
        assert_eq!(
            shape_with(4, &[]).slot_bytes,
            256 << 10,
            "four sources' 64 lanes share the area's cap"
        );
        // What a send outside a group may leave in the receiver's slots before its receive runs (README).
        assert_eq!(shape_with(2, &[]).buffered_bytes(), 64 << 20);
        assert_eq!(shape_with(4, &[]).buffered_bytes(), 32 << 20);
        for nranks in [5, 8, 16] {
            assert_eq!(shape_with(nranks, &[]), Shape::new(nranks, 32, 2, 512), "{nranks}");
        }
        // Set, the variable wins at every size of communicator, and a blank one counts as unset.
        assert_eq!(shape_with(8, &[("MSCCLPP_SENDRECV_LANES", "64")]).lanes, 64);
        assert_eq!(shape_with(2, &[("MSCCLPP_SENDRECV_LANES", "16")]).lanes, 16);
        assert_eq!(shape_with(4, &[("MSCCLPP_SENDRECV_LANES", "16")]).lanes, 16);
        assert_eq!(shape_with(8, &[("MSCCLPP_SENDRECV_LANES", " ")]).lanes, 32);
        assert_eq!(shape_with(4, &[("MSCCLPP_SENDRECV_LANES", " ")]).lanes, 64);
        // A bad value is the default for the communicator's size (with a warning), as unset is.
        assert_eq!(shape_with(8, &[("MSCCLPP_SENDRECV_LANES", "many")]).lanes, 32);
        assert_eq!(shape_with(4, &[("MSCCLPP_SENDRECV_LANES", "0")]).lanes, 64);
        let s = shape_with(
            2,
            &[("MSCCLPP_SENDRECV_DEPTH", "4"), ("MSCCLPP_SENDRECV_CHUNK_KB", "256")],
        );
        assert_eq!((s.lanes, s.depth, s.slot_bytes), (64, 4, 256 << 10));
    }

    #[test]
    fn the_lanes_default_is_the_one_the_settings_table_states() {
        // The table states it (its INFO log line and docs/settings.md's default column say it from there, a
        // test in settings.rs checks the column), and the shape takes it from the table at every size.
        assert_eq!(
            SENDRECV_LANES.default_text().as_deref(),
            Some("64 up to 4 ranks, 32 above")
        );
        let unset = Source::from_fn(|_| None);
        for nranks in 1..=MAX_RANKS {
            let stated: u32 = SENDRECV_LANES.default_among(nranks).parse().unwrap();
            assert_eq!(Shape::from_source(nranks, &unset).lanes, stated, "{nranks} ranks");
        }
        let above = SENDRECV_LANES.above.expect("the lanes' default depends on the ranks");
        assert_eq!(Shape::from_source(above.ranks, &unset).lanes, 64);
        assert_eq!(Shape::from_source(above.ranks + 1, &unset).lanes, 32);
    }

    #[test]
    fn the_lanes_setting_takes_every_lane_the_layout_has() {
        // The setting's range and the counters' layout are two constants: a build that widens one must widen
        // the other, or a larger MSCCLPP_SENDRECV_LANES is refused (with a warning) and measures the default.
        assert_eq!(
            SENDRECV_LANES.values,
            crate::settings::Values::Int {
                min: 1,
                max: SENDRECV_MAX_LANES as i64
            }
        );
        let most = SENDRECV_MAX_LANES.to_string();
        let source = Source::from_fn(move |name| (name == "MSCCLPP_SENDRECV_LANES").then(|| most.clone()));
        assert_eq!(Shape::from_source(4, &source).lanes as usize, SENDRECV_MAX_LANES);
    }

    #[test]
    fn shapes_fit_the_area_cap_and_keep_their_bounds() {
        assert_eq!(
            shape(),
            Shape {
                lanes: 32,
                depth: 2,
                slot_bytes: 512 << 10
            }
        );
        // Every shape the settings allow holds 1 MiB, what the GPU test sends outside a group.
        for nranks in 1..=MAX_RANKS {
            assert!(Shape::new(nranks, 1, 2, 16).buffered_bytes() >= 32 << 10);
            assert!(Shape::new(nranks, 32, 2, 512).buffered_bytes() >= 1 << 20, "{nranks}");
        }
        for nranks in 1..=MAX_RANKS {
            for (lanes, depth, kib) in [(16, 2, 256), (32, 8, 4096), (0, 0, 0), (99, 2, 1)] {
                let s = Shape::new(nranks, lanes, depth, kib);
                assert!((1..=SENDRECV_MAX_LANES as u32).contains(&s.lanes) && s.depth >= 2);
                assert!(s.slot_bytes >= MIN_CHUNK_BYTES && s.slot_bytes.is_multiple_of(16));
                assert!(
                    s.area_bytes(nranks)
                        <= SENDRECV_COUNTER_BYTES
                            + AREA_CAP.max(nranks as u64 * 2 * SENDRECV_MAX_LANES as u64 * MIN_CHUNK_BYTES),
                    "{nranks} {s:?}"
                );
            }
        }
        // Sixteen ranks at the defaults: the slots shrink to an eighth.
        assert_eq!(Shape::new(16, 32, 2, 512).slot_bytes, 128 << 10);
        assert_eq!(Shape::new(4, 32, 2, 512).slot_bytes, 512 << 10);
    }

    /// Every chunk the kernel moves on each lane of a channel, in its order: (the call's place among the
    /// channel's, offset, bytes). Written as send_recv.cuh's loop is, for each block of the channel.
    fn chunks(args: &SendRecvArgs, channel: usize) -> Vec<Vec<(usize, u64, u64)>> {
        let ch = args.channels[channel];
        let mut lanes = vec![Vec::new(); args.lanes as usize];
        for block in 0..ch.blocks {
            let mut lane = block as usize;
            while lane < args.lanes as usize {
                for k in 0..ch.ops as usize {
                    let op = args.ops[ch.first_op as usize + k];
                    if lane as u32 >= op.lanes {
                        continue;
                    }
                    let begin = lane as u64 * op.lane_units * 16;
                    let end = (begin + op.lane_units * 16).min(op.bytes);
                    let mut off = begin;
                    while off < end {
                        lanes[lane].push((k, off, op.chunk_bytes.min(end - off)));
                        off += op.chunk_bytes;
                    }
                }
                lane += ch.blocks as usize;
            }
        }
        lanes
    }

    fn moved(kind: SendRecvKind, peer: usize, buffer: DevicePtr, bytes: u64) -> Moved {
        Moved {
            kind,
            function: "test",
            peer,
            buffer,
            bytes,
            reduce_with: 0,
            pairing: Pairing::Alone,
        }
    }

    #[test]
    fn sender_and_receiver_move_the_same_chunks_whatever_their_groups_and_budgets() {
        let slot = shape().slot_bytes;
        let sizes = [100u64, 9 * slot + 48, 3 * slot, (20 << 20) + 1, 100 << 10];
        // Rank 0 sends these to rank 1, among receives from rank 1 and sends to rank 2, with a tight budget.
        let mut sender = Vec::new();
        for (i, &b) in sizes.iter().enumerate() {
            sender.push(moved(Recv, 1, 0x10_0000, 4096));
            sender.push(moved(Send, 1, 0x1000 + i as u64 * 3, b));
            sender.push(moved(Send, 2, 0x2000, 1 << 20));
        }
        // Rank 1 receives them alone, with the whole GPU.
        let receiver: Vec<Moved> = sizes.iter().map(|&b| moved(Recv, 0, 0x9000, b)).collect();
        let areas = [0; MAX_RANKS];
        for budget in [3u32, 4, 7, 128] {
            let s = channels(&sender, &[], &shape(), &Cut::default(), budget).unwrap();
            let r = channels(&receiver, &[], &shape(), &Cut::default(), 128).unwrap();
            let (sa, sb) = kernel_args(&sender, &[], &s, &shape(), &Cut::default(), &areas, 0, 0, 3);
            let (ra, rb) = kernel_args(&receiver, &[], &r, &shape(), &Cut::default(), &areas, 0, 1, 3);
            assert!(sb <= budget && rb <= 128);
            let to1 = s
                .iter()
                .position(|c| c.kind == ChannelKind::Send && c.peer == 1)
                .unwrap();
            assert_eq!(
                s[to1].ops,
                [1, 4, 7, 10, 13],
                "the sends to one peer keep their call order"
            );
            let sent = chunks(&sa, to1);
            let received = chunks(&ra, 0);
            assert_eq!(sent, received, "budget {budget}");
            // Every byte of every call moves once, in chunks that fit a half.
            for (k, &b) in sizes.iter().enumerate() {
                let mut pieces: Vec<(u64, u64)> =
                    sent.iter().flatten().filter(|c| c.0 == k).map(|c| (c.1, c.2)).collect();
                pieces.sort();
                let mut at = 0;
                for (off, n) in pieces {
                    assert!(off == at && off.is_multiple_of(16) && n > 0 && n <= slot);
                    at += n;
                }
                assert_eq!(at, b);
            }
        }
    }

    #[test]
    fn blocks_are_capped_to_fit_the_share_with_one_per_channel_at_least() {
        assert_eq!(fit_blocks(&[8, 8, 8], 128).unwrap(), [8, 8, 8]);
        assert_eq!(fit_blocks(&[8, 8, 8], 10).unwrap(), [3, 3, 3]);
        assert_eq!(fit_blocks(&[8, 1, 1], 5).unwrap(), [3, 1, 1]);
        assert_eq!(fit_blocks(&[2, 5], 2).unwrap(), [1, 1]);
        assert!(fit_blocks(&[], 1).unwrap().is_empty());
        let e = fit_blocks(&[1; 30], 16).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidUsage);
        assert!(e.message.contains("30 here") && e.message.contains("at most 16"), "{e}");
    }

    #[test]
    fn the_argument_lays_channels_and_calls_out_contiguously() {
        let remote = [
            moved(Send, 2, 0x1000, 5 * MIN_LANE_BYTES),
            moved(Recv, 2, 0x2008, 100),
            moved(Send, 1, 0x3000, 16),
            moved(Send, 2, 0x4000, 16),
        ];
        let mut areas = [0; MAX_RANKS];
        areas[..3].copy_from_slice(&[0xa0, 0xb0, 0xc0]);
        // A copy to this rank itself, unaligned on its source side, in a channel of its own, last.
        let copies = [SelfCopy {
            dst: 0x5000,
            src: 0x6004,
            bytes: 2 * MIN_LANE_BYTES,
        }];
        let c = channels(&remote, &copies, &shape(), &Cut::default(), 128).unwrap();
        assert_eq!(c.iter().map(|c| c.blocks).collect::<Vec<_>>(), [5, 1, 1, 2]);
        assert_eq!((c[3].kind, &c[3].ops), (ChannelKind::Copy, &vec![0]));
        let (a, blocks) = kernel_args(&remote, &copies, &c, &shape(), &Cut::default(), &areas, 0xdead, 0, 3);
        assert_eq!(blocks, 9);
        assert_eq!(a.channel_count, 4);
        assert_eq!(
            (a.channels[3].kind, a.channels[3].first_op, a.channels[3].first_block),
            (SENDRECV_COPY, 4, 7)
        );
        assert_eq!(
            (a.ops[4].ptr, a.ops[4].src, a.ops[4].flags, a.ops[4].lanes),
            (0x5000, 0x6004, 0, 2)
        );
        assert!(a.ops[..4].iter().all(|o| o.src == 0));
        let (a, blocks) = kernel_args(&remote, &[], &c[..3], &shape(), &Cut::default(), &areas, 0xdead, 0, 3);
        assert_eq!(blocks, 7);
        assert_eq!((a.rank, a.nranks, a.abort_flag), (0, 3, 0xdead));
        assert_eq!((a.lanes, a.depth, a.slot_bytes), (32, 2, 512 << 10));
        assert_eq!(a.areas, areas);
        assert_eq!(
            a.channels[..3],
            [
                SendRecvChannelArgs {
                    first_op: 0,
                    ops: 2,
                    first_block: 0,
                    blocks: 5,
                    peer: 2,
                    kind: SENDRECV_SEND
                },
                SendRecvChannelArgs {
                    first_op: 2,
                    ops: 1,
                    first_block: 5,
                    blocks: 1,
                    peer: 2,
                    kind: SENDRECV_RECV
                },
                SendRecvChannelArgs {
                    first_op: 3,
                    ops: 1,
                    first_block: 6,
                    blocks: 1,
                    peer: 1,
                    kind: SENDRECV_SEND
                },
            ]
        );
        assert_eq!(
            a.ops[..4].iter().map(|o| (o.ptr, o.flags, o.lanes)).collect::<Vec<_>>(),
            [(0x1000, 1, 5), (0x4000, 1, 1), (0x2008, 0, 1), (0x3000, 1, 1)]
        );
    }

    #[test]
    fn pairings_reach_the_kernel_as_flags() {
        // The middle of a chain: the receive from rank 3 is counted as it lands, the send on to rank 1
        // waits for it (the peer in the bits from SENDRECV_PEER_SHIFT on).
        let mut received = moved(Recv, 3, 0x1000, 64);
        received.pairing = Pairing::Forwarded;
        let mut sent = moved(Send, 1, 0x1000, 64);
        sent.pairing = Pairing::Forward { from: 3 };
        let mut guarded = moved(Send, 2, 0x2000, 64);
        guarded.pairing = Pairing::Guarded;
        let remote = [received, sent, guarded];
        let c = channels(&remote, &[], &shape(), &Cut::default(), 128).unwrap();
        let (a, _) = kernel_args(&remote, &[], &c, &shape(), &Cut::default(), &[0; MAX_RANKS], 0, 0, 4);
        let flags: Vec<u32> = a.ops[..3].iter().map(|o| o.flags).collect();
        assert_eq!(
            flags,
            [
                SENDRECV_ALIGNED | SENDRECV_FORWARDED,
                SENDRECV_ALIGNED | SENDRECV_FORWARD | (3 << SENDRECV_PEER_SHIFT),
                SENDRECV_ALIGNED | SENDRECV_GUARDED
            ]
        );
        // The middle of a reduce's chain: a relay channel of its own, the rank it sends to in the flags.
        let mut relay = moved(Recv, 2, 0, 64);
        relay.reduce_with = 0x3000;
        relay.pairing = Pairing::relay(0);
        let c = channels(&[relay], &[], &shape(), &Cut::default(), 128).unwrap();
        assert_eq!((c[0].kind, c[0].peer), (ChannelKind::Relay, 2));
        let (a, _) = kernel_args(&[relay], &[], &c, &shape(), &Cut::default(), &[0; MAX_RANKS], 0, 1, 4);
        assert_eq!((a.channels[0].kind, a.channels[0].peer), (SENDRECV_RELAY, 2));
        assert_eq!(
            (a.ops[0].ptr, a.ops[0].src, a.ops[0].flags),
            (0, 0x3000, SENDRECV_ALIGNED)
        );
        relay.pairing = Pairing::relay(3);
        let (a, _) = kernel_args(&[relay], &[], &c, &shape(), &Cut::default(), &[0; MAX_RANKS], 0, 1, 4);
        assert_eq!(a.ops[0].flags, SENDRECV_ALIGNED | (3 << SENDRECV_PEER_SHIFT));
        assert_eq!(
            SENDRECV_FORWARD | (15 << SENDRECV_PEER_SHIFT),
            0xf08,
            "every rank fits the bits"
        );
    }

    #[test]
    fn the_area_holds_every_slot_the_kernel_addresses() {
        for nranks in [1usize, 2, 4, 16] {
            for s in [
                shape(),
                Shape::new(nranks, 32, 4, 64),
                Shape::new(nranks, 3, 2, 16),
                Shape::new(nranks, 64, 2, 512),
                Shape::new(nranks, 48, 2, 512),
            ] {
                // send_recv.cuh's sendRecvSlot for the last source, lane and slot, plus a slot.
                let (lanes, depth) = (s.lanes as u64, s.depth as u64);
                let last = SENDRECV_COUNTER_BYTES
                    + (((nranks as u64 - 1) * lanes + lanes - 1) * depth + depth - 1) * s.slot_bytes
                    + s.slot_bytes;
                assert_eq!(s.area_bytes(nranks), last);
            }
        }
        assert_eq!(shape().area_bytes(2), (64 << 20) + SENDRECV_COUNTER_BYTES);
        // 64 lanes: the area stays within its cap, the slots shrinking from four ranks.
        assert_eq!(
            Shape::new(2, 64, 2, 512).area_bytes(2),
            (128 << 20) + SENDRECV_COUNTER_BYTES
        );
        assert_eq!(Shape::new(4, 64, 2, 512).slot_bytes, 256 << 10);
    }
}
