"""The package on two GPUs: connections over cupy arrays and torch tensors, the device connection table,
kernels compiled with NVRTC (cupy) and nvcc (torch's load_inline) that call put, signal, flush, wait and the
direct methods, registered writes, four ranks two per GPU, and abort. Each rank is a process of its own.

Skipped, saying why, on machines with fewer than two GPUs (``make test`` here); run on a GPU machine by
``python/run_gpu_tests.sh``."""

from __future__ import annotations

import os
import tempfile

import pytest

import _gpu_workers as w
import mscclpp
from _ranks import free_port, run_ranks
from mscclpp import _cuda

NGPUS = _cuda.device_count()
pytestmark = pytest.mark.skipif(
    NGPUS < 2,
    reason=f"needs 2 GPUs; this machine has {NGPUS}" + (f" ({_cuda.unavailable_reason()})" if NGPUS == 0 else ""),
)

FRAMEWORKS = ["cupy", "torch"]


def address() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_device_connection_table_in_gpu_memory(framework: str) -> None:
    a = address()
    results = run_ranks(2, w.device_table, a, framework)
    for rank, seen in enumerate(results):
        assert seen["count"] == 1 and seen["nbytes"] == 80
        assert seen["remote_rank"] == 1 - rank and seen["tag"] == 7 and seen["find"] == 0
        assert seen["conn_id"] == 0, "the FIFO handle carries the connection's index"
        assert seen["local_buff_is_buffer"] and seen["remote_buff_set"]
        assert seen["device_copy_matches"] and seen["view_matches"]
        assert seen["owner_alive"], "the connected buffer (a temporary) is kept alive by the communicator"
        assert seen["device"] == seen["gpu"] == rank


def test_ping_pong_through_the_proxy() -> None:
    iters = 1000
    results = run_ranks(2, w.ping_pong, address(), iters)
    for rank, r in enumerate(results):
        assert r["failed_iter"] == 0, f"rank {rank}: wait {r['failed_iter']} timed out"
    print(f"ping-pong through the proxy: {results[0]['us_per_round_trip']:.1f} us per round trip")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("chunk", [4096, 1 << 22])
def test_put_with_signal_moves_data(framework: str, chunk: int) -> None:
    results = run_ranks(2, w.put_with_signal, address(), framework, chunk, 5)
    for rank, r in enumerate(results):
        assert r["bad"] == [], f"rank {rank}: {r['bad']}"


def test_direct_methods_move_data_without_the_proxy() -> None:
    results = run_ranks(2, w.direct_put, address(), 1 << 20)
    for rank, r in enumerate(results):
        assert r["timed_out"] == 0 and r["wrong"] == [], f"rank {rank}: {r}"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_registered_buffer_write(framework: str) -> None:
    results = run_ranks(2, w.registered_write, address(), framework, 1 << 20)
    for rank, r in enumerate(results):
        assert r["remote"] == 1
        assert r["peer_data"], f"rank {rank}: the peer's write did not land"
        assert r["own_untouched"], f"rank {rank}: its own range was written"
        assert "InvalidArgumentError" in r["errors"]["past the end"] and "past the end" in r["errors"]["past the end"]
        assert r["errors"]["src too short"].startswith("ValueError")
        assert r["errors"]["offset too big"].startswith("ValueError")


def test_four_ranks_two_per_gpu_all_gather() -> None:
    results = run_ranks(4, w.all_gather, 4, address(), 1 << 20, timeout=180)
    for rank, r in enumerate(results):
        assert r["timed_out"] == [0, 0, 0, 0] and r["wrong"] == [], f"rank {rank}: {r}"
    assert sorted(r["gpu"] for r in results) == [0, 0, 1, 1]


def test_torch_load_inline_kernel() -> None:
    with tempfile.TemporaryDirectory() as build_dir:
        results = run_ranks(2, w.torch_load_inline, address(), 1 << 20, os.path.join(build_dir, "ext"), timeout=600)
    for rank, r in enumerate(results):
        assert r["timed_out"] == 0 and r["peer_data"], f"rank {rank}: {r}"


def test_abort_ends_a_waiting_kernel() -> None:
    results = run_ranks(2, w.abort_wakes_a_waiting_kernel, address())
    r = results[0]
    assert r["status"] == 2, f"the wait ended by its deadline, not by the abort: {r}"
    assert r["kernel_end_s"] < 5, r
    assert r["async_error"] is not None


def test_a_buffer_on_another_gpu_is_refused() -> None:
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        pytest.skip("cupy is not installed")
    import cupy

    with cupy.cuda.Device(1):
        other = cupy.zeros(64, dtype=cupy.uint8)
    with mscclpp.Communicator(1, 0, unique_id=mscclpp.UniqueId.create(), device=0) as comm:
        with pytest.raises(ValueError, match="on GPU 1 and the communicator works on GPU 0"):
            comm.connect(0, 0, other)
