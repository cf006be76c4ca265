// util.h: the host helpers every part of the C test harness uses, none of which touches CUDA or the library:
// formatting (fmt, sizeName), the deadlines' scale (MSCCLPP_TEST_TIMEOUT_SCALE), the monotonic clock, one
// process per rank (forkRankProcess, the alarm that names the rank, describeStatus for its end), memory shared
// with forked children (mapShared), free ports, command-line numbers, and a call run under a deadline
// (bounded). The harness's map is in docs/testing.md ("The C test harness").
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

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
#include <string>
#include <thread>
#include <vector>

namespace tc {

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

inline double nowSec()
{
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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

// Parses a whole decimal number in [lo, hi] or ends the process (exit code 1) naming the option.
inline long parseNumber(const char* text, const char* what, long lo, long hi)
{
  char* end = nullptr;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    fflush(stdout);
    fprintf(stderr, "ERROR: %s must be a number in [%ld, %ld], not \"%s\"\n", what, lo, hi, text);
    _exit(1);
  }
  return v;
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

static int gAlarmRank = -1; // the rank a forked child runs, named by its alarm's message

// A rank's last resort against a hang: its message names the rank, and its
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

} // namespace tc
