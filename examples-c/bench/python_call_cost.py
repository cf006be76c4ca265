#!/usr/bin/env python3
"""What a collective costs per eager call from Python (torch tensors, cupy arrays) against the same call
from C, in one run, as one table.

    python3 examples-c/bench/python_call_cost.py [--nranks N] [--calls N] [--repeats N] [--bytes B]

From the repository root of a built tree (build/bench/collectives_bench, build/lib). For each of
all-reduce (sum), all-gather, reduce-scatter (sum) and broadcast (root 0), float32, a message of --bytes
(default 1 KiB, counted as NCCL-tests and collectives_bench count it: all-reduce's and broadcast's buffer,
all-gather's output, reduce-scatter's input), out of place, as collectives_bench calls them:

- C: build/bench/collectives_bench --modes eager (BENCH_BIN_DIR names another folder): its ranks call the
  C function --calls times back to back between two CUDA events, median of --repeats; the figure is rank
  0's (the program prints no other; each call waits for its peers' kernels, so over the calls of a repeat
  the ranks' rates agree);
- Python: --nranks processes started here (spawn), rank r on GPU r % GPUs, meeting through a
  mscclpp.UniqueId made here (the bootstrap root runs in this process). Each rank calls mscclpp.all_reduce,
  all_gather, reduce_scatter and broadcast, first on torch tensors and then on cupy arrays, on the
  framework's current stream (the default one; then again on a stream of its own made current, the
  "side stream" columns): a warm-up, then --repeats times: a barrier (host only), then --calls calls back
  to back and one synchronize; the time per call is (host clock after the synchronize - before the first
  call) / calls, the median of the repeats; the table shows the slowest rank's. CUDA events recorded
  around the same loops give the figure the C program's way (printed below the table, for comparison).
  These calls go through the package's C fast path (the extension mscclpp/_fastcall.abi3.so, which make
  builds in place; a GPU machine handed a checkout needs that file too, or `make
  python/mscclpp/_fastcall.abi3.so` there, which needs cc and Python's headers). With the extension
  loaded, the current-stream loops run once more with it turned off (the "ctypes" columns: the Python
  code calling the library through ctypes), and the run checks that every timed call of the fast path
  was made by the extension. The output says whether the extension was loaded; without it, every column
  is the ctypes path and the "ctypes" columns are empty.

Each figure is the median of --rounds rounds (default 3), a round being the C program and then the Python
ranks: the machine's pace drifts over a run, and this way the drift reaches both sides alike. A line per
round follows the table.

When the kernels run faster than the calls are queued (the GPU's queue is not the bottleneck), these are
the host's cost of a call; otherwise a side shows the kernels' pace instead.

Every call type's result is checked once before and once after its timed calls, in each framework
(inputs are small integers, exact in float32); a wrong result is a FAIL line and the exit status is 1, as
is a failed program or rank. torch or cupy missing: its columns say so and the rest runs. Timings with
ranks sharing a GPU need the MPS daemon for the ranks' kernels to run at once (nvidia-cuda-mps-control
-d); the output says whether its control pipe was found.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Kernels load when a context is made, not at their first launch (docs/mscclpp.md, "Lazy module loading"): a rank
# must not sit in a lazy load, which waits for its GPU, while that GPU runs a collective waiting for a peer.
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


def use_package(path: str) -> None:
    """Makes ``import mscclpp`` find the package in ``path`` (by default python/ of this checkout, which
    loads build/lib/libmscclpp.so.0): in this process and, through the argument, in each rank."""
    if path not in sys.path:
        sys.path.insert(0, path)


COLLS = ("allreduce", "allgather", "reducescatter", "broadcast")
CALL_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
              "broadcast": "broadcast"}
FRAMEWORKS = ("torch", "cupy")
ESIZE = 4  # float32


def value(rank: int, i: int, salt: int) -> float:
    """Rank ``rank``'s input element i: 1 to 13, exact in float32, and so are sums over 16 ranks."""
    return float((i * 7 + rank * 5 + salt) % 13 + 1)


def shapes(coll: str, nbytes: int, nranks: int) -> Tuple[int, int, int]:
    """(count argument, input elements, output elements) of a message of nbytes, as collectives_bench."""
    if coll in ("allreduce", "broadcast"):
        n = nbytes // ESIZE
        return n, n, n
    chunk = nbytes // (ESIZE * nranks)
    return (chunk, chunk, chunk * nranks) if coll == "allgather" else (chunk, chunk * nranks, chunk)


def expected(coll: str, rank: int, nranks: int, nbytes: int, salt: int) -> List[float]:
    count, _, out_n = shapes(coll, nbytes, nranks)
    if coll == "allreduce":
        return [sum(value(r, j, salt) for r in range(nranks)) for j in range(out_n)]
    if coll == "allgather":
        return [value(j // count, j % count, salt) for j in range(out_n)]
    if coll == "reducescatter":
        return [sum(value(r, rank * count + j, salt) for r in range(nranks)) for j in range(out_n)]
    return [value(0, j, salt) for j in range(out_n)]


# ---- one rank ----

class Frame:
    """The few operations of torch or cupy the measurement needs."""

    def __init__(self, name: str, gpu: int) -> None:
        self.name = name
        if name == "torch":
            import torch

            self.mod = torch
            torch.cuda.set_device(gpu)
            torch.zeros(1, device="cuda")  # the context exists and is current from here on
        else:
            import cupy

            self.mod = cupy
            cupy.cuda.Device(gpu).use()
            cupy.zeros(1)

    def array(self, values: List[float]) -> Any:
        if self.name == "torch":
            return self.mod.tensor(values, dtype=self.mod.float32, device="cuda")
        return self.mod.asarray(values, dtype=self.mod.float32)

    def sync(self) -> None:
        (self.mod.cuda.current_stream() if self.name == "torch" else self.mod.cuda.get_current_stream()).synchronize()

    def events(self) -> Tuple[Any, Any]:
        if self.name == "torch":
            return self.mod.cuda.Event(enable_timing=True), self.mod.cuda.Event(enable_timing=True)
        return self.mod.cuda.Event(), self.mod.cuda.Event()

    def elapsed_ms(self, start: Any, stop: Any) -> float:
        if self.name == "torch":
            return start.elapsed_time(stop)
        return self.mod.cuda.get_elapsed_time(start, stop)

    def side_stream(self) -> Any:
        """A stream of the rank's own, and the context manager that makes it current."""
        if self.name == "torch":
            s = self.mod.cuda.Stream()
            return self.mod.cuda.stream(s)
        return self.mod.cuda.Stream(non_blocking=True)


def _calls(mscclpp: Any, comm: Any, coll: str, inp: Any, out: Any) -> Callable[[], Any]:
    if coll == "allreduce":
        return lambda: mscclpp.all_reduce(inp, "sum", comm=comm, out=out)
    if coll == "allgather":
        return lambda: mscclpp.all_gather(out, inp, comm=comm)
    if coll == "reducescatter":
        return lambda: mscclpp.reduce_scatter(out, inp, "sum", comm=comm)
    return lambda: mscclpp.broadcast(inp, 0, comm=comm, out=out)


def measure(fw: Frame, mscclpp: Any, comm: Any, args: argparse.Namespace, rank: int, nranks: int,
            stream_kind: str, salt_base: int) -> Tuple[Dict[str, Dict[str, float]], List[str], List[str]]:
    """Every collective on fw's current stream: {coll: {"wall": us, "events": us}}, what was wrong, and
    notes. ``stream_kind`` "ctypes": the current stream with the package's C fast path turned off."""
    results: Dict[str, Dict[str, float]] = {}
    problems: List[str] = []
    notes: List[str] = []
    coll_mod = mscclpp.collectives
    fast = coll_mod._use_fastcall(stream_kind != "ctypes")
    for k, coll in enumerate(COLLS):
        salt = salt_base + k
        count, in_n, out_n = shapes(coll, args.bytes, nranks)
        inp = fw.array([value(rank, i, salt) for i in range(in_n)])
        out = fw.array([0.0] * out_n)
        want = expected(coll, rank, nranks, args.bytes, salt)
        call = _calls(mscclpp, comm, coll, inp, out)
        what = f"{fw.name} {CALL_NAMES[coll]} ({stream_kind} stream)"

        def check(when: str) -> None:
            fw.sync()
            got = out.tolist()
            bad = [j for j in range(out_n) if got[j] != want[j]]
            if bad:
                problems.append(f"{what}, {when}: {len(bad)} of {out_n} elements wrong, first at {bad[0]}: "
                                f"{got[bad[0]]} instead of {want[bad[0]]}")

        call()
        check("first call")
        for _ in range(args.warmup):
            call()
        fw.sync()
        wall, events = [], []
        start, stop = fw.events()
        declined = coll_mod._fastcall.stats()[1] if fast else 0
        for _ in range(args.repeats):
            comm.barrier()
            t0 = time.perf_counter()
            start.record()
            for _ in range(args.calls):
                call()
            stop.record()
            stop.synchronize()
            t1 = time.perf_counter()
            wall.append((t1 - t0) / args.calls * 1e6)
            events.append(fw.elapsed_ms(start, stop) * 1e3 / args.calls)
        if fast and coll_mod._fastcall.stats()[1] != declined:
            notes.append(f"{what}: {coll_mod._fastcall.stats()[1] - declined} timed calls were left to the "
                         "Python path by the C fast path: these figures are not the fast path's")
        check(f"after {args.warmup + args.repeats * args.calls} more calls")
        results[coll] = {"wall": statistics.median(wall), "events": statistics.median(events)}
    coll_mod._use_fastcall(True)
    return results, problems, notes


def rank_main(rank: int, nranks: int, uid: Any, args: argparse.Namespace, out: Any) -> None:
    report: Dict[str, Any] = {"rank": rank, "results": {}, "problems": [], "notes": []}
    try:
        use_package(args.package_dir)
        import mscclpp

        report["fastcall"] = mscclpp.collectives._fastcall_state()
        with_fastcall = mscclpp.collectives._fastcall is not None

        found = []
        for name in FRAMEWORKS:
            try:
                __import__(name)
                found.append(name)
            except ImportError as e:
                report["notes"].append(f"{name}: not measured ({e})")
        if not found:
            raise RuntimeError("neither torch nor cupy imports")
        if "torch" in found:
            import torch

            gpus = torch.cuda.device_count()
        else:
            import cupy

            gpus = cupy.cuda.runtime.getDeviceCount()
        gpu = rank % gpus
        frames = {name: Frame(name, gpu) for name in found}
        report["gpu"], report["gpus"] = gpu, gpus
        if "torch" in found:
            report["device"] = frames["torch"].mod.cuda.get_device_name(gpu)
        with mscclpp.Communicator(nranks, rank, unique_id=uid, device=gpu) as comm:
            # Every rank must make the same calls: they measure the frameworks that every rank has.
            have = comm.all_gather_object(found)
            common = [n for n in FRAMEWORKS if all(n in h for h in have)]
            for f_index, name in enumerate(common):
                fw = frames[name]
                # Every rank has the same package (this checkout), so all make the same calls.
                kinds = ["current", "ctypes"] if with_fastcall else ["current"]
                for kind in kinds + ["side"]:
                    salt = 10 * f_index + {"current": 0, "ctypes": 3, "side": 5}[kind]
                    if kind == "side":
                        with fw.side_stream():
                            res, bad, notes = measure(fw, mscclpp, comm, args, rank, nranks, kind, salt)
                    else:
                        res, bad, notes = measure(fw, mscclpp, comm, args, rank, nranks, kind, salt)
                    report["results"][(name, kind)] = res
                    report["problems"] += bad
                    report["notes"] += notes
            comm.barrier()
        fast = mscclpp.collectives._fastcall
        if fast is not None and hasattr(fast, "shim_state"):
            state, why, reads, streams = fast.shim_state()
            report["notes"].append(f"rank {rank}: torch's C shim " + ("on" if state == 1 else f"off ({why})") +
                                   f": {reads} tensors and {streams} streams read through it")
    except BaseException as e:  # noqa: BLE001 - whatever it was goes to the parent
        report["error"] = f"{e!r}\n{traceback.format_exc()}"
    out.put(report)
    sys.stdout.flush()


def spawn_ranks(target: Callable[..., None], rank_args: Callable[[int, Any], Tuple[Any, ...]], nranks: int,
                timeout: float) -> Tuple[List[Dict[str, Any]], List[Any]]:
    """Runs ``target(*rank_args(rank, queue))`` in ``nranks`` spawned processes, each putting one report (a
    dict with "rank", and "error" if it failed) on the queue; returns the reports that came within
    ``timeout`` seconds and the processes, all ended (examples-c/bench/torch_dist_cost.py uses it too)."""
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=target, args=rank_args(r, results)) for r in range(nranks)]
    for p in procs:
        p.start()
    reports: List[Dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(reports) < nranks and time.monotonic() < deadline:
        try:
            reports.append(results.get(timeout=1.0))
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break
            continue
        # A rank that failed leaves its peers waiting in a collective: they get 30 s, then are ended.
        if "error" in reports[-1]:
            deadline = min(deadline, time.monotonic() + 30)
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    return reports, procs


def run_python(args: argparse.Namespace) -> Tuple[List[Dict[str, Any]], List[str]]:
    import mscclpp

    uid = mscclpp.UniqueId.create()  # the bootstrap root runs here, in this process
    reports, procs = spawn_ranks(rank_main, lambda r, q: (r, args.nranks, uid, args, q), args.nranks, args.timeout)
    failures: List[str] = []
    missing = sorted(set(range(args.nranks)) - {r["rank"] for r in reports})
    if missing:
        failures.append(f"FAIL python ranks {missing}: no report (exit codes {[p.exitcode for p in procs]}; "
                        f"limit {args.timeout:.0f} s)")
    for rep in reports:
        if "error" in rep:
            failures.append(f"FAIL python rank {rep['rank']}: {rep['error']}")
        failures += [f"FAIL rank {rep['rank']}: {p}" for p in rep["problems"]]
    return sorted(reports, key=lambda r: r["rank"]), failures


# ---- the C program ----

def run_c(args: argparse.Namespace) -> Tuple[Dict[str, float], List[str], str]:
    binary = os.path.join(os.environ.get("BENCH_BIN_DIR", os.path.join(ROOT, "build", "bench")), "collectives_bench")
    if not os.access(binary, os.X_OK):
        return {}, [f"FAIL {binary} is missing (not built: run make)"], ""
    colls = ",".join(f"{c}_f32" for c in COLLS)
    cmd = [binary, str(args.nranks), "--modes", "eager", "--colls", colls, "--sizes", str(args.bytes),
           "--iters", str(args.calls), "--repeats", str(args.repeats)]
    print(f"== {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = str(e.stdout or "") + str(e.stderr or ""), 124
    us: Dict[str, float] = {}
    fails = []
    for line in text.splitlines():
        if line.startswith("RESULT "):
            kv = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
            if kv.get("mode") == "eager" and kv.get("dtype") == "f32":
                us[kv["collective"]] = float(kv["us"])
                if kv.get("checked") != "1":
                    fails.append(f"FAIL collectives_bench {kv['collective']}: its check failed")
        elif line.startswith("FAIL"):
            fails.append(f"FAIL collectives_bench: {line}")
    if rc != 0:
        fails.append(f"FAIL collectives_bench: exit code {rc}; its output ends:\n" + "\n".join(text.splitlines()[-15:]))
    return us, fails, " ".join(cmd)


# ---- the table ----

def fmt(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.2f}"


def diff(a: Optional[float], b: Optional[float]) -> str:
    return "—" if a is None or b is None else f"{a - b:+.2f}"


Key = Tuple[str, str, str, str]  # framework, stream ("current", "side", "ctypes"), collective, "wall" or "events"


def slowest_ranks(reports: List[Dict[str, Any]]) -> Dict[Key, float]:
    """Each figure of one round of the Python ranks: the slowest rank's (only where every rank has it)."""
    out: Dict[Key, float] = {}
    if not reports:
        return out
    for (fw, stream), per_coll in reports[0].get("results", {}).items():
        for coll, figures in per_coll.items():
            for what in figures:
                try:
                    out[(fw, stream, coll, what)] = max(r["results"][(fw, stream)][coll][what] for r in reports)
                except KeyError:
                    pass
    return out


def median_of(rounds: List[Dict[Any, float]], key: Any) -> Optional[float]:
    vals = [r[key] for r in rounds if key in r]
    return statistics.median(vals) if vals else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=1024, help="message bytes (default 1024: 256 float32)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=200, help="calls before the timed repeats")
    parser.add_argument("--rounds", type=int, default=3,
                        help="C then Python, this many times; each figure is the median of the rounds")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each program of a round")
    parser.add_argument("--skip-c", action="store_true", help="leave out collectives_bench")
    parser.add_argument("--package-dir", default=os.path.join(ROOT, "python"),
                        help="where the mscclpp package is (default: python/ of this checkout)")
    args = parser.parse_args()
    args.package_dir = os.path.abspath(args.package_dir)
    use_package(args.package_dir)
    if args.nranks < 2 or args.calls < 1 or args.repeats < 1 or args.rounds < 1 or args.bytes < ESIZE * args.nranks:
        parser.error("nothing to measure (2 ranks or more, a call, a repeat, a round, a float32 per rank at least)")
    if args.bytes % (ESIZE * args.nranks):
        parser.error(f"--bytes must be a multiple of {ESIZE * args.nranks} (a float32 per rank)")

    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    if not any(line.startswith("GPU ") for line in listed.splitlines()):
        print("python_call_cost: skipped (no GPU found by nvidia-smi -L)")
        return 0

    failures: List[str] = []
    c_rounds: List[Dict[str, float]] = []
    py_rounds: List[Dict[Key, float]] = []
    c_cmd = "not run (--skip-c)"
    reports: List[Dict[str, Any]] = []
    # The machine's pace drifts over a run (other work, clocks): C and Python take turns, so that drift
    # reaches both alike, and the median of the rounds leaves out a disturbed one.
    for k in range(args.rounds):
        print(f"== round {k + 1} of {args.rounds}", file=sys.stderr, flush=True)
        if not args.skip_c:
            c_us, fails, c_cmd = run_c(args)
            c_rounds.append(c_us)
            failures += fails
        reports, fails = run_python(args)
        py_rounds.append(slowest_ranks(reports))
        failures += fails
        if fails:
            break

    import mscclpp

    gpus = {r.get("gpus") for r in reports if "gpus" in r}
    device = next((r["device"] for r in reports if "device" in r), "unknown GPU")
    mps_pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    mps = "found" if os.path.exists(os.path.join(mps_pipe, "control")) else "NOT found (ranks sharing a GPU then take turns)"
    print()
    print(f"### Per-call cost of eager collectives, Python against C ({args.nranks} ranks, {device}, "
          f"{gpus.pop() if len(gpus) == 1 else '?'} GPU(s) visible; MPS control pipe {mps_pipe}: {mps})")
    print()
    print(f"float32, {args.bytes} bytes per message, out of place, sum, broadcast from rank 0; mscclpp "
          f"{mscclpp.__version__} from {os.path.dirname(mscclpp.__file__)}, library {mscclpp.library_path()}.")
    print(f"C: {c_cmd}: CUDA events around {args.calls} calls back to back, median of {args.repeats}, rank 0.")
    print(f"Python: per rank, {args.warmup} warm-up calls, then {args.repeats} repeats of {args.calls} calls back to "
          "back and one synchronize, host clock from before the first call to after the synchronize, divided by "
          "the calls; median of the repeats, slowest rank. Current stream: the framework's default; side: a "
          "stream of the rank's own made current.")
    print(f"Each figure: the median of {len(py_rounds)} rounds, each round the C program and then the Python ranks.")
    states = sorted({r["fastcall"] for r in reports if "fastcall" in r})
    print("Python's calls: " + ("; ".join(f"{s}" for s in states) if states else "unknown (no rank reported)") +
          ". The torch and cupy columns take that path; the ctypes columns the same loops with the extension turned "
          "off (Python code and ctypes alone; empty without the extension).")
    print()
    heads = ["call", "C µs", "torch µs", "cupy µs", "torch − C", "cupy − C", "torch ctypes µs", "cupy ctypes µs",
             "torch side µs", "cupy side µs"]
    print("| " + " | ".join(heads) + " |")
    print("|" + " --- |" * len(heads))
    for coll in COLLS:
        c = median_of(c_rounds, coll)
        t, cp, tc, cc, ts, cs = (median_of(py_rounds, (fw, st, coll, "wall"))
                                 for st in ("current", "ctypes", "side") for fw in ("torch", "cupy"))
        print(f"| {CALL_NAMES[coll]} | {fmt(c)} | {fmt(t)} | {fmt(cp)} | {diff(t, c)} | {diff(cp, c)} | {fmt(tc)} | "
              f"{fmt(cc)} | {fmt(ts)} | {fmt(cs)} |")
    print()
    ev = []
    for coll in COLLS:
        parts = [f"{fw} {fmt(median_of(py_rounds, (fw, 'current', coll, 'events')))}" for fw in FRAMEWORKS]
        ev.append(f"{CALL_NAMES[coll]}: " + ", ".join(parts))
    print("The same Python loops timed by CUDA events, the C program's way (µs): " + "; ".join(ev))
    for k in range(len(py_rounds)):
        parts = []
        for coll in COLLS:
            c = c_rounds[k].get(coll) if k < len(c_rounds) else None
            parts.append(f"{CALL_NAMES[coll]} C {fmt(c)} torch {fmt(py_rounds[k].get(('torch', 'current', coll, 'wall')))}"
                         f" cupy {fmt(py_rounds[k].get(('cupy', 'current', coll, 'wall')))}")
        print(f"round {k + 1} (µs): " + "; ".join(parts))
    for r in reports:
        for n in r.get("notes", []):
            print(f"NOTE rank {r['rank']}: {n}")
    if failures:
        print()
        for f in failures:
            print(f)
        print("\nRESULT: FAILED")
        return 1
    print("\nRESULT: every result checked and right")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
