"""The library's log, routed into Python's ``logging``, and the per-call capture that puts the library's
log line into the exception of a failed call.

The package installs one handler with ``mscclppSetLogHandler`` at import. For every line the library writes
(on any thread: the caller's, a proxy's, the bootstrap's) it

- appends the line to the calling thread's capture list, if a call of this package is in progress on that
  thread, and to the thread's last few lines, numbered (the library logs an error on the thread that made
  the failing call, before it returns: a failed call's exception takes the lines logged since it began);
- hands the line to the logger ``mscclpp.<subsystem>`` (``mscclpp.ffi``, ``mscclpp.bootstrap``,
  ``mscclpp.proxy``, ...) at the line's level.

Where the application has configured no handler for those loggers, Python would print a WARN line on
standard error through its last-resort handler, and then again in the exception of the call that failed.
So a line logged during a call of this package (``call``), with no handler configured, is held until the
call returns: if the call failed, the line is the exception's alone; if it succeeded, it is logged then.
The collectives, whose calls are made without that (their per-call cost matters), log at once; the exception
of one that failed then names the lines already printed instead of repeating them (``.log_lines`` has them).

A line logged by a library thread takes the GIL for that. ``log_to_python(False)`` gives the lines back to
the library's default handler (standard error, or ``MSCCLPP_DEBUG_FILE``): then no library thread runs
Python code, and exceptions carry no log line.

Which lines the library writes at all is its own setting, ``MSCCLPP_DEBUG`` (default ``WARN``).

At interpreter exit the package closes every communicator still open and then gives logging back to the
library's default handler, so that no library thread calls into a finalizing interpreter.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import re
import threading
from typing import Any, Callable, Deque, List, Optional, Tuple

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

# Lines a failed call may have logged: the last few of each thread, numbered, so that a call need only note
# the thread's count before it calls the library (see lines_since).
_RECENT = 32


class _ThreadLog(threading.local):
    """What the handler keeps per thread: the capture list of a call in progress (or None), how many lines
    the library logged on the thread so far, and the last of them with their numbers."""

    capture: Optional[List[str]] = None
    # The lines held during a call while no handler is configured (see the module's doc), as (level, logger
    # name, line); None outside calls.
    held: Optional[List[Tuple[int, str, str]]] = None
    logged = 0

    def __init__(self) -> None:
        # (number, line, whether it was printed by Python's last-resort handler)
        self.recent: Deque[Tuple[int, str, bool]] = collections.deque(maxlen=_RECENT)


_state = _ThreadLog()
_installed = False
logger = logging.getLogger("mscclpp")


def _handle_line(raw: Optional[int]) -> None:
    # Runs on library threads too: it must never raise (ctypes would only print the exception).
    try:
        if not raw:
            return
        line = ctypes.string_at(raw).decode("utf-8", "replace").rstrip("\n")
        st = _state
        st.logged = n = st.logged + 1
        capture = st.capture
        if capture is not None:
            capture.append(line)
        m = _LINE.match(line)
        if m:
            level = _LEVELS.get(m.group("level"), logging.WARNING)
            name = "mscclpp." + m.group("subsystem").lower()
        else:
            level, name = logging.WARNING, "mscclpp"
        st.recent.append((n, line, _route(level, name, line)))
    except Exception:  # noqa: BLE001 - a log line must never take a library thread down
        pass


def _route(level: int, name: str, line: str) -> bool:
    """Logs the line, or holds it for the call in progress on this thread when no handler is configured.
    Returns whether Python's last-resort handler printed it (no handler configured)."""
    logger = logging.getLogger(name)
    if logger.hasHandlers():
        logger.log(level, "%s", line)
        return False
    held = _state.held
    if held is not None:
        held.append((level, name, line))
        return False
    logger.log(level, "%s", line)
    last = logging.lastResort
    return last is not None and logger.isEnabledFor(level) and level >= last.level


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
    """Collects the lines the library logs on this thread while it is active (nests), and holds those that
    would reach only Python's last-resort handler until ``release`` (see the module's doc)."""

    def __enter__(self) -> List[str]:
        self.previous = _state.capture
        self.previous_held = _state.held
        self.lines: List[str] = []
        self.held: List[Tuple[int, str, str]] = []
        _state.capture = self.lines
        _state.held = self.held
        return self.lines

    def __exit__(self, *exc: Any) -> None:
        _state.capture = self.previous
        _state.held = self.previous_held
        if self.previous is not None:
            self.previous.extend(self.lines)

    def release(self, failed: bool) -> None:
        """After the call: the held lines are logged, unless the call failed (its exception carries them)."""
        if not failed:
            for level, name, line in self.held:
                _route(level, name, line)


def lines_since(mark: int) -> List[str]:
    """The lines the library logged on this thread since its count (``_state.logged``, which a caller notes
    before calling the library) was ``mark``: the last ``_RECENT`` at most."""
    return [line for n, line, _ in _state.recent if n > mark]


def failure(name: str, rc: int, mark: int) -> Exception:
    """The exception for result ``rc`` of the C function ``name``, called when this thread's count of logged
    lines was ``mark``: the message carries the lines the call logged."""
    recent = [(line, shown) for n, line, shown in _state.recent if n > mark]
    shown = bool(recent) and all(s for _, s in recent)
    return error_for(rc, name, [line for line, _ in recent], _describe(rc), captured=_installed, shown_above=shown)


def call(name: str, *args: Any) -> None:
    """Calls the C function ``name``; a result other than ``mscclppSuccess`` raises its exception, whose
    message carries the lines the library logged during the call."""
    fn: Callable[..., int] = getattr(lib.cdll, name)
    capture = _Capture()
    with capture as lines:
        rc = fn(*args)
    capture.release(failed=rc != 0)
    if rc != 0:
        raise error_for(rc, name, lines, _describe(rc), captured=_installed)
