"""A client's sleep mode on our libnccl.so.2, from PyTorch processes: the calls vLLM's communicator makes around
ncclCommSuspend, through ctypes (as vLLM's pynccl wrapper), on tensors of PyTorch's caching allocator.

    python python/examples/torch_suspend_window.py [--nranks 4] [--cycles 4] [--seed 1] [--library PATH]
        [--no-warmup] [--no-suspend] [--no-window] [--max-ctas N]

Ranks are processes (torch.multiprocessing, spawned), every one on cuda:0 where there is one GPU (rank r on
cuda:(r % GPUs)); rank 0's ncclGetUniqueId reaches the others through a queue. Each rank makes its
communicator and all-reduces one element (vLLM's warm-up), then, `--cycles` times: pauses, suspends
(NCCL_SUSPEND_MEM), pauses, resumes, pauses, takes a 4 MiB float32 tensor from the caching allocator,
registers it with ncclCommWindowRegister (NCCL_WIN_COLL_SYMMETRIC), pauses, fills it with rank + 1 on the
current stream and all-reduces it out of place on that stream into a tensor of the same size, then
deregisters it. The pauses (0 to 50 ms, different on every rank, from `--seed`) put the ranks out of step,
as real processes are. Every element of every result must be n (n + 1) / 2, ncclCommGetAsyncError
ncclSuccess, and every all-reduce must end within 10 s.

Prints one PASS or FAIL line naming what went wrong on each rank, and exits 0 only on PASS. Skipped (a SKIP
line, exit 0) where torch or a GPU is missing.

Four ranks on one H200 under MPS (2026-12-01), before the fix: every all-reduce of some cycle hung on every
rank, in every run, on the all-reduce's copy algorithm (64 blocks each; 48 too), with or without the suspend,
the window and the warm-up; with maxCTAs 33 or 34 every run passed, and the same steps from C
(c-tests/nccl-gpu/nccl_window_suspend_test.cu) passed at 64. The cause: ranks sharing a GPU took shares that
filled it exactly (`algorithm::resident_share` now leaves half of it free). This program is that hang's test.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import sys
import time

NCCL_FLOAT32, NCCL_SUM, NCCL_SUSPEND_MEM, NCCL_WIN_COLL_SYMMETRIC = 7, 0, 1, 1
HANG_S = 10.0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


INT_FIELDS_AFTER_COMM_NAME = ("collnetEnable CTAPolicy shrinkShare nvlsCTAs nChannelsPerNetPeer nvlinkCentricSched "
                              "graphUsageMode numRmaCtx maxP2pPeers graphStreamOrdering launchOrderImplicit numRmaSig "
                              "rmaEagerInit hostCftMode nvlsHostMode").split()


class Config(ctypes.Structure):
    """nccl.h's ncclConfig_t (2.32), for --max-ctas."""

    _fields_ = ([("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint)]
                + [(f, ctypes.c_int) for f in ("blocking", "cgaClusterSize", "minCTAs", "maxCTAs")]
                + [("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int), ("trafficClass", ctypes.c_int),
                   ("commName", ctypes.c_char_p)]
                + [(f, ctypes.c_int) for f in INT_FIELDS_AFTER_COMM_NAME])

    @classmethod
    def with_max_ctas(cls, blocks: int) -> "Config":
        undef = -(1 << 31)
        c = cls(size=ctypes.sizeof(cls), magic=0xCAFEBEEF, version=23200)
        for name, kind in cls._fields_[3:]:
            if kind is ctypes.c_int:
                setattr(c, name, undef)
        c.maxCTAs = blocks
        return c


def rank_main(rank: int, n: int, args: argparse.Namespace, ids, results) -> None:  # type: ignore[no-untyped-def]
    import torch

    torch.cuda.set_device(rank % torch.cuda.device_count())
    lib = ctypes.CDLL(args.library)
    lib.ncclGetLastError.restype = ctypes.c_char_p

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}: {lib.ncclGetLastError(None).decode(errors='replace')}")

    def async_error(comm: ctypes.c_void_p) -> int:
        code = ctypes.c_int(-1)
        check(lib.ncclCommGetAsyncError(comm, ctypes.byref(code)), "ncclCommGetAsyncError")
        return code.value

    rnd = random.Random(args.seed * 1000 + rank)

    def pause() -> None:
        time.sleep(rnd.random() * 0.05)

    failure = ""
    try:
        uid = UniqueId()
        if rank == 0:
            check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
            for _ in range(n - 1):
                ids.put(bytes(uid.internal))
        else:
            ctypes.memmove(ctypes.byref(uid), ids.get(timeout=60), 128)
        comm = ctypes.c_void_p()
        if args.max_ctas:
            config = Config.with_max_ctas(args.max_ctas)
            check(lib.ncclCommInitRankConfig(ctypes.byref(comm), n, uid, rank, ctypes.byref(config)),
                  "ncclCommInitRankConfig")
        else:
            check(lib.ncclCommInitRank(ctypes.byref(comm), n, uid, rank), "ncclCommInitRank")
        stream = torch.cuda.current_stream()
        raw_stream = ctypes.c_void_p(stream.cuda_stream)
        warm = torch.zeros(1, device="cuda")
        if not args.no_warmup:
            check(lib.ncclAllReduce(ctypes.c_void_p(warm.data_ptr()), ctypes.c_void_p(warm.data_ptr()),
                                    ctypes.c_size_t(1), NCCL_FLOAT32, NCCL_SUM, comm, raw_stream),
                  "the warm-up ncclAllReduce")
        torch.cuda.synchronize()
        count = (4 << 20) // 4
        want = n * (n + 1) / 2
        for cycle in range(args.cycles):
            torch.cuda.synchronize()
            pause()
            if not args.no_suspend:
                check(lib.ncclCommSuspend(comm, NCCL_SUSPEND_MEM), "ncclCommSuspend")
                pause()
                check(lib.ncclCommResume(comm), "ncclCommResume")
            pause()
            t = torch.empty(count, dtype=torch.float32, device="cuda")
            win = ctypes.c_void_p()
            if not args.no_window:
                check(lib.ncclCommWindowRegister(comm, ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(count * 4),
                                                 ctypes.byref(win), NCCL_WIN_COLL_SYMMETRIC),
                      "ncclCommWindowRegister")
            pause()
            t.fill_(rank + 1)
            out = torch.empty_like(t)
            check(lib.ncclAllReduce(ctypes.c_void_p(t.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                    ctypes.c_size_t(count), NCCL_FLOAT32, NCCL_SUM, comm, raw_stream), "ncclAllReduce")
            done = torch.cuda.Event()
            done.record(stream)
            start = time.time()
            while not done.query():
                if time.time() - start > HANG_S:
                    raise RuntimeError(f"cycle {cycle}: the all-reduce did not end within {HANG_S:.0f} s "
                                       f"(ncclCommGetAsyncError: {async_error(comm)})")
                time.sleep(0.001)
            wrong = int((out != want).sum().item())
            if wrong:
                raise RuntimeError(f"cycle {cycle}: {wrong} of {count} elements are not {want} "
                                   f"(the first is {out[(out != want).nonzero()[0]].item()})")
            if async_error(comm) != 0:
                raise RuntimeError(f"cycle {cycle}: ncclCommGetAsyncError says {async_error(comm)}")
            if not args.no_window:
                check(lib.ncclCommWindowDeregister(comm, win), "ncclCommWindowDeregister")
            del t, out
        check(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    except Exception as e:  # noqa: BLE001 - every failure is this rank's verdict
        failure = str(e)
    results.put((rank, failure))
    if failure:
        print(f"rank {rank}: {failure}", file=sys.stderr, flush=True)
        # A rank whose all-reduce hangs cannot destroy its communicator; its exit ends its kernels (the
        # library raises the abort word at exit) and tells its peers.
        os._exit(1)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nranks", type=int, default=4)
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-ctas", type=int, default=0, help="ncclConfig_t.maxCTAs (0: the default)")
    p.add_argument("--no-warmup", action="store_true", help="no all-reduce before the first suspend")
    p.add_argument("--no-suspend", action="store_true", help="no suspend and resume in the cycles")
    p.add_argument("--no-window", action="store_true", help="a plain tensor, not a registered window")
    p.add_argument("--library", default=os.path.join(here, "..", "..", "build", "lib", "nccl", "libnccl.so.2"))
    args = p.parse_args()
    args.library = os.path.abspath(args.library)
    name = "torch_suspend_window"
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP {name}: torch cannot be imported ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIP {name}: no CUDA device usable by torch")
        return 0
    if not os.path.exists(args.library):
        print(f"FAIL {name}: {args.library} is missing (run make)")
        return 1
    ctx = mp.get_context("spawn")
    ids, results = ctx.Queue(), ctx.Queue()
    ranks = [ctx.Process(target=rank_main, args=(r, args.nranks, args, ids, results)) for r in range(args.nranks)]
    for proc in ranks:
        proc.start()
    verdicts: dict[int, str] = {}
    deadline = time.time() + 60 + args.cycles * (HANG_S + 5)
    while len(verdicts) < args.nranks and time.time() < deadline:
        try:
            rank, failure = results.get(timeout=1)
            verdicts[rank] = failure
        except Exception:  # noqa: BLE001 - queue.Empty: look again until the deadline
            pass
    for proc in ranks:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    missing = [r for r in range(args.nranks) if r not in verdicts]
    failures = [f"rank {r}: {f}" for r, f in sorted(verdicts.items()) if f] + [f"rank {r}: no verdict" for r in missing]
    what = f"{args.nranks} ranks, {args.cycles} cycles, seed {args.seed}"
    what += "".join(f", {o}" for o in ("no_warmup", "no_suspend", "no_window") if getattr(args, o))
    what += f", maxCTAs {args.max_ctas}" if args.max_ctas else ""
    if failures:
        print(f"FAIL {name}: {what}: " + "; ".join(failures))
        return 1
    print(f"PASS {name}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
