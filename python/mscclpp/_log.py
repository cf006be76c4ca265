"""The library's log, routed into Python's ``logging``, and the per-call capture that puts the library's
log line into the exception of a failed call.

The package installs one handler with ``mscclppSetLogHandler`` at import. For every line the library writes
(on any thread: the caller's, a proxy's, the bootstrap's) it

- appends the line to the calling thread's capture list, if a call of this package is in progress on that
  thread (the library logs an error on the thread that made the failing call, before it returns);
- hands the line to the logger ``mscclpp.<subsystem>`` (``mscclpp.ffi``, ``mscclpp.bootstrap``,
  ``mscclpp.proxy``, ...) at the line's level.

A line logged by a library thread takes the GIL for that. ``log_to_python(False)`` gives the lines back to
the library's default handler (standard error, or ``MSCCLPP_DEBUG_FILE``): then no library thread runs
Python code, and exceptions carry no log line.

Which lines the library writes at all is its own setting, ``MSCCLPP_DEBUG`` (default ``WARN``).

At interpreter exit the package closes every communicator still open and then gives logging back to the
library's default handler, so that no library thread calls into a finalizing interpreter.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from typing import Any, Callable, List, Optional

from ._library import LOG_HANDLER, lib
from .errors import error_for

_LEVELS = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": 5,
}
# "MSCCLPP WARN rank 3 BOOTSTRAP: message"
_LINE = re.compile(r"^MSCCLPP (?P<level>[A-Z]+) rank (?P<rank>\S+) (?P<subsystem>[A-Za-z0-9_]+): ")

_state = threading.local()
_installed = False
logger = logging.getLogger("mscclpp")


def _handle_line(raw: Optional[int]) -> None:
    # Runs on library threads too: it must never raise (ctypes would only print the exception).
    try:
        if not raw:
            return
        line = ctypes.string_at(raw).decode("utf-8", "replace").rstrip("\n")
        capture = getattr(_state, "capture", None)
        if capture is not None:
            capture.append(line)
        m = _LINE.match(line)
        if m:
            level = _LEVELS.get(m.group("level"), logging.WARNING)
            name = "mscclpp." + m.group("subsystem").lower()
        else:
            level, name = logging.WARNING, "mscclpp"
        logging.getLogger(name).log(level, "%s", line)
    except Exception:  # noqa: BLE001 - a log line must never take a library thread down
        pass


# Kept referenced for the life of the process: the library holds the raw function pointer.
_HANDLER = LOG_HANDLER(_handle_line)


def install() -> None:
    """Installs the package's log handler in the library (done at import)."""
    global _installed
    rc = lib.mscclppSetLogHandler(_HANDLER)
    if rc != 0:
        raise error_for(rc, "mscclppSetLogHandler", [], _describe(rc))
    _installed = True


def uninstall() -> None:
    """Gives logging back to the library's default handler (at interpreter exit)."""
    global _installed
    if _installed:
        lib.mscclppSetLogHandler(LOG_HANDLER())  # NULL: the default handler
        _installed = False


def log_to_python(enabled: bool = True) -> None:
    """Sends the library's log lines to Python's ``logging`` (the default), or, with ``False``, back to the
    library's default handler (standard error, or the file named by ``MSCCLPP_DEBUG_FILE``), which keeps
    Python code off the library's threads; exceptions then carry no log line."""
    if enabled:
        install()
    else:
        uninstall()


def routed_to_python() -> bool:
    return _installed


def _describe(rc: int) -> str:
    s = lib.mscclppGetErrorString(rc)
    return s.decode() if s else "unknown result code"


class _Capture:
    """Collects the lines the library logs on this thread while it is active (nests)."""

    def __enter__(self) -> List[str]:
        self.previous = getattr(_state, "capture", None)
        self.lines: List[str] = []
        _state.capture = self.lines
        return self.lines

    def __exit__(self, *exc: Any) -> None:
        _state.capture = self.previous
        if self.previous is not None:
            self.previous.extend(self.lines)


def checked(name: str) -> Callable[..., None]:
    """``call`` bound to the C function ``name`` once, for calls made per training step (the collectives):
    the same capture and exception, without looking the function up or making a context manager per
    call."""
    fn: Callable[..., int] = getattr(lib.cdll, name)
    state = _state

    def run(*args: Any) -> None:
        previous = getattr(state, "capture", None)
        lines: List[str] = []
        state.capture = lines
        try:
            rc = fn(*args)
        finally:
            state.capture = previous
        if previous is not None:
            previous.extend(lines)
        if rc != 0:
            raise error_for(rc, name, lines, _describe(rc), captured=_installed)

    run.__name__ = name
    return run


def call(name: str, *args: Any) -> None:
    """Calls the C function ``name``; a result other than ``mscclppSuccess`` raises its exception, whose
    message carries the lines the library logged during the call."""
    fn: Callable[..., int] = getattr(lib.cdll, name)
    with _Capture() as lines:
        rc = fn(*args)
    if rc != 0:
        raise error_for(rc, name, lines, _describe(rc), captured=_installed)
