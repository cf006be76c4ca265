//! The IB transport driven end to end against the simulated fabric, and the real backend's error paths.

use super::sim::{Faults, SimFabric};
use super::verbs::{WC_REM_ACCESS_ERR, WC_RETRY_EXC_ERR};
use super::*;
use crate::error::ErrorKind;
use crate::proxy::fifo::{FIFO_SIZE, TriggerRing};
use crate::proxy::trigger::{TYPE_DATA, TYPE_FLAG, TYPE_SYNC};
use crate::proxy::{ProxyShared, ProxyThread, TailPolicy, TailPublisher, Trigger, TriggerHandler, serve_one};
use std::alloc::Layout;

/// Zeroed, 16-byte-aligned host memory, touched only through raw pointers (the fabric writes into it).
struct HostMem {
    ptr: *mut u8,
    layout: Layout,
}

impl HostMem {
    fn new(len: usize) -> HostMem {
        let layout = Layout::from_size_align(len, 16).unwrap();
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        HostMem { ptr, layout }
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn len(&self) -> u64 {
        self.layout.size() as u64
    }
    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.layout.size());
        // SAFETY: in bounds (checked); the fabric writes only while a test thread polls, not during reads.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len).to_vec() }
    }
    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.layout.size());
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.read(off, 8).try_into().unwrap())
    }
    fn set_u64(&self, off: usize, v: u64) {
        self.write(off, &v.to_le_bytes());
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// One rank's memory: its connection buffer and epoch counters (`device` at +0, `proxy` at +8).
struct Rank {
    ib: IbTransport,
    buff: HostMem,
    epochs: HostMem,
}

const BUFF: usize = 4096;

fn config() -> IbConfig {
    IbConfig::default()
}

/// Flag counts for a few connection ids, all zero (a communicator's `FlagsCarried`).
fn counts() -> FlagsCarried {
    FlagsCarried::from_counts([0; 4])
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// Ranks 0 and 1, on devices mlx5_0 and mlx5_1 of one fabric, with one connection (tag 7) set up.
fn pair(fabric: &SimFabric, cfg: IbConfig) -> (Rank, Rank) {
    pair_with_timeout(fabric, cfg, Duration::from_secs(10))
}

fn pair_with_timeout(fabric: &SimFabric, cfg: IbConfig, stall: Duration) -> (Rank, Rank) {
    let mk = |rank: usize| {
        let r = Rank {
            ib: IbTransport::with_library(Arc::new(fabric.clone()), cfg.clone(), stall),
            buff: HostMem::new(BUFF),
            epochs: HostMem::new(32),
        };
        let mut r = r;
        let (dev, peer) = if rank == 0 { ("mlx5_0", 1) } else { ("mlx5_1", 0) };
        r.ib.open_endpoint(rank, 0, dev, peer, 7, r.buff.addr(), BUFF as u64, r.epochs.addr())
            .unwrap();
        r
    };
    let (mut a, mut b) = (mk(0), mk(1));
    let (ma, mb) = (a.ib.setup_message(0).unwrap(), b.ib.setup_message(0).unwrap());
    a.ib.complete_setup(0, &mb).unwrap();
    let (remote_buff, remote_epochs) = a.ib.endpoints[0].as_ref().unwrap().remote.unwrap();
    assert_eq!(
        (remote_buff.addr, remote_buff.size, remote_epochs.addr),
        (b.buff.addr(), BUFF as u64, b.epochs.addr())
    );
    b.ib.complete_setup(0, &ma).unwrap();
    (a, b)
}

fn trig(kind: u8, size: u32, src: u32, dst: u32) -> Trigger {
    Trigger {
        data_size: size,
        src_offset: src,
        dst_offset: dst,
        conn_id: 0,
        kind,
    }
}

#[derive(Default)]
struct Tails(Vec<u64>);
impl TailPublisher for Tails {
    fn publish(&mut self, tail: u64) -> Result<()> {
        self.0.push(tail);
        Ok(())
    }
}

/// A FIFO in host memory that the test pushes into, and the proxy loop's state.
struct Fifo {
    slots: HostMem,
    ring: TriggerRing,
    head: u64,
    tail: u64,
    tails: Tails,
    shared: ProxyShared,
}

impl Fifo {
    fn new() -> Fifo {
        let slots = HostMem::new(crate::proxy::fifo::HOST_BYTES);
        // SAFETY: the slots (and the host tail after them) are 16-byte aligned and live as long as the
        // ring (same struct, dropped together).
        let ring = unsafe { TriggerRing::new(slots.ptr.cast()) };
        Fifo {
            slots,
            ring,
            head: 0,
            tail: 0,
            tails: Tails::default(),
            shared: ProxyShared::default(),
        }
    }
    fn push(&mut self, t: Trigger) {
        let w = t.encode();
        let off = (self.head % FIFO_SIZE) as usize * 16;
        self.slots.set_u64(off + 8, w[1]);
        self.slots.set_u64(off, w[0]);
        self.head += 1;
    }
    /// Serves every pushed trigger.
    fn serve(&mut self, h: &mut IbHandler) {
        let mut policy = TailPolicy::new(self.tail);
        while let Some(t) = serve_one(
            &self.ring,
            self.tail,
            h,
            &mut self.tails,
            &mut policy,
            None,
            &self.shared,
        ) {
            self.tail = t;
        }
        assert_eq!(self.tail, self.head, "every pushed trigger was served");
    }
}

#[test]
fn data_trigger_writes_the_range_at_both_offsets() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, b) = pair(&fabric, config());
    a.buff.write(0, &pattern(BUFF, 3));
    let mut h = a.ib.handler(0, counts());
    h.handle(&trig(TYPE_DATA, 100, 16, 32)).unwrap();
    h.sync().unwrap();
    assert_eq!(b.buff.read(32, 100), a.buff.read(16, 100));
    assert!(b.buff.read(0, 32).iter().all(|&x| x == 0), "nothing before dstOffset");
    assert!(
        b.buff.read(132, BUFF - 132).iter().all(|&x| x == 0),
        "nothing past the range"
    );
    assert_eq!(b.epochs.u64_at(8), 0, "no flag without Flag");
    assert!(fabric.violations().is_empty());
}

#[test]
fn a_data_part_of_size_0_is_ignored_whatever_its_offsets() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, b) = pair(&fabric, config());
    let mut h = a.ib.handler(0, counts());
    let mut f = Fifo::new();
    // Offsets far past both buffers; a slot whose first word is 0 is empty, so a size of 0 always comes
    // with a source offset.
    let past = BUFF as u32 + 4096;
    f.push(trig(TYPE_DATA, 0, past, past));
    f.push(trig(TYPE_DATA | TYPE_FLAG, 0, past, past));
    f.push(trig(TYPE_SYNC, 1, 0, 0));
    f.serve(&mut h);
    assert_eq!(f.shared.dropped(), 0, "ignored, not dropped");
    assert!(f.shared.failure().is_none());
    assert_eq!(fabric.log().len(), 1, "only the flag was written");
    assert_eq!(b.epochs.u64_at(8), 1, "the flag of the Data|Flag was raised");
    assert!(b.buff.read(0, BUFF).iter().all(|&x| x == 0), "no data moved");
    assert!(fabric.violations().is_empty());
}

#[test]
fn flag_trigger_writes_the_count_of_flags_into_the_peers_proxy_word() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, b) = pair(&fabric, config());
    a.epochs.set_u64(0, 5);
    b.epochs.set_u64(0, 99);
    let sent = FlagsCarried::from_counts([6, 0, 0, 0]); // flags of an earlier launch
    let mut h = a.ib.handler(0, sent.clone());
    h.handle(&trig(TYPE_FLAG, 1, 0, 0)).unwrap();
    h.sync().unwrap();
    assert_eq!(
        b.epochs.u64_at(8),
        7,
        "peer's proxy word = flags carried out on the connection"
    );
    assert_eq!(sent.count(0), 7);
    assert_eq!(b.epochs.u64_at(0), 99, "peer's device word untouched");
    let log = fabric.log();
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].remote_addr, log[0].len), (b.epochs.addr() + 8, 8));
    assert!(b.buff.read(0, BUFF).iter().all(|&x| x == 0), "Flag alone moves no data");
}

#[test]
fn with_the_legacy_flag_the_peers_proxy_word_is_our_device_word() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let cfg = IbConfig {
        flag: IbFlagMode::Epoch,
        ..config()
    };
    let (a, b) = pair(&fabric, cfg);
    a.epochs.set_u64(0, 5);
    let mut h = a.ib.handler(0, counts());
    h.handle(&trig(TYPE_FLAG, 1, 0, 0)).unwrap();
    h.sync().unwrap();
    assert_eq!(b.epochs.u64_at(8), 5, "peer's proxy word = our device word");
}

#[test]
fn a_queue_pair_without_inline_data_falls_back_to_the_legacy_flag() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        no_inline: true,
        ..Faults::default()
    });
    let (a, b) = pair(&fabric, config());
    a.epochs.set_u64(0, 5);
    let mut h = a.ib.handler(0, counts());
    assert!(!h.queues[0].carries_values());
    h.handle(&trig(TYPE_FLAG, 1, 0, 0)).unwrap();
    h.sync().unwrap();
    assert_eq!(b.epochs.u64_at(8), 5, "the device word, as the legacy proxy wrote");
}

/// The legacy race, on a queue whose adapter runs one write per poll: the device pushes a second
/// signal (its `device` word becomes 2) while the first flag still waits behind its data. Once the
/// first data and flag have run (and not the second data), the peer may see 1 and no more.
fn proxy_word_after_the_first_put_lands(mode: IbFlagMode) -> (u64, bool) {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        execute_per_poll: 1,
        ..Faults::default()
    });
    let (a, b) = pair(&fabric, IbConfig { flag: mode, ..config() });
    a.buff.write(0, &pattern(BUFF, 6));
    let mut h = a.ib.handler(0, counts());
    a.epochs.set_u64(0, 1);
    h.handle(&trig(TYPE_DATA | TYPE_FLAG, 1024, 0, 0)).unwrap();
    a.epochs.set_u64(0, 2);
    h.handle(&trig(TYPE_DATA | TYPE_FLAG, 1024, 1024, 1024)).unwrap();
    let q = h.queues[0].clone();
    q.wait_for(1).unwrap(); // writes 0 (data) and 1 (flag) have run
    assert_eq!(q.in_flight(), 2, "the second put has not run");
    assert_eq!(b.buff.read(0, 1024), a.buff.read(0, 1024));
    let second_landed = b.buff.read(1024, 1024) == a.buff.read(1024, 1024);
    let word = b.epochs.u64_at(8);
    h.sync().unwrap();
    assert_eq!(b.buff.read(1024, 1024), a.buff.read(1024, 1024));
    assert_eq!(b.epochs.u64_at(8), 2, "both flags raised in the end");
    (word, second_landed)
}

#[test]
fn a_flag_never_counts_a_signal_whose_data_is_still_queued() {
    assert_eq!(proxy_word_after_the_first_put_lands(IbFlagMode::Count), (1, false));
    // The legacy flag reads the device word when the adapter runs it: it says 2 while the second
    // put's data has not landed, so the peer's wait() for it would return early.
    assert_eq!(proxy_word_after_the_first_put_lands(IbFlagMode::Epoch), (2, false));
}

#[test]
fn sync_returns_only_after_every_earlier_write_completed() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        execute_per_poll: 1,
        ..Faults::default()
    });
    let (a, b) = pair(&fabric, config());
    a.buff.write(0, &pattern(BUFF, 9));
    let mut h = a.ib.handler(0, counts());
    for i in 0..3 {
        h.handle(&trig(TYPE_DATA, 64, i * 64, i * 64)).unwrap();
    }
    let q = h.queues[0].clone();
    assert_eq!(q.in_flight(), 3, "posted, not yet executed");
    assert!(b.buff.read(0, 192).iter().all(|&x| x == 0));
    h.sync().unwrap();
    assert_eq!(q.in_flight(), 0);
    assert_eq!(b.buff.read(0, 192), a.buff.read(0, 192));
    assert_eq!(fabric.log().len(), 3);
}

#[test]
fn data_with_flag_lands_the_data_before_the_flag() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, b) = pair(&fabric, config());
    a.buff.write(0, &pattern(BUFF, 1));
    a.epochs.set_u64(0, 1);
    let mut h = a.ib.handler(0, counts());
    h.handle(&trig(TYPE_DATA | TYPE_FLAG, 256, 0, 512)).unwrap();
    h.sync().unwrap();
    let log = fabric.log();
    assert_eq!(log.len(), 2);
    assert_eq!(
        (log[0].remote_addr, log[0].len),
        (b.buff.addr() + 512, 256),
        "data first"
    );
    assert_eq!(
        (log[1].remote_addr, log[1].len),
        (b.epochs.addr() + 8, 8),
        "then the flag"
    );
    assert_eq!(log[0].qpn, log[1].qpn, "on one queue pair, which keeps them in order");
    assert_eq!(b.buff.read(512, 256), a.buff.read(0, 256));
    assert_eq!(b.epochs.u64_at(8), 1);
}

#[test]
fn data_flag_sync_through_the_fifo_completes_before_the_tail_is_published() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        execute_per_poll: 1,
        ..Faults::default()
    });
    let (a, b) = pair(&fabric, config());
    a.buff.write(0, &pattern(BUFF, 5));
    a.epochs.set_u64(0, 3);
    let mut h = a.ib.handler(0, counts());
    let mut f = Fifo::new();
    f.push(trig(TYPE_DATA | TYPE_FLAG | TYPE_SYNC, 1000, 100, 200));
    f.serve(&mut h);
    assert_eq!(f.tails.0, vec![1], "the tail is published after the Sync");
    assert_eq!(h.queues[0].in_flight(), 0, "the Sync waited for both writes");
    assert_eq!(b.buff.read(200, 1000), a.buff.read(100, 1000));
    assert_eq!(b.epochs.u64_at(8), 1, "one flag carried out");
    assert_eq!(f.slots.u64_at(0), 0, "the slot was released");
    assert_eq!(f.shared.processed(), 1);
    assert!(f.shared.failure().is_none());
}

#[test]
fn malformed_triggers_are_dropped_and_a_flag_is_still_raised() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, b) = pair(&fabric, config());
    a.epochs.set_u64(0, 4);
    let mut h = a.ib.handler(0, counts());
    let mut f = Fifo::new();
    f.push(trig(TYPE_DATA, 16, BUFF as u32 - 8, 0)); // source past the end
    f.push(trig(TYPE_DATA | TYPE_FLAG, 16, 0, BUFF as u32 - 8)); // destination past the end, with a flag
    f.push(Trigger {
        conn_id: 5, // no such connection
        ..trig(TYPE_DATA, 8, 0, 0)
    });
    f.push(trig(TYPE_DATA, u32::MAX, u32::MAX, 0)); // no overflow
    f.push(trig(TYPE_SYNC, 1, 0, 0));
    f.serve(&mut h);
    assert_eq!(f.shared.dropped(), 4);
    assert!(f.shared.failure().is_none(), "a malformed trigger is not a failure");
    assert!(b.buff.read(0, BUFF).iter().all(|&x| x == 0), "no data moved");
    assert_eq!(b.epochs.u64_at(8), 1, "the flag of the dropped Data|Flag was raised");
    assert_eq!(fabric.log().len(), 1);

    // A connection id that belongs to another transport (no IB route) is dropped too.
    let mut routes = h.routes.clone();
    routes.insert(0, None);
    let mut h2 = IbHandler::new(routes, IbFlagMode::Count, counts());
    let e = h2.handle(&trig(TYPE_FLAG, 1, 0, 0)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage);
    h2.handle(&Trigger {
        conn_id: 1,
        ..trig(TYPE_FLAG, 1, 0, 0)
    })
    .unwrap();
}

#[test]
fn failed_completion_is_logged_with_rank_peer_and_status_and_reported_later() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        fail_write: Some((1, WC_REM_ACCESS_ERR)),
        ..Faults::default()
    });
    let (a, _b) = pair(&fabric, config());
    let mut h = a.ib.handler(0, counts());
    let mut f = Fifo::new();
    f.push(trig(TYPE_DATA, 8, 0, 0));
    f.push(trig(TYPE_DATA | TYPE_SYNC, 8, 8, 8)); // its write fails
    f.push(trig(TYPE_FLAG | TYPE_SYNC, 1, 0, 0));
    f.serve(&mut h);
    let e = f.shared.failure().expect("the failure is recorded");
    assert_eq!(e.kind, ErrorKind::Remote);
    for part in ["rank 0", "rank 1", "tag 7", "remote access error", "status 10"] {
        assert!(e.message.contains(part), "{part:?} missing from: {}", e.message);
    }
    assert_eq!(f.tail, 3, "the proxy went on releasing triggers");
    assert!(h.sync().is_err(), "later syncs report it");
    let q = &h.queues[0];
    assert!(
        q.write(a.buff.addr(), 0, 8, 0, 0).is_err(),
        "the queue pair is unusable after it"
    );
}

#[test]
fn peer_unreachable_during_transfer_is_a_retry_exceeded_failure() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        fail_write: Some((0, WC_RETRY_EXC_ERR)),
        ..Faults::default()
    });
    let (a, _b) = pair(&fabric, config());
    let mut h = a.ib.handler(0, counts());
    h.handle(&trig(TYPE_FLAG, 1, 0, 0)).unwrap();
    let e = h.sync().unwrap_err();
    assert!(e.message.contains("transport retry counter exceeded"), "{}", e.message);
}

#[test]
fn full_send_queue_is_never_overrun() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        execute_per_poll: 1,
        ..Faults::default()
    });
    let cfg = IbConfig {
        qp_depth: 4,
        cq_size: 4,
        poll_batch: 2,
        ..config()
    };
    let (a, b) = pair(&fabric, cfg);
    a.buff.write(0, &pattern(BUFF, 7));
    let mut h = a.ib.handler(0, counts());
    assert_eq!(h.queues[0].depth(), 4);
    let mut f = Fifo::new();
    // Far more writes than the queue holds, pushed in FIFO-sized rounds.
    for round in 0..4u32 {
        for i in 0..100u32 {
            let off = i * 40;
            let kind = if i % 10 == 9 { TYPE_DATA | TYPE_FLAG } else { TYPE_DATA };
            f.push(trig(kind, 40, off, off));
        }
        f.push(trig(TYPE_SYNC, 1, 0, 0));
        f.serve(&mut h);
        assert_eq!(h.queues[0].in_flight(), 0, "round {round}");
    }
    assert!(fabric.violations().is_empty(), "{:?}", fabric.violations());
    assert_eq!(fabric.max_outstanding(), 4, "the queue was filled, never overfilled");
    assert!(f.shared.failure().is_none());
    assert_eq!(fabric.log().len(), 4 * 110);
    assert!(b.buff.read(0, 4000) == a.buff.read(0, 4000), "every write landed");
}

#[test]
fn a_completion_queue_smaller_than_the_send_queue_bounds_the_writes_in_flight() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    fabric.set_faults(Faults {
        execute_per_poll: 1,
        ..Faults::default()
    });
    let cfg = IbConfig {
        qp_depth: 64,
        cq_size: 3,
        poll_batch: 100,
        ..config()
    };
    let (a, _b) = pair(&fabric, cfg);
    let mut h = a.ib.handler(0, counts());
    for i in 0..50 {
        h.handle(&trig(TYPE_DATA | TYPE_FLAG, 8, i * 8, i * 8)).unwrap();
    }
    h.sync().unwrap();
    assert!(fabric.violations().is_empty(), "{:?}", fabric.violations());
    assert_eq!(fabric.max_outstanding(), 3);
}

#[test]
fn a_stalled_peer_fails_the_sync_instead_of_hanging() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, _b) = pair_with_timeout(&fabric, config(), Duration::from_millis(50));
    fabric.set_faults(Faults {
        stall: true,
        ..Faults::default()
    });
    let mut h = a.ib.handler(0, counts());
    h.handle(&trig(TYPE_FLAG, 1, 0, 0)).unwrap();
    let t = std::time::Instant::now();
    let e = h.sync().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(
        e.message.contains("no RDMA completion") && e.message.contains("rank 1"),
        "{}",
        e.message
    );
}

#[test]
fn unreachable_peer_at_connect_is_a_clear_error() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let mk = |rank: usize, dev: &str| {
        let mut ib = IbTransport::with_library(Arc::new(fabric.clone()), config(), Duration::from_secs(1));
        let (buff, epochs) = (HostMem::new(64), HostMem::new(32));
        ib.open_endpoint(rank, 0, dev, 1 - rank, 3, buff.addr(), 64, epochs.addr())
            .unwrap();
        (ib, buff, epochs)
    };
    let (mut a, _ab, _ae) = mk(0, "mlx5_0");
    let (b, _bb, _be) = mk(1, "mlx5_1");
    fabric.set_faults(Faults {
        unreachable: true,
        ..Faults::default()
    });
    let e = a.complete_setup(0, &b.setup_message(0).unwrap()).unwrap_err();
    assert!(
        e.message.contains("rank 1") && e.message.contains("unreachable"),
        "{}",
        e.message
    );

    // A message from the wrong rank or tag is refused before touching the queue pair.
    fabric.set_faults(Faults::default());
    let mut info = IbConnInfo::from_bytes(&b.setup_message(0).unwrap()).unwrap();
    info.tag = 4;
    let e = a.complete_setup(0, &info.to_bytes()).unwrap_err();
    assert!(e.message.contains("tag 4"), "{}", e.message);
    // RoCE on one side and LID addressing on the other is refused too.
    let mut info = IbConnInfo::from_bytes(&b.setup_message(0).unwrap()).unwrap();
    info.endpoint.gid_index = 3;
    let e = a.complete_setup(0, &info.to_bytes()).unwrap_err();
    assert!(e.message.contains("MSCCLPP_IB_GID_INDEX"), "{}", e.message);
}

#[test]
fn missing_device_and_inactive_port_are_clear_errors() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let mut ib = IbTransport::with_library(Arc::new(fabric.clone()), config(), Duration::from_secs(1));
    let e = ib.open_device("mlx5_9").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("\"mlx5_9\"") && e.message.contains("devices found: mlx5_0, mlx5_1"),
        "{}",
        e.message
    );
    fabric.set_faults(Faults {
        port_down: true,
        ..Faults::default()
    });
    let e = ib.open_device("mlx5_0").unwrap_err();
    assert!(e.message.contains("not active"), "{}", e.message);
    let mut ib = IbTransport::with_library(
        Arc::new(fabric.clone()),
        IbConfig { port: 2, ..config() },
        Duration::from_secs(1),
    );
    let e = ib.open_device("mlx5_0").unwrap_err();
    assert!(e.message.contains("MSCCLPP_IB_PORT"), "{}", e.message);
}

#[test]
fn registered_buffer_write_honours_both_offsets() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (mut a, mut b) = pair(&fabric, config());
    let (reg_a, reg_b) = (HostMem::new(256), HostMem::new(256));
    let ma = a.ib.register_message(0, reg_a.addr(), 256).unwrap();
    let mb = b.ib.register_message(0, reg_b.addr(), 256).unwrap();
    let ea = a.ib.register_remote(0, reg_a.addr(), 256, &mb).unwrap();
    let _eb = b.ib.register_remote(0, reg_b.addr(), 256, &ma).unwrap();
    assert!(ea.remoteBuff.is_null());
    assert!(a.ib.owns_registered(&ea));
    // SAFETY: an entry this state made and still owns.
    let rec = unsafe { *ea.IbMr };
    assert_eq!((rec.buff as u64, rec.info.addr), (reg_a.addr(), reg_b.addr()));

    // The source is neither the connection buffer nor the registered one: it gets registered on the fly.
    let src = HostMem::new(128);
    src.write(0, &pattern(128, 11));
    let regions = fabric.region_count();
    a.ib.rdma_write_and_wait(ea.IbMr, src.addr() + 30, 50, 20, (src.addr(), src.len()))
        .unwrap();
    assert_eq!(reg_b.read(20, 50), src.read(30, 50), "srcOffset 30 -> dstOffset 20");
    assert!(reg_b.read(0, 20).iter().all(|&x| x == 0) && reg_b.read(70, 186).iter().all(|&x| x == 0));
    assert_eq!(
        fabric.region_count(),
        regions + 1,
        "the source allocation was registered once"
    );
    a.ib.rdma_write_and_wait(ea.IbMr, src.addr() + 100, 28, 228, (src.addr(), src.len()))
        .unwrap();
    assert_eq!(reg_b.read(228, 28), src.read(100, 28));
    assert_eq!(fabric.region_count(), regions + 1, "and reused");

    let e =
        a.ib.rdma_write_and_wait(ea.IbMr, src.addr(), 50, 220, (src.addr(), src.len()))
            .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("dstOffset 220"), "{}", e.message);
    let foreign = rec;
    let e =
        a.ib.rdma_write_and_wait(&foreign, src.addr(), 8, 0, (src.addr(), src.len()))
            .unwrap_err();
    assert!(
        e.message.contains("was not made by mscclppRegisterBuffer"),
        "{}",
        e.message
    );
    assert!(fabric.violations().is_empty());

    a.ib.clear().unwrap();
    b.ib.clear().unwrap();
    assert_eq!(fabric.region_count(), 0, "clear deregisters everything");
}

#[test]
fn a_proxy_thread_serves_ib_triggers_until_stopped() {
    let fabric = SimFabric::new(&["mlx5_0", "mlx5_1"]);
    let (a, b) = pair(&fabric, config());
    a.buff.write(0, &pattern(BUFF, 2));
    a.epochs.set_u64(0, 1);
    let mut f = Fifo::new();
    f.push(trig(TYPE_DATA | TYPE_FLAG, 512, 0, 1024));
    f.push(trig(TYPE_SYNC, 1, 0, 0));
    // SAFETY: the slots outlive the thread, which is stopped below.
    let ring = unsafe { TriggerRing::new(f.slots.ptr.cast()) };
    let p = ProxyThread::spawn(
        "test-ib-proxy".into(),
        0,
        ring,
        0,
        Box::new(a.ib.handler(0, counts())),
        Box::new(Tails::default()),
        Box::new(|| Ok(())),
        std::sync::Arc::new(|cause| panic!("the proxy asked for an abort: {cause:?}")),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while p.shared().processed() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy did not serve the triggers"
        );
        std::thread::yield_now();
    }
    assert!(p.shared().failure().is_none());
    assert_eq!(p.stop().unwrap(), 2);
    assert_eq!(b.buff.read(1024, 512), a.buff.read(0, 512));
    assert_eq!(b.epochs.u64_at(8), 1);
}

#[test]
fn set_up_messages_round_trip_and_garbage_is_refused() {
    let info = IbConnInfo {
        rank: 3,
        tag: -2,
        endpoint: QpEndpoint {
            port: 1,
            lid: 0x1234,
            gid: [7; 16],
            gid_index: -1,
            qpn: 0xabcdef,
            psn: 0x123456,
            mtu: 5,
        },
        buff: KeyedRange {
            addr: 1 << 40,
            size: 1 << 20,
            key: 0xdead,
        },
        epochs: KeyedRange {
            addr: 77,
            size: 16,
            key: 0xbeef,
        },
    };
    let bytes = info.to_bytes();
    assert_eq!(IbConnInfo::from_bytes(&bytes).unwrap(), info);
    assert!(IbConnInfo::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    let mut long = bytes.clone();
    long.push(0);
    assert!(IbConnInfo::from_bytes(&long).is_err());
    let mut bad = bytes;
    bad[0] ^= 1;
    assert!(IbConnInfo::from_bytes(&bad).is_err());
    let r = KeyedRange {
        addr: 5,
        size: 6,
        key: 7,
    };
    assert_eq!(register_from_bytes(&register_to_bytes(&r)).unwrap(), r);
    assert!(register_from_bytes(&[0; 4]).is_err());
}

#[test]
fn settings_come_from_the_environment_with_defaults_and_named_errors() {
    let none = IbConfig::from_lookup(|_| None).unwrap();
    assert_eq!(
        none,
        IbConfig {
            port: 1,
            gid_index: -1,
            cq_size: 1024,
            poll_batch: 16,
            qp_depth: 256,
            ibv_so: "libibverbs.so.1".into(),
            flag: IbFlagMode::Count,
        }
    );
    assert_eq!(none, IbConfig::default());
    let vars = [
        ("MSCCLPP_IB_PORT", "2"),
        ("MSCCLPP_IB_GID_INDEX", "3"),
        ("MSCCLPP_IB_CQ_SIZE", "64"),
        ("MSCCLPP_IB_CQ_POLL_BATCH", "8"),
        ("MSCCLPP_IB_QP_DEPTH", "32"),
        ("MSCCLPP_IBV_SO", "/opt/rdma/lib/libibverbs.so.1"),
    ];
    let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
    let c = IbConfig::from_lookup(get).unwrap();
    assert_eq!(
        c,
        IbConfig {
            port: 2,
            gid_index: 3,
            cq_size: 64,
            poll_batch: 8,
            qp_depth: 32,
            ibv_so: "/opt/rdma/lib/libibverbs.so.1".into(),
            flag: IbFlagMode::Count,
        }
    );
    for (var, value) in [
        ("MSCCLPP_IB_PORT", "0"),
        ("MSCCLPP_IB_GID_INDEX", "-2"),
        ("MSCCLPP_IB_CQ_SIZE", "many"),
        ("MSCCLPP_IB_QP_DEPTH", "0"),
        ("MSCCLPP_IB_FLAG", "exact"),
    ] {
        let e = IbConfig::from_lookup(|k| (k == var).then(|| value.to_string())).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains(var), "{}", e.message);
    }
}

#[test]
fn the_flag_setting_reads_count_or_epoch() {
    let flag = |v: &'static str| {
        IbConfig::from_lookup(move |k| (k == "MSCCLPP_IB_FLAG").then(|| v.to_string()))
            .unwrap()
            .flag
    };
    assert_eq!(flag("count"), IbFlagMode::Count);
    assert_eq!(flag(" epoch "), IbFlagMode::Epoch);
    assert_eq!(flag(""), IbFlagMode::Count);
}

#[test]
fn real_backend_with_a_missing_library_is_a_clear_error() {
    let path = "/nonexistent/dir/libibverbs-missing.so";
    let e = real::RealLibrary::load(path).err().expect("no such file");
    assert!(
        e.message.contains(path) && e.message.contains("MSCCLPP_IBV_SO"),
        "{}",
        e.message
    );
    // The same through the communicator's IB transport, as mscclppConnect meets it.
    let mut ib = IbTransport {
        config: Some(IbConfig {
            ibv_so: path.into(),
            ..config()
        }),
        ..Default::default()
    };
    let e = ib.open_device("mlx5_0").unwrap_err();
    assert!(
        e.message.contains("cannot load the InfiniBand verbs library"),
        "{}",
        e.message
    );
}

#[test]
fn real_backend_on_a_machine_without_the_device_says_what_it_found() {
    // Whether or not libibverbs is installed here, naming a device that is not there is a clear error.
    let mut ib = IbTransport {
        config: Some(config()),
        ..Default::default()
    };
    let e = ib.open_device("mlx5_nonexistent").unwrap_err();
    let m = &e.message;
    assert!(
        m.contains("cannot load the InfiniBand verbs library \"libibverbs.so.1\"")
            || (m.contains("\"mlx5_nonexistent\" not found") && m.contains("devices found:")),
        "{m}"
    );
    match real::RealLibrary::load("libibverbs.so.1") {
        Ok(lib) => println!("libibverbs loaded; devices: {:?}", lib.device_names().unwrap()),
        Err(e) => println!("libibverbs not installed here: {e}"),
    }
}

#[test]
fn mscclpp_connect_over_ib_without_the_device_fails_clearly_before_touching_the_gpu() {
    use crate::bootstrap::UniqueId;
    use crate::comm::Communicator;
    use crate::connection::TransportKind;
    use crate::connections::Connections;
    let t = Duration::from_secs(20);
    let id = UniqueId::create(t).unwrap();
    let id1 = UniqueId::from_bytes(&id.to_bytes(), "unique id", "UniqueId::create").unwrap();
    let peer = std::thread::spawn(move || Communicator::init_by_id(2, &id1, 1, t));
    let comm = Communicator::init_by_id(2, &id, 0, t).unwrap();
    // Both stay alive until the end: a rank leaving early can fail the other's set-up.
    let peer = peer.join().unwrap().unwrap();
    // The buffer is never looked at: the device is checked first, so this holds on machines without a GPU.
    let ib = TransportKind::Ib {
        device: "mlx5_nonexistent".into(),
    };
    let connections = Connections::new(&comm);
    let e = connections.connect(&comm, 1, 0, 0x1000, 64, ib).unwrap_err();
    let m = &e.message;
    assert!(
        m.contains("cannot load the InfiniBand verbs library")
            || (m.contains("\"mlx5_nonexistent\" not found") && m.contains("devices found:")),
        "{m}"
    );
    connections.destroy(&comm).unwrap();
    comm.destroy();
    peer.destroy();
}
