// example_common.h: the helpers every example shares: error checks, whole-line printing, time-outs
// (so that a broken set-up ends with a message instead of a hang), and one child process per rank.
//
// Not a library interface: each example includes it as "../common/example_common.h". The GPU tests and the
// benchmarks have a harness of their own (c-tests/harness/), which reports each failure as a case's FAIL
// line where an example simply ends.
#ifndef MSCCLPP_EXAMPLE_COMMON_H_
#define MSCCLPP_EXAMPLE_COMMON_H_

#include <cuda_runtime.h>
#include <mscclpp.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace example {

// ---- printing and failing ----

inline std::mutex& printMutex()
{
  static std::mutex m;
  return m;
}

// Prints one whole line to stdout; threads and processes of one example share it.
inline void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void say(const char* fmt, ...)
{
  std::lock_guard<std::mutex> lock(printMutex());
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stdout, fmt, ap);
  va_end(ap);
  fputc('\n', stdout);
  fflush(stdout);
}

// Reports an error and ends the whole process with exit code 1. A failure in one thread or process
// leaves its peers waiting; ending at once (peers have their own time-outs) is the simplest safe answer.
[[noreturn]] inline void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] inline void die(const char* fmt, ...)
{
  char line[2048];
  int n = snprintf(line, sizeof(line), "ERROR: ");
  va_list ap;
  va_start(ap, fmt);
  const int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
  n += m > 0 ? m : 0;
  va_end(ap);
  if (n > (int)sizeof(line) - 2) n = (int)sizeof(line) - 2;
  line[n++] = '\n';
  {
    // One write, so that lines of processes failing together do not interleave.
    std::lock_guard<std::mutex> lock(printMutex());
    fflush(stdout);
    ssize_t ignored = write(STDERR_FILENO, line, n);
    (void)ignored;
  }
  _exit(1);
}

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess) {                                                                            \
      example::die("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(err_));          \
    }                                                                                                     \
  } while (0)

#define MSCCLPP_CHECK(call)                                                                               \
  do {                                                                                                    \
    mscclppResult_t res_ = (call);                                                                        \
    if (res_ != mscclppSuccess) {                                                                         \
      example::die("%s:%d: %s failed: %s (%d)", __FILE__, __LINE__, #call, mscclppGetErrorString(res_),   \
                   (int)res_);                                                                            \
    }                                                                                                     \
  } while (0)

// ---- time-outs ----

// How long a GPU thread waits for a peer's signal before it gives up. Legitimate waits in the examples
// last milliseconds; the margin covers a peer that launches its kernel late.
constexpr uint64_t kWaitTimeoutNs = 10ull * 1000 * 1000 * 1000;

// Nanoseconds of the GPU's global timer (the same clock on every SM).
__device__ __forceinline__ uint64_t globalTimerNs()
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// conn.wait() with a watchdog: spins until the peer's next signal has arrived, as wait() does, but gives
// up after timeoutNs and returns false. Once the signal is there, wait() itself records it and returns.
__device__ __forceinline__ bool waitWithTimeout(mscclppDevConn& conn, uint64_t timeoutNs = kWaitTimeoutNs)
{
  const uint64_t expected = *conn.waitEpochId + 1;
  const uint64_t start = globalTimerNs();
  while (!conn.epochReached(expected)) {
    if (globalTimerNs() - start > timeoutNs) return false;
  }
  conn.wait();
  return true;
}

inline double nowSec()
{
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Waits until the GPU work recorded before `done` has finished; a kernel stuck past `seconds` (a flush()
// that never returns, say) ends the process with a message instead of hanging it.
inline void waitForEvent(cudaEvent_t done, double seconds, const char* what)
{
  const double deadline = nowSec() + seconds;
  for (;;) {
    cudaError_t err = cudaEventQuery(done);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) die("%s: %s", what, cudaGetErrorString(err));
    if (nowSec() > deadline) die("%s: the GPU did not finish within %.0f s", what, seconds);
    usleep(200);
  }
}

inline void onAlarm(int)
{
  static const char msg[] = "ERROR: time limit reached; something hangs (see the lines above)\n";
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
  _exit(3);
}

// The last resort against a hang anywhere (a library call, a kernel): ends the process after `seconds`.
inline void armAlarm(unsigned seconds)
{
  signal(SIGALRM, onAlarm);
  alarm(seconds);
}

// Loads a kernel's code now rather than at its first launch. With CUDA's lazy loading, a first launch may
// wait until the GPU is idle; if a kernel of this process already spins on that GPU waiting for the new
// one (two ranks on one GPU in one process), it would wait forever.
template <typename Kernel>
inline void preloadKernel(Kernel* kernel)
{
  cudaFuncAttributes attr;
  CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
}

// ---- one process per rank ----

// fork() for the process of one rank: the child dies with the parent (for example when `timeout` kills
// the parent) and ends at once if the parent is already gone. Returns what fork() returned.
inline pid_t forkRankProcess()
{
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
  }
  return pid;
}

// Runs body(rank) in one child process per rank and waits for all of them for at most `seconds`. The
// parent touches no CUDA (CUDA does not survive fork()), so each child starts CUDA afresh. When a child
// fails, the others are killed at once. Returns true if every child exited with 0.
inline bool runRanks(int nranks, double seconds, const std::function<int(int)>& body)
{
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(nranks, -1);
  for (int rank = 0; rank < nranks; ++rank) {
    pid_t pid = forkRankProcess();
    if (pid < 0) {
      perror("fork");
      for (int r = 0; r < rank; ++r) kill(pids[r], SIGKILL);
      return false;
    }
    if (pid == 0) {
      int rc = body(rank);
      fflush(stdout);
      fflush(stderr);
      exit(rc);
    }
    pids[rank] = pid;
  }

  const double deadline = nowSec() + seconds;
  int running = nranks;
  bool ok = true;
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      perror("waitpid");
      ok = false;
      break;
    }
    if (pid == 0) {
      if (nowSec() > deadline) {
        fprintf(stderr, "ERROR: %d rank(s) did not finish within %.0f s\n", running, seconds);
        ok = false;
        break;
      }
      usleep(10000);
      continue;
    }
    int rank = -1;
    for (int r = 0; r < nranks; ++r) {
      if (pids[r] == pid) rank = r;
    }
    if (rank < 0) continue;
    pids[rank] = -1;
    --running;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (WIFEXITED(status)) {
      fprintf(stderr, "ERROR: rank %d failed (exit code %d)\n", rank, WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      fprintf(stderr, "ERROR: rank %d was killed by signal %d (%s)\n", rank, WTERMSIG(status),
              strsignal(WTERMSIG(status)));
    }
    ok = false;
    break;
  }
  // Whoever is left is stuck or no longer needed.
  for (int r = 0; r < nranks; ++r) {
    if (pids[r] > 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
    }
  }
  fflush(stderr);
  return ok;
}

// ---- command lines ----

// Parses a whole decimal number in [lo, hi] or ends the process naming the option.
inline long parseNumber(const char* text, const char* what, long lo, long hi)
{
  char* end = nullptr;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    die("%s must be a number in [%ld, %ld], not \"%s\"", what, lo, hi, text);
  }
  return v;
}

} // namespace example

#endif // MSCCLPP_EXAMPLE_COMMON_H_
