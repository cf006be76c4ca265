// same_process_test.cu: connections between two communicators of ONE process (threads, not processes).
//
// The library notices at set-up that the peer lives in the same process and uses the peer's buffer and
// epoch counters directly (CUDA IPC cannot open a process's own allocations). Cases:
//   two_gpus   rank 0 on GPU 0, rank 1 on GPU 1
//   same_gpu   both ranks on GPU 0
// Each case runs in a child process, so that a hang or a crash fails that case only; the parent touches no
// CUDA. In the child, two threads each create a communicator (ranks 0 and 1 of one job at 127.0.0.1 on a
// free port), connect to each other and launch kernels that move data both ways at once, in three rounds:
//   1. put() of the whole slot, signal(), flush(); wait()
//   2. 256 puts of 16 KiB chunks into reversed places, the last as putWithSignal(), then flush(); wait()
//      (more triggers than the FIFO has slots, and source offsets that differ from destination offsets)
//   3. putWithSignalAndFlush() of the whole slot; wait()
// After each wait() the kernel checks every received element, and the host checks the whole buffer again:
// the peer's slot holds the peer's data, our own slot is untouched.
//
// Prints `PASS <case>: ...`, `FAIL <case>: <reason>` or `SKIP <case>: <why>` per case, then a summary;
// exits non-zero if a case failed. Usage: same_process_test [two_gpus] [same_gpu]
#include <cuda_runtime.h>
#include <mscclpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr uint64_t kSlotElems = 1u << 20; // 4 MiB of uint32_t per rank
constexpr uint64_t kSlotBytes = kSlotElems * sizeof(uint32_t);
constexpr uint64_t kBuffBytes = 2 * kSlotBytes; // slot r belongs to rank r
constexpr int kChunks = 256;                    // round 2: 256 puts, twice the FIFO's 128 slots
constexpr uint64_t kChunkElems = kSlotElems / kChunks;
constexpr uint64_t kChunkBytes = kChunkElems * sizeof(uint32_t);
constexpr uint32_t kSentinel = 0xDEADBEEFu; // what the receiving slot holds before a round
constexpr int kRounds = 3;
constexpr uint64_t kWaitTimeoutNs = 10ull * 1000 * 1000 * 1000;
constexpr double kKernelDeadlineSec = 20;
constexpr unsigned kCaseAlarmSec = 60;
constexpr double kCaseDeadlineSec = 70;

const char* const kRoundNames[kRounds + 1] = {
  "", "put+signal+flush", "256 reversed-chunk puts with putWithSignal, flush", "putWithSignalAndFlush"};

// The case the child runs, for its messages.
const char* gCase = "?";
std::mutex gPrintMutex;

// Ends the case: one FAIL line (the runner counts it), exit code 1. The other thread may be stuck
// waiting for this one, so nothing is torn down.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fail(const char* fmt, ...)
{
  std::lock_guard<std::mutex> lock(gPrintMutex);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  printf("FAIL %s: %s\n", gCase, msg);
  fflush(stdout);
  _exit(1);
}

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess) fail("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(err_));   \
  } while (0)

#define MSCCLPP_CHECK(call)                                                                               \
  do {                                                                                                    \
    mscclppResult_t res_ = (call);                                                                        \
    if (res_ != mscclppSuccess) {                                                                         \
      fail("%s:%d: %s: %s (%d)", __FILE__, __LINE__, #call, mscclppGetErrorString(res_), (int)res_);      \
    }                                                                                                     \
  } while (0)

double nowSec()
{
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Element i of the slot of rank `rank` in `round`: never the sentinel, different per round, rank and place.
__host__ __device__ inline uint32_t patternWord(int round, int rank, uint64_t i)
{
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(rank + 1) << 48) ^ ((uint64_t)round << 56);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  const uint32_t v = (uint32_t)x;
  return v == kSentinel ? v ^ 1u : v;
}

// What element i of the peer's slot must hold after `round` (round 2 reverses the chunks' order).
__host__ __device__ inline uint32_t expectedFromPeer(int round, int peer, uint64_t i)
{
  if (round == 2) {
    const uint64_t chunk = i / kChunkElems, e = i % kChunkElems;
    return patternWord(round, peer, (kChunks - 1 - chunk) * kChunkElems + e);
  }
  return patternWord(round, peer, i);
}

__global__ void fillKernel(uint32_t* buff, int rank, int round)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < 2 * kSlotElems;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const int slot = (int)(i / kSlotElems);
    buff[i] = slot == rank ? patternWord(round, rank, i % kSlotElems) : kSentinel;
  }
}

struct KernelStatus
{
  int timedOut;
  unsigned int badElems;
  unsigned int firstBad; // index of one wrong element in the peer's slot
  uint32_t firstBadValue;
};

__device__ __forceinline__ uint64_t globalTimerNs()
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// wait() with a watchdog: once the peer's signal is there, wait() records it and returns at once.
__device__ bool waitWithTimeout(mscclppDevConn& conn)
{
  const uint64_t expected = *conn.waitEpochId + 1;
  const uint64_t start = globalTimerNs();
  while (*reinterpret_cast<volatile uint64_t*>(&conn.localSignalEpochId->proxy) < expected) {
    if (globalTimerNs() - start > kWaitTimeoutNs) return false;
  }
  conn.wait();
  return true;
}

// Thread 0 sends our slot and waits for the peer's; then the whole block checks what arrived.
__global__ void roundKernel(mscclppDevConn conn, int round, int rank, uint32_t* buff, KernelStatus* status)
{
  __shared__ int arrived;
  if (threadIdx.x == 0) {
    const uint64_t slot = (uint64_t)rank * kSlotBytes;
    if (round == 1) {
      conn.put(slot, slot, kSlotBytes);
      conn.signal();
      conn.flush();
    } else if (round == 2) {
      for (int k = 0; k < kChunks; ++k) {
        const uint64_t src = slot + (uint64_t)k * kChunkBytes;
        const uint64_t dst = slot + (uint64_t)(kChunks - 1 - k) * kChunkBytes;
        if (k + 1 < kChunks) {
          conn.put(dst, src, kChunkBytes);
        } else {
          conn.putWithSignal(dst, src, kChunkBytes);
        }
      }
      conn.flush();
    } else {
      conn.putWithSignalAndFlush(slot, kSlotBytes);
    }
    arrived = waitWithTimeout(conn) ? 1 : 0;
    if (!arrived) status->timedOut = 1;
  }
  __syncthreads();
  if (!arrived) return;
  const int peer = 1 - rank;
  const volatile uint32_t* fromPeer = buff + (uint64_t)peer * kSlotElems;
  for (uint64_t i = threadIdx.x; i < kSlotElems; i += blockDim.x) {
    const uint32_t got = fromPeer[i];
    if (got != expectedFromPeer(round, peer, i)) {
      if (atomicAdd(&status->badElems, 1u) == 0) {
        status->firstBad = (unsigned int)i;
        status->firstBadValue = got;
      }
    }
  }
}

// Two threads meet here (to share pointers after set-up).
class ThreadBarrier
{
public:
  void arrive()
  {
    std::unique_lock<std::mutex> lock(m_);
    const int gen = gen_;
    if (++count_ == 2) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  int count_ = 0;
  int gen_ = 0;
};

struct Shared
{
  bool sameGpu = false;
  int port = 0;
  ThreadBarrier barrier;
  void* buff[2] = {nullptr, nullptr};
  mscclppDevConn conn[2];
};

// One rank of the case, on its own thread.
void runRank(int rank, Shared* sh)
{
  const int gpu = sh->sameGpu ? 0 : rank;
  const int peer = 1 - rank;
  CUDA_CHECK(cudaSetDevice(gpu)); // the communicator takes the GPU current on the creating thread
  CUDA_CHECK(cudaFree(nullptr));
  // Load the kernels now: with both ranks on one GPU, loading one lazily at its first launch could wait
  // for the GPU to go idle while the peer's kernel spins waiting for ours.
  cudaFuncAttributes attr;
  CUDA_CHECK(cudaFuncGetAttributes(&attr, fillKernel));
  CUDA_CHECK(cudaFuncGetAttributes(&attr, roundKernel));

  // All allocations first: with both ranks on one GPU, cudaMalloc/cudaFree during the peer's kernel could
  // wait for it. Streams are non-blocking for the same reason.
  uint32_t* buff = nullptr;
  KernelStatus* status = nullptr;
  cudaStream_t stream;
  cudaEvent_t done;
  CUDA_CHECK(cudaMalloc(&buff, kBuffBytes));
  CUDA_CHECK(cudaMalloc(&status, sizeof(KernelStatus)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreate(&done));
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> host(2 * kSlotElems);
  sh->buff[rank] = buff;

  const std::string address = "127.0.0.1:" + std::to_string(sh->port);
  mscclppComm_t comm;
  MSCCLPP_CHECK(mscclppCommInitRank(&comm, 2, address.c_str(), rank));
  MSCCLPP_CHECK(mscclppConnect(comm, peer, /*tag*/ 7, buff, kBuffBytes, mscclppTransportP2P));
  MSCCLPP_CHECK(mscclppConnectionSetup(comm));
  mscclppDevConn_t* devConns = nullptr;
  int nConns = 0;
  MSCCLPP_CHECK(mscclppGetAllDeviceConnections(comm, &devConns, &nConns));
  if (nConns != 1) fail("rank %d: %d connections, expected 1", rank, nConns);
  const mscclppDevConn conn = devConns[0];
  sh->conn[rank] = conn;
  sh->barrier.arrive(); // both ranks have published their buffer and connection

  // The peer is in this process: its buffer and epoch counters are used as they are.
  const mscclppDevConn& other = sh->conn[peer];
  if (conn.remoteRank != peer || conn.tag != 7) {
    fail("rank %d: connection to rank %d tag %d, expected rank %d tag 7", rank, conn.remoteRank, conn.tag, peer);
  }
  if (conn.localBuff != buff) fail("rank %d: localBuff %p is not our buffer %p", rank, conn.localBuff, (void*)buff);
  if (conn.remoteBuff != sh->buff[peer]) {
    fail("rank %d: remoteBuff %p is not the peer's buffer %p", rank, conn.remoteBuff, sh->buff[peer]);
  }
  if (conn.localSignalEpochId == nullptr || conn.waitEpochId == nullptr) {
    fail("rank %d: the connection has no epoch counters", rank);
  }
  if (conn.remoteSignalEpochId != other.localSignalEpochId) {
    fail("rank %d: remoteSignalEpochId %p is not the peer's counters %p", rank, (void*)conn.remoteSignalEpochId,
         (void*)other.localSignalEpochId);
  }

  MSCCLPP_CHECK(mscclppProxyLaunch(comm));
  for (int round = 1; round <= kRounds; ++round) {
    fillKernel<<<256, 512, 0, stream>>>(buff, rank, round);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(status, 0, sizeof(KernelStatus), stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // Both slots are filled before either rank puts. The peer's puts of the last round all landed before
    // our last wait() returned, so none can overwrite this fill.
    MSCCLPP_CHECK(mscclppBootstrapBarrier(comm));

    roundKernel<<<1, 512, 0, stream>>>(conn, round, rank, buff, status);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaEventRecord(done, stream));
    const double deadline = nowSec() + kKernelDeadlineSec;
    for (;;) {
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) fail("rank %d round %d (%s): %s", rank, round, kRoundNames[round], cudaGetErrorString(e));
      if (nowSec() > deadline) {
        fail("rank %d round %d (%s): the kernel did not finish within %.0f s (flush() stuck?)", rank, round,
             kRoundNames[round], kKernelDeadlineSec);
      }
      usleep(200);
    }

    KernelStatus st;
    CUDA_CHECK(cudaMemcpyAsync(&st, status, sizeof(st), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(host.data(), buff, kBuffBytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (st.timedOut) {
      fail("rank %d round %d (%s): no signal from rank %d within %.0f s", rank, round, kRoundNames[round], peer,
           kWaitTimeoutNs / 1e9);
    }
    if (st.badElems != 0) {
      fail("rank %d round %d (%s): after wait() the kernel saw %u wrong element(s) from rank %d; element %u is "
           "0x%08x, expected 0x%08x",
           rank, round, kRoundNames[round], st.badElems, peer, st.firstBad, st.firstBadValue,
           expectedFromPeer(round, peer, st.firstBad));
    }
    for (int slot = 0; slot < 2; ++slot) {
      for (uint64_t i = 0; i < kSlotElems; ++i) {
        const uint32_t got = host[(uint64_t)slot * kSlotElems + i];
        const uint32_t want = slot == rank ? patternWord(round, rank, i) : expectedFromPeer(round, peer, i);
        if (got != want) {
          fail("rank %d round %d (%s): %s slot, element %llu is 0x%08x, expected 0x%08x", rank, round,
               kRoundNames[round], slot == rank ? "our own (source)" : "the peer's", (unsigned long long)i, got,
               want);
        }
      }
    }
  }

  // ProxyStop begins with a barrier: the peer's kernels are done before anything is freed.
  MSCCLPP_CHECK(mscclppProxyStop(comm));
  MSCCLPP_CHECK(mscclppCommDestroy(comm));
  CUDA_CHECK(cudaEventDestroy(done));
  CUDA_CHECK(cudaStreamDestroy(stream));
  CUDA_CHECK(cudaFree(status));
  CUDA_CHECK(cudaFree(buff));
}

// A port on 127.0.0.1 that nobody listens at now.
int freePort()
{
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail("socket: %s", strerror(errno));
  sockaddr_in addr;
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, (sockaddr*)&addr, sizeof(addr)) != 0 || getsockname(fd, (sockaddr*)&addr, &len) != 0) {
    fail("picking a free port: %s", strerror(errno));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void onAlarm(int)
{
  char msg[160];
  const int n = snprintf(msg, sizeof(msg), "FAIL %s: time limit of %u s reached; something hangs\n", gCase,
                         kCaseAlarmSec);
  ssize_t ignored = write(STDOUT_FILENO, msg, n > 0 ? (size_t)n : 0);
  (void)ignored;
  _exit(1);
}

// The body of a case's child process. Exit codes: 0 passed, 1 failed, 3 skipped (each prints its line).
int runCase(const std::string& name)
{
  gCase = name.c_str();
  // Every kernel loaded when the context starts (runRank() also preloads its kernels): see runRank().
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  signal(SIGALRM, onAlarm);
  alarm(kCaseAlarmSec);
  Shared sh;
  sh.sameGpu = name == "same_gpu";
  int nGpus = 0;
  const cudaError_t e = cudaGetDeviceCount(&nGpus);
  if (e != cudaSuccess) nGpus = 0;
  const int needed = sh.sameGpu ? 1 : 2;
  if (nGpus < needed) {
    printf("SKIP %s: %d GPU(s) found, %d needed%s%s\n", gCase, nGpus, needed, e != cudaSuccess ? ": " : "",
           e != cudaSuccess ? cudaGetErrorString(e) : "");
    return 3;
  }
  if (!sh.sameGpu) {
    int canAccess = 0;
    CUDA_CHECK(cudaDeviceCanAccessPeer(&canAccess, 0, 1));
    if (!canAccess) fail("GPU 0 cannot access GPU 1");
  }
  sh.port = freePort();
  std::thread t0(runRank, 0, &sh), t1(runRank, 1, &sh);
  t0.join();
  t1.join();
  printf("PASS %s: %s, both directions at once, %d rounds (%s; %s; %s) of %llu bytes, every element checked "
         "on the GPU after wait() and on the host; the connection uses the peer's buffer and epoch counters "
         "directly\n",
         gCase, sh.sameGpu ? "both communicators on GPU 0" : "communicators on GPU 0 and GPU 1", kRounds,
         kRoundNames[1], kRoundNames[2], kRoundNames[3], (unsigned long long)kSlotBytes);
  return 0;
}

} // namespace

int main(int argc, char** argv)
{
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::string> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != "two_gpus" && arg != "same_gpu") {
      fprintf(stderr, "usage: %s [two_gpus] [same_gpu]\n", argv[0]);
      return 2;
    }
    cases.push_back(arg);
  }
  if (cases.empty()) cases = {"two_gpus", "same_gpu"};

  int passed = 0, failed = 0, skipped = 0;
  for (const std::string& name : cases) {
    fflush(stdout);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      printf("FAIL %s: fork: %s\n", name.c_str(), strerror(errno));
      ++failed;
      continue;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int rc = runCase(name);
      fflush(stdout);
      _exit(rc);
    }
    // The parent only waits, with a deadline, and names what the child could not report itself.
    const double deadline = nowSec() + kCaseDeadlineSec;
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &status, WNOHANG)) == 0 && nowSec() < deadline) usleep(10000);
    if (got == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      printf("FAIL %s: did not finish within %.0f s\n", name.c_str(), kCaseDeadlineSec);
      ++failed;
    } else if (got < 0) {
      printf("FAIL %s: waitpid: %s\n", name.c_str(), strerror(errno));
      ++failed;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      ++passed;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 1) {
      ++failed; // the child printed its FAIL line
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
      ++skipped;
    } else if (WIFSIGNALED(status)) {
      printf("FAIL %s: killed by signal %d (%s)\n", name.c_str(), WTERMSIG(status), strsignal(WTERMSIG(status)));
      ++failed;
    } else {
      printf("FAIL %s: exit code %d\n", name.c_str(), WEXITSTATUS(status));
      ++failed;
    }
  }
  printf("same_process_test: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed == 0 ? 0 : 1;
}
