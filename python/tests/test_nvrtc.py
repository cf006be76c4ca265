"""mscclpp.h compiles under NVRTC (what cupy's RawModule uses) with the package's options, for kernels that call
every device method; so do the examples' kernels. No GPU needed: NVRTC only compiles. Skipped where no
NVRTC library is found (make's test environment installs one from PyPI)."""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from pathlib import Path
from typing import List, Optional

import pytest

import mscclpp

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _find_nvrtc() -> Optional[ctypes.CDLL]:
    candidates: List[str] = []
    try:
        import nvidia  # the PyPI wheels' namespace package

        for base in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so.*")))
    except ImportError:
        pass
    candidates = [c for c in candidates if "builtins" not in c and ".alt." not in c]
    candidates += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for c in candidates:
        try:
            if os.path.sep in c:
                # NVRTC opens its builtins library by name: load it first from the same folder.
                for b in glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so.*")):
                    if ".alt." not in b:
                        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(c)
        except OSError:
            continue
    return None


NVRTC = _find_nvrtc()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="no NVRTC library here (make installs nvidia-cuda-nvrtc into "
                                                      "build/python-venv)")


def compile_ptx(source: str, options: List[str]) -> str:
    """NVRTC-compiles ``source`` to PTX; a compile error fails the test with NVRTC's log."""
    assert NVRTC is not None
    prog = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None) == 0
    try:
        opts = [o.encode() for o in options]
        rc = NVRTC.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        NVRTC.nvrtcGetProgramLog(prog, log)
        assert rc == 0, f"NVRTC failed ({rc}) with {options}:\n{log.value.decode(errors='replace')}"
        NVRTC.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        assert NVRTC.nvrtcGetPTX(prog, ptx) == 0
        return ptx.value.decode()
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


EVERY_METHOD = r"""
#include <mscclpp.h>

extern "C" __global__ void every_method(mscclppDevConn* conns, int n, unsigned long long* out)
{
  mscclppDevConn& c = conns[blockIdx.x % n];
  if (threadIdx.x == 0) {
    c.put(0, 8, 64);
    c.put(0, 64);
    c.signal();
    c.putWithSignal(0, 0, 64);
    c.putWithSignal(64, 64);
    c.putWithSignalAndFlush(0, 0, 64);
    c.putWithSignalAndFlush(0, 64);
    c.flush();
    c.wait();
    out[0] = c.epochReached(3) ? 1 : 0;
    c.epochIncrement();
    c.directSignal();
    c.directWait();
    c.relaxedSignal();
    c.relaxedWait();
    out[1] = c.directPoll() ? 1 : 0;
    out[2] = c.fifo.push(mscclppData, 0, 0, 16);
  }
  c.directPut(0, 0, 4096, threadIdx.x, blockDim.x);
  c.directPutWarp(0, 0, 4096);
  c.directPutBlock(0, 0, 4096);
}
"""


@pytest.mark.parametrize("std", ["c++11", "c++17"])
def test_every_device_method_compiles_under_nvrtc(std: str) -> None:
    ptx = compile_ptx(EVERY_METHOD, mscclpp.jit.nvrtc_options(std) + ["--gpu-architecture=compute_90"])
    assert ".entry every_method" in ptx
    # The trigger is written in one 16-byte store, and the direct signal with release semantics.
    assert "st.volatile.global.v2.u64" in ptx
    assert "st.release.sys.global.u64" in ptx


def test_header_without_the_package_include_path_fails() -> None:
    """The include option is what makes it work (the test above would pass vacuously otherwise)."""
    with pytest.raises(AssertionError, match="mscclpp.h"):
        compile_ptx(EVERY_METHOD, ["--gpu-architecture=compute_90"])


def _example_kernel_sources() -> List[tuple]:
    found = []
    for path in sorted(EXAMPLES.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # examples import torch and cupy inside main() only
        source = getattr(module, "KERNEL_SOURCE", None)
        if source:
            found.append((path.name, source))
    return found


@pytest.mark.parametrize("name, source", _example_kernel_sources())
def test_example_kernels_compile_under_nvrtc(name: str, source: str) -> None:
    ptx = compile_ptx(source, mscclpp.jit.nvrtc_options() + ["--gpu-architecture=compute_90"])
    assert ".entry" in ptx, name
