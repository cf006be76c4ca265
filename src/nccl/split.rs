//! `ncclCommSplit` and `ncclCommShrink` carried out by the library: how the ranks of a parent
//! communicator agree on a new one. The new communicator is then made as an initialisation makes one
//! (`Communicator::init_by_id`, its own bootstrap), from a unique id that one of its ranks creates, so that
//! the root of its bootstrap lives in that rank's process.
//!
//! Their messages travel over the parent's bootstrap, in its space for splits and shrinks
//! (`Bootstrap::send_split`), tagged with the count of this rank's splits (or shrinks) of the parent:
//! every rank starts them in the same order, so that two at once (in one group) do not mix.
//!
//! - Split: every rank's color and key are gathered on every rank (`Bootstrap::gather_words`: up the
//!   binomial tree over the parent's ranks, then the whole list down it; its edges join neighbours, so it
//!   opens no connection, and a rank sends and receives at most `ceil(log2 n) + 1` messages). A rank starts
//!   it on a library thread when it calls (`exchange`) and does not wait for it there; a rank of
//!   `NCCL_SPLIT_NOCOLOR` needs nothing back and is done, its thread passing on the words of the ranks below
//!   it in the tree until every rank has called. Each color's members are ordered by key, then by parent
//!   rank; the first creates the id and sends it down a binomial tree over the members (in that order),
//!   so a member talks to at most a parent and `ceil(log2 m)` children there, connected on first use
//!   where they are not neighbours. The parent must be healthy: a failure ends the waits.
//! - Shrink: the ranks that stay are the parent's not excluded, in parent order; the first of them (every
//!   survivor passes the same list, so every survivor knows which) creates the id and sends it, with the
//!   list, down a tree of the survivors: one whose every edge joins neighbours, so that it runs over the
//!   connections the ranks have (`bootstrap::survivor_tree`, about log2(n) / 2 deep), or where the ranks
//!   left out cut some survivor off from the first, a binomial tree (`bootstrap::tree_children`, log2 n
//!   deep, its connections made as it goes); either way no rank sends to every other. Each passes it on
//!   first, then checks that its own list is the same (a survivor whose list differs fails, the
//!   others wait for it in vain at their new communicator's root, until its timeout). An excluded rank, dead or alive, takes
//!   no part. After a failure the parent's bootstrap refuses its ordinary messages, but its connections
//!   between live ranks stay up (the receive threads go on reading and sending heartbeats): split
//!   messages still go through them, and the waits for them go on despite the failure, ending only when
//!   the awaited peer's own connection closes or at the bootstrap's timeout.
//!
//! The exports (at the end) check their arguments, announce, and hand the job that finishes the agreement
//! and makes the communicator to `init.rs` (`start_child`: blocking, non-blocking or at a group's end as
//! the config and the group say). Where the ranks span hosts the new communicator is ours all the same,
//! made over our bootstrap, and gets a new NVIDIA communicator of its own among its ranks when it is made
//! (`init::finish_init`): NVIDIA's own shrink cannot cope with a dead peer, and a child of NVIDIA's alone
//! would be out of reach of our failure path.
#![allow(non_snake_case)] // nccl.h's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each function is nccl.h's

use super::entry::{OK, with_comm};
use super::init::{BOOTSTRAP_TIMEOUT, child_config, start_child};
use super::queue::Job;
use super::types::*;
use crate::abi::non_null_args;
use crate::bootstrap::UniqueId;
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The rounds of a split or shrink, in the low bits of a message's tag (the count of splits or shrinks
/// above them).
const COLORS: u64 = 0;
const SPLIT_ID: u64 = 1;
const SHRINK_ID: u64 = 2;
/// `ncclCommGrow`'s one round (`grow.rs`), above it the count of grows.
pub(super) const GROW_WORDS: u64 = 3;

pub(super) fn tag(count: u64, round: u64) -> u64 {
    (count << 2) | round
}

/// The parent ranks of `color` in the new communicator's rank order: by key, then by parent rank.
/// `entries` holds each parent rank's (color, key).
pub fn members(entries: &[(i32, i32)], color: i32) -> Vec<usize> {
    let mut m: Vec<usize> = (0..entries.len()).filter(|&r| entries[r].0 == color).collect();
    m.sort_by_key(|&r| (entries[r].1, r));
    m
}

/// The parent ranks a shrink keeps (in order), after checking the excluded ones: each in
/// `[0, nranks)`, and at least one rank left. The excluded ranks come back sorted, without repeats.
pub fn survivors(nranks: usize, exclude: &[i32]) -> Result<(Vec<usize>, Vec<usize>)> {
    let mut excluded = Vec::with_capacity(exclude.len());
    for &r in exclude {
        ensure_arg!(
            r >= 0 && (r as usize) < nranks,
            "excludeRanksList holds {r}; ranks are in [0, nranks = {nranks})"
        );
        excluded.push(r as usize);
    }
    excluded.sort_unstable();
    excluded.dedup();
    let kept: Vec<usize> = (0..nranks).filter(|r| excluded.binary_search(r).is_err()).collect();
    ensure_arg!(!kept.is_empty(), "excludeRanksList leaves no rank of the {nranks}");
    Ok((kept, excluded))
}

/// The words of every rank of a split or grow, gathered by a library thread that the rank started when it
/// called (`exchange`); the job that needs them takes them with `wait`.
pub struct Exchange {
    words: std::sync::mpsc::Receiver<Result<Vec<Vec<u8>>>>,
}

impl Exchange {
    /// The words by parent rank, once every rank's has come (or the exchange's error).
    pub fn wait(self) -> Result<Vec<Vec<u8>>> {
        self.words.recv().unwrap_or_else(|_| {
            Err(Error::internal(
                "the thread gathering the ranks' words ended without them",
            ))
        })
    }
}

/// Starts gathering every rank's `word` under `tag` (`Bootstrap::gather_words`, up and down the tree of
/// neighbours) on a library thread, and returns at once: a rank that needs nothing back (a split's
/// `NCCL_SPLIT_NOCOLOR`, a grow it refuses) drops the `Exchange` and is done, while its thread goes on
/// passing its subtree's words up and the list down, for the ranks below it that may call later. The
/// thread holds the parent until then: until every rank has called, or the parent fails, or `deadline`.
pub(super) fn exchange(
    parent: &Arc<Communicator>,
    tag: u64,
    word: Vec<u8>,
    deadline: Option<Instant>,
) -> Result<Exchange> {
    let (sender, words) = std::sync::mpsc::channel();
    let parent = parent.clone();
    std::thread::Builder::new()
        .name("mscclpp-split-words".into())
        .spawn(move || {
            let _scope = crate::logging::RankScope::enter(parent.rank());
            let got = parent.bootstrap().gather_words(tag, &word, deadline);
            // Nobody waits for the words of a rank that needs none: its own part may still have failed.
            if let Err(std::sync::mpsc::SendError(Err(e))) = sender.send(got) {
                log::info!("passing on the ranks' words of a split or grow: {}", e.message);
            }
        })
        .map_err(|e| Error::io("spawning the thread of a split's or grow's words", e))?;
    Ok(Exchange { words })
}

/// A split's first step, when the rank calls: its color and key go into the exchange of every rank's
/// (`exchange`), which it leaves at once.
pub fn announce(parent: &Arc<Communicator>, count: u64, color: i32, key: i32) -> Result<Exchange> {
    parent.check_usable()?;
    let mut bytes = color.to_le_bytes().to_vec();
    bytes.extend_from_slice(&key.to_le_bytes());
    exchange(parent, tag(count, COLORS), bytes, None)
}

/// The rest of a split of a rank with a color, after `announce`: the others' colors and keys, the id,
/// the new communicator.
pub fn split_job(
    parent: Arc<Communicator>,
    count: u64,
    colors: Exchange,
    color: i32,
    key: i32,
    timeout: Duration,
) -> Job {
    Box::new(move || {
        debug_assert_ne!(color, NCCL_SPLIT_NOCOLOR);
        let b = parent.bootstrap();
        let me = b.rank();
        let words = colors.wait()?;
        let mut entries = Vec::with_capacity(words.len());
        for (peer, got) in words.iter().enumerate() {
            let bytes: [u8; 8] = got.as_slice().try_into().map_err(|_| {
                Error::internal(format!(
                    "ncclCommSplit: rank {peer} sent {} bytes, not a color and a key",
                    got.len()
                ))
            })?;
            entries.push((
                i32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")),
                i32::from_le_bytes(bytes[4..].try_into().expect("4 bytes")),
            ));
        }
        if entries[me] != (color, key) {
            return Err(Error::internal(format!(
                "ncclCommSplit: the gathered words give this rank ({me}) color {} and key {}, not {color} and {key}",
                entries[me].0, entries[me].1
            )));
        }
        let members = members(&entries, color);
        let index = members
            .iter()
            .position(|&r| r == me)
            .ok_or_else(|| Error::internal("a rank is not among the members of its own color"))?;
        // The id goes down a binomial tree over the members (in their new order) from the first, who
        // creates it: at most ceil(log2 m) + 1 peers a member, made on first use where not neighbours.
        let id_bytes = if index == 0 {
            UniqueId::create(timeout)?.to_bytes().to_vec()
        } else {
            let from = members[crate::bootstrap::tree_parent(index)];
            b.recv_split(from, tag(count, SPLIT_ID), false, None)?
        };
        for child in crate::bootstrap::tree_children(index, members.len()) {
            b.send_split(members[child], tag(count, SPLIT_ID), &id_bytes)?;
        }
        let id = read_id(&id_bytes)?;
        log::info!(
            "ncclCommSplit: color {color}, key {key}: rank {index} of {} (parent ranks {:?})",
            members.len(),
            members
        );
        Communicator::init_by_id(members.len(), &id, index, timeout)
    })
}

/// A shrink of the survivors `kept` (parent ranks, in order; this rank among them), the others
/// (`excluded`) left out. Works on a failed parent too (see the module's comment); the survivors must all
/// call it within `timeout` of one another.
pub fn shrink_job(
    parent: Arc<Communicator>,
    count: u64,
    kept: Vec<usize>,
    excluded: Vec<usize>,
    timeout: Duration,
) -> Job {
    Box::new(move || {
        let b = parent.bootstrap();
        let me = b.rank();
        let index = kept
            .iter()
            .position(|&r| r == me)
            .ok_or_else(|| Error::internal("a shrinking rank is not among the survivors"))?;
        // The tree: of neighbours where it reaches every survivor, else the binomial one.
        let (parent_index, children) = match crate::bootstrap::survivor_tree(&kept, b.nranks()) {
            Some(parents) => (
                parents[index],
                (0..kept.len()).filter(|&j| parents[j] == Some(index)).collect(),
            ),
            None => (
                (index > 0).then(|| crate::bootstrap::tree_parent(index)),
                crate::bootstrap::tree_children(index, kept.len()),
            ),
        };
        // The id and the list go on to this rank's children in the tree: every one is tried, the first
        // failure (a child that is gone) reported once all were.
        let pass_on = |message: &[u8]| {
            let mut first = Ok(());
            for &child in &children {
                let sent = b.send_split(kept[child], tag(count, SHRINK_ID), message);
                if first.is_ok() {
                    first = sent;
                }
            }
            first
        };
        let id = if index == 0 {
            let id = UniqueId::create(timeout)?;
            let mut message = id.to_bytes().to_vec();
            for &r in &excluded {
                message.extend_from_slice(&(r as u32).to_le_bytes());
            }
            pass_on(&message)?;
            id
        } else {
            let deadline = Instant::now() + timeout;
            let parent_rank = kept[parent_index.expect("a survivor but the first has a parent")];
            let got = b.recv_split(parent_rank, tag(count, SHRINK_ID), true, Some(deadline))?;
            if got.len() < 128 || (got.len() - 128) % 4 != 0 {
                return Err(Error::internal(format!(
                    "ncclCommShrink: rank {parent_rank} sent {} bytes, not an id and a list of ranks",
                    got.len()
                )));
            }
            pass_on(&got)?;
            let theirs: Vec<usize> = got[128..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) as usize)
                .collect();
            if theirs != excluded {
                return Err(Error::invalid_argument(format!(
                    "ncclCommShrink: rank {} excludes ranks {theirs:?}, this rank {excluded:?}: every rank that \
                     stays must pass the same excludeRanksList",
                    kept[0]
                )));
            }
            read_id(&got[..128])?
        };
        log::info!(
            "ncclCommShrink: rank {index} of {} (parent ranks {:?} left out)",
            kept.len(),
            excluded
        );
        Communicator::init_by_id(kept.len(), &id, index, timeout)
    })
}

fn read_id(bytes: &[u8]) -> Result<UniqueId> {
    let bytes: &[u8; 128] = bytes
        .try_into()
        .map_err(|_| Error::internal(format!("a unique id of {} bytes", bytes.len())))?;
    UniqueId::from_bytes(bytes, "unique id", "ncclCommSplit's root")
}

// ---- exports ----

nccl_export! {
    /// The ranks that pass one color make a new communicator, ordered by key, then by parent rank
    /// (collective over the parent; `NCCL_SPLIT_NOCOLOR`: none, `*newcomm` NULL). Blocking or not as its
    /// config says (the parent's mode without one); inside a group, made at its end. See `split.rs`.
    /// Where the ranks span hosts, it is ours too, with a new NVIDIA communicator of its own.
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        with_comm("ncclCommSplit", comm, |c| {
            non_null_args!(newcomm);
            // SAFETY: checked non-null.
            unsafe { *newcomm = std::ptr::null_mut() };
            ensure_arg!(
                color >= 0 || color == NCCL_SPLIT_NOCOLOR,
                "color is {color}; it must not be negative, or NCCL_SPLIT_NOCOLOR"
            );
            // SAFETY: nccl.h's contract: NULL or the caller's config.
            let cfg = unsafe { child_config(c, config) }?;
            let parent = c.usable()?;
            let count = c.next_split();
            let colors = announce(&parent, count, color, key)?;
            if color == NCCL_SPLIT_NOCOLOR {
                return OK;
            }
            let job = split_job(parent, count, colors, color, key, BOOTSTRAP_TIMEOUT);
            // SAFETY: checked non-null.
            unsafe { start_child(c, newcomm, None, cfg, job) }
        })
    }
}

nccl_export! {
    /// The parent's ranks but the excluded ones make a new communicator, in parent order; the excluded
    /// ranks do not call it. Works after a failure, the dead ranks excluded: the survivors meet over the
    /// parent's connections between them (see `split.rs`). `NCCL_SHRINK_ABORT` first revokes the parent
    /// (`ncclCommRevoke`). Blocking or not as `ncclCommSplit`. Where the ranks span hosts, it is ours too,
    /// with a new NVIDIA communicator among the survivors.
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut c_int,
        excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrinkFlags: c_int,
    ) -> ncclResult_t {
        with_comm("ncclCommShrink", comm, |c| {
            non_null_args!(newcomm);
            // SAFETY: checked non-null.
            unsafe { *newcomm = std::ptr::null_mut() };
            ensure_arg!(
                matches!(shrinkFlags, NCCL_SHRINK_DEFAULT | NCCL_SHRINK_ABORT),
                "shrinkFlags is {shrinkFlags}; it must be NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
            );
            let (rank, nranks) = c.place()?;
            ensure_arg!(
                excludeRanksCount >= 0 && (excludeRanksCount as usize) < nranks,
                "excludeRanksCount is {excludeRanksCount}; it must be in [0, nranks = {nranks})"
            );
            let exclude = if excludeRanksCount > 0 {
                non_null_args!(excludeRanksList);
                // SAFETY: checked non-null; the caller passes excludeRanksCount ranks.
                unsafe { std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize) }.to_vec()
            } else {
                Vec::new()
            };
            let (kept, excluded) = survivors(nranks, &exclude)?;
            // SAFETY: nccl.h's contract: NULL or the caller's config.
            let cfg = unsafe { child_config(c, config) }?;
            ensure_arg!(
                excluded.binary_search(&rank).is_err(),
                "excludeRanksList holds this rank ({rank}): the ranks left out do not call ncclCommShrink"
            );
            // Any state of the parent will do (failed, revoked, finalized): a shrink is how one goes on.
            let parent = c.core()?;
            if shrinkFlags == NCCL_SHRINK_ABORT {
                c.revoke("ncclCommShrink")?;
            }
            let index = kept.iter().position(|&r| r == rank).expect("not excluded, so kept");
            let place = Some((index, kept.len()));
            let job = shrink_job(parent, c.next_shrink(), kept, excluded, BOOTSTRAP_TIMEOUT);
            // SAFETY: checked non-null.
            unsafe { start_child(c, newcomm, place, cfg, job) }
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn members_are_ordered_by_key_then_parent_rank() {
        // Parent ranks 0..6: colors 0,1,0,1,0,-1; keys reverse the order within color 0, tie within 1.
        let entries = [(0, 9), (1, 5), (0, 3), (1, 5), (0, 1), (-1, 0)];
        assert_eq!(members(&entries, 0), vec![4, 2, 0]);
        assert_eq!(members(&entries, 1), vec![1, 3], "equal keys keep parent order");
        assert!(members(&entries, 7).is_empty());
    }

    #[test]
    fn survivors_are_checked_and_kept_in_parent_order() {
        let (kept, excluded) = survivors(5, &[3, 1, 3]).unwrap();
        assert_eq!((kept, excluded), (vec![0, 2, 4], vec![1, 3]));
        assert_eq!(survivors(3, &[]).unwrap().0, vec![0, 1, 2]);
        for bad in [&[5][..], &[-1], &[0, 1, 2]] {
            let e = survivors(3, bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.message.contains("excludeRanksList"), "{}", e.message);
        }
    }

    pub(in crate::nccl) const T: Duration = Duration::from_secs(30);

    /// `n` communicators of one job, made on threads of this process (no GPU needed); `grow.rs`'s tests use
    /// it too.
    pub(in crate::nccl) fn job(n: usize) -> Vec<Arc<Communicator>> {
        crate::logging::init();
        let id = UniqueId::create(T).unwrap();
        std::thread::scope(|s| {
            let made: Vec<_> = (0..n)
                .map(|r| {
                    let id = &id;
                    s.spawn(move || Arc::new(Communicator::init_by_id(n, id, r, T).unwrap()))
                })
                .collect();
            made.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Runs `f(rank)` on a thread per rank; the results in rank order.
    /// Waits until every one of `parent` has learnt of a failure (within `T`).
    fn wait_for_failure(parent: &[Arc<Communicator>]) {
        for p in parent {
            let start = Instant::now();
            while p.check_usable().is_ok() {
                assert!(start.elapsed() < T, "rank {}: no failure seen", p.rank());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    fn on_ranks<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let all: Vec<_> = (0..n)
                .map(|r| {
                    s.spawn({
                        let f = &f;
                        move || f(r)
                    })
                })
                .collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn a_split_makes_one_communicator_per_color_in_key_order() {
        let parent = job(4);
        // Two splits at once of one parent (as in a group): colors by parity with keys reversing the
        // order, and one color with rank 3 left out.
        let places = on_ranks(4, |r| {
            let p = &parent[r];
            let colors = announce(p, 0, (r % 2) as i32, 10 - r as i32).unwrap();
            let second = if r == 3 { NCCL_SPLIT_NOCOLOR } else { 5 };
            let others = announce(p, 1, second, 0).unwrap();
            let first = split_job(p.clone(), 0, colors, (r % 2) as i32, 10 - r as i32, T)().unwrap();
            let other = (r != 3).then(|| split_job(p.clone(), 1, others, 5, 0, T)().unwrap());
            // The new communicators work: a barrier over each one's own bootstrap.
            first.bootstrap().barrier().unwrap();
            if let Some(o) = &other {
                o.bootstrap().barrier().unwrap();
            }
            ((first.rank(), first.nranks()), other.map(|o| (o.rank(), o.nranks())))
        });
        assert_eq!(
            places,
            vec![
                ((1, 2), Some((0, 3))),
                ((1, 2), Some((1, 3))),
                ((0, 2), Some((2, 3))),
                ((0, 2), None)
            ]
        );
    }

    /// The peers `b` is connected with beyond its neighbours (those of set-up).
    pub(in crate::nccl) fn beyond_neighbours(b: &crate::bootstrap::Bootstrap) -> Vec<usize> {
        let (me, n) = (b.rank(), b.nranks());
        b.connected_peers()
            .into_iter()
            .filter(|&p| !crate::bootstrap::are_neighbours(me, p, n))
            .collect()
    }

    #[test]
    fn a_split_of_many_ranks_opens_a_few_connections_a_rank_not_one_to_every_peer() {
        const N: usize = 64;
        let parent = job(N);
        // Three colors, keys that scatter each color's order (so that its tree of members joins ranks that
        // are not neighbours), and some ranks without a color: rank 0, the root of the tree of words, among
        // them, so that its words pass through a rank that has already returned.
        let color = |r: usize| {
            if r.is_multiple_of(7) {
                NCCL_SPLIT_NOCOLOR
            } else {
                (r % 3) as i32
            }
        };
        let key = |r: usize| ((r * 37) % N) as i32;
        let places = on_ranks(N, |r| {
            let words = announce(&parent[r], 0, color(r), key(r)).unwrap();
            if color(r) == NCCL_SPLIT_NOCOLOR {
                return None;
            }
            let new = split_job(parent[r].clone(), 0, words, color(r), key(r), T)().unwrap();
            new.bootstrap().barrier().unwrap();
            Some((new.rank(), new.nranks()))
        });
        let entries: Vec<(i32, i32)> = (0..N).map(|r| (color(r), key(r))).collect();
        for c in 0..3 {
            let m = members(&entries, c);
            for (i, &r) in m.iter().enumerate() {
                assert_eq!(places[r], Some((i, m.len())), "rank {r} of color {c}");
            }
        }
        // Each rank's connections: its neighbours (2 log2 n at most), and at most a parent and log2 m
        // children in its color's tree beyond them; every peer would be n - 1 = 63.
        for p in &parent {
            let b = p.bootstrap();
            let beyond = beyond_neighbours(b);
            assert!(
                beyond.len() <= 1 + 5,
                "rank {}: beyond its neighbours {beyond:?}",
                b.rank()
            );
            assert!(
                b.connected_peers().len() <= 12 + 6,
                "rank {}: {:?}",
                b.rank(),
                b.connected_peers()
            );
        }
        // The words went over the neighbours alone: the ranks without a color opened nothing.
        for r in (0..N).filter(|&r| color(r) == NCCL_SPLIT_NOCOLOR) {
            let b = parent[r].bootstrap();
            assert!(beyond_neighbours(b).is_empty(), "rank {r}: {:?}", beyond_neighbours(b));
        }
    }

    #[test]
    fn the_survivors_of_a_failure_shrink_to_a_working_communicator() {
        let mut parent = job(4);
        // Rank 3 aborts and goes: every other rank's parent has failed.
        let gone = parent.pop().unwrap();
        gone.abort("a test").unwrap();
        drop(gone);
        wait_for_failure(&parent);
        let (kept, excluded) = survivors(4, &[3]).unwrap();
        let places = on_ranks(3, |r| {
            let new = shrink_job(parent[r].clone(), 0, kept.clone(), excluded.clone(), T)().unwrap();
            new.bootstrap().barrier().unwrap();
            (new.rank(), new.nranks())
        });
        assert_eq!(places, vec![(0, 3), (1, 3), (2, 3)]);
        // A second shrink of the same failed parent, leaving rank 0 out too: rank 1 is the new root.
        let (kept, excluded) = survivors(4, &[3, 0]).unwrap();
        let places = on_ranks(2, |i| {
            let new = shrink_job(parent[i + 1].clone(), 1, kept.clone(), excluded.clone(), T)().unwrap();
            new.bootstrap().barrier().unwrap();
            (new.rank(), new.nranks())
        });
        assert_eq!(places, vec![(0, 2), (1, 2)]);
    }

    #[test]
    fn a_shrink_of_many_survivors_goes_down_a_tree_of_neighbours() {
        const N: usize = 12;
        let mut parent = job(N);
        // Ranks 11 and 4 abort and go: the others shrink without them.
        for gone in [parent.remove(11), parent.remove(4)] {
            gone.abort("a test").unwrap();
            drop(gone);
        }
        wait_for_failure(&parent);
        let (kept, excluded) = survivors(N, &[11, 4]).unwrap();
        let places = on_ranks(kept.len(), |i| {
            let new = shrink_job(parent[i].clone(), 0, kept.clone(), excluded.clone(), T)().unwrap();
            new.bootstrap().barrier().unwrap();
            (new.rank(), new.nranks())
        });
        assert_eq!(places, (0..10).map(|i| (i, 10)).collect::<Vec<_>>());
        // The tree joins neighbours: no survivor needed a connection beyond them.
        for p in &parent {
            let b = p.bootstrap();
            let neighbours = (0..N)
                .filter(|&q| q != b.rank() && crate::bootstrap::are_neighbours(b.rank(), q, N))
                .count();
            assert!(
                b.connected_peers().len() <= neighbours,
                "rank {}: {:?}",
                b.rank(),
                b.connected_peers()
            );
        }
    }

    #[test]
    fn a_shrink_to_survivors_cut_off_from_one_another_goes_down_the_binomial_tree() {
        const N: usize = 16;
        // Ranks 0 and 3 stay; every neighbour of rank 0's is left out, so no tree of neighbours joins them.
        let mut parent = job(N);
        let stay: Vec<Arc<Communicator>> = vec![parent.remove(0), parent.remove(2)];
        for gone in parent {
            gone.abort("a test").unwrap();
        }
        let exclude: Vec<i32> = (0..N as i32).filter(|&r| r != 0 && r != 3).collect();
        let (kept, excluded) = survivors(N, &exclude).unwrap();
        assert_eq!(kept, vec![0, 3]);
        assert!(crate::bootstrap::survivor_tree(&kept, N).is_none());
        let places = on_ranks(2, |i| {
            let new = shrink_job(stay[i].clone(), 0, kept.clone(), excluded.clone(), T)().unwrap();
            new.bootstrap().barrier().unwrap();
            (new.rank(), new.nranks())
        });
        assert_eq!(places, vec![(0, 2), (1, 2)]);
        assert!(stay[0].bootstrap().connected_peers().contains(&3), "made on first use");
    }

    #[test]
    fn survivors_with_different_lists_are_told() {
        let parent = job(3);
        let short = Duration::from_secs(2);
        let results = on_ranks(2, |r| {
            let list: &[i32] = if r == 0 { &[2] } else { &[2, 2] };
            let (kept, excluded) = survivors(3, list).unwrap();
            assert_eq!(excluded, vec![2], "repeats count once");
            let list: &[i32] = if r == 0 { &[2] } else { &[] };
            let (_, excluded) = survivors(3, list).unwrap();
            shrink_job(parent[r].clone(), 0, kept, excluded, short)().err()
        });
        let e = results[1].as_ref().expect("rank 1's list differs from rank 0's");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("same excludeRanksList"), "{}", e.message);
        assert!(
            results[0].is_some(),
            "rank 0 waits for rank 1 in vain, until its timeout"
        );
    }

    #[test]
    fn rounds_and_counts_make_distinct_tags() {
        let tags = [
            tag(0, COLORS),
            tag(0, SPLIT_ID),
            tag(0, SHRINK_ID),
            tag(0, GROW_WORDS),
            tag(1, COLORS),
            tag(1, SPLIT_ID),
        ];
        for (i, a) in tags.iter().enumerate() {
            for b in &tags[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
