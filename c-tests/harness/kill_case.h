// kill_case.h: the cases that SIGKILL the last rank while the others are busy (collectives_test's kill
// cases, nccl_gpu_test's and nccl_rma_test's), whichever face they call. The parent (runKillCase) forks the
// ranks, waits until each is ready (its loop or wait going), kills the last, gives the survivors 60 s to end
// on their own, then judges each survivor's report: the checks every kill case makes (every rank got going,
// none hung, each ended with code 0) and then the program's own (a `judge`). The ranks' side: a loop of
// steps at most four in flight until the failure shows (loopUntilFailure), the communicator's error that may
// trail it (trailingError), and calls that must return within a deadline or end the rank (boundedOrExit).
#pragma once

#include "case_runner.h"
#include "forked_ranks.h"

namespace tc {

// What every kill case's rank reports to the parent; a program's result derives from it.
struct KillOutcome
{
  int finished;   // the rank went through to its end
  int asyncError; // the communicator's error once the failure showed
  double tDetect; // CLOCK_MONOTONIC, when the rank saw the failure
  int syncRc;     // cudaStreamSynchronize after the failure
  double syncS;
  char note[300]; // why the rank stopped early (killFail)
};

// Shared by the parent and the ranks of one kill case: each rank's readiness, the flag that tells the loops
// to stop, each rank's result.
template <typename Result>
struct KillShared
{
  volatile int ready[kMaxRanks];
  volatile int stop;
  Result res[kMaxRanks];
};

// A rank's early end: `why` noted for the parent and said on stderr; the rank's exit code 1.
inline int killFail(KillOutcome& out, int rank, const std::string& why)
{
  copyText(out.note, sizeof(out.note), why);
  fprintf(stderr, "[rank %d] %s\n", rank, why.c_str());
  fflush(stderr);
  return 1;
}

// fn() on a helper thread with `device` current, given `seconds` (scaled) to return: a call that does not
// ends the rank (exit code 2) with `hang` noted, since it cannot go on. *tookS: how long the call took.
template <typename T>
T boundedOrExit(KillOutcome& out, int rank, int device, double seconds, std::function<T()> fn, const std::string& hang,
                double* tookS)
{
  const double t0 = nowSec();
  T rc{};
  if (!bounded<T>(device, seconds * timeoutScale(), fn, &rc)) {
    killFail(out, rank, hang);
    _exit(2);
  }
  *tookS = nowSec() - t0;
  return rc;
}

// No hang: the stream's queued kernels see the failure and end, within 10 s (scaled), or the rank ends
// with `hang` noted. Records syncRc and syncS.
inline void drainOrExit(KillOutcome& out, int rank, int device, cudaStream_t stream, const char* hang)
{
  out.syncRc = (int)boundedOrExit<cudaError_t>(
      out, rank, device, 10, [stream] { return cudaStreamSynchronize(stream); },
      fmt("cudaStreamSynchronize did not return within 10 s: %s", hang), &out.syncS);
}

// Queues step() until the failure shows, at most four in flight: each waits for the one four steps back
// (events[]), watching error() meanwhile. True once error() reported something (in *async) or a step
// returned an error (in *stepRc); false where *stop was set or 60 s (scaled) passed first. *steps counts
// the steps queued. E is the face's result type (0 is success).
template <typename E>
bool loopUntilFailure(cudaStream_t stream, cudaEvent_t (&events)[4], volatile int* stop,
                      const std::function<E()>& error, const std::function<E()>& step, unsigned long long* steps,
                      E* async, E* stepRc)
{
  const double deadline = nowSec() + 60 * timeoutScale();
  *async = E{};
  *stepRc = E{};
  for (unsigned long long i = 0;; ++i) {
    cudaEvent_t& e = events[i % 4];
    if (i >= 4) {
      while (cudaEventQuery(e) == cudaErrorNotReady) {
        *async = error();
        if (*async != E{} || *stop || nowSec() > deadline) break;
        usleep(100);
      }
    }
    if (*async != E{}) return true;
    if (*stop || nowSec() > deadline) return false;
    const E r = step();
    if (r != E{}) {
      *stepRc = r;
      return true;
    }
    cudaEventRecord(e, stream);
    *steps = i + 1;
    *async = error();
    if (*async != E{}) return true;
  }
}

// The communicator's error, which may trail a failed call by a moment: error() polled every millisecond
// for at most `seconds` (scaled) while it says success.
template <typename E>
E trailingError(E async, const std::function<E()>& error, double seconds)
{
  const double deadline = nowSec() + seconds * timeoutScale();
  while (async == E{} && nowSec() < deadline) {
    async = error();
    if (async == E{}) usleep(1000);
  }
  return async;
}

// The failure showed within 10 s (scaled) of the kill, and the stream drained, within 5 s: "" or why not.
inline std::string detectedAndDrained(const KillOutcome& o, double tKill)
{
  const double scale = timeoutScale();
  if (o.tDetect - tKill > 10 * scale) return fmt("the failure showed %.2f s after the kill", o.tDetect - tKill);
  if (o.syncRc != cudaSuccess) return fmt("cudaStreamSynchronize returned CUDA error %d", o.syncRc);
  if (o.syncS > 5 * scale) return fmt("cudaStreamSynchronize took %.2f s", o.syncS);
  return "";
}

struct KillPlan
{
  const char* name;         // the case's name on its PASS and FAIL lines
  int nranks;               // rank nranks - 1 is killed
  double alarmS;            // each rank's alarm (scaled)
  double readyS;            // how long the ranks have to get ready (scaled)
  useconds_t settleUs;      // how long the ready ranks go on before the kill
  const char* going;        // what a rank gets going before it is ready ("loop", "wait")
  bool waitForGpus;         // first wait for the GPUs to take new processes (after an earlier kill, MPS)
};

// Rank r of a kill case, as runRanks makes one: its host waits given 30 s (scaled).
inline Rank killCaseRank(int r, int nranks)
{
  Rank R;
  R.rank = r;
  R.nranks = nranks;
  R.hostTimeoutS = 30.0 * timeoutScale();
  return R;
}

// What runKillCase asks of a program: its rank's body (its exit code) and, for each survivor whose common
// checks passed, its own checks ("" or why not) and, where they pass, its part of the PASS line.
template <typename Result>
struct KillJudge
{
  std::function<int(int rank)> rank;
  std::function<std::string(int rank, const Result&, double tKill)> check;
  std::function<std::string(int rank, const Result&, double tKill)> info;
};

// The parent of a kill case: a FAIL line for each survivor that failed (`FAIL name: rank r: why`); returns
// their number (-1 where the case could not start, said on a FAIL line) and the survivors' infos in *info.
// The program prints its PASS and SUMMARY lines.
template <typename Result>
int runKillCase(const KillPlan& k, KillShared<Result>** shared, const KillJudge<Result>& judge, std::string* info)
{
  const double scale = timeoutScale();
  KillShared<Result>* S = mapShared<KillShared<Result>>();
  *shared = S;
  if (!S) {
    printf("FAIL %s: mmap failed\n", k.name);
    return -1;
  }
  const int nranks = k.nranks, victim = nranks - 1;
  if (k.waitForGpus) {
    // A kill case before this one ended a process with kernels running: under MPS the server may refuse new
    // clients until it has cleaned up after it (docs/failures.md, "A process that ends"; seen on two H100s).
    const std::string gpu = waitForGpuClients(30 * scale);
    if (!gpu.empty()) {
      printf("FAIL %s: the GPUs took no new process within %.0f s (%s)\n", k.name, 30 * scale, gpu.c_str());
      return -1;
    }
  }
  ForkedRanks ranks(nranks, k.alarmS * scale, judge.rank);
  // Every rank ready (or one gone early).
  bool early = false;
  const bool ready = ranks.waitReady([&](int r) { return S->ready[r] != 0; }, k.readyS * scale, &early);
  double tKill = 0;
  if (ready) {
    usleep(k.settleUs);
    ranks.kill(victim);
    tKill = nowSec();
    // Survivors finish on their own; the deadline turns a hang into a failure.
    ranks.waitEnded(60 * scale, victim);
  }
  S->stop = 1;
  std::vector<bool> killed = ranks.killRest();
  killed[victim] = false;
  int failed = 0;
  for (int r = 0; r < nranks; ++r) {
    if (r == victim) continue;
    const Result& o = S->res[r];
    std::string why;
    if (!ready || early) why = fmt("not every rank got its %s going (%s)", k.going, o.note[0] ? o.note : "see the log");
    else if (killed[r]) why = fmt("did not finish within 60 s of the kill (%s)", o.note[0] ? o.note : "a hang");
    else if (!WIFEXITED(ranks.status(r)) || WEXITSTATUS(ranks.status(r)) != 0 || !o.finished)
      why = fmt("%s: %s", describeStatus(ranks.status(r)).c_str(), o.note);
    else why = judge.check(r, o, tKill);
    if (!why.empty()) {
      printf("FAIL %s: rank %d: %s\n", k.name, r, why.c_str());
      ++failed;
    } else {
      *info += judge.info(r, o, tKill);
    }
  }
  return failed;
}

// The kill case's last lines: PASS (with the survivors' infos and `extra`) where none failed, then
// `SUMMARY <label> (...)` counting the case; frees the shared block. Returns the case's exit code.
template <typename Result>
int endKillCase(const KillPlan& k, KillShared<Result>* S, int failed, const std::string& info, const std::string& extra,
                const std::string& summary)
{
  if (failed < 0) return 1;
  if (!failed) printf("PASS %s:%s%s\n", k.name, info.c_str(), extra.c_str());
  printf("SUMMARY %s: %d passed, %d failed\n", summary.c_str(), failed ? 0 : 1, failed ? 1 : 0);
  fflush(stdout);
  munmap(S, sizeof(KillShared<Result>));
  return failed ? 1 : 0;
}

} // namespace tc
