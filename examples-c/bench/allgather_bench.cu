// All-gather benchmark with the legacy test's two patterns (see ../common/allgather_kernels.cuh), whole
// buffers of 1 MiB to 1 GiB. As the legacy test did, a CUDA graph of 10 kernel launches is captured and
// launched 10 times per measurement (100 times up to 16 MiB); the time per kernel is the median over repeats and
// algBW = whole buffer / time per kernel. Every size is checked word by word before and after timing.
//
//   allgather_bench [nranks] [--port P]
// The GPU tests' harness (c-tests/harness/, on the Makefile's include path): the same runner and checks.
#include "allgather_kernels.cuh"
#include "mscclpp_rank.h"

using namespace tc;

namespace {

constexpr int kKernelsPerGraph = 10;
// As the legacy test, 10 launches of the graph; small buffers get 100, so that a repeat lasts long enough
// (over a millisecond) for the ranks' skew at its start not to count.
inline int graphLaunches(uint64_t total)
{
  return total <= (16ull << 20) ? 100 : 10;
}
constexpr int kRepeats = 5;
constexpr uint64_t kMaxTotal = 1ull << 30;

AllGather gA;
uint32_t gSalt = 0;

std::string timeKernel(Rank& R, int kernel, uint64_t total, double* usPerKernel)
{
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  // Thread-local capture: the proxy thread keeps making CUDA calls meanwhile.
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kKernelsPerGraph; ++k) {
    cudaError_t e = allgatherLaunch<false>(R, kernel, total, R.stream);
    if (e != cudaSuccess) {
      cudaStreamEndCapture(R.stream, &graph);
      R.fatal = true;
      return fmt("kernel launch during capture: %s", cudaGetErrorString(e));
    }
  }
  TC_CUDA(cudaStreamEndCapture(R.stream, &graph));
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  TC_CUDA(cudaEventCreate(&start));
  TC_CUDA(cudaEventCreate(&stop));

  // Warm-up: one graph launch.
  TC_TRY(barrier(R, "before warm-up"));
  resetStatus(R);
  TC_CUDA(cudaGraphLaunch(exec, R.stream));
  TC_TRY(syncBounded(R, "warm-up graph"));

  std::vector<double> us;
  for (int rep = 0; rep < kRepeats; ++rep) {
    TC_TRY(barrier(R, "before timing"));
    TC_CUDA(cudaEventRecord(start, R.stream));
    for (int l = 0; l < graphLaunches(total); ++l) TC_CUDA(cudaGraphLaunch(exec, R.stream));
    TC_CUDA(cudaEventRecord(stop, R.stream));
    TC_TRY(syncBounded(R, "timed graphs", 2 * R.hostTimeoutS));
    float ms = 0;
    TC_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back((double)ms * 1000.0 / (kKernelsPerGraph * graphLaunches(total)));
  }
  *usPerKernel = median(us);
  TC_CUDA(cudaEventDestroy(start));
  TC_CUDA(cudaEventDestroy(stop));
  TC_CUDA(cudaGraphExecDestroy(exec));
  TC_CUDA(cudaGraphDestroy(graph));
  return "";
}

std::string benchOne(Rank& R, int kernel, uint64_t total)
{
  ++gSalt;
  std::string checkBefore = allgatherChecked<false>(R, gA, kernel, total, gSalt, "checked run");
  if (R.fatal) return checkBefore;
  double us = 0;
  TC_TRY(timeKernel(R, kernel, total, &us));
  // The timed launches re-sent the same chunks: the data must still be exact.
  std::string checkAfter = allgatherVerify(R, gA, total, gSalt, "after timing");
  if (R.fatal) return checkAfter;
  TC_TRY(barrier(R, "after check"));
  const double gbps = (double)total / (us * 1e-6) / 1e9;
  if (R.rank == 0) {
    printf("BENCH allgather kernel=%d bytes=%llu time_us=%.3f algbw_GBps=%.2f kernels=%d repeats=%d checked=%d\n", kernel,
           (unsigned long long)total, us, gbps, kKernelsPerGraph * graphLaunches(total), kRepeats,
           (checkBefore.empty() && checkAfter.empty()) ? 1 : 0);
    fflush(stdout);
  }
  if (!checkBefore.empty()) return checkBefore;
  if (!checkAfter.empty()) return checkAfter;
  R.info = fmt("(%.2f us per kernel, algBW %.1f GB/s)", us, gbps);
  return "";
}

int rankMain(Rank& R)
{
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "allgather_setup", [&] { return allgatherSetup(R, gA, kMaxTotal + 64 * 1024); })) return 1;
  for (uint64_t total = 1ull << 20; total <= kMaxTotal; total *= 4) {
    for (int kernel = 0; kernel < 2; ++kernel) {
      runCase(R, fmt("allgather_bench_kernel%d_%s", kernel, sizeName(total).c_str()),
              [&] { return benchOne(R, kernel, total); });
    }
  }
  bool ok = runCase(R, "teardown", [&] { return allgatherTeardown(R, gA); });
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  return runRanks("allgather_bench", opt, 120, rankMain);
}
