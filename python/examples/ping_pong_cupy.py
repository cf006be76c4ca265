"""Tutorial 01 in Python: two GPUs of one process play ping-pong with signal() and wait(), kernels by cupy.

Two communicators, ranks 0 and 1 of one job, live in this process, one host thread each (the library's
blocking calls release the GIL). Each thread picks its GPU, joins the job at 127.0.0.1:<port>, connects to
the other rank, starts its proxy and launches a one-thread kernel compiled with NVRTC (cupy.RawModule):

    GPU 0: wait for GPU 1's signal, spin ~10M cycles (a few ms), signal back   (--iters times)
    GPU 1: signal GPU 0, wait for its answer                                   (--iters times)

GPU 1 therefore waits for GPU 0's spin in every iteration; the example checks that it did (more than 1 ms
per iteration, and every single wait longer than 1 ms), which shows that the signals order the two GPUs.
Signals go through the proxies (signal(), wait(), flush()); with --direct they go GPU to GPU
(directSignal(), directWait()). Every wait in the kernels gives up after 10 s instead of hanging.

Usage: python ping_pong_cupy.py [--port N] [--iters N] [--direct]
Prints "Succeed!" at the end when every check passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import mscclpp

KERNEL_SOURCE = mscclpp.jit.WAITS_WITH_DEADLINE + r"""
// The peer's next signal, of the kind this example sends; false if it did not come within the deadline.
__device__ __forceinline__ bool pingWait(mscclppDevConn& c, bool direct)
{
  return direct ? directWaitFor(c) : waitFor(c);
}

__device__ __forceinline__ void pingSignal(mscclppDevConn& c, bool direct)
{
  if (direct) c.directSignal();
  else c.signal();
}

__device__ void spinCycles(long long cycles)
{
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// status[0]: 1-based iteration whose wait timed out (0: none); status[1]: GPU 1's shortest wait in ns.
extern "C" __global__ void ping_pong(mscclppDevConn* conns, int rank, int iters, long long spin, int direct,
                                     unsigned long long* status)
{
  if (threadIdx.x + blockIdx.x != 0) return;
  mscclppDevConn& c = conns[0];
  unsigned long long minWait = ~0ull;
  for (int i = 0; i < iters; ++i) {
    if (rank == 0) {
      if (!pingWait(c, direct)) { status[0] = i + 1; return; }
      spinCycles(spin);
      pingSignal(c, direct);
    } else {
      pingSignal(c, direct);
      const unsigned long long t0 = globalTimerNs();
      if (!pingWait(c, direct)) { status[0] = i + 1; return; }
      const unsigned long long waited = globalTimerNs() - t0;
      if (waited < minWait) minWait = waited;
    }
  }
  status[1] = minWait;
  // Every signal has left before the kernel ends (through the proxy, flush() waits until it has handled
  // them), so the peer's memory is not touched once the ranks tear down.
  if (direct) __threadfence_system();
  else c.flush();
}
"""

SPIN_CYCLES = 10_000_000  # about 5 ms at 2 GHz


def run_rank(rank: int, args: argparse.Namespace, results: dict) -> None:
    import cupy

    label = f"GPU {rank}"
    try:
        cupy.cuda.Device(rank).use()
        # Everything is allocated and the kernel loaded before any kernel starts; the stream is non-blocking
        # so that it never waits for other work on the GPU.
        buff = cupy.zeros(4096, dtype=cupy.uint8)  # a connection needs a buffer; ping-pong moves no data
        status = cupy.zeros(2, dtype=cupy.uint64)
        kernel = mscclpp.jit.cupy_module(KERNEL_SOURCE).get_function("ping_pong")
        stream = cupy.cuda.Stream(non_blocking=True)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()

        print(f"{label}: Initializing a communicator (rank {rank} of 2 at 127.0.0.1:{args.port}) ...", flush=True)
        with mscclpp.Communicator(2, rank, address=f"127.0.0.1:{args.port}", device=rank) as comm:
            print(f"{label}: Connecting to rank {1 - rank} ...", flush=True)
            comm.connect(1 - rank, 0, buff)
            comm.setup()
            conns = comm.device_connections()
            print(f"{label}: Launching the proxy ...", flush=True)
            with comm.proxy():
                print(f"{label}: Launching the ping_pong kernel ...", flush=True)
                with stream:
                    start.record()
                    kernel((1,), (1,), (cupy.uint64(conns.ptr), cupy.int32(rank), cupy.int32(args.iters),
                                        cupy.int64(SPIN_CYCLES), cupy.int32(args.direct), status))
                    stop.record()
                deadline = time.monotonic() + 20 + 0.05 * args.iters
                while not stop.done:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the kernel did not finish in time")
                    time.sleep(0.001)
            failed_iter, min_wait_ns = (int(x) for x in status.get())
            results[rank] = (failed_iter, min_wait_ns, cupy.cuda.get_elapsed_time(start, stop))
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        results[rank] = e


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=50505)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--direct", action="store_true", help="signal GPU to GPU, without the proxies")
    args = parser.parse_args()

    # A first kernel launch may wait for the whole GPU while CUDA loads modules lazily; load them eagerly.
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        print("At least two GPUs are required", file=sys.stderr)
        return 1
    if not cupy.cuda.runtime.deviceCanAccessPeer(0, 1):
        print("GPU 0 cannot access GPU 1", file=sys.stderr)
        return 1
    print("Signals go " + ("from GPU to GPU directly (no proxy involved)" if args.direct else "through the proxies"))

    results: dict = {}
    threads = [threading.Thread(target=run_rank, args=(rank, args, results)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rank in range(2):
        r = results.get(rank)
        if isinstance(r, BaseException) or r is None:
            print(f"ERROR: GPU {rank}: {r!r}", file=sys.stderr)
            return 1
        if r[0]:
            print(f"ERROR: GPU {rank}: wait {r[0]} timed out", file=sys.stderr)
            return 1
    _, min_wait_ns, ms = results[1]
    per_iter = ms / args.iters
    print(f"Elapsed {per_iter:.5g} ms per iteration ({args.iters}); GPU 1's shortest wait {min_wait_ns / 1e6:.3g} ms")
    if per_iter < 1 or min_wait_ns < 1_000_000:
        print("ERROR: GPU 1 did not wait for GPU 0's spin: the signals did not order the GPUs", file=sys.stderr)
        return 1
    print("Succeed!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
