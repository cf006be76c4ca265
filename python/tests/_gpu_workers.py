"""What each rank of the GPU tests runs, in its own process, on GPU ``rank % (GPUs)``. Kernels are compiled
with NVRTC through cupy (also for torch tensors, which cupy views without a copy), except in the
load_inline test. Every wait in a kernel has a deadline, so that a broken signal fails a test instead of
hanging it."""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

import pytest

import mscclpp
from mscclpp import _cuda

WAIT_TIMEOUT_NS = 10_000_000_000
SENTINEL = 255  # patterns are below 251, so no pattern byte is the sentinel

KERNELS = mscclpp.jit.WAITS_WITH_DEADLINE + r"""
// Rank 0 signals first; each rank answers the other's signal. status[0]: the 1-based iteration whose wait
// timed out (0: none); status[1]: nanoseconds for all iterations.
extern "C" __global__ void ping_pong(mscclppDevConn* conns, int rank, int iters, unsigned long long* status)
{
  if (threadIdx.x + blockIdx.x != 0) return;
  mscclppDevConn& c = conns[0];
  const unsigned long long t0 = globalTimerNs();
  for (int i = 0; i < iters; ++i) {
    if (rank == 0) c.signal();
    if (!waitFor(c)) {
      status[0] = i + 1;
      return;
    }
    if (rank != 0) c.signal();
  }
  c.flush();
  status[1] = globalTimerNs() - t0;
}

// Block b puts [offset, offset + bytes) into the peer of connection b at the same offset, with a signal, then
// waits for that peer's signal (its data has then arrived here). status[b] = 1 if that wait timed out.
extern "C" __global__ void put_own_range(mscclppDevConn* conns, int n, unsigned long long offset,
                                         unsigned long long bytes, unsigned long long* status)
{
  const int b = blockIdx.x;
  if (b >= n || threadIdx.x != 0) return;
  mscclppDevConn& c = conns[b];
  c.putWithSignal(offset, offset, bytes);
  if (!waitFor(c)) {
    status[b] = 1;
    return;
  }
  c.flush();
}

// The proxy-free way: the block writes into the peer's buffer itself, then signals it directly.
extern "C" __global__ void direct_put_own_range(mscclppDevConn* conns, unsigned long long offset,
                                                unsigned long long bytes, unsigned long long* status)
{
  mscclppDevConn& c = conns[0];
  c.directPutBlock(offset, offset, bytes);
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    c.directSignal();
    if (!directWaitFor(c)) status[0] = 1;
  }
}

// Waits for a signal that never comes (until an abort, or the deadline: status[0] = 1).
extern "C" __global__ void wait_once(mscclppDevConn* conns, unsigned long long* status)
{
  if (threadIdx.x + blockIdx.x != 0) return;
  status[0] = waitFor(conns[0]) ? 2 : 1;
}
"""

_module: Any = None


def _kernels() -> Any:
    global _module
    if _module is None:
        _module = mscclpp.jit.cupy_module(KERNELS)
    return _module


def _prepare(rank: int, framework: str) -> int:
    """Picks this rank's GPU and makes the framework use it; skips when something needed is missing."""
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")  # docs/mscclpp.md: kernels that wait on each other
    try:
        import cupy  # noqa: F401
    except ImportError:
        pytest.skip("cupy is not installed (the GPU tests compile their kernels with it)")
    ngpus = _cuda.device_count()
    if ngpus < 1:
        pytest.skip("no GPU")
    gpu = rank % ngpus
    if framework == "torch":
        try:
            import torch
        except ImportError:
            pytest.skip("torch is not installed")
        torch.cuda.set_device(gpu)
        torch.zeros(1, device="cuda")  # the context exists and is current from here on
    import cupy

    cupy.cuda.Device(gpu).use()
    return gpu


class Frame:
    """The few array operations the tests need, in cupy or torch (the buffers are that framework's)."""

    def __init__(self, framework: str) -> None:
        self.name = framework
        import cupy

        self.cp = cupy
        if framework == "torch":
            import torch

            self.torch = torch

    def zeros(self, n: int) -> Any:
        if self.name == "torch":
            return self.torch.zeros(n, dtype=self.torch.uint8, device="cuda")
        return self.cp.zeros(n, dtype=self.cp.uint8)

    def view(self, buf: Any) -> Any:
        """A cupy view of ``buf`` (no copy), for kernels and checks."""
        return self.cp.asarray(buf)

    def sync(self) -> None:
        if self.name == "torch":
            self.torch.cuda.synchronize()
        self.cp.cuda.Device().synchronize()


def pattern(cp: Any, rank: int, salt: int, n: int, start: int = 0) -> Any:
    i = cp.arange(start, start + n, dtype=cp.uint64)
    return ((i * 131 + rank * 7919 + salt * 31) % 251).astype(cp.uint8)


def fill_own_range(v: Any, cp: Any, rank: int, salt: int, chunk: int) -> None:
    v[:] = SENTINEL
    v[rank * chunk:(rank + 1) * chunk] = pattern(cp, rank, salt, chunk, rank * chunk)


def check_all_ranges(v: Any, cp: Any, nranks: int, salt: int, chunk: int) -> List[int]:
    """The ranks whose range of ``v`` does not hold their pattern."""
    return [r for r in range(nranks)
            if not bool((v[r * chunk:(r + 1) * chunk] == pattern(cp, r, salt, chunk, r * chunk)).all())]


def _wait_stream(cp: Any, seconds: float = 60) -> None:
    """Waits for the current device's work, failing (instead of hanging) if it does not end in time."""
    event = cp.cuda.Event()
    event.record()
    deadline = time.monotonic() + seconds
    while not event.done:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the GPU did not finish within {seconds} s")
        time.sleep(0.0005)


# ---- workers ----

def device_table(rank: int, address: str, framework: str) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    cp = fw.cp
    with mscclpp.Communicator(2, rank, address=address, device=gpu) as comm:
        # A temporary: the communicator must keep it alive while connected.
        conn = comm.connect(1 - rank, 7, fw.zeros(1 << 16))
        import gc

        gc.collect()
        comm.setup()
        conns = comm.device_connections()
        assert comm.device_connections() is conns, "made once per set-up"
        entry = conns[0]
        owner = comm.connections[0].buffer.owner
        owner_obj = owner[0] if isinstance(owner, tuple) else owner
        view = cp.asarray(conns)
        seen = {
            "count": len(conns),
            "nbytes": conns.nbytes,
            "remote_rank": entry.remote_rank,
            "tag": entry.tag,
            "conn_id": entry.host.connId,
            "local_buff_is_buffer": entry.host.localBuff == conn.buffer.ptr,
            "remote_buff_set": entry.host.remoteBuff != 0,
            "device_copy_matches": conns.read_back() == bytes(conns),
            "view_matches": bytes(view.get().tobytes()) == bytes(conns),
            "owner_alive": owner_obj is not None and int(fw.view(owner_obj).data.ptr) == conn.buffer.ptr,
            "find": conns.find(1 - rank, 7).index,
            "device": comm.device,
            "gpu": gpu,
        }
        comm.barrier()
    return seen


def ping_pong(rank: int, address: str, iters: int) -> Dict[str, Any]:
    gpu = _prepare(rank, "cupy")
    cp = Frame("cupy").cp
    kernel = _kernels().get_function("ping_pong")
    status = cp.zeros(2, dtype=cp.uint64)
    with mscclpp.Communicator(2, rank, address=address, device=gpu) as comm:
        comm.connect(1 - rank, 0, cp.zeros(4096, dtype=cp.uint8))
        comm.setup()
        conns = comm.device_connections()
        with comm.proxy():
            kernel((1,), (1,), (cp.uint64(conns.ptr), cp.int32(rank), cp.int32(iters), status))
            _wait_stream(cp)
        s = status.get()
    return {"failed_iter": int(s[0]), "us_per_round_trip": float(s[1]) / iters / 1000}


def put_with_signal(rank: int, address: str, framework: str, chunk: int, rounds: int) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    cp = fw.cp
    kernel = _kernels().get_function("put_own_range")
    buf = fw.zeros(2 * chunk)
    v = fw.view(buf)
    status = cp.zeros(1, dtype=cp.uint64)
    bad: List[Any] = []
    with mscclpp.Communicator(2, rank, address=address, device=gpu) as comm:
        comm.connect(1 - rank, 0, buf)
        comm.setup()
        conns = comm.device_connections()
        with comm.proxy():
            for salt in range(rounds):
                fill_own_range(v, cp, rank, salt, chunk)
                fw.sync()
                comm.barrier()  # the peer's buffer is ready for our data
                kernel((1,), (1,), (cp.uint64(conns.ptr), cp.int32(1), cp.uint64(rank * chunk), cp.uint64(chunk),
                                    status))
                _wait_stream(cp)
                if int(status.get()[0]):
                    bad.append((salt, "wait timed out"))
                    break
                wrong = check_all_ranges(v, cp, 2, salt, chunk)
                if wrong:
                    bad.append((salt, f"ranges of ranks {wrong} wrong"))
                comm.barrier()  # both have checked before the next round overwrites
    return {"bad": bad}


def direct_put(rank: int, address: str, chunk: int) -> Dict[str, Any]:
    gpu = _prepare(rank, "cupy")
    cp = Frame("cupy").cp
    kernel = _kernels().get_function("direct_put_own_range")
    buf = cp.zeros(2 * chunk, dtype=cp.uint8)
    status = cp.zeros(1, dtype=cp.uint64)
    with mscclpp.Communicator(2, rank, address=address, device=gpu) as comm:
        comm.connect(1 - rank, 0, buf)
        comm.setup()
        conns = comm.device_connections()
        fill_own_range(buf, cp, rank, 5, chunk)
        cp.cuda.Device().synchronize()
        comm.barrier()
        kernel((1,), (256,), (cp.uint64(conns.ptr), cp.uint64(rank * chunk), cp.uint64(chunk), status))
        _wait_stream(cp)
        comm.barrier()
        return {"timed_out": int(status.get()[0]), "wrong": check_all_ranges(buf, cp, 2, 5, chunk)}


def registered_write(rank: int, address: str, framework: str, chunk: int) -> Dict[str, Any]:
    gpu = _prepare(rank, framework)
    fw = Frame(framework)
    cp = fw.cp
    with mscclpp.Communicator(2, rank, address=address, device=gpu) as comm:
        comm.connect(1 - rank, 0, fw.zeros(4096))
        comm.setup()
        target = fw.zeros(2 * chunk)
        tv = fw.view(target)
        tv[:] = SENTINEL
        fw.sync()
        reg = comm.register_buffer(target)
        src = fw.zeros(chunk + 64)
        sv = fw.view(src)
        sv[64:] = pattern(cp, rank, 9, chunk, rank * chunk)
        fw.sync()
        comm.barrier()
        stream = fw.torch.cuda.current_stream() if framework == "torch" else cp.cuda.get_current_stream()
        reg.write(src, chunk, src_offset=64, dst_offset=rank * chunk, stream=stream)
        fw.sync()
        comm.barrier()  # every rank's write has completed
        ok_peer = bool((tv[(1 - rank) * chunk:(2 - rank) * chunk]
                        == pattern(cp, 1 - rank, 9, chunk, (1 - rank) * chunk)).all())
        own_untouched = bool((tv[rank * chunk:(rank + 1) * chunk] == SENTINEL).all())
        errors = {}
        for name, call in {
            "past the end": lambda: reg.write(src, chunk, src_offset=64, dst_offset=2 * chunk),
            "src too short": lambda: reg.write(src, chunk + 65, src_offset=0),
            "offset too big": lambda: reg.write(src, 1, dst_offset=2**32),
        }.items():
            try:
                call()
                errors[name] = "no error"
            except Exception as e:  # noqa: BLE001
                errors[name] = f"{type(e).__name__}: {e}"
        comm.barrier()
        return {"peer_data": ok_peer, "own_untouched": own_untouched, "remote": len(reg.remote_addresses),
                "errors": errors}


def all_gather(rank: int, nranks: int, address: str, chunk: int) -> Dict[str, Any]:
    gpu = _prepare(rank, "cupy")
    cp = Frame("cupy").cp
    kernel = _kernels().get_function("put_own_range")
    buf = cp.zeros(nranks * chunk, dtype=cp.uint8)
    status = cp.zeros(nranks, dtype=cp.uint64)
    with mscclpp.Communicator(nranks, rank, address=address, device=gpu) as comm:
        for peer in range(nranks):
            if peer != rank:
                comm.connect(peer, 0, buf)
        comm.setup()
        conns = comm.device_connections()
        fill_own_range(buf, cp, rank, 3, chunk)
        cp.cuda.Device().synchronize()
        comm.barrier()
        with comm.proxy():
            kernel((nranks - 1,), (1,), (cp.uint64(conns.ptr), cp.int32(nranks - 1), cp.uint64(rank * chunk),
                                         cp.uint64(chunk), status))
            _wait_stream(cp)
        return {"timed_out": [int(x) for x in status.get()], "wrong": check_all_ranges(buf, cp, nranks, 3, chunk),
                "gpu": gpu}


LOAD_INLINE_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <mscclpp.h>

__global__ void putOwnRange(mscclppDevConn* conns, uint64_t offset, uint64_t bytes, unsigned long long* timedOut)
{
  mscclppDevConn& c = conns[0];
  c.putWithSignal(offset, offset, bytes);
  const uint64_t expected = *c.waitEpochId + 1;
  unsigned long long spins = 0;
  while (!c.epochReached(expected)) {
    if (++spins > (1ull << 30)) {
      *timedOut = 1;
      return;
    }
  }
  c.wait();
  c.flush();
}

void put_own_range(int64_t conns, int64_t offset, int64_t bytes, torch::Tensor timedOut)
{
  auto* timed = reinterpret_cast<unsigned long long*>(timedOut.data_ptr());
  putOwnRange<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(reinterpret_cast<mscclppDevConn*>(conns), offset, bytes,
                                                              timed);
}
"""


def torch_load_inline(rank: int, address: str, chunk: int, build_dir: str) -> Dict[str, Any]:
    gpu = _prepare(rank, "torch")
    missing = mscclpp.jit.torch_load_inline_missing()
    if missing:
        pytest.skip(missing)
    import torch

    os.makedirs(build_dir, exist_ok=True)
    # Both ranks build the same extension in one folder: torch's builder lets one build while the other waits.
    ext = mscclpp.jit.torch_load_inline(
        "mscclpp_test_put", LOAD_INLINE_SOURCE, ["put_own_range"],
        cpp_sources="void put_own_range(int64_t conns, int64_t offset, int64_t bytes, torch::Tensor timedOut);",
        build_directory=build_dir, verbose=False)
    buf = torch.full((2 * chunk,), SENTINEL, dtype=torch.uint8, device="cuda")
    own = torch.arange(rank * chunk, (rank + 1) * chunk, device="cuda", dtype=torch.int64)
    buf[rank * chunk:(rank + 1) * chunk] = ((own * 131 + rank * 7919) % 251).to(torch.uint8)
    timed_out = torch.zeros(1, dtype=torch.int64, device="cuda")
    with mscclpp.Communicator(2, rank, address=address, device=gpu) as comm:
        comm.connect(1 - rank, 0, buf)
        comm.setup()
        conns = comm.device_connections()
        torch.cuda.synchronize()
        comm.barrier()
        with comm.proxy():
            ext.put_own_range(conns.ptr, rank * chunk, chunk, timed_out)
            torch.cuda.synchronize()
        peer = 1 - rank
        idx = torch.arange(peer * chunk, (peer + 1) * chunk, device="cuda", dtype=torch.int64)
        expected = ((idx * 131 + peer * 7919) % 251).to(torch.uint8)
        return {"timed_out": int(timed_out.item()),
                "peer_data": bool(torch.equal(buf[peer * chunk:(peer + 1) * chunk], expected))}


def abort_wakes_a_waiting_kernel(rank: int, address: str) -> Dict[str, Any]:
    gpu = _prepare(rank, "cupy")
    if not mscclpp.has_abort():
        pytest.skip("this libmscclpp has no mscclppCommAbort yet")
    cp = Frame("cupy").cp
    kernel = _kernels().get_function("wait_once")
    status = cp.zeros(1, dtype=cp.uint64)
    comm = mscclpp.Communicator(2, rank, address=address, device=gpu)
    result: Dict[str, Any] = {}
    try:
        comm.connect(1 - rank, 0, cp.zeros(4096, dtype=cp.uint8))
        comm.setup()
        conns = comm.device_connections()
        comm.launch_proxy()
        comm.barrier()
        if rank == 0:
            kernel((1,), (1,), (cp.uint64(conns.ptr), status))
            time.sleep(0.5)
            t0 = time.monotonic()
            comm.abort()
            _wait_stream(cp, 15)
            result["kernel_end_s"] = time.monotonic() - t0
            result["status"] = int(status.get()[0])
            err: Optional[mscclpp.MscclppError] = comm.async_error()
            result["async_error"] = None if err is None else err.code.name
        else:
            time.sleep(5)  # stays alive meanwhile: rank 0's abort is its own, not a dead peer
    finally:
        comm.close()
    return result
