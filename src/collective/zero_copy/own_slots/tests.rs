//! This rank's slots and generations, the export of a registration, and the descriptors of a call's
//! buffers.

use super::*;
use crate::error::ErrorKind;
use crate::registration::{Allocation, Kind, Registrations};

#[test]
fn slots_are_the_lowest_free_and_reuse_bumps_the_generation() {
    let mut slots = OwnSlots::default();
    assert_eq!(slots.add(0xa).unwrap(), (0, 1));
    assert_eq!(slots.add(0xb).unwrap(), (1, 1));
    assert_eq!(slots.add(0xc).unwrap(), (2, 1));
    assert_eq!(slots.get(0xb), Some((1, 1)));
    assert_eq!(slots.remove(0xb), Some((1, 1)));
    assert_eq!(slots.remove(0xb), None, "removed once");
    assert_eq!(slots.get(0xb), None);
    assert_eq!(slots.add(0xd).unwrap(), (1, 2), "slot 1 again, at a new generation");
    assert_eq!(slots.remove(0xa), Some((0, 1)));
    assert_eq!(slots.add(0xe).unwrap(), (0, 2));
    assert_eq!(slots.remove(0xd), Some((1, 2)));
    assert_eq!(slots.add(0xf).unwrap(), (1, 3));
    assert_eq!(slots.len(), 3);
    let e = slots.add(0xf).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Internal);
    assert!(e.message.contains("already holds slot 1"), "{}", e.message);
}

#[test]
fn a_full_table_is_refused_naming_the_limit_and_the_remedy() {
    let mut slots = OwnSlots::default();
    for token in 0..MAX_SLOTS as u64 {
        assert_eq!(slots.add(token).unwrap(), (token as u32, 1));
    }
    let e = slots.add(1000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidUsage);
    assert!(
        e.message.contains("at most 64 registered buffers") && e.message.contains("deregister buffers first"),
        "{}",
        e.message
    );
    assert_eq!(slots.get(1000), None);
    assert_eq!(slots.remove(17), Some((17, 1)));
    assert_eq!(slots.add(1000).unwrap(), (17, 2));
}

#[test]
fn an_exhausted_slot_is_retired_never_wrapped_to_generation_0() {
    let mut slots = OwnSlots::default();
    slots.slots[0].generation = u32::MAX - 1;
    assert_eq!(slots.add(1).unwrap(), (0, u32::MAX));
    assert_eq!(slots.remove(1), Some((0, u32::MAX)));
    assert_eq!(slots.add(2).unwrap(), (1, 1), "slot 0 is retired");
    for s in &mut slots.slots {
        s.token = None;
        s.generation = u32::MAX;
    }
    let e = slots.add(3).unwrap_err();
    assert!(
        e.message.contains("(64 retired") && e.message.contains("deregister buffers first"),
        "{}",
        e.message
    );
    assert!(slots.is_empty());
}

/// Slots whose token `token` holds slot 3 at generation 9 (three other tokens below it).
fn slot_3_generation_9(token: u64) -> OwnSlots {
    let mut slots = OwnSlots::default();
    for other in 0..3 {
        slots.add(0xf00 + other).unwrap();
    }
    for _ in 0..8 {
        slots.add(token).unwrap();
        slots.remove(token);
    }
    assert_eq!(slots.add(token).unwrap(), (3, 9));
    slots
}

#[test]
fn descriptors_of_exported_registrations_only() {
    let registrations = Registrations::default();
    let allocation = Allocation {
        buffer_id: 7,
        base: 0x10_0000,
        size: 1 << 20,
        device: 0,
    };
    let token = registrations.insert(Registration {
        ptr: 0x10_0100,
        len: 4096,
        kind: Kind::Buffer,
        allocation,
        library_memory: false,
    });
    let same = |p: DevicePtr, l: usize| registrations.lookup_with(p, l, |_, _| Ok(allocation));
    let exported = slot_3_generation_9(token);
    assert_eq!(exported.descriptor(0x10_0200, 64, same), (tag(3, 9), 0x100));
    assert_eq!(exported.descriptor(0x10_0100, 4096, same), (tag(3, 9), 0));
    // Past the registration's end, not exported, null, empty, or its memory reallocated: not zero-copy.
    assert_eq!(exported.descriptor(0x10_0200, 4096, same), (0, 0));
    assert_eq!(OwnSlots::default().descriptor(0x10_0200, 64, same), (0, 0));
    assert_eq!(exported.descriptor(0, 64, same), (0, 0));
    assert_eq!(exported.descriptor(0x10_0200, 0, same), (0, 0));
    let moved = Allocation {
        buffer_id: 8,
        ..allocation
    };
    let reallocated = |p: DevicePtr, l: usize| registrations.lookup_with(p, l, |_, _| Ok(moved));
    assert_eq!(exported.descriptor(0x10_0200, 64, reallocated), (0, 0));
}

#[test]
fn without_a_driver_exporting_is_a_cuda_error() {
    if crate::gpu::ensure_driver().is_ok() {
        return; // a machine with a driver answers about the address instead
    }
    let registration = Registration {
        ptr: 0x1000,
        len: 64,
        kind: crate::registration::Kind::Buffer,
        allocation: crate::registration::Allocation {
            buffer_id: 1,
            base: 0x1000,
            size: 64,
            device: 0,
        },
        library_memory: false,
    };
    let e = export(0, 1, &registration, 1).unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Cuda, "{}", e.message);
}
