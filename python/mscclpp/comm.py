"""The communicator and what hangs off it: unique ids, connections, the device connection table, the
proxy, registered buffers."""

from __future__ import annotations

import contextlib
import ctypes
import enum
import logging
import pickle
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple, Union

from . import _cuda
from ._library import DEV_CONN_BYTES, REGISTERED_P2P_BYTES, UniqueIdStruct, lib
from ._log import call
from .buffers import DeviceBuffer, device_buffer, stream_handle
from .errors import InvalidUsageError, MscclppError, ResultCode, error_for

_log = logging.getLogger("mscclpp")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _int32(name: str, value: Any) -> int:
    """An int argument that the C side takes as ``int``: checked here, since ctypes would cut it silently.
    Whether it is in range for the call (a rank below nranks, say) the library checks and logs."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = value.__index__()
        except (AttributeError, TypeError):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{name} is {value}, outside the C int range")
    return int(value)


def _uint(name: str, value: Any, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value < 2**bits:
        raise ValueError(f"{name} is {value}; it must be in [0, 2**{bits})")
    return value


def set_bootstrap_timeout(seconds: int) -> None:
    """How long (whole seconds, default 30) bootstrap set-up waits for the root and the peers; for the whole
    process (``mscclppSetBootstrapConnTimeout``). A rank whose peers never come gets :class:`RemoteError`."""
    call("mscclppSetBootstrapConnTimeout", _int32("seconds", seconds))


class Transport(enum.IntEnum):
    """``mscclppTransport_t``: how a connection moves data."""

    P2P = 0  #: GPUs of one machine: CUDA IPC and the copy engine (or the proxy-free direct methods)
    SHM = 1  #: reserved by the C interface; the library refuses it
    IB = 2  #: InfiniBand RDMA writes; needs ``ib_device``

    @classmethod
    def parse(cls, value: Union["Transport", int, str]) -> "Transport":
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"transport {value!r} is not one of P2P, IB") from None
        return cls(value)


class UniqueId:
    """The 128 opaque bytes that lead every rank to a bootstrap root (``mscclppUniqueId``).

    :meth:`create` starts the root in the calling process (which must then live until every rank has
    joined); the id is plain bytes, so it travels through any channel: pickling, ``torch.distributed``'s
    store (``store.set(key, bytes(uid))``), a file, an environment variable (hex).
    """

    SIZE = 128
    __slots__ = ("_data",)

    def __init__(self, data: Union[bytes, bytearray, memoryview]) -> None:
        data = bytes(data)
        if len(data) != self.SIZE:
            raise ValueError(f"a unique id has {self.SIZE} bytes, got {len(data)}")
        self._data = data

    @classmethod
    def create(cls) -> "UniqueId":
        """Starts a bootstrap root in this process and returns its id (``mscclppGetUniqueId``)."""
        out = UniqueIdStruct()
        call("mscclppGetUniqueId", ctypes.byref(out))
        return cls(ctypes.string_at(ctypes.addressof(out), cls.SIZE))

    def __bytes__(self) -> bytes:
        return self._data

    def hex(self) -> str:
        return self._data.hex()

    @classmethod
    def fromhex(cls, text: str) -> "UniqueId":
        return cls(bytes.fromhex(text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UniqueId) and other._data == self._data

    def __hash__(self) -> int:
        return hash(self._data)

    def __reduce__(self) -> Tuple[Any, Tuple[bytes]]:
        return (UniqueId, (self._data,))

    def __repr__(self) -> str:
        return f"UniqueId({self._data[:32].hex()}...)"

    def _struct(self) -> UniqueIdStruct:
        s = UniqueIdStruct()
        ctypes.memmove(ctypes.addressof(s), self._data, self.SIZE)
        return s


@dataclass(frozen=True)
class Connection:
    """A connection recorded by :meth:`Communicator.connect`.

    ``index`` is its place in connect order: its index in :meth:`Communicator.device_connections`, and
    the ``connId`` its triggers carry.
    """

    index: int
    remote_rank: int
    tag: int
    transport: Transport
    buffer: DeviceBuffer
    ib_device: Optional[str] = None


class DevConnStruct(ctypes.Structure):
    """``mscclppDevConn`` as the host sees it (80 bytes): ``mscclppBaseConn`` then the FIFO handle."""

    _fields_ = [
        ("remoteRank", ctypes.c_int32),
        ("tag", ctypes.c_int32),
        ("localBuff", ctypes.c_uint64),
        ("localSignalEpochId", ctypes.c_uint64),
        ("remoteSignalEpochId", ctypes.c_uint64),
        ("waitEpochId", ctypes.c_uint64),
        ("remoteBuff", ctypes.c_uint64),
        ("triggerFifo", ctypes.c_uint64),
        ("triggerFifoTail", ctypes.c_uint64),
        ("triggerFifoHead", ctypes.c_uint64),
        ("connId", ctypes.c_int32),
        ("_pad", ctypes.c_int32),
    ]


assert ctypes.sizeof(DevConnStruct) == DEV_CONN_BYTES


class DeviceConnection:
    """One entry of :class:`DeviceConnections`: ``ptr`` is the device address of its ``mscclppDevConn``;
    ``host`` its fields as copied from the library, of which ``remote_rank`` and ``tag`` are also
    attributes."""

    def __init__(self, index: int, ptr: int, host: DevConnStruct) -> None:
        self.index = index
        self.ptr = ptr
        self.host = host
        self.remote_rank: int = host.remoteRank
        self.tag: int = host.tag

    def __bytes__(self) -> bytes:
        """The struct's 80 bytes, e.g. for a kernel that takes ``mscclppDevConn`` by value or for
        ``__constant__`` memory."""
        return ctypes.string_at(ctypes.addressof(self.host), DEV_CONN_BYTES)

    def __repr__(self) -> str:
        return (f"DeviceConnection(index={self.index}, remote_rank={self.remote_rank}, tag={self.tag}, "
                f"ptr={self.ptr:#x})")


class DeviceConnections:
    """Every connection's ``mscclppDevConn``, in connect order, as an array in GPU memory that the package
    owns (the library keeps the table in host memory, as ``mscclppGetAllDeviceConnections`` returns it).

    Pass :attr:`ptr` to a kernel that takes ``mscclppDevConn*`` (cupy: ``numpy.uint64(conns.ptr)`` or
    ``cupy.asarray(conns)``; torch: an ``int64`` argument of a ``load_inline`` function, cast in C++). The
    object exposes ``__cuda_array_interface__`` (``nbytes`` bytes, ``uint8``), so ``cupy.asarray(conns)``
    and ``torch.as_tensor(conns, device="cuda")`` view it without a copy. The memory lives until the
    communicator is closed.
    """

    def __init__(self, device: int, table: bytes) -> None:
        self.count = len(table) // DEV_CONN_BYTES
        self.nbytes = len(table)
        self.device = device
        self._host = [DevConnStruct.from_buffer_copy(table, i * DEV_CONN_BYTES) for i in range(self.count)]
        self._table = table
        self._memory: Optional[_cuda.DeviceMemory] = _cuda.DeviceMemory(device, self.nbytes)
        self._memory.upload(table)
        self.ptr = self._memory.ptr

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> DeviceConnection:
        if not -self.count <= i < self.count:
            raise IndexError(f"connection {i} of {self.count}")
        i %= self.count
        return DeviceConnection(i, self.ptr + i * DEV_CONN_BYTES, self._host[i])

    def __iter__(self) -> Iterator[DeviceConnection]:
        return (self[i] for i in range(self.count))

    def find(self, remote_rank: int, tag: int = 0) -> DeviceConnection:
        """The first connection to ``remote_rank`` with ``tag`` (as ``mscclppGetDeviceConnection``)."""
        for c in self:
            if c.remote_rank == remote_rank and c.tag == tag:
                return c
        raise KeyError(f"no connection to rank {remote_rank} with tag {tag}")

    def __bytes__(self) -> bytes:
        """The whole table as the library gave it (``count * 80`` bytes)."""
        return self._table

    def read_back(self) -> bytes:
        """The table as it is in GPU memory now (kernels do not write it; for checks)."""
        if self._memory is None:
            raise InvalidUsageError("the device connections were freed (communicator closed)")
        return self._memory.download()

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if self._memory is None:
            raise InvalidUsageError("the device connections were freed (communicator closed)")
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3,
                "strides": None}

    def _free(self) -> None:
        if self._memory is not None:
            self._memory.free()
            self._memory = None
            self.ptr = 0

    def __repr__(self) -> str:
        return f"DeviceConnections(count={self.count}, device={self.device}, ptr={self.ptr:#x})"


class RegisteredBuffer:
    """A buffer exchanged with the peer of every connection (``mscclppRegisterBuffer``); :meth:`write`
    copies into all those peers' registered buffers at once (``mscclppRegisteredBufferWrite``).

    ``remote_addresses`` holds, per connection in connect order, the peer's buffer as mapped here (P2P).
    """

    def __init__(self, comm: "_CommState", buf: DeviceBuffer, connections: int) -> None:
        self.buffer = buf
        self._comm = comm
        # mscclppRegisteredMemory is { std::vector<mscclppRegisteredMemoryP2P> p2p; }: to libstdc++ (the
        # library's C++ runtime) three pointers, begin, end and end of storage. The package owns the storage
        # and gives it more room than the one entry per connection the library appends, so the library never
        # reallocates (and never frees memory it did not allocate); the check below proves it did not.
        capacity = 2 * connections + 4
        self._storage = (ctypes.c_uint8 * (capacity * REGISTERED_P2P_BYTES))()
        base = ctypes.addressof(self._storage)
        self._vector = (ctypes.c_uint64 * 3)(base, base, base + capacity * REGISTERED_P2P_BYTES)
        comm.gpu_call("mscclppRegisterBuffer", comm.handle(), ctypes.c_void_p(buf.ptr), buf.nbytes,
                      ctypes.addressof(self._vector))
        begin, end, cap_end = self._vector
        if begin != base or cap_end != base + capacity * REGISTERED_P2P_BYTES or (end - begin) % REGISTERED_P2P_BYTES:
            raise MscclppError("mscclppRegisterBuffer changed the vector's storage; the registered memory layout is "
                               "not libstdc++'s", code=ResultCode.InternalError, function="mscclppRegisterBuffer")
        n = (end - begin) // REGISTERED_P2P_BYTES
        words = (ctypes.c_uint64 * (2 * n)).from_address(base)
        self.remote_addresses: List[int] = [words[2 * i] for i in range(n)]

    def write(self, src: Any, nbytes: Optional[int] = None, *, src_offset: int = 0, dst_offset: int = 0,
              stream: Any = None) -> None:
        """Copies ``nbytes`` (default: the rest of ``src`` after ``src_offset``) from ``src`` into every
        peer's registered buffer at ``dst_offset``, on ``stream`` (None: the default stream; a torch or cupy
        stream, or a handle). Asynchronous with respect to the host, like a copy on that stream."""
        s = device_buffer(src)
        src_offset = _uint("src_offset", src_offset, 32)
        dst_offset = _uint("dst_offset", dst_offset, 32)
        if nbytes is None:
            nbytes = s.nbytes - src_offset
        nbytes = _uint("nbytes", nbytes, 64)
        if src_offset + nbytes > s.nbytes:
            raise ValueError(f"src_offset {src_offset} + nbytes {nbytes} is past the end of src ({s.nbytes} bytes)")
        self._comm.gpu_call("mscclppRegisteredBufferWrite", self._comm.handle(), ctypes.addressof(self._vector),
                            ctypes.c_void_p(s.ptr), nbytes, src_offset, dst_offset, stream_handle(stream))


# What the collectives' C fast path reads of a communicator (collectives.py, _fastcall.c): _CommState keeps
# `_fast` = (handle, device, size, rank) while the library holds the GPU of an open communicator, else None;
# it is made again whenever one of these attributes is set.
_FAST_FIELDS = frozenset(("_handle", "device", "size", "rank", "library_has_gpu"))


class _CommState:
    """What a Communicator owns, apart from the Python object, so that a finalizer can close it."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _FAST_FIELDS:
            d = self.__dict__
            h, device = d.get("_handle"), d.get("device")
            fast = None
            if d.get("library_has_gpu") and h is not None and device is not None:
                fast = (h, device, d.get("size"), d.get("rank"))
            object.__setattr__(self, "_fast", fast)

    def __init__(self) -> None:
        self._fast: Optional[Tuple[int, int, int, int]] = None
        self.lock = threading.RLock()
        self._handle: Optional[int] = None
        self.device: Optional[int] = None
        self.rank = -1
        self.size = -1
        self.connections: List[Connection] = []
        self.set_up = 0
        self.devconns: Optional[DeviceConnections] = None
        self.registered: List[RegisteredBuffer] = []
        self.proxy_running = False
        self._retained: Optional[int] = None
        # The handle of the device's primary context while retained.
        self.context: Optional[int] = None
        # Whether the library has taken its GPU (the context current when it was created, or at its first
        # call that needed one): from then on it makes that context current around each call itself, and
        # the collectives need not check which one is current on the calling thread (collectives.py).
        self.library_has_gpu = False

    def set_device(self, device: Optional[int]) -> None:
        """Records the communicator's GPU and retains its primary context until close: the library keeps
        using the context it found first, which must not be destroyed when no framework holds it (a
        primary context retained anew is a new context)."""
        self.device = device
        if device is not None and self._retained is None:
            ctx = _cuda.retain_primary(device)
            if ctx is not None:
                self._retained = device
                self.context = ctx

    def release_device(self) -> None:
        self.context = None
        if self._retained is not None:
            _cuda.release_primary(self._retained)
            self._retained = None

    def handle(self) -> ctypes.c_void_p:
        h = self._handle
        if h is None:
            raise InvalidUsageError("the communicator is closed", code=ResultCode.InvalidUsage,
                                    function="Communicator")
        return ctypes.c_void_p(h)

    def gpu_call(self, name: str, *args: Any) -> None:
        """A library call that may use the GPU: made with the communicator's GPU current, so that the
        library, which works on the context current when it first needs one, picks that GPU."""
        with _cuda.device_context(self.device):
            call(name, *args)

    def close(self) -> None:
        """Frees the device table, destroys the communicator (which stops its proxy), then lets go of the
        buffers: in that order, so that nothing the proxy may still touch is freed first."""
        with self.lock:
            h, self._handle = self._handle, None
            _open.discard(self)
            if h is None:
                return
            devconns, self.devconns = self.devconns, None
            try:
                if devconns is not None:
                    devconns._free()
            finally:
                try:
                    call("mscclppCommDestroy", ctypes.c_void_p(h))
                finally:
                    self.proxy_running = False
                    self.registered.clear()
                    self.connections.clear()
                    self.release_device()


_open: Set[_CommState] = set()


class Communicator:
    """A rank of a job (``mscclppComm_t``).

    Made from the root's address (``address="ip:port"``, also ``"ifname:ip:port"`` and ``"[v6]:port"``;
    rank 0 listens there) or from a :class:`UniqueId` (``unique_id=``). Blocks until every rank has
    joined, at most the bootstrap timeout (:func:`set_bootstrap_timeout`).

    ``device``: the GPU (CUDA ordinal) the communicator works on. By default the one whose context is
    current on the calling thread (``torch.cuda.set_device`` / ``cupy.cuda.Device().use()`` after the
    framework has touched the GPU), else the GPU of the first connected buffer. Not needed for the
    host-only parts (bootstrap, all-gather, barrier).

    Use it as a context manager, or call :meth:`close`: closing stops the proxy, frees what the library
    holds, then drops the references the communicator kept to connected and registered buffers. Every
    communicator still open at interpreter exit is closed then.
    """

    def __init__(self, nranks: int, rank: int, *, address: Optional[str] = None,
                 unique_id: Union[UniqueId, bytes, None] = None, device: Optional[int] = None) -> None:
        nranks = _int32("nranks", nranks)
        rank = _int32("rank", rank)
        if (address is None) == (unique_id is None):
            raise TypeError("pass exactly one of address= and unique_id=")
        if address is not None and not isinstance(address, str):
            raise TypeError(f"address must be a str like '127.0.0.1:50000', not {type(address).__name__}")
        uid = None
        if unique_id is not None:
            uid = unique_id if isinstance(unique_id, UniqueId) else UniqueId(unique_id)  # type: ignore[arg-type]
        st = _CommState()
        handle = ctypes.c_void_p()
        try:
            st.set_device(_int32("device", device) if device is not None else _cuda.current_device())
            with _cuda.device_context(device):
                if uid is None:
                    call("mscclppCommInitRank", ctypes.byref(handle), nranks, address.encode(), rank)  # type: ignore[union-attr]
                else:
                    call("mscclppCommInitRankFromId", ctypes.byref(handle), nranks, uid._struct(), rank)
        except BaseException:
            st.release_device()
            raise
        st._handle = handle.value
        # With a device (given, or current), its context was current on this thread during the init above:
        # the library took it as the communicator's.
        st.library_has_gpu = st.context is not None
        with st.lock:
            _open.add(st)
        self._st = st
        self._finalizer = weakref.finalize(self, _close_quietly, st)
        self._finalizer.atexit = False  # the package's own exit hook closes open communicators in order
        r, n = ctypes.c_int(), ctypes.c_int()
        call("mscclppCommRank", st.handle(), ctypes.byref(r))
        call("mscclppCommSize", st.handle(), ctypes.byref(n))
        st.rank, st.size = r.value, n.value

    # ---- identity ----
    @property
    def rank(self) -> int:
        """This rank (``mscclppCommRank``); ``InvalidUsageError`` once the communicator is closed."""
        st = self._st
        if st._handle is None:
            st.handle()  # raises: the communicator is closed
        return st.rank

    @property
    def size(self) -> int:
        """The number of ranks (``mscclppCommSize``); ``InvalidUsageError`` once the communicator is closed."""
        st = self._st
        if st._handle is None:
            st.handle()  # raises: the communicator is closed
        return st.size

    nranks = size

    @property
    def device(self) -> Optional[int]:
        """The GPU this communicator works on, once known."""
        return self._st.device

    @property
    def closed(self) -> bool:
        return self._st._handle is None

    # ---- the bootstrap ----
    def barrier(self) -> None:
        """Returns once every rank has called it (``mscclppBootstrapBarrier``)."""
        call("mscclppBootstrapBarrier", self._st.handle())

    def all_gather(self, data: Union[bytes, bytearray, memoryview]) -> List[bytes]:
        """Every rank's ``data``, by rank, through the bootstrap network (``mscclppBootstrapAllGather``).

        Ranks may pass different lengths: the lengths are gathered first."""
        mine = bytes(memoryview(data).cast("B"))
        n = self.size
        lengths = self._gather_blocks(len(mine).to_bytes(8, "little"), 8)
        sizes = [int.from_bytes(lengths[i * 8:(i + 1) * 8], "little") for i in range(n)]
        block = max(sizes)
        if block == 0:
            return [b""] * n
        if block * n > _INT32_MAX:
            raise ValueError(f"all_gather of {block} bytes per rank x {n} ranks is too large for the bootstrap")
        out = self._gather_blocks(mine.ljust(block, b"\0"), block)
        return [out[i * block:i * block + sizes[i]] for i in range(n)]

    def _gather_blocks(self, mine: bytes, block: int) -> bytes:
        buf = ctypes.create_string_buffer(block * self.size)
        ctypes.memmove(ctypes.addressof(buf) + self.rank * block, mine, block)
        call("mscclppBootstrapAllGather", self._st.handle(), buf, block)
        return buf.raw

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's ``obj`` (pickled), by rank."""
        return [pickle.loads(b) for b in self.all_gather(pickle.dumps(obj))]

    # ---- connections ----
    def connect(self, remote_rank: int, tag: int, buffer: Any, transport: Union[Transport, int, str] = Transport.P2P,
                ib_device: Optional[str] = None) -> Connection:
        """Records a connection to ``remote_rank`` with ``tag`` over ``buffer`` (``mscclppConnect``); the
        peer records the matching one (this rank, the same tag). :meth:`setup` then makes them all.

        ``buffer``: GPU memory exposing ``__cuda_array_interface__`` or DLPack (a CUDA torch tensor, a
        cupy array), contiguous; the communicator keeps it referenced until it is closed. ``ib_device``
        names the InfiniBand device (e.g. ``"mlx5_0"``) for ``Transport.IB``.
        """
        st = self._st
        remote_rank = _int32("remote_rank", remote_rank)
        tag = _int32("tag", tag)
        kind = Transport.parse(transport)
        if ib_device is not None and not isinstance(ib_device, str):
            raise TypeError(f"ib_device must be a str like 'mlx5_0', not {type(ib_device).__name__}")
        buf = device_buffer(buffer)
        dev = buf.device if buf.device is not None else _cuda.pointer_device(buf.ptr)
        if st.device is not None and dev is not None and dev != st.device:
            raise ValueError(f"the buffer is on GPU {dev} and the communicator works on GPU {st.device} (pass "
                             "device= when creating the communicator, or allocate the buffer there)")
        with st.lock:
            with _cuda.device_context(st.device if st.device is not None else dev):
                call("mscclppConnect", st.handle(), remote_rank, tag, ctypes.c_void_p(buf.ptr), buf.nbytes, int(kind),
                     ib_device.encode() if ib_device is not None else None)
            if st.device is None:
                st.set_device(dev)
            conn = Connection(len(st.connections), remote_rank, tag, kind, buf, ib_device)
            st.connections.append(conn)
            self._drop_devconns()
        return conn

    @property
    def connections(self) -> Tuple[Connection, ...]:
        """Every connection recorded so far, in connect order."""
        return tuple(self._st.connections)

    def setup(self) -> None:
        """Makes every connection recorded so far (``mscclppConnectionSetup``); every rank calls it; ends
        with a barrier."""
        st = self._st
        with st.lock:
            n = len(st.connections)
            st.gpu_call("mscclppConnectionSetup", st.handle())
            st.set_up = n
            self._drop_devconns()

    def device_connections(self) -> DeviceConnections:
        """The connections' ``mscclppDevConn`` table in GPU memory, ready for a kernel (see
        :class:`DeviceConnections`); made once per set-up and freed when the communicator closes."""
        st = self._st
        with st.lock:
            if st.devconns is not None:
                return st.devconns
            ptr, n = ctypes.c_void_p(), ctypes.c_int()
            st.gpu_call("mscclppGetAllDeviceConnections", st.handle(), ctypes.byref(ptr), ctypes.byref(n))
            table = ctypes.string_at(ptr.value, n.value * DEV_CONN_BYTES) if n.value and ptr.value else b""
            device = st.device if st.device is not None else _cuda.current_device()
            if device is None:
                raise MscclppError("no GPU for the device connections: " + (_cuda.unavailable_reason() or
                                   "the communicator's GPU is unknown"), code=ResultCode.UnhandledCudaError,
                                   function="device_connections")
            st.devconns = DeviceConnections(device, table)
            return st.devconns

    def _drop_devconns(self) -> None:
        d, self._st.devconns = self._st.devconns, None
        if d is not None:
            d._free()

    # ---- the proxy ----
    def launch_proxy(self) -> None:
        """Starts the proxy thread(s) that serve the connections' triggers (``mscclppProxyLaunch``)."""
        st = self._st
        st.gpu_call("mscclppProxyLaunch", st.handle())
        st.proxy_running = True

    def stop_proxy(self) -> None:
        """A barrier with every rank, then stops the proxy (``mscclppProxyStop``); harmless if it is not
        running. Call it once the kernels that use the connections have finished."""
        st = self._st
        st.gpu_call("mscclppProxyStop", st.handle())
        st.proxy_running = False

    @contextlib.contextmanager
    def proxy(self) -> Iterator["Communicator"]:
        """``with comm.proxy():`` launches the proxy and stops it (with its barrier) at the end of the block.
        When the block raises, the stop (whose barrier could wait for peers that are gone) is left to
        :meth:`close`, which stops the proxy without a barrier."""
        self.launch_proxy()
        ok = False
        try:
            yield self
            ok = True
        finally:
            if ok:
                self.stop_proxy()

    # ---- registered buffers ----
    def register_buffer(self, buffer: Any) -> RegisteredBuffer:
        """Exchanges ``buffer`` with the peer of every connection (``mscclppRegisterBuffer``; every rank
        calls it, after :meth:`setup`); kept referenced until the communicator closes."""
        st = self._st
        buf = device_buffer(buffer)
        with st.lock:
            reg = RegisteredBuffer(st, buf, len(st.connections))
            st.registered.append(reg)
        return reg

    # ---- failures ----
    def abort(self) -> None:
        """Aborts the communicator (``mscclppCommAbort``): its proxies stop and kernels waiting on its
        connections return; every rank's later calls fail. :meth:`close` is still needed."""
        _require("mscclppCommAbort")
        call("mscclppCommAbort", self._st.handle())

    def async_error(self) -> Optional[MscclppError]:
        """None while the communicator is healthy; else the exception for the error it ran into in the
        background (a dead peer, a failed proxy, an abort), not raised (``mscclppCommGetAsyncError``).
        Never blocks."""
        _require("mscclppCommGetAsyncError")
        code = ctypes.c_int()
        call("mscclppCommGetAsyncError", self._st.handle(), ctypes.byref(code))
        if code.value == 0:
            return None
        described = lib.mscclppGetErrorString(code.value)
        return error_for(code.value, "the communicator (asynchronous error)", [],
                         described.decode() if described else "unknown")

    # ---- teardown ----
    def close(self) -> None:
        """Stops the proxy (without a barrier), frees the device connection table and everything the library
        holds (``mscclppCommDestroy``), then drops the buffers. Safe to call twice."""
        self._finalizer.detach()
        self._st.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._st.connections)} connections"
        return f"Communicator(rank={self._st.rank}, size={self._st.size}, device={self.device}, {state})"


def _require(name: str) -> None:
    if not lib.has(name):
        raise NotImplementedError(f"this libmscclpp ({lib.path}) does not export {name}; it needs a newer build")


def has_abort() -> bool:
    """Whether the loaded library has ``mscclppCommAbort`` and ``mscclppCommGetAsyncError``."""
    return lib.has("mscclppCommAbort") and lib.has("mscclppCommGetAsyncError")


def _close_quietly(st: _CommState) -> None:
    try:
        st.close()
    except Exception as e:  # noqa: BLE001 - garbage collection and exit cannot raise
        _log.warning("closing a communicator that was left open: %s", e)


def close_all() -> None:
    """Closes every communicator still open (at interpreter exit)."""
    for st in list(_open):
        _close_quietly(st)
