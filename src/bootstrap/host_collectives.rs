//! All-gather and barrier over the bootstrap's point-to-point messages. Every rank must call them in the
//! same order; each has its own message space, so they never mix with user tags. After a failure both
//! fail at once, even in a job of one rank.
//!
//! `gather_words` is the exchange of communicator splits and grows: one word of any length from each rank,
//! among the split messages, up and down the binomial tree of neighbours, so that it opens no connection.

use super::endpoint::Bootstrap;
use super::topology::{tree_children, tree_parent};
use super::wire::{Key, Space};
use crate::error::{Error, Result};
use std::time::Instant;

impl Bootstrap {
    /// Gathers every rank's block: `data` holds `nranks * block` bytes, rank r's own block at
    /// `[r*block, (r+1)*block)` on entry, and all blocks on return.
    ///
    /// A ring: in step s each rank passes the block it got in step s-1 to the next rank. Each rank sends
    /// and receives `(nranks-1) * block` bytes, the least possible, over only two connections.
    pub fn all_gather(&self, data: &mut [u8], block: usize) -> Result<()> {
        let (rank, n) = (self.rank(), self.nranks());
        let expected = n.checked_mul(block).ok_or_else(|| {
            Error::invalid_argument(format!("all_gather: block size {block} times {n} ranks overflows"))
        })?;
        if data.len() != expected {
            return Err(Error::invalid_argument(format!(
                "all_gather: data holds {} bytes, expected nranks {n} * block {block} = {expected}",
                data.len()
            )));
        }
        self.check_alive()?;
        if n == 1 {
            return Ok(());
        }
        let key = Key {
            space: Space::AllGather,
            tag: 0,
        };
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        for step in 0..n - 1 {
            let send_index = (rank + n - step) % n;
            let recv_index = (rank + n - step - 1) % n;
            self.send_frame(next, key, &data[send_index * block..(send_index + 1) * block])?;
            let got = self.recv_frame(prev, key)?;
            if got.len() != block {
                return Err(Error::invalid_usage(format!(
                    "all_gather: rank {prev} sent a block of {} bytes, rank {rank} expects {block} \
                     (did the ranks pass different sizes?)",
                    got.len()
                )));
            }
            data[recv_index * block..(recv_index + 1) * block].copy_from_slice(&got);
        }
        Ok(())
    }

    /// Returns once every rank has called `barrier`.
    ///
    /// Dissemination: in round k each rank signals the rank 2^k after it and waits for the rank 2^k
    /// before it; after ceil(log2 nranks) rounds every rank has heard, indirectly, from all.
    pub fn barrier(&self) -> Result<()> {
        self.check_alive()?;
        let (rank, n) = (self.rank(), self.nranks());
        let mut distance = 1;
        let mut round = 0;
        while distance < n {
            let key = Key {
                space: Space::Barrier,
                tag: round,
            };
            self.send_frame((rank + distance) % n, key, &[])?;
            self.recv_frame((rank + n - distance) % n, key)?;
            distance *= 2;
            round += 1;
        }
        Ok(())
    }

    /// Gathers every rank's `word` (any length, one per rank), on every rank, among the split messages
    /// (`send_split`) under `tag`: the words by rank. Every rank must call it with the same `tag`.
    ///
    /// Up the binomial tree over the ranks rooted at rank 0 (`tree_parent`, `tree_children`), each rank
    /// passing its subtree's words on to its parent once its children's have come, then the whole list back
    /// down it. A rank and its parent in that tree differ by a power of two, so every edge joins neighbours
    /// (connected at set-up): no connection is opened, and each rank sends and receives at most
    /// `ceil(log2 n) + 1` messages, where a word sent to every other rank costs `n - 1` connections a rank.
    /// The list that comes down is the root's, so every rank holds the same words.
    ///
    /// Waits as `recv_split` does without `despite_failure`: a failure of the job ends it, and `deadline`
    /// bounds it (none: as long as the peers are connected). A rank's children and parent send under the
    /// same `tag` but in opposite directions, so their messages never mix (a queue per sending peer).
    pub fn gather_words(&self, tag: u64, word: &[u8], deadline: Option<Instant>) -> Result<Vec<Vec<u8>>> {
        let (rank, n) = (self.rank(), self.nranks());
        let mut words: Vec<Option<Vec<u8>>> = vec![None; n];
        words[rank] = Some(word.to_vec());
        for child in tree_children(rank, n) {
            let got = self.recv_split(child, tag, false, deadline)?;
            read_words(&got, child, &mut words)?;
        }
        let list = if rank == 0 {
            let missing: Vec<usize> = (0..n).filter(|&r| words[r].is_none()).collect();
            if !missing.is_empty() {
                return Err(Error::internal(format!(
                    "gather_words: the tree brought no word from {}",
                    super::list_ranks(&missing)
                )));
            }
            write_words(&words)
        } else {
            // This subtree's words go up; the whole list comes back down from the same parent.
            let parent = tree_parent(rank);
            self.send_split(parent, tag, &write_words(&words))?;
            let list = self.recv_split(parent, tag, false, deadline)?;
            let mut all = vec![None; n];
            read_words(&list, parent, &mut all)?;
            if all.iter().any(Option::is_none) || all[rank].as_deref() != Some(word) {
                return Err(Error::internal(format!(
                    "gather_words: rank {parent} passed down a list without every rank's word, or with another \
                     word of rank {rank}'s"
                )));
            }
            words = all;
            list
        };
        for child in tree_children(rank, n) {
            self.send_split(child, tag, &list)?;
        }
        Ok(words
            .into_iter()
            .map(|w| w.expect("checked: every rank's word"))
            .collect())
    }

    /// The first failure's error, if there was one.
    pub fn check_alive(&self) -> Result<()> {
        match self.failure() {
            Some(f) => Err(f.error()),
            None => Ok(()),
        }
    }
}

/// Words by rank on the wire: for each known one, its rank and length (4 bytes each, little-endian), then
/// its bytes.
fn write_words(words: &[Option<Vec<u8>>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (rank, word) in words.iter().enumerate() {
        if let Some(w) = word {
            out.extend_from_slice(&(rank as u32).to_le_bytes());
            out.extend_from_slice(&(w.len() as u32).to_le_bytes());
            out.extend_from_slice(w);
        }
    }
    out
}

/// Reads `from`'s message of `write_words` into `words`: a rank out of range, or one known already, is a
/// malformed message.
fn read_words(mut bytes: &[u8], from: usize, words: &mut [Option<Vec<u8>>]) -> Result<()> {
    let bad = |why: String| {
        Error::internal(format!(
            "gather_words: rank {from} sent a malformed list of words: {why}"
        ))
    };
    let take_u32 = |b: &mut &[u8]| -> Option<u32> {
        let (head, rest) = b.split_first_chunk::<4>()?;
        *b = rest;
        Some(u32::from_le_bytes(*head))
    };
    while !bytes.is_empty() {
        let (Some(rank), Some(len)) = (take_u32(&mut bytes), take_u32(&mut bytes)) else {
            return Err(bad(format!("{} bytes left over", bytes.len())));
        };
        let (rank, len) = (rank as usize, len as usize);
        if len > bytes.len() {
            return Err(bad(format!("rank {rank}'s word of {len} bytes, {} left", bytes.len())));
        }
        match words.get_mut(rank) {
            Some(slot @ None) => *slot = Some(bytes[..len].to_vec()),
            Some(Some(_)) => return Err(bad(format!("rank {rank}'s word twice"))),
            None => return Err(bad(format!("a word of rank {rank}, of {} ranks", words.len()))),
        }
        bytes = &bytes[len..];
    }
    Ok(())
}

#[cfg(test)]
mod word_tests {
    use super::*;

    #[test]
    fn word_lists_round_trip_and_malformed_ones_are_refused() {
        let words = vec![Some(b"ab".to_vec()), None, Some(Vec::new())];
        let mut back = vec![None; 3];
        read_words(&write_words(&words), 5, &mut back).unwrap();
        assert_eq!(back, words);
        // Rank 0's word again, a rank out of range, a cut length.
        let again = read_words(&write_words(&words), 5, &mut back).unwrap_err();
        assert!(
            again.message.contains("rank 5 sent") && again.message.contains("twice"),
            "{}",
            again.message
        );
        let mut two = vec![None; 2];
        assert!(read_words(&write_words(&words), 5, &mut two).is_err());
        let mut cut = write_words(&words);
        cut.truncate(5);
        assert!(read_words(&cut, 5, &mut vec![None; 3]).is_err());
    }
}
