//! `ncclCommGetUniqueId` and `ncclCommGrow` (NCCL 2.29): new ranks join the ranks of a communicator in a
//! new, larger one; the parent is untouched. The new communicator is made as an initialisation makes one
//! (`Communicator::init_by_id`, its own bootstrap), from the id that one existing rank, the grow's root,
//! made with `ncclCommGetUniqueId`: a bootstrap root in that rank's process.
//!
//! - The id: our unique id (`UniqueId`), marked as a grow's and carrying the parent's size, so that a new
//!   rank checks its rank (`[parent size, nRanks)`) before it connects to anything (`GrowId`).
//! - The existing ranks: only the root knows the id, and no rank knows which rank the root is. Every rank's
//!   word (`Word`: the `nRanks` it passes and the id if it is the root, or why it refuses the grow) is
//!   gathered on every rank over the parent's bootstrap, among the messages of splits
//!   (`Bootstrap::gather_words`, up and down the binomial tree of neighbours: no new connection, at most
//!   `ceil(log2 n) + 1` messages a rank; tagged with the count of this rank's grows of the parent: every
//!   rank grows in the same order), started on a library thread when the rank calls (`split::exchange`),
//!   within the timeout. Every rank thus holds the same words and comes to the same conclusion (`agree`,
//!   the first refusal by rank first): exactly one id and one `nRanks`, or the same error everywhere. A
//!   rank whose own arguments are wrong still gives its word (a refusal), so that its peers fail and the
//!   counts stay in step; its thread goes on passing the others' words on while it returns its error.
//! - The new ranks only call `init_by_id` with their rank; the bootstrap's root checks that every rank
//!   passes the same `nRanks` and that no rank comes twice (a rank turned away is told why).
#![allow(non_snake_case)] // NCCL's argument names
#![allow(clippy::missing_safety_doc)] // the contract of each export is nccl.h's

use super::comm::{MadeId, NcclComm};
use super::config;
use super::entry::{OK, entry, with_comm};
use super::init::{child_config, current_device, start, start_child};
use super::queue::Job;
use super::split::{Exchange, GROW_WORDS, exchange, tag};
use super::types::{NCCL_UNIQUE_ID_BYTES, ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId};
use crate::abi::non_null_args;
use crate::bootstrap::{MAX_RANKS, UniqueId};
use crate::comm::Communicator;
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the id's root waits for the ranks, and the existing ranks for one another's words.
const TIMEOUT: Duration = crate::bootstrap::DEFAULT_TIMEOUT;

/// Where a grow's mark and the parent's size sit in the id: past the bytes of `UniqueId::to_bytes`, which
/// leaves them zero.
const MARK_AT: usize = 116;
const MARK: [u8; 4] = *b"GROW";
const SIZE_AT: usize = MARK_AT + MARK.len();

/// The id of a grow: the bootstrap root of the new communicator, and the parent's size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrowId {
    pub id: UniqueId,
    pub parent_nranks: usize,
}

impl GrowId {
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        let mut b = self.id.to_bytes();
        debug_assert!(b[MARK_AT..].iter().all(|&x| x == 0), "a unique id's tail is zero");
        b[MARK_AT..SIZE_AT].copy_from_slice(&MARK);
        b[SIZE_AT..SIZE_AT + 4].copy_from_slice(&(self.parent_nranks as u32).to_le_bytes());
        b
    }

    /// Reads an id made by `to_bytes`; anything else is an invalid argument.
    pub fn from_bytes(bytes: &[u8; NCCL_UNIQUE_ID_BYTES]) -> Result<GrowId> {
        ensure_arg!(
            bytes[MARK_AT..SIZE_AT] == MARK,
            "uniqueId was not made by ncclCommGetUniqueId (an id of ncclGetUniqueId, or uninitialised memory?)"
        );
        let parent_nranks = u32::from_le_bytes(bytes[SIZE_AT..SIZE_AT + 4].try_into().expect("4 bytes")) as usize;
        let mut plain = *bytes;
        plain[MARK_AT..SIZE_AT + 4].fill(0);
        let id = UniqueId::from_bytes(&plain, "uniqueId", "ncclCommGetUniqueId")?;
        ensure_arg!(
            parent_nranks >= 1,
            "uniqueId names a communicator of {parent_nranks} ranks: it was not made by ncclCommGetUniqueId"
        );
        Ok(GrowId { id, parent_nranks })
    }
}

/// What an existing rank tells the others when it calls `ncclCommGrow`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Word {
    /// It takes part with this `nRanks`, and the id where it is the root.
    Joins {
        nranks: usize,
        id: Option<[u8; NCCL_UNIQUE_ID_BYTES]>,
    },
    /// Its arguments were refused, for this reason: the grow cannot go on.
    Refuses(String),
}

const JOINS: u8 = 0;
const REFUSES: u8 = 1;

impl Word {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Word::Joins { nranks, id } => {
                let mut b = vec![JOINS];
                b.extend_from_slice(&(*nranks as u32).to_le_bytes());
                b.push(id.is_some() as u8);
                if let Some(id) = id {
                    b.extend_from_slice(id);
                }
                b
            }
            Word::Refuses(why) => {
                let mut b = vec![REFUSES];
                b.extend_from_slice(why.as_bytes());
                b
            }
        }
    }

    /// Reads `from`'s word.
    pub fn decode(from: usize, b: &[u8]) -> Result<Word> {
        let bad = || {
            Error::internal(format!(
                "rank {from} sent {} bytes, not a grow's word (ncclCommGrow)",
                b.len()
            ))
        };
        match b.first() {
            Some(&JOINS) if b.len() == 6 || b.len() == 6 + NCCL_UNIQUE_ID_BYTES => {
                let nranks = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")) as usize;
                let id = match (b[5], b.len()) {
                    (0, 6) => None,
                    (1, _) if b.len() > 6 => Some(b[6..].try_into().expect("an id's bytes")),
                    _ => return Err(bad()),
                };
                Ok(Word::Joins { nranks, id })
            }
            Some(&REFUSES) => Ok(Word::Refuses(String::from_utf8_lossy(&b[1..]).into_owned())),
            _ => Err(bad()),
        }
    }
}

/// The error of a refusal by rank `from`, as its peers report it.
fn refused(from: usize, why: &str) -> Error {
    Error::invalid_usage(format!("rank {from} refused the grow: {why}"))
}

/// What the existing ranks agree on from their words (by parent rank): the new size and the id. Every
/// rank holds the same words, so every rank gets the same answer, or the same error.
pub fn agree(words: &[Word]) -> Result<(usize, UniqueId)> {
    let mut joined = Vec::with_capacity(words.len());
    for (r, w) in words.iter().enumerate() {
        match w {
            Word::Joins { nranks, id } => joined.push((r, *nranks, id.as_ref())),
            Word::Refuses(why) => return Err(refused(r, why)),
        }
    }
    let nranks = joined.first().map_or(0, |j| j.1);
    if joined.iter().any(|j| j.1 != nranks) {
        let each: Vec<String> = joined.iter().map(|(r, n, _)| format!("rank {r}: {n}")).collect();
        return Err(Error::invalid_argument(format!(
            "the existing ranks pass different nRanks ({}); every rank passes the new size",
            each.join(", ")
        )));
    }
    let roots: Vec<(usize, &[u8; NCCL_UNIQUE_ID_BYTES])> =
        joined.iter().filter_map(|(r, _, id)| id.map(|id| (*r, id))).collect();
    let (root, bytes) = match roots[..] {
        [one] => one,
        [] => {
            return Err(Error::invalid_argument(
                "no existing rank passed uniqueId; the rank whose ncclCommGetUniqueId made the id \
                 passes it, the others NULL",
            ));
        }
        _ => {
            let ranks: Vec<usize> = roots.iter().map(|(r, _)| *r).collect();
            return Err(Error::invalid_argument(format!(
                "{} each passed a uniqueId; only the rank that made it with ncclCommGetUniqueId \
                 passes it, the others NULL",
                crate::bootstrap::list_ranks(&ranks)
            )));
        }
    };
    let grow = GrowId::from_bytes(bytes)
        .map_err(|e| Error::internal(format!("ncclCommGrow: rank {root}'s id: {}", e.message)))?;
    if grow.parent_nranks != words.len() {
        return Err(Error::internal(format!(
            "ncclCommGrow: rank {root}'s id was made for a communicator of {} ranks, not this one of {}",
            grow.parent_nranks,
            words.len()
        )));
    }
    Ok((nranks, grow.id))
}

/// An existing rank's first step, when it calls: its word goes into the exchange of every rank's
/// (`split::exchange`, up and down the tree of neighbours, within `timeout`), which it leaves at once.
pub fn announce(parent: &Arc<Communicator>, count: u64, word: &Word, timeout: Duration) -> Result<Exchange> {
    exchange(
        parent,
        tag(count, GROW_WORDS),
        word.encode(),
        Some(Instant::now() + timeout),
    )
}

/// The rest of an existing rank's grow, after `announce` of `mine`: the others' words, then the new
/// communicator, in which this rank keeps its rank.
pub fn grow_job(parent: Arc<Communicator>, words: Exchange, mine: Word, timeout: Duration) -> Job {
    Box::new(move || {
        let b = parent.bootstrap();
        let (me, n) = (b.rank(), b.nranks());
        let gathered = words.wait()?;
        let mut words = Vec::with_capacity(n);
        for (peer, got) in gathered.iter().enumerate() {
            let word = if peer == me {
                mine.clone()
            } else {
                Word::decode(peer, got)?
            };
            // The first refusal, by rank, ends the grow; the later ranks' words do not matter.
            if let Word::Refuses(why) = &word {
                return Err(refused(peer, why));
            }
            words.push(word);
        }
        let (nranks, id) = agree(&words)?;
        log::info!(
            "ncclCommGrow: rank {me} of {nranks} (the parent's {n} and {} new)",
            nranks - n
        );
        Communicator::init_by_id(nranks, &id, me, timeout)
    })
}

fn id_bytes(id: &ncclUniqueId) -> [u8; NCCL_UNIQUE_ID_BYTES] {
    crate::abi::id_bytes(&id.internal)
}

nccl_export! {
    /// Makes the id new ranks pass to `ncclCommGrow`, on the one existing rank that will be the grow's
    /// root: a bootstrap root in this process (also where `NCCL_COMM_ID` is set), which waits for the
    /// ranks as long as `ncclGetUniqueId`'s does. One id at a time per communicator: another is refused
    /// (`ncclInvalidUsage`) until a grow has taken this one, or its root has given up waiting.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        with_comm("ncclCommGetUniqueId", comm, |c| {
            non_null_args!(uniqueId);
            let (_, nranks) = c.place()?;
            c.usable()?;
            let mut pending = c.grow_id();
            if let Some(made) = pending.as_ref() {
                let age = made.made.elapsed();
                if age < TIMEOUT {
                    return Err(Error::invalid_usage(format!(
                        "this comm's id, made {:.1} s ago, has not been used by a grow yet: \
                         one id at a time (ncclCommGrow takes it)",
                        age.as_secs_f64()
                    )));
                }
                log::info!(
                    "ncclCommGetUniqueId: the id made {:.0} s ago was never used (its root has given up); a new one \
                     replaces it",
                    age.as_secs_f64()
                );
            }
            let grow = GrowId {
                id: UniqueId::create(TIMEOUT)?,
                parent_nranks: nranks,
            };
            let bytes = grow.to_bytes();
            *pending = Some(MadeId {
                bytes,
                made: Instant::now(),
            });
            // SAFETY: checked non-null; the caller provides a writable ncclUniqueId.
            let out = unsafe { &mut *uniqueId };
            crate::abi::write_id_bytes(&mut out.internal, &bytes);
            OK
        })
    }
}

nccl_export! {
    /// A communicator of `nRanks` ranks: the parent's ranks (`comm`, `rank` -1; `uniqueId` the id of
    /// `ncclCommGetUniqueId` on the rank that made it, NULL on the others) keep their ranks, the new ones
    /// (`comm` NULL, `uniqueId` that id, `rank` in `[parent size, nRanks)`) take the ranks after them.
    /// The parent is untouched. Blocking or not as the config says (an existing rank without one: the
    /// parent's mode; a new rank: as `ncclCommInitRankConfig`); inside a group, made at its end. The
    /// root's grow takes the id, whatever its outcome. See `grow.rs`. Refused (`ncclInvalidUsage`) where
    /// NVIDIA's library carries every call of the parent (`MSCCLPP_NCCL_FALLBACK`, ranks on several
    /// hosts).
    fn ncclCommGrow / pncclCommGrow(
        comm: ncclComm_t,
        nRanks: c_int,
        uniqueId: *const ncclUniqueId,
        rank: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        if comm.is_null() {
            // SAFETY: nccl.h's contract for each argument.
            return entry("ncclCommGrow", || unsafe { join(nRanks, uniqueId, rank, newcomm, config) });
        }
        with_comm("ncclCommGrow", comm, |c| {
            // SAFETY: nccl.h's contract for each argument.
            unsafe { grow_existing(c, nRanks, uniqueId, rank, newcomm, config) }
        })
    }
}

/// A new rank's `ncclCommGrow`: an initialisation with the grow's id, once its rank is checked against
/// the parent's size the id carries.
///
/// # Safety
/// nccl.h's contract: `uniqueId` NULL or an id, `newcomm` NULL or writable, `config` NULL or a config.
unsafe fn join(
    nranks: c_int,
    unique_id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> Result<ncclResult_t> {
    ensure_arg!(
        !unique_id.is_null(),
        "comm and uniqueId are both NULL: an existing rank passes its comm, a new rank the id made by \
         ncclCommGetUniqueId"
    );
    non_null_args!(newcomm);
    // SAFETY: checked non-null.
    unsafe { *newcomm = std::ptr::null_mut() };
    // SAFETY: checked non-null; the caller's id.
    let grow = GrowId::from_bytes(&id_bytes(unsafe { &*unique_id }))?;
    let parent = grow.parent_nranks;
    check_nranks(nranks, parent)?;
    ensure_arg!(
        rank >= 0 && (rank as usize) >= parent && rank < nranks,
        "rank is {rank}; a new rank (comm NULL) takes a rank in [{parent}, nRanks = {nranks}): the parent's \
         ranks keep 0 to {}",
        parent - 1
    );
    let blocking_default = crate::settings::NCCL_COMM_BLOCKING.flag();
    // SAFETY: nccl.h's contract: NULL or the caller's config.
    let cfg = unsafe { config::read(config, blocking_default) }?;
    let (nranks, rank) = (nranks as usize, rank as usize);
    let gpu = GpuContext::current_if_any();
    let comm = NcclComm::pending(rank, nranks, current_device(gpu), cfg.name);
    comm.set_blocking(cfg.blocking);
    comm.set_cta_limit(cfg.max_ctas);
    log::info!("ncclCommGrow: a new rank {rank} of {nranks} (the parent has {parent})");
    let id = grow.id;
    let job: Job = Box::new(move || Communicator::init_by_id(nranks, &id, rank, TIMEOUT));
    // SAFETY: checked non-null.
    unsafe { start(newcomm, comm, gpu, cfg.blocking, job) }
}

fn check_nranks(nranks: c_int, parent: usize) -> Result<()> {
    ensure_arg!(
        nranks > 0 && (nranks as usize) > parent,
        "nRanks is {nranks}; a grow of a communicator of {parent} ranks makes a larger one"
    );
    ensure_arg!(
        nranks as usize <= MAX_RANKS,
        "nRanks is {nranks}; at most {MAX_RANKS} ranks are supported"
    );
    Ok(())
}

/// An existing rank's `ncclCommGrow`.
///
/// # Safety
/// As `join`.
unsafe fn grow_existing(
    c: &Arc<NcclComm>,
    nranks: c_int,
    unique_id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> Result<ncclResult_t> {
    let parent = c.usable()?;
    let count = c.next_grow();
    // From here on the rank sends its word whatever happens: its peers wait for it.
    // SAFETY: the caller's contract.
    let checked = unsafe { check_existing(c, parent.nranks(), nranks, unique_id, rank, newcomm, config) };
    let (nranks, id, cfg) = match checked {
        Ok(ok) => ok,
        Err(e) => {
            if let Err(sending) = announce(&parent, count, &Word::Refuses(e.message.clone()), TIMEOUT) {
                log::info!(
                    "ncclCommGrow: telling the other ranks of the refusal: {}",
                    sending.message
                );
            }
            return Err(e);
        }
    };
    let mine = Word::Joins { nranks, id };
    let words = announce(&parent, count, &mine, TIMEOUT)?;
    let place = Some((parent.rank(), nranks));
    let job = grow_job(parent, words, mine, TIMEOUT);
    // SAFETY: checked non-null by `check_existing`.
    unsafe { start_child(c, newcomm, place, cfg, job) }
}

/// An existing rank's arguments: the new size, the id where this rank is the root (taken from the
/// communicator once every check has passed), the config.
///
/// # Safety
/// As `join`.
unsafe fn check_existing(
    c: &NcclComm,
    parent: usize,
    nranks: c_int,
    unique_id: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> Result<(usize, Option<[u8; NCCL_UNIQUE_ID_BYTES]>, config::Config)> {
    non_null_args!(newcomm);
    // SAFETY: checked non-null.
    unsafe { *newcomm = std::ptr::null_mut() };
    ensure_arg!(
        rank == -1,
        "rank is {rank}; an existing rank (comm given) keeps its rank and passes -1"
    );
    check_nranks(nranks, parent)?;
    // SAFETY: nccl.h's contract: NULL or the caller's config.
    let cfg = unsafe { child_config(c, config) }?;
    let mut pending = c.grow_id();
    let id = if unique_id.is_null() {
        ensure_arg!(
            pending.is_none(),
            "uniqueId is NULL, but this rank made an id with ncclCommGetUniqueId: it is the grow's root and passes \
             that id"
        );
        None
    } else {
        // SAFETY: checked non-null; the caller's id.
        let given = id_bytes(unsafe { &*unique_id });
        let made = pending.as_ref().ok_or_else(|| {
            Error::invalid_argument(
                "uniqueId is given, but ncclCommGetUniqueId made no id on this comm (or a grow took it): only the \
                 rank that made the id passes it, the others NULL",
            )
        })?;
        ensure_arg!(
            made.bytes == given,
            "uniqueId is not the id ncclCommGetUniqueId made on this comm"
        );
        pending.take();
        Some(given)
    };
    Ok((nranks as usize, id, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn an_id(parent_nranks: usize) -> GrowId {
        GrowId {
            id: UniqueId {
                root: "10.0.0.7:4321".parse().unwrap(),
                magic: 0x1234_5678_9abc_def0,
            },
            parent_nranks,
        }
    }

    #[test]
    fn grow_ids_round_trip_and_others_are_refused() {
        let g = an_id(3);
        assert_eq!(GrowId::from_bytes(&g.to_bytes()).unwrap(), g);
        // An id of ncclGetUniqueId (no mark), zeros, a mark without a root, a size of 0.
        let plain = g.id.to_bytes();
        let mut unmarked_root = [0u8; 128];
        unmarked_root[MARK_AT..SIZE_AT].copy_from_slice(&MARK);
        unmarked_root[SIZE_AT] = 2;
        let mut empty_parent = g.to_bytes();
        empty_parent[SIZE_AT] = 0;
        for (what, bytes) in [
            ("a plain id", plain),
            ("zeros", [0u8; 128]),
            ("no root", unmarked_root),
            ("no parent", empty_parent),
        ] {
            let e = GrowId::from_bytes(&bytes).expect_err(what);
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}");
            assert!(e.message.contains("uniqueId"), "{what}: {}", e.message);
        }
        let e = GrowId::from_bytes(&plain).unwrap_err();
        assert!(e.message.contains("not made by ncclCommGetUniqueId"), "{}", e.message);
        // A grow's id is not a plain one.
        assert!(UniqueId::from_bytes(&g.to_bytes(), "uniqueId", "ncclGetUniqueId").is_err());
    }

    #[test]
    fn words_round_trip_and_garbage_is_refused() {
        let id = an_id(2).to_bytes();
        for w in [
            Word::Joins { nranks: 5, id: None },
            Word::Joins {
                nranks: 3,
                id: Some(id),
            },
            Word::Refuses("nRanks is 2; ...".into()),
        ] {
            assert_eq!(Word::decode(1, &w.encode()).unwrap(), w);
        }
        for bad in [
            &[][..],
            &[7],
            &[JOINS, 1, 0],
            &[JOINS, 4, 0, 0, 0, 1],
            &[JOINS, 4, 0, 0, 0, 2],
        ] {
            let e = Word::decode(3, bad).unwrap_err();
            assert!(e.message.contains("rank 3 sent"), "{}", e.message);
        }
    }

    #[test]
    fn the_ranks_agree_on_one_id_and_one_size_or_all_fail_alike() {
        let id = an_id(3);
        let joins = |nranks, root: bool| Word::Joins {
            nranks,
            id: root.then(|| id.to_bytes()),
        };
        let (nranks, got) = agree(&[joins(5, false), joins(5, true), joins(5, false)]).unwrap();
        assert_eq!((nranks, got), (5, id.id.clone()));

        let cases: [(&str, Vec<Word>, ErrorKind, &str); 5] = [
            (
                "no root",
                vec![joins(5, false), joins(5, false), joins(5, false)],
                ErrorKind::InvalidArgument,
                "no existing rank passed uniqueId",
            ),
            (
                "two roots",
                vec![joins(5, true), joins(5, false), joins(5, true)],
                ErrorKind::InvalidArgument,
                "ranks 0, 2 each passed a uniqueId",
            ),
            (
                "sizes differ",
                vec![joins(5, true), joins(4, false), joins(5, false)],
                ErrorKind::InvalidArgument,
                "different nRanks (rank 0: 5, rank 1: 4, rank 2: 5)",
            ),
            (
                "a refusal",
                vec![joins(5, true), Word::Refuses("rank is 3; ...".into()), joins(5, false)],
                ErrorKind::InvalidUsage,
                "rank 1 refused the grow: rank is 3",
            ),
            (
                "an id of another communicator",
                vec![joins(5, false), joins(5, true)],
                ErrorKind::Internal,
                "made for a communicator of 3 ranks, not this one of 2",
            ),
        ];
        for (what, words, kind, text) in cases {
            let e = agree(&words).expect_err(what);
            assert_eq!(e.kind, kind, "{what}");
            assert!(e.message.contains(text), "{what}: {}", e.message);
        }
    }

    #[test]
    fn nranks_must_grow() {
        check_nranks(3, 2).unwrap();
        for bad in [2, 1, 0, -1, MAX_RANKS as c_int + 1] {
            let e = check_nranks(bad, 2).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains(&format!("nRanks is {bad}")), "{}", e.message);
        }
    }

    use crate::nccl::split::tests::{T, job};

    #[test]
    fn two_ranks_grow_to_four_and_the_parent_still_works() {
        let parent = job(2);
        let grow = GrowId {
            id: UniqueId::create(T).unwrap(),
            parent_nranks: 2,
        };
        let root = 1;
        let places: Vec<(usize, usize)> = std::thread::scope(|s| {
            let all: Vec<_> = (0..4)
                .map(|r| {
                    let (parent, grow) = (&parent, &grow);
                    s.spawn(move || {
                        let new = if r < 2 {
                            let mine = Word::Joins {
                                nranks: 4,
                                id: (r == root).then(|| grow.to_bytes()),
                            };
                            let words = announce(&parent[r], 0, &mine, T).unwrap();
                            grow_job(parent[r].clone(), words, mine, T)().unwrap()
                        } else {
                            Communicator::init_by_id(4, &grow.id, r, T).unwrap()
                        };
                        // The new communicator works: a gather of every rank's number over its bootstrap.
                        let mut all = vec![0u8; 4];
                        all[new.rank()] = 10 + r as u8;
                        new.bootstrap().all_gather(&mut all, 1).unwrap();
                        assert_eq!(all, vec![10, 11, 12, 13], "rank {r}");
                        (new.rank(), new.nranks())
                    })
                })
                .collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(places, vec![(0, 4), (1, 4), (2, 4), (3, 4)]);
        std::thread::scope(|s| {
            for p in &parent {
                s.spawn(move || p.bootstrap().barrier().unwrap());
            }
        });
    }

    #[test]
    fn a_grow_of_many_ranks_opens_no_connection_beyond_the_neighbours() {
        const N: usize = 64;
        let parent = job(N);
        let grow = GrowId {
            id: UniqueId::create(T).unwrap(),
            parent_nranks: N,
        };
        let root = 45;
        let places: Vec<(usize, usize)> = std::thread::scope(|s| {
            let all: Vec<_> = (0..N + 2)
                .map(|r| {
                    let (parent, grow) = (&parent, &grow);
                    s.spawn(move || {
                        let new = if r < N {
                            let mine = Word::Joins {
                                nranks: N + 2,
                                id: (r == root).then(|| grow.to_bytes()),
                            };
                            let words = announce(&parent[r], 0, &mine, T).unwrap();
                            grow_job(parent[r].clone(), words, mine, T)().unwrap()
                        } else {
                            Communicator::init_by_id(N + 2, &grow.id, r, T).unwrap()
                        };
                        (new.rank(), new.nranks())
                    })
                })
                .collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(places, (0..N + 2).map(|r| (r, N + 2)).collect::<Vec<_>>());
        // The words went up and down the tree of neighbours: where each rank sent its word to every other,
        // each would hold n - 1 = 63 connections.
        for p in &parent {
            let b = p.bootstrap();
            let beyond = crate::nccl::split::tests::beyond_neighbours(b);
            assert!(beyond.is_empty(), "rank {}: beyond its neighbours {beyond:?}", b.rank());
        }
    }

    #[test]
    fn a_refusing_rank_ends_its_peers_grow_at_once() {
        let parent = job(3);
        let id = an_id(3).to_bytes();
        let started = Instant::now();
        let errors: Vec<Error> = std::thread::scope(|s| {
            let all: Vec<_> = (0..3)
                .map(|r| {
                    let parent = &parent;
                    s.spawn(move || {
                        let mine = match r {
                            0 => Word::Joins {
                                nranks: 5,
                                id: Some(id),
                            },
                            1 => Word::Refuses("rank is 7; an existing rank passes -1".into()),
                            _ => Word::Joins { nranks: 5, id: None },
                        };
                        let words = announce(&parent[r], 0, &mine, T).unwrap();
                        grow_job(parent[r].clone(), words, mine, T)().err().expect("refused")
                    })
                })
                .collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(started.elapsed() < T / 2, "nobody waited for a timeout");
        for (r, e) in errors.iter().enumerate() {
            assert!(
                e.message.contains("rank 1 refused the grow: rank is 7"),
                "rank {r}: {}",
                e.message
            );
        }
    }
}
