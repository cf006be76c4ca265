"""Both GPUs put data into each other at once with putWithSignal(), on torch tensors.

Two processes (torch.multiprocessing), one per GPU. Each rank's buffer, a torch uint8 tensor, holds two
ranges of the copy size: rank r owns [r*size, (r+1)*size) and puts it into the same range of the peer's
buffer. One GPU thread per rank runs, per iteration:

    signal(); wait();                    both sides are ready
    putWithSignal(range, range, size);   the proxy copies the range, then raises the peer's epoch
    wait();                              the peer's range has arrived here

and flush() at the end. The example times this for 1 KiB, 1 MiB and 64 MiB (GPU time per iteration and
the bandwidth each way), then checks every byte: the peer's range holds the peer's data, our own range is
intact. The ranks meet through torch.distributed's TCP store: rank 0 makes a mscclpp.UniqueId and puts
its bytes there.

The kernel is compiled by torch's load_inline (nvcc) when torch finds a CUDA toolkit and ninja, else by
cupy (NVRTC) and launched on torch's stream; --compiler picks one.

Usage: python bidir_put_torch.py [--port N] [--compiler auto|torch|cupy]
Prints "Succeed!" at the end when every check passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import mscclpp

SIZES = [(1 << 10, 1000), (1 << 20, 500), (64 << 20, 50)]  # (bytes, iterations)
WARMUP = 10
SENTINEL = 255

KERNEL_SOURCE = mscclpp.jit.WAITS_WITH_DEADLINE + r"""
// failed[0] gets the 1-based number of the wait that timed out.
extern "C" __global__ void bidir_put(mscclppDevConn* conns, unsigned long long bytes, int rank, int iters,
                                     long long* failed)
{
  if (threadIdx.x + blockIdx.x != 0) return;
  mscclppDevConn& c = conns[0];
  const unsigned long long offset = (unsigned long long)rank * bytes;
  for (int i = 0; i < iters; ++i) {
    c.signal();
    if (!waitFor(c)) { failed[0] = 2 * i + 1; return; }
    c.putWithSignal(offset, offset, bytes);
    if (!waitFor(c)) { failed[0] = 2 * i + 2; return; }
  }
  c.flush();
}
"""

# What torch's load_inline adds around the same kernel: a function that launches it on torch's stream.
TORCH_LAUNCHER = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
""" + KERNEL_SOURCE + r"""
void launch_bidir_put(int64_t conns, int64_t bytes, int64_t rank, int64_t iters, torch::Tensor failed)
{
  bidir_put<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(reinterpret_cast<mscclppDevConn*>(conns), bytes, rank,
                                                           iters, reinterpret_cast<long long*>(failed.data_ptr<int64_t>()));
}
"""


def pattern(torch, rank: int, salt: int, start: int, n: int):  # noqa: ANN001, ANN201
    i = torch.arange(start, start + n, device="cuda", dtype=torch.int64)
    return ((i * 131 + rank * 7919 + salt * 31) % 251).to(torch.uint8)


def torch_extension():  # noqa: ANN201
    """The kernel and its launcher built by torch's load_inline (cached after the first build)."""
    return mscclpp.jit.torch_load_inline(
        "mscclpp_example_bidir_put", TORCH_LAUNCHER, ["launch_bidir_put"],
        cpp_sources="void launch_bidir_put(int64_t conns, int64_t bytes, int64_t rank, int64_t iters, "
                    "torch::Tensor failed);")


def uses_torch_compiler(choice: str) -> bool:
    return choice == "torch" or (choice == "auto" and mscclpp.jit.torch_load_inline_missing() is None)


def make_launcher(choice: str, rank: int):  # noqa: ANN201
    """A function launch(conns_ptr, bytes, rank, iters, failed) and the name of the compiler used."""
    import torch

    missing = mscclpp.jit.torch_load_inline_missing()
    if uses_torch_compiler(choice):
        return torch_extension().launch_bidir_put, "torch load_inline (nvcc)"
    import cupy

    # cupy keeps its own current device (its CUDA runtime may not be torch's): the same GPU as torch's.
    cupy.cuda.Device(torch.cuda.current_device()).use()
    kernel = mscclpp.jit.cupy_module(KERNEL_SOURCE).get_function("bidir_put")

    def launch(conns: int, nbytes: int, r: int, iters: int, failed) -> None:  # noqa: ANN001
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((1,), (1,), (cupy.uint64(conns), cupy.uint64(nbytes), cupy.int32(r), cupy.int32(iters),
                                cupy.asarray(failed)))

    why = f" ({missing})" if missing else ""
    return launch, "cupy RawModule (NVRTC)" + why


def wait_gpu(torch, seconds: float) -> None:  # noqa: ANN001
    """torch.cuda.synchronize() with a deadline: a wait that never returns ends the example, not hangs it."""
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the GPU did not finish within {seconds} s")
        time.sleep(0.0002)


def run_rank(rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    launch, compiler = make_launcher(args.compiler, rank)
    max_bytes = max(b for b, _ in SIZES)
    buff = torch.empty(2 * max_bytes, dtype=torch.uint8, device="cuda")
    failed = torch.zeros(1, dtype=torch.int64, device="cuda")

    store = dist.TCPStore("127.0.0.1", args.port, 2, is_master=(rank == 0), timeout=timedelta(seconds=60))
    if rank == 0:
        store.set("mscclpp-unique-id", bytes(mscclpp.UniqueId.create()))
    uid = mscclpp.UniqueId(store.get("mscclpp-unique-id"))

    with mscclpp.Communicator(2, rank, unique_id=uid, device=rank) as comm:
        comm.connect(1 - rank, 0, buff)
        comm.setup()
        conns = comm.device_connections()
        if rank == 0:
            print(f"kernels compiled by {compiler}", flush=True)
        with comm.proxy():
            for salt, (nbytes, iters) in enumerate(SIZES):
                own = slice(rank * nbytes, (rank + 1) * nbytes)
                peer = slice((1 - rank) * nbytes, (2 - rank) * nbytes)
                buff.fill_(SENTINEL)
                buff[own] = pattern(torch, rank, salt, own.start, nbytes)
                torch.cuda.synchronize()
                comm.barrier()  # the peer's buffer is ready for our data

                launch(conns.ptr, nbytes, rank, WARMUP, failed)
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                launch(conns.ptr, nbytes, rank, iters, failed)
                stop.record()
                wait_gpu(torch, 20 + 0.01 * iters)
                if int(failed.item()):
                    raise RuntimeError(f"{nbytes} bytes: wait {int(failed.item())} timed out")
                us = start.elapsed_time(stop) * 1000 / iters
                gbps = nbytes / (us * 1e-6) / 1e9
                ok_peer = torch.equal(buff[peer], pattern(torch, 1 - rank, salt, peer.start, nbytes))
                ok_own = torch.equal(buff[own], pattern(torch, rank, salt, own.start, nbytes))
                beyond = buff[2 * nbytes:]
                ok_beyond = bool((beyond == SENTINEL).all()) if beyond.numel() else True
                print(f"GPU {rank}: {nbytes:>9} bytes x {iters:>4}: {us:9.2f} us per iteration, {gbps:7.2f} GB/s "
                      f"each way; data {'ok' if ok_peer and ok_own and ok_beyond else 'WRONG'}", flush=True)
                if not (ok_peer and ok_own and ok_beyond):
                    raise RuntimeError(f"{nbytes} bytes: data check failed (peer range {ok_peer}, own range {ok_own}, "
                                       f"beyond {ok_beyond})")
                comm.barrier()  # both have checked before the next size overwrites


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=50505, help="the TCP store's port on 127.0.0.1")
    parser.add_argument("--compiler", choices=["auto", "torch", "cupy"], default="auto")
    args = parser.parse_args()
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < 2:
        print("At least two GPUs are required", file=sys.stderr)
        return 1
    if uses_torch_compiler(args.compiler):
        # Built once here, before the ranks start: two ranks building the same extension at once race
        # for its cache folder (one finds the other's half-written build); the ranks load the cached one.
        torch_extension()
    try:
        mp.spawn(run_rank, args=(args,), nprocs=2, join=True)
    except Exception as e:  # noqa: BLE001 - a rank's failure, already printed by torch
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    print("Succeed!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
