// Scatter with packets (small messages): the root writes each peer's piece of its input as packets into
// that peer's scratch; each peer copies its piece out as the packets arrive. The root waits for every peer
// to say it is in this call (collRootGate).
//
// Scratch: one region of packets of the receiver's piece.
#pragma once

#include "packet.cuh"

__device__ void scatterPacket(const CollArgs& a)
{
  const auto [epoch, flag, units, first, step, aligned] = packetCall(a);

  collRootGate(a, epoch);
  if (a.rank == a.root) {
    const char* own = a.send + a.rank * a.strideBytes;
    for (uint64_t i = first; i < units; i += step) {
      for (uint32_t k = 1; k < a.nranks; k++) {
        const uint32_t peer = (a.rank + k) % a.nranks;
        putPacket(collPackets(a, peer, epoch), i, loadUnit<uint64_t>(a.send + peer * a.strideBytes, i, a.bytes, aligned),
                  flag);
      }
      if (own != a.recv) storeUnit<uint64_t>(a.recv, i, a.bytes, aligned, loadUnit<uint64_t>(own, i, a.bytes, aligned));
    }
  } else {
    bool aborted = false;
    const char* mine = collPackets(a, a.rank, epoch);
    for (uint64_t i = first; i < units && !aborted; i += step) {
      storeUnit<uint64_t>(a.recv, i, a.bytes, aligned, getPacket(a, mine, i, flag, aborted));
    }
  }
  collRootGateClose(a, epoch);
  collEnd(a, epoch);
}
