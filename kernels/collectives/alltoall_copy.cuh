// All-to-all by copies (larger messages): every rank writes the piece of its input meant for each peer into
// that peer's scratch in 16-byte units, each block signals its part, and every rank copies the pieces its
// peers sent it into its output, block by block as the signals arrive.
//
// Scratch: [source rank][unit]. In place works: a block sends its units of every piece before it signals,
// and overwrites them only after every peer's signal.
#pragma once

#include "common.cuh"

__device__ void alltoallCopy(const CollArgs& a)
{
  const CopyCall c = copyCall(a);
  const auto [epoch, units, part, aligned] = c;

  copyPiecesToPeers(a, c);
  if (a.send != a.recv) {
    for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
      const uint4 v = loadUnit<uint4>(a.send + a.rank * a.strideBytes, j, a.bytes, aligned);
      storeUnit<uint4>(a.recv + a.rank * a.strideBytes, j, a.bytes, aligned, v);
    }
  }
  collSignal(a, epoch, 0);
  if (collWait(a, epoch, 0)) copyPiecesFromPeers(a, c);
  collEnd(a, epoch);
}
