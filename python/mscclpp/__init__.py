"""mscclpp: GPU-driven communication from Python, over libmscclpp's C interface.

Kernels move data between GPUs themselves: they call ``put``, ``signal``, ``flush`` and ``wait`` on the
connections of a :class:`Communicator`, and the library's proxy carries the calls out. This package sets
all of that up from Python, for buffers of any framework (torch tensors, cupy arrays), and helps compile
the kernels (:mod:`mscclpp.jit`)::

    import mscclpp, torch
    torch.cuda.set_device(rank); buf = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    with mscclpp.Communicator(2, rank, address="127.0.0.1:50000") as comm:
        comm.connect(1 - rank, 0, buf)
        comm.setup()
        conns = comm.device_connections()      # mscclppDevConn[] in GPU memory, for the kernel
        with comm.proxy():
            ...                                # launch kernels that take conns.ptr

Collectives in NCCL's shape work on the same buffers with no set-up at all (:mod:`mscclpp.collectives`)::

    mscclpp.all_reduce(tensor, "sum", comm=comm)             # in place, on torch's current stream
    mscclpp.all_gather(out, tensor, comm=comm)

Imports on machines without a GPU, where the bootstrap (communicators, all-gather, barrier) works.
"""

from __future__ import annotations

import atexit as _atexit

from . import collectives, jit
from ._library import include_dir, library_path
from ._log import log_to_python
from .buffers import DeviceBuffer, device_buffer
from .collectives import DataType, ReduceOp, all_gather, all_reduce, broadcast, has_collectives, reduce_scatter
from .comm import (
    Communicator,
    Connection,
    DeviceConnection,
    DeviceConnections,
    RegisteredBuffer,
    Transport,
    UniqueId,
    has_abort,
    set_bootstrap_timeout,
)
from .errors import (
    CudaError,
    InProgressError,
    InternalError,
    InvalidArgumentError,
    InvalidUsageError,
    MscclppError,
    MscclppSystemError,
    RemoteError,
    ResultCode,
)

__version__ = "0.1.0"

__all__ = [
    "Communicator",
    "Connection",
    "CudaError",
    "DataType",
    "DeviceBuffer",
    "DeviceConnection",
    "DeviceConnections",
    "InProgressError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidUsageError",
    "MscclppError",
    "MscclppSystemError",
    "ReduceOp",
    "RegisteredBuffer",
    "RemoteError",
    "ResultCode",
    "Transport",
    "UniqueId",
    "all_gather",
    "all_reduce",
    "broadcast",
    "collectives",
    "device_buffer",
    "has_abort",
    "has_collectives",
    "include_dir",
    "jit",
    "library_path",
    "log_to_python",
    "reduce_scatter",
    "set_bootstrap_timeout",
]


def _install() -> None:
    from . import _log, comm

    _log.install()

    def at_exit() -> None:
        # Communicators first (their proxies stop), then the log handler: no library thread may call back
        # into the interpreter while it finalizes.
        comm.close_all()
        _log.uninstall()

    _atexit.register(at_exit)


_install()
