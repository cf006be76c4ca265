// Checks that the generated mscclpp.h and mscclppfifo.h reproduce the MSCCL++ 0.1.0 interface exactly:
// every type's size, alignment and field offsets and types, enum values and sizes, macros, the class
// relation of mscclppDevConn, and every function's exact type (static_assert); the trigger's bit packing
// and the exported symbols (at run time). Programs built against the legacy header rely on all of it.
//
// Built by g++ (as C++) and by nvcc (as CUDA, where the device methods are checked too, and exercised on
// a GPU when one is present). Both builds use -Wall -Wextra -Werror.
#include <mscclpp.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// ---- macros ----
#if MSCCLPP_MAJOR != 0 || MSCCLPP_MINOR != 1 || MSCCLPP_PATCH != 0 || MSCCLPP_VERSION != 100
#error "version macros differ from 0.1.0"
#endif
#if MSCCLPP_PROXY_FIFO_SIZE != 128 || MSCCLPP_PROXY_FIFO_FLUSH_COUNTER != 4
#error "FIFO macros differ from the legacy header"
#endif
#if MSCCLPP_UNIQUE_ID_BYTES != 128
#error "MSCCLPP_UNIQUE_ID_BYTES differs from the legacy header"
#endif
#if MSCCLPP_BITS_SIZE != 32 || MSCCLPP_BITS_OFFSET != 32 || MSCCLPP_BITS_CONNID != 10 || MSCCLPP_BITS_TYPE != 3
#error "trigger bit widths differ from the legacy header"
#endif
#ifndef MSCCLPPFIFO_H_
#error "mscclpp.h must include mscclppfifo.h"
#endif

#define SAME(A, ...) static_assert(std::is_same<A, __VA_ARGS__>::value, #A " is not " #__VA_ARGS__)
#define SIZE_ALIGN(T, size, align)                                                                           \
  static_assert(sizeof(T) == (size), "sizeof(" #T ") != " #size);                                            \
  static_assert(alignof(T) == (align), "alignof(" #T ") != " #align)
#define FIELD(T, field, offset, ...)                                                                         \
  static_assert(offsetof(T, field) == (offset), "offsetof(" #T ", " #field ") != " #offset);                 \
  SAME(decltype(T::field), __VA_ARGS__)

// mscclppDevConn derives from mscclppBaseConn, so it is not standard-layout and g++ warns about offsetof;
// the legacy layout (Itanium ABI, single inheritance, no virtuals) is what is being pinned here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
#ifdef __NVCC__
#pragma nv_diag_suppress 1427 // the same warning from nvcc's front end
#endif

// ---- mscclppfifo.h ----
SIZE_ALIGN(mscclppTriggerType_t, 8, 8);
SAME(std::underlying_type<mscclppTriggerType_t>::type, uint64_t);
static_assert(mscclppData == 1 && mscclppFlag == 2 && mscclppSync == 4, "trigger type values");
static_assert(std::is_same<decltype(mscclppData | mscclppFlag | mscclppSync), uint64_t>::value ||
                std::is_same<decltype(mscclppData | mscclppFlag | mscclppSync), unsigned long>::value,
              "trigger types combine as 64-bit values");

static_assert(std::is_union<mscclppTrigger>::value, "mscclppTrigger is a union");
SIZE_ALIGN(mscclppTrigger, 16, 16);
FIELD(mscclppTrigger, value, 0, uint64_t[2]);
static_assert(offsetof(mscclppTrigger, fields) == 0, "mscclppTrigger.fields at 0");
static_assert(sizeof(mscclppTrigger::fields) == 16, "mscclppTrigger.fields is 16 bytes");
SAME(mscclppTrigger_t, mscclppTrigger*);

SIZE_ALIGN(mscclppConcurrentFifo, 32, 8);
FIELD(mscclppConcurrentFifo, triggerFifo, 0, mscclppTrigger*);
FIELD(mscclppConcurrentFifo, triggerFifoTail, 8, uint64_t*);
FIELD(mscclppConcurrentFifo, triggerFifoHead, 16, uint64_t*);
FIELD(mscclppConcurrentFifo, connId, 24, int);

// ---- mscclpp.h: structs ----
SIZE_ALIGN(mscclppDevConnSignalEpochId, 16, 16);
FIELD(mscclppDevConnSignalEpochId, device, 0, uint64_t);
FIELD(mscclppDevConnSignalEpochId, proxy, 8, uint64_t);

SIZE_ALIGN(mscclppBaseConn, 48, 8);
FIELD(mscclppBaseConn, remoteRank, 0, int);
FIELD(mscclppBaseConn, tag, 4, int);
FIELD(mscclppBaseConn, localBuff, 8, void*);
FIELD(mscclppBaseConn, localSignalEpochId, 16, mscclppDevConnSignalEpochId*);
FIELD(mscclppBaseConn, remoteSignalEpochId, 24, mscclppDevConnSignalEpochId*);
FIELD(mscclppBaseConn, waitEpochId, 32, uint64_t*);
FIELD(mscclppBaseConn, remoteBuff, 40, void*);

static_assert(std::is_base_of<mscclppBaseConn, mscclppDevConn>::value, "mscclppDevConn : mscclppBaseConn");
static_assert(!std::is_polymorphic<mscclppDevConn>::value, "mscclppDevConn has no vtable");
static_assert(std::is_trivially_copyable<mscclppDevConn>::value, "mscclppDevConn is copied to the device");
SIZE_ALIGN(mscclppDevConn, 80, 8);
static_assert(offsetof(mscclppDevConn, remoteRank) == 0 && offsetof(mscclppDevConn, remoteBuff) == 40,
              "mscclppDevConn starts with its mscclppBaseConn");
FIELD(mscclppDevConn, fifo, 48, mscclppConcurrentFifo);
SAME(mscclppDevConn_t, mscclppDevConn);
SAME(mscclppComm_t, mscclppComm*);

SIZE_ALIGN(mscclppUniqueId, 128, 1);
FIELD(mscclppUniqueId, internal, 0, char[MSCCLPP_UNIQUE_ID_BYTES]);

SIZE_ALIGN(mscclppIbMrInfo, 16, 8);
FIELD(mscclppIbMrInfo, addr, 0, uint64_t);
FIELD(mscclppIbMrInfo, rkey, 8, uint32_t);

SIZE_ALIGN(mscclppIbMr, 32, 8);
FIELD(mscclppIbMr, mr, 0, ibv_mr*);
FIELD(mscclppIbMr, buff, 8, void*);
FIELD(mscclppIbMr, info, 16, mscclppIbMrInfo);

SIZE_ALIGN(mscclppRegisteredMemoryP2P, 16, 8);
FIELD(mscclppRegisteredMemoryP2P, remoteBuff, 0, void*);
FIELD(mscclppRegisteredMemoryP2P, IbMr, 8, mscclppIbMr*);

SIZE_ALIGN(mscclppRegisteredMemory, 24, 8);
FIELD(mscclppRegisteredMemory, p2p, 0, std::vector<mscclppRegisteredMemoryP2P>);

#ifdef __NVCC__
#pragma nv_diag_default 1427
#endif
#pragma GCC diagnostic pop

// ---- mscclpp.h: enums and typedefs ----
SIZE_ALIGN(mscclppResult_t, 4, 4);
static_assert(mscclppSuccess == 0 && mscclppUnhandledCudaError == 1 && mscclppSystemError == 2 &&
                mscclppInternalError == 3 && mscclppInvalidArgument == 4 && mscclppInvalidUsage == 5 &&
                mscclppRemoteError == 6 && mscclppInProgress == 7 && mscclppNumResults == 8,
              "mscclppResult_t values");
SIZE_ALIGN(mscclppTransport_t, 4, 4);
static_assert(mscclppTransportP2P == 0 && mscclppTransportSHM == 1 && mscclppTransportIB == 2,
              "mscclppTransport_t values");
SAME(mscclppLogHandler_t, void (*)(const char*));

// ---- mscclpp.h: functions, exactly as declared by the legacy header ----
SAME(decltype(&mscclppGetUniqueId), mscclppResult_t (*)(mscclppUniqueId*));
SAME(decltype(&mscclppCommInitRank), mscclppResult_t (*)(mscclppComm_t*, int, const char*, int));
SAME(decltype(&mscclppCommInitRankFromId), mscclppResult_t (*)(mscclppComm_t*, int, mscclppUniqueId, int));
SAME(decltype(&mscclppBootstrapAllGather), mscclppResult_t (*)(mscclppComm_t, void*, int));
SAME(decltype(&mscclppBootstrapBarrier), mscclppResult_t (*)(mscclppComm_t));
SAME(decltype(&mscclppCommDestroy), mscclppResult_t (*)(mscclppComm_t));
SAME(decltype(&mscclppGetErrorString), const char* (*)(mscclppResult_t));
SAME(decltype(&mscclppConnect),
     mscclppResult_t (*)(mscclppComm_t, int, int, void*, uint64_t, mscclppTransport_t, const char*));
SAME(decltype(&mscclppConnectionSetup), mscclppResult_t (*)(mscclppComm_t));
SAME(decltype(&mscclppGetAllDeviceConnections), mscclppResult_t (*)(mscclppComm_t, mscclppDevConn_t**, int*));
SAME(decltype(&mscclppGetDeviceConnection), mscclppResult_t (*)(mscclppComm_t, int, int, mscclppDevConn_t**));
SAME(decltype(&mscclppProxyLaunch), mscclppResult_t (*)(mscclppComm_t));
SAME(decltype(&mscclppProxyStop), mscclppResult_t (*)(mscclppComm_t));
SAME(decltype(&mscclppCommRank), mscclppResult_t (*)(mscclppComm_t, int*));
SAME(decltype(&mscclppCommSize), mscclppResult_t (*)(mscclppComm_t, int*));
SAME(decltype(&mscclppSetBootstrapConnTimeout), mscclppResult_t (*)(int));
SAME(decltype(&mscclppDefaultLogHandler), void (*)(const char*));
SAME(decltype(&mscclppSetLogHandler), mscclppResult_t (*)(mscclppLogHandler_t));
SAME(decltype(&mscclppRegisterBuffer), mscclppResult_t (*)(mscclppComm_t, void*, size_t, mscclppRegisteredMemory*));
SAME(decltype(&mscclppRegisteredBufferWrite), mscclppResult_t (*)(mscclppComm_t, mscclppRegisteredMemory*, void*,
                                                                  size_t, uint32_t, uint32_t, int64_t));
// ---- mscclpp.h: our extensions ----
#ifndef MSCCLPP_HAS_ABORT
#error "mscclpp.h does not define MSCCLPP_HAS_ABORT"
#endif
SAME(decltype(&mscclppCommAbort), mscclppResult_t (*)(mscclppComm_t));
SAME(decltype(&mscclppCommGetAsyncError), mscclppResult_t (*)(mscclppComm_t, mscclppResult_t*));
#ifndef MSCCLPP_HAS_REGISTRATION
#error "mscclpp.h does not define MSCCLPP_HAS_REGISTRATION"
#endif
// NCCL's shapes: ncclCommRegister(comm, buff, size, void** handle), ncclCommDeregister(comm, handle).
SAME(decltype(&mscclppCommRegister), mscclppResult_t (*)(mscclppComm_t, void*, size_t, void**));
SAME(decltype(&mscclppCommDeregister), mscclppResult_t (*)(mscclppComm_t, void*));
// The default argument: legacy callers leave ibDev out.
SAME(decltype(mscclppConnect(std::declval<mscclppComm_t>(), 1, 0, std::declval<void*>(), 8, mscclppTransportP2P)),
     mscclppResult_t);

// ---- mscclppDevConn and mscclppConcurrentFifo: device methods, exactly as declared by the legacy header ----
#ifdef __CUDACC__
SAME(decltype(static_cast<void (mscclppDevConn::*)(uint64_t, uint64_t, uint64_t)>(&mscclppDevConn::put)),
     void (mscclppDevConn::*)(uint64_t, uint64_t, uint64_t));
SAME(decltype(static_cast<void (mscclppDevConn::*)(uint64_t, uint64_t)>(&mscclppDevConn::put)),
     void (mscclppDevConn::*)(uint64_t, uint64_t));
SAME(decltype(&mscclppDevConn::signal), void (mscclppDevConn::*)());
SAME(decltype(static_cast<void (mscclppDevConn::*)(uint64_t, uint64_t, uint64_t)>(&mscclppDevConn::putWithSignal)),
     void (mscclppDevConn::*)(uint64_t, uint64_t, uint64_t));
SAME(decltype(static_cast<void (mscclppDevConn::*)(uint64_t, uint64_t)>(&mscclppDevConn::putWithSignal)),
     void (mscclppDevConn::*)(uint64_t, uint64_t));
SAME(decltype(static_cast<void (mscclppDevConn::*)(uint64_t, uint64_t, uint64_t)>(
       &mscclppDevConn::putWithSignalAndFlush)),
     void (mscclppDevConn::*)(uint64_t, uint64_t, uint64_t));
SAME(decltype(static_cast<void (mscclppDevConn::*)(uint64_t, uint64_t)>(&mscclppDevConn::putWithSignalAndFlush)),
     void (mscclppDevConn::*)(uint64_t, uint64_t));
SAME(decltype(&mscclppDevConn::flush), void (mscclppDevConn::*)());
SAME(decltype(&mscclppDevConn::wait), void (mscclppDevConn::*)());
SAME(decltype(&mscclppDevConn::epochIncrement), void (mscclppDevConn::*)());
SAME(decltype(&mscclppConcurrentFifo::push),
     uint64_t (mscclppConcurrentFifo::*)(uint64_t, uint64_t, uint64_t, uint64_t));
#endif

// ---- run time ----
static int passed = 0;
static int failed = 0;
static int skipped = 0;

#define CHECK(cond)                                                                                          \
  do {                                                                                                       \
    if (cond) {                                                                                              \
      ++passed;                                                                                              \
    } else {                                                                                                 \
      ++failed;                                                                                              \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                                          \
    }                                                                                                        \
  } while (0)

static void readWords(const mscclppTrigger& trigger, uint64_t words[2])
{
  std::memcpy(words, &trigger, sizeof(trigger));
}

// The legacy example: the bit fields land where the proxy reads them.
static void checkTriggerPacking()
{
  mscclppTrigger trigger;
  std::memset(&trigger, 0, sizeof(trigger));
  trigger.fields.dataSize = 0x11223344;
  trigger.fields.srcDataOffset = 0x55667788;
  trigger.fields.dstDataOffset = 0x99aabbcc;
  trigger.fields.connId = 0x3ff;
  trigger.fields.type = 5;
  uint64_t words[2];
  readWords(trigger, words);
  CHECK(words[0] == 0x5566778811223344ULL);
  CHECK(words[1] == 0x000017ff99aabbccULL);

  // And back: every field reads what the words say, with nothing in the padding bits.
  const uint64_t raw[2] = {0x0000000100000002ULL, (uint64_t(mscclppData | mscclppSync) << 42) | (7ULL << 32) | 3};
  std::memcpy(&trigger, raw, sizeof(raw));
  CHECK(trigger.fields.dataSize == 2);
  CHECK(trigger.fields.srcDataOffset == 1);
  CHECK(trigger.fields.dstDataOffset == 3);
  CHECK(trigger.fields.connId == 7);
  CHECK(trigger.fields.type == (mscclppData | mscclppSync));
}

// Every function of the header resolves to a symbol of libmscclpp (this program links against it).
static void checkSymbols()
{
  const void* symbols[] = {
    reinterpret_cast<const void*>(&mscclppGetUniqueId),
    reinterpret_cast<const void*>(&mscclppCommInitRank),
    reinterpret_cast<const void*>(&mscclppCommInitRankFromId),
    reinterpret_cast<const void*>(&mscclppBootstrapAllGather),
    reinterpret_cast<const void*>(&mscclppBootstrapBarrier),
    reinterpret_cast<const void*>(&mscclppCommDestroy),
    reinterpret_cast<const void*>(&mscclppGetErrorString),
    reinterpret_cast<const void*>(&mscclppConnect),
    reinterpret_cast<const void*>(&mscclppConnectionSetup),
    reinterpret_cast<const void*>(&mscclppGetAllDeviceConnections),
    reinterpret_cast<const void*>(&mscclppGetDeviceConnection),
    reinterpret_cast<const void*>(&mscclppProxyLaunch),
    reinterpret_cast<const void*>(&mscclppProxyStop),
    reinterpret_cast<const void*>(&mscclppCommRank),
    reinterpret_cast<const void*>(&mscclppCommSize),
    reinterpret_cast<const void*>(&mscclppSetBootstrapConnTimeout),
    reinterpret_cast<const void*>(&mscclppDefaultLogHandler),
    reinterpret_cast<const void*>(&mscclppSetLogHandler),
    reinterpret_cast<const void*>(&mscclppRegisterBuffer),
    reinterpret_cast<const void*>(&mscclppRegisteredBufferWrite),
    reinterpret_cast<const void*>(&mscclppCommAbort),
    reinterpret_cast<const void*>(&mscclppCommGetAsyncError),
    reinterpret_cast<const void*>(&mscclppCommRegister),
    reinterpret_cast<const void*>(&mscclppCommDeregister),
  };
  for (const void* symbol : symbols) {
    CHECK(symbol != nullptr);
  }
  // The enum-typed parameter crosses the ABI as an int: every code has a name.
  for (int code = mscclppSuccess; code <= mscclppNumResults; ++code) {
    const char* name = mscclppGetErrorString(static_cast<mscclppResult_t>(code));
    CHECK(name != nullptr && name[0] != '\0');
  }
}

#ifdef __CUDACC__
#include <cuda_runtime.h>

// Pushes through the header's device code into a FIFO that no proxy serves, so nothing here waits on one.
__global__ void pushTriggers(mscclppDevConn conn, uint64_t* pushedAt)
{
  pushedAt[0] = conn.fifo.push(5, 0x99aabbcc, 0x55667788, 0x11223344);
  conn.put(0x30, 0x20, 0x10);  // slot 1: Data
  conn.signal();               // slot 2: Flag, size 1; device epoch 1
  conn.putWithSignal(0x40, 8); // slot 3: Data|Flag; device epoch 2
  conn.wait();                 // proxy epoch was preset to 1
}

static void checkDeviceCode()
{
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED device-code check: no usable GPU here\n");
    ++skipped;
    return;
  }
  mscclppTrigger* fifo = nullptr;
  uint64_t* counters = nullptr; // head, tail, wait epoch, pushedAt
  mscclppDevConnSignalEpochId* epoch = nullptr;
  CHECK(cudaMallocManaged(&fifo, MSCCLPP_PROXY_FIFO_SIZE * sizeof(mscclppTrigger)) == cudaSuccess);
  CHECK(cudaMallocManaged(&counters, 4 * sizeof(uint64_t)) == cudaSuccess);
  CHECK(cudaMallocManaged(&epoch, sizeof(*epoch)) == cudaSuccess);
  if (failed != 0) {
    return;
  }
  std::memset(fifo, 0, MSCCLPP_PROXY_FIFO_SIZE * sizeof(mscclppTrigger));
  std::memset(counters, 0, 4 * sizeof(uint64_t));
  epoch->device = 0;
  epoch->proxy = 1;
  mscclppDevConn conn;
  std::memset(&conn, 0, sizeof(conn));
  conn.localSignalEpochId = epoch;
  conn.waitEpochId = &counters[2];
  conn.fifo.triggerFifo = fifo;
  conn.fifo.triggerFifoHead = &counters[0];
  conn.fifo.triggerFifoTail = &counters[1];
  conn.fifo.connId = 0x3ff;
  pushTriggers<<<1, 1>>>(conn, &counters[3]);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  uint64_t words[2];
  readWords(fifo[0], words);
  CHECK(words[0] == 0x5566778811223344ULL && words[1] == 0x000017ff99aabbccULL);
  readWords(fifo[1], words);
  CHECK(words[0] == ((0x20ULL << 32) | 0x10) && words[1] == ((uint64_t(mscclppData) << 42) | (0x3ffULL << 32) | 0x30));
  readWords(fifo[2], words);
  CHECK(words[0] == 1 && words[1] == ((uint64_t(mscclppFlag) << 42) | (0x3ffULL << 32)));
  readWords(fifo[3], words);
  CHECK(words[0] == ((0x40ULL << 32) | 8) &&
        words[1] == ((uint64_t(mscclppData | mscclppFlag) << 42) | (0x3ffULL << 32) | 0x40));
  CHECK(counters[0] == 4 && counters[3] == 0);
  CHECK(epoch->device == 2 && counters[2] == 1);
  cudaFree(fifo);
  cudaFree(counters);
  cudaFree(epoch);
}
#endif

int main()
{
  checkTriggerPacking();
  checkSymbols();
#ifdef __CUDACC__
  checkDeviceCode();
  const char* build = "nvcc";
#else
  const char* build = "g++";
#endif
  std::printf("layout_test (%s): %d passed, %d failed, %d skipped\n", build, passed, failed, skipped);
  return failed == 0 ? 0 : 1;
}
