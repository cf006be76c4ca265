// case_runner.h: how the GPU tests and the benchmarks run their cases, built on example_common.h (whose
// clocks, epoch check and forking it uses). Tests include it through the Makefile's -I of this folder,
// benchmarks as "../common/case_runner.h". It also compiles against the MSCCL++ 0.1.0 header (the legacy-ABI
// test and the legacy builds of two benchmarks).
//
// Where example_common.h ends the process on the first error (CUDA_CHECK, MSCCLPP_CHECK), the functions
// here return the reason as a string (TC_CUDA, TC_MSCCLPP, TC_TRY, TC_EXPECT), so that a failed case becomes
// a FAIL line and the rank goes on with the next case where it can.
//
// Process model: the parent forks one child per rank and never touches CUDA itself (CUDA state does not
// survive fork()). Each child picks its GPU, joins the communicator and runs a fixed sequence of test
// cases, recording each verdict in memory shared with the parent. The parent waits with a deadline, kills
// stragglers, then prints one line per case (`PASS name ...` / `FAIL name: reason`) and a summary.
//
// Nothing may hang: device-side waits give up after a timeout and report it, every kernel is waited for
// with a host-side deadline, blocking library calls can be run under a deadline, and each child has an
// alarm() as a last resort. A timeout is a failure.
#ifndef MSCCLPP_CASE_RUNNER_H_
#define MSCCLPP_CASE_RUNNER_H_

#include "example_common.h"

#include <cuda_runtime.h>
#include <mscclpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tc {

using example::epochReached;
using example::globalTimerNs;
using example::nowSec;

constexpr int kMaxRanks = 16;
constexpr int kMaxCases = 128;
constexpr int kNameLen = 96;
constexpr int kTextLen = 400;
constexpr int kMaxConns = 64;
constexpr int kMaxProgress = 64;

// ------------------------------------------------------------------------------------------------
// Small host utilities
// ------------------------------------------------------------------------------------------------

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...)
{
  char buf[2048];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// All deadlines are multiplied by MSCCLPP_TEST_TIMEOUT_SCALE (e.g. under compute-sanitizer).
inline double timeoutScale()
{
  const char* s = getenv("MSCCLPP_TEST_TIMEOUT_SCALE");
  double v = s ? atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}

// Copies text into a fixed buffer, one line only (results are printed one per line).
inline void copyText(char* dst, size_t cap, const std::string& src)
{
  size_t n = std::min(cap - 1, src.size());
  for (size_t i = 0; i < n; ++i) {
    char ch = src[i];
    dst[i] = (ch == '\n' || ch == '\r') ? ' ' : ch;
  }
  dst[n] = '\0';
}

inline const char* errStr(mscclppResult_t r)
{
  const char* s = mscclppGetErrorString(r);
  return s ? s : "(null error string)";
}

inline std::string sizeName(uint64_t bytes)
{
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return fmt("%lluGiB", (unsigned long long)(bytes >> 30));
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return fmt("%lluMiB", (unsigned long long)(bytes >> 20));
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0) return fmt("%lluKiB", (unsigned long long)(bytes >> 10));
  return fmt("%lluB", (unsigned long long)bytes);
}

inline double median(std::vector<double> v)
{
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ------------------------------------------------------------------------------------------------
// Data patterns: every word depends on a seed (role, sender, receiver, salt) and on its index, is never
// zero, and differs between neighbours, so misplaced, stale, missing or foreign data is detected.
// ------------------------------------------------------------------------------------------------

enum Role : uint32_t
{
  kRoleSrc = 1,      // data a rank sends
  kRoleSentinel = 2, // what a receive region holds before the transfer
  kRoleGuard = 3,    // memory around a buffer that nobody may write
  kRoleNew = 4,      // data written over a source after flush()
  kRolePing = 5,     // ping-pong payloads
  kRoleDirect = 6,   // stores through remoteBuff
  kRoleReg = 7,      // registered-buffer writes
};

__host__ __device__ inline uint64_t mix64(uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__host__ __device__ inline uint32_t makeSeed(uint32_t role, uint32_t from, uint32_t to, uint32_t salt)
{
  uint64_t x = mix64(((uint64_t)role << 56) ^ ((uint64_t)(from & 0xff) << 48) ^ ((uint64_t)(to & 0xff) << 40) ^ salt);
  uint32_t s = (uint32_t)(x ^ (x >> 32));
  return s ? s : 0x2468ACE1u;
}

__host__ __device__ inline uint32_t patternWord(uint32_t seed, uint64_t idx)
{
  uint64_t x = mix64(((uint64_t)seed << 32) ^ idx ^ ((uint64_t)seed * 0xD6E8FEB86659FD93ull));
  uint32_t v = (uint32_t)(x ^ (x >> 32));
  return v ? v : 0x13579BDFu;
}

// ------------------------------------------------------------------------------------------------
// Device side: failure reports and progress markers in host-mapped memory (readable while a kernel
// is still running), bounded waits.
// ------------------------------------------------------------------------------------------------

enum DevFailure : int
{
  kFailWaitTimeout = 1,
  kFailDataMismatch = 2,
  kFailBadOp = 3,
  kFailNullPointer = 4,
};

struct DevStatus
{
  volatile int failed; // 0, or a DevFailure; written last
  volatile int block;
  volatile int op;
  volatile int pad;
  volatile unsigned long long iter;
  volatile unsigned long long expected;
  volatile unsigned long long observed;
  // Per block: (op + 1) << 40 | iteration, updated as the block goes.
  volatile unsigned long long progress[kMaxProgress];
};

// The connections a kernel may use, copied from mscclppGetAllDeviceConnections().
__constant__ mscclppDevConn_t gConns[kMaxConns];

__device__ inline void devFail(DevStatus* st, int code, int op, uint64_t iter, uint64_t expected, uint64_t observed)
{
  if (st->failed) return; // keep the first report (best effort; only diagnostics race here)
  st->block = (int)blockIdx.x;
  st->op = op;
  st->iter = iter;
  st->expected = expected;
  st->observed = observed;
  __threadfence_system();
  st->failed = code;
  __threadfence_system();
}

__device__ inline void devProgress(DevStatus* st, int op, uint64_t iter)
{
  if (blockIdx.x < kMaxProgress) st->progress[blockIdx.x] = ((unsigned long long)(op + 1) << 40) | (iter & 0xFFFFFFFFFFull);
}

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

__global__ void fillKernel(uint32_t* buf, uint64_t n, uint32_t seed, uint64_t idx0)
{
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    buf[i] = patternWord(seed, idx0 + i);
  }
}

// out[0] += number of wrong words; out[1] = min(index of a wrong word).
__global__ void verifyKernel(const uint32_t* buf, uint64_t n, uint32_t seed, uint64_t idx0, unsigned long long* out)
{
  unsigned long long bad = 0, first = ~0ull;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    if (buf[i] != patternWord(seed, idx0 + i)) {
      ++bad;
      if (i < first) first = i;
    }
  }
  if (bad) {
    atomicAdd(&out[0], bad);
    atomicMin(&out[1], first);
  }
}

// ------------------------------------------------------------------------------------------------
// Results shared between the children and the parent
// ------------------------------------------------------------------------------------------------

enum Verdict : int
{
  kNotFinished = 0,
  kPass = 1,
  kFail = 2,
};

struct CaseSlot
{
  char name[kMaxRanks][kNameLen];
  int verdict[kMaxRanks];
  char reason[kMaxRanks][kTextLen];
  char info[kTextLen]; // rank 0's note for the PASS line
};

struct SharedState
{
  int nCases[kMaxRanks];
  char current[kMaxRanks][kNameLen];
  CaseSlot cases[kMaxCases];
  // Barriers that do not need the library (e.g. after mscclppCommDestroy), one counter per use.
  int oobBarrier[64];
};

// ------------------------------------------------------------------------------------------------
// Per-rank context
// ------------------------------------------------------------------------------------------------

struct Rank
{
  int rank = -1;
  int nranks = 0;
  int nGpus = 0;
  int device = -1;
  int port = 0;
  std::string addr; // "127.0.0.1:port" of rank 0
  mscclppComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  DevStatus* status = nullptr;  // host view
  DevStatus* dStatus = nullptr; // device view
  unsigned long long* dVerify = nullptr;
  SharedState* shared = nullptr;
  int oobSeq = 0;      // next SharedState::oobBarrier slot
  bool fatal = false; // set when the rank's state cannot be trusted any more; the rank stops after the case
  std::string info;   // note for the current case's PASS line
  double hostTimeoutS = 30;
  uint64_t waitTimeoutNs = 10ull * 1000000000ull;
};

// Checks inside functions returning std::string ("" = success) that have a `Rank& R` in scope.
#define TC_CUDA(expr)                                                                                          \
  do {                                                                                                         \
    cudaError_t e_ = (expr);                                                                                   \
    if (e_ != cudaSuccess) {                                                                                   \
      R.fatal = true;                                                                                          \
      return ::tc::fmt("%s failed: %s (%s:%d)", #expr, cudaGetErrorString(e_), __FILE__, __LINE__);            \
    }                                                                                                          \
  } while (0)

#define TC_MSCCLPP(expr)                                                                                       \
  do {                                                                                                         \
    mscclppResult_t r_ = (expr);                                                                               \
    if (r_ != mscclppSuccess) {                                                                                \
      R.fatal = true;                                                                                          \
      return ::tc::fmt("%s returned %d (%s) (%s:%d)", #expr, (int)r_, ::tc::errStr(r_), __FILE__, __LINE__);  \
    }                                                                                                          \
  } while (0)

#define TC_TRY(expr)                                                                                           \
  do {                                                                                                         \
    std::string s_ = (expr);                                                                                   \
    if (!s_.empty()) return s_;                                                                                \
  } while (0)

#define TC_EXPECT(cond, ...)                                                                                   \
  do {                                                                                                         \
    if (!(cond)) return ::tc::fmt(__VA_ARGS__);                                                                \
  } while (0)

inline void rankLog(const Rank& R, const char* f, ...) __attribute__((format(printf, 2, 3)));
inline void rankLog(const Rank& R, const char* f, ...)
{
  char buf[2048];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  fprintf(stderr, "[rank %d] %s\n", R.rank, buf);
  fflush(stderr);
}

inline std::string statusText(const Rank& R)
{
  const DevStatus* st = R.status;
  std::string s;
  static const char* names[] = {"none", "wait timed out", "data mismatch", "bad op", "null pointer"};
  int code = st->failed;
  if (code) {
    s = fmt("device reported '%s' in block %d op %d iter %llu (expected %llu, observed %llu)",
            (code >= 0 && code <= 4) ? names[code] : "?", st->block, st->op, (unsigned long long)st->iter,
            (unsigned long long)st->expected, (unsigned long long)st->observed);
  } else {
    s = "device reported nothing";
  }
  std::string prog;
  for (int b = 0; b < 8; ++b) {
    unsigned long long p = st->progress[b];
    if (!p) continue;
    prog += fmt(" b%d:op%llu/it%llu", b, (p >> 40) - 1, p & 0xFFFFFFFFFFull);
  }
  if (!prog.empty()) s += "; progress" + prog;
  return s;
}

inline void resetStatus(Rank& R) { memset((void*)R.status, 0, sizeof(DevStatus)); }

// Waits for everything queued on R.stream, with a deadline; then checks the device failure report.
inline std::string syncBounded(Rank& R, const char* what, double timeoutS = 0)
{
  if (timeoutS <= 0) timeoutS = R.hostTimeoutS;
  double t0 = nowSec();
  for (;;) {
    cudaError_t e = cudaStreamQuery(R.stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      R.fatal = true;
      return fmt("%s: stream error: %s; %s", what, cudaGetErrorString(e), statusText(R).c_str());
    }
    if (nowSec() - t0 > timeoutS) {
      R.fatal = true;
      return fmt("%s: TIMED OUT after %.0f s; %s", what, timeoutS, statusText(R).c_str());
    }
    usleep(100);
  }
  if (R.status->failed) {
    R.fatal = true;
    return fmt("%s: %s", what, statusText(R).c_str());
  }
  return "";
}

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

// A barrier through the shared result area, for when the communicator is gone.
inline std::string oobBarrier(Rank& R, const char* where)
{
  if (R.oobSeq >= 64) return "internal: too many out-of-band barriers";
  int* counter = &R.shared->oobBarrier[R.oobSeq++];
  __atomic_add_fetch(counter, 1, __ATOMIC_SEQ_CST);
  double t0 = nowSec();
  while (__atomic_load_n(counter, __ATOMIC_SEQ_CST) < R.nranks) {
    if (nowSec() - t0 > R.hostTimeoutS) {
      R.fatal = true;
      return fmt("out-of-band barrier (%s): TIMED OUT after %.0f s", where, R.hostTimeoutS);
    }
    usleep(200);
  }
  return "";
}

inline unsigned gridFor(uint64_t n) { return (unsigned)std::max<uint64_t>(1, std::min<uint64_t>((n + 255) / 256, 8192)); }

// Fills bytes [byteOff, byteOff + bytes) of base with patternWord(seed, idx0 + i) (asynchronously on R.stream).
inline std::string fillWords(Rank& R, void* base, uint64_t byteOff, uint64_t bytes, uint32_t seed, uint64_t idx0)
{
  if (byteOff % 4 || bytes % 4) return fmt("internal: unaligned fill at %llu + %llu", (unsigned long long)byteOff, (unsigned long long)bytes);
  if (bytes == 0) return "";
  uint64_t n = bytes / 4;
  fillKernel<<<gridFor(n), 256, 0, R.stream>>>((uint32_t*)((char*)base + byteOff), n, seed, idx0);
  TC_CUDA(cudaGetLastError());
  return "";
}

// Checks bytes [byteOff, byteOff + bytes) of base against patternWord(seed, idx0 + i); waits for R.stream.
inline std::string verifyWords(Rank& R, const void* base, uint64_t byteOff, uint64_t bytes, uint32_t seed, uint64_t idx0,
                               const std::string& what)
{
  if (byteOff % 4 || bytes % 4) return fmt("internal: unaligned verify at %llu + %llu", (unsigned long long)byteOff, (unsigned long long)bytes);
  if (bytes == 0) return "";
  uint64_t n = bytes / 4;
  TC_CUDA(cudaMemsetAsync(R.dVerify, 0, sizeof(unsigned long long), R.stream));
  TC_CUDA(cudaMemsetAsync(R.dVerify + 1, 0xff, sizeof(unsigned long long), R.stream));
  const uint32_t* words = (const uint32_t*)((const char*)base + byteOff);
  verifyKernel<<<gridFor(n), 256, 0, R.stream>>>(words, n, seed, idx0, R.dVerify);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "verify kernel"));
  unsigned long long res[2];
  TC_CUDA(cudaMemcpy(res, R.dVerify, sizeof(res), cudaMemcpyDeviceToHost));
  if (res[0] == 0) return "";
  uint32_t got = 0;
  TC_CUDA(cudaMemcpy(&got, words + res[1], 4, cudaMemcpyDeviceToHost));
  return fmt("%s: %llu of %llu words wrong, first at byte %llu of the region (offset %llu): got 0x%08x, want 0x%08x",
             what.c_str(), res[0], (unsigned long long)n, res[1] * 4, (unsigned long long)(byteOff + res[1] * 4), got,
             patternWord(seed, idx0 + res[1]));
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

// Releases what initRank allocated (not the communicator).
inline void freeRank(Rank& R)
{
  if (R.dVerify) cudaFree(R.dVerify);
  if (R.status) cudaFreeHost((void*)R.status);
  if (R.stream) cudaStreamDestroy(R.stream);
  R.dVerify = nullptr;
  R.status = nullptr;
  R.dStatus = nullptr;
  R.stream = nullptr;
}

// Runs one test case on this rank and records its verdict for the parent. A case that leaves the rank in a
// state that cannot be trusted (R.fatal) ends the rank: the other ranks then time out or get killed.
inline bool runCase(Rank& R, const std::string& name, const std::function<std::string()>& body)
{
  SharedState* S = R.shared;
  int idx = S->nCases[R.rank];
  if (idx >= kMaxCases) {
    rankLog(R, "too many test cases");
    _exit(4);
  }
  S->nCases[R.rank] = idx + 1;
  CaseSlot& slot = S->cases[idx];
  copyText(slot.name[R.rank], kNameLen, name);
  copyText(S->current[R.rank], kNameLen, name);
  R.info.clear();
  rankLog(R, "%s: start", name.c_str());
  double t0 = nowSec();
  std::string reason = body();
  double dt = nowSec() - t0;
  if (reason.empty()) {
    if (R.rank == 0) copyText(slot.info, kTextLen, R.info);
    slot.verdict[R.rank] = kPass;
    rankLog(R, "%s: ok (%.2f s) %s", name.c_str(), dt, R.info.c_str());
  } else {
    copyText(slot.reason[R.rank], kTextLen, reason);
    slot.verdict[R.rank] = kFail;
    rankLog(R, "%s: FAILED (%.2f s): %s", name.c_str(), dt, reason.c_str());
  }
  copyText(S->current[R.rank], kNameLen, "");
  if (R.fatal) {
    rankLog(R, "fatal error in '%s'; this rank stops here", name.c_str());
    fflush(stdout);
    fflush(stderr);
    _exit(1);
  }
  return reason.empty();
}

// ------------------------------------------------------------------------------------------------
// Parent side
// ------------------------------------------------------------------------------------------------

struct Options
{
  int nranks = 2;
  int port = 0;
  bool quick = false;
};

// Usage: prog [nranks] [--port P] [--quick]
inline Options parseArgs(int argc, char** argv, int defaultRanks)
{
  Options o;
  o.nranks = defaultRanks;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--port") && i + 1 < argc) {
      o.port = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--quick")) {
      o.quick = true;
    } else if (argv[i][0] != '-') {
      o.nranks = atoi(argv[i]);
    } else {
      fprintf(stderr, "unknown argument %s\nusage: %s [nranks] [--port P] [--quick]\n", argv[i], argv[0]);
      exit(2);
    }
  }
  if (o.nranks < 2 || o.nranks > kMaxRanks) {
    fprintf(stderr, "nranks must be in [2, %d]\n", kMaxRanks);
    exit(2);
  }
  return o;
}

inline bool portFree(int port)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return true;
  sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = bind(fd, (sockaddr*)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A port derived from the pid (so back-to-back runs do not meet a port lingering in TIME_WAIT) whose
// `count` consecutive ports can currently be bound.
inline int pickPort(int requested, int count = 1)
{
  if (requested > 0) return requested;
  int start = (int)((getpid() * 7919u) % 30000u);
  for (int i = 0; i < 500; ++i) {
    int p = 20000 + (start + i * 13) % 30000;
    bool ok = true;
    for (int k = 0; k < count && ok; ++k) ok = portFree(p + k);
    if (ok) return p;
  }
  return 20000 + start;
}

static volatile sig_atomic_t gStopRequested = 0;
static int gAlarmRank = -1;

inline void onStopSignal(int) { gStopRequested = 1; }

// A rank's last resort against a hang, as example::onAlarm is a program's; this one names the rank, and its
// exit code 3 tells the parent that the alarm fired (describeStatus()).
inline void onAlarm(int)
{
  char msg[96];
  int n = snprintf(msg, sizeof(msg), "[rank %d] WATCHDOG: alarm fired, rank exceeded its time limit\n", gAlarmRank);
  if (n > 0) (void)!write(2, msg, (size_t)n);
  _exit(3);
}

inline std::string describeStatus(int status)
{
  if (WIFEXITED(status)) {
    int c = WEXITSTATUS(status);
    if (c == 3) return "exited with code 3 (watchdog alarm)";
    return fmt("exited with code %d", c);
  }
  if (WIFSIGNALED(status)) return fmt("killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt("ended with status 0x%x", status);
}

// Memory the parent and every forked rank share, zeroed (a case's results and flags): one `T`, or null if
// the mapping failed. Released with munmap(ptr, sizeof(T)).
template <typename T>
T* mapShared()
{
  void* mem = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  memset(mem, 0, sizeof(T));
  return static_cast<T*>(mem);
}

// Forks one child per rank, each running rankMain(R) (its return value is the exit code), waits at most
// timeoutS (scaled), kills stragglers, prints per-case results and a summary. Returns main's exit code.
inline int runRanks(const char* progName, const Options& opt, double timeoutS, const std::function<int(Rank&)>& rankMain)
{
  timeoutS *= timeoutScale();
  const int nranks = opt.nranks;
  const int port = pickPort(opt.port, 2);
  SharedState* S = mapShared<SharedState>();
  if (!S) {
    printf("FAIL %s: mmap of the shared result area failed: %s\n", progName, strerror(errno));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);

  signal(SIGTERM, onStopSignal);
  signal(SIGINT, onStopSignal);
  std::vector<pid_t> pids(nranks, -1);
  std::vector<int> statuses(nranks, 0);
  std::vector<bool> done(nranks, false), killed(nranks, false);
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = example::forkRankProcess();
    if (pid < 0) {
      printf("FAIL %s: fork failed: %s\n", progName, strerror(errno));
      for (int k = 0; k < r; ++k) kill(pids[k], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      gAlarmRank = r;
      signal(SIGALRM, onAlarm);
      alarm((unsigned)(timeoutS + 10));
      Rank R;
      R.rank = r;
      R.nranks = nranks;
      R.port = port;
      R.addr = fmt("127.0.0.1:%d", port);
      R.shared = S;
      double scale = timeoutScale();
      R.hostTimeoutS = 30.0 * scale;
      R.waitTimeoutNs = (uint64_t)(15.0 * scale * 1e9);
      int rc = rankMain(R);
      fflush(stdout);
      fflush(stderr);
      exit(rc);
    }
    pids[r] = pid;
  }

  const double t0 = nowSec();
  double firstFailure = 0;
  bool timedOut = false;
  const double grace = 20.0 * timeoutScale();
  int remaining = nranks;
  while (remaining > 0) {
    for (int r = 0; r < nranks; ++r) {
      if (done[r]) continue;
      int st = 0;
      pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) {
        done[r] = true;
        statuses[r] = st;
        --remaining;
        bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!ok && firstFailure == 0) firstFailure = nowSec();
      }
    }
    if (remaining == 0) break;
    double now = nowSec();
    bool stop = false;
    if (now - t0 > timeoutS) {
      timedOut = true;
      stop = true;
    }
    if (firstFailure > 0 && now - firstFailure > grace) stop = true;
    if (gStopRequested) stop = true;
    if (stop) {
      for (int r = 0; r < nranks; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          killed[r] = true;
        }
      }
      for (int r = 0; r < nranks; ++r) {
        if (!done[r]) {
          int st = 0;
          waitpid(pids[r], &st, 0);
          statuses[r] = st;
          done[r] = true;
        }
      }
      remaining = 0;
      break;
    }
    usleep(20000);
  }
  const double elapsed = nowSec() - t0;

  int passed = 0, failed = 0;
  int nCases = 0;
  for (int r = 0; r < nranks; ++r) nCases = std::max(nCases, S->nCases[r]);
  for (int i = 0; i < nCases; ++i) {
    CaseSlot& c = S->cases[i];
    std::string name;
    for (int r = 0; r < nranks && name.empty(); ++r) name = c.name[r];
    if (name.empty()) name = fmt("case%d", i);
    bool allPass = true;
    std::string why;
    for (int r = 0; r < nranks; ++r) {
      if (c.verdict[r] == kPass) continue;
      allPass = false;
      if (!why.empty()) why += "; ";
      if (c.verdict[r] == kFail) {
        why += fmt("rank %d: %s", r, c.reason[r]);
      } else if (c.name[r][0] == '\0') {
        why += fmt("rank %d: never reached this case", r);
      } else {
        why += fmt("rank %d: did not finish (%s)", r, killed[r] ? "killed" : "process ended");
      }
    }
    if (allPass) {
      printf("PASS %s%s%s\n", name.c_str(), c.info[0] ? " " : "", c.info);
      ++passed;
    } else {
      printf("FAIL %s: %s\n", name.c_str(), why.c_str());
      ++failed;
    }
  }
  for (int r = 0; r < nranks; ++r) {
    int st = statuses[r];
    bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0 && !killed[r];
    if (ok) continue;
    // A rank that stopped with code 1 after recording a failed case is already accounted for.
    bool explained = false;
    for (int i = 0; i < nCases; ++i) explained = explained || S->cases[i].verdict[r] == kFail;
    if (explained && !killed[r] && WIFEXITED(st) && WEXITSTATUS(st) == 1) continue;
    std::string where = S->current[r][0] ? fmt(" while in case '%s'", S->current[r]) : std::string();
    if (killed[r]) {
      printf("FAIL %s_rank%d_process: killed by the parent %s%s\n", progName, r,
             timedOut ? fmt("after the %.0f s time limit", timeoutS).c_str() : "after another rank failed", where.c_str());
    } else {
      printf("FAIL %s_rank%d_process: %s%s\n", progName, r, describeStatus(st).c_str(), where.c_str());
    }
    ++failed;
  }
  if (nCases == 0 && failed == 0) {
    printf("FAIL %s: no test case ran\n", progName);
    ++failed;
  }
  printf("SUMMARY %s (%d ranks, port %d, %.1f s): %d passed, %d failed\n", progName, nranks, port, elapsed, passed, failed);
  fflush(stdout);
  munmap(S, sizeof(SharedState));
  return failed == 0 ? 0 : 1;
}


// Ranks forked by a parent with logic of its own around them (a rank killed, processes that end themselves):
// one child per rank runs body(rank) under an alarm of `alarmS` seconds and ends with its result (_exit: the
// child's own atexit handlers run only where body calls exit() itself); the parent reaps them without
// blocking and notes when each ended.
// Runs fn on a helper thread (with `device` current) and waits at most `seconds` for it; false if it did not
// return in time (the thread is left to finish, or to hang, on its own: the kill cases call what may block).
template <typename T>
inline bool bounded(int device, double seconds, std::function<T()> fn, T* out)
{
  auto p = std::make_shared<std::promise<T>>();
  std::future<T> f = p->get_future();
  std::thread([p, fn, device] {
    cudaSetDevice(device);
    p->set_value(fn());
  }).detach();
  if (f.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) return false;
  *out = f.get();
  return true;
}

// Waits (up to `seconds`) until a new process can take every visible GPU, probing in forked children (this
// process must not initialise CUDA before it forks ranks). Under MPS, after a client was killed or faulted
// with kernels running, the server refuses new clients ("all CUDA-capable devices are busy or unavailable")
// for a moment, until it has cleaned up after them: a case that starts its ranks then must wait for that.
// Returns "" once a probe succeeded, else the last probe's CUDA error.
inline std::string waitForGpuClients(double seconds)
{
  const double deadline = nowSec() + seconds;
  std::string last = "no probe ran";
  do {
    const pid_t pid = fork();
    if (pid == 0) {
      int n = 0;
      cudaError_t e = cudaGetDeviceCount(&n);
      for (int d = 0; e == cudaSuccess && d < n; ++d) {
        e = cudaSetDevice(d);
        if (e == cudaSuccess) e = cudaFree(nullptr);
      }
      _exit(e == cudaSuccess ? 0 : 100 + (int)std::min<unsigned>((unsigned)e, 100u));
    }
    if (pid < 0) return "fork failed";
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
    last = WIFEXITED(status) && WEXITSTATUS(status) >= 100
               ? fmt("a new process's CUDA initialisation: %s", cudaGetErrorName((cudaError_t)(WEXITSTATUS(status) - 100)))
               : describeStatus(status);
    usleep(200000);
  } while (nowSec() < deadline);
  return last;
}

class ForkedRanks
{
public:
  ForkedRanks(int nranks, double alarmS, const std::function<int(int)>& body)
    : pids_(nranks, -1), status_(nranks, -1), ended_(nranks, 0)
  {
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nranks; ++r) {
      pids_[r] = example::forkRankProcess();
      if (pids_[r] == 0) {
        gAlarmRank = r;
        signal(SIGALRM, onAlarm);
        alarm((unsigned)alarmS);
        const int rc = body(r);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
      }
    }
  }

  int size() const { return (int)pids_.size(); }
  int status(int r) const { return status_[r]; }
  double ended(int r) const { return ended_[r]; }

  // Whether rank r has ended (its waitpid status is then status(r)).
  bool reap(int r)
  {
    int st = 0;
    if (status_[r] == -1 && waitpid(pids_[r], &st, WNOHANG) == pids_[r]) {
      status_[r] = st;
      ended_[r] = nowSec();
    }
    return status_[r] != -1;
  }

  // Waits until ready(r) holds for every rank, a rank ends before it got ready (`*early`), or `seconds`
  // pass; whether every rank got ready. A rank that ends once ready counts as ready: the parent polls, and a
  // rank may be done with its part before the parent's next look.
  bool waitReady(const std::function<bool(int)>& ready, double seconds, bool* early)
  {
    const double deadline = nowSec() + seconds;
    bool all = false;
    *early = false;
    while (!all && !*early && nowSec() < deadline) {
      all = true;
      for (int r = 0; r < size(); ++r) {
        const bool ended = reap(r);
        const bool isReady = ready(r);
        all = all && isReady;
        *early = *early || (ended && !isReady);
      }
      if (!all) usleep(10000);
    }
    return all && !*early;
  }

  // Waits at most `seconds` for every rank but `except` (-1: none) to end on its own.
  void waitEnded(double seconds, int except = -1)
  {
    const double deadline = nowSec() + seconds;
    for (int left = size(); left > 0 && nowSec() < deadline; usleep(10000)) {
      left = 0;
      for (int r = 0; r < size(); ++r) left += r != except && !reap(r) ? 1 : 0;
    }
  }

  void kill(int r) { ::kill(pids_[r], SIGKILL); }

  // SIGKILLs and reaps every rank still alive; which ranks those were.
  std::vector<bool> killRest()
  {
    std::vector<bool> killed(size(), false);
    for (int r = 0; r < size(); ++r) {
      if (reap(r)) continue;
      ::kill(pids_[r], SIGKILL);
      int st = 0;
      waitpid(pids_[r], &st, 0);
      status_[r] = st;
      ended_[r] = nowSec();
      killed[r] = true;
    }
    return killed;
  }

private:
  std::vector<pid_t> pids_;
  std::vector<int> status_;
  std::vector<double> ended_;
};
} // namespace tc

#endif // MSCCLPP_CASE_RUNNER_H_
