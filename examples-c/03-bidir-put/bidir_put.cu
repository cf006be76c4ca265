// bidir_put.cu: both GPUs put data into each other at the same time, through their proxies.
//
// Each rank's buffer holds two ranges of copyBytes: rank r owns [r*copyBytes, (r+1)*copyBytes) and puts it
// into the same range of the peer's buffer. One GPU thread per rank runs, per iteration:
//   signal(); wait();                      both sides are ready
//   putWithSignal(range, range, bytes);    the proxy copies the range, then raises the peer's epoch
//   wait();                                the peer's range has arrived here
// and flush() at the end, after which the source range may be reused. The example times this for 1 KiB,
// 1 MiB and 128 MiB, then checks every byte of the buffer: the peer's range holds the peer's data, our own
// range is intact, and nothing beyond them was written.
//
// Usage:
//   bidir_put [--port N]                              forks ranks 0 and 1 on GPUs 0 and 1, P2P transport,
//                                                     meeting at 127.0.0.1:N (default 50505)
//   bidir_put <ip_port> <rank> <gpu_id> <transport>   runs one rank; transport is P2P or IB<n>, where IB<n>
//                                                     uses the InfiniBand device named by the environment
//                                                     variable MSCCLPP_IB_DEV_<n>, or mlx5_<n>
#include "../common/example_common.h"

#include <string>
#include <vector>

using example::die;
using example::say;

constexpr uint64_t kMaxCopyBytes = 128ull << 20;
constexpr uint64_t kBuffBytes = 2 * kMaxCopyBytes;
constexpr uint8_t kSentinel = 0xA5; // what every byte that nobody should write holds
constexpr double kKernelDeadlineSec = 20;

struct TestSize
{
  uint64_t bytes;
  int iters;
};
constexpr TestSize kSizes[] = {{1ull << 10, 1000}, {1ull << 20, 500}, {128ull << 20, 50}};
constexpr int kWarmupIters = 10;

// The byte rank `rank` puts at buffer offset i in the test with `salt`; never the sentinel.
__host__ __device__ inline uint8_t patternByte(int rank, uint32_t salt, uint64_t i)
{
  uint64_t x = i * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(rank + 1) << 56) ^ ((uint64_t)salt << 40);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  const uint8_t b = (uint8_t)(x >> 24);
  return b == kSentinel ? (uint8_t)(b ^ 0x5A) : b;
}

// Our own range gets our data; everything else, including where the peer's data will land, the sentinel.
__global__ void fillKernel(uint8_t* buff, uint64_t n, int rank, uint64_t copyBytes, uint32_t salt)
{
  const uint64_t lo = (uint64_t)rank * copyBytes, hi = lo + copyBytes;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    buff[i] = (i >= lo && i < hi) ? patternByte(rank, salt, i) : kSentinel;
  }
}

// `failed` gets the 1-based number of the wait that timed out.
__global__ void bidirPutKernel(mscclppDevConn conn, uint64_t copyBytes, int rank, int iters, int* failed)
{
  if (threadIdx.x + blockIdx.x * blockDim.x != 0) return;
  const uint64_t offset = (uint64_t)rank * copyBytes;
  for (int i = 0; i < iters; ++i) {
    conn.signal();
    if (!example::waitWithTimeout(conn)) {
      *failed = 2 * i + 1;
      return;
    }
    conn.putWithSignal(offset, offset, copyBytes);
    if (!example::waitWithTimeout(conn)) {
      *failed = 2 * i + 2;
      return;
    }
  }
  conn.flush();
}

struct RankArgs
{
  std::string ipPort;
  int rank = 0;
  int gpu = 0;
  mscclppTransport_t transport = mscclppTransportP2P;
  std::string ibDev; // for mscclppTransportIB
  bool checkPeerAccess = false;
};

// Runs the kernel once and waits for it; ends the process if a wait timed out.
static void runKernel(const RankArgs& a, const mscclppDevConn& conn, uint64_t copyBytes, int iters, int* failed,
                      cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop)
{
  CUDA_CHECK(cudaMemsetAsync(failed, 0, sizeof(int), stream));
  CUDA_CHECK(cudaEventRecord(start, stream));
  bidirPutKernel<<<1, 1, 0, stream>>>(conn, copyBytes, a.rank, iters, failed);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaEventRecord(stop, stream));
  char what[48];
  snprintf(what, sizeof(what), "GPU %d: bidirPutKernel", a.gpu);
  example::waitForEvent(stop, kKernelDeadlineSec, what);
  int f = 0;
  CUDA_CHECK(cudaMemcpyAsync(&f, failed, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (f != 0) {
    die("GPU %d: bytes %llu: wait %d of %d got no signal from the peer within %.0f s", a.gpu,
        (unsigned long long)copyBytes, f, 2 * iters, example::kWaitTimeoutNs / 1e9);
  }
}

// Checks every byte of the buffer after the test of `copyBytes` with `salt`.
static void verify(const RankArgs& a, const std::vector<uint8_t>& host, uint64_t copyBytes, uint32_t salt)
{
  const int peer = 1 - a.rank;
  const uint64_t ownLo = (uint64_t)a.rank * copyBytes, peerLo = (uint64_t)peer * copyBytes;
  uint64_t bad = 0, firstBad = 0;
  uint8_t firstWant = 0, firstGot = 0;
  for (uint64_t i = 0; i < host.size(); ++i) {
    uint8_t want = kSentinel;
    if (i >= ownLo && i < ownLo + copyBytes) {
      want = patternByte(a.rank, salt, i);
    } else if (i >= peerLo && i < peerLo + copyBytes) {
      want = patternByte(peer, salt, i);
    }
    if (host[i] != want) {
      if (bad == 0) {
        firstBad = i;
        firstWant = want;
        firstGot = host[i];
      }
      ++bad;
    }
  }
  if (bad != 0) {
    const char* where = (firstBad >= peerLo && firstBad < peerLo + copyBytes) ? "the peer's range"
                        : (firstBad >= ownLo && firstBad < ownLo + copyBytes) ? "our own range"
                                                                              : "outside both ranges";
    die("GPU %d: bytes %llu: %llu wrong byte(s); the first at offset %llu (%s): 0x%02x, expected 0x%02x", a.gpu,
        (unsigned long long)copyBytes, (unsigned long long)bad, (unsigned long long)firstBad, where, firstGot,
        firstWant);
  }
}

// One rank: joins the job, connects to the other rank, runs the three sizes.
static int runRank(const RankArgs& a)
{
  example::armAlarm(90);
  const int peer = 1 - a.rank;

  int nGpus = 0;
  CUDA_CHECK(cudaGetDeviceCount(&nGpus));
  if (a.gpu >= nGpus) die("GPU %d does not exist (found %d GPU(s))", a.gpu, nGpus);
  if (a.checkPeerAccess) {
    if (nGpus < 2) die("At least two GPUs are required (found %d)", nGpus);
    int canAccess = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&canAccess, 0, 1));
    if (!canAccess) die("GPU 0 cannot access GPU 1");
  }
  CUDA_CHECK(cudaSetDevice(a.gpu)); // the communicator works on this GPU
  CUDA_CHECK(cudaFree(nullptr));

  uint8_t* buff = nullptr;
  int* failed = nullptr;
  cudaStream_t stream;
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaMalloc(&buff, kBuffBytes));
  CUDA_CHECK(cudaMalloc(&failed, sizeof(int)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<uint8_t> host(kBuffBytes);

  mscclppComm_t comm;
  MSCCLPP_CHECK(mscclppCommInitRank(&comm, 2, a.ipPort.c_str(), a.rank));
  MSCCLPP_CHECK(mscclppConnect(comm, peer, /*tag*/ 0, buff, kBuffBytes, a.transport,
                               a.transport == mscclppTransportIB ? a.ibDev.c_str() : nullptr));
  MSCCLPP_CHECK(mscclppConnectionSetup(comm));
  mscclppDevConn_t* devConns = nullptr;
  int nConns = 0;
  MSCCLPP_CHECK(mscclppGetAllDeviceConnections(comm, &devConns, &nConns));
  if (nConns != 1) die("GPU %d: expected 1 connection, got %d", a.gpu, nConns);
  const mscclppDevConn conn = devConns[0];
  MSCCLPP_CHECK(mscclppProxyLaunch(comm));

  say("GPU %d: Preparing for tests ...", a.gpu);
  uint32_t salt = 0;
  for (const TestSize& size : kSizes) {
    ++salt;
    fillKernel<<<1024, 512, 0, stream>>>(buff, kBuffBytes, a.rank, size.bytes, salt);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // Both buffers are filled before either side puts anything.
    MSCCLPP_CHECK(mscclppBootstrapBarrier(comm));

    runKernel(a, conn, size.bytes, kWarmupIters, failed, stream, start, stop);
    MSCCLPP_CHECK(mscclppBootstrapBarrier(comm)); // start the timed runs together
    runKernel(a, conn, size.bytes, size.iters, failed, stream, start, stop);
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));

    CUDA_CHECK(cudaMemcpyAsync(host.data(), buff, kBuffBytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    verify(a, host, size.bytes, salt);

    const double msPerIter = ms / size.iters;
    if (a.rank == 0) {
      say("GPU %d: [Bidir PutWithSignal] bytes %llu, elapsed %g ms/iter, BW %g GB/s", a.gpu,
          (unsigned long long)size.bytes, msPerIter, size.bytes / (msPerIter * 1e6));
    }
    // No peer writes into our buffer again before the next fill: its last put arrived before our last wait
    // returned, and its next one comes after the barrier that follows the fill.
  }

  MSCCLPP_CHECK(mscclppProxyStop(comm)); // a barrier first: the peer is done too
  MSCCLPP_CHECK(mscclppCommDestroy(comm));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(failed));
  CUDA_CHECK(cudaFree(buff));
  return 0;
}

static void usage(const char* prog)
{
  fprintf(stderr,
          "usage: %s [--port N]                              ranks 0 and 1 on GPUs 0 and 1 of this machine\n"
          "       %s <ip_port> <rank> <gpu_id> <transport>   one rank; transport P2P or IB<n>\n"
          "  IB<n> uses the InfiniBand device named by $MSCCLPP_IB_DEV_<n>, or mlx5_<n>\n",
          prog, prog);
}

// "P2P" or "IB<n>".
static void parseTransport(const char* text, RankArgs* a)
{
  const std::string t = text;
  if (t == "P2P") {
    a->transport = mscclppTransportP2P;
    return;
  }
  if (t.size() > 2 && t.compare(0, 2, "IB") == 0) {
    const long n = example::parseNumber(t.c_str() + 2, "the number after IB", 0, 1023);
    const std::string var = "MSCCLPP_IB_DEV_" + std::to_string(n);
    const char* dev = getenv(var.c_str());
    a->transport = mscclppTransportIB;
    a->ibDev = (dev && *dev) ? dev : "mlx5_" + std::to_string(n);
    return;
  }
  die("transport must be P2P or IB<n>, not \"%s\"", text);
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 2 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) {
    usage(argv[0]);
    return 0;
  }

  if (argc == 5) {
    RankArgs a;
    a.ipPort = argv[1];
    a.rank = (int)example::parseNumber(argv[2], "rank", 0, 1);
    a.gpu = (int)example::parseNumber(argv[3], "gpu_id", 0, 1023);
    parseTransport(argv[4], &a);
    runRank(a);
    say("Succeed!");
    return 0;
  }

  int port = 50505;
  if (argc == 3 && std::string(argv[1]) == "--port") {
    port = (int)example::parseNumber(argv[2], "--port", 1, 65535);
  } else if (argc != 1) {
    usage(argv[0]);
    return 2;
  }
  const bool ok = example::runRanks(2, 100, [&](int rank) {
    RankArgs a;
    a.ipPort = "127.0.0.1:" + std::to_string(port);
    a.rank = rank;
    a.gpu = rank;
    a.checkPeerAccess = true;
    return runRank(a);
  });
  if (!ok) {
    fprintf(stderr, "ERROR: bidirectional put failed (see above)\n");
    return 1;
  }
  say("Succeed!");
  return 0;
}
