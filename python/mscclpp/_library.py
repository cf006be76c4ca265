"""Finding and loading libmscclpp, and the C prototypes of what the package calls.

The package is Python over the library's C ABI (ctypes): the shared library it loads is the very
``libmscclpp.so.0`` that C and CUDA programs link. Its one native part of its own, ``_fastcall`` (the
collectives' call path in C, optional), is built from ``_fastcall.c`` against the same library.

Where the library and its headers are looked for, first match wins:

1. ``mscclpp/_lib/libmscclpp.so.0`` and ``mscclpp/_include/`` inside the package: what ``pip install``
   bundles;
2. ``build/lib`` and ``build/include`` of the repository this package sits in (``python/`` beside
   ``build/``): what ``make`` lays out, for running from a checkout with ``PYTHONPATH=python``;
3. for the library only, the dynamic loader's search path (``libmscclpp.so.0``, e.g. after
   ``make install``).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import List, Optional

SONAME = "libmscclpp.so.0"
HEADERS = ("mscclpp.h", "mscclppfifo.h")

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_BUILD = _PACKAGE_DIR.parent.parent / "build"


def _candidates_lib() -> List[Path]:
    # The versioned file too, for a build/lib copied without its links.
    return [_PACKAGE_DIR / "_lib" / SONAME, _REPO_BUILD / "lib" / SONAME, _REPO_BUILD / "lib" / (SONAME + ".1.0")]


def _candidates_include() -> List[Path]:
    return [_PACKAGE_DIR / "_include", _REPO_BUILD / "include"]


def include_dir() -> str:
    """The folder holding ``mscclpp.h`` and ``mscclppfifo.h``, for compiling kernels against the library.

    Pass it to NVRTC (``-I``), to cupy's ``RawModule(options=...)`` or to torch's ``load_inline(
    extra_include_paths=[...])``. Raises ``FileNotFoundError`` when neither the package nor the
    repository it sits in has the headers.
    """
    for d in _candidates_include():
        if all((d / h).is_file() for h in HEADERS):
            return str(d)
    tried = ", ".join(str(d) for d in _candidates_include())
    raise FileNotFoundError(
        f"mscclpp.h not found (looked in {tried}); install the package with pip, or run make in the repository"
    )


class _Library:
    """The loaded library, with prototypes set on every function the package calls."""

    def __init__(self) -> None:
        self.path: Optional[str] = None
        self.cdll = self._load()
        self._declare()

    def _load(self) -> ctypes.CDLL:
        errors = []
        for path in _candidates_lib():
            if path.is_file():
                try:
                    lib = ctypes.CDLL(str(path))
                except OSError as e:  # a broken copy: say so, and try the next place
                    errors.append(f"{path}: {e}")
                    continue
                self.path = str(path)
                return lib
        try:
            lib = ctypes.CDLL(SONAME)
        except OSError as e:
            errors.append(f"{SONAME} from the loader's search path: {e}")
            raise ImportError(
                "cannot load libmscclpp: " + "; ".join(errors) + " (install the package with pip, or run make "
                "in the repository)"
            ) from None
        self.path = SONAME
        return lib

    def has(self, name: str) -> bool:
        """Whether the loaded library exports ``name`` (newer functions may be missing from older builds)."""
        return hasattr(self.cdll, name)

    def _declare(self) -> None:
        c = ctypes
        p = c.c_void_p
        res = c.c_int  # mscclppResult_t
        sig = {
            "mscclppGetUniqueId": (res, [p]),
            "mscclppCommInitRank": (res, [c.POINTER(p), c.c_int, c.c_char_p, c.c_int]),
            "mscclppCommInitRankFromId": (res, [c.POINTER(p), c.c_int, UniqueIdStruct, c.c_int]),
            "mscclppBootstrapAllGather": (res, [p, p, c.c_int]),
            "mscclppBootstrapBarrier": (res, [p]),
            "mscclppCommDestroy": (res, [p]),
            "mscclppGetErrorString": (c.c_char_p, [c.c_int]),
            "mscclppConnect": (res, [p, c.c_int, c.c_int, p, c.c_uint64, c.c_int, c.c_char_p]),
            "mscclppConnectionSetup": (res, [p]),
            "mscclppGetAllDeviceConnections": (res, [p, c.POINTER(p), c.POINTER(c.c_int)]),
            "mscclppGetDeviceConnection": (res, [p, c.c_int, c.c_int, c.POINTER(p)]),
            "mscclppProxyLaunch": (res, [p]),
            "mscclppProxyStop": (res, [p]),
            "mscclppCommRank": (res, [p, c.POINTER(c.c_int)]),
            "mscclppCommSize": (res, [p, c.POINTER(c.c_int)]),
            "mscclppSetBootstrapConnTimeout": (res, [c.c_int]),
            "mscclppDefaultLogHandler": (None, [c.c_char_p]),
            "mscclppSetLogHandler": (res, [LOG_HANDLER]),
            "mscclppRegisterBuffer": (res, [p, p, c.c_size_t, p]),
            "mscclppRegisteredBufferWrite": (res, [p, p, p, c.c_size_t, c.c_uint32, c.c_uint32, c.c_int64]),
            # From the failure-handling work; absent from older builds (see has()).
            "mscclppCommAbort": (res, [p]),
            "mscclppCommGetAsyncError": (res, [p, c.POINTER(c.c_int)]),
            # The collectives (MSCCLPP_HAS_COLLECTIVES); absent from older builds. The header's enums and
            # cudaStream_t are a C int and a pointer.
            "mscclppAllReduce": (res, [p, p, c.c_size_t, c.c_int, c.c_int, p, p]),
            "mscclppAllGather": (res, [p, p, c.c_size_t, c.c_int, p, p]),
            "mscclppReduceScatter": (res, [p, p, c.c_size_t, c.c_int, c.c_int, p, p]),
            "mscclppBroadcast": (res, [p, p, c.c_size_t, c.c_int, c.c_int, p, p]),
        }
        for name, (restype, argtypes) in sig.items():
            if not self.has(name):
                continue
            f = getattr(self.cdll, name)
            f.restype = restype
            f.argtypes = argtypes

    def __getattr__(self, name: str):
        return getattr(self.cdll, name)


class UniqueIdStruct(ctypes.Structure):
    """``mscclppUniqueId``: 128 opaque bytes, passed by value."""

    _fields_ = [("internal", ctypes.c_char * 128)]


# mscclppLogHandler_t: void (*)(const char*). The argument is taken as a raw pointer so that the line can be
# read with string_at (c_char_p would stop at the first NUL, which the library never sends anyway).
LOG_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# sizeof(mscclppDevConn) and sizeof(mscclppRegisteredMemoryP2P), as the header defines them (the library's
# layout test holds them to the legacy header).
DEV_CONN_BYTES = 80
REGISTERED_P2P_BYTES = 16

lib = _Library()


def library_path() -> str:
    """The path of the libmscclpp the package loaded (or its soname, when the loader found it)."""
    assert lib.path is not None
    return os.path.abspath(lib.path) if os.path.sep in lib.path else lib.path
