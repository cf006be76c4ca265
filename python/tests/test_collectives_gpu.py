"""The collectives on GPUs, two ranks (each a process of its own), with torch tensors and cupy arrays: every
collective over several element types, operators and sizes (both the packet and the copy algorithms), in
place and not; the framework's current stream and ``stream=``; buffers seen only through DLPack or
``__cuda_array_interface__``; errors on real tensors; every collective captured in a CUDA graph
(``torch.cuda.graph``, cupy's stream capture) and replayed with new inputs; the host cost of a call.

Rank r works on GPU r % (GPUs): on a machine with one GPU both ranks share it. These need 2 GPUs unless
``MSCCLPP_TEST_MIN_GPUS=1`` (then one is enough); they are skipped, saying why, where there are fewer
(``make test`` here); ``python/run_gpu_tests.sh`` runs them."""

from __future__ import annotations

import os

import pytest

import _collective_workers as w
import mscclpp
from _ranks import free_port, run_ranks
from mscclpp import _cuda

NGPUS = _cuda.device_count()


# As scripts/gpu-env.sh reads it: 1 lets both ranks share one GPU; anything else means 2.
MIN_GPUS = 1 if os.environ.get("MSCCLPP_TEST_MIN_GPUS") == "1" else 2
pytestmark = [
    pytest.mark.skipif(
        NGPUS < MIN_GPUS,
        reason=f"needs {MIN_GPUS} GPU{'s' if MIN_GPUS > 1 else ''} (MSCCLPP_TEST_MIN_GPUS=1 runs these with both ranks "
               f"on one GPU); this machine has {NGPUS}" + (f" ({_cuda.unavailable_reason()})" if NGPUS == 0 else ""),
    ),
    pytest.mark.skipif(not mscclpp.has_collectives(), reason="this libmscclpp has no collectives"),
]

TIMEOUT = 300  # two ranks time-slicing one GPU, spawning and importing torch or cupy: generous
SIZES = [1, 1027, 100_003]  # elements: one, an odd count, and (for 4- and 8-byte types) past the packet size

ALL_REDUCE = {
    "torch": [("float32", "sum"), ("float16", "max"), ("bfloat16", "avg"), ("int32", "prod"), ("int64", "min"),
              ("uint8", "sum"), ("int8", "avg"), ("float64", "prod")],
    "cupy": [("float32", "avg"), ("float64", "sum"), ("float16", "sum"), ("int8", "max"), ("uint32", "sum"),
             ("uint64", "min"), ("int32", "avg"), ("int64", "prod")],
}
REDUCE_SCATTER = {
    "torch": [("float32", "sum"), ("bfloat16", "max"), ("int64", "avg"), ("float16", "prod")],
    "cupy": [("float32", "min"), ("uint8", "sum"), ("float64", "avg"), ("int32", "prod")],
}
ALL_GATHER = {"torch": ["float32", "bfloat16", "int8", "int64"], "cupy": ["float16", "uint32", "float64", "uint8"]}
BROADCAST = {"torch": ["float32", "int32", "bfloat16"], "cupy": ["float64", "int8", "uint64"]}


def address() -> str:
    return f"127.0.0.1:{free_port()}"


def _ran(results: list) -> None:
    for rank, r in enumerate(results):
        assert r["failures"] == [], f"rank {rank} (GPU {r['gpu']}):\n" + "\n".join(r["failures"])


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_all_reduce(framework: str) -> None:
    _ran(run_ranks(2, w.all_reduce, address(), framework, ALL_REDUCE[framework], SIZES, timeout=TIMEOUT,
                   env=w.env_for_tests()))


def test_all_reduce_larger_than_the_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call larger than the library's scratch (1 MiB here) is cut into windows. The setting goes into this
    process's environment, which the ranks inherit when they start: the library reads its settings once,
    when the package loads it, before run_ranks' env= would apply."""
    monkeypatch.setenv("MSCCLPP_COLL_SCRATCH_MB", "1")
    _ran(run_ranks(2, w.all_reduce, address(), "torch", [("float32", "sum"), ("bfloat16", "max")], [1_000_003],
                   timeout=TIMEOUT, env=w.env_for_tests()))


@pytest.mark.parametrize("algo", ["packet", "copy"])
def test_all_reduce_and_reduce_scatter_with_either_algorithm(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each algorithm forced for every size (MSCCLPP_COLL_ALGO), odd counts included."""
    monkeypatch.setenv("MSCCLPP_COLL_ALGO", algo)
    _ran(run_ranks(2, w.all_reduce, address(), "torch", [("float16", "sum"), ("int32", "max")], [1, 1027, 100_003],
                   timeout=TIMEOUT, env=w.env_for_tests()))
    _ran(run_ranks(2, w.reduce_scatter, address(), "torch", [("bfloat16", "sum")], [1, 1027, 50_001],
                   timeout=TIMEOUT, env=w.env_for_tests()))


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_all_gather(framework: str) -> None:
    _ran(run_ranks(2, w.all_gather, address(), framework, ALL_GATHER[framework], [1, 1027, 50_001],
                   timeout=TIMEOUT, env=w.env_for_tests()))


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_reduce_scatter(framework: str) -> None:
    _ran(run_ranks(2, w.reduce_scatter, address(), framework, REDUCE_SCATTER[framework], [1, 1027, 50_001],
                   timeout=TIMEOUT, env=w.env_for_tests()))


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_broadcast(framework: str) -> None:
    _ran(run_ranks(2, w.broadcast, address(), framework, BROADCAST[framework], [1, 1027, 70_001],
                   timeout=TIMEOUT, env=w.env_for_tests()))


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_streams_protocols_and_errors(framework: str) -> None:
    results = run_ranks(2, w.streams_and_protocols, address(), framework, timeout=TIMEOUT, env=w.env_for_tests())
    _ran(results)
    for rank, r in enumerate(results):
        e = r["errors"]
        assert e["non-contiguous"].startswith("ValueError") and "not contiguous" in e["non-contiguous"], e
        assert e["complex"].startswith("TypeError") and "complex64" in e["complex"], e
        assert e["count"].startswith("ValueError") and "out has 7 elements" in e["count"], e
        if framework == "torch":
            assert e["cpu tensor"].startswith("TypeError") and "on cpu" in e["cpu tensor"], e
            assert e["dtype"].startswith("TypeError") and "differ in element type" in e["dtype"], e
            if "other gpu" in e:
                assert e["other gpu"].startswith("ValueError") and "the communicator works on GPU" in e["other gpu"], e
        else:
            assert e["bool"].startswith("TypeError") and "bool" in e["bool"], e
        if framework == "torch" and r["shim"] is not None:
            # With the extension, torch tensors are read through torch's C shim once it agreed with the
            # accessors (the errors above were raised with it on), unless this torch has no such shim.
            state, why, reads, _ = r["shim"]
            print(f"rank {rank}: torch's C shim {'on' if state == 1 else 'off: ' + why}, {reads} tensors read by it")
            assert (state == 1 and reads > 0) or (state == 0 and "was not found" in why), r["shim"]


@pytest.mark.parametrize("warm_up", [True, False], ids=["after-eager-calls", "first-call-in-capture"])
def test_torch_cuda_graph_replays(warm_up: bool) -> None:
    _ran(run_ranks(2, w.torch_graph, address(), 5, warm_up, timeout=TIMEOUT, env=w.env_for_tests()))


def test_cupy_stream_capture_replays() -> None:
    _ran(run_ranks(2, w.cupy_graph, address(), 5, timeout=TIMEOUT, env=w.env_for_tests()))


def test_the_host_cost_of_a_small_all_reduce() -> None:
    results = run_ranks(2, w.call_cost, address(), 2000, timeout=TIMEOUT, env=w.env_for_tests())
    for r in results:
        assert r["ok"], "the values changed under repeated max all-reduces"
        # Loose: only a gross regression (a synchronization, a slow lookup per call) should trip it.
        assert r["python_us"] < 100, r
    r = results[0]
    print(f"small all-reduce: {r['host_us']:.1f} us of host time per call ({r['python_us']:.1f} us in Python), "
          f"{r['total_us']:.1f} us per call until the GPU finished")
