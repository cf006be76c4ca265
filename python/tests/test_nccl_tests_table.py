"""The nccl-tests comparison's own logic, without a GPU: examples-c/bench/nccl_tests_table.py's reading of
nccl-tests output (rows, footer, versions), its side-by-side tables and ratios, its loud failure on
#wrong != 0, failed or missing runs; and examples-c/bench/nccl_tests.sh's syntax (bash -n, shellcheck where
installed) and usage. The nccl-tests output below is written here by hand in that program's format."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from typing import List, Optional, Sequence

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "examples-c", "bench")
HELPER = os.path.join(BENCH, "nccl_tests_table.py")
SCRIPT = os.path.join(BENCH, "nccl_tests.sh")

_spec = importlib.util.spec_from_file_location("nccl_tests_table", HELPER)
assert _spec is not None and _spec.loader is not None
table = importlib.util.module_from_spec(_spec)
sys.modules["nccl_tests_table"] = table  # dataclasses look their module up by name
_spec.loader.exec_module(table)

HEADER = """\
# nccl-tests version 2.17.9 nccl-headers=22809 nccl-library={lib}
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 1024 maxBytes 1048576 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid  12345 on    host-a device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  12346 on    host-a device  1 [0000:2a:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""

FOOTER = """\
# Out of bounds values : {oob} {ok}
# Avg bus bandwidth    : {avg}
#
# Collective test concluded: all_reduce_perf
"""


def row(size: int, oop_us: float, ip_us: float, wrong_oop: str = "0", wrong_ip: str = "0",
        dtype: str = "float", redop: str = "sum", root: int = -1) -> str:
    count = size // 4

    def bw(us: float) -> str:
        return f"{size / us / 1000.0:.2f}"

    return (f"{size:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:6d}  {oop_us:7.2f}  {bw(oop_us):>6s}  "
            f"{bw(oop_us):>6s}  {wrong_oop:>6s}  {ip_us:7.2f}  {bw(ip_us):>6s}  {bw(ip_us):>6s}  {wrong_ip:>6s}")


def nccl_tests_output(rows: Sequence[str], lib: int = 22809, avg: str = "1.23", oob: int = 0,
                      footer: bool = True, noise: Sequence[str] = ()) -> str:
    text = HEADER.format(lib=lib) + "".join(f"{n}\n" for n in noise) + "".join(f"{r}\n" for r in rows)
    if footer:
        text += FOOTER.format(oob=oob, ok="FAILED" if oob else "OK", avg=avg)
    return text


def write_out(tmp_path, runs: List[Sequence[str]], logs: dict, meta: Optional[dict] = None) -> str:  # type: ignore[no-untyped-def]
    """runs: (coll, mode, reg, lib, rc, log name or "") records of runs.tsv; logs: name -> text."""
    meta = {"machine": "2 x NVIDIA H100 80GB HBM3 (driver 580.00)", "date": "2026-01-02 03:04 UTC",
            "commit": "abc1234", "command": "examples-c/bench/nccl_tests.sh --quick", "ranks": "2", "gpus": "2",
            "nccl_h": "2.28.9", "sizes": "-b 1K -e 1M -f 4", "check": "1", "extra": "", **(meta or {})}
    lines = [f"meta\t{k}\t{v}" for k, v in meta.items()]
    for coll, mode, reg, lib, rc, log in runs:
        args = "-n 20 -w 5" if mode == "eager" else "-G 10 -n 50 -w 5"
        note = "not run: 4 ranks on 2 GPUs, and NVIDIA's NCCL refuses two ranks on one GPU" if rc == "skip" else ""
        lines.append("\t".join(["run", coll, mode, reg, lib, rc, "1.0", log, args, note]))
    (tmp_path / "runs.tsv").write_text("\n".join(lines) + "\n")
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


def run_helper(out: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([sys.executable, HELPER, "--out", out], capture_output=True, text=True, timeout=60)


def md_row(md: str, first_cell: str) -> str:
    return next(r for r in md.splitlines() if r.startswith(f"| {first_cell} |"))


# --- The parser ------------------------------------------------------------------------------------------------

def test_a_log_gives_its_rows_footer_and_versions() -> None:
    text = nccl_tests_output([row(1024, 10.12, 9.80), row(4096, 11.50, 11.25)], lib=23203, avg="0.31",
                             noise=["host-a:12345:12345 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.1<0>"])
    log = table.parse_log(text)
    assert [r.size for r in log.rows] == [1024, 4096]
    first = log.rows[0]
    assert (first.count, first.dtype, first.redop, first.root) == (256, "float", "sum", -1)
    assert first.oop.time_us == pytest.approx(10.12) and first.ip.time_us == pytest.approx(9.80)
    assert first.oop.algbw == pytest.approx(0.10) and first.oop.wrong == 0 and first.ip.wrong == 0
    assert log.avg_busbw == pytest.approx(0.31) and log.out_of_bounds == 0 and log.complete
    assert (log.nccl_headers, log.nccl_library) == (22809, 23203)
    assert table.fmt_version(22809) == "2.28.9" and table.fmt_version(23203) == "2.32.3"


def test_the_hand_written_row_of_the_format_parses() -> None:
    line = "        1024           256     float     sum      -1    10.12    0.10    0.10      0    9.80    0.10    0.10      0"
    r = table.parse_log(line).rows[0]
    assert (r.size, r.oop.time_us, r.ip.time_us, r.oop.wrong, r.ip.wrong) == (1024, 10.12, 9.80, 0, 0)


def test_unchecked_results_large_times_and_timestamps_parse() -> None:
    # -c 0 prints N/A for #wrong; %g and the float formatter give 1e+06-style numbers; -S 1 adds a timestamp.
    text = (HEADER.format(lib=22809).replace("#wrong\n#        (B)", "#wrong  timestamp\n#        (B)")
            + "  1073741824     268435456     float     sum      -1  1.2e+04   89.48   89.48    N/A  11800.5   90.99"
              "   90.99    N/A 2026-01-02 03:04:05\n"
            + "        1024           256     float     sum      -1    10.12    0.10    0.10  1e+06    9.80    0.10"
              "    0.10      0\n")
    log = table.parse_log(text)
    big, small = log.rows
    assert big.oop.time_us == pytest.approx(12000.0) and big.oop.wrong is None and big.ip.time_us == 11800.5
    assert small.oop.wrong == 1000000
    assert not log.complete  # no footer: cut short


def test_a_row_without_a_reduction_parses() -> None:
    # hypercube_perf prints its redop column blank.
    line = "        1024           128     float              -1    24.70    0.02    0.02       0    20.12    0.03    0.03       0"
    r = table.parse_log(line).rows[0]
    assert (r.size, r.count, r.dtype, r.redop, r.root) == (1024, 128, "float", "", -1)
    assert (r.oop.time_us, r.ip.time_us, r.ip.wrong) == (24.70, 20.12, 0)


def test_per_iteration_columns_are_skipped_by_the_header() -> None:
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong    i_min    i_max"
              "    i_p99    i_cv%     time   algbw   busbw #wrong    i_min    i_max    i_p99    i_cv%\n")
    line = ("        1024           256     float     sum      -1    10.00    0.10    0.10      0     9.00    11.00"
            "    11.00     3.00    20.00    0.05    0.05      2    19.00    21.00    21.00     2.00\n")
    r = table.parse_log(header + line).rows[0]
    assert r.oop.time_us == 10.0 and r.ip.time_us == 20.0 and r.ip.wrong == 2


def test_errors_are_kept_and_other_lines_ignored() -> None:
    text = ("Invalid number of GPUs: 3 requested but only 2 were found.\n"
            "host-a: Test NCCL failure common.cu:1100 'unhandled cuda error'\n"
            "# a comment 12 34\n  12 apples and 34 pears\n")
    log = table.parse_log(text)
    assert log.rows == [] and len(log.errors) == 2 and "Invalid number of GPUs" in log.errors[0]


# --- The tables ------------------------------------------------------------------------------------------------

def _pair_of_runs(tmp_path, ours_rows, nvidia_rows, ours_kw=None, nv_kw=None, ours_rc="0"):  # type: ignore[no-untyped-def]
    logs = {"all_reduce.eager.R0.nvidia.log": nccl_tests_output(nvidia_rows, **(nv_kw or {})),
            "all_reduce.eager.R0.ours.log": nccl_tests_output(ours_rows, lib=23203, **(ours_kw or {}))}
    runs = [("all_reduce", "eager", "0", "nvidia", "0", "all_reduce.eager.R0.nvidia.log"),
            ("all_reduce", "eager", "0", "ours", ours_rc, "all_reduce.eager.R0.ours.log")]
    return write_out(tmp_path, runs, logs)


def test_the_table_puts_both_libraries_side_by_side_with_ratios(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.00, 6.00), row(1 << 20, 30.00, 30.00)],
                        nvidia_rows=[row(1024, 10.00, 8.00), row(1 << 20, 20.00, 40.00)])
    res = run_helper(out)
    assert res.returncode == 0, res.stdout + res.stderr
    md = (tmp_path / "table.md").read_text()
    assert "2 x NVIDIA H100 80GB HBM3" in md and "abc1234" in md and "2026-01-02" in md
    assert "`examples-c/bench/nccl_tests.sh --quick`" in md
    assert "NVIDIA reports 2.28.9" in md and "ours reports 2.32.3" in md
    assert "#### all_reduce_perf, eager (-n 20 -w 5), -R 0" in md
    small = md_row(md, "1 KiB")
    # NVIDIA 10 / 8 us, ours 5 / 6: ratios 0.50 and 0.75, algBW of each, #wrong 0 / 0 of each.
    assert "| 10.00 / 8.00 | 5.00 / 6.00 | 0.50 / 0.75 | 0.10 / 0.13 | 0.20 / 0.17 | 0 / 0 | 0 / 0 |" in small, small
    big = md_row(md, "1 MiB")
    assert "| **1.50** / 0.75 |" in big, big  # ours slower out-of-place: bold in the markdown
    # The text table says the same, and the summary counts the sizes where ours is faster.
    assert "0.50 / 0.75" in res.stdout and "ours faster at 1 of 2 sizes" in res.stdout
    assert "worst 1.50 at 1 MiB" in res.stdout
    summary = md.split("#### Summary (out-of-place)")[1]
    assert "| all_reduce | eager | 0 | 1 of 2 | 0.87 | 1.50 (1 MiB) | 1.23 | 1.23 | ok |" in summary, summary
    assert "WRONG" not in md and "FAILED" not in res.stdout


def test_wrong_results_are_flagged_loudly_and_fail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.00, 6.00), row(4096, 5.00, 6.00, wrong_ip="12")],
                        nvidia_rows=[row(1024, 10.00, 8.00), row(4096, 10.00, 8.00)], ours_kw={"oob": 12})
    res = run_helper(out)
    assert res.returncode == 1
    assert "!!! all_reduce eager -R 0 ours: FAILED" in res.stderr
    assert "#wrong 12 at 4 KiB float sum root -1 in-place" in res.stderr and "12 out-of-bounds values" in res.stderr
    md = (tmp_path / "table.md").read_text()
    assert "**WRONG 0 / 12**" in md_row(md, "4 KiB")
    assert "WRONG" not in md_row(md, "1 KiB")
    assert "WRONG RESULTS OR FAILED RUNS" in md and "WRONG 0 / 12 !!!" in res.stdout


def test_a_failed_run_fails_and_the_other_library_still_shows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    logs = {"all_gather.graph.R0.nvidia.log": nccl_tests_output([row(1024, 10.0, 10.0)]),
            "all_gather.graph.R0.ours.log": "host-a: Test NCCL failure common.cu:1100 'internal error'\n"}
    runs = [("all_gather", "graph", "0", "nvidia", "0", "all_gather.graph.R0.nvidia.log"),
            ("all_gather", "graph", "0", "ours", "1", "all_gather.graph.R0.ours.log")]
    res = run_helper(write_out(tmp_path, runs, logs))
    assert res.returncode == 1
    assert "exit status 1" in res.stderr and "no result rows" in res.stderr and "internal error" in res.stderr
    md = (tmp_path / "table.md").read_text()
    # NVIDIA's row alone, and the failure said under the table.
    assert md_row(md, "1 KiB") == "| 1 KiB | 10.00 / 10.00 | 0.10 / 0.10 | 0 / 0 |"
    assert "**ours: FAILED: exit status 1; no result rows" in md


def test_a_run_cut_short_fails_even_with_exit_status_0(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.0, 5.0)], nvidia_rows=[row(1024, 10.0, 10.0)],
                        ours_kw={"footer": False})
    res = run_helper(out)
    assert res.returncode == 1 and "no result footer (cut short)" in res.stderr


def test_a_timeout_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.0, 5.0)], nvidia_rows=[row(1024, 10.0, 10.0)],
                        ours_kw={"footer": False}, ours_rc="124")
    res = run_helper(out)
    assert res.returncode == 1 and "exit status 124 (timed out)" in res.stderr


def test_a_skipped_library_is_a_note_not_a_failure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    logs = {"all_reduce.eager.R0.ours.log": nccl_tests_output([row(1024, 5.0, 6.0)], lib=23203)}
    runs = [("all_reduce", "eager", "0", "nvidia", "skip", ""),
            ("all_reduce", "eager", "0", "ours", "0", "all_reduce.eager.R0.ours.log")]
    res = run_helper(write_out(tmp_path, runs, logs, meta={"ranks": "4"}))
    assert res.returncode == 0, res.stdout + res.stderr
    md = (tmp_path / "table.md").read_text()
    assert "4 MPI processes on 2 GPUs, rank r on GPU r % 2" in md
    assert "NVIDIA: not run: 4 ranks on 2 GPUs" in md
    # The title and the facts do not speak of a comparison that did not run.
    assert "### nccl-tests: our libnccl.so.2 alone, 4 ranks" in md
    assert "against ours" not in md and "ratio" not in md
    # NVIDIA's columns and the ratio are left out; ours stay.
    assert "| size | ours us (out / in) | ours algBW GB/s | ours #wrong |" in md
    assert md_row(md, "1 KiB") == "| 1 KiB | 5.00 / 6.00 | 0.20 / 0.17 | 0 / 0 |"


def test_a_size_missing_from_one_library_keeps_its_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.0, 5.0)],
                        nvidia_rows=[row(1024, 10.0, 10.0), row(4096, 12.0, 12.0)])
    res = run_helper(out)
    assert res.returncode == 0, res.stderr
    md = (tmp_path / "table.md").read_text()
    assert "| 12.00 / 12.00 | - | - / - |" in md_row(md, "4 KiB")
    assert "ours faster at 1 of 1 sizes" in md


def test_several_types_get_a_column_of_their_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = [row(1024, 10.0, 10.0), row(1024, 10.0, 10.0, dtype="half", redop="max")]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.0, 5.0), row(1024, 20.0, 20.0, dtype="half", redop="max")],
                        nvidia_rows=rows)
    assert run_helper(out).returncode == 0
    md = (tmp_path / "table.md").read_text()
    assert "| size | type op root |" in md
    assert "| 1 KiB | half max -1 | 10.00 / 10.00 | 20.00 / 20.00 | **2.00** / **2.00** |" in md


def test_other_builds_and_later_rounds_get_columns_and_ratios_of_their_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # nccl_tests.sh --lib b=DIR --rounds 2: NVIDIA, ours, b, then each again as NAME-r2, in that run order.
    times = {"nvidia": 10.0, "ours": 5.0, "b": 4.0, "nvidia-r2": 11.0, "ours-r2": 6.0, "b-r2": 12.0}
    logs = {f"all_reduce.eager.R0.{lib}.log": nccl_tests_output([row(1024, t, t)]) for lib, t in times.items()}
    runs = [("all_reduce", "eager", "0", lib, "0", f"all_reduce.eager.R0.{lib}.log") for lib in times]
    res = run_helper(write_out(tmp_path, runs, logs))
    assert res.returncode == 0, res.stdout + res.stderr
    md = (tmp_path / "table.md").read_text()
    head = next(r for r in md.splitlines() if r.startswith("| size |"))
    assert head.startswith("| size | NVIDIA us (out / in) | ours us (out / in) | b us (out / in) | NVIDIA-r2 us "
                           "(out / in) | ours-r2 us (out / in) | b-r2 us (out / in) | ours/NVIDIA (out / in) | "
                           "b/NVIDIA (out / in) | NVIDIA-r2/NVIDIA (out / in) |"), head
    # Every ratio against NVIDIA's first run; a slower one bold.
    assert "| 0.50 / 0.50 | 0.40 / 0.40 | **1.10** / **1.10** | 0.60 / 0.60 | **1.20** / **1.20** |" in md_row(md, "1 KiB")
    summary = md.split("#### Summary (out-of-place)")[1]
    assert "| b avg busbw | NVIDIA-r2 avg busbw | ours-r2 avg busbw | b-r2 avg busbw | runs |" in summary, summary


def test_without_nvidia_the_other_builds_are_compared_with_ours(tmp_path) -> None:  # type: ignore[no-untyped-def]
    logs = {f"all_reduce.eager.R0.{lib}.log": nccl_tests_output([row(1024, t, t)]) for lib, t in (("ours", 5.0), ("b", 4.0))}
    runs = [("all_reduce", "eager", "0", "nvidia", "skip", ""),
            ("all_reduce", "eager", "0", "ours", "0", "all_reduce.eager.R0.ours.log"),
            ("all_reduce", "eager", "0", "b", "0", "all_reduce.eager.R0.b.log")]
    res = run_helper(write_out(tmp_path, runs, logs, meta={"ranks": "4"}))
    assert res.returncode == 0, res.stdout + res.stderr
    md = (tmp_path / "table.md").read_text()
    assert "| size | ours us (out / in) | b us (out / in) | b/ours (out / in) |" in md
    assert "| 5.00 / 5.00 | 4.00 / 4.00 | 0.80 / 0.80 |" in md_row(md, "1 KiB")


def test_a_library_name_shows_its_round() -> None:
    assert [table.lib_name(x) for x in ("nvidia", "ours", "b_2", "nvidia-r2", "ours-r10", "b_2-r3")] == [
        "NVIDIA", "ours", "b_2", "NVIDIA-r2", "ours-r10", "b_2-r3"]
    assert table.lib_order(["b", "ours", "nvidia", "b-r2", "ours"]) == ["nvidia", "ours", "b", "b-r2"]


def test_no_runs_tsv_is_a_usage_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = run_helper(str(tmp_path))
    assert res.returncode == 2 and "runs.tsv is missing" in res.stderr


# --- The script ------------------------------------------------------------------------------------------------

def test_the_script_is_executable_and_parses() -> None:
    assert os.access(SCRIPT, os.X_OK) and os.access(HELPER, os.X_OK)
    res = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing() -> None:
    res = subprocess.run(["shellcheck", "-x", SCRIPT], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_usage_names_the_source_and_no_source_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k != "NCCL_TESTS_SRC"}
    res = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0 and "https://github.com/NVIDIA/nccl-tests" in res.stdout
    for opt in ("--ranks", "--colls", "--modes", "--reg", "--sizes", "--libs", "--lib NAME=DIR", "--with NAME=VAR=VALUE",
                "--rounds", "--quick", "--extra", "--out"):
        assert opt in res.stdout, opt
    res = subprocess.run(["bash", SCRIPT, "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert res.returncode == 2 and "NCCL_TESTS_SRC is not set" in res.stderr
    res = subprocess.run(["bash", SCRIPT, "--modes", "lazy", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 2 and "neither eager nor graph" in res.stderr
    # Other builds (--lib NAME=DIR) and rounds: checked before anything is built.
    for args, says in ((["--lib", "B=" + str(tmp_path)], "NAME of lower-case letters"),
                       (["--lib", str(tmp_path)], "--lib takes NAME=DIR"),
                       (["--lib", "ours=" + str(tmp_path)], "the name 'ours' is taken"),
                       (["--lib", "b=" + str(tmp_path)], f"no libnccl.so.2 in {tmp_path}"),
                       (["--rounds", "0"], "--rounds takes a positive number"),
                       # Ours again with settings (--with NAME=VAR=VALUE,...).
                       (["--with", "rings"], "--with takes NAME=VAR=VALUE"),
                       (["--with", "Rings=MSCCLPP_COLL_ALGO=sendrecv"], "NAME of lower-case letters"),
                       (["--with", "ours=MSCCLPP_COLL_ALGO=sendrecv"], "the name 'ours' is taken"),
                       (["--with", "rings=PATH=/tmp"], "'PATH=/tmp' is not VAR=VALUE of an MSCCLPP_* or NCCL_*"),
                       (["--with", "rings=MSCCLPP_COLL_ALGO=sendrecv,MSCCLPP_SENDRECV_LANES="],
                        "'MSCCLPP_SENDRECV_LANES=' is not VAR=VALUE"),
                       (["--with", "r=MSCCLPP_COLL_ALGO=copy", "--with", "r=MSCCLPP_COLL_ALGO=packet"],
                        "the name 'r' is taken")):
        res = subprocess.run(["bash", SCRIPT, *args, "--out", str(tmp_path)], capture_output=True, text=True,
                             timeout=60, env=env)
        assert res.returncode == 2 and says in res.stderr, (args, res.stderr)
    (tmp_path / "libnccl.so.2").write_text("")
    res = subprocess.run(["bash", SCRIPT, "--lib", "b=" + str(tmp_path), "--lib", "b=" + str(tmp_path), "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and "the name 'b' is taken" in res.stderr, res.stderr
    res = subprocess.run(["bash", SCRIPT, "--lib", "b=" + str(tmp_path), "--rounds", "2", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and "NCCL_TESTS_SRC is not set" in res.stderr, res.stderr  # the options passed
    res = subprocess.run(["bash", SCRIPT, "--with", "rings=MSCCLPP_COLL_ALGO=sendrecv,MSCCLPP_SENDRECV_DEPTH=4",
                          "--lib", "c=" + str(tmp_path), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 2 and "NCCL_TESTS_SRC is not set" in res.stderr, res.stderr  # the options passed


def test_the_script_tabulates_again_from_its_logs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _pair_of_runs(tmp_path, ours_rows=[row(1024, 5.0, 5.0)], nvidia_rows=[row(1024, 10.0, 10.0)])
    res = subprocess.run(["bash", SCRIPT, "--table-only", "--out", out], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0.50 / 0.50" in res.stdout and (tmp_path / "table.md").exists()
