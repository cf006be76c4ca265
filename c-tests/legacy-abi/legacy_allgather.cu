// A program written against the 0.1.0 header, as an existing user of the legacy library would write it:
// it is compiled with that header (and a mscclppfifo.h written from the documented wire format), so every
// device method it calls (putWithSignal, putWithSignalAndFlush, flush, wait) is the legacy inline code,
// and it runs against our library. Two ranks all-gather with both legacy patterns and check every word,
// then write through a registered buffer (whose std::vector the library fills in).
//
//   legacy_allgather 2
#include <cstddef>

// From c-tests/harness/ (legacy.mk adds it to the include path): shared with the benchmarks.
#include "allgather_kernels.cuh"
#include "mscclpp_rank.h"

using namespace tc;

// The layout this binary was compiled with; the library must agree with it.
static_assert(sizeof(mscclppDevConnSignalEpochId) == 16, "epoch struct layout");
static_assert(sizeof(mscclppBaseConn) == 48, "base connection layout");
static_assert(sizeof(mscclppDevConn) == 80, "device connection layout");
static_assert(sizeof(mscclppConcurrentFifo) == 32 && offsetof(mscclppConcurrentFifo, connId) == 24, "FIFO layout");
static_assert(sizeof(mscclppTrigger) == 16 && alignof(mscclppTrigger) == 16, "trigger layout");
static_assert(sizeof(mscclppRegisteredMemoryP2P) == 16 && sizeof(mscclppRegisteredMemory) == 24, "registered memory layout");
static_assert(sizeof(mscclppUniqueId) == 128, "unique id layout");

namespace {

AllGather gA;
uint32_t gSalt = 0;
std::vector<char*> gToFree; // freed once the communicator is gone (the peer maps them until then)
constexpr uint64_t kMax = 64ull << 20;

std::string caseAllgather(Rank& R, int kernel, uint64_t total)
{
  std::string firstError;
  for (int launch = 1; launch <= 3; ++launch) {
    ++gSalt;
    // The kernels use the header's own wait(): no device-side deadline, the host-side one still applies.
    std::string e = allgatherChecked<true>(R, gA, kernel, total, gSalt, fmt("launch %d", launch));
    if (R.fatal) return e;
    if (firstError.empty()) firstError = e;
  }
  TC_TRY(barrier(R, "after case"));
  if (firstError.empty()) R.info = fmt("(%s, 3 launches)", sizeName(total).c_str());
  return firstError;
}

std::string caseRegisteredWrite(Rank& R)
{
  const uint64_t bytes = 1 << 20;
  char* reg = nullptr;
  char* src = nullptr;
  TC_CUDA(cudaMalloc((void**)&reg, bytes));
  gToFree.push_back(reg);
  TC_CUDA(cudaMalloc((void**)&src, bytes));
  gToFree.push_back(src);
  const int peer = 1 - R.rank;
  const uint32_t sentinel = makeSeed(kRoleSentinel, R.rank, peer, 7);
  TC_TRY(fillWords(R, reg, 0, bytes, sentinel, 0));
  TC_TRY(fillWords(R, src, 0, bytes, makeSeed(kRoleReg, R.rank, peer, 7), 0));
  TC_TRY(syncBounded(R, "fill"));
  std::string result;
  {
    mscclppRegisteredMemory regMem;
    mscclppComm_t comm = R.comm;
    mscclppRegisteredMemory* rm = &regMem;
    TC_TRY(callBounded(R, "mscclppRegisterBuffer", R.hostTimeoutS,
                       [comm, reg, bytes, rm]() { return mscclppRegisterBuffer(comm, reg, bytes, rm); }));
    if (regMem.p2p.size() != 1 || regMem.p2p[0].remoteBuff == nullptr) {
      R.fatal = true;
      return fmt("mscclppRegisterBuffer filled %zu p2p entries, expected 1 with a peer buffer", regMem.p2p.size());
    }
    TC_TRY(barrier(R, "before write"));
    const uint64_t size = bytes / 2;
    mscclppResult_t r = mscclppRegisteredBufferWrite(R.comm, &regMem, src, size, 0, 0, (int64_t)(intptr_t)R.stream);
    if (r != mscclppSuccess) {
      R.fatal = true;
      return fmt("mscclppRegisteredBufferWrite returned %d (%s)", (int)r, errStr(r));
    }
    TC_TRY(syncBounded(R, "registered write"));
    TC_TRY(barrier(R, "after write"));
    result = verifyWords(R, reg, 0, size, makeSeed(kRoleReg, peer, R.rank, 7), 0, "written part of the registered buffer");
    if (result.empty()) result = verifyWords(R, reg, size, bytes - size, sentinel, size / 4, "rest of the registered buffer");
    if (R.fatal) return result;
    TC_TRY(barrier(R, "after check"));
  }
  return result;
}

int rankMain(Rank& R)
{
  if (!runCase(R, "legacy_init", [&] { return initRank(R); })) return 1;
  if (R.nranks != 2) {
    runCase(R, "legacy_rank_count", [&] { return fmt("needs exactly 2 ranks, got %d", R.nranks); });
    return 1;
  }
  if (!runCase(R, "legacy_allgather_setup", [&] { return allgatherSetup(R, gA, kMax + 64 * 1024); })) return 1;
  for (int kernel = 0; kernel < 2; ++kernel) {
    for (uint64_t total : std::vector<uint64_t>{1ull << 20, kMax}) {
      runCase(R, fmt("legacy_allgather_kernel%d_%s", kernel, sizeName(total).c_str()),
              [&] { return caseAllgather(R, kernel, total); });
    }
  }
  runCase(R, "legacy_registered_buffer_write", [&] { return caseRegisteredWrite(R); });
  bool ok = runCase(R, "legacy_teardown", [&] { return allgatherTeardown(R, gA); });
  for (char* p : gToFree) cudaFree(p);
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  return runRanks("legacy_allgather", opt, 60, rankMain);
}
