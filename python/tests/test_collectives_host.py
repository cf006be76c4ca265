"""The collectives' Python side on any machine (no GPU needed): the element type from every protocol, the
operator spellings, shape, type and placement checks (which raise before the library is called), the
library's own argument errors with their log lines, an aborted or closed communicator, and, on a machine
without a GPU, the clean CudaError of a call that reaches the GPU.

Buffers here are objects that describe made-up device memory through ``__cuda_array_interface__`` or
DLPack; nothing is ever read from them: every call either fails its checks or stops at the GPU."""

from __future__ import annotations

import contextlib
import ctypes
import enum
import re
import threading
from typing import Any, Dict, List

import pytest

import mscclpp
from _ranks import run_rank_threads
from mscclpp import _cuda, buffers, collectives

BASE = 0x7000_0000  # made-up device addresses: no call here gets as far as touching them

# What a call that passes every check of the package and the library ends with: on a machine without a
# driver the library's CudaError; with one, the made-up address is not device memory.
REACHES_GPU = mscclpp.InvalidArgumentError if _cuda.available() else mscclpp.CudaError


class Cai:
    """A contiguous array of ``n`` elements of ``typestr`` at ``ptr``, by __cuda_array_interface__."""

    def __init__(self, n: int, typestr: str = "<f4", ptr: int = BASE, strides: Any = None, stream: Any = None):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (ptr, False), "version": 3,
                                         "strides": strides}
        if stream is not None:
            self.__cuda_array_interface__["stream"] = stream
        self.n, self.ptr, self.itemsize = n, ptr, int(typestr[2:])

    def piece(self, r: int, n: int) -> "Cai":
        """Elements [r * n, (r + 1) * n) of this array, as a view would give them."""
        return Cai(n, self.__cuda_array_interface__["typestr"], self.ptr + r * n * self.itemsize)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", buffers._DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_CAPSULE_NAME = ctypes.create_string_buffer(b"dltensor")  # the capsule keeps the pointer: it must outlive it


class DLPack:
    """A DLPack producer of ``n`` elements of DLPack type (code, bits) on CUDA device ``device`` (or on the CPU
    with ``device_type=1``); the capsule has no destructor (the structs live as long as this object)."""

    def __init__(self, n: int, code: int, bits: int, device: int = 0, device_type: int = 2, lanes: int = 1):
        self._shape = (ctypes.c_int64 * 1)(n)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = BASE
        t.device.device_type, t.device.device_id = device_type, device
        t.ndim = 1
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        self._device = (device_type, device)

    def __dlpack_device__(self) -> tuple:
        return self._device

    def __dlpack__(self, stream: Any = None) -> Any:
        return _capsule_new(ctypes.addressof(self._managed), ctypes.cast(_CAPSULE_NAME, ctypes.c_char_p), None)


@pytest.fixture(scope="module")
def comms() -> Any:
    """Two ranks of one job, made in two threads; the tests call them from the main thread."""
    uid = mscclpp.UniqueId.create()
    made: Dict[int, Any] = {}

    def join(rank: int) -> None:
        try:
            made[rank] = mscclpp.Communicator(2, rank, unique_id=uid)
        except BaseException as e:  # noqa: BLE001
            made[rank] = e

    threads = run_rank_threads(2, join)
    assert not any(t.is_alive() for t in threads)
    for c in made.values():
        if isinstance(c, BaseException):
            raise c
    yield made[0], made[1]
    for c in made.values():
        c.close()


@pytest.fixture()
def solo() -> Any:
    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
        yield comm


# ---- what the package exports ----

def _header_enum(name: str) -> Dict[str, int]:
    """The members of the C enum ``name`` in the header the package ships, without the prefix."""
    text = (mscclpp.include_dir() + "/mscclpp.h")
    with open(text) as f:
        header = f.read()
    body = re.search(r"typedef enum \{([^}]*)\} " + name + ";", header)
    assert body, f"{name} not in the header"
    return {m: int(v) for m, v in re.findall(r"mscclpp(\w+) = (-?\d+)", body.group(1))}


def test_enums_match_the_header() -> None:
    assert mscclpp.has_collectives()
    assert {t.name: int(t) for t in mscclpp.DataType} == _header_enum("mscclppDataType_t")
    assert {o.name: int(o) for o in mscclpp.ReduceOp} == _header_enum("mscclppRedOp_t")
    assert [t.itemsize for t in mscclpp.DataType] == [1, 1, 4, 4, 8, 8, 2, 4, 8, 2]
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "ReduceOp", "DataType"):
        assert name in mscclpp.__all__ and getattr(mscclpp, name) is getattr(collectives, name)


# ---- the operator ----

class _TorchLikeReduceOp(enum.Enum):
    """Stands for torch.distributed.ReduceOp, whose members are matched by name."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
    BAND = 4
    AVG = 7
    PREMUL_SUM = 8


@pytest.mark.parametrize("op, code", [
    ("sum", 0), ("SUM", 0), ("Sum", 0), (" prod ", 1), ("product", 1), ("max", 2), ("min", 3), ("avg", 4),
    ("AVG", 4), (mscclpp.ReduceOp.Prod, 1), (mscclpp.ReduceOp.Avg, 4), (3, 3),
    (_TorchLikeReduceOp.SUM, 0), (_TorchLikeReduceOp.PRODUCT, 1), (_TorchLikeReduceOp.MIN, 3),
    (_TorchLikeReduceOp.MAX, 2), (_TorchLikeReduceOp.AVG, 4),
])
def test_operator_spellings(op: Any, code: int) -> None:
    assert collectives._op(op) == code
    assert collectives._op(op) == code, "the second lookup (cached for other enums) agrees"


@pytest.mark.parametrize("op, error, needle", [
    ("mean", ValueError, "'mean' is not one of"),
    ("", ValueError, "is not one of"),
    (5, ValueError, "op is 5"),
    (-1, ValueError, "op is -1"),
    (True, TypeError, "not a bool"),
    (None, TypeError, "not NoneType"),
    (1.0, TypeError, "not float"),
    (_TorchLikeReduceOp.BAND, ValueError, "no mscclpp counterpart"),
    (_TorchLikeReduceOp.PREMUL_SUM, ValueError, "no mscclpp counterpart"),
])
def test_bad_operators_raise_before_the_library(solo: Any, op: Any, error: type, needle: str) -> None:
    with pytest.raises(error, match=re.escape(needle)):
        mscclpp.all_reduce(Cai(4), op, comm=solo)
    with pytest.raises(error, match=re.escape(needle)):
        mscclpp.reduce_scatter(Cai(4), Cai(4, ptr=BASE + 4096), op, comm=solo)


# ---- the element type ----

@pytest.mark.parametrize("typestr, dtype", [
    ("|i1", mscclpp.DataType.Int8), ("|u1", mscclpp.DataType.Uint8), ("<i4", mscclpp.DataType.Int32),
    ("<u4", mscclpp.DataType.Uint32), ("<i8", mscclpp.DataType.Int64), ("<u8", mscclpp.DataType.Uint64),
    ("<f2", mscclpp.DataType.Float16), ("<f4", mscclpp.DataType.Float32), ("<f8", mscclpp.DataType.Float64),
    ("=f4", mscclpp.DataType.Float32),
])
def test_element_type_from_the_array_interface(typestr: str, dtype: mscclpp.DataType) -> None:
    _, (ptr, n, code, device) = collectives._info(Cai(10, typestr), "tensor")
    assert (ptr, n, code) == (BASE, 10, dtype)


@pytest.mark.parametrize("code, bits, dtype", [
    (0, 8, mscclpp.DataType.Int8), (1, 8, mscclpp.DataType.Uint8), (0, 32, mscclpp.DataType.Int32),
    (1, 64, mscclpp.DataType.Uint64), (2, 16, mscclpp.DataType.Float16), (2, 64, mscclpp.DataType.Float64),
    (4, 16, mscclpp.DataType.Bfloat16),
])
def test_element_type_and_device_from_dlpack(code: int, bits: int, dtype: mscclpp.DataType) -> None:
    _, (ptr, n, got, device) = collectives._info(DLPack(6, code, bits, device=3), "tensor")
    assert (ptr, n, got, device) == (BASE, 6, dtype, 3)


@pytest.mark.parametrize("make, error, needle", [
    (lambda: Cai(4, "<c8"), TypeError, "dtype complex64, which the collectives do not take"),
    (lambda: Cai(4, "|b1"), TypeError, "dtype bool"),
    (lambda: Cai(4, ">f4"), TypeError, "no element type the collectives know"),
    (lambda: Cai(4, "|V2"), TypeError, "no element type the collectives know"),
    (lambda: DLPack(4, 2, 16, lanes=2), TypeError, "no element type the collectives know"),
    (lambda: DLPack(4, 5, 64), TypeError, "dtype complex64"),
    (lambda: DLPack(4, 2, 32, device_type=1), TypeError, "CPU memory"),
    (lambda: (BASE, 64), TypeError, "no element type the collectives know"),
    (lambda: mscclpp.DeviceBuffer(BASE, 64, None), TypeError, "no element type the collectives know"),
    (lambda: object(), TypeError, "is not a GPU buffer"),
    (lambda: b"host bytes", TypeError, "is not a GPU buffer"),
    (lambda: Cai(4, strides=(8,)), ValueError, "not contiguous"),
])
def test_what_is_not_a_typed_gpu_array_is_refused(solo: Any, make: Any, error: type, needle: str) -> None:
    for call in (lambda: mscclpp.all_reduce(make(), comm=solo),
                 lambda: mscclpp.broadcast(make(), 0, comm=solo),
                 lambda: mscclpp.all_reduce(Cai(4), comm=solo, out=make()),
                 lambda: mscclpp.all_gather(make(), Cai(4), comm=solo)):
        with pytest.raises(error, match=re.escape(needle)):
            call()


def test_torch_tensors_on_the_cpu_and_of_other_types_are_refused(solo: Any) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="torch tensor on cpu; the collectives need CUDA tensors"):
        mscclpp.all_reduce(torch.zeros(4), comm=solo)
    if not torch.cuda.is_available():
        pytest.skip("the rest needs a CUDA tensor")
    with pytest.raises(TypeError, match="torch.complex64"):
        mscclpp.all_reduce(torch.zeros(4, dtype=torch.complex64, device="cuda"), comm=solo)
    with pytest.raises(TypeError, match="torch.bool"):
        mscclpp.all_reduce(torch.zeros(4, dtype=torch.bool, device="cuda"), comm=solo)
    with pytest.raises(ValueError, match="not contiguous"):
        mscclpp.all_reduce(torch.zeros(4, 4, device="cuda").t(), comm=solo)


# ---- shapes, types and placement (two ranks) ----

def test_mismatched_shapes_and_types_raise_before_the_library(comms: Any) -> None:
    c0, c1 = comms
    f4 = Cai(8)
    cases = {
        "all_reduce count": (lambda: mscclpp.all_reduce(f4, comm=c0, out=Cai(7, ptr=BASE + 4096)), ValueError,
                             "out has 7 elements and tensor 8"),
        "all_reduce dtype": (lambda: mscclpp.all_reduce(f4, comm=c0, out=Cai(8, "<i4", BASE + 4096)), TypeError,
                             "tensor and out differ in element type (Float32 and Int32)"),
        "all_gather count": (lambda: mscclpp.all_gather(Cai(15, ptr=BASE + 4096), f4, comm=c0), ValueError,
                             "out has 15 elements; an all-gather of 8 elements per rank over 2 ranks needs 16"),
        "all_gather dtype": (lambda: mscclpp.all_gather(Cai(16, "<f2", BASE + 4096), f4, comm=c0), TypeError,
                             "inp and out differ in element type"),
        "reduce_scatter count": (lambda: mscclpp.reduce_scatter(Cai(4, ptr=BASE + 4096), Cai(9), comm=c0),
                                 ValueError, "inp has 9 elements; a reduce-scatter of 4 elements per rank over 2 "
                                 "ranks needs 8"),
        "reduce_scatter dtype": (lambda: mscclpp.reduce_scatter(Cai(4, "<f8", BASE + 4096), f4, comm=c0),
                                 TypeError, "inp and out differ in element type (Float32 and Float64)"),
        "broadcast count": (lambda: mscclpp.broadcast(f4, 0, comm=c0, out=Cai(9, ptr=BASE + 4096)), ValueError,
                            "out has 9 elements and tensor 8"),
        "devices": (lambda: mscclpp.all_gather(DLPack(16, 2, 32, device=1), DLPack(8, 2, 32, device=0), comm=c0),
                    ValueError, "inp and out are on different GPUs (0 and 1)"),
        "root type": (lambda: mscclpp.broadcast(f4, "0", comm=c0), TypeError, "root must be an int"),
        "root range": (lambda: mscclpp.broadcast(f4, 2**40, comm=c0), ValueError, "outside the C int range"),
        "stream type": (lambda: mscclpp.all_reduce(f4, comm=c0, stream="s"), TypeError, "is not a CUDA stream"),
        "comm type": (lambda: mscclpp.all_reduce(f4, comm="comm"), TypeError, "comm must be a mscclpp.Communicator"),
    }
    for name, (call, error, needle) in cases.items():
        with pytest.raises(error) as info:
            call()
        assert needle in str(info.value), f"{name}: {info.value}"
        assert not isinstance(info.value, mscclpp.MscclppError), f"{name}: raised by the library: {info.value}"


def test_comm_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        mscclpp.all_reduce(Cai(4), "sum", None)  # type: ignore[misc]


def test_partly_overlapping_buffers_are_refused_and_in_place_forms_pass(comms: Any) -> None:
    c0, c1 = comms
    n = 8
    out = Cai(2 * n)  # all-gather output; rank r's piece at out.piece(r, n)
    overlap = "overlaps the output but is not where an in-place call has it"
    for comm, rank in ((c0, 0), (c1, 1)):
        # The in-place forms reach the library (and stop at the GPU).
        with pytest.raises(REACHES_GPU):
            mscclpp.all_gather(out, out.piece(rank, n), comm=comm)
        with pytest.raises(REACHES_GPU):
            mscclpp.reduce_scatter(out.piece(rank, n), out, comm=comm)
        # The other rank's piece, or a piece shifted by one element, is refused.
        for wrong in (out.piece(1 - rank, n), Cai(n, ptr=out.ptr + rank * n * 4 + 4)):
            with pytest.raises(ValueError, match=overlap):
                mscclpp.all_gather(out, wrong, comm=comm)
            with pytest.raises(ValueError, match=overlap):
                mscclpp.reduce_scatter(wrong, out, comm=comm)
    with pytest.raises(ValueError, match=overlap):
        mscclpp.all_reduce(Cai(n), comm=c0, out=Cai(n, ptr=BASE + 4))
    with pytest.raises(ValueError, match=overlap):
        mscclpp.broadcast(Cai(n), 1, comm=c0, out=Cai(n, ptr=BASE - 4))
    # In place by passing the same array, or an array of the same memory, or disjoint arrays: all fine.
    for call in (lambda: mscclpp.all_reduce(Cai(n), comm=c0, out=Cai(n)),
                 lambda: mscclpp.all_reduce(Cai(n), comm=c0, out=Cai(n, ptr=BASE + 4 * n)),
                 lambda: mscclpp.broadcast(Cai(n), 0, comm=c0, out=Cai(n, ptr=BASE - 4 * n))):
        with pytest.raises(REACHES_GPU):
            call()


# ---- what the library says ----

def test_a_root_out_of_range_is_the_library_line(comms: Any) -> None:
    c0, _ = comms
    with pytest.raises(mscclpp.InvalidArgumentError) as info:
        mscclpp.broadcast(Cai(4), 2, comm=c0)
    e = info.value
    assert e.function == "mscclppBroadcast" and isinstance(e, ValueError)
    assert "root is 2; it must be in [0, nranks = 2)" in str(e)
    assert e.log_lines and e.log_lines[-1].startswith("MSCCLPP WARN")


def test_empty_calls_do_nothing_and_need_no_gpu(comms: Any) -> None:
    c0, c1 = comms
    empty = Cai(0, ptr=0)
    assert mscclpp.all_reduce(empty, "max", comm=c0) is empty
    assert mscclpp.all_gather(empty, Cai(0, ptr=0), comm=c1) is empty
    assert mscclpp.reduce_scatter(empty, Cai(0, ptr=0), comm=c0) is empty
    assert mscclpp.broadcast(empty, 1, comm=c1) is empty
    out = Cai(0, ptr=0)
    assert mscclpp.all_reduce(empty, comm=c0, out=out) is out


def test_a_closed_communicator_says_so() -> None:
    comm = mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create())
    comm.close()
    for call in (lambda: mscclpp.all_reduce(Cai(4), comm=comm),
                 lambda: mscclpp.all_gather(Cai(4), Cai(4), comm=comm),
                 lambda: mscclpp.reduce_scatter(Cai(4), Cai(4), comm=comm),
                 lambda: mscclpp.broadcast(Cai(4), 0, comm=comm)):
        with pytest.raises(mscclpp.InvalidUsageError, match="closed"):
            call()


@pytest.mark.skipif(not mscclpp.has_abort(), reason="this libmscclpp has no mscclppCommAbort")
def test_an_aborted_communicator_gives_its_error() -> None:
    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
        comm.abort()
        for call in (lambda: mscclpp.all_reduce(Cai(4), comm=comm),
                     lambda: mscclpp.all_gather(Cai(4, ptr=BASE + 64), Cai(4), comm=comm),
                     lambda: mscclpp.reduce_scatter(Cai(4, ptr=BASE + 64), Cai(4), comm=comm),
                     lambda: mscclpp.broadcast(Cai(4), 0, comm=comm)):
            with pytest.raises(mscclpp.InvalidUsageError) as info:
                call()
            assert info.value.function.startswith("mscclpp") and info.value.log_lines, info.value


@pytest.mark.skipif(_cuda.available(), reason="checks the answer of a machine without a CUDA driver")
def test_without_a_driver_every_collective_fails_cleanly_and_the_job_goes_on() -> None:
    uid = mscclpp.UniqueId.create()
    seen: Dict[int, List[Any]] = {}

    def rank_main(rank: int) -> None:
        errors: List[Any] = []
        try:
            with mscclpp.Communicator(2, rank, unique_id=uid) as comm:
                comm.barrier()
                x, out = Cai(1024), Cai(2048, ptr=BASE + (1 << 20))
                calls = [
                    lambda: mscclpp.all_reduce(x, "sum", comm=comm),
                    lambda: mscclpp.all_reduce(x, mscclpp.ReduceOp.Avg, comm=comm, out=out.piece(0, 1024), stream=0),
                    lambda: mscclpp.all_gather(out, x, comm=comm),
                    lambda: mscclpp.all_gather(out, out.piece(rank, 1024), comm=comm),
                    lambda: mscclpp.reduce_scatter(x.piece(rank, 512), x, "max", comm=comm),
                    lambda: mscclpp.broadcast(x, 1, comm=comm),
                    lambda: mscclpp.broadcast(Cai(7, "<f2"), 0, comm=comm, out=Cai(7, "<f2", BASE + 64), stream=2),
                ]
                for call in calls:
                    try:
                        call()
                        errors.append(None)
                    except Exception as e:  # noqa: BLE001
                        errors.append(e)
                # Nothing was set up halfway: the bootstrap still works for both.
                errors.append(comm.all_gather_object(rank))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        seen[rank] = errors

    threads = run_rank_threads(2, rank_main)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    functions = (["mscclppAllReduce"] * 2 + ["mscclppAllGather"] * 2 + ["mscclppReduceScatter"]
                 + ["mscclppBroadcast"] * 2)
    for rank in range(2):
        *errors, gathered = seen[rank]
        assert gathered == [0, 1], seen[rank]
        for e, function in zip(errors, functions):
            assert isinstance(e, mscclpp.CudaError), e
            assert e.function == function and "CUDA driver" in str(e), e
            assert e.log_lines and function in e.log_lines[-1], e.log_lines


def test_the_stream_of_the_array_interface_is_used_by_default() -> None:
    assert collectives._GENERIC.stream(Cai(4, stream=1234), None) == 1234
    assert collectives._GENERIC.stream(Cai(4), None) == 0
    assert collectives._GENERIC.stream(DLPack(4, 2, 32), 0) == 0


def test_calls_from_many_threads_keep_their_own_log_lines(solo: Any) -> None:
    """Each failure carries its own call's line, not another thread's (the capture is per thread)."""
    results: Dict[int, Any] = {}

    def worker(i: int) -> None:
        try:
            mscclpp.broadcast(Cai(4), 10 + i, comm=solo)
        except mscclpp.InvalidArgumentError as e:
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == list(range(8))
    for i, e in results.items():
        assert len(e.log_lines) == 1 and f"root is {10 + i};" in e.log_lines[0], e.log_lines


# ---- what reaches the C functions (recorded instead of called) ----

@pytest.fixture()
def recorded(monkeypatch: pytest.MonkeyPatch) -> Dict[str, List[tuple]]:
    """Replaces the four C functions by recorders of their arguments."""
    calls: Dict[str, List[tuple]] = {}
    for name in collectives._NAMES:
        calls[name] = []
        monkeypatch.setitem(collectives._fns, name, lambda *args, _name=name: calls[_name].append(args))
    return calls


def test_the_arguments_each_collective_passes(comms: Any, recorded: Dict[str, List[tuple]]) -> None:
    c0, c1 = comms
    h1 = c1._st._handle
    x = Cai(6, "<f2", stream=77)
    out = Cai(12, "<f2", ptr=BASE + 4096)
    assert mscclpp.all_reduce(x, "max", comm=c1) is x
    assert mscclpp.all_reduce(x, mscclpp.ReduceOp.Avg, comm=c1, out=out.piece(0, 6), stream=5) is not x
    assert mscclpp.all_gather(out, x, comm=c1) is out
    assert mscclpp.all_gather(out, out.piece(1, 6), comm=c1) is out
    assert mscclpp.reduce_scatter(x, out, "prod", comm=c1) is x
    assert mscclpp.reduce_scatter(out.piece(1, 6), out, comm=c1, stream=9).ptr == BASE + 4096 + 12
    assert mscclpp.broadcast(x, 1, comm=c1) is x
    assert mscclpp.broadcast(x, 0, comm=c1, out=out.piece(1, 6)).ptr == BASE + 4096 + 12
    f16 = int(mscclpp.DataType.Float16)
    # The stream: the array interface's (77), stream= (5, 9), or the output's interface's (none: 0).
    assert recorded["mscclppAllReduce"] == [(BASE, BASE, 6, f16, 2, h1, 77), (BASE, BASE + 4096, 6, f16, 4, h1, 5)]
    assert recorded["mscclppAllGather"] == [(BASE, BASE + 4096, 6, f16, h1, 0),
                                            (BASE + 4096 + 12, BASE + 4096, 6, f16, h1, 0)]
    assert recorded["mscclppReduceScatter"] == [(BASE + 4096, BASE, 6, f16, 1, h1, 77),
                                                (BASE + 4096, BASE + 4096 + 12, 6, f16, 0, h1, 9)]
    assert recorded["mscclppBroadcast"] == [(BASE, BASE, 6, f16, 1, h1, 77), (BASE, BASE + 4096 + 12, 6, f16, 0, h1, 0)]


def test_the_gpu_is_made_current_only_until_the_library_has_taken_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A communicator made with no GPU current: its calls run with its GPU's context pushed (or checked
    current) until one call with data has succeeded; then the library, which makes its context current
    itself, is called directly, without asking the driver. An empty call does not count."""
    events: List[str] = []
    ctx = 0xC0C0

    @contextlib.contextmanager
    def pushed(device: Any) -> Any:
        events.append(f"push {device}")
        yield

    monkeypatch.setattr(_cuda, "device_context", pushed)
    monkeypatch.setattr(_cuda, "current_context", lambda: events.append("asked") or 0x1234)
    # No GPU current when the communicator is made, also on a machine with one (an earlier test of the
    # session may have left its context current on this thread).
    monkeypatch.setattr(_cuda, "current_device", lambda: None)
    results = iter([0, 4, 0, 0])  # an empty call, a failing call, then two that succeed
    for name in collectives._NAMES:
        monkeypatch.setitem(collectives._fns, name, lambda *args: events.append("call") or next(results))
    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
        st = comm._st
        assert not st.library_has_gpu, "no GPU was current when it was made"
        st.device, st.context = 0, ctx  # as the first buffer's GPU would set them
        events.clear()
        mscclpp.all_reduce(Cai(0, ptr=0), comm=comm)
        assert events == ["asked", "push 0", "call"] and not st.library_has_gpu, events
        with pytest.raises(mscclpp.InvalidArgumentError):
            mscclpp.broadcast(Cai(4), 0, comm=comm)
        assert not st.library_has_gpu, "a failed call took no GPU"
        events.clear()
        mscclpp.all_gather(Cai(4), Cai(4, ptr=BASE + 64), comm=comm)
        assert st.library_has_gpu and events == ["asked", "push 0", "call"], events
        events.clear()
        mscclpp.reduce_scatter(Cai(4), Cai(4, ptr=BASE + 64), comm=comm)
        assert events == ["call"], events
        st.device, st.context = None, None


def test_a_failed_call_carries_only_its_own_lines(solo: Any) -> None:
    """Lines logged on the thread before a call are not put into its exception: a failure takes the lines
    logged since it began."""
    with pytest.raises(mscclpp.InvalidArgumentError):
        mscclpp.broadcast(Cai(4), 7, comm=solo)
    with pytest.raises(mscclpp.InvalidArgumentError) as info:
        mscclpp.broadcast(Cai(4), 9, comm=solo)
    assert len(info.value.log_lines) == 1 and "root is 9;" in info.value.log_lines[0], info.value.log_lines


def test_a_library_without_collectives_says_so(solo: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(collectives._fns, "mscclppAllGather")
    assert not mscclpp.has_collectives()
    with pytest.raises(NotImplementedError, match="does not export mscclppAllGather"):
        mscclpp.all_gather(Cai(4), Cai(4, ptr=BASE + 64), comm=solo)


FAKE_TORCH = r'''
import sys, time, types

torch = types.ModuleType("torch")


class dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "torch." + self.name


for n in ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64", "bool"):
    setattr(torch, n, dtype(n))


class Tensor:
    """What the package reads of a torch tensor, and nothing else."""

    def __init__(self, n, dt, ptr, device=0, contiguous=True):
        self.n, self.dtype, self.ptr, self.dev, self.contiguous = n, dt, ptr, device, contiguous
        self.is_cuda = device is not None
        self.device = f"cuda:{device}" if device is not None else "cpu"
        self.shape = (n,)

    def numel(self):
        return self.n

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.dev if self.dev is not None else -1

    def is_contiguous(self):
        return self.contiguous

    def stride(self):
        return (1,) if self.contiguous else (2,)


class Parameter(Tensor):
    pass


torch.Tensor = Tensor
torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 0x5000 + device)
sys.modules["torch"] = torch

import mscclpp
from mscclpp import collectives

calls = []
for name in collectives._NAMES:
    collectives._fns[name] = lambda *args, _name=name: calls.append((_name,) + args)
with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
    h = comm._st._handle
    x = Parameter(1024, torch.bfloat16, 0x7000_0000, device=0)
    y = Tensor(1024, torch.bfloat16, 0x7100_0000, device=0)
    assert mscclpp.all_reduce(x, comm=comm) is x
    assert mscclpp.all_reduce(x, "min", comm=comm, out=y) is y
    assert mscclpp.broadcast(x, 0, comm=comm, stream=3) is x
    assert calls == [("mscclppAllReduce", 0x7000_0000, 0x7000_0000, 1024, 9, 0, h, 0x5000),
                     ("mscclppAllReduce", 0x7000_0000, 0x7100_0000, 1024, 9, 3, h, 0x5000),
                     ("mscclppBroadcast", 0x7000_0000, 0x7000_0000, 1024, 9, 0, h, 3)], calls
    assert comm.device == 0, "the communicator took its buffers' GPU"
    for bad, error, needle in (
        (Tensor(4, torch.float32, 0x1000, device=None), TypeError, "torch tensor on cpu"),
        (Tensor(4, torch.complex64, 0x1000), TypeError, "torch.complex64"),
        (Tensor(4, torch.bool, 0x1000), TypeError, "torch.bool"),
        (Tensor(4, torch.float32, 0x1000, contiguous=False), ValueError, "not contiguous"),
        (Tensor(4, torch.bfloat16, 0x1000, device=1), ValueError, "is on GPU 1 and the communicator works on GPU 0"),
    ):
        try:
            mscclpp.all_reduce(bad, comm=comm)
            raise AssertionError(f"{needle}: no error")
        except error as e:
            assert needle in str(e), e
    try:
        mscclpp.all_reduce(x, comm=comm, out=Tensor(1024, torch.float16, 0x7100_0000))
        raise AssertionError("no error for different dtypes")
    except TypeError as e:
        assert "differ in element type (Bfloat16 and Float16)" in str(e), e

    # What a call costs in Python (the C function does nothing here).
    calls.clear()
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        mscclpp.all_reduce(x, comm=comm)
    t1 = time.perf_counter()
    assert len(calls) == n
    print(f"us per call: {(t1 - t0) / n * 1e6:.2f}")
'''


def test_torch_tensors_through_torchs_accessors_with_a_stand_in_torch() -> None:
    """The torch path (dtype table, stream accessor, subclasses, checks), on a machine without torch: a fake
    ``torch`` module in a fresh interpreter, the C functions replaced by a recorder. Also reports the Python
    cost of a call."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)
    pkg_parent = str(Path(mscclpp.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent, here, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", FAKE_TORCH], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    us = float(r.stdout.split("us per call:")[1])
    print(f"Python cost of an all_reduce of a torch tensor: {us:.2f} us")
    assert us < 100, f"{us} us per call in Python alone"
