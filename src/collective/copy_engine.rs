//! Copy-engine collectives on registered buffers: an eager all-gather or broadcast whose data the GPU's
//! copy engines (DMA) move straight from this rank's input into the peers' registered outputs, each byte
//! once, with no SM spent on it. Over NVLink the copy engine writing into the peer's memory carries more
//! than SM stores or loads, and more than the copy engine reading it (docs/PERFORMANCE.md, "The link's
//! ceilings" and the copy engine's figures); the design is in docs/ZERO_COPY.md.
//!
//! The host queues the copies, so it must know before queuing them that every rank reaches every output
//! it writes (the SM zero-copy kernels find that out on the GPU, by their vote). The ranks exchange their
//! outputs' descriptors through the bootstrap, each looks the peers' up in its zero-copy table
//! (`ZeroCopy::resolve`), and a second exchange makes the verdict every rank's: all yes, the copy engine;
//! any no, the call goes on as if this had not been tried. Such a call waits on the host until every rank
//! has reached it (two all-gathers of the bootstrap), so only large calls try it
//! (`algorithm::copy_engine_from`).
//!
//! On the application's stream: a fence launch (every rank's stream has reached the call, so the peers'
//! outputs may be overwritten), the copies (the first on the stream, the others on side streams the stream
//! forks to and joins by events), and a second fence (every rank's copies are done, so every output is
//! whole before its stream moves on). The fences are kernels that end on an abort
//! (`kernels/collectives/copy_engine.cuh`); the copies always end.
//!
//! Never in a CUDA graph: a captured copy would be replayed with the capture's addresses, unchecked, after
//! a peer deregistered or reallocated its buffer. A capture keeps the SM zero-copy kernels, which check at
//! every replay. (Copies switched on at each replay by a conditional graph node were built and ran slower
//! than those kernels: docs/ZERO_COPY.md.)

use super::Collective;
use super::algorithm::{Choice, Placement, copy_engine_from};
use crate::bootstrap::Bootstrap;
use crate::error::Result;
use crate::gpu::{AppStream, DevicePtr, Event, GpuContext, Stream};

/// Threads of a fence launch (one block): at least one per rank.
pub const FENCE_THREADS: u32 = 32;

/// Whether an eager call tries the copy engine: all-gather and broadcast, from `copy_engine_from`'s size
/// (`Choice::CopyEngine`: at every size), never while the stream is captured.
pub fn attempt(
    collective: Collective,
    nranks: usize,
    placement: Placement,
    message: u64,
    choice: Choice,
    capturing: bool,
) -> bool {
    if !matches!(collective, Collective::AllGather | Collective::Broadcast) || nranks < 2 || message == 0 || capturing {
        return false;
    }
    match choice {
        Choice::CopyEngine => true,
        Choice::Auto => copy_engine_from(collective, nranks, placement).is_some_and(|from| message >= from),
        Choice::Force(_) | Choice::ZeroCopy | Choice::SendRecv => false,
    }
}

/// The peers whose outputs `rank` writes: every peer for an all-gather and for a broadcast's root, none
/// for a broadcast's other ranks.
fn writes(collective: Collective, rank: usize, nranks: usize, root: usize) -> Vec<usize> {
    match collective {
        Collective::AllGather => (0..nranks).filter(|&r| r != rank).collect(),
        Collective::Broadcast if rank == root => (0..nranks).filter(|&r| r != rank).collect(),
        _ => Vec::new(),
    }
}

/// Agrees with every rank on whether the call goes by the copy engine. `own` is this rank's output's
/// descriptor (`ZeroCopy::descriptor`: tag and offset, or (0, 0) when not registered), `recv` its output,
/// and `resolve(peer, tag, offset)` where a peer's output lies in this context (`ZeroCopy::resolve`).
/// Collective: every rank of the call calls it. Gives every rank's output as this rank reaches it (0 for
/// those it does not write), or `None` when some rank cannot reach all it writes.
pub fn agree(
    bootstrap: &Bootstrap,
    collective: Collective,
    root: usize,
    own: (u64, u64),
    recv: DevicePtr,
    resolve: impl Fn(usize, u64, u64) -> Option<DevicePtr>,
) -> Result<Option<Vec<DevicePtr>>> {
    let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
    let mut descriptors = vec![0u8; 16 * nranks];
    descriptors[16 * rank..16 * rank + 8].copy_from_slice(&own.0.to_le_bytes());
    descriptors[16 * rank + 8..16 * rank + 16].copy_from_slice(&own.1.to_le_bytes());
    bootstrap.all_gather(&mut descriptors, 16)?;
    let word = |i: usize| u64::from_le_bytes(descriptors[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let mut outputs = vec![0; nranks];
    outputs[rank] = recv;
    let mut found = true;
    for peer in writes(collective, rank, nranks, root) {
        match resolve(peer, word(2 * peer), word(2 * peer + 1)) {
            Some(address) => outputs[peer] = address,
            None => found = false,
        }
    }
    let mut votes = vec![0u8; nranks];
    votes[rank] = found as u8;
    bootstrap.all_gather(&mut votes, 1)?;
    Ok(votes.iter().all(|&v| v == 1).then_some(outputs))
}

/// One copy the copy engine makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCopy {
    pub dst: DevicePtr,
    pub src: DevicePtr,
    pub bytes: u64,
}

/// This rank's copies of a call of `piece` bytes a rank (`Call::sizes`): an all-gather's input into its
/// place in every output, a broadcast root's input into every output; none where source and destination
/// are the same bytes (in place). `outputs` is `agree`'s, `send` this rank's input.
pub fn copies(
    collective: Collective,
    rank: usize,
    root: usize,
    piece: u64,
    send: DevicePtr,
    outputs: &[DevicePtr],
) -> Vec<PeerCopy> {
    let nranks = outputs.len();
    // This rank's own output last: the peers' are across the link, the longer copies.
    let everyone = (1..=nranks).map(|k| (rank + k) % nranks);
    let wanted: Vec<(DevicePtr, DevicePtr)> = match collective {
        Collective::AllGather => everyone.map(|r| (outputs[r] + rank as u64 * piece, send)).collect(),
        Collective::Broadcast if rank == root => everyone.map(|r| (outputs[r], send)).collect(),
        _ => Vec::new(),
    };
    wanted
        .into_iter()
        .filter(|&(dst, src)| dst != src)
        .map(|(dst, src)| PeerCopy { dst, src, bytes: piece })
        .collect()
}

/// The side streams a call's copies fork to, and the events that fork and join them: made at the first
/// call that needs them, kept until the communicator's destroy.
pub struct SideStreams {
    gpu: GpuContext,
    fork: Option<Event>,
    lanes: Vec<(Stream, Event)>,
}

impl SideStreams {
    pub fn new(gpu: &GpuContext) -> SideStreams {
        SideStreams {
            gpu: *gpu,
            fork: None,
            lanes: Vec::new(),
        }
    }

    /// Queues `copies` after the work queued on `stream`, each on a copy engine of its own where the GPU
    /// has several, and makes the work queued on `stream` afterwards wait for all of them.
    ///
    /// # Safety
    /// Every copy's ranges are memory this context reaches (its own buffers, or peers' mapped ones) that
    /// stays allocated until the copies have run, and nothing else writes a destination meanwhile.
    pub unsafe fn queue(&mut self, stream: AppStream, copies: &[PeerCopy]) -> Result<()> {
        let Some((first, rest)) = copies.split_first() else {
            return Ok(());
        };
        if !rest.is_empty() {
            let fork = match &mut self.fork {
                Some(fork) => fork,
                none => none.insert(Event::new(&self.gpu)?),
            };
            stream.record(fork)?;
            while self.lanes.len() < rest.len() {
                self.lanes.push((Stream::new(&self.gpu)?, Event::new(&self.gpu)?));
            }
            for (copy, (side, join)) in rest.iter().zip(&self.lanes) {
                side.wait(fork)?;
                // SAFETY: the caller's contract.
                unsafe { side.copy(copy.dst, copy.src, copy.bytes as usize)? };
                side.record(join)?;
            }
        }
        // SAFETY: the caller's contract.
        unsafe { stream.copy(first.dst, first.src, first.bytes as usize)? };
        for (_, join) in self.lanes.iter().take(rest.len()) {
            stream.wait(join)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::algorithm::Protocol;

    #[test]
    fn eager_all_gathers_and_broadcasts_only() {
        let big = 1 << 30;
        let several = Placement::SeveralGpus;
        assert!(attempt(Collective::AllGather, 2, several, big, Choice::Auto, false));
        // Across GPUs among more than two, the chains and rings instead; on one GPU at any count.
        assert!(!attempt(Collective::Broadcast, 8, several, big, Choice::Auto, false));
        assert!(!attempt(Collective::AllGather, 4, several, big, Choice::Auto, false));
        assert!(attempt(
            Collective::Broadcast,
            8,
            Placement::OneGpu,
            big,
            Choice::Auto,
            false
        ));
        assert!(attempt(
            Collective::AllGather,
            4,
            several,
            big,
            Choice::CopyEngine,
            false
        ));
        assert!(
            !attempt(Collective::AllGather, 2, several, big, Choice::Auto, true),
            "captured"
        );
        assert!(
            !attempt(Collective::AllGather, 2, several, 1 << 20, Choice::Auto, false),
            "small"
        );
        assert!(attempt(Collective::AllGather, 2, several, 1, Choice::CopyEngine, false));
        assert!(!attempt(
            Collective::AllGather,
            2,
            several,
            0,
            Choice::CopyEngine,
            false
        ));
        assert!(!attempt(
            Collective::AllGather,
            1,
            several,
            big,
            Choice::CopyEngine,
            false
        ));
        for choice in [
            Choice::ZeroCopy,
            Choice::Force(Protocol::Copy),
            Choice::Force(Protocol::Packet),
        ] {
            assert!(
                !attempt(Collective::AllGather, 2, several, big, choice, false),
                "{choice:?}"
            );
        }
        for c in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::Reduce,
            Collective::AllToAll,
            Collective::Gather,
            Collective::Scatter,
        ] {
            assert!(!attempt(c, 2, several, big, Choice::CopyEngine, false), "{c:?}");
        }
    }

    #[test]
    fn all_gather_copies_the_input_into_every_output() {
        let outputs = [0x1000, 0x9000, 0x3000];
        let got = copies(Collective::AllGather, 1, 0, 0x100, 0x5000, &outputs);
        let want = [(0x3100, 0x5000), (0x1100, 0x5000), (0x9100, 0x5000)];
        assert_eq!(got.len(), 3);
        for (copy, (dst, src)) in got.iter().zip(want) {
            assert_eq!((copy.dst, copy.src, copy.bytes), (dst, src, 0x100));
        }
        // In place: this rank's input is its piece of its own output, which needs no copy.
        let in_place = copies(Collective::AllGather, 1, 0, 0x100, 0x9100, &outputs);
        assert_eq!(in_place.len(), 2);
        assert!(in_place.iter().all(|c| c.dst != 0x9100));
    }

    #[test]
    fn broadcast_copies_the_root_input_into_every_output() {
        let outputs = [0x7000, 0x5000, 0x8000];
        let root = copies(Collective::Broadcast, 1, 1, 64, 0x4000, &outputs);
        let dsts: Vec<_> = root.iter().map(|c| (c.dst, c.src, c.bytes)).collect();
        assert_eq!(dsts, [(0x8000, 0x4000, 64), (0x7000, 0x4000, 64), (0x5000, 0x4000, 64)]);
        assert_eq!(
            copies(Collective::Broadcast, 1, 1, 64, 0x5000, &outputs).len(),
            2,
            "root in place"
        );
        assert!(
            copies(Collective::Broadcast, 2, 1, 64, 0, &outputs).is_empty(),
            "not the root"
        );
    }

    #[test]
    fn writes_are_the_outputs_each_algorithm_fills() {
        assert_eq!(writes(Collective::AllGather, 1, 3, 0), [0, 2]);
        assert_eq!(writes(Collective::Broadcast, 2, 3, 2), [0, 1]);
        assert!(writes(Collective::Broadcast, 1, 3, 2).is_empty());
    }

    fn job(n: usize) -> Vec<Bootstrap> {
        use crate::bootstrap::PROTOCOL_MAGIC;
        use crate::bootstrap::tests::{T, local_root, on_ranks};
        let root = local_root(PROTOCOL_MAGIC, T);
        let addr = root.local_addr();
        on_ranks(n, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, n, T).unwrap())
    }

    /// Runs `agree` on every rank of `bs` at once; rank r's output is registered as tag r + 1 at offset
    /// 16 r, and each rank resolves what `reaches(rank, peer)` allows, at 0x1000 (peer + 1).
    fn agree_everywhere(
        bs: &[Bootstrap],
        collective: Collective,
        root: usize,
        reaches: fn(usize, usize) -> bool,
    ) -> Vec<Option<Vec<DevicePtr>>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = bs
                .iter()
                .map(|b| {
                    s.spawn(move || {
                        let rank = b.rank();
                        let own = (rank as u64 + 1, 16 * rank as u64);
                        let resolve = |peer: usize, tag: u64, offset: u64| {
                            assert_eq!((tag, offset), (peer as u64 + 1, 16 * peer as u64), "rank {rank}");
                            reaches(rank, peer).then_some(0x1000 * (peer as u64 + 1) + offset)
                        };
                        agree(b, collective, root, own, 0xa000 + rank as u64, resolve).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_agrees_or_none_does() {
        let bs = job(3);
        let all = agree_everywhere(&bs, Collective::AllGather, 0, |_, _| true);
        assert_eq!(all[1], Some(vec![0x1000, 0xa001, 0x3000 + 32]));
        assert!(all.iter().all(Option::is_some));
        // Rank 2 cannot map rank 0's output: nobody goes by the copy engine.
        let one_missing = agree_everywhere(&bs, Collective::AllGather, 0, |rank, peer| (rank, peer) != (2, 0));
        assert!(one_missing.iter().all(Option::is_none), "{one_missing:?}");
        // A broadcast's root alone writes the peers' outputs: what the others cannot map does not matter.
        let broadcast = agree_everywhere(&bs, Collective::Broadcast, 1, |rank, _| rank == 1);
        assert_eq!(broadcast[1], Some(vec![0x1000, 0xa001, 0x3000 + 32]));
        assert_eq!(broadcast[0], Some(vec![0xa000, 0, 0]));
        let root_blind = agree_everywhere(&bs, Collective::Broadcast, 1, |rank, peer| rank != 1 || peer != 2);
        assert!(root_blind.iter().all(Option::is_none), "{root_blind:?}");
    }
}
