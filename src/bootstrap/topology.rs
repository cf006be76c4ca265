//! Who talks to whom in the bootstrap's own traffic: pure functions of the rank and the job's size, so that
//! every rank computes the same graph without a word, and a simulated network can drive them as the real one
//! does.
//!
//! - `neighbours`: the ranks `rank ± 2^k` (mod `nranks`). Set-up connects exactly these (the higher rank of a
//!   pair opens the connection), their heartbeats and silences are what liveness watches, and notices travel
//!   over them: at most `2 ceil(log2 n)` connections a rank, `2 log2 n` watchers for each rank (a rank goes
//!   unwatched only if every one of them dies), and the ring (`± 1`) and dissemination (`± 2^k`) patterns of
//!   the host collectives are among them. Any other pair connects when one of them first sends (`lazily`).
//! - `set_up_rows`: the rows of the table the root sends a rank (its own and its neighbours', every one to
//!   rank 0, which passes the whole table down the binomial tree).
//! - `spread_to`: the ranks a notice goes on to from a rank that has just learned of it.
//! - `tree_parent` and `tree_children`: a binomial tree over `0..m` rooted at 0 (a shrink's id goes down it).

/// The ranks `rank ± 2^k` (mod `nranks`) for `2^k < nranks`, but `rank` itself: sorted, without repeats.
/// Symmetric: `p` is a neighbour of `r` exactly when `r` is one of `p`.
pub fn neighbours(rank: usize, nranks: usize) -> Vec<usize> {
    let mut out: Vec<usize> = powers_below(nranks)
        .flat_map(|d| [(rank + d) % nranks, (rank + nranks - d) % nranks])
        .filter(|&p| p != rank)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `a` and `b` are neighbours (`neighbours`), without building the list.
pub fn are_neighbours(a: usize, b: usize, nranks: usize) -> bool {
    if a == b || a >= nranks || b >= nranks {
        return false;
    }
    let d = (b + nranks - a) % nranks;
    d.is_power_of_two() || (nranks - d).is_power_of_two()
}

/// The ranks whose rows of the table the root sends `rank` at set-up, sorted: its own and its neighbours'
/// (what its set-up connects), and every rank's to rank 0, the root of the tree the whole table then goes
/// down. One function for the root, the rank that checks its reply and the simulation, so that the three
/// agree on what the root sends: `n (2 log2 n + 2)` rows at most in all.
pub fn set_up_rows(rank: usize, nranks: usize) -> Vec<usize> {
    if rank == 0 {
        return (0..nranks).collect();
    }
    let mut rows = neighbours(rank, nranks);
    rows.push(rank);
    rows.sort_unstable();
    rows
}

/// 1, 2, 4, ... below `nranks`.
fn powers_below(nranks: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2)).take_while(move |&d| d < nranks)
}

/// The ranks `rank` of `nranks` passes a notice about `failed` on to: its neighbours, the ranks 1, 2, 4,
/// ... before and after it (modulo `nranks`), but `failed`. Every one does so once, when it first learns
/// of it, so a notice that one rank starts reaches every other (any distance is a sum of distinct powers of
/// two, and a path that runs through the dead rank has another order of the same steps that does not), in
/// at most `ceil(log2 n)` steps (fewer: both directions at once) and `2 n ceil(log2 n)` notices in all.
pub fn spread_to(rank: usize, nranks: usize, failed: usize) -> Vec<usize> {
    neighbours(rank, nranks).into_iter().filter(|&p| p != failed).collect()
}

/// The parent of `index` (> 0) in the binomial tree over `0..m` rooted at 0: `index` without its lowest
/// set bit.
pub fn tree_parent(index: usize) -> usize {
    debug_assert!(index > 0, "the root has no parent");
    index & (index - 1)
}

/// The children of `index` in the binomial tree over `0..m`: `index + 2^k` for every `2^k` below the lowest
/// set bit of `index` (every `2^k` for the root), within `m`, the farthest first. The tree is `ceil(log2 m)`
/// deep and a node has at most that many children.
pub fn tree_children(index: usize, m: usize) -> Vec<usize> {
    // The root's children span the whole tree; another node's stop below its lowest set bit.
    let below = if index == 0 { m } else { index & index.wrapping_neg() };
    // The largest subtree first, so that the deepest path starts at once: `ceil(log2 m)` steps in all.
    let mut children: Vec<usize> = powers_below(below).map(|d| index + d).filter(|&c| c < m).collect();
    children.reverse();
    children
}

/// A tree over the survivors `kept` of a job of `nranks` (ranks, in order) whose every edge joins
/// neighbours, so that it runs over connections the ranks have already: a breadth-first search from
/// `kept[0]` (neighbours in rank order), each survivor's parent as an index into `kept` (`None` for the
/// root). `None` when some survivor cannot be reached that way (the ranks left out cut it off: a shrink to a
/// few ranks far apart), where a caller falls back on `tree_children`. Its depth is the graph's, about
/// `log2(n) / 2` where nobody is left out.
pub fn survivor_tree(kept: &[usize], nranks: usize) -> Option<Vec<Option<usize>>> {
    if kept.is_empty() {
        return Some(Vec::new());
    }
    let mut index_of = vec![usize::MAX; nranks];
    for (i, &r) in kept.iter().enumerate() {
        index_of[r] = i;
    }
    let mut parent = vec![None; kept.len()];
    let mut seen = vec![false; kept.len()];
    let mut queue = std::collections::VecDeque::from([0usize]);
    seen[0] = true;
    let mut reached = 1;
    while let Some(i) = queue.pop_front() {
        for p in neighbours(kept[i], nranks) {
            let j = index_of[p];
            if j != usize::MAX && !seen[j] {
                seen[j] = true;
                parent[j] = Some(i);
                reached += 1;
                queue.push_back(j);
            }
        }
    }
    (reached == kept.len()).then_some(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceil_log2(n: usize) -> usize {
        (usize::BITS - (n - 1).leading_zeros()) as usize
    }

    #[test]
    fn neighbours_are_symmetric_few_and_connected() {
        for n in (1usize..=70).chain([255, 256, 257, 1000, 1024]) {
            for r in 0..n {
                let nb = neighbours(r, n);
                assert!(nb.len() <= 2 * ceil_log2(n.max(2)), "n {n}: rank {r} has {}", nb.len());
                for &p in &nb {
                    assert!(p < n && p != r);
                    assert!(neighbours(p, n).contains(&r), "n {n}: {r} -> {p} but not back");
                    assert!(are_neighbours(r, p, n));
                }
                for p in (0..n).filter(|p| !nb.contains(p)) {
                    assert!(!are_neighbours(r, p, n), "n {n}: {r} and {p}");
                }
                // The ring and the dissemination barrier's peers are among them.
                if n > 1 {
                    assert!(nb.contains(&((r + 1) % n)) && nb.contains(&((r + n - 1) % n)));
                }
                for p in spread_to(r, n, usize::MAX) {
                    assert!(nb.contains(&p));
                }
                // The root's rows for a rank: its own and its neighbours', every one for rank 0.
                let rows = set_up_rows(r, n);
                let expected = if r == 0 { n } else { nb.len() + 1 };
                assert_eq!(rows.len(), expected, "n {n}: rank {r}'s rows {rows:?}");
                assert!(rows.contains(&r) && nb.iter().all(|p| rows.contains(p)));
            }
        }
        // Small jobs are a full mesh.
        for n in 1..=5 {
            assert_eq!(neighbours(0, n), (1..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_binomial_tree_reaches_every_index_once_in_log_steps() {
        for m in 1usize..=300 {
            let mut seen = vec![0usize; m];
            let mut depth = vec![0usize; m];
            let mut frontier = vec![0usize];
            seen[0] = 1;
            while let Some(i) = frontier.pop() {
                let children = tree_children(i, m);
                assert!(children.len() <= ceil_log2(m.max(2)));
                for c in children {
                    assert_eq!(tree_parent(c), i, "m {m}: child {c} of {i}");
                    seen[c] += 1;
                    depth[c] = depth[i] + 1;
                    frontier.push(c);
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "m {m}: {seen:?}");
            assert!(depth.iter().all(|&d| d <= ceil_log2(m.max(2))), "m {m}");
        }
    }

    #[test]
    fn the_survivors_tree_joins_neighbours_and_is_shallow() {
        let depth_of = |parent: &[Option<usize>], mut i: usize| {
            let mut d = 0;
            while let Some(p) = parent[i] {
                i = p;
                d += 1;
            }
            d
        };
        for n in [2usize, 3, 7, 16, 100, 256, 1024] {
            // Nobody left out, one, every third: a tree of neighbours, shallower than the binomial one.
            for gap in [usize::MAX, n - 1, 3].into_iter().filter(|&g| g > 1) {
                let kept: Vec<usize> = (0..n).filter(|r| gap == usize::MAX || (r % gap != gap - 1)).collect();
                let parent = survivor_tree(&kept, n).unwrap_or_else(|| panic!("n {n}, gap {gap}"));
                assert_eq!(parent[0], None);
                for (j, p) in parent.iter().enumerate().skip(1) {
                    let p = p.expect("a parent");
                    assert!(are_neighbours(kept[j], kept[p], n), "n {n}: {} - {}", kept[j], kept[p]);
                }
                let deepest = (0..kept.len()).map(|i| depth_of(&parent, i)).max().unwrap();
                assert!(deepest <= ceil_log2(n.max(2)), "n {n}, gap {gap}: depth {deepest}");
            }
        }
        // Two ranks far apart, their neighbours all left out: no such tree.
        assert_eq!(survivor_tree(&[0, 3], 16), None);
        assert_eq!(survivor_tree(&[5], 16), Some(vec![None]));
    }
}
