// Broadcast with packets (small messages): the root writes its input as packets into every peer's scratch
// (and its own output); the others copy the packets out as they arrive.
//
// The root waits, at its end, for a word from every peer that it has started this call (collRootGate): the
// root gets nothing else from them, and without it could run two calls ahead and overwrite the slot a peer
// still reads. Among more than two ranks each non-root waits for the other non-roots' words likewise.
//
// Scratch: [unit] packets. In place when the root's input is its output.
#pragma once

#include "packet.cuh"

__device__ void broadcastPacket(const CollArgs& a)
{
  const auto [epoch, flag, units, first, step, aligned] = packetCall(a);

  collRootGate(a, epoch);
  if (a.rank == a.root) {
    for (uint64_t i = first; i < units; i += step) {
      const uint64_t v = loadUnit<uint64_t>(a.send, i, a.bytes, aligned);
      for (uint32_t k = 1; k < a.nranks; k++) putPacket(collPackets(a, (a.rank + k) % a.nranks, epoch), i, v, flag);
      if (a.send != a.recv) storeUnit<uint64_t>(a.recv, i, a.bytes, aligned, v);
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
