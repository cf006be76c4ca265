// All-to-all with packets (small messages): every rank writes the piece of its input meant for each peer as
// packets into that peer's scratch, then copies the pieces its peers sent it into its output.
//
// Scratch: [source rank][unit] packets. Each unit of every piece is sent and received by the same thread, so
// the output may be the input (in place).
#pragma once

#include "packet.cuh"

__device__ void alltoallPacket(const CollArgs& a)
{
  const auto [epoch, flag, units, first, step, aligned] = packetCall(a);

  for (uint64_t i = first; i < units; i += step) {
    for (uint32_t k = 1; k < a.nranks; k++) {
      const uint32_t peer = (a.rank + k) % a.nranks;
      putPacket(collPackets(a, peer, epoch), a.rank * units + i,
                loadUnit<uint64_t>(a.send + peer * a.strideBytes, i, a.bytes, aligned), flag);
    }
    if (a.send != a.recv) {
      const uint64_t v = loadUnit<uint64_t>(a.send + a.rank * a.strideBytes, i, a.bytes, aligned);
      storeUnit<uint64_t>(a.recv + a.rank * a.strideBytes, i, a.bytes, aligned, v);
    }
  }
  bool aborted = false;
  const char* mine = collPackets(a, a.rank, epoch);
  for (uint32_t k = 1; k < a.nranks && !aborted; k++) {
    const uint32_t source = (a.rank + a.nranks - k) % a.nranks;
    for (uint64_t i = first; i < units && !aborted; i += step) {
      const uint64_t v = getPacket(a, mine, source * units + i, flag, aborted);
      storeUnit<uint64_t>(a.recv + source * a.strideBytes, i, a.bytes, aligned, v);
    }
  }
  collEnd(a, epoch);
}
