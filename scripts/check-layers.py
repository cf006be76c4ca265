#!/usr/bin/env python3
"""`make test`'s check of the source tree's layers (src/): the core (everything but the two C faces and
their shared base) never imports a face, the faces (`nccl/`, NCCL's `nccl.h`; `mscclpp_abi/`, the legacy
`mscclpp.h`) never import each other, their shared base `abi/` imports neither, and no files import each
other in a loop but a pair that splits one type's `impl` (`comm.rs` and `failure.rs`) and the bootstrap's
own files (`bootstrap/`).

An import is any `crate::` or `super::` path outside a comment, tests included: `use` lines, and paths
written in full in code. Prints a PASS or FAIL line per check, naming each offending import or loop, and
ends with "layers tests: N passed, N failed".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

SRC = Path(__file__).resolve().parent.parent / "src"
FACES = ("nccl", "mscclpp_abi")
BASE = "abi"
# Loops allowed: files that split one type's impl, and the bootstrap's own files.
ALLOWED_LOOPS = [{"comm.rs", "failure.rs"}]
ALLOWED_LOOP_DIRS = ("bootstrap/",)

PATH = re.compile(r"\b(crate|super)((?:::\w+)+)(::\{([^;]*?)\})?", re.S)


def module_of(rel: str) -> str:
    m = rel[: -len(".rs")]
    if m.endswith("/mod"):
        m = m[: -len("/mod")]
    return "" if m == "lib" else m.replace("/", "::")


def area(rel: str) -> str:
    top = rel.split("/")[0] if "/" in rel else ""
    if top in FACES:
        return top
    return "base" if top == BASE else "core"


def imports(files: Dict[str, str]) -> Set[Tuple[str, str]]:
    modules = {module_of(r): r for r in files}

    def resolve(path: str) -> str | None:
        parts = path.split("::")
        for i in range(len(parts), 0, -1):
            m = "::".join(parts[:i])
            if m in modules:
                return modules[m]
        return None

    edges = set()
    for rel, text in files.items():
        code = re.sub(r"//[^\n]*", "", text)
        here = module_of(rel).split("::") if module_of(rel) else []
        for m in PATH.finditer(code):
            base, path = m.group(1), m.group(2)[2:]
            full = "::".join(here[:-1] + [path]) if base == "super" else path
            targets = [full]
            if m.group(4):
                targets += [full + "::" + t.strip().split(" ")[0].split("::")[0] for t in m.group(4).split(",") if t.strip()]
            for t in targets:
                dst = resolve(t)
                if dst and dst != rel:
                    edges.add((rel, dst))
    return edges


def loops(edges: Set[Tuple[str, str]], nodes: List[str]) -> List[List[str]]:
    graph: Dict[str, Set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        graph[a].add(b)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for n in nodes:
        if n not in index:
            visit(n)
    return found


def main() -> int:
    files = {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.rs"))}
    edges = imports(files)
    checks = []
    core_to_face = sorted((a, b) for a, b in edges if area(a) == "core" and area(b) in FACES)
    checks.append(("the core imports no face", core_to_face))
    between = sorted((a, b) for a, b in edges if area(a) in FACES and area(b) in FACES and area(a) != area(b))
    checks.append(("neither face imports the other", between))
    base_up = sorted((a, b) for a, b in edges if area(a) == "base" and area(b) in FACES)
    checks.append(("abi/ imports neither face", base_up))
    bad_loops = [
        c
        for c in loops(edges, list(files))
        if set(c) not in ALLOWED_LOOPS and not all(f.startswith(ALLOWED_LOOP_DIRS) for f in c)
    ]
    checks.append(("no loop of imports but comm.rs <-> failure.rs and within bootstrap/", bad_loops))
    # The checker itself must see imports: a tree this size has hundreds.
    checks.append(("the imports were read (more than 100 between files)", [] if len(edges) > 100 else [f"only {len(edges)}"]))
    passed = failed = 0
    for name, offenders in checks:
        if offenders:
            failed += 1
            print(f"FAIL {name}:")
            for o in offenders:
                print(f"    {' -> '.join(o) if isinstance(o, tuple) else ' <-> '.join(o) if isinstance(o, list) else o}")
        else:
            passed += 1
            print(f"PASS {name}")
    print(f"layers tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
