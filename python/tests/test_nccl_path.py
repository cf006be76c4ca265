"""``python -m mscclpp.nccl_path``: the path of the NCCL face built beside the package (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mscclpp
from mscclpp import nccl_path


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(mscclpp.__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "mscclpp.nccl_path", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_prints_an_existing_libnccl_so_2_when_built() -> None:
    found = nccl_path.nccl_library_path()
    r = _run()
    if found is None:  # a package installed without the NCCL face: the command says so and fails
        assert r.returncode == 1
        assert "no libnccl.so.2" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    printed = Path(r.stdout.strip())
    assert printed.name == "libnccl.so.2" and printed.is_file() and printed.is_absolute()
    # It is ours: it exports NCCL's version and none of libmscclpp's names (checked in the file's bytes).
    data = printed.read_bytes()
    assert b"ncclGetVersion" in data
    d = _run("--dir")
    assert d.returncode == 0 and Path(d.stdout.strip()) == printed.parent


def test_the_library_loads_with_the_core_one_folder_up() -> None:
    """libnccl.so.2 is a thin library over libmscclpp.so.0 (docs/architecture.md): the core lies one folder up,
    in the package as in build/lib, where the library's run path ($ORIGIN/..) finds it; a process that loads
    the library alone gets both, and NCCL's answer from the core."""
    found = nccl_path.nccl_library_path()
    if found is None:
        pytest.skip("this package was installed without libnccl.so.2 (run make, then pip install ./python)")
    core = Path(found).parent.parent / "libmscclpp.so.0"
    assert core.is_file(), f"{found} needs libmscclpp.so.0, which {core.parent} lacks"
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int(0); "
            "rc = lib.ncclGetVersion(ctypes.byref(v)); "
            "maps = {l.split()[-1] for l in open('/proc/self/maps') if 'libmscclpp' in l}; "
            "print(rc, v.value, *sorted(maps))")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    r = subprocess.run([sys.executable, "-c", code, found], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rc, version, *cores = r.stdout.split()
    assert (rc, version) == ("0", "23203"), r.stdout
    assert [os.path.realpath(c) for c in cores] == [os.path.realpath(core)], r.stdout


def test_missing_library_and_bad_arguments(monkeypatch, capsys) -> None:
    monkeypatch.setattr(nccl_path, "candidates", lambda: [Path("/nonexistent/libnccl.so.2")])
    assert nccl_path.nccl_library_path() is None
    assert nccl_path.main([]) == 1
    assert "/nonexistent/libnccl.so.2" in capsys.readouterr().err
    assert nccl_path.main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert "usage" in err and "'--bogus'" in err


def test_help_prints_the_usage_and_exits_0() -> None:
    for flag in ("--help", "-h"):
        r = _run(flag)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: python -m mscclpp.nccl_path [--dir]") and "--dir" in r.stdout
        assert r.stderr == ""
