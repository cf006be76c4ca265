//! The planner: what a group's submitted work (`Submitted`: made by `pipeline`'s constructors) becomes, in order, and what a collective's launches are. Pure:
//! it looks at the calls' arguments and the communicator's shape, never at a GPU, so that every rule here is
//! tested without one (and every rank, given the same calls, plans the same).
//!
//! - `plan`: a group's (or a lone call's) steps: its collectives and resumes in call order, then its sends
//!   and receives in one launch (they must progress at the same time), then its one-sided calls, the puts
//!   and signals first and the waits last (a wait queued before a put of the same group would hold the
//!   stream back from the put its peer waits for). Every rank issues its work in the same order, so that no
//!   rank's kernel waits behind one its peer queued later.
//! - `paths`: the paths a collective may take, in the order they are tried: the copy engine (which may
//!   decline: some rank cannot reach an output), zero-copy (whose kernel falls back to the scratch by itself),
//!   sends and receives (which may not fit the send/receive area), the scratch algorithm.
//! - `scratch_launches`: the scratch algorithm's launches, a window each.

use super::algorithm::{self, Choice, Placement, Protocol};
use super::call::Sizes;
use super::signal::OneSided;
use super::{Call, Collective, RedOp, SendRecvOp, copy_engine, send_recv_collectives, zero_copy};
use crate::error::{Error, Result};
use crate::gpu::AppStream;

/// A call's work, checked as far as it can be without a GPU (`pipeline`'s constructors check it).
#[derive(Clone, Debug)]
pub enum Work {
    /// A collective and its byte sizes (its root checked).
    Collective { call: Call, sizes: Sizes },
    /// A send or a receive: a group's are carried by one launch.
    SendRecv(SendRecvOp),
    /// A put, a signal or a wait (`signal.rs`).
    OneSided(OneSided),
    /// The end of a suspend (`ncclCommResume`): collective, the peers make their memory again with it.
    Resume,
}

/// Work and the application's stream it goes on.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub work: Work,
    pub stream: AppStream,
}

/// One step of a plan: indices into the submitted work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A collective call, or a resume.
    Alone(usize),
    /// Every send and receive of the group, in call order: one launch.
    SendRecv(Vec<usize>),
    /// A one-sided call.
    OneSided(usize),
}

/// The steps of `work` (one communicator's share of a group, or a lone call), in the order they are issued.
pub fn plan(work: &[Submitted]) -> Result<Vec<Step>> {
    let mut steps = Vec::new();
    let mut send_recv = Vec::new();
    let (mut puts, mut waits) = (Vec::new(), Vec::new());
    for (i, s) in work.iter().enumerate() {
        match &s.work {
            Work::Collective { .. } | Work::Resume => steps.push(Step::Alone(i)),
            Work::SendRecv(_) => send_recv.push(i),
            Work::OneSided(op) if op.waits() => waits.push(i),
            Work::OneSided(_) => puts.push(i),
        }
    }
    if let Some(&first) = send_recv.first() {
        // Two launches of one group on two streams could each wait for the other's share of the GPU.
        if send_recv.iter().any(|&i| work[i].stream != work[first].stream) {
            return Err(Error::invalid_usage(
                "the sends and receives of one group on one communicator use several streams; this library \
                 carries them out on one stream per communicator and group",
            ));
        }
        steps.push(Step::SendRecv(send_recv));
    }
    steps.extend(puts.into_iter().chain(waits).map(Step::OneSided));
    Ok(steps)
}

/// A path a collective may take (`paths`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The copy engines move the data (eager all-gathers and broadcasts on registered outputs); declined
    /// where some rank cannot reach an output it writes.
    CopyEngine,
    /// One kernel that reads and writes the peers' registered buffers, or, where a rank's vote says no,
    /// runs the scratch algorithm itself: never declines.
    ZeroCopy,
    /// Sends and receives (`send_recv_collectives`); declined where the calls do not fit the send/receive
    /// area.
    SendRecv,
    /// The scratch algorithm the table chose, a launch per window (`scratch_launches`): never declines.
    Scratch(Protocol),
}

/// The settings that choose a collective's path beside its shape (`MSCCLPP_COLL_ALGO`,
/// `MSCCLPP_DETERMINISTIC`). Every rank of a call must take the same path (a kernel waits for its
/// namesakes on the peers), so the collectives' set-up compares every rank's (`Scratch::set_up`): a rank
/// whose environment differs is an error naming it, not a hang.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSettings {
    pub choice: Choice,
    pub reproducible: bool,
}

impl PathSettings {
    /// One byte: the choice's code, and the reproducible mode in the high bit.
    pub fn code(self) -> u8 {
        self.choice.code() | ((self.reproducible as u8) << 7)
    }

    /// `None` where rank `peer`'s byte says the same as ours; else the error naming what differs.
    pub fn disagreement(self, peer: usize, theirs: u8) -> Option<crate::error::Error> {
        if theirs == self.code() {
            return None;
        }
        let (choice, reproducible) = (Choice::from_code(theirs & 0x7f), theirs >> 7 != 0);
        let what = match choice {
            Some(c) if c != self.choice => format!(
                "rank {peer}'s MSCCLPP_COLL_ALGO is {:?} and ours {:?}",
                c.name(),
                self.choice.name()
            ),
            Some(_) => format!(
                "rank {peer}'s MSCCLPP_DETERMINISTIC is {} and ours {}",
                reproducible as u8, self.reproducible as u8
            ),
            None => format!("rank {peer} sent an unknown algorithm code {theirs:#x}"),
        };
        Some(crate::error::Error::invalid_usage(format!(
            "{what}: the settings that choose the collectives' paths must be the same on every rank"
        )))
    }
}

/// What a collective's path depends on: the call's shape and the communicator's.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub collective: Collective,
    pub op: Option<RedOp>,
    pub nranks: usize,
    pub placement: Placement,
    /// The bytes that cross (`Collective::message`).
    pub message: u64,
    pub choice: Choice,
    /// `MSCCLPP_DETERMINISTIC`: a reduction takes only paths that reduce each element in rank order.
    pub reproducible: bool,
    pub capturing: bool,
}

/// The paths `shape` may take, in the order they are tried; the last never declines.
pub fn paths(shape: &Shape) -> Vec<Path> {
    let Shape {
        collective,
        op,
        nranks,
        placement,
        message,
        choice,
        reproducible,
        capturing,
    } = *shape;
    let mut paths = Vec::new();
    if copy_engine::attempt(collective, nranks, placement, message, choice, capturing) {
        paths.push(Path::CopyEngine);
    }
    if zero_copy::attempt(collective, op, nranks, placement, message, choice) {
        paths.push(Path::ZeroCopy);
        return paths;
    }
    // Every path but the rings and chains of sends and receives reduces an element in rank order, whatever
    // the size, window or grid: the copy engine reduces nothing, zero-copy and the scratch algorithms add
    // rank 0's value, then rank 1's, ... (kernels/collectives/); a ring adds in an order that depends on
    // where the element falls, a chain in the chain's order. A reproducible reduction leaves them out.
    let reduces = op.is_some();
    if !(reproducible && reduces) && send_recv_collectives::applies(collective, op, nranks, placement, message, choice)
    {
        paths.push(Path::SendRecv);
    }
    paths.push(Path::Scratch(algorithm::choose(collective, nranks, message, choice)));
    paths
}

/// One launch of the scratch algorithm: `bytes` of the piece from `offset`, on `blocks` of `threads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchLaunch {
    pub offset: u64,
    pub bytes: u64,
    pub blocks: u32,
    pub threads: u32,
}

/// The scratch algorithm's launches for one rank's `piece` bytes: a window each (`window` bytes, the
/// scratch's), each with its grid of at most `max_blocks` blocks.
pub fn scratch_launches(
    collective: Collective,
    protocol: Protocol,
    nranks: usize,
    piece: u64,
    window: u64,
    max_blocks: u32,
) -> Vec<ScratchLaunch> {
    algorithm::windows(piece, window)
        .map(|(offset, bytes)| {
            let (blocks, threads) = algorithm::grid(collective, protocol, nranks, bytes, max_blocks);
            ScratchLaunch {
                offset,
                bytes,
                blocks,
                threads,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::signal::{SignalId, Wait};
    use crate::collective::{DataType, SendRecvKind};

    fn stream(raw: u64) -> AppStream {
        // SAFETY: never used as a stream: the planner only compares streams.
        unsafe { AppStream::from_raw(raw) }
    }

    fn collective(c: Collective) -> Submitted {
        let call = Call {
            collective: c,
            function: "test",
            send: 0x1000,
            recv: 0x2000,
            count: 4,
            datatype: DataType::Float32,
            op: Some(RedOp::Sum),
            root: 0,
        };
        Submitted {
            work: Work::Collective {
                sizes: call.sizes(0, 2, 0).unwrap(),
                call,
            },
            stream: stream(7),
        }
    }

    fn send_recv(kind: SendRecvKind, s: u64) -> Submitted {
        Submitted {
            work: Work::SendRecv(SendRecvOp {
                kind,
                function: "test",
                peer: 1,
                buffer: 0x3000,
                count: 4,
                datatype: DataType::Float32,
            }),
            stream: stream(s),
        }
    }

    fn one_sided(op: OneSided) -> Submitted {
        Submitted {
            work: Work::OneSided(op),
            stream: stream(7),
        }
    }

    fn signal() -> OneSided {
        OneSided::Signal {
            peer: 1,
            signal: SignalId { ctx: 0, index: 0 },
        }
    }

    fn wait() -> OneSided {
        OneSided::Wait(vec![Wait {
            peer: 1,
            signal: SignalId { ctx: 0, index: 0 },
            count: 1,
        }])
    }

    #[test]
    fn a_group_goes_collectives_then_sends_and_receives_then_one_sided_calls_waits_last() {
        let work = vec![
            one_sided(wait()),
            send_recv(SendRecvKind::Send, 7),
            collective(Collective::AllReduce),
            one_sided(signal()),
            send_recv(SendRecvKind::Recv, 7),
            Submitted {
                work: Work::Resume,
                stream: stream(0),
            },
            collective(Collective::AllGather),
            one_sided(wait()),
            one_sided(signal()),
        ];
        assert_eq!(
            plan(&work).unwrap(),
            vec![
                Step::Alone(2),
                Step::Alone(5),
                Step::Alone(6),
                Step::SendRecv(vec![1, 4]),
                Step::OneSided(3),
                Step::OneSided(8),
                Step::OneSided(0),
                Step::OneSided(7),
            ]
        );
        assert!(plan(&[]).unwrap().is_empty());
        assert_eq!(
            plan(&[collective(Collective::Broadcast)]).unwrap(),
            vec![Step::Alone(0)]
        );
    }

    #[test]
    fn a_groups_sends_and_receives_on_two_streams_are_refused() {
        let work = vec![send_recv(SendRecvKind::Send, 7), send_recv(SendRecvKind::Recv, 8)];
        let e = plan(&work).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::InvalidUsage);
        assert!(e.message.contains("several streams"), "{e}");
    }

    fn shape(collective: Collective, message: u64, choice: Choice, capturing: bool) -> Shape {
        Shape {
            collective,
            op: matches!(
                collective,
                Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
            )
            .then_some(RedOp::Sum),
            nranks: 4,
            placement: Placement::SeveralGpus,
            message,
            choice,
            reproducible: false,
            capturing,
        }
    }

    #[test]
    fn ranks_whose_path_settings_differ_are_named() {
        let ours = PathSettings {
            choice: Choice::Auto,
            reproducible: true,
        };
        assert!(ours.disagreement(3, ours.code()).is_none());
        let algo = ours.disagreement(
            3,
            PathSettings {
                choice: Choice::SendRecv,
                ..ours
            }
            .code(),
        );
        let e = algo.expect("another algorithm");
        assert!(
            e.message
                .contains("rank 3's MSCCLPP_COLL_ALGO is \"sendrecv\" and ours \"auto\""),
            "{e}"
        );
        let det = ours.disagreement(
            5,
            PathSettings {
                reproducible: false,
                ..ours
            }
            .code(),
        );
        assert!(
            det.unwrap()
                .message
                .contains("rank 5's MSCCLPP_DETERMINISTIC is 0 and ours 1")
        );
        assert!(
            ours.disagreement(1, 0x3f)
                .unwrap()
                .message
                .contains("unknown algorithm code")
        );
        for c in [
            Choice::Auto,
            Choice::ZeroCopy,
            Choice::CopyEngine,
            Choice::SendRecv,
            Choice::Force(Protocol::Copy),
        ] {
            assert_eq!(Choice::from_code(c.code()), Some(c));
            assert_eq!(Choice::parse(c.name()), c);
        }
    }

    #[test]
    fn a_reproducible_reduction_never_takes_sends_and_receives() {
        let reductions = [Collective::AllReduce, Collective::ReduceScatter, Collective::Reduce];
        let choices = [
            Choice::Auto,
            Choice::SendRecv,
            Choice::ZeroCopy,
            Choice::Force(Protocol::Copy),
        ];
        let mut rings_left_out = 0;
        for c in reductions {
            for choice in choices {
                for nranks in [2, 3, 4, 8] {
                    for placement in [Placement::OneGpu, Placement::SeveralGpus] {
                        for message in [4096, 1 << 20, 64 << 20, 1 << 30] {
                            let default = Shape {
                                nranks,
                                placement,
                                ..shape(c, message, choice, false)
                            };
                            let reproducible = Shape {
                                reproducible: true,
                                ..default
                            };
                            let (was, now) = (paths(&default), paths(&reproducible));
                            assert!(!now.contains(&Path::SendRecv), "{reproducible:?}: {now:?}");
                            // Only the rings and chains are left out: every other path stays, in its order.
                            let kept: Vec<Path> = was.iter().copied().filter(|p| *p != Path::SendRecv).collect();
                            assert_eq!(now, kept, "{reproducible:?}");
                            rings_left_out += was.contains(&Path::SendRecv) as usize;
                        }
                    }
                }
            }
        }
        // The default does take them somewhere (among several GPUs, large; or when forced), else this proves
        // nothing.
        assert!(rings_left_out > 0);
        // The collectives that reduce nothing keep theirs.
        let broadcast = Shape {
            reproducible: true,
            ..shape(Collective::Broadcast, 1 << 30, Choice::SendRecv, false)
        };
        assert!(paths(&broadcast).contains(&Path::SendRecv));
    }

    #[test]
    fn every_collective_ends_on_a_path_that_never_declines() {
        let choices = [
            Choice::Auto,
            Choice::ZeroCopy,
            Choice::CopyEngine,
            Choice::SendRecv,
            Choice::Force(Protocol::Packet),
            Choice::Force(Protocol::Copy),
        ];
        for c in Collective::ALL {
            for choice in choices {
                for message in [4096, 1 << 20, 256 << 20] {
                    for capturing in [false, true] {
                        let p = paths(&shape(c, message, choice, capturing));
                        let last = *p.last().unwrap();
                        assert!(
                            matches!(last, Path::ZeroCopy | Path::Scratch(_)),
                            "{c:?} {choice:?} {message} {capturing}: {p:?}"
                        );
                        assert!(
                            !capturing || !p.contains(&Path::CopyEngine),
                            "never the copy engine in a graph: {p:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_copy_engine_is_tried_before_zero_copy_and_sends_before_the_scratch() {
        let eager = paths(&shape(Collective::AllGather, 1 << 20, Choice::CopyEngine, false));
        assert_eq!(eager, vec![Path::CopyEngine, Path::ZeroCopy]);
        let captured = paths(&shape(Collective::AllGather, 1 << 20, Choice::CopyEngine, true));
        assert_eq!(captured, vec![Path::ZeroCopy]);
        let all_to_all = paths(&shape(Collective::AllToAll, 1 << 20, Choice::Auto, false));
        assert_eq!(all_to_all[0], Path::SendRecv);
        let forced = paths(&shape(
            Collective::AllReduce,
            1 << 20,
            Choice::Force(Protocol::Packet),
            false,
        ));
        assert_eq!(forced, vec![Path::Scratch(Protocol::Packet)]);
    }

    #[test]
    fn the_scratch_launches_cover_the_piece_once_in_windows() {
        for (piece, window) in [
            (1u64, 64u64),
            (64, 64),
            (65, 64),
            (10 << 20, 1 << 20),
            ((3 << 20) + 5, 1 << 20),
        ] {
            let launches = scratch_launches(Collective::AllReduce, Protocol::Copy, 4, piece, window, 16);
            let mut next = 0;
            for l in &launches {
                assert_eq!(l.offset, next, "{piece} {window}: {launches:?}");
                assert!(l.bytes > 0 && l.bytes <= window);
                assert!(l.blocks >= 1 && l.blocks <= 16, "{l:?}");
                next += l.bytes;
            }
            assert_eq!(next, piece);
            assert_eq!(launches.len() as u64, piece.div_ceil(window));
        }
        assert!(scratch_launches(Collective::AllReduce, Protocol::Copy, 4, 0, 64, 16).is_empty());
    }
}
