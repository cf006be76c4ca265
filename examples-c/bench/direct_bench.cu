// The proxy-free device methods (an extension of this library): ping-pong latency with
// directSignal/directWait (release/acquire) and relaxedSignal/relaxedWait, and the bandwidth of a
// block-wide directPut in both directions at once. Checked before timed.
//
//   direct_bench [--port P]
// The GPU tests' harness (c-tests/harness/, on the Makefile's include path): the same runner and checks.
#include "mscclpp_rank.h"

using namespace tc;

namespace {

#ifndef MSCCLPP_HAS_DIRECT_METHODS
#error "direct_bench needs a mscclpp.h with the proxy-free methods"
#endif

constexpr int kIters = 20000;
constexpr int kRepeats = 5;
constexpr uint64_t kMaxBytes = 1ull << 30; // per direction
constexpr int kCopyThreads = 1024;

// directWait()/relaxedWait() with a deadline (same counters as the header's methods).
template <bool Relaxed>
__device__ bool boundedDirectWait(mscclppDevConn_t& conn, DevStatus* st, uint64_t timeoutNs, uint64_t iter)
{
  uint64_t* mine = reinterpret_cast<uint64_t*>(conn.localSignalEpochId);
  const uint64_t want = mine[6] + 1;
  mine[6] = want;
  uint64_t seen = 0, start = globalTimerNs();
  unsigned spins = 0;
  for (;;) {
    if (Relaxed)
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine + 5) : "memory");
    else
      asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine + 5) : "memory");
    if (seen >= want) return true;
    if ((++spins & 1023) == 0 && (st->failed || globalTimerNs() - start > timeoutNs)) {
      devFail(st, kFailWaitTimeout, Relaxed ? 1 : 0, iter, want, seen);
      return false;
    }
  }
}

template <bool Relaxed>
__global__ void pingpongKernel(int iters, int first, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mscclppDevConn_t conn = gConns[0];
  for (int i = 0; i < iters; ++i) {
    if (!first && !boundedDirectWait<Relaxed>(conn, st, timeoutNs, i)) return;
    if (Relaxed)
      conn.relaxedSignal();
    else
      conn.directSignal();
    if (first && !boundedDirectWait<Relaxed>(conn, st, timeoutNs, i)) return;
  }
}

// Every block copies its share of [rank*bytes, (rank+1)*bytes) into the peer's buffer at the same place.
__global__ void copyKernel(uint64_t offset, uint64_t bytes)
{
  mscclppDevConn_t conn = gConns[0];
  const uint64_t per = (bytes / gridDim.x + 15) / 16 * 16;
  const uint64_t begin = blockIdx.x * per;
  if (begin >= bytes) return;
  const uint64_t len = begin + per > bytes ? bytes - begin : per;
  conn.directPutBlock(offset + begin, offset + begin, len);
}

char* gBuf = nullptr;

std::string setup(Rank& R)
{
  TC_CUDA(cudaMalloc((void**)&gBuf, 2 * kMaxBytes));
  mscclppDevConn_t conn;
  TC_TRY(connectPeer(R, gBuf, 2 * kMaxBytes, &conn));
  TC_EXPECT(conn.remoteBuff != nullptr && conn.remoteSignalEpochId != nullptr, "the P2P connection has no remote pointers");
  return "";
}

template <bool Relaxed>
std::string pingpong(Rank& R, const char* name, cudaEvent_t start, cudaEvent_t stop)
{
  std::vector<double> oneWayUs;
  for (int rep = 0; rep <= kRepeats; ++rep) { // the first is a warm-up
    TC_TRY(barrier(R, "before ping-pong"));
    resetStatus(R);
    TC_CUDA(cudaEventRecord(start, R.stream));
    pingpongKernel<Relaxed><<<1, 32, 0, R.stream>>>(kIters, R.rank == 0, R.dStatus, R.waitTimeoutNs);
    TC_CUDA(cudaGetLastError());
    TC_CUDA(cudaEventRecord(stop, R.stream));
    TC_TRY(syncBounded(R, "ping-pong kernel", 2 * R.hostTimeoutS));
    float ms = 0;
    TC_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0) oneWayUs.push_back((double)ms * 1000.0 / (2.0 * kIters));
  }
  if (R.rank == 0) {
    printf("BENCH direct_pingpong mode=%s one_way_us=%.3f iters=%d repeats=%d\n", name, median(oneWayUs), kIters,
           kRepeats);
    fflush(stdout);
  }
  R.info = fmt("(one way %.3f us)", median(oneWayUs));
  return "";
}

// Both ranks copy at once, or (oneWay) only rank 0 copies while rank 1 receives.
std::string copyBench(Rank& R, uint64_t bytes, int blocks, bool oneWay, cudaEvent_t start, cudaEvent_t stop)
{
  const bool sends = !oneWay || R.rank == 0, receives = !oneWay || R.rank == 1;
  const uint64_t mine = (uint64_t)R.rank * kMaxBytes, theirs = (uint64_t)(1 - R.rank) * kMaxBytes;
  const uint32_t seed = 0x5eed0000u + (uint32_t)(bytes >> 10);
  // Check: fill my range, copy it into the peer, verify the peer's range that landed in mine.
  TC_TRY(fillWords(R, gBuf, mine, bytes, seed + R.rank, 0));
  // On this rank's stream: a cudaMemset on the legacy stream could still be zeroing while the peer writes.
  TC_CUDA(cudaMemsetAsync(gBuf + theirs, 0, bytes, R.stream));
  TC_CUDA(cudaStreamSynchronize(R.stream));
  TC_TRY(barrier(R, "before checked copy"));
  if (sends) copyKernel<<<blocks, kCopyThreads, 0, R.stream>>>(mine, bytes);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "copy kernel"));
  TC_TRY(barrier(R, "after checked copy"));
  if (receives) TC_TRY(verifyWords(R, gBuf, theirs, bytes, seed + (1 - R.rank), 0, "directPutBlock"));
  std::vector<double> us;
  for (int rep = 0; rep <= kRepeats; ++rep) {
    TC_TRY(barrier(R, "before timed copy"));
    TC_CUDA(cudaEventRecord(start, R.stream));
    if (sends) copyKernel<<<blocks, kCopyThreads, 0, R.stream>>>(mine, bytes);
    TC_CUDA(cudaGetLastError());
    TC_CUDA(cudaEventRecord(stop, R.stream));
    TC_TRY(syncBounded(R, "copy kernel"));
    float ms = 0;
    TC_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0) us.push_back(ms * 1000.0);
  }
  const double t = median(us);
  if (R.rank == 0) {
    printf("BENCH direct_copy bytes=%llu directions=%d time_us=%.3f gbps_per_direction=%.2f blocks=%d threads=%d\n",
           (unsigned long long)bytes, oneWay ? 1 : 2, t, bytes / t / 1000.0, blocks, kCopyThreads);
    fflush(stdout);
  }
  R.info = fmt("(%s %s, %d blocks: %.1f us, %.1f GB/s per direction)", sizeName(bytes).c_str(),
               oneWay ? "one way" : "each way at once", blocks, t, bytes / t / 1000.0);
  return "";
}

int rankMain(Rank& R)
{
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "direct_setup", [&] { return setup(R); })) return 1;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  bool ok = runCase(R, "direct_pingpong", [&] { return pingpong<false>(R, "acquire_release", start, stop); });
  ok = ok && runCase(R, "relaxed_pingpong", [&] { return pingpong<true>(R, "relaxed", start, stop); });
  // 64 blocks of 1024 threads (about half the SMs of an H200) both ways at once, then one way only, and
  // on every SM: how many SMs it takes to fill the links.
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, R.device);
  struct Copy
  {
    uint64_t bytes;
    int blocks;
    bool oneWay;
  };
  std::vector<Copy> copies = {{1ull << 20, 64, false}, {64ull << 20, 64, false}, {1ull << 30, 64, false},
                              {1ull << 30, 32, true},   {1ull << 30, 64, true}};
  if (sms > 0) {
    copies.push_back({1ull << 30, sms, false});
    copies.push_back({1ull << 30, sms, true});
  }
  for (const Copy& c : copies) {
    ok = ok && runCase(R, fmt("direct_copy_%s_%dblocks%s", sizeName(c.bytes).c_str(), c.blocks, c.oneWay ? "_one_way" : ""),
                       [&] { return copyBench(R, c.bytes, c.blocks, c.oneWay, start, stop); });
  }
  ok = runCase(R, "teardown", [&]() -> std::string {
         TC_TRY(destroyComm(R, false));
         TC_CUDA(cudaFree(gBuf));
         return "";
       }) && ok;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  return runRanks("direct_bench", opt, 120, rankMain);
}
