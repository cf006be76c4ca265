"""The library's result codes as Python exceptions.

Every C function returns an ``mscclppResult_t``; a failure becomes an instance of the class for its code
(all subclasses of :class:`MscclppError`). The message names the C function, the code and the log
lines the library wrote during the failing call (the library logs every error once, naming the function and
the bad argument), e.g.::

    InvalidArgumentError: mscclppConnect failed with mscclppInvalidArgument (invalid argument):
    MSCCLPP WARN rank 0 CORE: mscclppConnect: remoteRank is 5; it must be in [0, nranks = 2)
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Sequence, Type


class ResultCode(enum.IntEnum):
    """``mscclppResult_t``."""

    Success = 0
    UnhandledCudaError = 1
    SystemError = 2
    InternalError = 3
    InvalidArgument = 4
    InvalidUsage = 5
    RemoteError = 6
    InProgress = 7

    @property
    def c_name(self) -> str:
        """The name in the C header, e.g. ``mscclppInvalidArgument``."""
        return "mscclpp" + self.name


class MscclppError(RuntimeError):
    """A call into libmscclpp failed.

    Attributes: ``code`` (:class:`ResultCode`), ``function`` (the C function, or the Python method for
    errors found before calling C), ``log_lines`` (what the library logged during the call, oldest first).
    A subclass names its code in its bases: ``class RemoteError(MscclppError, code=ResultCode.RemoteError)``.
    """

    code: ResultCode = ResultCode.InternalError

    def __init_subclass__(cls, code: Optional[ResultCode] = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, code: Optional[ResultCode] = None, function: str = "",
                 log_lines: Sequence[str] = ()) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.function = function
        self.log_lines = tuple(log_lines)


class CudaError(MscclppError, code=ResultCode.UnhandledCudaError):
    """``mscclppUnhandledCudaError``: a CUDA driver call failed (or there is no driver, no GPU)."""


class MscclppSystemError(MscclppError, code=ResultCode.SystemError):
    """``mscclppSystemError``: a system call failed (sockets, shared memory, threads)."""


class InternalError(MscclppError, code=ResultCode.InternalError):
    """``mscclppInternalError``: a bug in the library (or a panic it caught)."""


class InvalidArgumentError(MscclppError, ValueError, code=ResultCode.InvalidArgument):
    """``mscclppInvalidArgument``: an argument was wrong; the message names it."""


class InvalidUsageError(MscclppError, code=ResultCode.InvalidUsage):
    """``mscclppInvalidUsage``: a call in the wrong order, or on a closed communicator."""


class RemoteError(MscclppError, code=ResultCode.RemoteError):
    """``mscclppRemoteError``: a peer did not come, went away, or the network failed."""


class InProgressError(MscclppError, code=ResultCode.InProgress):
    """``mscclppInProgress``."""


_BY_CODE: Dict[int, Type[MscclppError]] = {
    cls.code: cls
    for cls in (CudaError, MscclppSystemError, InternalError, InvalidArgumentError, InvalidUsageError,
                RemoteError, InProgressError)
}


def error_for(rc: int, function: str, log_lines: Sequence[str], description: str,
              captured: bool = True, shown_above: bool = False) -> MscclppError:
    """The exception for result code ``rc`` of ``function`` (``description`` is the library's string;
    ``captured``: whether the package was collecting the library's lines; ``shown_above``: whether they were
    printed on standard error already, so that the message only points at them)."""
    try:
        code = ResultCode(rc)
        name = code.c_name
    except ValueError:
        code, name = ResultCode.InternalError, f"unknown result code {rc}"
    cls = _BY_CODE.get(rc, MscclppError)
    message = f"{function} failed with {name} ({description})"
    if log_lines and shown_above:
        message += f" (the library's {'line' if len(log_lines) == 1 else f'{len(log_lines)} lines'} above; also in .log_lines)"
    elif log_lines:
        message += ": " + " | ".join(log_lines)
    elif captured:
        message += " (the library logged nothing; MSCCLPP_DEBUG may be OFF)"
    else:
        message += " (the library's line went to its own log: mscclpp.log_to_python(False))"
    return cls(message, code=code, function=function, log_lines=log_lines)
