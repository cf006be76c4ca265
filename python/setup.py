"""Builds the mscclpp wheel: the Python package plus the libraries it drives.

The package calls libmscclpp's C interface through ctypes; the wheel carries exactly what ``make`` builds into
``build/``: ``libmscclpp.so.0`` with the collectives' CUDA kernels embedded, NCCL's face ``libnccl.so.2``
(found by ``python -m mscclpp.nccl_path``: a thin library over ``libmscclpp.so.0``, which it finds one folder
up) and the headers ``mscclpp.h`` and ``mscclppfifo.h``. Never a wheel without its kernels or without
``libnccl.so.2``:

- run by ``make`` (which sets ``LIBMSCCLPP_FROM_MAKE=1`` after building them), the files of ``build/`` are
  taken as they are;
- in a checkout where ``make`` has built them before, ``make lib`` brings them up to date first (cargo
  rebuilds only what changed: a second or two when nothing did);
- in a checkout where nothing was built yet (a fresh clone), the build stops and says to run ``make`` first:
  the first build installs CUDA's compiler and compiles the kernels, minutes that pip would spend without a
  word;
- without make or cargo (a ``build/`` made elsewhere), its files are taken as they are.

Whatever the way, the files are checked (both libraries, the headers, and CUDA fatbins inside
``libmscclpp.so.0``) before anything is packed, and the build stops naming what is missing.

The libraries go into the package as ``mscclpp/_lib/libmscclpp.so.0`` and ``mscclpp/_lib/nccl/libnccl.so.2``
(whose run path, ``$ORIGIN/..``, is ``mscclpp/_lib/``: the layout of ``build/lib``), the headers into
``mscclpp/_include/``.

One small CPython extension is compiled too, ``mscclpp._fastcall`` (``mscclpp/_fastcall.c``: the
collectives' per-call work in C, see collectives.py), against the stable ABI (``Py_LIMITED_API`` 3.10, where
``METH_FASTCALL | METH_KEYWORDS`` came in), so that its one build loads into every CPython >= 3.10. It is
optional: where there is no C compiler or no Python headers, or the building Python is older than 3.10, the
build says so and goes on, and the package calls the library through ctypes alone (as it does on any Python
older than 3.10). The wheel is tagged ``cp310-abi3-<platform>`` when it holds the extension (any CPython >=
3.10), else ``py3-none-<platform>`` (any Python 3); one platform either way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has it built in; older ones take it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HEADERS = ("mscclpp.h", "mscclppfifo.h")
BUILD = REPO / "build"
LIBRARY = BUILD / "lib" / "libmscclpp.so.0"
NCCL_LIBRARY = BUILD / "lib" / "nccl" / "libnccl.so.2"
INCLUDE = BUILD / "include"
# A CUDA fatbin's header starts with this magic (0xBA55ED50, little-endian): libmscclpp embeds one per kernel
# unit, and none when it was built without nvcc.
FATBIN_MAGIC = b"\x50\xed\x55\xba"


def _stop(why: str) -> NoReturn:
    raise SystemExit(f"mscclpp: {why}")


def _missing() -> list[str]:
    """What of build/ the wheel needs is not there (paths relative to the repository)."""
    wanted = [LIBRARY, NCCL_LIBRARY] + [INCLUDE / h for h in HEADERS]
    return [str(p.relative_to(REPO)) for p in wanted if not p.is_file()]


def _make_lib() -> None:
    """``make lib`` at the repository root, as a build of its own: a make that runs pip (``make`` itself)
    sets LIBMSCCLPP_FROM_MAKE and never gets here, so its jobserver and flags are not passed on."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    print("mscclpp: make lib (brings build/lib up to date)")
    r = subprocess.run(["make", "--no-print-directory", "lib"], cwd=REPO, env=env)
    if r.returncode != 0:
        _stop(f"make lib failed in {REPO} (exit status {r.returncode}); run make there and see its output")


def _library_and_headers() -> tuple[Path, Path, Path]:
    """(libmscclpp.so.0, libnccl.so.2, the folder with the generated headers), as make builds them."""
    in_checkout = (REPO / "Makefile").is_file() and (REPO / "Cargo.toml").is_file()
    from_make = os.environ.get("LIBMSCCLPP_FROM_MAKE") == "1"
    if not from_make and in_checkout:
        missing = _missing()
        if missing:
            _stop(
                f"{', '.join(missing)} not built yet: run `make` in {REPO} first (the first build installs CUDA's "
                "compiler and compiles the collectives' kernels, about 7 minutes on 2 cores), then pip install "
                "./python again. The wheel carries libmscclpp.so.0 with its kernels and libnccl.so.2, as make "
                "builds them."
            )
        if shutil.which("make") and shutil.which(os.environ.get("CARGO", "cargo")):
            _make_lib()
    missing = _missing()
    if missing:
        _stop(f"{', '.join(missing)} missing: run `make` in {REPO}, then pip install ./python again")
    if FATBIN_MAGIC not in LIBRARY.read_bytes():
        _stop(
            f"{LIBRARY} has no CUDA kernels (it was built without nvcc): run `make` in {REPO}, which installs "
            "CUDA's compiler, then pip install ./python again"
        )
    print(f"mscclpp: bundling {LIBRARY}, {NCCL_LIBRARY} and {INCLUDE}/{{{','.join(HEADERS)}}}")
    return LIBRARY, NCCL_LIBRARY, INCLUDE


class BuildPyWithLibrary(build_py):
    """build_py that also puts the library and the headers into the package."""

    def run(self) -> None:
        super().run()
        lib, nccl, include = _library_and_headers()
        pkg = Path(self.build_lib) / "mscclpp"
        (pkg / "_lib" / "nccl").mkdir(parents=True, exist_ok=True)
        (pkg / "_include").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, pkg / "_lib" / "libmscclpp.so.0")
        os.chmod(pkg / "_lib" / "libmscclpp.so.0", 0o755)
        shutil.copyfile(nccl, pkg / "_lib" / "nccl" / "libnccl.so.2")
        os.chmod(pkg / "_lib" / "nccl" / "libnccl.so.2", 0o755)
        for h in HEADERS:
            shutil.copyfile(include / h, pkg / "_include" / h)


class PlatformWheel(bdist_wheel):
    """The wheel holds a native library (so it is not pure) and, where it could be built, an extension of
    the stable ABI (so any CPython >= 3.10; without it, any Python 3)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        # Called after the build: whether the optional extension was built is known by then.
        plat = super().get_tag()[2]
        outputs = self.get_finalized_command("build_ext").get_outputs()
        if outputs and all(os.path.isfile(p) for p in outputs):
            return "cp310", "abi3", plat
        return "py3", "none", plat


# optional: a failed compile (no compiler, no Python.h) is a warning, and the package then uses ctypes alone.
FASTCALL = Extension("mscclpp._fastcall", ["mscclpp/_fastcall.c"], py_limited_api=True, optional=True,
                     extra_compile_args=["-O2", "-Wall", "-Wextra"])

if sys.version_info < (3, 10):
    print("mscclpp: Python < 3.10: the collectives' C fast path (stable ABI 3.10) is not built; ctypes alone")
setup(ext_modules=[FASTCALL] if sys.version_info >= (3, 10) else [], cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
