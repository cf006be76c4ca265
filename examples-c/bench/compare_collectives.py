#!/usr/bin/env python3
"""Our collectives against NCCL on this machine, in one run, as one table.

    examples-c/bench/compare_collectives.py [--quick] [--log-dir DIR] [--colls LIST] [--sizes LIST] ...

Runs, one after another:
- build/bench/collectives_bench: ours from C (mscclpp.h), CUDA graph and eager;
- examples-c/bench/nccl_collectives.py with torch's own libnccl (NVIDIA's): torch.distributed's calls,
  graph and eager; ours called from torch through the package (eager); PyTorch SymmetricMemory's one-shot
  and two-shot all-reduce, graph and eager;
- the same script again with our build/lib/nccl/libnccl.so.2 preloaded (LD_PRELOAD): torch.distributed's
  calls, unchanged, on our library (lib=ours-nccl);
- with --register, both again on registered buffers: collectives_bench --register (zero-copy: the kernels
  that read the peers' buffers, and the copy engine for large eager all-gathers and broadcasts), and
  torch.distributed on our libnccl with torch's allocator hook (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1:
  every segment registered with ncclCommRegister);
collects their RESULT lines and prints two markdown tables, graph and eager: a row per collective and
size, a column per library and caller (time per call in us / algBW in GB/s), and the time ratios against
NVIDIA's NCCL (below 1: ours is faster). Then the issue's targets, each met or missed. Raw logs go to
--log-dir (default $BENCH_LOG_DIR, else build/bench-logs): collectives_bench.log, nccl_collectives.log,
nccl_collectives_ours.log.

Needs 2 GPUs; with fewer it says it skipped, unless MSCCLPP_TEST_MIN_GPUS=1, which runs both ranks on one
GPU (NCCL then cannot run, and our timings are not comparable to 2-GPU figures; a note says so). Only the
standard library here; the NCCL part needs torch (PYTHON names the interpreter, default this one), and is
skipped with a note where torch does not import. Exits non-zero if a program failed or a check failed.
--table-only prints the table from the logs already in --log-dir.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# (lib, caller) -> column heading, per table (the mode is the table's). A column no row has is left out.
COLUMNS: List[Tuple[Tuple[str, str], str]] = [
    (("mscclpp", "c"), "ours, C"),
    (("mscclpp+reg", "c"), "ours, C, registered"),
    (("mscclpp", "torch"), "ours, torch (package)"),
    (("ours-nccl", "torch"), "torch.distributed on our libnccl"),
    (("ours-nccl+reg", "torch"), "torch.distributed on our libnccl, registered"),
    (("nccl", "torch"), "torch.distributed on NVIDIA NCCL"),
    (("symm-oneshot", "torch"), "SymmMem one-shot"),
    (("symm-twoshot", "torch"), "SymmMem two-shot"),
]
# Each table's ratios: (ours, NVIDIA's), time over time.
RATIOS: List[Tuple[Tuple[str, str], str]] = [
    (("mscclpp", "c"), "ours C / NVIDIA"),
    (("mscclpp+reg", "c"), "ours C registered / NVIDIA"),
    (("mscclpp", "torch"), "ours torch / NVIDIA"),
    (("ours-nccl", "torch"), "our libnccl / NVIDIA"),
    (("ours-nccl+reg", "torch"), "our libnccl registered / NVIDIA"),
]
NVIDIA = ("nccl", "torch")
OURS_GRAPH, OURS_TORCH_EAGER = ("mscclpp", "c", "graph"), ("mscclpp", "torch", "eager")
NCCL_GRAPH, NCCL_EAGER = ("nccl", "torch", "graph"), ("nccl", "torch", "eager")
OURS_NCCL_GRAPH, OURS_NCCL_EAGER = ("ours-nccl", "torch", "graph"), ("ours-nccl", "torch", "eager")
OURS_REG_GRAPH, OURS_REG_EAGER = ("mscclpp+reg", "c", "graph"), ("mscclpp+reg", "c", "eager")
# Where a target asks for bandwidth: the best of ours from C, unregistered and registered, either mode.
OURS_C_ANY = [OURS_GRAPH, ("mscclpp", "c", "eager"), OURS_REG_GRAPH, OURS_REG_EAGER]
SYMM = ("symm-oneshot", "symm-twoshot")
C_DEFAULT_COLLS = "allreduce_bf16,allreduce_f32,allgather_f32,reducescatter_f32,broadcast_f32"
COLL_ORDER = {"allreduce": 0, "allgather": 1, "reducescatter": 2, "broadcast": 3, "reduce": 4, "alltoall": 5}
DTYPE_ORDER = {"f16": 0, "bf16": 1, "f32": 2}

Result = Dict[str, str]
Key = Tuple[str, str, int]  # collective, dtype, bytes


def size_name(b: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def count_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def gpu_names() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown GPUs"
    names = [n.strip() for n in out.splitlines() if n.strip()]
    return ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names)) or "no GPU"


def run_logged(cmd: List[str], log: str, limit: float, env: Dict[str, str]) -> int:
    """Runs cmd with its output in log; kills its whole process group past limit seconds."""
    print(f"== {' '.join(cmd)} (limit {limit:.0f} s, log {log})", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        # A session of its own: on timeout the ranks it started (torch's spawned processes do not die with
        # their parent) go with it.
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            f.write(f"\nFAIL {os.path.basename(cmd[0])}: killed after the {limit:.0f} s limit\n")
            rc = 124
    print(f"-- exit code {rc}, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return rc


def read_log(path: str) -> Tuple[List[Result], List[str]]:
    """The RESULT lines of a log (as key=value dicts) and its INFO/NOTE/SKIP/FAIL lines."""
    results, notes = [], []
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return [], [f"FAIL {path} is missing"]
    for line in lines:
        if line.startswith("RESULT "):
            results.append(dict(w.split("=", 1) for w in line.split()[1:] if "=" in w))
        elif line.startswith(("INFO ", "NOTE", "SKIP ", "FAIL ")):
            notes.append(line)
    return results, notes


def index(results: List[Result]) -> Dict[Key, Dict[Tuple[str, str, str], Result]]:
    table: Dict[Key, Dict[Tuple[str, str, str], Result]] = {}
    for r in results:
        try:
            key = (r["collective"], r["dtype"], int(r["bytes"]))
            # Registered buffers (collectives_bench --register) are a column of their own.
            lib = r["lib"] + ("+reg" if "+registered" in r.get("algo", "") else "")
            col = (lib, r["caller"], r["mode"])
            float(r["us"])
        except (KeyError, ValueError):
            continue
        table.setdefault(key, {})[col] = r
    return table


def fmt_us(us: float) -> str:
    return f"{us:.2f}" if us < 100 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def fmt_gbps(g: float) -> str:
    return f"{g:.2f}" if g < 10 else f"{g:.1f}"


def cell(r: Optional[Result]) -> str:
    if r is None:
        return "—"
    text = f"{fmt_us(float(r['us']))} / {fmt_gbps(float(r['algbw']))}"
    return text if r.get("checked", "1") == "1" else text + " (check FAILED)"


def ratio(ours: Optional[Result], theirs: Optional[Result]) -> Optional[float]:
    if ours is None or theirs is None:
        return None
    return float(ours["us"]) / float(theirs["us"])


def print_table(table: Dict[Key, Dict[Tuple[str, str, str], Result]], mode: str) -> None:
    """One table of the calls made in `mode` (graph or eager)."""
    present = {col for row in table.values() for col in row}
    cols = [(c + (mode,), h) for c, h in COLUMNS if c + (mode,) in present]
    ratios = [(c + (mode,), h) for c, h in RATIOS if c + (mode,) in present and NVIDIA + (mode,) in present]
    if not cols:
        return
    heads = ["collective", "size"] + [f"{h} (µs / GB/s)" for _, h in cols] + [h for _, h in ratios]
    print(f"**{'In a CUDA graph' if mode == 'graph' else 'Eager'}**")
    print()
    print("| " + " | ".join(heads) + " |")
    print("|" + " --- |" * len(heads))
    for key in sorted(table, key=lambda k: (COLL_ORDER.get(k[0], 9), DTYPE_ORDER.get(k[1], 9), k[2])):
        row = table[key]
        if not any(c in row for c, _ in cols):
            continue
        cells = [f"{key[0]} {key[1]}", size_name(key[2])] + [cell(row.get(c)) for c, _ in cols]
        for ours, _ in ratios:
            x = ratio(row.get(ours), row.get(NVIDIA + (mode,)))
            cells.append("—" if x is None else f"{x:.2f}")
        print("| " + " | ".join(cells) + " |")
    print()


def print_targets(table: Dict[Key, Dict[Tuple[str, str, str], Result]]) -> None:
    """The issue's targets, each met, MISSED, or not measured in this run."""

    def rows(coll: str, lo: int = 0, hi: int = 1 << 62):
        return [(k, v) for k, v in sorted(table.items(), key=lambda kv: kv[0][2]) if k[0] == coll and lo <= k[2] <= hi]

    # A check: (met, what was measured, how bad: the larger the worse), one per row measured.
    def verdict(text: str, checks: List[Tuple[bool, str, float]]) -> None:
        if not checks:
            print(f"- {text}: not measured in this run")
            return
        missed = [d for ok, d, _ in checks if not ok]
        detail = "; ".join(missed) if missed else "worst: " + max(checks, key=lambda c: c[2])[1]
        print(f"- {text}: {'MISSED' if missed else 'met'} ({detail})")

    def us_at_most(coll: str, col, lo: int, hi: int, limit: float) -> List[Tuple[bool, str, float]]:
        out = []
        for k, v in rows(coll, lo, hi):
            if col in v:
                us = float(v[col]["us"])
                out.append((us <= limit, f"{k[1]} {size_name(k[2])} {fmt_us(us)} µs", us))
        return out

    def gbps_at_least(coll: str, sizes: List[int], limit: float, cols=(OURS_GRAPH,)) -> List[Tuple[bool, str, float]]:
        """Per row, the best of `cols` (named in the detail when there are several)."""
        out = []
        for k, v in rows(coll):
            found = [(float(v[c]["algbw"]), c) for c in cols if c in v]
            if k[2] in sizes and found:
                g, c = max(found)
                where = f" ({c[0]}, {c[2]})" if len(cols) > 1 else ""
                out.append((g >= limit, f"{k[1]} {size_name(k[2])} {fmt_gbps(g)} GB/s{where}", -g))
        return out

    def vs_nccl(coll: str, ours, theirs, hi: int = 1 << 62, factor: float = 1.0) -> List[Tuple[bool, str, float]]:
        out = []
        for k, v in rows(coll, 0, hi):
            x = ratio(v.get(ours), v.get(theirs))
            if x is not None:
                out.append((x <= factor, f"{k[1]} {size_name(k[2])} ratio {x:.2f}", x))
        return out

    def vs_symm(ours, mode: str) -> List[Tuple[bool, str, float]]:
        """Ours against the faster of SymmetricMemory's two kernels, row by row."""
        out = []
        for k, v in rows("allreduce"):
            best = min((v[(s, "torch", mode)] for s in SYMM if (s, "torch", mode) in v), key=lambda r: float(r["us"]),
                       default=None)
            x = ratio(v.get(ours), best)
            if x is not None:
                out.append((x <= 1.0, f"{k[1]} {size_name(k[2])} ratio {x:.2f} ({best['lib']})", x))
        return out

    print("Targets (from the issue; ratios are ours/NCCL times):")
    verdict("all-reduce in a CUDA graph ≤ 3.5 µs from 1 KiB to 64 KiB",
            us_at_most("allreduce", OURS_GRAPH, 1 << 10, 64 << 10, 3.5))
    verdict("all-reduce in a CUDA graph ≤ 8 µs at 1 MiB", us_at_most("allreduce", OURS_GRAPH, 1 << 20, 1 << 20, 8.0))
    verdict("all-reduce algBW ≥ 370 GB/s at 256 MiB and 1 GiB (graph)",
            gbps_at_least("allreduce", [256 << 20, 1 << 30], 370.0))
    verdict("all-reduce algBW ≥ 370 GB/s at 256 MiB and 1 GiB (ours from C, best of graph, eager, registered)",
            gbps_at_least("allreduce", [256 << 20, 1 << 30], 370.0, OURS_C_ANY))
    verdict("all-reduce eager from torch (the package) ≤ 1/3 of dist.all_reduce on NVIDIA NCCL up to 1 MiB",
            vs_nccl("allreduce", OURS_TORCH_EAGER, NCCL_EAGER, 1 << 20, 1.0 / 3.0))
    verdict("(for reference) dist.all_reduce on our libnccl ≤ 1/3 of it on NVIDIA NCCL up to 1 MiB, eager",
            vs_nccl("allreduce", OURS_NCCL_EAGER, NCCL_EAGER, 1 << 20, 1.0 / 3.0))
    verdict("all-reduce ≤ SymmetricMemory's faster kernel at every size, graph (ours from C)",
            vs_symm(OURS_GRAPH, "graph"))
    verdict("all-reduce ≤ SymmetricMemory's faster kernel at every size, eager (ours from torch)",
            vs_symm(OURS_TORCH_EAGER, "eager"))
    # SymmetricMemory's kernels work on its own registered buffers (symm_mem.empty): ours on registered ones too.
    verdict("all-reduce ≤ SymmetricMemory's faster kernel at every size, graph (ours from C, registered)",
            vs_symm(OURS_REG_GRAPH, "graph"))
    verdict("all-reduce ≤ SymmetricMemory's faster kernel at every size, eager (ours from C, registered)",
            vs_symm(OURS_REG_EAGER, "eager"))
    for coll, name in (("allgather", "all-gather"), ("reducescatter", "reduce-scatter"), ("broadcast", "broadcast"),
                       ("reduce", "reduce"), ("alltoall", "all-to-all"), ("allreduce", "all-reduce")):
        verdict(f"{name} ≥ NCCL at every size, graph, ours from C", vs_nccl(coll, OURS_GRAPH, NCCL_GRAPH))
        verdict(f"{name} ≥ NCCL at every size, graph, ours from C, registered", vs_nccl(coll, OURS_REG_GRAPH, NCCL_GRAPH))
        verdict(f"{name} ≥ NCCL at every size, eager, ours from C, registered", vs_nccl(coll, OURS_REG_EAGER, NCCL_EAGER))
        verdict(f"{name} ≥ NCCL at every size, graph, torch.distributed on ours",
                vs_nccl(coll, OURS_NCCL_GRAPH, NCCL_GRAPH))
        verdict(f"{name} ≥ NCCL at every size, eager, torch.distributed on ours",
                vs_nccl(coll, OURS_NCCL_EAGER, NCCL_EAGER))
        verdict(f"{name} ≥ NCCL at every size, eager, ours from torch (the package)",
                vs_nccl(coll, OURS_TORCH_EAGER, NCCL_EAGER))
    verdict("all-gather ≥ 770 GB/s at 1 GiB (graph)", gbps_at_least("allgather", [1 << 30], 770.0))
    verdict("all-gather ≥ 770 GB/s at 1 GiB (ours from C, best of graph, eager, registered)",
            gbps_at_least("allgather", [1 << 30], 770.0, OURS_C_ANY))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", help="default: $BENCH_LOG_DIR, else build/bench-logs (both from the repository root)")
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1K, 64K, 1M, 16M, 256M; shorter repeats")
    parser.add_argument("--colls", help="e.g. allreduce_f16,allgather_f32 (default: all-reduce bf16 and f32, "
                        "all-gather, reduce-scatter, broadcast, f32; through torch also reduce and all-to-all)")
    parser.add_argument("--sizes", help="comma-separated bytes with K, M, G (default 1K..1G, powers of 4)")
    parser.add_argument("--min-bytes")
    parser.add_argument("--max-bytes")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--iters", type=int, help="calls per timed repeat (default: about --repeat-ms)")
    parser.add_argument("--repeat-ms", type=float)
    parser.add_argument("--ours-modes", help="ours from torch: eager (default) or eager,graph")
    parser.add_argument("--skip-c", action="store_true", help="leave out collectives_bench")
    parser.add_argument("--skip-torch", action="store_true", help="leave out nccl_collectives.py")
    parser.add_argument("--skip-preload", action="store_true",
                        help="leave out torch.distributed on our libnccl.so.2 (LD_PRELOAD)")
    parser.add_argument("--torch-limit", type=int, default=1800, help="seconds for each run of nccl_collectives.py")
    parser.add_argument("--table-only", action="store_true", help="only print the table of the logs in --log-dir")
    parser.add_argument("--register", action="store_true",
                        help="also on registered buffers: collectives_bench --register, and torch.distributed on our "
                             "libnccl with torch's allocator hook")
    args = parser.parse_args()
    # Given: from where this was started; by default: from the repository root, as run_bench.sh has it.
    if args.log_dir:
        log_dir = os.path.abspath(args.log_dir)
    else:
        log_dir = os.path.join(ROOT, os.environ.get("BENCH_LOG_DIR", "build/bench-logs"))
    os.chdir(ROOT)
    log_dir = os.path.relpath(log_dir) if os.path.abspath(log_dir).startswith(ROOT + os.sep) else log_dir
    c_log = os.path.join(log_dir, "collectives_bench.log")
    torch_log = os.path.join(log_dir, "nccl_collectives.log")
    preload_log = os.path.join(log_dir, "nccl_collectives_ours.log")
    c_reg_log = os.path.join(log_dir, "collectives_bench_registered.log")
    preload_reg_log = os.path.join(log_dir, "nccl_collectives_ours_registered.log")
    failures: List[str] = []
    notes: List[str] = []
    ran: List[str] = []  # the logs of this run (a part left out keeps no stale log in the table)
    shared = False

    if args.table_only:
        ran = [p for p in (c_log, c_reg_log, torch_log, preload_log, preload_reg_log) if os.path.exists(p)]
    else:
        n_gpus = count_gpus()
        min_gpus = max(1, int(os.environ.get("MSCCLPP_TEST_MIN_GPUS", "2") or 2))
        if n_gpus < min_gpus:
            print(f"compare_collectives: skipped ({n_gpus} GPUs found by nvidia-smi -L, {min_gpus} needed; "
                  "MSCCLPP_TEST_MIN_GPUS=1 runs the ranks on one GPU)")
            return 0
        shared = n_gpus < args.nranks
        if shared:
            print(f"NOTE: {args.nranks} ranks on {n_gpus} GPU(s): the ranks share GPUs; timings will NOT be comparable "
                  "to one GPU per rank, and NCCL cannot run", file=sys.stderr, flush=True)
        os.makedirs(log_dir, exist_ok=True)
        common: List[str] = []
        for opt in ("sizes", "min_bytes", "max_bytes", "repeats", "iters", "repeat_ms"):
            value = getattr(args, opt)
            if value is not None:
                common += [f"--{opt.replace('_', '-')}", str(value)]
        if args.quick:
            common.append("--quick")
        env = dict(os.environ)
        if not args.skip_c:
            binary = os.path.join(os.environ.get("BENCH_BIN_DIR", "build/bench"), "collectives_bench")
            if not os.access(binary, os.X_OK):
                failures.append(f"FAIL {binary} is missing (not built: run make)")
            else:
                # By default the collectives of nccl_collectives.py's default that mscclpp.h has (it has no
                # reduce and no all-to-all), the same types.
                colls = ["--colls", args.colls or C_DEFAULT_COLLS]
                rc = run_logged([binary, str(args.nranks)] + colls + common, c_log, 1200, env)
                ran.append(c_log)
                if rc != 0:
                    failures.append(f"FAIL collectives_bench: exit code {rc} (log {c_log})")
                if args.register:
                    rc = run_logged([binary, str(args.nranks)] + colls + common + ["--register"], c_reg_log, 1200, env)
                    ran.append(c_reg_log)
                    if rc != 0:
                        failures.append(f"FAIL collectives_bench --register: exit code {rc} (log {c_reg_log})")
        if not args.skip_torch:
            py = os.environ.get("PYTHON", sys.executable)
            try:
                probe = subprocess.run([py, "-c", "import torch"], capture_output=True, text=True, timeout=300)
                why = (probe.stderr.strip().splitlines() or ["?"])[-1] if probe.returncode else ""
            except (OSError, subprocess.SubprocessError) as e:
                why = repr(e)
            if why:
                notes.append(f"SKIP NCCL and ours from torch: {py} cannot import torch ({why})")
            else:
                # The package from this checkout (it loads build/lib/libmscclpp.so.0), as python/run_gpu_tests.sh.
                env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
                    os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
                script = [py, os.path.join("examples-c", "bench", "nccl_collectives.py"), "--nranks", str(args.nranks)]
                common += ["--colls", args.colls] if args.colls else []
                cmd = script + common + (["--ours-modes", args.ours_modes] if args.ours_modes else [])
                cmd += ["--libs", "nccl,mscclpp,symm-oneshot,symm-twoshot", "--timeout", str(args.torch_limit)]
                rc = run_logged(cmd, torch_log, args.torch_limit + 60, env)
                ran.append(torch_log)
                if rc != 0:
                    failures.append(f"FAIL nccl_collectives.py: exit code {rc} (log {torch_log})")
                # torch.distributed, unchanged, on our libnccl.so.2: it comes first by LD_PRELOAD, so every NCCL
                # call torch makes binds to it (its INFO line names the libnccl the process mapped).
                ours_nccl = os.path.abspath(os.environ.get("MSCCLPP_NCCL_LIB", "build/lib/nccl/libnccl.so.2"))
                if args.skip_preload:
                    pass
                elif not os.path.exists(ours_nccl):
                    failures.append(f"FAIL {ours_nccl} is missing (not built: run make)")
                else:
                    pre_env = dict(env)
                    pre_env["LD_PRELOAD"] = ours_nccl + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
                    cmd = script + common + ["--libs", "nccl", "--nccl-label", "ours-nccl",
                                             "--timeout", str(args.torch_limit)]
                    rc = run_logged(cmd, preload_log, args.torch_limit + 60, pre_env)
                    ran.append(preload_log)
                    if rc != 0:
                        failures.append(f"FAIL nccl_collectives.py on our libnccl: exit code {rc} (log {preload_log})")
                    if args.register:
                        reg_env = dict(pre_env, TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK="1")
                        cmd = script + common + ["--libs", "nccl", "--nccl-label", "ours-nccl+reg",
                                                 "--timeout", str(args.torch_limit)]
                        rc = run_logged(cmd, preload_reg_log, args.torch_limit + 60, reg_env)
                        ran.append(preload_reg_log)
                        if rc != 0:
                            failures.append(f"FAIL nccl_collectives.py on our libnccl, registered: exit code {rc} "
                                            f"(log {preload_reg_log})")

    results: List[Result] = []
    for path in ran:
        r, n = read_log(path)
        results += r
        notes += n
    fails = [n for n in notes if n.startswith("FAIL")] + failures
    shared = shared or any(int(r["ranks"]) > int(r["gpus"]) for r in results
                           if r.get("ranks", "").isdigit() and r.get("gpus", "").isdigit())

    print()
    where = "" if args.table_only else f", {gpu_names()}"
    print(f"### Collectives against NCCL ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}{where}, "
          f"{args.nranks} ranks)")
    print()
    loud = ("**NOTE: the ranks share GPUs (fewer GPUs than ranks, as MSCCLPP_TEST_MIN_GPUS=1 allows): these timings "
            "are NOT comparable to figures with one GPU per rank, and NCCL cannot run this way; only the logic is "
            "checked.**")
    if shared:
        print(loud + "\n")
    for n in notes:
        if n.startswith(("INFO", "NOTE", "SKIP")):
            print(f"    {n}")
    print()
    table = index(results)
    if table:
        print("Time per call in µs / algBW in GB/s (all-reduce and broadcast: the buffer; all-gather: the output; "
              "reduce-scatter: the input). Graph: calls captured in a CUDA graph and replayed; eager: one call "
              "after another, from C or from Python; median of the repeats. Ratios: time over NVIDIA's NCCL "
              "(torch.distributed, same mode); below 1 = ours faster.")
        print()
        print_table(table, "graph")
        print_table(table, "eager")
        print_targets(table)
    else:
        print("No results (see the logs).")
    if shared:
        print("\n" + loud)
    if fails:
        print()
        for f in fails:
            print(f)
    print(f"\nlogs: {', '.join(ran)}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
