"""Compiling kernels against the library: kernels ``#include <mscclpp.h>`` and call ``put``, ``signal``,
``flush``, ``wait`` and the direct methods on the ``mscclppDevConn`` entries of
:meth:`Communicator.device_connections`.

The header is C++ and compiles under NVRTC (cupy's ``RawModule``/``RawKernel``, ``cuda.bindings``'s
NVRTC, ...) and nvcc (torch's ``load_inline``, a CMake project). Nothing needs linking: the device methods
are inline code in the header, talking to the library's proxy through memory.

With cupy::

    mod = cupy.RawModule(code=src, options=mscclpp.jit.nvrtc_options())   # or mscclpp.jit.cupy_module(src)

With torch::

    ext = torch.utils.cpp_extension.load_inline(..., extra_include_paths=[mscclpp.include_dir()])
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence

from ._library import include_dir

__all__ = ["WAITS_WITH_DEADLINE", "include_dir", "nvrtc_options", "nvcc_options", "cupy_module",
           "torch_load_inline_missing", "torch_load_inline"]

#: Device code to put in front of a kernel's source (it includes ``mscclpp.h``) so that a signal that
#: never comes fails the kernel instead of hanging it: ``waitFor(conn)`` and ``directWaitFor(conn)`` are
#: ``wait()`` and ``directWait()`` that return false once ``WAIT_TIMEOUT_NS`` nanoseconds have passed
#: (10 s, unless the source defines it first), and ``globalTimerNs()`` reads the GPU's global timer. It
#: compiles under NVRTC and nvcc.
WAITS_WITH_DEADLINE = r"""
#include <mscclpp.h>

#ifndef WAIT_TIMEOUT_NS
#define WAIT_TIMEOUT_NS 10000000000ull
#endif

__device__ __forceinline__ unsigned long long globalTimerNs()
{
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// wait() with a deadline: false if the peer's next signal did not come in time.
__device__ __forceinline__ bool waitFor(mscclppDevConn& c)
{
  const uint64_t expected = *c.waitEpochId + 1;
  const unsigned long long t0 = globalTimerNs();
  while (!c.epochReached(expected)) {
    if (globalTimerNs() - t0 > WAIT_TIMEOUT_NS) return false;
  }
  c.wait();
  return true;
}

// directWait() with a deadline.
__device__ __forceinline__ bool directWaitFor(mscclppDevConn& c)
{
  const unsigned long long t0 = globalTimerNs();
  while (!c.directPoll()) {
    if (globalTimerNs() - t0 > WAIT_TIMEOUT_NS) return false;
  }
  c.directWait();
  return true;
}
"""


def nvrtc_options(std: str = "c++17") -> List[str]:
    """NVRTC options for kernels that include ``mscclpp.h``: the include folder and the C++ standard
    (C++11 or later)."""
    return [f"-I{include_dir()}", f"--std={std}"]


def nvcc_options(std: str = "c++17") -> List[str]:
    """nvcc options for the same (the header also compiles as C++11)."""
    return [f"-I{include_dir()}", f"-std={std}"]


def cupy_module(code: str, *, options: Sequence[str] = (), name_expressions: Optional[Sequence[str]] = None,
                **kwargs: Any) -> Any:
    """A ``cupy.RawModule`` compiled from ``code`` with :func:`nvrtc_options` added to ``options``."""
    import cupy  # noqa: PLC0415 - cupy is optional

    return cupy.RawModule(code=code, options=tuple(nvrtc_options()) + tuple(options),
                          name_expressions=name_expressions, **kwargs)


def torch_load_inline_missing() -> Optional[str]:
    """Why torch's ``load_inline`` cannot build a CUDA extension here (no torch, no CUDA toolkit, no ninja),
    or None when it can."""
    try:
        from torch.utils import cpp_extension  # noqa: PLC0415 - torch is optional
    except ImportError:
        return "torch is not installed"
    home = getattr(cpp_extension, "CUDA_HOME", None)
    if not home or not os.path.exists(os.path.join(home, "bin", "nvcc")):
        return "torch finds no CUDA toolkit (set CUDA_HOME to a folder with bin/nvcc)"
    if not cpp_extension.is_ninja_available():
        return "torch's load_inline needs the ninja build tool (pip install ninja)"
    return None


def torch_load_inline(name: str, cuda_sources: Any, functions: Any, cpp_sources: Any = "",
                      **kwargs: Any) -> Any:
    """``torch.utils.cpp_extension.load_inline`` with ``mscclpp.h``'s folder added to the include paths.

    Raises ``RuntimeError`` saying what is missing when it cannot build here."""
    missing = torch_load_inline_missing()
    if missing is not None:
        raise RuntimeError(missing)
    from torch.utils import cpp_extension  # noqa: PLC0415 - torch is optional

    paths = list(kwargs.pop("extra_include_paths", []) or [])
    paths.append(include_dir())
    return cpp_extension.load_inline(name=name, cpp_sources=cpp_sources, cuda_sources=cuda_sources,
                                     functions=functions, extra_include_paths=paths, **kwargs)
