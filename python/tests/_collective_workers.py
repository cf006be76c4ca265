"""What each rank of the collectives' GPU tests runs, in its own process, on GPU ``rank % (GPUs)`` (so two
ranks share one GPU on a machine that has one). Every rank makes the same collective calls in the same
order whatever it finds, records what was wrong, and returns it; waits for the GPU have deadlines, so that a
broken collective fails a test instead of hanging it.

Inputs are small integers (1 to 11) that depend on the rank, the element and a salt: every sum, product,
maximum, minimum and average of two ranks' values is exact in every element type, so results are compared
bit for bit with what the test computes itself."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

import mscclpp
from mscclpp import _cuda

FLOATS = {"float16", "bfloat16", "float32", "float64"}


def _prepare(rank: int, framework: str) -> int:
    """Picks this rank's GPU and makes the framework use it; skips when the framework is missing."""
    ngpus = _cuda.device_count()
    if ngpus < 1:
        pytest.skip("no GPU")
    gpu = rank % ngpus
    if framework == "torch":
        try:
            import torch
        except ImportError:
            pytest.skip("torch is not installed")
        torch.cuda.set_device(gpu)
        torch.zeros(1, device="cuda")  # the context exists and is current from here on
    else:
        try:
            import cupy
        except ImportError:
            pytest.skip("cupy is not installed")
        cupy.cuda.Device(gpu).use()
        cupy.zeros(1)
    return gpu


class Frame:
    """The few array operations the checks need, in torch or cupy."""

    def __init__(self, framework: str) -> None:
        self.name = framework
        if framework == "torch":
            import torch

            self.torch = torch
        else:
            import cupy

            self.cp = cupy

    def dtype(self, name: str) -> Any:
        return getattr(self.torch, name) if self.name == "torch" else self.cp.dtype(name)

    def cast(self, x: Any, name: str) -> Any:
        return x.to(self.dtype(name)) if self.name == "torch" else x.astype(self.dtype(name))

    def values(self, rank: int, n: int, dtype: str, salt: int = 0, wide: bool = False) -> Any:
        """Rank ``rank``'s input: 1 to 11; ``wide``: as float64/int64, for computing expectations."""
        if self.name == "torch":
            i = self.torch.arange(n, device="cuda", dtype=self.torch.int64)
        else:
            i = self.cp.arange(n, dtype=self.cp.int64)
        v = (i * 7 + rank * 3 + salt * 5) % 11 + 1
        return self.cast(v, ("float64" if dtype in FLOATS else "int64") if wide else dtype)

    def zeros(self, n: int, dtype: str) -> Any:
        if self.name == "torch":
            return self.torch.zeros(n, dtype=self.dtype(dtype), device="cuda")
        return self.cp.zeros(n, dtype=self.dtype(dtype))

    def reduced(self, op: str, nranks: int, n: int, dtype: str, salt: int = 0, piece: Optional[int] = None) -> Any:
        """What ``op`` over every rank's ``values(r, n, ...)`` gives (of ``piece`` of length n//nranks)."""
        acc = None
        for r in range(nranks):
            v = self.values(r, n, dtype, salt, wide=True)
            if piece is not None:
                m = n // nranks
                v = v[piece * m:(piece + 1) * m]
            if acc is None:
                acc = v
            elif op in ("sum", "avg"):
                acc = acc + v
            elif op == "prod":
                acc = acc * v
            elif op == "max":
                acc = self.torch.maximum(acc, v) if self.name == "torch" else self.cp.maximum(acc, v)
            else:
                acc = self.torch.minimum(acc, v) if self.name == "torch" else self.cp.minimum(acc, v)
        if op == "avg":
            acc = acc / nranks if dtype in FLOATS else acc // nranks  # integers: truncated (all positive here)
        return self.cast(acc, dtype)

    def concat(self, parts: Sequence[Any]) -> Any:
        return self.torch.cat(list(parts)) if self.name == "torch" else self.cp.concatenate(list(parts))

    def compare(self, what: str, got: Any, expected: Any) -> Optional[str]:
        """None when equal bit for bit, else what differs."""
        if self.name == "torch":
            if self.torch.equal(got, expected):
                return None
            bad = (got != expected).nonzero().flatten()
            first = int(bad[0].item())
            return (f"{what}: {bad.numel()} of {got.numel()} elements wrong, the first at {first}: "
                    f"{got[first].item()} instead of {expected[first].item()}")
        if bool(self.cp.array_equal(got, expected)):
            return None
        bad = self.cp.nonzero(got != expected)[0]
        first = int(bad[0])
        return (f"{what}: {bad.size} of {got.size} elements wrong, the first at {first}: {got[first].item()} "
                f"instead of {expected[first].item()}")

    def wait(self, seconds: float = 60) -> None:
        """Waits for the current stream's work; fails (instead of hanging) if it does not end in time."""
        if self.name == "torch":
            event = self.torch.cuda.Event()
            event.record()
            done = event.query
        else:
            event = self.cp.cuda.Event()
            event.record()
            done = lambda: event.done  # noqa: E731
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the GPU did not finish within {seconds} s (a collective hangs?)")
            time.sleep(0.0002)


def _communicator(rank: int, nranks: int, address: str, gpu: int) -> mscclpp.Communicator:
    return mscclpp.Communicator(nranks, rank, address=address, device=gpu)


# ---- one collective, many element types, operators and sizes, in place and not ----

def all_reduce(rank: int, address: str, framework: str, cases: Sequence[Tuple[str, str]],
               sizes: Sequence[int]) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    failures: List[str] = []
    with _communicator(rank, 2, address, gpu) as comm:
        for dtype, op in cases:
            for n in sizes:
                expected = fw.reduced(op, 2, n, dtype)
                # In place: the input is overwritten, and the call returns it.
                x = fw.values(rank, n, dtype)
                ret = mscclpp.all_reduce(x, op, comm=comm)
                fw.wait()
                failures += _problems(fw, f"all_reduce {dtype} {op} n={n} in place", x, expected, ret is x)
                # Out of place: the input is left as it was.
                x = fw.values(rank, n, dtype)
                out = fw.zeros(n, dtype)
                ret = mscclpp.all_reduce(x, op, comm=comm, out=out)
                fw.wait()
                failures += _problems(fw, f"all_reduce {dtype} {op} n={n} into out", out, expected, ret is out)
                failures += _problems(fw, f"all_reduce {dtype} {op} n={n}: the input", x, fw.values(rank, n, dtype))
    return {"failures": failures, "gpu": gpu}


def all_gather(rank: int, address: str, framework: str, dtypes: Sequence[str], sizes: Sequence[int]) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    failures: List[str] = []
    with _communicator(rank, 2, address, gpu) as comm:
        for dtype in dtypes:
            for n in sizes:
                expected = fw.concat([fw.values(r, n, dtype) for r in range(2)])
                out = fw.zeros(2 * n, dtype)
                ret = mscclpp.all_gather(out, fw.values(rank, n, dtype), comm=comm)
                fw.wait()
                failures += _problems(fw, f"all_gather {dtype} n={n}", out, expected, ret is out)
                # In place: this rank's piece of the output is the input.
                out = fw.zeros(2 * n, dtype)
                out[rank * n:(rank + 1) * n] = fw.values(rank, n, dtype)
                ret = mscclpp.all_gather(out, out[rank * n:(rank + 1) * n], comm=comm)
                fw.wait()
                failures += _problems(fw, f"all_gather {dtype} n={n} in place", out, expected, ret is out)
    return {"failures": failures, "gpu": gpu}


def reduce_scatter(rank: int, address: str, framework: str, cases: Sequence[Tuple[str, str]],
                   sizes: Sequence[int]) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    failures: List[str] = []
    with _communicator(rank, 2, address, gpu) as comm:
        for dtype, op in cases:
            for n in sizes:
                expected = fw.reduced(op, 2, 2 * n, dtype, piece=rank)
                inp = fw.values(rank, 2 * n, dtype)
                out = fw.zeros(n, dtype)
                ret = mscclpp.reduce_scatter(out, inp, op, comm=comm)
                fw.wait()
                failures += _problems(fw, f"reduce_scatter {dtype} {op} n={n}", out, expected, ret is out)
                failures += _problems(fw, f"reduce_scatter {dtype} {op} n={n}: the input", inp,
                                      fw.values(rank, 2 * n, dtype))
                # In place: the output is this rank's piece of the input.
                inp = fw.values(rank, 2 * n, dtype)
                piece = inp[rank * n:(rank + 1) * n]
                ret = mscclpp.reduce_scatter(piece, inp, op, comm=comm)
                fw.wait()
                failures += _problems(fw, f"reduce_scatter {dtype} {op} n={n} in place", piece, expected,
                                      ret is piece)
    return {"failures": failures, "gpu": gpu}


def broadcast(rank: int, address: str, framework: str, dtypes: Sequence[str], sizes: Sequence[int]) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    failures: List[str] = []
    with _communicator(rank, 2, address, gpu) as comm:
        for dtype in dtypes:
            for n in sizes:
                for root in (0, 1):
                    x = fw.values(rank, n, dtype)
                    ret = mscclpp.broadcast(x, root, comm=comm)
                    fw.wait()
                    failures += _problems(fw, f"broadcast {dtype} n={n} root {root} in place", x,
                                          fw.values(root, n, dtype), ret is x)
                    x = fw.values(rank, n, dtype)
                    out = fw.zeros(n, dtype)
                    ret = mscclpp.broadcast(x, root, comm=comm, out=out)
                    fw.wait()
                    failures += _problems(fw, f"broadcast {dtype} n={n} root {root} into out", out,
                                          fw.values(root, n, dtype), ret is out)
                    failures += _problems(fw, f"broadcast {dtype} n={n} root {root}: the input", x,
                                          fw.values(rank, n, dtype))
    return {"failures": failures, "gpu": gpu}


def _problems(fw: Frame, what: str, got: Any, expected: Any, returned_output: bool = True) -> List[str]:
    out = []
    if not returned_output:
        out.append(f"{what}: the call did not return its output")
    wrong = fw.compare(what, got, expected)
    if wrong:
        out.append(wrong)
    return out


# ---- streams, other protocols, errors ----

class _OnlyDLPack:
    """A tensor seen through DLPack alone (the package's path for frameworks it does not know)."""

    def __init__(self, t: Any) -> None:
        self.t = t

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.t.__dlpack__()

    def __dlpack_device__(self) -> Any:
        return self.t.__dlpack_device__()


class _OnlyCai:
    """An array seen through __cuda_array_interface__ alone."""

    def __init__(self, a: Any) -> None:
        self.__cuda_array_interface__ = a.__cuda_array_interface__


def streams_and_protocols(rank: int, address: str, framework: str) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    failures: List[str] = []
    errors: Dict[str, str] = {}
    n = 4099
    with _communicator(rank, 2, address, gpu) as comm:
        if framework == "torch":
            torch = fw.torch
            # On a stream of the application's, made current: the call goes there.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                x = fw.values(rank, n, "float32")
                mscclpp.all_reduce(x, comm=comm)
                y = x * 2  # ordered after the all-reduce by the stream alone
                fw.wait()
            failures += _problems(fw, "all_reduce on the current side stream", y,
                                  fw.reduced("sum", 2, n, "float32") * 2)
            # Named with stream=: a torch stream, then a raw handle.
            for name, stream in (("torch.cuda.Stream", side), ("a handle", side.cuda_stream)):
                x = fw.values(rank, n, "int32")
                side.wait_stream(torch.cuda.current_stream())  # x is made on the current stream
                mscclpp.all_reduce(x, "max", comm=comm, stream=stream)
                side.synchronize()
                failures += _problems(fw, f"all_reduce on stream= {name}", x, fw.reduced("max", 2, n, "int32"))
            # bfloat16 through DLPack alone (torch's __cuda_array_interface__ has no bfloat16).
            x = fw.values(rank, n, "bfloat16")
            mscclpp.all_reduce(_OnlyDLPack(x), "avg", comm=comm, stream=torch.cuda.current_stream())
            fw.wait()
            failures += _problems(fw, "all_reduce of a DLPack-only bfloat16 tensor", x,
                                  fw.reduced("avg", 2, n, "bfloat16"))
            # A tensor that requires grad is a buffer like any other.
            w = fw.values(rank, n, "float32").requires_grad_(True)
            with torch.no_grad():
                mscclpp.all_reduce(w, comm=comm)
            fw.wait()
            failures += _problems(fw, "all_reduce of a tensor that requires grad", w.detach(),
                                  fw.reduced("sum", 2, n, "float32"))
            # Usual calls enough for the extension to trust torch's C shim (_fastcall.c, read_torch: its reads
            # compared with the Python accessors' on a type's first tensors), so that the checks below are made
            # with the shim on.
            warm = fw.values(rank, 64, "float32")
            for _ in range(12):
                mscclpp.all_reduce(warm, "max", comm=comm)
            fw.wait()
            checks = {
                "cpu tensor": lambda: mscclpp.all_reduce(torch.zeros(4), comm=comm),
                "non-contiguous": lambda: mscclpp.all_reduce(torch.zeros(8, 8, device="cuda").t(), comm=comm),
                "complex": lambda: mscclpp.all_reduce(torch.zeros(4, dtype=torch.complex64, device="cuda"), comm=comm),
                "count": lambda: mscclpp.all_gather(torch.zeros(7, device="cuda"), torch.zeros(4, device="cuda"),
                                                    comm=comm),
                "dtype": lambda: mscclpp.reduce_scatter(torch.zeros(4, device="cuda"),
                                                        torch.zeros(8, dtype=torch.float16, device="cuda"), comm=comm),
            }
            if torch.cuda.device_count() > 1:
                other = torch.zeros(4, device=f"cuda:{1 - gpu}")
                checks["other gpu"] = lambda: mscclpp.all_reduce(other, comm=comm)
        else:
            cp = fw.cp
            side = cp.cuda.Stream(non_blocking=True)
            cp.cuda.get_current_stream().synchronize()
            with side:
                x = fw.values(rank, n, "float32")
                mscclpp.all_reduce(x, comm=comm)
                y = x * 2
                fw.wait()
            failures += _problems(fw, "all_reduce on the current side stream", y,
                                  fw.reduced("sum", 2, n, "float32") * 2)
            x = fw.values(rank, n, "uint32")
            cp.cuda.Device().synchronize()  # x is made on the current stream, which side does not wait for
            mscclpp.all_reduce(x, "min", comm=comm, stream=side)
            side.synchronize()
            failures += _problems(fw, "all_reduce on stream= cupy.cuda.Stream", x, fw.reduced("min", 2, n, "uint32"))
            # Through __cuda_array_interface__ alone, and through DLPack alone.
            x = fw.values(rank, n, "float16")
            mscclpp.all_reduce(_OnlyCai(x), "sum", comm=comm)
            cp.cuda.Device().synchronize()
            failures += _problems(fw, "all_reduce of an interface-only array", x, fw.reduced("sum", 2, n, "float16"))
            x = fw.values(rank, n, "int64")
            mscclpp.all_reduce(_OnlyDLPack(x), "prod", comm=comm)
            cp.cuda.Device().synchronize()
            failures += _problems(fw, "all_reduce of a DLPack-only array", x, fw.reduced("prod", 2, n, "int64"))
            checks = {
                "non-contiguous": lambda: mscclpp.all_reduce(cp.zeros((8, 8), dtype=cp.float32).T, comm=comm),
                "complex": lambda: mscclpp.all_reduce(cp.zeros(4, dtype=cp.complex64), comm=comm),
                "bool": lambda: mscclpp.all_reduce(cp.zeros(4, dtype=cp.bool_), comm=comm),
                "count": lambda: mscclpp.all_gather(cp.zeros(7, dtype=cp.float32), cp.zeros(4, dtype=cp.float32),
                                                    comm=comm),
            }
        for name, call in checks.items():
            try:
                call()
                errors[name] = "no error"
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {e}"
        comm.barrier()
    from mscclpp import collectives

    fast = collectives._fastcall
    shim = fast.shim_state() if fast is not None and hasattr(fast, "shim_state") else None
    return {"failures": failures, "errors": errors, "gpu": gpu, "shim": shim}


# ---- CUDA graphs ----

def _graph_buffers(fw: Frame, rank: int, salt: int, bufs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The graph test's inputs for ``salt``: made, or copied into the buffers the graph captured."""
    n, big = 1027, 300_001  # the big all-reduce is past the packet size, so both protocols are captured
    fresh = {
        "x": fw.values(rank, n, "float32", salt),
        "xb": fw.values(rank, big, "float32", salt),
        "ag_in": fw.values(rank, n, "bfloat16" if fw.name == "torch" else "float16", salt),
        "rs_in": fw.values(rank, 2 * n, "float16", salt),
        "bc": fw.values(rank, n, "int32", salt),
    }
    if bufs is None:
        fresh["ag_out"] = fw.zeros(2 * n, "bfloat16" if fw.name == "torch" else "float16")
        fresh["rs_out"] = fw.zeros(n, "float16")
        return fresh
    for k, v in fresh.items():
        bufs[k][...] = v
    return bufs


def _graph_step(bufs: Dict[str, Any], comm: mscclpp.Communicator) -> None:
    mscclpp.all_reduce(bufs["x"], "sum", comm=comm)
    mscclpp.all_reduce(bufs["xb"], "max", comm=comm)
    mscclpp.all_gather(bufs["ag_out"], bufs["ag_in"], comm=comm)
    mscclpp.reduce_scatter(bufs["rs_out"], bufs["rs_in"], "sum", comm=comm)
    mscclpp.broadcast(bufs["bc"], 1, comm=comm)


def _graph_check(fw: Frame, rank: int, salt: int, bufs: Dict[str, Any], what: str) -> List[str]:
    n, big = 1027, 300_001
    agt = "bfloat16" if fw.name == "torch" else "float16"
    return (_problems(fw, f"{what}: all_reduce sum", bufs["x"], fw.reduced("sum", 2, n, "float32", salt))
            + _problems(fw, f"{what}: all_reduce max (large)", bufs["xb"], fw.reduced("max", 2, big, "float32", salt))
            + _problems(fw, f"{what}: all_gather", bufs["ag_out"],
                        fw.concat([fw.values(r, n, agt, salt) for r in range(2)]))
            + _problems(fw, f"{what}: reduce_scatter", bufs["rs_out"],
                        fw.reduced("sum", 2, 2 * n, "float16", salt, piece=rank))
            + _problems(fw, f"{what}: broadcast", bufs["bc"], fw.values(1, n, "int32", salt)))


def torch_graph(rank: int, address: str, replays: int, warm_up: bool) -> Dict[str, Any]:
    """Every collective captured in one torch.cuda.graph and replayed ``replays`` times with new inputs.
    ``warm_up``: one eager call of each first (as torch's documentation asks of captured work); without, the
    collectives' set-up happens inside the capture."""
    gpu = _prepare(rank, "torch")
    fw = Frame("torch")
    torch = fw.torch
    failures: List[str] = []
    with _communicator(rank, 2, address, gpu) as comm:
        bufs = _graph_buffers(fw, rank, 0)
        if warm_up:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _graph_step(bufs, comm)
            torch.cuda.current_stream().wait_stream(side)
            fw.wait()
            failures += _graph_check(fw, rank, 0, bufs, "eager warm-up")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _graph_step(bufs, comm)
        for salt in range(1, replays + 1):
            _graph_buffers(fw, rank, salt, bufs)
            graph.replay()
            fw.wait()
            failures += _graph_check(fw, rank, salt, bufs, f"replay {salt}")
        del graph
        torch.cuda.synchronize()
    return {"failures": failures, "gpu": gpu}


def cupy_graph(rank: int, address: str, replays: int) -> Dict[str, Any]:
    """As torch_graph, with cupy's stream capture (after an eager warm-up)."""
    gpu = _prepare(rank, "cupy")
    fw = Frame("cupy")
    cp = fw.cp
    if not hasattr(cp.cuda.Stream, "begin_capture"):
        pytest.skip(f"cupy {cp.__version__} has no stream capture")
    failures: List[str] = []
    with _communicator(rank, 2, address, gpu) as comm:
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            bufs = _graph_buffers(fw, rank, 0)
            _graph_step(bufs, comm)
            fw.wait()
            failures += _graph_check(fw, rank, 0, bufs, "eager warm-up")
            stream.begin_capture()
            _graph_step(bufs, comm)
            graph = stream.end_capture()
            for salt in range(1, replays + 1):
                _graph_buffers(fw, rank, salt, bufs)
                graph.launch()
                fw.wait()
                failures += _graph_check(fw, rank, salt, bufs, f"replay {salt}")
    return {"failures": failures, "gpu": gpu}


# ---- the cost of a call ----

def call_cost(rank: int, address: str, calls: int) -> Dict[str, Any]:
    """Host time per small in-place all-reduce (torch; max, so that the values stay put), and the part of it
    spent in Python (the same calls with the C function replaced by one that does nothing)."""
    gpu = _prepare(rank, "torch")
    import torch

    from mscclpp import collectives

    x = torch.ones(256, device="cuda")
    with _communicator(rank, 2, address, gpu) as comm:
        for _ in range(50):
            mscclpp.all_reduce(x, "max", comm=comm)
        torch.cuda.synchronize()
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            mscclpp.all_reduce(x, "max", comm=comm)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        ok = bool(torch.all(x == 1.0).item())
        real = collectives._fns["mscclppAllReduce"]
        collectives._fns["mscclppAllReduce"] = lambda *args: None
        try:
            t3 = time.perf_counter()
            for _ in range(calls):
                mscclpp.all_reduce(x, "max", comm=comm)
            t4 = time.perf_counter()
        finally:
            collectives._fns["mscclppAllReduce"] = real
        comm.barrier()
    return {"host_us": (t1 - t0) / calls * 1e6, "total_us": (t2 - t0) / calls * 1e6,
            "python_us": (t4 - t3) / calls * 1e6, "ok": ok, "gpu": gpu}


def env_for_tests() -> Dict[str, str]:
    """What every rank's environment gets: kernels loaded eagerly (see docs/mscclpp.md, "Lazy module loading")."""
    return {"CUDA_MODULE_LOADING": os.environ.get("CUDA_MODULE_LOADING", "EAGER")}
