//! Multi-rank tests: every rank is a thread of this process, on 127.0.0.1 with ports the system picks.

use super::wire::{self, Greeting, Kind, Refusal};
use super::*;
use crate::error::{ErrorKind, Result};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

/// Long enough never to fire in a passing test on a loaded machine.
pub(crate) const T: Duration = Duration::from_secs(30);

pub(crate) fn local_root(magic: u64, timeout: Duration) -> Root {
    crate::logging::init();
    Root::listen("127.0.0.1:0".parse().unwrap(), magic, timeout).unwrap()
}

/// Runs `f(rank)` on `n` threads and returns the results in rank order.
pub(crate) fn on_ranks<R: Send>(n: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                s.spawn({
                    let f = &f;
                    move || f(r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// A byte that depends on the rank and the offset, so misplaced blocks show.
fn pattern(rank: usize, i: usize) -> u8 {
    (rank.wrapping_mul(131) ^ i.wrapping_mul(7) ^ (i >> 9)) as u8
}

fn check_all_gather(b: &Bootstrap, block: usize) -> Result<()> {
    let (rank, n) = (b.rank(), b.nranks());
    let mut data = vec![0xEEu8; n * block];
    for i in 0..block {
        data[rank * block + i] = pattern(rank, i);
    }
    b.all_gather(&mut data, block)?;
    for r in 0..n {
        let got = &data[r * block..(r + 1) * block];
        assert!(
            got.iter().enumerate().all(|(i, &x)| x == pattern(r, i)),
            "rank {rank}: block {r} of {block} bytes is wrong"
        );
    }
    Ok(())
}

/// What every job in these tests does once set up.
fn exercise(b: &Bootstrap, rank: usize, n: usize) -> Result<()> {
    assert_eq!((b.rank(), b.nranks()), (rank, n));
    for block in [1, 3, 1000, 4097] {
        check_all_gather(b, block)?;
        b.barrier()?;
    }
    // A ring of user messages, so that every rank both sends and receives.
    b.send((rank + 1) % n, 42, format!("from {rank}").as_bytes())?;
    let got = b.recv((rank + n - 1) % n, 42)?;
    assert_eq!(got, format!("from {}", (rank + n - 1) % n).as_bytes());
    b.barrier()
}

fn job_by_address(n: usize) {
    job_by_address_doing(n, |b, r| exercise(b, r, n));
}

/// A job of `n` ranks through an address's root, each running `work` once set up.
fn job_by_address_doing(n: usize, work: impl Fn(&Bootstrap, usize) -> Result<()> + Sync) {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let results = on_ranks(n, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, n, T)?;
        work(&b, r)
    });
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
    root.join();
}

fn job_by_unique_id(n: usize) {
    let id = UniqueId::create(T).unwrap();
    let bytes = id.to_bytes();
    let results = on_ranks(n, |r| {
        let id = UniqueId::from_bytes(&bytes, "unique id", "UniqueId::create")?;
        let b = Bootstrap::connect_to_id(&id, r, n, T)?;
        exercise(&b, r, n)
    });
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
}

#[test]
fn by_address_2_ranks() {
    job_by_address(2);
}

#[test]
fn by_address_4_ranks() {
    job_by_address(4);
}

#[test]
fn by_address_8_ranks() {
    job_by_address(8);
}

#[test]
fn by_address_16_ranks() {
    job_by_address(16);
}

#[test]
fn by_unique_id_2_ranks() {
    job_by_unique_id(2);
}

#[test]
fn by_unique_id_4_ranks() {
    job_by_unique_id(4);
}

#[test]
fn by_unique_id_8_ranks() {
    job_by_unique_id(8);
}

#[test]
fn by_unique_id_16_ranks() {
    job_by_unique_id(16);
}

#[test]
fn a_single_rank_job_works() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let b = Bootstrap::connect(root.local_addr(), PROTOCOL_MAGIC, 0, 1, T).unwrap();
    let mut data = [7u8; 5];
    b.all_gather(&mut data, 5).unwrap();
    assert_eq!(data, [7; 5]);
    b.barrier().unwrap();
    b.send(0, 1, b"me").unwrap();
    assert_eq!(b.recv(0, 1).unwrap(), b"me");
}

#[test]
fn rank_0_starts_the_root_of_an_address_job() {
    // A free port: bind, note it, close. Rank 0 binds it again through the address.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = RootAddress::parse(&format!("127.0.0.1:{port}")).unwrap();
    let results = on_ranks(3, |r| {
        if r > 0 {
            // Ranks other than 0 may start first; they retry until the root is up.
            thread::sleep(Duration::from_millis(20));
        }
        let b = Bootstrap::connect_to_address(&addr, r, 3, T)?;
        // Every rank's host came with the root's table: here all are this machine.
        let here = crate::gpu::ProcessId::this().host;
        if b.hosts() != [here; 3] {
            return Err(crate::error::Error::internal(format!(
                "hosts {:?}, not 3 x {here:#x}",
                b.hosts()
            )));
        }
        exercise(&b, r, 3)
    });
    for res in results {
        res.unwrap();
    }
}

#[test]
fn ipv6_loopback_works_where_available() {
    let Ok(root) = Root::listen("[::1]:0".parse().unwrap(), PROTOCOL_MAGIC, T) else {
        eprintln!("skipped: this machine cannot listen on [::1]");
        return;
    };
    let addr = root.local_addr();
    let results = on_ranks(3, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 3, T)?;
        assert!(b.peer_addr(r).unwrap().is_ipv6());
        exercise(&b, r, 3)
    });
    for res in results {
        res.unwrap();
    }
}

#[test]
fn all_gather_of_8_mib_blocks() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let results = on_ranks(4, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 4, T)?;
        check_all_gather(&b, 8 << 20)?;
        check_all_gather(&b, (8 << 20) + 3)
    });
    for res in results {
        res.unwrap();
    }
}

#[test]
fn huge_messages_both_ways_at_once_do_not_deadlock() {
    const LEN: usize = 64 << 20;
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let results = on_ranks(2, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 2, T)?;
        let mine: Vec<u8> = (0..LEN).map(|i| pattern(r, i)).collect();
        // Both ranks send first: a send must not wait for the peer's recv.
        b.send(1 - r, 9, &mine)?;
        let theirs = b.recv(1 - r, 9)?;
        assert_eq!(theirs.len(), LEN);
        assert!(theirs.iter().enumerate().all(|(i, &x)| x == pattern(1 - r, i)));
        b.barrier()
    });
    for res in results {
        res.unwrap();
    }
}

#[test]
fn tags_are_matched_out_of_order_and_fifo_per_tag() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let results = on_ranks(3, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 3, T)?;
        if r == 0 {
            for (tag, msg) in [
                (3u64, "three"),
                (1, "one"),
                (2, "two-a"),
                (2, "two-b"),
                (u64::MAX, "max"),
            ] {
                b.send(1, tag, msg.as_bytes())?;
            }
            b.send(2, 1, b"")?;
            b.send(0, 5, b"self")?;
            assert_eq!(b.recv(0, 5)?, b"self");
        } else if r == 1 {
            assert_eq!(b.recv(0, 2)?, b"two-a");
            assert_eq!(b.recv(0, u64::MAX)?, b"max");
            assert_eq!(b.recv(0, 3)?, b"three");
            assert_eq!(b.recv(0, 2)?, b"two-b");
            assert_eq!(b.recv(0, 1)?, b"one");
        } else {
            assert_eq!(b.recv(0, 1)?, b"");
        }
        // User tags never collide with the collectives' messages.
        check_all_gather(&b, 16)?;
        b.barrier()
    });
    for res in results {
        res.unwrap();
    }
}

#[test]
fn bad_arguments_are_invalid_argument_errors() {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let e = Bootstrap::connect(addr, 1, 2, 2, T).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("rank 2"), "{}", e.message);
    let e = Bootstrap::connect(addr, 1, 0, 0, T).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("nranks 0"), "{}", e.message);
    let e = Bootstrap::connect(addr, 1, 0, MAX_RANKS + 1, T).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);

    let root = local_root(PROTOCOL_MAGIC, T);
    let b = Bootstrap::connect(root.local_addr(), PROTOCOL_MAGIC, 0, 1, T).unwrap();
    let mut data = [0u8; 10];
    let e = b.all_gather(&mut data, 3).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("10 bytes"), "{}", e.message);
    assert_eq!(
        b.all_gather(&mut data, usize::MAX).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(b.send(1, 0, b"x").unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(b.recv(7, 0).unwrap_err().kind, ErrorKind::InvalidArgument);
}

#[test]
fn all_gather_with_mismatched_sizes_fails_instead_of_corrupting() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let results = on_ranks(2, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 2, T)?;
        let block = 4 + 4 * r;
        let mut data = vec![0u8; 2 * block];
        b.all_gather(&mut data, block)
    });
    for res in results {
        assert_eq!(res.unwrap_err().kind, ErrorKind::InvalidUsage);
    }
}

#[test]
fn a_rank_that_never_comes_fails_the_others_within_the_timeout() {
    let timeout = Duration::from_secs(1);
    let root = local_root(PROTOCOL_MAGIC, timeout);
    let addr = root.local_addr();
    let start = Instant::now();
    // Rank 3 of 4 never starts.
    let results = on_ranks(3, |r| {
        Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 4, timeout).map(|_| ())
    });
    let took = start.elapsed();
    for res in results {
        let e = res.unwrap_err();
        // Told by the root, which gives up a timeout after the first rank arrived, that rank 3 never came
        // (each rank waits a little past its own timeout for that answer).
        assert_eq!(e.kind, ErrorKind::Remote, "{e}");
        assert!(e.message.contains("gave up: rank 3 did not arrive within"), "{e}");
    }
    assert!(
        took >= Duration::from_millis(900) && took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
    root.join();
}

#[test]
fn a_rank_that_ends_before_its_hello_is_named_as_such() {
    let timeout = Duration::from_secs(1);
    let root = local_root(PROTOCOL_MAGIC, timeout);
    let addr = root.local_addr();
    // Rank 1 of 2 connects and ends after half a greeting (its process closing the socket, as at its death).
    let mut half = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut half, &[0x4d; 8]).unwrap();
    drop(half);
    let e = Bootstrap::connect(addr, PROTOCOL_MAGIC, 0, 2, timeout).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Remote, "{e}");
    assert!(e.message.contains("gave up: rank 1 did not arrive within"), "{e}");
    assert!(
        e.message.contains("connections that ended before their hello")
            && e.message.contains("closed before finishing its greeting"),
        "{e}"
    );
    root.join();
}

#[test]
fn a_root_that_never_comes_fails_within_the_timeout() {
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let timeout = Duration::from_millis(700);
    let start = Instant::now();
    let e = Bootstrap::connect(addr, PROTOCOL_MAGIC, 1, 2, timeout).err().unwrap();
    let took = start.elapsed();
    assert_eq!(e.kind, ErrorKind::Remote);
    assert!(e.message.contains("cannot reach the bootstrap root"), "{e}");
    assert!(
        took >= Duration::from_millis(600) && took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn stopping_the_root_tells_waiting_ranks() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let waiting = thread::spawn(move || Bootstrap::connect(addr, PROTOCOL_MAGIC, 0, 2, T).map(|_| ()));
    thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    root.stop();
    let e = waiting.join().unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote);
    assert!(e.message.contains("stopped"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_rank_that_joined_and_left_fails_the_job_at_once() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let start = Instant::now();
    let waiting = thread::spawn(move || Bootstrap::connect(addr, PROTOCOL_MAGIC, 0, 3, T).map(|_| ()));
    thread::sleep(Duration::from_millis(200));
    // Rank 2 says hello, then its connection closes, as when its process ends; rank 1 has not come yet.
    let fake_addr = Some("127.0.0.1:9".parse().unwrap());
    let leaver = stranger(addr, &greeting(Kind::RootHello, PROTOCOL_MAGIC, 2, 3, 0, fake_addr));
    thread::sleep(Duration::from_millis(200));
    drop(leaver);
    let e = waiting.join().unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote, "{e}");
    for part in [
        "rank 2 (from",
        "left before all 3 ranks arrived",
        "closed its connection",
        "had not arrived",
    ] {
        assert!(e.message.contains(part), "{part}: {e}");
    }
    // A rank of the job that comes later is told the same at once, not left to wait out the timeout.
    let e = Bootstrap::connect(addr, PROTOCOL_MAGIC, 1, 3, T).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Remote, "{e}");
    assert!(
        e.message.contains("rank 2 (from") && e.message.contains("left before all"),
        "{e}"
    );
    // One of another job is still turned away for its own reason.
    let e = Bootstrap::connect(addr, 0x0123_4567, 1, 3, T).err().unwrap();
    assert!(e.message.contains("wrong magic"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    root.stop();
}

/// Connects to `addr` and sends `bytes`, returning the stream so it stays open.
fn stranger(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    // The other side may hang up on garbage before we finish writing it.
    let _ = s.write_all(bytes);
    s
}

fn greeting(kind: Kind, magic: u64, rank: usize, nranks: usize, aux: u32, addr: Option<SocketAddr>) -> Vec<u8> {
    let mut g = Greeting::new(kind, magic, rank, nranks);
    g.aux = aux;
    g.addr = addr;
    g.encode().to_vec()
}

fn expect_rejection(s: &mut TcpStream) -> String {
    match wire::read_reply(s, Instant::now() + Duration::from_secs(10), 1 << 20) {
        Err(Refusal::Rejected { status, reason }) => {
            assert_eq!(status, wire::STATUS_REJECTED);
            reason
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn strangers_at_the_root_do_not_disturb_the_job() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let fake_addr = Some("127.0.0.1:9".parse().unwrap());
    // Garbage, silence, a half greeting, a greeting that closes at once, and a flood of bytes.
    let mut held = vec![
        stranger(addr, b"GET / HTTP/1.0\r\n\r\n"),
        stranger(addr, b""),
        stranger(
            addr,
            &greeting(Kind::RootHello, PROTOCOL_MAGIC, 0, 4, 0, fake_addr)[..30],
        ),
        stranger(addr, &[0xFF; 100_000]),
    ];
    drop(stranger(addr, b"MSCLBOOT"));
    // Well-formed hellos that disagree with the job are answered with a reason.
    let mut wrong_magic = stranger(addr, &greeting(Kind::RootHello, 0xBAD, 1, 4, 0, fake_addr));
    assert!(expect_rejection(&mut wrong_magic).contains("wrong magic"));
    let mut peer_hello = stranger(addr, &greeting(Kind::PeerHello, PROTOCOL_MAGIC, 1, 4, 0, fake_addr));
    assert!(expect_rejection(&mut peer_hello).contains("not a hello"));

    let start = Instant::now();
    let results = on_ranks(4, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 4, T)?;
        exercise(&b, r, 4)
    });
    for res in results {
        res.unwrap();
    }
    // The silent stranger's 10 s handshake allowance did not hold up the ranks.
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    held.clear();
}

#[test]
fn ranks_of_another_job_are_turned_away() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    thread::scope(|s| {
        let real: Vec<_> = (0..3)
            .map(|r| {
                s.spawn(move || {
                    let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 4, T)?;
                    exercise(&b, r, 4)
                })
            })
            .collect();
        // While ranks 0-2 wait for rank 3: a rank of another job with a different magic, and one that
        // thinks the job has 5 ranks.
        thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        let e = Bootstrap::connect(addr, 0x0123_4567, 3, 4, T).err().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(e.message.contains("wrong magic"), "{e}");
        let e = Bootstrap::connect(addr, PROTOCOL_MAGIC, 3, 5, T).err().unwrap();
        assert_eq!(e.kind, ErrorKind::InvalidUsage, "{e}");
        assert!(e.message.contains("nranks 5"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, 3, 4, T).unwrap();
        exercise(&b, 3, 4).unwrap();
        for h in real {
            h.join().unwrap().unwrap();
        }
    });
}

#[test]
fn a_duplicate_rank_is_turned_away() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let first = thread::spawn(move || Bootstrap::connect(addr, PROTOCOL_MAGIC, 0, 2, T));
    thread::sleep(Duration::from_millis(200));
    let e = Bootstrap::connect(addr, PROTOCOL_MAGIC, 0, 2, T).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidUsage);
    assert!(e.message.contains("already joined"), "{e}");
    let b1 = Bootstrap::connect(addr, PROTOCOL_MAGIC, 1, 2, T).unwrap();
    let b0 = first.join().unwrap().unwrap();
    thread::scope(|s| {
        s.spawn(|| b0.barrier().unwrap());
        b1.barrier().unwrap();
    });
}

#[test]
fn strangers_at_rank_listeners_do_not_disturb_the_job() {
    const N: usize = 3;
    // The test plays the root, so it learns the ranks' listen addresses before they meet.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root_addr = listener.local_addr().unwrap();
    thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|r| {
                s.spawn(move || {
                    let b = Bootstrap::connect(root_addr, PROTOCOL_MAGIC, r, N, T)?;
                    exercise(&b, r, N)
                })
            })
            .collect();
        let mut joined: Vec<Option<(TcpStream, SocketAddr)>> = (0..N).map(|_| None).collect();
        for _ in 0..N {
            let (stream, g) = accept_hello(&listener);
            joined[g.rank as usize] = Some((stream, g.addr.unwrap()));
        }
        let mut held = Vec::new();
        for (r, j) in joined.iter().enumerate() {
            let at = j.as_ref().unwrap().1;
            held.push(stranger(
                at,
                b"\x00\x01garbage that is not a greeting at all, longer than 80 bytes...................",
            ));
            held.push(stranger(at, b""));
            drop(stranger(at, b"MSCL"));
            let fake = Some("127.0.0.1:9".parse().unwrap());
            let mut wrong_magic = stranger(at, &greeting(Kind::PeerHello, 0xBAD, N - 1, N, r as u32, fake));
            assert!(expect_rejection(&mut wrong_magic).contains("wrong magic"));
            let mut itself = stranger(at, &greeting(Kind::PeerHello, PROTOCOL_MAGIC, r, N, r as u32, fake));
            assert!(expect_rejection(&mut itself).contains("is this rank"));
            let mut wrong_target = stranger(at, &greeting(Kind::PeerHello, PROTOCOL_MAGIC, N - 1, N, 77, fake));
            assert!(expect_rejection(&mut wrong_target).contains("wants rank 77"));
            let mut wrong_n = stranger(
                at,
                &greeting(Kind::PeerHello, PROTOCOL_MAGIC, N - 1, N + 1, r as u32, fake),
            );
            assert!(expect_rejection(&mut wrong_n).contains("nranks"));
        }
        let mut table = Vec::new();
        for (r, j) in joined.iter().enumerate() {
            table.extend_from_slice(&wire::encode_table_row(r, Some(j.as_ref().unwrap().1), 0));
        }
        let start = Instant::now();
        for (r, j) in joined.iter_mut().enumerate() {
            let stream = &mut j.as_mut().unwrap().0;
            wire::write_reply(stream, PROTOCOL_MAGIC, r, N, wire::STATUS_OK, &table).unwrap();
        }
        for h in ranks {
            h.join().unwrap().unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        drop(held);
    });
}

/// Asserts that a rank's set-up ended in a remote error within 2 s of `since`, its message holding `parts`.
fn fails_at_once(rank: thread::JoinHandle<Result<()>>, since: Instant, parts: &[&str]) {
    let e = rank.join().unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote, "{e}");
    for part in parts {
        assert!(e.message.contains(part), "{part}: {e}");
    }
    assert!(since.elapsed() < Duration::from_secs(2), "{:?}", since.elapsed());
}

/// For a test that plays the root: the next rank's connection and its hello.
fn accept_hello(listener: &TcpListener) -> (TcpStream, Greeting) {
    let (mut stream, _) = listener.accept().unwrap();
    let mut bytes = [0u8; wire::GREETING_LEN];
    wire::read_exact_by(&mut stream, &mut bytes, Instant::now() + T).unwrap();
    (stream, Greeting::decode(&bytes).unwrap())
}

#[test]
fn a_root_that_goes_away_fails_its_waiting_ranks_at_once() {
    // The test plays the root and closes the connection after the hello, as when its process ends.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root_addr = listener.local_addr().unwrap();
    let rank1 = thread::spawn(move || Bootstrap::connect(root_addr, PROTOCOL_MAGIC, 1, 2, T).map(|_| ()));
    let (stream, _) = accept_hello(&listener);
    let start = Instant::now();
    drop(stream);
    fails_at_once(rank1, start, &["waiting at the root", "without an answer"]);
}

#[test]
fn a_peer_whose_listener_is_gone_fails_set_up_at_once() {
    // The test plays the root and lists, for rank 0, an address where nothing listens any more: what
    // rank 1 finds when rank 0's process ended after the table was sent.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root_addr = listener.local_addr().unwrap();
    let gone = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let rank1 = thread::spawn(move || Bootstrap::connect(root_addr, PROTOCOL_MAGIC, 1, 2, T).map(|_| ()));
    let (mut stream, hello) = accept_hello(&listener);
    let mut table = wire::encode_table_row(0, Some(gone), hello.host).to_vec();
    table.extend_from_slice(&wire::encode_table_row(1, hello.addr, hello.host));
    let start = Instant::now();
    wire::write_reply(&mut stream, PROTOCOL_MAGIC, 1, 2, wire::STATUS_OK, &table).unwrap();
    fails_at_once(rank1, start, &["connecting to peer 0", "its process ended"]);
}

#[test]
fn a_closed_peer_fails_recv_and_drop_is_prompt() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let mut bs = on_ranks(2, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 2, T).unwrap());
    let b1 = bs.pop().unwrap();
    let b0 = bs.pop().unwrap();
    b1.send(0, 1, b"last words").unwrap();
    let start = Instant::now();
    drop(b1);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "drop took {:?}",
        start.elapsed()
    );
    // What arrived before the close is still delivered; after it, waits fail instead of hanging.
    assert_eq!(b0.recv(1, 1).unwrap(), b"last words");
    let e = b0.recv(1, 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote);
    assert!(e.message.contains("peer 1"), "{e}");
    assert_eq!(b0.barrier().unwrap_err().kind, ErrorKind::Remote);
    assert!(start.elapsed() < Duration::from_secs(3));
    // It said goodbye: an orderly close, not a failure.
    assert_eq!(b0.failure(), None);
}

/// The threads of this process now.
fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

/// Reads a child's output to its end, so that a full pipe never stops the child.
fn drain(mut pipe: impl std::io::Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// Runs `body` with the process to itself, so that the process's threads are the body's and the harness's
/// alone (other tests run on threads of the same process): here where the harness was asked for the test
/// `test` of this module alone (`--exact NAME --test-threads=1`), else in a run of this test binary so asked,
/// which must pass within `limit`.
fn alone_in_a_process(test: &str, limit: Duration, body: impl FnOnce()) {
    let name = format!(
        "{}::{test}",
        module_path!().split_once("::").expect("the crate's name").1
    );
    let args = ["--exact", name.as_str(), "--test-threads=1", "--nocapture"];
    let given: Vec<String> = std::env::args().skip(1).collect();
    if args[..3].iter().all(|a| given.iter().any(|g| g == a)) {
        return body();
    }
    let mut child = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running the test binary again");
    let out = drain(child.stdout.take().expect("piped"));
    let err = drain(child.stderr.take().expect("piped"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the test binary") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().expect("stdout"), err.join().expect("stderr"));
    let Some(status) = status else {
        panic!("{name} did not end within {limit:?} in a process of its own (a hang):\n{out}\n{err}");
    };
    assert!(
        status.success() && out.contains("1 passed"),
        "{name} in a process of its own: {status}\n{out}\n{err}"
    );
}

/// `job_by_address`, with every rank, once set up and exercised, waiting twice at `held` before it leaves.
fn job_held_at(n: usize, held: &std::sync::Barrier) {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let results = on_ranks(n, |r| {
        let b = Bootstrap::connect(addr, PROTOCOL_MAGIC, r, n, T).and_then(|b| exercise(&b, r, n).map(|()| b));
        held.wait();
        held.wait();
        b.map(drop)
    });
    for (r, res) in results.into_iter().enumerate() {
        res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
    root.join();
}

#[test]
fn many_jobs_in_parallel_do_not_leak_threads_or_hang() {
    const JOBS: usize = 8;
    const RANKS: usize = 3;
    let test = "many_jobs_in_parallel_do_not_leak_threads_or_hang";
    alone_in_a_process(test, Duration::from_secs(60), || {
        // One job first: what the process starts once and keeps (the logger's) is no leak.
        job_by_address(RANKS);
        let before = threads_now();
        let started = Instant::now();
        // Every rank of every job waits, set up and exercised, until all of them are: the jobs run at once.
        let all_up = std::sync::Barrier::new(JOBS * RANKS + 1);
        let during = thread::scope(|s| {
            for _ in 0..JOBS {
                s.spawn(|| job_held_at(RANKS, &all_up));
            }
            all_up.wait();
            let during = threads_now();
            all_up.wait();
            during
        });
        // At least each job's thread, and each rank's with its receive thread.
        assert!(
            during >= before + JOBS * (1 + 2 * RANKS),
            "{JOBS} jobs of {RANKS} ranks at once: {during} threads, {before} before"
        );
        let ended = Instant::now();
        while threads_now() > before && ended.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(10));
        }
        let after = threads_now();
        assert!(
            after <= before,
            "{} threads left 5 s after {JOBS} jobs ended ({before} before, {during} during)",
            after - before
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{JOBS} jobs of {RANKS} ranks took {:?}",
            started.elapsed()
        );
    });
}

#[test]
fn endpoints_and_roots_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Bootstrap>();
    shareable::<Root>();
}

// ---- failures: a peer that dies or goes silent, aborts ----

/// The last rank of an `n`-rank job, played by the test with raw sockets: it joins at the root and
/// connects to its neighbours (all lower ranks), and then does only what the test makes it do.
struct FakeRank {
    /// The connection to each neighbour, in rank order.
    conns: Vec<TcpStream>,
    _listener: TcpListener,
}

fn fake_last_rank(root: SocketAddr, n: usize) -> FakeRank {
    let rank = n - 1;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut to_root = wire::connect_by(root, Instant::now() + T).unwrap();
    let hello = greeting(
        Kind::RootHello,
        PROTOCOL_MAGIC,
        rank,
        n,
        0,
        Some(listener.local_addr().unwrap()),
    );
    to_root.write_all(&hello).unwrap();
    let (_, table) = wire::read_reply(&mut to_root, Instant::now() + T, n * wire::TABLE_ROW_LEN).unwrap();
    let conns = super::topology::neighbours(rank, n)
        .into_iter()
        .map(|peer| {
            let addr = wire::decode_table_entry(&table, peer).unwrap().0.unwrap();
            let mut s = wire::connect_by(addr, Instant::now() + T).unwrap();
            s.write_all(&greeting(Kind::PeerHello, PROTOCOL_MAGIC, rank, n, peer as u32, None))
                .unwrap();
            wire::read_reply(&mut s, Instant::now() + T, 0).unwrap();
            s
        })
        .collect();
    FakeRank {
        conns,
        _listener: listener,
    }
}

/// A fake rank `rank` of `n` that says hello at the root `root`, giving a listener it never accepts on: its
/// connection to the root (open, so that it stays in the job) and the listener.
fn hello_at_root(root: SocketAddr, rank: usize, n: usize) -> (TcpStream, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut to_root = wire::connect_by(root, Instant::now() + T).unwrap();
    let hello = greeting(
        Kind::RootHello,
        PROTOCOL_MAGIC,
        rank,
        n,
        0,
        Some(listener.local_addr().unwrap()),
    );
    to_root.write_all(&hello).unwrap();
    (to_root, listener)
}

/// Ranks `0..n-1` of an `n`-rank job watched as `liveness` says, and the fake last rank.
fn job_with_fake_last_rank(n: usize, liveness: Liveness) -> (Vec<Bootstrap>, FakeRank) {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    thread::scope(|s| {
        let real: Vec<_> = (0..n - 1)
            .map(|r| {
                s.spawn(move || Bootstrap::connect_watching(addr, None, PROTOCOL_MAGIC, r, n, T, liveness).unwrap())
            })
            .collect();
        let fake = fake_last_rank(addr, n);
        (real.into_iter().map(|h| h.join().unwrap()).collect(), fake)
    })
}

/// Waits up to `limit` for `b`'s first failure.
fn failure_within(b: &Bootstrap, limit: Duration) -> PeerFailure {
    let start = Instant::now();
    loop {
        if let Some(f) = b.failure() {
            return f;
        }
        assert!(start.elapsed() < limit, "rank {}: no failure after {limit:?}", b.rank());
        thread::sleep(Duration::from_millis(5));
    }
}

/// A timeout that never fires in these tests, so that only a closed connection or a notice can.
fn patient() -> Liveness {
    Liveness::new(Duration::from_secs(60))
}

#[test]
fn a_killed_peer_is_detected_at_once_by_every_rank_and_runs_the_hook_once() {
    let (ranks, fake) = job_with_fake_last_rank(3, patient());
    let calls = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    for b in &ranks {
        let calls = calls.clone();
        b.on_failure(move |f| {
            let thread = thread::current().name().unwrap_or("").to_string();
            calls.lock().push((f.observer, f.rank, thread));
        });
    }
    // Closing without a goodbye is what the kernel does for a killed process.
    let killed = Instant::now();
    drop(fake);
    for b in &ranks {
        let f = failure_within(b, Duration::from_secs(5));
        assert_eq!(f.rank, 2);
        // Seen by this rank, or first by another rank that told this one (both race to it).
        assert!(
            matches!(&f.cause, Cause::ConnectionClosed(_))
                || matches!(&f.cause, Cause::ReportedBy { how, .. } if how.contains("connection closed")),
            "{f:?}"
        );
        assert!(
            f.detected - killed < Duration::from_secs(2),
            "{:?}",
            f.detected - killed
        );
        // Every later call fails at once, naming the dead rank.
        let start = Instant::now();
        let e = b.barrier().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(
            e.message.contains("rank 2 failed (") && e.message.contains("connection closed"),
            "{e}"
        );
        assert!(b.send(0, 1, b"x").is_err() && b.recv(0, 1).is_err());
        assert!(start.elapsed() < Duration::from_secs(1));
    }
    let start = Instant::now();
    while calls.lock().len() < 2 && start.elapsed() < Duration::from_secs(5) {
        thread::sleep(Duration::from_millis(5));
    }
    let mut calls = calls.lock().clone();
    calls.sort();
    assert_eq!(
        calls,
        vec![
            (0, 2, "mscclpp-failure-0".to_string()),
            (1, 2, "mscclpp-failure-1".to_string())
        ]
    );
    // A hook registered after the failure runs at once, on the caller's thread.
    let late = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let l = late.clone();
    ranks[0].on_failure(move |_| l.store(true, std::sync::atomic::Ordering::SeqCst));
    assert!(late.load(std::sync::atomic::Ordering::SeqCst));
    let start = Instant::now();
    drop(ranks);
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
}

#[test]
fn a_silent_peer_gets_heartbeats_and_is_declared_dead_after_the_timeout() {
    let liveness = Liveness::new(Duration::from_secs(1));
    // Before the fake rank's last word (its handshake), so that the silence measured from here is never
    // shorter than the one rank 0 sees, however long the set-up takes on a loaded machine.
    let silent_since = Instant::now();
    let (mut ranks, mut fake) = job_with_fake_last_rank(2, liveness);
    let b0 = ranks.pop().unwrap();
    thread::scope(|s| {
        // A barrier waiting on the silent rank ends when it is declared dead, not later.
        let waiting = s.spawn(|| (b0.barrier(), Instant::now()));
        // Rank 0 sends heartbeats every 250 ms meanwhile.
        let mut beats = 0;
        let mut header = [0u8; wire::FRAME_HEADER_LEN];
        while beats < 2 {
            wire::read_exact_by(&mut fake.conns[0], &mut header, Instant::now() + T)
                .unwrap_or_else(|e| panic!("{e} after {:?}: {:?}", silent_since.elapsed(), b0.failure()));
            let (key, len) = wire::decode_frame_header(&header).unwrap();
            if key.space == wire::Space::Heartbeat {
                assert_eq!(len, 0);
                beats += 1;
            } else {
                let mut body = vec![0u8; len as usize];
                wire::read_exact_by(&mut fake.conns[0], &mut body, Instant::now() + T).unwrap();
            }
        }
        assert!(
            silent_since.elapsed() < Duration::from_millis(900),
            "{:?}",
            silent_since.elapsed()
        );
        let f = failure_within(&b0, Duration::from_secs(5));
        let after = f.detected - silent_since;
        assert_eq!(f.rank, 1);
        assert!(
            matches!(f.cause, Cause::NoHeartbeat(d) if d >= liveness.timeout),
            "{f:?}"
        );
        assert!(after >= liveness.timeout && after < Duration::from_secs(3), "{after:?}");
        let (result, ended) = waiting.join().unwrap();
        let e = result.unwrap_err();
        assert!(e.message.contains("rank 1 failed (no heartbeat for"), "{e}");
        assert!(ended - f.detected < Duration::from_millis(500));
    });
    // The rank that closed the connection said why, at WARN.
    let said = crate::logging::tap::warned(&["rank 0: closing the connection to peer 1: nothing from it for"]);
    assert!(!said.is_empty(), "no WARN line for the connection rank 0 closed");
}

#[test]
fn a_failure_seen_by_one_rank_is_reported_to_the_others() {
    let (ranks, mut fake) = job_with_fake_last_rank(3, patient());
    // Rank 2 drops only its connection to rank 0; rank 1 still has its own, so only rank 0 sees it.
    drop(fake.conns.remove(0));
    let f0 = failure_within(&ranks[0], Duration::from_secs(5));
    assert_eq!((f0.rank, matches!(f0.cause, Cause::ConnectionClosed(_))), (2, true));
    let f1 = failure_within(&ranks[1], Duration::from_secs(5));
    assert_eq!(f1.rank, 2);
    match &f1.cause {
        Cause::ReportedBy { reporter, how } => {
            assert_eq!(*reporter, 0);
            assert!(how.starts_with("connection closed"), "{how}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        f1.to_string().contains("peer rank 2 failed: rank 0 reported it"),
        "{f1}"
    );
    assert!(ranks[1].barrier().unwrap_err().message.contains("rank 2 failed"));
}

#[test]
fn a_local_abort_fails_every_rank_promptly() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let ranks = on_ranks(3, |r| {
        Bootstrap::connect_watching(addr, None, PROTOCOL_MAGIC, r, 3, T, patient()).unwrap()
    });
    thread::scope(|s| {
        // Rank 1 waits in a barrier that rank 0 never joins; the abort ends it.
        let waiting = s.spawn(|| ranks[1].barrier());
        thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        ranks[0].abort();
        let f = ranks[0].failure().unwrap();
        assert!(f.is_local_abort());
        assert_eq!(ranks[0].barrier().unwrap_err().kind, ErrorKind::InvalidUsage);
        for b in &ranks[1..] {
            let f = failure_within(b, Duration::from_secs(2));
            assert_eq!((f.rank, f.cause.clone()), (0, Cause::Aborted));
        }
        let e = waiting.join().unwrap().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(e.message.contains("rank 0 failed (it aborted its communicator)"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
        // A second abort changes nothing.
        ranks[0].abort();
        assert!(ranks[0].failure().unwrap().is_local_abort());
    });
}

#[test]
fn idle_ranks_are_alive_and_an_orderly_close_is_no_failure() {
    let liveness = Liveness::new(Duration::from_secs(2));
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let mut ranks = on_ranks(3, |r| {
        Bootstrap::connect_watching(addr, None, PROTOCOL_MAGIC, r, 3, T, liveness).unwrap()
    });
    // No call for more than twice the timeout: the receive threads keep the peers informed.
    thread::sleep(liveness.timeout * 2 + Duration::from_millis(500));
    for b in &ranks {
        assert_eq!(b.failure(), None, "rank {}", b.rank());
    }
    on_ranks(3, |r| ranks[r].barrier()).into_iter().for_each(|r| r.unwrap());
    drop(ranks.pop());
    thread::sleep(Duration::from_millis(200));
    for b in &ranks {
        assert_eq!(b.failure(), None, "rank {}", b.rank());
    }
    let e = ranks[0].recv(2, 5).unwrap_err();
    assert!(e.message.contains("rank 2 left"), "{e}");
}

#[test]
fn survivors_of_a_failure_still_exchange_split_messages() {
    let (ranks, fake) = job_with_fake_last_rank(3, patient());
    // Before any failure: in order per tag, apart from user messages of the same tag.
    ranks[0].send_split(1, 7, b"before").unwrap();
    ranks[0].send(1, 7, b"user").unwrap();
    assert_eq!(ranks[1].recv_split(0, 7, false, None).unwrap(), b"before");
    assert_eq!(ranks[1].recv(0, 7).unwrap(), b"user");
    drop(fake);
    for b in &ranks {
        failure_within(b, Duration::from_secs(5));
    }
    // Plain messages are over; split messages between the survivors still go both ways.
    assert!(ranks[0].send(1, 8, b"x").is_err());
    let far = Some(Instant::now() + T);
    on_ranks(2, |r| {
        let b = &ranks[r];
        b.send_split(1 - r, 9, format!("survivor {r}").as_bytes()).unwrap();
        let got = b.recv_split(1 - r, 9, true, far).unwrap();
        assert_eq!(got, format!("survivor {}", 1 - r).as_bytes());
        // A wait that does not go on despite the failure fails at once, as every other wait does.
        assert_eq!(b.recv_split(1 - r, 9, false, far).unwrap_err().kind, ErrorKind::Remote);
    });
    // The dead rank's connection is closed: a wait for it ends at once rather than at the deadline.
    let start = Instant::now();
    let e = ranks[0].recv_split(2, 9, true, far).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5), "{e}");
    assert!(ranks[0].send_split(5, 1, b"").is_err(), "a peer out of range");
}

// ---- registration records: pushed unasked, taken without waiting ----

/// Takes `peer`'s registration records on `b` until `n` have come, waiting up to 5 s for them.
fn take_records(b: &Bootstrap, peer: usize, n: usize) -> Vec<Vec<u8>> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "rank {}: {} of {n} records from peer {peer} after 5 s",
            b.rank(),
            got.len()
        );
        got.extend(b.take_registration_records(peer));
        thread::sleep(Duration::from_millis(2));
    }
    got
}

#[test]
fn registration_records_arrive_unasked_in_order_apart_from_other_messages() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let bs = on_ranks(3, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 3, T).unwrap());
    // Nothing came: an empty answer at once, for every peer, self and a peer out of range included.
    let start = Instant::now();
    for peer in [0, 1, 2, 3, usize::MAX] {
        assert!(bs[1].take_registration_records(peer).is_empty(), "peer {peer}");
    }
    assert!(start.elapsed() < Duration::from_millis(500), "{:?}", start.elapsed());

    // A burst from rank 0, with user and split messages of tag 0 between; one record from rank 2.
    for i in 0..200u32 {
        bs[0].push_registration_record(1, &i.to_le_bytes()).unwrap();
        if i == 100 {
            bs[0].send(1, 0, b"user").unwrap();
            bs[0].send_split(1, 0, b"split").unwrap();
        }
    }
    bs[2].push_registration_record(1, b"from 2").unwrap();
    bs[0].push_registration_record(2, b"to 2").unwrap();
    let got = take_records(&bs[1], 0, 200);
    let expected: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_le_bytes().to_vec()).collect();
    assert_eq!(got, expected, "every record, once, in the order pushed");
    assert_eq!(take_records(&bs[1], 2, 1), [b"from 2"], "kept apart by sender");
    assert_eq!(take_records(&bs[2], 0, 1), [b"to 2"], "and by receiver");
    assert_eq!(bs[1].recv(0, 0).unwrap(), b"user", "records never reach recv");
    assert_eq!(bs[1].recv_split(0, 0, false, None).unwrap(), b"split");
    // The collectives and user messages still line up after them.
    on_ranks(3, |r| {
        check_all_gather(&bs[r], 8)?;
        bs[r].barrier()
    })
    .into_iter()
    .for_each(|r| r.unwrap());
    for (b, peer) in [(&bs[1], 0), (&bs[1], 2), (&bs[2], 0), (&bs[0], 1)] {
        assert!(b.take_registration_records(peer).is_empty(), "nothing more");
    }
}

#[test]
fn a_registration_record_to_self_or_out_of_range_is_refused() {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let bs = on_ranks(2, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 2, T).unwrap());
    let e = bs[1].push_registration_record(1, b"x").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("peer 1 is this rank"), "{e}");
    let e = bs[0].push_registration_record(2, b"x").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("peer 2 out of range for nranks 2"), "{e}");
    assert!(
        bs[1].take_registration_records(1).is_empty(),
        "nothing delivered to self"
    );
}

#[test]
fn registration_records_that_arrived_are_still_taken_after_a_failure() {
    let (ranks, fake) = job_with_fake_last_rank(3, patient());
    ranks[0].push_registration_record(1, b"before").unwrap();
    drop(fake);
    for b in &ranks {
        failure_within(b, Duration::from_secs(5));
    }
    assert_eq!(take_records(&ranks[1], 0, 1), [b"before"]);
    // Pushing is over, as every plain send is.
    let e = ranks[0].push_registration_record(1, b"after").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote);
    assert!(e.message.contains("rank 2 failed"), "{e}");
    assert!(ranks[1].take_registration_records(0).is_empty());
    assert!(
        ranks[1].take_registration_records(2).is_empty(),
        "the dead rank sent none"
    );
}

#[test]
fn a_rank_whose_set_up_failed_fails_the_communicators_of_the_others() {
    // Rank 2 connects to rank 0 only, then stays: rank 0's set-up completes (ranks 1 and 2 connected to
    // it), rank 1's times out waiting for rank 2. Rank 0's communicator holds a rank that has none: it
    // must fail, not wait on rank 1 as on a rank that left in order.
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let short = Duration::from_secs(3);
    thread::scope(|s| {
        let r0 = s.spawn(move || Bootstrap::connect_watching(addr, None, PROTOCOL_MAGIC, 0, 3, short, patient()));
        let r1 = s.spawn(move || Bootstrap::connect_watching(addr, None, PROTOCOL_MAGIC, 1, 3, short, patient()));
        let (mut to_root, _listener) = hello_at_root(addr, 2, 3);
        let (_, table) = wire::read_reply(&mut to_root, Instant::now() + T, 3 * wire::TABLE_ROW_LEN).unwrap();
        let rank0 = wire::decode_table_entry(&table, 0).unwrap().0.unwrap();
        let mut to_rank0 = wire::connect_by(rank0, Instant::now() + T).unwrap();
        to_rank0
            .write_all(&greeting(Kind::PeerHello, PROTOCOL_MAGIC, 2, 3, 0, None))
            .unwrap();
        wire::read_reply(&mut to_rank0, Instant::now() + T, 0).unwrap();
        let b0 = r0.join().unwrap().unwrap();
        let e = r1.join().unwrap().err().unwrap();
        assert!(e.message.contains("waiting for rank 2 to connect"), "{e}");
        let f = failure_within(&b0, Duration::from_secs(2));
        assert_eq!(f.rank, 1, "{f:?}");
        assert!(matches!(f.cause, Cause::ConnectionClosed(_)), "{f:?}");
        assert_eq!(b0.recv(1, 5).unwrap_err().kind, ErrorKind::Remote);
        drop(to_rank0);
    });
}

#[test]
fn a_rank_whose_set_up_fails_says_it_closes_its_connections_without_a_goodbye() {
    let timeout = Duration::from_secs(1);
    let root = local_root(PROTOCOL_MAGIC, timeout);
    let addr = root.local_addr();
    // Rank 2 of 3 reaches the root but never connects to its peers: ranks 0 and 1 connect to each other,
    // wait for it, and give up.
    let (to_root, _listener) = hello_at_root(addr, 2, 3);
    for result in on_ranks(2, |r| {
        Bootstrap::connect(addr, PROTOCOL_MAGIC, r, 3, timeout).map(|_| ())
    }) {
        assert!(result.is_err(), "a set-up without rank 2 succeeded");
    }
    // Each ended its connection to the other without a goodbye, and said so at WARN.
    for rank in [0, 1] {
        let said = crate::logging::tap::warned(&[&format!(
            "rank {rank}: closing its connections to 1 peer(s) without a goodbye"
        )]);
        assert!(
            !said.is_empty(),
            "rank {rank} closed its connection without a WARN line"
        );
    }
    drop(to_root);
}

#[test]
fn a_death_spread_by_powers_of_two_reaches_every_rank_in_log_steps_with_few_notices() {
    use super::topology::spread_to;
    for n in (2usize..=70).chain([255, 256, 257, 1000]) {
        let steps_bound = usize::BITS - (n - 1).leading_zeros(); // ceil(log2 n)
        for failed in [0, n / 2, n - 1] {
            for observer in (0..n).filter(|&r| r != failed).step_by(if n > 100 { 97 } else { 1 }) {
                // Each rank tells its peers once, when it first hears; count the steps and the notices.
                let mut heard = vec![usize::MAX; n];
                heard[observer] = 0;
                let mut frontier = vec![observer];
                let mut notices = 0;
                while !frontier.is_empty() {
                    let mut next = Vec::new();
                    for r in frontier {
                        for p in spread_to(r, n, failed) {
                            assert!(p != r && p != failed && p < n, "n {n}: {r} tells {p}");
                            notices += 1;
                            if heard[p] == usize::MAX {
                                heard[p] = heard[r] + 1;
                                next.push(p);
                            }
                        }
                    }
                    frontier = next;
                }
                for (r, &h) in heard.iter().enumerate() {
                    if r != failed {
                        assert!(
                            h != usize::MAX,
                            "n {n}, rank {failed} dead, seen by {observer}: rank {r} never hears"
                        );
                        assert!(h <= steps_bound as usize + 1, "n {n}: rank {r} hears after {h} steps");
                    }
                }
                assert!(notices <= 2 * n * steps_bound as usize, "n {n}: {notices} notices");
            }
        }
    }
}

// ---- a control plane that scales: neighbours at set-up, connections on first use, notices to all ----

/// An `n`-rank job of real endpoints on threads of this process, watched as `liveness` says.
fn job_watched(n: usize, liveness: Liveness) -> Vec<Bootstrap> {
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    on_ranks(n, |r| {
        Bootstrap::connect_watching(addr, None, PROTOCOL_MAGIC, r, n, T, liveness).unwrap()
    })
}

#[test]
fn set_up_connects_the_neighbours_only_and_other_peers_on_first_use() {
    const N: usize = 16;
    let ranks = job_watched(N, patient());
    for b in &ranks {
        assert_eq!(
            b.connected_peers(),
            super::topology::neighbours(b.rank(), N),
            "rank {}",
            b.rank()
        );
    }
    // Rank 3 is no neighbour of rank 0: the first message makes their connection.
    assert!(!ranks[0].connected_peers().contains(&3));
    ranks[0].send(3, 1, b"first").unwrap();
    assert_eq!(ranks[3].recv(0, 1).unwrap(), b"first");
    ranks[3].send(0, 2, b"back").unwrap();
    assert_eq!(ranks[0].recv(3, 2).unwrap(), b"back");
    assert!(ranks[0].connected_peers().contains(&3) && ranks[3].connected_peers().contains(&0));
    // Ranks 5 and 10 send first at once, many messages each: all arrive, in order.
    on_ranks(2, |i| {
        let (me, peer) = if i == 0 { (5, 10) } else { (10, 5) };
        for k in 0..50u32 {
            ranks[me].send(peer, 7, &k.to_le_bytes()).unwrap();
        }
        for k in 0..50u32 {
            assert_eq!(ranks[me].recv(peer, 7).unwrap(), k.to_le_bytes());
        }
    });
    // The collectives need no other connection.
    on_ranks(N, |r| exercise(&ranks[r], r, N))
        .into_iter()
        .for_each(|r| r.unwrap());
    for b in &ranks {
        assert!(b.connected_peers().len() <= super::topology::neighbours(b.rank(), N).len() + 1);
    }
    // An orderly close of every rank is no failure, lazily made connections too.
    let start = Instant::now();
    drop(ranks);
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}

/// The open file descriptors of this process.
fn fds_now() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

#[test]
fn a_rank_holds_few_descriptors_however_large_the_job() {
    let test = "a_rank_holds_few_descriptors_however_large_the_job";
    alone_in_a_process(test, Duration::from_secs(120), || {
        for n in [16usize, 64] {
            let before = fds_now();
            let ranks = job_watched(n, patient());
            on_ranks(n, |r| ranks[r].barrier()).into_iter().for_each(|r| r.unwrap());
            let per_rank = (fds_now() - before) as f64 / n as f64;
            // A listener, a wake-up pair, and per connection a socket and its duplicate for sending: about
            // 4 log2 n + 3 (the full mesh held 2 (n - 1) + 3).
            let log2 = n.trailing_zeros() as f64;
            assert!(
                per_rank <= 4.0 * log2 + 4.0,
                "{n} ranks: {per_rank:.1} descriptors a rank"
            );
            drop(ranks);
        }
    });
}

#[test]
fn every_death_reaches_every_survivor_even_where_the_dead_ranks_watchers_die_too() {
    const N: usize = 16;
    let liveness = Liveness::new(Duration::from_secs(1));
    // Rank 15 is silent from the start (a stopped process): it never sends a heartbeat. Its neighbours
    // 14 and 0 are killed; the others of its watchers (1, 3, 7, 11, 13) find its silence.
    let (mut ranks, fake) = job_with_fake_last_rank(N, liveness);
    let killed_at = Instant::now();
    let r14 = ranks.pop().unwrap();
    r14.vanish();
    let r0 = ranks.remove(0);
    r0.vanish();
    let survivors: Vec<&Bootstrap> = ranks.iter().collect();
    assert_eq!(survivors.len(), 13);
    let far = Some(Instant::now() + T);
    thread::scope(|s| {
        // Rank 5, no neighbour of 15's, sends it a message larger than the sockets hold: the first message
        // makes the connection, which the silent rank never answers; the send fails once it is declared
        // dead, naming it, instead of hanging.
        let r5 = survivors[4];
        assert_eq!(r5.rank(), 5);
        let blocked = s.spawn(move || (r5.send_split(15, 3, &vec![1u8; 64 << 20]), Instant::now()));
        for b in &survivors {
            for dead in [0, 14, 15] {
                let e = b.recv_split(dead, 1, true, far).unwrap_err();
                assert!(
                    e.message.contains(&format!("rank {dead} failed")),
                    "rank {}: {e}",
                    b.rank()
                );
            }
            // Every death was known in time: the kills at once, the silence after the timeout.
            assert!(killed_at.elapsed() < liveness.timeout * 4, "{:?}", killed_at.elapsed());
        }
        let (sent, ended) = blocked.join().unwrap();
        let e = sent.unwrap_err();
        assert!(e.message.contains("15"), "{e}");
        assert!(ended - killed_at < liveness.timeout * 4, "{:?}", ended - killed_at);
    });
    // The survivors still talk to one another, on connections made after the failure too.
    on_ranks(2, |i| {
        let (me, peer) = if i == 0 { (0, 11) } else { (11, 0) };
        let (b, p) = (&ranks[me], ranks[peer].rank());
        b.send_split(p, 9, b"alive").unwrap();
        assert_eq!(b.recv_split(p, 9, true, far).unwrap(), b"alive");
    });
    drop(fake);
}

#[test]
fn a_death_in_a_large_job_is_known_by_all_in_a_few_hops() {
    const N: usize = 64;
    let mut ranks = job_watched(N, patient());
    let victim = ranks.remove(37);
    let killed = Instant::now();
    victim.vanish();
    for b in &ranks {
        let f = failure_within(b, Duration::from_secs(10));
        assert_eq!(f.rank, 37, "rank {}: {f:?}", b.rank());
    }
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    // A wait for the dead rank ends at once, on a rank connected to it or not.
    for b in &ranks {
        let e = b.recv_split(37, 0, true, Some(Instant::now() + T)).unwrap_err();
        assert!(e.message.contains("rank 37 failed"), "{e}");
    }
}

#[test]
fn the_root_sends_each_rank_its_neighbours_rows_and_the_table_comes_down_the_tree() {
    const N: usize = 64;
    let root = local_root(PROTOCOL_MAGIC, T);
    let addr = root.local_addr();
    let ranks = on_ranks(N, |r| Bootstrap::connect(addr, PROTOCOL_MAGIC, r, N, T).unwrap());
    // Every rank knows every rank's address and host, as that rank listens.
    let here = crate::gpu::ProcessId::this().host;
    for b in &ranks {
        assert_eq!(b.hosts(), &[here; N][..], "rank {}", b.rank());
        for q in &ranks {
            assert_eq!(
                b.peer_addr(q.rank()),
                q.peer_addr(q.rank()),
                "rank {} of {}",
                q.rank(),
                b.rank()
            );
        }
        assert!(b.peer_addr(b.rank()).unwrap().port() != 0);
    }
    // The root wrote rank 0 the whole table and every other rank its own row and its neighbours' (11 at
    // 64 ranks): 64 + 63 * 12 rows, where the whole table to every rank was 64 * 64.
    let rows = root.table_bytes_sent() as usize / wire::TABLE_ROW_LEN;
    let neighbours = topology::neighbours(1, N).len();
    assert_eq!(rows, N + (N - 1) * (neighbours + 1));
    assert!(rows * 3 < N * N, "{rows} rows");
    // The table came over the neighbours: no rank holds a connection beyond them.
    for b in &ranks {
        assert!(
            b.connected_peers().iter().all(|&p| are_neighbours(b.rank(), p, N)),
            "rank {}: {:?}",
            b.rank(),
            b.connected_peers()
        );
    }
}

/// Every rank sends to every other at once, then receives from each (as the collectives' set-up meets every
/// peer of its machine, and registration records go to every peer): most pairs are not neighbours, so both
/// sides of a pair may open its connection at the same moment.
fn all_pairs_at_once(n: usize) {
    job_by_address_doing(n, |b, r| {
        for round in 0..3u64 {
            for p in (0..n).filter(|&p| p != r) {
                b.send(p, 7 + round, format!("{r}->{p} {round}").as_bytes())?;
            }
            for p in (0..n).filter(|&p| p != r) {
                let got = b.recv(p, 7 + round)?;
                assert_eq!(got, format!("{p}->{r} {round}").as_bytes(), "rank {r} from {p}");
            }
            b.barrier()?;
        }
        Ok(())
    });
}

#[test]
fn every_pair_at_once_16_ranks() {
    all_pairs_at_once(16);
}

#[test]
fn every_pair_at_once_32_ranks() {
    all_pairs_at_once(32);
}
