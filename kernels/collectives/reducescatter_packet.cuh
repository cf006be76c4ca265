// Reduce-scatter with packets (small messages): every rank writes each peer's piece of its input as packets
// into that peer's scratch, then reduces its own piece, in rank order, from the peers' packets and its
// input. A PreMulSum scales the input where it is read (PreOp): each peer's piece before it is sent, this
// rank's own before its reduction.
//
// Scratch: [source rank][unit] packets. In place when the output is this rank's piece of the input.
#pragma once

#include "packet.cuh"
#include "reduce.cuh"

template <typename T, typename Op>
__device__ void reducescatterPacket(const CollArgs& a)
{
  const auto [epoch, flag, units, first, step, aligned] = packetCall(a);
  const PreOp<T, Op> pre(a);

  for (uint32_t k = 1; k < a.nranks; k++) {
    const uint32_t peer = (a.rank + k) % a.nranks;
    char* region = collPackets(a, peer, epoch);
    for (uint64_t i = first; i < units; i += step) {
      putPacket(region, a.rank * units + i, pre(loadUnit<uint64_t>(a.send + peer * a.strideBytes, i, a.bytes, aligned)), flag);
    }
  }
  bool aborted = false;
  const char* mine = collPackets(a, a.rank, epoch);
  const char* own = a.send + a.rank * a.strideBytes;
  for (uint64_t i = first; i < units && !aborted; i += step) {
    uint64_t acc = 0;
    for (uint32_t r = 0; r < a.nranks; r++) {
      const uint64_t v = r == a.rank ? pre(loadUnit<uint64_t>(own, i, a.bytes, aligned)) : getPacket(a, mine, r * units + i, flag, aborted);
      acc = r == 0 ? v : reduceUnit<T, Op>(acc, v);
    }
    storeUnit<uint64_t>(a.recv, i, a.bytes, aligned, finishUnit<T, Op>(acc, a.nranks));
  }
  collEnd(a, epoch);
}
