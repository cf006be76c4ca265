//! One collective call as the application made it, checked: which collective, the buffers, the count,
//! the type, the operator and the root, and the byte sizes they make.

use super::{DataType, RedOp};
use crate::ensure_arg;
use crate::error::{Error, Result};
use crate::gpu::DevicePtr;

/// The collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    /// An all-reduce whose result only the root keeps.
    Reduce,
    /// An all-gather whose result only the root keeps.
    Gather,
    /// The root's piece r to rank r.
    Scatter,
    /// Every rank's piece r to rank r.
    AllToAll,
}

impl Collective {
    /// Every collective, in declaration order (for tests that go through them all).
    pub const ALL: [Collective; 8] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllToAll,
    ];

    /// Whether the collective has a root (which ranks read or keep data depends on it).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// Whether the application's buffers hold one piece per rank (`strideBytes` apart) on some rank.
    pub fn per_rank_pieces(self) -> bool {
        matches!(
            self,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::Gather
                | Collective::Scatter
                | Collective::AllToAll
        )
    }

    /// The name of the count argument, for messages.
    fn count_name(self) -> &'static str {
        match self {
            Collective::AllGather => "sendcount",
            Collective::ReduceScatter => "recvcount",
            _ => "count",
        }
    }

    /// The bytes that cross for one rank's `piece` (what the algorithm table is keyed by): the whole
    /// buffer of an all-reduce, a reduce and a broadcast; the gathered or scattered buffer of the others.
    pub fn message(self, piece: u64, nranks: usize) -> u64 {
        if self.per_rank_pieces() {
            piece.saturating_mul(nranks as u64)
        } else {
            piece
        }
    }
}

/// A call's arguments, as the application passed them (the type and operator already checked).
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub collective: Collective,
    /// The exported function the application called (`ncclAllReduce`, `mscclppAllReduce`), for messages:
    /// each face names its own.
    pub function: &'static str,
    pub send: DevicePtr,
    pub recv: DevicePtr,
    /// Elements: of the whole buffer (all-reduce, broadcast), or of one rank's piece (all-gather's
    /// `sendcount`, reduce-scatter's `recvcount`).
    pub count: usize,
    pub datatype: DataType,
    /// `None` for the collectives that do not reduce.
    pub op: Option<RedOp>,
    /// Broadcast's root (0 for the others).
    pub root: usize,
}

/// The byte sizes of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// One rank's piece: the whole buffer of an all-reduce or a broadcast, the input of an all-gather,
    /// the output of a reduce-scatter.
    pub piece: u64,
    /// The input buffer (0 where this rank reads none: a broadcast's or a scatter's non-root).
    pub send: u64,
    /// The output buffer (0 where this rank keeps none: a reduce's or a gather's non-root).
    pub recv: u64,
}

impl Call {
    /// Checks what can be checked without a GPU: the root, the sizes (no overflow), and that the buffers
    /// a non-empty call uses are not null. `root` is the application's int, checked here.
    pub fn sizes(&self, rank: usize, nranks: usize, root: i64) -> Result<Sizes> {
        if self.collective.rooted() {
            ensure_arg!(
                root >= 0 && (root as u64) < nranks as u64,
                "root is {root}; it must be in [0, nranks = {nranks})"
            );
        }
        let overflow = || {
            Error::invalid_argument(format!(
                "{} = {} elements of {} bytes{} overflow a 64-bit byte count",
                self.collective.count_name(),
                self.count,
                self.datatype.size(),
                if self.collective.per_rank_pieces() {
                    format!(" x nranks = {nranks}")
                } else {
                    String::new()
                }
            ))
        };
        let piece = (self.count as u64)
            .checked_mul(self.datatype.size() as u64)
            .ok_or_else(overflow)?;
        let whole = piece.checked_mul(nranks as u64).ok_or_else(overflow)?;
        // Pointers add byte counts: a buffer must fit the address space too.
        ensure_arg!(whole < (1u64 << 63), "{}", overflow().message);
        let sizes = match self.collective {
            Collective::AllReduce => Sizes {
                piece,
                send: piece,
                recv: piece,
            },
            Collective::AllGather => Sizes {
                piece,
                send: piece,
                recv: whole,
            },
            Collective::ReduceScatter => Sizes {
                piece,
                send: whole,
                recv: piece,
            },
            Collective::Broadcast => Sizes {
                piece,
                send: if rank == self.root { piece } else { 0 },
                recv: piece,
            },
            Collective::Reduce => Sizes {
                piece,
                send: piece,
                recv: if rank == self.root { piece } else { 0 },
            },
            Collective::Gather => Sizes {
                piece,
                send: piece,
                recv: if rank == self.root { whole } else { 0 },
            },
            Collective::Scatter => Sizes {
                piece,
                send: if rank == self.root { whole } else { 0 },
                recv: piece,
            },
            Collective::AllToAll => Sizes {
                piece,
                send: whole,
                recv: whole,
            },
        };
        if piece > 0 {
            ensure_arg!(
                sizes.send == 0 || self.send != 0,
                "sendbuff is NULL ({} = {})",
                self.collective.count_name(),
                self.count
            );
            ensure_arg!(
                sizes.recv == 0 || self.recv != 0,
                "recvbuff is NULL ({} = {})",
                self.collective.count_name(),
                self.count
            );
        }
        Ok(sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(collective: Collective, count: usize, datatype: DataType) -> Call {
        Call {
            collective,
            function: "test",
            send: 0x1000,
            recv: 0x2000,
            count,
            datatype,
            op: Some(RedOp::Sum),
            root: 0,
        }
    }

    #[test]
    fn sizes_per_collective() {
        let s = call(Collective::AllReduce, 3, DataType::Float32)
            .sizes(0, 4, 0)
            .unwrap();
        assert_eq!((s.piece, s.send, s.recv), (12, 12, 12));
        let s = call(Collective::AllGather, 3, DataType::Float16)
            .sizes(1, 4, 0)
            .unwrap();
        assert_eq!((s.piece, s.send, s.recv), (6, 6, 24));
        let s = call(Collective::ReduceScatter, 5, DataType::Int64)
            .sizes(1, 2, 0)
            .unwrap();
        assert_eq!((s.piece, s.send, s.recv), (40, 80, 40));
        let mut b = call(Collective::Broadcast, 7, DataType::Uint8);
        b.root = 1;
        assert_eq!(b.sizes(1, 2, 1).unwrap().send, 7);
        assert_eq!(b.sizes(0, 2, 1).unwrap().send, 0, "a non-root reads no input");
        let mut r = call(Collective::Reduce, 3, DataType::Float32);
        r.root = 1;
        assert_eq!(
            r.sizes(1, 4, 1).unwrap(),
            Sizes {
                piece: 12,
                send: 12,
                recv: 12
            }
        );
        assert_eq!(r.sizes(0, 4, 1).unwrap().recv, 0, "a reduce's non-root keeps no output");
        let mut g = call(Collective::Gather, 3, DataType::Int32);
        g.root = 2;
        assert_eq!(
            g.sizes(2, 4, 2).unwrap(),
            Sizes {
                piece: 12,
                send: 12,
                recv: 48
            }
        );
        assert_eq!(g.sizes(0, 4, 2).unwrap().recv, 0);
        let sc = call(Collective::Scatter, 3, DataType::Int32);
        assert_eq!(
            sc.sizes(0, 4, 0).unwrap(),
            Sizes {
                piece: 12,
                send: 48,
                recv: 12
            }
        );
        assert_eq!(
            sc.sizes(1, 4, 0).unwrap().send,
            0,
            "a scatter's non-root reads no input"
        );
        let a = call(Collective::AllToAll, 3, DataType::Int8);
        assert_eq!(
            a.sizes(1, 4, 0).unwrap(),
            Sizes {
                piece: 3,
                send: 12,
                recv: 12
            }
        );
    }

    #[test]
    fn fp8_counts_are_bytes_and_the_table_picks_by_bytes() {
        use crate::collective::algorithm::{Choice, Protocol, choose, packet_limit};
        for t in [DataType::Float8e4m3, DataType::Float8e5m2] {
            // A PreMulSum changes nothing in sizes or choice: its scalar travels in the kernel argument.
            let mut c = call(Collective::AllReduce, 512 << 10, t);
            c.op = Some(RedOp::PreMulSum(crate::collective::Scalar::Immediate(0x38)));
            let s = c.sizes(0, 2, 0).unwrap();
            assert_eq!((s.piece, s.send, s.recv), (512 << 10, 512 << 10, 512 << 10));
            let message = Collective::AllReduce.message(s.piece, 2);
            assert_eq!(message, packet_limit(Collective::AllReduce, 4));
            assert_eq!(
                choose(Collective::AllReduce, 4, message, Choice::Auto),
                Protocol::Packet
            );
            assert_eq!(
                choose(Collective::AllReduce, 4, message + 1, Choice::Auto),
                Protocol::Copy
            );
            let rs = call(Collective::ReduceScatter, 1000, t).sizes(1, 4, 0).unwrap();
            assert_eq!((rs.piece, rs.send, rs.recv), (1000, 4000, 1000));
        }
    }

    #[test]
    fn overflowing_counts_are_refused() {
        let e = call(Collective::AllReduce, usize::MAX / 2, DataType::Float64)
            .sizes(0, 2, 0)
            .unwrap_err();
        assert!(e.message.contains("count = ") && e.message.contains("overflow"), "{e}");
        let e = call(Collective::AllGather, 1 << 61, DataType::Int8)
            .sizes(0, 8, 0)
            .unwrap_err();
        assert!(
            e.message.contains("sendcount") && e.message.contains("nranks = 8"),
            "{e}"
        );
    }

    #[test]
    fn roots_and_null_buffers() {
        let mut b = call(Collective::Broadcast, 1, DataType::Int32);
        assert!(b.sizes(0, 2, 2).unwrap_err().message.contains("root is 2"));
        assert!(b.sizes(0, 2, -1).unwrap_err().message.contains("root is -1"));
        b.recv = 0;
        assert!(b.sizes(0, 2, 0).unwrap_err().message.contains("recvbuff is NULL"));
        let mut a = call(Collective::AllReduce, 1, DataType::Int32);
        a.send = 0;
        assert!(a.sizes(0, 2, 0).unwrap_err().message.contains("sendbuff is NULL"));
        a.count = 0;
        a.recv = 0;
        assert!(a.sizes(0, 2, 0).is_ok(), "an empty call may pass null buffers");
        let mut nonroot = call(Collective::Broadcast, 4, DataType::Int32);
        nonroot.send = 0;
        assert!(nonroot.sizes(1, 2, 0).is_ok(), "a non-root's sendbuff is not used");
        let mut reduce = call(Collective::Reduce, 4, DataType::Int32);
        reduce.recv = 0;
        assert!(
            reduce.sizes(1, 2, 0).is_ok(),
            "a reduce's non-root recvbuff is not used"
        );
        assert!(reduce.sizes(0, 2, 0).unwrap_err().message.contains("recvbuff is NULL"));
        let gather = call(Collective::Gather, 4, DataType::Int32);
        assert!(gather.sizes(0, 2, 5).unwrap_err().message.contains("root is 5"));
    }
}
