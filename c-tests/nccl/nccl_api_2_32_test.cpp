// NCCL 2.30-2.32's host-side calls through our nccl.h and nccl_device/host.h, without a GPU: the settings
// API (ncclParam*), ncclResetDebugInit, ncclSetEncryption, the per-call configs of the collectives (checked
// before anything touches a GPU), a config of torch 2.15's size (96 bytes), ncclCommQueryProperties, the
// teams, and what the device API's host side refuses (multimem, CFT, requirements) with its log line.
// Built against build/include/nccl.h and linked with -lnccl alone. Prints one line per check and
// "nccl api 2.32 test: N passed, N failed".
#include <nccl.h>
#include <nccl_device/host.h>

#include "nccl_check.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

static ncclComm_t one_rank() {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return NULL;
  return comm;
}

static void settings() {
  ncclParamHandle_t h = NULL;
  expect(ncclParamBind(&h, "MSCCLPP_COLL_SCRATCH_MB"), ncclSuccess, "ncclParamBind(MSCCLPP_COLL_SCRATCH_MB)");
  int32_t mb = -1;
  int64_t mb64 = -1;
  uint8_t mb8 = 0;
  expect(ncclParamGetI32(h, &mb), ncclSuccess, "ncclParamGetI32");
  expect(ncclParamGetI64(h, &mb64), ncclSuccess, "ncclParamGetI64");
  expect(ncclParamGetU8(h, &mb8), ncclSuccess, "ncclParamGetU8");
  check(mb == 48 && mb64 == 48 && mb8 == 48, "the value set in the environment (48) in every width");
  const char* text = NULL;
  expect(ncclParamGetStr(h, &text), ncclSuccess, "ncclParamGetStr");
  check(text != NULL && std::string(text) == "48", "ncclParamGetStr gives \"48\"");
  char buf[8];
  int len = 0;
  expect(ncclParamGet(h, buf, sizeof(buf), &len), ncclSuccess, "ncclParamGet");
  check(len == 3 && std::string(buf) == "48", "ncclParamGet copies \"48\" and its NUL (3 bytes)");
  expect(ncclParamGet(h, buf, 2, &len), ncclInvalidArgument, "ncclParamGet(maxLen 2, too short)");
  check(len == 3 && buf[1] == 0, "a short buffer gets what fits, NUL-terminated, and the length needed");
  // A setting at its default.
  expect(ncclParamBind(&h, "MSCCLPP_PEER_TIMEOUT"), ncclSuccess, "ncclParamBind(MSCCLPP_PEER_TIMEOUT)");
  uint16_t timeout = 0;
  expect(ncclParamGetU16(h, &timeout), ncclSuccess, "ncclParamGetU16");
  check(timeout == 30, "MSCCLPP_PEER_TIMEOUT at its default, 30");
  // NCCL's names, with and without the prefix.
  expect(ncclParamBind(&h, "NCCL_DEBUG"), ncclSuccess, "ncclParamBind(NCCL_DEBUG)");
  expect(ncclParamGetStr(h, &text), ncclSuccess, "ncclParamGetStr(NCCL_DEBUG)");
  check(text != NULL && std::string(text) == "WARN", "NCCL_DEBUG is WARN (as this test set it)");
  int8_t i8 = 0;
  expect(ncclParamGetI8(h, &i8), ncclInvalidArgument, "ncclParamGetI8 of a word");
  logged("NCCL_DEBUG is \"WARN\", not a number");
  expect(ncclParamBind(&h, "COMM_ID"), ncclSuccess, "ncclParamBind(COMM_ID): NCCL_COMM_ID");
  // Refusals.
  expect(ncclParamBind(&h, "NCCL_ALGO"), ncclInvalidArgument, "ncclParamBind(NCCL_ALGO), not ours");
  logged("key \"NCCL_ALGO\" is not a setting of this library");
  expect(ncclParamBind(NULL, "NCCL_DEBUG"), ncclInvalidArgument, "ncclParamBind(out NULL)");
  expect(ncclParamBind(&h, NULL), ncclInvalidArgument, "ncclParamBind(key NULL)");
  expect(ncclParamGetI32((ncclParamHandle_t)0x1000, &mb), ncclInvalidArgument, "ncclParamGetI32(a made-up handle)");
  logged("is not a handle made by ncclParamBind");
  const char* value = NULL;
  int value_len = 0;
  expect(ncclParamGetParameter("MSCCLPP_COLL_SCRATCH_MB", &value, &value_len), ncclSuccess, "ncclParamGetParameter");
  check(value != NULL && std::string(value) == "48" && value_len == 2, "ncclParamGetParameter gives \"48\", 2");
  const char** keys = NULL;
  int n = 0;
  expect(ncclParamGetAllParameterKeys(&keys, &n), ncclSuccess, "ncclParamGetAllParameterKeys");
  bool found_debug = false, found_nccl = false;
  for (int i = 0; i < n && keys; i++) {
    found_debug |= std::string(keys[i]) == "MSCCLPP_DEBUG";
    found_nccl |= std::string(keys[i]) == "NCCL_COMM_ID";
  }
  check(n > 10 && found_debug && found_nccl, "every setting's key, MSCCLPP_DEBUG and NCCL_COMM_ID among them");
}

// ncclParamDumpAll logs at INFO: nothing at WARN, the values once ncclResetDebugInit has read NCCL_DEBUG=INFO.
static void reset_debug_init() {
  ncclParamDumpAll();
  check(read_file(log_path).find("MSCCLPP_COLL_SCRATCH_MB=48") == std::string::npos,
        "at WARN, ncclParamDumpAll writes nothing");
  setenv("NCCL_DEBUG", "INFO", 1);
  ncclResetDebugInit();
  ncclParamDumpAll();
  logged("MSCCLPP_COLL_SCRATCH_MB=48");
  setenv("NCCL_DEBUG", "WARN", 1);
  ncclResetDebugInit();
}

static void encryption() {
  ncclEncryptionConfig_t c = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  expect(ncclSetEncryption(&c), ncclSuccess, "ncclSetEncryption(NCCL_ENCRYPTION_MODE_NONE)");
  c.mode = NCCL_ENCRYPTION_MODE_PSK;
  c.psk = "secret";
  expect(ncclSetEncryption(&c), ncclInvalidUsage, "ncclSetEncryption(a pre-shared key), refused");
  logged("NCCL_ENCRYPTION_MODE_PSK is refused: this library encrypts nothing");
  c.mode = 9;
  expect(ncclSetEncryption(&c), ncclInvalidArgument, "ncclSetEncryption(mode 9)");
  expect(ncclSetEncryption(NULL), ncclInvalidArgument, "ncclSetEncryption(NULL)");
}

static void collective_configs(ncclComm_t comm) {
  void* p = (void*)0x1000;
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  expect(ncclAllReduceConfig(NULL, NULL, 0, ncclFloat, ncclSum, comm, 0, &c), ncclSuccess,
         "ncclAllReduceConfig(count 0)");
  expect(ncclAllReduceConfig(NULL, NULL, 0, ncclFloat, ncclSum, comm, 0, NULL), ncclSuccess,
         "ncclAllReduceConfig(config NULL)");
  c.magic = 1;
  expect(ncclAllReduceConfig(p, p, 4, ncclFloat, ncclSum, comm, 0, &c), ncclInvalidArgument,
         "ncclAllReduceConfig(bad magic)");
  logged("ncclAllReduceConfig: config's magic is 0x1");
  c = NCCL_COLLCONFIG_INITIALIZER;
  c.minCTAs = 8;
  c.maxCTAs = 4;
  expect(ncclAllGatherConfig(p, p, 4, ncclFloat, comm, 0, &c), ncclInvalidArgument, "ncclAllGatherConfig(min > max)");
  logged("config's minCTAs (8) is larger than its maxCTAs (4)");
  c = NCCL_COLLCONFIG_INITIALIZER;
  c.maxCTAs = -2;
  expect(ncclReduceScatterConfig(p, p, 4, ncclFloat, ncclSum, comm, 0, &c), ncclInvalidArgument,
         "ncclReduceScatterConfig(maxCTAs -2)");
  c = NCCL_COLLCONFIG_INITIALIZER;
  c.size = 8;
  expect(ncclBroadcastConfig(p, p, 4, ncclFloat, 0, comm, 0, &c), ncclInvalidArgument, "ncclBroadcastConfig(size 8)");
  c = NCCL_COLLCONFIG_INITIALIZER;
  c.algSelection = "ring";  // not ours: ignored
  expect(ncclReduceConfig(NULL, NULL, 0, ncclFloat, ncclSum, 0, comm, 0, &c), ncclSuccess,
         "ncclReduceConfig(algSelection \"ring\", ignored)");
  // The same argument checks as the calls without a config.
  c = NCCL_COLLCONFIG_INITIALIZER;
  expect(ncclAlltoAllConfig(p, p, 4, (ncclDataType_t)12, comm, 0, &c), ncclInvalidArgument,
         "ncclAlltoAllConfig(datatype 12)");
  expect(ncclGatherConfig(p, p, 4, ncclFloat, 1, comm, 0, &c), ncclInvalidArgument, "ncclGatherConfig(root 1 of 1)");
  expect(ncclScatterConfig(p, p, 4, ncclFloat, 0, NULL, 0, &c), ncclInvalidArgument, "ncclScatterConfig(comm NULL)");
  // A completion event inside a group: the group's work is queued at its end.
  c.launchCompletionEvent = (cudaEvent_t)0x10;
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclAllReduceConfig(p, p, 4, ncclFloat, ncclSum, comm, 0, &c), ncclInvalidUsage,
         "ncclAllReduceConfig(launchCompletionEvent inside a group)");
  logged("launchCompletionEvent inside a group is not carried out");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (nothing queued)");
}

static void properties_and_teams(ncclComm_t comm) {
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  props.rank = -7;
  expect(ncclCommQueryProperties(comm, &props), ncclSuccess, "ncclCommQueryProperties");
  check(props.rank == 0 && props.nRanks == 1 && props.nvmlDev == -1 && !props.deviceApiSupport &&
            !props.multimemSupport && props.hostRmaSupport && props.nLsaTeams == 1 && props.ginType == NCCL_GIN_TYPE_NONE &&
            !props.cftSupport && props.size == sizeof(ncclCommProperties_t),
        "the properties: rank 0 of 1, one-sided calls yes, device API, multicast, GIN and CFT no");
  props.magic = 0;
  expect(ncclCommQueryProperties(comm, &props), ncclInvalidArgument, "ncclCommQueryProperties(bad magic)");
  expect(ncclCommQueryProperties(comm, NULL), ncclInvalidArgument, "ncclCommQueryProperties(NULL)");
  expect(ncclCommQueryProperties(NULL, &props), ncclInvalidArgument, "ncclCommQueryProperties(comm NULL)");

  ncclTeam_t world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  check(world.nRanks == 1 && world.rank == 0 && world.stride == 1, "ncclTeamWorld: {1, 0, 1}");
  check(lsa.nRanks == 1 && lsa.rank == 0 && lsa.stride == 1, "ncclTeamLsa: the world (one machine)");
  check(rail.nRanks == 1 && rail.rank == 0, "ncclTeamRail: this rank alone");
  check(ncclTeamRankToWorld(comm, world, 0) == 0 && ncclTeamRankToLsa(comm, lsa, 0) == 0, "team rank 0 is world rank 0");
  check(ncclTeamRankToWorld(comm, world, 1) == -1, "a rank outside the team: -1");
  logged("rank is 1; it must be in [0, team.nRanks = 1)");
  ncclTeam_t cft = ncclTeamCft(comm, NCCL_CFT_TEAM_FLAT);
  check(cft.nRanks == 0, "ncclTeamCft: the empty team");
  logged("CFT teams (they need NVLink multicast): not offered by this library");
  ncclTeam_t none = ncclTeamWorld(NULL);
  check(none.nRanks == 0, "ncclTeamWorld(NULL): the empty team");
}

static void refused_device_api(ncclComm_t comm) {
  void* ptr = (void*)0x1;
  expect(ncclGetLsaMultimemDevicePointer(NULL, 0, &ptr), ncclInvalidUsage, "ncclGetLsaMultimemDevicePointer");
  logged("multimem pointers: not offered by this library");
  ncclMultimemHandle_t mm = {NULL};
  expect(ncclGetMultimemDevicePointer(NULL, 0, mm, &ptr), ncclInvalidUsage, "ncclGetMultimemDevicePointer");
  ncclCftLeId le = 0;
  size_t off = 0;
  expect(ncclGetPeerDeviceLeInfo(NULL, 0, 0, &le, &off), ncclInvalidUsage, "ncclGetPeerDeviceLeInfo");
  ncclTeam_t world = ncclTeamWorld(comm);
  ncclLsaBarrierHandle_t lsa_barrier;
  ncclDevResourceRequirements_t req;
  expect(ncclLsaBarrierCreateRequirement(world, 1, &lsa_barrier, &req), ncclInvalidUsage,
         "ncclLsaBarrierCreateRequirement");
  logged("device-API barriers: not offered by this library");
  ncclGinBarrierHandle_t gin_barrier;
  expect(ncclGinBarrierCreateRequirement(comm, world, 1, &gin_barrier, &req), ncclInvalidUsage,
         "ncclGinBarrierCreateRequirement");
  check(ncclLLA2ACalcSlots(1024, 8) == 0, "ncclLLA2ACalcSlots: 0 (the device API's LL all-to-all is not offered)");
  ncclLLA2AHandle_t a2a;
  expect(ncclLLA2ACreateRequirement(1, 1, &a2a, &req), ncclInvalidUsage, "ncclLLA2ACreateRequirement");
  // The communicator still works.
  int n = 0;
  expect(ncclCommCount(comm, &n), ncclSuccess, "ncclCommCount after the refusals");
}

// torch 2.14/2.15 and sglang pass NCCL 2.30's ncclConfig_t: 96 bytes; what lies beyond is not read.
static void config_of_96_bytes() {
  struct {
    ncclConfig_t config;
  } holder;
  holder.config = NCCL_CONFIG_INITIALIZER;
  holder.config.size = 96;
  holder.config.version = 23007;
  holder.config.blocking = 1;
  holder.config.rmaEagerInit = 77;  // past 96 bytes: must not be read (77 would be refused)
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  expect(ncclCommInitRankConfig(&comm, 1, id, 0, &holder.config), ncclSuccess,
         "ncclCommInitRankConfig with a 96-byte config (NCCL 2.30's)");
  expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  holder.config.size = sizeof(ncclConfig_t);
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  expect(ncclCommInitRankConfig(&comm, 1, id, 0, &holder.config), ncclInvalidArgument,
         "the same config at 120 bytes: rmaEagerInit 77 is read, and refused");
  logged("config's rmaEagerInit is 77; it must be 0 or 1");
}

int main() {
  if (!init_counts()) return 2;
  if (!log_to_a_temp_file("nccl_api_2_32_test")) return 2;
  unsetenv("MSCCLPP_DEBUG");
  unsetenv("MSCCLPP_DEBUG_FILE");
  unsetenv("NCCL_COMM_ID");
  unsetenv("MSCCLPP_NCCL_FALLBACK");
  unsetenv("MSCCLPP_PEER_TIMEOUT");
  // Read by the library at its first call, as every setting is.
  setenv("MSCCLPP_COLL_SCRATCH_MB", "48", 1);
  settings();
  reset_debug_init();
  encryption();
  config_of_96_bytes();
  ncclComm_t comm = one_rank();
  check(comm != NULL, "a communicator of one rank");
  if (comm) {
    collective_configs(comm);
    properties_and_teams(comm);
    refused_device_api(comm);
    expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  }
  if (counts->failed) std::printf("log (%s):\n%s", log_path.c_str(), read_file(log_path).c_str());
  std::remove(log_path.c_str());
  std::printf("nccl api 2.32 test: %d passed, %d failed\n", counts->passed, counts->failed);
  return counts->failed ? 1 : 0;
}
