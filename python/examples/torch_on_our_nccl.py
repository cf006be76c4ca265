"""PyTorch, unchanged, on libmscclpp's NCCL face: torch.distributed's "nccl" backend running on our
build/lib/nccl/libnccl.so.2, loaded ahead of NVIDIA's by LD_PRELOAD (the NCCL functions torch calls then
resolve to ours).

    LD_PRELOAD=$PWD/build/lib/nccl/libnccl.so.2 python python/examples/torch_on_our_nccl.py [--nranks 2] [--kill]
        [--hosts]

(Started without LD_PRELOAD it starts itself again with it, so the line above is what always runs.)

Ranks are spawned by torch.multiprocessing, rank r on cuda:(r % GPUs): on one GPU every rank shares it.
NVIDIA's NCCL refuses two ranks on one GPU ("Duplicate GPU detected") when the communicator is made;
PyTorch's ProcessGroupNCCL leaves that check to NCCL, and our library allows it, so this runs on one GPU too.

Each rank checks, against the same operation on a gloo group (new_group(backend="gloo")) over the same
values (in float64 on the CPU; gloo has no AVG, so its reference of an average is the sum divided by the
number of ranks):
  - the NCCL in use is ours: /proc/self/maps maps build/lib/nccl/libnccl.so.2, the process's NCCL symbols
    resolve to it (dladdr of what the global scope finds, as for libtorch_cuda's calls), and its
    ncclGetVersion says 23203 (2.32.3). torch 2.11's start-up also dlopens NVIDIA's libnccl.so.2 by its
    path, so that one is mapped too; no call reaches it (the note of the PASS line names it);
  - all_reduce (sum, avg, max, min; and sum on bfloat16, float16, int32, int64), all_gather_into_tensor,
    all_gather, reduce_scatter_tensor (sum, max), broadcast from rank 0 and the last rank, barrier;
  - reduce (sum to rank 0, max to the last rank: the root's result, the others' tensors left as they
    were), all_to_all_single with even splits (NCCL's ncclAlltoAll or a group of sends and receives, as
    torch picks) and uneven ones (a group of ncclSend/ncclRecv), send/recv both ways between pairs,
    isend/irecv around a ring, batch_isend_irecv both ways around a ring in one batch, gather and scatter
    from rank 0 and the last rank;
  - ReduceOp.PREMUL_SUM (torch.distributed._make_nccl_premul_sum, as FSDP uses it: ncclRedOpCreatePreMulSum
    with the factor a float, ncclScalarHostImmediate, or a one-element tensor on the GPU, ncclScalarDevice)
    in all_reduce and reduce_scatter_tensor on float32, bfloat16 and float16: gloo's reference is the sum of
    each rank's input times the factor (small integers times 3 or 0.25: exact);
  - new_group: the even ranks and the odd ranks, each an NCCL group of its own (made when first used, from a
    unique id torch hands over its store): all_reduce, all_gather_into_tensor and broadcast on it;
  - an all_reduce captured in a CUDA graph (torch.cuda.graph, after a warm-up on a side stream) and replayed
    three times, each replay's input copied in first;
  - a DDP training (nn.Linear stack, 3 SGD steps, the same seed on every rank, each rank its own batches):
    its final parameters against those of a copy of the model trained on the same GPU and batches whose
    gradients are reduced by gloo instead (each times 1/world as DDP scales them, summed by gloo's
    all_reduce on CPU copies). The local gradients are the same bits (same GPU, kernels and inputs;
    CUBLAS_WORKSPACE_CONFIG set for cuBLAS's determinism), so at 2 ranks (one sum of two float32 values,
    the same bits in any order) the parameters must be equal; above 2 ranks NCCL's and gloo's sums of the
    gradients may be associated differently, each then an ulp apart, so they must agree within rtol 1e-5,
    atol 1e-6 (the note gives the largest difference);
  - destroy_process_group returns;
  - then init_process_group again with device_id= (eager: the communicator made at once, and torch makes a
    new_group's communicator by ncclCommSplit of the default one, NCCL_SPLIT_NOCOLOR on the ranks outside
    it): an all_reduce on the world, the even and odd subgroups as above (the note gives torch's
    comm_split_count where it has one), destroy_process_group.
--kill: a job of its own: every rank makes the group (TORCH_NCCL_ASYNC_ERROR_HANDLING=1: torch's watchdog
aborts the communicator and tears the process down when ncclCommGetAsyncError reports an error), checks a
few all_reduces, meets the others at a gloo barrier; then the last rank SIGKILLs itself while the others
loop on all_reduces. Each survivor must end within 60 s of the kill, having raised from a collective an
error that speaks of NCCL, a remote failure or an abort (it reports the error and ends), or torn down by
torch's watchdog (a non-zero exit status); the victim must end by SIGKILL, and the parent reaps every
process.
--hosts: every rank on a virtual host of its own (a UTS namespace with the host name vhost-<rank>, which
needs root; SKIP otherwise), so that the library takes the ranks for separate machines: its communicators
stay ours and every collective goes through NVIDIA's NCCL, which it finds beside torch without a setting.
Gloo's and NVIDIA's sockets stay on the loopback (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
Prints one line per case (PASS name / FAIL name: why / SKIP name: why) and exits non-zero on any FAIL.
The values are small integers, so every order of summation gives the same bits. Where ranks exchange
pieces, gloo's reference is an all_gather (or broadcast) of every rank's input, from which each rank
takes what it should have got.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
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

HOSTS_ENV = "TORCH_ON_OUR_NCCL_HOSTS"  # set by --hosts, read by the spawned ranks


def own_host(rank: int) -> None:
    """With --hosts: this process on a virtual host of its own, before anything reads the host name."""
    if os.environ.get(HOSTS_ENV) != "1":
        return
    os.unshare(os.CLONE_NEWUTS)
    socket.sethostname(f"vhost-{rank}")


def worker(rank: int, nranks: int, port: int, port2: int, queue) -> None:
    own_host(rank)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # cuBLAS's results are the same bits from run to run with a fixed workspace (the DDP case compares two
    # models trained by the same kernels); read when cuBLAS is first used.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

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
        if rc != 0 or v.value != 23203:
            raise AssertionError(f"ncclGetVersion returned {rc}, version {v.value}; expected 0 and 23203")
        others = [p for p in libs if os.path.realpath(p) != OUR_LIB]
        # torch.cuda.nccl.version() is the version torch was compiled against (a constant): a note only.
        return (f"NCCL symbols resolve to {OUR_LIB}, ncclGetVersion 23203; torch.cuda.nccl.version() = "
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

    def premul_sum(dtype, on_device, salt, scatter=False):
        # The factor a float (torch: ncclScalarHostImmediate) or a one-element tensor of the same type on the
        # GPU (ncclScalarDevice); the inputs small integers, so that every product and sum is exact.
        def body():
            make = getattr(dist, "_make_nccl_premul_sum", None)
            if make is None:
                return ("SKIP", "torch.distributed._make_nccl_premul_sum is missing in this torch")
            f = 0.25 if on_device else 3.0
            # PyTorch hands NCCL the factor of a bfloat16 reduction as a float32 (its unpackPreMulSum<float,
            # ncclBfloat16>; a tensor factor must be float32 then), while NCCL's API, NVIDIA's library and ours
            # read a scalar of the reduction's type: a bfloat16, the float's first two bytes (its low half).
            # What the collective multiplies by is then that bfloat16, on NVIDIA's NCCL as on ours.
            fdtype = torch.float32 if dtype == torch.bfloat16 else dtype
            factor = torch.tensor([f], dtype=fdtype, device=device) if on_device else f
            applied = f
            if dtype == torch.bfloat16:
                low = torch.tensor([f], dtype=torch.float32).view(torch.int32).item() & 0xFFFF
                applied = torch.tensor([low << 16], dtype=torch.int32).view(torch.float32).item()
            x = values(salt, nranks * N if scatter else N, dtype)
            want = gloo_all_reduce(x.double() * applied, R.SUM)
            t = x.to(device)
            if scatter:
                out = torch.full((N,), -1000.0, dtype=dtype, device=device)
                dist.reduce_scatter_tensor(out, t, op=make(factor))
                torch.cuda.synchronize()
                expect_equal(f"reduce_scatter_tensor PREMUL_SUM x {f} {dtype}", out, want[rank * N:(rank + 1) * N])
            else:
                dist.all_reduce(t, op=make(factor))
                torch.cuda.synchronize()
                expect_equal(f"all_reduce PREMUL_SUM x {f} {dtype}", t, want)
            read = f" (read as the bfloat16 {applied}, as NCCL reads it)" if applied != f else ""
            return f"factor {f}{read}, " + ("a tensor on the GPU (ncclScalarDevice)" if on_device
                                            else "a float (ncclScalarHostImmediate)")
        return body

    def even_odd_groups():
        """new_group of the even ranks, then of the odd ones (every rank makes both, in this order); this
        rank's members and group."""
        evens, odds = list(range(0, nranks, 2)), list(range(1, nranks, 2))
        g_even = dist.new_group(ranks=evens)
        g_odd = dist.new_group(ranks=odds)
        return (evens, g_even) if rank % 2 == 0 else (odds, g_odd)

    def on_subgroup(members, group, salt):
        """all_reduce, all_gather_into_tensor and broadcast (from the group's last member) on `group`."""
        x = values(salt, N)
        parts = gloo_inputs(x)
        t = x.to(device)
        dist.all_reduce(t, group=group)
        torch.cuda.synchronize()
        expect_equal(f"all_reduce on the group of ranks {members}", t, sum(parts[m] for m in members))
        out = torch.full((len(members) * N,), -1000.0, device=device)
        dist.all_gather_into_tensor(out, x.to(device), group=group)
        torch.cuda.synchronize()
        expect_equal(f"all_gather_into_tensor on the group of ranks {members}", out,
                     torch.cat([parts[m] for m in members]))
        src = members[-1]  # a global rank, as torch.distributed takes it
        b = x.to(device)
        dist.broadcast(b, src=src, group=group)
        torch.cuda.synchronize()
        expect_equal(f"broadcast from {src} on the group of ranks {members}", b, parts[src])
        return f"ranks {members}: this rank is {members.index(rank)} of {len(members)} there"

    def subgroups(salt):
        def body():
            members, group = even_odd_groups()
            return on_subgroup(members, group, salt)
        return body

    def graph_all_reduce():
        if not hasattr(torch.cuda, "CUDAGraph"):
            return ("SKIP", "torch.cuda.CUDAGraph is missing in this torch")
        t = torch.zeros(N, device=device)
        # A first all_reduce outside the capture, on a side stream, as torch's documentation of CUDA graphs
        # asks (the communicator exists before the capture).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(t)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(t)
        for k in range(3):
            x = values(60 + k, N)
            want = gloo_all_reduce(x, R.SUM)
            t.copy_(x.to(device))
            graph.replay()
            torch.cuda.synchronize()
            expect_equal(f"replay {k + 1}", t, want)
        return "3 replays checked"

    def ddp_training():
        import copy

        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(1234)  # the same initial model on every rank
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
        ref = copy.deepcopy(model)
        ddp = DDP(model, device_ids=[device.index])
        lr = 0.05
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
            xin = torch.randn(16, 32, generator=g).to(device)
            target = torch.randn(16, 8, generator=g).to(device)
            opt.zero_grad(set_to_none=True)
            ref_opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(ddp(xin), target).backward()  # DDP's all-reduce of the gradients: ours
            nn.functional.mse_loss(ref(xin), target).backward()
            for p in ref.parameters():
                # As DDP: each gradient times 1/world, then summed over the ranks (here by gloo).
                c = p.grad.mul(1.0 / nranks).cpu()
                dist.all_reduce(c, group=gloo)
                p.grad.copy_(c.to(device))
            opt.step()
            ref_opt.step()
        torch.cuda.synchronize()
        worst = 0.0
        for (name, a), b in zip(ddp.module.named_parameters(), ref.parameters()):
            a, b = a.detach().cpu(), b.detach().cpu()
            worst = max(worst, float((a - b).abs().max()))
            if nranks == 2:
                if not torch.equal(a, b):
                    raise AssertionError(f"parameter {name} after 3 steps differs from gloo's training (2 ranks: "
                                         f"must be equal), largest difference {float((a - b).abs().max())}")
            elif not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"parameter {name} after 3 steps differs from gloo's training beyond rtol 1e-5, "
                                     f"atol 1e-6: largest difference {float((a - b).abs().max())}")
        return (f"3 steps; parameters {'equal' if worst == 0 else f'within {worst:.3g}'} of the training whose "
                f"gradients gloo reduced")

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
    for dtype, salt in ((torch.float32, 42), (torch.bfloat16, 43), (torch.float16, 44)):
        name = str(dtype).split(".")[-1]
        case(f"all_reduce_premul_sum_float_factor_{name}", premul_sum(dtype, False, salt))
        case(f"all_reduce_premul_sum_tensor_factor_{name}", premul_sum(dtype, True, salt + 10))
    case("reduce_scatter_tensor_premul_sum_float_factor", premul_sum(torch.float32, False, 45, scatter=True))
    case("reduce_scatter_tensor_premul_sum_tensor_factor_bfloat16", premul_sum(torch.bfloat16, True, 46, scatter=True))
    case("new_group_even_and_odd_ranks", subgroups(47))
    case("all_reduce_in_cuda_graph_replayed", graph_all_reduce)
    case("ddp_training_3_steps_against_gloo", ddp_training)

    def destroy():
        t0 = time.monotonic()
        dist.destroy_process_group()
        return f"{time.monotonic() - t0:.2f} s"
    case("destroy_process_group", destroy)

    # Again, eagerly: init_process_group with device_id= makes the communicator at once, and torch then makes
    # a new_group's communicator by ncclCommSplit of the default one.
    eager = {}

    def init_eager():
        nonlocal gloo
        try:
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port2}", rank=rank, world_size=nranks,
                                    timeout=timedelta(seconds=60), device_id=device)
        except TypeError as e:  # a torch without device_id
            return ("SKIP", f"init_process_group takes no device_id here ({e})")
        gloo = dist.new_group(backend="gloo")
        eager["on"] = True
        return f"rank {rank} bound to {device}"

    def split_count():
        try:
            backend = dist.group.WORLD._get_backend(device)
            count = getattr(backend, "comm_split_count", None)
            return count() if callable(count) else None
        except Exception:  # an API this torch does not have: the note says so
            return None

    def eager_subgroups():
        before = split_count()
        note = subgroups(52)()
        after = split_count()
        if after is None:
            return note + "; torch has no comm_split_count here"
        return note + f"; torch's comm_split_count of the default group: {before} before, {after} after"

    def if_eager(body):
        return lambda: body() if eager else ("SKIP", "no eager process group (see init_process_group_nccl_device_id)")

    case("init_process_group_nccl_device_id", init_eager)
    case("all_reduce_sum_float32_eager", if_eager(all_reduce(R.SUM, torch.float32, 50)))
    case("new_group_even_and_odd_ranks_eager", if_eager(eager_subgroups))
    case("destroy_process_group_eager", if_eager(destroy))
    report("__done__", "DONE")


# ---- --kill: one rank SIGKILLs itself ----

KILL_WINDOW = 60.0  # seconds after the kill within which every survivor must have ended


def kill_worker(rank: int, nranks: int, port: int, report_dir: str) -> None:
    own_host(rank)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    victim = nranks - 1

    # Reports go to a file of this rank's (one write each), not to a queue shared by the ranks: a process
    # that torch's watchdog ends while it holds the queue's lock would leave the others' reports stuck.
    fd = os.open(os.path.join(report_dir, f"rank{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def report(name: str, verdict: str, text: str = "") -> None:
        os.write(fd, (json.dumps([name, verdict, text[:600]]) + "\n").encode())

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    try:
        # torch's own timeout far beyond the window: what ends the survivors must be our failure detection.
        dist.init_process_group("nccl", rank=rank, world_size=nranks, timeout=timedelta(seconds=300))
        gloo = dist.new_group(backend="gloo")
        for i in range(3):
            x = torch.full((4099,), float(rank + i), device=device)
            dist.all_reduce(x)
            torch.cuda.synchronize()
            want = float(sum(r + i for r in range(nranks)))
            if not bool((x == want).all()):
                raise AssertionError(f"all_reduce {i}: {x[0].item()} where {want} was due")
        report("ready", "READY", "3 all_reduces checked")
        dist.barrier(group=gloo)  # every rank checked, none in a collective yet
    except Exception as e:  # the job could not start: the parent reports it
        report("ready", "FAIL", f"{type(e).__name__}: {e}")
        return
    if rank == victim:
        time.sleep(1.0)  # the others are waiting in their first all_reduce by now
        report("victim", "KILLING", "")
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # not reached
    t0 = time.monotonic()
    calls = 0
    x = torch.ones(1 << 16, device=device)
    try:
        while time.monotonic() - t0 < 2 * KILL_WINDOW:
            x.fill_(1.0)
            dist.all_reduce(x)
            torch.cuda.synchronize()
            calls += 1
        report("survivor", "FAIL", f"{calls} all_reduces and no error within {2 * KILL_WINDOW:.0f} s")
    except Exception as e:  # the failure, as torch raises it
        report("survivor", "RAISED", f"after {calls} all_reduces, {time.monotonic() - t0:.1f} s: "
                                     f"{type(e).__name__}: {e}")
    # destroy_process_group on the failed group, bounded (a note: torch's watchdog may end the process first).
    returned = threading.Event()

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # noted as not returned normally
            return
        returned.set()

    threading.Thread(target=destroy, daemon=True).start()
    ok = returned.wait(20)
    report("destroy", "NOTE", "destroy_process_group returned" if ok else
           "destroy_process_group did not return normally within 20 s")
    os._exit(0)


def run_kill(args, mp) -> int:
    nranks = args.nranks
    victim = nranks - 1
    # torch's watchdog: on an error of the communicator (ncclCommGetAsyncError), abort it and end the process.
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    # No flight-recorder dump on the error, which could hold the tear-down back.
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
    port = args.port or free_port()
    report_dir = tempfile.mkdtemp(prefix="torch_on_our_nccl_kill.")
    t0 = time.monotonic()
    procs = mp.start_processes(kill_worker, args=(nranks, port, report_dir), nprocs=nranks, join=False,
                               start_method="spawn")
    processes = procs.processes
    ended = {}  # rank -> (time, exit code)
    t_kill = None
    while True:
        now = time.monotonic()
        for r, p in enumerate(processes):
            if r not in ended and not p.is_alive():
                p.join()
                ended[r] = (now, p.exitcode)
        if t_kill is None and victim in ended:
            t_kill = ended[victim][0]
        if len(ended) == nranks:
            break
        if t_kill is not None and now - t_kill > KILL_WINDOW:
            break
        # Before the kill: a rank that ended (it could not start), or no kill within the limit.
        if t_kill is None and (ended or now - t0 > min(args.timeout, 180.0)):
            break
        time.sleep(0.05)
    killed = []
    for r, p in enumerate(processes):
        if r not in ended:
            p.kill()
            p.join(10)
            killed.append(r)
    reports = {}  # (rank, name) -> (verdict, text)
    for r in range(nranks):
        try:
            with open(os.path.join(report_dir, f"rank{r}.txt")) as f:
                for text_line in f:
                    try:
                        name, verdict, text = json.loads(text_line)
                    except ValueError:  # a line cut short by the process's end
                        continue
                    reports[(r, name)] = (verdict, text.replace("\n", " "))
        except OSError:
            pass
    shutil.rmtree(report_dir, ignore_errors=True)

    def exit_text(code) -> str:
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"signal {-code}"
        return f"exit code {code}"

    passed = failed = 0

    def line(ok: bool, name: str, text: str) -> None:
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' if not ok else ' '}{text}")
        passed, failed = passed + ok, failed + (not ok)

    not_ready = [r for r in range(nranks) if reports.get((r, "ready"), ("", ""))[0] != "READY"]
    line(not not_ready, "torch_kill_every_rank_ready",
         f"ranks {not_ready} did not get ready: " + "; ".join(
             f"rank {r}: {reports.get((r, 'ready'), ('', 'no report'))[1] or exit_text(ended.get(r, (0, None))[1])}"
             for r in not_ready) if not_ready else f"{nranks} ranks, 3 all_reduces checked on each")
    if not not_ready:
        code = ended.get(victim, (0, None))[1]
        line(code == -signal.SIGKILL, f"torch_kill_rank_{victim}_sigkilled",
             exit_text(code) if code != -signal.SIGKILL else "ended by SIGKILL")
        for r in range(nranks - 1):
            name = f"torch_kill_survivor_rank_{r}"
            verdict, text = reports.get((r, "survivor"), ("", ""))
            note = reports.get((r, "destroy"), ("", ""))[1]
            if t_kill is None:
                line(False, name, "the victim never ended")
            elif r in killed or r not in ended:
                line(False, name, f"still running {KILL_WINDOW:.0f} s after the kill (killed by the parent); "
                                  f"{verdict.lower() + ': ' + text if verdict else 'no report'}")
            else:
                when, code = ended[r]
                after = when - t_kill
                if verdict == "RAISED":
                    lowered = text.lower()
                    ok = any(w in lowered for w in ("nccl", "remote", "abort"))
                    line(ok, name, f"raised from a collective, ended {after:.1f} s after the kill ({exit_text(code)}): "
                                   f"{text}" + (f"; {note}" if note else "") if ok else
                         f"raised an error that says nothing of NCCL or the failure: {text}")
                elif verdict == "FAIL":
                    line(False, name, text)
                elif code != 0:
                    line(True, name, f"ended by torch's tear-down {after:.1f} s after the kill ({exit_text(code)}), "
                                     "before it raised")
                else:
                    line(False, name, f"ended with exit code 0 {after:.1f} s after the kill without raising")
    line(not killed, "torch_kill_job_ended",
         f"every process ended and was reaped, {time.monotonic() - t0:.1f} s" if not killed else
         f"ranks {killed} were still running and were killed by the parent")
    print(f"SUMMARY torch_on_our_nccl --kill ({nranks} ranks, {time.monotonic() - t0:.1f} s): {passed} passed, "
          f"{failed} failed")
    return 1 if failed else 0


# ---- the parent ----

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds before the ranks are killed")
    ap.add_argument("--kill", action="store_true", help="the last rank SIGKILLs itself (see above)")
    ap.add_argument("--hosts", action="store_true", help="every rank on a virtual host of its own (see above)")
    args = ap.parse_args()
    if args.hosts:
        if os.geteuid() != 0 or not hasattr(os, "unshare"):
            print("SKIP torch_on_our_nccl --hosts: virtual hosts need root and Python 3.12's os.unshare")
            return 0
        os.environ[HOSTS_ENV] = "1"
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if args.nranks < 2:
        print("FAIL torch_on_our_nccl: --nranks must be at least 2")
        return 1

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
    if args.kill:
        return run_kill(args, mp)

    nranks = args.nranks
    port = args.port or free_port()
    port2 = free_port()
    while port2 == port:
        port2 = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    t0 = time.monotonic()
    procs = mp.start_processes(worker, args=(nranks, port, port2, queue), nprocs=nranks, join=False,
                               start_method="spawn")
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
