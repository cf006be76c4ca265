//! The records' wire format: round trips, and every malformed message refused naming what was wrong.

use super::*;
use crate::error::ErrorKind;
use crate::registration::{Allocation, Kind};

pub(crate) fn exported(slot: u32, generation: u32) -> Exported {
    Exported {
        slot,
        generation,
        offset_in_allocation: 0x200,
        len: 4096,
        alloc_size: 1 << 20,
        // An allocation of its own per slot and generation (`shared_allocation` shares one).
        buffer_id: 1000 * (slot as u64 + 1) + generation as u64,
        window: 0,
        address: 0x10_0200,
        handle: vec![slot as u8; 64],
    }
}

pub(crate) fn added(slot: u32, generation: u32) -> Record {
    Record::Added(exported(slot, generation))
}

/// `added(1, 2)` with another range in its allocation of 1 MiB.
fn ranged(offset_in_allocation: u64, len: u64) -> Record {
    Record::Added(Exported {
        offset_in_allocation,
        len,
        ..exported(1, 2)
    })
}

pub(crate) fn gone(slot: u32, generation: u32) -> Record {
    Record::Gone { slot, generation }
}

#[test]
fn both_kinds_round_trip() {
    let mut handle = vec![0u8; 64];
    handle[0] = 0xab;
    handle[63] = 0xcd;
    let a = Record::Added(Exported {
        slot: 63,
        generation: u32::MAX,
        offset_in_allocation: 0x1000,
        len: (1 << 30) - 0x1000,
        alloc_size: 1 << 30,
        buffer_id: u64::MAX,
        window: 7,
        address: 0x7f00_dead_1000,
        handle,
    });
    let bytes = a.encode();
    assert_eq!(bytes.len(), 2 + 4 + 4 + 4 * 8 + 4 + 8 + 4 + 64);
    assert_eq!(bytes[..2], [KIND_ADDED, FORMAT_VERSION]);
    assert_eq!(Record::decode(&bytes).unwrap(), a);
    let g = gone(5, 7);
    let bytes = g.encode();
    assert_eq!(bytes, [KIND_GONE, FORMAT_VERSION, 5, 0, 0, 0, 7, 0, 0, 0]);
    assert_eq!(Record::decode(&bytes).unwrap(), g);
    assert_eq!((g.slot(), g.generation()), (5, 7));
}

#[test]
fn an_added_record_is_made_from_a_registration() {
    let registration = Registration {
        ptr: 0x10_0200,
        len: 4096,
        kind: Kind::Buffer,
        allocation: Allocation {
            buffer_id: 4001,
            base: 0x10_0000,
            size: 1 << 20,
            device: 0,
        },
        library_memory: false,
    };
    assert_eq!(Record::added(3, 1, &registration, vec![3; 64]).unwrap(), added(3, 1));
    let before = Registration {
        ptr: 0xf_0000,
        ..registration
    };
    let e = Record::added(3, 1, &before, vec![3; 64]).unwrap_err();
    assert!(e.message.contains("starts before its allocation"), "{}", e.message);
}

#[test]
fn truncated_messages_are_refused_naming_the_record() {
    for record in [added(1, 2), gone(1, 2)] {
        let bytes = record.encode();
        for n in 0..bytes.len() {
            let e = Record::decode(&bytes[..n]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Remote);
            assert!(
                e.message.contains("registration record is truncated"),
                "{n}: {}",
                e.message
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let e = Record::decode(&longer).unwrap_err();
        assert!(e.message.contains("1 trailing bytes"), "{}", e.message);
    }
}

#[test]
fn unknown_kinds_and_versions_are_refused() {
    let mut bytes = gone(1, 2).encode();
    bytes[0] = 9;
    let e = Record::decode(&bytes).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Remote);
    assert!(e.message.contains("unknown kind 9"), "{}", e.message);
    let mut bytes = added(1, 2).encode();
    bytes[1] = FORMAT_VERSION + 1;
    let e = Record::decode(&bytes).unwrap_err();
    assert!(
        e.message.contains("format version 3") && e.message.contains("version 2 only"),
        "{}",
        e.message
    );
}

#[test]
fn oversized_handles_and_inconsistent_records_are_refused() {
    assert_eq!(
        added(1, 2).encode().len(),
        2 + 4 + 4 + 4 * 8 + 4 + 8 + 4 + MAX_HANDLE_BYTES,
        "64 bytes pass"
    );
    let oversized = Record::Added(Exported {
        offset_in_allocation: 0,
        len: 1,
        alloc_size: 1,
        buffer_id: 1,
        handle: vec![0; MAX_HANDLE_BYTES + 1],
        ..exported(1, 2)
    });
    let e = Record::decode(&oversized.encode()).unwrap_err();
    assert!(
        e.message
            .contains("registration record has an IPC handle of 65 bytes (at most 64)"),
        "{}",
        e.message
    );
    // A length prefix claiming more than the message holds is refused before anything is read.
    let mut bytes = added(1, 2).encode();
    let at = bytes.len() - 64 - 4;
    bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let e = Record::decode(&bytes).unwrap_err();
    assert!(e.message.contains("IPC handle of 4294967295 bytes"), "{}", e.message);

    let e = Record::decode(&ranged((1 << 20) - 100, 4096).encode()).unwrap_err();
    assert!(e.message.contains("outside its allocation"), "{}", e.message);
    let e = Record::decode(&ranged(u64::MAX, 4096).encode()).unwrap_err();
    assert!(e.message.contains("outside its allocation"), "{}", e.message);
    let e = Record::decode(&ranged(0, 0).encode()).unwrap_err();
    assert!(e.message.contains("covers 0 bytes"), "{}", e.message);
    assert_eq!(
        Record::decode(&ranged(0, 1 << 20).encode()).unwrap(),
        ranged(0, 1 << 20),
        "the whole allocation"
    );
    for record in [added(1, 0), gone(1, 0)] {
        let e = Record::decode(&record.encode()).unwrap_err();
        assert!(e.message.contains("generation 0"), "{}", e.message);
    }
}
