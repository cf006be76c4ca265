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
//   failure_test exit-kill N   MSCCLPP_ABORT_EXIT_TIMEOUT=2: rank N-1 is SIGKILLed and the others never call
//                              the library again; each ends with exit status 75 2 s after the kill (within
//                              EXIT_SLACK_S), and its log file holds one WARN line saying why
//   failure_test exit-abort N  the same after rank 1's mscclppCommAbort: every rank ends with 75
//   failure_test exit-destroy N  MSCCLPP_ABORT_EXIT_TIMEOUT=2: the survivors destroy their communicator as
//                              soon as they see the error, then live on past the timeout: no exit, no line
//   failure_test exit-off N    the setting unset: survivors that never destroy live on past 2 s, no line
//   failure_test kill-in-init N  SIGKILL of rank N-1 once it has joined the root (in rank 0's process) and
//                              waits there for ranks 1 to N-2, not started yet: rank 0's init fails at once
//                              with mscclppRemoteError, its log line naming rank N-1 as the rank that left;
//                              ranks 1 to N-2, started after the kill, are told the same by the root at once
//                              (the bootstrap timeout is 20 s: neither waits it out)
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
// MSCCLPP_ABORT_EXIT_TIMEOUT of the exit cases, and how late past it a process may end.
static const double EXIT_TIMEOUT_S = 2;
static const double EXIT_SLACK_S = 2;
// What the library's documentation promises such a process ends with (EX_TEMPFAIL).
static const int ABORT_EXIT_STATUS = 75;

// What the parent and the ranks share (anonymous shared memory, mapped before the fork).
struct Shared {
  std::atomic<int> ready;      // ranks past set-up
  std::atomic<int> go;         // set by the parent once it has killed or stopped the victim
  double event_time;           // when it did (CLOCK_MONOTONIC, the same clock in every process)
  double detected[MAX_RANKS];  // seconds from the event until each survivor saw the error
  std::atomic<int> joined;     // kill-in-init: rank 0's root has logged the victim's arrival
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

// The threads of this process once those the library joined are gone. pthread_join returns when the
// kernel wakes the joiner, early in the thread's exit; the thread leaves /proc/self/task a moment later
// (longer on a loaded machine). A thread still running stays far longer than the second waited here:
// the library's loops run until told to stop, and its exit watch waits MSCCLPP_ABORT_EXIT_TIMEOUT (2 s).
static int threads_after_join() {
  const double until = now_s() + 1.0;
  int n = thread_count();
  while (n > 1 && now_s() < until) {
    usleep(1000);
    n = thread_count();
  }
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

// The first log line that contains every one of `parts`, waiting up to a second for it: the library records
// a failure (which mscclppCommGetAsyncError then reports) just before its thread logs it.
static std::string await_log_line(const std::vector<std::string>& parts) {
  double start = now_s();
  std::string line = log_line_with(parts);
  while (line.empty() && now_s() - start < 1) {
    usleep(1000);
    line = log_line_with(parts);
  }
  return line;
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
  const int threads = threads_after_join();
  CHECK(threads == 1, "%d threads left after destroy", threads);
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
    if (line.empty()) line = await_log_line({"MSCCLPP WARN", who, how, "after its last sign of life"});
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
  const int threads = threads_after_join();
  CHECK(threads == 1, "%d threads left after destroy", threads);
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
  CHECK(!await_log_line({"MSCCLPP WARN", who}).empty(), "no WARN line \"%s\"; the log was:\n%s", who,
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

// ---- MSCCLPP_ABORT_EXIT_TIMEOUT ----

// The directory the exit cases' ranks log into (MSCCLPP_DEBUG_FILE), one file per process: what a rank
// logs just before the library ends it is read back by the parent.
static std::string g_log_dir;

static std::string log_file_of(pid_t pid) { return g_log_dir + "/rank." + std::to_string(pid) + ".log"; }

// The lines of a file that contain every one of `parts`.
static std::vector<std::string> lines_with(const std::string& path, const std::vector<std::string>& parts) {
  std::vector<std::string> out;
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  while (fgets(buf, sizeof(buf), f)) {
    std::string line = buf;
    bool all = true;
    for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
    if (all) out.push_back(line);
  }
  fclose(f);
  return out;
}

// A rank of an exit case: joins with the library's default log handler (the file), then never calls the
// library again; the aborter first aborts once every rank is ready. Only the library can end it.
static int exit_rank(int rank, int nranks, const char* addr, bool aborter) {
  g_rank = rank;
  mscclppComm_t comm = nullptr;
  mscclppResult_t r = mscclppCommInitRank(&comm, nranks, addr, rank);
  CHECK(r == mscclppSuccess, "init: %s", mscclppGetErrorString(r));
  r = mscclppBootstrapBarrier(comm);
  CHECK(r == mscclppSuccess, "first barrier: %s", mscclppGetErrorString(r));
  g_shared->ready.fetch_add(1);
  if (aborter) {
    while (g_shared->ready.load() < nranks) usleep(1000);
    g_shared->event_time = now_s();
    CHECK(mscclppCommAbort(comm) == mscclppSuccess, "mscclppCommAbort");
    g_shared->go = 1;
  }
  for (;;) pause();
}

// exit-kill (rank N-1 killed) or exit-abort (rank ABORTER aborts): every other rank must end with
// ABORT_EXIT_STATUS between EXIT_TIMEOUT_S and EXIT_TIMEOUT_S + EXIT_SLACK_S after the event, having
// logged one WARN line that names it, the failure and the exit.
static bool exit_job(const char* name, int nranks, bool kill_last) {
  char addr[64];
  new_job(addr, sizeof(addr));
  const int dead = kill_last ? nranks - 1 : -1;
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    if (r == dead) {
      pids.push_back(spawn([=] { return victim(r, nranks, addr); }));
    } else {
      pids.push_back(spawn([=] { return exit_rank(r, nranks, addr, !kill_last && r == ABORTER); }));
    }
  }
  double start = now_s();
  while (g_shared->ready.load() < nranks && now_s() - start < 30) usleep(1000);
  bool ok = g_shared->ready.load() == nranks;
  if (!ok) fprintf(stderr, "failure_test %s: only %d of %d ranks got ready\n", name, g_shared->ready.load(), nranks);
  if (kill_last) {
    g_shared->event_time = now_s();
    kill(pids[dead], SIGKILL);
  } else {
    while (!g_shared->go.load() && now_s() - start < 30) usleep(1000);
  }
  // Reap the ranks as they end, noting when.
  std::vector<int> status(nranks, -1);
  std::vector<double> ended(nranks, -1);
  const double deadline = g_shared->event_time + EXIT_TIMEOUT_S + EXIT_SLACK_S + 5;
  for (int left = nranks; left > 0 && now_s() < deadline;) {
    left = 0;
    for (int r = 0; r < nranks; ++r) {
      if (r == dead || ended[r] >= 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        ended[r] = now_s() - g_shared->event_time;
        status[r] = st;
      } else {
        ++left;
      }
    }
    usleep(1000);
  }
  printf("failure_test %s: from the %s to each process's end:", name, kill_last ? "kill" : "abort");
  for (int r = 0; r < nranks; ++r) {
    if (r == dead) continue;
    if (ended[r] < 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], nullptr, 0);
      fprintf(stderr, "failure_test %s: rank %d still ran %.1f s after the event\n", name, r,
              now_s() - g_shared->event_time);
      ok = false;
      continue;
    }
    printf(" %.3f", ended[r]);
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != ABORT_EXIT_STATUS) {
      fprintf(stderr, "failure_test %s: rank %d ended with %s %d, want exit status %d\n", name, r,
              WIFEXITED(status[r]) ? "exit status" : "signal",
              WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]), ABORT_EXIT_STATUS);
      ok = false;
    }
    if (ended[r] < EXIT_TIMEOUT_S - 0.01 || ended[r] > EXIT_TIMEOUT_S + EXIT_SLACK_S) {
      fprintf(stderr, "failure_test %s: rank %d ended %.3f s after the event, want %.0f to %.0f s\n", name, r,
              ended[r], EXIT_TIMEOUT_S, EXIT_TIMEOUT_S + EXIT_SLACK_S);
      ok = false;
    }
    char who[64], cause[96];
    snprintf(who, sizeof(who), "rank %d: the communicator was aborted", r);
    if (kill_last) {
      // Seen first-hand or reported by another survivor: "connection closed" either way.
      snprintf(cause, sizeof(cause), "(peer rank %d failed: ", dead);
    } else if (r == ABORTER) {
      snprintf(cause, sizeof(cause), "(mscclppCommAbort)");
    } else {
      snprintf(cause, sizeof(cause), "(peer rank %d failed: it aborted its communicator)", ABORTER);
    }
    char status_words[64];
    snprintf(status_words, sizeof(status_words), "ending the process with exit status %d", ABORT_EXIT_STATUS);
    const std::string file = log_file_of(pids[r]);
    size_t lines = lines_with(file, {"MSCCLPP WARN", who, cause, kill_last ? "connection closed" : "",
                                    "MSCCLPP_ABORT_EXIT_TIMEOUT (2 s)", status_words}).size();
    size_t any = lines_with(file, {"ending the process"}).size();
    if (lines != 1 || any != 1) {
      fprintf(stderr, "failure_test %s: rank %d logged %zu line(s) \"%s ... %s ... %s\" and %zu about the exit; its log "
              "%s was:\n", name, r, lines, who, cause, status_words, any, file.c_str());
      std::string cmd = "cat '" + file + "' >&2";
      if (system(cmd.c_str()) != 0) fprintf(stderr, "(no log)\n");
      ok = false;
    }
  }
  printf(" s\n");
  if (dead >= 0) ok = wait_child(pids[dead], SIGKILL) && ok;
  return ok;
}

// exit-destroy (`destroy`) and exit-off (the setting unset): the survivors of a kill see the error; with
// `destroy` they destroy at once, otherwise they do not; either way they live on past the timeout and
// the library logs nothing about ending them.
static int living_survivor(int rank, int nranks, const char* addr, int dead, bool destroy) {
  mscclppComm_t comm = nullptr;
  if (join_job(rank, nranks, addr, &comm) != 0) return 1;
  double wait_start = now_s();
  while (!g_shared->go.load()) {
    CHECK(now_s() - wait_start < 30, "the parent never killed rank %d", dead);
    usleep(1000);
  }
  mscclppResult_t err = poll_async_error(comm, KILL_LIMIT_S);
  CHECK(err == mscclppRemoteError, "async error %d (%s), want mscclppRemoteError", err, mscclppGetErrorString(err));
  if (destroy) {
    mscclppResult_t r = mscclppCommDestroy(comm);
    CHECK(r == mscclppSuccess, "destroy: %s", mscclppGetErrorString(r));
    const int threads = threads_after_join();
    CHECK(threads == 1, "%d threads left after destroy (the exit watch's included)", threads);
  }
  sleep_s(EXIT_TIMEOUT_S + EXIT_SLACK_S + 0.5);
  CHECK(log_line_with({"ending the process"}).empty(), "the library meant to end the process:\n%s",
        whole_log().c_str());
  if (!destroy) {
    mscclppResult_t r = mscclppCommDestroy(comm);
    CHECK(r == mscclppSuccess, "destroy: %s", mscclppGetErrorString(r));
  }
  return 0;
}

static bool living_job(int nranks, bool destroy) {
  char addr[64];
  new_job(addr, sizeof(addr));
  const int dead = nranks - 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    if (r == dead) {
      pids.push_back(spawn([=] { return victim(r, nranks, addr); }));
    } else {
      pids.push_back(spawn([=] { return living_survivor(r, nranks, addr, dead, destroy); }));
    }
  }
  double start = now_s();
  while (g_shared->ready.load() < nranks && now_s() - start < 30) usleep(1000);
  g_shared->event_time = now_s();
  kill(pids[dead], SIGKILL);
  g_shared->go = 1;
  bool ok = true;
  for (int r = 0; r < nranks; ++r) {
    if (r != dead) ok = wait_child(pids[r]) && ok;
  }
  return wait_child(pids[dead], SIGKILL) && ok;
}

// kill-in-init: the bootstrap timeout, long enough that a rank which waits it out fails the promptness checks.
static const int INIT_TIMEOUT_S = 20;
static int g_victim = -1;

// Rank 0's log handler in kill-in-init: the log, and word to the parent once the root saw the victim join.
static void watch_joins(const char* msg) {
  capture_log(msg);
  char needle[32];
  snprintf(needle, sizeof(needle), ": rank %d joined", g_victim);
  if (msg && strstr(msg, needle)) g_shared->joined = 1;
}

// A rank of kill-in-init: its init fails with mscclppRemoteError within KILL_LIMIT_S of the kill (or of its
// own start, for a rank started after it), and its log line says the victim left before all ranks arrived.
static int init_after_a_leaver(int rank, int nranks, const char* addr, int dead) {
  g_rank = rank;
  g_victim = dead;
  mscclppSetLogHandler(rank == 0 ? watch_joins : capture_log);
  CHECK(mscclppSetBootstrapConnTimeout(INIT_TIMEOUT_S) == mscclppSuccess, "mscclppSetBootstrapConnTimeout");
  const double start = now_s();
  mscclppComm_t comm = nullptr;
  mscclppResult_t r = mscclppCommInitRank(&comm, nranks, addr, rank);
  const double took = now_s() - (rank == 0 ? g_shared->event_time : start);
  CHECK(r == mscclppRemoteError, "init: %d (%s), want mscclppRemoteError", r, mscclppGetErrorString(r));
  CHECK(comm == nullptr, "a failed init left a communicator");
  CHECK(took < KILL_LIMIT_S, "init failed %.2f s after the %s", took, rank == 0 ? "kill" : "rank's start");
  char left[64];
  snprintf(left, sizeof(left), "rank %d (from", dead);
  CHECK(!log_line_with({"mscclppCommInitRank", left, "left before all"}).empty(),
        "no log line of the failed init naming rank %d as the rank that left; the log was:\n%s", dead,
        whole_log().c_str());
  // Rank 0's process holds the root: it stays until the ranks started after the kill have been told.
  double wait_start = now_s();
  while (rank == 0 && !g_shared->go.load()) {
    CHECK(now_s() - wait_start < 30, "the parent never said the late ranks were done");
    usleep(1000);
  }
  return 0;
}

// The victim of kill-in-init: its init waits at the root for ranks that start only after its death.
static int joining_victim(int rank, int nranks, const char* addr) {
  g_rank = rank;
  mscclppSetBootstrapConnTimeout(INIT_TIMEOUT_S);
  mscclppComm_t comm = nullptr;
  mscclppCommInitRank(&comm, nranks, addr, rank);
  fprintf(stderr, "failure_test kill-in-init: rank %d's init returned before it was killed\n", rank);
  return 1;
}

static bool kill_in_init_job(int nranks) {
  char addr[64];
  new_job(addr, sizeof(addr));
  g_shared->joined = 0;
  const int dead = nranks - 1;
  pid_t first = spawn([=] { return init_after_a_leaver(0, nranks, addr, dead); });
  pid_t victim_pid = spawn([=] { return joining_victim(dead, nranks, addr); });
  double start = now_s();
  while (!g_shared->joined.load() && now_s() - start < 30) usleep(1000);
  bool ok = g_shared->joined.load() == 1;
  if (!ok) fprintf(stderr, "failure_test kill-in-init: the root never logged rank %d's arrival\n", dead);
  g_shared->event_time = now_s();
  kill(victim_pid, SIGKILL);
  ok = wait_child(victim_pid, SIGKILL) && ok;
  std::vector<pid_t> late;
  for (int r = 1; r < dead; ++r) late.push_back(spawn([=] { return init_after_a_leaver(r, nranks, addr, dead); }));
  for (pid_t p : late) ok = wait_child(p) && ok;
  g_shared->go = 1;
  return wait_child(first) && ok;
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
  char exit_timeout[16];
  snprintf(exit_timeout, sizeof(exit_timeout), "%g", EXIT_TIMEOUT_S);
  const bool exit_case = name == "exit-kill" || name == "exit-abort" || name == "exit-destroy";
  if (exit_case) {
    setenv("MSCCLPP_ABORT_EXIT_TIMEOUT", exit_timeout, 1);
  } else {
    unsetenv("MSCCLPP_ABORT_EXIT_TIMEOUT");
  }
  // The ranks that the library ends log into files of their own (their last line is read from there).
  if (name == "exit-kill" || name == "exit-abort") {
    setenv("MSCCLPP_DEBUG_FILE", (g_log_dir + "/rank.%p.log").c_str(), 1);
  } else {
    unsetenv("MSCCLPP_DEBUG_FILE");
  }
  // kill-in-init learns of the victim's arrival from rank 0's INFO line; the other cases keep the default.
  const char* debug_before = getenv("MSCCLPP_DEBUG");
  const std::string debug_saved = debug_before ? debug_before : "";
  if (name == "kill-in-init") setenv("MSCCLPP_DEBUG", "INFO", 1);
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
  } else if (name == "exit-kill") {
    ok = exit_job("exit-kill", nranks, true);
  } else if (name == "exit-abort") {
    ok = exit_job("exit-abort", nranks, false);
  } else if (name == "exit-destroy") {
    ok = living_job(nranks, true);
  } else if (name == "exit-off") {
    ok = living_job(nranks, false);
  } else if (name == "kill-in-init") {
    if (nranks < 3) {
      fprintf(stderr, "failure_test kill-in-init: N must be at least 3 (a rank must be missing at the kill)\n");
      return false;
    }
    ok = kill_in_init_job(nranks);
  } else {
    fprintf(stderr, "failure_test: unknown case %s\n", name.c_str());
    return false;
  }
  if (debug_before) {
    setenv("MSCCLPP_DEBUG", debug_saved.c_str(), 1);
  } else {
    unsetenv("MSCCLPP_DEBUG");
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
  const char* tmp = getenv("TMPDIR");
  std::string dir_template = std::string(tmp && *tmp ? tmp : "/tmp") + "/failure_test.XXXXXX";
  if (!mkdtemp(&dir_template[0])) {
    perror("failure_test: mkdtemp");
    return 1;
  }
  g_log_dir = dir_template;
  const char* cases[] = {"kill-last", "kill-root", "stop",         "idle",     "abort",
                         "exit-kill", "exit-abort", "exit-destroy", "exit-off", "kill-in-init"};
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
    fprintf(stderr,
            "usage: %s [kill-last N | kill-root N | stop N | idle N | abort N | exit-kill N | exit-abort N | "
            "exit-destroy N | exit-off N | kill-in-init N]\n",
            argv[0]);
    return 2;
  }
  // The exit cases' log files go with their directory.
  std::string cleanup = "rm -rf '" + g_log_dir + "'";
  if (system(cleanup.c_str()) != 0) fprintf(stderr, "failure_test: could not remove %s\n", g_log_dir.c_str());
  return ok ? 0 : 1;
}
