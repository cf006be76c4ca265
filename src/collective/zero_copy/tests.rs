//! Which calls try zero-copy, and the tags that name a registration to the peers.

use super::*;

#[test]
fn the_choice_depends_on_what_every_rank_shares() {
    use crate::collective::algorithm::{Protocol, packet_limit};
    assert!(packet_limit(Collective::AllReduce, 2) < 16 << 20);
    let sum = Some(RedOp::Sum);
    let one = Placement::OneGpu;
    let several = Placement::SeveralGpus;
    let limit = packet_limit(Collective::AllReduce, 2);
    assert!(!attempt(Collective::AllReduce, sum, 2, one, limit, Choice::Auto));
    assert!(
        !attempt(Collective::AllReduce, sum, 2, one, 4 << 20, Choice::Auto),
        "slower at 4 MiB"
    );
    assert!(attempt(Collective::AllReduce, sum, 2, one, 16 << 20, Choice::Auto));
    assert!(attempt(Collective::ReduceScatter, sum, 16, one, 16 << 20, Choice::Auto));
    // Across GPUs never by the table: large calls go as sends and receives (send_recv_collectives.rs), two
    // ranks' as halves, more ranks' as rings and chains.
    for n in [2, 4, 8] {
        assert!(!attempt(Collective::AllReduce, sum, n, several, 64 << 20, Choice::Auto));
        assert!(!attempt(
            Collective::ReduceScatter,
            sum,
            n,
            several,
            1 << 30,
            Choice::Auto
        ));
        assert!(!attempt(Collective::AllGather, None, n, several, 1 << 30, Choice::Auto));
        assert!(
            !attempt(Collective::Broadcast, None, n, several, 1 << 30, Choice::Auto),
            "a chain of sends and receives across GPUs"
        );
    }
    assert!(attempt(Collective::Broadcast, None, 4, one, 16 << 20, Choice::Auto));
    assert!(attempt(Collective::AllGather, None, 4, one, 1 << 30, Choice::Auto));
    for c in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
    ] {
        assert!(!attempt(c, sum, 2, several, 1 << 30, Choice::Auto), "{c:?}");
        assert!(attempt(c, sum, 2, several, 1 << 30, Choice::ZeroCopy), "{c:?}");
    }
    assert!(attempt(Collective::AllGather, None, 2, one, 1 << 30, Choice::Auto));
    assert!(attempt(Collective::AllGather, None, 4, several, 1, Choice::ZeroCopy));
    // Forcing the copy engine forces the kernels too, for what the copy engine does not take (all-reduce,
    // reduce-scatter, captured calls, calls some rank cannot go by it).
    assert!(attempt(Collective::AllReduce, sum, 2, several, 1, Choice::CopyEngine));
    assert!(attempt(Collective::AllGather, None, 2, several, 1, Choice::CopyEngine));
    let copy = Choice::Force(Protocol::Copy);
    assert!(!attempt(Collective::AllGather, None, 4, one, 1 << 30, copy));
    assert!(!attempt(Collective::AllReduce, sum, 1, one, 1 << 30, Choice::ZeroCopy));
    assert!(!attempt(Collective::AllReduce, sum, 2, one, 0, Choice::ZeroCopy));
    for c in [
        Collective::Reduce,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllToAll,
    ] {
        assert!(!attempt(c, sum, 2, one, 1 << 30, Choice::ZeroCopy), "{c:?}");
        assert_eq!(zero_copy_from(c, 2, one), None);
    }
    let premul = RedOp::PreMulSum(crate::collective::Scalar::Immediate(1));
    assert!(!attempt(
        Collective::AllReduce,
        Some(premul),
        2,
        one,
        1 << 30,
        Choice::ZeroCopy
    ));
}

#[test]
fn tags_name_slot_and_generation() {
    assert_eq!(tag(0, 1), 0x8000_0000_0000_0001);
    assert_eq!(tag(63, 0xffff_ffff), 0x8000_003f_ffff_ffff);
    assert_eq!(untag(tag(63, 0xffff_ffff)), Some((63, 0xffff_ffff)));
    assert_eq!(untag(tag(5, 2)), Some((5, 2)));
    assert_eq!(untag(0), None);
}
