"""Collectives in NCCL's shape on torch tensors and cupy arrays: all-reduce, all-gather, reduce-scatter and
broadcast (``mscclppAllReduce``, ``mscclppAllGather``, ``mscclppReduceScatter``, ``mscclppBroadcast``).

Every rank of the communicator makes the same calls in the same order. A call queues its work on a stream
and returns at once (it never waits for the GPU), so it can be captured in a CUDA graph
(``torch.cuda.graph``) and replayed. No registration and no ``connect``/``setup`` are needed: any
contiguous CUDA buffer of the communicator's GPU will do; the first call sets the collectives up on every
rank (see docs/collectives.md)::

    import mscclpp, torch
    with mscclpp.Communicator(2, rank, unique_id=uid, device=gpu) as comm:
        x = torch.ones(1024, device="cuda")
        mscclpp.all_reduce(x, comm=comm)                         # in place, on torch's current stream
        out = torch.empty(2 * 1024, device="cuda")
        mscclpp.all_gather(out, x, comm=comm)                    # out[r * 1024:(r + 1) * 1024] = rank r's x

The element type comes from the buffer's dtype (:class:`DataType`); the operator is a string (``"sum"``,
``"prod"``, ``"max"``, ``"min"``, ``"avg"``), a :class:`ReduceOp`, or ``torch.distributed.ReduceOp``'s
members of those names. The stream is the current one of the output's framework (torch's
``current_stream``, cupy's ``get_current_stream``; for other objects the ``__cuda_array_interface__``'s
``stream``, else the default stream) unless ``stream=`` names one. Wrong Python types raise ``TypeError``
and impossible shapes ``ValueError``, before the library is called; the library's own errors raise the
package's exceptions (:class:`InvalidArgumentError` with its log line, :class:`CudaError`, ...).

These are called once per training step, often for small buffers, so the per-call work is kept small: the C
functions, the dtype tables, the framework of each buffer type and the stream accessor are resolved once,
and the communicator's GPU is made current by the library itself once it has taken it (until then, by the
package, see ``_first_calls``). What is left per call (a few attribute reads of each buffer, dict lookups,
the checks, the stream, the library call) is made in C by the extension ``mscclpp._fastcall``
(``_fastcall.c``) for torch tensors and cupy arrays: the four public functions are then its builtins (the
same signatures and docstrings, no Python frame per call), which call the library through the function's
address, and hand every call they do not make (``stream=`` given, other buffers, the first calls, arguments
the Python function would refuse, anything unusual) to the Python functions below, with the arguments as
given. Those make every such call through ctypes and raise every error, with or without the extension. The
extension is optional (built by ``make`` and ``pip`` where a C compiler and Python's headers are found, for
CPython >= 3.10; ``MSCCLPP_PYTHON_FASTCALL=0`` at import turns it off); ``_fastcall_state()`` says whether
it is in use, and ``python/benchmarks/host_call_cost.py`` measures the per-call work both ways.
"""

from __future__ import annotations

import ctypes
import enum
import importlib.util
import os
import sys
from typing import Any, Callable, Dict, Optional, Tuple

from . import _cuda, _log
from ._library import lib
from .buffers import device_array, stream_handle
from .comm import Communicator, _CommState, _int32
from .errors import InvalidUsageError, ResultCode

__all__ = ["DataType", "ReduceOp", "all_gather", "all_reduce", "broadcast", "has_collectives", "reduce_scatter"]


class ReduceOp(enum.IntEnum):
    """``mscclppRedOp_t`` (NCCL's numbering). ``Avg`` is the sum divided by the number of ranks (truncated
    for integer types)."""

    Sum = 0
    Prod = 1
    Max = 2
    Min = 3
    Avg = 4


class DataType(enum.IntEnum):
    """``mscclppDataType_t`` (NCCL's numbering); picked from the buffer's dtype."""

    Int8 = 0
    Uint8 = 1
    Int32 = 2
    Uint32 = 3
    Int64 = 4
    Uint64 = 5
    Float16 = 6
    Float32 = 7
    Float64 = 8
    Bfloat16 = 9

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]


_ITEMSIZE = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2)  # by DataType value
# Element type names as buffers.py, numpy and torch (without the "torch.") spell them.
_BY_NAME: Dict[str, int] = {t.name.lower(): int(t) for t in DataType}
_SUPPORTED = ", ".join(_BY_NAME)

# Operators: the enum's members (which, being ints, also find the C values 0..4) and the usual spellings.
_OPS: Dict[Any, int] = {m: int(m) for m in ReduceOp}
for _name, _code in {"sum": 0, "prod": 1, "product": 1, "max": 2, "min": 3, "avg": 4}.items():
    _OPS[_name] = _OPS[_name.upper()] = _OPS[_name.capitalize()] = _code
del _name, _code


_OTHER_OPS: Dict[Any, int] = {}  # other enums' members (torch.distributed.ReduceOp.SUM), once resolved


def _op(op: Any) -> int:
    """The ``mscclppRedOp_t`` of ``op``: one dict lookup for the usual spellings."""
    c = op.__class__
    if c is str or c is ReduceOp or c is int:
        code = _OPS.get(op)
        if code is not None:
            return code
    return _parse_op(op)


def _parse_op(op: Any) -> int:
    """The slow path of :func:`_op`: other spellings, other enums (matched by member name, then
    remembered), integers of other types."""
    if isinstance(op, bool):
        raise TypeError("op must be 'sum', 'prod', 'max', 'min', 'avg' or a mscclpp.ReduceOp, not a bool")
    if isinstance(op, str):
        code = _OPS.get(op.strip().lower())
        if code is None:
            raise ValueError(f"op {op!r} is not one of 'sum', 'prod', 'max', 'min', 'avg'")
        return code
    try:
        code = _OTHER_OPS.get(op)
    except TypeError:  # unhashable: resolved by name every time
        code = None
    if code is not None:
        return code
    name = getattr(op, "name", None)  # torch.distributed.ReduceOp.SUM, other enums
    if isinstance(name, str):
        code = _OPS.get(name.lower())
        if code is None:
            raise ValueError(f"op {op!r} has no mscclpp counterpart (sum, prod, max, min, avg)")
        try:
            _OTHER_OPS[op] = code
        except TypeError:
            pass
        return code
    index = getattr(op, "__index__", None)  # numpy integers
    if index is not None:
        value = index()
        if value in _OPS:
            return _OPS[value]
        raise ValueError(f"op is {value}; mscclppRedOp_t values are 0 (sum) to 4 (avg)")
    raise TypeError(f"op must be 'sum', 'prod', 'max', 'min', 'avg' or a mscclpp.ReduceOp, not {type(op).__name__}")


def _unsupported(what: str, dtype: Any) -> TypeError:
    return TypeError(f"{what} has dtype {dtype}, which the collectives do not take (they take {_SUPPORTED})")


# ---- what a buffer is: (address, elements, DataType, device), per framework ----

class _Torch:
    """torch tensors: read through torch's own accessors (its __cuda_array_interface__ builds a dict per
    call, and refuses bfloat16)."""

    def __init__(self, torch: Any) -> None:
        self.dtypes: Dict[Any, int] = {}
        for name, code in _BY_NAME.items():
            dt = getattr(torch, name, None)  # uint32/uint64 exist in newer torch only
            if dt is not None:
                self.dtypes[dt] = code
        # The raw handle of the current stream of a device, without making a torch.cuda.Stream object per
        # call; torch's own compiled code uses this accessor. The public spelling is the fallback.
        raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        if raw is not None:
            self.stream_of_device: Callable[[int], int] = raw
        else:
            self.stream_of_device = lambda device: torch.cuda.current_stream(device).cuda_stream

    def info(self, t: Any, what: str) -> Tuple[int, int, int, Optional[int]]:
        if not t.is_cuda:
            raise TypeError(f"{what} is a torch tensor on {t.device}; the collectives need CUDA tensors")
        code = self.dtypes.get(t.dtype)
        if code is None:
            raise _unsupported(what, t.dtype)
        if not t.is_contiguous():
            raise ValueError(f"{what} is not contiguous (shape {tuple(t.shape)}, stride {t.stride()}); pass "
                             f"{what}.contiguous(), or a contiguous output")
        return t.data_ptr(), t.numel(), code, t.get_device()

    def stream(self, t: Any, device: Optional[int]) -> int:
        return self.stream_of_device(device)


class _Cupy:
    """cupy arrays: read through cupy's accessors."""

    def __init__(self, cupy: Any) -> None:
        import numpy

        self.dtypes: Dict[Any, int] = {numpy.dtype(n): c for n, c in _BY_NAME.items() if n != "bfloat16"}
        self.get_stream = cupy.cuda.get_current_stream
        self.per_device: Optional[bool] = None  # whether get_current_stream takes a device (cupy >= 11)

    def info(self, a: Any, what: str) -> Tuple[int, int, int, Optional[int]]:
        code = self.dtypes.get(a.dtype)
        if code is None:
            raise _unsupported(what, a.dtype)
        if not a.flags.c_contiguous:
            raise ValueError(f"{what} is not contiguous (shape {a.shape}, strides {a.strides}); pass "
                             "cupy.ascontiguousarray(...), or a contiguous output")
        return a.data.ptr, a.size, code, a.device.id

    def stream(self, a: Any, device: Optional[int]) -> int:
        # cupy's current stream is per device; the array's device's is the one its work goes to.
        if self.per_device is not False and device is not None:
            try:
                s = self.get_stream(device).ptr
                self.per_device = True
                return s
            except TypeError:
                self.per_device = False
        return self.get_stream().ptr


class _Generic:
    """Anything else with __cuda_array_interface__ or DLPack (numba, JAX, ...): the protocol gives the
    address, the shape and the element type."""

    def info(self, x: Any, what: str) -> Tuple[int, int, int, Optional[int]]:
        buf = device_array(x)
        if buf.dtype is None:
            raise TypeError(f"{what} ({type(x).__name__}) has no element type the collectives know: pass a torch "
                            "tensor, a cupy array, or an object with __cuda_array_interface__ or __dlpack__ of "
                            f"one of {_SUPPORTED}")
        code = _BY_NAME.get(buf.dtype)
        if code is None:
            raise _unsupported(what, buf.dtype)
        device = buf.device
        if device is None and buf.nbytes:
            device = _cuda.pointer_device(buf.ptr)
        return buf.ptr, buf.count, code, device

    def stream(self, x: Any, device: Optional[int]) -> int:
        # The stream the producer names in its array interface (its work on the buffer is ordered there);
        # DLPack producers and those that name none: the default stream.
        try:
            s = x.__cuda_array_interface__.get("stream")
        except Exception:  # noqa: BLE001 - no interface, or one that refuses: the default stream
            return 0
        return s if isinstance(s, int) else 0


_GENERIC = _Generic()
_frameworks: Dict[str, Any] = {}
_adapters: Dict[type, Any] = {}


def _resolve(tp: type) -> Any:
    """Which framework a buffer type belongs to, looked up once per type. Frameworks are only looked for
    among the modules already imported: the package imports none of them."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "Tensor", None), type) and issubclass(tp, torch.Tensor):
        if "torch" not in _frameworks:
            _frameworks["torch"] = _Torch(torch)
        a = _frameworks["torch"]
    else:
        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(getattr(cupy, "ndarray", None), type) and issubclass(tp, cupy.ndarray):
            if "cupy" not in _frameworks:
                _frameworks["cupy"] = _Cupy(cupy)
            a = _frameworks["cupy"]
        else:
            a = _GENERIC
    _adapters[tp] = a
    _fast_register(tp, a)
    return a


# ---- the C functions, bound once ----

_NAMES = ("mscclppAllReduce", "mscclppAllGather", "mscclppReduceScatter", "mscclppBroadcast")


def _bind(name: str) -> Callable[..., int]:
    """The C function ``name`` as called per collective: every argument declared ``void*``. The library's
    arguments here are pointers, a ``size_t`` and ``int``s, each passed in a 64-bit integer register (the
    x86-64 and AArch64 calling conventions), where the callee reads an ``int`` from the low 32 bits (a
    negative one arrives sign-extended, which those bits keep). ctypes passes a Python int as ``void*``
    without making an object, and as ``size_t`` or ``int`` by making one per argument: measured, a call of
    the seven costs a quarter to a third less this way. The ints are in range before they are passed
    (element types and operators are the enums' values, a root is checked against the C int range)."""
    return _bind_at(name, ctypes.cast(getattr(lib.cdll, name), ctypes.c_void_p).value)


def _bind_at(name: str, address: int) -> Callable[..., int]:
    """The collective ``name``'s C function at ``address``, as :func:`_bind` declares it (the tests bind
    recorders this way: the extension then calls them too, after :func:`_fast_configure`)."""
    nargs = len(getattr(lib.cdll, name).argtypes)
    return ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * nargs))(address)


# This thread's count of the lines the library logged: noted before a call, it finds the lines of a call
# that failed (see _log.failure).
_tlog = _log._state

# The C functions the collectives call (the tests replace them with recorders): each returns the
# mscclppResult_t, which the collectives turn into the package's exception.
_fns: Dict[str, Callable[..., Any]] = {n: _bind(n) for n in _NAMES if lib.has(n)}


# ---- the C fast path (optional): _fastcall.c ----
#
# The extension makes a call's per-call work in C for torch tensors and cupy arrays: the argument binding,
# the reads and checks of the Python code below, the stream, the library call (through the function's
# address, not ctypes). Its builtins are the public functions (see the end of this file); each declines
# (calls nothing) whenever anything is unusual and hands the call, as it came, to the Python function,
# which makes it and raises its errors, as without the extension: explicit ``stream=``, arguments it would
# refuse, other buffers, any check that fails, a communicator before its first call (comm.py keeps
# _CommState._fast for the extension), a function of _fns replaced by a Python one, _use_fastcall(False).
# make builds it in place (python/mscclpp/_fastcall.abi3.so, for PYTHONPATH=python), pip into the package;
# one build serves every CPython >= 3.10 (stable ABI 3.10). Without it (no C compiler or Python headers when
# the package was built, a Python older than 3.10 or one that cannot load it, or MSCCLPP_PYTHON_FASTCALL=0 in
# the environment at import) the public functions are the Python ones below, through ctypes.

_FASTCALL_INTERFACE = 2  # the _fastcall.c this code calls (its INTERFACE)
_fastcall: Any = None
_fastcall_setting = os.environ.get("MSCCLPP_PYTHON_FASTCALL", "1").strip()
if _fastcall_setting not in ("", "0", "1"):  # as the library treats a bad flag: a warning, the default kept
    _log.logger.warning("MSCCLPP_PYTHON_FASTCALL=%r is neither 0 nor 1; the fast path stays on (the default)",
                        _fastcall_setting)
if _fastcall_setting == "0":
    _fastcall_missing = "turned off by MSCCLPP_PYTHON_FASTCALL=0"
elif sys.version_info < (3, 10) or sys.implementation.name != "cpython":
    _fastcall_missing = "not used: it needs CPython >= 3.10 (it is built for the stable ABI of 3.10)"
elif importlib.util.find_spec(f"{__package__}._fastcall") is None:
    # Said plainly: an import of a module that is not there reads "cannot import name ... (most likely due
    # to a circular import)" while the package is initialising.
    _fastcall_missing = (f"not built (no _fastcall*.so in {os.path.dirname(os.path.abspath(__file__))}: make "
                         "builds it there, pip into the installed package)")
else:
    try:
        from . import _fastcall  # type: ignore[attr-defined,no-redef]

        _fastcall_missing = ""
    except ImportError as e:
        _fastcall_missing = f"not loaded ({e})"
    if _fastcall is not None and getattr(_fastcall, "INTERFACE", None) != _FASTCALL_INTERFACE:
        _fastcall_missing = (f"a stale build ({_fastcall.__file__}, interface {getattr(_fastcall, 'INTERFACE', None)}"
                             f", not {_FASTCALL_INTERFACE}: make rebuilds it), not used")
        _fastcall = None

_fastcall_on = False  # whether the builtins make the calls (_use_fastcall)


def _fastcall_state() -> str:
    """Whether the collectives' C fast path is in use, in words (for benchmarks and test reports)."""
    if _fastcall is None:
        return "the C fast path is " + _fastcall_missing + "; the collectives call the library through ctypes"
    where = getattr(_fastcall, "__file__", "?")
    if not _fastcall_on:
        return f"the C fast path ({where}) is turned off (_use_fastcall(False))"
    return f"the C fast path is in use ({where})"


def _use_fastcall(on: bool = True) -> bool:
    """Turns the C fast path on or off for this process (benchmarks and tests compare the two); returns
    whether it is on (never where the extension is missing). Off, the public functions (still the
    extension's builtins) hand every call to the Python functions."""
    global _fastcall_on
    _fastcall_on = bool(on) and _fastcall is not None
    if _fastcall is not None:
        _fastcall.enable(_fastcall_on)
    return _fastcall_on


def _fast_register(tp: type, a: Any) -> None:
    """Tells the extension that buffers of exactly ``tp`` are torch tensors or cupy arrays, with that
    framework's dtype table and stream accessor (called as _resolve finds each type)."""
    if _fastcall is None:
        return
    if isinstance(a, _Torch):
        _fastcall.add_type(tp, 0, a.dtypes, a.stream_of_device)
    elif isinstance(a, _Cupy):
        _fastcall.add_type(tp, 1, a.dtypes, a.get_stream)


def _fast_configure() -> None:
    """Hands the extension what it reads per call, once: at import, and again after _fns changed (the
    tests). A ctypes function in _fns is called at its address while _fns holds it; anything else there
    (a recorder in Python) makes the extension decline that collective, so Python's path calls it."""
    if _fastcall is None:
        return
    _fastcall.configure(_fns, _OPS, _OTHER_OPS, ReduceOp, Communicator, _ITEMSIZE, _tlog, _log.failure)
    for index, name in enumerate(_NAMES):
        f = _fns.get(name)
        address = ctypes.cast(f, ctypes.c_void_p).value if isinstance(f, ctypes._CFuncPtr) else None
        _fastcall.set_function(index, f, address or 0)
    for tp, a in list(_adapters.items()):
        _fast_register(tp, a)


_fast_configure()
_use_fastcall(True)


def has_collectives() -> bool:
    """Whether the loaded library has the collectives (``MSCCLPP_HAS_COLLECTIVES``)."""
    return len(_fns) == len(_NAMES)


def _fn(name: str) -> Callable[..., Any]:
    f = _fns.get(name)
    if f is None:
        raise NotImplementedError(f"this libmscclpp ({lib.path}) does not export {name}; it needs a newer build")
    return f


def _state(comm: Any) -> _CommState:
    if not isinstance(comm, Communicator):
        raise TypeError(f"comm must be a mscclpp.Communicator, not {type(comm).__name__}")
    st = comm._st
    if st._handle is None:
        raise InvalidUsageError("the communicator is closed", code=ResultCode.InvalidUsage, function="Communicator")
    return st


def _check_device(st: _CommState, device: Optional[int], what: str) -> None:
    """The buffers must be on the communicator's GPU; a communicator that has none yet takes theirs (as
    ``connect`` does). Called when the buffers' device is not the communicator's."""
    if device is None:
        return
    if st.device is None:
        with st.lock:
            if st.device is None:
                st.set_device(device)
    if device != st.device:
        raise ValueError(f"{what} is on GPU {device} and the communicator works on GPU {st.device} (pass device= "
                         "when creating the communicator, or allocate the buffer there)")


def _same_type(a: Tuple[int, int, int, Optional[int]], b: Tuple[int, int, int, Optional[int]], names: str) -> None:
    if a[2] != b[2]:
        raise TypeError(f"{names} differ in element type ({DataType(a[2]).name} and {DataType(b[2]).name})")
    if a[3] is not None and b[3] is not None and a[3] != b[3]:
        raise ValueError(f"{names} are on different GPUs ({a[3]} and {b[3]})")


def _placement(send: int, send_bytes: int, recv: int, recv_bytes: int, in_place: int, shape: str) -> None:
    """Input and output either do not overlap or sit where NCCL's in-place form puts them (``in_place``: the
    input's address then); anything else would read data the call overwrites."""
    if send == in_place or send_bytes == 0 or recv_bytes == 0:
        return
    if send < recv + recv_bytes and recv < send + send_bytes:
        raise ValueError(f"the input overlaps the output but is not where an in-place call has it ({shape})")


def _first_calls(st: _CommState, f: Callable[..., Any], args: Tuple[Any, ...], count: int) -> Any:
    """Calls ``f`` (a collective's C function) before the library has taken its GPU (a communicator made
    with no GPU current, before its first call with data): with the communicator's GPU current, so that
    the library takes that one; the thread's own context is left as it was. Once the library has its GPU,
    it makes that GPU's context current around each call itself (and puts the thread's back), and the
    collectives call it directly."""
    ctx = st.context
    if ctx is not None and _cuda.current_context() == ctx:
        rc = f(*args)
    else:
        with _cuda.device_context(st.device):
            rc = f(*args)
    if not rc and count and st.device is not None:
        st.library_has_gpu = True  # a call with data took the GPU (an empty one returns before)
    return rc


def _info(x: Any, what: str) -> Tuple[Any, Tuple[int, int, int, Optional[int]]]:
    a = _adapters.get(x.__class__) or _resolve(x.__class__)
    return a, a.info(x, what)


def _out_of_place(tensor: Any, info: Tuple[int, int, int, Optional[int]], out: Any, collective: str,
                  article: str) -> Tuple[Any, int, Optional[int]]:
    """A separate ``out`` of ``tensor``'s element type and number of elements, not partly overlapping it:
    (accessor of ``out``, receive pointer, device)."""
    send, n, dt, dev = info
    a = _adapters.get(out.__class__) or _resolve(out.__class__)
    o = a.info(out, "out")
    recv, m, odt, odev = o
    if odt != dt or (odev != dev and odev is not None and dev is not None):
        _same_type(info, o, "tensor and out")
    if m != n:
        raise ValueError(f"out has {m} elements and tensor {n}; {article} {collective} needs as many")
    nbytes = n * _ITEMSIZE[dt]
    if recv != send and send < recv + nbytes and recv < send + nbytes:
        _placement(send, nbytes, recv, nbytes, recv, f"{collective}: out is tensor")
    return a, recv, odev if dev is None else dev


# ---- the collectives ----
#
# Per call: the communicator's state, the operator (a dict lookup), each buffer's framework (a dict lookup
# by type) and its address, size, element type and device (the framework's accessors), the stream, then
# the library. The checks that raise are in the slow paths only: a call that passes them does no more work
# for them than the comparisons. _fastcall.c makes the same steps, in the same terms, for torch and cupy
# buffers (and binds the arguments as these signatures do): a change of a rule or of a signature here needs
# the same change there (test_fastcall_host.py compares the two).

def all_reduce(tensor: Any, op: Any = "sum", *, comm: Communicator, out: Any = None, stream: Any = None) -> Any:
    """Reduces ``tensor`` over the ranks with ``op`` (``mscclppAllReduce``); every rank gets the same bits.

    In place by default; with ``out`` (same element type and number of elements; not overlapping
    ``tensor`` unless it is ``tensor``) the result goes there and ``tensor`` is left as it was. Returns the
    output. Queued on ``stream`` (default: the current stream of the output's framework).
    """
    st = comm._st if comm.__class__ is Communicator and comm._st._handle is not None else _state(comm)
    code = _OPS.get(op) if op.__class__ is str else None
    if code is None:
        code = _op(op)
    a = _adapters.get(tensor.__class__) or _resolve(tensor.__class__)
    info = a.info(tensor, "tensor")
    send, n, dt, dev = info
    if out is None or out is tensor:
        out, recv = tensor, send
    else:
        a, recv, dev = _out_of_place(tensor, info, out, "all-reduce", "an")
    if dev != st.device:
        _check_device(st, dev, "tensor")
    s = a.stream(out, dev) if stream is None else stream_handle(stream)
    f = _fns.get("mscclppAllReduce") or _fn("mscclppAllReduce")
    mark = _tlog.logged
    args = (send, recv, n, dt, code, st._handle, s)
    rc = f(*args) if st.library_has_gpu else _first_calls(st, f, args, n)
    if rc:
        raise _log.failure("mscclppAllReduce", rc, mark)
    return out


def all_gather(out: Any, inp: Any, *, comm: Communicator, stream: Any = None) -> Any:
    """Gathers every rank's ``inp`` into ``out`` by rank (``mscclppAllGather``): ``out`` has ``nranks``
    times ``inp``'s elements, and ``out[r * n:(r + 1) * n]`` gets rank r's ``inp``. In place when ``inp`` is
    ``out[rank * n:(rank + 1) * n]``. Returns ``out``. Queued on ``stream`` (default: the current stream of
    ``out``'s framework)."""
    st = comm._st if comm.__class__ is Communicator and comm._st._handle is not None else _state(comm)
    a = _adapters.get(out.__class__) or _resolve(out.__class__)
    o = a.info(out, "out")
    recv, m, dt, dev = o
    i = (_adapters.get(inp.__class__) or _resolve(inp.__class__)).info(inp, "inp")
    send, n, idt, idev = i
    if idt != dt or (idev != dev and idev is not None and dev is not None):
        _same_type(i, o, "inp and out")
    nranks = st.size
    if m != n * nranks:
        raise ValueError(f"out has {m} elements; an all-gather of {n} elements per rank over {nranks} ranks needs "
                         f"{n * nranks}")
    piece = n * _ITEMSIZE[dt]
    in_place = recv + st.rank * piece
    if send != in_place and send < recv + piece * nranks and recv < send + piece:
        _placement(send, piece, recv, piece * nranks, in_place, f"all-gather: inp is out[rank * {n}:(rank + 1) * {n}]")
    if dev is None:
        dev = idev
    if dev != st.device:
        _check_device(st, dev, "out")
    s = a.stream(out, dev) if stream is None else stream_handle(stream)
    f = _fns.get("mscclppAllGather") or _fn("mscclppAllGather")
    mark = _tlog.logged
    args = (send, recv, n, dt, st._handle, s)
    rc = f(*args) if st.library_has_gpu else _first_calls(st, f, args, n)
    if rc:
        raise _log.failure("mscclppAllGather", rc, mark)
    return out


def reduce_scatter(out: Any, inp: Any, op: Any = "sum", *, comm: Communicator, stream: Any = None) -> Any:
    """Reduces ``inp`` over the ranks with ``op`` and gives each rank its piece (``mscclppReduceScatter``):
    ``inp`` has ``nranks`` times ``out``'s elements, and rank r's ``out`` gets the reduction of every rank's
    ``inp[r * n:(r + 1) * n]``. In place when ``out`` is ``inp[rank * n:(rank + 1) * n]``. Returns ``out``.
    Queued on ``stream`` (default: the current stream of ``out``'s framework)."""
    st = comm._st if comm.__class__ is Communicator and comm._st._handle is not None else _state(comm)
    code = _OPS.get(op) if op.__class__ is str else None
    if code is None:
        code = _op(op)
    a = _adapters.get(out.__class__) or _resolve(out.__class__)
    o = a.info(out, "out")
    recv, n, dt, dev = o
    i = (_adapters.get(inp.__class__) or _resolve(inp.__class__)).info(inp, "inp")
    send, m, idt, idev = i
    if idt != dt or (idev != dev and idev is not None and dev is not None):
        _same_type(i, o, "inp and out")
    nranks = st.size
    if m != n * nranks:
        raise ValueError(f"inp has {m} elements; a reduce-scatter of {n} elements per rank over {nranks} ranks "
                         f"needs {n * nranks}")
    piece = n * _ITEMSIZE[dt]
    # In place, the output is the input's piece of this rank: the input starts rank * piece before it.
    in_place = recv - st.rank * piece
    if send != in_place and send < recv + piece and recv < send + piece * nranks:
        _placement(send, piece * nranks, recv, piece, in_place,
                   f"reduce-scatter: out is inp[rank * {n}:(rank + 1) * {n}]")
    if dev is None:
        dev = idev
    if dev != st.device:
        _check_device(st, dev, "out")
    s = a.stream(out, dev) if stream is None else stream_handle(stream)
    f = _fns.get("mscclppReduceScatter") or _fn("mscclppReduceScatter")
    mark = _tlog.logged
    args = (send, recv, n, dt, code, st._handle, s)
    rc = f(*args) if st.library_has_gpu else _first_calls(st, f, args, n)
    if rc:
        raise _log.failure("mscclppReduceScatter", rc, mark)
    return out


def broadcast(tensor: Any, root: int, *, comm: Communicator, out: Any = None, stream: Any = None) -> Any:
    """Copies rank ``root``'s ``tensor`` to every rank (``mscclppBroadcast``): in place by default; with
    ``out`` (same element type and number of elements) the result goes there, and ``tensor`` is read on the
    root only. Returns the output. Queued on ``stream`` (default: the current stream of the output's
    framework). A root out of range is the library's ``InvalidArgumentError``."""
    st = comm._st if comm.__class__ is Communicator and comm._st._handle is not None else _state(comm)
    if root.__class__ is not int or not -(2**31) <= root < 2**31:
        root = _int32("root", root)
    a = _adapters.get(tensor.__class__) or _resolve(tensor.__class__)
    info = a.info(tensor, "tensor")
    send, n, dt, dev = info
    if out is None or out is tensor:
        out, recv = tensor, send
    else:
        a, recv, dev = _out_of_place(tensor, info, out, "broadcast", "a")
    if dev != st.device:
        _check_device(st, dev, "tensor")
    s = a.stream(out, dev) if stream is None else stream_handle(stream)
    f = _fns.get("mscclppBroadcast") or _fn("mscclppBroadcast")
    mark = _tlog.logged
    args = (send, recv, n, dt, root, st._handle, s)
    rc = f(*args) if st.library_has_gpu else _first_calls(st, f, args, n)
    if rc:
        raise _log.failure("mscclppBroadcast", rc, mark)
    return out


# ---- the public functions ----
#
# With the extension, mscclpp.all_reduce, all_gather, reduce_scatter and broadcast are its builtins (no
# Python frame per call): each parses its arguments as the Python function above would (same names,
# positions and defaults) and makes the usual call itself; every other call (stream= given, arguments the
# Python function would refuse, anything the extension declines, the fast path turned off) goes to the
# Python function above with the arguments as they came, which makes it or raises its error. Without the
# extension, the Python functions are the public ones. The builtins carry the Python functions' docstrings
# and, as __text_signature__, their signatures without the annotations (inspect.signature reads them).

_PYTHON_FUNCTIONS: Dict[str, Callable[..., Any]] = {
    "all_reduce": all_reduce, "all_gather": all_gather, "reduce_scatter": reduce_scatter, "broadcast": broadcast,
}
_TEXT_SIGNATURES = {  # as inspect.signature prints the Python functions', without annotations
    "all_reduce": "($module, tensor, op='sum', *, comm, out=None, stream=None)",
    "all_gather": "($module, out, inp, *, comm, stream=None)",
    "reduce_scatter": "($module, out, inp, op='sum', *, comm, stream=None)",
    "broadcast": "($module, tensor, root, *, comm, out=None, stream=None)",
}

if _fastcall is not None:
    _publish = _fastcall.publish
    all_reduce = _publish(0, all_reduce, _TEXT_SIGNATURES["all_reduce"], __name__)  # noqa: F811
    all_gather = _publish(1, all_gather, _TEXT_SIGNATURES["all_gather"], __name__)  # noqa: F811
    reduce_scatter = _publish(2, reduce_scatter, _TEXT_SIGNATURES["reduce_scatter"], __name__)  # noqa: F811
    broadcast = _publish(3, broadcast, _TEXT_SIGNATURES["broadcast"], __name__)  # noqa: F811
    del _publish
