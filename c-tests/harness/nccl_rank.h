// nccl_rank.h: a rank of NCCL's face (nccl.h, libnccl.so.2 alone) in the case runner, for the programs
// with a board of their own (nccl_gpu_test, nccl_rma_test, nccl_suspend_test, nccl_window_suspend_test,
// pg_nccl_sequence): NCCL result codes named in a failure's reason, the result checks (TN_OK,
// TN_EXPECT_RC), the board of shared memory's barrier and the end of a step shared by the ranks
// (boardBarrier, together), a communicator's unique id handed from rank 0 to the others through the board,
// a rank's device, stream and status block, and main's board, GPU probe and case groups (mapBoard,
// skipWithoutGpu). Each program keeps its own board (a struct Board holding a `Meeting meeting`) and its
// cases; its kill runs share kill_case.h. The staged programs (nccl_grow_test, nccl_collconfig_test) use
// staged.h instead.
#pragma once

#include "case_runner.h"
#include "forked_ranks.h"

#include <nccl.h>

#include <string>

namespace tc {

// ------------------------------------------------------------------------------------------------
// Result codes and the checks that name them
// ------------------------------------------------------------------------------------------------

inline const char* resultName(ncclResult_t r)
{
  static const char* names[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                "ncclRemoteError",   "ncclInProgress",         "ncclTimeout"};
  return (int)r >= 0 && (int)r < 9 ? names[(int)r] : "not an ncclResult_t";
}

// The library's last error of `comm` (NULL: the process's), "" where it has none.
inline std::string lastError(ncclComm_t comm = nullptr)
{
  const char* s = ncclGetLastError(comm);
  return s ? s : "";
}

// An NCCL call that must succeed, inside a function returning std::string with `Rank& R` in scope.
#define TN_OK(expr)                                                                                            \
  do {                                                                                                         \
    ncclResult_t r_ = (expr);                                                                                  \
    if (r_ != ncclSuccess) {                                                                                   \
      return ::tc::fmt("%s returned %s (%s:%d); last error: %s", #expr, ::tc::resultName(r_), __FILE__,        \
                       __LINE__, ::tc::lastError(nullptr).c_str());                                            \
    }                                                                                                          \
  } while (0)

// An NCCL call that must return `want`.
#define TN_EXPECT_RC(expr, want)                                                                               \
  do {                                                                                                         \
    ncclResult_t r_ = (expr);                                                                                  \
    if (r_ != (want)) {                                                                                        \
      return ::tc::fmt("%s returned %s, expected %s (%s:%d)", #expr, ::tc::resultName(r_),                     \
                       ::tc::resultName(want), __FILE__, __LINE__);                                            \
    }                                                                                                          \
  } while (0)

// ------------------------------------------------------------------------------------------------
// The ranks' meetings on the board
// ------------------------------------------------------------------------------------------------

constexpr int kVerdicts = 64; // boardBarrier's record of failed steps, by barrier number modulo this

// What the barriers keep in the board (zeroed with it before each group of ranks).
struct Meeting
{
  int arrivals;            // boardBarrier's count of arrivals, never reset within a group
  int failedAt[kVerdicts]; // k + 1 where a rank arrived at its barrier k after a failed step
};

// Where the programs' barriers differ, each says so in main, before the ranks are forked.
struct MeetingRules
{
  useconds_t pollUs = 100; // nccl_rma_test polls every 50 us
  // Who the barrier waits for, in its timeout's reason: pg_nccl_sequence's third process is not a rank of
  // the communicator until the grow, so it says "processes".
  const char* who = "ranks";
  // nccl_suspend_test: a rank that learns at `together` that another failed stops too (R.fatal), since the
  // communicator's calls no longer match between the ranks.
  bool othersFailureIsFatal = false;
};

inline Meeting* gMeeting = nullptr; // in the board mapped shared by the parent (mapBoard)
inline MeetingRules gMeetingRules;
inline int gBarriers = 0; // boardBarrier calls this rank has made (every rank makes the same ones)

// A barrier of the ranks through the board, usable as often as needed (case_runner's oobBarrier has 64
// uses): every rank's k-th call waits for the k-th call of all the others. `failure` non-empty: this rank's
// step before the barrier failed, which *anyFailed tells every rank after it (see `together`).
inline std::string boardBarrier(Rank& R, const char* where, const std::string& failure = std::string(),
                                bool* anyFailed = nullptr)
{
  const int k = gBarriers++;
  if (!failure.empty()) __atomic_store_n(&gMeeting->failedAt[k % kVerdicts], k + 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&gMeeting->arrivals, 1, __ATOMIC_SEQ_CST);
  const int target = (k + 1) * R.nranks;
  const double deadline = nowSec() + R.hostTimeoutS;
  while (__atomic_load_n(&gMeeting->arrivals, __ATOMIC_SEQ_CST) < target) {
    if (nowSec() > deadline) {
      R.fatal = true;
      return fmt("barrier (%s): the other %s did not arrive within %.0f s", where, gMeetingRules.who,
                 R.hostTimeoutS);
    }
    usleep(gMeetingRules.pollUs);
  }
  if (anyFailed) *anyFailed = __atomic_load_n(&gMeeting->failedAt[k % kVerdicts], __ATOMIC_SEQ_CST) == k + 1;
  return "";
}

// A step's end shared by the ranks: a barrier at which each also learns whether the step failed on any of
// them. A rank whose step failed returns its reason, the others that another rank failed; so all leave a
// case at the same point (none waits in a collective, a split, a resume or a barrier for a rank that left).
inline std::string together(Rank& R, const std::string& why, const char* where)
{
  bool anyFailed = false;
  const std::string b = boardBarrier(R, where, why, &anyFailed);
  if (!why.empty()) return why;
  if (!b.empty()) return b;
  if (anyFailed) {
    if (gMeetingRules.othersFailureIsFatal) R.fatal = true;
    return fmt("another rank failed before %s (its reason is on its line)", where);
  }
  return "";
}

// ------------------------------------------------------------------------------------------------
// A communicator's unique id, handed over the board (as PyTorch hands it over its store)
// ------------------------------------------------------------------------------------------------

struct SharedId
{
  volatile int ready;
  ncclUniqueId id;
};

inline void publishId(SharedId& slot, const ncclUniqueId& id)
{
  memcpy((void*)&slot.id, &id, sizeof(ncclUniqueId));
  __sync_synchronize();
  slot.ready = 1;
}

// Waits (bounded) for `slot` to be published, then copies its id; `late` begins the reason where it was not
// ("... within N s").
inline std::string awaitId(Rank& R, SharedId& slot, ncclUniqueId* id, const std::string& late)
{
  const double deadline = nowSec() + R.hostTimeoutS;
  while (!slot.ready) {
    if (nowSec() > deadline) {
      R.fatal = true;
      return fmt("%s within %.0f s", late.c_str(), R.hostTimeoutS);
    }
    usleep(1000);
  }
  __sync_synchronize();
  memcpy(id, (const void*)&slot.id, sizeof(ncclUniqueId));
  return "";
}

// The id of a communicator: rank 0 makes it, the others wait for it (bounded).
inline std::string shareUniqueId(Rank& R, SharedId& slot, ncclUniqueId* id,
                                 const std::string& late = "rank 0 did not publish the unique id")
{
  if (R.rank == 0) {
    TN_OK(ncclGetUniqueId(id));
    publishId(slot, *id);
    return "";
  }
  return awaitId(R, slot, id, late);
}

// ------------------------------------------------------------------------------------------------
// A rank's device
// ------------------------------------------------------------------------------------------------

// CUDA device (rank r uses GPU r % GPUs), stream and the status block syncBounded reads; the program's own
// buffers come after. Released by case_runner's freeRank.
// `*comm` made over every rank, its unique id handed from rank 0 through `slot`: "" or the reason, the rank
// then fatal where ncclCommInitRank itself failed.
inline std::string initBoardComm(Rank& R, SharedId& slot, ncclComm_t* comm)
{
  ncclUniqueId id;
  std::string why = shareUniqueId(R, slot, &id);
  if (!why.empty()) return why;
  ncclResult_t r = ncclCommInitRank(comm, R.nranks, id, R.rank);
  if (r == ncclSuccess && *comm) return "";
  R.fatal = true;
  return fmt("ncclCommInitRank returned %s: %s", resultName(r), lastError().c_str());
}

inline std::string setUpDevice(Rank& R)
{
  // Kernels load when the process starts (docs/mscclpp.md, "Lazy module loading"); the runner's environment wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  // The ranks meet through the unique id here, not through an address in the environment.
  unsetenv("NCCL_COMM_ID");
  TC_CUDA(cudaGetDeviceCount(&R.nGpus));
  TC_EXPECT(R.nGpus > 0, "no CUDA device visible");
  R.device = R.rank % R.nGpus;
  if (R.nranks > R.nGpus) {
    // Ranks sharing a GPU take turns or split it: be more patient.
    R.hostTimeoutS *= 2;
  }
  TC_CUDA(cudaSetDevice(R.device));
  TC_CUDA(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  TC_CUDA(cudaHostAlloc((void**)&R.status, sizeof(DevStatus), cudaHostAllocMapped));
  memset((void*)R.status, 0, sizeof(DevStatus));
  return "";
}

inline int nextRank(const Rank& R) { return (R.rank + 1) % R.nranks; }
inline int prevRank(const Rank& R) { return (R.rank + R.nranks - 1) % R.nranks; }

inline const char* typeName(ncclDataType_t t)
{
  switch (t) {
  case ncclInt8: return "int8";
  case ncclUint8: return "uint8";
  case ncclInt32: return "int32";
  case ncclUint32: return "uint32";
  case ncclInt64: return "int64";
  case ncclUint64: return "uint64";
  case ncclFloat16: return "float16";
  case ncclFloat32: return "float32";
  case ncclFloat64: return "float64";
  case ncclBfloat16: return "bfloat16";
  case ncclFloat8e4m3: return "float8e4m3";
  case ncclFloat8e5m2: return "float8e5m2";
  default: return "?";
  }
}

inline size_t typeSize(ncclDataType_t t)
{
  switch (t) {
  case ncclInt8:
  case ncclUint8:
  case ncclFloat8e4m3:
  case ncclFloat8e5m2: return 1;
  case ncclFloat16:
  case ncclBfloat16: return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32: return 4;
  default: return 8;
  }
}

// Every statistic of ncclCommMemStats (v[ncclCommMemStat_t]), as PyTorch's getMemoryStats reads them;
// Total = Suspend + Persist always.
inline std::string memStats(ncclComm_t comm, uint64_t v[4])
{
  for (int s = 0; s < 4; ++s) {
    v[s] = ~0ull;
    TN_OK(ncclCommMemStats(comm, (ncclCommMemStat_t)s, &v[s]));
  }
  if (v[3] != v[0] + v[2])
    return fmt("Total %llu is not Suspend %llu + Persist %llu", (unsigned long long)v[3], (unsigned long long)v[0],
               (unsigned long long)v[2]);
  return "";
}

// The communicator's asynchronous error, as kill_case.h's loops poll it.
inline std::function<ncclResult_t()> asyncErrorOf(ncclComm_t comm)
{
  return [comm] {
    ncclResult_t a = ncclSuccess;
    ncclCommGetAsyncError(comm, &a);
    return a;
  };
}

// A kill case's survivor (kill_case.h): the communicator's error was ncclRemoteError, seen within 10 s
// (scaled) of the kill, and ncclGetLastError names the dead rank `victim`; "" or why not.
inline std::string sawRemoteError(int asyncError, double afterKillS, const char* lastError, int victim)
{
  const std::string peer = fmt("rank %d", victim);
  if (asyncError != ncclRemoteError)
    return fmt("ncclCommGetAsyncError gave %s, not ncclRemoteError", resultName((ncclResult_t)asyncError));
  if (afterKillS > 10 * timeoutScale()) return fmt("the failure showed %.2f s after the kill", afterKillS);
  if (std::string(lastError).find(peer) == std::string::npos)
    return fmt("ncclGetLastError does not name %s: '%s'", peer.c_str(), lastError);
  return "";
}

// ------------------------------------------------------------------------------------------------
// main's part
// ------------------------------------------------------------------------------------------------

// The program's board, mapped shared and zeroed before the ranks are forked, its Meeting the barriers';
// null, with a FAIL line naming `program`, where the mapping failed.
template <typename B>
B* mapBoard(const char* program)
{
  B* board = mapSharedOrSay<B>(program);
  if (board) gMeeting = &board->meeting;
  return board;
}

// main of a program whose ranks run one group of cases: the board mapped (mapBoard, into *board), a SKIP
// line naming `program` where no GPU is usable (exit code 0), `ready` (where given) to adjust the options
// once one is, then runRanks under the name `group`. Returns main's exit code.
template <typename B>
int runBoardGroup(const char* program, B** board, const char* group, Options opt, double timeoutS,
                  const std::function<int(Rank&)>& rankMain, const std::function<void(Options&)>& ready = nullptr)
{
  *board = mapBoard<B>(program);
  if (!*board) return 1;
  if (skipWithoutGpu(program)) return 0;
  if (ready) ready(opt);
  return runRanks(group, opt, timeoutS, rankMain);
}

} // namespace tc
