// Broadcast by copies (larger messages): the root writes its input into every peer's scratch in 16-byte
// units and each of its blocks signals its part; the others copy each part out once it is signalled.
//
// As with packets, the root waits for every peer's word that it has started this call (collRootGate).
//
// Scratch: [unit]. In place when the root's input is its output.
#pragma once

#include "common.cuh"

__device__ void broadcastCopy(const CollArgs& a)
{
  const auto [epoch, units, part, aligned] = copyCall(a);

  collRootGate(a, epoch);
  if (a.rank == a.root) {
    for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
      const uint4 v = loadUnit<uint4>(a.send, j, a.bytes, aligned);
      for (uint32_t k = 1; k < a.nranks; k++) storeScratch16(collData(a, (a.rank + k) % a.nranks, epoch), j, v);
      if (a.send != a.recv) storeUnit<uint4>(a.recv, j, a.bytes, aligned, v);
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
