// All-gather across nodes: ranks on the same host talk over P2P (CUDA IPC and the copy engine), ranks on
// other hosts over InfiniBand (RDMA writes from GPU memory). Which is which is found at run time by
// all-gathering every rank's host name with mscclppBootstrapAllGather, as the legacy all-gather test did.
//
// Every rank owns one chunk of a buffer of nranks chunks; each rank puts its chunk into every peer's
// buffer at the same offset, signals, and waits for every peer's chunk. The result is checked word by word
// and the time per all-gather is printed by rank 0, then "Succeed!" when every rank's data was right.
//
//   ib_allgather -a HOST:PORT [-r RANK -n NRANKS] [-g GPUS_PER_NODE] [-d IBDEV0,IBDEV1,...]
//                [-b CHUNK_BYTES] [-i ITERATIONS]
//
// RANK and NRANKS default to the launcher's variables (Open MPI: OMPI_COMM_WORLD_RANK/SIZE; MPICH and Intel
// MPI: PMI_RANK/PMI_SIZE; Slurm: SLURM_PROCID/SLURM_NTASKS). The GPU of a rank is its rank among the ranks
// of its host (the launcher's local rank when it gives one, else RANK % GPUS_PER_NODE). -d lists the IB
// device of each local GPU (default mlx5_ib0, mlx5_ib1, ...). docs/IB.md shows two-node command lines.
#include "../common/example_common.h"

#include <getopt.h>

using namespace example;

constexpr int kMaxConns = 64;
constexpr int kHostNameBytes = 64;
__constant__ mscclppDevConn_t gConns[kMaxConns];

// One block per connection; its first thread drives the connection. A peer that never signals sets
// *timedOut instead of hanging the kernel.
__global__ void allgather(int rank, uint64_t chunkBytes, int nconns, int* timedOut)
{
  if (blockIdx.x >= nconns || threadIdx.x != 0) return;
  mscclppDevConn_t& conn = gConns[blockIdx.x];
  conn.putWithSignalAndFlush(rank * chunkBytes, chunkBytes);
  if (!waitWithTimeout(conn)) atomicExch(timedOut, 1);
}

// Chunk r holds words r * 2^24 + i: every word says whose it is and where it belongs.
__global__ void fill(uint32_t* buf, int rank, uint64_t chunkWords)
{
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < chunkWords; i += gridDim.x * blockDim.x)
    buf[rank * chunkWords + i] = (uint32_t)(rank << 24) + (uint32_t)i;
}

static int envInt(const char* const* names, int fallback)
{
  for (; *names; ++names) {
    const char* v = getenv(*names);
    if (v && *v) return atoi(v);
  }
  return fallback;
}

static void usage(const char* argv0)
{
  die("usage: %s -a HOST:PORT [-r RANK -n NRANKS] [-g GPUS_PER_NODE] [-d IBDEV0,IBDEV1,...] [-b CHUNK_BYTES] "
      "[-i ITERATIONS]",
      argv0);
}

int main(int argc, char** argv)
{
  static const char* const kRankVars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", nullptr};
  static const char* const kSizeVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", nullptr};
  static const char* const kLocalVars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                                           nullptr};
  std::string address;
  std::string ibDevices;
  int rank = envInt(kRankVars, -1);
  int nranks = envInt(kSizeVars, -1);
  int gpusPerNode = 0;
  uint64_t chunkBytes = 1 << 20;
  int iterations = 20;
  int opt;
  while ((opt = getopt(argc, argv, "a:r:n:g:d:b:i:")) != -1) {
    switch (opt) {
      case 'a': address = optarg; break;
      case 'r': rank = (int)parseNumber(optarg, "-r RANK", 0, kMaxConns); break;
      case 'n': nranks = (int)parseNumber(optarg, "-n NRANKS", 2, kMaxConns + 1); break;
      case 'g': gpusPerNode = (int)parseNumber(optarg, "-g GPUS_PER_NODE", 1, 64); break;
      case 'd': ibDevices = optarg; break;
      case 'b': chunkBytes = (uint64_t)parseNumber(optarg, "-b CHUNK_BYTES", 4, 1l << 30); break;
      case 'i': iterations = (int)parseNumber(optarg, "-i ITERATIONS", 1, 100000); break;
      default: usage(argv[0]);
    }
  }
  if (address.empty() || rank < 0 || nranks < 2 || rank >= nranks || nranks > kMaxConns + 1 || chunkBytes % 4 != 0)
    usage(argv[0]);
  armAlarm(300);

  // The GPU must be current before the communicator is made: it becomes the communicator's GPU.
  if (gpusPerNode <= 0) CUDA_CHECK(cudaGetDeviceCount(&gpusPerNode));
  const int localRank = envInt(kLocalVars, rank % gpusPerNode);
  CUDA_CHECK(cudaSetDevice(localRank % gpusPerNode));

  mscclppComm_t comm;
  MSCCLPP_CHECK(mscclppCommInitRank(&comm, nranks, address.c_str(), rank));

  // Who shares our host: all-gather the host names.
  std::vector<char> hosts((size_t)nranks * kHostNameBytes, 0);
  gethostname(&hosts[(size_t)rank * kHostNameBytes], kHostNameBytes - 1);
  MSCCLPP_CHECK(mscclppBootstrapAllGather(comm, hosts.data(), kHostNameBytes));
  auto hostOf = [&](int r) { return std::string(&hosts[(size_t)r * kHostNameBytes]); };

  // The IB device of this rank's GPU.
  std::vector<std::string> devs;
  for (size_t start = 0; start < ibDevices.size();) {
    size_t comma = ibDevices.find(',', start);
    if (comma == std::string::npos) comma = ibDevices.size();
    devs.push_back(ibDevices.substr(start, comma - start));
    start = comma + 1;
  }
  const std::string ibDev =
    (size_t)localRank < devs.size() ? devs[localRank] : "mlx5_ib" + std::to_string(localRank);

  const uint64_t totalBytes = chunkBytes * nranks;
  uint32_t* buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, totalBytes));
  CUDA_CHECK(cudaMemset(buf, 0, totalBytes));
  fill<<<64, 256>>>(buf, rank, chunkBytes / 4);
  CUDA_CHECK(cudaDeviceSynchronize());

  int nIb = 0;
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    const bool sameHost = hostOf(peer) == hostOf(rank);
    nIb += !sameHost;
    MSCCLPP_CHECK(mscclppConnect(comm, peer, 0, buf, totalBytes, sameHost ? mscclppTransportP2P : mscclppTransportIB,
                                 sameHost ? nullptr : ibDev.c_str()));
  }
  MSCCLPP_CHECK(mscclppConnectionSetup(comm));
  mscclppDevConn_t* conns = nullptr;
  int nconns = 0;
  MSCCLPP_CHECK(mscclppGetAllDeviceConnections(comm, &conns, &nconns));
  CUDA_CHECK(cudaMemcpyToSymbol(gConns, conns, sizeof(mscclppDevConn_t) * nconns));
  MSCCLPP_CHECK(mscclppProxyLaunch(comm));
  say("rank %d on %s: GPU %d, %d P2P and %d IB connection(s) (IB device %s)", rank, hostOf(rank).c_str(),
      localRank % gpusPerNode, nconns - nIb, nIb, nIb ? ibDev.c_str() : "-");

  cudaStream_t stream;
  cudaEvent_t done;
  int* timedOut = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_CHECK(cudaMallocManaged(&timedOut, sizeof(int)));
  *timedOut = 0;
  allgather<<<nconns, 32, 0, stream>>>(rank, chunkBytes, nconns, timedOut);  // warm-up, and the checked run
  CUDA_CHECK(cudaEventRecord(done, stream));
  waitForEvent(done, 60, "the first all-gather");
  if (*timedOut) die("rank %d: a peer's signal did not arrive within the watchdog's time", rank);
  std::vector<uint32_t> host(totalBytes / 4);
  CUDA_CHECK(cudaMemcpy(host.data(), buf, totalBytes, cudaMemcpyDeviceToHost));
  long bad = 0;
  const uint64_t chunkWords = chunkBytes / 4;
  for (int r = 0; r < nranks; ++r)
    for (uint64_t i = 0; i < chunkWords; ++i)
      if (host[r * chunkWords + i] != (uint32_t)(r << 24) + (uint32_t)i && bad++ < 5)
        say("rank %d: word %llu of rank %d's chunk is %#x", rank, (unsigned long long)i, r, host[r * chunkWords + i]);

  MSCCLPP_CHECK(mscclppBootstrapBarrier(comm));
  const double t0 = nowSec();
  for (int it = 0; it < iterations; ++it) allgather<<<nconns, 32, 0, stream>>>(rank, chunkBytes, nconns, timedOut);
  CUDA_CHECK(cudaEventRecord(done, stream));
  waitForEvent(done, 120, "the timed all-gathers");
  const double us = (nowSec() - t0) * 1e6 / iterations;
  if (*timedOut) die("rank %d: a peer's signal did not arrive within the watchdog's time", rank);
  MSCCLPP_CHECK(mscclppBootstrapBarrier(comm));

  std::vector<long> allBad(nranks, 0);
  allBad[rank] = bad;
  MSCCLPP_CHECK(mscclppBootstrapAllGather(comm, allBad.data(), sizeof(long)));
  long totalBad = 0;
  for (long b : allBad) totalBad += b;
  if (rank == 0)
    say("all-gather of %llu bytes over %d ranks: %.1f us, algbw %.2f GB/s", (unsigned long long)totalBytes, nranks,
        us, (double)totalBytes / (us * 1e-6) / 1e9);

  MSCCLPP_CHECK(mscclppProxyStop(comm));
  MSCCLPP_CHECK(mscclppCommDestroy(comm));
  CUDA_CHECK(cudaEventDestroy(done));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(timedOut));
  CUDA_CHECK(cudaFree(buf));
  if (totalBad) die("rank %d: %ld word(s) wrong over all ranks", rank, totalBad);
  if (rank == 0) say("Succeed!");
  return 0;
}
