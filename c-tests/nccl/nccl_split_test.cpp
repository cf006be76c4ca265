// ncclCommSplit, ncclCommShrink and ncclCommRevoke without a GPU (the bootstrap needs none): ranks are
// threads of one process, or processes for a rank that is killed. Each case runs in a child of its own
// (fork before any call into the library, whose threads do not survive a fork):
// - split: 4 ranks into 2 colors by one thread in a group, keys reversing the order; NCCL_SPLIT_NOCOLOR
//   (*newcomm NULL); a split of a split; non-blocking by config and by the parent's mode; bad input;
// - shrink leaving a live rank out: the survivors' new communicator works (a split of it, which exchanges
//   over its own bootstrap), the rank left out is untouched; bad input;
// - revoke: later calls refused, the peer sees it, ncclCommGetAsyncError says ncclSuccess once both
//   revoked, and a shrink of the revoked communicator works;
// - shrink after a SIGKILL: 3 processes, one killed; the survivors see ncclRemoteError, shrink it out
//   (one with NCCL_SHRINK_ABORT, one non-blocking) and their new communicator works, twice over;
// - a rank SIGKILLed as soon as its own init returned, five times: the others end in ncclRemoteError within
//   10 s, from their init (still connecting to each other) or from ncclCommGetAsyncError.
// Prints one line per check and "nccl split test: N passed, N failed".
#include <nccl.h>

#include "nccl_check.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

static int count_of(ncclComm_t c) {
  int n = -1;
  return ncclCommCount(c, &n) == ncclSuccess ? n : -1;
}

static int rank_of(ncclComm_t c) {
  int r = -1;
  return ncclCommUserRank(c, &r) == ncclSuccess ? r : -1;
}

// Polls ncclCommGetAsyncError while it says ncclInProgress (10 s at most); returns what it says then.
static ncclResult_t settled(ncclComm_t c) {
  ncclResult_t state = ncclInProgress;
  for (int i = 0; i < 1000 && state == ncclInProgress; ++i) {
    if (ncclCommGetAsyncError(c, &state) != ncclSuccess) return ncclInvalidArgument;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return state;
}

// Polls ncclCommGetAsyncError until it says `want` (10 s at most).
static bool reaches(ncclComm_t c, ncclResult_t want) {
  ncclResult_t state = ncclSuccess;
  for (int i = 0; i < 1000; ++i) {
    if (ncclCommGetAsyncError(c, &state) == ncclSuccess && state == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// `n` ranks made by this thread in one group.
static std::vector<ncclComm_t> ranks(int n) {
  ncclUniqueId id;
  std::vector<ncclComm_t> comms(n, nullptr);
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  ncclGroupStart();
  for (int r = 0; r < n; ++r) ncclCommInitRank(&comms[r], n, id, r);
  expect(ncclGroupEnd(), ncclSuccess, std::to_string(n) + " ranks made in a group");
  return comms;
}

// Runs f(r) on a thread per listed rank.
static void on_threads(const std::vector<int>& which, const std::function<void(int)>& f) {
  std::vector<std::thread> threads;
  for (int r : which) threads.emplace_back(f, r);
  for (auto& t : threads) t.join();
}

static std::vector<int> all(int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r) v.push_back(r);
  return v;
}

static void destroy(const std::vector<ncclComm_t>& comms, const std::string& what) {
  bool ok = true;
  for (ncclComm_t c : comms)
    if (c) ok = ncclCommDestroy(c) == ncclSuccess && ok;
  check(ok, "ncclCommDestroy of every " + what);
}

static void split_case() {
  auto parent = ranks(4);
  // One thread, a group: colors by parity, keys reversing the order (10 - rank).
  std::vector<ncclComm_t> halves(4, nullptr);
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int r = 0; r < 4; ++r)
    expect(ncclCommSplit(parent[r], r % 2, 10 - r, &halves[r], NULL), ncclSuccess, "ncclCommSplit queued in a group");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd makes the 4 split comms");
  for (int r = 0; r < 4; ++r)
    check(count_of(halves[r]) == 2 && rank_of(halves[r]) == (r < 2 ? 1 : 0),
          "parent rank " + std::to_string(r) + ": color " + std::to_string(r % 2) + " has 2 ranks, this one is " +
              std::to_string(r < 2 ? 1 : 0) + " (keys reverse the order), got " + std::to_string(rank_of(halves[r])) +
              " of " + std::to_string(count_of(halves[r])));

  // A thread per rank, blocking; rank 3 in no color; equal keys keep the parent's order.
  std::vector<ncclComm_t> three(4, nullptr);
  on_threads(all(4), [&](int r) {
    three[r] = (ncclComm_t)0x1;
    expect(ncclCommSplit(parent[r], r == 3 ? NCCL_SPLIT_NOCOLOR : 7, 0, &three[r], NULL), ncclSuccess,
           "ncclCommSplit from a thread per rank");
  });
  check(three[3] == NULL, "NCCL_SPLIT_NOCOLOR: *newcomm is NULL");
  for (int r = 0; r < 3; ++r)
    check(count_of(three[r]) == 3 && rank_of(three[r]) == r, "equal keys: parent order (rank " + std::to_string(r) + ")");

  // A split of a split.
  std::vector<ncclComm_t> nested(3, nullptr);
  on_threads(all(3), [&](int r) {
    expect(ncclCommSplit(three[r], r < 2 ? 0 : 1, 0, &nested[r], NULL), ncclSuccess, "ncclCommSplit of a split comm");
  });
  check(count_of(nested[0]) == 2 && count_of(nested[1]) == 2 && count_of(nested[2]) == 1 && rank_of(nested[1]) == 1 &&
            rank_of(nested[2]) == 0,
        "the nested split has 2 + 1 ranks");

  // Non-blocking by config: ncclInProgress, then ncclSuccess; the new comm's place is known then.
  std::vector<ncclComm_t> nb(4, nullptr);
  on_threads(all(4), [&](int r) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t got = ncclCommSplit(parent[r], 0, r, &nb[r], &cfg);
    check((got == ncclInProgress || got == ncclSuccess) && nb[r] != NULL, "a non-blocking split returns at once");
    expect(settled(nb[r]), ncclSuccess, "and reaches ncclSuccess");
    check(count_of(nb[r]) == 4 && rank_of(nb[r]) == r, "with count 4, rank " + std::to_string(r));
  });
  // Without a config, a non-blocking parent's split is non-blocking too.
  std::vector<ncclComm_t> inherited(4, nullptr);
  on_threads(all(4), [&](int r) {
    expect(ncclCommSplit(nb[r], 0, -r, &inherited[r], NULL), ncclInProgress, "a split of a non-blocking comm (no config)");
    expect(settled(inherited[r]), ncclSuccess, "reaches ncclSuccess");
    check(rank_of(inherited[r]) == 3 - r, "keys -rank reverse the order");
  });

  // Bad input: refused at once, before any message (no peer is left waiting).
  ncclComm_t out = (ncclComm_t)0x1;
  expect(ncclCommSplit(parent[0], -2, 0, &out, NULL), ncclInvalidArgument, "ncclCommSplit(color -2)");
  check(out == NULL, "*newcomm is NULL after a refusal");
  logged("color is -2");
  expect(ncclCommSplit(parent[0], 0, 0, NULL, NULL), ncclInvalidArgument, "ncclCommSplit(newcomm NULL)");
  logged("newcomm is NULL");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 7;
  expect(ncclCommSplit(parent[0], 0, 0, &out, &bad), ncclInvalidArgument, "ncclCommSplit(config with a wrong magic)");
  expect(ncclCommSplit(NULL, 0, 0, &out, NULL), ncclInvalidArgument, "ncclCommSplit(comm NULL)");
  destroy(inherited, "inherited comm");
  destroy(nb, "non-blocking split comm");
  destroy(nested, "nested split comm");
  destroy(three, "split comm");
  destroy(halves, "half");
  // The parents still work after all that: one more split.
  std::vector<ncclComm_t> last(4, nullptr);
  on_threads(all(4), [&](int r) { ncclCommSplit(parent[r], 0, 0, &last[r], NULL); });
  check(count_of(last[3]) == 4, "the parent splits again");
  destroy(last, "last split comm");
  destroy(parent, "parent");
}

static void shrink_live_case() {
  auto parent = ranks(4);
  // Rank 1 is left out and does not call.
  std::vector<ncclComm_t> shrunk(4, nullptr);
  on_threads({0, 2, 3}, [&](int r) {
    int exclude[] = {1};
    expect(ncclCommShrink(parent[r], exclude, 1, &shrunk[r], NULL, NCCL_SHRINK_DEFAULT), ncclSuccess,
           "ncclCommShrink leaving rank 1 out");
  });
  for (int r : {0, 2, 3})
    check(count_of(shrunk[r]) == 3 && rank_of(shrunk[r]) == (r == 0 ? 0 : r - 1),
          "parent rank " + std::to_string(r) + " is rank " + std::to_string(r == 0 ? 0 : r - 1) + " of 3");
  // The new communicator works: a split of it exchanges over its own bootstrap.
  std::vector<ncclComm_t> again(4, nullptr);
  on_threads({0, 2, 3}, [&](int r) {
    expect(ncclCommSplit(shrunk[r], 0, -rank_of(shrunk[r]), &again[r], NULL), ncclSuccess, "a split of the shrunk comm");
  });
  check(rank_of(again[0]) == 2 && rank_of(again[3]) == 0 && count_of(again[2]) == 3, "it orders the 3 by key");
  ncclResult_t async = ncclInternalError;
  ncclCommGetAsyncError(parent[1], &async);
  expect(async, ncclSuccess, "the rank left out keeps a healthy parent");

  // Bad input, refused at once.
  ncclComm_t out = (ncclComm_t)0x1;
  int four[] = {4}, minus[] = {-1}, every[] = {0, 1, 2, 3}, self[] = {0};
  expect(ncclCommShrink(parent[0], four, 1, &out, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "exclude rank 4 of 4");
  check(out == NULL, "*newcomm is NULL after a refusal");
  logged("excludeRanksList holds 4");
  expect(ncclCommShrink(parent[0], minus, 1, &out, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "exclude rank -1");
  expect(ncclCommShrink(parent[0], every, 4, &out, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "exclude every rank");
  logged("excludeRanksCount is 4");
  expect(ncclCommShrink(parent[0], NULL, 1, &out, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "excludeRanksList NULL");
  expect(ncclCommShrink(parent[0], self, 1, &out, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "exclude the caller");
  logged("excludeRanksList holds this rank (0)");
  expect(ncclCommShrink(parent[0], four, 0, NULL, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "newcomm NULL");
  expect(ncclCommShrink(parent[0], NULL, 0, &out, NULL, 2), ncclInvalidArgument, "shrinkFlags 2");
  logged("shrinkFlags is 2");
  destroy(again, "split of the shrunk comm");
  destroy(shrunk, "shrunk comm");
  destroy(parent, "parent");
}

static void revoke_case() {
  auto comms = ranks(2);
  expect(ncclCommRevoke(comms[0], 1), ncclInvalidArgument, "ncclCommRevoke(flags 1)");
  expect(ncclCommRevoke(NULL, 0), ncclInvalidArgument, "ncclCommRevoke(comm NULL)");
  expect(ncclCommRevoke(comms[0], 0), ncclSuccess, "ncclCommRevoke(rank 0)");
  void* p = (void*)0x1000;
  expect(ncclAllReduce(p, p, 4, ncclFloat, ncclSum, comms[0], 0), ncclInvalidUsage, "a collective on a revoked comm");
  logged("comm was revoked");
  expect(ncclSend(p, 4, ncclFloat, 1, comms[0], 0), ncclInvalidUsage, "a send on a revoked comm");
  ncclComm_t out = (ncclComm_t)0x1;
  expect(ncclCommSplit(comms[0], 0, 0, &out, NULL), ncclInvalidUsage, "a split of a revoked comm");
  check(count_of(comms[0]) == 2 && rank_of(comms[0]) == 0, "queries still answer");
  ncclResult_t async = ncclInternalError;
  ncclCommGetAsyncError(comms[0], &async);
  expect(async, ncclSuccess, "ncclCommGetAsyncError of the revoked comm");
  // Rank 1 learns of it (our revoke tells the peers), and revokes too.
  check(reaches(comms[1], ncclRemoteError), "rank 1 sees rank 0's revoke as ncclRemoteError");
  expect(ncclCommRevoke(comms[1], 0), ncclSuccess, "ncclCommRevoke(rank 1)");
  ncclCommGetAsyncError(comms[1], &async);
  expect(async, ncclSuccess, "then its async error is ncclSuccess");
  // A shrink of the revoked comm leaving nobody out: a working communicator of both.
  std::vector<ncclComm_t> fresh(2, nullptr);
  on_threads(all(2), [&](int r) {
    expect(ncclCommShrink(comms[r], NULL, 0, &fresh[r], NULL, NCCL_SHRINK_DEFAULT), ncclSuccess, "ncclCommShrink of a revoked comm");
  });
  check(count_of(fresh[1]) == 2 && rank_of(fresh[1]) == 1, "its new comm has both ranks");
  std::vector<ncclComm_t> split(2, nullptr);
  on_threads(all(2), [&](int r) { ncclCommSplit(fresh[r], 0, -r, &split[r], NULL); });
  check(rank_of(split[0]) == 1, "and works (a split of it)");
  destroy(split, "split of the new comm");
  destroy(fresh, "new comm");
  expect(ncclCommAbort(comms[0]), ncclSuccess, "ncclCommAbort of a revoked comm");
  expect(ncclCommDestroy(comms[1]), ncclSuccess, "ncclCommDestroy of a revoked comm");
}

// Rank 0 makes the unique id and writes it to ranks 1 and 2 through id_pipe; they read it.
static bool share_id(int rank, int id_pipe[2][2], ncclUniqueId* id) {
  if (rank != 0) return read(id_pipe[rank - 1][0], id, sizeof(*id)) == (ssize_t)sizeof(*id);
  if (ncclGetUniqueId(id) != ncclSuccess) return false;
  for (int i = 0; i < 2; ++i)
    if (write(id_pipe[i][1], id, sizeof(*id)) != (ssize_t)sizeof(*id)) return false;
  return true;
}

// One rank's process of the killed-rank case; returns its exit status. Rank 2 dies only once ranks 0 and 1
// said through ready_pipe that their init returned: a rank's init may return while its peers are still
// connecting to each other, and a death then fails their init instead (ncclRemoteError), a different case.
static int killed_case_rank(int rank, int id_pipe[2][2], int ready_pipe[2]) {
  ncclUniqueId id;
  if (!share_id(rank, id_pipe, &id)) return 3;
  ncclComm_t parent = NULL;
  expect(ncclCommInitRank(&parent, 3, id, rank), ncclSuccess, "rank " + std::to_string(rank) + ": ncclCommInitRank(3 ranks)");
  if (rank == 2) {
    char byte[2];
    for (size_t got = 0; got < sizeof(byte);) {
      ssize_t n = read(ready_pipe[0], byte + got, sizeof(byte) - got);
      if (n <= 0) return 3;
      got += (size_t)n;
    }
    raise(SIGKILL);
  }
  if (write(ready_pipe[1], "r", 1) != 1) return 3;
  std::string me = "rank " + std::to_string(rank) + ": ";
  check(reaches(parent, ncclRemoteError), me + "sees rank 2's death as ncclRemoteError");
  // Rank 0 stops the parent's work first; rank 1 asks for a non-blocking shrink.
  int exclude[] = {2};
  ncclComm_t shrunk = NULL;
  if (rank == 0) {
    expect(ncclCommShrink(parent, exclude, 1, &shrunk, NULL, NCCL_SHRINK_ABORT), ncclSuccess, me + "ncclCommShrink(NCCL_SHRINK_ABORT)");
  } else {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t got = ncclCommShrink(parent, exclude, 1, &shrunk, &cfg, NCCL_SHRINK_DEFAULT);
    check(got == ncclInProgress || got == ncclSuccess, me + "a non-blocking ncclCommShrink returns at once");
  }
  expect(settled(shrunk), ncclSuccess, me + "the survivors' new comm is ready");
  check(count_of(shrunk) == 2 && rank_of(shrunk) == rank, me + "it has 2 ranks, this one " + std::to_string(rank));
  // It works: a split exchanges over its bootstrap; a second shrink of the failed parent works too.
  // Rank 1's new comm is non-blocking, and so is a split of it without a config.
  ncclComm_t split = NULL;
  expect(ncclCommSplit(shrunk, 0, -rank, &split, NULL), rank == 0 ? ncclSuccess : ncclInProgress, me + "a split of the new comm");
  expect(settled(split), ncclSuccess, me + "the split is ready");
  check(rank_of(split) == 1 - rank, me + "its keys reverse the order");
  ncclComm_t second = NULL;
  expect(ncclCommShrink(parent, exclude, 1, &second, NULL, NCCL_SHRINK_DEFAULT), ncclSuccess, me + "a second shrink of the parent");
  check(count_of(second) == 2 && rank_of(second) == rank, me + "gives 2 ranks again");
  ncclResult_t async = ncclInternalError;
  ncclCommGetAsyncError(second, &async);
  expect(async, ncclSuccess, me + "no error on it");
  bool ok = ncclCommDestroy(split) == ncclSuccess && ncclCommDestroy(second) == ncclSuccess &&
            ncclCommDestroy(shrunk) == ncclSuccess && ncclCommAbort(parent) == ncclSuccess;
  check(ok, me + "everything destroyed, the parent aborted");
  return 0;
}

// One rank's process of the init-race case: rank 2 dies the moment its own init returns, while ranks 0
// and 1 may still be connecting to each other (or not: the race goes either way). Each of them ends in
// ncclRemoteError well within the bootstrap timeout (30 s), from its init or from ncclCommGetAsyncError.
static int init_race_rank(int rank, int id_pipe[2][2], int[2]) {
  ncclUniqueId id;
  if (!share_id(rank, id_pipe, &id)) return 3;
  const auto start = std::chrono::steady_clock::now();
  ncclComm_t comm = NULL;
  const ncclResult_t got = ncclCommInitRank(&comm, 3, id, rank);
  if (rank == 2) raise(SIGKILL);
  const std::string me = "rank " + std::to_string(rank) + ": ";
  if (got == ncclSuccess) {
    check(reaches(comm, ncclRemoteError), me + "init returned; rank 2's death then fails the comm: ncclRemoteError");
  } else {
    expect(got, ncclRemoteError, me + "init failed on rank 2's death");
    check(comm == NULL, me + "and left no comm");
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(took < 10, me + "within 10 s of its start (" + std::to_string(took) + " s)");
  if (comm != NULL) check(ncclCommAbort(comm) == ncclSuccess, me + "ncclCommAbort");
  return 0;
}

// Runs rank_main(rank, id_pipe, ready_pipe) for ranks 0-2 in processes of their own; rank 2 must end by
// SIGKILL, the others with status 0.
static void three_ranks(int (*rank_main)(int, int[2][2], int[2])) {
  int id_pipe[2][2];
  int ready_pipe[2];
  for (auto& p : id_pipe)
    if (pipe(p) != 0) return check(false, "pipe");
  if (pipe(ready_pipe) != 0) return check(false, "pipe");
  pid_t pids[3];
  for (int r = 0; r < 3; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rank_main(r, id_pipe, ready_pipe));
  }
  for (int r = 0; r < 3; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (r == 2)
      check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "rank 2 was SIGKILLed");
    else
      check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank " + std::to_string(r) + " ended normally");
  }
}

static void killed_case() { three_ranks(killed_case_rank); }

// Five times, so that both ways the race can go are likely taken.
static void init_race_case() {
  for (int i = 0; i < 5; ++i) three_ranks(init_race_rank);
}

static void run(const char* name, void (*body)()) {
  std::printf("-- %s\n", name);
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int before = counts->failed;
    body();
    if (counts->failed != before) std::printf("log:\n%s\n", read_file(log_path).c_str());
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0, std::string(name) + ": the child ended normally");
  std::remove(log_path.c_str());
}

int main() {
  if (!init_counts()) return 2;
  // The library's log lines go to a file of their own (in each child too), where logged() looks.
  if (!log_to_a_temp_file("nccl_split_test")) return 2;
  for (const char* v : {"MSCCLPP_DEBUG", "MSCCLPP_DEBUG_FILE", "NCCL_COMM_ID", "MSCCLPP_NCCL_FALLBACK",
                        "NCCL_COMM_BLOCKING", "MSCCLPP_ABORT_EXIT_TIMEOUT"})
    unsetenv(v);
  run("split", split_case);
  run("shrink leaving a live rank out", shrink_live_case);
  run("revoke", revoke_case);
  run("shrink after a rank was SIGKILLed", killed_case);
  run("a rank SIGKILLed as soon as its init returned", init_race_case);
  std::printf("nccl split test: %d passed, %d failed\n", counts->passed, counts->failed);
  return counts->failed ? 1 : 0;
}
