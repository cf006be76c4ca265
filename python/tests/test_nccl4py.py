"""nccl4py (NVIDIA's Python API for NCCL, which vLLM now prefers) on our libnccl.so.2, where nccl4py is installed
(skipped, and said so, where it is not). Like CuPy, it finds libnccl.so.2 through ``cuda.pathfinder``, which
takes an already loaded copy first: loading ours first is the one way that works without a setting.

Each check runs in a child process that loads our library by path before it imports nccl4py, so the rest of
the suite keeps its own state. No GPU is needed: the calls checked are nccl4py's host calls (its version, unique
ids, error strings), every C function its bindings declare being found in ours, and communicators of two ranks
made by its ``Communicator.init`` on threads, with its queries and its destroy.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from mscclpp import nccl_path

CHILD = textwrap.dedent(
    r"""
    import ctypes, json, os, re, sys, threading
    ours = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
    import nccl.bindings
    import nccl.core as n

    out = {}
    v = n.get_version()
    out["path"] = str(v.libnccl.path) if v.libnccl else None
    out["version"] = str(v.libnccl.version) if v.libnccl else None
    a, b = n.get_unique_id(), n.get_unique_id()
    raw = lambda u: u.as_bytes if isinstance(u.as_bytes, bytes) else u.as_bytes()  # noqa: E731
    out["id_bytes"] = len(raw(a))
    out["ids_differ"] = raw(a) != raw(b)
    ours.ncclGetErrorString.restype = ctypes.c_char_p
    out["error_strings_match"] = all(
        n.get_error_string(code) == ours.ncclGetErrorString(code).decode() for code in range(9))
    # Every C function nccl4py's bindings declare (cynccl.pxd) is one of ours.
    pxd = os.path.join(os.path.dirname(nccl.bindings.__file__), "cynccl.pxd")
    declared = sorted(set(re.findall(r"^cdef [^(\n]*?\b(nccl[A-Za-z0-9_]+)\(", open(pxd).read(), re.M)))
    out["declared"] = len(declared)
    out["missing"] = [f for f in declared if not hasattr(ours, f)]
    # Two ranks on threads of this process, through nccl4py's own Communicator.
    uid = n.get_unique_id()
    made, errors = [None, None], []

    def rank(r):
        try:
            made[r] = n.Communicator.init(2, r, uid)
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(f"rank {r}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    out["init_errors"] = errors
    out["places"] = [(c.rank, c.nranks) for c in made if c is not None]
    for c in made:
        if c is not None:
            c.destroy()
    print(json.dumps(out))
    """
)


def _ours() -> str:
    path = nccl_path.nccl_library_path()
    if path is None:
        pytest.skip("this package was installed without our libnccl.so.2 (run make)")
    return str(path)


def test_nccl4py_runs_on_our_library() -> None:
    if importlib.util.find_spec("nccl") is None or importlib.util.find_spec("nccl.core") is None:
        pytest.skip(f"nccl4py is not installed in {sys.executable} (pip install nccl4py[cu13] to run this test)")
    ours = _ours()
    r = subprocess.run([sys.executable, "-c", CHILD, ours], capture_output=True, text=True, timeout=180,
                       env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    from pathlib import Path

    assert got["path"] and Path(got["path"]).resolve() == Path(ours).resolve(), got
    assert got["version"] == "2.32.3", got
    assert got["id_bytes"] == 128 and got["ids_differ"], got
    assert got["error_strings_match"], got
    assert got["declared"] > 50 and got["missing"] == [], got
    assert got["init_errors"] == [] and sorted(got["places"]) == [[0, 2], [1, 2]], got
