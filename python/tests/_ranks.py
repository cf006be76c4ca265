"""Runs one function per rank, each in its own process (spawned: nothing of the parent's CUDA or library
state is inherited), with a deadline, and brings back each rank's result or failure."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import pytest


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank_threads(nranks: int, fn: Callable[[int], Any], timeout: float = 60) -> List[threading.Thread]:
    """Runs ``fn(rank)`` for every rank, each in a thread of this process, and waits up to ``timeout`` s for
    each; returns the threads (one still alive did not finish)."""
    threads = [threading.Thread(target=fn, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return threads


class _Skip(Exception):
    pass


def _child(fn: Callable[..., Any], rank: int, args: Sequence[Any], env: Dict[str, str], out: Any) -> None:
    os.environ.update(env)
    try:
        result = fn(rank, *args)
        out.put((rank, "ok", result))
    except pytest.skip.Exception as e:  # type: ignore[attr-defined]
        out.put((rank, "skip", str(e.msg)))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        out.put((rank, "error", traceback.format_exc()))


def run_ranks(nranks: int, fn: Callable[..., Any], *args: Any, timeout: float = 120,
              env: Optional[Dict[str, str]] = None) -> List[Any]:
    """Runs ``fn(rank, *args)`` for every rank in its own process; returns the results by rank. A rank that
    raises fails the test with its traceback; a rank that calls pytest.skip skips it; a rank still running
    at the deadline fails the test (all are killed)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, args, env or {}, out), daemon=True) for r in range(nranks)]
    for p in procs:
        p.start()
    results: Dict[int, Any] = {}
    errors: List[str] = []
    skips: List[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) + len(skips) < nranks:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(nranks)) - set(results))
                pytest.fail(f"ranks {missing} did not finish within {timeout} s; errors: {errors}")
            try:
                rank, kind, value = out.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                if dead and out.empty():
                    time.sleep(0.5)
                    if out.empty():
                        pytest.fail(f"ranks {dead} exited with {[procs[r].exitcode for r in dead]} "
                                    f"without a result; errors so far: {errors}")
                continue
            if kind == "ok":
                results[rank] = value
            elif kind == "skip":
                skips.append(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
                # The others may wait for the failed rank; give them a moment, then stop waiting.
                deadline = min(deadline, time.monotonic() + 15)
        if errors:
            pytest.fail("\n".join(errors))
        # Every rank reported; each must now also exit, closing what it left open, within a short time.
        exit_deadline = time.monotonic() + 30
        for r, p in enumerate(procs):
            p.join(timeout=max(0.1, exit_deadline - time.monotonic()))
            if p.is_alive():
                pytest.fail(f"rank {r} reported its result but did not exit within 30 s (hangs at exit)")
            if p.exitcode != 0:
                pytest.fail(f"rank {r} reported its result but exited with {p.exitcode}")
        if skips:
            pytest.skip(skips[0])
        return [results[r] for r in range(nranks)]
    finally:
        for p in procs:
            if p.is_alive():
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(5)
