// The floor of a small collective in a CUDA graph, without this library. Each of two GPUs (one process
// drives both, peer access on) runs a graph of K kernels of one kind, the two graphs replayed R times side
// by side; the time per kernel is the wall time over K x R (median of 5 repeats). The kinds:
//   empty       a kernel that does nothing: one kernel after another in a graph;
//   counter     reads and bumps a word of its own GPU (the epoch a collective kernel keeps);
//   flag        bumps the counter, stores it into the peer's flag word (st.release.sys) and waits for its
//               own (ld.acquire.sys): one launch plus one flag crossing NVLink, both ways at once;
//   packets B   one block writes B bytes of f32 as packets (8 data bytes and two copies of the flag in one
//               16-byte store) into the peer's slot of this epoch (two slots, by the epoch's parity), reads
//               the peer's packets and adds them to its own input into its output: a one-shot all-reduce
//               of two ranks, the shape of ours up to 4 KiB, with nothing else.
// The packet kernels' output is checked on both GPUs before they are timed. A wait that outlasts 5 s ends
// the kernel and the program fails, rather than hanging. Needs two GPUs that reach each other's memory.
//
//   graph_floor [--kernels K] [--replays R]     (defaults 10 and 200)
#define BENCH_NAME "graph_floor"
#include "bench_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kRepeats = 5;
constexpr uint64_t kMaxBytes = 16 << 10;  // the largest packet case
constexpr uint64_t kTimeoutNs = 5000000000ull;

// One GPU's words: `counter` (its epoch), `flag` (written by the peer), `timedOut` (set by a wait that gave
// up), then two packet slots written by the peer, its input and its output.
struct Gpu
{
  uint64_t* words;  // [0] counter, [1] flag, [2] timed out
  char* slots;      // 2 x kMaxBytes * 2 (a packet carries 8 data bytes in 16)
  float* in;
  float* out;
  cudaStream_t stream;
};

struct Peer
{
  uint64_t* flag;  // the peer's flag word, mapped here
  char* slots;     // the peer's packet slots, mapped here
};

__device__ __forceinline__ uint64_t globalTimerNs()
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void emptyKernel() {}

__global__ void counterKernel(uint64_t* words)
{
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(words) = *reinterpret_cast<volatile uint64_t*>(words) + 1;
}

__global__ void flagKernel(uint64_t* words, uint64_t* peerFlag)
{
  if (threadIdx.x != 0) return;
  const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(words) + 1;
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peerFlag), "l"(epoch) : "memory");
  const uint64_t start = globalTimerNs();
  for (uint32_t spins = 0;; spins++) {
    uint64_t seen;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(words + 1) : "memory");
    if (seen >= epoch) break;
    if ((spins & 1023) == 1023 && globalTimerNs() - start > kTimeoutNs) {
      words[2] = 1;
      break;
    }
  }
  *reinterpret_cast<volatile uint64_t*>(words) = epoch;
}

__global__ void packetKernel(uint64_t* words, const char* mySlots, char* peerSlots, const float* in, float* out,
                             uint64_t units)
{
  const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(words) + 1;
  const uint32_t flag = static_cast<uint32_t>(epoch);
  const uint64_t slot = (epoch & 1) * kMaxBytes * 2;
  const uint64_t* in64 = reinterpret_cast<const uint64_t*>(in);
  for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
    const uint64_t v = in64[i];
    char* p = peerSlots + slot + i * 16;
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(static_cast<uint32_t>(v)), "r"(flag),
                 "r"(static_cast<uint32_t>(v >> 32)), "r"(flag)
                 : "memory");
  }
  bool gaveUp = false;
  for (uint64_t i = threadIdx.x; i < units && !gaveUp; i += blockDim.x) {
    const char* p = mySlots + slot + i * 16;
    uint32_t lo, f1, hi, f2;
    const uint64_t start = globalTimerNs();
    for (uint32_t spins = 0;; spins++) {
      asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(lo), "=r"(f1), "=r"(hi), "=r"(f2) : "l"(p));
      if (f1 == flag && f2 == flag) break;
      if ((spins & 1023) == 1023 && globalTimerNs() - start > kTimeoutNs) {
        words[2] = 1;
        gaveUp = true;
        break;
      }
    }
    float2 theirs, mine = reinterpret_cast<const float2*>(in)[i];
    const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
    memcpy(&theirs, &v, sizeof v);
    reinterpret_cast<float2*>(out)[i] = make_float2(mine.x + theirs.x, mine.y + theirs.y);
  }
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(words) = epoch;
}

enum class Kind { Empty, Counter, Flag, Packets };

struct Case
{
  const char* name;
  Kind kind;
  uint64_t bytes;
};

void launch(const Case& c, Gpu& g, const Peer& p)
{
  switch (c.kind) {
  case Kind::Empty:
    emptyKernel<<<1, 32, 0, g.stream>>>();
    break;
  case Kind::Counter:
    counterKernel<<<1, 32, 0, g.stream>>>(g.words);
    break;
  case Kind::Flag:
    flagKernel<<<1, 32, 0, g.stream>>>(g.words, p.flag);
    break;
  case Kind::Packets: {
    const uint64_t units = c.bytes / 8;
    const unsigned threads = static_cast<unsigned>(std::min<uint64_t>(512, (units + 31) / 32 * 32));
    packetKernel<<<1, threads, 0, g.stream>>>(g.words, g.slots, p.slots, g.in, g.out, units);
    break;
  }
  }
}

cudaGraphExec_t capture(const Case& c, int dev, Gpu& g, const Peer& p, int kernels)
{
  CHECK(cudaSetDevice(dev));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kernels; k++) launch(c, g, p);
  CHECK(cudaStreamEndCapture(g.stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  return exec;
}

void syncBoth(Gpu* g)
{
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaStreamSynchronize(g[d].stream));
  }
}

void failIfTimedOut(Gpu* g, const char* name)
{
  for (int d = 0; d < 2; d++) {
    uint64_t timedOut = 0;
    CHECK(cudaSetDevice(d));
    CHECK(cudaMemcpy(&timedOut, g[d].words + 2, sizeof timedOut, cudaMemcpyDeviceToHost));
    if (timedOut) {
      printf("FAIL graph_floor: %s: GPU %d waited more than 5 s for its peer\n", name, d);
      exit(1);
    }
  }
}

// Every output element on both GPUs equals the two inputs' sum (GPU d's input element i is i % 1024 + d).
void checkPackets(Gpu* g, const Case& c)
{
  const uint64_t n = c.bytes / 4;
  std::vector<float> out(n);
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaMemcpy(out.data(), g[d].out, c.bytes, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < n; i++) {
      const float want = 2.0f * static_cast<float>(i % 1024) + 1.0f;
      if (out[i] != want) {
        printf("FAIL graph_floor: %s: GPU %d element %llu is %g, not %g\n", c.name, d, (unsigned long long)i,
               out[i], want);
        exit(1);
      }
    }
  }
}

} // namespace

int main(int argc, char** argv)
{
  int kernels = 10, replays = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--kernels")) kernels = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--replays")) replays = atoi(argv[i + 1]);
  }
  if (kernels < 1 || replays < 1) {
    printf("FAIL graph_floor: --kernels and --replays take a positive count\n");
    return 1;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) {
    printf("SKIP graph_floor: needs 2 GPUs, found %d\n", gpus);
    return 0;
  }
  int reach01 = 0, reach10 = 0;
  CHECK(cudaDeviceCanAccessPeer(&reach01, 0, 1));
  CHECK(cudaDeviceCanAccessPeer(&reach10, 1, 0));
  if (!reach01 || !reach10) {
    printf("SKIP graph_floor: GPUs 0 and 1 cannot reach each other's memory\n");
    return 0;
  }

  Gpu g[2];
  Peer p[2];
  std::vector<float> host(kMaxBytes / 4);
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CHECK(cudaMalloc(&g[d].words, 3 * sizeof(uint64_t)));
    CHECK(cudaMemset(g[d].words, 0, 3 * sizeof(uint64_t)));
    CHECK(cudaMalloc(&g[d].slots, 4 * kMaxBytes));
    CHECK(cudaMemset(g[d].slots, 0, 4 * kMaxBytes));
    CHECK(cudaMalloc(&g[d].in, kMaxBytes));
    CHECK(cudaMalloc(&g[d].out, kMaxBytes));
    for (size_t i = 0; i < host.size(); i++) host[i] = static_cast<float>(i % 1024 + d);
    CHECK(cudaMemcpy(g[d].in, host.data(), kMaxBytes, cudaMemcpyHostToDevice));
    CHECK(cudaStreamCreateWithFlags(&g[d].stream, cudaStreamNonBlocking));
  }
  for (int d = 0; d < 2; d++) p[d] = Peer{g[1 - d].words + 1, g[1 - d].slots};

  const Case cases[] = {
    {"empty", Kind::Empty, 0},          {"counter", Kind::Counter, 0},
    {"flag", Kind::Flag, 0},            {"packets 8 B", Kind::Packets, 8},
    {"packets 1 KiB", Kind::Packets, 1 << 10}, {"packets 4 KiB", Kind::Packets, 4 << 10},
    {"packets 16 KiB", Kind::Packets, 16 << 10},
  };
  printf("graph_floor: a graph of %d kernels on each of 2 GPUs, replayed %d times side by side; us per kernel, "
         "median of %d (min - max)\n",
         kernels, replays, kRepeats);
  for (const Case& c : cases) {
    cudaGraphExec_t exec[2];
    for (int d = 0; d < 2; d++) exec[d] = capture(c, d, g[d], p[d], kernels);
    // Warm up (and, for the packets, check): the graphs' first replays upload them.
    for (int r = 0; r < 5; r++) {
      for (int d = 0; d < 2; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaGraphLaunch(exec[d], g[d].stream));
      }
    }
    syncBoth(g);
    failIfTimedOut(g, c.name);
    if (c.kind == Kind::Packets) checkPackets(g, c);
    std::vector<double> us;
    for (int rep = 0; rep < kRepeats; rep++) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < replays; r++) {
        for (int d = 0; d < 2; d++) {
          CHECK(cudaSetDevice(d));
          CHECK(cudaGraphLaunch(exec[d], g[d].stream));
        }
      }
      syncBoth(g);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      us.push_back(s * 1e6 / (static_cast<double>(kernels) * replays));
    }
    failIfTimedOut(g, c.name);
    if (c.kind == Kind::Packets) checkPackets(g, c);
    std::sort(us.begin(), us.end());
    printf("graph_floor %-15s %6.2f us per kernel (%.2f - %.2f)\n", c.name, us[kRepeats / 2], us.front(), us.back());
    for (int d = 0; d < 2; d++) CHECK(cudaGraphExecDestroy(exec[d]));
  }
  for (int d = 0; d < 2; d++) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaFree(g[d].words));
    CHECK(cudaFree(g[d].slots));
    CHECK(cudaFree(g[d].in));
    CHECK(cudaFree(g[d].out));
    CHECK(cudaStreamDestroy(g[d].stream));
  }
  return 0;
}
