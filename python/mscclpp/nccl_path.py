"""Where this package's NCCL library is: ``python -m mscclpp.nccl_path`` prints the path of the
``libnccl.so.2`` built from the same tree as the package's ``libmscclpp`` (the NCCL face, docs/nccl.md,
"Loading it"), for preloading it under PyTorch::

    LD_PRELOAD=$(python -m mscclpp.nccl_path) torchrun --nproc-per-node 2 train.py

``--dir`` prints its folder instead (for ``LD_LIBRARY_PATH`` with programs linked with ``-lnccl``); ``--help``
(``-h``) prints the usage. Any other argument is an error (status 2).

Looked for, first match wins: ``mscclpp/_lib/nccl/libnccl.so.2`` inside the package (what ``pip install``
bundles), then ``build/lib/nccl/libnccl.so.2`` of the repository the package sits in (what ``make`` lays
out). Either is a thin library over the core, ``libmscclpp.so.0``, which lies one folder up (``mscclpp/_lib/``,
``build/lib/``), where the library's run path finds it: preloading the one file brings both. Nothing is
loaded: importing this module never touches NVIDIA's or our NCCL. When neither file exists, the command
says where it looked and exits with status 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

SONAME = "libnccl.so.2"

_PACKAGE_DIR = Path(__file__).resolve().parent


def candidates() -> List[Path]:
    """The places looked at, in order."""
    return [_PACKAGE_DIR / "_lib" / "nccl" / SONAME, _PACKAGE_DIR.parent.parent / "build" / "lib" / "nccl" / SONAME]


def nccl_library_path() -> Optional[str]:
    """The absolute path of our ``libnccl.so.2``, or None when this installation has none."""
    for p in candidates():
        if p.is_file():
            return str(p)
    return None


USAGE = """usage: python -m mscclpp.nccl_path [--dir]

Prints the path of this package's libnccl.so.2 (NCCL's API on libmscclpp), e.g. for
  LD_PRELOAD=$(python -m mscclpp.nccl_path) torchrun --nproc-per-node 2 train.py
  --dir       print its folder instead (for LD_LIBRARY_PATH)
  -h, --help  print this and exit
Exit status 1 when this installation has no libnccl.so.2."""


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    if any(a not in ("--dir",) for a in args):
        print(USAGE.splitlines()[0], file=sys.stderr)
        print(f"mscclpp.nccl_path: unknown argument {next(a for a in args if a != '--dir')!r}", file=sys.stderr)
        return 2
    path = nccl_library_path()
    if path is None:
        tried = ", ".join(str(p) for p in candidates())
        print(f"mscclpp: no {SONAME} of this package (looked in {tried}); run make in the repository, or "
              "install the package from a tree built with make", file=sys.stderr)
        return 1
    print(str(Path(path).parent) if "--dir" in args else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
