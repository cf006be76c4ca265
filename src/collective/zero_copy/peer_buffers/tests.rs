//! The peers' table: opens, replacements, shared allocations, held closes, stale and refused records (with
//! a fake opener, no GPU), and records pushed through the bootstrap between in-process ranks.

use super::*;
use crate::collective::zero_copy::records::tests::{added, exported, gone};
use crate::collective::zero_copy::records::{FORMAT_VERSION, KIND_GONE, publish};
use crate::error::ErrorKind;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// What the fake opener saw: every open's arguments, and every mapping closed, by id.
#[derive(Default)]
struct Log {
    opened: RefCell<Vec<(usize, Vec<u8>, u64)>>,
    closed: RefCell<Vec<u64>>,
}

/// A mapping that records its close.
struct FakeMapping {
    id: u64,
    log: Rc<Log>,
}

impl Drop for FakeMapping {
    fn drop(&mut self) {
        self.log.closed.borrow_mut().push(self.id);
    }
}

/// Maps allocation `n` (counting opens from 1) at `0x7f00_0000_0000 + (n << 32)`; fails while `fail` is set.
struct FakeOpener {
    log: Rc<Log>,
    fail: Cell<bool>,
    next: Cell<u64>,
}

impl FakeOpener {
    fn new() -> (FakeOpener, Rc<Log>) {
        let log = Rc::new(Log::default());
        let opener = FakeOpener {
            log: log.clone(),
            fail: Cell::new(false),
            next: Cell::new(1),
        };
        (opener, log)
    }
}

fn base_of(id: u64) -> u64 {
    0x7f00_0000_0000 + (id << 32)
}

impl Opener for FakeOpener {
    type Mapping = FakeMapping;
    fn open(&self, peer: usize, handle: &[u8], alloc_size: u64) -> Result<(FakeMapping, u64)> {
        self.log.opened.borrow_mut().push((peer, handle.to_vec(), alloc_size));
        if self.fail.get() {
            return Err(Error::cuda("cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (fake)"));
        }
        let id = self.next.get();
        self.next.set(id + 1);
        Ok((
            FakeMapping {
                id,
                log: self.log.clone(),
            },
            base_of(id),
        ))
    }
}

fn table(rank: usize, nranks: usize) -> (PeerTable<FakeOpener>, Rc<Log>) {
    let (opener, log) = FakeOpener::new();
    (PeerTable::new(rank, nranks, opener).unwrap(), log)
}

fn closed(log: &Log) -> Vec<u64> {
    log.closed.borrow().clone()
}

#[test]
fn added_opens_and_resolves_only_the_exact_generation() {
    let (mut t, log) = table(0, 4);
    t.apply(2, added(5, 3)).unwrap();
    assert_eq!(*log.opened.borrow(), [(2, vec![5u8; 64], 1 << 20)]);
    let address = base_of(1) + 0x200;
    assert_eq!(t.resolve(2, 5, 3), Some(address), "mapped base plus the offset");
    assert_eq!(t.resolve(2, 5, 2), None, "older generation");
    assert_eq!(t.resolve(2, 5, 4), None, "newer generation");
    assert_eq!(t.resolve(1, 5, 3), None, "another peer");
    assert_eq!(t.resolve(2, 4, 3), None, "another slot");
    assert_eq!(t.resolve(0, 5, 3), None, "this rank");
    assert_eq!(t.resolve(9, 5, 3), None, "no such peer");
    assert_eq!(t.resolve(2, MAX_SLOTS as u32, 3), None, "no such slot");
    assert_eq!(t.device_entries(), [(2, 5, 3, address)]);
}

#[test]
fn a_newer_added_replaces_and_closes_the_old_mapping() {
    let (mut t, log) = table(1, 2);
    t.apply(0, added(0, 1)).unwrap();
    t.apply(0, added(0, 2)).unwrap();
    assert_eq!(closed(&log), [1], "generation 1's mapping closed");
    assert_eq!(t.resolve(0, 0, 1), None);
    assert_eq!(t.resolve(0, 0, 2), Some(base_of(2) + 0x200));
    assert_eq!(t.len(), 1);
}

#[test]
fn registrations_in_one_allocation_share_its_mapping() {
    let (mut t, log) = table(1, 3);
    let in_one = |slot: u32, generation: u32, offset: u64| {
        Record::Added(Exported {
            offset_in_allocation: offset,
            buffer_id: 7,
            ..exported(slot, generation)
        })
    };
    t.apply(0, in_one(0, 1, 0x200)).unwrap();
    t.apply(0, in_one(1, 1, 0x4000)).unwrap();
    t.apply(2, in_one(0, 1, 0x200)).unwrap();
    assert_eq!(
        log.opened.borrow().len(),
        2,
        "peer 0's allocation opened once, peer 2's once"
    );
    assert_eq!(t.resolve(0, 0, 1), Some(base_of(1) + 0x200));
    assert_eq!(
        t.resolve(0, 1, 1),
        Some(base_of(1) + 0x4000),
        "the same mapping, another offset"
    );
    t.apply(0, gone(0, 1)).unwrap();
    assert!(closed(&log).is_empty(), "still used by slot 1");
    t.apply(0, gone(1, 1)).unwrap();
    assert_eq!(closed(&log), [1], "closed with its last registration");
    // Opened afresh once closed.
    t.apply(0, in_one(0, 2, 0x200)).unwrap();
    assert_eq!(log.opened.borrow().len(), 3);
}

#[test]
fn held_closes_wait_until_released() {
    let (mut t, log) = table(1, 2);
    t.hold_closes();
    t.apply(0, added(0, 1)).unwrap();
    t.apply(0, added(0, 2)).unwrap();
    t.apply(0, added(1, 1)).unwrap();
    t.apply(0, gone(1, 1)).unwrap();
    assert!(
        closed(&log).is_empty(),
        "replaced and gone mappings stay open while kernels may read them"
    );
    assert!(t.has_retired());
    assert_eq!(t.resolve(0, 0, 1), None, "a retired mapping is no longer resolved");
    assert_eq!(t.resolve(0, 1, 1), None);
    assert_eq!(t.resolve(0, 0, 2), Some(base_of(2) + 0x200));
    assert_eq!(t.device_entries().len(), 1);
    assert_eq!(t.release_retired(), 2);
    assert_eq!(closed(&log), [1, 3]);
    assert!(!t.has_retired());
    t.apply(0, gone(0, 2)).unwrap();
    assert_eq!(t.clear(), 1, "clear closes the retired ones too");
    assert_eq!(closed(&log), [1, 3, 2]);
}

#[test]
fn stale_added_is_ignored() {
    let (mut t, log) = table(1, 2);
    t.apply(0, added(3, 5)).unwrap();
    t.apply(0, added(3, 5)).unwrap();
    t.apply(0, added(3, 4)).unwrap();
    assert_eq!(
        log.opened.borrow().len(),
        1,
        "neither the same nor an older generation is opened"
    );
    assert!(closed(&log).is_empty());
    assert_eq!(t.resolve(0, 3, 5), Some(base_of(1) + 0x200));
    // After its Gone, a late Added of the same generation does not map it again.
    t.apply(0, gone(3, 5)).unwrap();
    t.apply(0, added(3, 5)).unwrap();
    assert_eq!(log.opened.borrow().len(), 1);
    assert_eq!(t.resolve(0, 3, 5), None);
}

#[test]
fn gone_drops_only_the_held_generation() {
    let (mut t, log) = table(0, 3);
    t.apply(1, added(2, 4)).unwrap();
    t.apply(1, gone(2, 3)).unwrap();
    t.apply(1, gone(2, 5)).unwrap();
    t.apply(2, gone(2, 4)).unwrap();
    assert!(
        closed(&log).is_empty(),
        "another generation's or another peer's Gone is ignored"
    );
    assert_eq!(t.resolve(1, 2, 4), Some(base_of(1) + 0x200));
    t.apply(1, gone(2, 4)).unwrap();
    assert_eq!(closed(&log), [1]);
    assert_eq!(t.resolve(1, 2, 4), None);
    assert!(t.is_empty());
    t.apply(1, gone(2, 4)).unwrap();
    assert_eq!(closed(&log), [1], "a repeated Gone closes nothing more");
    // The slot is reused at a newer generation.
    t.apply(1, added(2, 5)).unwrap();
    assert_eq!(t.resolve(1, 2, 5), Some(base_of(2) + 0x200));
}

#[test]
fn a_failed_open_leaves_the_slot_empty_and_reports_the_error() {
    let (mut t, log) = table(0, 2);
    t.apply(1, added(7, 1)).unwrap();
    t.opener.fail.set(true);
    let e = t.apply(1, added(7, 2)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cuda);
    assert!(e.message.contains("cuIpcOpenMemHandle"), "{}", e.message);
    assert_eq!(closed(&log), [1], "the superseded mapping is closed all the same");
    assert_eq!(t.resolve(1, 7, 1), None);
    assert_eq!(t.resolve(1, 7, 2), None);
    assert!(t.device_entries().is_empty());
    let e = t.apply(1, added(8, 1)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Cuda);
    assert_eq!(t.resolve(1, 8, 1), None);
    // A later generation opens again once the opener works.
    t.opener.fail.set(false);
    t.apply(1, added(7, 3)).unwrap();
    assert_eq!(t.resolve(1, 7, 3), Some(base_of(2) + 0x200));
}

#[test]
fn a_mapping_that_would_overflow_is_refused() {
    struct AtTheTop;
    impl Opener for AtTheTop {
        type Mapping = ();
        fn open(&self, _: usize, _: &[u8], _: u64) -> Result<((), u64)> {
            Ok(((), u64::MAX - 0x100))
        }
    }
    let mut t = PeerTable::new(0, 2, AtTheTop).unwrap();
    let e = t.apply(1, added(0, 1)).unwrap_err();
    assert!(e.message.contains("overflows"), "{}", e.message);
    assert_eq!(t.resolve(1, 0, 1), None);
}

#[test]
fn every_mapping_is_closed_exactly_once() {
    let (mut t, log) = table(0, 4);
    t.apply(1, added(0, 1)).unwrap(); // 1: replaced
    t.apply(1, added(0, 2)).unwrap(); // 2: gone
    t.apply(2, added(0, 1)).unwrap(); // 3: cleared
    t.apply(3, added(9, 1)).unwrap(); // 4: cleared
    t.apply(1, gone(0, 2)).unwrap();
    assert_eq!(closed(&log), [1, 2]);
    assert_eq!(t.clear(), 2);
    assert_eq!(closed(&log), [1, 2, 3, 4]);
    assert_eq!(t.clear(), 0);
    t.apply(2, added(0, 1)).unwrap();
    assert_eq!(
        log.opened.borrow().len(),
        4,
        "generations are kept across clear: a late Added is stale"
    );
    t.apply(3, added(9, 2)).unwrap(); // 5: dropped with the table
    drop(t);
    assert_eq!(closed(&log), [1, 2, 3, 4, 5]);
}

#[test]
fn device_entries_are_by_peer_then_slot() {
    let (mut t, _log) = table(1, 4);
    t.apply(3, added(1, 1)).unwrap();
    t.apply(0, added(63, 2)).unwrap();
    t.apply(2, added(4, 1)).unwrap();
    t.apply(0, added(2, 9)).unwrap();
    t.apply(3, added(0, 1)).unwrap();
    let entries = t.device_entries();
    let keys: Vec<_> = entries.iter().map(|&(p, s, g, _)| (p, s, g)).collect();
    assert_eq!(keys, [(0, 2, 9), (0, 63, 2), (2, 4, 1), (3, 0, 1), (3, 1, 1)]);
    for (peer, slot, generation, address) in entries {
        assert_eq!(t.resolve(peer, slot, generation), Some(address));
    }
}

#[test]
fn own_rank_and_out_of_range_arguments_are_refused() {
    let (mut t, log) = table(1, 3);
    let e = t.apply(1, added(0, 1)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("peer 1 is this rank"), "{}", e.message);
    let e = t.apply(3, added(0, 1)).unwrap_err();
    assert!(e.message.contains("peer 3 out of range for nranks 3"), "{}", e.message);
    let e = t.apply(0, added(MAX_SLOTS as u32, 1)).unwrap_err();
    assert!(e.message.contains("slot 64 of peer 0 out of range"), "{}", e.message);
    let e = t.apply(0, gone(u32::MAX, 1)).unwrap_err();
    assert!(e.message.contains("slot 4294967295"), "{}", e.message);
    let e = t.apply(0, added(0, 0)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("from peer 0") && e.message.contains("generation 0"),
        "{}",
        e.message
    );
    assert!(log.opened.borrow().is_empty(), "nothing opened for refused records");

    let (opener, _) = FakeOpener::new();
    let e = PeerTable::new(2, 2, opener).err().unwrap();
    assert!(e.message.contains("rank 2 out of range for nranks 2"), "{}", e.message);
    let (opener, _) = FakeOpener::new();
    let e = PeerTable::new(0, MAX_RANKS + 1, opener).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidUsage);
    assert!(e.message.contains("at most 16 ranks"), "{}", e.message);
}

// ---- pushed through the bootstrap: several in-process ranks ----

/// A job of `n` in-process ranks (their root is done once all have arrived).
fn job(n: usize) -> Vec<Bootstrap> {
    use crate::bootstrap::PROTOCOL_MAGIC;
    use crate::bootstrap::tests::{T, local_root, on_ranks};
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    on_ranks(n, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, n, T).unwrap())
}

/// Absorbs into `t` until it holds `peer`'s `slot` at `generation`, waiting up to 5 s.
fn absorb_until_held(t: &mut PeerTable<FakeOpener>, b: &Bootstrap, peer: usize, slot: u32, generation: u32) {
    let start = std::time::Instant::now();
    while t.resolve(peer, slot, generation).is_none() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "rank {}: peer {peer}'s slot {slot} generation {generation} not held after 5 s",
            b.rank()
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.absorb(b);
    }
}

/// Absorbs into `t` until `n` records were applied, waiting up to 5 s for them to arrive.
fn absorb_until(t: &mut PeerTable<FakeOpener>, b: &Bootstrap, n: usize) -> usize {
    let start = std::time::Instant::now();
    let mut applied = t.absorb(b);
    while applied < n {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "rank {}: {applied} of {n} records applied after 5 s",
            b.rank()
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
        applied += t.absorb(b);
    }
    applied
}

#[test]
fn published_records_are_absorbed_by_every_peer() {
    let bs = job(3);
    let mut tables: Vec<_> = (0..3).map(|r| table(r, 3)).collect();
    publish(&bs[0], &added(0, 1)).unwrap();
    for r in [1, 2] {
        let (t, log) = &mut tables[r];
        assert_eq!(absorb_until(t, &bs[r], 1), 1);
        assert_eq!(*log.opened.borrow(), [(0, vec![0u8; 64], 1 << 20)], "rank {r}");
        assert_eq!(t.resolve(0, 0, 1), Some(base_of(1) + 0x200), "rank {r}");
    }
    assert_eq!(tables[0].0.absorb(&bs[0]), 0, "nothing to self");
    publish(&bs[0], &gone(0, 1)).unwrap();
    for r in [1, 2] {
        let (t, log) = &mut tables[r];
        assert_eq!(absorb_until(t, &bs[r], 1), 1);
        assert_eq!(t.resolve(0, 0, 1), None, "rank {r}");
        assert_eq!(closed(log), [1], "rank {r}");
        assert!(t.is_empty());
        assert_eq!(t.absorb(&bs[r]), 0, "absorbed once");
    }
}

#[test]
fn a_registration_that_ended_before_it_was_taken_is_never_opened() {
    let records = vec![
        (0, added(1, 1)),
        (1, added(1, 1)),
        (0, added(2, 1)),
        (0, gone(1, 1)),
        (0, added(1, 2)),
    ];
    let kept = without_finished(records);
    let kept: Vec<_> = kept
        .iter()
        .map(|(p, r)| (*p, r.slot(), r.generation(), matches!(r, Record::Gone { .. })))
        .collect();
    // Peer 0's slot 1 generation 1 came and went; peer 1's namesake and peer 0's next generation stay.
    assert_eq!(
        kept,
        [(1, 1, 1, false), (0, 2, 1, false), (0, 1, 1, true), (0, 1, 2, false)]
    );
    // A Gone before its Added (of another batch's registration) drops nothing.
    let kept = without_finished(vec![(0, gone(1, 1)), (0, added(1, 1))]);
    assert_eq!(kept.len(), 2);
}

#[test]
fn records_of_different_ranks_are_kept_apart() {
    let bs = job(3);
    publish(&bs[0], &added(4, 1)).unwrap();
    publish(&bs[1], &added(4, 5)).unwrap();
    let (mut t, log) = table(2, 3);
    assert_eq!(absorb_until(&mut t, &bs[2], 2), 2);
    let mut opened: Vec<usize> = log.opened.borrow().iter().map(|o| o.0).collect();
    opened.sort();
    assert_eq!(opened, [0, 1], "one open per peer");
    assert!(t.resolve(0, 4, 1).is_some() && t.resolve(1, 4, 5).is_some());
    assert_eq!(t.resolve(0, 4, 5), None, "rank 1's generation is not rank 0's");
    assert_eq!(t.resolve(1, 4, 1), None);
    // Ranks 0 and 1 each hear of the other's only.
    for (r, peer, generation) in [(0, 1, 5), (1, 0, 1)] {
        let (mut t, _log) = table(r, 3);
        assert_eq!(absorb_until(&mut t, &bs[r], 1), 1);
        assert_eq!(t.device_entries(), [(peer, 4, generation, base_of(1) + 0x200)]);
    }
}

#[test]
fn a_burst_is_applied_in_the_order_it_was_published() {
    let bs = job(3);
    for record in [added(0, 1), gone(0, 1), added(0, 2)] {
        publish(&bs[0], &record).unwrap();
    }
    let (mut t, log) = table(1, 3);
    absorb_until_held(&mut t, &bs[1], 0, 0, 2);
    assert_eq!(
        t.resolve(0, 0, 2),
        Some(base_of(log.opened.borrow().len() as u64) + 0x200)
    );
    assert_eq!(t.resolve(0, 0, 1), None);
    // Generation 1 was opened and closed by its Gone, or, taken in one batch with its Gone, never opened.
    match log.opened.borrow().len() {
        2 => assert_eq!(closed(&log), [1], "generation 1 closed by its Gone"),
        n => assert_eq!((n, closed(&log)), (1, vec![])),
    }
    // A Gone pushed before the Added of its generation leaves it held; after it, it goes. The last
    // record (slot 5) says when all have been taken.
    for record in [gone(1, 1), added(1, 1), added(2, 1), gone(2, 1), added(5, 1)] {
        publish(&bs[0], &record).unwrap();
    }
    absorb_until_held(&mut t, &bs[1], 0, 5, 1);
    assert!(t.resolve(0, 1, 1).is_some());
    assert_eq!(t.resolve(0, 2, 1), None);
    assert_eq!(t.device_entries().len(), 3, "slots 0, 1 and 5");
    let open = log.opened.borrow().len() - closed(&log).len();
    assert_eq!(open, 3, "every mapping but the held ones closed");
}

#[test]
fn a_record_that_cannot_be_read_or_applied_is_skipped_and_the_rest_applied() {
    let bs = job(3);
    let out_of_range = added(MAX_SLOTS as u32, 1).encode();
    let messages: [&[u8]; 5] = [
        b"garbage",
        &[KIND_GONE, FORMAT_VERSION + 1, 0, 0, 0, 0, 1, 0, 0, 0],
        &out_of_range,
        &added(3, 1).encode(),
        &gone(9, 9).encode(),
    ];
    for message in messages {
        bs[0].push_registration_record(1, message).unwrap();
    }
    let (mut t, _log) = table(1, 3);
    assert_eq!(absorb_until(&mut t, &bs[1], 2), 2, "the good Added and Gone");
    assert_eq!(t.resolve(0, 3, 1), Some(base_of(1) + 0x200));
    // A failed open is skipped too; a later record still opens.
    t.opener.fail.set(true);
    publish(&bs[0], &added(5, 1)).unwrap();
    let start = std::time::Instant::now();
    while t.opener.log.opened.borrow().len() < 2 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "the record never came"
        );
        assert_eq!(t.absorb(&bs[1]), 0);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(t.resolve(0, 5, 1), None);
    t.opener.fail.set(false);
    publish(&bs[0], &added(5, 2)).unwrap();
    assert_eq!(absorb_until(&mut t, &bs[1], 1), 1);
    assert_eq!(t.resolve(0, 5, 2), Some(base_of(2) + 0x200));
    assert_eq!(t.len(), 2);
}

#[test]
fn absorbing_when_nothing_came_returns_at_once() {
    let bs = job(3);
    let (mut t, _log) = table(2, 3);
    let start = std::time::Instant::now();
    for _ in 0..100 {
        assert_eq!(t.absorb(&bs[2]), 0);
    }
    assert!(
        start.elapsed() < std::time::Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn publish_tries_every_peer_and_names_the_one_that_failed() {
    let mut bs = job(3);
    // Rank 1 leaves: pushing to it fails once its socket is gone, and rank 2 still gets every record.
    drop(bs.remove(1));
    let (b0, b2) = (&bs[0], &bs[1]);
    let start = std::time::Instant::now();
    let mut generation = 0;
    let e = loop {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "pushing to the closed rank 1 never failed"
        );
        generation += 1;
        if let Err(e) = publish(b0, &added(0, generation)) {
            break e;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(e.kind, ErrorKind::Remote);
    assert!(
        e.message.contains(&format!(
            "pushing the registration record of slot 0 generation {generation} to peer 1: "
        )),
        "{}",
        e.message
    );
    assert!(!e.message.contains("more peers failed"), "{}", e.message);
    let (mut t, log) = table(2, 3);
    assert_eq!(absorb_until(&mut t, b2, generation as usize), generation as usize);
    assert_eq!(t.resolve(0, 0, generation), Some(base_of(generation as u64) + 0x200));
    assert_eq!(log.opened.borrow().len(), generation as usize);
}

#[test]
fn only_64_byte_handles_reach_the_driver() {
    let e = ipc_handle(2, &[0u8; 63]).unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("peer 2's exported handle has 63 bytes"),
        "{}",
        e.message
    );
    assert!(ipc_handle(2, &[0u8; 65]).is_err());
    assert_eq!(ipc_handle(2, &[7u8; 64]).unwrap(), &[7u8; 64]);
}
