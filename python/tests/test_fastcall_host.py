"""The collectives' C fast path (``mscclpp/_fastcall.c``) on any machine (no GPU needed): it must make
exactly the library calls that the Python code makes through ctypes, and leave every unusual call and
every error to the Python code, so that each raises the same exception with the same message.

Stand-ins for torch and cupy (modules put into ``sys.modules`` for each test, buffer types whose accessors
return what each test chooses) and a recorder in place of the library's four functions: a ctypes callback
whose address the extension calls like the library's, so every argument it passes is checked (pointers,
count, element type, operator or root, communicator handle, stream). Each call runs twice, through the
extension and with it turned off (``collectives._use_fastcall(False)``), and the two must agree in what
they return or raise and in what reached the "library"; the extension's counters tell which calls it made.
"""

from __future__ import annotations

import ctypes
import enum
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import mscclpp
from _ranks import run_rank_threads
from mscclpp import _cuda, collectives

needs_fastcall = pytest.mark.skipif(collectives._fastcall is None, reason=collectives._fastcall_state())

BASE = 0x7000_0000  # made-up device addresses: the recorder never reads them
F16, BF16 = int(mscclpp.DataType.Float16), int(mscclpp.DataType.Bfloat16)


def test_the_extension_is_there_where_it_could_be_built() -> None:
    """Installed by pip with a C compiler and Python's headers at hand, the package has its C fast path; a
    checkout has it once make built it in place (PYTHONPATH=python)."""
    print(collectives._fastcall_state())
    if collectives._fastcall is not None:
        assert collectives._fastcall.__file__.endswith(".abi3.so"), "built for the stable ABI"
        return
    if "MSCCLPP_PYTHON_FASTCALL" in os.environ:
        pytest.skip(collectives._fastcall_state())
    here = os.path.dirname(collectives.__file__)
    if os.path.isfile(os.path.join(here, "_fastcall.c")):
        pytest.skip(f"a checkout without the built extension (make builds it): {collectives._fastcall_state()}")
    compiler = shutil.which(os.environ.get("CC", "cc"))
    headers = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if compiler is None or not headers:
        pytest.skip(f"no C compiler or Python.h here either: {collectives._fastcall_state()}")
    pytest.fail(f"pip could have built the extension here: {collectives._fastcall_state()}")


def test_a_package_without_the_built_extension_says_so(tmp_path: Any) -> None:
    """A checkout whose extension was never built (a copy of the tree without its ignored files) says the
    extension is not built and where it looked, not Python's "(most likely due to a circular import)"."""
    # The checkout's package (python/mscclpp beside these tests), whichever copy this session imported.
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mscclpp")
    repo_build = os.path.join(os.path.dirname(os.path.dirname(here)), "build")
    if not os.path.isdir(repo_build) or not os.path.isfile(os.path.join(here, "collectives.py")):
        pytest.skip(f"these tests do not sit in a checkout with build/ ({here})")
    copy = tmp_path / "python" / "mscclpp"
    shutil.copytree(here, copy, ignore=shutil.ignore_patterns("_fastcall*.so", "__pycache__"))
    os.symlink(repo_build, tmp_path / "build")
    env = {k: v for k, v in os.environ.items() if k != "MSCCLPP_PYTHON_FASTCALL"}
    env["PYTHONPATH"] = str(tmp_path / "python")
    out = subprocess.run([sys.executable, "-c", "from mscclpp import collectives; print(collectives._fastcall_state())"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if sys.version_info < (3, 10):
        assert "3.10" in out.stdout
        return
    assert "not built" in out.stdout and str(copy) in out.stdout, out.stdout
    assert "circular" not in out.stdout, out.stdout


# ---- stand-ins for torch and cupy ----

class _Dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return "torch." + self.name


def _fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    for n in ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "bool"):
        setattr(torch, n, _Dtype(n))

    class Tensor:
        """What the package reads of a torch tensor; ``fail`` names an accessor that raises."""

        def __init__(self, n: int, dt: Any, ptr: int, device: Optional[int] = 0, contiguous: bool = True,
                     fail: str = "") -> None:
            self.n, self.dtype, self.ptr, self.dev, self.contiguous, self.fail = n, dt, ptr, device, contiguous, fail
            self.is_cuda = device is not None
            self.device = f"cuda:{device}" if device is not None else "cpu"
            self.shape = (n,)

        def _check(self, name: str) -> None:
            if self.fail == name:
                raise RuntimeError(f"{name} refused")

        def numel(self) -> int:
            self._check("numel")
            return self.n

        def data_ptr(self) -> int:
            self._check("data_ptr")
            return self.ptr

        def get_device(self) -> int:
            return self.dev if self.dev is not None else -1

        def is_contiguous(self) -> bool:
            return self.contiguous

        def stride(self) -> Tuple[int]:
            return (1,) if self.contiguous else (2,)

    class Parameter(Tensor):
        pass

    torch.Tensor = Tensor
    torch.Parameter = Parameter
    torch.streams = {}  # device -> raw stream; a missing device makes the accessor raise
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: torch.streams[device])
    torch.streams.update({0: 0x5000, 1: 0x5001})
    return torch


def _fake_numpy() -> Any:
    try:
        import numpy

        return numpy
    except ImportError:
        pass
    np = types.ModuleType("numpy")
    made: Dict[str, Any] = {}

    class dtype:
        def __new__(cls, name: Any) -> Any:  # numpy.dtype("float32") is numpy.dtype("float32")
            name = getattr(name, "name", name)
            if name not in made:
                made[name] = object.__new__(cls)
                made[name].name = name
            return made[name]

        def __repr__(self) -> str:
            return f"dtype('{self.name}')"

    np.dtype = dtype
    return np


def _fake_cupy(np: Any, per_device: bool = True) -> types.ModuleType:
    """cupy's accessors; ``per_device=False``: an old cupy whose get_current_stream takes no device."""
    cupy = types.ModuleType("cupy")

    class ndarray:
        def __init__(self, n: int, dt: str, ptr: int, device: int = 0, contiguous: bool = True) -> None:
            self.size, self.dtype = n, np.dtype(dt)
            self.data = types.SimpleNamespace(ptr=ptr)
            self.device = types.SimpleNamespace(id=device)
            self.flags = types.SimpleNamespace(c_contiguous=contiguous)
            self.shape, self.strides = (n,), (4,) if contiguous else (8,)

    def get_current_stream(*device: int) -> Any:
        if device and not per_device:
            raise TypeError("get_current_stream() takes no arguments (1 given)")
        return types.SimpleNamespace(ptr=0x6000 + (device[0] if device else 0x80))

    cupy.ndarray = ndarray
    cupy.cuda = types.SimpleNamespace(get_current_stream=get_current_stream)
    return cupy


# ---- the recorder in place of the library ----

class Recorder:
    """The four C functions, replaced by ctypes callbacks of the library's prototypes (so that each argument
    is read as the library reads it: an ``int`` from the low 32 bits of its register), bound the way
    collectives._bind binds the library's functions: both the extension (through the address) and the
    Python path (through ctypes) call them. Each call is recorded with its function's name; ``rc`` is what
    they return."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []
        self.rc = 0
        self._callbacks = []
        for name in collectives._NAMES:
            declared = getattr(mscclpp._library.lib.cdll, name)
            proto = ctypes.CFUNCTYPE(ctypes.c_int, *declared.argtypes)
            cb = proto(lambda *args, _name=name: self._record(_name, args))
            self._callbacks.append(cb)  # alive as long as the recorder
            collectives._fns[name] = collectives._bind_at(name, ctypes.cast(cb, ctypes.c_void_p).value)

    def _record(self, name: str, args: tuple) -> int:
        self.calls.append((name,) + tuple(a or 0 for a in args))  # NULL arrives as None
        return self.rc


@pytest.fixture(scope="module")
def comms() -> Iterator[Tuple[Any, Any]]:
    """Two ranks of one job, made in two threads; the tests call them from the main thread."""
    uid = mscclpp.UniqueId.create()
    made: Dict[int, Any] = {}

    def join(rank: int) -> None:
        made[rank] = mscclpp.Communicator(2, rank, unique_id=uid)

    threads = run_rank_threads(2, join)
    assert not any(t.is_alive() for t in threads) and len(made) == 2
    yield made[0], made[1]
    for c in made.values():
        c.close()


class World:
    """What a test works with: the stand-in modules, the recorder, the two communicators."""

    def __init__(self, torch: Any, cupy: Any, rec: Recorder, comms: Tuple[Any, Any]) -> None:
        self.torch, self.cupy, self.rec, self.comms = torch, cupy, rec, comms

    def both_ways(self, call: Callable[[], Any]) -> List[Tuple[Any, List[tuple], int]]:
        """(what ``call`` returned or raised, the library calls it made, how many the extension made),
        through the extension and then without it."""
        out = []
        for on in (True, False):
            collectives._use_fastcall(on)
            self.rec.calls.clear()
            before = collectives._fastcall.stats()[0]
            try:
                result: Any = ("returned", call())
            except Exception as e:  # noqa: BLE001 - compared below
                result = ("raised", type(e), str(e))
            out.append((result, list(self.rec.calls), collectives._fastcall.stats()[0] - before))
        collectives._use_fastcall(True)
        return out

    def same_both_ways(self, call: Callable[[], Any]) -> Tuple[Any, List[tuple], int]:
        (fast, fast_calls, made), (slow, slow_calls, _) = self.both_ways(call)
        assert fast == slow, f"the extension's {fast} and Python's {slow}"
        assert fast_calls == slow_calls, f"the extension called {fast_calls}, Python {slow_calls}"
        return fast, fast_calls, made


@pytest.fixture()
def world(comms: Tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """Stand-in torch and cupy for this test, fresh framework tables, the recorder, and communicators as
    after their first call on a GPU machine (GPU 0, the library holding it). Everything is put back after,
    the extension's tables too."""
    if collectives._fastcall is None:
        pytest.skip(collectives._fastcall_state())
    torch = _fake_torch()
    np = _fake_numpy()
    cupy = _fake_cupy(np)
    saved_fns = dict(collectives._fns)
    saved_other_ops = dict(collectives._OTHER_OPS)  # the enums' members a test resolves stay its own
    saved_states = [(c._st.device, c._st.library_has_gpu) for c in comms]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "numpy", np)
    monkeypatch.setattr(collectives, "_frameworks", {})
    monkeypatch.setattr(collectives, "_adapters", {})
    rec = Recorder()
    for c in comms:
        c._st.device, c._st.library_has_gpu = 0, True
    try:
        collectives._fast_configure()
        for tp in (torch.Tensor, torch.Parameter, cupy.ndarray):
            collectives._resolve(tp)  # as the first call with each type does; the extension knows them then
        yield World(torch, cupy, rec, comms)
    finally:
        monkeypatch.undo()  # first: it puts back what the test's own patches of _fns replaced
        for c, (device, has_gpu) in zip(comms, saved_states):
            c._st.device, c._st.library_has_gpu = device, has_gpu
        collectives._fns.clear()
        collectives._fns.update(saved_fns)
        collectives._OTHER_OPS.clear()
        collectives._OTHER_OPS.update(saved_other_ops)
        collectives._use_fastcall(True)
        collectives._fast_configure()  # the real functions and buffer types again


# ---- what reaches the library ----

class _OtherReduceOp(enum.Enum):
    """Stands for torch.distributed.ReduceOp, whose members are matched by name (then remembered)."""

    SUM = 0
    MAX = 3


class _IntReduceOp(enum.IntEnum):
    """Another enum's member that equals an int (and True): once remembered, a bool must still be refused."""

    PROD = 1


@needs_fastcall
def test_the_extension_passes_what_the_python_path_passes(world: World) -> None:
    torch, cupy, (c0, c1) = world.torch, world.cupy, world.comms
    h1 = c1._st._handle
    t = torch.Tensor(6, torch.float16, BASE)
    p = torch.Parameter(6, torch.float16, BASE + 0x100)  # a subclass: its own entry, as in _adapters
    P, BIG, A, A_BIG, MINE = BASE + 0x100, BASE + 0x1000, BASE + 0x2000, BASE + 0x3000, BASE + 0x1000 + 12
    big = torch.Tensor(12, torch.float16, BIG)
    a = cupy.ndarray(6, "float16", A)
    a_big = cupy.ndarray(12, "float16", A_BIG)
    mine = torch.Tensor(6, torch.float16, MINE)  # rank 1's piece of big
    empty = torch.Tensor(0, torch.bfloat16, 0)
    mscclpp.all_reduce(t, _OtherReduceOp.MAX, comm=c1)  # Python resolves the other enum's member once
    AR, AG, RS, BC = collectives._NAMES
    # (the call, what the library gets): rank 1, fp16 (6), torch's stream of GPU 0 (0x5000), cupy's 0x6000.
    cases: List[Tuple[Callable[[], Any], tuple]] = [
        (lambda: mscclpp.all_reduce(t, comm=c1), (AR, BASE, BASE, 6, F16, 0, h1, 0x5000)),
        (lambda: mscclpp.all_reduce(t, "MAX", comm=c1, out=t), (AR, BASE, BASE, 6, F16, 2, h1, 0x5000)),
        (lambda: mscclpp.all_reduce(t, mscclpp.ReduceOp.Avg, comm=c1, out=p), (AR, BASE, P, 6, F16, 4, h1, 0x5000)),
        (lambda: mscclpp.all_reduce(p, 3, comm=c1), (AR, P, P, 6, F16, 3, h1, 0x5000)),
        (lambda: mscclpp.all_reduce(t, _OtherReduceOp.MAX, comm=c1), (AR, BASE, BASE, 6, F16, 2, h1, 0x5000)),
        # torch in, cupy out: cupy's stream
        (lambda: mscclpp.all_reduce(t, "prod", comm=c1, out=a), (AR, BASE, A, 6, F16, 1, h1, 0x6000)),
        (lambda: mscclpp.all_reduce(a, "min", comm=c1), (AR, A, A, 6, F16, 3, h1, 0x6000)),
        (lambda: mscclpp.all_gather(big, t, comm=c1), (AG, BASE, BIG, 6, F16, h1, 0x5000)),
        (lambda: mscclpp.all_gather(big, mine, comm=c1), (AG, MINE, BIG, 6, F16, h1, 0x5000)),  # in place
        (lambda: mscclpp.all_gather(a_big, a, comm=c1), (AG, A, A_BIG, 6, F16, h1, 0x6000)),
        (lambda: mscclpp.reduce_scatter(t, big, "max", comm=c1), (RS, BIG, BASE, 6, F16, 2, h1, 0x5000)),
        (lambda: mscclpp.reduce_scatter(mine, big, comm=c1), (RS, BIG, MINE, 6, F16, 0, h1, 0x5000)),  # in place
        (lambda: mscclpp.reduce_scatter(a, a_big, comm=c1), (RS, A_BIG, A, 6, F16, 0, h1, 0x6000)),
        (lambda: mscclpp.broadcast(t, 1, comm=c1), (BC, BASE, BASE, 6, F16, 1, h1, 0x5000)),
        (lambda: mscclpp.broadcast(t, 0, comm=c1, out=p), (BC, BASE, P, 6, F16, 0, h1, 0x5000)),
        (lambda: mscclpp.broadcast(a, -1, comm=c1), (BC, A, A, 6, F16, -1, h1, 0x6000)),
        # empty: still the library's call (it returns at once)
        (lambda: mscclpp.all_reduce(empty, comm=c1), (AR, 0, 0, 0, BF16, 0, h1, 0x5000)),
    ]
    for call, expected in cases:
        result, calls, made = world.same_both_ways(call)
        assert result[0] == "returned" and made == 1, (expected, result, made)
        assert calls == [expected], (calls, expected)
    # What each returns: the output, in place the tensor itself.
    assert world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=c1))[0][1] is t
    assert world.same_both_ways(lambda: mscclpp.broadcast(t, 0, comm=c1, out=p))[0][1] is p
    assert world.same_both_ways(lambda: mscclpp.all_gather(big, t, comm=c1))[0][1] is big


def _torch_library_loaded() -> bool:
    """Whether a torch library is mapped into this process (a real torch imported by another test: on a
    machine with torch, pytest runs the GPU tests in the same process)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libtorch_cpu" in line for line in maps)
    except OSError:
        return "torch" in sys.modules


def test_without_torchs_c_shim_the_accessors_are_read(world: World) -> None:
    # The stand-in tensors are read through their Python accessors (every call above was made that way). With
    # no torch library in this process the extension finds no aoti_torch_* functions and says so; with one
    # (a real torch imported by another test) it finds the shim, but the stand-ins' type holds no at::Tensor
    # (no _cdata), so nothing is read through it either.
    t = world.torch.Tensor(6, world.torch.float16, BASE)
    result, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=world.comms[1]))
    assert result[0] == "returned" and made == 1 and len(calls) == 1
    state, why, reads, stream_reads = collectives._fastcall.shim_state()
    if _torch_library_loaded():
        assert (state, reads, stream_reads) == (1, 0, 0), (state, why, reads, stream_reads)
    else:
        assert (state, reads, stream_reads) == (0, 0, 0) and "was not found" in why, (state, why, reads)


@needs_fastcall
def test_the_stream_is_the_current_one_of_the_outputs_gpu(world: World) -> None:
    torch, (c0, _) = world.torch, world.comms
    t = torch.Tensor(4, torch.float32, BASE)
    world.torch.streams[0] = 0xABCDEF
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=c0))
    assert made == 1 and calls[0][-1] == 0xABCDEF
    world.torch.streams[0] = 2**64 - 2  # a handle is passed as it is, whatever its bits
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=c0))
    assert made == 1 and calls[0][-1] == 2**64 - 2


@needs_fastcall
def test_an_old_cupy_without_per_device_streams(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _fake_cupy(_fake_numpy(), per_device=False)
    monkeypatch.setitem(sys.modules, "cupy", old)
    monkeypatch.setattr(collectives, "_frameworks", {})
    collectives._resolve(old.ndarray)
    a = old.ndarray(8, "float32", BASE)
    for _ in range(2):  # the first finds out, the second knows
        _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(a, comm=world.comms[0]))
        assert made == 1 and calls[0][-1] == 0x6080, calls


# ---- what the extension leaves to Python ----

@needs_fastcall
def test_every_error_is_pythons_with_the_same_message(world: World) -> None:
    torch, cupy, (c0, c1) = world.torch, world.cupy, world.comms
    T = torch.Tensor
    t = T(8, torch.float32, BASE)
    big = T(16, torch.float32, BASE + 0x1000)
    closed = mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create())
    closed._st.device, closed._st.library_has_gpu = 0, True
    closed.close()
    bad: Dict[str, Callable[[], Any]] = {
        "a CPU tensor": lambda: mscclpp.all_reduce(T(4, torch.float32, BASE, device=None), comm=c0),
        "complex64": lambda: mscclpp.all_reduce(T(4, torch.complex64, BASE), comm=c0),
        "bool": lambda: mscclpp.broadcast(T(4, torch.bool, BASE), 0, comm=c0),
        "not contiguous": lambda: mscclpp.all_reduce(T(4, torch.float32, BASE, contiguous=False), comm=c0),
        "cupy not contiguous": lambda: mscclpp.all_reduce(cupy.ndarray(4, "float32", BASE, contiguous=False), comm=c0),
        "cupy complex": lambda: mscclpp.all_reduce(cupy.ndarray(4, "complex64", BASE), comm=c0),
        "another GPU": lambda: mscclpp.all_reduce(T(4, torch.float32, BASE, device=1), comm=c0),
        "out on another GPU": lambda: mscclpp.all_reduce(t, comm=c0, out=T(8, torch.float32, BASE + 64, device=1)),
        "out of another dtype": lambda: mscclpp.all_reduce(t, comm=c0, out=T(8, torch.float16, BASE + 64)),
        "out of another count": lambda: mscclpp.broadcast(t, 0, comm=c0, out=T(7, torch.float32, BASE + 64)),
        "out overlapping": lambda: mscclpp.all_reduce(t, comm=c0, out=T(8, torch.float32, BASE + 4)),
        "out a CPU tensor": lambda: mscclpp.all_reduce(t, comm=c0, out=T(8, torch.float32, BASE + 64, device=None)),
        "all_gather count": lambda: mscclpp.all_gather(T(15, torch.float32, BASE + 0x1000), t, comm=c1),
        "all_gather dtype": lambda: mscclpp.all_gather(T(16, torch.float16, BASE + 0x1000), t, comm=c1),
        "all_gather piece": lambda: mscclpp.all_gather(big, T(8, torch.float32, BASE + 0x1000), comm=c1),
        "all_gather shifted": lambda: mscclpp.all_gather(big, T(8, torch.float32, BASE + 0x1000 + 36), comm=c1),
        "reduce_scatter count": lambda: mscclpp.reduce_scatter(t, T(17, torch.float32, BASE + 0x1000), comm=c1),
        "reduce_scatter piece": lambda: mscclpp.reduce_scatter(T(8, torch.float32, BASE + 0x1000), big, comm=c1),
        "op mean": lambda: mscclpp.all_reduce(t, "mean", comm=c0),
        "op True": lambda: mscclpp.all_reduce(t, True, comm=c0),
        "op 2.5": lambda: mscclpp.reduce_scatter(t, big, 2.5, comm=c1),
        "op 7": lambda: mscclpp.all_reduce(t, 7, comm=c0),
        "op None": lambda: mscclpp.all_reduce(t, None, comm=c0),
        "op unhashable": lambda: mscclpp.all_reduce(t, ["sum"], comm=c0),
        "root str": lambda: mscclpp.broadcast(t, "0", comm=c0),
        "root too large": lambda: mscclpp.broadcast(t, 2**40, comm=c0),
        "comm type": lambda: mscclpp.all_reduce(t, comm="comm"),
        "comm closed": lambda: mscclpp.all_gather(big, t, comm=closed),
        "a raising data_ptr": lambda: mscclpp.all_reduce(T(8, torch.float32, BASE, fail="data_ptr"), comm=c0),
        "a raising numel of out": lambda: mscclpp.all_reduce(t, comm=c0, out=T(8, torch.float32, BASE + 64,
                                                                               fail="numel")),
    }
    mscclpp.all_reduce(t, _IntReduceOp.PROD, comm=c0)  # remembered in _OTHER_OPS, where True == PROD finds it
    for what, call in bad.items():
        result, calls, made = world.same_both_ways(call)
        assert result[0] == "raised" and not calls and made == 0, (what, result, calls, made)
    # The framework's stream accessor raising (no stream for that GPU): its error.
    c0._st.device = 3
    try:
        result, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(T(4, torch.float32, BASE, device=3),
                                                                              comm=c0))
        assert result[:2] == ("raised", KeyError) and not calls and made == 0, result
    finally:
        c0._st.device = 0


@needs_fastcall
def test_a_failing_library_call_raises_the_same_error(world: World) -> None:
    torch, (c0, c1) = world.torch, world.comms
    t = torch.Tensor(8, torch.float32, BASE)
    world.rec.rc = int(mscclpp.ResultCode.InvalidArgument)
    for call in (lambda: mscclpp.all_reduce(t, comm=c0), lambda: mscclpp.broadcast(t, 1, comm=c1),
                 lambda: mscclpp.all_gather(torch.Tensor(16, torch.float32, BASE + 0x1000), t, comm=c1),
                 lambda: mscclpp.reduce_scatter(t, torch.Tensor(16, torch.float32, BASE + 0x1000), comm=c1)):
        result, calls, made = world.same_both_ways(call)
        assert made == 1 and len(calls) == 1 and result[:2] == ("raised", mscclpp.InvalidArgumentError), result
        assert "failed with mscclppInvalidArgument" in result[2], result


@needs_fastcall
def test_unusual_calls_are_left_to_python(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    torch, (c0, _) = world.torch, world.comms
    t = torch.Tensor(8, torch.float32, BASE)
    # stream= given: Python's (the stream object is Python's to read).
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=c0, stream=77))
    assert made == 0 and calls[0][-1] == 77
    # Spellings only Python parses, ints of other types.
    class Int(int):
        pass

    for op in (" prod ", "Product", Int(2)):
        _, calls, made = world.same_both_ways(lambda op=op: mscclpp.all_reduce(t, op, comm=c0))
        assert len(calls) == 1, op
    # A function of _fns replaced by Python code (as the other tests' recorders): Python calls it.
    seen: List[tuple] = []
    monkeypatch.setitem(collectives._fns, "mscclppAllReduce", lambda *args: seen.append(args) or 0)
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=c0))
    assert made == 0 and len(seen) == 2 and seen[0] == seen[1]
    # Before the library has taken its GPU: Python makes the GPU current for the call (_first_calls).
    monkeypatch.setitem(collectives._fns, "mscclppAllReduce", collectives._fns["mscclppBroadcast"])
    monkeypatch.setattr(_cuda, "current_context", lambda: None)
    c0._st.library_has_gpu = False
    try:
        _, calls, made = world.same_both_ways(lambda: mscclpp.broadcast(t, 0, comm=c0))
        assert made == 0 and len(calls) == 1
    finally:
        c0._st.library_has_gpu = True
    # A type the package does not know as torch's or cupy's: Python's generic path.
    class Cai:
        __cuda_array_interface__ = {"shape": (8,), "typestr": "<f4", "data": (BASE, False), "version": 3}

    cai = Cai()
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(cai, comm=c0))
    assert made == 0 and len(calls) == 1
    # A root that is an int only by __index__ (a bool, here): Python's _int32 takes it.
    _, calls, made = world.same_both_ways(lambda: mscclpp.broadcast(t, True, comm=c0))
    assert made == 0 and calls[0][5] == 1


@needs_fastcall
def test_turned_off_and_missing_functions(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    torch, (c0, _) = world.torch, world.comms
    t = torch.Tensor(8, torch.float32, BASE)
    monkeypatch.delitem(collectives._fns, "mscclppAllGather")
    for on in (True, False):
        collectives._use_fastcall(on)
        with pytest.raises(NotImplementedError, match="does not export mscclppAllGather"):
            mscclpp.all_gather(torch.Tensor(16, torch.float32, BASE + 0x1000), t, comm=c0)
    assert "turned off" in collectives._fastcall_state()
    collectives._use_fastcall(True)
    assert "in use" in collectives._fastcall_state()


@needs_fastcall
def test_the_gil_is_released_during_the_library_call(world: World) -> None:
    """The library may block (a peer's first call, a full queue): other Python threads must run meanwhile,
    as they do around ctypes' calls. libc's usleep stands for the library: it takes the first argument, the
    send pointer, as microseconds (x86-64 and AArch64 pass the other arguments in registers it ignores)."""
    usleep = ctypes.CDLL(None).usleep
    collectives._fns["mscclppAllReduce"] = collectives._bind_at("mscclppAllReduce",
                                                               ctypes.cast(usleep, ctypes.c_void_p).value)
    collectives._fast_configure()
    t = world.torch.Tensor(4, world.torch.float32, 300_000)  # 0.3 s
    ticks: List[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        time.sleep(0.02)
        before = collectives._fastcall.stats()[0]
        t0 = time.monotonic()
        assert mscclpp.all_reduce(t, comm=world.comms[0]) is t
        t1 = time.monotonic()
        assert collectives._fastcall.stats()[0] == before + 1, "the extension made the call"
    finally:
        stop.set()
        th.join()
    during = [x for x in ticks if t0 + 0.05 < x < t1 - 0.05]
    assert t1 - t0 >= 0.25 and len(during) >= 5, (t1 - t0, len(during))


@needs_fastcall
def test_an_accessor_that_reconfigures_the_extension_mid_call(world: World) -> None:
    """A buffer's accessor may run Python code, which may start the extension afresh (a reload, another
    thread): the call in progress goes on with what it holds, and later calls are Python's until the
    extension is configured again."""
    torch, (c0, _) = world.torch, world.comms

    class Odd(torch.Tensor):
        def numel(self) -> int:
            collectives._fastcall.configure(collectives._fns, collectives._OPS, collectives._OTHER_OPS,
                                            mscclpp.ReduceOp, mscclpp.Communicator, collectives._ITEMSIZE,
                                            collectives._tlog, mscclpp._log.failure)
            return super().numel()

    collectives._resolve(Odd)
    x = Odd(8, torch.float32, BASE)
    before = collectives._fastcall.stats()[0]
    assert mscclpp.all_reduce(x, comm=c0) is x
    assert collectives._fastcall.stats()[0] == before + 1 and len(world.rec.calls) == 1
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(x, comm=c0))
    assert made == 0 and len(calls) == 1, "the extension knows no function now"
    collectives._fast_configure()
    t = torch.Tensor(8, torch.float32, BASE)
    _, calls, made = world.same_both_ways(lambda: mscclpp.all_reduce(t, comm=c0))
    assert made == 1 and len(calls) == 1, "configured again: the types in _adapters, the functions in _fns"


@needs_fastcall
def test_the_librarys_own_error_carries_its_log_line(world: World) -> None:
    """The real mscclppBroadcast, called by the extension: it refuses a root out of range before it needs
    a GPU, and logs why; the exception carries that line, as from the Python path."""
    collectives._fns["mscclppBroadcast"] = collectives._bind("mscclppBroadcast")
    collectives._fast_configure()
    t = world.torch.Tensor(4, world.torch.float32, BASE)
    (fast, _, made), (slow, _, _) = world.both_ways(lambda: mscclpp.broadcast(t, 2, comm=world.comms[0]))
    assert made == 1 and fast == slow, (fast, slow)
    assert fast[1] is mscclpp.InvalidArgumentError and "root is 2; it must be in [0, nranks = 2)" in fast[2], fast
    with pytest.raises(mscclpp.InvalidArgumentError) as info:
        mscclpp.broadcast(t, 3, comm=world.comms[0])
    assert info.value.function == "mscclppBroadcast" and len(info.value.log_lines) == 1, info.value.log_lines
    assert "root is 3;" in info.value.log_lines[0]


# ---- the public functions are the extension's builtins ----

def _unannotated(f: Callable[..., Any]) -> Any:
    import inspect

    sig = inspect.signature(f)
    return sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                       return_annotation=sig.empty)


@needs_fastcall
def test_the_public_functions_are_builtins_with_the_python_signatures() -> None:
    import inspect

    for name, python in collectives._PYTHON_FUNCTIONS.items():
        f = getattr(mscclpp, name)
        assert f is getattr(collectives, name) and type(f).__name__ == "builtin_function_or_method", f
        assert f.__name__ == f.__qualname__ == name and f.__module__ == "mscclpp.collectives", f
        assert inspect.signature(f) == _unannotated(python), (inspect.signature(f), _unannotated(python))
        assert f.__doc__ == python.__doc__
        assert python.__name__ == name and python.__module__ == "mscclpp.collectives"


def test_the_python_functions_are_public_without_the_extension() -> None:
    """MSCCLPP_PYTHON_FASTCALL=0: the public functions are collectives.py's own."""
    import subprocess

    env = dict(os.environ, MSCCLPP_PYTHON_FASTCALL="0",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(mscclpp.__file__))] +
                                          [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    code = ("import types, mscclpp; from mscclpp import collectives as c\n"
            "assert c._fastcall is None and not c._use_fastcall(True), c._fastcall_state()\n"
            "for n, f in c._PYTHON_FUNCTIONS.items():\n"
            "    assert getattr(mscclpp, n) is f and isinstance(f, types.FunctionType), n\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.stdout, r.stderr)


def test_a_bad_switch_value_warns_and_keeps_the_default() -> None:
    """MSCCLPP_PYTHON_FASTCALL neither 0 nor 1: a warning naming it and the value; the default (on) kept."""
    import subprocess

    env = dict(os.environ, MSCCLPP_PYTHON_FASTCALL="yes",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(mscclpp.__file__))] +
                                          [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    code = "from mscclpp import collectives as c\nprint(c._fastcall_state())\n"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "MSCCLPP_PYTHON_FASTCALL='yes' is neither 0 nor 1" in r.stderr
    assert "turned off" not in r.stdout


@needs_fastcall
def test_arguments_are_bound_as_python_binds_them(world: World) -> None:
    """Every spelling the Python function takes is made by the extension; every one it refuses is handed to
    it (nothing called), and it raises its own TypeError, the same as the Python function called itself."""
    torch, (c0, c1) = world.torch, world.comms
    t = torch.Tensor(8, torch.float32, BASE)
    o = torch.Tensor(8, torch.float32, BASE + 0x100)
    big = torch.Tensor(16, torch.float32, BASE + 0x1000)
    comm = "".join(["co", "mm"])  # a keyword that is not the interned string: compared by value
    made_here: Dict[str, Callable[[], Any]] = {
        "by keyword": lambda: mscclpp.all_reduce(tensor=t, op="max", comm=c0, out=o),
        "keywords in another order": lambda: mscclpp.all_reduce(out=o, comm=c0, tensor=t),
        "stream=None": lambda: mscclpp.all_reduce(t, comm=c0, stream=None),
        "out=None": lambda: mscclpp.broadcast(t, 1, comm=c1, out=None),
        "root by keyword": lambda: mscclpp.broadcast(t, root=0, comm=c0),
        "all_gather by keyword": lambda: mscclpp.all_gather(inp=t, out=big, comm=c1),
        "reduce_scatter op positional": lambda: mscclpp.reduce_scatter(t, big, "min", comm=c1),
        "reduce_scatter by keyword": lambda: mscclpp.reduce_scatter(inp=big, out=t, op="avg", comm=c1),
        "a keyword built at run time": lambda: mscclpp.all_reduce(t, **{comm: c0}),
    }
    for what, call in made_here.items():
        result, calls, made = world.same_both_ways(call)
        assert result[0] == "returned" and made == 1 and len(calls) == 1, (what, result, made)
    refused: Dict[str, Tuple[str, tuple, Dict[str, Any]]] = {  # (function, positional, keywords)
        "nothing": ("all_reduce", (), {}),
        "no comm": ("all_reduce", (t,), {}),
        "comm positional": ("all_reduce", (t, "sum", c0), {}),
        "unknown keyword": ("all_reduce", (t,), {"comm": c0, "outt": o}),
        "tensor twice": ("all_reduce", (t,), {"tensor": t, "comm": c0}),
        "op twice": ("reduce_scatter", (t, big, "sum"), {"op": "sum", "comm": c1}),
        "no root": ("broadcast", (t,), {"comm": c0}),
        "all_gather no inp": ("all_gather", (big,), {"comm": c1}),
        "all_gather out=": ("all_gather", (big, t), {"comm": c1, "out": big}),
        "all_gather op": ("all_gather", (big, t, "sum"), {"comm": c1}),
        "reduce_scatter too many": ("reduce_scatter", (t, big, "sum", c1), {}),
        "broadcast stream positional": ("broadcast", (t, 0, c0), {}),
    }
    for what, (name, args, kwargs) in refused.items():
        f = getattr(mscclpp, name)
        result, calls, made = world.same_both_ways(lambda: f(*args, **kwargs))
        assert result[:2] == ("raised", TypeError) and not calls and made == 0, (what, result, made)
        with pytest.raises(TypeError) as python:  # the Python function called itself: the same message
            collectives._PYTHON_FUNCTIONS[name](*args, **kwargs)
        assert result[2] == str(python.value), (what, result, python.value)
    # stream= given: the Python function, which makes the call on that stream.
    before = collectives._fastcall.stats()
    assert mscclpp.all_reduce(t, comm=c0, stream=0x77) is t
    after = collectives._fastcall.stats()
    assert after[0] == before[0] and after[1] == before[1] + 1 and world.rec.calls[-1][-1] == 0x77


@needs_fastcall
def test_a_cupy_with_its_direct_attributes(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """cupy's arrays have _c_contiguous (what flags.c_contiguous reads) and data.device_id (what device.id
    reads), which the extension reads instead of making a Flags and a Device object per call."""
    np = _fake_numpy()
    cupy = _fake_cupy(np)
    plain = cupy.ndarray

    class ndarray(plain):  # type: ignore[misc,valid-type] # noqa: N801
        def __init__(self, n: int, dt: str, ptr: int, device: int = 0, contiguous: bool = True) -> None:
            self.size, self.dtype = n, np.dtype(dt)
            self.data = types.SimpleNamespace(ptr=ptr, device_id=device)
            self._device = types.SimpleNamespace(id=device)
            self._flags = types.SimpleNamespace(c_contiguous=contiguous)
            self._c_contiguous = contiguous
            self.shape, self.strides = (n,), (4,) if contiguous else (8,)
            self.reads = 0

        @property
        def flags(self) -> Any:  # cupy makes a Flags object per read
            self.reads += 1
            return self._flags

        @property
        def device(self) -> Any:  # cupy makes a Device object per read
            self.reads += 1
            return self._device

    cupy.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(collectives, "_frameworks", {})
    collectives._resolve(ndarray)
    c0 = world.comms[0]
    a, b = ndarray(8, "float32", BASE), ndarray(8, "float32", BASE + 0x100)
    for call in (lambda: mscclpp.all_reduce(a, comm=c0), lambda: mscclpp.all_reduce(a, comm=c0, out=b)):
        result, calls, made = world.same_both_ways(call)
        assert result[0] == "returned" and made == 1 and len(calls) == 1, result
    a.reads = b.reads = 0
    mscclpp.all_reduce(a, comm=c0, out=b)
    assert a.reads == b.reads == 0, "the extension read neither flags nor device"
    for bad in (ndarray(8, "float32", BASE, contiguous=False), ndarray(8, "float32", BASE, device=1)):
        result, calls, made = world.same_both_ways(lambda bad=bad: mscclpp.all_reduce(bad, comm=c0))
        assert result[0] == "raised" and made == 0 and not calls, result


def test_the_communicators_state_for_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """_CommState._fast: (handle, device, size, rank) while the library holds the GPU of an open
    communicator, else None; every change of those attributes makes it again."""
    # Made with no GPU current, also on a machine with one (an earlier test may have left a context current).
    monkeypatch.setattr(_cuda, "current_device", lambda: None)
    comm = mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create())
    st = comm._st
    try:
        h = st._handle
        assert st._fast is None and not st.library_has_gpu  # no GPU current
        st.device, st.library_has_gpu = 0, True
        assert st._fast == (h, 0, 1, 0)
        st.device = 2
        assert st._fast == (h, 2, 1, 0)
        st.library_has_gpu = False
        assert st._fast is None
        st.library_has_gpu = True
        comm.close()
        assert st._fast is None
    finally:
        comm.close()
