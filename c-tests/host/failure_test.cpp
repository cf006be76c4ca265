// Multi-process tests of failure handling through the C API, without a GPU: every rank is a forked
// process, and the test kills, stops or idles one of them.
//
//   failure_test kill-last N   SIGKILL of rank N-1: every survivor sees mscclppRemoteError from
//                              mscclppCommGetAsyncError, and a WARN line naming itself, the dead rank and
//                              how it was detected, within a few seconds; a barrier then fails at once
//   failure_test kill-root N   the same for rank 0 (which started the job's root)
//   failure_test stop N        SIGSTOP of rank N-1, with MSCCLPP_PEER_TIMEOUT=2: detected after about 2 s
//   failure_test idle N        rank N-1 makes no call for twice MSCCLPP_PEER_TIMEOUT (2 s): no false alarm
//   failure_test abort N       rank 1 calls mscclppCommAbort from a second thread while its main thread
//                              waits in a barrier: that barrier fails at once (mscclppInvalidUsage), every
//                              other rank sees mscclppRemoteError naming rank 1
//   failure_test               all of the above with N = 3
//
// Exits non-zero on any failure.
#include <mscclpp.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <string>
#include <thread>
#include <vector>

#define HOST_TEST_NAME "failure_test"
// A child that hangs is killed after this many seconds and counts as failed.
static const unsigned CHILD_LIMIT_S = 60;
#include "host_test_common.h"

// MSCCLPP_PEER_TIMEOUT of the stop and idle cases (the kill and abort cases keep the default of 30 s, so
// that only a closed connection or a notice can explain a prompt detection).
static const double PEER_TIMEOUT_S = 2;
// A killed rank's peers must know within this many seconds.
static const double KILL_LIMIT_S = 3;
// A stopped rank's peers must know within the timeout plus this.
static const double STOP_SLACK_S = 3;
// A call that must fail "at once" after a failure returns within this.
static const double PROMPT_S = 1;
static const int MAX_RANKS = 16;

// What the parent and the ranks share (anonymous shared memory, mapped before the fork).
struct Shared {
  std::atomic<int> ready;      // ranks past set-up
  std::atomic<int> go;         // set by the parent once it has killed or stopped the victim
  double event_time;           // when it did (CLOCK_MONOTONIC, the same clock in every process)
  double detected[MAX_RANKS];  // seconds from the event until each survivor saw the error
};
static Shared* g_shared = nullptr;

// The threads of this process (Linux: the entries of /proc/self/task).
static int thread_count() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// A new job: the address of its root in `addr`, and no rank ready yet nor told to go on.
static void new_job(char* addr, size_t size) {
  free_local_addr(addr, size);
  g_shared->ready = 0;
  g_shared->go = 0;
}

// Runs every rank of a new job in a child, rank_main(rank, nranks, addr); true if all exited with status 0.
static bool run_job(int nranks, int (*rank_main)(int rank, int nranks, const char* addr)) {
  char addr[64];
  new_job(addr, sizeof(addr));
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) pids.push_back(spawn([=] { return rank_main(r, nranks, addr); }));
  return wait_all(pids);
}

// Init, a barrier, and the count of ready ranks.
static int join_job(int rank, int nranks, const char* addr, mscclppComm_t* comm) {
  g_rank = rank;
  mscclppSetLogHandler(capture_log);
  mscclppResult_t r = mscclppCommInitRank(comm, nranks, addr, rank);
  CHECK(r == mscclppSuccess, "init: %s", mscclppGetErrorString(r));
  r = mscclppBootstrapBarrier(*comm);
  CHECK(r == mscclppSuccess, "first barrier: %s", mscclppGetErrorString(r));
  g_shared->ready.fetch_add(1);
  return 0;
}

// The victim: joins, then waits to be killed or stopped, calling nothing.
static int victim(int rank, int nranks, const char* addr) {
  mscclppComm_t comm = nullptr;
  if (join_job(rank, nranks, addr, &comm) != 0) return 1;
  for (;;) pause();
}

// Polls mscclppCommGetAsyncError until it is not mscclppSuccess or `limit` seconds have passed since the
// parent's event; returns it.
static mscclppResult_t poll_async_error(mscclppComm_t comm, double limit) {
  mscclppResult_t err = mscclppSuccess;
  for (;;) {
    mscclppResult_t r = mscclppCommGetAsyncError(comm, &err);
    if (r != mscclppSuccess) return r;
    if (err != mscclppSuccess || now_s() - g_shared->event_time > limit) return err;
    usleep(2000);
  }
}

// After the failure: later calls fail at once, and teardown is prompt and clean.
static int calls_after_failure(mscclppComm_t comm, mscclppResult_t want, int culprit) {
  double t = now_s();
  mscclppResult_t r = mscclppBootstrapBarrier(comm);
  double took = now_s() - t;
  CHECK(r == want, "barrier after the failure: %d (%s), want %d", r, mscclppGetErrorString(r), want);
  CHECK(took < PROMPT_S, "barrier after the failure took %.2f s", took);
  char buf[4 * MAX_RANKS] = {0};
  r = mscclppBootstrapAllGather(comm, buf, 4);
  CHECK(r == want, "all-gather after the failure: %d (%s)", r, mscclppGetErrorString(r));
  // A collective on the aborted communicator returns the error at once, before looking at its buffers
  // (host memory here: no GPU is needed to get this far).
  t = now_s();
  r = mscclppAllReduce(buf, buf, 1, mscclppInt32, mscclppSum, comm, nullptr);
  CHECK(r == want, "all-reduce after the failure: %d (%s), want %d", r, mscclppGetErrorString(r), want);
  CHECK(now_s() - t < PROMPT_S, "all-reduce after the failure took %.2f s", now_s() - t);
  // Errors name the rank that failed.
  char needle[64];
  snprintf(needle, sizeof(needle), "rank %d failed", culprit);
  if (want == mscclppRemoteError) {
    CHECK(!log_line_with({"mscclppBootstrapBarrier", needle}).empty(),
          "no log line of the failed barrier naming rank %d; the log was:\n%s", culprit, whole_log().c_str());
  }
  t = now_s();
  r = mscclppProxyStop(comm);
  CHECK(now_s() - t < 5, "mscclppProxyStop took %.2f s", now_s() - t);
  CHECK(r == want, "mscclppProxyStop after the failure: %d (%s)", r, mscclppGetErrorString(r));
  t = now_s();
  r = mscclppCommDestroy(comm);
  CHECK(r == mscclppSuccess, "destroy after the failure: %s", mscclppGetErrorString(r));
  CHECK(now_s() - t < 5, "destroy took %.2f s", now_s() - t);
  // No thread of the library is left behind.
  CHECK(thread_count() == 1, "%d threads left after destroy", thread_count());
  return 0;
}

// A rank that outlives `dead`: it must learn of the death in time, in the ways `hows` allows.
static int survivor(int rank, int nranks, const char* addr, int dead, double min_s, double max_s,
                    const std::vector<std::string>& hows) {
  mscclppComm_t comm = nullptr;
  if (join_job(rank, nranks, addr, &comm) != 0) return 1;
  double wait_start = now_s();
  while (!g_shared->go.load()) {
    CHECK(now_s() - wait_start < 30, "the parent never killed or stopped rank %d", dead);
    usleep(1000);
  }
  mscclppResult_t err = poll_async_error(comm, max_s + 2);
  double after = now_s() - g_shared->event_time;
  g_shared->detected[rank] = after;
  CHECK(err == mscclppRemoteError, "async error %d (%s) %.2f s after the event, want mscclppRemoteError", err,
        mscclppGetErrorString(err), after);
  CHECK(after >= min_s && after <= max_s, "rank %d's failure seen after %.2f s, want %.1f to %.1f s", dead, after,
        min_s, max_s);
  // One WARN line names this rank, the dead rank, how it was detected and how long after its last sign of life.
  char who[64];
  snprintf(who, sizeof(who), "rank %d: peer rank %d failed: ", rank, dead);
  std::string line;
  for (const std::string& how : hows) {
    if (line.empty()) line = log_line_with({"MSCCLPP WARN", who, how, "after its last sign of life"});
  }
  CHECK(!line.empty(), "no WARN line \"%s...\"; the log was:\n%s", who, whole_log().c_str());
  return calls_after_failure(comm, mscclppRemoteError, dead);
}

// Runs an N-rank job, does `event` to the victim once every rank is ready, and checks everyone.
static bool victim_job(const char* name, int nranks, int dead, int signal_number, double min_s, double max_s,
                       const std::vector<std::string>& hows) {
  char addr[64];
  new_job(addr, sizeof(addr));
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    if (r == dead) {
      pids.push_back(spawn([=] { return victim(r, nranks, addr); }));
    } else {
      pids.push_back(spawn([=] { return survivor(r, nranks, addr, dead, min_s, max_s, hows); }));
    }
  }
  double start = now_s();
  while (g_shared->ready.load() < nranks && now_s() - start < 30) usleep(1000);
  bool ok = g_shared->ready.load() == nranks;
  if (!ok) fprintf(stderr, "failure_test %s: only %d of %d ranks got ready\n", name, g_shared->ready.load(), nranks);
  g_shared->event_time = now_s();
  kill(pids[dead], signal_number);
  g_shared->go = 1;
  for (int r = 0; r < nranks; ++r) {
    if (r != dead) ok = wait_child(pids[r]) && ok;
  }
  // A stopped victim is killed now; SIGKILL ends a stopped process too.
  if (signal_number != SIGKILL) kill(pids[dead], SIGKILL);
  ok = wait_child(pids[dead], SIGKILL) && ok;
  printf("failure_test %s: survivors saw rank %d's failure after", name, dead);
  for (int r = 0; r < nranks; ++r) {
    if (r != dead) printf(" %.2f", g_shared->detected[r]);
  }
  printf(" s\n");
  return ok;
}

// ---- no false alarm for an idle rank ----
static int idle_rank(int rank, int nranks, const char* addr) {
  mscclppComm_t comm = nullptr;
  if (join_job(rank, nranks, addr, &comm) != 0) return 1;
  double quiet = 2 * PEER_TIMEOUT_S + 0.5;
  if (rank == nranks - 1) {
    // Not a single call: only the library's own threads speak for this rank.
    sleep_s(quiet);
  } else {
    double start = now_s();
    while (now_s() - start < quiet) {
      mscclppResult_t err = mscclppSuccess;
      mscclppResult_t r = mscclppCommGetAsyncError(comm, &err);
      CHECK(r == mscclppSuccess && err == mscclppSuccess, "async error %d after %.2f s of idling", err, now_s() - start);
      usleep(50 * 1000);
    }
  }
  mscclppResult_t r = mscclppBootstrapBarrier(comm);
  CHECK(r == mscclppSuccess, "barrier after idling: %s", mscclppGetErrorString(r));
  r = mscclppCommDestroy(comm);
  CHECK(r == mscclppSuccess, "destroy: %s", mscclppGetErrorString(r));
  CHECK(thread_count() == 1, "%d threads left after destroy", thread_count());
  // Ranks that destroy their communicators one after the other do not take each other for dead.
  sleep_s(0.3);
  CHECK(log_line_with({"WARN"}).empty(), "a warning in a healthy job:\n%s", whole_log().c_str());
  return 0;
}

static bool idle_job(int nranks) { return run_job(nranks, idle_rank); }

// ---- mscclppCommAbort ----
static const int ABORTER = 1;

static int abort_rank(int rank, int nranks, const char* addr) {
  mscclppComm_t comm = nullptr;
  if (join_job(rank, nranks, addr, &comm) != 0) return 1;
  if (rank == ABORTER) {
    // The main thread waits in a barrier the other ranks never join; another thread aborts.
    double aborted_at = 0;
    mscclppResult_t abort_result = mscclppInternalError;
    std::thread aborter([&] {
      sleep_s(0.3);
      aborted_at = now_s();
      abort_result = mscclppCommAbort(comm);
    });
    mscclppResult_t r = mscclppBootstrapBarrier(comm);
    double ended = now_s();
    aborter.join();
    CHECK(abort_result == mscclppSuccess, "mscclppCommAbort: %s", mscclppGetErrorString(abort_result));
    CHECK(r == mscclppInvalidUsage, "the waiting barrier returned %d (%s), want mscclppInvalidUsage", r,
          mscclppGetErrorString(r));
    CHECK(ended - aborted_at < PROMPT_S, "the waiting barrier ended %.2f s after the abort", ended - aborted_at);
    g_shared->event_time = aborted_at;
    g_shared->go = 1;
    mscclppResult_t err = mscclppSuccess;
    CHECK(mscclppCommGetAsyncError(comm, &err) == mscclppSuccess, "mscclppCommGetAsyncError");
    CHECK(err == mscclppInvalidUsage, "async error %d after the local abort, want mscclppInvalidUsage", err);
    CHECK(mscclppCommAbort(comm) == mscclppSuccess, "a second mscclppCommAbort");
    return calls_after_failure(comm, mscclppInvalidUsage, ABORTER);
  }
  // The others do not call the library until the abort has happened, then learn of it.
  double start = now_s();
  while (!g_shared->go.load()) {
    CHECK(now_s() - start < 30, "rank %d never aborted", ABORTER);
    usleep(1000);
  }
  mscclppResult_t err = poll_async_error(comm, 5);
  double after = now_s() - g_shared->event_time;
  g_shared->detected[rank] = after;
  CHECK(err == mscclppRemoteError, "async error %d (%s) after rank %d aborted", err, mscclppGetErrorString(err),
        ABORTER);
  CHECK(after < KILL_LIMIT_S, "rank %d's abort seen after %.2f s", ABORTER, after);
  char who[64];
  snprintf(who, sizeof(who), "rank %d: peer rank %d failed: it aborted its communicator", rank, ABORTER);
  CHECK(!log_line_with({"MSCCLPP WARN", who}).empty(), "no WARN line \"%s\"; the log was:\n%s", who,
        whole_log().c_str());
  return calls_after_failure(comm, mscclppRemoteError, ABORTER);
}

static bool abort_job(int nranks) {
  bool ok = run_job(nranks, abort_rank);
  printf("failure_test abort: the other ranks saw the abort after");
  for (int r = 0; r < nranks; ++r) {
    if (r != ABORTER) printf(" %.2f", g_shared->detected[r]);
  }
  printf(" s\n");
  return ok;
}

static bool run_case(const std::string& name, int nranks) {
  bool ok = false;
  char timeout[16];
  snprintf(timeout, sizeof(timeout), "%g", PEER_TIMEOUT_S);
  // The library reads its settings once per process, at the first call: set them before the ranks fork.
  if (name == "stop" || name == "idle") {
    setenv("MSCCLPP_PEER_TIMEOUT", timeout, 1);
  } else {
    unsetenv("MSCCLPP_PEER_TIMEOUT");
  }
  std::vector<std::string> closed = {"connection closed", "reported it (connection closed"};
  std::vector<std::string> silent = {"no heartbeat for", "reported it (no heartbeat for"};
  double start = now_s();
  if (name == "kill-last") {
    ok = victim_job("kill-last", nranks, nranks - 1, SIGKILL, 0, KILL_LIMIT_S, closed);
  } else if (name == "kill-root") {
    ok = victim_job("kill-root", nranks, 0, SIGKILL, 0, KILL_LIMIT_S, closed);
  } else if (name == "stop") {
    // The last heartbeat may have left up to a quarter of the timeout before the stop.
    ok = victim_job("stop", nranks, nranks - 1, SIGSTOP, PEER_TIMEOUT_S * 0.75 - 0.1, PEER_TIMEOUT_S + STOP_SLACK_S,
                    silent);
  } else if (name == "idle") {
    ok = idle_job(nranks);
  } else if (name == "abort") {
    ok = abort_job(nranks);
  } else {
    fprintf(stderr, "failure_test: unknown case %s\n", name.c_str());
    return false;
  }
  printf("failure_test %s %d: %s (%.1f s)\n", name.c_str(), nranks, ok ? "PASS" : "FAIL", now_s() - start);
  fflush(stdout);
  return ok;
}

int main(int argc, char** argv) {
  // A failed write to a closed test socket must be an error, not a signal.
  signal(SIGPIPE, SIG_IGN);
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    perror("failure_test: mmap");
    return 1;
  }
  g_shared = new (mem) Shared();
  const char* cases[] = {"kill-last", "kill-root", "stop", "idle", "abort"};
  bool ok = true;
  if (argc == 3) {
    int n = atoi(argv[2]);
    if (n < 2 || n > MAX_RANKS) {
      fprintf(stderr, "failure_test: N must be in [2, %d]\n", MAX_RANKS);
      return 2;
    }
    ok = run_case(argv[1], n);
  } else if (argc == 1) {
    for (const char* c : cases) ok = run_case(c, 3) && ok;
  } else {
    fprintf(stderr, "usage: %s [kill-last N | kill-root N | stop N | idle N | abort N]\n", argv[0]);
    return 2;
  }
  return ok ? 0 : 1;
}
