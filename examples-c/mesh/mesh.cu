// mesh.cu: N ranks, each connected to every other one, all-gather their chunks with putWithSignal.
//
// The parent forks one process per rank. Rank r uses GPU r % (number of GPUs), so there may be more ranks
// than GPUs (ranks that share a GPU reach each other's memory through CUDA IPC too). Each rank's buffer
// holds nranks chunks; chunk r belongs to rank r. Rank r:
//   - connects to every other rank over P2P (one connection each, the whole buffer, tag 0), sets them up
//     and copies the device connections into __constant__ memory, as the mesh tutorial does;
//   - runs a kernel with one thread per peer: putWithSignal(chunk r -> the peer's chunk r), flush(), then
//     wait() for that peer's chunk;
//   - checks every element of the buffer: chunk p holds rank p's data, for every p.
// It does this for two rounds with different data, which also shows that connections can be reused.
//
// Usage: mesh <nranks> [--port P]       (ranks meet at 127.0.0.1:P, default 50505)
#include "../common/example_common.h"

#include <string>
#include <vector>

using example::die;
using example::say;

constexpr int kMaxRanks = 64;                  // the data below keeps the rank in 6 bits
constexpr uint64_t kChunkElems = 256 * 1024;   // 1 MiB of uint32_t per rank
constexpr uint64_t kChunkBytes = kChunkElems * sizeof(uint32_t);
constexpr uint32_t kSentinel = 0xFFFFFFFFu;    // never produced by meshValue
constexpr int kRounds = 2;
constexpr double kKernelDeadlineSec = 20;

// One connection per peer, in connect order (the order of mscclppGetAllDeviceConnections).
__constant__ mscclppDevConn constDevConns[kMaxRanks - 1];

// Element i of rank `rank`'s chunk in `round`: the round, the rank and the index, so that data from the
// wrong round, rank or place is told apart.
__host__ __device__ inline uint32_t meshValue(int round, int rank, uint64_t i)
{
  return ((uint32_t)(round & 3) << 30) | ((uint32_t)(rank & 0x3f) << 24) | (uint32_t)(i & 0xffffff);
}

__global__ void fillKernel(uint32_t* buff, int nranks, int rank, int round)
{
  const uint64_t n = (uint64_t)nranks * kChunkElems;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t chunk = i / kChunkElems;
    buff[i] = chunk == (uint64_t)rank ? meshValue(round, rank, i % kChunkElems) : kSentinel;
  }
}

// Thread t serves peer connection t. `failed[t]` is set if that peer's signal never came.
__global__ void allGatherKernel(int rank, int nPeers, int* failed)
{
  const int t = threadIdx.x;
  if (t >= nPeers) return;
  mscclppDevConn conn = constDevConns[t];
  const uint64_t offset = (uint64_t)rank * kChunkBytes;
  conn.putWithSignal(offset, offset, kChunkBytes); // our chunk into the same place of the peer's buffer
  conn.flush();                                     // after this our chunk may be changed again
  if (!example::waitWithTimeout(conn)) failed[t] = 1; // the peer's chunk is here
}

static int runRank(int rank, int nranks, int port)
{
  example::armAlarm(60);
  int nGpus = 0;
  CUDA_CHECK(cudaGetDeviceCount(&nGpus));
  if (nGpus < 1) die("rank %d: no GPU found", rank);
  const int gpu = rank % nGpus;
  CUDA_CHECK(cudaSetDevice(gpu)); // the communicator works on this GPU
  CUDA_CHECK(cudaFree(nullptr));

  const uint64_t buffElems = (uint64_t)nranks * kChunkElems;
  const uint64_t buffBytes = buffElems * sizeof(uint32_t);
  const int nPeers = nranks - 1;
  uint32_t* buff = nullptr;
  int* failed = nullptr;
  cudaStream_t stream;
  cudaEvent_t done;
  CUDA_CHECK(cudaMalloc(&buff, buffBytes));
  CUDA_CHECK(cudaMalloc(&failed, nPeers * sizeof(int)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&done));
  std::vector<uint32_t> host(buffElems);

  const std::string address = "127.0.0.1:" + std::to_string(port);
  mscclppComm_t comm;
  MSCCLPP_CHECK(mscclppCommInitRank(&comm, nranks, address.c_str(), rank));
  std::vector<int> peers;
  for (int r = 0; r < nranks; ++r) {
    if (r == rank) continue;
    MSCCLPP_CHECK(mscclppConnect(comm, r, /*tag*/ 0, buff, buffBytes, mscclppTransportP2P));
    peers.push_back(r);
  }
  MSCCLPP_CHECK(mscclppConnectionSetup(comm));
  mscclppDevConn_t* devConns = nullptr;
  int nConns = 0;
  MSCCLPP_CHECK(mscclppGetAllDeviceConnections(comm, &devConns, &nConns));
  if (nConns != nPeers) die("rank %d: expected %d connections, got %d", rank, nPeers, nConns);
  for (int i = 0; i < nConns; ++i) {
    if (devConns[i].remoteRank != peers[i]) {
      die("rank %d: connection %d goes to rank %d, expected %d", rank, i, devConns[i].remoteRank, peers[i]);
    }
  }
  CUDA_CHECK(cudaMemcpyToSymbol(constDevConns, devConns, nConns * sizeof(mscclppDevConn)));
  MSCCLPP_CHECK(mscclppProxyLaunch(comm));
  say("Rank %d (GPU %d): connected to %d peers", rank, gpu, nPeers);

  for (int round = 1; round <= kRounds; ++round) {
    fillKernel<<<512, 512, 0, stream>>>(buff, nranks, rank, round);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(failed, 0, nPeers * sizeof(int), stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // Every rank has filled its buffer before anyone puts into it.
    MSCCLPP_CHECK(mscclppBootstrapBarrier(comm));

    allGatherKernel<<<1, nPeers, 0, stream>>>(rank, nPeers, failed);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(done, stream));
    char what[48];
    snprintf(what, sizeof(what), "rank %d: allGatherKernel", rank);
    example::waitForEvent(done, kKernelDeadlineSec, what);

    std::vector<int> f(nPeers);
    CUDA_CHECK(cudaMemcpyAsync(f.data(), failed, nPeers * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(host.data(), buff, buffBytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < nPeers; ++i) {
      if (f[i]) die("rank %d: round %d: no signal from rank %d within %.0f s", rank, round, peers[i],
                    example::kWaitTimeoutNs / 1e9);
    }
    uint64_t bad = 0, firstBad = 0;
    for (uint64_t i = 0; i < buffElems; ++i) {
      const uint32_t want = meshValue(round, (int)(i / kChunkElems), i % kChunkElems);
      if (host[i] != want) {
        if (bad == 0) firstBad = i;
        ++bad;
      }
    }
    if (bad != 0) {
      die("rank %d: round %d: %llu wrong element(s); the first is element %llu of rank %llu's chunk: 0x%08x, "
          "expected 0x%08x",
          rank, round, (unsigned long long)bad, (unsigned long long)(firstBad % kChunkElems),
          (unsigned long long)(firstBad / kChunkElems), host[firstBad],
          meshValue(round, (int)(firstBad / kChunkElems), firstBad % kChunkElems));
    }
    say("Rank %d (GPU %d): round %d: all-gather of %d x %llu bytes verified", rank, gpu, round, nranks,
        (unsigned long long)kChunkBytes);
    // No peer writes into our buffer before the next fill: all its puts arrived before our waits returned,
    // and its next ones come after the barrier that follows the fill.
  }

  MSCCLPP_CHECK(mscclppProxyStop(comm)); // a barrier first: every rank is done
  MSCCLPP_CHECK(mscclppCommDestroy(comm));
  CUDA_CHECK(cudaEventDestroy(done));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(failed));
  CUDA_CHECK(cudaFree(buff));
  return 0;
}

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 2 && !(argc == 4 && std::string(argv[2]) == "--port")) {
    fprintf(stderr, "usage: %s <nranks> [--port P]\n  nranks in [2, %d]; rank r uses GPU r %% (number of GPUs)\n",
            argv[0], kMaxRanks);
    return 2;
  }
  const int nranks = (int)example::parseNumber(argv[1], "nranks", 2, kMaxRanks);
  const int port = argc == 4 ? (int)example::parseNumber(argv[3], "--port", 1, 65535) : 50505;

  const bool ok = example::runRanks(nranks, 75, [&](int rank) { return runRank(rank, nranks, port); });
  if (!ok) {
    fprintf(stderr, "ERROR: mesh all-gather of %d ranks failed (see above)\n", nranks);
    return 1;
  }
  say("Succeed!");
  return 0;
}
