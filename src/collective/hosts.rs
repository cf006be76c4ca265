//! How a communicator's ranks sit on hosts: each host's ranks, each rank's local index on its host, and the
//! rails (the ranks of one local index on every host that has one), which is what collectives across hosts
//! are built from: ours among the ranks of one host, the network engine's among the ranks of one rail.
//!
//! Pure: it is made from every rank's host (the bootstrap's table), so every rank computes the same layout
//! without another exchange, and every rule here is tested without a GPU or a second machine. Hosts are
//! numbered by their lowest rank, and a host's ranks are kept in rank order, whatever order the job gave
//! them (ranks of two hosts may interleave).

use std::fmt;

/// The hosts of a communicator's ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    /// Each host's ranks, in rank order; hosts in the order of their lowest rank.
    hosts: Vec<Vec<usize>>,
    /// Each rank's host (an index into `hosts`).
    host_of: Vec<usize>,
    /// Each rank's index among its host's ranks.
    local_index: Vec<usize>,
}

impl HostLayout {
    /// The layout of ranks whose hosts are `host_keys` (one entry a rank; equal keys: the same host).
    pub fn new<K: PartialEq>(host_keys: &[K]) -> HostLayout {
        let mut keys: Vec<&K> = Vec::new();
        let mut hosts: Vec<Vec<usize>> = Vec::new();
        let mut host_of = Vec::with_capacity(host_keys.len());
        let mut local_index = Vec::with_capacity(host_keys.len());
        for (rank, key) in host_keys.iter().enumerate() {
            // A linear search: a job has few hosts next to its ranks, and this runs once a communicator.
            let host = match keys.iter().position(|k| *k == key) {
                Some(h) => h,
                None => {
                    keys.push(key);
                    hosts.push(Vec::new());
                    hosts.len() - 1
                }
            };
            local_index.push(hosts[host].len());
            hosts[host].push(rank);
            host_of.push(host);
        }
        HostLayout {
            hosts,
            host_of,
            local_index,
        }
    }

    pub fn nranks(&self) -> usize {
        self.host_of.len()
    }

    /// How many hosts the ranks span.
    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    pub fn spans_hosts(&self) -> bool {
        self.hosts.len() > 1
    }

    /// The ranks of host `host`, in rank order.
    pub fn ranks_of_host(&self, host: usize) -> &[usize] {
        &self.hosts[host]
    }

    /// The host of `rank`.
    pub fn host_of(&self, rank: usize) -> usize {
        self.host_of[rank]
    }

    /// The index of `rank` among its host's ranks.
    pub fn local_index(&self, rank: usize) -> usize {
        self.local_index[rank]
    }

    /// Whether every host has as many ranks as every other.
    pub fn uniform(&self) -> bool {
        self.hosts.windows(2).all(|w| w[0].len() == w[1].len())
    }

    /// How many rails there are: the most ranks any host has.
    pub fn rail_count(&self) -> usize {
        self.hosts.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Rail `local`: the rank of local index `local` on every host that has one, in host order. Rail 0 holds
    /// every host's first rank (its leader), so it reaches every host whatever the layout.
    pub fn rail(&self, local: usize) -> Vec<usize> {
        self.hosts.iter().filter_map(|h| h.get(local).copied()).collect()
    }

    /// Every host's first rank: rail 0.
    pub fn leaders(&self) -> Vec<usize> {
        self.rail(0)
    }
}

/// For the INFO line of a communicator across hosts: "2 hosts (ranks 0-1; 2-3), 2 rails".
impl fmt::Display for HostLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<String> = self.hosts.iter().map(|h| ranks_text(h)).collect();
        write!(
            f,
            "{} host{} (ranks {}), {} rail{}{}",
            self.hosts.len(),
            if self.hosts.len() == 1 { "" } else { "s" },
            hosts.join("; "),
            self.rail_count(),
            if self.rail_count() == 1 { "" } else { "s" },
            if self.uniform() { "" } else { ", hosts of unequal sizes" }
        )
    }
}

/// Ranks in order as runs: "0-3,6,8-9".
fn ranks_text(ranks: &[usize]) -> String {
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        runs.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    runs.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_hosts_of_two_ranks_have_two_rails() {
        let l = HostLayout::new(&[7u64, 7, 9, 9]);
        assert_eq!((l.nranks(), l.host_count(), l.rail_count()), (4, 2, 2));
        assert!(l.spans_hosts() && l.uniform());
        assert_eq!(l.ranks_of_host(1), &[2, 3]);
        assert_eq!((l.host_of(2), l.local_index(2), l.local_index(3)), (1, 0, 1));
        assert_eq!((l.rail(0), l.rail(1)), (vec![0, 2], vec![1, 3]));
        assert_eq!(l.leaders(), vec![0, 2]);
        assert_eq!(l.to_string(), "2 hosts (ranks 0-1; 2-3), 2 rails");
    }

    #[test]
    fn hosts_of_unequal_sizes_leave_the_higher_rails_short() {
        // 3 hosts of 2 + 1 + 1 ranks.
        let l = HostLayout::new(&["a", "a", "b", "c"]);
        assert!(!l.uniform());
        assert_eq!((l.host_count(), l.rail_count()), (3, 2));
        assert_eq!(l.rail(0), vec![0, 2, 3], "rail 0 reaches every host");
        assert_eq!(l.rail(1), vec![1]);
        assert!(l.rail(2).is_empty());
        assert_eq!(
            l.to_string(),
            "3 hosts (ranks 0-1; 2; 3), 2 rails, hosts of unequal sizes"
        );
    }

    #[test]
    fn interleaved_ranks_keep_rank_order_on_each_host() {
        let l = HostLayout::new(&[1, 2, 1, 2, 2]);
        assert_eq!((l.ranks_of_host(0), l.ranks_of_host(1)), (&[0, 2][..], &[1, 3, 4][..]));
        assert_eq!((l.local_index(2), l.local_index(4)), (1, 2));
        assert_eq!(l.rail(1), vec![2, 3]);
        assert_eq!(
            l.to_string(),
            "2 hosts (ranks 0,2; 1,3-4), 3 rails, hosts of unequal sizes"
        );
    }

    #[test]
    fn one_host_and_one_rank_a_host() {
        let one = HostLayout::new(&[5u64; 3]);
        assert!(!one.spans_hosts() && one.uniform());
        assert_eq!((one.rail_count(), one.leaders()), (3, vec![0]));
        assert_eq!(one.to_string(), "1 host (ranks 0-2), 3 rails");
        let apart = HostLayout::new(&[1u64, 2, 3]);
        assert_eq!((apart.rail_count(), apart.rail(0)), (1, vec![0, 1, 2]));
        assert_eq!(apart.to_string(), "3 hosts (ranks 0; 1; 2), 1 rail");
        let none = HostLayout::new::<u64>(&[]);
        assert_eq!((none.nranks(), none.host_count(), none.rail_count()), (0, 0, 0));
        assert!(none.uniform() && !none.spans_hosts());
    }
}
