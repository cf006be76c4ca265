#!/usr/bin/env python3
"""`make test`'s check of the source tree's layers (src/): the core (everything but the two C faces and
their shared base) never imports a face, the faces (`nccl/`, NCCL's `nccl.h`; `mscclpp_abi/`, the legacy
`mscclpp.h`) never import each other, their shared base `abi/` imports neither, no files import each
other in a loop but the bootstrap's own files (`bootstrap/`), and the NCCL face reaches none of the legacy
connection machine (`connections.rs` and the connections, transports and proxies under it), directly or
through the core.

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
# Loops allowed: the bootstrap's own files.
ALLOWED_LOOP_DIRS = ("bootstrap/",)
# The legacy face's connection machine, which the NCCL face never loads.
LEGACY = ("connections.rs", "connection.rs", "transport/", "proxy/")
NCCL_REACHES = "the NCCL face reaches no legacy connection machine (connections, transports, proxies)"

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


def reached(edges: Set[Tuple[str, str]], start: List[str]) -> Dict[str, str]:
    """Every file reached from `start` through imports, with the file it was first reached from."""
    graph: Dict[str, Set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    seen: Dict[str, str] = {s: s for s in start}
    todo = list(start)
    while todo:
        v = todo.pop()
        for w in sorted(graph.get(v, ())):
            if w not in seen:
                seen[w] = v
                todo.append(w)
    return seen


def checks_of(files: Dict[str, str]) -> List[Tuple[str, list]]:
    edges = imports(files)
    checks = []
    core_to_face = sorted((a, b) for a, b in edges if area(a) == "core" and area(b) in FACES)
    checks.append(("the core imports no face", core_to_face))
    between = sorted((a, b) for a, b in edges if area(a) in FACES and area(b) in FACES and area(a) != area(b))
    checks.append(("neither face imports the other", between))
    base_up = sorted((a, b) for a, b in edges if area(a) == "base" and area(b) in FACES)
    checks.append(("abi/ imports neither face", base_up))
    bad_loops = [c for c in loops(edges, list(files)) if not all(f.startswith(ALLOWED_LOOP_DIRS) for f in c)]
    checks.append(("no loop of imports but within bootstrap/", bad_loops))
    via = reached(edges, [f for f in files if area(f) == "nccl"])
    legacy = sorted((via[f], f) for f in via if f.startswith(LEGACY))
    checks.append((NCCL_REACHES, legacy))
    return checks


def self_test() -> List[str]:
    """The checks fail where they should, on made-up trees: a loop, the NCCL face reaching a transport
    through the core, a core file importing a face."""
    problems = []
    looped = {"a.rs": "use crate::b::X;", "b.rs": "use super::a::Y;", "nccl/mod.rs": ""}
    if not dict(checks_of(looped))["no loop of imports but within bootstrap/"]:
        problems.append("a loop a.rs <-> b.rs was not seen")
    through = {
        "nccl/x.rs": "use crate::comm::C;",
        "comm.rs": "crate::transport::p2p::new()",
        "transport/p2p/mod.rs": "",
    }
    if dict(checks_of(through))[NCCL_REACHES] != [("comm.rs", "transport/p2p/mod.rs")]:
        problems.append("nccl/x.rs -> comm.rs -> transport/p2p/mod.rs was not seen")
    up = {"comm.rs": "use crate::nccl::comm::NcclComm;", "nccl/comm.rs": ""}
    if not dict(checks_of(up))["the core imports no face"]:
        problems.append("comm.rs -> nccl/comm.rs was not seen")
    return problems


def main() -> int:
    files = {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.rs"))}
    checks = checks_of(files)
    # The checker itself must see imports: a tree this size has hundreds.
    edges = len(imports(files))
    read = [] if edges > 100 else [f"only {edges}"]
    checks.append(("the imports were read (more than 100 between files)", read))
    checks.append(("the checks fail on made-up trees that break them", self_test()))
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
