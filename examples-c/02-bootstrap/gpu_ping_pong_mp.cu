// gpu_ping_pong_mp.cu: the ping-pong of 01-ping-pong with one process per GPU.
//
// The parent process forks one child per GPU and waits for them; it never touches CUDA, because CUDA
// does not survive fork(). The children meet in one of two ways:
//   - by address (default): rank 0 listens at <ip>:<port> and rank 1 connects there;
//   - by unique id (--unique-id): the parent calls mscclppGetUniqueId() before forking, which starts a
//     bootstrap root inside the parent; fork() copies the id into both children, which pass it to
//     mscclppCommInitRankFromId(). (Across machines, send the id with MPI_Bcast or a file instead.)
// Then each child connects to the other rank, starts its proxy and launches a one-thread kernel:
//   GPU 0: wait, spin ~10M cycles, signal        GPU 1: signal, wait        (100 times)
// GPU 1 checks that it waited more than 1 ms per iteration.
//
// Usage: gpu_ping_pong_mp [--ip A] [--port N] [--unique-id] [--iters N]
#include "../common/example_common.h"

#include <string>

using example::die;
using example::say;

constexpr long long kSpinCycles = 10000000; // about 5 ms at 2 GHz
constexpr size_t kBuffBytes = 4096;         // a connection needs a buffer; ping-pong moves no data
constexpr double kKernelDeadlineSec = 20; // the host's limit for one kernel, plus 50 ms per iteration

struct KernelStatus
{
  int failedIter;                // 1-based iteration whose wait timed out; 0 if none did
  unsigned long long minWaitNs;  // GPU 1: its shortest wait for GPU 0's answer
};

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
    if (!example::waitWithTimeout(conn)) {
      status->failedIter = i + 1;
      return;
    }
    spinCycles(kSpinCycles);
    conn.signal();
  }
  conn.flush(); // the proxy has handled every signal before the kernel ends
}

__global__ void gpuKernel1(mscclppDevConn conn, int iters, KernelStatus* status)
{
  if (threadIdx.x + blockIdx.x * blockDim.x != 0) return;
  unsigned long long minWait = ~0ull;
  for (int i = 0; i < iters; ++i) {
    conn.signal();
    const uint64_t t0 = example::globalTimerNs();
    if (!example::waitWithTimeout(conn)) {
      status->failedIter = i + 1;
      return;
    }
    const unsigned long long waited = example::globalTimerNs() - t0;
    if (waited < minWait) minWait = waited;
  }
  status->minWaitNs = minWait;
  conn.flush();
}

struct Options
{
  std::string ip = "127.0.0.1";
  int port = 50505;
  bool uniqueId = false;
  int iters = 100;
};

// One child process: rank `rank` on GPU `rank`.
static int runRank(int rank, const Options& opt, const mscclppUniqueId& id)
{
  example::armAlarm(60 + opt.iters / 10);
  const int gpu = rank;
  const int peer = 1 - rank;

  int nGpus = 0;
  CUDA_CHECK(cudaGetDeviceCount(&nGpus));
  if (nGpus < 2) die("At least two GPUs are required (found %d)", nGpus);
  if (rank == 0) {
    int canAccess = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&canAccess, 0, 1));
    if (!canAccess) die("GPU 0 cannot access GPU 1");
  }
  // The communicator works on the GPU current on the thread that creates it.
  CUDA_CHECK(cudaSetDevice(gpu));
  CUDA_CHECK(cudaFree(nullptr));

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

  mscclppComm_t comm;
  if (opt.uniqueId) {
    say("GPU %d: Initializing a communicator from the unique id ...", gpu);
    MSCCLPP_CHECK(mscclppCommInitRankFromId(&comm, 2, id, rank));
  } else {
    const std::string address = opt.ip + ":" + std::to_string(opt.port);
    say("GPU %d: Initializing a communicator at %s ...", gpu, address.c_str());
    MSCCLPP_CHECK(mscclppCommInitRank(&comm, 2, address.c_str(), rank));
  }
  int myRank = -1, nRanks = -1;
  MSCCLPP_CHECK(mscclppCommRank(comm, &myRank));
  MSCCLPP_CHECK(mscclppCommSize(comm, &nRanks));
  if (myRank != rank || nRanks != 2) die("GPU %d: the communicator says rank %d of %d", gpu, myRank, nRanks);

  say("GPU %d: Creating a connection ...", gpu);
  MSCCLPP_CHECK(mscclppConnect(comm, peer, /*tag*/ 0, buff, kBuffBytes, mscclppTransportP2P));
  MSCCLPP_CHECK(mscclppConnectionSetup(comm)); // exchanges what the peer needs; ends with a barrier

  mscclppDevConn_t* devConns = nullptr;
  int nConns = 0;
  MSCCLPP_CHECK(mscclppGetAllDeviceConnections(comm, &devConns, &nConns));
  if (nConns != 1) die("GPU %d: expected 1 connection, got %d", gpu, nConns);
  mscclppDevConn conn = devConns[0];

  say("GPU %d: Launching the proxy ...", gpu);
  MSCCLPP_CHECK(mscclppProxyLaunch(comm));
  MSCCLPP_CHECK(mscclppBootstrapBarrier(comm)); // both kernels start together

  say("GPU %d: Launching a GPU kernel ...", gpu);
  CUDA_CHECK(cudaEventRecord(start, stream));
  if (rank == 0) {
    gpuKernel0<<<1, 1, 0, stream>>>(conn, opt.iters, status);
  } else {
    gpuKernel1<<<1, 1, 0, stream>>>(conn, opt.iters, status);
  }
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaEventRecord(stop, stream));
  char what[32];
  snprintf(what, sizeof(what), "GPU %d", gpu);
  example::waitForEvent(stop, kKernelDeadlineSec + 0.05 * opt.iters, what);

  KernelStatus st;
  CUDA_CHECK(cudaMemcpyAsync(&st, status, sizeof(st), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (st.failedIter != 0) {
    die("GPU %d: no signal from rank %d within %.0f s (iteration %d of %d)", gpu, peer,
        example::kWaitTimeoutNs / 1e9, st.failedIter, opt.iters);
  }
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));

  MSCCLPP_CHECK(mscclppProxyStop(comm)); // a barrier first: the peer is done too
  MSCCLPP_CHECK(mscclppCommDestroy(comm));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(status));
  CUDA_CHECK(cudaFree(buff));

  if (rank == 1) {
    const float msPerIter = ms / opt.iters;
    say("Elapsed %g ms per iteration (%d)", msPerIter, opt.iters);
    if (msPerIter < 1.0f) {
      die("GPU 1 took only %g ms per iteration; it should wait more than 1 ms for GPU 0 each time", msPerIter);
    }
    if (st.minWaitNs < 1000000ull) {
      die("GPU 1's shortest wait was %.3f ms; every wait should span GPU 0's spin (more than 1 ms)",
          st.minWaitNs / 1e6);
    }
  }
  return 0;
}

static void usage(const char* prog)
{
  fprintf(stderr,
          "usage: %s [--ip A] [--port N] [--unique-id] [--iters N]\n"
          "  --ip A       address rank 0 listens at (default 127.0.0.1)\n"
          "  --port N     port rank 0 listens at (default 50505)\n"
          "  --unique-id  meet through mscclppGetUniqueId() instead of --ip/--port\n"
          "  --iters N    ping-pong rounds (default 100)\n",
          prog);
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ip" && i + 1 < argc) {
      opt.ip = argv[++i];
    } else if (arg == "--port" && i + 1 < argc) {
      opt.port = (int)example::parseNumber(argv[++i], "--port", 1, 65535);
    } else if (arg == "--unique-id") {
      opt.uniqueId = true;
    } else if (arg == "--iters" && i + 1 < argc) {
      opt.iters = (int)example::parseNumber(argv[++i], "--iters", 1, 100000);
    } else {
      usage(argv[0]);
      return arg == "-h" || arg == "--help" ? 0 : 2;
    }
  }

  // The id names a bootstrap root that now runs in this (parent) process; creating it needs no GPU.
  mscclppUniqueId id;
  memset(&id, 0, sizeof(id));
  if (opt.uniqueId) MSCCLPP_CHECK(mscclppGetUniqueId(&id));

  const bool ok = example::runRanks(2, 70 + opt.iters / 10, [&](int rank) { return runRank(rank, opt, id); });
  if (!ok) {
    fprintf(stderr, "ERROR: ping-pong failed (see above)\n");
    return 1;
  }
  say("Succeed!");
  return 0;
}
