"""Shared pieces of the package's tests: the header lines, the summary line the repository's test runners
count ("python tests: N passed, N failed, N skipped"), and ranks in processes."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the helpers beside this file (and in children)

import mscclpp  # noqa: E402


def pytest_report_header(config: pytest.Config) -> str:
    from mscclpp import collectives

    return (f"mscclpp {mscclpp.__version__} from {os.path.dirname(mscclpp.__file__)}; library "
            f"{mscclpp.library_path()}; headers {mscclpp.include_dir()}; {collectives._fastcall_state()}")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    terminalreporter.write_line(f"python tests: {passed} passed, {failed} failed, {skipped} skipped")
