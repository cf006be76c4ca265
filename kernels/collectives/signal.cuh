// NCCL's one-sided calls (src/collective/signal.rs): a put's data into a peer's window, the signal that
// follows it, and the wait that consumes signals.
//
// Signals are 64-bit counters in the receiving rank's signal area (after its p2p area in its scratch
// allocation, mapped by every peer): [source rank][context][signal index]. A signal is an atomic add of 1 to
// the receiver's counter for this rank, after a system-scope fence, so that everything this rank's stream
// wrote before it (the put's copy: by this kernel, or by the copy engine earlier on the stream) is visible
// to whoever sees the count. A wait spins until its counter reaches the count asked for, then takes that
// many off it (a compare-and-swap: signals keep arriving meanwhile), so that a CUDA graph replayed N times
// waits, each time, for signals of its own replay. Waits end on an abort of the communicator, without
// consuming (the host reports the failure).
#pragma once

#include "common.cuh"

#define MSCCLPP_SIGNAL_MAX_CONTEXTS 4
#define MSCCLPP_SIGNAL_MAX_INDICES 8
#define MSCCLPP_SIGNAL_MAX_WAITS 64
#define MSCCLPP_SIGNAL_PUT_THREADS 512
// Spins before a waiting thread starts to sleep between looks, and the longest sleep (ns).
#define MSCCLPP_SIGNAL_SPINS_BEFORE_SLEEP 4096
#define MSCCLPP_SIGNAL_MAX_SLEEP_NS 256

// Laid out as src/collective/signal.rs lays it out.
struct SignalArgs {
  const char* src;                // a put's data in this rank's memory (unused when bytes is 0)
  char* dst;                      // where it goes: the peer's window, as mapped here
  uint64_t bytes;                 // bytes this kernel copies (0: the copy engine did, or a signal alone)
  unsigned long long* signal;     // the receiver's counter for this rank (null: no signal)
  unsigned long long* waitCounter[MSCCLPP_SIGNAL_MAX_WAITS];  // this rank's counters a wait reads
  uint64_t waitCount[MSCCLPP_SIGNAL_MAX_WAITS];               // signals each must take
  const volatile uint64_t* abortFlag;  // host memory: non-zero once the communicator is aborted
  uint32_t waits;                 // entries of waitCounter / waitCount
  uint32_t aligned;               // non-zero when src and dst are multiples of 16
};

// One block: copies `bytes` (a small put), then raises the signal.
__device__ __forceinline__ void rmaPut(const SignalArgs& a)
{
  if (a.bytes != 0) {
    const uint64_t units = unitsOf(a.bytes, 16);
    const bool aligned = a.aligned != 0;
    for (uint64_t j = threadIdx.x; j < units; j += blockDim.x) {
      storeUnit<uint4>(a.dst, j, a.bytes, aligned, loadUnit<uint4>(a.src, j, a.bytes, aligned));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && a.signal != nullptr) {
    __threadfence_system();
    atomicAdd_system(a.signal, 1ull);
  }
}

// One block, a thread per counter: each waits for its count and consumes it.
__device__ __forceinline__ void rmaWait(const SignalArgs& a)
{
  if (threadIdx.x >= a.waits) return;
  unsigned long long* counter = a.waitCounter[threadIdx.x];
  const unsigned long long want = a.waitCount[threadIdx.x];
  uint32_t spins = 0;
  uint32_t sleep = 32;
  for (;;) {
    const unsigned long long have = loadAcquireSys(reinterpret_cast<const uint64_t*>(counter));
    if (have >= want) {
      // Signals that arrive between the load and the swap make it fail: look again.
      if (atomicCAS_system(counter, have, have - want) == have) break;
      continue;
    }
    if (++spins % MSCCLPP_COLL_ABORT_POLL == 0 && *a.abortFlag != 0) return;
    if (spins > MSCCLPP_SIGNAL_SPINS_BEFORE_SLEEP) {
      __nanosleep(sleep);
      if (sleep < MSCCLPP_SIGNAL_MAX_SLEEP_NS) sleep *= 2;
    }
  }
  // What the peers wrote before their signals is read by the stream's later work.
  __threadfence_system();
}
