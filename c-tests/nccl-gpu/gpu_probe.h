// The GPU test programs of NCCL's face: how many CUDA devices a new process sees, asked before any rank
// is forked (the parent must not start CUDA itself: a forked child could not use it).
#pragma once

#include "case_runner.h"

#include <algorithm>
#include <string>

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
  pid_t pid = example::forkRankProcess();
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

} // namespace tc
