// ncclCommGetUniqueId and ncclCommGrow on GPUs, through our nccl.h and libnccl.so.2 alone: a communicator
// of 2 ranks grown to 4, every result checked element by element against a host reference.
//
// Four processes, forked by the parent before anything touches CUDA; process r uses GPU r % GPUs, so all
// may share one GPU. Processes 0 and 1 make the first communicator (rank 0's ncclGetUniqueId); processes 2
// and 3 join at the grow, with the id process 0 made by ncclCommGetUniqueId. Both ids travel through
// memory the processes share. The stages, each ended by a meeting of the four processes at which each
// learns whether any failed (then all stop, so that none waits in a collective for a process that left):
//   0. ranks 0, 1: ncclCommInitRank (2 ranks), an all-reduce (1000 and 2^20 + 3 floats) checked;
//   1. rank 0: ncclCommGetUniqueId, a second one before the grow ncclInvalidUsage; ranks 0, 1: ncclCommGrow
//      with nRanks 2 (not larger than the parent) ncclInvalidArgument;
//   2. the new ranks' bad grows, each ncclInvalidArgument at once: a rank inside the parent's range (1),
//      rank 4 of 4, nRanks 2;
//   3. ncclCommGrow to 4: rank 0 with the id, rank 1 with NULL (rank -1 both), ranks 2, 3 with comm NULL and
//      the id; every rank's Count is 4 and UserRank its process number (the parent's ranks keep theirs);
//   4. on the grown communicator, old and new ranks alike: all-reduce (1000 and 2^20 + 3 floats), all-gather
//      (65537 floats a rank), and a ring of ncclSend / ncclRecv in one group (2^18 + 7 floats);
//   5. ranks 0, 1: the parent still works (an all-reduce checked);
//   6. ranks 0, 1: ncclCommShrink of the grown communicator leaving ranks 2 and 3 out, an all-reduce checked
//      on the 2 left (Count 2, UserRank kept); ranks 2, 3 destroy their grown communicator;
//   7. everything destroyed.
//
//   nccl_grow_test
//
// Output: PASS / FAIL lines (per process and stage), SKIP where no GPU is usable, a SUMMARY line. Exit code 0
// only if every stage passed on every process. MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline.
//
// The harness's staged.h (c-tests/harness/) gives the stages' runner, the forking, the alarm and the
// formatting.
#include "staged.h"

using namespace tc;

namespace {

constexpr int kOld = 2;     // ranks of the first communicator
constexpr int kAll = 4;     // ranks after the grow
constexpr int kStages = 8;

struct Board
{
  StagedId parentId, growId;
  StageBoard stages;
};

Board* gBoard = nullptr;

// Count and UserRank as expected.
std::string place(ncclComm_t comm, int rank, int nranks)
{
  int n = -1, r = -1;
  TG_OK(ncclCommCount(comm, &n));
  TG_OK(ncclCommUserRank(comm, &r));
  if (n != nranks || r != rank) return fmt("rank %d of %d, expected rank %d of %d", r, n, rank, nranks);
  return "";
}

// An all-reduce (sum) of `count` floats: rank r gives r + 1 + i % 7 (exact in float for any order of sums).
std::string allReduce(ncclComm_t comm, int rank, int nranks, size_t count, cudaStream_t stream)
{
  Buffers b;
  float* in = b.get(count);
  float* out = b.get(count);
  if (!in || !out) return "cudaMalloc failed";
  std::string why = upload(in, count, stream, [&](size_t i) { return float(rank + 1 + i % 7); });
  if (!why.empty()) return why;
  TG_OK(ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream));
  why = compare(fmt("all-reduce of %zu floats on %d ranks", count, nranks).c_str(), out, count, stream,
                [&](size_t i) { return float(nranks * (nranks + 1) / 2 + nranks * (i % 7)); });
  return why.empty() ? healthy(comm) : why;
}

// An all-gather of `count` floats a rank: rank r gives r * 1000 + i % 1000.
std::string allGather(ncclComm_t comm, int rank, int nranks, size_t count, cudaStream_t stream)
{
  Buffers b;
  float* in = b.get(count);
  float* out = b.get(count * nranks);
  if (!in || !out) return "cudaMalloc failed";
  std::string why = upload(in, count, stream, [&](size_t i) { return float(rank * 1000 + i % 1000); });
  if (!why.empty()) return why;
  TG_OK(ncclAllGather(in, out, count, ncclFloat, comm, stream));
  why = compare(fmt("all-gather of %zu floats a rank on %d ranks", count, nranks).c_str(), out, count * nranks,
                stream, [&](size_t i) { return float((i / count) * 1000 + (i % count) % 1000); });
  return why.empty() ? healthy(comm) : why;
}

// A ring in one group: every rank sends `count` floats to the next and receives from the previous.
std::string ring(ncclComm_t comm, int rank, int nranks, size_t count, cudaStream_t stream)
{
  Buffers b;
  float* in = b.get(count);
  float* out = b.get(count);
  if (!in || !out) return "cudaMalloc failed";
  std::string why = upload(in, count, stream, [&](size_t i) { return float(rank * 1000 + i % 1000) + 0.5f; });
  if (!why.empty()) return why;
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  TG_OK(ncclGroupStart());
  TG_OK(ncclSend(in, count, ncclFloat, next, comm, stream));
  TG_OK(ncclRecv(out, count, ncclFloat, prev, comm, stream));
  TG_OK(ncclGroupEnd());
  why = compare(fmt("ring of %zu floats on %d ranks (from rank %d)", count, nranks, prev).c_str(), out, count, stream,
                [&](size_t i) { return float(prev * 1000 + i % 1000) + 0.5f; });
  return why.empty() ? healthy(comm) : why;
}

struct Proc
{
  int rank = 0; // the process number: its rank in the parent (0, 1) and in the grown communicator
  cudaStream_t stream = nullptr;
  ncclComm_t parent = nullptr, grown = nullptr, shrunk = nullptr;
  ncclUniqueId growId;
};

std::string stageParent(Proc& P)
{
  ncclUniqueId id;
  std::string why = shareStagedId(P.rank, gBoard->parentId, &id);
  if (!why.empty()) return why;
  TG_OK(ncclCommInitRank(&P.parent, kOld, id, P.rank));
  why = place(P.parent, P.rank, kOld);
  for (size_t count : {size_t(1000), size_t((1 << 20) + 3)})
    if (why.empty()) why = allReduce(P.parent, P.rank, kOld, count, P.stream);
  return why;
}

std::string stageId(Proc& P)
{
  if (P.rank == 0) {
    TG_OK(ncclCommGetUniqueId(P.parent, &P.growId));
    ncclUniqueId again;
    TG_EXPECT(ncclCommGetUniqueId(P.parent, &again), ncclInvalidUsage);
    publishStagedId(gBoard->growId, P.growId);
  }
  ncclComm_t out = (ncclComm_t)0x1;
  TG_EXPECT(ncclCommGrow(P.parent, kOld, P.rank == 0 ? &P.growId : NULL, -1, &out, NULL), ncclInvalidArgument);
  if (out != NULL) return "*newcomm is not NULL after a refused ncclCommGrow";
  return "";
}

std::string stageBadNewRanks(Proc& P)
{
  std::string why = awaitStagedId(gBoard->growId, &P.growId, "rank 0's ncclCommGetUniqueId");
  if (!why.empty()) return why;
  ncclComm_t out = (ncclComm_t)0x1;
  const double t0 = nowSec();
  if (P.rank == 2) {
    TG_EXPECT(ncclCommGrow(NULL, kAll, &P.growId, 1, &out, NULL), ncclInvalidArgument); // the parent's range
    TG_EXPECT(ncclCommGrow(NULL, kAll, &P.growId, kAll, &out, NULL), ncclInvalidArgument);
  } else {
    TG_EXPECT(ncclCommGrow(NULL, kOld, &P.growId, 3, &out, NULL), ncclInvalidArgument); // not larger
  }
  if (out != NULL) return "*newcomm is not NULL after a refused ncclCommGrow";
  if (nowSec() - t0 > 5) return fmt("the refusals took %.1f s", nowSec() - t0);
  return "";
}

std::string stageGrow(Proc& P)
{
  if (P.rank < kOld)
    TG_OK(ncclCommGrow(P.parent, kAll, P.rank == 0 ? &P.growId : NULL, -1, &P.grown, NULL));
  else
    TG_OK(ncclCommGrow(NULL, kAll, &P.growId, P.rank, &P.grown, NULL));
  return place(P.grown, P.rank, kAll);
}

std::string stageGrown(Proc& P)
{
  std::string why;
  for (size_t count : {size_t(1000), size_t((1 << 20) + 3)})
    if (why.empty()) why = allReduce(P.grown, P.rank, kAll, count, P.stream);
  if (why.empty()) why = allGather(P.grown, P.rank, kAll, 65537, P.stream);
  if (why.empty()) why = ring(P.grown, P.rank, kAll, (1 << 18) + 7, P.stream);
  return why;
}

std::string stageShrink(Proc& P)
{
  if (P.rank >= kOld) {
    TG_OK(ncclCommDestroy(P.grown));
    P.grown = nullptr;
    return "";
  }
  int exclude[] = {2, 3};
  TG_OK(ncclCommShrink(P.grown, exclude, 2, &P.shrunk, NULL, NCCL_SHRINK_DEFAULT));
  std::string why = place(P.shrunk, P.rank, kOld);
  return why.empty() ? allReduce(P.shrunk, P.rank, kOld, 4099, P.stream) : why;
}

std::string stageDestroy(Proc& P)
{
  for (ncclComm_t* c : {&P.shrunk, &P.grown, &P.parent}) {
    if (*c) TG_OK(ncclCommDestroy(*c));
    *c = nullptr;
  }
  return "";
}

bool old(int r) { return r < kOld; }
bool fresh(int r) { return r >= kOld; }

const Stage<Proc> kPlan[kStages] = {
  {"parent of 2 ranks: ncclCommInitRank, all-reduce", stageParent, old},
  {"ncclCommGetUniqueId (a second one before the grow refused); a grow to nRanks 2 refused", stageId, old},
  {"new ranks: a rank inside the parent's range, rank 4 of 4, nRanks 2: refused at once", stageBadNewRanks, fresh},
  {"ncclCommGrow from 2 to 4 ranks: Count 4, the parent's ranks keep theirs", stageGrow},
  {"grown comm: all-reduce, all-gather, send/recv ring", stageGrown},
  {"the parent still works: all-reduce", [](Proc& P) { return allReduce(P.parent, P.rank, kOld, 65537, P.stream); }, old},
  {"ncclCommShrink of the grown comm back to ranks 0, 1 (2, 3 destroy theirs): all-reduce", stageShrink},
  {"everything destroyed", stageDestroy},
};

int runProcess(int rank)
{
  Proc P;
  P.rank = rank;
  return runStages(P, kPlan, kStages, &gBoard->stages, kAll);
}

} // namespace

int main()
{
  const double scale = timeoutScale();
  gWaitS = 60 * scale;
  gBoard = mapSharedOrSay<Board>("nccl_grow_test");
  if (!gBoard) return 1;
  if (skipWithoutGpu("nccl_grow_test")) return 0;
  const double t0 = nowSec();
  const int failed = runStagedProcesses("nccl_grow_test", kAll, 300 * scale, 320 * scale, runProcess);
  printf("SUMMARY nccl_grow (2 ranks grown to 4, %.1f s): %s\n", nowSec() - t0, failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}
