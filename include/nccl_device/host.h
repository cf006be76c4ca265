/*
 * nccl_device/host.h of libmscclpp's NCCL face: the host side of NCCL 2.32.3's device API (its functions,
 * types and layouts), so that a program that calls them compiles against this library and runs on it.
 * Written for this library from the facts of the interface.
 *
 * What each call does here (docs/nccl.md, "The host side of the device API"): the teams, ncclCommQueryProperties and the peer
 * pointers of a window are answered; what needs NCCL's device kernels (ncclDevCommCreate, the barrier,
 * GIN and LL all-to-all requirements) or NVLink multicast (the multimem pointers, CFT) returns
 * ncclInvalidUsage with a log line saying so. This library never uses NVLink multicast.
 *
 * C11 or later, C++11 or later; needs no CUDA header.
 */
#ifndef NCCL_DEVICE_HOST_H_
#define NCCL_DEVICE_HOST_H_

#include <nccl.h>
#include <stdint.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Types of the device API that its host functions take ---- */

typedef struct ncclDevComm ncclDevComm_t;
typedef uint32_t ncclDevResourceHandle;
typedef ncclDevResourceHandle ncclDevResourceHandle_t;
typedef uint32_t ncclGinSignal_t;
typedef uint32_t ncclGinCounter_t;
typedef uint32_t ncclCftLeId;
typedef ncclCftLeId ncclCftLeId_t;

/* A team: nRanks ranks, this one at rank, world ranks stride apart. */
struct ncclTeam {
  int nRanks, rank, stride;
};
typedef struct ncclTeam ncclTeam_t;

struct ncclMultimemHandle {
  void* mcBasePtr;
};
typedef struct ncclMultimemHandle ncclMultimemHandle_t;

struct ncclLsaBarrierHandle {
  ncclDevResourceHandle_t bufHandle;
  int nBarriers;
};
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;

struct ncclGinBarrierHandle {
  ncclGinSignal_t signal0;
  ncclDevResourceHandle_t unused;
};
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;

struct ncclLLA2AHandle {
  ncclDevResourceHandle_t bufHandle;
  uint32_t nSlots;
};
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;

struct ncclGinOutboxHandle {
  ncclDevResourceHandle bufHandle;
  uint32_t size_log2;
};
struct ncclGinInboxA2AHandle {
  ncclDevResourceHandle bufHandle;
  ncclGinSignal_t signals;
  uint32_t size_log2;
  uint32_t nPeers_rcp32;
};

typedef enum {
  NCCL_GIN_CONNECTION_NONE,
  NCCL_GIN_CONNECTION_FULL,
  NCCL_GIN_CONNECTION_RAIL,
  NCCL_GIN_CONNECTION_CUSTOM_STRIDE
} ncclGinConnectionType_t;

typedef enum {
  NCCL_GIN_TYPE_NONE = 0,
  NCCL_GIN_TYPE_PROXY = 2,
  NCCL_GIN_TYPE_GDAKI = 3,
  NCCL_GIN_TYPE_GPI = 4,
  NCCL_GIN_TYPE_EFA_GDA = 5,
  NCCL_GIN_MAX_TYPES = 6
} ncclGinType_t;

typedef enum {
  NCCL_CFT_TEAM_FLAT,
  NCCL_CFT_TEAM_HIER_MULTIMEM,
  NCCL_CFT_TEAM_HIER_LSA
} ncclCftTeamMode_t;

typedef enum {
  NCCL_CFT_NONE = 0x0,
  NCCL_CFT = 0x1,
  NCCL_CFT_MULTIMEM = 0x2
} ncclCftCap_t;

typedef struct ncclDevResourceRequirements {
  struct ncclDevResourceRequirements* next;
  size_t bufferSize, bufferAlign;
  ncclDevResourceHandle_t* outBufferHandle;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinSignal_t* outGinSignalStart;
  ncclGinCounter_t* outGinCounterStart;
} ncclDevResourceRequirements_t;

typedef struct ncclTeamRequirements {
  struct ncclTeamRequirements* next;
  ncclTeam_t team;
  bool multimem;
  ncclMultimemHandle_t* outMultimemHandle;
} ncclTeamRequirements_t;

typedef struct ncclDevCommRequirements {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclDevResourceRequirements_t* resourceRequirementsList;
  ncclTeamRequirements_t* teamRequirementsList;
  bool lsaMultimem;
  int barrierCount;
  int lsaBarrierCount;
  int railGinBarrierCount;
  int lsaLLA2ABlockCount, lsaLLA2ASlotCount;
  bool ginForceEnable;
  int ginContextCount;
  int ginSignalCount;
  int ginCounterCount;
  ncclGinConnectionType_t ginConnectionType;
  bool ginExclusiveContexts;
  int ginQueueDepth;
  int ginTrafficClass;
  int worldGinBarrierCount;
  bool ginStrongSignalsRequired;
  bool ginVaSignalsRequired;
  int ginCustomStride;
  ncclGinType_t ginType;
  bool useRuntimeVersion;
  int cftCaps;
  int cftBarrierCount;
} ncclDevCommRequirements_t;

/* What ncclCommQueryProperties fills: initialise it with NCCL_COMM_PROPERTIES_INITIALIZER. */
typedef struct ncclCommProperties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;           /* -1 here: the library does not load NVML */
  bool deviceApiSupport; /* false here */
  bool multimemSupport;  /* false here: NVLink multicast is never used */
  ncclGinType_t ginType;
  int nLsaTeams;
  bool hostRmaSupport; /* true: ncclPutSignal / ncclSignal / ncclWaitSignal */
  ncclGinType_t railedGinType;
  uint64_t commHash;
  int ginMinStride;
  ncclGinConnectionType_t ginConnectionType;
  bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  bool cftSupport;
  bool cftMulticastSupport;
  bool cftCountedSupport;
} ncclCommProperties_t;

#define NCCL_COMM_PROPERTIES_INITIALIZER {                                  \
  sizeof(ncclCommProperties_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
  0, 0, 0, 0, false, false, NCCL_GIN_TYPE_NONE, 0, false, NCCL_GIN_TYPE_NONE, 0, 0,           \
  NCCL_GIN_CONNECTION_NONE, {false}, 0, false, false, false                                   \
}

/* ---- Functions ---- */

ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);
ncclResult_t pncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t* props);

/* A peer's registration of a window, as this process reaches it (lsaRank: the world rank here). */
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr);
ncclResult_t pncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void** outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr);
ncclResult_t pncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank, void** outPtr);

/* NVLink multicast and CFT: not offered (ncclInvalidUsage). */
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t pncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void** outPtr);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem,
                                          void** outPtr);
ncclResult_t pncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset, ncclMultimemHandle_t multimem,
                                           void** outPtr);
ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t pncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, ncclCftLeId* leId, size_t* leOffset);
ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam,
                                    ncclCftLeId* leId, size_t* leOffset);
ncclResult_t pncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peerCft, ncclTeam_t cftTeam,
                                     ncclCftLeId* leId, size_t* leOffset);
ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId* leId,
                                     size_t* leOffset);
ncclResult_t pncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peerWorld, ncclCftLeId* leId,
                                      size_t* leOffset);

/* Teams: the world (every rank), the ranks whose memory this one reaches (every rank: one machine), the
 * rail (this rank alone on one machine). CFT teams are not offered: an empty team. */
ncclTeam_t ncclTeamWorld(ncclComm_t comm);
ncclTeam_t pncclTeamWorld(ncclComm_t comm);
ncclTeam_t ncclTeamLsa(ncclComm_t comm);
ncclTeam_t pncclTeamLsa(ncclComm_t comm);
ncclTeam_t ncclTeamRail(ncclComm_t comm);
ncclTeam_t pncclTeamRail(ncclComm_t comm);
ncclTeam_t ncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode);
ncclTeam_t pncclTeamCft(ncclComm_t comm, ncclCftTeamMode_t mode);
ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm);
ncclTeam_t pncclTeamCftMultimem(ncclComm_t comm);
/* The world (or LSA) rank of a team's rank; -1, with a log line, for a rank outside the team. */
int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
int pncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);
int pncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);

/* Requirements of device-API resources: not offered (ncclInvalidUsage; ncclLLA2ACalcSlots gives 0). */
ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t* outHandle,
                                              ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                             ncclGinBarrierHandle_t* outHandle, ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
                                              ncclGinBarrierHandle_t* outHandle,
                                              ncclDevResourceRequirements_t* outReq);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
int pncclLLA2ACalcSlots(int maxElts, int maxEltSize);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                        ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots, ncclLLA2AHandle_t* outHandle,
                                         ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2, struct ncclGinOutboxHandle* outHandle,
                                            ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclGinOutboxCreateRequirement(int nBlocks, int size_log2, struct ncclGinOutboxHandle* outHandle,
                                             ncclDevResourceRequirements_t* outReq);
ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2,
                                              struct ncclGinInboxA2AHandle* outHandle,
                                              ncclDevResourceRequirements_t* outReq);
ncclResult_t pncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2,
                                               struct ncclGinInboxA2AHandle* outHandle,
                                               ncclDevResourceRequirements_t* outReq);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_DEVICE_HOST_H_ */
