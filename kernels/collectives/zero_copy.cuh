// Zero-copy collectives: every rank reads and writes the peers' registered buffers directly, so each byte
// crosses memory once (no pass through the scratch). Registration is local, so the ranks first agree, in
// the kernel, that every rank reaches every buffer the algorithm touches (docs/ZERO_COPY.md):
//
// 1. Block 0 of each rank writes its input's and output's descriptors (tag and offset, CollArgs) as packets
//    into every peer's scratch, reads the peers' and looks each up in the table of the peers' registrations
//    mapped here (`zcTable`, host memory the host rewrites as records arrive).
// 2. It writes its vote (it found every buffer it needs) to every peer and reads theirs. Every rank reads
//    the same votes, so every rank decides alike: all yes, zero-copy; any no, the same launch moves the
//    data by the scratch algorithm (the fallback, below).
// 3. Block 0 leaves the decision and the addresses in `state`; the other blocks wait for them there (every
//    block of a launch is resident: src/collective/algorithm.rs, resident_share).
// 4. The data moves; then each block tells every peer it is done with the peers' buffers and waits for
//    theirs, so that no rank returns while a peer still reads or writes its buffers.
#pragma once

#include "allgather_copy.cuh"
#include "allreduce_rsag.cuh"
#include "broadcast_copy.cuh"
#include "packet.cuh"
#include "reduce.cuh"
#include "reducescatter_copy.cuh"

// Registrations per rank the table holds (src/collective/zero_copy/mod.rs, MAX_SLOTS).
#define MSCCLPP_ZC_SLOTS 64
// Packets of the agreement, at the start of the slot's packet area: [source rank][4] descriptor words,
// then [source rank] votes.
#define MSCCLPP_ZC_DESCRIPTOR_WORDS 4
#define MSCCLPP_ZC_VOTES (MSCCLPP_COLL_MAX_RANKS * MSCCLPP_ZC_DESCRIPTOR_WORDS)

// Which of the peers' buffers an algorithm reads or writes.
enum ZcNeeds : uint32_t {
  ZcPeerInputs = 1,   // every peer's input
  ZcPeerOutputs = 2,  // every peer's output
  ZcRootInput = 4,    // the root's input only (broadcast)
};

// The address here of byte `offset` of the peer's registration named by `tag`, or 0 when the table holds
// no mapping of exactly that generation. The host writes an entry's generation 0 first, then the address,
// then the new generation: a read between sees two generations that differ, or 0.
__device__ __forceinline__ uint64_t zcResolve(const CollArgs& a, uint32_t peer, uint64_t tag, uint64_t offset)
{
  if ((tag >> 63) == 0) return 0;
  const uint32_t slot = static_cast<uint32_t>(tag >> 32) & 0x7fffffffu;
  const uint32_t generation = static_cast<uint32_t>(tag);
  if (slot >= MSCCLPP_ZC_SLOTS || generation == 0) return 0;
  const uint64_t* entry =
    const_cast<const uint64_t*>(a.zcTable) + (static_cast<uint64_t>(peer) * MSCCLPP_ZC_SLOTS + slot) * 2;
  // Acquire loads keep the three reads in order (each load after an acquire is made after it) without the
  // full system fences, each of which waits for this thread's earlier memory operations system-wide.
  const uint64_t before = loadAcquireSys(entry);
  const uint64_t address = loadAcquireSys(entry + 1);
  const uint64_t after = loadAcquireSys(entry);
  return before == generation && after == generation && address != 0 ? address + offset : 0;
}

struct ZcPlan {
  bool go;       // every rank moves the data zero-copy
  bool aligned;  // every buffer this rank touches, and the stride, are multiples of 16
};

// Steps 1-3 above. `inputs` and `outputs` (shared memory, a word per rank) get every rank's input and
// output as this rank reaches them (0 for those the algorithm does not touch).
template <uint32_t Needs>
__device__ ZcPlan zcAgree(const CollArgs& a, uint64_t epoch, uint64_t* inputs, uint64_t* outputs)
{
  volatile uint64_t* state = a.state;
  const uint32_t t = threadIdx.x;
  if (blockIdx.x == 0) {
    const uint32_t flag = packetFlag(epoch);
    const char* mine = collPackets(a, a.rank, epoch);
    bool aborted = false;
    if (t < a.nranks && t != a.rank) {
      char* theirs = collPackets(a, t, epoch);
      const uint64_t words[MSCCLPP_ZC_DESCRIPTOR_WORDS] = {a.zcSendTag, a.zcSendOffset, a.zcRecvTag, a.zcRecvOffset};
      for (int w = 0; w < MSCCLPP_ZC_DESCRIPTOR_WORDS; w++) {
        putPacket(theirs, a.rank * MSCCLPP_ZC_DESCRIPTOR_WORDS + w, words[w], flag);
      }
    }
    bool found = true, aligned = true;
    if (t < a.nranks) {
      uint64_t input = 0, output = 0;
      if (t == a.rank) {
        input = reinterpret_cast<uint64_t>(a.send);
        output = reinterpret_cast<uint64_t>(a.recv);
      } else {
        uint64_t w[MSCCLPP_ZC_DESCRIPTOR_WORDS];
        for (int k = 0; k < MSCCLPP_ZC_DESCRIPTOR_WORDS; k++) {
          w[k] = getPacket(a, mine, t * MSCCLPP_ZC_DESCRIPTOR_WORDS + k, flag, aborted);
        }
        if ((Needs & ZcPeerInputs) || ((Needs & ZcRootInput) && t == a.root)) {
          input = zcResolve(a, t, w[0], w[1]);
          found = found && input != 0;
        }
        if (Needs & ZcPeerOutputs) {
          output = zcResolve(a, t, w[2], w[3]);
          found = found && output != 0;
        }
      }
      aligned = input % 16 == 0 && output % 16 == 0;
      state[MSCCLPP_STATE_ZC_SEND + t] = input;
      state[MSCCLPP_STATE_ZC_RECV + t] = output;
    }
    const bool mineYes = __syncthreads_and(found && !aborted) != 0;
    if (t < a.nranks && t != a.rank) {
      putPacket(collPackets(a, t, epoch), MSCCLPP_ZC_VOTES + a.rank, mineYes ? 1 : 0, flag);
    }
    bool yes = mineYes;
    if (t < a.nranks && t != a.rank) {
      yes = getPacket(a, mine, MSCCLPP_ZC_VOTES + t, flag, aborted) == 1 && !aborted;
    }
    const bool go = __syncthreads_and(yes) != 0;
    const bool allAligned = __syncthreads_and(aligned) != 0 && a.aligned != 0;
    if (t == 0) {
      if (go) state[MSCCLPP_STATE_ZC_CALLS] = state[MSCCLPP_STATE_ZC_CALLS] + 1;
      __threadfence();
      state[MSCCLPP_STATE_ZC_DECISION] = (epoch << 2) | (allAligned ? 2 : 0) | (go ? 1 : 0);
    }
    __syncthreads();
  } else {
    // Block 0 always decides (its waits end on an abort), so this wait ends.
    if (t == 0) {
      while ((state[MSCCLPP_STATE_ZC_DECISION] >> 2) != epoch) {
      }
      __threadfence();
    }
    __syncthreads();
  }
  const uint64_t decision = state[MSCCLPP_STATE_ZC_DECISION];
  if (t < a.nranks) {
    inputs[t] = state[MSCCLPP_STATE_ZC_SEND + t];
    outputs[t] = state[MSCCLPP_STATE_ZC_RECV + t];
  }
  __syncthreads();
  return {(decision & 1) != 0, (decision & 2) != 0};
}

// Step 4: this block is done with the peers' buffers; waits until every peer's same block is.
__device__ __forceinline__ void zcFinish(const CollArgs& a, uint64_t epoch)
{
  collSignal(a, epoch, 0);
  collWait(a, epoch, 0);
}

#define MSCCLPP_ZC_BEGIN(needs)                                         \
  __shared__ uint64_t inputs[MSCCLPP_COLL_MAX_RANKS];                   \
  __shared__ uint64_t outputs[MSCCLPP_COLL_MAX_RANKS];                  \
  const uint64_t epoch = collBegin(a);                                  \
  const ZcPlan plan = zcAgree<needs>(a, epoch, inputs, outputs);

// How the units are spread: grid-stride, every block's threads on neighbouring units, so that at any
// moment the whole launch streams through one region of each buffer. Measured on one H100 with 2 ranks
// under MPS (docs/PERFORMANCE.md, zero-copy, the layout), a contiguous part per block instead (one stream
// per block, 128 far apart) moved 2.25-2.38 TB/s of memory traffic where the grid-stride moved 2.85-2.99,
// the copy engine's 3.02. With the grid-stride, writes into a peer's buffer through its mapping move as much
// as reads of it, so all-reduce pushes its reduced shard (4 N of traffic instead of two pulls' 5 N); several
// units per thread at once (2, 4 or 8, with the registers for them) moved no more. The whole, aligned units
// go by plain 16-byte loads and stores, without the checks of a partial or unaligned unit (which cost 7-9 %
// of the traffic there).
template <bool B>
struct ZcWhole {
  static constexpr bool value = B;
};

// Unit `unit` of a buffer of `bytes`: a whole, aligned one directly, any other byte by byte.
template <typename Whole>
__device__ __forceinline__ uint4 zcLoad(const char* base, uint64_t unit, uint64_t bytes)
{
  if constexpr (Whole::value) return reinterpret_cast<const uint4*>(base)[unit];
  else return loadUnit<uint4>(base, unit, bytes, false);
}

template <typename Whole>
__device__ __forceinline__ void zcStore(char* base, uint64_t unit, uint64_t bytes, uint4 v)
{
  if constexpr (Whole::value) reinterpret_cast<uint4*>(base)[unit] = v;
  else storeUnit<uint4>(base, unit, bytes, false, v);
}

// `step(j, whole)` for each of this block's units j < `total`; `whole` is ZcWhole<true> for j < `wholeUnits`
// (units that are whole and aligned), ZcWhole<false> after.
template <typename Step>
__device__ __forceinline__ void zcUnits(uint64_t total, uint64_t wholeUnits, Step step)
{
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t whole = wholeUnits < total ? wholeUnits : total;
  uint64_t j = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; j < whole; j += stride) step(j, ZcWhole<true>());
  for (; j < total; j += stride) step(j, ZcWhole<false>());
}

// The units of a buffer of `bytes` that are whole and, if every buffer is aligned, go directly.
__device__ __forceinline__ uint64_t zcWholeUnits(const ZcPlan& plan, uint64_t bytes)
{
  return plan.aligned ? bytes / 16 : 0;
}

// ---- the fallback: the scratch algorithm, in the same launch --------------------------------------------
// Where the vote says no, this launch runs the collective's scratch algorithm (`body`, the scratch kernel's
// own code), window by window, each window its own epoch as if it were its own launch: the path the call
// would have taken without registered buffers, in one launch instead of one per window. (Separate scratch
// launches after the zero-copy one, each doing nothing where the vote said yes, cost every zero-copy call
// about 5 us a window: 43 windows for a 1 GiB all-reduce with the default scratch, one H100, 2 ranks under
// MPS, docs/PERFORMANCE.md.) Between windows every block of this rank waits until the last one has ended
// the window (collEnd), as the next launch on the stream would; every block is resident, so this ends.
__device__ __forceinline__ void zcWindowEnded(const CollArgs& a, uint64_t epoch)
{
  if (threadIdx.x == 0) {
    while (*reinterpret_cast<volatile uint64_t*>(&a.state[MSCCLPP_STATE_EPOCH]) < epoch) {
    }
    __threadfence();
  }
  __syncthreads();
}

// A window's arguments live in shared memory: the scratch code reads them in its loops, which from a
// thread's own copy (local memory) made the fallback 30 % slower than the scratch kernels.
template <typename Body>
__device__ void zcThroughScratch(const CollArgs& a, uint64_t epoch, Body body)
{
  __shared__ CollArgs window;
  collEnd(a, epoch);
  zcWindowEnded(a, epoch);
  for (uint64_t offset = 0; offset < a.bytes; offset += a.zcWindow) {
    if (threadIdx.x == 0) {
      window = a;
      window.send = a.send ? a.send + offset : nullptr;
      window.recv = a.recv ? a.recv + offset : nullptr;
      window.bytes = a.bytes - offset < a.zcWindow ? a.bytes - offset : a.zcWindow;
    }
    __syncthreads();
    const uint64_t windowEpoch = collBegin(a);
    body(window);
    zcWindowEnded(a, windowEpoch);
  }
}

// All-reduce in one pass: rank r reduces shard r of every rank's input, in rank order, and writes the sum
// into shard r of every rank's output (its own last), so each byte is read once and written once where it
// lands. Every rank's output gets the same bits (one rank computes each shard). In place is safe: shard r
// of any input is read, and of any output written, only by rank r, each unit by one thread that reads it
// before writing it. PreMulSum is not taken here (a rank would scale a peer's input by its own scalar):
// src/collective/zero_copy/mod.rs.
template <typename T, typename Op>
__device__ void allreduceZc(const CollArgs& a)
{
  MSCCLPP_ZC_BEGIN(ZcPeerInputs | ZcPeerOutputs)
  if (plan.go) {
    const uint64_t bytes = a.bytes;
    const uint32_t nranks = a.nranks;
    const uint64_t units = unitsOf(bytes, 16);
    const uint64_t shard = (units + nranks - 1) / nranks;
    // This rank's shard: units [first, first + mine), the first `whole` of them whole and aligned.
    const uint64_t first = a.rank * shard;
    const uint64_t left = first < units ? units - first : 0;
    const uint64_t mine = left < shard ? left : shard;
    const uint64_t wholeUnits = zcWholeUnits(plan, bytes);
    const uint64_t whole = wholeUnits > first ? wholeUnits - first : 0;
    zcUnits(mine, whole, [&](uint64_t j, auto w) {
      using W = decltype(w);
      const uint64_t u = first + j;
      uint4 acc = zcLoad<W>(reinterpret_cast<const char*>(inputs[0]), u, bytes);
      for (uint32_t r = 1; r < nranks; r++) {
        acc = reduceUnit<T, Op>(acc, zcLoad<W>(reinterpret_cast<const char*>(inputs[r]), u, bytes));
      }
      acc = finishUnit<T, Op>(acc, nranks);
      for (uint32_t k = 0, r = a.rank; k < nranks; k++) {
        r = r + 1 == nranks ? 0 : r + 1;
        zcStore<W>(reinterpret_cast<char*>(outputs[r]), u, bytes, acc);
      }
    });
    zcFinish(a, epoch);
    collEnd(a, epoch);
  } else {
    zcThroughScratch(a, epoch, allreduceRsag<T, Op>);
  }
}

// All-gather: every rank pushes its input into its place in every rank's output (its own last). Across GPUs
// stores into a peer's memory carry more than loads from it with both directions busy (363 against 336 GB/s
// each way on two H100s, docs/PERFORMANCE.md, the link's ceilings); on one GPU the two move alike.
__device__ void allgatherZc(const CollArgs& a)
{
  MSCCLPP_ZC_BEGIN(ZcPeerOutputs)
  if (plan.go) {
    for (uint32_t k = 1; k <= a.nranks; k++) {
      const uint32_t r = (a.rank + k) % a.nranks;
      char* piece = reinterpret_cast<char*>(outputs[r]) + a.rank * a.strideBytes;
      if (piece == a.send) continue;
      zcUnits(unitsOf(a.bytes, 16), zcWholeUnits(plan, a.bytes), [&](uint64_t j, auto w) {
        using W = decltype(w);
        zcStore<W>(piece, j, a.bytes, zcLoad<W>(a.send, j, a.bytes));
      });
    }
    zcFinish(a, epoch);
    collEnd(a, epoch);
  } else {
    zcThroughScratch(a, epoch, allgatherCopy);
  }
}

// Reduce-scatter: rank r reduces piece r of every rank's input, in rank order, into its output.
template <typename T, typename Op>
__device__ void reducescatterZc(const CollArgs& a)
{
  MSCCLPP_ZC_BEGIN(ZcPeerInputs)
  if (plan.go) {
    const uint64_t piece = a.rank * a.strideBytes;
    const uint64_t bytes = a.bytes;
    const uint32_t nranks = a.nranks;
    zcUnits(unitsOf(bytes, 16), zcWholeUnits(plan, bytes), [&](uint64_t j, auto w) {
      using W = decltype(w);
      uint4 acc = zcLoad<W>(reinterpret_cast<const char*>(inputs[0]) + piece, j, bytes);
      for (uint32_t r = 1; r < nranks; r++) {
        acc = reduceUnit<T, Op>(acc, zcLoad<W>(reinterpret_cast<const char*>(inputs[r]) + piece, j, bytes));
      }
      zcStore<W>(a.recv, j, bytes, finishUnit<T, Op>(acc, nranks));
    });
    zcFinish(a, epoch);
    collEnd(a, epoch);
  } else {
    zcThroughScratch(a, epoch, reducescatterCopy<T, Op>);
  }
}

// Broadcast: every rank copies the root's input into its output (the root too, unless in place).
__device__ void broadcastZc(const CollArgs& a)
{
  MSCCLPP_ZC_BEGIN(ZcRootInput)
  if (plan.go) {
    const char* source = reinterpret_cast<const char*>(inputs[a.root]);
    if (source != a.recv) {
      zcUnits(unitsOf(a.bytes, 16), zcWholeUnits(plan, a.bytes), [&](uint64_t j, auto w) {
        using W = decltype(w);
        zcStore<W>(a.recv, j, a.bytes, zcLoad<W>(source, j, a.bytes));
      });
    }
    zcFinish(a, epoch);
    collEnd(a, epoch);
  } else {
    zcThroughScratch(a, epoch, broadcastCopy);
  }
}
