"""Collectives through torch.distributed's NCCL backend, and ours called from torch, timed the way
collectives_bench times ours from C, so that compare_collectives.py can put them into one table.

    python3 examples-c/bench/nccl_collectives.py [--nranks N] [--colls LIST] [--sizes LIST] [--quick] ...

Processes: --nranks (default 2) started with torch.multiprocessing, rank r on GPU r % GPUs. For each
collective and message size (NCCL-tests' bytes: all-reduce's and broadcast's buffer, all-gather's output,
reduce-scatter's input; sum; broadcast from rank 0):

- lib=nccl: `dist.all_reduce`, `dist.all_gather_into_tensor`, `dist.reduce_scatter_tensor`,
  `dist.broadcast`, `dist.reduce` (to rank 0), `dist.all_to_all_single`, eager (a loop of calls from Python
  between CUDA events) and graph (the same calls captured in a `torch.cuda.graph`, 100 per graph up to
  1 MiB and 10 above, replayed). Whichever libnccl.so.2 the process loaded: with ours preloaded
  (`LD_PRELOAD=build/lib/nccl/libnccl.so.2`), `--nccl-label ours-nccl` names these rows lib=ours-nccl;
- lib=symm-oneshot, symm-twoshot (`--libs`, all-reduce only): PyTorch SymmetricMemory's kernels,
  `torch.ops.symm_mem.one_shot_all_reduce_out` (out of place) and `two_shot_all_reduce_` (in place) on
  `symm_mem.empty` buffers rendezvoused over the world group, eager and graph as above; a type or size
  they refuse is a SKIP line;
- lib=mscclpp caller=torch: `mscclpp.all_reduce`, `all_gather`, `reduce_scatter`, `broadcast` (the
  package's collectives, if it has them: otherwise this says so and leaves those rows out), eager, and with
  `--ours-modes eager,graph` also in a graph.

NCCL's rows come first, then ours (--libs picks). One call of each is checked element by element first
(small non-zero integers, exact in every type), and again after the timed calls (all-reduce and broadcast
are in place, as torch's are: that check is done on a fresh call). Each time is the median of --repeats
timed loops of about --repeat-ms after a warm-up, between host barriers (gloo, nothing on the GPU). A
failed check is a FAIL line; an error ends the run (the ranks could no longer agree on the next call).
Rank 0 prints one line per measurement,

    RESULT lib=nccl caller=torch collective=allreduce dtype=f16 bytes=1024 mode=eager us=38.4 algbw=0.027 ...

NVLink multicast (NVLS) is never used: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are
forced before torch starts. NCCL does not run two ranks on one GPU; with fewer GPUs than ranks only our rows
are measured (their timings then mean nothing, as the NOTE line says).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from bench_ranks import free_port, supervise  # beside this file

# Before torch (and NCCL) start, in the parent and in every spawned process (they import this module
# again): multicast objects must never be created on these machines.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"  # SymmetricMemory likewise
# Kernels load when a context is made, not at their first launch (docs/mscclpp.md, "Lazy module loading"): a rank
# must not sit in a lazy load, which waits for its GPU, while that GPU runs a collective waiting for a peer.
# The caller's setting wins.
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")

COLLS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")
# The package's collectives (lib=mscclpp caller=torch) and SymmetricMemory's (all-reduce only).
OURS_COLLS = ("allreduce", "allgather", "reducescatter", "broadcast")
SYMM_LIBS = ("symm-oneshot", "symm-twoshot")
DTYPES = ("f16", "bf16", "f32")
# bfloat16 rather than float16 for all-reduce: SymmetricMemory's kernels take float32 and bfloat16 only.
DEFAULT_COLLS = "allreduce_bf16,allreduce_f32,allgather_f32,reducescatter_f32,broadcast_f32,reduce_f32,alltoall_f32"
# As collectives_bench: powers of 4 from 1 KiB to 1 GiB.
DEFAULT_SIZES = [1 << s for s in range(10, 31, 2)]
QUICK_SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
CHUNK_ELEMS = 1 << 24  # patterns are made and checked in pieces of this many elements (bounded memory)


def parse_bytes(text: str) -> int:
    t = text.strip()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for suffix in ("iB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix) and t[-len(suffix) - 1].upper() in units:
            t = t[: -len(suffix)]
            break
    mult = 1
    if t and t[-1].upper() in units:
        mult = units[t[-1].upper()]
        t = t[:-1]
    value = int(t) * mult
    if value <= 0:
        raise ValueError(f"size {text} is not positive")
    return value


def parse_colls(text: str) -> List[Tuple[str, str]]:
    specs = []
    for name in filter(None, text.split(",")):
        if name == "allreduce":
            specs += [("allreduce", "f16"), ("allreduce", "f32")]
            continue
        base, _, dtype = name.partition("_")
        dtype = dtype or "f32"
        if base not in COLLS or dtype not in DTYPES:
            raise ValueError(f"unknown collective {name} (allreduce_f16, allgather_f32, ...)")
        specs.append((base, dtype))
    return specs


def calls_per_graph(nbytes: int) -> int:
    # As collectives_bench: enough calls per graph for the replay's own launch to vanish.
    return 100 if nbytes <= (1 << 20) else 10


def calls_per_repeat(nbytes: int, args: argparse.Namespace) -> int:
    # As collectives_bench: a repeat of about repeat_ms, estimated at 5 us + 250 GB/s, at least 10 calls;
    # the same on every rank.
    if args.iters > 0:
        return args.iters
    est_us = 5.0 + nbytes / 250e3
    return max(10, min(20000, int(-(-args.repeat_ms * 1000.0 // est_us))))


def mapped_libnccl() -> List[str]:
    """The libnccl files this process has mapped (which one torch uses: ours when preloaded)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libnccl" in line and "/" in line})
    except OSError:
        return []


def say(line: str) -> None:
    print(line, flush=True)


# ---- data: rank r's element i is (7 i + 5 r + salt) mod 13 + 1, as in collectives_bench ----


def fill_pattern(torch: Any, t: Any, rank: int, salt: int, start: int = 0) -> None:
    """t[k] = value of element start + k of rank's input."""
    n = t.numel()
    for lo in range(0, n, CHUNK_ELEMS):
        hi = min(n, lo + CHUNK_ELEMS)
        idx = torch.arange(start + lo, start + hi, device=t.device, dtype=torch.int64)
        t[lo:hi] = ((idx * 7 + rank * 5 + salt) % 13 + 1).to(t.dtype)


def expected_piece(torch: Any, coll: str, rank: int, nranks: int, chunk: int, salt: int, lo: int, hi: int,
                   device: Any) -> Any:
    """Float32 values that elements [lo, hi) of rank's output must hold."""
    j = torch.arange(lo, hi, device=device, dtype=torch.int64)

    def value(r: Any, i: Any) -> Any:
        return ((i * 7 + r * 5 + salt) % 13 + 1).to(torch.float32)

    if coll == "allreduce":
        return sum(value(r, j) for r in range(nranks))
    if coll == "allgather":
        return value(j // chunk, j % chunk)
    if coll == "reducescatter":
        return sum(value(r, rank * chunk + j) for r in range(nranks))
    if coll == "reduce":
        # To rank 0, in place; another rank's buffer (its input) must be left as it was.
        return sum(value(r, j) for r in range(nranks)) if rank == 0 else value(rank, j)
    if coll == "alltoall":
        # Piece p of the output is piece `rank` of rank p's input.
        return value(j // chunk, rank * chunk + j % chunk)
    return value(0, j)  # broadcast from rank 0


def check_output(torch: Any, out: Any, coll: str, rank: int, nranks: int, chunk: int, salt: int) -> str:
    n = out.numel()
    for lo in range(0, n, CHUNK_ELEMS):
        hi = min(n, lo + CHUNK_ELEMS)
        want = expected_piece(torch, coll, rank, nranks, chunk, salt, lo, hi, out.device)
        got = out[lo:hi].to(torch.float32)
        bad = (got != want).nonzero()
        if bad.numel():
            k = int(bad[0])
            return (f"{int(bad.numel())} wrong elements in [{lo}, {hi}) of {n}, first at {lo + k}: "
                    f"got {float(got[k])}, want {float(want[k])}")
    return ""


# ---- one collective of one library, on tensors made for it ----


class Case:
    """The tensors of one collective at one size, and the call under test (lib: 'nccl', whatever library
    torch.distributed's NCCL backend loaded; 'mscclpp', the package's collectives; 'symm-oneshot' or
    'symm-twoshot', SymmetricMemory's all-reduce kernels)."""

    def __init__(self, torch: Any, dist: Any, ours: Any, comm: Any, lib: str, coll: str, dtype_name: str,
                 nbytes: int, rank: int, nranks: int, salt: int) -> None:
        self.torch, self.coll, self.rank, self.nranks, self.salt = torch, coll, rank, nranks, salt
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
        esize = torch.tensor([], dtype=dtype).element_size()
        dev = torch.device("cuda", torch.cuda.current_device())
        if lib in SYMM_LIBS:
            from torch.distributed import _symmetric_memory as symm_mem

            count = nbytes // esize
            self.chunk, self.bytes = count, count * esize
            # The input lives in symmetric memory, mapped by every peer (rendezvous is collective).
            self.inp = symm_mem.empty(count, dtype=dtype, device=dev)
            group = dist.group.WORLD.group_name
            symm_mem.rendezvous(self.inp, group)
            ops = torch.ops.symm_mem
            if lib == "symm-oneshot":
                self.out = torch.empty(count, dtype=dtype, device=dev)
                inp, out = self.inp, self.out
                self.call = lambda: ops.one_shot_all_reduce_out(inp, "sum", group, out)
            else:
                self.out = self.inp  # two_shot_all_reduce_ is in place
                inp = self.inp
                self.call = lambda: ops.two_shot_all_reduce_(inp, "sum", group)
            return
        if coll in ("allreduce", "broadcast", "reduce"):
            count = nbytes // esize
            self.chunk = count
            self.inp = torch.empty(count, dtype=dtype, device=dev)
            self.out = self.inp  # in place, as torch's all_reduce, broadcast and reduce are
            self.bytes = count * esize
        elif coll == "alltoall":
            # NCCL-tests' bytes: a rank's whole send buffer, a piece of chunk elements per peer.
            self.chunk = nbytes // (esize * nranks)
            self.inp = torch.empty(self.chunk * nranks, dtype=dtype, device=dev)
            self.out = torch.empty(self.chunk * nranks, dtype=dtype, device=dev)
            self.bytes = self.chunk * nranks * esize
        else:
            self.chunk = nbytes // (esize * nranks)
            big = torch.empty(self.chunk * nranks, dtype=dtype, device=dev)
            small = torch.empty(self.chunk, dtype=dtype, device=dev)
            self.inp, self.out = (small, big) if coll == "allgather" else (big, small)
            self.bytes = self.chunk * nranks * esize
        if self.chunk == 0:
            raise ValueError(f"{nbytes} bytes are too few for {nranks} ranks")
        self.call: Callable[[], Any] = self._nccl_call(dist) if lib == "nccl" else self._ours_call(ours, comm)

    def _nccl_call(self, dist: Any) -> Callable[[], Any]:
        inp, out = self.inp, self.out
        if self.coll == "allreduce":
            return lambda: dist.all_reduce(out)
        if self.coll == "allgather":
            return lambda: dist.all_gather_into_tensor(out, inp)
        if self.coll == "reducescatter":
            return lambda: dist.reduce_scatter_tensor(out, inp)
        if self.coll == "reduce":
            return lambda: dist.reduce(out, dst=0)
        if self.coll == "alltoall":
            return lambda: dist.all_to_all_single(out, inp)
        return lambda: dist.broadcast(out, src=0)

    def _ours_call(self, ours: Any, comm: Any) -> Callable[[], Any]:
        inp, out = self.inp, self.out
        if self.coll == "allreduce":
            return lambda: ours.all_reduce(out, op="sum", comm=comm)
        if self.coll == "allgather":
            return lambda: ours.all_gather(out, inp, comm=comm)
        if self.coll == "reducescatter":
            return lambda: ours.reduce_scatter(out, inp, op="sum", comm=comm)
        return lambda: ours.broadcast(out, 0, comm=comm)

    def prepare(self) -> None:
        """Inputs filled, a separate output zeroed (so that an output left unwritten fails the check)."""
        fill_pattern(self.torch, self.inp, self.rank, self.salt)
        if self.out is not self.inp:
            self.out.zero_()
        self.torch.cuda.synchronize()

    def checked_call(self) -> str:
        self.prepare()
        self.call()
        self.torch.cuda.synchronize()
        return check_output(self.torch, self.out, self.coll, self.rank, self.nranks, self.chunk, self.salt)


def timed(torch: Any, barrier: Callable[[], None], body: Callable[[], None], repeats: int) -> List[float]:
    """Milliseconds of body() on the current stream, once per repeat, each after a barrier."""
    times = []
    for _ in range(repeats):
        barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        body()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def time_eager(torch: Any, case: Case, barrier: Callable[[], None], args: argparse.Namespace) -> Tuple[float, int]:
    n = calls_per_repeat(case.bytes, args)
    barrier()
    for _ in range(min(n, 20)):
        case.call()
    torch.cuda.synchronize()

    def loop() -> None:
        for _ in range(n):
            case.call()

    ms = statistics.median(timed(torch, barrier, loop, args.repeats))
    return ms * 1000.0 / n, n


def time_graph(torch: Any, case: Case, barrier: Callable[[], None], args: argparse.Namespace) -> Tuple[float, int]:
    per_graph = calls_per_graph(case.bytes)
    replays = max(1, -(-calls_per_repeat(case.bytes, args) // per_graph))
    # torch asks for a few calls on a side stream before a capture (lazy initialisations happen there).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    barrier()
    with torch.cuda.stream(side):
        for _ in range(3):
            case.call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            case.call()
    torch.cuda.synchronize()
    barrier()
    graph.replay()  # warm-up
    torch.cuda.synchronize()

    def loop() -> None:
        for _ in range(replays):
            graph.replay()

    ms = statistics.median(timed(torch, barrier, loop, args.repeats))
    graph.reset()  # its memory and the captured calls go now, before the next size
    return ms * 1000.0 / (per_graph * replays), per_graph * replays


def load_ours() -> Tuple[Optional[Any], str]:
    """The package's collectives (mscclpp.all_reduce, ... or mscclpp.collectives), or None and why not."""
    try:
        import mscclpp
    except Exception as e:  # any failure: no rows of ours from torch
        return None, f"import mscclpp failed: {e!r}"
    names = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
    has = getattr(mscclpp, "has_collectives", None)
    if has is not None and not has():
        return None, f"the library that mscclpp ({mscclpp.__file__}) loaded has no collectives"
    for holder in (mscclpp, getattr(mscclpp, "collectives", None)):
        if holder is not None and all(hasattr(holder, n) for n in names):
            return holder, f"mscclpp from {os.path.dirname(mscclpp.__file__)}"
    try:
        from mscclpp import collectives
    except Exception as e:
        return None, f"mscclpp ({mscclpp.__file__}) has no all_reduce and no collectives module ({e!r})"
    if all(hasattr(collectives, n) for n in names):
        return collectives, f"mscclpp.collectives from {os.path.dirname(collectives.__file__)}"
    return None, "mscclpp.collectives lacks one of " + ", ".join(names)


def result_line(lib: str, coll: str, dtype: str, nbytes: int, mode: str, us: float, calls: int, nranks: int,
                gpus: int, args: argparse.Namespace, checked: bool) -> str:
    algo = os.environ.get("MSCCLPP_COLL_ALGO", "auto") if lib in ("mscclpp", "ours-nccl") else lib
    return (f"RESULT lib={lib} caller=torch collective={coll} dtype={dtype} bytes={nbytes} mode={mode} "
            f"us={us:.3f} algbw={nbytes / us / 1000.0:.3f} calls={calls} repeats={args.repeats} ranks={nranks} "
            f"gpus={gpus} algo={algo} checked={int(checked)}")


def worker(rank: int, nranks: int, args: argparse.Namespace, dist_port: int, ours_port: int) -> None:
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    gpu = rank % gpus
    torch.cuda.set_device(gpu)
    # NCCL refuses two ranks of one communicator on one GPU ("duplicate GPU").
    nccl_ok = "nccl" in args.libs and nranks <= gpus
    dist.init_process_group("nccl" if nccl_ok else "gloo", init_method=f"tcp://127.0.0.1:{dist_port}", rank=rank,
                            world_size=nranks)
    # Host barriers through gloo, so that they put nothing on the GPU between timed loops.
    cpu_group = dist.new_group(backend="gloo") if nccl_ok else None

    def barrier() -> None:
        dist.barrier(group=cpu_group)

    if rank == 0:
        nccl_version = "-"
        if nccl_ok:
            v = torch.cuda.nccl.version()  # a tuple in recent torch, an int (2.28.9 = 22809) in older ones
            nccl_version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        say(f"INFO nccl_collectives ranks={nranks} gpus={gpus} device=\"{torch.cuda.get_device_name(gpu)}\" "
            f"torch={torch.__version__} nccl={nccl_version} NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')} "
            f"lib={args.nccl_label} libnccl={','.join(mapped_libnccl()) or '-'}")
        if nranks > gpus:
            say(f"NOTE: {nranks} ranks share {gpus} GPU(s): NCCL is not measured (it refuses two ranks on one GPU) "
                "and our timings are NOT comparable to figures with one GPU per rank")
        if "nccl" in args.libs and not nccl_ok:
            say("SKIP lib=nccl: fewer GPUs than ranks")

    ours, why = (None, "not asked for (--libs)")
    comm = None
    if "mscclpp" in args.libs:
        ours, why = load_ours()
        # Every rank must agree before any of them joins (a rank that could not load would leave the others
        # waiting in the bootstrap).
        found = [None] * nranks
        dist.all_gather_object(found, ours is not None, group=cpu_group)
        if ours is not None and not all(found):
            ours, why = None, "not every rank could load mscclpp's collectives"
        if ours is not None:
            import mscclpp

            comm = mscclpp.Communicator(nranks, rank, address=f"127.0.0.1:{ours_port}", device=gpu)
    if rank == 0:
        if ours is None:
            say(f"SKIP lib=mscclpp caller=torch: {why}; the rows of ours from torch are left out")
        else:
            say(f"INFO ours from torch: {why}")

    libs: List[Tuple[str, List[str]]] = []
    if nccl_ok:
        libs.append(("nccl", args.modes))
    if ours is not None:
        libs.append(("mscclpp", args.ours_modes))
    symm_ok = nccl_ok and any(lib in args.libs for lib in SYMM_LIBS)
    if symm_ok:
        try:
            from torch.distributed import _symmetric_memory as symm_mem

            # Needed by the torch versions before 2.8; a no-op (or gone) after.
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:
                enable(dist.group.WORLD.group_name)
        except Exception as e:
            symm_ok = False
            if rank == 0:
                say(f"SKIP lib=symm-*: torch's SymmetricMemory is not usable here ({e!r})")
    if symm_ok:
        libs += [(lib, args.modes) for lib in SYMM_LIBS if lib in args.libs]
    failed = 0
    # NCCL first, for every collective and size, then ours, then SymmetricMemory: a failure in ours (which
    # ends the run, see below) then loses none of NCCL's rows.
    for lib, modes in libs:
        label = args.nccl_label if lib == "nccl" else lib
        for spec_index, (coll, dtype) in enumerate(args.specs):
            if (lib == "mscclpp" and coll not in OURS_COLLS) or (lib in SYMM_LIBS and coll != "allreduce"):
                continue
            for size_index, nbytes in enumerate(args.sizes):
                salt = 1 + spec_index * len(args.sizes) + size_index
                name = f"{label} {coll} {dtype} {nbytes} bytes"
                if lib in SYMM_LIBS:
                    # SymmetricMemory refuses some types and sizes; it says so on every rank alike, before
                    # any rank waits for another, so a refusal is a SKIP row, not the end of the run.
                    try:
                        case = Case(torch, dist, ours, comm, lib, coll, dtype, nbytes, rank, nranks, salt)
                        problem = case.checked_call()
                        refused = ""
                    except Exception as e:
                        refused = repr(e)
                    verdicts = [None] * nranks
                    dist.all_gather_object(verdicts, refused, group=cpu_group)
                    if any(verdicts):
                        if rank == 0:
                            say(f"SKIP {name}: " + next(v for v in verdicts if v)[:300])
                        torch.cuda.synchronize()
                        continue
                try:
                    if lib not in SYMM_LIBS:
                        case = Case(torch, dist, ours, comm, lib, coll, dtype, nbytes, rank, nranks, salt)
                    results: Dict[str, Tuple[float, int]] = {}
                    if lib not in SYMM_LIBS:
                        problem = case.checked_call()
                    problem = problem and "first call: " + problem
                    verdicts = [None] * nranks
                    # Every rank times, or none: a rank alone skipping would leave its peers' calls unmatched.
                    dist.all_gather_object(verdicts, problem, group=cpu_group)
                    if not any(verdicts):
                        for mode in modes:
                            results[mode] = (time_graph if mode == "graph" else time_eager)(torch, case, barrier, args)
                        # All-reduce and broadcast are in place: the timed calls changed their data, so a fresh
                        # call (after them, on the same communicator) is checked.
                        problem = case.checked_call()
                        problem = problem and "after the timed calls: " + problem
                        dist.all_gather_object(verdicts, problem, group=cpu_group)
                    bad = {r: v for r, v in enumerate(verdicts) if v}
                    if rank == 0:
                        for mode, (us, calls) in results.items():
                            say(result_line(label, coll, dtype, case.bytes, mode, us, calls, nranks, gpus, args,
                                            not bad))
                        if bad:
                            say(f"FAIL {name}: " + "; ".join(f"rank {r}: {v}" for r, v in bad.items()))
                    failed += bool(bad)
                    del case
                except Exception as e:
                    # The ranks may now disagree on what comes next: stopping is safer than mismatched calls
                    # (the parent ends the other ranks soon after).
                    say(f"FAIL {name} (rank {rank}): {e!r}")
                    traceback.print_exc()
                    raise SystemExit(1) from e
    torch.cuda.synchronize()
    if comm is not None:
        comm.close()
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()
    if failed:
        raise SystemExit(1)


def run_rank(rank: int, nranks: int, args: argparse.Namespace, dist_port: int, ours_port: int) -> None:
    try:
        worker(rank, nranks, args, dist_port, ours_port)
    except SystemExit as e:
        sys.stdout.flush()
        os._exit(int(e.code or 0))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--colls", default=DEFAULT_COLLS, help=f"default {DEFAULT_COLLS}")
    parser.add_argument("--sizes", default="", help="comma-separated bytes (K, M, G suffixes); default 1K..1G by 4")
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="1G")
    parser.add_argument("--modes", default="graph,eager", help="NCCL's modes")
    parser.add_argument("--ours-modes", default="eager", help="modes of ours from torch (graph,eager)")
    parser.add_argument("--libs", default="nccl,mscclpp", help="nccl (torch.distributed), mscclpp (the package), "
                        "symm-oneshot, symm-twoshot (SymmetricMemory's all-reduce)")
    parser.add_argument("--nccl-label", default="nccl", help="lib= of torch.distributed's rows: ours-nccl when "
                        "our libnccl.so.2 is preloaded (compare_collectives.py does)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=0, help="calls per timed repeat (default: about --repeat-ms)")
    parser.add_argument("--repeat-ms", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="1K, 64K, 1M, 16M, 256M; 5 ms repeats")
    parser.add_argument("--timeout", type=float, default=0, help="seconds for the whole run (default: by sizes)")
    args = parser.parse_args()
    try:
        args.specs = parse_colls(args.colls)
        lo, hi = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
        if args.sizes:
            args.sizes = [parse_bytes(s) for s in args.sizes.split(",") if s]
        else:
            args.sizes = [b for b in (QUICK_SIZES if args.quick else DEFAULT_SIZES) if lo <= b <= hi]
        for opt in ("modes", "ours_modes", "libs"):
            setattr(args, opt, [m for m in getattr(args, opt).split(",") if m])
        if not set(args.modes + args.ours_modes) <= {"graph", "eager"}:
            raise ValueError("modes are graph and eager")
        if not set(args.libs) <= {"nccl", "mscclpp", *SYMM_LIBS}:
            raise ValueError("libs are nccl, mscclpp, " + ", ".join(SYMM_LIBS))
    except ValueError as e:
        parser.error(str(e))
    if args.quick:
        args.repeat_ms = min(args.repeat_ms, 5.0)
    if not args.specs or not args.sizes or args.nranks < 2 or args.repeats < 1:
        parser.error("nothing to measure")

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    dist_port, ours_port = free_port(), free_port()
    while ours_port == dist_port:
        ours_port = free_port()
    procs = [ctx.Process(target=run_rank, args=(r, args.nranks, args, dist_port, ours_port))
             for r in range(args.nranks)]
    for p in procs:
        p.start()
    # Nothing may hang: a rank that fails makes the others stop soon after; a run past its time is killed.
    limit = args.timeout or 180.0 + 20.0 * len(args.specs) * len(args.sizes)
    codes = supervise(procs, limit, "nccl_collectives", say)
    say(f"SUMMARY nccl_collectives: exit codes {codes}")
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
