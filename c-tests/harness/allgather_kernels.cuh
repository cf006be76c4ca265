// The two all-gather patterns of the legacy all-gather test, and their set-up and checking, shared by the
// all-gather test, the legacy-ABI test and the all-gather benchmark (which so measures exactly the kernels
// the test checks).
//
// The buffer holds nranks chunks; rank q owns chunk q. Every rank connects once (tag 0) to every peer with
// the whole buffer, in ascending peer order, so connection i serves peer (i < rank ? i : i + 1).
//   kernel 0: block i serves connection i: putWithSignal(own chunk), flush(), wait().
//   kernel 1: a ring: in step s a rank sends chunk (rank - s) mod n to rank + 1 with putWithSignalAndFlush
//             and waits for the chunk coming from rank - 1 (with 2 ranks: the legacy kernel 1 exactly).
// Per launch every connection carries exactly as many signals as its receiver waits for, so launches can
// follow each other (the wait counters persist in device memory).
#ifndef MSCCLPP_ALLGATHER_KERNELS_CUH_
#define MSCCLPP_ALLGATHER_KERNELS_CUH_

#include "mscclpp_rank.h"

namespace tc {

// kHeaderWait: use mscclppDevConn::wait() as a legacy program would (no deadline; the host-side deadline
// still applies) instead of boundedWait().
template <bool kHeaderWait>
__device__ __forceinline__ bool allgatherWait(mscclppDevConn_t& conn, DevStatus* st, uint64_t timeoutNs, int op, uint64_t it)
{
  if (kHeaderWait) {
    conn.wait();
    return true;
  }
  return boundedWait(conn, st, timeoutNs, op, it);
}

template <bool kHeaderWait>
__global__ void allgatherAllPairs(int rank, uint64_t chunkBytes, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0) return;
  mscclppDevConn_t conn = gConns[blockIdx.x];
  conn.putWithSignal((uint64_t)rank * chunkBytes, chunkBytes);
  conn.flush();
  allgatherWait<kHeaderWait>(conn, st, timeoutNs, 0, 0);
}

template <bool kHeaderWait>
__global__ void allgatherRing(int rank, int nranks, uint64_t chunkBytes, int nextConn, int prevConn, DevStatus* st,
                              uint64_t timeoutNs)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mscclppDevConn_t next = gConns[nextConn];
  mscclppDevConn_t prev = gConns[prevConn];
  for (int s = 0; s < nranks - 1; ++s) {
    const int chunk = (rank - s + nranks) % nranks;
    next.putWithSignalAndFlush((uint64_t)chunk * chunkBytes, chunkBytes);
    if (!allgatherWait<kHeaderWait>(prev, st, timeoutNs, 1, (uint64_t)s)) return;
  }
}

struct AllGather
{
  char* buf = nullptr;
  uint64_t capacity = 0; // bytes of buf, all connected
  int nConns = 0;
};

inline int peerConnIndex(int rank, int peer) { return peer < rank ? peer : peer - 1; }

inline uint64_t chunkBytesFor(uint64_t totalBytes, int nranks) { return (totalBytes / (uint64_t)nranks) & ~(uint64_t)3; }

inline uint32_t chunkSeed(int owner, uint32_t salt) { return makeSeed(kRoleSrc, (uint32_t)owner, 0xff, salt); }
inline uint32_t agSentinelSeed(int me, uint32_t salt) { return makeSeed(kRoleSentinel, (uint32_t)me, 0xff, salt); }

// Bytes after the all-gather region that are checked to stay untouched.
inline uint64_t tailCheckBytes(const AllGather& A, uint64_t totalBytes)
{
  return std::min<uint64_t>(64 * 1024, A.capacity - std::min(A.capacity, totalBytes));
}

inline std::string allgatherSetup(Rank& R, AllGather& A, uint64_t capacity)
{
  A.capacity = capacity;
  TC_CUDA(cudaMalloc((void**)&A.buf, capacity));
  for (int peer = 0; peer < R.nranks; ++peer) {
    if (peer == R.rank) continue;
    mscclppResult_t r = mscclppConnect(R.comm, peer, 0, A.buf, capacity, mscclppTransportP2P);
    if (r != mscclppSuccess) {
      R.fatal = true;
      return fmt("mscclppConnect(peer %d, %llu bytes) returned %d (%s)", peer, (unsigned long long)capacity, (int)r, errStr(r));
    }
  }
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppConnectionSetup", R.hostTimeoutS, [comm]() { return mscclppConnectionSetup(comm); }));
  mscclppDevConn_t* all = nullptr;
  int n = -1;
  TC_MSCCLPP(mscclppGetAllDeviceConnections(R.comm, &all, &n));
  if (n != R.nranks - 1 || all == nullptr) {
    R.fatal = true;
    return fmt("mscclppGetAllDeviceConnections gave %d connections (array %p), expected %d", n, (void*)all, R.nranks - 1);
  }
  for (int i = 0; i < n; ++i) {
    int peer = i < R.rank ? i : i + 1;
    if (all[i].remoteRank != peer || all[i].localBuff != (void*)A.buf || all[i].fifo.connId != i) {
      R.fatal = true;
      return fmt("connection %d: remoteRank %d localBuff %p connId %d, expected %d %p %d", i, all[i].remoteRank,
                 all[i].localBuff, all[i].fifo.connId, peer, (void*)A.buf, i);
    }
  }
  TC_TRY(loadConns(R, all, n));
  A.nConns = n;
  TC_MSCCLPP(mscclppProxyLaunch(comm));
  return "";
}

// Own chunk <- its pattern; the other chunks and a tail beyond the region <- this rank's sentinel.
inline std::string allgatherFill(Rank& R, AllGather& A, uint64_t totalBytes, uint32_t salt)
{
  const uint64_t chunk = chunkBytesFor(totalBytes, R.nranks);
  for (int q = 0; q < R.nranks; ++q) {
    const uint64_t off = (uint64_t)q * chunk;
    TC_TRY(fillWords(R, A.buf, off, chunk, q == R.rank ? chunkSeed(q, salt) : agSentinelSeed(R.rank, salt), off / 4));
  }
  const uint64_t end = (uint64_t)R.nranks * chunk;
  TC_TRY(fillWords(R, A.buf, end, tailCheckBytes(A, end), agSentinelSeed(R.rank, salt), end / 4));
  TC_TRY(syncBounded(R, "all-gather fill"));
  return "";
}

inline std::string allgatherVerify(Rank& R, AllGather& A, uint64_t totalBytes, uint32_t salt, const std::string& what)
{
  const uint64_t chunk = chunkBytesFor(totalBytes, R.nranks);
  for (int q = 0; q < R.nranks; ++q) {
    const uint64_t off = (uint64_t)q * chunk;
    TC_TRY(verifyWords(R, A.buf, off, chunk, chunkSeed(q, salt), off / 4, fmt("%s: chunk of rank %d", what.c_str(), q)));
  }
  const uint64_t end = (uint64_t)R.nranks * chunk;
  TC_TRY(verifyWords(R, A.buf, end, tailCheckBytes(A, end), agSentinelSeed(R.rank, salt), end / 4,
                     fmt("%s: bytes after the region", what.c_str())));
  return "";
}

// Queues one all-gather kernel on `stream` (no synchronization).
template <bool kHeaderWait>
inline cudaError_t allgatherLaunch(Rank& R, int kernel, uint64_t totalBytes, cudaStream_t stream)
{
  const uint64_t chunk = chunkBytesFor(totalBytes, R.nranks);
  if (kernel == 0) {
    allgatherAllPairs<kHeaderWait><<<R.nranks - 1, 32, 0, stream>>>(R.rank, chunk, R.dStatus, R.waitTimeoutNs);
  } else {
    const int next = peerConnIndex(R.rank, (R.rank + 1) % R.nranks);
    const int prev = peerConnIndex(R.rank, (R.rank - 1 + R.nranks) % R.nranks);
    allgatherRing<kHeaderWait><<<1, 32, 0, stream>>>(R.rank, R.nranks, chunk, next, prev, R.dStatus, R.waitTimeoutNs);
  }
  return cudaGetLastError();
}

// One checked all-gather: fill, barrier, launch, wait, verify.
template <bool kHeaderWait>
inline std::string allgatherChecked(Rank& R, AllGather& A, int kernel, uint64_t totalBytes, uint32_t salt, const std::string& what)
{
  TC_TRY(allgatherFill(R, A, totalBytes, salt));
  TC_TRY(barrier(R, "before all-gather"));
  resetStatus(R);
  TC_CUDA((allgatherLaunch<kHeaderWait>(R, kernel, totalBytes, R.stream)));
  TC_TRY(syncBounded(R, fmt("%s: kernel", what.c_str()).c_str()));
  TC_TRY(allgatherVerify(R, A, totalBytes, salt, what));
  return "";
}

inline std::string allgatherTeardown(Rank& R, AllGather& A)
{
  // Every rank has closed its mapping of the peers' buffers before any buffer is freed.
  TC_TRY(destroyComm(R));
  TC_CUDA(cudaFree(A.buf));
  A.buf = nullptr;
  return "";
}

} // namespace tc

#endif // MSCCLPP_ALLGATHER_KERNELS_CUH_
