// Ping-pong latency between two GPUs over one P2P connection: one thread per GPU; rank 0 signals then
// waits, rank 1 waits then signals, many times in one kernel. Prints the one-way latency (kernel time /
// 2 / iterations), median of repeats, timed with CUDA events after a checked run and a warm-up.
//
//   pingpong [--port P]
// The GPU tests' harness (c-tests/harness/, on the Makefile's include path): the same runner and checks.
#include "mscclpp_rank.h"

using namespace tc;

namespace {

constexpr int kCheckIters = 1000;
constexpr int kWarmupIters = 1000;
constexpr int kIters = 10000;
constexpr int kRepeats = 5;

__global__ void pingpongKernel(int iters, int first, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mscclppDevConn_t conn = gConns[0];
  for (int i = 0; i < iters; ++i) {
    if (first) {
      conn.signal();
      if (!boundedWait(conn, st, timeoutNs, 0, (uint64_t)i)) return;
    } else {
      if (!boundedWait(conn, st, timeoutNs, 0, (uint64_t)i)) return;
      conn.signal();
    }
  }
}

char* gBuf = nullptr;
mscclppDevConn_t gConn;
uint64_t gRounds = 0; // signals sent = waits made, per rank

std::string setup(Rank& R)
{
  TC_CUDA(cudaMalloc((void**)&gBuf, 4096));
  TC_TRY(connectPeer(R, gBuf, 4096, &gConn));
  TC_MSCCLPP(mscclppProxyLaunch(R.comm));
  return "";
}

std::string runKernel(Rank& R, int iters, cudaEvent_t start, cudaEvent_t stop, float* ms)
{
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  TC_CUDA(cudaEventRecord(start, R.stream));
  pingpongKernel<<<1, 32, 0, R.stream>>>(iters, R.rank == 0 ? 1 : 0, R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_CUDA(cudaEventRecord(stop, R.stream));
  TC_TRY(syncBounded(R, "ping-pong kernel", 2 * R.hostTimeoutS));
  gRounds += (uint64_t)iters;
  TC_CUDA(cudaEventElapsedTime(ms, start, stop));
  return "";
}

int rankMain(Rank& R)
{
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "pingpong_setup", [&] { return setup(R); })) return 1;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!runCase(R, "pingpong_check", [&]() -> std::string {
        TC_CUDA(cudaEventCreate(&start));
        TC_CUDA(cudaEventCreate(&stop));
        float ms = 0;
        TC_TRY(runKernel(R, kCheckIters, start, stop, &ms));
        TC_TRY(barrier(R, "after kernel"));
        TC_TRY(expectEpochs(R, gConn, gRounds));
        R.info = fmt("(%d round trips, epochs match)", kCheckIters);
        return "";
      }))
    return 1;
  runCase(R, "pingpong_timed", [&]() -> std::string {
    float ms = 0;
    TC_TRY(runKernel(R, kWarmupIters, start, stop, &ms));
    std::vector<double> oneWayUs;
    for (int rep = 0; rep < kRepeats; ++rep) {
      TC_TRY(runKernel(R, kIters, start, stop, &ms));
      oneWayUs.push_back((double)ms * 1000.0 / (2.0 * kIters));
    }
    TC_TRY(barrier(R, "after timing"));
    TC_TRY(expectEpochs(R, gConn, gRounds));
    const double med = median(oneWayUs);
    const double lo = *std::min_element(oneWayUs.begin(), oneWayUs.end());
    const double hi = *std::max_element(oneWayUs.begin(), oneWayUs.end());
    if (R.rank == 0) {
      printf("BENCH pingpong one_way_us=%.3f min_us=%.3f max_us=%.3f iters=%d repeats=%d\n", med, lo, hi, kIters, kRepeats);
      fflush(stdout);
    }
    R.info = fmt("(one way %.2f us, median of %d x %d round trips)", med, kRepeats, kIters);
    return "";
  });
  bool ok = runCase(R, "teardown", [&]() -> std::string {
    TC_TRY(destroyComm(R));
    TC_CUDA(cudaFree(gBuf));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return "";
  });
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  return runRanks("pingpong", opt, 60, rankMain);
}
