// gpu_ping_pong.cu: two GPUs in one process play ping-pong with signal() and wait().
//
// Two communicators, ranks 0 and 1 of one job, live in this process, one host thread each. Each thread
// picks its GPU, joins the job at 127.0.0.1:<port>, connects to the other rank, starts its proxy and
// launches a one-thread kernel:
//   GPU 0: wait for GPU 1's signal, spin ~10M cycles (a few ms), signal back   (100 times)
//   GPU 1: signal GPU 0, wait for its answer                                   (100 times)
// GPU 1 therefore waits for GPU 0's spin in every iteration; the example checks that it did (more than
// 1 ms per iteration), which shows that the signals really order the two GPUs.
//
// The library notices that the peer lives in the same process and uses its memory directly (CUDA IPC
// cannot open a process's own allocations). With --same-gpu both communicators use GPU 0.
//
// Usage: gpu_ping_pong [--same-gpu] [--port N] [--iters N]
#include "../common/example_common.h"

#include <algorithm>
#include <string>
#include <thread>

using example::die;
using example::say;

constexpr long long kSpinCycles = 10000000; // about 5 ms at 2 GHz
constexpr size_t kBuffBytes = 4096;         // a connection needs a buffer; ping-pong moves no data
constexpr double kKernelDeadlineSec = 20;   // the host's limit for one kernel, plus 50 ms per iteration

// What a kernel reports back.
struct KernelStatus
{
  int failedIter;                // 1-based iteration whose wait timed out; 0 if none did
  unsigned long long minWaitNs;  // GPU 1: its shortest wait for GPU 0's answer
};

// With the proxy-free extension the GPU raises the peer's epoch itself; otherwise it asks its proxy to.
__device__ __forceinline__ void pingSignal(mscclppDevConn& conn)
{
#ifdef MSCCLPP_HAS_DIRECT_METHODS
  conn.directSignal();
#else
  conn.signal();
#endif
}

// Waits (with a deadline) for the peer's next signal, of the same kind pingSignal() sends.
__device__ __forceinline__ bool pingWait(mscclppDevConn& conn)
{
#ifdef MSCCLPP_HAS_DIRECT_METHODS
  const uint64_t start = example::globalTimerNs();
  while (!conn.directPoll()) {
    if (example::globalTimerNs() - start > example::kWaitTimeoutNs) return false;
  }
  conn.directWait();
  return true;
#else
  return example::waitWithTimeout(conn);
#endif
}

// Before the kernel ends: every signal has left (with the proxy, flush() waits until it has handled
// them), so the peer's memory is not touched once the ranks start tearing down.
__device__ __forceinline__ void finishSignals(mscclppDevConn& conn)
{
#ifdef MSCCLPP_HAS_DIRECT_METHODS
  (void)conn;
  __threadfence_system();
#else
  conn.flush();
#endif
}

__device__ void spinCycles(long long cycles)
{
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void gpuKernel0(mscclppDevConn conn, int iters, KernelStatus* status)
{
  if (threadIdx.x + blockIdx.x * blockDim.x != 0) return;
  for (int i = 0; i < iters; ++i) {
    if (!pingWait(conn)) {
      status->failedIter = i + 1;
      return;
    }
    spinCycles(kSpinCycles);
    pingSignal(conn);
  }
  finishSignals(conn);
}

__global__ void gpuKernel1(mscclppDevConn conn, int iters, KernelStatus* status)
{
  if (threadIdx.x + blockIdx.x * blockDim.x != 0) return;
  unsigned long long minWait = ~0ull;
  for (int i = 0; i < iters; ++i) {
    pingSignal(conn);
    const uint64_t t0 = example::globalTimerNs();
    if (!pingWait(conn)) {
      status->failedIter = i + 1;
      return;
    }
    const unsigned long long waited = example::globalTimerNs() - t0;
    if (waited < minWait) minWait = waited;
  }
  status->minWaitNs = minWait;
  finishSignals(conn);
}

struct Options
{
  bool sameGpu = false;
  int port = 50505;
  int iters = 100;
};

struct RankResult
{
  float msPerIter = 0;
  unsigned long long minWaitNs = 0;
};

// Everything one rank does, on its own host thread.
static void runRank(int rank, const Options& opt, RankResult* result)
{
  const int gpu = opt.sameGpu ? 0 : rank;
  const int peer = 1 - rank;
  char label[32];
  if (opt.sameGpu) {
    snprintf(label, sizeof(label), "GPU %d (rank %d)", gpu, rank);
  } else {
    snprintf(label, sizeof(label), "GPU %d", gpu);
  }
  const std::string address = "127.0.0.1:" + std::to_string(opt.port);

  // The communicator works on the GPU current on the thread that creates it.
  CUDA_CHECK(cudaSetDevice(gpu));
  CUDA_CHECK(cudaFree(nullptr)); // makes sure the GPU's context exists and is current here
  example::preloadKernel(gpuKernel0);
  example::preloadKernel(gpuKernel1);

  // Everything is allocated before any kernel starts: cudaMalloc/cudaFree may wait for the whole GPU,
  // which, with both ranks on one GPU, would wait for the peer's kernel. The stream is non-blocking so
  // that it never waits for other work on the GPU either.
  void* buff = nullptr;
  KernelStatus* status = nullptr;
  cudaStream_t stream;
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaMalloc(&buff, kBuffBytes));
  CUDA_CHECK(cudaMalloc(&status, sizeof(KernelStatus)));
  CUDA_CHECK(cudaMemset(status, 0, sizeof(KernelStatus)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaDeviceSynchronize());

  say("%s: Initializing a communicator (rank %d of 2 at %s) ...", label, rank, address.c_str());
  mscclppComm_t comm;
  MSCCLPP_CHECK(mscclppCommInitRank(&comm, 2, address.c_str(), rank));

  say("%s: Connecting to rank %d ...", label, peer);
  MSCCLPP_CHECK(mscclppConnect(comm, peer, /*tag*/ 0, buff, kBuffBytes, mscclppTransportP2P));
  MSCCLPP_CHECK(mscclppConnectionSetup(comm)); // ends with a barrier: both ranks are connected

  mscclppDevConn_t* devConns = nullptr;
  int nConns = 0;
  MSCCLPP_CHECK(mscclppGetAllDeviceConnections(comm, &devConns, &nConns));
  if (nConns != 1) die("%s: expected 1 connection, got %d", label, nConns);
  mscclppDevConn conn = devConns[0]; // passed to the kernel by value: it only holds device pointers

  say("%s: Launching the proxy ...", label);
  MSCCLPP_CHECK(mscclppProxyLaunch(comm));
  // Both ranks are fully set up before either kernel starts (and they start together).
  MSCCLPP_CHECK(mscclppBootstrapBarrier(comm));

  say("%s: Launching gpuKernel%d ...", label, rank);
  CUDA_CHECK(cudaEventRecord(start, stream));
  if (rank == 0) {
    gpuKernel0<<<1, 1, 0, stream>>>(conn, opt.iters, status);
  } else {
    gpuKernel1<<<1, 1, 0, stream>>>(conn, opt.iters, status);
  }
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaEventRecord(stop, stream));
  example::waitForEvent(stop, kKernelDeadlineSec + 0.05 * opt.iters, label);

  KernelStatus st;
  CUDA_CHECK(cudaMemcpyAsync(&st, status, sizeof(st), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (st.failedIter != 0) {
    die("%s: no signal from rank %d within %.0f s (iteration %d of %d)", label, peer,
        example::kWaitTimeoutNs / 1e9, st.failedIter, opt.iters);
  }
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  result->msPerIter = ms / opt.iters;
  result->minWaitNs = st.minWaitNs;

  // ProxyStop begins with a barrier, so neither rank frees anything while the other still runs.
  MSCCLPP_CHECK(mscclppProxyStop(comm));
  MSCCLPP_CHECK(mscclppCommDestroy(comm));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(status));
  CUDA_CHECK(cudaFree(buff));
}

static void usage(const char* prog)
{
  fprintf(stderr,
          "usage: %s [--same-gpu] [--port N] [--iters N]\n"
          "  --same-gpu  both communicators on GPU 0 (default: GPU 0 and GPU 1)\n"
          "  --port N    bootstrap port on 127.0.0.1 (default 50505)\n"
          "  --iters N   ping-pong rounds (default 100)\n",
          prog);
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--same-gpu") {
      opt.sameGpu = true;
    } else if (arg == "--port" && i + 1 < argc) {
      opt.port = (int)example::parseNumber(argv[++i], "--port", 1, 65535);
    } else if (arg == "--iters" && i + 1 < argc) {
      opt.iters = (int)example::parseNumber(argv[++i], "--iters", 1, 100000);
    } else {
      usage(argv[0]);
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }
  example::armAlarm(60 + opt.iters / 10);
  // Load every kernel when the GPU's context starts (unless the user chose otherwise): with both ranks on
  // one GPU, loading a kernel lazily could wait for the other rank's kernel, which waits for this one.
  // runRank() also preloads its kernels, which is enough by itself; this is a second line of defence.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);

  int nGpus = 0;
  CUDA_CHECK(cudaGetDeviceCount(&nGpus));
  if (opt.sameGpu) {
    if (nGpus < 1) die("No GPU found");
  } else {
    if (nGpus < 2) die("At least two GPUs are required (found %d); --same-gpu runs on one", nGpus);
    int canAccess = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&canAccess, 0, 1));
    if (!canAccess) die("GPU 0 cannot access GPU 1");
  }
#ifdef MSCCLPP_HAS_DIRECT_METHODS
  say("Signals are written by the GPUs directly (no proxy involved)");
#else
  say("Signals go through each rank's proxy");
#endif

  RankResult results[2];
  std::thread t0(runRank, 0, std::cref(opt), &results[0]);
  std::thread t1(runRank, 1, std::cref(opt), &results[1]);
  t0.join();
  t1.join();

  const RankResult& r1 = results[1];
  say("Elapsed %g ms per iteration (%d)", r1.msPerIter, opt.iters);
  if (r1.msPerIter < 1.0f) {
    die("GPU 1 took only %g ms per iteration; it should wait more than 1 ms for GPU 0 each time",
        r1.msPerIter);
  }
  if (r1.minWaitNs < 1000000ull) {
    die("GPU 1's shortest wait was %.3f ms; every wait should span GPU 0's spin (more than 1 ms)",
        r1.minWaitNs / 1e6);
  }
  say("Succeed!");
  return 0;
}
