//! A simulation of the control plane's traffic at sizes no machine here runs (1k to 100k ranks): the same
//! choices of who sends what to whom as the real bootstrap (`topology.rs`'s `neighbours`, `set_up_rows`,
//! `spread_to`, binomial tree and survivors' tree, the wire's row and frame sizes), on a simulated network
//! where each message costs its sender and its receiver some time (one message at a time per rank: a
//! receive thread, a socket) and its bytes at the sender's bandwidth, and travels with a latency, some
//! messages lost and resent after TCP's retransmission timeout.
//!
//! It gives the time to initialise (the root gathers every hello and sends each rank its own and its
//! neighbours' rows, rank 0 every one; each rank connects to its neighbours; the whole table comes down
//! the binomial tree from rank 0), for a death to be known by every survivor (its neighbours see its
//! connections close; each rank that learns passes the notice on to `spread_to`), for a shrink's id to
//! reach every survivor down the tree, then the new communicator's initialisation, and for split's and
//! grow's exchange of words (`Bootstrap::gather_words`, up the binomial tree and back down).
//! `docs/PERFORMANCE.md` has its figures beside the measured ones (`cargo test --lib simulated_figures --
//! --ignored --nocapture` prints them).

use super::topology::{neighbours, set_up_rows, spread_to, survivor_tree, tree_children, tree_parent};
use super::wire::{FRAME_HEADER_LEN, TABLE_ENTRY_LEN, TABLE_ROW_LEN};
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
    /// The root sends every rank the whole table (`n` entries of `TABLE_ENTRY_LEN` bytes), then the ranks
    /// connect to their neighbours: what the bootstrap did up to wire protocol 5, kept to compare.
    Whole,
    /// What the bootstrap does (wire protocol 6): the root sends each rank the rows of `set_up_rows` (its
    /// own and its neighbours', rank 0 every one, `TABLE_ROW_LEN` bytes each), the ranks connect to their
    /// neighbours, then the whole table goes down the binomial tree from rank 0 (`tree_children`), each
    /// rank passing it on to its children one after another once it holds it and its neighbours have
    /// connected (its children are among them).
    Tree,
}

/// What an initialisation came to.
pub struct Init {
    /// When the last rank holds the whole table and has passed it on.
    pub time: f64,
    /// The bytes of table rows the root sent (what `Root::table_bytes_sent` counts).
    pub root_bytes: usize,
    /// The depth of the tree the table came down (0 for `Table::Whole`).
    pub depth: usize,
    /// The fewest rows any rank ends with: `n` when every rank holds the whole table.
    pub fewest_rows: usize,
}

/// Initialisation: every rank's hello reaches the root (which takes them one at a time), the root sends
/// every rank its rows, one rank after another in rank order (`table` says which rows), then every rank
/// connects to its lower neighbours (its own handshakes one after another, each answered by a receive
/// thread that takes one at a time), and with `Table::Tree` the whole table goes down the binomial tree.
pub fn init(n: usize, net: &Network, seed: u64, table: Table) -> Init {
    let mut rng = Rng(seed | 1);
    // The hellos arrive about at once; the root takes them one at a time.
    let mut root_free = 0.0f64;
    for _ in 0..n {
        let arrives = net.send_cost + wire_time(net, &mut rng);
        root_free = root_free.max(arrives) + net.recv_cost;
    }
    // The rows, to one rank after another, each reply as long as the rows it carries.
    let mut held = vec![0usize; n];
    let mut has_rows = vec![0.0f64; n];
    let mut root_bytes = 0;
    let mut t = root_free;
    for r in 0..n {
        let (rows, len) = match table {
            Table::Whole => (n, TABLE_ENTRY_LEN),
            Table::Tree => (set_up_rows(r, n).len(), TABLE_ROW_LEN),
        };
        held[r] = rows;
        root_bytes += rows * len;
        t += net.send_cost + (rows * len) as f64 / net.bandwidth;
        has_rows[r] = t + wire_time(net, &mut rng);
    }
    // The neighbours: each rank greets its lower ones (once the lower one has its rows, which is when it
    // listens for sure: it listened before its hello), the lower one's receive thread answers in turn.
    let mut accept_free = vec![0.0f64; n];
    let mut ready = has_rows.clone();
    for r in 0..n {
        let mut t = has_rows[r];
        for p in neighbours(r, n).into_iter().filter(|&p| p < r) {
            t += net.send_cost;
            let at = t + wire_time(net, &mut rng);
            let answered = at.max(accept_free[p]) + net.connect_cost;
            accept_free[p] = answered;
            ready[p] = ready[p].max(answered);
            ready[r] = ready[r].max(answered + wire_time(net, &mut rng));
        }
    }
    let connected = ready.iter().copied().fold(0.0, f64::max);
    if table == Table::Whole {
        return Init {
            time: connected,
            root_bytes,
            depth: 0,
            fewest_rows: held.into_iter().min().unwrap_or(0),
        };
    }
    // The table down the tree. A parent's index is below its children's (`tree_parent` clears a bit), so in
    // rank order each rank's table has come before it is passed on; a rank the tree did not reach never
    // gets it, and its time stays infinite.
    let mut table_at = vec![f64::INFINITY; n];
    table_at[0] = has_rows[0];
    let mut depth = vec![0usize; n];
    let mut finished = connected;
    for r in 0..n {
        let mut t = table_at[r].max(ready[r]);
        // The message carries what this rank holds: the whole table, or less where the tree is wrong.
        let bytes = (held[r] * TABLE_ROW_LEN + FRAME_HEADER_LEN) as f64 / net.bandwidth;
        for c in tree_children(r, n) {
            t += net.send_cost + bytes;
            table_at[c] = t + wire_time(net, &mut rng) + net.recv_cost;
            held[c] = held[c].max(held[r]);
            depth[c] = depth[r] + 1;
        }
        finished = finished.max(t);
    }
    Init {
        time: finished,
        root_bytes,
        depth: depth.into_iter().max().unwrap_or(0),
        fewest_rows: held.into_iter().min().unwrap_or(0),
    }
}

/// What split's and grow's exchange of words (`Bootstrap::gather_words`) came to.
pub struct Gather {
    /// When rank 0 holds every word: the end of the way up.
    pub up: f64,
    /// When the last rank holds the whole list and has passed it on.
    pub time: f64,
    /// The fewest words any rank ends with: `n` when every rank holds every word.
    pub fewest_words: usize,
    /// The most messages one rank sends.
    pub most_sends: usize,
}

/// `Bootstrap::gather_words` with every rank calling at once with a word of `word` bytes (a split's
/// colour and key: 8): up the binomial tree (`tree_parent`), each rank sending its subtree's words once its
/// children's have come (its receive thread takes them one at a time), then rank 0's list of all of them
/// down it (`tree_children`), over connections the ranks have (every edge joins neighbours).
pub fn gather_words(n: usize, word: usize, net: &Network, seed: u64) -> Gather {
    let mut rng = Rng(seed | 1);
    // `write_words`: a rank and a length (4 bytes each) before each word, in one frame.
    let bytes = |words: usize| (words * (8 + word) + FRAME_HEADER_LEN) as f64 / net.bandwidth;
    let mut words = vec![1usize; n];
    let mut arrivals: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut sends = vec![0usize; n];
    let mut free = vec![0.0f64; n];
    // Up. Children's indices are above their parent's, so from the last rank down every child has sent
    // before its parent is looked at; words sent to a parent already looked at would be lost.
    for r in (0..n).rev() {
        let mut got = std::mem::take(&mut arrivals[r]);
        got.sort_by(f64::total_cmp);
        let mut t = got.into_iter().fold(0.0, |t: f64, a| t.max(a) + net.recv_cost);
        if r > 0 {
            let p = tree_parent(r);
            t += net.send_cost + bytes(words[r]);
            arrivals[p].push(t + wire_time(net, &mut rng));
            words[p] += words[r];
            sends[r] += 1;
        }
        free[r] = t;
    }
    let up = free[0];
    // Down: the list that comes to a rank is what it passes on, to its children one after another.
    let mut list_at = vec![f64::INFINITY; n];
    list_at[0] = up;
    let mut held = vec![0usize; n];
    held[0] = words[0];
    let mut time = up;
    for r in 0..n {
        let mut t = list_at[r].max(free[r]);
        for c in tree_children(r, n) {
            t += net.send_cost + bytes(held[r]);
            list_at[c] = t + wire_time(net, &mut rng) + net.recv_cost;
            held[c] = held[r];
            sends[r] += 1;
        }
        time = time.max(t);
    }
    Gather {
        up,
        time,
        fewest_words: held.into_iter().min().unwrap_or(0),
        most_sends: sends.into_iter().max().unwrap_or(0),
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

    fn ceil_log2(n: usize) -> usize {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }

    #[test]
    fn the_simulation_grows_as_the_design_says() {
        let net = Network::datacentre();
        // Notices: every survivor knows in about log2 n steps, with at most 2 n log2 n notices.
        for n in [16usize, 256, 1024] {
            let s = notice_spread(n, n - 1, &net, 7);
            let steps = ceil_log2(n);
            assert!(s.notices <= 2 * n * steps, "{n}: {} notices", s.notices);
            assert!(s.all_know.is_finite() && s.all_know < 0.01, "{n}: {}", s.all_know);
        }
        // The tree's depth, not its size, sets the broadcast's time; the tree of neighbours needs no
        // connection made.
        assert!(tree_broadcast(1024, &net, 1) < 20.0 * (net.latency * 2.0 + net.connect_cost + net.recv_cost));
        assert!(survivor_broadcast(1024, 512, &net, 1) < tree_broadcast(1023, &net, 1));
        // The whole table to every rank grows with n² at the root; the rows and the tree do not.
        let whole = |n| init(n, &net, 1, Table::Whole).time;
        assert!(whole(1024) < whole(4096));
        assert!(init(65536, &net, 1, Table::Tree).time < whole(65536));
    }

    #[test]
    fn the_table_comes_down_a_tree_of_log_depth_and_the_root_sends_n_log_n_rows() {
        let net = Network::datacentre();
        for n in [2usize, 3, 64, 1000, 1024, 1025, 4097] {
            let i = init(n, &net, 2, Table::Tree);
            assert!(i.time.is_finite(), "{n}: some rank never got the table");
            assert_eq!(i.fewest_rows, n, "{n}: a rank without the whole table");
            // The deepest index below n is one with the most bits set: floor(log2 n) hops from rank 0, which
            // is ceil(log2 n) where n is a power of two.
            assert_eq!(
                i.depth,
                (usize::BITS - 1 - n.leading_zeros()) as usize,
                "{n}: the table's tree"
            );
            // At most its own and 2 ceil(log2 n) neighbours' rows a rank, and rank 0's n.
            let rows = i.root_bytes / TABLE_ROW_LEN;
            assert!(rows <= n + (n - 1) * (2 * ceil_log2(n) + 1), "{n}: {rows} rows");
            // Below 4 ranks everybody is everybody's neighbour: the table is whole everywhere.
            if n >= 64 {
                assert!(rows * 3 < n * n, "{n}: {rows} rows");
            }
        }
        // Where n is a power of two every rank but 0 has 2 log2 n - 1 neighbours (the one n / 2 away is
        // both ways): the 64-rank test of the real root counts the same.
        let n = 4096;
        let rows = init(n, &net, 2, Table::Tree).root_bytes / TABLE_ROW_LEN;
        assert_eq!(rows, n + (n - 1) * (2 * 12 - 1 + 1));
        // Four times the ranks: a little over four times the root's bytes (n log n), where the whole
        // table to every rank is sixteen times (n²).
        let bytes = |n, t| init(n, &net, 2, t).root_bytes as f64;
        let tree = bytes(16384, Table::Tree) / bytes(4096, Table::Tree);
        let whole = bytes(16384, Table::Whole) / bytes(4096, Table::Whole);
        assert!((4.0..5.0).contains(&tree), "{tree}");
        assert!((whole - 16.0).abs() < 1e-9, "{whole}");
    }

    #[test]
    fn split_words_go_up_and_down_the_tree_to_every_rank() {
        let net = Network::datacentre();
        for n in [1usize, 2, 5, 1000, 1024, 4097] {
            let g = gather_words(n, 8, &net, 3);
            assert_eq!(g.fewest_words, n, "{n}: a rank without every word");
            assert!(g.time.is_finite() && g.up <= g.time, "{n}: {} then {}", g.up, g.time);
            // One message up and one to each child: at most ceil(log2 n) + 1 a rank.
            assert!(g.most_sends <= ceil_log2(n.max(2)) + 1, "{n}: {} sends", g.most_sends);
        }
        // The depth sets the time: twice the tree, each step a message or two, plus the lists' bytes.
        let n = 4096;
        let g = gather_words(n, 8, &net, 3);
        let step = 2.0 * net.latency + net.send_cost + net.recv_cost;
        let list = (n * 16) as f64 / net.bandwidth;
        let bound = 2.0 * ceil_log2(n) as f64 * (2.0 * step + list) + 3.0 * ceil_log2(n) as f64 * list;
        assert!(g.time < bound, "{} s against {bound} s", g.time);
    }

    /// The figures of docs/PERFORMANCE.md.
    #[test]
    #[ignore]
    fn simulated_figures() {
        let nets = [
            ("data centre", Network::datacentre()),
            (
                "1% loss",
                Network {
                    loss: 0.01,
                    ..Network::datacentre()
                },
            ),
        ];
        println!(
            "| network | ranks | init | root sends | tree depth | init, whole table to each rank (protocol 5) | \
             death known by all | notices | shrink's id to all (binomial tree) | shrink | split's words: at rank 0, at all |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for (name, net) in nets {
            for n in [1_000usize, 10_000, 100_000] {
                let tree = init(n, &net, 3, Table::Tree);
                assert_eq!(tree.fewest_rows, n);
                let whole = init(n, &net, 3, Table::Whole).time;
                let spread = notice_spread(n, n / 2, &net, 5);
                let id = survivor_broadcast(n, n / 2, &net, 9);
                let binomial = tree_broadcast(n - 1, &net, 9);
                let shrink = id + init(n - 1, &net, 11, Table::Tree).time;
                let words = gather_words(n, 8, &net, 13);
                assert_eq!(words.fewest_words, n);
                println!(
                    "| {name} | {n} | {:.3} s | {:.2} MB | {} | {whole:.3} s | {:.2} ms | {} | {:.2} ms ({:.2} ms) | \
                     {shrink:.3} s | {:.2} ms, {:.2} ms |",
                    tree.time,
                    tree.root_bytes as f64 / 1e6,
                    tree.depth,
                    spread.all_know * 1e3,
                    spread.notices,
                    id * 1e3,
                    binomial * 1e3,
                    words.up * 1e3,
                    words.time * 1e3,
                );
            }
        }
    }
}
