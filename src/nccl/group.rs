//! `ncclGroupStart` / `ncclGroupEnd` bookkeeping, per thread as in NCCL: the depth of nesting, the work
//! queued since the outermost start, and the first error a call inside the group returned (which fails
//! the whole group at its end, as NCCL does: nothing queued is then issued).
//!
//! The work itself (`api.rs`'s `Op`) is issued at the outermost end, in the order it was queued.

use crate::error::{Error, Result};
use std::cell::RefCell;

/// One thread's group state.
#[derive(Debug)]
pub struct Group<Op> {
    depth: usize,
    queue: Vec<Op>,
    error: Option<Error>,
}

impl<Op> Default for Group<Op> {
    fn default() -> Self {
        Group {
            depth: 0,
            queue: Vec::new(),
            error: None,
        }
    }
}

/// What the outermost end hands back: the work to issue, or the error that failed the group.
pub type Ended<Op> = std::result::Result<Vec<Op>, Error>;

impl<Op> Group<Op> {
    pub fn start(&mut self) {
        self.depth += 1;
    }

    /// Whether a group is open (work is queued rather than issued).
    pub fn open(&self) -> bool {
        self.depth > 0
    }

    /// Queues `op` for the outermost end. Only inside a group.
    pub fn queue(&mut self, op: Op) {
        debug_assert!(self.open());
        self.queue.push(op);
    }

    /// Remembers the first error of a call inside the group.
    pub fn fail(&mut self, e: &Error) {
        if self.open() && self.error.is_none() {
            self.error = Some(e.clone());
        }
    }

    /// Ends one level: `Err` when no group is open (`ncclInvalidUsage`), `Ok(None)` for an inner end,
    /// `Ok(Some(..))` for the outermost, with the queued work or the group's error.
    pub fn end(&mut self) -> Result<Option<Ended<Op>>> {
        if self.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd without a matching ncclGroupStart on this thread",
            ));
        }
        self.depth -= 1;
        if self.depth > 0 {
            return Ok(None);
        }
        let queue = std::mem::take(&mut self.queue);
        Ok(Some(match self.error.take() {
            Some(e) => Err(e),
            None => Ok(queue),
        }))
    }
}

/// Runs `f` on this thread's group of `Op`s.
pub fn with<Op: 'static, T>(
    local: &'static std::thread::LocalKey<RefCell<Group<Op>>>,
    f: impl FnOnce(&mut Group<Op>) -> T,
) -> T {
    local.with(|g| f(&mut g.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn an_end_without_a_start_is_invalid_usage() {
        let mut g: Group<u32> = Group::default();
        assert_eq!(g.end().unwrap_err().kind, ErrorKind::InvalidUsage);
        g.start();
        assert!(g.end().unwrap().is_some());
        assert_eq!(g.end().unwrap_err().kind, ErrorKind::InvalidUsage);
    }

    #[test]
    fn nested_groups_issue_everything_in_order_at_the_outermost_end() {
        let mut g = Group::default();
        g.start();
        g.queue(1);
        g.start();
        g.queue(2);
        g.start();
        g.queue(3);
        assert!(g.end().unwrap().is_none());
        assert!(g.end().unwrap().is_none());
        g.queue(4);
        assert!(g.open());
        assert_eq!(g.end().unwrap().unwrap().unwrap(), vec![1, 2, 3, 4]);
        assert!(!g.open());
        g.start();
        assert!(g.end().unwrap().unwrap().unwrap().is_empty(), "nothing left over");
    }

    #[test]
    fn an_error_inside_fails_the_group_and_drops_its_work() {
        let mut g = Group::default();
        g.start();
        g.queue(1);
        g.fail(&Error::invalid_argument("first"));
        g.fail(&Error::invalid_usage("second"));
        g.queue(2);
        let e = g.end().unwrap().unwrap().unwrap_err();
        assert_eq!(e.message, "first");
        g.start();
        g.queue(3);
        assert_eq!(
            g.end().unwrap().unwrap().unwrap(),
            vec![3],
            "the next group starts clean"
        );
        g.fail(&Error::invalid_argument("outside a group"));
        g.start();
        assert!(g.end().unwrap().unwrap().is_ok(), "errors outside a group are not kept");
    }
}
