// Packets: 8 bytes of data and two copies of a 32-bit flag in one 16-byte store, so that a reader that sees
// both flags equal to the call's sees the data with it, with no fence and no separate signal (the idea of
// NCCL's LL protocol, with 8 data bytes per store). Both flags are checked, so a torn store is never taken
// for a whole one.
#pragma once

#include "common.cuh"

// The flag of epoch e: never 0 (the value of fresh scratch memory), and equal for two epochs of one slot
// only 2^32 - 1 launches apart.
__device__ __forceinline__ uint32_t packetFlag(uint64_t epoch)
{
  return static_cast<uint32_t>(epoch % 0xffffffffull) + 1;
}

// What every packet kernel starts with: the call's epoch and flag, the piece's 8-byte units, and this
// thread's first unit and stride over the grid.
struct PacketCall {
  uint64_t epoch;
  uint32_t flag;
  uint64_t units, first, step;
  bool aligned;
};
__device__ __forceinline__ PacketCall packetCall(const CollArgs& a)
{
  const uint64_t epoch = collBegin(a);
  return {epoch,
          packetFlag(epoch),
          unitsOf(a.bytes, 8),
          blockIdx.x * blockDim.x + threadIdx.x,
          static_cast<uint64_t>(gridDim.x) * blockDim.x,
          a.aligned != 0};
}

__device__ __forceinline__ void putPacket(char* region, uint64_t index, uint64_t data, uint32_t flag)
{
  char* p = region + index * 16;
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(static_cast<uint32_t>(data)),
               "r"(flag), "r"(static_cast<uint32_t>(data >> 32)), "r"(flag)
               : "memory");
}

// Waits for the packet at `index` to carry `flag` and returns its data; gives up (returning 0) once the
// communicator is aborted, which `aborted` then says.
__device__ __forceinline__ uint64_t getPacket(const CollArgs& a, const char* region, uint64_t index, uint32_t flag,
                                              bool& aborted)
{
  const char* p = region + index * 16;
  uint32_t lo, f0, hi, f1;
  uint32_t spins = 0;
  do {
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(lo), "=r"(f0), "=r"(hi), "=r"(f1)
                 : "l"(p)
                 : "memory");
    if (f0 == flag && f1 == flag) return (static_cast<uint64_t>(hi) << 32) | lo;
    if (aborted) return 0;
  } while (++spins % MSCCLPP_COLL_ABORT_POLL != 0 || !(aborted = collAborted(a)));
  return 0;
}
