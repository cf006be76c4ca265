"""PyTorch, unchanged, on libmscclpp's NCCL face: torch.distributed's "nccl" backend running on our
build/lib/nccl/libnccl.so.2, loaded ahead of NVIDIA's by LD_PRELOAD (the NCCL functions torch calls then
resolve to ours).

    LD_PRELOAD=$PWD/build/lib/nccl/libnccl.so.2 python python/examples/torch_on_our_nccl.py [--nranks 2]

(Started without LD_PRELOAD it starts itself again with it, so the line above is what always runs.)

Ranks are spawned by torch.multiprocessing, rank r on cuda:(r % GPUs): on one GPU every rank shares it.
NVIDIA's NCCL refuses two ranks on one GPU ("Duplicate GPU detected") when the communicator is made;
PyTorch's ProcessGroupNCCL leaves that check to NCCL, and our library allows it, so this runs on one GPU too.

Each rank checks, against the same operation on a gloo group (new_group(backend="gloo")) over the same
values (in float64 on the CPU; gloo has no AVG, so its reference of an average is the sum divided by the
number of ranks):
  - the NCCL in use is ours: /proc/self/maps maps build/lib/nccl/libnccl.so.2, the process's NCCL symbols
    resolve to it (dladdr of what the global scope finds, as for libtorch_cuda's calls), and its
    ncclGetVersion says 22809 (2.28.9). torch 2.11's start-up also dlopens NVIDIA's libnccl.so.2 by its
    path, so that one is mapped too; no call reaches it (the note of the PASS line names it);
  - all_reduce (sum, avg, max, min; and sum on bfloat16, float16, int32, int64), all_gather_into_tensor,
    all_gather, reduce_scatter_tensor (sum, max), broadcast from rank 0 and the last rank, barrier;
  - reduce (sum to rank 0, max to the last rank: the root's result, the others' tensors left as they
    were), all_to_all_single with even splits (NCCL's ncclAlltoAll or a group of sends and receives, as
    torch picks) and uneven ones (a group of ncclSend/ncclRecv), send/recv both ways between pairs,
    isend/irecv around a ring, batch_isend_irecv both ways around a ring in one batch, gather and scatter
    from rank 0 and the last rank;
  - destroy_process_group returns.
Prints one line per case (PASS name / FAIL name: why / SKIP name: why) and exits non-zero on any FAIL.
The values are small integers, so every order of summation gives the same bits. Where ranks exchange
pieces, gloo's reference is an all_gather (or broadcast) of every rank's input, from which each rank
takes what it should have got.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
OUR_LIB = os.path.realpath(os.path.join(HERE, "..", "..", "build", "lib", "nccl", "libnccl.so.2"))
N = 4099  # elements per rank: odd, so that no piece is a round size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one rank ----

def worker(rank: int, nranks: int, port: int, queue) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)

    def report(name: str, verdict: str, text: str = "") -> None:
        queue.put((rank, name, verdict, text.replace("\n", " ")[:400]))

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)

    def case(name: str, body) -> None:
        report(name, "START")
        try:
            verdict = body()
            if isinstance(verdict, tuple):
                report(name, *verdict)
            else:
                report(name, "PASS", verdict or "")
        except Exception as e:  # a failed check or a library error: this case fails, the next runs
            tb = traceback.format_exc().strip().splitlines()
            report(name, "FAIL", f"{type(e).__name__}: {e} ({tb[-3].strip() if len(tb) > 2 else ''})")

    dist.init_process_group("nccl", rank=rank, world_size=nranks, timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")

    def values(salt: int, count: int, dtype=torch.float32, lo: int = -8, hi: int = 9):
        g = torch.Generator().manual_seed(1000 * salt + rank)
        return torch.randint(lo, hi, (count,), generator=g).to(dtype)

    def gloo_all_reduce(x, op):
        y = x.double().clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op, group=gloo)
        return y / nranks if op == dist.ReduceOp.AVG else y

    def expect_equal(what: str, got, want) -> None:
        got = got.double().cpu()
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            i = int(bad[0]) if bad.numel() else -1
            raise AssertionError(f"{what}: {bad.numel()} of {want.numel()} elements differ from gloo's, first at {i}: "
                                 f"{got.flatten()[i].item()} vs {want.flatten()[i].item()}")

    def check_ours():
        import ctypes

        class DlInfo(ctypes.Structure):
            _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                        ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

        maps = open("/proc/self/maps").read().splitlines()
        libs = sorted({line.split()[-1] for line in maps if "libnccl" in line.split()[-1]})
        if OUR_LIB not in [os.path.realpath(p) for p in libs]:
            raise AssertionError(f"{OUR_LIB} is not mapped; libnccl files mapped: {libs}")
        # torch's own start-up may dlopen NVIDIA's libnccl.so.2 by its path (mapped, then); what counts is
        # which library the process's NCCL symbols resolve to: the global scope, where LD_PRELOAD comes first
        # (libtorch_cuda's calls resolve the same way).
        scope = ctypes.CDLL(None)
        try:
            dladdr = scope.dladdr
        except AttributeError:  # glibc before 2.34 keeps it in libdl
            dladdr = ctypes.CDLL("libdl.so.2").dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        for sym in ("ncclGetVersion", "ncclCommInitRankConfig", "ncclAllReduce", "ncclCommGetAsyncError"):
            info = DlInfo()
            if not dladdr(ctypes.cast(getattr(scope, sym), ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
                raise AssertionError(f"dladdr knows nothing of {sym}")
            where = os.path.realpath(info.dli_fname.decode())
            if where != OUR_LIB:
                raise AssertionError(f"{sym} resolves to {where}, not to {OUR_LIB}")
        v = ctypes.c_int(0)
        rc = scope.ncclGetVersion(ctypes.byref(v))
        if rc != 0 or v.value != 22809:
            raise AssertionError(f"ncclGetVersion returned {rc}, version {v.value}; expected 0 and 22809")
        others = [p for p in libs if os.path.realpath(p) != OUR_LIB]
        # torch.cuda.nccl.version() is the version torch was compiled against (a constant): a note only.
        return (f"NCCL symbols resolve to {OUR_LIB}, ncclGetVersion 22809; torch.cuda.nccl.version() = "
                f"{torch.cuda.nccl.version()}" + (f"; also mapped, unused: {others}" if others else ""))

    def all_reduce(op, dtype, salt):
        def body():
            x = values(salt, N, dtype)
            want = gloo_all_reduce(x, op)
            t = x.to(device)
            dist.all_reduce(t, op=op)
            torch.cuda.synchronize()
            expect_equal(f"all_reduce {op} {dtype}", t, want)
        return body

    def all_gather_into_tensor():
        x = values(20, N)
        parts = [torch.empty(N, dtype=torch.float64) for _ in range(nranks)]
        dist.all_gather(parts, x.double(), group=gloo)
        out = torch.empty(nranks * N, device=device)
        dist.all_gather_into_tensor(out, x.to(device))
        torch.cuda.synchronize()
        expect_equal("all_gather_into_tensor", out, torch.cat(parts))

    def all_gather_list():
        x = values(21, N, torch.int32)
        parts = [torch.empty(N, dtype=torch.float64) for _ in range(nranks)]
        dist.all_gather(parts, x.double(), group=gloo)
        outs = [torch.empty(N, dtype=torch.int32, device=device) for _ in range(nranks)]
        dist.all_gather(outs, x.to(device))
        torch.cuda.synchronize()
        for k in range(nranks):
            expect_equal(f"all_gather piece {k}", outs[k], parts[k])

    def reduce_scatter_tensor(op, salt):
        def body():
            x = values(salt, nranks * N)
            want = gloo_all_reduce(x, op)[rank * N:(rank + 1) * N]
            out = torch.empty(N, device=device)
            dist.reduce_scatter_tensor(out, x.to(device), op=op)
            torch.cuda.synchronize()
            expect_equal(f"reduce_scatter_tensor {op}", out, want)
        return body

    def broadcast(src, salt):
        def body():
            x = values(salt, N)
            want = x.double().clone()
            dist.broadcast(want, src=src, group=gloo)
            t = x.to(device)
            dist.broadcast(t, src=src)
            torch.cuda.synchronize()
            expect_equal(f"broadcast from {src}", t, want)
        return body

    def barrier():
        t0 = time.monotonic()
        dist.barrier()
        torch.cuda.synchronize()
        return f"{(time.monotonic() - t0) * 1e3:.1f} ms"

    def gloo_inputs(x):
        """Every rank's x (same length on every rank) in float64, by gloo."""
        parts = [torch.empty(x.numel(), dtype=torch.float64) for _ in range(nranks)]
        dist.all_gather(parts, x.double(), group=gloo)
        return parts

    def reduce(op, dst, salt):
        def body():
            x = values(salt, N)
            want = gloo_all_reduce(x, op)
            t = x.to(device)
            dist.reduce(t, dst=dst, op=op)
            torch.cuda.synchronize()
            # A non-root's tensor is its input (ncclReduce in place: recvbuff is not used there).
            expect_equal(f"reduce {op} to {dst}", t, want if rank == dst else x.double())
        return body

    def all_to_all_even():
        x = values(32, nranks * N)
        parts = gloo_inputs(x)
        want = torch.cat([parts[k][rank * N:(rank + 1) * N] for k in range(nranks)])
        out = torch.empty(nranks * N, device=device)
        dist.all_to_all_single(out, x.to(device))
        torch.cuda.synchronize()
        expect_equal("all_to_all_single (even)", out, want)

    def all_to_all_uneven():
        # Rank r sends split(r, p) elements to rank p: every pair its own size, some of them odd.
        def split(r, p):
            return 100 * (1 + (r + 2 * p) % 3) + 7 * r + p

        sizes_in = [split(rank, p) for p in range(nranks)]
        sizes_out = [split(p, rank) for p in range(nranks)]
        longest = max(sum(split(r, p) for p in range(nranks)) for r in range(nranks))
        x = values(33, sum(sizes_in))
        # gloo's all_gather wants equal sizes: every rank's input padded to the longest.
        parts = gloo_inputs(torch.cat([x, torch.zeros(longest - x.numel())]))
        pieces = []
        for p in range(nranks):
            at = sum(split(p, q) for q in range(rank))
            pieces.append(parts[p][at:at + split(p, rank)])
        want = torch.cat(pieces)
        out = torch.full((sum(sizes_out),), -1000.0, device=device)
        dist.all_to_all_single(out, x.to(device), output_split_sizes=sizes_out, input_split_sizes=sizes_in)
        torch.cuda.synchronize()
        expect_equal("all_to_all_single (uneven)", out, want)
        return f"{sum(sizes_in)} elements out, {sum(sizes_out)} in"

    def send_recv():
        # Pairs (0, 1), (2, 3), ...: the even rank sends first, the odd one receives first, then the other way.
        peer = rank ^ 1
        parts = gloo_inputs(values(31, N))
        if peer >= nranks:
            return "no partner for this rank (odd nranks)"
        mine = values(31, N).to(device)
        got = torch.full((N,), -1000.0, device=device)
        if rank % 2 == 0:
            dist.send(mine, dst=peer)
            dist.recv(got, src=peer)
        else:
            dist.recv(got, src=peer)
            dist.send(mine, dst=peer)
        torch.cuda.synchronize()
        expect_equal(f"recv from {peer}", got, parts[peer])
        expect_equal("the sent tensor", mine, parts[rank])

    def isend_irecv_ring():
        nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
        parts = gloo_inputs(values(34, N))
        mine = values(34, N).to(device)
        got = torch.full((N,), -1000.0, device=device)
        works = [dist.isend(mine, dst=nxt), dist.irecv(got, src=prv)]
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        expect_equal(f"irecv from {prv}", got, parts[prv])

    def batch_ring_both_ways():
        # Sends to next and previous, receives from previous and next, in one batch (one NCCL group). With
        # two ranks next and previous are the same rank: the k-th send meets the peer's k-th receive.
        nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
        fwd, bwd = values(35, N), values(36, N + 3)
        parts_fwd, parts_bwd = gloo_inputs(fwd), gloo_inputs(bwd)
        from_prv = torch.full((N,), -1000.0, device=device)
        from_nxt = torch.full((N + 3,), -1000.0, device=device)
        ops = [dist.P2POp(dist.isend, fwd.to(device), nxt), dist.P2POp(dist.irecv, from_prv, prv),
               dist.P2POp(dist.isend, bwd.to(device), prv), dist.P2POp(dist.irecv, from_nxt, nxt)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        torch.cuda.synchronize()
        expect_equal(f"from {prv} (its forward tensor)", from_prv, parts_fwd[prv])
        expect_equal(f"from {nxt} (its backward tensor)", from_nxt, parts_bwd[nxt])

    def gather(dst, salt):
        def body():
            x = values(salt, N)
            parts = gloo_inputs(x)
            outs = [torch.full((N,), -1000.0, device=device) for _ in range(nranks)] if rank == dst else None
            t = x.to(device)
            dist.gather(t, gather_list=outs, dst=dst)
            torch.cuda.synchronize()
            expect_equal("gather's input", t, x.double())
            if rank == dst:
                for k in range(nranks):
                    expect_equal(f"gather piece {k} at {dst}", outs[k], parts[k])
        return body

    def scatter(src, salt):
        def body():
            x = values(salt, nranks * N)  # the source's pieces where this rank is the source
            whole = x.double().clone()
            dist.broadcast(whole, src=src, group=gloo)
            ins = [p.to(device) for p in x.split(N)] if rank == src else None
            out = torch.full((N,), -1000.0, device=device)
            dist.scatter(out, scatter_list=ins, src=src)
            torch.cuda.synchronize()
            expect_equal(f"scatter piece {rank} from {src}", out, whole[rank * N:(rank + 1) * N])
        return body

    R = dist.ReduceOp
    case("init_process_group_nccl", lambda: f"{nranks} ranks, rank {rank} on {device}")
    for op, salt in ((R.SUM, 1), (R.AVG, 2), (R.MAX, 3), (R.MIN, 4)):
        case(f"all_reduce_{str(op).split('.')[-1].lower()}_float32", all_reduce(op, torch.float32, salt))
    for dtype, salt in ((torch.bfloat16, 5), (torch.float16, 6), (torch.int32, 7), (torch.int64, 8)):
        case(f"all_reduce_sum_{str(dtype).split('.')[-1]}", all_reduce(R.SUM, dtype, salt))
    case("loaded_libnccl_is_ours", check_ours)
    case("all_gather_into_tensor", all_gather_into_tensor)
    case("all_gather_list_int32", all_gather_list)
    case("reduce_scatter_tensor_sum", reduce_scatter_tensor(R.SUM, 9))
    case("reduce_scatter_tensor_max", reduce_scatter_tensor(R.MAX, 10))
    case("broadcast_from_rank_0", broadcast(0, 11))
    case(f"broadcast_from_rank_{nranks - 1}", broadcast(nranks - 1, 12))
    case("barrier", barrier)
    last = nranks - 1
    case("reduce_sum_to_rank_0", reduce(R.SUM, 0, 30))
    case(f"reduce_max_to_rank_{last}", reduce(R.MAX, last, 37))
    case("all_to_all_single_even", all_to_all_even)
    case("all_to_all_single_uneven", all_to_all_uneven)
    case("send_recv_pairs_both_ways", send_recv)
    case("isend_irecv_ring", isend_irecv_ring)
    case("batch_isend_irecv_ring_both_ways", batch_ring_both_ways)
    case("gather_to_rank_0", gather(0, 38))
    case(f"gather_to_rank_{last}", gather(last, 39))
    case("scatter_from_rank_0", scatter(0, 40))
    case(f"scatter_from_rank_{last}", scatter(last, 41))

    def destroy():
        t0 = time.monotonic()
        dist.destroy_process_group()
        return f"{time.monotonic() - t0:.2f} s"
    case("destroy_process_group", destroy)
    report("__done__", "DONE")


# ---- the parent ----

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds before the ranks are killed")
    args = ap.parse_args()

    if "libnccl" not in os.environ.get("LD_PRELOAD", ""):
        if not os.path.exists(OUR_LIB):
            print(f"FAIL torch_on_our_nccl: {OUR_LIB} is not built (make)")
            return 1
        env = dict(os.environ, LD_PRELOAD=OUR_LIB)
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP torch_on_our_nccl: torch cannot be imported ({e})")
        return 0
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        print("SKIP torch_on_our_nccl: no CUDA device visible to torch")
        return 0

    nranks = args.nranks
    port = args.port or free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    t0 = time.monotonic()
    procs = mp.start_processes(worker, args=(nranks, port, queue), nprocs=nranks, join=False, start_method="spawn")
    results = []  # (rank, name, verdict, text) in arrival order
    died = ""
    timed_out = False
    while True:
        while not queue.empty():
            results.append(queue.get())
        try:
            if procs.join(timeout=0.5):
                break
        except Exception as e:  # a rank raised outside a case, or died
            died = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            break
        if time.monotonic() - t0 > args.timeout:
            timed_out = True
            break
    for p in procs.processes:
        if p.is_alive():
            p.kill()
    for p in procs.processes:
        p.join(5)
    while not queue.empty():
        results.append(queue.get())

    # One line per case: PASS where every rank passed, SKIP where every rank skipped, FAIL otherwise.
    order, by_case, started = [], {}, {}
    done = set()
    for rank, name, verdict, text in results:
        if name == "__done__":
            done.add(rank)
            continue
        if verdict == "START":
            started.setdefault(rank, name)
            started[rank] = name
            if name not in by_case:
                order.append(name)
                by_case[name] = {}
            continue
        by_case[name][rank] = (verdict, text)
    passed = failed = 0
    for name in order:
        got = by_case[name]
        fails = [f"rank {r}: {t}" for r, (v, t) in sorted(got.items()) if v == "FAIL"]
        missing = [r for r in range(nranks) if r not in got]
        if fails or missing:
            why = "; ".join(fails + [f"rank {r} did not finish it" for r in missing])
            print(f"FAIL {name}: {why}")
            failed += 1
        elif all(v == "SKIP" for v, _ in got.values()):
            print(f"SKIP {name}: {got[0][1]}")
        elif any(v == "SKIP" for v, _ in got.values()):
            print(f"FAIL {name}: some ranks skipped, some passed: {got}")
            failed += 1
        else:
            print(f"PASS {name}{' ' + got[0][1] if got[0][1] else ''}")
            passed += 1
    for r in range(nranks):
        if r not in done:
            where = f" (last case started: {started[r]})" if r in started else ""
            why = "timed out" if timed_out else (died or "ended early")
            print(f"FAIL torch_on_our_nccl_rank{r}_process: {why}{where}")
            failed += 1
    if passed + failed == 0:
        print("FAIL torch_on_our_nccl: no case ran")
        failed += 1
    print(f"SUMMARY torch_on_our_nccl ({nranks} ranks, {time.monotonic() - t0:.1f} s): {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
