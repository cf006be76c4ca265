// staged.h: what the NCCL face's staged GPU programs share (nccl_grow_test, nccl_collconfig_test): return-code
// checks that name the call, waiting for a flag another process sets, a communicator's health after its
// stream drained, device buffers freed on every path, uploads and element-by-element comparisons of floats,
// and the stages' runner: each process runs the plan's stages in order, prints a PASS or FAIL line per stage
// and meets the others at each stage's end (StageBoard), where all stop if any failed. Each program keeps
// its own board of shared memory for what its processes hand each other.
#pragma once

#include "forked_ranks.h"

#include <nccl.h>

#include <functional>

namespace tc {

// How long a process waits for the others (scaled by the test's MSCCLPP_TEST_TIMEOUT_SCALE in main).
inline double gWaitS = 60;

inline std::string rc(ncclResult_t r) { return fmt("%s (%d)", ncclGetErrorString(r), (int)r); }

#define TG_CUDA(expr)                                                                                          \
  do {                                                                                                         \
    cudaError_t e_ = (expr);                                                                                   \
    if (e_ != cudaSuccess) return fmt("%s: %s (%s:%d)", #expr, cudaGetErrorString(e_), __FILE__, __LINE__);   \
  } while (0)

// An NCCL call that must return `want`.
#define TG_EXPECT(expr, want)                                                                                  \
  do {                                                                                                         \
    ncclResult_t r_ = (expr);                                                                                  \
    if (r_ != (want)) {                                                                                        \
      return fmt("%s returned %s, expected %s (%s:%d); last error: %s", #expr, rc(r_).c_str(),                 \
                 rc(want).c_str(), __FILE__, __LINE__, ncclGetLastError(NULL));                                \
    }                                                                                                          \
  } while (0)
#define TG_OK(expr) TG_EXPECT(expr, ncclSuccess)

// Waits until *flag is set by another process (bounded).
inline std::string waitFlag(int* flag, const char* what)
{
  const double deadline = nowSec() + gWaitS;
  while (!__atomic_load_n(flag, __ATOMIC_SEQ_CST)) {
    if (nowSec() > deadline) return fmt("%s did not come within %.0f s", what, gWaitS);
    usleep(1000);
  }
  return "";
}

// The communicator's own error after a stream was drained: a failure seen meanwhile fails the stage.
inline std::string healthy(ncclComm_t comm)
{
  ncclResult_t async = ncclInternalError;
  TG_OK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) return fmt("ncclCommGetAsyncError says %s: %s", rc(async).c_str(), ncclGetLastError(comm));
  return "";
}

// Device buffers freed on every path.
struct Buffers
{
  std::vector<void*> all;
  float* get(size_t count)
  {
    void* p = nullptr;
    if (cudaMalloc(&p, count * sizeof(float) + 16) != cudaSuccess) return nullptr;
    all.push_back(p);
    return (float*)p;
  }
  ~Buffers()
  {
    for (void* p : all) cudaFree(p);
  }
};

// Compares `count` floats of the device buffer `d` with want(i).
template <typename F>
inline std::string compare(const char* what, const float* d, size_t count, cudaStream_t stream, F want)
{
  std::vector<float> h(count);
  TG_CUDA(cudaMemcpyAsync(h.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  TG_CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < count; ++i)
    if (h[i] != want(i))
      return fmt("%s: element %zu is %g, expected %g", what, i, (double)h[i], (double)want(i));
  return "";
}

inline std::string upload(float* d, size_t count, cudaStream_t stream, const std::function<float(size_t)>& value)
{
  std::vector<float> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = value(i);
  TG_CUDA(cudaMemcpyAsync(d, h.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
  TG_CUDA(cudaStreamSynchronize(stream));
  return "";
}

// A communicator's id handed from one process to the others through their board.
struct StagedId
{
  ncclUniqueId id;
  int ready;
};

inline void publishStagedId(StagedId& slot, const ncclUniqueId& id)
{
  memcpy(&slot.id, &id, sizeof(id));
  __atomic_store_n(&slot.ready, 1, __ATOMIC_SEQ_CST);
}

// Waits (bounded) until `slot` is published, then copies its id; `what` names it in the reason if it is not.
inline std::string awaitStagedId(StagedId& slot, ncclUniqueId* id, const char* what)
{
  std::string why = waitFlag(&slot.ready, what);
  if (!why.empty()) return why;
  memcpy(id, &slot.id, sizeof(*id));
  return "";
}

// A new communicator's id: rank 0 makes it (ncclGetUniqueId) and publishes it, the others wait for it.
inline std::string shareStagedId(int rank, StagedId& slot, ncclUniqueId* id)
{
  if (rank != 0) return awaitStagedId(slot, id, "rank 0's ncclGetUniqueId");
  TG_OK(ncclGetUniqueId(id));
  publishStagedId(slot, *id);
  return "";
}

// ------------------------------------------------------------------------------------------------
// The stages' runner
// ------------------------------------------------------------------------------------------------

constexpr int kMaxStages = 16;

// The ends of the stages, met by every process: in the program's board, zeroed with it before the fork.
struct StageBoard
{
  int arrivals[kMaxStages]; // processes arrived at each stage's end
  int failed[kMaxStages];   // processes whose stage failed
};

// A process's end of `stage`: waits (bounded) for the other `processes`; "" if none failed.
inline std::string meetStage(StageBoard* board, int processes, int stage, bool ok)
{
  if (!ok) __atomic_add_fetch(&board->failed[stage], 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&board->arrivals[stage], 1, __ATOMIC_SEQ_CST);
  const double deadline = nowSec() + gWaitS;
  while (__atomic_load_n(&board->arrivals[stage], __ATOMIC_SEQ_CST) < processes) {
    if (nowSec() > deadline) return fmt("the other processes did not end stage %d within %.0f s", stage, gWaitS);
    usleep(200);
  }
  if (__atomic_load_n(&board->failed[stage], __ATOMIC_SEQ_CST)) return fmt("a process failed stage %d", stage);
  return "";
}

// One stage of a plan: its name on the PASS / FAIL lines, what it runs on a process's state `P`, and which
// processes take part (null: every one; one that does not prints nothing and only meets the others).
template <typename P>
struct Stage
{
  const char* name;
  std::string (*run)(P&);
  bool (*takesPart)(int rank) = nullptr;
};

// Process `P.rank`'s part: its GPU (rank % GPUs) and a stream in P.stream, then every stage of the plan in
// order, each ended by meetStage; a process that learns there that another failed stops (so that none
// waits in a collective for a process that left). Its exit code: 0 only if every stage it ran passed.
template <typename P>
int runStages(P& proc, const Stage<P>* plan, int stages, StageBoard* board, int processes)
{
  const int rank = proc.rank;
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices < 1) {
    printf("FAIL rank %d: cudaGetDeviceCount: %s\n", rank, cudaGetErrorString(e));
    return 1;
  }
  if ((e = cudaSetDevice(rank % devices)) != cudaSuccess || (e = cudaStreamCreate(&proc.stream)) != cudaSuccess) {
    printf("FAIL rank %d: setting up device %d: %s\n", rank, rank % devices, cudaGetErrorString(e));
    return 1;
  }
  int failures = 0;
  for (int s = 0; s < stages; ++s) {
    const Stage<P>& stage = plan[s];
    std::string why;
    if (!stage.takesPart || stage.takesPart(rank)) {
      const double t0 = nowSec();
      why = stage.run(proc);
      if (why.empty())
        printf("PASS rank %d: %s (%.2f s)\n", rank, stage.name, nowSec() - t0);
      else
        printf("FAIL rank %d: %s: %s\n", rank, stage.name, why.c_str());
      fflush(stdout);
    }
    failures += why.empty() ? 0 : 1;
    const std::string together = meetStage(board, processes, s, why.empty());
    if (!together.empty()) {
      if (why.empty()) printf("FAIL rank %d: stopping after stage %d: %s\n", rank, s, together.c_str());
      fflush(stdout);
      return 1; // the others stop too; exiting tells the library's peers
    }
  }
  cudaStreamDestroy(proc.stream);
  return failures ? 1 : 0;
}

// main's part: forks `processes` processes, each running body(rank) under an alarm of `alarmS` seconds,
// waits `waitS` for them to end and kills the rest; a FAIL line naming `program` for each process killed or
// ended with a code other than 0. Returns the number of those.
inline int runStagedProcesses(const char* program, int processes, double alarmS, double waitS,
                              const std::function<int(int)>& body)
{
  ForkedRanks procs(processes, alarmS, body);
  procs.waitEnded(waitS);
  const std::vector<bool> killed = procs.killRest();
  int failed = 0;
  for (int r = 0; r < processes; ++r) {
    if (killed[r]) {
      printf("FAIL %s: process %d did not end within %.0f s (killed)\n", program, r, waitS);
      ++failed;
    } else if (!WIFEXITED(procs.status(r)) || WEXITSTATUS(procs.status(r)) != 0) {
      printf("FAIL %s: process %d %s\n", program, r, describeStatus(procs.status(r)).c_str());
      ++failed;
    }
  }
  return failed;
}

} // namespace tc
