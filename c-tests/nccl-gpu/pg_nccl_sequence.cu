// The NCCL calls PyTorch's ProcessGroupNCCL makes around suspend / resume / memory statistics / grow, in its
// order, through our nccl.h and libnccl.so.2 alone, each step self-checked:
//
//   pg_init_config_96_bytes   ncclGetVersion; ncclCommInitRankConfig with the 96-byte ncclConfig_t of NCCL
//                             2.30 (size 96, version 23007, as torch built against it passes);
//                             ncclCommGetAsyncError (the watchdog's poll) says ncclSuccess
//   pg_allreduce              an all-reduce, checked
//   pg_memstats               ncclCommMemStats for each ncclCommMemStat_t (getMemoryStats)
//   pg_suspend                ncclCommSuspend(NCCL_SUSPEND_MEM); ncclCommMemStats again; the watchdog's
//                             ncclCommGetAsyncError still answers ncclSuccess
//   pg_resume_allreduce       ncclCommResume, ncclCommMemStats, an all-reduce checked
//   pg_grow_2_to_3            where ncclCommGrow is exported (looked up with dlsym, so that this program runs
//                             where it is not): ncclCommGetUniqueId on rank 0, ncclCommGrow on the two ranks
//                             and on a third process (forked with them, waiting for the id), then on the new
//                             communicator Count / UserRank, an all-reduce checked and ncclCommDestroy;
//                             otherwise a SKIP line and two ranks only
//   pg_destroy                ncclCommDestroy
//
// Usage: pg_nccl_sequence [--port P]. Output: PASS / FAIL per step, a SUMMARY line; exit code 0 only if every
// step passed on every rank. Each rank has an alarm; MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline.
#include "nccl_rank.h"

#include <dlfcn.h>

using namespace tc;

namespace {

typedef ncclResult_t (*GetUniqueIdFn)(ncclComm_t, ncclUniqueId*);
typedef ncclResult_t (*GrowFn)(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*, ncclConfig_t*);

// What the processes share beside case_runner's results: the two ids, the barriers' meeting (nccl_rank.h).
struct Board
{
  SharedId id;
  SharedId growId;
  Meeting meeting;
};

Board* gBoard = nullptr;
bool gGrow = false; // ncclCommGrow and ncclCommGetUniqueId are exported: three processes, the third a new rank
ncclComm_t gComm = nullptr;
float* gSend = nullptr;
float* gRecv = nullptr;
constexpr uint64_t kCount = (1u << 20) + 3;

// Every process's k-th call waits for the k-th of all the others; each learns whether a step failed anywhere,
// so that none waits in a collective call for a rank that left. Not nccl_rank.h's `together`: here the
// barrier's timeout is the reason even where this process's step failed too, and a process that learns that
// another failed stops (R.fatal).
std::string processesTogether(Rank& R, const std::string& why, const char* where)
{
  bool anyFailed = false;
  const std::string b = boardBarrier(R, where, why, &anyFailed);
  if (!b.empty()) return b;
  if (!why.empty()) return why;
  if (anyFailed) {
    R.fatal = true;
    return fmt("another rank failed before %s (its reason is on its line)", where);
  }
  return "";
}

// NCCL 2.30's ncclConfig_t as torch built against it passes it: 96 bytes, version 23007.
ncclConfig_t config96()
{
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.size = 96;
  c.version = 23007;
  c.commName = "pg_nccl_sequence";
  return c;
}

// An all-reduce (sum) of x[i] = (rank + 1) * (i % 89 + 1) over `nranks` ranks, checked.
std::string allReduce(Rank& R, ncclComm_t comm, int rank, int nranks, const char* what)
{
  std::vector<float> h(kCount);
  for (uint64_t i = 0; i < kCount; ++i) h[i] = (float)((rank + 1) * (int)(i % 89 + 1));
  TC_CUDA(cudaMemcpyAsync(gSend, h.data(), kCount * 4, cudaMemcpyHostToDevice, R.stream));
  TC_CUDA(cudaMemsetAsync(gRecv, 0, kCount * 4, R.stream));
  TN_OK(ncclAllReduce(gSend, gRecv, kCount, ncclFloat32, ncclSum, comm, R.stream));
  TC_TRY(syncBounded(R, what));
  TC_CUDA(cudaMemcpy(h.data(), gRecv, kCount * 4, cudaMemcpyDeviceToHost));
  const float ranks = (float)(nranks * (nranks + 1) / 2);
  for (uint64_t i = 0; i < kCount; ++i)
    if (h[i] != (float)(i % 89 + 1) * ranks)
      return fmt("%s: element %llu is %g, expected %g", what, (unsigned long long)i, h[i], (float)(i % 89 + 1) * ranks);
  return "";
}

std::string asyncOk(ncclComm_t comm, const char* when)
{
  ncclResult_t a = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(comm, &a));
  if (a != ncclSuccess) return fmt("ncclCommGetAsyncError %s says %s", when, resultName(a));
  return "";
}

// ---- the steps (the new rank, R.rank == 2, joins only the grow) ----

bool existing(const Rank& R) { return R.rank < 2; }

std::string stepInit(Rank& R)
{
  int v = 0;
  TN_OK(ncclGetVersion(&v));
  ncclUniqueId id;
  TC_TRY(shareUniqueId(R, gBoard->id, &id, "the unique id was not published"));
  ncclConfig_t c = config96();
  ncclResult_t r = ncclCommInitRankConfig(&gComm, 2, id, R.rank, &c);
  if (r != ncclSuccess || !gComm) {
    R.fatal = true;
    return fmt("ncclCommInitRankConfig (96-byte config) returned %s", resultName(r));
  }
  TC_TRY(asyncOk(gComm, "after the initialisation"));
  R.info = fmt("NCCL version code %d", v);
  return "";
}

std::string stepMemStats(Rank& R)
{
  uint64_t v[4];
  TC_TRY(memStats(gComm, v));
  TC_EXPECT(v[3] > 0 && v[0] > 0 && v[1] == 0, "Suspend %llu, Suspended %llu, Persist %llu, Total %llu",
            (unsigned long long)v[0], (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3]);
  R.info = fmt("Suspend %llu, Suspended %llu, Persist %llu, Total %llu bytes", (unsigned long long)v[0],
               (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3]);
  return "";
}

std::string stepSuspend(Rank& R)
{
  TC_CUDA(cudaStreamSynchronize(R.stream));
  TN_OK(ncclCommSuspend(gComm, NCCL_SUSPEND_MEM));
  uint64_t v[4];
  TC_TRY(memStats(gComm, v));
  TC_EXPECT(v[1] == 1 && v[0] == 0, "after ncclCommSuspend: Suspended %llu (1 expected), Suspend %llu (0)",
            (unsigned long long)v[1], (unsigned long long)v[0]);
  return asyncOk(gComm, "while suspended");
}

std::string stepResume(Rank& R)
{
  TN_OK(ncclCommResume(gComm));
  uint64_t v[4];
  TC_TRY(memStats(gComm, v));
  TC_EXPECT(v[1] == 0 && v[0] > 0, "after ncclCommResume: Suspended %llu (0 expected), Suspend %llu (> 0)",
            (unsigned long long)v[1], (unsigned long long)v[0]);
  return allReduce(R, gComm, R.rank, 2, "all-reduce right after ncclCommResume");
}

std::string stepGrow(Rank& R)
{
  GetUniqueIdFn getId = (GetUniqueIdFn)dlsym(RTLD_DEFAULT, "ncclCommGetUniqueId");
  GrowFn grow = (GrowFn)dlsym(RTLD_DEFAULT, "ncclCommGrow");
  TC_EXPECT(getId && grow, "ncclCommGrow or ncclCommGetUniqueId is not found in this process");
  ncclUniqueId id;
  ncclConfig_t c = config96();
  ncclComm_t grown = nullptr;
  ncclResult_t r;
  if (R.rank == 0) {
    TN_OK(getId(gComm, &id));
    publishId(gBoard->growId, id);
    r = grow(gComm, 3, &id, -1, &grown, &c);
  } else if (R.rank == 1) {
    r = grow(gComm, 3, nullptr, -1, &grown, &c);
  } else {
    TC_TRY(awaitId(R, gBoard->growId, &id, "the grow's id was not published"));
    r = grow(nullptr, 3, &id, 2, &grown, &c);
  }
  if (r != ncclSuccess || !grown) {
    R.fatal = true;
    const char* e = ncclGetLastError(nullptr);
    return fmt("ncclCommGrow returned %s (newcomm %p): %s", resultName(r), (void*)grown, e ? e : "");
  }
  int count = -1, rank = -1;
  TN_OK(ncclCommCount(grown, &count));
  TN_OK(ncclCommUserRank(grown, &rank));
  TC_EXPECT(count == 3 && rank == R.rank, "the grown communicator's Count/UserRank are %d/%d, expected 3/%d", count,
            rank, R.rank);
  TC_TRY(allReduce(R, grown, R.rank, 3, "all-reduce on the grown communicator"));
  uint64_t v[4];
  TC_TRY(memStats(grown, v));
  TN_OK(ncclCommDestroy(grown));
  return "";
}

std::string setUp(Rank& R)
{
  TC_TRY(setUpDevice(R));
  TC_CUDA(cudaMalloc((void**)&gSend, kCount * 4));
  TC_CUDA(cudaMalloc((void**)&gRecv, kCount * 4));
  return "";
}

int rankMain(Rank& R)
{
  if (!setUpPassed(R, setUp(R))) return 1;
  // The steps of the two existing ranks; the new rank (a third process, where grow is there) only keeps
  // step with them until the grow.
  auto step = [&](const char* name, std::function<std::string()> body) {
    runCase(R, name, [&] { return processesTogether(R, existing(R) ? body() : std::string(), name); });
  };
  step("pg_init_config_96_bytes", [&] { return stepInit(R); });
  step("pg_allreduce", [&] { return allReduce(R, gComm, R.rank, 2, "all-reduce"); });
  step("pg_memstats", [&] { return stepMemStats(R); });
  step("pg_suspend", [&] { return stepSuspend(R); });
  step("pg_resume_allreduce", [&] { return stepResume(R); });
  if (gGrow) runCase(R, "pg_grow_2_to_3", [&] { return processesTogether(R, stepGrow(R), "after the grow"); });
  step("pg_destroy", [&]() -> std::string {
    TN_OK(ncclCommDestroy(gComm));
    gComm = nullptr;
    return "";
  });
  cudaFree(gSend);
  cudaFree(gRecv);
  freeRank(R);
  return 0;
}

} // namespace

int main(int argc, char** argv)
{
  gMeetingRules.who = "processes"; // the third is not a rank of the communicator until the grow
  return runBoardGroup("pg_nccl_sequence", &gBoard, "pg_nccl_sequence", parseArgs(argc, argv, 2), 240, rankMain,
                       [](Options& opt) {
                         // Looked up, not linked: the program runs where grow is not there yet (no CUDA is
                         // touched by the look-up).
                         gGrow = dlsym(RTLD_DEFAULT, "ncclCommGrow") != nullptr &&
                                 dlsym(RTLD_DEFAULT, "ncclCommGetUniqueId") != nullptr;
                         opt.nranks = gGrow ? 3 : 2;
                         if (!gGrow) printf("SKIP pg_grow_2_to_3: ncclCommGrow is not exported by this libnccl.so.2\n");
                       });
}
