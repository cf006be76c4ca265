"""The host-only API, on any machine (no GPU needed): unique ids, communicators by address and by id with 2 and
4 processes, the bootstrap's all-gather and barrier, errors that carry the library's log line, logging,
and a clean exit."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import _host_workers
import mscclpp
from _ranks import free_port, run_rank_threads, run_ranks
from mscclpp import _cuda

HERE = Path(__file__).resolve().parent


def run_python(code: str, *, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter that imports the same mscclpp as this one."""
    pkg_parent = str(Path(mscclpp.__file__).resolve().parent.parent)
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([pkg_parent, str(HERE), full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


# ---- the package itself ----

def test_imports_without_a_gpu_and_finds_library_and_headers() -> None:
    assert Path(mscclpp.library_path()).exists() or mscclpp.library_path() == "libmscclpp.so.0"
    inc = Path(mscclpp.include_dir())
    assert (inc / "mscclpp.h").is_file() and (inc / "mscclppfifo.h").is_file()
    assert "mscclppDevConn" in (inc / "mscclpp.h").read_text()
    assert mscclpp.jit.nvrtc_options()[0] == f"-I{inc}"


# ---- unique ids ----

def test_unique_id_is_128_bytes_that_pickle_and_hex_round_trip() -> None:
    uid = mscclpp.UniqueId.create()
    raw = bytes(uid)
    assert len(raw) == 128
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert mscclpp.UniqueId.fromhex(uid.hex()) == uid
    assert mscclpp.UniqueId(raw) == uid and hash(mscclpp.UniqueId(raw)) == hash(uid)
    other = mscclpp.UniqueId.create()
    assert other != uid, "each id names its own root and magic"


@pytest.mark.parametrize("length", [0, 127, 129])
def test_unique_id_of_the_wrong_length_is_refused(length: int) -> None:
    with pytest.raises(ValueError, match="128 bytes"):
        mscclpp.UniqueId(b"x" * length)


def test_an_id_not_made_by_the_library_is_refused_with_its_log_line() -> None:
    with pytest.raises(mscclpp.InvalidArgumentError) as info:
        mscclpp.Communicator(2, 0, unique_id=b"\0" * 128)
    e = info.value
    assert e.code == mscclpp.ResultCode.InvalidArgument and e.function == "mscclppCommInitRankFromId"
    assert any("unique id" in line and line.startswith("MSCCLPP WARN") for line in e.log_lines), e.log_lines
    assert "unique id: unknown format tag" in str(e)


# ---- communicators in processes ----

def _check_bootstrap_results(results: list, nranks: int) -> None:
    for rank, seen in enumerate(results):
        assert seen["rank"] == rank and seen["size"] == nranks
        assert seen["gathered"] == [bytes([r]) * (r + 1) for r in range(nranks)]
        assert seen["empty"] == [b""] * nranks
        assert seen["objects"] == [{"rank": r, "name": f"r{r}"} for r in range(nranks)]
        assert f"remoteRank is {nranks + 7}" in seen["bad_connect"]


@pytest.mark.parametrize("nranks", [2, 4])
def test_ranks_in_processes_meet_by_address(nranks: int) -> None:
    address = f"127.0.0.1:{free_port()}"
    results = run_ranks(nranks, _host_workers.bootstrap_rank, nranks, address, timeout=90)
    _check_bootstrap_results(results, nranks)


@pytest.mark.parametrize("nranks", [2, 4])
def test_ranks_in_processes_meet_by_unique_id(nranks: int) -> None:
    # The root runs in this process (which made the id); the id travels to the ranks pickled.
    uid = mscclpp.UniqueId.create()
    results = run_ranks(nranks, _host_workers.bootstrap_rank, nranks, "", uid, timeout=90)
    _check_bootstrap_results(results, nranks)


def test_ranks_in_threads_of_one_process() -> None:
    """The library's blocking calls release the GIL: two ranks in two threads of one interpreter meet."""
    address = f"127.0.0.1:{free_port()}"
    out: dict = {}

    def rank_main(rank: int) -> None:
        try:
            with mscclpp.Communicator(2, rank, address=address) as comm:
                out[rank] = comm.all_gather(f"thread {rank}".encode())
                comm.barrier()
        except BaseException as e:  # noqa: BLE001
            out[rank] = e

    threads = run_rank_threads(2, rank_main)
    assert not any(t.is_alive() for t in threads)
    assert out == {0: [b"thread 0", b"thread 1"], 1: [b"thread 0", b"thread 1"]}


# ---- bad input ----

@pytest.mark.parametrize(
    "nranks, rank, address, needle",
    [
        (0, 0, "127.0.0.1:1", "nranks is 0; it must be at least 1"),
        (2, 2, "127.0.0.1:1", "rank is 2; it must be in [0, nranks = 2)"),
        (2, -1, "127.0.0.1:1", "rank is -1"),
        (1, 0, "no-port-here", "missing ':port'"),
        (1, 0, "", "empty"),
    ],
)
def test_bad_communicator_arguments_raise_with_the_library_line(nranks: int, rank: int, address: str,
                                                               needle: str) -> None:
    with pytest.raises(mscclpp.InvalidArgumentError) as info:
        mscclpp.Communicator(nranks, rank, address=address)
    assert needle in str(info.value)
    assert info.value.log_lines and info.value.log_lines[-1].startswith("MSCCLPP WARN")
    assert isinstance(info.value, ValueError), "InvalidArgumentError is also a ValueError"


def test_bad_python_arguments_raise_before_calling_the_library() -> None:
    with pytest.raises(TypeError, match="rank must be an int"):
        mscclpp.Communicator(2, "0", address="127.0.0.1:1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outside the C int range"):
        mscclpp.Communicator(2**40, 0, address="127.0.0.1:1")
    with pytest.raises(TypeError, match="exactly one of"):
        mscclpp.Communicator(1, 0)
    with pytest.raises(TypeError, match="exactly one of"):
        mscclpp.Communicator(1, 0, address="127.0.0.1:1", unique_id=b"\0" * 128)
    with pytest.raises(mscclpp.InvalidArgumentError, match="timeout is 0 seconds"):
        mscclpp.set_bootstrap_timeout(0)


class _HostArray:
    """Host memory as DLPack presents it (device type 1, CPU)."""

    def __dlpack_device__(self) -> tuple:
        return (1, 0)

    def __dlpack__(self, stream=None):  # noqa: ANN001 - never reached
        raise AssertionError("the device check comes first")


class _StridedCai:
    __cuda_array_interface__ = {"shape": (4, 4), "typestr": "<f4", "data": (0x7000_0000, False), "version": 3,
                                "strides": (32, 4)}


def test_connect_refuses_what_is_not_gpu_memory_and_bad_peers() -> None:
    address = f"127.0.0.1:{free_port()}"
    errors: dict = {}

    def rank_main(rank: int) -> None:
        with mscclpp.Communicator(2, rank, address=address) as comm:
            if rank == 0:
                for name, call in {
                    "plain object": lambda: comm.connect(1, 0, object()),
                    "host dlpack": lambda: comm.connect(1, 0, _HostArray()),
                    "strided": lambda: comm.connect(1, 0, _StridedCai()),
                    "empty": lambda: comm.connect(1, 0, (0x1000, 0)),
                    "bad transport": lambda: comm.connect(1, 0, (0x1000, 64), transport="carrier-pigeon"),
                    "peer out of range": lambda: comm.connect(2, 0, (0x1000, 64)),
                    "peer is self": lambda: comm.connect(0, 0, (0x1000, 64)),
                    "shm": lambda: comm.connect(1, 0, (0x1000, 64), transport="shm"),
                    "ib without device": lambda: comm.connect(1, 0, (0x1000, 64), transport=mscclpp.Transport.IB),
                }.items():
                    try:
                        call()
                        errors[name] = None
                    except Exception as e:  # noqa: BLE001
                        errors[name] = e
                # No connection was recorded by any of them.
                assert comm.connections == ()
            comm.barrier()

    run_rank_threads(2, rank_main)
    assert isinstance(errors["plain object"], TypeError) and "is not a GPU buffer" in str(errors["plain object"])
    assert isinstance(errors["host dlpack"], TypeError) and "CPU memory" in str(errors["host dlpack"])
    assert isinstance(errors["strided"], ValueError) and "not contiguous" in str(errors["strided"])
    assert isinstance(errors["empty"], ValueError) and "empty" in str(errors["empty"])
    assert isinstance(errors["bad transport"], ValueError) and "carrier-pigeon" in str(errors["bad transport"])
    e = errors["peer out of range"]
    assert isinstance(e, mscclpp.InvalidArgumentError) and "remoteRank is 2; it must be in [0, nranks = 2)" in str(e)
    e = errors["peer is self"]
    assert isinstance(e, mscclpp.InvalidArgumentError) and "this rank itself" in str(e)
    e = errors["shm"]
    assert isinstance(e, mscclpp.InvalidArgumentError) and "mscclppTransportSHM is not implemented" in str(e)
    e = errors["ib without device"]
    assert isinstance(e, mscclpp.InvalidArgumentError) and "ibDev" in str(e)


@pytest.mark.skipif(_cuda.available(), reason="checks the answer of a machine without a CUDA driver")
def test_without_a_driver_gpu_calls_fail_with_the_reason() -> None:
    address = f"127.0.0.1:{free_port()}"
    errors: dict = {}

    def rank_main(rank: int) -> None:
        with mscclpp.Communicator(2, rank, address=address) as comm:
            comm.barrier()  # both have finished joining before either leaves
            try:
                comm.connect(1 - rank, 0, (0x7000_0000, 4096))
            except mscclpp.MscclppError as e:
                errors[rank] = e

    run_rank_threads(2, rank_main)
    for rank in range(2):
        e = errors[rank]
        assert isinstance(e, mscclpp.CudaError), e
        assert "CUDA driver" in str(e) and e.function == "mscclppConnect"


def test_calls_in_the_wrong_order_are_invalid_usage() -> None:
    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
        with pytest.raises(mscclpp.InvalidUsageError, match="no connections"):
            comm.device_connections()
        with pytest.raises(mscclpp.InvalidUsageError, match="call mscclppConnectionSetup first"):
            comm.register_buffer((0x1000, 64))
        # With no connections there is no proxy to launch; stopping it is harmless.
        with comm.proxy():
            pass
        comm.setup()


def test_a_closed_communicator_says_so() -> None:
    comm = mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create())
    assert not comm.closed
    comm.close()
    comm.close()  # twice is fine
    assert comm.closed
    for call in (comm.barrier, lambda: comm.all_gather(b"x"), comm.setup, comm.launch_proxy, lambda: comm.rank,
                 lambda: comm.size, lambda: comm.nranks):
        with pytest.raises(mscclpp.InvalidUsageError, match="closed"):
            call()
    assert "closed" in repr(comm) and "rank=0" in repr(comm)
    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as c2:
        pass
    assert c2.closed


def test_peers_that_never_come_end_in_remote_error_within_the_timeout() -> None:
    mscclpp.set_bootstrap_timeout(2)
    try:
        start = time.monotonic()
        with pytest.raises(mscclpp.RemoteError) as info:
            mscclpp.Communicator(2, 1, address=f"127.0.0.1:{free_port()}")
        took = time.monotonic() - start
    finally:
        mscclpp.set_bootstrap_timeout(30)
    assert took < 15, took
    assert info.value.log_lines, "the failure is logged"


# ---- logging ----

def test_library_lines_reach_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mscclpp"):
        with pytest.raises(mscclpp.InvalidArgumentError):
            mscclpp.Communicator(3, 5, address="127.0.0.1:1")
    records = [r for r in caplog.records if r.name.startswith("mscclpp.")]
    assert records, caplog.records
    assert records[-1].levelno == logging.WARNING
    assert "rank is 5; it must be in [0, nranks = 3)" in records[-1].getMessage()


def test_info_lines_with_mscclpp_debug_info_and_log_lines_from_library_threads() -> None:
    r = run_python(
        """
        import logging, mscclpp
        lines = []
        class Keep(logging.Handler):
            def emit(self, record):
                lines.append((record.name, record.levelname, record.getMessage()))
        logging.getLogger("mscclpp").addHandler(Keep())
        logging.getLogger("mscclpp").setLevel(logging.INFO)
        with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
            comm.barrier()
        assert any(l == "INFO" and "communicator ready: rank 0 of 1" in m for _, l, m in lines), lines
        assert any("unique id: root at" in m for _, _, m in lines), lines
        print("ok", len(lines))
        """,
        env={"MSCCLPP_DEBUG": "INFO"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_log_to_python_false_gives_lines_back_to_the_library_default_handler() -> None:
    r = run_python(
        """
        import mscclpp
        mscclpp.log_to_python(False)
        try:
            mscclpp.Communicator(0, 0, address="127.0.0.1:1")
        except mscclpp.InvalidArgumentError as e:
            assert "mscclppCommInitRank failed with mscclppInvalidArgument" in str(e), e
            assert "log_to_python(False)" in str(e), e
            print("raised")
        mscclpp.log_to_python(True)
        try:
            mscclpp.Communicator(0, 0, address="127.0.0.1:1")
        except mscclpp.InvalidArgumentError as e:
            assert "nranks is 0" in str(e), e
            print("raised again")
        """
    )
    assert r.returncode == 0, r.stderr
    assert "raised" in r.stdout and "raised again" in r.stdout
    # The first line went to standard error through the library's own handler; the second, with no handler
    # configured in Python, only into the exception (caught here), not through the last-resort handler too.
    assert r.stderr.count("MSCCLPP WARN rank - FFI: mscclppCommInitRank: nranks is 0") == 1, r.stderr


def test_a_failed_calls_line_is_shown_once_without_logging_configured() -> None:
    # No handler configured: the exception alone carries the line of a failed call (the traceback shows it);
    # Python's last-resort handler does not print it first. A collective (logged at once, for its per-call
    # cost) prints it once too: its exception points at the line instead of repeating it.
    r = run_python(
        """
        import mscclpp
        class Cai:
            def __init__(self, n, ptr):
                self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False),
                                                 "version": 3, "strides": None}
        comm = mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create())
        try:
            mscclpp.all_reduce(Cai(16, 1 << 20), comm=comm)
        except mscclpp.MscclppError as e:
            print("collective:", e, "|", len(e.log_lines))
        comm.connect(5, 0, (0x1000, 64))
        """
    )
    assert r.returncode != 0
    line = "MSCCLPP WARN rank 0 FFI: mscclppConnect: remoteRank is 5"
    assert r.stderr.count(line) == 1, r.stderr
    assert "InvalidArgumentError: mscclppConnect failed" in r.stderr, r.stderr
    if "collective:" in r.stdout:  # the library refused it (no driver, or not device memory): logged once
        logged = [l for l in r.stderr.splitlines() if "mscclppAllReduce" in l and l.startswith("MSCCLPP")]
        assert len(logged) <= 1, r.stderr
        assert r.stdout.rstrip().endswith("| 1") and ("above" in r.stdout) == bool(logged), r.stdout


# ---- exit and leaks ----

def test_interpreter_exit_closes_what_was_left_open_without_hanging() -> None:
    port = free_port()
    r = run_python(
        f"""
        import threading, mscclpp
        mscclpp.UniqueId.create()                    # a root nobody joins
        kept = []
        def rank_main(rank):
            comm = mscclpp.Communicator(2, rank, address="127.0.0.1:{port}")
            comm.barrier()
            kept.append(comm)                        # never closed
        ts = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("leaving", len(kept))
        """,
        env={"MSCCLPP_DEBUG": "INFO"},  # library threads log while closing: they must not call a dead interpreter
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "leaving 2" in r.stdout
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_ranks_in_processes_that_leave_communicators_open_exit() -> None:
    address = f"127.0.0.1:{free_port()}"
    # run_ranks fails the test if a rank does not exit within 30 s of reporting, or exits non-zero.
    results = run_ranks(2, _host_workers.leave_open, 2, address, timeout=60)
    assert all("Communicator(rank=" in r for r in results)


def _fds_and_threads() -> tuple:
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_closing_releases_sockets_and_threads() -> None:
    def cycle() -> None:
        with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
            comm.barrier()
            comm.all_gather(b"x")

    cycle()  # whatever is made once per process (the logger, thread pools) is made here
    time.sleep(0.5)
    before = _fds_and_threads()
    for _ in range(20):
        cycle()
    deadline = time.monotonic() + 10
    after = _fds_and_threads()
    while time.monotonic() < deadline and (after[0] > before[0] + 2 or after[1] > before[1] + 2):
        time.sleep(0.2)
        after = _fds_and_threads()
    assert after[0] <= before[0] + 2, f"file descriptors: {before[0]} before 20 communicators, {after[0]} after"
    assert after[1] <= before[1] + 2, f"threads: {before[1]} before 20 communicators, {after[1]} after"


# ---- abort and the asynchronous error (from the failure-handling work) ----

def test_abort_without_library_support_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # A library built before the two functions existed: the package reports what it lacks instead of crashing.
    from mscclpp import comm as comm_module

    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create()) as comm:
        real_has = comm_module.lib.has
        missing = {"mscclppCommAbort", "mscclppCommGetAsyncError"}
        monkeypatch.setattr(comm_module.lib, "has", lambda name: name not in missing and real_has(name))
        assert not mscclpp.has_abort()
        with pytest.raises(NotImplementedError, match="mscclppCommAbort"):
            comm.abort()
        with pytest.raises(NotImplementedError, match="mscclppCommGetAsyncError"):
            comm.async_error()
        monkeypatch.undo()
        assert mscclpp.has_abort()
        assert comm.async_error() is None


@pytest.mark.skipif(not mscclpp.has_abort(), reason="this libmscclpp has no mscclppCommAbort/GetAsyncError yet")
def test_abort_and_async_error() -> None:
    comm = mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create())
    assert comm.async_error() is None
    comm.abort()
    err = comm.async_error()
    assert isinstance(err, mscclpp.MscclppError) and err.code != mscclpp.ResultCode.Success
    comm.close()
    with pytest.raises(mscclpp.InvalidUsageError):
        comm.abort()
    with pytest.raises(mscclpp.InvalidUsageError):
        comm.async_error()
