// mscclpp_rank.h: a rank of the legacy face (mscclpp.h, libmscclpp) in the case runner: the communicator's
// set-up and end (initRank, destroyComm), its calls under a deadline (callBounded, barrier, TC_MSCCLPP),
// the device connections kernels use (gConns, loadConns, connectPeer), their epochs (readEpochs,
// expectEpochs) and a device wait with a deadline (boundedWait). It also compiles against the MSCCL++ 0.1.0
// header (the legacy-ABI test and the legacy builds of two benchmarks), so nothing here may need more than
// that header has (see epochReached).
#pragma once

#include "case_runner.h"

#include <mscclpp.h>

namespace tc {

constexpr int kMaxConns = 64; // connections gConns holds

// Whether the peer's proxy has published `epoch` signals, as wait() decides it: conn.epochReached(). The
// 0.1.0 header has no such method; its wait() reads only the epoch struct, so that is what counts there.
__device__ __forceinline__ bool epochReached(mscclppDevConn& conn, uint64_t epoch)
{
#ifdef MSCCLPP_HAS_EPOCH_REACHED
  return conn.epochReached(epoch);
#else
  return *reinterpret_cast<volatile uint64_t*>(&conn.localSignalEpochId->proxy) >= epoch;
#endif
}

inline const char* errStr(mscclppResult_t r)
{
  const char* s = mscclppGetErrorString(r);
  return s ? s : "(null error string)";
}

// The connections a kernel may use, copied from mscclppGetAllDeviceConnections().
__constant__ mscclppDevConn_t gConns[kMaxConns];

// mscclppDevConn::wait() with a deadline: bumps waitEpochId exactly as wait() does, then spins until the
// proxy-written epoch reaches it. Gives up (and reports) after timeoutNs or once another block failed.
__device__ inline bool boundedWait(mscclppDevConn_t& conn, DevStatus* st, uint64_t timeoutNs, int op, uint64_t iter)
{
  uint64_t target = *conn.waitEpochId + 1;
  *conn.waitEpochId = target;
  volatile uint64_t* epoch = &conn.localSignalEpochId->proxy;
  if (epochReached(conn, target)) return true;
  uint64_t start = globalTimerNs();
  unsigned spins = 0;
  while (!epochReached(conn, target)) {
    if ((++spins & 1023) == 0) {
      if (st->failed || globalTimerNs() - start > timeoutNs) {
        devFail(st, kFailWaitTimeout, op, iter, target, *epoch);
        return false;
      }
    }
  }
  return true;
}

#define TC_MSCCLPP(expr)                                                                                       \
  do {                                                                                                         \
    mscclppResult_t r_ = (expr);                                                                               \
    if (r_ != mscclppSuccess) {                                                                                \
      R.fatal = true;                                                                                          \
      return ::tc::fmt("%s returned %d (%s) (%s:%d)", #expr, (int)r_, ::tc::errStr(r_), __FILE__, __LINE__);  \
    }                                                                                                          \
  } while (0)


// Runs a blocking call on a helper thread (with the rank's device current) and gives up after timeoutS.
// On timeout the rank is marked fatal: the stuck call is abandoned and the process exits after the case.
inline std::string callBounded(Rank& R, const char* what, double timeoutS, const std::function<mscclppResult_t()>& fn)
{
  auto task = std::make_shared<std::packaged_task<mscclppResult_t()>>([fn, dev = R.device]() {
    cudaSetDevice(dev);
    return fn();
  });
  std::future<mscclppResult_t> fut = task->get_future();
  std::thread([task]() { (*task)(); }).detach();
  if (fut.wait_for(std::chrono::duration<double>(timeoutS)) != std::future_status::ready) {
    R.fatal = true;
    return fmt("%s: TIMED OUT after %.0f s (did not return)", what, timeoutS);
  }
  mscclppResult_t r = fut.get();
  if (r != mscclppSuccess) {
    R.fatal = true;
    return fmt("%s returned %d (%s)", what, (int)r, errStr(r));
  }
  return "";
}

inline std::string barrier(Rank& R, const char* where = "barrier")
{
  mscclppComm_t comm = R.comm;
  return callBounded(R, fmt("mscclppBootstrapBarrier (%s)", where).c_str(), R.hostTimeoutS,
                     [comm]() { return mscclppBootstrapBarrier(comm); });
}

// Copies the connections into gConns for kernels.
inline std::string loadConns(Rank& R, const mscclppDevConn_t* conns, int n)
{
  TC_EXPECT(n >= 0 && n <= kMaxConns, "too many connections for the test (%d > %d)", n, kMaxConns);
  // Host-to-device copies are ordered on the rank's stream: a plain cudaMemcpy from pageable memory may
  // return before its data has landed, and kernels run on a non-blocking stream.
  if (n > 0) TC_CUDA(cudaMemcpyToSymbolAsync(gConns, conns, sizeof(mscclppDevConn_t) * n, 0, cudaMemcpyHostToDevice, R.stream));
  TC_TRY(syncBounded(R, "copy of the connections"));
  return "";
}

// Two-rank programs: connects to the other rank over P2P (tag 0) with one buffer, sets up, and loads the
// one connection into gConns[0]; *conn gets a host copy.
inline std::string connectPeer(Rank& R, void* buf, uint64_t bytes, mscclppDevConn_t* conn)
{
  TC_EXPECT(R.nranks == 2, "needs exactly 2 ranks");
  TC_MSCCLPP(mscclppConnect(R.comm, 1 - R.rank, 0, buf, bytes, mscclppTransportP2P));
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppConnectionSetup", R.hostTimeoutS, [comm]() { return mscclppConnectionSetup(comm); }));
  mscclppDevConn_t* all = nullptr;
  int n = -1;
  TC_MSCCLPP(mscclppGetAllDeviceConnections(R.comm, &all, &n));
  if (n != 1 || all == nullptr) {
    R.fatal = true;
    return fmt("expected 1 connection, got %d", n);
  }
  *conn = all[0];
  return loadConns(R, all, 1);
}

// Stops the proxy (if launched) and destroys the communicator; returns once every rank has done so, so
// that no peer still maps a buffer the caller frees next.
inline std::string destroyComm(Rank& R, bool proxyLaunched = true)
{
  mscclppComm_t comm = R.comm;
  if (proxyLaunched)
    TC_TRY(callBounded(R, "mscclppProxyStop", R.hostTimeoutS, [comm]() { return mscclppProxyStop(comm); }));
  TC_TRY(callBounded(R, "mscclppCommDestroy", R.hostTimeoutS, [comm]() { return mscclppCommDestroy(comm); }));
  R.comm = nullptr;
  return oobBarrier(R, "after mscclppCommDestroy");
}

// Reads a connection's epoch counters (device memory) on the host.
inline std::string readEpochs(Rank& R, const mscclppDevConn_t& c, uint64_t* device, uint64_t* proxy, uint64_t* wait)
{
  TC_EXPECT(c.localSignalEpochId && c.waitEpochId, "connection to rank %d tag %d has a NULL epoch pointer", c.remoteRank, c.tag);
  mscclppDevConnSignalEpochId e;
  TC_CUDA(cudaMemcpy(&e, c.localSignalEpochId, sizeof(e), cudaMemcpyDefault));
  TC_CUDA(cudaMemcpy(wait, c.waitEpochId, sizeof(uint64_t), cudaMemcpyDefault));
  *device = e.device;
  *proxy = e.proxy;
  return "";
}

// All three epoch counters of a connection equal `want` (each signal matched by one wait).
inline std::string expectEpochs(Rank& R, const mscclppDevConn_t& c, uint64_t want)
{
  uint64_t device = 0, proxy = 0, wait = 0;
  TC_TRY(readEpochs(R, c, &device, &proxy, &wait));
  TC_EXPECT(device == want && proxy == want && wait == want, "epochs device %llu proxy %llu wait %llu, expected %llu each",
            (unsigned long long)device, (unsigned long long)proxy, (unsigned long long)wait, (unsigned long long)want);
  return "";
}

// CUDA device, stream, status block and communicator for this rank.
inline std::string initRank(Rank& R)
{
  // Kernels load when the process starts, not at their first launch: a lazy first launch takes a driver
  // lock, and waits for the GPU, while an earlier kernel may be waiting on the proxy, whose next CUDA call
  // needs that lock (a deadlock; docs/mscclpp.md, "Lazy module loading"). The runner's environment wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  TC_CUDA(cudaGetDeviceCount(&R.nGpus));
  TC_EXPECT(R.nGpus > 0, "no CUDA device visible");
  R.device = R.rank % R.nGpus;
  if (R.nranks > R.nGpus) {
    // Ranks sharing a GPU are time-sliced against each other: be more patient.
    R.hostTimeoutS *= 2;
    R.waitTimeoutNs *= 2;
  }
  TC_CUDA(cudaSetDevice(R.device));
  TC_CUDA(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  TC_CUDA(cudaHostAlloc((void**)&R.status, sizeof(DevStatus), cudaHostAllocMapped));
  memset((void*)R.status, 0, sizeof(DevStatus));
  TC_CUDA(cudaHostGetDevicePointer((void**)&R.dStatus, (void*)R.status, 0));
  TC_CUDA(cudaMalloc((void**)&R.dVerify, 2 * sizeof(unsigned long long)));
  // A slowed run (compute-sanitizer starting 8 instrumented processes one after another took over 30 s to
  // bring the last to the root) gets a bootstrap rendezvous as patient as its other deadlines.
  if (timeoutScale() > 1) TC_MSCCLPP(mscclppSetBootstrapConnTimeout((int)(30 * timeoutScale())));
  // Called on this thread (its current device is the communicator's device); the parent's deadline
  // covers a rendezvous that never completes.
  mscclppComm_t comm = nullptr;
  mscclppResult_t r = mscclppCommInitRank(&comm, R.nranks, R.addr.c_str(), R.rank);
  if (r != mscclppSuccess) {
    R.fatal = true;
    return fmt("mscclppCommInitRank(nranks %d, %s, rank %d) returned %d (%s)", R.nranks, R.addr.c_str(), R.rank, (int)r,
               errStr(r));
  }
  TC_EXPECT(comm != nullptr, "mscclppCommInitRank succeeded but returned a NULL communicator");
  R.comm = comm;
  int rk = -1, sz = -1;
  TC_MSCCLPP(mscclppCommRank(comm, &rk));
  TC_MSCCLPP(mscclppCommSize(comm, &sz));
  TC_EXPECT(rk == R.rank && sz == R.nranks, "mscclppCommRank/Size say %d/%d, expected %d/%d", rk, sz, R.rank, R.nranks);
  R.info = fmt("%d GPUs visible, %d ranks", R.nGpus, R.nranks);
  return "";
}

} // namespace tc
