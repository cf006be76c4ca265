//! Collectives carried as sends and receives (`send_recv.rs`) above the packet sizes, where send and receive's
//! lanes reach the link's speed (many blocks, each streaming its part through slots in the receiver's
//! memory, the copy-out overlapping the next chunk) and the scratch algorithms ran their windows one after
//! the other:
//! - gather, scatter and all-to-all among any ranks: every byte goes from one rank to another once;
//! - broadcast between two ranks, and across GPUs among more from `CHAIN_FROM`, as a chain from the root
//!   (root, root + 1, ...): each rank but the last passes each chunk on as soon as it has landed
//!   (`Pairing::Forward`), so that every link carries the message once and the hops overlap;
//! - reduce across GPUs, between two above its packets and among more from `reduce_chain_from`, as a chain
//!   ending at the root: the first rank sends its input, each middle rank receives the sum so far, adds its
//!   own input and sends the result on straight into the next rank's slots (`Pairing::Relay`), and the root's
//!   receive adds its own input as the chunks arrive;
//! - between two GPUs, from `LARGE` bytes, all-gather (each rank sends its piece to the other),
//!   reduce-scatter (each sends the other's half and reduces its own) and all-reduce as a reduce-scatter
//!   then an all-gather of the reduced parts, two launches;
//! - among more ranks across GPUs, those three as rings: all-reduce and reduce-scatter from `RINGS_FROM`,
//!   all-gather from `RING_ALL_GATHER_FROM` (at every size where `MSCCLPP_COLL_ALGO=sendrecv` asks): the
//!   all-gather's ranks send their piece to the next and pass each piece they receive on as it lands, the
//!   reduce-scatter relays each part's sum so far (one channel from the rank before to the next), an
//!   all-reduce is both.
//!
//! PreMulSum stays on the scratch algorithms.

use super::algorithm::{Choice, Placement, Protocol, choose};
use super::send_recv::{Cut, Moved, Pairing, Reducing, SelfCopy, SendRecvKind, SendRecvOp, Work};
use super::{Call, Collective, DataType, RedOp};
use crate::error::Result;
use crate::gpu::DevicePtr;

/// The smallest message from which two GPUs' all-reduce, all-gather and reduce-scatter go as sends and
/// receives: below it their scratch algorithms lead NVIDIA's (2 x H200, 2026-11-27: all-reduce 0.82 of its
/// time at 16 MiB, all-gather 0.68), above it they fell behind (all-reduce 1.16 at 1 GiB).
pub const LARGE: u64 = 64 << 20;

/// The smallest broadcast among more than two ranks on several GPUs, and reduce among more than four
/// (`reduce_chain_from`), that goes as a chain. On four H200s (docs/PERFORMANCE.md, 2026-11-28) the chains lead
/// NVIDIA's from 4 to 16 MiB (0.90-0.96 of its time) and reach 352 (broadcast) and 337 GB/s (reduce) at 1 GiB
/// against its 361 and 364; at 1 MiB they take 1.17-1.25 times its time, still less than the scratch algorithms did
/// there (1.48-1.62); below, the scratch algorithms keep the calls (not measured against the chains).
pub const CHAIN_FROM: u64 = 1 << 20;

/// The smallest all-reduce or reduce-scatter among more than two ranks on several GPUs that goes as a ring. On four
/// H200s (docs/PERFORMANCE.md "Four GPUs: rings, 64 lanes and the table's choices across GPUs", 2026-11-28) the
/// rings took 0.82-0.88 of the scratch algorithms' time from 64 MiB (all-reduce 4523 against 5540 us at 1 GiB,
/// NVIDIA's 4542) and 1.02-1.09 at 32 MiB; at 16 MiB 1.35.
pub const RINGS_FROM: u64 = 64 << 20;

/// The smallest all-gather among more than two ranks on several GPUs that goes as a ring: the same four H200s,
/// 0.89 of the scratch algorithm's time at 32 MiB, 0.72-0.78 from 64 MiB, 1.06 at 16 MiB.
pub const RING_ALL_GATHER_FROM: u64 = 32 << 20;

/// The smallest reduce among `nranks` (more than two) on several GPUs that goes as a chain: from 256 KiB among
/// up to four, where the packets' one shot was slower (4 x H200, 2026-11-28: the chain took 0.74 of its time
/// at 256 KiB in graphs, 0.55 at 512 KiB; 0.87 and 0.62 eager; at 128 KiB 0.94 in graphs but 1.20 eager);
/// among more from `CHAIN_FROM` (each rank is one more hop of a chunk's latency; not measured).
pub fn reduce_chain_from(nranks: usize) -> u64 {
    if nranks <= 4 { 256 << 10 } else { CHAIN_FROM }
}

/// Whether a call goes as sends and receives: where the table would pick copies (and for two GPUs' all-reduce,
/// all-gather and reduce-scatter from `LARGE`), and the algorithm is not forced; with `Choice::SendRecv`
/// every call these launches can carry, at every size and placement. The same on every rank.
pub fn applies(
    collective: Collective,
    op: Option<RedOp>,
    nranks: usize,
    placement: Placement,
    message: u64,
    choice: Choice,
) -> bool {
    let any = choice == Choice::SendRecv;
    let several = placement == Placement::SeveralGpus;
    let reducible = !matches!(op, Some(RedOp::PreMulSum(_)));
    let carried = match collective {
        Collective::Gather | Collective::Scatter | Collective::AllToAll => true,
        Collective::Broadcast => any || nranks == 2 || (several && message >= CHAIN_FROM),
        Collective::Reduce => reducible && (any || (several && (nranks == 2 || message >= reduce_chain_from(nranks)))),
        // Among more ranks, rings.
        Collective::AllGather => any || (several && message >= if nranks == 2 { LARGE } else { RING_ALL_GATHER_FROM }),
        Collective::AllReduce | Collective::ReduceScatter => {
            reducible && (any || (several && message >= if nranks == 2 { LARGE } else { RINGS_FROM }))
        }
    };
    carried
        && match choice {
            Choice::Force(_) => false,
            Choice::SendRecv => true,
            // A chain's reduce takes over from the packets below their limit too.
            _ if collective == Collective::Reduce && nranks > 2 => true,
            _ => choose(collective, nranks, message, choice) == Protocol::Copy,
        }
}

/// One launch of the send/receive kernel: its work and, where its receives reduce, the operator and type.
pub struct Launch {
    pub work: Work,
    pub reducing: Reducing,
}

/// The most lanes a call of an all-to-all or an all-gather is cut into. Every rank of those sends, receives
/// and copies to itself at once, three channels of a block per lane; between two H200s (2026-11-28,
/// docs/PERFORMANCE.md "Two GPUs at every size") they were faster at 32 lanes than at 64 at every size:
/// all-to-all in a graph 15.6 against 19.7 us at 4 MiB, 21 against 26 at 8 MiB, 1493 against 1532 eager at
/// 1 GiB; all-gather 1492 against 1544 at 1 GiB. Fewer blocks for the copy to itself did not help.
pub const SELF_COPYING_LANES: u32 = 32;

/// The fewest bytes of an all-to-all's lane: among four H200s (2026-11-28, docs/PERFORMANCE.md "Chains' chunks
/// and all-to-all's lanes among four GPUs") a 4 MiB all-to-all (1 MiB to each rank) took 20.9 us in a graph at
/// 16 lanes and 24.1 at 32 (NVIDIA's 21.6); from 64 MiB, 16 lanes were slower. At 64 KiB a lane, a call cuts
/// 1 MiB into 16 lanes and 2 MiB or more into 32, as between two H200s, where 32 led from 2 MiB.
pub const ALL_TO_ALL_LEAST_LANE_BYTES: u64 = 64 << 10;

/// The fewest chunks of a lane of a reduce's and of a broadcast's chain among more than two ranks
/// (`Cut::least_chunks`). Among four H200s (2026-11-28, docs/PERFORMANCE.md "Chains' chunks and all-to-all's
/// lanes among four GPUs"), against the 256 KiB chunks of plain sends there: a reduce of 64 MiB took 209 us
/// in 128 KiB chunks (1 MiB lanes, 8 chunks each) against 234, of 256 MiB 811 against 827 (32 chunks), but
/// of 1 GiB 3186 against 3134 (so not 128 KiB at 512 KiB a lane and up: 32 chunks). A broadcast gained 2 % at
/// 64 MiB in 128 KiB chunks and lost 4 % at 256 MiB (so 16 chunks).
pub const REDUCE_CHAIN_CHUNKS: u32 = 32;
pub const BROADCAST_CHAIN_CHUNKS: u32 = 16;

/// The launches that carry `call` on `rank` (in order, on the call's stream): `piece` bytes per rank (the
/// whole buffer of an all-reduce, a broadcast or a reduce), `send` and `recv` this rank's buffers (0 where
/// it has none). For a call `applies` accepted.
pub fn launches(
    call: &Call,
    rank: usize,
    nranks: usize,
    send: DevicePtr,
    recv: DevicePtr,
    piece: u64,
) -> Result<Vec<Launch>> {
    let moving = |ops: Vec<SendRecvOp>| -> Result<Vec<Launch>> {
        Ok(vec![Launch {
            work: Work::sort(&ops, rank, nranks)?,
            reducing: None,
        }])
    };
    let reducing = call.op.map(|op| (op, call.datatype));
    // The other rank, for the calls carried only between two.
    let peer = (rank + 1) % nranks;
    // Rank r's piece of the rings' all-gather and reduce-scatter: (offset, bytes).
    let pieces = || -> Vec<(u64, u64)> { (0..nranks as u64).map(|r| (r * piece, piece)).collect() };
    let mut launches = match call.collective {
        Collective::AllGather => Ok(vec![all_gather_ring(call, rank, nranks, send, recv, &pieces())]),
        // Among more than two, rings: a reduce-scatter, then an all-gather of the reduced parts.
        Collective::ReduceScatter if nranks > 2 => Ok(vec![reduce_scatter_ring(
            call,
            rank,
            nranks,
            send,
            &pieces(),
            recv,
            reducing,
        )]),
        Collective::AllReduce if nranks > 2 => {
            let parts = split_on_units(piece, call.datatype.size() as u64, nranks);
            let own = recv + parts[rank].0;
            Ok(vec![
                reduce_scatter_ring(call, rank, nranks, send, &parts, own, reducing),
                all_gather_ring(call, rank, nranks, own, recv, &parts),
            ])
        }
        // In place, piece p of the buffer leaves for rank p while rank p's piece arrives into it: each
        // arriving chunk waits until its place has been sent (`Pairing::Guarded`).
        Collective::AllToAll if send == recv => {
            let mut l = moving(ops(call, rank, nranks, send, recv, piece))?;
            for m in &mut l[0].work.remote {
                m.pairing = Pairing::Guarded;
            }
            Ok(l)
        }
        // The middle of the chain passes on what it receives from the rank before it.
        Collective::Broadcast => {
            let mut l = moving(ops(call, rank, nranks, send, recv, piece))?;
            let remote = &mut l[0].work.remote;
            if let [
                received @ Moved {
                    kind: SendRecvKind::Recv,
                    ..
                },
                sent @ Moved {
                    kind: SendRecvKind::Send,
                    ..
                },
            ] = remote.as_mut_slice()
            {
                received.pairing = Pairing::Forwarded;
                sent.pairing = Pairing::Forward { from: received.peer };
            }
            Ok(l)
        }
        // A chain ending at the root (root + 1, root + 2, ..., root): the first rank sends its input on, each
        // middle rank relays the sum so far with its own input added, and the root's receive adds its own
        // and finishes (an average divides by every rank).
        Collective::Reduce => {
            let (prev, next) = ((rank + nranks - 1) % nranks, (rank + 1) % nranks);
            Ok(vec![if rank == call.root {
                launch(&[moved(call, SendRecvKind::Recv, prev, recv, piece, send)], reducing)
            } else if prev == call.root {
                launch(&[moved(call, SendRecvKind::Send, next, send, piece, 0)], None)
            } else {
                let mut relay = moved(call, SendRecvKind::Recv, prev, 0, piece, send);
                relay.pairing = Pairing::relay(next);
                launch(&[relay], reducing)
            }])
        }
        Collective::ReduceScatter => Ok(vec![launch(
            &[
                moved(call, SendRecvKind::Send, peer, send + peer as u64 * piece, piece, 0),
                moved(call, SendRecvKind::Recv, peer, recv, piece, send + rank as u64 * piece),
            ],
            reducing,
        )]),
        Collective::AllReduce => {
            // Halves at an element: rank r reduces half r, then each sends the other its half.
            let size = call.datatype.size() as u64;
            let first = (piece / size).div_ceil(2) * size;
            let half = |r: usize| if r == 0 { (0, first) } else { (first, piece - first) };
            let ((mine, mine_bytes), (theirs, theirs_bytes)) = (half(rank), half(peer));
            Ok(vec![
                launch(
                    &[
                        moved(call, SendRecvKind::Send, peer, send + theirs, theirs_bytes, 0),
                        moved(call, SendRecvKind::Recv, peer, recv + mine, mine_bytes, send + mine),
                    ],
                    reducing,
                ),
                launch(
                    &[
                        moved(call, SendRecvKind::Send, peer, recv + mine, mine_bytes, 0),
                        moved(call, SendRecvKind::Recv, peer, recv + theirs, theirs_bytes, 0),
                    ],
                    None,
                ),
            ])
        }
        Collective::Gather | Collective::Scatter | Collective::AllToAll => {
            moving(ops(call, rank, nranks, send, recv, piece))
        }
    }?;
    let cut = match call.collective {
        Collective::AllToAll => Cut {
            most_lanes: Some(SELF_COPYING_LANES),
            least_lane_bytes: Some(ALL_TO_ALL_LEAST_LANE_BYTES),
            ..Cut::default()
        },
        Collective::AllGather => Cut {
            most_lanes: Some(SELF_COPYING_LANES),
            ..Cut::default()
        },
        // Between two there is no hop to shorten.
        Collective::Reduce if nranks > 2 => Cut {
            least_chunks: Some(REDUCE_CHAIN_CHUNKS),
            ..Cut::default()
        },
        Collective::Broadcast if nranks > 2 => Cut {
            least_chunks: Some(BROADCAST_CHAIN_CHUNKS),
            ..Cut::default()
        },
        _ => Cut::default(),
    };
    for l in &mut launches {
        l.work.cut = cut;
    }
    Ok(launches)
}

/// `bytes` cut into `n` parts at 16-byte boundaries (a multiple of every type's size), the first ones 16
/// bytes larger where the units do not divide, the last one taking what is left of a unit (whole
/// elements): (offset, bytes) of each. Every part then starts on a 16-byte unit of the buffer, so that the
/// rings' ops keep `SENDRECV_ALIGNED` where the buffers are aligned (an element's cut, 8 bytes off among
/// 3 ranks at 64 MiB of floats, sent every chunk unit by unit, byte by byte into the next rank's slot).
fn split_on_units(bytes: u64, size: u64, n: usize) -> Vec<(u64, u64)> {
    debug_assert!(16u64.is_multiple_of(size) && bytes.is_multiple_of(size));
    let (units, n64) = (bytes / 16, n as u64);
    let mut offset = 0;
    (0..n64)
        .map(|i| {
            let mut part = (units / n64 + u64::from(i < units % n64)) * 16;
            if i == n64 - 1 {
                part += bytes % 16;
            }
            let at = offset;
            offset += part;
            (at, part)
        })
        .collect()
}

/// A ring's all-gather of `parts` (offset and bytes of each rank's part of `recv`, in rank order): this
/// rank sends its part (read from `own`, copied to its place where that differs) to the next rank, and
/// passes each part it receives from the rank before on as it lands, but the last (whose ring ends here).
/// Step s brings the part of rank - s, so every rank sends the next the parts in the order it receives them.
fn all_gather_ring(
    call: &Call,
    rank: usize,
    nranks: usize,
    own: DevicePtr,
    recv: DevicePtr,
    parts: &[(u64, u64)],
) -> Launch {
    let (prev, next) = ((rank + nranks - 1) % nranks, (rank + 1) % nranks);
    let at = |r: usize| recv + parts[r].0;
    let mut remote = vec![moved(call, SendRecvKind::Send, next, own, parts[rank].1, 0)];
    for step in 1..nranks {
        let from = (rank + nranks - step) % nranks;
        let mut received = moved(call, SendRecvKind::Recv, prev, at(from), parts[from].1, 0);
        if step < nranks - 1 {
            received.pairing = Pairing::Forwarded;
            let mut sent = moved(call, SendRecvKind::Send, next, at(from), parts[from].1, 0);
            sent.pairing = Pairing::Forward { from: prev };
            remote.extend([received, sent]);
        } else {
            remote.push(received);
        }
    }
    let mut l = launch(&remote, None);
    if own != at(rank) && parts[rank].1 > 0 {
        l.work.copies.push(SelfCopy {
            dst: at(rank),
            src: own,
            bytes: parts[rank].1,
        });
    }
    l
}

/// A ring's reduce-scatter of `send` cut into `parts` (offset and bytes of each rank's part, in rank order)
/// into `out`, this rank's part of the result: one relay channel from the rank before to the next. Step 0
/// sends this rank's input of the part of rank - 1; step s receives the sum so far of the part of
/// rank - 1 - s, adds this rank's input and sends it on; the last step receives this rank's own part, adds
/// its input and finishes it into `out` (an average divides by every rank).
///
/// The kernel's relay goes chunk-major (`sendRecvRelay`, send_recv.cuh): a ring that went step by step would
/// fill the next rank's slots in step 0, which only sends, and wait round the ring for credits.
fn reduce_scatter_ring(
    call: &Call,
    rank: usize,
    nranks: usize,
    send: DevicePtr,
    parts: &[(u64, u64)],
    out: DevicePtr,
    reducing: Reducing,
) -> Launch {
    let (prev, next) = ((rank + nranks - 1) % nranks, (rank + 1) % nranks);
    let remote: Vec<Moved> = (0..nranks)
        .map(|step| {
            let part = (rank + 2 * nranks - 1 - step) % nranks;
            let (receives, sends) = (step > 0, step < nranks - 1);
            let buffer = if sends { 0 } else { out };
            let mut m = moved(
                call,
                SendRecvKind::Recv,
                prev,
                buffer,
                parts[part].1,
                send + parts[part].0,
            );
            m.pairing = Pairing::Relay {
                to: next,
                receives,
                sends,
            };
            m
        })
        .collect();
    launch(&remote, reducing)
}

fn moved(call: &Call, kind: SendRecvKind, peer: usize, buffer: DevicePtr, bytes: u64, reduce_with: DevicePtr) -> Moved {
    Moved {
        kind,
        function: call.function,
        peer,
        buffer,
        bytes,
        reduce_with,
        pairing: Pairing::Alone,
    }
}

/// A launch of `remote` (none of them empty: an all-reduce of one element leaves a half empty).
fn launch(remote: &[Moved], reducing: Reducing) -> Launch {
    let remote: Vec<Moved> = remote.iter().filter(|m| m.bytes > 0).copied().collect();
    // Where no receive is left to reduce, the moving kernel serves.
    let reducing = reducing.filter(|_| remote.iter().any(|m| m.reduce_with != 0));
    Launch {
        work: Work {
            buffers: remote.clone(),
            copies: Vec::new(),
            remote,
            cut: Cut::default(),
        },
        reducing,
    }
}

/// The most channels (peer and direction pairs, and one of copies to itself; a block each at least) any
/// rank's launch of the call has: the same on every rank, so that every rank decides alike whether the call
/// fits one launch.
pub fn most_channels(collective: Collective, nranks: usize) -> usize {
    match collective {
        Collective::AllToAll => 2 * (nranks - 1) + 1,
        // A ring: a send on, a receive, and the copy to itself.
        Collective::AllGather => 3,
        // Two ranks: a send and a receive. More: a ring's relay channel, then its all-gather's send, receive
        // and (an all-reduce's part being in place) no copy.
        Collective::AllReduce | Collective::ReduceScatter if nranks == 2 => 2,
        Collective::AllReduce | Collective::ReduceScatter => 3,
        Collective::Gather | Collective::Scatter => nranks,
        // A send, a receive or a relay: one channel on every rank of the chain.
        Collective::Reduce => 1,
        // A send on and a receive (a chain's middle), or a send on and the copy to itself (its root).
        Collective::Broadcast => 2,
    }
}

/// This rank's sends and receives for the call: `piece` bytes per rank (the whole buffer of a broadcast),
/// `send` and `recv` its buffers (0 where it has none). A rank's own piece is a send to itself with its
/// receive, which `send_recv::Work::sort` turns into a copy (none where the call is in place).
/// Each op names the call's function (`Call::function`) in its messages.
pub fn ops(call: &Call, rank: usize, nranks: usize, send: DevicePtr, recv: DevicePtr, piece: u64) -> Vec<SendRecvOp> {
    let root = call.root;
    let op = |kind, peer, buffer| SendRecvOp {
        kind,
        function: call.function,
        peer,
        buffer,
        count: piece as usize,
        datatype: DataType::Uint8,
    };
    let at = |base: DevicePtr, peer: usize| base + peer as u64 * piece;
    let mut ops = Vec::new();
    match call.collective {
        Collective::Gather if rank == root => {
            ops.push(op(SendRecvKind::Send, rank, send));
            ops.extend((0..nranks).map(|peer| op(SendRecvKind::Recv, peer, at(recv, peer))));
        }
        Collective::Gather => ops.push(op(SendRecvKind::Send, root, send)),
        Collective::Scatter if rank == root => {
            ops.extend((0..nranks).map(|peer| op(SendRecvKind::Send, peer, at(send, peer))));
            ops.push(op(SendRecvKind::Recv, rank, recv));
        }
        Collective::Scatter => ops.push(op(SendRecvKind::Recv, root, recv)),
        Collective::AllToAll => {
            for peer in 0..nranks {
                ops.push(op(SendRecvKind::Send, peer, at(send, peer)));
                ops.push(op(SendRecvKind::Recv, peer, at(recv, peer)));
            }
        }
        // A chain from the root: each rank receives from the one before and, but the last, sends on from
        // its own buffer (the root also copies its input to its output where they differ).
        Collective::Broadcast => {
            let (prev, next) = ((rank + nranks - 1) % nranks, (rank + 1) % nranks);
            if rank == root {
                if next != rank {
                    ops.push(op(SendRecvKind::Send, next, send));
                }
                ops.push(op(SendRecvKind::Send, rank, send));
                ops.push(op(SendRecvKind::Recv, rank, recv));
            } else {
                ops.push(op(SendRecvKind::Recv, prev, recv));
                if next != root {
                    ops.push(op(SendRecvKind::Send, next, recv));
                }
            }
        }
        Collective::AllGather | Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce => {}
    }
    ops
}

#[cfg(test)]
#[path = "send_recv_model.rs"]
mod model;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::kernel_args::SendRecvArgs;
    use crate::collective::send_recv::{CHAIN_LEAST_CHUNK_BYTES, Shape, Work, plan};
    use SendRecvKind::{Recv, Send};

    /// (kind, peer, buffer) of each op.
    fn list(ops: &[SendRecvOp]) -> Vec<(SendRecvKind, usize, DevicePtr)> {
        ops.iter().map(|o| (o.kind, o.peer, o.buffer)).collect()
    }

    #[test]
    fn which_calls_go_as_sends_and_receives() {
        let (big, sum) = (64 << 20, Some(RedOp::Sum));
        let several = Placement::SeveralGpus;
        let applies_auto = |c, n, message, placement| applies(c, sum, n, placement, message, Choice::Auto);
        for c in [Collective::Gather, Collective::Scatter, Collective::AllToAll] {
            assert!(applies_auto(c, 4, big, several), "{c:?}");
            assert!(applies_auto(c, 4, big, Placement::OneGpu), "{c:?}");
            assert!(!applies_auto(c, 4, 1024, several), "{c:?}: packets below the limit");
            assert!(
                !applies(c, None, 4, several, big, Choice::Force(Protocol::Copy)),
                "{c:?}: forced"
            );
        }
        for n in [2, 3, 8] {
            assert!(
                applies_auto(Collective::Broadcast, n, big, several),
                "broadcast among {n}: a chain"
            );
        }
        assert!(applies_auto(Collective::Broadcast, 4, CHAIN_FROM, several));
        assert!(
            !applies_auto(Collective::Broadcast, 4, CHAIN_FROM - 1, several),
            "the scratch algorithm below"
        );
        assert!(
            !applies_auto(Collective::Broadcast, 4, big, Placement::OneGpu),
            "zero-copy on one GPU"
        );
        assert!(applies_auto(Collective::Broadcast, 2, big, Placement::OneGpu));
        // Across GPUs all-gather and the reductions, among any ranks (chains and rings); not on one GPU, not
        // PreMulSum.
        for c in [
            Collective::AllGather,
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::Reduce,
        ] {
            assert!(applies_auto(c, 2, LARGE, several), "{c:?}");
            for n in [3, 4, 8] {
                assert!(
                    applies_auto(c, n, RINGS_FROM, several),
                    "{c:?} among {n}: a chain or a ring"
                );
                assert!(!applies_auto(c, n, RINGS_FROM, Placement::OneGpu), "{c:?} among {n}");
            }
            assert!(!applies_auto(c, 2, LARGE, Placement::OneGpu), "{c:?}");
            assert!(
                !applies(c, None, 2, several, LARGE, Choice::Force(Protocol::Copy)),
                "{c:?}"
            );
        }
        let premul = Some(RedOp::PreMulSum(crate::collective::Scalar::Device(0x10)));
        assert!(!applies(Collective::AllReduce, premul, 2, several, LARGE, Choice::Auto));
        // Below LARGE the scratch algorithms keep all-reduce, all-gather and reduce-scatter; reduce goes
        // from above its packets.
        assert!(!applies_auto(Collective::AllReduce, 2, LARGE - 16, several));
        assert!(!applies_auto(Collective::AllGather, 2, 16 << 20, several));
        // Among more, the rings from their own sizes.
        assert!(!applies_auto(Collective::AllReduce, 4, RINGS_FROM - 16, several));
        assert!(!applies_auto(Collective::ReduceScatter, 4, RINGS_FROM - 16, several));
        assert!(applies_auto(Collective::AllGather, 4, RING_ALL_GATHER_FROM, several));
        assert!(!applies_auto(
            Collective::AllGather,
            4,
            RING_ALL_GATHER_FROM - 16,
            several
        ));
        assert!(!applies_auto(Collective::AllGather, 2, RING_ALL_GATHER_FROM, several));
        assert!(applies_auto(Collective::Reduce, 2, 1 << 20, several));
        assert!(!applies_auto(Collective::Reduce, 2, 4096, several));
        assert!(applies_auto(Collective::Reduce, 4, CHAIN_FROM, several));
        assert!(
            applies_auto(Collective::Reduce, 4, 256 << 10, several),
            "below the packets' limit"
        );
        assert!(!applies_auto(Collective::Reduce, 4, (256 << 10) - 16, several));
        assert!(applies_auto(Collective::Reduce, 3, 256 << 10, several));
        assert!(!applies_auto(Collective::Reduce, 8, 256 << 10, several));
        assert!(applies_auto(Collective::Reduce, 8, CHAIN_FROM, several));
        assert!(!applies_auto(Collective::Reduce, 4, LARGE, Placement::OneGpu));
        assert!(!applies(Collective::Reduce, premul, 4, several, LARGE, Choice::Auto));
    }

    #[test]
    fn sendrecv_choice_takes_every_call_the_launches_carry() {
        let (sum, one) = (Some(RedOp::Sum), Placement::OneGpu);
        let premul = Some(RedOp::PreMulSum(crate::collective::Scalar::Device(0x10)));
        let forced = |c, op, n, placement, message| applies(c, op, n, placement, message, Choice::SendRecv);
        for c in [
            Collective::Gather,
            Collective::Scatter,
            Collective::AllToAll,
            Collective::Broadcast,
            Collective::Reduce,
        ] {
            for n in [2, 3, 8] {
                for message in [1, 4096, LARGE] {
                    assert!(
                        forced(c, sum, n, one, message),
                        "{c:?} among {n}, {message} B on one GPU"
                    );
                }
            }
        }
        for c in [Collective::AllGather, Collective::AllReduce, Collective::ReduceScatter] {
            for n in [2, 3, 8] {
                assert!(forced(c, sum, n, one, 8), "{c:?} among {n}");
            }
        }
        for c in [Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce] {
            assert!(
                !forced(c, premul, 2, one, LARGE),
                "{c:?}: PreMulSum stays on the scratch"
            );
        }
        // Never zero-copy nor the copy engine, and the scratch's protocol as `Auto` picks it.
        assert!(!crate::collective::zero_copy::attempt(
            Collective::AllReduce,
            sum,
            4,
            one,
            1 << 30,
            Choice::SendRecv
        ));
        assert!(!crate::collective::copy_engine::attempt(
            Collective::AllGather,
            2,
            one,
            1 << 30,
            Choice::SendRecv,
            false
        ));
        assert_eq!(
            choose(Collective::AllReduce, 4, 1024, Choice::SendRecv),
            Protocol::Packet
        );
        assert_eq!(Choice::parse("SendRecv"), Choice::SendRecv);
    }

    fn call(collective: Collective, count: usize, datatype: DataType, root: usize) -> Call {
        Call {
            collective,
            function: "test",
            send: 0,
            recv: 0,
            count,
            datatype,
            op: Some(RedOp::Avg),
            root,
        }
    }

    /// (kind, peer, buffer, bytes, reduce_with) of each op of a launch.
    fn remote(l: &Launch) -> Vec<(SendRecvKind, usize, DevicePtr, u64, DevicePtr)> {
        l.work
            .remote
            .iter()
            .map(|m| (m.kind, m.peer, m.buffer, m.bytes, m.reduce_with))
            .collect()
    }

    /// Each launch's kernel argument and its number of ops, of every rank's launches of `c` among `nranks` at
    /// `shape` (`plan`), `piece` bytes per rank from `root` (apart: the send buffer below the receive buffer).
    fn planned(c: Collective, nranks: usize, piece: u64, root: usize, shape: Shape) -> Vec<(SendRecvArgs, usize)> {
        use crate::collective::kernel_args::MAX_RANKS;
        let (send, recv) = (0x1000_0000u64, 0x10_0000_0000u64);
        let count = (piece / 4) as usize;
        (0..nranks)
            .flat_map(|rank| {
                let l = launches(
                    &call(c, count, DataType::Float32, root),
                    rank,
                    nranks,
                    send,
                    recv,
                    piece,
                )
                .unwrap();
                l.into_iter().map(move |l| {
                    let copies = l.work.moving_copies();
                    let (args, _) = plan(&l.work, &copies, &shape, 264, &[0; MAX_RANKS], 0, rank, nranks).unwrap();
                    (args, l.work.remote.len() + copies.len())
                })
            })
            .collect()
    }

    #[test]
    fn all_to_all_and_all_gather_cut_their_calls_into_fewer_lanes() {
        let shape = Shape::new(2, 64, 2, 512);
        // (the most lanes of any op, the layout's lanes) of each rank's launches of `c` between two ranks.
        let lanes_of = |c: Collective| -> Vec<(u32, u32)> {
            planned(c, 2, 512 << 20, 0, shape)
                .iter()
                .map(|(args, n)| (args.ops[..*n].iter().map(|o| o.lanes).max().unwrap(), args.lanes))
                .collect()
        };
        for c in [Collective::AllToAll, Collective::AllGather] {
            let l = lanes_of(c);
            assert!(
                !l.is_empty() && l.iter().all(|&x| x == (SELF_COPYING_LANES, 64)),
                "{c:?}: {l:?}"
            );
        }
        // The others keep the shape's lanes, and the slots keep its layout everywhere.
        for c in [
            Collective::Broadcast,
            Collective::Gather,
            Collective::Scatter,
            Collective::AllReduce,
        ] {
            let l = lanes_of(c);
            assert!(!l.is_empty() && l.iter().all(|&x| x == (64, 64)), "{c:?}: {l:?}");
        }
        // A plain group of sends and receives is never capped.
        assert_eq!(Work::sort(&[], 0, 2).unwrap().cut, Cut::default());
    }

    /// (lanes, chunk bytes) of every op of every rank's launches of `c` among `nranks` at `shape`, `piece`
    /// bytes per rank.
    fn cuts_of(c: Collective, nranks: usize, piece: u64, shape: Shape) -> Vec<(u32, u64)> {
        planned(c, nranks, piece, 1, shape)
            .iter()
            .flat_map(|(args, n)| args.ops[..*n].iter().map(|o| (o.lanes, o.chunk_bytes)))
            .collect()
    }

    #[test]
    fn chains_among_more_than_two_cut_finer_chunks() {
        // Among four at the default shape (64 lanes, slots of 256 KiB): a 64 MiB chain's lanes of 1 MiB go in
        // chunks of 128 KiB (CHAIN_LEAST_CHUNK_BYTES), not the slot's 256 KiB.
        let four = Shape::new(4, 64, 2, 512);
        assert_eq!(four.slot_bytes, 256 << 10);
        let chunks = |c, nranks, piece, shape| -> Vec<u64> {
            let mut v: Vec<u64> = cuts_of(c, nranks, piece, shape).iter().map(|&(_, b)| b).collect();
            v.dedup();
            v
        };
        for c in [Collective::Reduce, Collective::Broadcast] {
            assert_eq!(chunks(c, 4, 64 << 20, four), [CHAIN_LEAST_CHUNK_BYTES], "{c:?}");
            // At 1 GiB (16 MiB lanes) the slot bounds them, as plain sends'.
            assert_eq!(chunks(c, 4, 1 << 30, four), [four.slot_bytes], "{c:?}");
            // Lanes of 64 KiB (4 MiB): plain sends' chunks (a chain never cuts coarser).
            assert_eq!(chunks(c, 4, 4 << 20, four), [32 << 10], "{c:?}");
            // Between two there is no hop to shorten: plain sends' chunks, half a lane of 1 MiB.
            assert_eq!(chunks(c, 2, 64 << 20, Shape::new(2, 64, 2, 512)), [512 << 10], "{c:?}");
        }
        // At 256 MiB (lanes of 4 MiB) a reduce's chain cuts 32 chunks a lane, a broadcast's 16.
        assert_eq!(chunks(Collective::Reduce, 4, 256 << 20, four), [128 << 10]);
        assert_eq!(chunks(Collective::Broadcast, 4, 256 << 20, four), [256 << 10]);
        // The other collectives keep plain sends' chunks.
        assert_eq!(chunks(Collective::Scatter, 4, 64 << 20, four), [four.slot_bytes]);
    }

    #[test]
    fn all_to_all_lanes_carry_at_least_64_kib() {
        let lanes = |nranks: usize, piece: u64| -> Vec<u32> {
            let shape = Shape::new(nranks, 64, 2, 512);
            let mut v: Vec<u32> = cuts_of(Collective::AllToAll, nranks, piece, shape)
                .iter()
                .map(|&(l, _)| l)
                .collect();
            v.sort();
            v.dedup();
            v
        };
        // 1 MiB to each rank among four: 16 lanes; 2 MiB and more: 32 (SELF_COPYING_LANES).
        assert_eq!(lanes(4, 1 << 20), [16]);
        assert_eq!(lanes(4, 2 << 20), [SELF_COPYING_LANES]);
        assert_eq!(lanes(2, 4 << 20), [SELF_COPYING_LANES]);
        assert_eq!(lanes(4, 256 << 10), [4]);
        assert_eq!(ALL_TO_ALL_LEAST_LANE_BYTES, 64 << 10);
    }

    #[test]
    fn two_ranks_reduce_as_the_chunks_arrive() {
        let (send, recv) = (0x1000_0000u64, 0x2000_0000u64);
        let f32s = DataType::Float32;
        // All-reduce of 5 floats: rank 0 reduces the first 3, rank 1 the last 2, then they swap halves.
        let c = call(Collective::AllReduce, 5, f32s, 0);
        let l = launches(&c, 0, 2, send, recv, 20).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(remote(&l[0]), [(Send, 1, send + 12, 8, 0), (Recv, 1, recv, 12, send)]);
        assert_eq!(l[0].reducing, Some((RedOp::Avg, f32s)));
        assert_eq!(remote(&l[1]), [(Send, 1, recv, 12, 0), (Recv, 1, recv + 12, 8, 0)]);
        assert_eq!(l[1].reducing, None, "the all-gather half only moves");
        let l = launches(&c, 1, 2, send, recv, 20).unwrap();
        assert_eq!(
            remote(&l[0]),
            [(Send, 0, send, 12, 0), (Recv, 0, recv + 12, 8, send + 12)]
        );
        assert_eq!(remote(&l[1]), [(Send, 0, recv + 12, 8, 0), (Recv, 0, recv, 12, 0)]);
        // One element: rank 1's half is empty, and its first launch reduces nothing.
        let one = call(Collective::AllReduce, 1, f32s, 0);
        let l = launches(&one, 1, 2, send, recv, 4).unwrap();
        assert_eq!(remote(&l[0]), [(Send, 0, send, 4, 0)]);
        assert_eq!(l[0].reducing, None);
        // Reduce to rank 1: the root's receive reduces with its input; the other only sends.
        let r = call(Collective::Reduce, 8, f32s, 1);
        let root = launches(&r, 1, 2, send, recv, 32).unwrap();
        assert_eq!(remote(&root[0]), [(Recv, 0, recv, 32, send)]);
        assert_eq!(root[0].reducing, Some((RedOp::Avg, f32s)));
        let other = launches(&r, 0, 2, send, 0, 32).unwrap();
        assert_eq!(remote(&other[0]), [(Send, 1, send, 32, 0)]);
        assert_eq!(other[0].reducing, None);
        // Reduce-scatter: each sends the other's piece and reduces its own.
        let rs = call(Collective::ReduceScatter, 4, f32s, 0);
        let l = launches(&rs, 1, 2, send, recv, 16).unwrap();
        assert_eq!(remote(&l[0]), [(Send, 0, send, 16, 0), (Recv, 0, recv, 16, send + 16)]);
        // All-gather: its own piece to the other, the other's into its place, its own copied.
        let ag = call(Collective::AllGather, 4, f32s, 0);
        let l = launches(&ag, 1, 2, send, recv, 16).unwrap();
        assert_eq!(remote(&l[0]), [(Send, 0, send, 16, 0), (Recv, 0, recv, 16, 0)]);
        assert_eq!((l[0].work.copies[0].dst, l[0].work.copies[0].src), (recv + 16, send));
        // An all-to-all in place guards its pairs (a chunk arrives only where its place was sent); out of
        // place it does not.
        let a2a = call(Collective::AllToAll, 4, f32s, 0);
        let l = launches(&a2a, 0, 2, send, send, 16).unwrap();
        assert!(l[0].work.remote.len() == 2 && l[0].work.remote.iter().all(|m| m.pairing == Pairing::Guarded));
        let l = launches(&a2a, 0, 2, send, recv, 16).unwrap();
        assert!(l[0].work.remote.iter().all(|m| m.pairing == Pairing::Alone));
        // A broadcast's chain among 4 from rank 1: the middle ranks (2 and 3) pass on what they receive;
        // the root and the last rank move alone.
        let b = call(Collective::Broadcast, 4, f32s, 1);
        let pairings = |rank| {
            let l = launches(&b, rank, 4, send, recv, 16).unwrap();
            assert_eq!(l.len(), 1);
            l[0].work
                .remote
                .iter()
                .map(|m| (m.kind, m.peer, m.pairing))
                .collect::<Vec<_>>()
        };
        assert_eq!(pairings(1), [(Send, 2, Pairing::Alone)]);
        assert_eq!(
            pairings(2),
            [(Recv, 1, Pairing::Forwarded), (Send, 3, Pairing::Forward { from: 1 })]
        );
        assert_eq!(
            pairings(3),
            [(Recv, 2, Pairing::Forwarded), (Send, 0, Pairing::Forward { from: 2 })]
        );
        assert_eq!(pairings(0), [(Recv, 3, Pairing::Alone)]);
        // A reduce's chain among 4 to rank 1: 2 -> 3 -> 0 -> 1. Rank 2 sends its input and moves only; 3
        // and 0 relay (a receive without a buffer of its own, reducing with their input); the root reduces
        // into its output.
        let mut r = call(Collective::Reduce, 4, f32s, 1);
        r.op = Some(RedOp::Sum);
        let chain = |rank| {
            let l = launches(&r, rank, 4, send, recv, 16).unwrap();
            assert_eq!(l.len(), 1);
            let m = &l[0].work.remote;
            (
                m.iter()
                    .map(|m| (m.kind, m.peer, m.buffer, m.reduce_with, m.pairing))
                    .collect::<Vec<_>>(),
                l[0].reducing,
            )
        };
        let sum = Some((RedOp::Sum, f32s));
        assert_eq!(chain(2), (vec![(Send, 3, send, 0, Pairing::Alone)], None));
        assert_eq!(chain(3), (vec![(Recv, 2, 0, send, Pairing::relay(0))], sum));
        assert_eq!(chain(0), (vec![(Recv, 3, 0, send, Pairing::relay(1))], sum));
        assert_eq!(chain(1), (vec![(Recv, 0, recv, send, Pairing::Alone)], sum));
        for rank in 0..4 {
            assert!(chain(rank).0.len() <= most_channels(Collective::Reduce, 4));
        }
        // An all-gather's ring among 4, rank 1: its piece to 2, then pieces 0, 3, 2 from 0 into their
        // places, the first two passed on to 2 as they land; its own piece copied to its place.
        let ag = call(Collective::AllGather, 4, f32s, 0);
        let l = launches(&ag, 1, 4, send, recv, 16).unwrap();
        let m = &l[0].work.remote;
        assert_eq!(
            m.iter()
                .map(|m| (m.kind, m.peer, m.buffer, m.pairing))
                .collect::<Vec<_>>(),
            [
                (Send, 2, send, Pairing::Alone),
                (Recv, 0, recv, Pairing::Forwarded),
                (Send, 2, recv, Pairing::Forward { from: 0 }),
                (Recv, 0, recv + 48, Pairing::Forwarded),
                (Send, 2, recv + 48, Pairing::Forward { from: 0 }),
                (Recv, 0, recv + 32, Pairing::Alone),
            ]
        );
        assert_eq!((l[0].work.copies[0].dst, l[0].work.copies[0].src), (recv + 16, send));
        // Every rank sends to the next the pieces in the order the next receives them from it.
        for rank in 0..4 {
            let (next, l) = ((rank + 1) % 4, launches(&ag, rank, 4, send, recv, 16).unwrap());
            let theirs = launches(&ag, next, 4, send, recv, 16).unwrap();
            let sent: Vec<u64> = l[0]
                .work
                .remote
                .iter()
                .filter(|m| m.kind == Send)
                .map(|m| m.buffer)
                .collect();
            let received: Vec<u64> = theirs[0]
                .work
                .remote
                .iter()
                .filter(|m| m.kind == Recv)
                .map(|m| m.buffer)
                .collect();
            let offset = |b: u64| if b == send { rank as u64 * 16 } else { b - recv };
            assert_eq!(
                sent.iter().map(|&b| offset(b)).collect::<Vec<_>>(),
                received.iter().map(|&b| b - recv).collect::<Vec<_>>()
            );
            assert!(
                l[0].work
                    .remote
                    .iter()
                    .filter(|m| m.kind == Send)
                    .all(|m| m.peer == next)
            );
        }
    }

    #[test]
    fn rings_reduce_each_part_around_every_rank_once() {
        let (send, recv, f32s) = (0x1000_0000u64, 0x2000_0000u64, DataType::Float32);
        // Parts start on 16-byte units; the last takes the rest of a unit.
        assert_eq!(split_on_units(104, 4, 4), [(0, 32), (32, 32), (64, 16), (80, 24)]);
        assert_eq!(split_on_units(40, 4, 4), [(0, 16), (16, 16), (32, 0), (32, 8)]);
        assert_eq!(split_on_units(8, 4, 4), [(0, 0), (0, 0), (0, 0), (0, 8)]);
        assert_eq!(split_on_units(56, 8, 3), [(0, 16), (16, 16), (32, 24)]);
        let big = split_on_units(64 << 20, 4, 3);
        assert!(big.iter().all(|&(at, _)| at % 16 == 0), "{big:?}");
        assert_eq!(big.iter().map(|p| p.1).sum::<u64>(), 64 << 20);
        // A reduce-scatter among 4, rank 1 (16 bytes a part): one relay channel from 0 to 2; part 0 first
        // (its input, nothing received), then 3 and 2 relayed, its own part 1 last, finished into recv.
        let mut rs = call(Collective::ReduceScatter, 4, f32s, 0);
        rs.op = Some(RedOp::Sum);
        let steps = |rank: usize| {
            let l = launches(&rs, rank, 4, send, recv, 16).unwrap();
            assert_eq!((l.len(), l[0].reducing), (1, Some((RedOp::Sum, f32s))));
            l[0].work.remote.clone()
        };
        let relay = |receives, sends| Pairing::Relay { to: 2, receives, sends };
        assert_eq!(
            steps(1)
                .iter()
                .map(|m| (m.kind, m.peer, m.buffer, m.reduce_with, m.pairing))
                .collect::<Vec<_>>(),
            [
                (Recv, 0, 0, send, relay(false, true)),
                (Recv, 0, 0, send + 48, relay(true, true)),
                (Recv, 0, 0, send + 32, relay(true, true)),
                (Recv, 0, recv, send + 16, relay(true, false)),
            ]
        );
        // What each rank sends the next, step by step, is what the next receives, in the same order.
        let part = |m: &Moved| (m.reduce_with - send) / 16;
        for rank in 0..4 {
            let sent: Vec<u64> = steps(rank)
                .iter()
                .filter(|m| matches!(m.pairing, Pairing::Relay { sends: true, .. }))
                .map(part)
                .collect();
            let received: Vec<u64> = steps((rank + 1) % 4)
                .iter()
                .filter(|m| matches!(m.pairing, Pairing::Relay { receives: true, .. }))
                .map(part)
                .collect();
            assert_eq!(sent, received, "rank {rank}");
            assert_eq!(
                steps(rank).last().unwrap().reduce_with,
                send + rank as u64 * 16,
                "its own part last"
            );
        }
        // An all-reduce among 4 of 26 floats: the reduce-scatter of parts of 8, 8, 4 and 6 elements (16-byte
        // units, the rest last), then the all-gather of each rank's reduced part, in place in recv.
        let mut ar = call(Collective::AllReduce, 26, f32s, 0);
        ar.op = Some(RedOp::Sum);
        let l = launches(&ar, 2, 4, send, recv, 104).unwrap();
        assert_eq!(l.len(), 2);
        let last = l[0].work.remote.last().unwrap();
        assert_eq!((last.buffer, last.reduce_with, last.bytes), (recv + 64, send + 64, 16));
        assert_eq!(l[1].reducing, None);
        assert!(l[1].work.copies.is_empty(), "its part is already in place");
        assert_eq!(
            l[1].work
                .remote
                .iter()
                .map(|m| (m.kind, m.peer, m.buffer, m.bytes))
                .collect::<Vec<_>>(),
            [
                (Send, 3, recv + 64, 16),
                (Recv, 1, recv + 32, 32),
                (Send, 3, recv + 32, 32),
                (Recv, 1, recv, 32),
                (Send, 3, recv, 32),
                (Recv, 1, recv + 80, 24),
            ]
        );
        for c in [Collective::AllReduce, Collective::ReduceScatter] {
            for rank in 0..4 {
                let mut k = call(c, 8, f32s, 0);
                k.op = Some(RedOp::Sum);
                for l in launches(&k, rank, 4, send, recv, 32).unwrap() {
                    let channels = l
                        .work
                        .remote
                        .iter()
                        .map(|m| (m.kind, m.peer))
                        .collect::<std::collections::HashSet<_>>();
                    assert!(channels.len() + usize::from(!l.work.copies.is_empty()) <= most_channels(c, 4));
                }
            }
        }
    }

    #[test]
    fn every_piece_goes_to_its_place_once() {
        let (send, recv, piece) = (0x1000_0000u64, 0x2000_0000u64, 0x100u64);
        // Rank `rank` of `n`'s ops for `c` rooted at `root`, on `send` and `recv`.
        let ops_of = |c, root, rank, n, send, recv| ops(&call(c, 1, DataType::Uint8, root), rank, n, send, recv, piece);
        // Gather to rank 1 of 3: the root receives every piece at its place, its own by a copy.
        let g = ops_of(Collective::Gather, 1, 1, 3, send, recv);
        assert_eq!(
            list(&g),
            [
                (Send, 1, send),
                (Recv, 0, recv),
                (Recv, 1, recv + piece),
                (Recv, 2, recv + 2 * piece)
            ]
        );
        let w = Work::sort(&g, 1, 3).unwrap();
        assert_eq!(w.copies.len(), 1);
        assert_eq!((w.copies[0].dst, w.copies[0].src), (recv + piece, send));
        assert_eq!(list(&ops_of(Collective::Gather, 1, 2, 3, send, 0)), [(Send, 1, send)]);
        // Scatter from rank 0.
        let s = ops_of(Collective::Scatter, 0, 0, 2, send, recv);
        assert_eq!(list(&s), [(Send, 0, send), (Send, 1, send + piece), (Recv, 0, recv)]);
        assert_eq!(list(&ops_of(Collective::Scatter, 0, 1, 2, 0, recv)), [(Recv, 0, recv)]);
        // All-to-all: piece p of the input to rank p, piece p of the output from rank p.
        let a = ops_of(Collective::AllToAll, 0, 1, 2, send, recv);
        assert_eq!(
            list(&a),
            [
                (Send, 0, send),
                (Recv, 0, recv),
                (Send, 1, send + piece),
                (Recv, 1, recv + piece)
            ]
        );
        let w = Work::sort(&a, 1, 2).unwrap();
        assert_eq!(w.remote.len(), 2);
        assert_eq!((w.copies[0].dst, w.copies[0].src), (recv + piece, send + piece));
        // Broadcast between two ranks; in place at the root, its copy is dropped.
        let b = ops_of(Collective::Broadcast, 1, 1, 2, send, send);
        assert_eq!(list(&b), [(Send, 0, send), (Send, 1, send), (Recv, 1, send)]);
        // Among four from rank 2: a chain 2 -> 3 -> 0 -> 1; the middle passes on from its own buffer.
        let chain = |rank| ops_of(Collective::Broadcast, 2, rank, 4, send, recv);
        assert_eq!(list(&chain(2)), [(Send, 3, send), (Send, 2, send), (Recv, 2, recv)]);
        assert_eq!(list(&chain(3)), [(Recv, 2, recv), (Send, 0, recv)]);
        assert_eq!(list(&chain(0)), [(Recv, 3, recv), (Send, 1, recv)]);
        assert_eq!(list(&chain(1)), [(Recv, 0, recv)]);
        assert!(ops_of(Collective::AllReduce, 0, 0, 2, send, recv).is_empty());
        for (c, n) in [
            (Collective::AllReduce, 2),
            (Collective::ReduceScatter, 2),
            (Collective::Reduce, 2),
        ] {
            for rank in 0..n {
                let mut k = call(c, 8, DataType::Float32, 0);
                k.op = Some(RedOp::Sum);
                for l in launches(&k, rank, n, send, recv, 32).unwrap() {
                    assert!(l.work.remote.len() <= most_channels(c, n), "{c:?}");
                }
            }
        }
        // The channels every rank's launch has are at most `most_channels`.
        for c in [
            Collective::Gather,
            Collective::Scatter,
            Collective::AllToAll,
            Collective::Broadcast,
        ] {
            let n = 5;
            for rank in 0..n {
                let w = Work::sort(&ops_of(c, 2 % n, rank, n, send, recv), rank, n).unwrap();
                let mut channels: Vec<(u32, usize)> = w.remote.iter().map(|m| (m.kind as u32, m.peer)).collect();
                channels.sort();
                channels.dedup();
                let copies = usize::from(!w.copies.is_empty());
                assert!(channels.len() + copies <= most_channels(c, n), "{c:?} rank {rank}");
            }
        }
        for o in ops_of(Collective::AllToAll, 0, 0, 4, send, recv) {
            assert_eq!((o.count as u64, o.datatype), (piece, DataType::Uint8));
        }
    }
}
