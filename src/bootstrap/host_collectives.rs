//! All-gather and barrier over the bootstrap's point-to-point messages. Every rank must call them in the
//! same order; each has its own message space, so they never mix with user tags. After a failure both
//! fail at once, even in a job of one rank.

use super::endpoint::Bootstrap;
use super::wire::{Key, Space};
use crate::error::{Error, Result};

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

    /// The first failure's error, if there was one.
    fn check_alive(&self) -> Result<()> {
        match self.failure() {
            Some(f) => Err(f.error()),
            None => Ok(()),
        }
    }
}
