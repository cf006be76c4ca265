"""From torch.distributed to mscclpp: the same four collectives on NCCL and on mscclpp, side by side.

Two processes (torch.multiprocessing), rank r on GPU r % GPUs. Each rank runs one training-step-like
sequence of collectives, first with torch.distributed on NCCL, then with mscclpp; the calls map one to one:

    torch.distributed (NCCL)                          mscclpp
    dist.all_reduce(grad)                             mscclpp.all_reduce(grad, comm=comm)
    dist.all_gather_into_tensor(gathered, shard)      mscclpp.all_gather(gathered, shard, comm=comm)
    dist.reduce_scatter_tensor(shard_out, full)       mscclpp.reduce_scatter(shard_out, full, comm=comm)
    dist.broadcast(params, src=0)                     mscclpp.broadcast(params, 0, comm=comm)

Both run on torch's current stream and return before the GPU is done; mscclpp's take the tensors as they are
(no registration) and need no set-up beyond the communicator. The example checks that both backends give the
same bits, and the values computed locally (the inputs are small integers: every order of summation gives
the same result). Then it times a small all-reduce (a gradient sync of a small model, where the cost per
call is what counts) with each, and with mscclpp replayed from a CUDA graph.

The ranks meet through torch.distributed's TCP store, which also carries mscclpp's unique id: rank 0 makes
the id (its bootstrap root runs in rank 0's process) and sets its 128 bytes under a key; every rank gets
them (store.get waits until the key is there) and joins with them.

--backend nccl or mscclpp runs one half alone, checked against the local computation. NCCL needs a GPU per
rank: where there are fewer GPUs than ranks (both ranks on one GPU), --backend both skips the NCCL half
(torch.distributed then runs on gloo, for its store and barriers only).

NCCL_NVLS_ENABLE=0 is set before torch.distributed starts (in the parent, which the ranks inherit, and in each
rank): NCCL must not use NVLink multicast here.

Usage: python allreduce_from_torch_distributed.py [--backend both|nccl|mscclpp] [--nranks N] [--port P]
Prints "Succeed!" at the end when every check passed.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Dict

import mscclpp

N = 1 << 18  # elements per rank's shard (1 MiB of float32)
SMALL = 1024  # elements of the timed all-reduce
GRAPH_CALLS = 20  # all-reduces per captured graph


# ---- the step, both ways ----

def step_nccl(dist: Any, t: Dict[str, Any]) -> None:
    dist.all_reduce(t["grad"])                              # sum, in place
    dist.all_gather_into_tensor(t["gathered"], t["shard"])
    dist.reduce_scatter_tensor(t["shard_out"], t["full"])   # sum
    dist.broadcast(t["params"], src=0)


def step_mscclpp(comm: mscclpp.Communicator, t: Dict[str, Any]) -> None:
    mscclpp.all_reduce(t["grad"], comm=comm)                # sum, in place
    mscclpp.all_gather(t["gathered"], t["shard"], comm=comm)
    mscclpp.reduce_scatter(t["shard_out"], t["full"], comm=comm)  # sum
    mscclpp.broadcast(t["params"], 0, comm=comm)


# ---- inputs and what they must give ----

def rank_values(torch: Any, rank: int, n: int, dtype: Any) -> Any:
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i * 7 + rank * 3) % 11 + 1).to(dtype)


def inputs(torch: Any, rank: int, world: int) -> Dict[str, Any]:
    return {
        "grad": rank_values(torch, rank, world * N, torch.bfloat16),
        "shard": rank_values(torch, rank, N, torch.float32),
        "gathered": torch.zeros(world * N, device="cuda"),
        "full": rank_values(torch, rank, world * N, torch.float32),
        "shard_out": torch.zeros(N, device="cuda"),
        "params": rank_values(torch, rank, N, torch.float32) * (rank + 1),
    }


def expected(torch: Any, rank: int, world: int) -> Dict[str, Any]:
    """What the step leaves in each tensor, computed here (in float64: exact for these values)."""
    total = sum(rank_values(torch, r, world * N, torch.float64) for r in range(world))
    return {
        "grad": total.to(torch.bfloat16),
        "shard": rank_values(torch, rank, N, torch.float32),  # an input: unchanged
        "gathered": torch.cat([rank_values(torch, r, N, torch.float32) for r in range(world)]),
        "full": rank_values(torch, rank, world * N, torch.float32),  # an input: unchanged
        "shard_out": total[rank * N:(rank + 1) * N].float(),
        "params": rank_values(torch, 0, N, torch.float32),  # root 0's
    }


def compare(torch: Any, rank: int, what: str, got: Dict[str, Any], want: Dict[str, Any]) -> None:
    wrong = [k for k in want if not torch.equal(got[k], want[k])]
    if wrong:
        raise RuntimeError(f"rank {rank}: {what}: {wrong} differ")


def set_environment() -> None:
    """What the process needs in its environment before CUDA and NCCL start (the ranks inherit it, and set it
    again themselves): set by the functions that run, not at import, so that importing this file changes
    nothing."""
    # NCCL must never use NVLink multicast (NVLS) on these machines; NCCL reads this when its first
    # communicator is made, inside torch.distributed.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    # Kernels load when the context is made, not at their first launch (see docs/mscclpp.md, "Lazy module
    # loading"): a lazy load in one rank must not wait for a GPU busy with a collective that waits for it.
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


# ---- timing ----

def gpu_us_per_call(torch: Any, run: Callable[[], None], calls: int) -> float:
    """GPU time per call of ``run`` (which queues ``calls`` calls), waiting with a deadline."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    stop.record()
    deadline = time.monotonic() + 60
    while not stop.query():
        if time.monotonic() > deadline:
            raise TimeoutError("the timed all-reduces did not finish within 60 s")
        time.sleep(0.0002)
    return start.elapsed_time(stop) * 1000 / calls


def run_rank(rank: int, world: int, port: int, run_nccl: bool, run_mscclpp: bool, iters: int) -> None:
    set_environment()  # before CUDA starts in this process, and before torch.distributed makes NCCL's communicator
    import torch
    import torch.distributed as dist

    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)

    # The process group, on a store of our own so that mscclpp's id can travel through it too.
    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=timedelta(seconds=60))
    dist.init_process_group("nccl" if run_nccl else "gloo", store=store, rank=rank, world_size=world)

    comm = None
    if run_mscclpp:
        # mscclpp's unique id through the same store: rank 0 makes it, everybody reads it.
        if rank == 0:
            store.set("mscclpp/unique_id", bytes(mscclpp.UniqueId.create()))
        uid = mscclpp.UniqueId(store.get("mscclpp/unique_id"))
        comm = mscclpp.Communicator(world, rank, unique_id=uid, device=gpu)

    try:
        want = expected(torch, rank, world)

        # 1. The step on NCCL and on mscclpp; each checked, and against each other.
        results = {}
        if run_nccl:
            t = inputs(torch, rank, world)
            step_nccl(dist, t)
            torch.cuda.synchronize()
            compare(torch, rank, "NCCL vs the local computation", t, want)
            results["NCCL"] = t
        if comm is not None:
            t = inputs(torch, rank, world)
            step_mscclpp(comm, t)
            torch.cuda.synchronize()
            compare(torch, rank, "mscclpp vs the local computation", t, want)
            if run_nccl:
                compare(torch, rank, "mscclpp vs NCCL", t, results["NCCL"])
            results["mscclpp"] = t
        if rank == 0:
            print(f"{world} ranks: all_reduce, all_gather, reduce_scatter and broadcast of {' and '.join(results)} "
                  "give the local computation's values" + (", bit for bit the same" if len(results) > 1 else ""),
                  flush=True)

        # 2. A small all-reduce, timed: eagerly with each, then mscclpp replayed from a CUDA graph. MAX keeps
        # the values as they are, however many calls.
        x = torch.ones(SMALL, device="cuda")
        times = {}
        if run_nccl:
            for _ in range(20):
                dist.all_reduce(x, op=dist.ReduceOp.MAX)
            torch.cuda.synchronize()
            dist.barrier()
            times["NCCL"] = gpu_us_per_call(
                torch, lambda: [dist.all_reduce(x, op=dist.ReduceOp.MAX) for _ in range(iters)], iters)
        if comm is not None:
            for _ in range(20):
                mscclpp.all_reduce(x, "max", comm=comm)
            torch.cuda.synchronize()
            dist.barrier()
            times["mscclpp"] = gpu_us_per_call(
                torch, lambda: [mscclpp.all_reduce(x, "max", comm=comm) for _ in range(iters)], iters)

            graph = torch.cuda.CUDAGraph()
            # NCCL's watchdog thread queries its events while this thread captures: "thread_local" keeps the
            # capture's restrictions to this thread (the default, "global", would fail the capture for them).
            mode = {"capture_error_mode": "thread_local"} if run_nccl else {}
            with torch.cuda.graph(graph, **mode):  # captured like any kernel queued on the current stream
                for _ in range(GRAPH_CALLS):
                    mscclpp.all_reduce(x, "max", comm=comm)
            replays = max(1, iters // GRAPH_CALLS)
            torch.cuda.synchronize()
            dist.barrier()
            times["mscclpp in a CUDA graph"] = gpu_us_per_call(
                torch, lambda: [graph.replay() for _ in range(replays)], replays * GRAPH_CALLS)
            del graph
        torch.cuda.synchronize()
        if not bool((x == 1.0).all()):
            raise RuntimeError(f"rank {rank}: the timed all-reduces changed the values")
        gathered: list = [None] * world
        dist.all_gather_object(gathered, times)
        if rank == 0:
            shared = " (ranks share GPUs: the times say little)" if world > torch.cuda.device_count() else ""
            for name in times:
                worst = max(g[name] for g in gathered)
                print(f"all-reduce of {SMALL} float32 with {name}: {worst:8.2f} us per call (slowest rank){shared}",
                      flush=True)
        dist.barrier()  # every rank is done with the collectives before any communicator goes
    finally:
        torch.cuda.synchronize()
        if comm is not None:
            comm.close()
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["both", "nccl", "mscclpp"], default="both",
                        help="which to run: both (compared), or one of them (checked against the local computation)")
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--port", type=int, default=0, help="the TCP store's port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--iters", type=int, default=1000, help="timed all-reduces per backend")
    args = parser.parse_args()
    set_environment()  # before torch starts CUDA here; the ranks inherit it
    import torch
    import torch.multiprocessing as mp

    ngpus = torch.cuda.device_count()
    if ngpus < 1 or args.nranks < 2:
        print(f"Needs a GPU and at least two ranks (GPUs: {ngpus}, --nranks {args.nranks})", file=sys.stderr)
        return 1
    run_nccl = args.backend in ("both", "nccl")
    run_mscclpp = args.backend in ("both", "mscclpp")
    if run_nccl and ngpus < args.nranks:
        if args.backend == "nccl":
            print(f"NCCL needs a GPU per rank ({args.nranks} ranks, {ngpus} GPUs)", file=sys.stderr)
            return 1
        print(f"{args.nranks} ranks on {ngpus} GPU(s): NCCL needs a GPU per rank, so only mscclpp runs "
              "(torch.distributed on gloo, for its store and barriers)", flush=True)
        run_nccl = False
    port = args.port or free_port()
    try:
        mp.spawn(run_rank, args=(args.nranks, port, run_nccl, run_mscclpp, args.iters), nprocs=args.nranks, join=True)
    except Exception as e:  # noqa: BLE001 - a rank's failure, already printed by torch
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    print("Succeed!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
