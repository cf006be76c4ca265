// All-gather by copies (larger messages): every rank writes its piece into every peer's scratch in 16-byte
// units, each block then signals its part, and every rank copies the peers' pieces out block by block as
// their signals arrive.
//
// Scratch: [source rank][unit]. In place when the input is this rank's piece of the output.
#pragma once

#include "common.cuh"

__device__ void allgatherCopy(const CollArgs& a)
{
  const CopyCall c = copyCall(a);
  const auto [epoch, units, part, aligned] = c;
  // A rank without output (a gather's non-root: `recv` is null) sends its piece and stores nothing.
  char* ownPiece = a.recv ? a.recv + a.rank * a.strideBytes : nullptr;
  const bool keep = a.recv != nullptr;
  const bool inPlace = a.send == ownPiece;

  for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
    const uint4 v = loadUnit<uint4>(a.send, j, a.bytes, aligned);
    for (uint32_t k = 1; k < a.nranks; k++) {
      const uint32_t peer = (a.rank + k) % a.nranks;
      storeScratch16(collData(a, peer, epoch) + a.rank * units * 16, j, v);
    }
    if (keep && !inPlace) storeUnit<uint4>(ownPiece, j, a.bytes, aligned, v);
  }
  collSignal(a, epoch, 0);
  if (collWait(a, epoch, 0) && keep) copyPiecesFromPeers(a, c);
  collEnd(a, epoch);
}
