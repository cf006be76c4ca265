// All-reduce, one shot with packets (small messages): every rank writes its whole input as packets into a
// region of every peer's scratch, then reduces what the peers wrote, in rank order (so that every rank gets
// the same bits), with its own input. One link crossing; (n - 1) x the message on each rank's links.
//
// A PreMulSum scales each unit of the input where it is read (PreOp): before it is sent and before it
// enters this rank's own reduction, so every rank's input is scaled by its own scalar, once.
//
// Scratch: [source rank][unit] packets of 8 data bytes. Each unit is written, read and reduced by the same
// thread, so the output may be the input (in place). A rank without output (a reduce's non-root: `recv` is
// null) takes part all the same and stores nothing.
#pragma once

#include "packet.cuh"
#include "reduce.cuh"

template <typename T, typename Op>
__device__ void allreducePacket(const CollArgs& a)
{
  const auto [epoch, flag, units, first, step, aligned] = packetCall(a);
  const PreOp<T, Op> pre(a);

  for (uint64_t i = first; i < units; i += step) {
    const uint64_t v = pre(loadUnit<uint64_t>(a.send, i, a.bytes, aligned));
    for (uint32_t k = 1; k < a.nranks; k++) {
      const uint32_t peer = (a.rank + k) % a.nranks;
      putPacket(collPackets(a, peer, epoch), a.rank * units + i, v, flag);
    }
  }
  bool aborted = false;
  const char* mine = collPackets(a, a.rank, epoch);
  for (uint64_t i = first; i < units && !aborted; i += step) {
    const uint64_t own = pre(loadUnit<uint64_t>(a.send, i, a.bytes, aligned));
    uint64_t acc = 0;
    for (uint32_t r = 0; r < a.nranks; r++) {
      const uint64_t v = r == a.rank ? own : getPacket(a, mine, r * units + i, flag, aborted);
      acc = r == 0 ? v : reduceUnit<T, Op>(acc, v);
    }
    if (a.recv) storeUnit<uint64_t>(a.recv, i, a.bytes, aligned, finishUnit<T, Op>(acc, a.nranks));
  }
  collEnd(a, epoch);
}
