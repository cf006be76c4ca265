// Trigger FIFO of the 0.1.0 interface, written for the legacy-ABI test from the documented wire format.
//
// The legacy-ABI program is compiled against the 0.1.0 header, which includes this file; the inline
// device code below then lives inside the test binary, not in the library. It must therefore produce
// exactly the bits the legacy code produced, so it deliberately does not mask over-wide arguments
// (callers keep sizes and offsets within 32 bits and connection ids within 10 bits).
#ifndef MSCCLPPFIFO_H_
#define MSCCLPPFIFO_H_

#include <stdint.h>

// mscclpp.h defines the slot count before including this file; keep a fallback for standalone use.
#ifndef MSCCLPP_PROXY_FIFO_SIZE
#define MSCCLPP_PROXY_FIFO_SIZE 128
#endif

// What the proxy does for a trigger; a trigger carries a bit set of these.
typedef enum : uint64_t
{
  mscclppData = 0x1,
  mscclppFlag = 0x2,
  mscclppSync = 0x4
} mscclppTriggerType_t;

#define MSCCLPP_BITS_SIZE 32
#define MSCCLPP_BITS_OFFSET 32
#define MSCCLPP_BITS_CONNID 10
#define MSCCLPP_BITS_TYPE 3

// One 16-byte slot. Word 0: dataSize | srcDataOffset << 32. Word 1: dstDataOffset | connId << 32 | type << 42.
union alignas(16) mscclppTrigger
{
  uint64_t value[2];
  struct
  {
    uint64_t dataSize : MSCCLPP_BITS_SIZE;
    uint64_t srcDataOffset : MSCCLPP_BITS_OFFSET;
    uint64_t dstDataOffset : MSCCLPP_BITS_OFFSET;
    uint64_t connId : MSCCLPP_BITS_CONNID;
    uint64_t type : MSCCLPP_BITS_TYPE;
    uint64_t : (64 - MSCCLPP_BITS_OFFSET - MSCCLPP_BITS_CONNID - MSCCLPP_BITS_TYPE);
  } fields;
};

typedef mscclppTrigger* mscclppTrigger_t;

// Many device threads produce into one proxy's FIFO; the proxy thread is the only consumer.
struct mscclppConcurrentFifo
{
#ifdef __CUDACC__
  // Claims a slot, waits for room and for the slot to be released, then writes the whole trigger in a
  // single 16-byte store (a slot is empty while its word 0 is zero). Returns the claimed position.
  __forceinline__ __device__ uint64_t push(uint64_t type, uint64_t dstDataOffset, uint64_t srcDataOffset,
                                           uint64_t dataSize)
  {
    uint64_t pos = atomicAdd((unsigned long long*)triggerFifoHead, 1ULL);
    while (pos >= MSCCLPP_PROXY_FIFO_SIZE + *(volatile uint64_t*)triggerFifoTail) {
    }
    mscclppTrigger* slot = &triggerFifo[pos % MSCCLPP_PROXY_FIFO_SIZE];
    while (*(volatile uint64_t*)&slot->value[0] != 0) {
    }
    uint64_t word0 = (srcDataOffset << MSCCLPP_BITS_SIZE) + dataSize;
    uint64_t word1 = (((type << MSCCLPP_BITS_CONNID) + (uint64_t)connId) << MSCCLPP_BITS_OFFSET) + dstDataOffset;
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(slot->value), "l"(word0), "l"(word1) : "memory");
    return pos;
  }
#endif
  mscclppTrigger* triggerFifo; // the slots, in pinned host memory mapped for the device
  uint64_t* triggerFifoTail;   // the device's (possibly stale) copy of the proxy's tail
  uint64_t* triggerFifoHead;   // next position to claim; advanced by device threads only
  int connId;                  // index of the connection this handle pushes for
};

#endif // MSCCLPPFIFO_H_
