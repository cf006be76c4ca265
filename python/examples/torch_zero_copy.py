"""PyTorch, unchanged, on our NCCL library with registered memory: the collectives go zero-copy.

    python python/examples/torch_zero_copy.py [--nranks 2] [--mode hook|mempool|both]

(It starts itself again with LD_PRELOAD=build/lib/nccl/libnccl.so.2 where that is not set.)

Two ways PyTorch hands NCCL registered memory, each a job of its own (rank r on cuda:(r % GPUs)):
  - hook: TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1: PyTorch registers every segment of its caching
    allocator with the communicator (ncclCommRegister) as it allocates it;
  - mempool: a torch.cuda.MemPool over the process group's allocator (ncclMemAlloc), the tensors allocated in
    it, the pool registered with backend.register_mem_pool. torch offers that allocator only on GPUs that
    support multicast; elsewhere (it says why) the MemPool is of torch's own allocator, registered alike.
Each rank makes tensors of 16 MiB (MSCCLPP_COLL_ALGO=zerocopy: every call tries zero-copy) and runs, three
times over, all_reduce (sum), all_gather_into_tensor, reduce_scatter_tensor (sum) and broadcast from rank
0, each checked exactly (small integers). At destroy_process_group the library logs at INFO how many calls
moved their data zero-copy; every rank's log (MSCCLPP_DEBUG_FILE) must give at least 2 of the 3 rounds'
calls (a first call may come before a peer's registration reached this rank).
Prints PASS/FAIL lines per mode and a SUMMARY; exits non-zero on any FAIL, 0 with SKIP where torch or a GPU
is missing.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUR_LIB = os.path.realpath(os.path.join(HERE, "..", "..", "build", "lib", "nccl", "libnccl.so.2"))
ELEMENTS = 4 << 20  # float32: 16 MiB per tensor
ROUNDS = 3
CALLS_PER_ROUND = 4
COUNT_LINE = re.compile(r"(\d+) call\(s\) moved their data zero-copy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multicast_supported(device: int) -> str:
    """CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED of `device`, as the driver says (for the note)."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int(-1)
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), 132, device) != 0:
            return "unknown"
        return "yes" if value.value else "no"
    except OSError:
        return "unknown"


def worker(rank: int, nranks: int, port: int, mode: str, log_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["MSCCLPP_DEBUG"] = "INFO"
    # Every call tries zero-copy whatever the GPUs' placement (`auto` takes it where it measured faster:
    # src/collective/algorithm.rs, zero_copy_from).
    os.environ["MSCCLPP_COLL_ALGO"] = "zerocopy"
    os.environ["MSCCLPP_DEBUG_FILE"] = os.path.join(log_dir, f"rank{rank}.%p.log")
    if mode == "hook":
        os.environ["TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"] = "1"
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=nranks, device_id=device)
    backend = dist.distributed_c10d._get_default_group()._get_backend(device)
    pool = None

    def tensors():
        x = torch.full((ELEMENTS,), float(rank + 1), device=device)
        mine = torch.full((ELEMENTS,), float(rank), device=device)
        gathered = torch.empty(ELEMENTS * nranks, device=device)
        stacked = torch.arange(ELEMENTS * nranks, device=device, dtype=torch.float32) % 7 + rank
        piece = torch.empty(ELEMENTS, device=device)
        b = torch.full((ELEMENTS,), float(rank * 10 + 3), device=device)
        return x, mine, gathered, stacked, piece, b

    # Every tensor a collective touches is made here, so that it lies in registered memory.
    if mode == "mempool":
        try:
            allocator = backend.mem_allocator
        except RuntimeError as e:
            # torch offers NCCL's allocator (ncclMemAlloc) only on GPUs with multicast support; elsewhere a
            # pool of its own allocator's memory, registered the same way.
            print(f"rank {rank}: torch refused NCCL's allocator ({e}; multicast supported: "
                  f"{multicast_supported(device.index)}); a MemPool of torch's allocator instead", flush=True)
            allocator = None
        pool = torch.cuda.MemPool(allocator) if allocator is not None else torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            x, mine, gathered, stacked, piece, b = tensors()
        backend.register_mem_pool(pool)
    else:
        x, mine, gathered, stacked, piece, b = tensors()
    total = float(sum(r + 1 for r in range(nranks)))
    for _ in range(ROUNDS):
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, mine)
        dist.reduce_scatter_tensor(piece, stacked)
        b.fill_(float(rank * 10 + 3))
        dist.broadcast(b, 0)
        torch.cuda.synchronize()
        assert bool((x == total).all()), f"all_reduce: {x[:4].tolist()} where {total} everywhere"
        want = torch.arange(nranks, device=device, dtype=torch.float32).repeat_interleave(ELEMENTS)
        assert bool((gathered == want).all()), "all_gather_into_tensor: a piece is wrong"
        idx = torch.arange(ELEMENTS, device=device, dtype=torch.float32) + rank * ELEMENTS
        want_piece = (idx % 7) * nranks + sum(range(nranks))
        assert bool((piece == want_piece).all()), "reduce_scatter_tensor: wrong sums"
        assert bool((b == 3.0).all()), f"broadcast: {b[:4].tolist()} where 3.0 from rank 0"
    if pool is not None:
        backend.deregister_mem_pool(pool)
    del x, mine, gathered, stacked, piece, b
    dist.destroy_process_group()


def run_mode(mode: str, nranks: int, mp) -> tuple[bool, str]:
    log_dir = tempfile.mkdtemp(prefix=f"torch-zc-{mode}-")
    t0 = time.monotonic()
    try:
        mp.start_processes(worker, args=(nranks, free_port(), mode, log_dir), nprocs=nranks, join=True,
                           start_method="spawn")
    except Exception as e:  # a rank raised (a wrong result among others) or died
        text = str(e).strip().splitlines()
        return False, f"a rank failed: {text[-1] if text else type(e).__name__}"
    counts = []
    for r in range(nranks):
        found = [int(m.group(1)) for f in glob.glob(os.path.join(log_dir, f"rank{r}.*.log"))
                 for m in COUNT_LINE.finditer(open(f, errors="replace").read())]
        counts.append(sum(found))
    least = (ROUNDS - 1) * CALLS_PER_ROUND
    note = f"zero-copy calls per rank {counts} of {ROUNDS * CALLS_PER_ROUND}, {time.monotonic() - t0:.1f} s"
    if min(counts) < least:
        return False, f"{note}: fewer than {least} (logs in {log_dir})"
    return True, note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--mode", choices=["hook", "mempool", "both"], default="both")
    args = ap.parse_args()
    if "libnccl" not in os.environ.get("LD_PRELOAD", ""):
        if not os.path.exists(OUR_LIB):
            print(f"FAIL torch_zero_copy: {OUR_LIB} is not built (make)")
            return 1
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, LD_PRELOAD=OUR_LIB))
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP torch_zero_copy: torch cannot be imported ({e})")
        return 0
    if not torch.cuda.is_available():
        print("SKIP torch_zero_copy: no CUDA device visible to torch")
        return 0
    failed = passed = 0
    for mode in (["hook", "mempool"] if args.mode == "both" else [args.mode]):
        ok, note = run_mode(mode, args.nranks, mp)
        print(f"{'PASS' if ok else 'FAIL'} torch_zero_copy_{mode}: {note}", flush=True)
        passed += ok
        failed += not ok
    print(f"SUMMARY torch_zero_copy ({args.nranks} ranks): {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
