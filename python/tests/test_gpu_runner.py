"""python/run_gpu_tests.sh (make python-gpu-test) split into parts, without a GPU: a stand-in nvidia-smi says
there are two, and the tests part runs a host-only test file, so nothing here touches a GPU."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from typing import Any, Dict

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RUNNER = os.path.join(ROOT, "python", "run_gpu_tests.sh")
HOST_ONLY = "python/tests/test_nccl_tests_table.py"


def _run(tmp_path: Any, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: stand-in (UUID: GPU-0)'\necho 'GPU 1: stand-in (UUID: GPU-1)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    full: Dict[str, str] = dict(os.environ)
    full.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", PYTHON=sys.executable,
                PY_GPU_LOG_DIR=str(tmp_path / "logs"), **env)
    return subprocess.run(["bash", RUNNER], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300)


def test_a_part_that_does_not_exist_is_refused(tmp_path: Any) -> None:
    r = _run(tmp_path, PY_GPU_PARTS="tests bogus")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PY_GPU_PARTS: 'bogus' is not tests or examples" in r.stdout, r.stdout
    assert "== pytest" not in r.stdout


def test_the_tests_part_alone_runs_the_named_tests_and_no_example(tmp_path: Any) -> None:
    r = _run(tmp_path, PY_GPU_PARTS="tests", PY_GPU_TESTS=HOST_ONLY)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert f"== pytest {HOST_ONLY}" in out, out
    assert "note: part examples not run (PY_GPU_PARTS=tests)" in out, out
    assert "example" not in out.replace("note: part examples not run", ""), out
    # Every test of that file (one skips where shellcheck is not installed), and nothing else, counted.
    with open(os.path.join(ROOT, HOST_ONLY)) as f:
        tests = sum(line.startswith("def test_") for line in f)
    m = re.search(r"^python gpu: (\d+) passed, 0 failed, (\d+) skipped$", out, re.M)
    assert m and int(m.group(1)) + int(m.group(2)) == tests and int(m.group(2)) <= 1, (tests, out)
