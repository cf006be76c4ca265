// NCCL's API without a GPU: layouts and values of our nccl.h, the version, error strings and the last
// error, every bad argument (each with its code and a log line naming the argument), groups, refused
// functions, split and shrink of one rank, non-blocking initialisation, and communicators of one and two
// ranks in one process (the bootstrap needs no GPU), including a peer's abort seen through
// ncclCommGetAsyncError, and ncclCommAbort from another thread ending a call blocked on the communicator
// (under a watchdog, so that a hang is a FAIL).
// Built against build/include/nccl.h and linked with -lnccl alone. Prints one line per check and
// "nccl host test: N passed, N failed".
#include <nccl.h>

#include "nccl_check.h"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

static void layouts_and_values() {
  check(sizeof(ncclUniqueId) == 128 && NCCL_UNIQUE_ID_BYTES == 128, "ncclUniqueId is 128 bytes");
  check(sizeof(ncclConfig_t) == 120, "ncclConfig_t is 120 bytes (2.32)");
  const size_t offsets[] = {offsetof(ncclConfig_t, size),          offsetof(ncclConfig_t, magic),
                            offsetof(ncclConfig_t, version),       offsetof(ncclConfig_t, blocking),
                            offsetof(ncclConfig_t, cgaClusterSize), offsetof(ncclConfig_t, minCTAs),
                            offsetof(ncclConfig_t, maxCTAs),       offsetof(ncclConfig_t, netName),
                            offsetof(ncclConfig_t, splitShare),    offsetof(ncclConfig_t, trafficClass),
                            offsetof(ncclConfig_t, commName),      offsetof(ncclConfig_t, collnetEnable),
                            offsetof(ncclConfig_t, CTAPolicy),     offsetof(ncclConfig_t, shrinkShare),
                            offsetof(ncclConfig_t, nvlsCTAs),      offsetof(ncclConfig_t, nChannelsPerNetPeer),
                            offsetof(ncclConfig_t, nvlinkCentricSched), offsetof(ncclConfig_t, graphUsageMode),
                            offsetof(ncclConfig_t, numRmaCtx),          offsetof(ncclConfig_t, maxP2pPeers),
                            offsetof(ncclConfig_t, graphStreamOrdering), offsetof(ncclConfig_t, launchOrderImplicit),
                            offsetof(ncclConfig_t, numRmaSig),          offsetof(ncclConfig_t, rmaEagerInit),
                            offsetof(ncclConfig_t, hostCftMode),        offsetof(ncclConfig_t, nvlsHostMode)};
  const size_t want[] = {0,  8,  12, 16, 20, 24, 28, 32, 40, 44, 48,  56,  60,
                         64, 68, 72, 76, 80, 84, 88, 92, 96, 100, 104, 108, 112};
  check(std::memcmp(offsets, want, sizeof(want)) == 0, "ncclConfig_t's field offsets");
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  check(sizeof(ncclConfig_t) == 120 && c.size == 120 && c.magic == 0xcafebeef && c.version == 23203 &&
            c.blocking == INT_MIN && c.netName == NULL && c.commName == NULL &&
            c.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT && c.nvlsHostMode == NCCL_CONFIG_UNDEF_INT,
        "NCCL_CONFIG_INITIALIZER");
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  check(sizeof(ncclCollConfig_t) == 72 && offsetof(ncclCollConfig_t, algSelection) == 40 &&
            offsetof(ncclCollConfig_t, userProfilerTag) == 56 && offsetof(ncclCollConfig_t, launchCompletionEvent) == 64 &&
            cc.size == 72 && cc.magic == 0xcafebeef && cc.version == 23203 && cc.forceAlgSelection == 1 &&
            cc.maxCTAs == NCCL_CONFIG_UNDEF_INT && cc.launchCompletionEvent == NULL,
        "ncclCollConfig_t and NCCL_COLLCONFIG_INITIALIZER");
  check(sizeof(ncclWaitSignalDesc_t) == 16 && sizeof(ncclEncryptionConfig_t) == 32 && NCCL_SUSPEND_MEM == 1 &&
            ncclStatGpuMemSuspend == 0 && ncclStatGpuMemSuspended == 1 && ncclStatGpuMemPersist == 2 &&
            ncclStatGpuMemTotal == 3,
        "2.29-2.32's other types and values");
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  check(sizeof(ncclSimInfo_t) == 24 && s.magic == 0x74685283 && s.size == 24, "ncclSimInfo_t and its initializer");
  check(NCCL_MAJOR == 2 && NCCL_MINOR == 32 && NCCL_PATCH == 3 && NCCL_VERSION_CODE == 23203 &&
            NCCL_VERSION(2, 32, 3) == 23203 && NCCL_VERSION(2, 28, 9) == 22809 && NCCL_VERSION(2, 8, 4) == 2804,
        "version macros");
  check(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2 && ncclInternalError == 3 &&
            ncclInvalidArgument == 4 && ncclInvalidUsage == 5 && ncclRemoteError == 6 && ncclInProgress == 7 &&
            ncclTimeout == 8 && ncclNumResults == 9,
        "ncclResult_t values");
  check(ncclInt8 == 0 && ncclChar == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclInt == 2 && ncclUint32 == 3 &&
            ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclHalf == 6 && ncclFloat32 == 7 &&
            ncclFloat == 7 && ncclFloat64 == 8 && ncclDouble == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 &&
            ncclFloat8e5m2 == 11 && ncclNumTypes == 12,
        "ncclDataType_t values");
  check(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4 && ncclNumOps == 5 &&
            ncclMaxRedOp == 0x7fffffff && sizeof(ncclRedOp_t) == sizeof(int),
        "ncclRedOp_t values, int-sized");
  check(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1 && NCCL_SPLIT_NOCOLOR == -1 &&
            NCCL_SHRINK_DEFAULT == 0 && NCCL_SHRINK_ABORT == 1 && NCCL_WIN_DEFAULT == 0 &&
            NCCL_WIN_COLL_SYMMETRIC == 1 && NCCL_WIN_REQUIRED_ALIGNMENT == 4096,
        "other values");
}

static void version_and_errors() {
  int v = 0;
  expect(ncclGetVersion(&v), ncclSuccess, "ncclGetVersion");
  check(v == 23203, "ncclGetVersion gives 23203");
  expect(ncclGetVersion(NULL), ncclInvalidArgument, "ncclGetVersion(NULL)");
  logged("ncclGetVersion: version is NULL");
  check(std::strstr(ncclGetLastError(NULL), "version is NULL") != NULL, "ncclGetLastError names the argument");
  bool distinct = true;
  for (int i = 0; i < ncclNumResults; ++i)
    for (int j = i + 1; j < ncclNumResults; ++j)
      distinct = distinct && std::strcmp(ncclGetErrorString((ncclResult_t)i), ncclGetErrorString((ncclResult_t)j)) != 0;
  check(distinct && std::strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "ncclGetErrorString");
  check(std::strcmp(ncclGetErrorString((ncclResult_t)99), "unknown result code") == 0, "ncclGetErrorString(99)");
  check(pncclGetErrorString(ncclInvalidUsage) == ncclGetErrorString(ncclInvalidUsage), "pncclGetErrorString");
}

// A communicator of one rank (no GPU needed).
static ncclComm_t one_rank() {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return NULL;
  return comm;
}

static void initialisation() {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  ncclComm_t comm = NULL;
  expect(ncclGetUniqueId(NULL), ncclInvalidArgument, "ncclGetUniqueId(NULL)");
  expect(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument, "ncclCommInitRank(comm NULL)");
  expect(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "ncclCommInitRank(nranks 0)");
  logged("nranks is 0");
  expect(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "ncclCommInitRank(rank 2 of 2)");
  logged("rank is 2");
  expect(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument, "ncclCommInitRank(an id of zeros)");
  logged("unique id");
  check(comm == NULL, "a failed init leaves *comm alone");
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.magic = 0x1234;
  expect(ncclCommInitRankConfig(&comm, 1, id, 0, &c), ncclInvalidArgument, "config with a wrong magic");
  logged("config's magic is 0x1234");
  ncclConfig_t small = NCCL_CONFIG_INITIALIZER;
  small.size = 16;
  expect(ncclCommInitRankConfig(&comm, 1, id, 0, &small), ncclInvalidArgument, "config with a wrong size");
  logged("config's size is 16");
  ncclConfig_t b = NCCL_CONFIG_INITIALIZER;
  b.blocking = 2;
  expect(ncclCommInitRankConfig(&comm, 1, id, 0, &b), ncclInvalidArgument, "config with blocking 2");
  logged("blocking is 2");
  expect(ncclCommInitAll(NULL, 1, NULL), ncclInvalidArgument, "ncclCommInitAll(comms NULL)");
  expect(ncclCommInitAll(&comm, 0, NULL), ncclInvalidArgument, "ncclCommInitAll(ndev 0)");
  ncclUniqueId ids[2];
  expect(ncclCommInitRankScalable(&comm, 1, 0, 2, ids, NULL), ncclInvalidUsage, "ncclCommInitRankScalable(2 ids)");
  logged("not carried out by this library yet");

  // One id: carried out.
  ncclUniqueId one;
  expect(ncclGetUniqueId(&one), ncclSuccess, "ncclGetUniqueId");
  expect(ncclCommInitRankScalable(&comm, 1, 0, 1, &one, NULL), ncclSuccess, "ncclCommInitRankScalable(1 id)");
  expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");

  // Non-blocking: ncclInProgress (or ncclSuccess), then ncclCommGetAsyncError reaches ncclSuccess.
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  nb.commName = "nonblocking";
  expect(ncclGetUniqueId(&one), ncclSuccess, "ncclGetUniqueId");
  comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, 1, one, 0, &nb);
  check((r == ncclInProgress || r == ncclSuccess) && comm != NULL, "non-blocking init returns at once with a comm");
  ncclResult_t state = ncclInProgress;
  for (int i = 0; i < 1000 && state == ncclInProgress; ++i) {
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  expect(state, ncclSuccess, "non-blocking init reaches ncclSuccess");
  expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy (non-blocking)");
}

static void one_rank_calls() {
  ncclComm_t comm = one_rank();
  check(comm != NULL, "a communicator of one rank");
  if (!comm) return;
  int n = -1, rank = -1, dev = -1;
  expect(ncclCommCount(comm, &n), ncclSuccess, "ncclCommCount");
  expect(ncclCommUserRank(comm, &rank), ncclSuccess, "ncclCommUserRank");
  check(n == 1 && rank == 0, "count 1, rank 0");
  ncclResult_t d = ncclCommCuDevice(comm, &dev);
  check(d == ncclSuccess || d == ncclUnhandledCudaError, "ncclCommCuDevice: a device, or no driver");
  expect(ncclCommCount(comm, NULL), ncclInvalidArgument, "ncclCommCount(count NULL)");
  expect(ncclCommCount(NULL, &n), ncclInvalidArgument, "ncclCommCount(comm NULL)");
  logged("comm is NULL");
  ncclResult_t async = ncclInternalError;
  expect(ncclCommGetAsyncError(comm, &async), ncclSuccess, "ncclCommGetAsyncError");
  expect(async, ncclSuccess, "async error of a healthy comm");
  expect(ncclCommGetAsyncError(comm, NULL), ncclInvalidArgument, "ncclCommGetAsyncError(NULL)");

  // Collectives: every bad argument, caught before any GPU work.
  void* p = (void*)0x1000;
  expect(ncclAllReduce(p, p, 4, ncclFloat, ncclSum, NULL, 0), ncclInvalidArgument, "ncclAllReduce(comm NULL)");
  expect(ncclAllReduce(p, p, 4, (ncclDataType_t)12, ncclSum, comm, 0), ncclInvalidArgument, "ncclAllReduce(datatype 12)");
  logged("ncclAllReduce: datatype is 12");
  expect(ncclAllReduce(p, p, 4, (ncclDataType_t)-1, ncclSum, comm, 0), ncclInvalidArgument, "ncclAllReduce(datatype -1)");
  logged("it must be an ncclDataType_t, 0 (ncclInt8) to 11 (ncclFloat8e5m2)");
  expect(ncclAllReduce(p, p, 4, ncclFloat, (ncclRedOp_t)5, comm, 0), ncclInvalidArgument, "ncclAllReduce(op 5, not made)");
  logged("op is 5");
  expect(ncclAllReduce(p, p, 4, ncclFloat, (ncclRedOp_t)-3, comm, 0), ncclInvalidArgument, "ncclAllReduce(op -3)");
  expect(ncclAllReduce(p, NULL, 4, ncclFloat, ncclSum, comm, 0), ncclInvalidArgument, "ncclAllReduce(recvbuff NULL)");
  logged("recvbuff is NULL");
  expect(ncclAllReduce(NULL, p, 4, ncclFloat, ncclSum, comm, 0), ncclInvalidArgument, "ncclAllReduce(sendbuff NULL)");
  expect(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, 0), ncclSuccess, "ncclAllReduce(count 0)");
  expect(ncclAllReduce(p, p, SIZE_MAX / 2, ncclFloat, ncclSum, comm, 0), ncclInvalidArgument, "ncclAllReduce(count overflows)");
  expect(ncclBroadcast(p, p, 4, ncclFloat, 1, comm, 0), ncclInvalidArgument, "ncclBroadcast(root 1 of 1)");
  logged("root is 1");
  expect(ncclBcast(p, 4, ncclFloat, -1, comm, 0), ncclInvalidArgument, "ncclBcast(root -1)");
  expect(ncclAllGather(p, NULL, 4, ncclFloat, comm, 0), ncclInvalidArgument, "ncclAllGather(recvbuff NULL)");
  expect(ncclReduceScatter(p, p, 4, ncclFloat, (ncclRedOp_t)9, comm, 0), ncclInvalidArgument, "ncclReduceScatter(op 9)");

  // PreMulSum operators: made for one type, carried out by the core's collectives (checked here without a
  // GPU); an operator of another type, of another comm or destroyed is refused before anything is queued.
  float scalar = 0.5f;
  ncclRedOp_t op = ncclSum;
  expect(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm), ncclSuccess, "ncclRedOpCreatePreMulSum");
  check(op >= ncclNumOps, "its operator is numbered from ncclNumOps");
  expect(ncclAllReduce(p, p, 4, ncclFloat16, op, comm, 0), ncclInvalidArgument, "ncclAllReduce(a float PreMulSum op, half data)");
  logged("was made by ncclRedOpCreatePreMulSum for ncclFloat32, not for datatype ncclFloat16 of this call");
  expect(ncclReduce(p, p, 4, ncclFloat8e4m3, op, 0, comm, 0), ncclInvalidArgument, "ncclReduce(a float PreMulSum op, fp8 data)");
  expect(ncclReduceScatter(p, p, 0, ncclInt32, op, comm, 0), ncclInvalidArgument, "ncclReduceScatter(count 0, wrong type)");
  expect(ncclAllReduce(NULL, NULL, 0, ncclFloat, op, comm, 0), ncclSuccess, "ncclAllReduce(PreMulSum, count 0)");
  expect(ncclAllReduce(p, NULL, 4, ncclFloat, op, comm, 0), ncclInvalidArgument, "ncclAllReduce(PreMulSum, recvbuff NULL)");
  ncclRedOp_t devOp = ncclSum;
  unsigned char fp8Scalar = 0x38;  // 1.0 as e4m3
  expect(ncclRedOpCreatePreMulSum(&devOp, (void*)0x1004, ncclFloat, ncclScalarDevice, comm), ncclSuccess,
         "ncclRedOpCreatePreMulSum(ncclScalarDevice): the pointer is read by the kernels");
  expect(ncclRedOpCreatePreMulSum(&devOp, (void*)0x1002, ncclFloat, ncclScalarDevice, comm), ncclInvalidArgument,
         "ncclRedOpCreatePreMulSum(ncclScalarDevice, misaligned)");
  logged("is not aligned to its type ncclFloat32 (4 bytes)");
  ncclRedOp_t fp8Op = ncclSum;
  expect(ncclRedOpCreatePreMulSum(&fp8Op, &fp8Scalar, ncclFloat8e4m3, ncclScalarHostImmediate, comm), ncclSuccess,
         "ncclRedOpCreatePreMulSum(ncclFloat8e4m3)");
  check(fp8Op != op, "a second operator gets a number of its own");
  expect(ncclAllReduce(p, p, 4, ncclFloat8e5m2, fp8Op, comm, 0), ncclInvalidArgument, "an e4m3 operator on e5m2 data");
  // Calls that pass the checks are the core's: without a driver they fail there (or host memory is
  // refused), never as unsupported.
  for (auto [name, rc] : {std::pair<const char*, ncclResult_t>{"ncclAllReduce(fp8)", ncclAllReduce(p, p, 4, ncclFloat8e4m3, ncclSum, comm, 0)},
                          {"ncclAllReduce(fp8, ncclMax)", ncclAllReduce(p, p, 4, ncclFloat8e5m2, ncclMax, comm, 0)},
                          {"ncclReduceScatter(fp8)", ncclReduceScatter(p, p, 4, ncclFloat8e5m2, ncclAvg, comm, 0)},
                          {"ncclAllGather(fp8)", ncclAllGather(p, p, 4, ncclFloat8e4m3, comm, 0)},
                          {"ncclBroadcast(fp8)", ncclBroadcast(p, p, 4, ncclFloat8e5m2, 0, comm, 0)},
                          {"ncclAllReduce(PreMulSum)", ncclAllReduce(p, p, 4, ncclFloat, op, comm, 0)},
                          {"ncclReduceScatter(PreMulSum)", ncclReduceScatter(p, p, 4, ncclFloat, op, comm, 0)},
                          {"ncclReduce(PreMulSum, device scalar)", ncclReduce(p, p, 4, ncclFloat, devOp, 0, comm, 0)},
                          {"ncclAllReduce(fp8 PreMulSum)", ncclAllReduce(p, p, 4, ncclFloat8e4m3, fp8Op, comm, 0)}})
    check(rc == ncclUnhandledCudaError || rc == ncclInvalidArgument,
          std::string(name) + ": carried out natively (no driver here, or host memory refused), not refused as unsupported");
  // An operator is its communicator's: another comm does not know it.
  ncclComm_t other = one_rank();
  if (other) {
    expect(ncclAllReduce(p, p, 4, ncclFloat, op, other, 0), ncclInvalidArgument, "a PreMulSum op of another comm");
    logged("or an operator made by ncclRedOpCreatePreMulSum on this comm (and not destroyed)");
    expect(ncclRedOpDestroy(op, other), ncclInvalidArgument, "ncclRedOpDestroy on another comm");
    expect(ncclCommDestroy(other), ncclSuccess, "ncclCommDestroy(other)");
  }
  // Inside a group a refused operator fails the group's end, which issues nothing.
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclAllReduce(p, p, 4, ncclBfloat16, op, comm, 0), ncclInvalidArgument, "a wrong-type PreMulSum in a group");
  expect(ncclGroupEnd(), ncclInvalidArgument, "the group's end fails");
  expect(ncclRedOpDestroy(devOp, comm), ncclSuccess, "ncclRedOpDestroy(device scalar op)");
  expect(ncclRedOpDestroy(fp8Op, comm), ncclSuccess, "ncclRedOpDestroy(fp8 op)");
  expect(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat, ncclScalarHostImmediate, comm), ncclInvalidArgument, "PreMulSum(op NULL)");
  expect(ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat, ncclScalarHostImmediate, comm), ncclInvalidArgument, "PreMulSum(scalar NULL)");
  expect(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, (ncclScalarResidence_t)7, comm), ncclInvalidArgument, "PreMulSum(residence 7)");
  expect(ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)12, ncclScalarDevice, comm), ncclInvalidArgument, "PreMulSum(datatype 12)");
  expect(ncclRedOpDestroy(op, comm), ncclSuccess, "ncclRedOpDestroy");
  expect(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "ncclRedOpDestroy twice");
  expect(ncclAllReduce(p, p, 4, ncclFloat, op, comm, 0), ncclInvalidArgument, "a destroyed PreMulSum op");
  expect(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "ncclRedOpDestroy(ncclSum)");

  // Reduce, all-to-all, gather and scatter are carried out by the core: their arguments are checked here
  // without a GPU, as the other collectives' are; a valid call then needs the GPU (no driver here).
  expect(ncclReduce(p, p, 4, ncclFloat, ncclSum, 3, comm, 0), ncclInvalidArgument, "ncclReduce(root 3)");
  logged("root is 3");
  expect(ncclReduce(p, NULL, 4, ncclFloat, ncclSum, 0, comm, 0), ncclInvalidArgument, "ncclReduce(root's recvbuff NULL)");
  expect(ncclReduce(p, p, 4, ncclFloat, (ncclRedOp_t)9, 0, comm, 0), ncclInvalidArgument, "ncclReduce(op 9)");
  expect(ncclAlltoAll(p, p, 4, (ncclDataType_t)40, comm, 0), ncclInvalidArgument, "ncclAlltoAll(datatype 40)");
  expect(ncclAlltoAll(NULL, p, 4, ncclFloat, comm, 0), ncclInvalidArgument, "ncclAlltoAll(sendbuff NULL)");
  expect(ncclGather(p, p, 4, ncclFloat, -1, comm, 0), ncclInvalidArgument, "ncclGather(root -1)");
  expect(ncclScatter(p, p, 4, ncclFloat, 1, comm, 0), ncclInvalidArgument, "ncclScatter(root 1 of 1)");
  expect(ncclScatter(NULL, NULL, 0, ncclFloat, 0, comm, 0), ncclSuccess, "ncclScatter(count 0)");
  for (auto [name, rc] : {std::pair<const char*, ncclResult_t>{"ncclReduce", ncclReduce(p, p, 4, ncclFloat, ncclSum, 0, comm, 0)},
                          {"ncclAlltoAll", ncclAlltoAll(p, p, 4, ncclFloat, comm, 0)},
                          {"ncclGather", ncclGather(p, p, 4, ncclFloat, 0, comm, 0)},
                          {"ncclScatter", ncclScatter(p, p, 4, ncclFloat, 0, comm, 0)}})
    check(rc == ncclUnhandledCudaError || rc == ncclInvalidArgument,
          std::string(name) + ": carried out natively (no driver here, or host memory refused), not refused as unsupported");
  // Send and receive are the core's: a send to this rank without its receive in the same call or group
  // cannot complete, and is refused before anything is queued.
  expect(ncclSend(p, 4, ncclFloat, 0, comm, 0), ncclInvalidArgument, "ncclSend to self, unmatched");
  expect(ncclSend(p, 4, ncclFloat, 1, comm, 0), ncclInvalidArgument, "ncclSend(peer 1 of 1)");
  logged("peer is 1");
  expect(ncclRecv(p, 4, ncclFloat, 0, comm, 0), ncclInvalidArgument, "ncclRecv from self, unmatched");
  expect(ncclSend(p, 0, ncclFloat, 0, comm, 0), ncclSuccess, "ncclSend(count 0) does nothing");
  expect(ncclRecv(p, 4, ncclFloat8e4m3, 0, comm, 0), ncclInvalidArgument, "ncclRecv(fp8) from self, unmatched: ours");
  expect(ncclSend(p, 4, ncclFloat8e5m2, 1, comm, 0), ncclInvalidArgument, "ncclSend(fp8, peer 1 of 1)");
  expect(ncclSend(p, 4, (ncclDataType_t)12, 0, comm, 0), ncclInvalidArgument, "ncclSend(datatype 12)");
  // Split and shrink are carried out here (nccl_split_test has more ranks); revoke there too.
  ncclComm_t newcomm = (ncclComm_t)p;
  expect(ncclCommSplit(comm, 0, 0, &newcomm, NULL), ncclSuccess, "ncclCommSplit of one rank");
  check(newcomm != NULL && newcomm != comm && ncclCommCount(newcomm, &n) == ncclSuccess && n == 1,
        "its new comm has one rank");
  expect(ncclCommDestroy(newcomm), ncclSuccess, "ncclCommDestroy(split comm)");
  newcomm = (ncclComm_t)p;
  expect(ncclCommSplit(comm, -2, 0, &newcomm, NULL), ncclInvalidArgument, "ncclCommSplit(color -2)");
  check(newcomm == NULL, "a refused ncclCommSplit sets *newcomm to NULL");
  logged("color is -2");
  expect(ncclCommSplit(comm, 0, 0, NULL, NULL), ncclInvalidArgument, "ncclCommSplit(newcomm NULL)");
  expect(ncclCommShrink(comm, NULL, 0, &newcomm, NULL, NCCL_SHRINK_DEFAULT), ncclSuccess, "ncclCommShrink(nothing excluded)");
  expect(ncclCommDestroy(newcomm), ncclSuccess, "ncclCommDestroy(shrunk comm)");
  expect(ncclCommShrink(comm, NULL, 0, &newcomm, NULL, 7), ncclInvalidArgument, "ncclCommShrink(flags 7)");
  expect(ncclCommRevoke(comm, 1), ncclInvalidArgument, "ncclCommRevoke(flags 1)");
  logged("revokeFlags is 1");
  expect(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage, "ncclDevCommCreate: not offered");
  logged("device API");
  expect(ncclDevCommDestroy(comm, NULL), ncclInvalidUsage, "ncclDevCommDestroy: not offered");

  // Registration and windows (the core's table, as mscclppCommRegister): arguments first; a host address
  // is refused by the driver's query (ncclInvalidArgument on a GPU machine, ncclUnhandledCudaError
  // without a driver); a handle never issued, or one deregistered already, is ncclInvalidUsage; NULL
  // handles are NCCL's "nothing registered" and deregister as a no-op.
  void* handle = p;
  expect(ncclCommRegister(comm, p, 64, NULL), ncclInvalidArgument, "ncclCommRegister(handle NULL)");
  logged("handle is NULL");
  expect(ncclCommRegister(comm, NULL, 64, &handle), ncclInvalidArgument, "ncclCommRegister(buff NULL)");
  logged("buff is NULL");
  expect(ncclCommRegister(comm, p, 0, &handle), ncclInvalidArgument, "ncclCommRegister(size 0)");
  logged("size is 0");
  expect(ncclCommRegister(NULL, p, 64, &handle), ncclInvalidArgument, "ncclCommRegister(comm NULL)");
  ncclResult_t reg = ncclCommRegister(comm, p, 64, &handle);
  check(reg == ncclInvalidArgument || reg == ncclUnhandledCudaError, "ncclCommRegister(host address) is refused");
  check(handle == p, "a refused ncclCommRegister leaves *handle alone");
  expect(ncclCommDeregister(comm, (void*)0x4d53000000ba0000ull), ncclInvalidUsage, "ncclCommDeregister(never issued)");
  logged("is not a live registration");
  expect(ncclCommDeregister(comm, p), ncclInvalidUsage, "ncclCommDeregister(an address)");
  expect(ncclCommDeregister(comm, NULL), ncclSuccess, "ncclCommDeregister(NULL): nothing to do");
  expect(ncclCommDeregister(NULL, p), ncclInvalidArgument, "ncclCommDeregister(comm NULL)");
  ncclWindow_t win = (ncclWindow_t)p;
  expect(ncclCommWindowRegister(comm, p, 4096, &win, 5), ncclInvalidArgument, "ncclCommWindowRegister(flags 5)");
  expect(ncclCommWindowRegister(comm, p, 4096, NULL, NCCL_WIN_DEFAULT), ncclInvalidArgument,
         "ncclCommWindowRegister(win NULL)");
  expect(ncclCommWindowRegister(comm, NULL, 4096, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
         "ncclCommWindowRegister(buff NULL)");
  expect(ncclCommWindowRegister(comm, p, 0, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
         "ncclCommWindowRegister(size 0)");
  reg = ncclCommWindowRegister(comm, p, 4096, &win, NCCL_WIN_COLL_SYMMETRIC);
  check(reg == ncclInvalidArgument || reg == ncclUnhandledCudaError, "ncclCommWindowRegister(host address) is refused");
  check(win == (ncclWindow_t)p, "a refused ncclCommWindowRegister leaves *win alone");
  expect(ncclCommWindowDeregister(comm, (ncclWindow_t)0x4d53000000bb0000ull), ncclInvalidUsage,
         "ncclCommWindowDeregister(never issued)");
  logged("is not a live window");
  expect(ncclCommWindowDeregister(comm, NULL), ncclSuccess, "ncclCommWindowDeregister(NULL): nothing to do");

  // Memory.
  void* mem = p;
  expect(ncclMemAlloc(NULL, 16), ncclInvalidArgument, "ncclMemAlloc(ptr NULL)");
  expect(ncclMemAlloc(&mem, 0), ncclSuccess, "ncclMemAlloc(0 bytes)");
  check(mem == NULL, "ncclMemAlloc(0 bytes) gives NULL");
  expect(ncclMemFree(NULL), ncclSuccess, "ncclMemFree(NULL)");
  expect(ncclMemFree(p), ncclInvalidArgument, "ncclMemFree(not ours)");

  // Groups.
  expect(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd without a start");
  logged("without a matching ncclGroupStart");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart (nested)");
  expect(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, 0), ncclSuccess, "ncclAllReduce queued in a group");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (inner)");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (outer) issues it");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclAllReduce(p, p, 4, (ncclDataType_t)12, ncclSum, comm, 0), ncclInvalidArgument, "a bad call in a group");
  expect(ncclGroupEnd(), ncclInvalidArgument, "fails its group's end");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclSend(p, 4, ncclFloat, 0, comm, 0), ncclSuccess, "ncclSend to self queued in a group");
  expect(ncclGroupEnd(), ncclInvalidArgument, "its group's end refuses it, unmatched");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclRecv(p, 4, ncclFloat, 0, comm, 0), ncclSuccess, "ncclRecv from self queued");
  expect(ncclSend(p, 4, ncclFloat, 0, comm, 0), ncclSuccess, "ncclSend to self queued after it");
  const ncclResult_t matched = ncclGroupEnd();
  check(matched == ncclUnhandledCudaError || matched == ncclInvalidArgument,
        "a matched send and receive to self reach the GPU path at the group's end (no driver, or host memory)");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclAllReduce(p, p, 4, ncclFloat, ncclSum, NULL, 0), ncclInvalidArgument, "a NULL comm in a group");
  expect(ncclGroupEnd(), ncclInvalidArgument, "fails its group's end too");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  expect(ncclGroupSimulateEnd(NULL), ncclInvalidArgument, "ncclGroupSimulateEnd(NULL)");
  sim.magic = 1;
  expect(ncclGroupSimulateEnd(&sim), ncclInvalidArgument, "ncclGroupSimulateEnd(wrong magic)");
  ncclSimInfo_t sim2 = NCCL_SIM_INFO_INITIALIZER;
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclGroupSimulateEnd(&sim2), ncclSuccess, "ncclGroupSimulateEnd");
  expect(ncclGroupEnd(), ncclInvalidUsage, "the simulated end closed the group");

  // Finalize, then destroy; the handle is dead afterwards.
  expect(ncclCommFinalize(comm), ncclSuccess, "ncclCommFinalize");
  expect(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, 0), ncclInvalidUsage, "a call after finalize");
  logged("finalized");
  expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  expect(ncclCommCount(comm, &n), ncclInvalidArgument, "a destroyed comm");
  logged("not a live communicator");
  expect(ncclCommDestroy(comm), ncclInvalidArgument, "ncclCommDestroy twice");
  expect(ncclCommDestroy(NULL), ncclSuccess, "ncclCommDestroy(NULL)");
  expect(ncclCommAbort(NULL), ncclSuccess, "ncclCommAbort(NULL)");
  expect(ncclCommFinalize(NULL), ncclInvalidArgument, "ncclCommFinalize(NULL)");

  // Abort frees the communicator.
  comm = one_rank();
  expect(ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
  expect(ncclCommGetAsyncError(comm, &async), ncclInvalidArgument, "an aborted comm is gone");
}

// Two ranks made by one thread in a group, then rank 0 aborts: rank 1 sees ncclRemoteError.
static void two_ranks() {
  ncclUniqueId id;
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  ncclComm_t comms[2] = {NULL, NULL};
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclCommInitRank(&comms[0], 2, id, 0), ncclSuccess, "ncclCommInitRank(rank 0) in a group");
  expect(ncclCommInitRank(&comms[1], 2, id, 1), ncclSuccess, "ncclCommInitRank(rank 1) in a group");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd makes both");
  int n = 0, r = -1;
  expect(ncclCommCount(comms[1], &n), ncclSuccess, "ncclCommCount");
  expect(ncclCommUserRank(comms[1], &r), ncclSuccess, "ncclCommUserRank");
  check(n == 2 && r == 1, "count 2, rank 1");

  // ncclGroupSimulateEnd: an estimate from our algorithm table's choice, growing with the size; nothing is
  // issued (no GPU is needed).
  void* buf = (void*)0x1000;
  float small = -1, large = -1;
  for (float* out : {&small, &large}) {
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    expect(ncclAllReduce(buf, buf, out == &small ? 256 : (256u << 20), ncclFloat, ncclSum, comms[0], 0), ncclSuccess,
           "ncclAllReduce queued");
    expect(ncclGroupSimulateEnd(&sim), ncclSuccess, "ncclGroupSimulateEnd");
    *out = sim.estimatedTime;
  }
  check(small > 0 && large > 100 * small,
        "the estimate of a 1 GiB all-reduce is far above that of 1 KiB (" + std::to_string(small) + " and " +
            std::to_string(large) + " us)");

  // Two non-blocking inits from one thread, outside a group.
  ncclUniqueId id2;
  expect(ncclGetUniqueId(&id2), ncclSuccess, "ncclGetUniqueId");
  ncclConfig_t nb = NCCL_CONFIG_INITIALIZER;
  nb.blocking = 0;
  ncclComm_t more[2] = {NULL, NULL};
  ncclResult_t a = ncclCommInitRankConfig(&more[0], 2, id2, 0, &nb);
  ncclResult_t b = ncclCommInitRankConfig(&more[1], 2, id2, 1, &nb);
  check(a == ncclInProgress && b == ncclInProgress, "two non-blocking inits from one thread return ncclInProgress");
  ncclResult_t s0 = ncclInProgress, s1 = ncclInProgress;
  for (int i = 0; i < 1000 && (s0 == ncclInProgress || s1 == ncclInProgress); ++i) {
    ncclCommGetAsyncError(more[0], &s0);
    ncclCommGetAsyncError(more[1], &s1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  check(s0 == ncclSuccess && s1 == ncclSuccess, "both reach ncclSuccess");
  expect(ncclCommDestroy(more[0]), ncclSuccess, "ncclCommDestroy");
  expect(ncclCommDestroy(more[1]), ncclSuccess, "ncclCommDestroy");

  expect(ncclCommAbort(comms[0]), ncclSuccess, "ncclCommAbort(rank 0)");
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 500 && async == ncclSuccess; ++i) {
    ncclCommGetAsyncError(comms[1], &async);
    if (async == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  expect(async, ncclRemoteError, "rank 1 sees rank 0's abort as ncclRemoteError");
  check(std::strstr(ncclGetLastError(comms[1]), "rank 0") != NULL,
        std::string("ncclGetLastError names the peer: ") + ncclGetLastError(comms[1]));
  void* p = (void*)0x1000;
  expect(ncclAllReduce(p, p, 4, ncclFloat, ncclSum, comms[1], 0), ncclRemoteError, "a call on the failed comm");
  expect(ncclCommDestroy(comms[1]), ncclSuccess, "ncclCommDestroy(rank 1)");
}

// ncclCommAbort from another thread while a call blocks on the communicator. Rank 0 of two ranks calls a
// blocking ncclCommSplit, which is collective over the parent: it waits for rank 1's color, and rank 1
// never calls it. Another thread aborts rank 0's communicator after 200 ms: the split must return soon
// after (within 5 s) with ncclInvalidUsage (the library's code for a call ended by this rank's own abort),
// *newcomm NULL; the abort gives ncclSuccess, and rank 1 sees rank 0's abort as ncclRemoteError. A
// watchdog ends the program with a FAIL if the case has not finished within 20 s (the split's wait has
// no timeout of its own: without the abort it would wait as long as rank 1 lives).
static void abort_while_blocked() {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return done; })) {
      check(false, "ncclCommAbort from another thread ends a blocked ncclCommSplit: still blocked after 20 s");
      std::printf("log (%s):\n%s", log_path.c_str(), read_file(log_path).c_str());
      std::printf("nccl host test: %d passed, %d failed\n", counts->passed, counts->failed);
      std::fflush(stdout);
      std::remove(log_path.c_str());
      _exit(1);
    }
  });

  ncclUniqueId id;
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  ncclComm_t comms[2] = {NULL, NULL};
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  ncclCommInitRank(&comms[0], 2, id, 0);
  ncclCommInitRank(&comms[1], 2, id, 1);
  expect(ncclGroupEnd(), ncclSuccess, "two ranks made in a group (for the abort of a blocked call)");

  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point aborting = Clock::time_point::max();
  ncclResult_t aborted = ncclInternalError;
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    aborting = Clock::now();
    aborted = ncclCommAbort(comms[0]);
  });
  ncclComm_t newcomm = (ncclComm_t)0x1;
  const ncclResult_t split = ncclCommSplit(comms[0], 0, 0, &newcomm, NULL);
  const Clock::time_point returned = Clock::now();
  const std::string last = ncclGetLastError(NULL);
  aborter.join();
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  const double blocked = ms(returned - start), after = ms(returned - aborting);
  std::printf("blocked ncclCommSplit: returned %.1f ms after it was called, %.1f ms after ncclCommAbort began\n",
              blocked, after);
  check(returned >= aborting, "the split blocked until the abort came (returned after " + std::to_string(blocked) + " ms)");
  check(after < 5000, "and returned within 5 s of ncclCommAbort (" + std::to_string(after) + " ms)");
  expect(split, ncclInvalidUsage, "the split ended by the abort of its communicator");
  check(newcomm == NULL, "its *newcomm is NULL");
  check(last.find("aborted") != std::string::npos, "ncclGetLastError says the communicator was aborted: " + last);
  expect(aborted, ncclSuccess, "ncclCommAbort from another thread while a split blocks on it");
  int n = 0;
  expect(ncclCommCount(comms[0], &n), ncclInvalidArgument, "the aborted comm is gone");
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 500 && async == ncclSuccess; ++i) {
    ncclCommGetAsyncError(comms[1], &async);
    if (async == ncclSuccess) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  expect(async, ncclRemoteError, "rank 1 sees rank 0's abort as ncclRemoteError");
  expect(ncclCommDestroy(comms[1]), ncclSuccess, "ncclCommDestroy(rank 1)");

  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
}

int main() {
  if (!init_counts()) return 2;
  // The library's log lines go to a file of their own (in each child too), where logged() looks.
  if (!log_to_a_temp_file("nccl_host_test")) return 2;
  unsetenv("MSCCLPP_DEBUG");
  unsetenv("MSCCLPP_DEBUG_FILE");
  unsetenv("NCCL_COMM_ID");
  unsetenv("MSCCLPP_NCCL_FALLBACK");  // its calls are refused here; nccl_fallback_test sets it
  layouts_and_values();
  version_and_errors();
  initialisation();
  one_rank_calls();
  two_ranks();
  abort_while_blocked();
  if (counts->failed) std::printf("log (%s):\n%s", log_path.c_str(), read_file(log_path).c_str());
  std::remove(log_path.c_str());
  std::printf("nccl host test: %d passed, %d failed\n", counts->passed, counts->failed);
  return counts->failed ? 1 : 0;
}
