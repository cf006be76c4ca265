// The fences around a copy-engine call (src/collective/copy_engine.rs): the host queues the copies; these
// launches, one block each, order them against the peers' streams.
// - Before the copies (bytes 0): every rank's stream has reached the call, so every output may be
//   overwritten (the work queued before it on that stream is done with it).
// - After them (bytes: the call's): this rank's copies into the outputs are done (stream order); it tells
//   every peer and waits until each peer's are, so that no rank's stream moves on before its output is
//   whole. The call is counted among those that moved their data zero-copy.
// Both end on an abort of the communicator, like every wait of the collectives.
#pragma once

#include "common.cuh"

__device__ void ceFence(const CollArgs& a)
{
  const uint64_t epoch = collBegin(a);
  collSignal(a, epoch, 0);
  const bool done = collWait(a, epoch, 0);
  if (done && a.bytes != 0 && threadIdx.x == 0) {
    volatile uint64_t* state = a.state;
    state[MSCCLPP_STATE_ZC_CALLS] = state[MSCCLPP_STATE_ZC_CALLS] + 1;
  }
  collEnd(a, epoch);
}
