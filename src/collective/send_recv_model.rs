//! A host model of the send/receive kernel (`kernels/collectives/send_recv.cuh`) run on what the host lays
//! out for it (`send_recv::kernel_args`), for the rings and chains of `send_recv_collectives.rs`: every rank's
//! blocks walk their lanes, ops and chunks as the kernel's loops do, wait on the same counters (posted, credit,
//! landed) and publish the same values, and move the bytes through slots of the areas. A chunk is one
//! atomic step (a block waits for everything before it publishes anything, so this loses no deadlock), and
//! a rank's next launch starts once every block of its launch has ended. It finds deadlocks (no block can go
//! on, and not all have ended), counters that skip or go back, and bytes that end wrong.

use super::launches;
use crate::collective::kernel_args::{
    MAX_RANKS, SENDRECV_ALIGNED, SENDRECV_COPY, SENDRECV_FORWARD, SENDRECV_FORWARDED, SENDRECV_GUARDED,
    SENDRECV_MAX_LANES, SENDRECV_PEER_SHIFT, SENDRECV_RECV, SENDRECV_RELAY, SENDRECV_RELAY_NO_IN,
    SENDRECV_RELAY_NO_OUT, SENDRECV_SEND, SendRecvArgs, SendRecvOpArgs,
};
use crate::collective::send_recv::{Shape, plan};
use crate::collective::{Call, Collective, DataType, RedOp};
use std::collections::HashMap;

const LANES: usize = SENDRECV_MAX_LANES;

fn at(rank: usize, lane: u32) -> usize {
    rank * LANES + lane as usize
}

/// One rank's send/receive area: its counters, each [rank][lane], and its slots.
#[derive(Clone)]
struct Area {
    posted: Vec<u64>,
    credit: Vec<u64>,
    sent: Vec<u64>,
    received: Vec<u64>,
    guard: Vec<u64>,
    landed: Vec<u64>,
    /// (source, lane, slot) -> bytes.
    slots: HashMap<(usize, u32, u64), Vec<u8>>,
}

impl Area {
    fn new() -> Area {
        let z = vec![0u64; MAX_RANKS * LANES];
        Area {
            posted: z.clone(),
            credit: z.clone(),
            sent: z.clone(),
            received: z.clone(),
            guard: z.clone(),
            landed: z,
            slots: HashMap::new(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    LaneStart {
        lane: u32,
    },
    Send {
        lane: u32,
        ptr: u64,
        n: u64,
        forward_from: Option<usize>,
        guarded: bool,
    },
    Recv {
        lane: u32,
        ptr: u64,
        own: u64,
        n: u64,
        forwarded: bool,
        guarded: bool,
    },
    Relay {
        lane: u32,
        ptr: u64,
        src: u64,
        n: u64,
        receives: bool,
        sends: bool,
    },
    Copy {
        dst: u64,
        src: u64,
        n: u64,
    },
    LaneEnd {
        lane: u32,
    },
}

#[derive(Debug)]
struct Block {
    kind: u32,
    peer: usize,
    to: usize,
    events: Vec<Ev>,
    pc: usize,
    chunk: u64,
    first: u64,
    guarded: u64,
    forwarded: u64,
    landed_peer: Option<usize>,
    input: u64,
    output: u64,
    first_in: u64,
    first_out: u64,
}

fn lane_of(op: &SendRecvOpArgs, lane: u32) -> (u64, u64) {
    let begin = lane as u64 * op.lane_units * 16;
    (begin, (begin + op.lane_units * 16).min(op.bytes))
}

/// The events of every block of a launch, as the kernel's loops walk them.
fn blocks_of(a: &SendRecvArgs, blocks: u32, reduces: bool) -> Vec<Block> {
    let channels = &a.channels[..a.channel_count as usize];
    (0..blocks)
        .map(|b| {
            let mut c = 0;
            while c + 1 < channels.len() && b >= channels[c + 1].first_block {
                c += 1;
            }
            let ch = channels[c];
            let ops = &a.ops[ch.first_op as usize..(ch.first_op + ch.ops) as usize];
            let used = ops.iter().map(|o| o.lanes).max().unwrap_or(0);
            let mut events = Vec::new();
            let first_lane = b - ch.first_block;
            let to = (ops[0].flags >> SENDRECV_PEER_SHIFT) as usize;
            match ch.kind {
                SENDRECV_COPY => {
                    for op in ops {
                        let mut lane = first_lane;
                        while lane < op.lanes {
                            let (begin, end) = lane_of(op, lane);
                            events.push(Ev::Copy {
                                dst: op.ptr + begin,
                                src: op.src + begin,
                                n: end.saturating_sub(begin),
                            });
                            lane += ch.blocks;
                        }
                    }
                }
                SENDRECV_RELAY => {
                    assert!(
                        reduces,
                        "a relay channel in a moving launch: the kernel would take it for a receive"
                    );
                    let mut lane = first_lane;
                    while lane < used {
                        events.push(Ev::LaneStart { lane });
                        let mut chunks = 0;
                        for op in ops.iter().filter(|o| lane < o.lanes) {
                            let (begin, end) = lane_of(op, lane);
                            let c = if end > begin {
                                (end - begin).div_ceil(op.chunk_bytes)
                            } else {
                                0
                            };
                            chunks = chunks.max(c);
                        }
                        // Chunk-major: chunk c of every op, then chunk c + 1.
                        for c in 0..chunks {
                            for op in ops.iter() {
                                if lane >= op.lanes {
                                    continue;
                                }
                                assert_eq!(
                                    (op.flags >> SENDRECV_PEER_SHIFT) as usize,
                                    to,
                                    "every relay sends to one rank"
                                );
                                let (begin, end) = lane_of(op, lane);
                                let off = begin + c * op.chunk_bytes;
                                if off >= end {
                                    continue;
                                }
                                events.push(Ev::Relay {
                                    lane,
                                    ptr: op.ptr + off,
                                    src: op.src + off,
                                    n: (end - off).min(op.chunk_bytes),
                                    receives: op.flags & SENDRECV_RELAY_NO_IN == 0,
                                    sends: op.flags & SENDRECV_RELAY_NO_OUT == 0,
                                });
                            }
                        }
                        events.push(Ev::LaneEnd { lane });
                        lane += ch.blocks;
                    }
                }
                SENDRECV_SEND | SENDRECV_RECV => {
                    let sending = ch.kind == SENDRECV_SEND;
                    let mut lane = first_lane;
                    while lane < used {
                        events.push(Ev::LaneStart { lane });
                        for op in ops.iter().filter(|o| lane < o.lanes) {
                            let (begin, end) = lane_of(op, lane);
                            let mut off = begin;
                            while off < end {
                                let n = (end - off).min(op.chunk_bytes);
                                let guarded = op.flags & SENDRECV_GUARDED != 0;
                                events.push(if sending {
                                    Ev::Send {
                                        lane,
                                        ptr: op.ptr + off,
                                        n,
                                        forward_from: (op.flags & SENDRECV_FORWARD != 0)
                                            .then_some((op.flags >> SENDRECV_PEER_SHIFT) as usize),
                                        guarded,
                                    }
                                } else {
                                    Ev::Recv {
                                        lane,
                                        ptr: op.ptr + off,
                                        own: if reduces {
                                            op.src + if op.src != 0 { off } else { 0 }
                                        } else {
                                            0
                                        },
                                        n,
                                        forwarded: op.flags & SENDRECV_FORWARDED != 0,
                                        guarded,
                                    }
                                });
                                off += op.chunk_bytes;
                            }
                        }
                        events.push(Ev::LaneEnd { lane });
                        lane += ch.blocks;
                    }
                }
                k => panic!("channel kind {k}"),
            }
            Block {
                kind: ch.kind,
                peer: ch.peer as usize,
                to,
                events,
                pc: 0,
                chunk: 0,
                first: 0,
                guarded: 0,
                forwarded: 0,
                landed_peer: None,
                input: 0,
                output: 0,
                first_in: 0,
                first_out: 0,
            }
        })
        .collect()
}

/// Every rank's memory: regions (base -> bytes).
struct Memory {
    regions: Vec<HashMap<u64, Vec<u8>>>,
}

impl Memory {
    fn find(&mut self, rank: usize, addr: u64, n: u64) -> &mut [u8] {
        for (&base, bytes) in self.regions[rank].iter_mut() {
            if addr >= base && addr + n <= base + bytes.len() as u64 {
                let o = (addr - base) as usize;
                return &mut bytes[o..o + n as usize];
            }
        }
        panic!("rank {rank}: {n} bytes at {addr:#x} are in no buffer");
    }
    fn read(&mut self, rank: usize, addr: u64, n: u64) -> Vec<u8> {
        self.find(rank, addr, n).to_vec()
    }
}

/// Reduces (u32 sums) `own` and `slot`.
fn sum(own: &[u8], slot: &[u8]) -> Vec<u8> {
    assert_eq!(own.len() % 4, 0);
    own.chunks(4)
        .zip(slot.chunks(4))
        .flat_map(|(a, b)| {
            let v = u32::from_le_bytes(a.try_into().unwrap()).wrapping_add(u32::from_le_bytes(b.try_into().unwrap()));
            v.to_le_bytes()
        })
        .collect()
}

struct Sim {
    nranks: usize,
    depth: u64,
    slot_bytes: u64,
    areas: Vec<Area>,
    mem: Option<Memory>,
}

impl Sim {
    fn write_counter(v: &mut u64, value: u64, what: &str) {
        assert_eq!(value, *v + 1, "{what} goes from {} to {value}", *v);
        *v = value;
    }

    /// One event of `b` on `rank`, if what it waits for is there.
    fn step(&mut self, rank: usize, b: &mut Block) -> bool {
        let ev = b.events[b.pc];
        let depth = self.depth;
        match ev {
            Ev::LaneStart { lane } => {
                let own = &self.areas[rank];
                b.guarded = 0;
                b.forwarded = 0;
                b.landed_peer = None;
                match b.kind {
                    SENDRECV_SEND => b.first = own.sent[at(b.peer, lane)],
                    SENDRECV_RECV => b.first = own.received[at(b.peer, lane)],
                    _ => {
                        b.first_in = own.received[at(b.peer, lane)];
                        b.first_out = own.sent[at(b.to, lane)];
                        b.input = b.first_in;
                        b.output = b.first_out;
                    }
                }
                b.chunk = b.first;
            }
            Ev::LaneEnd { lane } => {
                let own = &mut self.areas[rank];
                match b.kind {
                    SENDRECV_SEND => {
                        own.sent[at(b.peer, lane)] = b.chunk;
                        if b.forwarded != 0 {
                            own.landed[at(b.landed_peer.unwrap(), lane)] = 0;
                        }
                    }
                    SENDRECV_RECV => {
                        own.received[at(b.peer, lane)] = b.chunk;
                        if b.guarded != 0 {
                            own.guard[at(b.peer, lane)] = 0;
                        }
                    }
                    _ => {
                        own.received[at(b.peer, lane)] = b.input;
                        own.sent[at(b.to, lane)] = b.output;
                    }
                }
            }
            Ev::Copy { dst, src, n } => {
                if let Some(m) = &mut self.mem {
                    let v = m.read(rank, src, n);
                    m.find(rank, dst, n).copy_from_slice(&v);
                }
            }
            Ev::Send {
                lane,
                ptr,
                n,
                forward_from,
                guarded,
            } => {
                let chunk = b.chunk + 1;
                let own = &self.areas[rank];
                if let Some(from) = forward_from {
                    b.landed_peer = Some(from);
                    if own.landed[at(from, lane)] < b.forwarded + 1 {
                        return false;
                    }
                }
                if own.credit[at(b.peer, lane)] < chunk.saturating_sub(depth) {
                    return false;
                }
                assert!(n <= self.slot_bytes);
                b.chunk = chunk;
                if forward_from.is_some() {
                    b.forwarded += 1;
                }
                if let Some(m) = &mut self.mem {
                    let v = m.read(rank, ptr, n);
                    self.areas[b.peer].slots.insert((rank, lane, chunk % depth), v);
                }
                Self::write_counter(&mut self.areas[b.peer].posted[at(rank, lane)], chunk, "posted");
                if guarded {
                    b.guarded += 1;
                    self.areas[rank].guard[at(b.peer, lane)] = b.guarded;
                }
            }
            Ev::Recv {
                lane,
                ptr,
                own: operand,
                n,
                forwarded,
                guarded,
            } => {
                let chunk = b.chunk + 1;
                let own = &self.areas[rank];
                if own.posted[at(b.peer, lane)] < chunk {
                    return false;
                }
                if guarded && own.guard[at(b.peer, lane)] < b.guarded + 1 {
                    return false;
                }
                b.chunk = chunk;
                if guarded {
                    b.guarded += 1;
                }
                if let Some(m) = &mut self.mem {
                    let slot = self.areas[rank].slots[&(b.peer, lane, chunk % depth)][..n as usize].to_vec();
                    let v = if operand != 0 {
                        sum(&m.read(rank, operand, n), &slot)
                    } else {
                        slot
                    };
                    m.find(rank, ptr, n).copy_from_slice(&v);
                }
                Self::write_counter(&mut self.areas[b.peer].credit[at(rank, lane)], chunk, "credit");
                if forwarded {
                    b.forwarded += 1;
                    self.areas[rank].landed[at(b.peer, lane)] = b.forwarded;
                }
            }
            Ev::Relay {
                lane,
                ptr,
                src,
                n,
                receives,
                sends,
            } => {
                let own = &self.areas[rank];
                let (input, output) = (b.input + receives as u64, b.output + sends as u64);
                if receives && own.posted[at(b.peer, lane)] < input {
                    return false;
                }
                if sends && own.credit[at(b.to, lane)] < output.saturating_sub(depth) {
                    return false;
                }
                assert!(n <= self.slot_bytes);
                (b.input, b.output) = (input, output);
                if let Some(m) = &mut self.mem {
                    let mine = m.read(rank, src, n);
                    let v = if receives {
                        let slot = &self.areas[rank].slots[&(b.peer, lane, input % depth)][..n as usize];
                        sum(&mine, slot)
                    } else {
                        mine
                    };
                    if sends {
                        self.areas[b.to].slots.insert((rank, lane, output % depth), v);
                    } else {
                        m.find(rank, ptr, n).copy_from_slice(&v);
                    }
                }
                if sends {
                    Self::write_counter(&mut self.areas[b.to].posted[at(rank, lane)], output, "posted");
                }
                if receives {
                    Self::write_counter(&mut self.areas[b.peer].credit[at(rank, lane)], input, "credit");
                }
            }
        }
        b.pc += 1;
        true
    }
}

/// Where a rank's buffers lie: (send, its bytes), (recv, its bytes).
type Layout = ((u64, u64), (u64, u64));

/// One configuration: `nranks` ranks of `shape`, each rank's launches of `call` (its blocks at most
/// `max_blocks[rank]`), its buffers `layout(rank)` (`recv` may lie inside `send`, or the other way round:
/// the in-place calls). With `data`, returns every rank's output.
fn run(
    call: &Call,
    nranks: usize,
    shape: Shape,
    max_blocks: &[u32],
    piece: u64,
    layout: &dyn Fn(usize) -> Layout,
    data: bool,
) -> std::result::Result<Option<Vec<Vec<u8>>>, String> {
    let mut launches_of: Vec<Vec<(SendRecvArgs, u32, bool)>> = Vec::new();
    for (rank, &max_blocks) in max_blocks.iter().enumerate().take(nranks) {
        let mut l = Vec::new();
        let ((send, _), (recv, _)) = layout(rank);
        for launch in launches(call, rank, nranks, send, recv, piece).unwrap() {
            let copies = launch.work.moving_copies();
            let (args, blocks) = plan(
                &launch.work,
                &copies,
                &shape,
                max_blocks,
                &[0; MAX_RANKS],
                0,
                rank,
                nranks,
            )
            .map_err(|e| e.message)?;
            assert!(blocks <= max_blocks);
            for op in &args.ops[..launch.work.remote.len() + copies.len()] {
                let aligned = op.ptr % 16 == 0 && op.src % 16 == 0;
                assert_eq!(op.flags & SENDRECV_ALIGNED != 0, aligned);
            }
            l.push((args, blocks, launch.reducing.is_some()));
        }
        launches_of.push(l);
    }
    // Each rank's input: element i of rank r is a value of its own.
    let value = |r: usize, i: u64| (r as u32 + 1).wrapping_mul(0x9E37_79B9) ^ (i as u32).wrapping_mul(0x85EB_CA6B);
    let mem = data.then(|| Memory {
        regions: (0..nranks)
            .map(|r| {
                let ((send, send_bytes), (recv, recv_bytes)) = layout(r);
                let mut regions = HashMap::new();
                let input: Vec<u8> = (0..send_bytes / 4).flat_map(|i| value(r, i).to_le_bytes()).collect();
                // In place: one buffer holds the other.
                if recv >= send && recv + recv_bytes <= send + send_bytes {
                    regions.insert(send, input);
                } else if send >= recv && send + send_bytes <= recv + recv_bytes {
                    let mut out = vec![0xEEu8; recv_bytes as usize];
                    let o = (send - recv) as usize;
                    out[o..o + send_bytes as usize].copy_from_slice(&input);
                    regions.insert(recv, out);
                } else {
                    regions.insert(send, input);
                    regions.insert(recv, vec![0xEEu8; recv_bytes as usize]);
                }
                regions
            })
            .collect(),
    });
    let mut sim = Sim {
        nranks,
        depth: shape.depth as u64,
        slot_bytes: shape.slot_bytes,
        areas: vec![Area::new(); nranks],
        mem,
    };
    let mut next_launch = vec![0usize; nranks];
    let mut running: Vec<Vec<Block>> = (0..nranks).map(|_| Vec::new()).collect();
    loop {
        let mut progressed = false;
        let mut done = true;
        for rank in 0..sim.nranks {
            if running[rank].iter().all(|b| b.pc == b.events.len()) && next_launch[rank] < launches_of[rank].len() {
                let (args, blocks, reduces) = &launches_of[rank][next_launch[rank]];
                running[rank] = blocks_of(args, *blocks, *reduces);
                next_launch[rank] += 1;
                progressed = true;
            }
            for b in running[rank].iter_mut() {
                // A few events a turn, so that the blocks interleave.
                for _ in 0..3 {
                    if b.pc < b.events.len() && sim.step(rank, b) {
                        progressed = true;
                    }
                }
                done &= b.pc == b.events.len();
            }
            done &= next_launch[rank] == launches_of[rank].len();
        }
        if done {
            break;
        }
        if !progressed {
            let mut stuck = String::new();
            for (rank, blocks) in running.iter().enumerate() {
                for (i, b) in blocks.iter().enumerate().filter(|(_, b)| b.pc < b.events.len()) {
                    stuck += &format!(
                        "rank {rank} launch {} block {i} (kind {} peer {}): {:?}\n",
                        next_launch[rank] - 1,
                        b.kind,
                        b.peer,
                        b.events[b.pc]
                    );
                }
            }
            return Err(format!("deadlock:\n{stuck}"));
        }
    }
    // Every pair's counts agree.
    for r in 0..nranks {
        for q in 0..nranks {
            for lane in 0..LANES as u32 {
                let (a, b) = (&sim.areas[r], &sim.areas[q]);
                assert_eq!(a.sent[at(q, lane)], b.received[at(r, lane)], "{r} -> {q} lane {lane}");
                assert_eq!(b.posted[at(r, lane)], a.sent[at(q, lane)], "{r} -> {q} lane {lane}");
                assert_eq!(a.credit[at(q, lane)], a.sent[at(q, lane)], "{r} -> {q} lane {lane}");
                assert_eq!((a.landed[at(q, lane)], a.guard[at(q, lane)]), (0, 0));
            }
        }
    }
    Ok(sim.mem.map(|mut m| {
        (0..nranks)
            .map(|r| {
                let (_, (recv, recv_bytes)) = layout(r);
                m.read(r, recv, recv_bytes)
            })
            .collect()
    }))
}

fn call(collective: Collective, count: usize) -> Call {
    Call {
        collective,
        function: "model",
        send: 0,
        recv: 0,
        count,
        datatype: DataType::Uint32,
        op: (!matches!(collective, Collective::AllGather | Collective::Broadcast)).then_some(RedOp::Sum),
        root: 0,
    }
}

/// Where each case puts its buffers: out of place, or in place as NCCL lays it out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Apart,
    InPlace,
}

/// Runs `collective` of `count` elements among `nranks` and checks every rank's output.
fn check(
    collective: Collective,
    nranks: usize,
    count: u64,
    shape: Shape,
    max_blocks: &[u32],
    place: Place,
    data: bool,
) {
    let bytes = count * 4;
    let (send_bytes, recv_bytes, piece) = match collective {
        Collective::AllGather => (bytes, bytes * nranks as u64, bytes),
        Collective::ReduceScatter => (bytes * nranks as u64, bytes, bytes),
        _ => (bytes, bytes, bytes),
    };
    let (base, whole) = (0x1_0000_0004u64, bytes * nranks as u64);
    let layout = |rank: usize| -> Layout {
        match (place, collective) {
            (Place::Apart, _) => ((base + 4, send_bytes), (base + (1 << 31) + 8, recv_bytes)),
            // sendbuff = recvbuff + rank * count
            (Place::InPlace, Collective::AllGather) => ((base + rank as u64 * bytes, bytes), (base, whole)),
            // recvbuff = sendbuff + rank * recvcount
            (Place::InPlace, Collective::ReduceScatter) => ((base, whole), (base + rank as u64 * bytes, bytes)),
            (Place::InPlace, _) => ((base, bytes), (base, bytes)),
        }
    };
    let what = format!("{collective:?} of {count} among {nranks}, {shape:?}, blocks {max_blocks:?}, {place:?}");
    let result = run(
        &call(collective, count as usize),
        nranks,
        shape,
        max_blocks,
        piece,
        &layout,
        data,
    );
    let outputs = match result {
        Ok(o) => o,
        Err(e) => panic!("{what}: {e}"),
    };
    let Some(outputs) = outputs else { return };
    let value = |r: usize, i: u64| (r as u32 + 1).wrapping_mul(0x9E37_79B9) ^ (i as u32).wrapping_mul(0x85EB_CA6B);
    for (r, out) in outputs.iter().enumerate() {
        // A reduce's result is the root's (rank 0, `call`) alone.
        if collective == Collective::Reduce && r != 0 {
            continue;
        }
        let got: Vec<u32> = out
            .chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let expect: Vec<u32> = match collective {
            Collective::AllGather => (0..nranks).flat_map(|q| (0..count).map(move |i| value(q, i))).collect(),
            Collective::ReduceScatter => (0..count)
                .map(|i| (0..nranks).fold(0u32, |s, q| s.wrapping_add(value(q, r as u64 * count + i))))
                .collect(),
            Collective::Broadcast => (0..count).map(|i| value(0, i)).collect(),
            _ => (0..count)
                .map(|i| (0..nranks).fold(0u32, |s, q| s.wrapping_add(value(q, i))))
                .collect(),
        };
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expect[i]) {
            panic!("{what}: rank {r} element {i} is {:#x}, not {:#x}", got[i], expect[i]);
        }
    }
}

/// Runs `collectives` among 3 to 5 ranks at depths 2 and 4 on each of `shapes` (lanes, KiB a slot), for each of
/// `counts(lanes)`, out of place and in place, with blocks for every lane and with `few(rank)`: how many ran.
fn small_cases(
    collectives: &[Collective],
    shapes: &[(u32, u64)],
    counts: impl Fn(u64) -> Vec<u64>,
    few: impl Fn(usize) -> u32,
) -> usize {
    let mut cases = 0;
    for nranks in [3usize, 4, 5] {
        for depth in [2u32, 4] {
            for &(lanes, chunk_kib) in shapes {
                let shape = Shape::new(nranks, lanes, depth, chunk_kib);
                for count in counts(lanes as u64) {
                    for blocks in [vec![64u32; nranks], (0..nranks).map(&few).collect()] {
                        for &c in collectives {
                            for place in [Place::Apart, Place::InPlace] {
                                check(c, nranks, count, shape, &blocks, place, true);
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    cases
}

#[test]
fn rings_finish_and_move_every_byte_once() {
    // (Debug builds walk every byte: 3 to 5 ranks, depths 2 and 4 keep this under half a minute.)
    // Parts of a few chunks a lane, not a multiple of the chunk, and a last lane shorter.
    let cases = small_cases(
        &[Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce],
        &[(1, 16), (2, 16), (3, 32)],
        |lanes| vec![4096 * lanes * 3 + 12, 4096 * 5 + 3, 4096 * lanes * 2 - 1, 700, 3],
        |r| 3 + (r as u32 % 2),
    );
    assert!(cases > 0);
}

#[test]
fn rings_finish_at_their_real_sizes() {
    // 64 MiB (`RINGS_FROM`) and a little more among 3 to 8, the default shapes (64 lanes among up to four, 32
    // among more; depth 2, slots of up to 512 KiB) and deeper: no bytes, only the counters.
    for nranks in [3usize, 4, 8] {
        for (lanes, depth) in [(32u32, 2u32), (32, 4), (64, 2)] {
            let shape = Shape::new(nranks, lanes, depth, 512);
            for bytes in [64u64 << 20, (64 << 20) + 4 * 7] {
                for blocks in [
                    vec![64u32; nranks],
                    vec![16; nranks],
                    vec![3; nranks],
                    (0..nranks).map(|r| 5 + 7 * (r as u32 % 2)).collect(),
                ] {
                    for c in [Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce] {
                        let count = match c {
                            Collective::AllReduce => bytes / 4,
                            _ => bytes / 4 / nranks as u64,
                        };
                        check(c, nranks, count, shape, &blocks, Place::Apart, false);
                    }
                }
            }
        }
    }
}

#[test]
fn chains_finish_and_move_every_byte_once() {
    // Broadcast from the root through every rank, reduce ending at it; a middle rank needs two blocks.
    let cases = small_cases(
        &[Collective::Broadcast, Collective::Reduce],
        &[(1, 16), (3, 32)],
        |lanes| vec![4096 * lanes * 3 + 12, 4096 * 5 + 3, 700, 3],
        |r| 2 + (r as u32 % 2),
    );
    assert!(cases > 0);
}

#[test]
fn chains_cut_finer_move_every_byte_once() {
    // Lanes of 4 MiB and a little more, one among three and two among four: a chain cuts them finer than plain
    // sends (a reduce in 32 chunks of 128 KiB a lane, a broadcast in 16 of 256 KiB; slots of 512 KiB), every
    // byte checked, with a block for every lane and with fewer.
    for (nranks, lanes) in [(3usize, 1u32), (4, 2)] {
        let shape = Shape::new(nranks, lanes, 2, 512);
        assert_eq!(shape.slot_bytes, 512 << 10);
        let count = (lanes as u64 * (4 << 20) + 48) / 4;
        for blocks in [vec![8u32; nranks], vec![3; nranks]] {
            for c in [Collective::Broadcast, Collective::Reduce] {
                check(c, nranks, count, shape, &blocks, Place::Apart, true);
            }
        }
    }
}

#[test]
fn chains_finish_at_their_real_sizes() {
    // From where a reduce among four goes as a chain (256 KiB) to 64 MiB, at the default shapes (64 lanes
    // among up to four, 32 among more) with blocks for every lane and for a few: no bytes, only the counters.
    for nranks in [3usize, 4, 8] {
        for lanes in [32u32, 64] {
            let shape = Shape::new(nranks, lanes, 2, 512);
            for bytes in [256u64 << 10, 1 << 20, 64 << 20] {
                for blocks in [vec![128u32; nranks], vec![3; nranks]] {
                    for c in [Collective::Broadcast, Collective::Reduce] {
                        check(c, nranks, bytes / 4, shape, &blocks, Place::Apart, false);
                    }
                }
            }
        }
    }
}

#[test]
fn two_ranks_all_gather_moves_every_byte_in_fewer_lanes_than_the_shape() {
    // A part of 64 lanes of 16 KiB and a little more: cut into 32 lanes (SELF_COPYING_LANES) of two slots of
    // the 64-lane layout's each, with blocks for every lane and for fewer.
    let shape = Shape::new(2, 64, 2, 16);
    let count = (64u64 << 14) / 4 + 5;
    for blocks in [vec![128u32, 128], vec![20, 7]] {
        for place in [Place::Apart, Place::InPlace] {
            check(Collective::AllGather, 2, count, shape, &blocks, place, true);
        }
    }
}
