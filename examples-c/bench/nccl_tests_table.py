#!/usr/bin/env python3
"""Side-by-side tables of NVIDIA's nccl-tests run on NVIDIA's libnccl.so.2 and on ours (and on other builds).

examples-c/bench/nccl_tests.sh runs every *_perf once per library, mode and registration (or --rounds times),
keeps each raw output in OUT and lists the runs in OUT/runs.tsv; this reads them back (standard library only)
and prints one table per collective, mode and -R value: for each size the time of each library (us), the
ratio of each to NVIDIA's (below 1: faster; to ours where NVIDIA's did not run), the algorithm bandwidth of
each and the #wrong of each, out-of-place and in-place ("out / in" in each cell). Libraries beyond NVIDIA's
and ours (--lib NAME=DIR) and later rounds (NAME-r2, ...) get columns of their own. The markdown version
goes to OUT/table.md, for docs/PERFORMANCE.md.

    examples-c/bench/nccl_tests_table.py --out build/nccl-tests-logs

runs.tsv, tab-separated, one record a line:
    meta  KEY  VALUE                       (machine, date, commit, built, command, ranks, gpus, nccl_h, ...)
    run   COLL MODE REG LIB RC SECONDS LOG ARGS NOTE
RC is the exit status of mpirun, or "skip" for a run not made (NOTE says why); LOG is relative to OUT.

Exit status 1 when any run failed (non-zero exit, no result footer, no rows), reported out-of-bounds
values or a #wrong other than 0, each flagged loudly; else 0.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# The two libraries every table compares; runs may add others (nccl_tests.sh --lib NAME=DIR, and each
# library's later rounds, NAME-r2, ...), shown after them in the order they first ran.
LIBS = ("nvidia", "ours")
LIB_NAMES = {"nvidia": "NVIDIA", "ours": "ours"}


def lib_name(lib: str) -> str:
    """How a library is shown: NVIDIA, ours, a --lib NAME as it is; a later round of each with "-rN"."""
    m = re.fullmatch(r"(.+)-r([0-9]+)", lib)
    base, suffix = (m.group(1), f"-r{m.group(2)}") if m else (lib, "")
    return LIB_NAMES.get(base, base) + suffix


def lib_order(libs_in_run_order: Sequence[str]) -> List[str]:
    """NVIDIA's and ours first (where they ran), then every other library in the order it first ran."""
    seen = list(dict.fromkeys(libs_in_run_order))
    return [lib for lib in LIBS if lib in seen] + [lib for lib in seen if lib not in LIBS]


@dataclass
class Side:
    """One placement's columns of a row: time (us), algbw and busbw (GB/s), #wrong (None: not checked)."""

    time_us: Optional[float]
    algbw: Optional[float]
    busbw: Optional[float]
    wrong: Optional[int]


@dataclass
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    oop: Optional[Side]  # out-of-place
    ip: Optional[Side]  # in-place

    @property
    def variant(self) -> Tuple[str, str, int]:
        return (self.dtype, self.redop, self.root)


@dataclass
class Log:
    rows: List[Row] = field(default_factory=list)
    avg_busbw: Optional[float] = None
    out_of_bounds: Optional[int] = None
    nccl_headers: Optional[int] = None
    nccl_library: Optional[int] = None
    errors: List[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.avg_busbw is not None


@dataclass
class Run:
    coll: str
    mode: str
    reg: str
    lib: str
    rc: str  # mpirun's exit status, or "skip"
    seconds: str
    log_name: str
    args: str
    note: str
    log: Optional[Log] = None

    @property
    def skipped(self) -> bool:
        return self.rc == "skip"

    def problems(self) -> List[str]:
        """Why this run does not count as a clean one (empty: it does)."""
        if self.skipped:
            return []
        out = []
        if self.rc != "0":
            out.append(f"exit status {self.rc}" + (" (timed out)" if self.rc == "124" else ""))
        log = self.log
        if log is None:
            out.append(f"no log {self.log_name}")
            return out
        if not log.rows:
            out.append("no result rows")
        if not log.complete:
            out.append("no result footer (cut short)")
        if log.out_of_bounds:
            out.append(f"{log.out_of_bounds} out-of-bounds values")
        wrong = [f"#wrong {side.wrong} at {fmt_size(r.size)} {r.dtype} {r.redop} root {r.root} {place}"
                 for r in log.rows for place, side in (("out-of-place", r.oop), ("in-place", r.ip))
                 if side is not None and side.wrong]
        out += wrong[:4] + ([f"and {len(wrong) - 4} more with #wrong != 0"] if len(wrong) > 4 else [])
        if out and log.errors:
            out.append("its log says: " + " | ".join(log.errors[:3]))
        return out


# --- Parsing nccl-tests' output -----------------------------------------------------------------------------

_VERSION_RE = re.compile(r"nccl-headers=(\d+)\s+nccl-library=(\d+)")
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan|inf)", re.IGNORECASE)
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_ERROR_RE = re.compile(r"error|failure|failed|abort|invalid|segmentation|signal|killed|timeout", re.IGNORECASE)
_TIME_LABELS = ("time", "cputime")


def _number(tok: str) -> Optional[float]:
    if tok.upper() == "N/A":
        return None
    return float(tok)


def _is_value(tok: str) -> bool:
    if tok.upper() == "N/A":
        return True
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _side(toks: Sequence[str]) -> Side:
    wrong = _number(toks[3])
    return Side(_number(toks[0]), _number(toks[1]), _number(toks[2]), None if wrong is None else int(wrong))


def _columns_per_side(header: Sequence[str]) -> int:
    """From the column header ('size count type redop root time algbw busbw #wrong [i_min ...] time ...'):
    how many columns each placement has (4, or 8 with per-iteration timing)."""
    times = [i for i, t in enumerate(header) if t in _TIME_LABELS]
    if len(times) >= 2:
        return times[1] - times[0]
    return 4


def parse_log(text: str) -> Log:
    """Reads one nccl-tests output: its rows (size, count, type, redop, root, then time, algbw, busbw,
    #wrong out-of-place, the same in-place), the version line, the footer; other lines that look like
    errors are kept for the report. '#' lines other than those are skipped."""
    log = Log()
    width = 4
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            m = _VERSION_RE.search(s)
            if m:
                log.nccl_headers, log.nccl_library = int(m.group(1)), int(m.group(2))
            m = _AVG_RE.match(s)
            if m:
                log.avg_busbw = float(m.group(1))
            m = _OOB_RE.match(s)
            if m:
                log.out_of_bounds = int(m.group(1))
            if toks[:5] == ["size", "count", "type", "redop", "root"]:
                width = _columns_per_side(toks)
            continue
        toks = s.split()
        row = _parse_row(toks, width)
        if row is not None:
            log.rows.append(row)
        elif _ERROR_RE.search(s) and len(log.errors) < 20:
            log.errors.append(s[:200])
    return log


def _int(tok: str) -> Optional[int]:
    try:
        return int(tok)
    except ValueError:
        return None


def _parse_row(toks: List[str], width: int) -> Optional[Row]:
    if len(toks) < 4 + 4 or not (toks[0].isdigit() and toks[1].isdigit()) or _is_value(toks[2]):
        return None
    # size, count, type, redop, root; a test without a reduction (hypercube_perf) prints redop blank.
    if _int(toks[3]) is not None:
        redop, root, rest = "", _int(toks[3]), toks[4:]
    else:
        redop, root, rest = toks[3], _int(toks[4]), toks[5:]
    if root is None:
        return None
    while rest and not _is_value(rest[-1]):  # a timestamp (-S 1) closes the row
        rest.pop()
    if not all(_is_value(t) for t in rest):
        return None
    try:
        if len(rest) >= 2 * width:
            oop, ip = _side(rest[:4]), _side(rest[width:width + 4])
        elif len(rest) >= 4:  # one placement alone: nccl-tests leaves out-of-place blank then
            oop, ip = None, _side(rest[:4])
        else:
            return None
    except ValueError:
        return None
    return Row(int(toks[0]), int(toks[1]), toks[2], redop, root, oop, ip)


def read_runs(out_dir: str) -> Tuple[Dict[str, str], List[Run]]:
    meta: Dict[str, str] = {}
    runs: List[Run] = []
    with open(os.path.join(out_dir, "runs.tsv"), encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "meta" and len(fields) >= 3:
                meta[fields[1]] = fields[2]
            elif fields[0] == "run" and len(fields) >= 9:
                fields += [""] * (10 - len(fields))
                run = Run(*fields[1:10])
                if not run.skipped and run.log_name:
                    path = os.path.join(out_dir, run.log_name)
                    if os.path.isfile(path):
                        with open(path, encoding="utf-8", errors="replace") as lf:
                            run.log = parse_log(lf.read())
                runs.append(run)
    return meta, runs


# --- Formatting ----------------------------------------------------------------------------------------------

def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt_num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if abs(v) >= 10000:
        return f"{v:.0f}"
    return f"{v:.2f}"


def fmt_wrong(v: Optional[int]) -> str:
    return "N/A" if v is None else str(v)


def fmt_version(code: Optional[int]) -> str:
    if code is None:
        return "?"
    if code >= 10000:  # 2.9 and later: major * 10000 + minor * 100 + patch
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def ratio(ours: Optional[Side], nv: Optional[Side]) -> Optional[float]:
    if ours is None or nv is None or ours.time_us is None or nv.time_us is None or nv.time_us <= 0:
        return None
    return ours.time_us / nv.time_us


@dataclass
class Line:
    """One size (and type, op, root) of one table: NVIDIA's row and ours, either possibly missing."""

    key: Tuple[int, str, str, int, int]
    rows: Dict[str, Optional[Row]]


def pair_rows(runs: Dict[str, Run], libs: Sequence[str]) -> List[Line]:
    """The libraries' rows matched by size, type, op, root (and repetition, for -N), in output order."""
    lines: Dict[Tuple[int, str, str, int, int], Line] = {}
    for lib in libs:
        run = runs.get(lib)
        if run is None or run.log is None:
            continue
        seen: Dict[Tuple[int, str, str, int], int] = {}
        for r in run.log.rows:
            k4 = (r.size, r.dtype, r.redop, r.root)
            n = seen.get(k4, 0)
            seen[k4] = n + 1
            key = k4 + (n,)
            if key not in lines:
                lines[key] = Line(key, {lib_: None for lib_ in libs})
            lines[key].rows[lib] = r
    return sorted(lines.values(), key=lambda ln: (ln.key[4], ln.key[0], ln.key[1:4]))


def _pair(a: str, b: str) -> str:
    return f"{a} / {b}"


def table_rows(lines: List[Line], md: bool) -> Tuple[List[str], List[List[str]]]:
    """The header and cells of one table: each library's time, the ratio of each to the base (NVIDIA's, else
    ours where NVIDIA's did not run), each one's algBW and #wrong; a library alone gets its columns only."""
    variants = {ln.key[1:4] for ln in lines}
    with_variant = len(variants) > 1
    libs = list(lines[0].rows) if lines else list(LIBS)
    present = [lib for lib in libs if any(ln.rows[lib] is not None for ln in lines)] or libs
    base = next((lib for lib in LIBS if lib in present), None) if len(present) > 1 else None
    compared = [lib for lib in present if lib != base] if base is not None else []
    head = ["size"] + (["type op root"] if with_variant else [])
    head += [f"{lib_name(lib)} us (out / in)" for lib in present]
    head += [f"{lib_name(lib)}/{lib_name(base)} (out / in)" for lib in compared]
    head += [f"{lib_name(lib)} algBW GB/s" for lib in present] + [f"{lib_name(lib)} #wrong" for lib in present]

    def col(row: Optional[Row], what: str) -> str:
        if row is None:
            return "-"
        vals = []
        for side in (row.oop, row.ip):
            if side is None:
                vals.append("-")
            elif what == "wrong":
                vals.append(fmt_wrong(side.wrong))
            else:
                vals.append(fmt_num(getattr(side, what)))
        return _pair(*vals)

    body = []
    for ln in lines:
        cells = [fmt_size(ln.key[0])]
        if with_variant:
            cells.append(f"{ln.key[1] or '-'} {ln.key[2] or '-'} {ln.key[3]}")
        cells += [col(ln.rows[lib], "time_us") for lib in present]
        for lib in compared:
            nv, us = ln.rows[base], ln.rows[lib]
            ratios = []
            for place in ("oop", "ip"):
                r = ratio(getattr(us, place) if us else None, getattr(nv, place) if nv else None)
                txt = "-" if r is None else f"{r:.2f}"
                if md and r is not None and r > 1.0:
                    txt = f"**{txt}**"
                ratios.append(txt)
            cells.append(_pair(*ratios))
        cells += [col(ln.rows[lib], "algbw") for lib in present]
        for lib in present:
            row = ln.rows[lib]
            w = col(row, "wrong")
            if row is not None and any(s is not None and s.wrong for s in (row.oop, row.ip)):
                w = f"**WRONG {w}**" if md else f"WRONG {w} !!!"
            cells.append(w)
        body.append(cells)
    return head, body


def render_text(head: List[str], body: List[List[str]]) -> str:
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    out = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    for r in body:
        out.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return "\n".join(out)


def render_md(head: List[str], body: List[List[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for r in body:
        out.append("| " + " | ".join(r) + " |")
    return "\n".join(out)


@dataclass
class Summary:
    coll: str
    mode: str
    reg: str
    faster: int = 0
    compared: int = 0
    ratios: List[float] = field(default_factory=list)
    worst: Optional[Tuple[float, str]] = None
    avg: Dict[str, Optional[float]] = field(default_factory=dict)
    verdict: str = "ok"

    def geomean(self) -> Optional[float]:
        if not self.ratios or any(r <= 0 for r in self.ratios):
            return None
        return math.exp(sum(math.log(r) for r in self.ratios) / len(self.ratios))


def summarize(group: Dict[str, Run], lines: List[Line]) -> Summary:
    any_run = next(iter(group.values()))
    s = Summary(any_run.coll, any_run.mode, any_run.reg)
    for ln in lines:
        nv, us = ln.rows.get("nvidia"), ln.rows.get("ours")
        r = ratio(us.oop if us else None, nv.oop if nv else None)
        if r is None:
            continue
        s.compared += 1
        s.faster += r < 1.0
        s.ratios.append(r)
        if s.worst is None or r > s.worst[0]:
            s.worst = (r, fmt_size(ln.key[0]))
    for lib, run in group.items():
        s.avg[lib] = run.log.avg_busbw if run.log else None
    return s


# --- The report ----------------------------------------------------------------------------------------------

def report(out_dir: str) -> int:
    meta, runs = read_runs(out_dir)
    libs = lib_order([run.lib for run in runs])
    groups: Dict[Tuple[str, str, str], Dict[str, Run]] = {}
    order: List[Tuple[str, str, str]] = []
    for run in runs:
        key = (run.coll, run.mode, run.reg)
        if key not in groups:
            groups[key] = {}
            order.append(key)
        groups[key][run.lib] = run

    text: List[str] = []
    md: List[str] = []
    loud: List[str] = []
    summaries: List[Summary] = []

    versions = {}
    for run in runs:
        if run.log and run.log.nccl_library is not None:
            versions.setdefault(run.lib, run.log.nccl_library)
    headers = next((r.log.nccl_headers for r in runs if r.log and r.log.nccl_headers is not None), None)
    machine = meta.get("machine", "unknown machine")
    ranks, gpus = meta.get("ranks", "?"), meta.get("gpus", "?")
    shared = ranks.isdigit() and gpus.isdigit() and int(ranks) > int(gpus)
    placement = (f"{ranks} MPI processes on {gpus} GPU{'' if gpus == '1' else 's'}, rank r on GPU r % {gpus}" if shared
                 else f"{ranks} MPI processes, one GPU each")
    command = meta.get("command", "?")
    # Ranks sharing a GPU (or --libs ours) run ours alone: no ratio to speak of, and the title says so.
    compared = any(run.lib == "nvidia" and not run.skipped for run in runs)
    title = (f"nccl-tests: NVIDIA's libnccl.so.2 against ours, {ranks} ranks, {machine}" if compared
             else f"nccl-tests: our libnccl.so.2 alone, {ranks} ranks, {machine}")
    facts = [
        f"Machine: {machine}; {placement}"
        + (f"; clocks and power at most: {meta['limits']}" if meta.get("limits") else "")
        + (f"; GPUs {meta['uuids']}" if meta.get("uuids") else "") + ".",
        f"Date: {meta.get('date', '?')}; commit {meta.get('commit', '?')}"
        + (f"; our libraries built from: {meta['built']}" if meta.get("built") else "") + ".",
        "Libraries: " + (", ".join(f"{lib_name(lib)} reports {fmt_version(versions[lib])}"
                                   for lib in libs if lib in versions) or "?")
        + f"; nccl-tests compiled against NVIDIA's nccl.h {meta.get('nccl_h') or fmt_version(headers)}.",
        f"Sizes: {meta.get('sizes', '?')}; -c {meta.get('check', '?')}"
        + (f"; extra: {meta['extra']}" if meta.get("extra") else "") + "; NCCL_NVLS_ENABLE=0.",
        "Times in us as nccl-tests prints them (the mean over ranks)"
        + ("; ratio = ours / NVIDIA time, below 1: ours faster" if compared else "")
        + "; algBW in GB/s; each cell is out-of-place / in-place.",
    ]
    text.append(f"== {title}")
    text += facts
    text.append(f"Command: {command}")
    md.append(f"### {title}")
    md.append("")
    md += [f"- {f}" for f in facts]
    if compared:
        md[-1] += " Bold ratio: ours slower."
    md.append(f"- Command: `{command}`")

    for key in order:
        group = groups[key]
        coll, mode, reg = key
        args = next((r.args for r in group.values() if r.args), "")
        heading = f"{coll}_perf, {mode} ({args}), -R {reg}"
        text.append("")
        text.append(f"== {heading}")
        md.append("")
        md.append(f"#### {heading}")
        md.append("")
        notes = []
        for lib in libs:
            run = group.get(lib)
            if run is None:
                continue
            if run.skipped:
                notes.append(f"{lib_name(lib)}: {run.note or 'not run'}")
                continue
            probs = run.problems()
            if probs:
                msg = f"{lib_name(lib)}: FAILED: " + "; ".join(probs) + f" (log {run.log_name})"
                notes.append(msg)
                loud.append(f"{coll} {mode} -R {reg} {msg}")
        lines = pair_rows(group, libs)
        if lines:
            head, body = table_rows(lines, md=False)
            text.append(render_text(head, body))
            head, body = table_rows(lines, md=True)
            md.append(render_md(head, body))
        else:
            text.append("(no rows)")
            md.append("(no rows)")
        s = summarize(group, lines)
        if any(group[lib].problems() for lib in group):
            s.verdict = "FAILED"
        summaries.append(s)
        avg = "; ".join(f"{lib_name(lib)} avg busbw {fmt_num(s.avg.get(lib))} GB/s" for lib in libs if lib in group
                        and not group[lib].skipped)
        line = avg
        if s.compared:
            gm = s.geomean()
            line += (f"; ours faster at {s.faster} of {s.compared} sizes (out-of-place)"
                     + (f", geometric mean ratio {gm:.2f}" if gm is not None else "")
                     + (f", worst {s.worst[0]:.2f} at {s.worst[1]}" if s.worst else ""))
        for n in notes:
            text.append(f"   {n}")
            md.append("")
            md.append(f"{'**' + n + '**' if 'FAILED' in n else n}")
        text.append(f"   {line}")
        md.append("")
        md.append(line + ".")

    if summaries:
        text.append("")
        text.append("== Summary (out-of-place)")
        md.append("")
        md.append("#### Summary (out-of-place)")
        md.append("")
        others = [lib for lib in libs if lib not in LIBS]
        # NVIDIA's columns only where its library ran.
        versus = ["ours faster", "geomean ours/NVIDIA", "worst ratio", "NVIDIA avg busbw"] if compared else []
        head = (["collective", "mode", "-R"] + versus + ["ours avg busbw"]
                + [f"{lib_name(lib)} avg busbw" for lib in others] + ["runs"])
        body = []
        for s in summaries:
            gm = s.geomean()
            cells = [f"{s.faster} of {s.compared}" if s.compared else "-", "-" if gm is None else f"{gm:.2f}",
                     f"{s.worst[0]:.2f} ({s.worst[1]})" if s.worst else "-", fmt_num(s.avg.get("nvidia"))]
            body.append([s.coll, s.mode, s.reg] + (cells if compared else []) + [fmt_num(s.avg.get("ours"))]
                        + [fmt_num(s.avg.get(lib)) for lib in others] + [s.verdict])
        text.append(render_text(head, body))
        md.append(render_md(head, body))

    if loud:
        banner = "!!! WRONG RESULTS OR FAILED RUNS !!!"
        text.append("")
        text.append(banner)
        text += [f"!!! {m}" for m in loud]
        md.append("")
        md.append(f"**{banner}**")
        md.append("")
        md += [f"- **{m}**" for m in loud]
    print("\n".join(text))
    with open(os.path.join(out_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    print(f"\nmarkdown: {os.path.join(out_dir, 'table.md')}")
    if loud:
        for m in loud:
            print(f"!!! {m}", file=sys.stderr)
        return 1
    if not runs:
        print("no runs in runs.tsv", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/nccl-tests-logs", help="the folder of runs.tsv and the logs")
    a = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(a.out, "runs.tsv")):
        print(f"{a.out}/runs.tsv is missing (run examples-c/bench/nccl_tests.sh first)", file=sys.stderr)
        return 2
    return report(a.out)


if __name__ == "__main__":
    sys.exit(main())
