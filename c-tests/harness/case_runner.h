// case_runner.h: how a GPU test (and a benchmark) runs its cases, whichever face it calls. Tests include it
// (or mscclpp_rank.h, nccl_rank.h above it) through the Makefile's -Ic-tests/harness.
//
// A case is a function returning std::string: "" when it passed, else the reason (TC_CUDA, TC_TRY,
// TC_EXPECT return it), so that a failed case becomes a FAIL line and the rank goes on with the next case
// where it can.
//
// Process model: the parent forks one child per rank and never touches CUDA itself (CUDA state does not
// survive fork()). Each child picks its GPU, joins the communicator and runs a fixed sequence of test
// cases (runCase), recording each verdict in memory shared with the parent. The parent (runRanks) waits
// with a deadline, kills stragglers, then prints one line per case (`PASS name ...` / `FAIL name: reason`)
// and a SUMMARY line; its exit code is 0 only if every case passed on every rank.
//
// Nothing may hang: device-side waits give up after a timeout and report it, every kernel is waited for
// with a host-side deadline (syncBounded), blocking calls can be run under a deadline (bounded, and
// mscclpp_rank.h's callBounded), and each child has an alarm() as a last resort. A timeout is a failure.
#pragma once

#include "patterns.h"
#include "util.h"

#include <cuda_runtime.h>

struct mscclppComm; // mscclpp.h's, for Rank::comm (mscclppComm_t); only mscclpp_rank.h includes that header

namespace tc {

constexpr int kMaxRanks = 16;
constexpr int kMaxCases = 128;
constexpr int kNameLen = 96;
constexpr int kTextLen = 400;

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
  mscclppComm* comm = nullptr; // the legacy face's communicator (mscclpp_rank.h); NCCL's programs keep theirs
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

// A rank's set-up, whose failure `why` is recorded as a case of its own, `name` (the rank's caller then
// returns 1 and runs no other case); whether it passed. A set-up that passed records no case.
inline bool setUpPassed(Rank& R, const std::string& why, const char* name = "setup")
{
  if (why.empty()) return true;
  runCase(R, name, [&] { return why; });
  return false;
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

static volatile sig_atomic_t gStopRequested = 0;
inline void onStopSignal(int) { gStopRequested = 1; }

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
    pid_t pid = forkRankProcess();
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

} // namespace tc
