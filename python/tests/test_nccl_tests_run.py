"""examples-c/bench/nccl_tests.sh end to end without a GPU: its build, its runs and its table, over stand-ins.

The stand-ins: an nccl-tests source whose Makefile builds small C programs named like its *_perf (each prints
what nccl-tests prints, its times set by the libnccl.so.2 it loaded and the settings it was given), NVIDIA's
NCCL as a stub library, an mpirun that starts one process with the -x settings, nvcc and nvidia-smi. Our
library is the real build/lib/nccl/libnccl.so.2 (the programs only ask it for its version). What is checked
is the script's own work: which library each run loads, which settings reach it, and the table it writes."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from typing import Any, Dict

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "examples-c", "bench", "nccl_tests.sh")
OURS = os.path.join(ROOT, "build", "lib", "nccl", "libnccl.so.2")

# A *_perf stand-in: nccl-tests' output, each time 10 us on NVIDIA's library, 8 on ours and 5 on ours with
# MSCCLPP_COLL_ALGO=sendrecv (so the table's ratios say which library and settings each run had).
PERF_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int ncclGetVersion(int* version);
int main(int argc, char** argv) {
  long lo = 1024, hi = 1024, f = 2;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!strcmp(argv[i], "-b")) lo = strtol(argv[i + 1], 0, 10);
    if (!strcmp(argv[i], "-e")) hi = strtol(argv[i + 1], 0, 10);
    if (!strcmp(argv[i], "-f")) f = strtol(argv[i + 1], 0, 10);
  }
  int v = 0;
  ncclGetVersion(&v);
  Dl_info info;
  dladdr((void*)ncclGetVersion, &info);
  const char* algo = getenv("MSCCLPP_COLL_ALGO");
  double us = strstr(info.dli_fname, "stub-nccl") ? 10.0 : (algo && !strcmp(algo, "sendrecv") ? 5.0 : 8.0);
  printf("# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=%d\n", v);
  printf("# Collective test starting: %s_perf\n#\n", COLL);
  printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
  printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n");
  for (long s = lo; s <= hi; s *= f) {
    double bw = s / us / 1000.0;
    printf("%12ld  %12ld     float     sum      -1  %7.2f  %6.2f  %6.2f       0  %7.2f  %6.2f  %6.2f       0\n", s,
           s / 4, us, bw, bw, us, bw, bw);
  }
  printf("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.23\n#\n# Collective test concluded: %s_perf\n", COLL);
  return 0;
}
"""

MAKEFILE = """\
BUILDDIR ?= build
all:
\tmkdir -p $(BUILDDIR)
\tfor c in all_reduce sendrecv; do gcc -O0 -DCOLL=\\"$$c\\" -o $(BUILDDIR)/$${c}_perf perf.c -L$(NCCL_HOME)/lib -lnccl -ldl || exit 1; done
"""

# One process, with the settings of every -x; the options of Open MPI's mpirun that the script passes.
MPIRUN = """\
#!/bin/bash
[ "$1" = --version ] && { echo "mpirun (Open MPI) 4.1.6"; exit 0; }
while [ $# -gt 0 ]; do
  case "$1" in
    -np|--bind-to) shift 2 ;;
    --allow-run-as-root|--oversubscribe) shift ;;
    -x) case "$2" in *=*) export "$2" ;; esac; shift 2 ;;
    *) break ;;
  esac
done
exec "$@"
"""

NVIDIA_SMI = """\
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: stand-in (UUID: GPU-0)"; echo "GPU 1: stand-in (UUID: GPU-1)" ;;
  *compute_cap*) echo "9.0"; echo "9.0" ;;
  *clocks.max.sm*) echo "1980, 3201, 700.00"; echo "1980, 3201, 700.00" ;;
  *uuid*) echo "GPU-0a1b2c3d-0000"; echo "GPU-4e5f6a7b-1111" ;;
  *driver_version*) echo "580.00" ;;
  *name*) echo "Stand-in GPU"; echo "Stand-in GPU" ;;
esac
"""


def _executable(path: Any, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _stand_ins(tmp_path: Any) -> Dict[str, str]:
    src = tmp_path / "nccl-tests"
    (src / "src").mkdir(parents=True)
    (src / "src" / "common.cu").write_text("")
    (src / "Makefile").write_text(MAKEFILE)
    (src / "perf.c").write_text(PERF_C)
    nccl = tmp_path / "stub-nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "lib").mkdir()
    (nccl / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n")
    stub = tmp_path / "stub.c"
    stub.write_text("int ncclGetVersion(int* v) { *v = 22809; return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(nccl / "lib" / "libnccl.so.2"),
                    str(stub)], check=True)
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    _executable(tmp_path / "cuda" / "bin" / "nvcc", "#!/bin/sh\nexit 0\n")
    (tmp_path / "mpi" / "bin").mkdir(parents=True)
    (tmp_path / "mpi" / "include").mkdir()
    (tmp_path / "mpi" / "include" / "mpi.h").write_text("")
    _executable(tmp_path / "mpi" / "bin" / "mpirun", MPIRUN)
    (tmp_path / "bin").mkdir()
    _executable(tmp_path / "bin" / "nvidia-smi", NVIDIA_SMI)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MSCCLPP_", "NCCL_", "CUDA_"))}
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", NCCL_TESTS_SRC=str(src),
               NCCL_TESTS_BUILD=str(tmp_path / "build"), NCCL_HOME=str(nccl), CUDA_HOME=str(tmp_path / "cuda"),
               MPI_HOME=str(tmp_path / "mpi"))
    return env


@pytest.mark.skipif(shutil.which("gcc") is None or not os.path.exists(OURS),
                    reason="needs gcc and build/lib/nccl/libnccl.so.2 (make)")
def test_runs_load_their_library_and_settings_and_the_table_compares_them(tmp_path: Any) -> None:
    env = _stand_ins(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run(["bash", SCRIPT, "--colls", "all_reduce,sendrecv", "--modes", "eager", "--sizes",
                        "-b 1024 -e 4096 -f 4", "--with", "rings=MSCCLPP_COLL_ALGO=sendrecv", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # Each library's runs load its own file; the build went where NCCL_TESTS_BUILD says, not into the tree.
    assert f"libnccl.so.2 for nvidia: {os.path.realpath(tmp_path / 'stub-nccl' / 'lib' / 'libnccl.so.2')}" in r.stdout
    assert f"libnccl.so.2 for ours: {os.path.realpath(OURS)}" in r.stdout, r.stdout
    assert (tmp_path / "build" / "bin" / "sendrecv_perf").exists()
    # The settings reach the --with runs only, and head their logs.
    log = (out / "sendrecv.eager.R0.rings.log").read_text()
    assert "of rings" in log and "with MSCCLPP_COLL_ALGO=sendrecv" in log, log
    assert "with MSCCLPP" not in (out / "sendrecv.eager.R0.ours.log").read_text()
    # The table: NVIDIA 10 us, ours 8 (0.80), ours with the setting 5 (0.50), at both sizes.
    md = (out / "table.md").read_text()
    # It names the build of ours it measured, from the commit the library keeps (src/lib.rs), whatever the
    # tree's commit: NVIDIA's has none, and the --with runs are ours again.
    with open(OURS, "rb") as f:
        tag = re.search(rb"libmscclpp build commit ([0-9a-z]*);", f.read())
    assert tag, "build/lib/nccl/libnccl.so.2 keeps no build commit"
    built = tag.group(1).decode()
    assert re.fullmatch(r"[0-9a-f]{12}|unknown", built), built
    assert f"; our libraries built from: ours {built}." in md, md
    # The GPUs' clock and power limits (each set once) and their UUIDs' start head the table: the same model
    # measures differently from host to host.
    assert "; clocks and power at most: 1980 MHz SM, 3201 MHz memory, 700.00 W; GPUs GPU-0a1b2c3d GPU-4e5f6a7b." in md, md
    # A build of another commit than the tree's is said (make has not run since the last commit, say).
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        note = f"note: ours ({os.path.dirname(OURS)}) was built from commit {built}, the tree is at"
        assert (note in r.stdout) == (built != head.stdout.strip()), r.stdout
    rows = [line for line in md.splitlines() if line.startswith("| 1 KiB |") or line.startswith("| 4 KiB |")]
    assert len(rows) == 4, md
    for line in rows:
        assert "10.00" in line and "8.00" in line and "5.00" in line, line
        assert "0.80" in line and "0.50" in line, line
