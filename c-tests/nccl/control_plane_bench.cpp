// The control plane's benchmark with host-only processes (no GPU: CUDA_VISIBLE_DEVICES is set empty), for
// each size N given:
//   - N processes forked; rank 0's ncclGetUniqueId handed to the others through shared memory, then every
//     rank's ncclCommInitRank at once (each call timed: the slowest and the fastest);
//   - a barrier through shared memory, then every rank's ncclCommSplit(comm, rank % 2, nranks - rank, ...)
//     (timed; the two halves' counts and the reversed ranks checked, then destroyed), and another barrier;
//   - the last rank writes the time (CLOCK_MONOTONIC, one clock for all
//     processes) and SIGKILLs itself;
//   - every survivor polls ncclCommGetAsyncError every millisecond, and records when it first sees anything
//     but ncclSuccess, as time since the kill (at most 10 s: then it goes on without);
//   - every survivor calls ncclCommShrink(comm, {N-1}, 1, &newcomm, NULL, NCCL_SHRINK_ABORT), timed, and
//     checks that the new communicator has N-1 ranks and that its rank there is its old one (the survivors
//     keep their parent order, and the rank left out is the last);
//   - a barrier of the survivors, then each destroys both communicators.
// Every wait is bounded: the whole size has --timeout seconds (default 120); 2 s later the parent SIGKILLs
// the ranks still running, and reports each one's step.
//
// --stop: the last rank SIGSTOPs itself instead (a stopped process: its sockets stay open, only its silence
// tells), with MSCCLPP_PEER_TIMEOUT 1 unless it is set; the parent SIGKILLs it once the survivors are done.
// --runs K: each size K times (a line each).
//
// Prints one line per size: the figures and the outcome ("all right", or what failed: which ranks, with
// their error from ncclGetLastError, and which did not finish which step), then a machine-readable summary
// (a line "summary {...}" of JSON). Exit status 0 when every size came out all right, 1 otherwise, 2 for a
// bad argument. The library logs to a file per process (NCCL_DEBUG_FILE, in a temporary directory); where a
// size fails, a WARN or ERROR line of each kind is printed (at most 8).
//
// --logs DIR: the library's log files go to DIR and are kept (NCCL_DEBUG, WARN unless the caller sets it,
// says how much they hold: NCCL_DEBUG=INFO to see where a rank's initialisation stops).
//
// Usage: control_plane_bench [--timeout SECONDS] [--runs K] [--stop] [--logs DIR] [N ...]    (sizes default to 16 64 128)
#include <nccl.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <fstream>
#include <linux/futex.h>
#include <map>
#include <string>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

// How long a survivor waits for the failure to show in ncclCommGetAsyncError.
const int64_t kDetectLimitNs = 10'000'000'000LL;
// How long the parent waits past a size's deadline for the ranks to end on their own.
const int64_t kGraceNs = 2'000'000'000LL;
// --stop: the victim stops itself rather than die.
bool g_stop = false;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// A rank's steps, in order; a rank's slot says the one it is in (or last finished: kDone).
enum Step : int {
  kForked, kWaitId, kInit, kBarrier, kSplit, kSplitBarrier, kDetect, kShrink, kCheck, kSurvivorBarrier, kDestroy, kDone
};
const char* const kStepNames[] = {"start",      "waiting for the id", "init",    "the barrier after init",
                                  "split",      "the barrier after split",
                                  "detection",  "shrink",             "the check", "the barrier after shrink",
                                  "destroy",    "done"};

// What a rank reports, written by it alone and read by the parent once it has ended or been killed.
struct Slot {
  int step;
  int init_rc;    // -1 until ncclCommInitRank returns
  int detect_rc;  // the first result but ncclSuccess that ncclCommGetAsyncError gave (0: none)
  int split_rc;   // -1 until ncclCommSplit returns
  int split_count, split_rank;
  int shrink_rc;  // -1 until ncclCommShrink returns
  int new_count, new_rank;
  int destroy_rc;  // the first failing destroy's result (0: none)
  int barrier_timed_out;
  int64_t init_begin, init_end, split_begin, split_end, detect_at, shrink_begin, shrink_end;
  char error[256];  // ncclGetLastError of the first failing call
};

// Shared by the parent and the ranks of one size (mapped before the forks).
struct Board {
  ncclUniqueId id;
  int id_rc;
  int arrived;      // ranks started (futex word)
  int id_ready;     // 1: the id is there, 2: ncclGetUniqueId failed (futex word)
  int initialised;  // ranks past init (futex word)
  int split;        // ranks past the split (futex word)
  int shrunk;       // survivors past the check (futex word)
  int64_t kill_at;  // written by the victim just before its SIGKILL
  Slot slots[1];    // one per rank
};

long futex(int* word, int op, int value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

// Adds one to *word; the one that makes it `want` wakes the waiters.
void arrive(int* word, int want) {
  if (__atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST) >= want) futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

void publish(int* word, int value) {
  __atomic_store_n(word, value, __ATOMIC_SEQ_CST);
  futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

// Waits until *word >= want; false at the deadline.
bool wait_for(int* word, int want, int64_t deadline) {
  for (;;) {
    int v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (v >= want) return true;
    int64_t left = std::min<int64_t>(deadline - now_ns(), 100'000'000);
    if (left <= 0) return false;
    timespec ts{static_cast<time_t>(left / 1'000'000'000LL), static_cast<long>(left % 1'000'000'000LL)};
    futex(word, FUTEX_WAIT, v, &ts);
  }
}

void note_error(Slot& s, ncclComm_t comm) {
  if (s.error[0]) return;
  const char* e = ncclGetLastError(comm);
  std::snprintf(s.error, sizeof(s.error), "%s", e && *e ? e : "(no message)");
}

// One rank's run; its process ends here.
[[noreturn]] void rank_main(Board* b, int n, int rank, int64_t deadline) {
  Slot& s = b->slots[rank];
  const int dead = n - 1;
  s.step = kWaitId;
  arrive(&b->arrived, n);
  if (rank == 0) {
    wait_for(&b->arrived, n, deadline);
    b->id_rc = ncclGetUniqueId(&b->id);
    if (b->id_rc != ncclSuccess) note_error(s, nullptr);
    publish(&b->id_ready, b->id_rc == ncclSuccess ? 1 : 2);
  }
  if (!wait_for(&b->id_ready, 1, deadline) || __atomic_load_n(&b->id_ready, __ATOMIC_SEQ_CST) != 1) _exit(1);
  ncclUniqueId id = b->id;

  s.step = kInit;
  ncclComm_t comm = nullptr;
  s.init_begin = now_ns();
  ncclResult_t rc = ncclCommInitRank(&comm, n, id, rank);
  s.init_end = now_ns();
  s.init_rc = rc;
  if (rc != ncclSuccess) {
    note_error(s, nullptr);
    comm = nullptr;
  }

  s.step = kBarrier;
  arrive(&b->initialised, n);
  if (!wait_for(&b->initialised, n, deadline)) {
    s.barrier_timed_out = 1;
    _exit(1);
  }
  if (comm) {
    // Two halves by parity, each in reverse order of the parent's ranks.
    s.step = kSplit;
    ncclComm_t half = nullptr;
    s.split_begin = now_ns();
    ncclResult_t src = ncclCommSplit(comm, rank % 2, n - rank, &half, nullptr);
    s.split_end = now_ns();
    s.split_rc = src;
    if (src != ncclSuccess) {
      note_error(s, comm);
    } else {
      ncclCommCount(half, &s.split_count);
      ncclCommUserRank(half, &s.split_rank);
      ncclCommDestroy(half);
    }
  }
  s.step = kSplitBarrier;
  arrive(&b->split, n);
  if (!wait_for(&b->split, n, deadline)) {
    s.barrier_timed_out = 1;
    _exit(1);
  }
  if (rank == dead) {
    __atomic_store_n(&b->kill_at, now_ns(), __ATOMIC_SEQ_CST);
    kill(getpid(), g_stop ? SIGSTOP : SIGKILL);
    for (;;) pause();  // (stopped: the parent SIGKILLs it once the survivors are done)
  }
  if (!comm) {  // its init failed: nothing to shrink
    s.step = kDone;
    arrive(&b->shrunk, n - 1);
    _exit(0);
  }

  s.step = kDetect;
  const int64_t detect_deadline = std::min(deadline, now_ns() + kDetectLimitNs);
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t got = ncclCommGetAsyncError(comm, &async);
    if (got != ncclSuccess) async = got;
    if (async != ncclSuccess) {
      s.detect_at = now_ns();
      s.detect_rc = async;
      break;
    }
    if (now_ns() >= detect_deadline) break;
    timespec ms{0, 1'000'000};
    nanosleep(&ms, nullptr);
  }

  s.step = kShrink;
  int excluded = dead;
  ncclComm_t newcomm = nullptr;
  s.shrink_begin = now_ns();
  rc = ncclCommShrink(comm, &excluded, 1, &newcomm, nullptr, NCCL_SHRINK_ABORT);
  s.shrink_end = now_ns();
  s.shrink_rc = rc;
  if (rc != ncclSuccess) {
    note_error(s, nullptr);
    newcomm = nullptr;
  }

  s.step = kCheck;
  if (newcomm) {
    if (ncclCommCount(newcomm, &s.new_count) != ncclSuccess) s.new_count = -1;
    if (ncclCommUserRank(newcomm, &s.new_rank) != ncclSuccess) s.new_rank = -1;
  }

  s.step = kSurvivorBarrier;
  arrive(&b->shrunk, n - 1);
  if (!wait_for(&b->shrunk, n - 1, deadline)) s.barrier_timed_out = 1;

  s.step = kDestroy;
  if (newcomm && (rc = ncclCommDestroy(newcomm)) != ncclSuccess && !s.destroy_rc) s.destroy_rc = rc;
  if ((rc = ncclCommDestroy(comm)) != ncclSuccess && !s.destroy_rc) s.destroy_rc = rc;
  s.step = kDone;
  _exit(s.barrier_timed_out ? 1 : 0);
}

// "3, 7-9, 12" from sorted ranks (at most 24 runs, then how many ranks more).
std::string ranges(const std::vector<int>& ranks) {
  std::string out;
  size_t runs = 0;
  for (size_t i = 0; i < ranks.size(); ++runs) {
    if (runs == 24) {
      out += " and " + std::to_string(ranks.size() - i) + " more";
      break;
    }
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string who(const std::vector<int>& ranks) {
  return ranks.size() == 1 ? "rank " + ranges(ranks) : std::to_string(ranks.size()) + " ranks (" + ranges(ranks) + ")";
}

// A duration for people: "21 ms", "1.6 ms", "1.37 s".
std::string span(double ns) {
  char buf[32];
  double ms = ns / 1e6;
  if (ms < 10)
    std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  else if (ms < 1000)
    std::snprintf(buf, sizeof buf, "%.0f ms", ms);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", ms / 1000);
  return buf;
}

// A message with its numbers (ranks, counts) made "N": messages that differ in those alone are one kind.
std::string kind_of(const std::string& message) {
  std::string out;
  for (size_t i = 0; i < message.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(message[i]))) {
      while (i + 1 < message.size() && std::isdigit(static_cast<unsigned char>(message[i + 1]))) ++i;
      out += 'N';
    } else {
      out += message[i];
    }
  }
  return out;
}

std::string shortened(const std::string& s, size_t max) { return s.size() <= max ? s : s.substr(0, max) + "..."; }

// Ranks and their messages, grouped by kind (kind_of).
struct Messages {
  std::map<std::string, std::pair<std::string, std::vector<int>>> kinds;  // kind -> (first message, ranks)
  int count = 0;
  void add(int rank, const std::string& message) {
    auto& k = kinds[kind_of(message)];
    if (k.second.empty()) k.first = message;
    k.second.push_back(rank);
    ++count;
  }
  bool empty() const { return kinds.empty(); }
  // '3 ranks (3-5), e.g. rank 3: "A"; rank 9: "B"': the commonest kinds first, at most 4.
  std::string text() const {
    std::vector<std::pair<std::string, std::vector<int>>> list;
    for (const auto& k : kinds) list.push_back(k.second);
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    std::string out;
    size_t shown = 0;
    for (const auto& [message, ranks] : list) {
      if (shown == 4) {
        out += "; and " + std::to_string(list.size() - shown) + " other kinds of message";
        break;
      }
      out += (shown++ ? "; " : "") + who(ranks) +
             (ranks.size() > 1 ? ", e.g. rank " + std::to_string(ranks[0]) : std::string()) + ": \"" +
             shortened(message, 240) + "\"";
    }
    return out;
  }
};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += ' ';
    else
      out += c;
  }
  return out + "\"";
}

// The library's WARN and ERROR lines in `dir` (a file per process), one of each kind (kind_of), at most `max`,
// the lowest ranks' first.
std::vector<std::string> log_lines(const std::string& dir, const std::vector<pid_t>& pids, size_t max) {
  std::vector<std::string> out;
  std::map<std::string, bool> seen;
  for (size_t r = 0; r < pids.size() && out.size() < max; ++r) {
    std::ifstream f(dir + "/" + std::to_string(pids[r]) + ".log");
    std::string line;
    while (out.size() < max && std::getline(f, line))
      if ((line.find("WARN") != std::string::npos || line.find("ERROR") != std::string::npos) &&
          !seen[kind_of(line)]) {
        seen[kind_of(line)] = true;
        out.push_back("rank " + std::to_string(r) + ": " + shortened(line, 400));
      }
  }
  return out;
}

void remove_dir(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        std::remove((dir + "/" + e->d_name).c_str());
    closedir(d);
  }
  rmdir(dir.c_str());
}

struct Result {
  int ranks = 0;
  bool ok = false;
  std::string outcome;
  double init_max = -1, init_min = -1, split_max = -1, split_min = -1, detect_max = -1, detect_min = -1, shrink_max = -1, shrink_min = -1;
  double wall = 0;
  int init_failed = 0, undetected = 0, shrink_failed = 0, unfinished = 0;
};

// One size: fork, wait within the deadline, read the slots.
std::string g_keep_logs;  // --logs DIR

Result run_size(int n, double timeout_s) {
  Result res;
  res.ranks = n;
  char tmpl[] = "/tmp/control_plane_bench.XXXXXX";
  std::string logdir = !g_keep_logs.empty() ? g_keep_logs : mkdtemp(tmpl) ? tmpl : "";
  if (!logdir.empty()) setenv("NCCL_DEBUG_FILE", (logdir + "/%p.log").c_str(), 1);

  size_t bytes = sizeof(Board) + sizeof(Slot) * static_cast<size_t>(n);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    res.outcome = std::string("fails: mmap: ") + std::strerror(errno);
    return res;
  }
  Board* b = static_cast<Board*>(mem);
  for (int r = 0; r < n; ++r) {
    b->slots[r].init_rc = -1;
    b->slots[r].shrink_rc = -1;
    b->slots[r].split_rc = -1;
  }
  const int64_t start = now_ns();
  const int64_t deadline = start + static_cast<int64_t>(timeout_s * 1e9);
  const pid_t parent = getpid();
  std::vector<pid_t> pids(n, -1);
  std::string fork_error;
  int forked = 0;
  for (; forked < n; ++forked) {
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      rank_main(b, n, forked, deadline);
    }
    if (pid < 0) {
      fork_error = std::string("fork of rank ") + std::to_string(forked) + ": " + std::strerror(errno);
      break;
    }
    pids[forked] = pid;
  }
  if (forked < n)  // the others would wait for the missing ones: end them now
    for (int r = 0; r < forked; ++r) kill(pids[r], SIGKILL);

  std::map<pid_t, int> rank_of;
  for (int r = 0; r < forked; ++r) rank_of[pids[r]] = r;
  std::vector<int> status(n, 0);
  std::vector<bool> reaped(n, false);
  int left = forked;
  bool killed_stragglers = false;
  while (left > 0) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      auto it = rank_of.find(pid);
      if (it != rank_of.end() && !reaped[it->second]) {
        reaped[it->second] = true;
        status[it->second] = st;
        --left;
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    // A stopped victim stays until the survivors are done with it.
    if (g_stop && forked == n && !reaped[n - 1] && __atomic_load_n(&b->shrunk, __ATOMIC_SEQ_CST) >= n - 1)
      kill(pids[n - 1], SIGKILL);
    if (!killed_stragglers && now_ns() > deadline + kGraceNs) {
      for (int r = 0; r < forked; ++r)
        if (!reaped[r]) kill(pids[r], SIGKILL);
      killed_stragglers = true;
    }
    usleep(2000);
  }
  res.wall = (now_ns() - start) / 1e9;

  // The figures and the failures.
  const int dead = n - 1;
  const Slot* s = b->slots;
  std::vector<std::string> failures;
  if (!fork_error.empty()) failures.push_back(fork_error);
  if (b->id_ready == 2)
    failures.push_back("ncclGetUniqueId: " + std::string(ncclGetErrorString(static_cast<ncclResult_t>(b->id_rc))) +
                       " (" + s[0].error + ")");
  Messages init_errors, shrink_errors, destroy_errors;
  std::vector<int> undetected, wrong_count, wrong_rank, status_wrong;
  std::map<int, std::vector<int>> unfinished;  // step -> ranks
  std::vector<double> init_t, split_t, detect_t, shrink_t;
  Messages split_errors;
  std::vector<int> split_wrong;
  std::vector<int> early;  // saw a failure before the kill
  const int64_t kill_at = b->kill_at;
  for (int r = 0; r < forked; ++r) {
    const Slot& x = s[r];
    bool victim = r == dead;
    bool finished = victim ? x.step >= kBarrier && kill_at != 0 : x.step == kDone;
    if (!finished) unfinished[x.step].push_back(r);
    if (x.init_rc == ncclSuccess)
      init_t.push_back(x.init_end - x.init_begin);
    if (x.split_rc == ncclSuccess) {
      split_t.push_back(x.split_end - x.split_begin);
      // Ranks of one parity, ordered by the key n - rank: the higher parent ranks first.
      int count = 0, above = 0;
      for (int q = r % 2; q < n; q += 2) {
        ++count;
        above += q > r;
      }
      if (x.split_count != count || x.split_rank != above) split_wrong.push_back(r);
    } else if (x.split_rc > 0) {
      split_errors.add(r, std::string(ncclGetErrorString(static_cast<ncclResult_t>(x.split_rc))) + ": " + x.error);
    }
    else if (x.init_rc > 0 && x.init_end <= deadline)  // (one that ended later is reported as late below)
      init_errors.add(r, std::string(ncclGetErrorString(static_cast<ncclResult_t>(x.init_rc))) + ": " + x.error);
    if (victim || x.init_rc != ncclSuccess || x.step < kShrink) continue;
    if (x.detect_rc == 0)
      undetected.push_back(r);
    else if (kill_at == 0 || x.detect_at < kill_at)
      early.push_back(r);
    else
      detect_t.push_back(x.detect_at - kill_at);
    if (x.shrink_rc == ncclSuccess) {
      shrink_t.push_back(x.shrink_end - x.shrink_begin);
      if (x.step > kCheck) {
        if (x.new_count != n - 1) wrong_count.push_back(r);
        if (x.new_rank != (r < dead ? r : r - 1)) wrong_rank.push_back(r);
      }
    } else if (x.shrink_rc > 0) {
      shrink_errors.add(r, std::string(ncclGetErrorString(static_cast<ncclResult_t>(x.shrink_rc))) + ": " + x.error);
    }
    if (x.destroy_rc) destroy_errors.add(r, ncclGetErrorString(static_cast<ncclResult_t>(x.destroy_rc)));
  }
  std::vector<int> late_barrier;  // waited in vain for the others after the shrink
  for (int r = 0; r < forked; ++r) {
    if (r != dead && s[r].barrier_timed_out && s[r].step > kSurvivorBarrier) late_barrier.push_back(r);
    // The ranks that finished their steps: the victim ended by its SIGKILL, the others by exit status 0.
    bool victim = r == dead;
    if (!reaped[r] || (victim ? kill_at == 0 : s[r].step != kDone || s[r].barrier_timed_out)) continue;
    bool right = victim ? WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL
                        : WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0;
    if (!right) status_wrong.push_back(r);
  }
  // The ranks whose init had not returned at the deadline held the barrier after it up.
  std::vector<int> late_init;
  for (int r = 0; r < forked; ++r)
    if (s[r].step >= kInit && (s[r].init_rc < 0 || s[r].init_end > deadline)) late_init.push_back(r);
  if (!late_init.empty()) failures.push_back(who(late_init) + " were still in init at the timeout");
  if (!init_errors.empty())
    failures.push_back("init failed on " + std::to_string(init_errors.count) + " of " + std::to_string(n) +
                       " ranks: " + init_errors.text());
  if (!split_errors.empty())
    failures.push_back("split failed on " + std::to_string(split_errors.count) + " ranks: " + split_errors.text());
  if (!split_wrong.empty()) failures.push_back(who(split_wrong) + ": the split's count or rank is wrong");
  if (!early.empty()) failures.push_back(who(early) + " saw a failure before the kill");
  if (!undetected.empty())
    failures.push_back(who(undetected) + " did not learn of the kill within " + span(kDetectLimitNs));
  if (!shrink_errors.empty())
    failures.push_back("shrink failed on " + std::to_string(shrink_errors.count) + " of " +
                       std::to_string(shrink_errors.count + shrink_t.size()) + " survivors: " + shrink_errors.text());
  if (!wrong_count.empty())
    failures.push_back(who(wrong_count) + ": the new communicator's count is not " + std::to_string(n - 1));
  if (!wrong_rank.empty()) failures.push_back(who(wrong_rank) + ": the new communicator's rank is not the old one");
  if (!destroy_errors.empty()) failures.push_back("destroy failed on " + destroy_errors.text());
  for (const auto& [step, ranks] : unfinished)
    failures.push_back(who(ranks) + " did not finish " + kStepNames[step] +
                       (killed_stragglers ? " (killed at the timeout)" : ""));
  if (!late_barrier.empty())
    failures.push_back(who(late_barrier) + " waited until the timeout at the barrier after shrink");
  if (!status_wrong.empty()) failures.push_back(who(status_wrong) + " ended with an unexpected status");

  auto minmax = [](const std::vector<double>& v, double& lo, double& hi) {
    if (v.empty()) return;
    lo = *std::min_element(v.begin(), v.end());
    hi = *std::max_element(v.begin(), v.end());
  };
  minmax(init_t, res.init_min, res.init_max);
  minmax(split_t, res.split_min, res.split_max);
  minmax(detect_t, res.detect_min, res.detect_max);
  minmax(shrink_t, res.shrink_min, res.shrink_max);
  for (int r = 0; r < forked; ++r) res.init_failed += s[r].init_rc > 0;
  res.undetected = static_cast<int>(undetected.size());
  res.shrink_failed = shrink_errors.count;
  for (const auto& g : unfinished) res.unfinished += static_cast<int>(g.second.size());
  res.ok = failures.empty();
  if (res.ok) {
    res.outcome = "all right";
  } else {
    res.outcome = "fails: ";
    for (size_t i = 0; i < failures.size(); ++i) res.outcome += (i ? "; " : "") + failures[i];
  }

  std::string line = "ranks " + std::to_string(n) + ": ";
  if (!init_t.empty()) {
    line += "init slowest " + span(res.init_max) + " (fastest " + span(res.init_min) + ")";
    if (init_t.size() < static_cast<size_t>(n))
      line += " on the " + std::to_string(init_t.size()) + " of " + std::to_string(n) + " that succeeded";
  } else
    line += "no init succeeded";
  if (!split_t.empty()) line += ", split slowest " + span(res.split_max) + " (fastest " + span(res.split_min) + ")";
  if (!detect_t.empty()) {
    int survivors = static_cast<int>(detect_t.size() + undetected.size() + early.size());
    line += ", failure known by ";
    line += detect_t.size() == static_cast<size_t>(n - 1) ? std::string("every survivor")
                                                           : std::to_string(detect_t.size()) + " of " +
                                                                 std::to_string(survivors) + " survivors";
    line += " within " + span(res.detect_max) + " (fastest " + span(res.detect_min) + ")";
  }
  if (!shrink_t.empty()) {
    line += ", shrink slowest " + span(res.shrink_max) + " (fastest " + span(res.shrink_min) + ")";
    if (shrink_errors.count)
      line += " on the " + std::to_string(shrink_t.size()) + " of " +
              std::to_string(shrink_t.size() + shrink_errors.count) + " that succeeded";
  }
  line += ", outcome: " + res.outcome;
  std::printf("%s\n", line.c_str());
  if (!res.ok && !logdir.empty())
    for (const auto& l : log_lines(logdir, pids, 8)) std::printf("    log: %s\n", l.c_str());
  std::fflush(stdout);
  munmap(mem, bytes);
  if (!logdir.empty() && g_keep_logs.empty()) remove_dir(logdir);
  return res;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "control_plane_bench: %s\nusage: control_plane_bench [--timeout SECONDS] [--runs K] [--stop] [--logs DIR] "
               "[RANKS ...]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double timeout_s = 120;
  long runs = 1;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    char* end = nullptr;
    if (a == "--timeout") {
      if (++i == argc) return usage("--timeout needs a value");
      timeout_s = std::strtod(argv[i], &end);
      if (*end || !(timeout_s > 0)) return usage("--timeout takes a positive number of seconds");
    } else if (a == "--runs") {
      if (++i == argc) return usage("--runs needs a value");
      runs = std::strtol(argv[i], &end, 10);
      if (*end || runs < 1 || runs > 1000) return usage("--runs takes a count of 1 to 1000");
    } else if (a == "--logs") {
      if (++i == argc) return usage("--logs needs a directory");
      g_keep_logs = argv[i];
      if (mkdir(argv[i], 0755) != 0 && errno != EEXIST) return usage("--logs: the directory cannot be made");
    } else if (a == "--stop") {
      g_stop = true;
    } else {
      long v = std::strtol(a.c_str(), &end, 10);
      if (*end || v < 2 || v > 100000) return usage(("not a size of at least 2 ranks: " + a).c_str());
      sizes.push_back(static_cast<int>(v));
    }
  }
  if (sizes.empty()) sizes = {16, 64, 128};

  // No GPU, NCCL's settings only, and as many open files as allowed.
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  for (const char* v : {"MSCCLPP_DEBUG", "MSCCLPP_DEBUG_FILE", "NCCL_COMM_ID", "MSCCLPP_NCCL_FALLBACK",
                        "NCCL_COMM_BLOCKING", "MSCCLPP_ABORT_EXIT_TIMEOUT"})
    unsetenv(v);
  setenv("NCCL_DEBUG", "WARN", 0);
  if (g_stop) setenv("MSCCLPP_PEER_TIMEOUT", "1", 0);
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  getrlimit(RLIMIT_NOFILE, &lim);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("control plane bench: %ld cores, open files %llu, timeout %g s a size, %ld run(s) each, the last rank %s\n",
              cores, static_cast<unsigned long long>(lim.rlim_cur), timeout_s, runs,
              g_stop ? "stopped (SIGSTOP)" : "killed (SIGKILL)");
  std::fflush(stdout);

  std::vector<Result> results;
  for (int n : sizes)
    for (long k = 0; k < runs; ++k) results.push_back(run_size(n, timeout_s));

  auto num = [](double ns, double scale) {
    char buf[32];
    if (ns < 0) return std::string("null");
    std::snprintf(buf, sizeof buf, "%.4f", ns / scale);
    return std::string(buf);
  };
  std::string json = "{\"cores\":" + std::to_string(cores) + ",\"open_files\":" + std::to_string(lim.rlim_cur) +
                     ",\"sizes\":[";
  bool all_ok = true;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    all_ok = all_ok && r.ok;
    json += (i ? "," : "") + std::string("{\"ranks\":") + std::to_string(r.ranks) +
            ",\"init_slowest_s\":" + num(r.init_max, 1e9) + ",\"init_fastest_s\":" + num(r.init_min, 1e9) +
            ",\"split_slowest_s\":" + num(r.split_max, 1e9) + ",\"split_fastest_s\":" + num(r.split_min, 1e9) +
            ",\"detect_slowest_ms\":" + num(r.detect_max, 1e6) + ",\"detect_fastest_ms\":" + num(r.detect_min, 1e6) +
            ",\"shrink_slowest_s\":" + num(r.shrink_max, 1e9) + ",\"shrink_fastest_s\":" + num(r.shrink_min, 1e9) +
            ",\"init_failed\":" + std::to_string(r.init_failed) + ",\"undetected\":" + std::to_string(r.undetected) +
            ",\"shrink_failed\":" + std::to_string(r.shrink_failed) +
            ",\"unfinished\":" + std::to_string(r.unfinished) +
            ",\"wall_s\":" + num(r.wall * 1e9, 1e9) + ",\"ok\":" + (r.ok ? "true" : "false") +
            ",\"outcome\":" + json_string(r.outcome) + "}";
  }
  json += "]}";
  std::printf("summary %s\n", json.c_str());
  return all_ok ? 0 : 1;
}
