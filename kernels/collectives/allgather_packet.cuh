// All-gather with packets (small messages): every rank writes its piece as packets into every peer's
// scratch and its own output, then copies the peers' pieces out as their packets arrive.
//
// Scratch: [source rank][unit] packets. In place when the input is this rank's piece of the output.
#pragma once

#include "packet.cuh"

__device__ void allgatherPacket(const CollArgs& a)
{
  const auto [epoch, flag, units, first, step, aligned] = packetCall(a);
  // A rank without output (a gather's non-root: `recv` is null) sends its piece and stores nothing.
  char* ownPiece = a.recv ? a.recv + a.rank * a.strideBytes : nullptr;
  const bool keep = a.recv != nullptr;
  const bool inPlace = a.send == ownPiece;

  for (uint64_t i = first; i < units; i += step) {
    const uint64_t v = loadUnit<uint64_t>(a.send, i, a.bytes, aligned);
    for (uint32_t k = 1; k < a.nranks; k++) {
      const uint32_t peer = (a.rank + k) % a.nranks;
      putPacket(collPackets(a, peer, epoch), a.rank * units + i, v, flag);
    }
    if (keep && !inPlace) storeUnit<uint64_t>(ownPiece, i, a.bytes, aligned, v);
  }
  bool aborted = false;
  const char* mine = collPackets(a, a.rank, epoch);
  for (uint32_t k = 1; k < a.nranks && !aborted; k++) {
    const uint32_t source = (a.rank + a.nranks - k) % a.nranks;
    // A rank without output still waits for every peer's packets of this call: it ends, as every call does,
    // only once it has heard from every peer in it (common.cuh), so its next call never overwrites a slot
    // a peer still reads.
    for (uint64_t i = first; i < units && !aborted; i += step) {
      const uint64_t v = getPacket(a, mine, source * units + i, flag, aborted);
      if (keep) storeUnit<uint64_t>(a.recv + source * a.strideBytes, i, a.bytes, aligned, v);
    }
  }
  collEnd(a, epoch);
}
