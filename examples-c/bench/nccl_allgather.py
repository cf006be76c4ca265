"""All-gather through PyTorch's NCCL backend, timed the way allgather_bench times ours, for comparison.

    torchrun --nproc_per_node=N examples-c/bench/nccl_allgather.py

Prints one line per size, `BENCH nccl_allgather ranks=N bytes=B time_us=T algbw_GBps=A` (algBW = whole
output / time), after checking the gathered data once per size. NVLink multicast stays off
(NCCL_NVLS_ENABLE=0) unless the environment says otherwise.
"""

import os
import statistics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SIZES = [1 << 20, 16 << 20, 256 << 20, 1 << 30]
WARMUP, ITERS, REPEATS = 10, 100, 5


def main() -> int:
    dist.init_process_group("nccl")
    rank, nranks = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    failed = 0
    for total in SIZES:
        chunk = total // nranks // 4  # float32 elements per rank
        inp = torch.full((chunk,), float(rank + 1), dtype=torch.float32, device="cuda")
        out = torch.zeros(chunk * nranks, dtype=torch.float32, device="cuda")
        dist.all_gather_into_tensor(out, inp)
        torch.cuda.synchronize()
        expected = torch.arange(1, nranks + 1, dtype=torch.float32, device="cuda").repeat_interleave(chunk)
        if not torch.equal(out, expected):
            print(f"FAIL nccl_allgather rank {rank}: wrong data at {total} bytes", flush=True)
            failed += 1
            continue
        for _ in range(WARMUP):
            dist.all_gather_into_tensor(out, inp)
        times = []
        for _ in range(REPEATS):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            start.record()
            for _ in range(ITERS):
                dist.all_gather_into_tensor(out, inp)
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop) * 1000.0 / ITERS)
        t = statistics.median(times)
        if rank == 0:
            nbytes = chunk * 4 * nranks
            print(f"BENCH nccl_allgather ranks={nranks} bytes={nbytes} time_us={t:.3f} "
                  f"algbw_GBps={nbytes / t / 1000.0:.2f}", flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
