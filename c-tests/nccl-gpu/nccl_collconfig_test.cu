// The collectives with a per-call configuration (NCCL 2.31: ncclAllReduceConfig and its seven siblings) on
// GPUs, through our nccl.h and libnccl.so.2 alone: every result checked element by element against a host
// reference, the config's launchCompletionEvent recorded once the call's work is queued, and a graph of a
// configured all-reduce replayed.
//
// N processes (default 2), forked before anything touches CUDA; process r uses GPU r % GPUs. Stages, each
// ended by a meeting of the processes at which each learns whether any failed:
//   0. ncclCommInitRankConfig with a config of NCCL 2.30's size (96 bytes, as torch 2.15 passes), maxCTAs
//      4 on rank 0 and more on the others (every collective below then runs with at most 4 blocks a launch);
//   1. each *Config collective with a config whose tuning fields are set (maxCTAs, algSelection "ring",
//      CTAPolicy, a profiler tag: ignored here): all-reduce, all-gather, reduce-scatter, broadcast, reduce,
//      all-to-all, gather, scatter, out of place, checked;
//   2. ncclAllReduceConfig of 16 Mi floats with a launchCompletionEvent: cudaEventSynchronize on it, then
//      the output read on another stream without waiting for the call's stream: it must be complete;
//   3. a CUDA graph of two configured all-reduces (one with an event) replayed 3 times, the input changed
//      between replays, each checked;
//   4. destroyed.
//
//   nccl_collconfig_test [nranks]
//
// Output: PASS / FAIL lines, SKIP where no GPU is usable, a SUMMARY line; exit code 0 only if every stage
// passed on every process. MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline.
#include "staged.h"

using namespace tc;

namespace {

constexpr int kStages = 5;
int gRanks = 2;

struct Board
{
  StagedId id;
  StageBoard stages;
};

Board* gBoard = nullptr;

struct Proc
{
  int rank = 0;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
};

// A config whose tuning fields are all set: this library ignores them (DEBUG lines), the results stay right.
ncclCollConfig_t tunedConfig()
{
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.minCTAs = 1;
  c.maxCTAs = 4;
  c.algSelection = "ring";
  c.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
  c.userProfilerTag = 42;
  return c;
}

std::string stageInit(Proc& P)
{
  ncclUniqueId id;
  const std::string why = shareStagedId(P.rank, gBoard->id, &id);
  if (!why.empty()) return why;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.size = 96; // NCCL 2.30's ncclConfig_t
  config.version = 23007;
  // A different limit on each rank: the smallest (4) applies to every rank's collectives.
  config.maxCTAs = 4 + 4 * P.rank;
  TG_OK(ncclCommInitRankConfig(&P.comm, gRanks, id, P.rank, &config));
  int n = -1;
  TG_OK(ncclCommCount(P.comm, &n));
  return n == gRanks ? "" : fmt("ncclCommCount gave %d", n);
}

std::string stageCollectives(Proc& P)
{
  const int n = gRanks, r = P.rank;
  const size_t count = 65537;
  const ncclCollConfig_t c = tunedConfig();
  Buffers b;
  float* in = b.get(count * n);
  float* out = b.get(count * n);
  if (!in || !out) return "cudaMalloc failed";
  auto mine = [&](size_t i) { return float(r + 1 + i % 7); };
  std::string why = upload(in, count * n, P.stream, mine);
  if (!why.empty()) return why;
  // all-reduce: the sum of r + 1 + i % 7 over the ranks.
  TG_OK(ncclAllReduceConfig(in, out, count, ncclFloat, ncclSum, P.comm, P.stream, &c));
  why = compare("ncclAllReduceConfig", out, count, P.stream, [&](size_t i) { return float(n * (n + 1) / 2 + n * (i % 7)); });
  if (!why.empty()) return why;
  // all-gather: rank q's piece holds q + 1 + i % 7.
  TG_OK(ncclAllGatherConfig(in, out, count, ncclFloat, P.comm, P.stream, &c));
  why = compare("ncclAllGatherConfig", out, count * n, P.stream,
                [&](size_t i) { return float(i / count + 1 + (i % count) % 7); });
  if (!why.empty()) return why;
  // reduce-scatter of count * n: this rank's piece of the sums.
  TG_OK(ncclReduceScatterConfig(in, out, count, ncclFloat, ncclSum, P.comm, P.stream, &c));
  why = compare("ncclReduceScatterConfig", out, count, P.stream,
                [&](size_t i) { return float(n * (n + 1) / 2 + n * ((r * count + i) % 7)); });
  if (!why.empty()) return why;
  // broadcast from the last rank.
  TG_OK(ncclBroadcastConfig(in, out, count, ncclFloat, n - 1, P.comm, P.stream, &c));
  why = compare("ncclBroadcastConfig", out, count, P.stream, [&](size_t i) { return float(n + i % 7); });
  if (!why.empty()) return why;
  // reduce to rank 0.
  TG_CUDA(cudaMemsetAsync(out, 0, count * sizeof(float), P.stream));
  TG_OK(ncclReduceConfig(in, out, count, ncclFloat, ncclSum, 0, P.comm, P.stream, &c));
  if (r == 0) {
    why = compare("ncclReduceConfig", out, count, P.stream, [&](size_t i) { return float(n * (n + 1) / 2 + n * (i % 7)); });
    if (!why.empty()) return why;
  }
  // all-to-all of count / n... a piece of 1000 floats per peer: piece p of rank q's input is q + 1 + i % 7.
  const size_t piece = 1000;
  TG_OK(ncclAlltoAllConfig(in, out, piece, ncclFloat, P.comm, P.stream, &c));
  why = compare("ncclAlltoAllConfig", out, piece * n, P.stream,
                [&](size_t i) { return float(i / piece + 1 + (r * piece + i % piece) % 7); });
  if (!why.empty()) return why;
  // gather to rank 0, scatter from rank 0.
  TG_OK(ncclGatherConfig(in, out, piece, ncclFloat, 0, P.comm, P.stream, &c));
  if (r == 0) {
    why = compare("ncclGatherConfig", out, piece * n, P.stream, [&](size_t i) { return float(i / piece + 1 + (i % piece) % 7); });
    if (!why.empty()) return why;
  }
  TG_OK(ncclScatterConfig(in, out, piece, ncclFloat, 0, P.comm, P.stream, &c));
  why = compare("ncclScatterConfig", out, piece, P.stream, [&](size_t i) { return float(1 + (r * piece + i) % 7); });
  return why.empty() ? healthy(P.comm) : why;
}

std::string stageEvent(Proc& P)
{
  const int n = gRanks, r = P.rank;
  const size_t count = size_t(16) << 20;
  Buffers b;
  float* in = b.get(count);
  float* out = b.get(count);
  if (!in || !out) return "cudaMalloc failed";
  std::string why = upload(in, count, P.stream, [&](size_t i) { return float(r + 1 + i % 7); });
  if (!why.empty()) return why;
  TG_CUDA(cudaMemsetAsync(out, 0, count * sizeof(float), P.stream));
  TG_CUDA(cudaStreamSynchronize(P.stream));
  cudaEvent_t done;
  TG_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  c.launchCompletionEvent = done;
  ncclResult_t res = ncclAllReduceConfig(in, out, count, ncclFloat, ncclSum, P.comm, P.stream, &c);
  if (res != ncclSuccess) {
    cudaEventDestroy(done);
    return fmt("ncclAllReduceConfig with an event returned %s", rc(res).c_str());
  }
  // The event alone tells that the call is done: read the output on a stream of its own.
  cudaStream_t other;
  TG_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaError_t e = cudaEventSynchronize(done);
  if (e == cudaSuccess) why = compare("ncclAllReduceConfig of 16 Mi floats, read after its event", out, count, other,
                                      [&](size_t i) { return float(n * (n + 1) / 2 + n * (i % 7)); });
  cudaStreamSynchronize(P.stream);
  cudaStreamDestroy(other);
  cudaEventDestroy(done);
  if (e != cudaSuccess) return fmt("cudaEventSynchronize: %s", cudaGetErrorString(e));
  return why.empty() ? healthy(P.comm) : why;
}

std::string stageGraph(Proc& P)
{
  const int n = gRanks, r = P.rank;
  const size_t count = 100003;
  Buffers b;
  float* in = b.get(count);
  float* mid = b.get(count);
  float* out = b.get(count);
  if (!in || !mid || !out) return "cudaMalloc failed";
  cudaEvent_t done;
  TG_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  ncclCollConfig_t c = tunedConfig();
  ncclCollConfig_t withEvent = NCCL_COLLCONFIG_INITIALIZER;
  withEvent.launchCompletionEvent = done;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TG_CUDA(cudaStreamBeginCapture(P.stream, cudaStreamCaptureModeGlobal));
  ncclResult_t r1 = ncclAllReduceConfig(in, mid, count, ncclFloat, ncclSum, P.comm, P.stream, &c);
  ncclResult_t r2 = ncclAllReduceConfig(mid, out, count, ncclFloat, ncclSum, P.comm, P.stream, &withEvent);
  TG_CUDA(cudaStreamEndCapture(P.stream, &graph));
  if (r1 != ncclSuccess || r2 != ncclSuccess) return fmt("captured calls returned %s, %s", rc(r1).c_str(), rc(r2).c_str());
  TG_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::string why;
  for (int replay = 0; replay < 3 && why.empty(); ++replay) {
    why = upload(in, count, P.stream, [&](size_t i) { return float(r + replay + i % 5); });
    if (!why.empty()) break;
    TG_CUDA(cudaGraphLaunch(exec, P.stream));
    // sum over ranks of (q + replay + i % 5), then summed again over the ranks: n times that.
    why = compare(fmt("graph replay %d", replay).c_str(), out, count, P.stream,
                  [&](size_t i) { return float(n * (n * (n - 1) / 2 + n * replay + n * (i % 5))); });
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(done);
  return why.empty() ? healthy(P.comm) : why;
}

std::string stageDestroy(Proc& P)
{
  TG_OK(ncclCommDestroy(P.comm));
  P.comm = nullptr;
  return "";
}

const Stage<Proc> kPlan[kStages] = {
  {"ncclCommInitRankConfig with a 96-byte config (NCCL 2.30's, as torch 2.15 passes), maxCTAs 4 + 4 * rank", stageInit},
  {"the eight *Config collectives with tuning fields set, checked", stageCollectives},
  {"launchCompletionEvent: the output complete once the event is", stageEvent},
  {"a graph of two configured all-reduces (one with an event) replayed 3 times", stageGraph},
  {"ncclCommDestroy", stageDestroy},
};

int runProcess(int rank)
{
  Proc P;
  P.rank = rank;
  return runStages(P, kPlan, kStages, &gBoard->stages, gRanks);
}

} // namespace

int main(int argc, char** argv)
{
  if (argc > 1) gRanks = atoi(argv[1]);
  if (gRanks < 2 || gRanks > 8) {
    printf("usage: nccl_collconfig_test [nranks, 2 to 8]\n");
    return 2;
  }
  const double scale = timeoutScale();
  gWaitS = 60 * scale;
  gBoard = mapSharedOrSay<Board>("nccl_collconfig_test");
  if (!gBoard) return 1;
  if (skipWithoutGpu("nccl_collconfig_test")) return 0;
  const double t0 = nowSec();
  const int failed = runStagedProcesses("nccl_collconfig_test", gRanks, 240 * scale, 260 * scale, runProcess);
  printf("SUMMARY nccl_collconfig (%d ranks, %.1f s): %s\n", gRanks, nowSec() - t0, failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}
