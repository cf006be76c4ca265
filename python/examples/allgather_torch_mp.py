"""An all-gather of torch tensors across processes started with torch.multiprocessing, by a kernel that puts
each rank's chunk into every peer with putWithSignal().

Every rank (one process each, on GPU rank % GPUs) holds a float32 tensor of nranks chunks and fills chunk
`rank`. It connects to every peer over that tensor (connection i of the device table goes to the i-th
peer); the kernel runs one block per peer, whose first thread

    putWithSignal(chunk offset, chunk offset, chunk bytes);   our chunk into the peer's tensor
    wait();                                                   the peer's chunk has arrived here

and flush() at the end. The example checks every chunk on every rank, and times the all-gather for a few
sizes (GPU time per all-gather, and the algorithm bandwidth: the gathered bytes per second). The parent
makes a mscclpp.UniqueId and hands it to the processes as an argument (it is picklable); the bootstrap
root runs in the parent.

Usage: python allgather_torch_mp.py [--nranks N] [--iters N]   (default: one rank per GPU, at least 2)
Prints "Succeed!" at the end when every check passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mscclpp

SIZES = [1 << 10, 1 << 20, 16 << 20]  # bytes per rank
WARMUP = 5

KERNEL_SOURCE = mscclpp.jit.WAITS_WITH_DEADLINE + r"""
// Block b serves connection b. Each iteration puts our chunk and waits for the peer's; failed[b] gets the
// 1-based iteration whose wait timed out.
extern "C" __global__ void all_gather(mscclppDevConn* conns, int npeers, int rank, unsigned long long chunkBytes,
                                      int iters, long long* failed)
{
  const int b = blockIdx.x;
  if (b >= npeers || threadIdx.x != 0) return;
  mscclppDevConn& c = conns[b];
  const unsigned long long offset = (unsigned long long)rank * chunkBytes;
  for (int i = 0; i < iters; ++i) {
    c.putWithSignal(offset, offset, chunkBytes);
    if (!waitFor(c)) { failed[b] = i + 1; return; }
  }
  c.flush();
}
"""


def chunk_values(torch, rank: int, n: int):  # noqa: ANN001, ANN201
    return torch.arange(n, device="cuda", dtype=torch.float32) * 0.5 + rank * 1000.0


def run_rank(rank: int, nranks: int, uid, iters: int) -> None:  # noqa: ANN001
    import cupy
    import torch

    gpu = rank % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    cupy.cuda.Device(gpu).use()
    kernel = mscclpp.jit.cupy_module(KERNEL_SOURCE).get_function("all_gather")
    max_elems = max(SIZES) // 4
    data = torch.zeros(nranks * max_elems, dtype=torch.float32, device="cuda")
    failed = torch.zeros(nranks, dtype=torch.int64, device="cuda")
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    with mscclpp.Communicator(nranks, rank, unique_id=uid, device=gpu) as comm:
        for peer in range(nranks):
            if peer != rank:
                comm.connect(peer, 0, data)
        comm.setup()
        conns = comm.device_connections()

        def gather(chunk_bytes: int, n: int) -> None:
            with stream:
                kernel((nranks - 1,), (1,), (cupy.uint64(conns.ptr), cupy.int32(nranks - 1), cupy.int32(rank),
                                             cupy.uint64(chunk_bytes), cupy.int32(n), cupy.asarray(failed)))

        with comm.proxy():
            for chunk_bytes in SIZES:
                elems = chunk_bytes // 4
                view = data[: nranks * elems].view(nranks, elems)  # chunk r at r * chunk_bytes, as put() writes
                view.fill_(-1.0)
                view[rank] = chunk_values(torch, rank, elems)
                torch.cuda.synchronize()
                comm.barrier()
                gather(chunk_bytes, WARMUP)
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                gather(chunk_bytes, iters)
                stop.record()
                deadline = time.monotonic() + 30
                while not stop.query():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"rank {rank}: the all-gather of {chunk_bytes} bytes did not finish")
                    time.sleep(0.0002)
                if int(failed.sum().item()):
                    raise RuntimeError(f"rank {rank}: a wait timed out ({failed.tolist()})")
                wrong = [r for r in range(nranks) if not torch.equal(view[r], chunk_values(torch, r, elems))]
                us = start.elapsed_time(stop) * 1000 / iters
                algbw = nranks * chunk_bytes / (us * 1e-6) / 1e9
                results = comm.all_gather_object((us, algbw, wrong))
                if rank == 0:
                    worst = max(r[0] for r in results)
                    print(f"{nranks} ranks, {chunk_bytes:>9} bytes per rank: {worst:9.2f} us per all-gather "
                          f"(slowest rank), {nranks * chunk_bytes / (worst * 1e-6) / 1e9:7.2f} GB/s algorithm "
                          f"bandwidth", flush=True)
                bad = {r: res[2] for r, res in enumerate(results) if res[2]}
                if bad:
                    raise RuntimeError(f"chunks wrong after the all-gather of {chunk_bytes} bytes: {bad} "
                                       "(rank: the ranks whose chunks it holds wrongly)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nranks", type=int, default=0, help="processes (default: one per GPU)")
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    import torch
    import torch.multiprocessing as mp

    ngpus = torch.cuda.device_count()
    nranks = args.nranks or ngpus
    if ngpus < 1 or nranks < 2:
        print(f"At least two ranks are required (GPUs: {ngpus}, --nranks {args.nranks})", file=sys.stderr)
        return 1
    uid = mscclpp.UniqueId.create()  # the root runs here, in the parent
    try:
        mp.spawn(run_rank, args=(nranks, uid, args.iters), nprocs=nranks, join=True)
    except Exception as e:  # noqa: BLE001 - a rank's failure, already printed by torch
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    print("Succeed!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
