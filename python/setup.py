"""Builds the mscclpp wheel: the Python package plus the library it drives.

The package calls libmscclpp's C interface through ctypes; the library is built by its own build (cargo)
and bundled as is:

- in a checkout (this folder beside the repository's Cargo.toml) with cargo on the PATH, ``cargo build
  --release`` runs at the repository root (cargo rebuilds only what changed) and the wheel takes
  ``target/release/libmscclpp.so`` and the headers build.rs writes into ``build/include``;
- without cargo, an existing ``build/lib/libmscclpp.so.0`` and ``build/include`` (made by ``make``
  elsewhere) are taken;
- otherwise the build stops and says what is missing.

The library goes into the package as ``mscclpp/_lib/libmscclpp.so.0`` and the headers into
``mscclpp/_include/``. Where ``make`` has built the NCCL face (``build/lib/nccl/libnccl.so.2``), it goes in as
``mscclpp/_lib/nccl/libnccl.so.2``, found by ``python -m mscclpp.nccl_path``; the wheel is made without it
otherwise (the build says so).

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

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has it built in; older ones take it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HEADERS = ("mscclpp.h", "mscclppfifo.h")


def _library_and_headers() -> tuple[Path, Path]:
    """(the shared library, the folder with the generated headers), building them if cargo is here."""
    cargo = os.environ.get("CARGO", "cargo")
    include = REPO / "build" / "include"
    if (REPO / "Cargo.toml").is_file() and shutil.which(cargo):
        print(f"mscclpp: cargo build --release in {REPO}")
        subprocess.run([cargo, "build", "--release"], cwd=REPO, check=True)
        lib = REPO / "target" / "release" / "libmscclpp.so"
    else:
        lib = REPO / "build" / "lib" / "libmscclpp.so.0"
        if not lib.is_file():
            raise SystemExit(
                "mscclpp: cannot build the library: cargo (the Rust toolchain, https://rustup.rs) is not on the PATH "
                f"and there is no prebuilt {lib} (run make in the repository)"
            )
        print(f"mscclpp: cargo not found; bundling the prebuilt {lib}")
    missing = [h for h in HEADERS if not (include / h).is_file()]
    if not lib.is_file() or missing:
        raise SystemExit(f"mscclpp: the library build did not produce {lib} and {include}/{{{','.join(HEADERS)}}}")
    return lib, include


class BuildPyWithLibrary(build_py):
    """build_py that also puts the library and the headers into the package."""

    def run(self) -> None:
        super().run()
        lib, include = _library_and_headers()
        pkg = Path(self.build_lib) / "mscclpp"
        (pkg / "_lib").mkdir(parents=True, exist_ok=True)
        (pkg / "_include").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, pkg / "_lib" / "libmscclpp.so.0")
        os.chmod(pkg / "_lib" / "libmscclpp.so.0", 0o755)
        for h in HEADERS:
            shutil.copyfile(include / h, pkg / "_include" / h)
        nccl = REPO / "build" / "lib" / "nccl" / "libnccl.so.2"
        if nccl.is_file():
            (pkg / "_lib" / "nccl").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nccl, pkg / "_lib" / "nccl" / "libnccl.so.2")
            os.chmod(pkg / "_lib" / "nccl" / "libnccl.so.2", 0o755)
        else:
            print(f"mscclpp: {nccl} not built (make builds it): the package goes without the NCCL face")


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
