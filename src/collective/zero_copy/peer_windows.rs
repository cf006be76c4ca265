//! The peers' windows by ordinal, for the one-sided calls (`signal.rs`): noted from the same records the
//! zero-copy table takes in (`records.rs`, `PeerBuffers::refresh`), so that a put finds the peer's
//! registration of a window by the ordinal every rank gives it (`Registrations::window_ordinal`).

use super::records::Record;
use std::collections::HashMap;

/// A peer's registration of a window as its record described it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerWindow {
    /// Its slot and generation among the peer's registrations (the zero-copy table's key).
    pub slot: u32,
    pub generation: u32,
    pub len: u64,
    /// Its first byte in the peer's own address space.
    pub address: u64,
}

/// The peers' windows by ordinal, kept from the records the zero-copy table takes in.
#[derive(Default)]
pub struct PeerWindows {
    by_ordinal: HashMap<(usize, u32), PeerWindow>,
}

impl PeerWindows {
    /// Takes note of a record `peer` pushed: a window's `Added`, or the `Gone` of one.
    pub fn note(&mut self, peer: usize, record: &Record) {
        match record {
            Record::Added(e) if e.window != 0 => {
                self.by_ordinal.insert(
                    (peer, e.window),
                    PeerWindow {
                        slot: e.slot,
                        generation: e.generation,
                        len: e.len,
                        address: e.address,
                    },
                );
            }
            Record::Gone { slot, generation } => self
                .by_ordinal
                .retain(|&(p, _), w| !(p == peer && (w.slot, w.generation) == (*slot, *generation))),
            Record::Added(_) => {}
        }
    }

    pub fn get(&self, peer: usize, ordinal: u32) -> Option<PeerWindow> {
        self.by_ordinal.get(&(peer, ordinal)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::zero_copy::records::Exported;

    fn window_record(slot: u32, generation: u32, window: u32) -> Record {
        Record::Added(Exported {
            slot,
            generation,
            offset_in_allocation: 0,
            len: 4096,
            alloc_size: 1 << 20,
            buffer_id: 9,
            window,
            address: 0x7f00_0000_0000 + slot as u64 * 0x1000,
            handle: vec![0; 64],
        })
    }

    #[test]
    fn peer_windows_are_found_by_ordinal_until_they_are_gone() {
        let mut w = PeerWindows::default();
        w.note(1, &window_record(3, 1, 2));
        w.note(1, &window_record(4, 1, 0)); // a buffer, not a window
        w.note(2, &window_record(3, 7, 2));
        let got = w.get(1, 2).unwrap();
        assert_eq!((got.slot, got.generation, got.len), (3, 1, 4096));
        assert_eq!(got.address, 0x7f00_0000_3000);
        assert_eq!(w.get(2, 2).unwrap().generation, 7, "peers are kept apart");
        assert!(w.get(1, 1).is_none());
        assert!(w.get(1, 0).is_none(), "buffers are not noted");
        // A Gone of another generation or peer leaves it; its own removes it.
        w.note(1, &Record::Gone { slot: 3, generation: 2 });
        w.note(3, &Record::Gone { slot: 3, generation: 1 });
        assert!(w.get(1, 2).is_some());
        w.note(1, &Record::Gone { slot: 3, generation: 1 });
        assert!(w.get(1, 2).is_none());
        assert!(w.get(2, 2).is_some());
    }
}
