// Bidirectional putWithSignal between two GPUs: per iteration both GPUs putWithSignal their half of the
// buffer to the other and wait for the other's, one thread per GPU. Prints the time per iteration and the
// bandwidth per direction (bytes per direction / time), median of repeats, for 1 KiB to 128 MiB per
// direction. Each size is checked word by word once before it is timed.
//
//   bidir_put [--port P]
// The GPU tests' harness (c-tests/harness/, on the Makefile's include path): the same runner and checks.
#include "mscclpp_rank.h"

using namespace tc;

namespace {

constexpr int kRepeats = 5;
constexpr uint64_t kMaxBytes = 128ull << 20;

struct Size
{
  uint64_t bytes;
  int iters;
};
const Size kSizes[] = {{1ull << 10, 5000}, {32ull << 10, 5000}, {1ull << 20, 2000}, {32ull << 20, 200}, {128ull << 20, 60}};

// Rank r owns [r * bytes, (r + 1) * bytes) and sends it to the same place in the peer's buffer.
__global__ void bidirKernel(int rank, uint64_t bytes, int iters, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mscclppDevConn_t conn = gConns[0];
  for (int i = 0; i < iters; ++i) {
    conn.putWithSignal((uint64_t)rank * bytes, bytes);
    if (!boundedWait(conn, st, timeoutNs, 0, (uint64_t)i)) return;
  }
  // The time includes the completion of this GPU's own last transfer.
  conn.flush();
}

char* gBuf = nullptr;
mscclppDevConn_t gConn;
uint64_t gRounds = 0;

std::string setup(Rank& R)
{
  TC_CUDA(cudaMalloc((void**)&gBuf, 2 * kMaxBytes));
  TC_TRY(connectPeer(R, gBuf, 2 * kMaxBytes, &gConn));
  TC_MSCCLPP(mscclppProxyLaunch(R.comm));
  return "";
}

std::string runKernel(Rank& R, uint64_t bytes, int iters, cudaEvent_t start, cudaEvent_t stop, float* ms)
{
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  TC_CUDA(cudaEventRecord(start, R.stream));
  bidirKernel<<<1, 32, 0, R.stream>>>(R.rank, bytes, iters, R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_CUDA(cudaEventRecord(stop, R.stream));
  TC_TRY(syncBounded(R, "bidirectional kernel", 2 * R.hostTimeoutS));
  gRounds += (uint64_t)iters;
  TC_CUDA(cudaEventElapsedTime(ms, start, stop));
  return "";
}

// One iteration on fresh data, then every word of the peer's half and of the untouched rest is checked.
std::string checkSize(Rank& R, uint64_t bytes, uint32_t salt, cudaEvent_t start, cudaEvent_t stop)
{
  const int peer = 1 - R.rank;
  const uint32_t mine = makeSeed(kRoleSrc, R.rank, peer, salt);
  const uint32_t sentinel = makeSeed(kRoleSentinel, R.rank, peer, salt);
  TC_TRY(fillWords(R, gBuf, (uint64_t)R.rank * bytes, bytes, mine, 0));
  TC_TRY(fillWords(R, gBuf, (uint64_t)peer * bytes, bytes, sentinel, 0));
  const uint64_t tail = std::min<uint64_t>(64 * 1024, 2 * kMaxBytes - 2 * bytes);
  TC_TRY(fillWords(R, gBuf, 2 * bytes, tail, sentinel, 1u << 30));
  TC_TRY(syncBounded(R, "fill"));
  float ms = 0;
  TC_TRY(runKernel(R, bytes, 1, start, stop, &ms));
  TC_TRY(barrier(R, "after kernel"));
  TC_TRY(verifyWords(R, gBuf, (uint64_t)peer * bytes, bytes, makeSeed(kRoleSrc, peer, R.rank, salt), 0, "peer's half"));
  TC_TRY(verifyWords(R, gBuf, (uint64_t)R.rank * bytes, bytes, mine, 0, "own half"));
  TC_TRY(verifyWords(R, gBuf, 2 * bytes, tail, sentinel, 1u << 30, "bytes after both halves"));
  TC_TRY(expectEpochs(R, gConn, gRounds));
  return "";
}

int rankMain(Rank& R)
{
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "bidir_setup", [&] { return setup(R); })) return 1;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!runCase(R, "bidir_events", [&]() -> std::string {
        TC_CUDA(cudaEventCreate(&start));
        TC_CUDA(cudaEventCreate(&stop));
        return "";
      }))
    return 1;
  uint32_t salt = 0;
  for (const Size& s : kSizes) {
    const std::string name = sizeName(s.bytes);
    // A failed check leaves the ranks in step (all collective calls are made), so timing goes on.
    bool checked = runCase(R, "bidir_check_" + name, [&] { return checkSize(R, s.bytes, ++salt, start, stop); });
    runCase(R, "bidir_timed_" + name, [&]() -> std::string {
      float ms = 0;
      TC_TRY(runKernel(R, s.bytes, std::max(1, s.iters / 10), start, stop, &ms)); // warm-up
      std::vector<double> us;
      for (int rep = 0; rep < kRepeats; ++rep) {
        TC_TRY(runKernel(R, s.bytes, s.iters, start, stop, &ms));
        us.push_back((double)ms * 1000.0 / s.iters);
      }
      TC_TRY(barrier(R, "after timing"));
      TC_TRY(expectEpochs(R, gConn, gRounds));
      const double med = median(us);
      const double gbps = (double)s.bytes / (med * 1e-6) / 1e9;
      if (R.rank == 0) {
        printf("BENCH bidir_put bytes=%llu us_per_iter=%.3f GBps_per_direction=%.2f min_us=%.3f max_us=%.3f iters=%d "
               "repeats=%d checked=%d\n",
               (unsigned long long)s.bytes, med, gbps, *std::min_element(us.begin(), us.end()),
               *std::max_element(us.begin(), us.end()), s.iters, kRepeats, checked ? 1 : 0);
        fflush(stdout);
      }
      R.info = fmt("(%s per direction: %.2f us per iteration, %.1f GB/s per direction)", name.c_str(), med, gbps);
      return "";
    });
  }
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
  return runRanks("bidir_put", opt, 90, rankMain);
}
