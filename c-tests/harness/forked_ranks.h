// forked_ranks.h: ranks forked by a parent with logic of its own around them (ForkedRanks: a rank killed,
// processes that end themselves, stages), and what a parent asks the GPUs before it forks any (it must not
// start CUDA itself: a forked child could not use it): how many CUDA devices a new process sees
// (probeGpus), and whether a new process can take every GPU again (waitForGpuClients, after a kill).
#pragma once

#include "util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

namespace tc {

// The number of CUDA devices, asked in a child; -1 or 0 with the reason in *why where none is usable.
inline int probeGpus(std::string* why)
{
  int fds[2];
  if (pipe(fds) != 0) {
    *why = fmt("pipe failed: %s", strerror(errno));
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = forkRankProcess();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char msg[256];
    int len = snprintf(msg, sizeof(msg), "%d %s", e == cudaSuccess ? n : 0, e == cudaSuccess ? "" : cudaGetErrorString(e));
    if (len > 0) (void)!write(fds[1], msg, (size_t)std::min(len, (int)sizeof(msg) - 1));
    _exit(0);
  }
  close(fds[1]);
  char buf[256] = {0};
  ssize_t got = 0, k;
  while (got < (ssize_t)sizeof(buf) - 1 && (k = read(fds[0], buf + got, sizeof(buf) - 1 - got)) > 0) got += k;
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  int n = 0;
  char rest[256] = {0};
  if (sscanf(buf, "%d %255[^\n]", &n, rest) < 1) {
    *why = "the probe process reported nothing";
    return -1;
  }
  *why = rest;
  return n;
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

// Ranks forked by a parent with logic of its own around them (a rank killed, processes that end themselves):
// one child per rank runs body(rank) under an alarm of `alarmS` seconds and ends with its result (_exit: the
// child's own atexit handlers run only where body calls exit() itself); the parent reaps them without
// blocking and notes when each ended.
class ForkedRanks
{
public:
  ForkedRanks(int nranks, double alarmS, const std::function<int(int)>& body)
    : pids_(nranks, -1), status_(nranks, -1), ended_(nranks, 0)
  {
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nranks; ++r) {
      pids_[r] = forkRankProcess();
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

// Whether no CUDA device is usable (asked in a child: the parent must not start CUDA), said on a SKIP line
// naming `what`: nothing ran, which is not a pass, and not this program's failure.
inline bool skipWithoutGpu(const std::string& what)
{
  std::string why;
  if (probeGpus(&why) > 0) return false;
  printf("SKIP %s: no CUDA device usable (%s)\n", what.c_str(), why.empty() ? "none visible" : why.c_str());
  return true;
}

// A program's board, mapShared; null, with a FAIL line naming `program`, where the mapping failed.
template <typename B>
B* mapSharedOrSay(const char* program)
{
  B* board = mapShared<B>();
  if (!board) printf("FAIL %s: mmap failed: %s\n", program, strerror(errno));
  return board;
}

} // namespace tc
