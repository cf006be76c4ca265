#!/usr/bin/env python3
"""A DDP training step and tensor-parallel steps on NVIDIA's NCCL and on ours: step times, same results.

    python3 examples-c/bench/train_step.py [--nranks 2] [--ours-lib build/lib/nccl/libnccl.so.2] [--steps 30]
                                           [--warmup 5] [--out-dir build/bench-logs] [--timeout 600]

From the repository root of a built tree. The script runs itself twice (--worker-run LABEL --json PATH), each
run in a process session of its own, killed past --timeout s: `nvidia` (torch's bundled NCCL; a libnccl in
LD_PRELOAD is dropped), then `ours` (LD_PRELOAD=<absolute --ours-lib>). Their output is relayed, each line
prefixed `[nvidia] ` or `[ours] `, and kept in DIR/train_step_<label>.log (DIR: --out-dir).

A run spawns --nranks ranks, rank r on GPU r % GPUs, process group "nccl" (device_id given), NVLS off; all
eager, float32. Workloads, each --warmup steps then --steps timed ones (zero_grad, forward, backward, SGD
lr 1e-3 step; rank 0's host time between two torch.cuda.synchronize()), MSE loss:
- `ddp`: MLP 2048-4096-4096-4096-2048 (GELU between, ~50M parameters, torch.manual_seed(0)) in
  DistributedDataParallel, per rank 32 x 2048 random inputs and targets (seed 1000 + rank);
- `tp_64k`, `tp_4k`: Megatron tensor parallelism, 8 residual blocks: column-parallel Linear 1024 -> 4096/nranks,
  GELU, row-parallel Linear 4096/nranks -> 1024 all-reduced in forward (g); the block input all-reduced in
  backward (f); rank r holds slice r of full weights (seed 1); inputs 16 x 1024 (64 KiB all-reduces) or
  1 x 1024 (4 KiB), the same on every rank (seed 2000).
Rank 0 prints first `INFO train_step lib=L device="..." torch=V nccl=V ncclGetVersion=N ncclAllReduce_in=FILE
mapped=FILES` (nccl= is the version torch was built with), then per workload

    RESULT bench=train_step lib=ours workload=ddp nranks=2 step_ms_median=12.345 p10=12.100 p90=12.900 steps=30

keeps every step's loss (ranks' average), saves its final parameters (flat float64) to
DIR/train_step_<label>_<workload>_params.pt and writes the JSON (NCCL versions, libnccl files mapped, the file
ncclAllReduce resolves to, device, torch, per workload step_ms, median, p10, p90, losses). Replicated
parameters (all of ddp's, tp's row-parallel biases) with other checksums on other ranks are a FAIL. A run ends
with `SUMMARY train_step lib=L: exit codes [...]`.

The parent checks that `ours` mapped --ours-lib and resolved ncclAllReduce to it and that `nvidia` did not
map it, prints a line naming device, torch and each run's ncclAllReduce file, a markdown table (median and
p10..p90 step ms, ours/nvidia, largest loss and final parameter differences, verdict) and per workload

    RESULT bench=train_step workload=ddp nranks=2 nvidia_ms=12.345 ours_ms=12.001 ratio=0.972 \
        loss_max_abs_diff=0 params_max_abs_diff=0 identical=1

(one line). Results agree when rank 0's final parameters are bit-identical or within 1e-5 * max(1, max |p|)
(sums may be ordered otherwise). A disagreement, failed run or failed check is a FAIL line and exit status 1;
else a PASS line. With fewer GPUs than ranks (NVIDIA's NCCL refuses two ranks on one GPU): SKIP, exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from bench_ranks import free_port, supervise  # beside this file

# Before torch (and NCCL) start, here and in every spawned rank (they import this module again): multicast
# objects must never be created on these machines.
os.environ["NCCL_NVLS_ENABLE"] = "0"
# Kernels load when a context is made, not at first launch: a rank must not sit in a lazy load (which waits
# for its GPU) while that GPU runs a collective waiting for a peer. The caller's setting wins.
os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
# cuBLAS gives the same bits run after run with it: the two runs must differ by their NCCL alone.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LABELS = ("nvidia", "ours")
WORKLOADS = ("ddp", "tp_64k", "tp_4k")
TP_TOKENS = {"tp_64k": 16, "tp_4k": 1}  # x 1024 hidden x 4 bytes: 64 KiB and 4 KiB per all-reduce
HIDDEN, FFN, TP_LAYERS = 1024, 4096, 8
BATCH_POOL = 8  # distinct batches, cycled (bounded memory whatever --steps)


def say(line: str) -> None:
    print(line, flush=True)


def percentile(values: List[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# ---- one rank ----


def tp_functions(torch: Any, dist: Any) -> Tuple[Any, Any]:
    """Megatron's f (identity forward, all-reduce of the gradient backward) and g (the reverse)."""

    class CopyToTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x  # autograd makes the output a view of x

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            # Every rank's shard contributed part of the input's gradient. A copy: grad may be shared with
            # the residual branch and must not change under it.
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    class ReduceFromTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            # In place on the row-parallel matmul's output, which its backward does not keep.
            dist.all_reduce(x)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad

    return CopyToTP, ReduceFromTP


def build_ddp(torch: Any, dev: Any, rank: int, args: argparse.Namespace) -> Tuple[Any, Any, List[Any], Any]:
    """(module to call, parameters, replicated parameters, batches)."""
    from torch.nn.parallel import DistributedDataParallel

    nn = torch.nn
    torch.manual_seed(0)  # on the CPU: the same model on every rank
    sizes = [2048, 4096, 4096, 4096, 2048]
    layers: List[Any] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1])] + ([nn.GELU()] if i < len(sizes) - 2 else [])
    model = nn.Sequential(*layers).to(dev)
    ddp = DistributedDataParallel(model, device_ids=[dev.index])
    g = torch.Generator().manual_seed(1000 + rank)
    pool = min(BATCH_POOL, args.warmup + args.steps)
    data = (torch.randn(pool, 32, 2048, generator=g).to(dev), torch.randn(pool, 32, 2048, generator=g).to(dev))
    params = list(model.parameters())
    return ddp, params, params, data


def build_tp(torch: Any, dist: Any, dev: Any, rank: int, nranks: int, tokens: int,
             args: argparse.Namespace) -> Tuple[Any, List[Any], List[Any], Any]:
    nn, F = torch.nn, torch.nn.functional
    copy_to, reduce_from = tp_functions(torch, dist)
    k = FFN // nranks
    mine = slice(rank * k, (rank + 1) * k)
    g = torch.Generator().manual_seed(1)

    def uniform(*shape: int, fan_in: int) -> Any:  # nn.Linear's default init, from our generator
        return (torch.rand(*shape, generator=g) * 2 - 1) / fan_in ** 0.5

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w1, b1 = uniform(FFN, HIDDEN, fan_in=HIDDEN), uniform(FFN, fan_in=HIDDEN)
            w2, b2 = uniform(HIDDEN, FFN, fan_in=FFN), uniform(HIDDEN, fan_in=FFN)
            self.w1 = nn.Parameter(w1[mine].contiguous())  # column-parallel: rows r*k..
            self.b1 = nn.Parameter(b1[mine].contiguous())
            self.w2 = nn.Parameter(w2[:, mine].contiguous())  # row-parallel: columns r*k..
            self.b2 = nn.Parameter(b2)  # replicated: added once, after the all-reduce

        def forward(self, x: Any) -> Any:
            h = F.gelu(F.linear(copy_to.apply(x), self.w1, self.b1))
            return x + reduce_from.apply(F.linear(h, self.w2)) + self.b2

    model = nn.Sequential(*[Block() for _ in range(TP_LAYERS)]).to(dev)
    gd = torch.Generator().manual_seed(2000)  # the same data on every rank
    pool = min(BATCH_POOL, args.warmup + args.steps)
    data = (torch.randn(pool, tokens, HIDDEN, generator=gd).to(dev),
            torch.randn(pool, tokens, HIDDEN, generator=gd).to(dev))
    return model, list(model.parameters()), [b.b2 for b in model], data


def train(torch: Any, dist: Any, model: Any, params: List[Any], data: Any, nranks: int,
          args: argparse.Namespace) -> Tuple[List[float], List[float]]:
    """Step times in ms (timed steps only) and every step's loss, averaged over the ranks."""
    opt = torch.optim.SGD(params, lr=1e-3)
    xs, ys = data
    times: List[float] = []
    losses: List[float] = []
    for i in range(args.warmup + args.steps):
        x, y = xs[i % len(xs)], ys[i % len(ys)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        total = loss.detach().clone()  # outside the timed region
        dist.all_reduce(total)
        losses.append(total.item() / nranks)
    return times, losses


def nccl_identity(torch: Any) -> Dict[str, Any]:
    """Which libnccl files are mapped, and which one the process's NCCL symbols resolve to."""
    import ctypes

    with open("/proc/self/maps") as f:
        mapped = sorted({ln.split()[-1] for ln in f.read().splitlines() if "libnccl" in ln.split()[-1]})

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    # torch 2.11 also dlopens NVIDIA's file by its path (mapped beside a preloaded one): what counts is
    # where the global scope (LD_PRELOAD first, as for libtorch_cuda's calls) finds ncclAllReduce.
    symbol_lib: Optional[str] = None
    get_version: Optional[int] = None
    scope = ctypes.CDLL(None)
    try:
        try:
            dladdr = scope.dladdr
        except AttributeError:  # glibc before 2.34 keeps it in libdl
            dladdr = ctypes.CDLL("libdl.so.2").dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        info = DlInfo()
        if dladdr(ctypes.cast(scope.ncclAllReduce, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            symbol_lib = os.path.realpath(info.dli_fname.decode())
        v = ctypes.c_int(0)
        if scope.ncclGetVersion(ctypes.byref(v)) == 0:
            get_version = v.value
    except (AttributeError, OSError):  # not in the global scope (torch may have opened NCCL locally)
        pass
    if get_version is None and len(mapped) == 1:
        # Opened locally (torch's own libnccl, not preloaded): ask the one mapped file, already loaded.
        try:
            v = ctypes.c_int(0)
            if ctypes.CDLL(mapped[0]).ncclGetVersion(ctypes.byref(v)) == 0:
                get_version = v.value
        except (AttributeError, OSError):
            pass
    v = torch.cuda.nccl.version()  # the version torch was built with: a tuple in recent torch
    return {"nccl_version": ".".join(map(str, v)) if isinstance(v, tuple) else str(v),
            "nccl_get_version": get_version, "mapped_libnccl": mapped, "nccl_symbol_lib": symbol_lib}


def rank_body(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist

    nranks, label = args.nranks, args.worker_run
    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nranks,
                            device_id=dev)
    cpu_group = dist.new_group(backend="gloo")  # checksums and the final barrier: nothing on the GPU
    report: Dict[str, Any] = {"label": label, "nranks": nranks, "gpus": torch.cuda.device_count(),
                              "device": torch.cuda.get_device_name(gpu), "torch": torch.__version__,
                              "workloads": {}}
    if rank == 0:
        report.update(nccl_identity(torch))
        say(f"INFO train_step lib={label} device=\"{report['device']}\" torch={report['torch']} "
            f"nccl={report['nccl_version']} ncclGetVersion={report['nccl_get_version']} "
            f"ncclAllReduce_in={report['nccl_symbol_lib']} mapped={','.join(report['mapped_libnccl'])}")
    failed = False
    for name in WORKLOADS:
        if name == "ddp":
            model, params, replicated, data = build_ddp(torch, dev, rank, args)
        else:
            model, params, replicated, data = build_tp(torch, dist, dev, rank, nranks, TP_TOKENS[name], args)
        times, losses = train(torch, dist, model, params, data, nranks, args)
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).double() for p in replicated])
            checksum = [flat.sum().item(), flat.abs().sum().item()]
        sums: List[Any] = [None] * nranks
        dist.all_gather_object(sums, checksum, group=cpu_group)
        if rank == 0:
            path = os.path.join(args.out_dir, f"train_step_{label}_{name}_params.pt")
            torch.save(torch.cat([p.detach().reshape(-1).double().cpu() for p in params]), path)
            med, p10, p90 = percentile(times, 0.5), percentile(times, 0.1), percentile(times, 0.9)
            report["workloads"][name] = {"step_ms": times, "median": med, "p10": p10, "p90": p90, "losses": losses,
                                         "params_file": path, "replicated_checksums": sums}
            say(f"RESULT bench=train_step lib={label} workload={name} nranks={nranks} step_ms_median={med:.3f} "
                f"p10={p10:.3f} p90={p90:.3f} steps={args.steps}")
            if any(s != sums[0] for s in sums):
                say(f"FAIL train_step lib={label} workload={name}: the replicated parameters differ between "
                    f"ranks (float64 sum, sum of |p| per rank: {sums})")
                failed = True
        del model, params, replicated, data
        dist.barrier()
        torch.cuda.synchronize()
    if rank == 0:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json)
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()
    if failed:
        raise SystemExit(1)


def run_rank(rank: int, args: argparse.Namespace, port: int) -> None:
    # os._exit: no interpreter teardown (CUDA, NCCL, threads) that could hang after the work is done.
    try:
        rank_body(rank, args, port)
    except SystemExit as e:
        sys.stdout.flush()
        os._exit(0 if e.code is None else e.code if isinstance(e.code, int) else 1)
    except BaseException as e:
        traceback.print_exc()
        say(f"FAIL train_step lib={args.worker_run} rank={rank}: {e!r}")
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def worker_run(args: argparse.Namespace) -> int:
    import torch
    import torch.multiprocessing as mp

    gpus = torch.cuda.device_count()
    if gpus < args.nranks:
        why = f"{gpus} GPU(s) for {args.nranks} ranks (NVIDIA's NCCL refuses two ranks on one GPU)"
        say(f"SKIP train_step lib={args.worker_run}: {why}")
        with open(args.json, "w") as f:
            json.dump({"label": args.worker_run, "skip": why}, f)
        return 0
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=run_rank, args=(r, args, port)) for r in range(args.nranks)]
    for p in procs:
        p.start()
    # Nothing may hang: a rank that fails makes the others go 30 s later; all go before the parent's limit.
    limit = max(60.0, args.timeout - 30.0)
    codes = supervise(procs, limit, f"train_step lib={args.worker_run}", say)
    say(f"SUMMARY train_step lib={args.worker_run}: exit codes {codes}")
    return 0 if all(c == 0 for c in codes) else 1


# ---- the parent: both runs, then the comparison ----


def run_child(label: str, cmd: List[str], env: Dict[str, str], log_path: str, limit: float) -> int:
    """Runs cmd in a session of its own, its output relayed with a prefix and logged; killed past limit."""
    say(f"== [{label}] {' '.join(cmd)} (limit {limit:.0f} s, log {log_path})")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True, text=True, encoding="utf-8", errors="replace")

        def relay() -> None:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                text = line.rstrip("\n")
                say(f"[{label}] {text}")

        pump = threading.Thread(target=relay, daemon=True)
        pump.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc, timed_out = 124, True
        # The whole group, also after a normal end: spawned ranks do not die with their parent.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        pump.join(timeout=10)
        if timed_out:
            say(f"FAIL train_step lib={label}: killed after the {limit:.0f} s limit")
            log.write(f"\nFAIL train_step lib={label}: killed after the {limit:.0f} s limit\n")
    return rc


def compare(torch: Any, a_path: str, b_path: str) -> Tuple[float, float, bool]:
    """(max |a - b|, max |a|, bit-identical) of two saved parameter vectors."""
    a = torch.load(a_path, map_location="cpu", weights_only=True)
    b = torch.load(b_path, map_location="cpu", weights_only=True)
    if a.shape != b.shape:
        raise ValueError(f"{a_path} has {tuple(a.shape)} parameters, {b_path} {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0, 0.0, True
    return (a - b).abs().max().item(), a.abs().max().item(), torch.equal(a, b)


def parent(args: argparse.Namespace) -> int:
    ours_lib = os.path.abspath(args.ours_lib)
    if not os.path.isfile(ours_lib):
        say(f"FAIL train_step: {ours_lib} is missing (run make)")
        return 1
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    reports: Dict[str, Dict[str, Any]] = {}
    failed = False
    for label in LABELS:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # Neither run inherits a preloaded libnccl from the caller; ours gets ours, first.
        preload = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
                   if p and "libnccl" not in os.path.basename(p)]
        if label == "ours":
            preload.insert(0, ours_lib)
        if preload:
            env["LD_PRELOAD"] = ":".join(preload)
        else:
            env.pop("LD_PRELOAD", None)
        json_path = os.path.join(out_dir, f"train_step_{label}.json")
        for stale in [json_path] + [os.path.join(out_dir, f"train_step_{label}_{w}_params.pt") for w in WORKLOADS]:
            if os.path.exists(stale):
                os.remove(stale)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-run", label, "--json", json_path,
               "--nranks", str(args.nranks), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--out-dir", out_dir, "--timeout", str(args.timeout)]
        rc = run_child(label, cmd, env, os.path.join(out_dir, f"train_step_{label}.log"), args.timeout)
        try:
            with open(json_path) as f:
                reports[label] = json.load(f)
        except (OSError, ValueError) as e:
            say(f"FAIL train_step lib={label}: exit code {rc}, no JSON report ({e})")
            failed = True
            continue
        if rc != 0:
            say(f"FAIL train_step lib={label}: exit code {rc}")
            failed = True
    skipped = [r["skip"] for r in reports.values() if "skip" in r]
    if skipped and not failed:
        say(f"SKIP train_step: {skipped[0]}")
        return 0
    if failed or len(reports) != len(LABELS):
        return 1

    # The preload took effect in `ours`, and nothing of ours came into `nvidia`.
    real = os.path.realpath(ours_lib)
    for label, rep in reports.items():
        mapped_ours = real in [os.path.realpath(p) for p in rep.get("mapped_libnccl", [])]
        resolves_ours = rep.get("nccl_symbol_lib") == real
        if label == "ours" and not (mapped_ours and resolves_ours):
            say(f"FAIL train_step lib=ours: NCCL is not ours (mapped {rep.get('mapped_libnccl')}, ncclAllReduce "
                f"in {rep.get('nccl_symbol_lib')}, expected {real})")
            failed = True
        if label == "nvidia" and (mapped_ours or resolves_ours):
            say(f"FAIL train_step lib=nvidia: {real} is mapped in the run that should use NVIDIA's NCCL")
            failed = True

    import torch  # only here: the parent itself needs no GPU

    nv, ours = reports["nvidia"], reports["ours"]
    rows: List[str] = []
    lines: List[str] = []  # after the table: RESULT and FAIL lines
    for name in WORKLOADS:
        a, b = nv["workloads"].get(name), ours["workloads"].get(name)
        if a is None or b is None or len(a["losses"]) != len(b["losses"]):
            lines.append(f"FAIL train_step workload={name}: missing from a report, or losses of other steps")
            continue
        ratio = b["median"] / a["median"] if a["median"] > 0 else float("nan")
        loss_diff = max((abs(x - y) for x, y in zip(a["losses"], b["losses"])), default=0.0)
        try:
            diff, scale, identical = compare(torch, a["params_file"], b["params_file"])
        except Exception as e:  # unreadable or not a tensor: no comparison
            lines.append(f"FAIL train_step workload={name}: parameters not comparable: {e}")
            continue
        tol = 1e-5 * max(1.0, scale)
        agree = identical or diff <= tol  # a NaN difference is no agreement
        verdict = "bit-identical" if identical else (f"agree (<= {tol:.1e})" if agree else f"DIFFER (> {tol:.1e})")
        rows.append(f"| {name} | {a['median']:.3f} ({a['p10']:.3f}..{a['p90']:.3f}) | {b['median']:.3f} "
                    f"({b['p10']:.3f}..{b['p90']:.3f}) | {ratio:.3f} | {loss_diff:.3g} | {diff:.3g} | {verdict} |")
        lines.append(f"RESULT bench=train_step workload={name} nranks={args.nranks} nvidia_ms={a['median']:.3f} "
                     f"ours_ms={b['median']:.3f} ratio={ratio:.3f} loss_max_abs_diff={loss_diff:.3g} "
                     f"params_max_abs_diff={diff:.3g} identical={int(identical)}")
        if not agree:
            lines.append(f"FAIL train_step workload={name}: final parameters differ by {diff:.3g} "
                         f"(allowed {tol:.3g}; losses differ by up to {loss_diff:.3g})")
    say(f"\ntrain_step: {args.nranks} ranks on {nv['device']} ({nv['gpus']} GPUs), torch {nv['torch']}; "
        f"nvidia: ncclGetVersion {nv.get('nccl_get_version')} in {nv.get('nccl_symbol_lib')}; ours: "
        f"ncclGetVersion {ours.get('nccl_get_version')} in {ours.get('nccl_symbol_lib')}; "
        f"{args.steps} timed steps after {args.warmup}\n")
    say("| workload | nvidia ms median (p10..p90) | ours ms median (p10..p90) | ours/nvidia "
        "| loss max abs diff | params max abs diff | results |")
    say("|---|---|---|---|---|---|---|")
    for row in rows:
        say(row)
    say("")
    for line in lines:
        say(line)
    failed = failed or any(line.startswith("FAIL") for line in lines)
    if failed:
        return 1
    say(f"PASS train_step: {', '.join(WORKLOADS)} agree between NVIDIA's NCCL and ours ({real})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--ours-lib", default=os.path.join(ROOT, "build", "lib", "nccl", "libnccl.so.2"))
    parser.add_argument("--steps", type=int, default=30, help="timed steps per workload")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "build", "bench-logs"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (nvidia, ours)")
    parser.add_argument("--worker-run", choices=LABELS, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nranks < 2 or FFN % args.nranks:
        parser.error(f"--nranks must be at least 2 and divide {FFN} (the tensor-parallel width)")
    if args.steps < 1 or args.warmup < 0 or args.timeout <= 0:
        parser.error("--steps must be at least 1, --warmup not negative, --timeout positive")
    if args.worker_run:
        if not args.json:
            parser.error("--worker-run needs --json")
        args.out_dir = os.path.abspath(args.out_dir)
        os.makedirs(args.out_dir, exist_ok=True)
        return worker_run(args)
    return parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
