// Device helpers every collective kernel shares: the argument block, the call's epoch, the scratch slot
// layout, flags between ranks, abort checks, and loads and stores of 8- and 16-byte units that may be
// partial or unaligned. Compiled by the library's build (build.rs) only; never part of a public header.
#pragma once

#include <stdint.h>

// The one kernel argument, CollArgs, and MSCCLPP_COLL_MAX_RANKS and MSCCLPP_COLL_MAX_BLOCKS: written by
// build.rs from kernels/coll_args.rs, where the library's KernelArgs is defined.
#include "coll_args.cuh"

// Flags at the start of each scratch slot: [phase][block][source rank], 64 bits each.
#define MSCCLPP_COLL_PHASES 2
#define MSCCLPP_COLL_FLAG_BYTES (MSCCLPP_COLL_PHASES * MSCCLPP_COLL_MAX_BLOCKS * MSCCLPP_COLL_MAX_RANKS * 8)
// How often a spinning thread looks at the abort word in host memory (a read over PCIe).
#define MSCCLPP_COLL_ABORT_POLL 1024

// The words of `CollArgs::state`: the epoch of the last call and the blocks done with the current one
// (below), the zero-copy decision of the last call that voted (epoch << 2 | aligned << 1 | go), the number
// of calls that went zero-copy, then every rank's input and output as this rank reaches them (the vote's
// result, for the blocks other than the one that voted).
#define MSCCLPP_STATE_EPOCH 0
#define MSCCLPP_STATE_BLOCKS_DONE 1
#define MSCCLPP_STATE_ZC_DECISION 2
#define MSCCLPP_STATE_ZC_CALLS 3
#define MSCCLPP_STATE_ZC_SEND 4
#define MSCCLPP_STATE_ZC_RECV (MSCCLPP_STATE_ZC_SEND + MSCCLPP_COLL_MAX_RANKS)
#define MSCCLPP_STATE_WORDS (MSCCLPP_STATE_ZC_RECV + MSCCLPP_COLL_MAX_RANKS)

// The PreMulSum scalar of a call whose elements are of type T (see CollArgs).
template <typename T>
__device__ __forceinline__ T collScalar(const CollArgs& a)
{
  if (a.scalarPtr) return *reinterpret_cast<const T*>(a.scalarPtr);
  const uint64_t bits = a.scalarBits;
  return *reinterpret_cast<const T*>(&bits);
}

// What a rank's units of input go through before they leave its buffer (see reduce.cuh's PreOp): nothing.
struct NoPre {
  template <typename U>
  __device__ __forceinline__ U operator()(U v) const { return v; }
};

// ---- the call's epoch --------------------------------------------------------------------------------
// Every launch is one epoch (1, 2, ...), counted on the GPU so that a replayed CUDA graph goes on counting.
// Epoch e uses slot e % 2 of every scratch buffer: a rank can be at most one epoch ahead of its peers
// (finishing epoch e needs every peer's data of epoch e, or its word that it is in it: collRootGate), so it
// never writes the slot a peer still reads. Every kernel keeps that: it ends only once it has heard from
// every peer in its epoch.
__device__ __forceinline__ uint64_t collBegin(const CollArgs& a)
{
  return *reinterpret_cast<volatile uint64_t*>(a.state) + 1;
}

// The last block to finish records the epoch as done, for the next launch on the stream. Only a zero-copy
// kernel's fallback (`zcWindow` non-zero) reads the epoch and the count inside the launch, between its
// windows (zero_copy.cuh): there the count and the epoch are fenced. Every other launch's reader is the next
// launch on the stream, which sees all this one wrote, so its blocks neither fence nor wait: a fence after
// stores into a peer's memory waits for them to cross the link. The count still finds the last block, so
// that no block can start (and take its epoch from the state) after the epoch was stored.
__device__ __forceinline__ void collEnd(const CollArgs& a, uint64_t epoch)
{
  __syncthreads();
  if (threadIdx.x != 0) return;
  volatile uint64_t* state = a.state;
  if (gridDim.x == 1) {
    // One block (every packet call up to a few KiB): nothing to count; in a fallback, its own thread 0
    // is the one that reads the epoch next.
    state[0] = epoch;
    return;
  }
  const bool inLaunchReaders = a.zcWindow != 0;
  if (inLaunchReaders) __threadfence();
  const unsigned long long done = atomicAdd(reinterpret_cast<unsigned long long*>(&a.state[1]), 1ull);
  if (done == gridDim.x - 1) {
    state[1] = 0;
    // The count is reset before any block sees the epoch done (a zero-copy kernel's fallback starts its next
    // window, and its count, as soon as it does).
    if (inLaunchReaders) __threadfence();
    state[0] = epoch;
    if (inLaunchReaders) __threadfence();
  }
}

__device__ __forceinline__ char* collSlot(const CollArgs& a, uint32_t rank, uint64_t epoch)
{
  return a.scratch[rank] + (epoch & 1) * a.slotBytes;
}

// A slot holds its flags, then an area only packets are written to, then an area for copies. Packets never
// share memory with copied data: a stale word of an application's data could otherwise look like a packet
// of the current call, whereas a stale packet always carries an older call's flag.
__device__ __forceinline__ char* collPackets(const CollArgs& a, uint32_t rank, uint64_t epoch)
{
  return collSlot(a, rank, epoch) + MSCCLPP_COLL_FLAG_BYTES;
}

__device__ __forceinline__ char* collData(const CollArgs& a, uint32_t rank, uint64_t epoch)
{
  return collSlot(a, rank, epoch) + MSCCLPP_COLL_FLAG_BYTES + a.packetBytes;
}

__device__ __forceinline__ uint64_t* collFlag(const CollArgs& a, uint32_t owner, uint64_t epoch, int phase, int block,
                                              uint32_t source)
{
  return reinterpret_cast<uint64_t*>(collSlot(a, owner, epoch)) +
         (static_cast<uint64_t>(phase) * MSCCLPP_COLL_MAX_BLOCKS + block) * MSCCLPP_COLL_MAX_RANKS + source;
}

__device__ __forceinline__ bool collAborted(const CollArgs& a)
{
  return *a.abortFlag != 0;
}

// ---- flags -------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t loadAcquireSys(const uint64_t* p)
{
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void storeReleaseSys(uint64_t* p, uint64_t v)
{
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// After every thread of the block has written its part of phase `phase` into the peers' scratch: tells
// each peer (or only `only`, if it names a rank) that this block's part is there.
__device__ __forceinline__ void collSignal(const CollArgs& a, uint64_t epoch, int phase, int only = -1)
{
  __syncthreads();
  const uint32_t peer = threadIdx.x;
  if (peer < a.nranks && peer != a.rank && (only < 0 || peer == static_cast<uint32_t>(only))) {
    __threadfence_system();
    storeReleaseSys(collFlag(a, peer, epoch, phase, blockIdx.x, a.rank), epoch);
  }
}

// Waits until every peer's same block (or only `only`'s; never `skip`'s) has signalled phase `phase`;
// returns false once the communicator is aborted (the data is then undefined, and the kernel should end).
__device__ __forceinline__ bool collWait(const CollArgs& a, uint64_t epoch, int phase, int only = -1, int skip = -1)
{
  int aborted = 0;
  const uint32_t peer = threadIdx.x;
  if (peer < a.nranks && peer != a.rank && (only < 0 || peer == static_cast<uint32_t>(only)) &&
      (skip < 0 || peer != static_cast<uint32_t>(skip))) {
    const uint64_t* flag = collFlag(a, a.rank, epoch, phase, blockIdx.x, peer);
    uint32_t spins = 0;
    while (loadAcquireSys(flag) < epoch) {
      if (++spins % MSCCLPP_COLL_ABORT_POLL == 0 && collAborted(a)) {
        aborted = 1;
        break;
      }
    }
  }
  return __syncthreads_or(aborted) == 0;
}

// ---- units of data -----------------------------------------------------------------------------------
// Buffers are handled in units of 8 (packets) or 16 (bulk) bytes. The last unit of a piece may be partial,
// and the application's buffers need not be aligned: such units are moved byte by byte.
template <typename U>
__device__ __forceinline__ U loadUnit(const char* base, uint64_t unit, uint64_t bytes, bool aligned)
{
  const uint64_t off = unit * sizeof(U);
  const uint64_t n = bytes - off < sizeof(U) ? bytes - off : sizeof(U);
  if (n == sizeof(U) && aligned) return *reinterpret_cast<const U*>(base + off);
  U v;
  char* out = reinterpret_cast<char*>(&v);
  for (uint64_t i = 0; i < sizeof(U); i++) out[i] = i < n ? base[off + i] : 0;
  return v;
}

template <typename U>
__device__ __forceinline__ void storeUnit(char* base, uint64_t unit, uint64_t bytes, bool aligned, U v)
{
  const uint64_t off = unit * sizeof(U);
  const uint64_t n = bytes - off < sizeof(U) ? bytes - off : sizeof(U);
  if (n == sizeof(U) && aligned) {
    *reinterpret_cast<U*>(base + off) = v;
    return;
  }
  const char* in = reinterpret_cast<const char*>(&v);
  for (uint64_t i = 0; i < n; i++) base[off + i] = in[i];
}

// Units of scratch memory are always aligned and whole (scratch regions are sized in units).
__device__ __forceinline__ uint4 loadScratch16(const char* base, uint64_t unit)
{
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(base + unit * 16));
  return v;
}

__device__ __forceinline__ void storeScratch16(char* base, uint64_t unit, uint4 v)
{
  *reinterpret_cast<uint4*>(base + unit * 16) = v;
}

// The range of units [begin, end) of `total` that block `block` of `blocks` handles.
struct UnitRange {
  uint64_t begin, end;
};
__device__ __forceinline__ UnitRange blockRange(uint64_t total, uint32_t block, uint32_t blocks)
{
  const uint64_t per = (total + blocks - 1) / blocks;
  const uint64_t begin = per * block < total ? per * block : total;
  const uint64_t end = begin + per < total ? begin + per : total;
  return {begin, end};
}

__device__ __forceinline__ uint64_t unitsOf(uint64_t bytes, uint64_t unit)
{
  return (bytes + unit - 1) / unit;
}

// What every copy kernel that splits one piece among its blocks starts with: the call's epoch, the piece's
// 16-byte units, and this block's part of them.
struct CopyCall {
  uint64_t epoch;
  uint64_t units;
  UnitRange part;
  bool aligned;
};
__device__ __forceinline__ CopyCall copyCall(const CollArgs& a)
{
  const uint64_t units = unitsOf(a.bytes, 16);
  return {collBegin(a), units, blockRange(units, blockIdx.x, gridDim.x), a.aligned != 0};
}

// ---- pieces between ranks (copy kernels) -------------------------------------------------------------
// Every peer's piece of this rank's input (`strideBytes` apart in `send`) into that peer's scratch, in the
// region of this rank: this block's units of each piece, each through `pre` (a reduction's PreOp).
template <typename Pre = NoPre>
__device__ __forceinline__ void copyPiecesToPeers(const CollArgs& a, const CopyCall& c, const Pre& pre = Pre())
{
  for (uint32_t k = 1; k < a.nranks; k++) {
    const uint32_t peer = (a.rank + k) % a.nranks;
    char* region = collData(a, peer, c.epoch) + a.rank * c.units * 16;
    for (uint64_t j = c.part.begin + threadIdx.x; j < c.part.end; j += blockDim.x) {
      storeScratch16(region, j, pre(loadUnit<uint4>(a.send + peer * a.strideBytes, j, a.bytes, c.aligned)));
    }
  }
}

// What every peer wrote into this rank's scratch (a region per source) into the source's piece of `recv`
// (`strideBytes` apart): this block's units of each piece. After the peers' signals.
__device__ __forceinline__ void copyPiecesFromPeers(const CollArgs& a, const CopyCall& c)
{
  const char* mine = collData(a, a.rank, c.epoch);
  for (uint32_t k = 1; k < a.nranks; k++) {
    const uint32_t source = (a.rank + a.nranks - k) % a.nranks;
    for (uint64_t j = c.part.begin + threadIdx.x; j < c.part.end; j += blockDim.x) {
      storeUnit<uint4>(a.recv + source * a.strideBytes, j, a.bytes, c.aligned, loadScratch16(mine + source * c.units * 16, j));
    }
  }
}

// ---- one sender (broadcast, scatter) -----------------------------------------------------------------
// A call ends only once this rank has heard from every peer in it (the peer's data, or its word that it is
// in the call), so a peer in this rank's next call has finished the call before this one, the last to use
// that call's slot: no rank writes a slot a peer still reads. A broadcast's or scatter's non-roots send no
// data, so each tells every peer it is in the call (phase 1) as it starts (collRootGate), and each rank
// waits at its end for the words of the peers it got no data from (collRootGateClose): the root for every
// non-root, a non-root for the other non-roots. No rank waits before it writes, so the words' trips across
// the link overlap the root's data instead of preceding it.
__device__ __forceinline__ void collRootGate(const CollArgs& a, uint64_t epoch)
{
  if (a.rank != a.root) collSignal(a, epoch, 1);
}

// The end of a call that opened with collRootGate. Between two ranks the non-root has heard from its one
// peer, the root, by its data.
__device__ __forceinline__ void collRootGateClose(const CollArgs& a, uint64_t epoch)
{
  if (a.rank == a.root) {
    collWait(a, epoch, 1);
  } else if (a.nranks > 2) {
    collWait(a, epoch, 1, -1, static_cast<int>(a.root));
  }
}

