//! A simulation of the control plane's traffic at sizes no machine here runs (1k to 100k ranks): the same
//! choices of who sends what to whom as the real bootstrap (`topology.rs`'s `neighbours`, `spread_to` and
//! binomial tree, the root's gathering and its table), on a simulated network where each message costs its
//! sender and its receiver some time (one message at a time per rank: a receive thread, a socket) and
//! travels with a latency, some messages lost and resent after TCP's retransmission timeout.
//!
//! It gives the time to initialise (the root gathers every hello and sends every rank the table, then each
//! rank connects to its neighbours), for a death to be known by every survivor (its neighbours see its
//! connections close; each rank that learns passes the notice on to `spread_to`), and for a shrink's id to
//! reach every survivor down the tree, then the new communicator's initialisation. `docs/PERFORMANCE.md`
//! has its figures beside the measured ones (`cargo test --release --lib simulated_figures -- --ignored
//! --nocapture` prints them).

use super::topology::{neighbours, spread_to, survivor_tree, tree_children};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The simulated network and hosts, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Network {
    /// One way, from a send to its arrival (plus a uniform jitter of as much again).
    pub latency: f64,
    /// A sender's time per message (the system call, the copy).
    pub send_cost: f64,
    /// A receiver's time per message (its receive thread reads and acts on one at a time).
    pub recv_cost: f64,
    /// Bytes a second one rank sends (the root's table).
    pub bandwidth: f64,
    /// The share of messages lost once and resent after `rto`.
    pub loss: f64,
    pub rto: f64,
    /// The TCP handshake and the bootstrap's greeting and answer, for one connection.
    pub connect_cost: f64,
}

impl Network {
    /// One data centre's network: 25 µs one way, 5 µs a message at each end, 10 GB/s, no loss.
    pub fn datacentre() -> Network {
        Network {
            latency: 25e-6,
            send_cost: 5e-6,
            recv_cost: 5e-6,
            bandwidth: 10e9,
            loss: 0.0,
            rto: 0.2,
            connect_cost: 150e-6,
        }
    }
}

/// A small deterministic random source (xorshift), so that the figures repeat.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The time one message takes on the wire, its loss and resend included.
fn wire_time(net: &Network, rng: &mut Rng) -> f64 {
    let mut t = net.latency * (1.0 + rng.unit());
    if rng.unit() < net.loss {
        t += net.rto;
    }
    t
}

/// How the ranks learn one another's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// The root sends every rank the whole table (`n` entries): what the bootstrap did up to wire protocol 5.
    Whole,
    /// The root sends every rank its neighbours' entries only; the ranks then all-gather the whole table
    /// over their neighbours (Bruck's algorithm: log2 n rounds, the last carrying half the table). The
    /// bootstrap now sends each rank its neighbours' rows too, but rank 0 the whole table, which then goes
    /// down the binomial tree of neighbours (log2 n steps, each the whole table): this variant is the
    /// nearer model of it.
    Neighbours,
}

/// Initialisation: every rank's hello reaches the root (which takes them one at a time), the root sends
/// every rank its table (of `entry`-byte entries, `table` says which), then every rank connects to its
/// lower neighbours (its own handshakes one after another, each answered by a receive thread that takes
/// one at a time).
pub fn init_time(n: usize, net: &Network, entry: usize, seed: u64, table: Table) -> f64 {
    let mut rng = Rng(seed | 1);
    // The hellos arrive about at once; the root takes them one at a time.
    let mut root_free = 0.0f64;
    for _ in 0..n {
        let arrives = net.send_cost + wire_time(net, &mut rng);
        root_free = root_free.max(arrives) + net.recv_cost;
    }
    // The table, to one rank after another.
    let entries = match table {
        Table::Whole => n,
        Table::Neighbours => neighbours(0, n).len(),
    };
    let bytes = (entries * entry) as f64 / net.bandwidth;
    let mut has_table = vec![0.0f64; n];
    let mut t = root_free;
    for slot in has_table.iter_mut() {
        t += net.send_cost + bytes;
        *slot = t + wire_time(net, &mut rng);
    }
    // The neighbours: each rank greets its lower ones (once the lower one has its table, which is when it
    // listens for sure: it listened before its hello), the lower one's receive thread answers in turn.
    let mut accept_free = vec![0.0f64; n];
    let mut ready = has_table.clone();
    for r in 0..n {
        let mut t = has_table[r];
        for p in neighbours(r, n).into_iter().filter(|&p| p < r) {
            t += net.send_cost;
            let at = t + wire_time(net, &mut rng);
            let answered = at.max(accept_free[p]) + net.connect_cost;
            accept_free[p] = answered;
            ready[p] = ready[p].max(answered);
            ready[r] = ready[r].max(answered + wire_time(net, &mut rng));
        }
    }
    let connected = ready.into_iter().fold(0.0, f64::max);
    match table {
        Table::Whole => connected,
        Table::Neighbours => {
            // Round k: every rank sends 2^k entries to the rank 2^k before it (at once: all in step).
            let mut t = connected;
            let mut d = 1;
            while d < n {
                let block = (d.min(n - d) * entry) as f64 / net.bandwidth;
                t += net.send_cost + block + wire_time(net, &mut rng) + net.recv_cost;
                d *= 2;
            }
            t
        }
    }
}

/// What a death's spread came to: when the last survivor knew, and how many notices went out.
pub struct Spread {
    pub all_know: f64,
    pub notices: usize,
}

/// A death: rank `dead`'s neighbours see its connections close (each after a latency), and every rank
/// that learns of it, first-hand or by a notice, passes it on to `spread_to` once.
pub fn notice_spread(n: usize, dead: usize, net: &Network, seed: u64) -> Spread {
    let mut rng = Rng(seed | 1);
    let mut known = vec![f64::INFINITY; n];
    // (time, rank): when a notice (or the close) reaches a rank.
    let mut events: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let key = |t: f64| (t * 1e12) as u64;
    for p in neighbours(dead, n) {
        events.push(Reverse((key(wire_time(net, &mut rng)), p)));
    }
    let mut busy = vec![0.0f64; n];
    let mut notices = 0;
    while let Some(Reverse((at, r))) = events.pop() {
        let at = at as f64 / 1e12;
        // The receive thread takes one message at a time.
        let done = at.max(busy[r]) + net.recv_cost;
        busy[r] = done;
        if known[r].is_finite() {
            continue;
        }
        known[r] = done;
        let mut t = done;
        for p in spread_to(r, n, dead) {
            t += net.send_cost;
            notices += 1;
            events.push(Reverse((key(t + wire_time(net, &mut rng)), p)));
        }
        busy[r] = t;
    }
    let all_know = (0..n).filter(|&r| r != dead).map(|r| known[r]).fold(0.0, f64::max);
    Spread { all_know, notices }
}

/// A shrink's id down the survivors' tree of neighbours (`survivor_tree`: the survivors of a job of `n`
/// without rank `dead`): each passes it on to its children one after another, over connections it has.
pub fn survivor_broadcast(n: usize, dead: usize, net: &Network, seed: u64) -> f64 {
    let mut rng = Rng(seed | 1);
    let kept: Vec<usize> = (0..n).filter(|&r| r != dead).collect();
    let parent = survivor_tree(&kept, n).expect("one rank left out cuts nobody off");
    let mut children = vec![Vec::new(); kept.len()];
    for (j, p) in parent.iter().enumerate() {
        if let Some(p) = p {
            children[*p].push(j);
        }
    }
    // Breadth first: a parent has the id before its children.
    let mut at = vec![0.0f64; kept.len()];
    let mut queue = std::collections::VecDeque::from([0usize]);
    let mut last = 0.0f64;
    while let Some(i) = queue.pop_front() {
        let mut t = at[i];
        for &c in &children[i] {
            t += net.send_cost;
            at[c] = t + wire_time(net, &mut rng) + net.recv_cost;
            last = last.max(at[c]);
            queue.push_back(c);
        }
    }
    last
}

/// A shrink's id down the binomial tree of `m` survivors (where the ranks left out cut the tree of
/// neighbours): each passes it on to its children one after another, a connection made first.
pub fn tree_broadcast(m: usize, net: &Network, seed: u64) -> f64 {
    let mut rng = Rng(seed | 1);
    let mut at = vec![0.0f64; m];
    let mut last = 0.0f64;
    for i in 0..m {
        let mut t = at[i];
        for c in tree_children(i, m) {
            t += net.send_cost + net.connect_cost;
            at[c] = t + wire_time(net, &mut rng) + net.recv_cost;
            last = last.max(at[c]);
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulation_grows_as_the_design_says() {
        let net = Network::datacentre();
        // Notices: every survivor knows in about log2 n steps, with at most 2 n log2 n notices.
        for n in [16usize, 256, 1024] {
            let s = notice_spread(n, n - 1, &net, 7);
            let steps = (usize::BITS - (n - 1).leading_zeros()) as usize;
            assert!(s.notices <= 2 * n * steps, "{n}: {} notices", s.notices);
            assert!(s.all_know.is_finite() && s.all_know < 0.01, "{n}: {}", s.all_know);
        }
        // The tree's depth, not its size, sets the broadcast's time; the tree of neighbours needs no
        // connection made.
        assert!(tree_broadcast(1024, &net, 1) < 20.0 * (net.latency * 2.0 + net.connect_cost + net.recv_cost));
        assert!(survivor_broadcast(1024, 512, &net, 1) < tree_broadcast(1023, &net, 1));
        // Initialisation is the root's: it grows with n (the table, n entries to each of n ranks, is n²).
        assert!(init_time(1024, &net, 36, 1, Table::Whole) < init_time(4096, &net, 36, 1, Table::Whole));
        assert!(init_time(65536, &net, 36, 1, Table::Neighbours) < init_time(65536, &net, 36, 1, Table::Whole));
    }

    /// The figures of docs/PERFORMANCE.md.
    #[test]
    #[ignore]
    fn simulated_figures() {
        let nets = [
            ("data centre", Network::datacentre()),
            (
                "data centre, 1% loss",
                Network {
                    loss: 0.01,
                    ..Network::datacentre()
                },
            ),
        ];
        println!(
            "| network | ranks | init | init, neighbours' table | death known by all | notices | shrink's id to all (binomial tree) | shrink |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        for (name, net) in nets {
            for n in [1_000usize, 10_000, 100_000] {
                let init = init_time(n, &net, 36, 3, Table::Whole);
                let sparse = init_time(n, &net, 36, 3, Table::Neighbours);
                let spread = notice_spread(n, n / 2, &net, 5);
                let id = survivor_broadcast(n, n / 2, &net, 9);
                let binomial = tree_broadcast(n - 1, &net, 9);
                let shrink = id + init_time(n - 1, &net, 36, 11, Table::Whole);
                println!(
                    "| {name} | {n} | {init:.3} s | {sparse:.3} s | {:.2} ms | {} | {:.2} ms ({:.2} ms) | {shrink:.3} s |",
                    spread.all_know * 1e3,
                    spread.notices,
                    id * 1e3,
                    binomial * 1e3
                );
            }
        }
    }
}
