//! The kernels the dispatch paths ask for, each found in the table of entry points (a test of its own: it
//! reads every path's choice, which `kernels.rs`, imported by those paths, cannot).

use super::algorithm::{self, Choice, Placement, Protocol};
use super::kernels::{Entry, built_types, entry};
use super::variants::{Kernel, Op};
use super::{Collective, DataType, RedOp, Scalar, send_recv_collectives, zero_copy};
use std::collections::HashSet;

/// Every launch the dispatcher can ask for, by the paths' own choices: the scratch algorithms of every
/// collective (every operator where it reduces), zero-copy and sends and receives whose receives reduce
/// where they would be tried, one rank's `PreMulSum`, and the kernels of no type.
fn requests() -> Vec<(Kernel, Option<RedOp>, DataType)> {
    let premul = RedOp::PreMulSum(Scalar::Immediate(0));
    let mut out = Vec::new();
    for t in DataType::ALL {
        for c in Collective::ALL {
            let reduces = matches!(
                c,
                Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
            );
            let ops: Vec<Option<RedOp>> = if reduces {
                RedOp::BUILT_IN.iter().copied().chain([premul]).map(Some).collect()
            } else {
                vec![None]
            };
            for op in ops {
                for p in [Protocol::Packet, Protocol::Copy] {
                    out.push((algorithm::kernel(c, p), op, t));
                }
                if zero_copy::attempt(c, op, 2, Placement::SeveralGpus, 1, Choice::ZeroCopy) {
                    out.push((zero_copy::kernel(c), op, t));
                }
                if op.is_some() && send_recv_collectives::applies(c, op, 2, Placement::SeveralGpus, 1, Choice::SendRecv)
                {
                    out.push((Kernel::SendRecvReduce, op, t));
                }
            }
        }
        out.push((Kernel::ScalePreMulSum, Some(premul), t));
    }
    for k in [Kernel::SendRecv, Kernel::CeFence, Kernel::RmaPut, Kernel::RmaWait] {
        out.push((k, None, DataType::Uint8));
    }
    out
}

#[test]
fn every_launch_the_dispatcher_asks_for_has_an_entry_point() {
    let built = built_types();
    let requests = requests();
    for &(kernel, op, t) in &requests {
        let e = entry(kernel, op, t);
        if op.is_some() && !built.contains(&t) {
            assert_eq!(e, Entry::LeftOut, "{kernel:?} {op:?} {t:?}");
        } else {
            assert!(
                matches!(e, Entry::Built { .. }),
                "{kernel:?} {op:?} {t:?} has no entry point: {e:?}"
            );
        }
    }
    // Every kernel and operator of the table is asked for by some path.
    let asked: HashSet<(Kernel, Option<Op>)> = requests
        .iter()
        .map(|&(k, op, _)| (k, op.map(RedOp::kernel_op)))
        .collect();
    for kernel in Kernel::ALL {
        let ops: Vec<Option<Op>> = if kernel.reduces() {
            kernel.spec().ops.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
        for op in ops {
            assert!(asked.contains(&(kernel, op)), "no path asks for {kernel:?} {op:?}");
        }
    }
}
