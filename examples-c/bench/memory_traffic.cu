// How fast SM kernels move memory between two processes that share one GPU (two ranks under MPS), laid out
// as the zero-copy kernels could lay it out, against the copy engine: the probe behind the zero-copy
// kernels' layout (docs/PERFORMANCE-HISTORY.md, zero-copy). Two processes (fork before CUDA), each a rank with an
// input and an output of `bytes`, each mapping the other's through CUDA IPC. Cases (N = bytes, traffic =
// bytes read and written by both ranks together):
//   ce_pull      the copy engine copies the peer's input into this rank's output (4 N)
//   ag_pull      an SM kernel does the same (4 N); ag_push writes this rank's input into the peer's output
//   ar_pull2     all-reduce in two pulls: reduce this rank's half of both inputs into its output, then copy
//                the peer's half from the peer's output (5 N)
//   ar_push      all-reduce in one pass: reduce this rank's half of both inputs into both outputs (4 N)
//   rs_pull      reduce this rank's half of both inputs into its output (3 N)
// each with a contiguous part of the units per block ("chunk") and grid-stride ("stride"), one 16-byte unit
// per thread at a time, 1024 threads, as many blocks as half the GPU holds. The data is not checked (the
// kernels do not wait for each other): this times memory traffic only. Run it under MPS:
//
//   memory_traffic [bytes, default 1 GiB] [iterations, default 8]
#define BENCH_NAME "memory_traffic"
#include "bench_check.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>

namespace {

constexpr int kThreads = 1024;

struct Buffers {
  const uint4* in;    // this rank's input
  uint4* out;         // this rank's output
  const uint4* peerIn;
  uint4* peerOut;
  uint64_t units;
  int rank;
  int kind;
  bool stride;
};

enum Kind { kAgPull, kAgPush, kArPull2, kArPush, kRsPull, kKinds };
const char* kNames[kKinds] = {"ag_pull", "ag_push", "ar_pull2", "ar_push", "rs_pull"};
const double kTraffic[kKinds] = {4, 4, 5, 4, 3};

__device__ uint4 add(uint4 a, uint4 b)
{
  float* x = reinterpret_cast<float*>(&a);
  const float* y = reinterpret_cast<const float*>(&b);
  for (int i = 0; i < 4; i++) x[i] += y[i];
  return a;
}

// step(j) for this block's units of [begin, end).
template <typename Step>
__device__ void each(uint64_t begin, uint64_t end, bool stride, Step step)
{
  if (stride) {
    for (uint64_t j = begin + uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < end; j += uint64_t(gridDim.x) * blockDim.x)
      step(j);
  } else {
    const uint64_t per = (end - begin + gridDim.x - 1) / gridDim.x;
    const uint64_t first = begin + per * blockIdx.x, last = first + per < end ? first + per : end;
    for (uint64_t j = first + threadIdx.x; j < last; j += blockDim.x) step(j);
  }
}

__global__ void __launch_bounds__(kThreads) traffic(Buffers b)
{
  const uint64_t half = b.units / 2, mine = b.rank * half, other = (1 - b.rank) * half;
  switch (b.kind) {
  case kAgPull: each(0, b.units, b.stride, [&](uint64_t j) { b.out[j] = b.peerIn[j]; }); break;
  case kAgPush: each(0, b.units, b.stride, [&](uint64_t j) { b.peerOut[j] = b.in[j]; }); break;
  case kArPull2:
    each(mine, mine + half, b.stride, [&](uint64_t j) { b.out[j] = add(b.in[j], b.peerIn[j]); });
    each(other, other + half, b.stride, [&](uint64_t j) { b.out[j] = b.peerOut[j]; });
    break;
  case kArPush:
    each(mine, mine + half, b.stride, [&](uint64_t j) {
      const uint4 v = add(b.in[j], b.peerIn[j]);
      b.out[j] = v;
      b.peerOut[j] = v;
    });
    break;
  case kRsPull: each(mine, mine + half, b.stride, [&](uint64_t j) { b.out[j] = add(b.in[j], b.peerIn[j]); }); break;
  }
}

int gToPeer = -1, gFromPeer = -1;

void barrier()
{
  char c = 0;
  if (write(gToPeer, &c, 1) != 1 || read(gFromPeer, &c, 1) != 1) {
    printf("FAIL memory_traffic: the other process is gone\n");
    exit(1);
  }
}

// Both ranks start together and the time ends when both are done: µs per iteration.
template <typename Launch>
double timed(cudaStream_t s, int iterations, Launch launch)
{
  launch();
  CHECK(cudaStreamSynchronize(s));
  barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; i++) launch();
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaGetLastError());
  barrier();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iterations;
}

}  // namespace

int main(int argc, char** argv)
{
  const uint64_t bytes = argc > 1 ? strtoull(argv[1], nullptr, 0) / 32 * 32 : 1ull << 30;
  const int iterations = argc > 2 ? atoi(argv[2]) : 8;
  int toChild[2], toParent[2], handles[2][2];
  if (pipe(toChild) || pipe(toParent) || pipe(handles[0]) || pipe(handles[1])) return 1;
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  gToPeer = rank == 0 ? toChild[1] : toParent[1];
  gFromPeer = rank == 0 ? toParent[0] : toChild[0];

  CHECK(cudaSetDevice(0));
  int multiprocessors = 0;
  CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0));
  uint4 *in = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemset(in, 1, bytes));
  CHECK(cudaMemset(out, 0, bytes));
  cudaIpcMemHandle_t mine[2], theirs[2];
  CHECK(cudaIpcGetMemHandle(&mine[0], in));
  CHECK(cudaIpcGetMemHandle(&mine[1], out));
  if (write(handles[rank][1], mine, sizeof mine) != sizeof mine ||
      read(handles[1 - rank][0], theirs, sizeof theirs) != sizeof theirs) {
    printf("FAIL memory_traffic: exchanging IPC handles\n");
    return 1;
  }
  void *peerIn = nullptr, *peerOut = nullptr;
  CHECK(cudaIpcOpenMemHandle(&peerIn, theirs[0], cudaIpcMemLazyEnablePeerAccess));
  CHECK(cudaIpcOpenMemHandle(&peerOut, theirs[1], cudaIpcMemLazyEnablePeerAccess));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int perMultiprocessor = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perMultiprocessor, traffic, kThreads, 0));
  const int blocks = perMultiprocessor * multiprocessors / 2;

  const double ce = timed(s, iterations, [&] { CHECK(cudaMemcpyAsync(out, peerIn, bytes, cudaMemcpyDeviceToDevice, s)); });
  if (rank == 0) {
    printf("memory_traffic: %llu bytes per rank, 2 ranks on one GPU, %d blocks of %d threads per rank\n",
           (unsigned long long)bytes, blocks, kThreads);
    printf("RESULT case=ce_pull layout=- us=%.1f traffic_gbs=%.0f\n", ce, 4.0 * bytes / ce / 1e3);
  }
  Buffers b{in, out, static_cast<const uint4*>(peerIn), static_cast<uint4*>(peerOut), bytes / 16, rank, 0, false};
  for (int kind = 0; kind < kKinds; kind++) {
    for (bool stride : {false, true}) {
      b.kind = kind;
      b.stride = stride;
      const double us = timed(s, iterations, [&] { traffic<<<blocks, kThreads, 0, s>>>(b); });
      if (rank == 0) {
        printf("RESULT case=%s layout=%s us=%.1f traffic_gbs=%.0f\n", kNames[kind], stride ? "stride" : "chunk", us,
               kTraffic[kind] * bytes / us / 1e3);
      }
    }
  }
  barrier();
  if (rank == 0) {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      printf("FAIL memory_traffic: rank 1 ended with status %d\n", status);
      return 1;
    }
  }
  return 0;
}
