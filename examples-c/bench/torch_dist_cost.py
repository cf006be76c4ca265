#!/usr/bin/env python3
"""PyTorch's eager ``dist.all_reduce`` through our NCCL library against ``mscclpp.all_reduce`` on the same
tensor, per call, in one run (issue 25, point 6).

    python3 examples-c/bench/torch_dist_cost.py [--nranks N] [--bytes B] [--calls N] [--repeats N] [--rounds N]

From the repository root of a built tree (build/lib/nccl/libnccl.so.2, build/lib, python/). --nranks
processes are started here (spawn) with our libnccl.so.2 preloaded (``LD_PRELOAD``, as a user runs PyTorch on
it), rank r on GPU r % GPUs. Each rank makes a ``torch.distributed`` process group ``"nccl"`` (a TCP store on
127.0.0.1, ``device_id`` given so that the communicator is made at once) and a ``mscclpp.Communicator`` of the
same ranks, then times, on one float32 tensor of --bytes (default 1 KiB), in place, sum, on torch's current
stream, alternately:

- ``torch``: ``dist.all_reduce(t)`` (PyTorch's ProcessGroupNCCL, then our ``ncclAllReduce``);
- ``mscclpp``: ``mscclpp.all_reduce(t, comm=comm)`` (the package's fast path, then ``mscclppAllReduce``);

each a warm-up, then --repeats times: a barrier, --calls calls back to back and one synchronize; the time
per call is host time / calls, the median of the repeats, the slowest rank's, the median of --rounds rounds.
The result of each side is checked after its timed calls (inputs are small integers; the sum of N ranks'
values, exact in float32, grows by nothing since each loop starts from the same tensor refilled). With
ranks sharing a GPU the MPS daemon must run (nvidia-cuda-mps-control -d) for the ranks' kernels to run at
once; NVIDIA's NCCL cannot be measured that way (it refuses two ranks on one GPU), so it is not a column here.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import traceback
from typing import Any, Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NCCL_LIB = os.path.join(ROOT, "build", "lib", "nccl", "libnccl.so.2")
SIDES = ("torch", "mscclpp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, args: argparse.Namespace, uid: Any, port: int, out: Any) -> None:
    report: Dict[str, Any] = {"rank": rank}
    try:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import torch
        import torch.distributed as dist

        import mscclpp

        gpu = rank % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        dev = torch.device("cuda", gpu)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.nranks,
                                device_id=dev)
        report["fastcall"] = mscclpp.collectives._fastcall_state()
        n = args.bytes // 4
        base = torch.tensor([float((rank + j) % 7 + 1) for j in range(n)], dtype=torch.float32, device=dev)
        want = torch.tensor([float(sum((r + j) % 7 + 1 for r in range(args.nranks))) for j in range(n)],
                            dtype=torch.float32, device=dev)
        t = base.clone()
        with mscclpp.Communicator(args.nranks, rank, unique_id=uid, device=gpu) as comm:
            calls = {"torch": lambda: dist.all_reduce(t), "mscclpp": lambda: mscclpp.all_reduce(t, comm=comm)}
            times: Dict[str, List[float]] = {s: [] for s in SIDES}
            for rnd in range(args.rounds + 1):  # round 0 warms up
                for side in SIDES:
                    f = calls[side]
                    per: List[float] = []
                    for _ in range(args.repeats):
                        t.copy_(base)
                        dist.barrier()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        for _ in range(args.calls):
                            f()
                        torch.cuda.synchronize()
                        per.append((time.perf_counter() - t0) * 1e6 / args.calls)
                        # One call on the refilled tensor, checked.
                        t.copy_(base)
                        f()
                        torch.cuda.synchronize()
                        if not torch.equal(t, want):
                            bad = int((t != want).sum())
                            raise AssertionError(f"{side}: {bad} of {n} elements wrong after the timed calls")
                    if rnd:
                        times[side].append(statistics.median(per))
            report["times"] = times
            comm.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        report["error"] = f"{e!r}\n{traceback.format_exc()}"
    out.put(report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if not os.path.isfile(NCCL_LIB):
        print(f"FAIL torch_dist_cost: {NCCL_LIB} is missing (run make)")
        return 1
    # Spawned ranks exec a fresh interpreter: the preload reaches them, not this process.
    os.environ["LD_PRELOAD"] = NCCL_LIB + (":" + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import mscclpp

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from python_call_cost import spawn_ranks

    uid = mscclpp.UniqueId.create()
    port = free_port()
    reports, _ = spawn_ranks(rank_main, lambda r, q: (r, args, uid, port, q), args.nranks, args.timeout)
    failed = [r for r in reports if "error" in r]
    for r in failed:
        print(f"FAIL torch_dist_cost rank {r['rank']}: {r['error']}")
    if len(reports) < args.nranks:
        print(f"FAIL torch_dist_cost: {args.nranks - len(reports)} rank(s) sent no report within {args.timeout:.0f} s")
    if failed or len(reports) < args.nranks:
        return 1
    print(f"torch_dist_cost: {args.nranks} ranks, {args.bytes} bytes float32 all-reduce in place, eager; "
          f"mscclpp fast path: {reports[0].get('fastcall')}")
    print("round | " + " | ".join(f"{s} us" for s in SIDES) + " | torch - mscclpp")
    med: Dict[str, float] = {}
    for rnd in range(args.rounds):
        row = {s: max(r["times"][s][rnd] for r in reports) for s in SIDES}  # the slowest rank
        print(f"{rnd + 1:5d} | " + " | ".join(f"{row[s]:8.2f}" for s in SIDES) + f" | {row['torch'] - row['mscclpp']:+.2f}")
    for s in SIDES:
        med[s] = statistics.median(max(r["times"][s][k] for r in reports) for k in range(args.rounds))
    print(f"RESULT torch_dist_us={med['torch']:.2f} mscclpp_all_reduce_us={med['mscclpp']:.2f} "
          f"diff_us={med['torch'] - med['mscclpp']:+.2f}")
    print("PASS torch_dist_cost: both sides checked after their timed calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
