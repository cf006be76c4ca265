//! Messages that arrived from peers, waiting for `recv`: one FIFO per (peer, key), what we know about
//! each peer's connection, and whether the job has failed (then every wait fails at once).

use super::wire::Key;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// The state of the connections with one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Link {
    /// No connection yet: set-up's neighbours are waited for, any other peer connects when one side first
    /// sends (a wait for its message goes on meanwhile).
    Idle,
    Connected,
    /// Closed (the peer left or was declared dead); the reason says how. It never opens again.
    Closed(String),
}

struct State {
    queues: HashMap<(usize, Key), VecDeque<Vec<u8>>>,
    links: Vec<Link>,
    /// The error of the first failure (a peer declared dead, or an abort).
    failure: Option<Error>,
}

/// Shared by the receive thread, which delivers, and the rank's threads, which wait.
pub struct Mailbox {
    state: Mutex<State>,
    changed: Condvar,
}

impl Mailbox {
    /// A mailbox for `nranks` peers; `me` (messages to self) counts as connected.
    pub fn new(me: usize, nranks: usize) -> Mailbox {
        let mut links = vec![Link::Idle; nranks];
        links[me] = Link::Connected;
        Mailbox {
            state: Mutex::new(State {
                queues: HashMap::new(),
                links,
                failure: None,
            }),
            changed: Condvar::new(),
        }
    }

    pub fn deliver(&self, peer: usize, key: Key, message: Vec<u8>) {
        self.state
            .lock()
            .queues
            .entry((peer, key))
            .or_default()
            .push_back(message);
        self.changed.notify_all();
    }

    /// Records a connection with `peer` (a second one too: both may open one at once); false once its link
    /// has closed, which no connection reopens.
    pub fn connect(&self, peer: usize) -> bool {
        let mut state = self.state.lock();
        match state.links[peer] {
            Link::Closed(_) => return false,
            Link::Connected => return true,
            Link::Idle => state.links[peer] = Link::Connected,
        }
        drop(state);
        self.changed.notify_all();
        true
    }

    /// Whether `peer`'s link has closed: it left, or was declared dead.
    pub fn is_closed(&self, peer: usize) -> bool {
        matches!(self.state.lock().links[peer], Link::Closed(_))
    }

    /// Records that `peer` is gone (its connection closed, it left, or it was declared dead); waiters for
    /// its messages then fail, once what had arrived is taken. The first reason stays.
    pub fn close(&self, peer: usize, reason: String) {
        let mut state = self.state.lock();
        if !matches!(state.links[peer], Link::Closed(_)) {
            state.links[peer] = Link::Closed(reason);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Records the job's failure: every wait, now and later, fails with `error`.
    pub fn fail(&self, error: Error) {
        let mut state = self.state.lock();
        if state.failure.is_none() {
            state.failure = Some(error);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until each of `peers` has connected, or returns those still missing at `deadline` (or as soon
    /// as the job fails). A peer whose connection has already closed again did connect (only a connected
    /// link closes, but for a peer declared dead): set-up is complete, and what is sent to or awaited from
    /// that peer fails later with the close's reason. (A fast peer may finish its set-up and close its
    /// communicator before this rank looks.)
    pub fn wait_connected(&self, peers: &[usize], deadline: Instant) -> std::result::Result<(), Vec<usize>> {
        let mut state = self.state.lock();
        loop {
            let missing: Vec<usize> = peers
                .iter()
                .copied()
                .filter(|&p| state.links[p] == Link::Idle)
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if state.failure.is_some() {
                return Err(missing);
            }
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                let missing = peers
                    .iter()
                    .copied()
                    .filter(|&p| state.links[p] == Link::Idle)
                    .collect();
                return Err(missing);
            }
        }
    }

    /// Takes the oldest message from `peer` under `key`, waiting for one as long as the peer's link has not
    /// closed (it may have no connection yet: the peer makes one when it sends). Messages that arrived before a connection closed are still delivered; once the job has
    /// failed, nothing is: the failure's error comes back at once.
    pub fn take(&self, peer: usize, key: Key) -> Result<Vec<u8>> {
        self.take_until(peer, key, false, None)
    }

    /// Takes every message from `peer` under `key` queued so far, oldest first, without waiting: for
    /// messages pushed unasked, which the receiver absorbs when it likes. Neither a failure nor a closed
    /// connection hides what had arrived: the caller decides what to do with it.
    pub fn take_all(&self, peer: usize, key: Key) -> Vec<Vec<u8>> {
        self.state
            .lock()
            .queues
            .remove(&(peer, key))
            .map(Vec::from)
            .unwrap_or_default()
    }

    /// `take`, where `despite_failure` keeps waiting after the job failed (for as long as the peer's own
    /// connection is open: the survivors of a failure still talk to one another), and `deadline`, where
    /// given, ends the wait with a `Remote` error.
    pub fn take_until(
        &self,
        peer: usize,
        key: Key,
        despite_failure: bool,
        deadline: Option<Instant>,
    ) -> Result<Vec<u8>> {
        let mut state = self.state.lock();
        loop {
            if let Some(e) = &state.failure
                && !despite_failure
            {
                return Err(Error::new(
                    e.kind,
                    format!(
                        "waiting for a message from peer {peer} ({:?} tag {}): {}",
                        key.space, key.tag, e.message
                    ),
                ));
            }
            if let Some(queue) = state.queues.get_mut(&(peer, key))
                && let Some(message) = queue.pop_front()
            {
                if queue.is_empty() {
                    state.queues.remove(&(peer, key));
                }
                return Ok(message);
            }
            if let Link::Closed(reason) = &state.links[peer] {
                return Err(Error::remote(format!(
                    "waiting for a message from peer {peer} ({:?} tag {}): {reason}",
                    key.space, key.tag
                )));
            }
            match deadline {
                None => self.changed.wait(&mut state),
                Some(d) => {
                    if self.changed.wait_until(&mut state, d).timed_out()
                        && state.queues.get(&(peer, key)).is_none_or(|q| q.is_empty())
                    {
                        return Err(Error::new(
                            crate::error::ErrorKind::Timeout,
                            format!(
                                "waiting for a message from peer {peer} ({:?} tag {}): nothing came in time",
                                key.space, key.tag
                            ),
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn fifo_per_key_and_keys_are_independent() {
        let m = Mailbox::new(0, 2);
        m.deliver(1, Key::user(7), b"a".to_vec());
        m.deliver(1, Key::user(8), b"x".to_vec());
        m.deliver(1, Key::user(7), b"b".to_vec());
        assert_eq!(m.take(1, Key::user(8)).unwrap(), b"x");
        assert_eq!(m.take(1, Key::user(7)).unwrap(), b"a");
        assert_eq!(m.take(1, Key::user(7)).unwrap(), b"b");
    }

    #[test]
    fn take_waits_for_delivery_and_fails_once_closed() {
        let m = Arc::new(Mailbox::new(0, 3));
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            m2.deliver(1, Key::user(1), b"late".to_vec());
            m2.deliver(2, Key::user(1), b"before close".to_vec());
            m2.close(2, "peer closed its connection".into());
        });
        assert_eq!(m.take(1, Key::user(1)).unwrap(), b"late");
        t.join().unwrap();
        assert_eq!(m.take(2, Key::user(1)).unwrap(), b"before close");
        let e = m.take(2, Key::user(1)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(
            e.message.contains("peer 2") && e.message.contains("closed"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_failure_ends_every_wait_at_once() {
        let m = Arc::new(Mailbox::new(0, 3));
        m.deliver(2, Key::user(1), b"queued".to_vec());
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            m2.fail(Error::remote("rank 1 failed (connection closed)"));
        });
        let start = Instant::now();
        let e = m.take(1, Key::user(1)).unwrap_err();
        t.join().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(e.kind, ErrorKind::Remote);
        assert!(e.message.contains("rank 1 failed"), "{}", e.message);
        // Even a message already there: the job is over.
        assert!(m.take(2, Key::user(1)).is_err());
        assert_eq!(
            m.wait_connected(&[1, 2], Instant::now() + Duration::from_secs(30)),
            Err(vec![1, 2])
        );
        // The first failure stays.
        m.fail(Error::invalid_usage("later"));
        assert!(m.take(1, Key::user(1)).unwrap_err().message.contains("rank 1 failed"));
    }

    #[test]
    fn a_wait_despite_the_failure_goes_on_until_the_message_its_link_closing_or_its_deadline() {
        let m = Arc::new(Mailbox::new(0, 3));
        m.fail(Error::remote("rank 2 failed (connection closed)"));
        assert!(m.take(1, Key::user(1)).is_err(), "a plain wait fails at once");
        let m2 = m.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            m2.deliver(1, Key::user(1), b"survivor".to_vec());
        });
        let far = Some(Instant::now() + Duration::from_secs(30));
        assert_eq!(m.take_until(1, Key::user(1), true, far).unwrap(), b"survivor");
        t.join().unwrap();
        m.close(2, "peer closed its connection".into());
        let e = m.take_until(2, Key::user(1), true, far).unwrap_err();
        assert!(e.message.contains("closed"), "{}", e.message);
        let start = Instant::now();
        let e = m
            .take_until(1, Key::user(1), true, Some(start + Duration::from_millis(100)))
            .unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.message.contains("nothing came in time"), "{}", e.message);
    }

    #[test]
    fn take_all_empties_one_queue_in_order_without_waiting() {
        let m = Mailbox::new(0, 3);
        let start = Instant::now();
        assert!(m.take_all(1, Key::registration()).is_empty(), "nothing came");
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        for message in [&b"a"[..], b"b", b"c"] {
            m.deliver(1, Key::registration(), message.to_vec());
        }
        m.deliver(2, Key::registration(), b"other peer".to_vec());
        m.deliver(1, Key::user(0), b"other key".to_vec());
        assert_eq!(m.take_all(1, Key::registration()), [b"a", b"b", b"c"]);
        assert!(m.take_all(1, Key::registration()).is_empty(), "taken once");
        assert_eq!(m.take(1, Key::user(0)).unwrap(), b"other key");
        // After a failure and a close, what had arrived is still there.
        m.fail(Error::remote("rank 2 failed (connection closed)"));
        m.close(2, "peer closed its connection".into());
        m.deliver(1, Key::registration(), b"late".to_vec());
        assert_eq!(m.take_all(2, Key::registration()), [b"other peer"]);
        assert_eq!(m.take_all(1, Key::registration()), [b"late"]);
        assert!(m.take_all(2, Key::registration()).is_empty());
    }

    #[test]
    fn connection_tracking() {
        let m = Mailbox::new(1, 4);
        assert_eq!(
            m.wait_connected(&[0, 2], Instant::now() + Duration::from_millis(10)),
            Err(vec![0, 2])
        );
        assert!(m.connect(0));
        assert!(m.connect(0), "a second connection of the same peer is one link");
        assert!(!m.is_closed(2));
        assert!(m.connect(2));
        assert_eq!(m.wait_connected(&[0, 2], Instant::now()), Ok(()));
        // Rank 3 is waited for by nobody and connects when it likes; once closed, its link stays closed.
        m.close(3, "rank 3 failed".into());
        assert!(m.is_closed(3) && !m.connect(3));
        m.close(3, "a later reason".into());
        assert!(m.take(3, Key::user(0)).unwrap_err().message.contains("rank 3 failed"));
    }

    #[test]
    fn a_peer_that_connected_and_left_before_the_wait_does_not_hold_set_up_up() {
        let m = Mailbox::new(1, 3);
        assert!(m.connect(0));
        m.close(0, "peer closed its connection".into());
        assert_eq!(
            m.wait_connected(&[0, 2], Instant::now() + Duration::from_millis(10)),
            Err(vec![2]),
            "only the peer that never came is missing"
        );
        assert!(m.connect(2));
        assert_eq!(m.wait_connected(&[0, 2], Instant::now()), Ok(()));
        let e = m.take(0, Key::user(1)).unwrap_err();
        assert!(e.message.contains("closed"), "{}", e.message);
    }
}
