// Helpers of the multi-process host tests, where every rank is a forked child of the test program.
//
// The including file defines, before the #include:
//   #define HOST_TEST_NAME "name_test"           the program's name, which starts its messages
//   static const unsigned CHILD_LIMIT_S = ...;   a child that hangs is killed after this many seconds
#ifndef HOST_TEST_COMMON_H
#define HOST_TEST_COMMON_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

// The rank this process plays (-1 in the parent), for the messages of fail().
static int g_rank = -1;

static inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, HOST_TEST_NAME ": rank %d: FAILED: ", g_rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

// In a function returning int (a rank's exit status): unless `cond` holds, reports and returns 1.
#define CHECK(cond, ...) \
  do {                   \
    if (!(cond)) {       \
      fail(__VA_ARGS__); \
      return 1;          \
    }                    \
  } while (0)

static inline double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void sleep_s(double s) { usleep((useconds_t)(s * 1e6)); }

// A port nobody listens on right now: bind port 0, read it back, close.
static inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, (sockaddr*)&a, sizeof(a)) == 0 && getsockname(fd, (sockaddr*)&a, &len) == 0) port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// Writes "127.0.0.1:PORT" of a free port (see free_port) into `addr`, for a new job's root; returns the
// port (-1 when none could be had).
static inline int free_local_addr(char* addr, size_t size) {
  int port = free_port();
  snprintf(addr, size, "127.0.0.1:%d", port);
  return port;
}

// Runs `body` in a child process, which is killed by SIGALRM after CHILD_LIMIT_S; returns its pid.
template <typename F>
static pid_t spawn(F body) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(CHILD_LIMIT_S);
    _exit(body());
  }
  return pid;
}

// Waits for a child; true if it exited with status 0 (or, when `killed_by` is non-zero, was killed by it).
static inline bool wait_child(pid_t pid, int killed_by = 0) {
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) {
    fprintf(stderr, HOST_TEST_NAME ": could not start or wait for a child\n");
    return false;
  }
  if (WIFSIGNALED(status)) {
    if (killed_by != 0 && WTERMSIG(status) == killed_by) return true;
    fprintf(stderr, HOST_TEST_NAME ": child %d killed by signal %d%s\n", pid, WTERMSIG(status),
            WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
    return false;
  }
  if (killed_by != 0) {
    fprintf(stderr, HOST_TEST_NAME ": child %d exited (status %d) instead of being killed\n", pid,
            WEXITSTATUS(status));
    return false;
  }
  return WEXITSTATUS(status) == 0;
}

// Waits for every child; true if all exited with status 0.
static inline bool wait_all(const std::vector<pid_t>& pids) {
  bool ok = true;
  for (pid_t pid : pids) ok = wait_child(pid) && ok;
  return ok;
}

// ---- the log, as this process's handler (capture_log, given to mscclppSetLogHandler) receives it ----
static std::mutex g_log_mutex;
static std::string g_log;

static inline void capture_log(const char* msg) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log += msg ? msg : "";
}

// The first log line that contains every one of `parts`, or "".
static inline std::string log_line_with(const std::vector<std::string>& parts) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  size_t start = 0;
  while (start < g_log.size()) {
    size_t end = g_log.find('\n', start);
    if (end == std::string::npos) end = g_log.size();
    std::string line = g_log.substr(start, end - start);
    bool all = true;
    for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
    if (all) return line;
    start = end + 1;
  }
  return "";
}

static inline std::string whole_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return g_log;
}

#endif  // HOST_TEST_COMMON_H
