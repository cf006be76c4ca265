// The floor of any host proxy on this machine, without this library: the bidirectional putWithSignal
// loop of bidir_put with the library replaced by the least a host proxy must do. Per GPU, one kernel
// thread writes a request number into page-locked host memory and spins until the peer's flag reaches
// it; one host thread per GPU spins on the request, queues the data copy into the peer's buffer and
// raises the peer's flag after it, in one of these ways:
//
//   flag    the flag alone (no data): an 8-byte copy of the value from a device table (the one-way signal)
//   copy2   the data copy, then that 8-byte copy (this library's way: exact, ordered by the copy engine)
//   write   the data copy, then a stream memory write of the value
//   query   the data copy, then the host thread asks the stream until it is idle and stores the value
//           into host memory that the peer's kernel polls
//   fifo    copy2, with the request pushed as this library's FIFO pushes a trigger: a device atomic claims
//           a position, then one 16-byte store writes the slot (what the legacy protocol adds on the device)
//   flush   copy2, then the host thread asks the stream until it is idle and stores the request number
//           into host memory that its own kernel polls: the kernel goes on once its own data has landed
//           and the peer's flag has come (the step of the all-gather benchmark's kernel 0:
//           putWithSignal, flush, wait)
//
// Each way runs with the peer's memory reached as this library reaches it (mode=ipc: one process per GPU,
// CUDA IPC handles) and through peer access within one process (mode=peer). One iteration is one
// putWithSignal each way, so its time is the one-way latency of a put and its flag. Prints, per mode, way
// and size, the time per iteration (median of repeats) and the host thread's CPU time per request inside
// the calls that queue its work; the data is checked at both ends after each way.
//
//   proxy_floor [ignored arguments]
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int kRepeats = 5;
constexpr uint64_t kSpinLimitNs = 2000000000ull; // a kernel that waits 2 s gives up
constexpr uint64_t kMaxBytes = 1ull << 20;
constexpr uint64_t kMaxIters = 5000;

// This file's own checks, not those of ../common/: the program measures a proxy without this library, so it
// uses nothing of it and a reader sees all it does here; a failure is a `FAIL proxy_floor: ...` line on
// stdout, where run_bench.sh looks for it. They end the process with _exit(): they run in forked children
// and in one of two threads, where exit() would run exit handlers and destructors while the other side
// still runs.
#define CHECK(call)                                                                                        \
  do {                                                                                                     \
    cudaError_t e_ = (call);                                                                               \
    if (e_ != cudaSuccess) {                                                                               \
      printf("FAIL proxy_floor: %s: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__);             \
      fflush(stdout);                                                                                      \
      _exit(1);                                                                                            \
    }                                                                                                      \
  } while (0)
#define CHECK_CU(call)                                                                                     \
  do {                                                                                                     \
    CUresult r_ = (call);                                                                                  \
    if (r_ != CUDA_SUCCESS) {                                                                              \
      printf("FAIL proxy_floor: %s: CUresult %d (line %d)\n", #call, (int)r_, __LINE__);                   \
      fflush(stdout);                                                                                      \
      _exit(1);                                                                                            \
    }                                                                                                      \
  } while (0)

// Driver entry points, fetched through the runtime (nothing to link against).
CUresult (*pMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult (*pStreamWriteValue64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
CUresult (*pStreamQuery)(CUstream);

template <class F>
void entry(const char* name, F** fn)
{
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, (void**)fn, 13000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || *fn == nullptr) {
    printf("FAIL proxy_floor: driver entry point %s not found\n", name);
    _exit(1);
  }
}

__device__ uint64_t globalNs()
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One request per iteration; the next only once the peer's flag has reached this one.
// With `done`, also until the host thread has seen this request's data land.
// With `head`, each request is pushed as a FIFO trigger (claim, then a 16-byte store).
__global__ void loopKernel(volatile uint64_t* request, const volatile uint64_t* flag, const volatile uint64_t* done,
                           unsigned long long* head, uint64_t iters, int* timedOut)
{
  for (uint64_t i = 1; i <= iters; ++i) {
    if (head != nullptr) {
      const uint64_t pos = atomicAdd(head, 1ull);
      asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(request), "l"(i), "l"(pos) : "memory");
    } else {
      *request = i;
    }
    const uint64_t t0 = globalNs();
    while (*flag < i || (done != nullptr && *done < i)) {
      if (globalNs() - t0 > kSpinLimitNs) {
        *timedOut = 1;
        return;
      }
    }
  }
}

__host__ __device__ uint32_t patternWord(int rank, uint64_t i) { return (uint32_t)(i * 2654435761u) ^ (0x5eed0000u + rank); }

__global__ void fillKernel(uint32_t* p, uint64_t n, int rank)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = patternWord(rank, i);
}

enum class Way { Flag, Copy2, Fifo, Write, Query, Flush };
const char* const kWayNames[] = {"flag", "copy2", "fifo", "write", "query", "flush"};

// Memory both sides see: a barrier, the IPC handles, and each side's host flag (query way). Mapped
// shared and anonymous before any fork, so threads and processes use it alike.
struct Shared
{
  std::atomic<uint64_t> arrived;
  cudaIpcMemHandle_t dst[2], flag[2]; // mode=ipc
  char* dstPtr[2];                     // mode=peer
  uint64_t* flagPtr[2];
  alignas(4096) uint64_t flagHost[2][8];
};

void barrier(Shared* sh, uint64_t& generation)
{
  generation += 2;
  sh->arrived.fetch_add(1);
  while (sh->arrived.load() < generation) {
  }
}

struct Side
{
  int rank;
  bool ipc;
  Shared* sh;
  uint64_t gen = 0;
  char* src;
  char* dst;
  uint64_t* flagDev;      // written by the peer's copy engine
  uint64_t* flagHostDev;  // our host flag, as our kernel reads it (query way)
  uint64_t* table;        // table[k] = k on our GPU: the flag values copied from
  uint64_t* request;      // page-locked, mapped, 16 bytes: our kernel's request number (and a position)
  unsigned long long* head; // device memory: the positions the fifo way claims
  uint64_t* done;         // page-locked, mapped: the last request whose data has landed (flush way)
  int* timedOut;
  cudaStream_t kernelStream, proxyStream;
  char* peerDst;
  uint64_t* peerFlag;
  std::atomic<uint64_t>* peerFlagHost;
};

void spinUntilIdle(CUstream s)
{
  CUresult r;
  while ((r = pStreamQuery(s)) == CUDA_ERROR_NOT_READY) {
  }
  CHECK_CU(r);
}

// Serves `iters` requests; returns the CPU seconds spent in the calls that queue each request's work.
double serve(Way way, Side& me, uint64_t bytes, uint64_t iters)
{
  const CUstream s = (CUstream)me.proxyStream;
  volatile uint64_t* req = me.request;
  double busy = 0;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t served = 0; served < iters;) {
    if (*req <= served) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) {
        printf("FAIL proxy_floor: rank %d saw no request %llu\n", me.rank, (unsigned long long)served + 1);
        fflush(stdout);
        _exit(1);
      }
      continue;
    }
    ++served;
    const auto t0 = std::chrono::steady_clock::now();
    const CUdeviceptr data = (CUdeviceptr)me.peerDst, from = (CUdeviceptr)me.src;
    const CUdeviceptr flag = (CUdeviceptr)me.peerFlag, value = (CUdeviceptr)(me.table + served);
    switch (way) {
      case Way::Flag: CHECK_CU(pMemcpyDtoDAsync(flag, value, 8, s)); break;
      case Way::Copy2:
      case Way::Fifo:
        CHECK_CU(pMemcpyDtoDAsync(data, from, bytes, s));
        CHECK_CU(pMemcpyDtoDAsync(flag, value, 8, s));
        break;
      case Way::Write:
        CHECK_CU(pMemcpyDtoDAsync(data, from, bytes, s));
        CHECK_CU(pStreamWriteValue64(s, flag, served, 0));
        break;
      case Way::Query:
        CHECK_CU(pMemcpyDtoDAsync(data, from, bytes, s));
        spinUntilIdle(s);
        me.peerFlagHost->store(served, std::memory_order_release);
        break;
      case Way::Flush:
        CHECK_CU(pMemcpyDtoDAsync(data, from, bytes, s));
        CHECK_CU(pMemcpyDtoDAsync(flag, value, 8, s));
        spinUntilIdle(s);
        reinterpret_cast<std::atomic<uint64_t>*>(me.done)->store(served, std::memory_order_release);
        break;
    }
    busy += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return busy;
}

// One timed run of this side; returns (us per iteration, CPU us per request).
std::pair<double, double> runOnce(Side& me, Way way, uint64_t bytes, uint64_t iters)
{
  CHECK(cudaMemset(me.flagDev, 0, 8));
  me.sh->flagHost[me.rank][0] = 0;
  *(volatile uint64_t*)me.request = 0;
  *(volatile uint64_t*)me.done = 0;
  CHECK(cudaDeviceSynchronize());
  barrier(me.sh, me.gen); // both flags are zero before either side can raise the other's
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t* flag = way == Way::Query ? me.flagHostDev : me.flagDev;
  loopKernel<<<1, 1, 0, me.kernelStream>>>(me.request, flag, way == Way::Flush ? me.done : nullptr,
                                           way == Way::Fifo ? me.head : nullptr, iters, me.timedOut);
  CHECK(cudaGetLastError());
  const double busy = serve(way, me, bytes, iters);
  CHECK(cudaStreamSynchronize(me.kernelStream));
  CHECK(cudaStreamSynchronize(me.proxyStream));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (*me.timedOut) {
    printf("FAIL proxy_floor: %s: the kernel of rank %d waited 2 s for a flag\n", kWayNames[(int)way], me.rank);
    fflush(stdout);
    _exit(1);
  }
  barrier(me.sh, me.gen);
  return {s * 1e6 / (double)iters, busy * 1e6 / (double)iters};
}

bool dataArrived(Side& me, uint64_t bytes)
{
  const int peer = 1 - me.rank;
  const uint64_t last = bytes / 4 - 1;
  uint32_t a, b;
  CHECK(cudaMemcpy(&a, me.dst, 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&b, me.dst + 4 * last, 4, cudaMemcpyDeviceToHost));
  return a == patternWord(peer, 0) && b == patternWord(peer, last);
}

// Everything one side does; in the parent thread of its process (ipc) or a thread of the one process.
int sideMain(Side& me)
{
  CHECK(cudaSetDevice(me.rank));
  CHECK(cudaMalloc(&me.src, kMaxBytes));
  CHECK(cudaMalloc(&me.dst, kMaxBytes));
  CHECK(cudaMalloc(&me.flagDev, 8));
  CHECK(cudaMalloc(&me.table, 8 * (kMaxIters + 1)));
  std::vector<uint64_t> values(kMaxIters + 1);
  for (uint64_t k = 0; k <= kMaxIters; ++k) values[k] = k;
  CHECK(cudaMemcpy(me.table, values.data(), 8 * values.size(), cudaMemcpyHostToDevice));
  CHECK(cudaHostAlloc(&me.request, 64, cudaHostAllocMapped));
  CHECK(cudaMalloc(&me.head, 8));
  CHECK(cudaMemset(me.head, 0, 8));
  CHECK(cudaHostAlloc(&me.done, 64, cudaHostAllocMapped));
  CHECK(cudaHostAlloc(&me.timedOut, 64, cudaHostAllocMapped));
  *me.timedOut = 0;
  CHECK(cudaStreamCreateWithFlags(&me.kernelStream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&me.proxyStream, cudaStreamNonBlocking));
  fillKernel<<<64, 256>>>((uint32_t*)me.src, kMaxBytes / 4, me.rank);
  CHECK(cudaMemset(me.dst, 0, kMaxBytes));
  CHECK(cudaDeviceSynchronize());
  const int peer = 1 - me.rank;
  if (me.ipc) {
    CHECK(cudaHostRegister(me.sh->flagHost, sizeof(me.sh->flagHost), cudaHostRegisterMapped));
    CHECK(cudaIpcGetMemHandle(&me.sh->dst[me.rank], me.dst));
    CHECK(cudaIpcGetMemHandle(&me.sh->flag[me.rank], me.flagDev));
    barrier(me.sh, me.gen);
    CHECK(cudaIpcOpenMemHandle((void**)&me.peerDst, me.sh->dst[peer], cudaIpcMemLazyEnablePeerAccess));
    CHECK(cudaIpcOpenMemHandle((void**)&me.peerFlag, me.sh->flag[peer], cudaIpcMemLazyEnablePeerAccess));
  } else {
    if (me.rank == 0) CHECK(cudaHostRegister(me.sh->flagHost, sizeof(me.sh->flagHost), cudaHostRegisterMapped | cudaHostRegisterPortable));
    me.sh->dstPtr[me.rank] = me.dst;
    me.sh->flagPtr[me.rank] = me.flagDev;
    CHECK(cudaDeviceEnablePeerAccess(peer, 0));
    barrier(me.sh, me.gen);
    me.peerDst = me.sh->dstPtr[peer];
    me.peerFlag = me.sh->flagPtr[peer];
  }
  CHECK(cudaHostGetDevicePointer((void**)&me.flagHostDev, me.sh->flagHost[me.rank], 0));
  me.peerFlagHost = reinterpret_cast<std::atomic<uint64_t>*>(me.sh->flagHost[peer]);
  barrier(me.sh, me.gen);

  const struct
  {
    uint64_t bytes, iters;
  } sizes[] = {{1 << 10, 5000}, {32 << 10, 5000}, {512 << 10, 2000}, {1 << 20, 2000}};
  int failed = 0;
  for (const auto& sz : sizes) {
    for (Way way : {Way::Flag, Way::Copy2, Way::Fifo, Way::Write, Way::Query, Way::Flush}) {
      if (way == Way::Flag && sz.bytes != (1 << 10)) continue;
      CHECK(cudaMemset(me.dst, 0, sz.bytes));
      runOnce(me, way, sz.bytes, sz.iters / 10); // warm-up
      std::vector<double> us, cpu;
      for (int r = 0; r < kRepeats; ++r) {
        auto [u, c] = runOnce(me, way, sz.bytes, sz.iters);
        us.push_back(u);
        cpu.push_back(c);
      }
      std::sort(us.begin(), us.end());
      std::sort(cpu.begin(), cpu.end());
      const bool checked = way == Way::Flag || dataArrived(me, sz.bytes);
      if (!checked) {
        printf("FAIL proxy_floor: mode=%s way=%s bytes=%llu: rank %d did not receive the peer's data\n",
               me.ipc ? "ipc" : "peer", kWayNames[(int)way], (unsigned long long)sz.bytes, me.rank);
        failed = 1;
      }
      if (me.rank == 0) {
        const double med = us[kRepeats / 2];
        printf("BENCH proxy_floor mode=%s way=%s bytes=%llu us_per_iter=%.3f GBps_per_direction=%.2f min_us=%.3f "
               "max_us=%.3f cpu_us_per_request=%.3f iters=%llu checked=%d\n",
               me.ipc ? "ipc" : "peer", kWayNames[(int)way], (unsigned long long)sz.bytes, med,
               (double)sz.bytes / (med * 1e-6) / 1e9, us.front(), us.back(), cpu[kRepeats / 2],
               (unsigned long long)sz.iters, checked ? 1 : 0);
      }
      fflush(stdout);
      barrier(me.sh, me.gen);
    }
  }
  return failed;
}

Shared* mapShared()
{
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    printf("FAIL proxy_floor: mmap of the shared page failed\n");
    exit(1);
  }
  return new (p) Shared();
}

void loadEntryPoints()
{
  entry("cuMemcpyDtoDAsync", &pMemcpyDtoDAsync);
  entry("cuStreamWriteValue64", &pStreamWriteValue64);
  entry("cuStreamQuery", &pStreamQuery);
}

// Runs `body` in a child process; returns its exit status (non-zero on a crash).
template <class F>
int inChild(F body)
{
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    const int rc = body();
    fflush(stdout);
    _exit(rc);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

} // namespace

int main()
{
  // The parent never touches CUDA, so that the children it forks may.
  if (inChild([&] {
        int n = 0;
        return cudaGetDeviceCount(&n) == cudaSuccess && n >= 2 ? 0 : 2;
      }) != 0) {
    printf("SKIP proxy_floor: needs two GPUs\n");
    return 0;
  }
  int status = 0;
  // mode=ipc: one process per GPU, as this library's ranks.
  {
    Shared* sh = mapShared();
    pid_t pids[2];
    fflush(stdout);
    for (int r = 0; r < 2; ++r) {
      pids[r] = fork();
      if (pids[r] == 0) {
        loadEntryPoints();
        Side me{};
        me.rank = r;
        me.ipc = true;
        me.sh = sh;
        const int rc = sideMain(me);
        fflush(stdout);
        _exit(rc);
      }
    }
    for (pid_t pid : pids) {
      int st = 0;
      if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) status = 1;
    }
  }
  // mode=peer: one process, one thread per GPU, peer access.
  status |= inChild([] {
    loadEntryPoints();
    Shared* sh = mapShared();
    Side sides[2]{};
    int rc[2] = {0, 0};
    std::thread t[2];
    for (int r = 0; r < 2; ++r) {
      sides[r].rank = r;
      sides[r].sh = sh;
      t[r] = std::thread([&, r] {
        rc[r] = sideMain(sides[r]);
      });
    }
    for (auto& th : t) th.join();
    return rc[0] | rc[1];
  });
  if (status != 0) printf("FAIL proxy_floor: a rank failed (see above)\n");
  return status;
}
