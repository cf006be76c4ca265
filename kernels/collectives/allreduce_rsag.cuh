// All-reduce in two shots, reduce-scatter then all-gather (larger messages): the buffer is cut into one
// shard per rank; every rank writes each peer's shard of its input into that peer's scratch, the owner
// reduces its shard in rank order with its own input and writes the result into its output and into
// every peer's scratch, and every rank copies the other shards out. 2 (n - 1) / n x the message on each
// rank's links; per-block flags order the phases, so no block waits for the whole grid. A PreMulSum scales
// the input where it is read (PreOp): each peer's shard before it is sent, this rank's own before its
// reduction; the reduced shards of phase 3 are results, never scaled.
//
// Scratch: a reduce region [source rank][shard unit] and a gather region [owner rank][shard unit] of
// 16-byte units. Block b handles the same part of every shard on every rank, and every unit it reads in
// one phase it writes only in a later one, so the output may be the input (in place).
#pragma once

#include "reduce.cuh"

template <typename T, typename Op>
__device__ void allreduceRsag(const CollArgs& a)
{
  const uint64_t epoch = collBegin(a);
  const uint64_t units = unitsOf(a.bytes, 16);
  const uint64_t shard = (units + a.nranks - 1) / a.nranks;
  const UnitRange part = blockRange(shard, blockIdx.x, gridDim.x);
  const bool aligned = a.aligned != 0;
  const uint64_t gatherOffset = static_cast<uint64_t>(a.nranks) * shard * 16;
  const PreOp<T, Op> pre(a);

  // 1. Each peer's shard of the input into its reduce region.
  for (uint32_t k = 1; k < a.nranks; k++) {
    const uint32_t peer = (a.rank + k) % a.nranks;
    char* reduceRegion = collData(a, peer, epoch) + a.rank * shard * 16;
    for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
      const uint64_t u = peer * shard + j;
      if (u < units) storeScratch16(reduceRegion, j, pre(loadUnit<uint4>(a.send, u, a.bytes, aligned)));
    }
  }
  collSignal(a, epoch, 0);
  if (collWait(a, epoch, 0)) {
    // 2. Reduce our shard; write it out and into every peer's gather region.
    const char* mine = collData(a, a.rank, epoch);
    for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
      const uint64_t u = a.rank * shard + j;
      if (u >= units) break;
      uint4 acc;
      for (uint32_t r = 0; r < a.nranks; r++) {
        const uint4 v = r == a.rank ? pre(loadUnit<uint4>(a.send, u, a.bytes, aligned))
                                    : loadScratch16(mine + r * shard * 16, j);
        acc = r == 0 ? v : reduceUnit<T, Op>(acc, v);
      }
      acc = finishUnit<T, Op>(acc, a.nranks);
      if (a.recv) storeUnit<uint4>(a.recv, u, a.bytes, aligned, acc);
      for (uint32_t k = 1; k < a.nranks; k++) {
        const uint32_t peer = (a.rank + k) % a.nranks;
        storeScratch16(collData(a, peer, epoch) + gatherOffset + a.rank * shard * 16, j, acc);
      }
    }
    collSignal(a, epoch, 1);
    if (collWait(a, epoch, 1) && a.recv) {
      // 3. The other shards, reduced by their owners.
      const char* gathered = mine + gatherOffset;
      for (uint32_t k = 1; k < a.nranks; k++) {
        const uint32_t owner = (a.rank + k) % a.nranks;
        for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
          const uint64_t u = owner * shard + j;
          if (u < units) storeUnit<uint4>(a.recv, u, a.bytes, aligned, loadScratch16(gathered + owner * shard * 16, j));
        }
      }
    }
  }
  collEnd(a, epoch);
}
