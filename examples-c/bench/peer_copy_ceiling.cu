// What the link between two GPUs carries without this library: 1 GiB copied by the copy engine
// (cudaMemcpyPeerAsync), by SM kernels that write into the peer's memory or read from it, and by both at
// once (a share of the bytes by SMs, the rest by the copy engine), one way and both ways at once. The
// proxy moves data with the copy engine, and directPutBlock() is an SM write: these are their ceilings.
// One process drives both GPUs; each case is checked word by word once, then timed (median of 5 repeats).
//
//   peer_copy_ceiling [ignored arguments]
#define BENCH_NAME "peer_copy_ceiling"
#include "bench_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr size_t kBytes = 1ull << 30;
constexpr int kRepeats = 5;
constexpr int kThreads = 1024;

__host__ __device__ uint32_t word(uint32_t seed, uint64_t i) { return (uint32_t)(i * 2654435761u) ^ seed; }

__global__ void fill(uint32_t* p, uint64_t n, uint32_t seed)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = word(seed, i);
}

__global__ void count_wrong(const uint32_t* p, uint64_t n, uint32_t seed, unsigned long long* wrong)
{
  unsigned long long w = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    w += p[i] != word(seed, i);
  if (w) atomicAdd(wrong, w);
}

// Grid-stride 16-byte copy with four loads in flight per thread (as directPut()).
__global__ void sm_copy(uint4* __restrict__ dst, const uint4* __restrict__ src, uint64_t n16)
{
  const uint64_t nt = (uint64_t)gridDim.x * blockDim.x;
  uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
  for (; i + 3 * nt < n16; i += 4 * nt) {
    uint4 a = src[i], b = src[i + nt], c = src[i + 2 * nt], d = src[i + 3 * nt];
    dst[i] = a;
    dst[i + nt] = b;
    dst[i + 2 * nt] = c;
    dst[i + 3 * nt] = d;
  }
  for (; i < n16; i += nt) dst[i] = src[i];
}

enum class Sm { None, Write, Read };

struct Case
{
  const char* method;
  Sm sm;
  double smShare; // of the bytes, by SMs; the rest by the copy engine
  int blocks;
  bool both;
};

struct Gpu
{
  char* src;
  char* dst;
  cudaStream_t ce, sm;
  cudaEvent_t start, smDone, stop;
  unsigned long long* wrong;
};
Gpu g[2];

// Queues GPU d's copy of its src into the peer's dst, timed by d's events.
void queue(int d, const Case& c)
{
  const int p = 1 - d;
  const size_t smBytes = (size_t)(kBytes * c.smShare) & ~(size_t)0xFFFFF;
  CHECK(cudaSetDevice(d));
  CHECK(cudaEventRecord(g[d].start, g[d].ce));
  CHECK(cudaStreamWaitEvent(g[d].sm, g[d].start, 0));
  if (smBytes < kBytes)
    CHECK(cudaMemcpyPeerAsync(g[p].dst + smBytes, p, g[d].src + smBytes, d, kBytes - smBytes, g[d].ce));
  if (smBytes > 0) {
    // A write runs on this GPU into the peer's memory; a read runs on the peer, from this GPU's memory.
    const int runner = c.sm == Sm::Write ? d : p;
    CHECK(cudaSetDevice(runner));
    cudaStream_t s = runner == d ? g[d].sm : g[p].sm;
    sm_copy<<<c.blocks, kThreads, 0, s>>>((uint4*)g[p].dst, (const uint4*)g[d].src, smBytes / 16);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(g[runner].smDone, s));
    CHECK(cudaSetDevice(d));
    CHECK(cudaStreamWaitEvent(g[d].ce, g[runner].smDone, 0));
  }
  CHECK(cudaEventRecord(g[d].stop, g[d].ce));
}

// One run of the case; returns the slowest direction's time in ms.
float runOnce(const Case& c)
{
  for (int d = 0; d < 2; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceSynchronize());
  }
  float worst = 0;
  const int dirs = c.both ? 2 : 1;
  for (int d = 0; d < dirs; ++d) queue(d, c);
  for (int d = 0; d < dirs; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaEventSynchronize(g[d].stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, g[d].start, g[d].stop));
    worst = std::max(worst, ms);
  }
  return worst;
}

bool check(const Case& c, uint32_t salt)
{
  const int dirs = c.both ? 2 : 1;
  for (int d = 0; d < 2; ++d) {
    CHECK(cudaSetDevice(d));
    fill<<<1024, 256>>>((uint32_t*)g[d].src, kBytes / 4, salt + d);
    fill<<<1024, 256>>>((uint32_t*)g[d].dst, kBytes / 4, ~salt);
    CHECK(cudaMemset(g[d].wrong, 0, sizeof(unsigned long long)));
    CHECK(cudaDeviceSynchronize());
  }
  runOnce(c);
  bool ok = true;
  for (int d = 0; d < dirs; ++d) {
    const int p = 1 - d;
    CHECK(cudaSetDevice(p));
    count_wrong<<<1024, 256>>>((const uint32_t*)g[p].dst, kBytes / 4, salt + d, g[p].wrong);
    unsigned long long wrong = 0;
    CHECK(cudaMemcpy(&wrong, g[p].wrong, sizeof(wrong), cudaMemcpyDeviceToHost));
    if (wrong) {
      printf("FAIL peer_copy_ceiling %s: %llu of %zu words wrong on GPU %d\n", c.method, wrong, kBytes / 4, p);
      ok = false;
    }
  }
  return ok;
}

} // namespace

int main()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    printf("SKIP peer_copy_ceiling: needs two GPUs, found %d\n", n);
    return 0;
  }
  for (int d = 0; d < 2; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CHECK(cudaMalloc(&g[d].src, kBytes));
    CHECK(cudaMalloc(&g[d].dst, kBytes));
    CHECK(cudaMalloc(&g[d].wrong, sizeof(unsigned long long)));
    CHECK(cudaStreamCreateWithFlags(&g[d].ce, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&g[d].sm, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&g[d].start));
    CHECK(cudaEventCreate(&g[d].smDone));
    CHECK(cudaEventCreate(&g[d].stop));
  }
  const Case cases[] = {
    {"copy_engine", Sm::None, 0, 0, false},      {"copy_engine", Sm::None, 0, 0, true},
    {"sm_write", Sm::Write, 1, 132, false},      {"sm_write", Sm::Write, 1, 132, true},
    {"sm_read", Sm::Read, 1, 132, false},        {"sm_read", Sm::Read, 1, 132, true},
    {"copy_engine+sm_write", Sm::Write, 0.1, 64, true}, {"copy_engine+sm_write", Sm::Write, 0.2, 64, true},
    {"copy_engine+sm_write", Sm::Write, 0.3, 64, true},
  };
  int failed = 0;
  uint32_t salt = 1;
  for (const Case& c : cases) {
    const bool ok = check(c, salt += 2);
    failed += !ok;
    std::vector<double> gbps;
    for (int r = 0; r < kRepeats; ++r) gbps.push_back(kBytes / (runOnce(c) * 1e-3) / 1e9);
    std::sort(gbps.begin(), gbps.end());
    printf("BENCH peer_copy method=%s directions=%d sm_share=%.1f blocks=%d gbps_per_direction=%.1f min=%.1f max=%.1f "
           "checked=%d\n",
           c.method, c.both ? 2 : 1, c.smShare, c.blocks, gbps[kRepeats / 2], gbps.front(), gbps.back(), ok ? 1 : 0);
    fflush(stdout);
  }
  return failed ? 1 : 0;
}
