// Reduce-scatter by copies (larger messages): every rank writes each peer's piece of its input into that
// peer's scratch in 16-byte units, each block signals its part, and every rank reduces its own piece, in
// rank order, block by block as the signals arrive. A PreMulSum scales the input where it is read (PreOp):
// each peer's piece before it is sent, this rank's own before its reduction.
//
// Scratch: [source rank][unit]. In place when the output is this rank's piece of the input.
#pragma once

#include "reduce.cuh"

template <typename T, typename Op>
__device__ void reducescatterCopy(const CollArgs& a)
{
  const CopyCall c = copyCall(a);
  const auto [epoch, units, part, aligned] = c;
  const PreOp<T, Op> pre(a);

  copyPiecesToPeers(a, c, pre);
  collSignal(a, epoch, 0);
  if (collWait(a, epoch, 0)) {
    const char* mine = collData(a, a.rank, epoch);
    const char* own = a.send + a.rank * a.strideBytes;
    for (uint64_t j = part.begin + threadIdx.x; j < part.end; j += blockDim.x) {
      uint4 acc;
      for (uint32_t r = 0; r < a.nranks; r++) {
        const uint4 v = r == a.rank ? pre(loadUnit<uint4>(own, j, a.bytes, aligned)) : loadScratch16(mine + r * units * 16, j);
        acc = r == 0 ? v : reduceUnit<T, Op>(acc, v);
      }
      storeUnit<uint4>(a.recv, j, a.bytes, aligned, finishUnit<T, Op>(acc, a.nranks));
    }
  }
  collEnd(a, epoch);
}
