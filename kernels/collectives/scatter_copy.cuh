// Scatter by copies (larger messages): the root writes each peer's piece of its input into that peer's
// scratch in 16-byte units and signals it; each peer copies its piece out. As in a broadcast, the root
// waits for every peer to say it is in this call (collRootGate).
//
// Scratch: one region of the receiver's piece. In place at the root when its output is its own piece of
// the input.
#pragma once

#include "common.cuh"

__device__ void scatterCopy(const CollArgs& a)
{
  const auto [epoch, units, part, aligned] = copyCall(a);

  collRootGate(a, epoch);
  if (a.rank == a.root) {
    for (uint32_t k = 1; k < a.nranks; k++) {
      const uint32_t peer = (a.rank + k) % a.nranks;
      char* region = collData(a, peer, epoch);
      for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
        storeScratch16(region, j, loadUnit<uint4>(a.send + peer * a.strideBytes, j, a.bytes, aligned));
      }
    }
    const char* own = a.send + a.rank * a.strideBytes;
    if (own != a.recv) {
      for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
        storeUnit<uint4>(a.recv, j, a.bytes, aligned, loadUnit<uint4>(own, j, a.bytes, aligned));
      }
    }
    collSignal(a, epoch, 0);
  } else {
    if (!collWait(a, epoch, 0, static_cast<int>(a.root))) {
      collEnd(a, epoch);
      return;
    }
    const char* mine = collData(a, a.rank, epoch);
    for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
      storeUnit<uint4>(a.recv, j, a.bytes, aligned, loadScratch16(mine, j));
    }
  }
  collRootGateClose(a, epoch);
  collEnd(a, epoch);
}
