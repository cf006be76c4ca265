#!/usr/bin/env python3
"""What the package's collectives cost the host per call, apart from the library: runs anywhere, no GPU.

    PYTHONPATH=python python3 python/benchmarks/host_call_cost.py [--calls N] [--repeats N]

``mscclpp.all_reduce``, ``all_gather``, ``reduce_scatter`` and ``broadcast`` are called in a loop on
stand-ins for torch tensors and cupy arrays (256 float32, "1 KiB"), on a two-rank communicator made in two
threads of this process, with the library's four C functions replaced by a C function that returns 0 at
once (the library's own host work, which a C caller pays as well, is not counted). The communicator is
set as after its first call on a GPU machine (GPU 0, the library holding its GPU), so every call takes
the steady path. The no-op functions are compiled with ``cc`` (needed).

Each call is measured both ways: through the package's C fast path (the extension
``mscclpp/_fastcall.abi3.so``, which reads the buffers and calls the function's address from C; the
"C path" columns; mscclpp.all_reduce etc. are then its builtins) and through the Python code and ctypes
alone (the extension turned off: its builtins hand each call to the Python functions; the "ctypes" columns,
which include that hand-over, well under 0.1 us). Where the extension is not built (see ``make``), only the second; the first line says which.
The run checks that every timed call of the C path was made by the extension.

The stand-ins read like torch's and cupy's objects (the same attribute and method names, methods as
Python methods, where torch's and cupy's are C): real objects answer in about the same time or faster,
so the figures are close to, and if anything above, what torch and cupy cost. They replace the real
modules in this process even where those are installed (real tensors would need a GPU).

Prints microseconds per call for each collective (all-reduce and broadcast in place and with ``out=``),
kind of buffer and path, the minimum over the repeats (the least disturbed by other work on the machine;
the repeats go round all the cases), and the floor: one ctypes call of the no-op with all_reduce's
arguments as plain ints. Every call, the floor's too, is made through a lambda, whose cost (well under
0.1 us) is in every figure alike.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import Any, Callable, Dict, List, Optional

N_ELEMS = 256  # 1 KiB of float32, the size
CONTEXT = 0x51C0  # the fake driver's current context, made the communicator's
BASE = 0x7F00_0000_0000  # made-up device addresses: nothing is read from them

_NOOP_C = r"""
int mscclpp_bench_noop(void) { return 0; }
int mscclpp_bench_ctx(void** ctx) { *ctx = (void*)0x51C0; return 0; }
"""


def _compile_noops(tmp: str) -> Optional[ctypes.CDLL]:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    src, so = os.path.join(tmp, "noop.c"), os.path.join(tmp, "noop.so")
    with open(src, "w") as f:
        f.write(_NOOP_C)
    if subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, src], capture_output=True).returncode != 0:
        return None
    return ctypes.CDLL(so)


# ---- stand-ins for torch and cupy: the attributes the package reads, nothing else ----

def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")

    class dtype:
        __slots__ = ("name",)

        def __init__(self, name: str) -> None:
            self.name = name

        def __repr__(self) -> str:
            return "torch." + self.name

    for n in ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"):
        setattr(torch, n, dtype(n))

    class Tensor:
        __slots__ = ("_n", "dtype", "_ptr", "_dev", "is_cuda", "device")

        def __init__(self, n: int, dt: Any, ptr: int, device: int = 0) -> None:
            self._n, self.dtype, self._ptr, self._dev = n, dt, ptr, device
            self.is_cuda = True
            self.device = f"cuda:{device}"

        def numel(self) -> int:
            return self._n

        def data_ptr(self) -> int:
            return self._ptr

        def get_device(self) -> int:
            return self._dev

        def is_contiguous(self) -> bool:
            return True

        def element_size(self) -> int:
            return 4

    torch.Tensor = Tensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0x5000 + device)
    torch.cuda = types.SimpleNamespace(current_stream=lambda device=None: types.SimpleNamespace(cuda_stream=0x5000))
    return torch


def _fake_numpy() -> types.ModuleType:
    np = types.ModuleType("numpy")
    made: Dict[str, Any] = {}

    class dtype:
        __slots__ = ("name", "itemsize")

        def __new__(cls, name: Any) -> Any:  # numpy.dtype("float32") is numpy.dtype("float32")
            name = getattr(name, "name", name)
            d = made.get(name)
            if d is None:
                d = made[name] = object.__new__(cls)
                d.name = name
                d.itemsize = 4
            return d

        def __repr__(self) -> str:
            return f"dtype('{self.name}')"

    np.dtype = dtype
    return np


def _fake_cupy(np: Any) -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    flags = types.SimpleNamespace(c_contiguous=True)
    stream = types.SimpleNamespace(ptr=0x6000)

    class ndarray:
        __slots__ = ("size", "dtype", "data", "device", "flags", "shape", "strides")

        def __init__(self, n: int, dt: str, ptr: int, device: int = 0) -> None:
            self.size, self.dtype = n, np.dtype(dt)
            self.data = types.SimpleNamespace(ptr=ptr)
            self.device = types.SimpleNamespace(id=device)
            self.flags = flags
            self.shape, self.strides = (n,), (4,)

    cupy.ndarray = ndarray
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda device=None: stream)
    return cupy


def _frameworks() -> Dict[str, Any]:
    """Stand-in torch and cupy modules, in place of any real ones for this process (real tensors would
    need a GPU); numpy's stand-in only where numpy does not import."""
    try:
        import numpy as np
    except ImportError:
        np = sys.modules["numpy"] = _fake_numpy()
    found = {"torch": _fake_torch(), "cupy": _fake_cupy(np)}
    sys.modules.update(found)
    return found


# ---- the package, with the C functions and the driver replaced ----

def _install_noops(noops: ctypes.CDLL) -> Any:
    """Replaces the library's collectives and the driver's cuCtxGetCurrent, then reloads the collectives'
    module (it binds its C functions when imported). Returns the reloaded module."""
    from mscclpp import _cuda, collectives
    from mscclpp._library import lib

    def address(f: Any) -> int:
        return ctypes.cast(f, ctypes.c_void_p).value or 0

    for name in collectives._NAMES:
        proto = getattr(lib.cdll, name)
        f = ctypes.CFUNCTYPE(proto.restype, *proto.argtypes)(address(noops.mscclpp_bench_noop))
        f.argtypes, f.restype = proto.argtypes, proto.restype
        setattr(lib.cdll, name, f)
    get_ctx = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))(address(noops.mscclpp_bench_ctx))
    _cuda._driver = types.SimpleNamespace(cuCtxGetCurrent=get_ctx)  # type: ignore[assignment]
    return importlib.reload(collectives)


def _communicators() -> List[Any]:
    import mscclpp

    uid = mscclpp.UniqueId.create()
    made: Dict[int, Any] = {}

    def join(rank: int) -> None:
        made[rank] = mscclpp.Communicator(2, rank, unique_id=uid)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    comms = [made[0], made[1]]
    for c in comms:
        # As on a GPU machine after the first call: the communicator works on GPU 0, whose context the
        # framework made current, and the library has taken that GPU (it makes it current itself).
        c._st.device, c._st.context = 0, CONTEXT
        c._st.library_has_gpu = True
    return comms


def _time_loop(call: Callable[[], Any], calls: int) -> float:
    """Microseconds per call of ``calls`` calls in a loop (the loop's own cost, about 0.02 us a turn,
    included)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t0) / calls * 1e6


CALLS = ("all_reduce", "all_reduce out", "all_gather", "reduce_scatter", "broadcast", "broadcast out")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=15, help="timed loops per figure (the minimum is shown)")
    args = parser.parse_args()

    fw = _frameworks()
    torch, cupy = fw["torch"], fw["cupy"]
    with tempfile.TemporaryDirectory() as tmp:
        noops = _compile_noops(tmp)
        if noops is None:
            print("host_call_cost: skipped (no C compiler, cc, to build the no-op functions)")
            return 0
        comms = _communicators()  # before the driver is replaced: they are made without a GPU
        comm = comms[0]
        coll = _install_noops(noops)
        paths = ["C path", "ctypes"] if coll._use_fastcall(True) else ["ctypes"]
        state = coll._fastcall_state()
        n, calls, reps = N_ELEMS, args.calls, args.repeats

        def buffers(kind: str) -> Dict[str, Any]:
            if kind == "torch":
                def make(m: int, ptr: int) -> Any:
                    return torch.Tensor(m, torch.float32, ptr)
            else:
                def make(m: int, ptr: int) -> Any:
                    return cupy.ndarray(m, "float32", ptr)
            return {"x": make(n, BASE), "big": make(2 * n, BASE + (1 << 20)), "small": make(n, BASE + (2 << 20))}

        cases: Dict[tuple, Callable[[], Any]] = {}
        for kind in ("torch", "cupy"):
            b = buffers(kind)
            x, big, small = b["x"], b["big"], b["small"]
            cases[("all_reduce", kind)] = lambda x=x: coll.all_reduce(x, "sum", comm=comm)
            cases[("all_reduce out", kind)] = lambda x=x, y=small: coll.all_reduce(x, "sum", comm=comm, out=y)
            cases[("all_gather", kind)] = lambda big=big, small=small: coll.all_gather(big, small, comm=comm)
            cases[("reduce_scatter", kind)] = lambda big=big, small=small: coll.reduce_scatter(small, big, "sum",
                                                                                               comm=comm)
            cases[("broadcast", kind)] = lambda x=x: coll.broadcast(x, 0, comm=comm)
            cases[("broadcast out", kind)] = lambda x=x, y=small: coll.broadcast(x, 0, comm=comm, out=y)

        from mscclpp._library import lib

        declared = lib.cdll.mscclppAllReduce
        as_pointers = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * 7))(
            ctypes.cast(declared, ctypes.c_void_p).value)
        args7 = (BASE, BASE, n, 7, 0, comm._st._handle, 0x5000)
        floors = {"declared": lambda: declared(*args7), "pointers": lambda: as_pointers(*args7)}

        # (call, kind, path) -> the loop's call; the floor's path is its prototype.
        timed: Dict[tuple, Callable[[], Any]] = {}
        for (c, kind), call in cases.items():
            for path in paths:
                timed[(c, kind, path)] = call
        for proto, call in floors.items():
            timed[("floor", proto, "ctypes")] = call
        for path in paths:
            coll._use_fastcall(path == "C path")
            for call in cases.values():
                call()  # resolves what is resolved once
        # Round robin: what disturbs the machine for a while spreads over every case alike.
        best = {key: float("inf") for key in timed}
        declined = 0
        for _ in range(reps):
            for key, call in timed.items():
                coll._use_fastcall(key[2] == "C path")
                before = coll._fastcall.stats() if key[2] == "C path" else (0, 0)
                best[key] = min(best[key], _time_loop(call, calls))
                if key[2] == "C path":
                    declined += coll._fastcall.stats()[1] - before[1]
        coll._use_fastcall(True)
        from mscclpp import _cuda

        _cuda._driver = None
        for c in comms:
            c.close()
    print(f"host work per call of the package's collectives, 256 float32; library replaced by compiled no-op C "
          "functions; buffers: stand-ins for torch tensors and cupy arrays; "
          f"min of {reps} loops of {calls} calls; Python {sys.version.split()[0]}; {state}")
    heads = [f"{kind} {path} us" for path in paths for kind in ("torch", "cupy")]
    print(f"{'call':16s} " + " ".join(f"{h:>16s}" for h in heads))
    for c in CALLS:
        print(f"{c:16s} " + " ".join(f"{best[(c, kind, path)]:16.2f}" for path in paths for kind in ("torch", "cupy")))
    print(f"floor: the no-op called through ctypes with all_reduce's arguments as plain ints: "
          f"{best[('floor', 'declared', 'ctypes')]:.2f} us with the library's prototype (pointers, size_t, ints), "
          f"{best[('floor', 'pointers', 'ctypes')]:.2f} us with every argument declared void*")
    if "C path" in paths:
        if declined:
            print(f"FAIL: {declined} timed calls of the C path were left to Python (its figures are not its own)")
            return 1
        print("every timed call of the C path was made by the extension")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
