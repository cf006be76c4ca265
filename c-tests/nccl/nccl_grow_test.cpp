// ncclCommGetUniqueId and ncclCommGrow without a GPU (the bootstrap needs none): three processes, forked
// before any call into the library. Processes 0 and 1 make a communicator of 2 ranks; process 0 makes the
// grow's id and hands it to process 2 through shared memory; the three make a communicator of 3:
// - ncclCommGetUniqueId: a second id while the first is unused is ncclInvalidUsage, uniqueId NULL
//   ncclInvalidArgument;
// - bad grows, each refused at once (nothing waits for a timeout): nRanks not larger than the parent (on both
//   existing ranks), an existing rank passing a rank (its peer's grow then fails too, naming it), the root
//   passing no id and a non-root passing one, a new rank with a rank of the parent's range or past nRanks,
//   comm and uniqueId both NULL, a plain ncclGetUniqueId id, and the id of a grow that was refused is taken
//   (a new one can be made);
// - the grow: the root inside a group, the other existing rank non-blocking, the new rank blocking; every
//   rank's Count is 3 and UserRank its place (the parent's ranks keep theirs); the grown communicator works
//   (a split of it, keys reversing the order) and so does the parent (a split of it too).
// Prints one line per check and "nccl grow test: N passed, N failed".
#include <nccl.h>

#include "nccl_check.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace {

// What the processes share: the ids, and a step counter per process for `meet`.
struct Board {
  ncclUniqueId parentId, growId, plainId;
  int parentReady, growReady;
  int step[3];
};
Board* board = nullptr;

const double kWaitS = 40; // longer than the library's bootstrap timeout (30 s): a hang shows as a failure

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Waits until *flag is set by another process (bounded).
bool wait_for(int* flag, const std::string& what) {
  const double deadline = now() + kWaitS;
  while (!__atomic_load_n(flag, __ATOMIC_SEQ_CST)) {
    if (now() > deadline) {
      check(false, "waiting for " + what);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void publish(ncclUniqueId* slot, const ncclUniqueId& id, int* flag) {
  std::memcpy(slot, &id, sizeof(id));
  __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
}

// The processes' k-th meeting: returns once every process has arrived at step k (bounded).
void meet(int me, int k) {
  __atomic_store_n(&board->step[me], k, __ATOMIC_SEQ_CST);
  const double deadline = now() + kWaitS;
  for (int p = 0; p < 3; ++p)
    while (__atomic_load_n(&board->step[p], __ATOMIC_SEQ_CST) < k) {
      if (now() > deadline) return check(false, "process " + std::to_string(p) + " reached step " + std::to_string(k));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

int count_of(ncclComm_t c) {
  int n = -1;
  return ncclCommCount(c, &n) == ncclSuccess ? n : -1;
}

int rank_of(ncclComm_t c) {
  int r = -1;
  return ncclCommUserRank(c, &r) == ncclSuccess ? r : -1;
}

// Polls ncclCommGetAsyncError while it says ncclInProgress (kWaitS at most); returns what it says then.
ncclResult_t settled(ncclComm_t c) {
  ncclResult_t state = ncclInProgress;
  const double deadline = now() + kWaitS;
  while (state == ncclInProgress && now() < deadline) {
    if (ncclCommGetAsyncError(c, &state) != ncclSuccess) return ncclInvalidArgument;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return state;
}

// This thread's last error names `text`.
void says(const std::string& text, const std::string& me) {
  const std::string last = ncclGetLastError(NULL);
  check(last.find(text) != std::string::npos, me + "the error says \"" + text + "\" (got \"" + last + "\")");
}

// Process 0 or 1: a rank of the parent; process 0 is the grow's root.
void existing(int rank) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  ncclUniqueId id;
  if (rank == 0) {
    expect(ncclGetUniqueId(&id), ncclSuccess, me + "ncclGetUniqueId");
    publish(&board->parentId, id, &board->parentReady);
  } else {
    if (!wait_for(&board->parentReady, "the parent's id")) return;
    std::memcpy(&id, &board->parentId, sizeof(id));
  }
  ncclComm_t parent = NULL;
  expect(ncclCommInitRank(&parent, 2, id, rank), ncclSuccess, me + "ncclCommInitRank(2 ranks)");

  ncclUniqueId grow;
  if (rank == 0) {
    expect(ncclCommGetUniqueId(parent, &grow), ncclSuccess, me + "ncclCommGetUniqueId");
    ncclUniqueId again;
    expect(ncclCommGetUniqueId(parent, &again), ncclInvalidUsage, me + "a second ncclCommGetUniqueId before the grow");
    says("one id at a time", me);
    expect(ncclCommGetUniqueId(parent, NULL), ncclInvalidArgument, me + "ncclCommGetUniqueId(uniqueId NULL)");
    expect(ncclCommGetUniqueId(NULL, &again), ncclInvalidArgument, me + "ncclCommGetUniqueId(comm NULL)");
  }
  const ncclUniqueId* mine = rank == 0 ? &grow : NULL;

  // nRanks not larger than the parent: refused on every rank, the id kept.
  ncclComm_t out = (ncclComm_t)0x1;
  expect(ncclCommGrow(parent, 2, mine, -1, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(nRanks 2 of 2)");
  check(out == NULL, me + "*newcomm is NULL after a refusal");
  says("nRanks is 2", me);

  // Rank 1 passes a rank: it is refused at once, and rank 0's grow fails too, naming it, without waiting
  // for a timeout. Rank 0's id is taken by that grow.
  const double t0 = now();
  if (rank == 0) {
    expect(ncclCommGrow(parent, 3, mine, -1, &out, NULL), ncclInvalidUsage, me + "ncclCommGrow whose peer refuses");
    says("rank 1 refused the grow: rank is 5", me);
  } else {
    expect(ncclCommGrow(parent, 3, NULL, 5, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(rank 5 on an existing rank)");
    says("passes -1", me);
  }
  check(now() - t0 < 10, me + "the refused grow ended within 10 s");
  if (rank == 0) {
    expect(ncclCommGetUniqueId(parent, &grow), ncclSuccess, me + "ncclCommGetUniqueId again: the refused grow took the first");
    publish(&board->growId, grow, &board->growReady);
  } else if (!wait_for(&board->growReady, "the grow's id")) {
    return;
  } else {
    std::memcpy(&grow, &board->growId, sizeof(grow));
  }

  // The root passes no id, the other rank passes one: both refused at once (the id stays with rank 0).
  if (rank == 0) {
    expect(ncclCommGrow(parent, 3, NULL, -1, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(the root's id not passed)");
    says("this rank made an id", me);
  } else {
    expect(ncclCommGrow(parent, 3, &grow, -1, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(an id this rank did not make)");
    says("made no id on this comm", me);
  }
  meet(rank, 1);

  // The grow: rank 0 inside a group, rank 1 non-blocking.
  ncclComm_t grown = NULL;
  if (rank == 0) {
    expect(ncclGroupStart(), ncclSuccess, me + "ncclGroupStart");
    expect(ncclCommGrow(parent, 3, &grow, -1, &grown, NULL), ncclSuccess, me + "ncclCommGrow queued in a group");
    expect(ncclGroupEnd(), ncclSuccess, me + "ncclGroupEnd makes the grown comm");
  } else {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t got = ncclCommGrow(parent, 3, NULL, -1, &grown, &cfg);
    check((got == ncclInProgress || got == ncclSuccess) && grown != NULL, me + "a non-blocking ncclCommGrow returns at once");
    expect(settled(grown), ncclSuccess, me + "and reaches ncclSuccess");
  }
  check(count_of(grown) == 3 && rank_of(grown) == rank,
        me + "the grown comm has 3 ranks, this one keeps rank " + std::to_string(rank) + " (got " +
            std::to_string(rank_of(grown)) + " of " + std::to_string(count_of(grown)) + ")");
  ncclComm_t again = (ncclComm_t)0x1;
  // The grow took rank 0's id: passing it again is refused on both ranks (each at once, by its own check).
  expect(ncclCommGrow(parent, 4, &grow, -1, &again, NULL), ncclInvalidArgument, me + "ncclCommGrow with the used id");
  says("made no id on this comm", me);
  meet(rank, 2);

  // The grown comm works: a split of it with keys reversing the order exchanges over its own bootstrap.
  // (rank 1's grown comm is non-blocking, and so is a split of it without a config)
  ncclComm_t reversed = NULL;
  expect(ncclCommSplit(grown, 0, -rank, &reversed, NULL), rank == 0 ? ncclSuccess : ncclInProgress,
         me + "a split of the grown comm");
  expect(settled(reversed), ncclSuccess, me + "is ready");
  check(count_of(reversed) == 3 && rank_of(reversed) == 2 - rank, me + "it reverses the 3 ranks");
  // The parent is untouched: Count 2, and a split of it works.
  ncclComm_t half = NULL;
  expect(ncclCommSplit(parent, 0, -rank, &half, NULL), ncclSuccess, me + "a split of the parent");
  check(count_of(parent) == 2 && count_of(half) == 2 && rank_of(half) == 1 - rank, me + "the parent still has 2 ranks and works");
  bool ok = ncclCommDestroy(half) == ncclSuccess && ncclCommDestroy(reversed) == ncclSuccess &&
            ncclCommDestroy(grown) == ncclSuccess && ncclCommDestroy(parent) == ncclSuccess;
  check(ok, me + "everything destroyed");
}

// Process 2: the new rank.
void newcomer() {
  const std::string me = "new rank 2: ";
  ncclUniqueId plain;
  expect(ncclGetUniqueId(&plain), ncclSuccess, me + "ncclGetUniqueId (a plain id, for a refusal)");
  if (!wait_for(&board->growReady, "the grow's id")) return;
  ncclUniqueId grow;
  std::memcpy(&grow, &board->growId, sizeof(grow));
  ncclComm_t out = (ncclComm_t)0x1;
  expect(ncclCommGrow(NULL, 3, &grow, 1, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(a new rank taking rank 1)");
  check(out == NULL, me + "*newcomm is NULL after a refusal");
  says("rank is 1; a new rank (comm NULL) takes a rank in [2, nRanks = 3)", me);
  expect(ncclCommGrow(NULL, 3, &grow, 3, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(rank 3 of 3)");
  expect(ncclCommGrow(NULL, 2, &grow, 2, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(nRanks 2, the parent's)");
  says("nRanks is 2", me);
  expect(ncclCommGrow(NULL, 3, NULL, 2, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(comm and uniqueId NULL)");
  says("comm and uniqueId are both NULL", me);
  expect(ncclCommGrow(NULL, 3, &plain, 2, &out, NULL), ncclInvalidArgument, me + "ncclCommGrow(an id of ncclGetUniqueId)");
  says("not made by ncclCommGetUniqueId", me);
  expect(ncclCommGrow(NULL, 3, &grow, 2, NULL, NULL), ncclInvalidArgument, me + "ncclCommGrow(newcomm NULL)");
  meet(2, 1);

  ncclComm_t grown = NULL;
  expect(ncclCommGrow(NULL, 3, &grow, 2, &grown, NULL), ncclSuccess, me + "ncclCommGrow (blocking)");
  check(count_of(grown) == 3 && rank_of(grown) == 2, me + "it is rank 2 of 3");
  meet(2, 2);
  ncclComm_t reversed = NULL;
  expect(ncclCommSplit(grown, 0, -2, &reversed, NULL), ncclSuccess, me + "a split of the grown comm");
  check(rank_of(reversed) == 0, me + "it comes first there");
  check(ncclCommDestroy(reversed) == ncclSuccess && ncclCommDestroy(grown) == ncclSuccess, me + "everything destroyed");
}

} // namespace

int main() {
  if (!init_counts()) return 2;
  if (!log_to_a_temp_file("nccl_grow_test")) return 2;
  for (const char* v : {"MSCCLPP_DEBUG", "MSCCLPP_DEBUG_FILE", "NCCL_COMM_ID", "MSCCLPP_NCCL_FALLBACK",
                        "NCCL_COMM_BLOCKING", "MSCCLPP_ABORT_EXIT_TIMEOUT"})
    unsetenv(v);
  void* mem = mmap(NULL, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 2;
  board = static_cast<Board*>(mem);
  std::memset(board, 0, sizeof(Board));
  pid_t pids[3];
  for (int p = 0; p < 3; ++p) {
    pids[p] = fork();
    if (pids[p] == 0) {
      alarm(120); // a hang ends the process (and shows as a failure below)
      if (p < 2)
        existing(p);
      else
        newcomer();
      std::fflush(stdout);
      _exit(0);
    }
  }
  for (int p = 0; p < 3; ++p) {
    int status = 0;
    waitpid(pids[p], &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "process " + std::to_string(p) + " ended normally");
  }
  if (counts->failed) std::printf("log:\n%s\n", read_file(log_path).c_str());
  std::remove(log_path.c_str());
  std::printf("nccl grow test: %d passed, %d failed\n", counts->passed, counts->failed);
  return counts->failed ? 1 : 0;
}
