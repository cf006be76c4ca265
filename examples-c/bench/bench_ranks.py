"""What the Python benchmarks that start one process per rank share: a free port, and the wait for the
ranks that never hangs (nccl_collectives.py, train_step.py)."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, List


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def supervise(procs: List[Any], limit: float, what: str, say: Callable[[str], None], grace: float = 30.0) -> List[int]:
    """Waits for the started rank processes (multiprocessing.Process) and returns their exit codes. Nothing
    may hang: `grace` seconds after one rank failed (its peers may wait for it forever), or past `limit`
    seconds, the ones still running are killed, each with a FAIL line naming `what` and the rank."""
    deadline = time.monotonic() + limit
    first_failure = None
    while any(p.is_alive() for p in procs):
        now = time.monotonic()
        if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
            first_failure = now
        if now > deadline or (first_failure is not None and now - first_failure > grace):
            why = f"the {limit:.0f} s limit" if now > deadline else "another rank failed"
            for r, p in enumerate(procs):
                if p.is_alive():
                    say(f"FAIL {what} rank={r}: killed after {why}")
                    p.kill()
            break
        time.sleep(0.1)
    for p in procs:
        p.join()
    return [p.exitcode for p in procs]
