/*
 * nccl.h of libmscclpp's NCCL face (build/lib/nccl/libnccl.so.2): the C interface of NCCL 2.32.3 (its
 * functions, values and layouts), so that programs written for NCCL compile and run unchanged against
 * this library. Written for this library from the facts of the interface; docs/nccl.md says
 * which functions are carried out and which return ncclInvalidUsage for now.
 *
 * C11 or later, C++11 or later; needs no CUDA header (cudaStream_t is declared as cuda_runtime.h does).
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23203
/* The code of version X.Y.Z: X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before). */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* This header is ours: a program may tell (NVIDIA's nccl.h does not define it). */
#define NCCL_LIBMSCCLPP 1

#ifndef __CUDA_RUNTIME_H__
typedef struct CUstream_st* cudaStream_t; /* as cuda_runtime.h declares them */
typedef struct CUevent_st* cudaEvent_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator. Handles are opaque: never dereference one. */
typedef struct ncclComm* ncclComm_t;
/* A registered window (ncclCommWindowRegister). */
typedef struct ncclWindow* ncclWindow_t;

#define NCCL_COMM_NULL NULL

/* The id every rank of a communicator is given (made by ncclGetUniqueId on one rank). */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Results. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8, /* since 2.30.3: a wait with a deadline ran out */
  ncclNumResults = 9
} ncclResult_t;

/* Configuration of a communicator: initialise it with NCCL_CONFIG_INITIALIZER, then set fields. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* CTA policy flags (ncclConfig_t.CTAPolicy). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink's flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommWindowRegister's flags, and the alignment its symmetric windows need. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04
#define NCCL_WIN_CFT_COUNTED 0x08
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclCommRevoke's flags (must be 0). */
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclCommSuspend's flags: release the communicator's device memory while it is idle. */
#define NCCL_SUSPEND_MEM 0x01

/* ncclConfig_t.hostCftMode and .nvlsHostMode (2.32; this library uses neither). */
typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;
typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

typedef struct ncclConfig_v23100 {
  /* Set by NCCL_CONFIG_INITIALIZER: the library reads the struct by its size and version. */
  size_t size;
  unsigned int magic;
  unsigned int version;
  /* 0: calls may return ncclInProgress; poll ncclCommGetAsyncError. */
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  /* 2.29 and later (the struct grows only at its end; a shorter one, of an older header, is read by size). */
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;         /* 2.30 */
  int graphStreamOrdering; /* 2.30 */
  int launchOrderImplicit; /* 2.31 */
  int numRmaSig;           /* 2.31 */
  int rmaEagerInit;        /* 2.31 */
  int hostCftMode;         /* 2.32 */
  int nvlsHostMode;        /* 2.32 */
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER {                                          \
  sizeof(ncclConfig_t),                      /* size */                    \
  0xcafebeef,                                /* magic */                   \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */          \
  NCCL_CONFIG_UNDEF_INT,                     /* blocking */                \
  NCCL_CONFIG_UNDEF_INT,                     /* cgaClusterSize */          \
  NCCL_CONFIG_UNDEF_INT,                     /* minCTAs */                 \
  NCCL_CONFIG_UNDEF_INT,                     /* maxCTAs */                 \
  NCCL_CONFIG_UNDEF_PTR,                     /* netName */                 \
  NCCL_CONFIG_UNDEF_INT,                     /* splitShare */              \
  NCCL_CONFIG_UNDEF_INT,                     /* trafficClass */            \
  NCCL_CONFIG_UNDEF_PTR,                     /* commName */                \
  NCCL_CONFIG_UNDEF_INT,                     /* collnetEnable */           \
  NCCL_CONFIG_UNDEF_INT,                     /* CTAPolicy */               \
  NCCL_CONFIG_UNDEF_INT,                     /* shrinkShare */             \
  NCCL_CONFIG_UNDEF_INT,                     /* nvlsCTAs */                \
  NCCL_CONFIG_UNDEF_INT,                     /* nChannelsPerNetPeer */     \
  NCCL_CONFIG_UNDEF_INT,                     /* nvlinkCentricSched */      \
  NCCL_CONFIG_UNDEF_INT,                     /* graphUsageMode */          \
  NCCL_CONFIG_UNDEF_INT,                     /* numRmaCtx */               \
  NCCL_CONFIG_UNDEF_INT,                     /* maxP2pPeers */             \
  NCCL_CONFIG_UNDEF_INT,                     /* graphStreamOrdering */     \
  NCCL_CONFIG_UNDEF_INT,                     /* launchOrderImplicit */     \
  NCCL_CONFIG_UNDEF_INT,                     /* numRmaSig */               \
  NCCL_CONFIG_UNDEF_INT,                     /* rmaEagerInit */            \
  NCCL_CONFIG_UNDEF_INT,                     /* hostCftMode */             \
  NCCL_CONFIG_UNDEF_INT,                     /* nvlsHostMode */            \
}

/* A vendor option of a per-collective config (a list through next; this library reads none). */
typedef struct ncclConfigExt {
  struct ncclConfigExt* next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char* s;
    void* raw;
  } val;
} ncclConfigExt_t;

/* Configuration of one collective call (the nccl*Config functions, 2.31): initialise it with
 * NCCL_COLLCONFIG_INITIALIZER, then set fields; read by its size and version as ncclConfig_t is. */
typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t* ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char* algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
  cudaEvent_t launchCompletionEvent; /* recorded on the stream once the call's work is queued */
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER {                                      \
  sizeof(ncclCollConfig_t),                  /* size */                    \
  0xcafebeef,                                /* magic */                   \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */          \
  NCCL_CONFIG_UNDEF_PTR,                     /* ext */                     \
  NCCL_CONFIG_UNDEF_INT,                     /* minCTAs */                 \
  NCCL_CONFIG_UNDEF_INT,                     /* maxCTAs */                 \
  NCCL_CONFIG_UNDEF_INT,                     /* nvlsCTAs */                \
  NCCL_CONFIG_UNDEF_INT,                     /* cgaClusterSize */          \
  NCCL_CONFIG_UNDEF_PTR,                     /* algSelection */            \
  1,                                         /* forceAlgSelection */       \
  NCCL_CONFIG_UNDEF_INT,                     /* CTAPolicy */               \
  0,                                         /* userProfilerTag */         \
  NCCL_CONFIG_UNDEF_PTR                      /* launchCompletionEvent */   \
}

/* What ncclGroupSimulateEnd fills. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER {                                        \
  sizeof(ncclSimInfo_t),                     /* size */                    \
  0x74685283,                                /* magic */                   \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */          \
  NCCL_UNDEF_FLOAT                           /* estimatedTime */           \
}

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Reduction operators; values from ncclNumOps up are made by ncclRedOpCreatePreMulSum. */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  /* Keeps the enum int-sized whatever the compiler. */
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Where ncclRedOpCreatePreMulSum's scalar lives. */
typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* ---- Memory ---- */

/* Device memory of the current device; ncclMemFree frees it. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ---- Version, unique id, communicators ---- */

/* *version = NCCL_VERSION_CODE of the API the library implements (23203: every function of 2.32.3). */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Makes the id every rank passes to its init (call it on one rank, hand the id to the others). */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* Joins nranks ranks meeting through commId; rank is this one's. With config->blocking = 0 it returns
 * ncclInProgress and the communicator is usable once ncclCommGetAsyncError reports ncclSuccess. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* One process, one rank per device of devlist (NULL: devices 0 to ndev-1). */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* ncclCommInitRankConfig with nId ids (made by as many ranks). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* Ends the communicator's work; then ncclCommDestroy frees it. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* The id new ranks pass to ncclCommGrow (on one existing rank; one id at a time, used once). */
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t pncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId);

/* A communicator of nRanks ranks: the existing ones (comm, rank -1; uniqueId the id on the one rank that
 * made it, NULL on the others) keep their ranks, the new ones (comm NULL, uniqueId, rank their new rank)
 * take the ranks after them. */
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                          ncclConfig_t* config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                           ncclComm_t* newcomm, ncclConfig_t* config);

/* Releases (NCCL_SUSPEND_MEM) the device memory of an idle communicator; ncclCommResume restores it.
 * Every rank calls both. No work may be issued on the communicator in between. */
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

/* What ncclCommMemStats reports. */
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* bytes of device memory a suspend releases */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended, else 0 */
  ncclStatGpuMemPersist = 2,   /* bytes of device memory kept while suspended */
  ncclStatGpuMemTotal = 3      /* bytes of device memory the communicator holds */
} ncclCommMemStat_t;
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);

/* Frees the communicator. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Aborts the communicator on every rank (from any thread, also while a call on it waits) and frees it. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Stops the communicator's work without freeing it; revokeFlags must be 0. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* New communicators of the ranks with the same color, ordered by key (NCCL_SPLIT_NOCOLOR: none). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);

/* A new communicator of the ranks not listed in excludeRanksList. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                             ncclConfig_t* config, int shrinkFlags);

/* ---- Errors and queries ---- */

/* A static description of a result. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* The message of the last error (comm may be NULL). */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* The communicator's asynchronous error, without blocking (ncclRemoteError once a peer failed). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ---- Registration ---- */

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
/* The buffer a window was registered with. */
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t pncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

/* ---- Operators ---- */

/* An operator summing each input multiplied by *scalar (a value of datatype, on the host or the device). */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- Collectives: every rank calls them in the same order; work is queued on stream ---- */

/* root's recvbuff gets op over every rank's sendbuff (count elements). */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                         int root, ncclComm_t comm, cudaStream_t stream);

/* In place: every rank's buff gets root's. */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);

/* Every rank's recvbuff gets root's sendbuff. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream);

/* Every rank's recvbuff gets op over every rank's sendbuff (count elements). */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* recvbuff (recvcount elements) gets this rank's piece of op over every sendbuff (nranks * recvcount). */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* recvbuff (nranks * sendcount elements) gets every rank's sendbuff, in rank order. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream);

/* Rank r's recvbuff block j (count elements) gets rank j's sendbuff block r. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

/* root's recvbuff block j (count elements) gets rank j's sendbuff. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);

/* Rank j's recvbuff (count elements) gets root's sendbuff block j. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                          ncclComm_t comm, cudaStream_t stream);

/* ---- Collectives with a per-call configuration (2.31) ---- */

ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                              ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                              const ncclCollConfig_t* config);
ncclResult_t pncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                               const ncclCollConfig_t* config);
ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                     const ncclCollConfig_t* config);
ncclResult_t pncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
                                      const ncclCollConfig_t* config);
ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t pncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                int root, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t* config);

/* ---- Point to point ---- */

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

/* ---- One-sided: puts into a peer's window and signals, ordered on the stream (2.29) ---- */

/* Copies count elements of localbuff into peer's registration of the window peerWin names (the window
 * every rank registered in the same order), at peerWinOffset bytes, then signals peer. */
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin,
                           size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                            ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
                            ncclComm_t comm, cudaStream_t stream);
/* A signal alone, ordered after the stream's earlier work. */
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);

/* One wait of ncclWaitSignal: opCnt signals from peer. */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;
/* The stream's later work waits until every described signal has arrived (and consumes them). */
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream);

/* ---- Groups: work between the outermost start and its end is issued at the end (groups nest) ---- */

ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
/* Ends the group without issuing its collectives; fills simInfo (made by NCCL_SIM_INFO_INITIALIZER). */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

/* ---- Encryption of the traffic between hosts (2.32) ---- */

typedef enum {
  NCCL_ENCRYPTION_MODE_NONE = 0,
  NCCL_ENCRYPTION_MODE_PSK = 1
} ncclEncryptionMode_t;

typedef struct ncclEncryptionConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int mode;
  const char* psk;
} ncclEncryptionConfig_t;

#define NCCL_ENCRYPTION_CONFIG_INITIALIZER {                               \
  sizeof(ncclEncryptionConfig_t),            /* size */                    \
  0xcafebeef,                                /* magic */                   \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */          \
  NCCL_ENCRYPTION_MODE_NONE,                 /* mode */                    \
  NCCL_CONFIG_UNDEF_PTR                      /* psk */                     \
}

/* NCCL_ENCRYPTION_MODE_NONE is accepted; a pre-shared key is refused (this library encrypts nothing). */
ncclResult_t ncclSetEncryption(const ncclEncryptionConfig_t* config);
ncclResult_t pncclSetEncryption(const ncclEncryptionConfig_t* config);

/* ---- Settings (2.30): NCCL's parameters, read from this library's one table of settings ---- */

typedef struct ncclParamHandle* ncclParamHandle_t;
/* A handle of the setting key (an NCCL_* or MSCCLPP_* name). */
ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key);
ncclResult_t pncclParamBind(ncclParamHandle_t* out, const char* key);
/* Its value as an integer of each width (ncclInvalidArgument where it does not fit or is not a number). */
ncclResult_t ncclParamGetI8(ncclParamHandle_t h, int8_t* out);
ncclResult_t pncclParamGetI8(ncclParamHandle_t h, int8_t* out);
ncclResult_t ncclParamGetI16(ncclParamHandle_t h, int16_t* out);
ncclResult_t pncclParamGetI16(ncclParamHandle_t h, int16_t* out);
ncclResult_t ncclParamGetI32(ncclParamHandle_t h, int32_t* out);
ncclResult_t pncclParamGetI32(ncclParamHandle_t h, int32_t* out);
ncclResult_t ncclParamGetI64(ncclParamHandle_t h, int64_t* out);
ncclResult_t pncclParamGetI64(ncclParamHandle_t h, int64_t* out);
ncclResult_t ncclParamGetU8(ncclParamHandle_t h, uint8_t* out);
ncclResult_t pncclParamGetU8(ncclParamHandle_t h, uint8_t* out);
ncclResult_t ncclParamGetU16(ncclParamHandle_t h, uint16_t* out);
ncclResult_t pncclParamGetU16(ncclParamHandle_t h, uint16_t* out);
ncclResult_t ncclParamGetU32(ncclParamHandle_t h, uint32_t* out);
ncclResult_t pncclParamGetU32(ncclParamHandle_t h, uint32_t* out);
ncclResult_t ncclParamGetU64(ncclParamHandle_t h, uint64_t* out);
ncclResult_t pncclParamGetU64(ncclParamHandle_t h, uint64_t* out);
/* Its value as text (valid for the life of the process). */
ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char** out);
ncclResult_t pncclParamGetStr(ncclParamHandle_t h, const char** out);
/* Its text copied into out (at most maxLen bytes, NUL included); *len the bytes its whole text needs. */
ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len);
ncclResult_t pncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len);
/* The text of the setting key, and its length. */
ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen);
ncclResult_t pncclParamGetParameter(const char* key, const char** value, int* valueLen);
/* Every setting's name (a table valid for the life of the process). */
ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen);
ncclResult_t pncclParamGetAllParameterKeys(const char*** table, int* tableLen);
/* Logs every setting and its value at INFO. */
void ncclParamDumpAll(void);
void pncclParamDumpAll(void);

/* Reads NCCL_DEBUG / MSCCLPP_DEBUG again (NCCL marks it deprecated). */
void ncclResetDebugInit(void);
void pncclResetDebugInit(void);

/* ---- NCCL's device API: not offered by this library (both return ncclInvalidUsage); its host helpers
 * are declared in nccl_device/host.h ---- */

struct ncclDevCommRequirements;
struct ncclDevComm;
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements* reqs,
                               struct ncclDevComm* outDevComm);
ncclResult_t pncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements* reqs,
                                struct ncclDevComm* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm* devComm);
ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm* devComm);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
