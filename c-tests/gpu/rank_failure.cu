// A rank that dies or goes silent, on GPUs: every other rank's kernel ends and its host learns which rank
// failed, instead of spinning forever.
//
// Ranks form a ring: each puts into the next rank's buffer and waits for the previous one, in one long
// kernel, until its host says stop. The parent process forks the ranks and, two seconds after all are
// running, hurts one (the "victim"). Each survivor polls mscclppCommGetAsyncError, and once it reports an
// error, asks its kernel to stop, waits for it, stops the proxy and destroys the communicator. Checked per
// survivor: the error is mscclppRemoteError, the library's log names the victim, it came within 10 s of
// the kill (MSCCLPP_PEER_TIMEOUT + 10 s for SIGSTOP), the kernel ended, and teardown took seconds.
//
// The same source is also built against the 0.1.0 header (build/tests/gpu/legacy/rank_failure): its
// kernels carry the legacy device code, which the library must release from outside.
//
//   rank_failure <case> [nranks]
//   cases: kill_pingpong, kill_stream, kill_flush (SIGKILL of the last rank while it ping-pongs, streams
//          4 MiB putWithSignals, or flushes them), kill_rank0 (SIGKILL of rank 0, which hosts the root),
//          stop_pingpong (SIGSTOP of the last rank; MSCCLPP_PEER_TIMEOUT=4), abort (rank 0's host calls
//          mscclppCommAbort while every kernel waits), stuck_wait (every rank waits for a signal nobody
//          sends; MSCCLPP_WAIT_TIMEOUT=2: only kernels built on this library's header report it)
//   named only (not in "all": the library ends its survivors, which a leak check would count against them):
//          exit_endless: every rank ping-pongs through the proxy in a kernel that never ends (it looks at
//          neither aborted() nor its host) while its host waits in cudaStreamSynchronize; the last rank is
//          SIGKILLed; with MSCCLPP_ABORT_EXIT_TIMEOUT=3 every survivor must end with exit status 75 within
//          3 to 3 + EXIT_SLACK_S seconds of the kill, having logged the line that says so. Prints the time
//          from the kill to each process's end, and the time per iteration of the kernel before and after.
#include "mscclpp_rank.h"

#ifndef MSCCLPP_HAS_ABORT
// Built on the 0.1.0 header, which has neither: a legacy program that adopts failure handling on the
// host declares them itself (its kernels stay as they were).
extern "C" mscclppResult_t mscclppCommAbort(mscclppComm_t comm);
extern "C" mscclppResult_t mscclppCommGetAsyncError(mscclppComm_t comm, mscclppResult_t* asyncError);
#define RF_BUILD "legacy header"
#else
#define RF_BUILD "this header"
#endif

using namespace tc;

namespace {

enum Mode { kPingPong, kStream, kFlush, kWaitOnly, kEndless };

// MSCCLPP_ABORT_EXIT_TIMEOUT of exit_endless, what the library's documentation says the process then
// ends with (EX_TEMPFAIL), and how late past the timeout it may end.
constexpr int kExitTimeoutS = 3;
constexpr int kAbortExitStatus = 75;
constexpr double kExitSlackS = 5;

constexpr uint64_t kBytes = 4ull << 20;
constexpr int kBurst = 8;

struct Result
{
  int finished;
  int asyncError;
  double tError;     // when mscclppCommGetAsyncError first reported an error
  double tKernelEnd; // when the kernel was seen finished
  double stopS, destroyS;
  int stopRc, destroyRc;
  int kernelEnded;
  int logNamesRank; // the library logged a line naming the failed rank
  int logNamesWait; // the library logged the stuck wait (stuck_wait)
  int deviceSawAbort;
  unsigned long long iterations;
  // exit_endless: the kernel's iterations sampled by a host thread: at its first sample, when the victim
  // was hurt, and last (with their times), and the library's lines saying it ends the process.
  unsigned long long itersFirst, itersAtHurt, itersLast;
  double tFirst, tAtHurt, tLast;
  int exitLines;
  char note[300];
};

struct Shared
{
  volatile int ready[kMaxRanks];
  volatile double tHurt; // when the parent hurt the victim (or rank 0 aborted), CLOCK_MONOTONIC
  Result res[kMaxRanks];
};

__global__ void ringKernel(mscclppDevConn send, mscclppDevConn recv, int mode, volatile int* stop,
                           volatile unsigned long long* iterations, volatile int* sawAbort)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (unsigned long long i = 0; *stop == 0; ++i) {
    switch (mode) {
    case kPingPong:
      send.putWithSignal(0, 8);
      recv.wait();
      break;
    case kStream:
      for (int k = 0; k < kBurst; ++k) send.putWithSignal(0, kBytes);
      for (int k = 0; k < kBurst; ++k) recv.wait();
      break;
    case kFlush:
      for (int k = 0; k < kBurst; ++k) send.putWithSignal(0, kBytes);
      send.flush();
      for (int k = 0; k < kBurst; ++k) recv.wait();
      break;
    default:
      recv.wait();
      break;
    }
#ifdef MSCCLPP_HAS_ABORT
    if ((i & 63) == 0 && recv.aborted()) *sawAbort = 1;
#endif
    *iterations = i + 1;
  }
#ifdef MSCCLPP_HAS_ABORT
  // The host may tell the kernel to stop before the proxy has raised the abort word (the aborting rank
  // learns of its own abort at once): give the word a second to say so.
  const uint64_t since = mscclppGlobalTimerNs();
  while (!recv.aborted() && mscclppGlobalTimerNs() - since < 1000000000ull) {
  }
  if (recv.aborted()) *sawAbort = 1;
#endif
}

// Never ends, and never looks at aborted() or its host: as a kernel written for the 0.1.0 header that loops
// through the proxy. Only the end of the process ends it.
__global__ void endlessKernel(mscclppDevConn send, mscclppDevConn recv, volatile unsigned long long* iterations)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (unsigned long long i = 1;; ++i) {
    send.putWithSignal(0, 8);
    recv.wait();
    *iterations = i;
  }
}

// This rank's result, for the log handler (exit_endless counts the line that announces the exit).
Result* gResult = nullptr;

std::mutex& gLogMutex = *new std::mutex;
std::vector<std::string>& gLog = *new std::vector<std::string>;

void captureLog(const char* msg)
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  std::string m = msg ? msg : "";
  gLog.push_back(m);
  if (gResult && m.find("ending the process with exit status") != std::string::npos) ++gResult->exitLines;
  fprintf(stderr, "library log: %s", m.c_str());
  if (m.empty() || m.back() != '\n') fputc('\n', stderr);
}

bool logHas(const std::string& a, const std::string& b = "")
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  for (const std::string& l : gLog)
    if (l.find(a) != std::string::npos && (b.empty() || l.find(b) != std::string::npos)) return true;
  return false;
}

#define RF_CHECK(expr)                                                                                         \
  do {                                                                                                         \
    auto rf_rc = (expr);                                                                                       \
    if ((int)rf_rc != 0) {                                                                                     \
      snprintf(out.note, sizeof(out.note), "%s failed: %d", #expr, (int)rf_rc);                              \
      return 1;                                                                                                \
    }                                                                                                          \
  } while (0)

struct Case
{
  const char* name;
  Mode mode;
  int victim; // -1: none
  int signal;
  bool namedOnly; // run only when named, not by "all"
};

int rankMain(const Case& c, int rank, int nranks, int port, Shared* S)
{
  Result& out = S->res[rank];
  gResult = &out;
  int ngpus = 0;
  cudaGetDeviceCount(&ngpus);
  RF_CHECK(cudaSetDevice(rank % std::max(ngpus, 1)));
  mscclppSetLogHandler(captureLog);
  mscclppComm_t comm;
  RF_CHECK(mscclppCommInitRank(&comm, nranks, fmt("127.0.0.1:%d", port).c_str(), rank));
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  char *sendBuf = nullptr, *recvBuf = nullptr;
  RF_CHECK(cudaMalloc((void**)&sendBuf, kBytes));
  RF_CHECK(cudaMalloc((void**)&recvBuf, kBytes));
  // Tag r: rank r's connection to rank r+1, which puts into that rank's buffer and signals it.
  RF_CHECK(mscclppConnect(comm, next, rank, sendBuf, kBytes, mscclppTransportP2P));
  RF_CHECK(mscclppConnect(comm, prev, prev, recvBuf, kBytes, mscclppTransportP2P));
  RF_CHECK(mscclppConnectionSetup(comm));
  mscclppDevConn_t *send = nullptr, *recv = nullptr;
  RF_CHECK(mscclppGetDeviceConnection(comm, next, rank, &send));
  RF_CHECK(mscclppGetDeviceConnection(comm, prev, prev, &recv));
  int* stop = nullptr;
  unsigned long long* iterations = nullptr;
  int* sawAbort = nullptr;
  RF_CHECK(cudaHostAlloc((void**)&stop, sizeof(int), cudaHostAllocMapped));
  RF_CHECK(cudaHostAlloc((void**)&iterations, sizeof(*iterations), cudaHostAllocMapped));
  RF_CHECK(cudaHostAlloc((void**)&sawAbort, sizeof(int), cudaHostAllocMapped));
  *stop = 0;
  *iterations = 0;
  *sawAbort = 0;
  cudaFuncAttributes attr; // load the kernel before anything waits on the proxy (lazy loading)
  RF_CHECK(cudaFuncGetAttributes(&attr, ringKernel));
  RF_CHECK(cudaFuncGetAttributes(&attr, endlessKernel));
  cudaStream_t stream;
  RF_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RF_CHECK(mscclppProxyLaunch(comm));
  if (c.mode == kEndless) {
    endlessKernel<<<1, 1, 0, stream>>>(*send, *recv, iterations);
    RF_CHECK(cudaGetLastError());
    S->ready[rank] = 1;
    // A thread of the application samples the kernel's progress; the main thread waits for a kernel that
    // never ends, and never calls the library again. Only the library can end this process.
    std::thread([&] {
      for (;;) {
        const unsigned long long n = *(volatile unsigned long long*)iterations;
        const double t = nowSec();
        if (out.tFirst == 0 && n > 0) {
          out.itersFirst = n;
          out.tFirst = t;
        }
        if (out.tAtHurt == 0 && S->tHurt != 0) {
          out.itersAtHurt = n;
          out.tAtHurt = t;
        }
        out.itersLast = n;
        out.tLast = t;
        usleep(1000);
      }
    }).detach();
    const cudaError_t e = cudaStreamSynchronize(stream);
    snprintf(out.note, sizeof(out.note), "cudaStreamSynchronize returned %d: the endless kernel ended", (int)e);
    return 1;
  }
  ringKernel<<<1, 1, 0, stream>>>(*send, *recv, c.mode, stop, iterations, sawAbort);
  RF_CHECK(cudaGetLastError());
  S->ready[rank] = 1;

  std::thread aborter;
  if (c.victim < 0 && c.mode != kWaitOnly && rank == 0) {
    aborter = std::thread([&] {
      while (S->tHurt == 0) usleep(1000);
      mscclppResult_t r = mscclppCommAbort(comm);
      if (r != mscclppSuccess) snprintf(out.note, sizeof(out.note), "mscclppCommAbort returned %d", (int)r);
    });
  }

  // Until the library reports an error (the parent's deadline bounds this loop).
  mscclppResult_t err = mscclppSuccess;
  while (err == mscclppSuccess) {
    RF_CHECK(mscclppCommGetAsyncError(comm, &err));
    if (err == mscclppSuccess) usleep(2000);
  }
  out.tError = nowSec();
  out.asyncError = (int)err;
  *(volatile int*)stop = 1;
  const double kernelDeadline = nowSec() + 10;
  cudaError_t q;
  while ((q = cudaStreamQuery(stream)) == cudaErrorNotReady && nowSec() < kernelDeadline) usleep(500);
  out.tKernelEnd = nowSec();
  out.kernelEnded = q != cudaErrorNotReady;
  out.iterations = *(volatile unsigned long long*)iterations;
  out.deviceSawAbort = *(volatile int*)sawAbort;
  if (aborter.joinable()) aborter.join();
  double t = nowSec();
  out.stopRc = (int)mscclppProxyStop(comm);
  out.stopS = nowSec() - t;
  t = nowSec();
  out.destroyRc = (int)mscclppCommDestroy(comm);
  out.destroyS = nowSec() - t;
  // The rank to blame: the victim, or rank 0 for its mscclppCommAbort (which it need not name itself).
  out.logNamesRank = c.victim >= 0 ? logHas(fmt("rank %d", c.victim)) : rank == 0 || logHas("rank 0");
  out.logNamesWait = logHas("MSCCLPP_WAIT_TIMEOUT", "epoch 1");
  if (out.kernelEnded) {
    cudaStreamDestroy(stream);
    cudaFree(sendBuf);
    cudaFree(recvBuf);
    cudaFreeHost(stop);
    cudaFreeHost(iterations);
    cudaFreeHost(sawAbort);
    cudaDeviceReset();
  }
  out.finished = 1;
  return 0;
}

int runCase(const Case& c, int nranks)
{
  const bool stopCase = c.signal == SIGSTOP;
  const double peerTimeout = stopCase ? 4 : 30;
  setenv("MSCCLPP_PEER_TIMEOUT", fmt("%d", (int)peerTimeout).c_str(), 1);
  if (c.mode == kWaitOnly) setenv("MSCCLPP_WAIT_TIMEOUT", "2", 1);
  if (c.mode == kEndless) setenv("MSCCLPP_ABORT_EXIT_TIMEOUT", fmt("%d", kExitTimeoutS).c_str(), 1);
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    printf("FAIL %s: mmap failed\n", c.name);
    return 1;
  }
  Shared* S = (Shared*)mem;
  memset((void*)S, 0, sizeof(Shared));
  const int port = pickPort(0, 2);
  fflush(stdout);
  std::vector<pid_t> pids(nranks);
  for (int r = 0; r < nranks; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      alarm(120);
      int rc = rankMain(c, r, nranks, port, S);
      if (rc != 0) fprintf(stderr, "[rank %d] %s\n", r, S->res[r].note);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  }
  auto allReady = [&] {
    for (int r = 0; r < nranks; ++r)
      if (!S->ready[r]) return false;
    return true;
  };
  double deadline = nowSec() + 60;
  while (!allReady() && nowSec() < deadline) usleep(10000);
  bool ready = allReady();
  usleep(2000000);
  if (c.victim >= 0) kill(pids[c.victim], c.signal);
  S->tHurt = nowSec();
  const double limit = stopCase ? peerTimeout + 10 : 10;
  // Survivors have limit + teardown to finish.
  std::vector<int> status(nranks, -1);
  std::vector<double> endT(nranks, 0); // when each survivor was seen ended
  deadline = nowSec() + limit + 30;
  for (int left = nranks - (c.victim >= 0 ? 1 : 0); left > 0 && nowSec() < deadline;) {
    left = 0;
    for (int r = 0; r < nranks; ++r) {
      if (r == c.victim || status[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        endT[r] = nowSec();
      } else
        ++left;
    }
    usleep(c.mode == kEndless ? 1000 : 10000);
  }
  for (int r = 0; r < nranks; ++r) {
    if (status[r] != -1) continue;
    kill(pids[r], SIGKILL);
    int st;
    waitpid(pids[r], &st, 0);
    if (r != c.victim) status[r] = -2;
  }
  int failed = 0;
  std::string info;
  for (int r = 0; r < nranks; ++r) {
    if (r == c.victim) continue;
    const Result& o = S->res[r];
    std::string why;
    if (!ready) why = "not every rank got its kernel running";
    else if (status[r] == -2) why = "did not finish (killed after the deadline)";
    else if (c.mode == kEndless) {
      const double end = endT[r] - S->tHurt;
      const double usBefore = o.itersAtHurt > o.itersFirst ? (o.tAtHurt - o.tFirst) * 1e6 / (o.itersAtHurt - o.itersFirst) : 0;
      const double usAfter = o.itersLast > o.itersAtHurt ? (o.tLast - o.tAtHurt) * 1e6 / (o.itersLast - o.itersAtHurt) : 0;
      if (WIFSIGNALED(status[r])) why = fmt("killed by signal %d, not ended by the library", WTERMSIG(status[r]));
      else if (WEXITSTATUS(status[r]) != kAbortExitStatus)
        why = fmt("exit status %d, want %d (%s)", WEXITSTATUS(status[r]), kAbortExitStatus, o.note);
      else if (end < kExitTimeoutS - 0.01 || end > kExitTimeoutS + kExitSlackS)
        why = fmt("ended %.3f s after the kill, want %d to %.0f s", end, kExitTimeoutS, kExitTimeoutS + kExitSlackS);
      else if (o.exitLines != 1)
        why = fmt("%d log lines say the library ends the process, want 1", o.exitLines);
      else
        info += fmt(" rank%d: ended with status %d %.3f s after the kill; the kernel took %.2f us per iteration "
                    "before the kill, %.3f us after (%llu iterations after);",
                    r, kAbortExitStatus, end, usBefore, usAfter, o.itersLast - o.itersAtHurt);
    }
    else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0 || !o.finished) why = fmt("ended badly: %s", o.note);
    else {
      const double detect = o.tError - S->tHurt;
      const bool localAbort = c.victim < 0 && c.mode != kWaitOnly && r == 0;
      if (c.mode == kWaitOnly) {
        if (o.asyncError == mscclppSuccess) why = "no error reported";
      } else if (!localAbort && o.asyncError != mscclppRemoteError)
        why = fmt("async error %d, not mscclppRemoteError", o.asyncError);
      else if (localAbort && o.asyncError == mscclppSuccess)
        why = "no error after mscclppCommAbort";
      if (why.empty() && c.mode != kWaitOnly && detect > limit) why = fmt("error after %.2f s (limit %.0f s)", detect, limit);
      if (why.empty() && c.mode == kWaitOnly && detect > 2 + 10) why = fmt("stuck wait reported after %.2f s", detect);
      if (why.empty() && !o.kernelEnded) why = "the kernel still spins 10 s after the error";
      if (why.empty() && c.mode != kWaitOnly && !o.logNamesRank) why = "no log line names the failed rank";
#ifdef MSCCLPP_HAS_ABORT
      if (why.empty() && !o.deviceSawAbort) why = "the kernel's aborted() never said so";
#endif
      if (why.empty() && (o.stopS > 10 || o.destroyS > 10))
        why = fmt("teardown too slow: stop %.2f s, destroy %.2f s", o.stopS, o.destroyS);
      if (why.empty() && o.destroyRc != 0 && o.destroyRc != mscclppRemoteError && o.destroyRc != o.asyncError)
        why = fmt("mscclppCommDestroy returned %d", o.destroyRc);
      if (why.empty())
        info += fmt(" rank%d: error %d after %.3f s, kernel ended %.1f ms later (%llu iterations), stop %.2f s (rc %d), destroy %.2f s;",
                    r, o.asyncError, detect, (o.tKernelEnd - o.tError) * 1e3, o.iterations, o.stopS, o.stopRc, o.destroyS);
    }
    if (!why.empty()) {
      printf("FAIL %s_%dranks (%s): rank %d: %s\n", c.name, nranks, RF_BUILD, r, why.c_str());
      ++failed;
    }
  }
  if (c.mode == kWaitOnly) {
    // The first rank whose wait is reported aborts the others (they see mscclppRemoteError naming it),
    // so one report is what every rank can count on.
    int reports = 0;
    for (int r = 0; r < nranks; ++r) reports += S->res[r].logNamesWait;
    if (reports == 0) {
      printf("FAIL %s_%dranks (%s): no rank logged the stuck wait with its epoch\n", c.name, nranks, RF_BUILD);
      ++failed;
    }
    info += fmt(" %d rank(s) logged their stuck wait;", reports);
  }
  if (!failed) printf("PASS %s_%dranks (%s):%s\n", c.name, nranks, RF_BUILD, info.c_str());
  fflush(stdout);
  munmap(mem, sizeof(Shared));
  unsetenv("MSCCLPP_WAIT_TIMEOUT");
  unsetenv("MSCCLPP_ABORT_EXIT_TIMEOUT");
  return failed;
}

} // namespace

int main(int argc, char** argv)
{
  const Case cases[] = {
    {"kill_pingpong", kPingPong, -2, SIGKILL, false}, {"kill_stream", kStream, -2, SIGKILL, false},
    {"kill_flush", kFlush, -2, SIGKILL, false},       {"kill_rank0", kPingPong, 0, SIGKILL, false},
    {"stop_pingpong", kPingPong, -2, SIGSTOP, false}, {"abort", kPingPong, -1, 0, false},
    {"stuck_wait", kWaitOnly, -1, 0, false},          {"exit_endless", kEndless, -2, SIGKILL, true},
  };
  if (argc < 2) {
    fprintf(stderr, "usage: %s <case|all> [nranks]\n", argv[0]);
    return 2;
  }
  const int nranks = argc > 2 ? atoi(argv[2]) : 2;
  if (nranks < 2 || nranks > kMaxRanks) {
    fprintf(stderr, "nranks must be in [2, %d]\n", kMaxRanks);
    return 2;
  }
  int failed = 0, ran = 0;
  for (Case c : cases) {
    if (strcmp(argv[1], c.name) != 0 && (strcmp(argv[1], "all") != 0 || c.namedOnly)) continue;
#ifndef MSCCLPP_HAS_ABORT
    if (c.mode == kWaitOnly) {
      // Legacy device code cannot report a stuck wait: its wait() is compiled into the program.
      printf("SKIP %s (%s): legacy kernels do not report stuck waits\n", c.name, RF_BUILD);
      continue;
    }
#endif
    if (c.victim == -2) c.victim = nranks - 1;
    ++ran;
    failed += runCase(c, nranks);
  }
  if (ran == 0) {
    printf("FAIL rank_failure: no case named %s\n", argv[1]);
    return 1;
  }
  printf("SUMMARY rank_failure (%s, %d ranks): %d passed, %d failed\n", RF_BUILD, nranks, ran - failed, failed);
  return failed ? 1 : 0;
}
