// Multi-process tests of the bootstrap through the C API: every rank is a forked process. Host-only: the
// bootstrap needs no GPU.
//
//   bootstrap_test N addr     N ranks meet at 127.0.0.1:PORT (mscclppCommInitRank)
//   bootstrap_test N id       N ranks meet through a unique id made by the parent
//   bootstrap_test timeout    ranks whose root or peers never come fail within the timeout
//   bootstrap_test stranger   strangers and a rank of another job at the root do not break a 4-rank job
//   bootstrap_test late       a rank arriving after the root gave up on it is told why at once; the root
//                             thread of a unique id sleeps while it waits (this process's CPU time)
//   bootstrap_test            all of the above, with 2, 4, 8 and 16 ranks
//
// Jobs split over several invocations (e.g. on different hosts), each running some of the ranks:
//   bootstrap_test join N IP:PORT FIRST COUNT     ranks FIRST..FIRST+COUNT-1 of an N-rank job at IP:PORT;
//                                                 the invocation with rank 0 starts the root there
//   bootstrap_test join-id N IDFILE FIRST COUNT   the same through a unique id: the invocation with
//                                                 rank 0 makes the id (its root lives in that process)
//                                                 and writes it to IDFILE; the others wait for the file
//
// Exits non-zero on any failure.
#include <mscclpp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#define HOST_TEST_NAME "bootstrap_test"
// A child that hangs is killed after this many seconds and counts as failed.
static const unsigned CHILD_LIMIT_S = 90;
#include "host_test_common.h"

static unsigned char pattern(int rank, size_t i) { return (unsigned char)(rank * 131 ^ i * 7 ^ (i >> 9)); }

// What every rank of a working job does: check rank and size, all-gather several sizes, barriers, destroy.
static int run_rank(int rank, int nranks, const char* addr, const mscclppUniqueId* id) {
  g_rank = rank;
  mscclppComm_t comm = nullptr;
  mscclppResult_t r = id ? mscclppCommInitRankFromId(&comm, nranks, *id, rank)
                         : mscclppCommInitRank(&comm, nranks, addr, rank);
  CHECK(r == mscclppSuccess, "init: %s", mscclppGetErrorString(r));
  int got = -1;
  CHECK(mscclppCommRank(comm, &got) == mscclppSuccess && got == rank, "mscclppCommRank gave %d", got);
  CHECK(mscclppCommSize(comm, &got) == mscclppSuccess && got == nranks, "mscclppCommSize gave %d", got);
  const int sizes[] = {1, 3, 8, 1000, 4101, 1 << 20};
  for (int size : sizes) {
    std::vector<unsigned char> buf((size_t)size * nranks, 0xEE);
    for (int i = 0; i < size; ++i) buf[(size_t)rank * size + i] = pattern(rank, i);
    r = mscclppBootstrapAllGather(comm, buf.data(), size);
    CHECK(r == mscclppSuccess, "all-gather of %d bytes: %s", size, mscclppGetErrorString(r));
    for (int p = 0; p < nranks; ++p)
      for (int i = 0; i < size; ++i)
        CHECK(buf[(size_t)p * size + i] == pattern(p, i), "all-gather of %d bytes: byte %d of rank %d's block is wrong",
              size, i, p);
    r = mscclppBootstrapBarrier(comm);
    CHECK(r == mscclppSuccess, "barrier: %s", mscclppGetErrorString(r));
  }
  r = mscclppCommDestroy(comm);
  CHECK(r == mscclppSuccess, "destroy: %s", mscclppGetErrorString(r));
  return 0;
}

static bool job_by_address(int nranks) {
  char addr[64];
  if (free_local_addr(addr, sizeof(addr)) < 0) return false;
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) pids.push_back(spawn([=] { return run_rank(r, nranks, addr, nullptr); }));
  return wait_all(pids);
}

static bool job_by_id(int nranks) {
  mscclppUniqueId id;
  mscclppResult_t r = mscclppGetUniqueId(&id);
  if (r != mscclppSuccess) {
    fprintf(stderr, "bootstrap_test: mscclppGetUniqueId: %s\n", mscclppGetErrorString(r));
    return false;
  }
  // The root runs in this process; the ranks are children that received the id.
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nranks; ++rank) pids.push_back(spawn([=] { return run_rank(rank, nranks, nullptr, &id); }));
  return wait_all(pids);
}

// How long a join-id invocation waits for the id file to appear.
static const double ID_FILE_WAIT_S = 30;
// The bootstrap timeout of join invocations: short, so that a broken job reports its error well before
// the caller's time limit, yet far longer than a working job takes.
static const int JOIN_TIMEOUT_S = 10;

// Writes the id so that a reader never sees half of it: a temporary file, then a rename.
static bool write_id_file(const char* path, const mscclppUniqueId& id) {
  std::string tmp = std::string(path) + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (!f) {
    fprintf(stderr, "bootstrap_test: cannot create %s: %s\n", tmp.c_str(), strerror(errno));
    return false;
  }
  bool ok = fwrite(&id, sizeof(id), 1, f) == 1;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp.c_str(), path) != 0) {
    fprintf(stderr, "bootstrap_test: cannot write the id to %s: %s\n", path, strerror(errno));
    return false;
  }
  return true;
}

// Waits for the id file written by the invocation with rank 0 and reads it.
static bool read_id_file(const char* path, mscclppUniqueId* id) {
  double deadline = now_s() + ID_FILE_WAIT_S;
  struct stat st;
  while (stat(path, &st) != 0) {
    if (now_s() > deadline) {
      fprintf(stderr, "bootstrap_test: no id file %s after %.0f s\n", path, ID_FILE_WAIT_S);
      return false;
    }
    usleep(10 * 1000);
  }
  if ((size_t)st.st_size != sizeof(*id)) {
    fprintf(stderr, "bootstrap_test: id file %s has %lld bytes, want %zu\n", path, (long long)st.st_size, sizeof(*id));
    return false;
  }
  FILE* f = fopen(path, "rb");
  bool ok = f && fread(id, sizeof(*id), 1, f) == 1;
  if (f) fclose(f);
  if (!ok) fprintf(stderr, "bootstrap_test: cannot read the id from %s\n", path);
  return ok;
}

// Ranks first..first+count-1 of an nranks job, by address (idfile null) or by the id in idfile.
static bool join_part(int nranks, const char* addr, const char* idfile, int first, int count) {
  mscclppResult_t r = mscclppSetBootstrapConnTimeout(JOIN_TIMEOUT_S);
  if (r != mscclppSuccess) {
    fprintf(stderr, "bootstrap_test: mscclppSetBootstrapConnTimeout: %s\n", mscclppGetErrorString(r));
    return false;
  }
  mscclppUniqueId id;
  if (idfile) {
    if (first == 0) {
      // The root of the id runs in this process, which stays until its ranks are done.
      r = mscclppGetUniqueId(&id);
      if (r != mscclppSuccess) {
        fprintf(stderr, "bootstrap_test: mscclppGetUniqueId: %s\n", mscclppGetErrorString(r));
        return false;
      }
      if (!write_id_file(idfile, id)) return false;
    } else if (!read_id_file(idfile, &id)) {
      return false;
    }
  }
  std::vector<pid_t> pids;
  for (int rank = first; rank < first + count; ++rank)
    pids.push_back(spawn([=] { return run_rank(rank, nranks, addr, idfile ? &id : nullptr); }));
  return wait_all(pids);
}

// Parses a whole decimal number in [lo, hi].
static bool parse_int(const char* s, int lo, int hi, int* out) {
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

// An init that must fail: with a bootstrap timeout of `timeout_s`, by `addr` or, where it is not null, by
// `id`, it returns a remote error within [min_s, max_s] seconds, not a hang, its log line saying `why`.
static int expect_init_refused(int rank, int nranks, const char* addr, const mscclppUniqueId* id, int timeout_s,
                               double min_s, double max_s, const char* why) {
  g_rank = rank;
  mscclppSetLogHandler(capture_log);
  CHECK(mscclppSetBootstrapConnTimeout(timeout_s) == mscclppSuccess, "mscclppSetBootstrapConnTimeout(%d)", timeout_s);
  mscclppComm_t comm = nullptr;
  double start = now_s();
  mscclppResult_t r = id ? mscclppCommInitRankFromId(&comm, nranks, *id, rank)
                         : mscclppCommInitRank(&comm, nranks, addr, rank);
  double took = now_s() - start;
  CHECK(r == mscclppRemoteError, "init returned %d (%s), want a remote error", r, mscclppGetErrorString(r));
  CHECK(took >= min_s && took <= max_s, "init failed after %.2f s, want %.1f to %.1f s", took, min_s, max_s);
  const char* call = id ? "mscclppCommInitRankFromId" : "mscclppCommInitRank";
  CHECK(!log_line_with({call, why}).empty(), "no log line of %s saying '%s':\n%s", call, why, whole_log().c_str());
  return 0;
}

// Init with a 2 s timeout must fail with a remote error after about 2 s.
static int expect_timeout(int rank, int nranks, const char* addr, const char* why) {
  return expect_init_refused(rank, nranks, addr, nullptr, 2, 1.5, 4.5, why);
}

static int connect_to(int port);

static bool timeouts() {
  // A rank whose root never comes.
  char addr[64];
  free_local_addr(addr, sizeof(addr));
  bool ok = wait_all({spawn([=] { return expect_timeout(1, 2, addr, "cannot reach the bootstrap root"); })});
  // Ranks 0 and 1 of 3, whose rank 2 never comes: the root, which gives up 2 s after the first rank came,
  // tells both which rank is missing.
  free_local_addr(addr, sizeof(addr));
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(spawn([=] { return expect_timeout(r, 3, addr, "rank 2 did not arrive"); }));
  }
  ok = wait_all(pids) && ok;
  // The same, but a process connects to the root as soon as it listens, sends half a hello and ends (a rank
  // that died as it started): the others are told that a connection ended before its hello, not only that
  // rank 2 never came.
  free_local_addr(addr, sizeof(addr));
  pids.clear();
  for (int r = 0; r < 2; ++r) {
    pids.push_back(spawn([=] { return expect_timeout(r, 3, addr, "connections that ended before their hello"); }));
  }
  pids.push_back(spawn([=] {
    const int port = atoi(strrchr(addr, ':') + 1);
    for (int i = 0; i < 300; ++i) {
      const int fd = connect_to(port);
      if (fd >= 0) {
        if (write(fd, "MSCCLPP!", 8) != 8) return 1;
        _exit(0); // the socket closes as the process ends
      }
      usleep(10 * 1000);
    }
    fprintf(stderr, "bootstrap_test: the root at %s never listened\n", addr);
    return 1;
  }));
  return wait_all(pids) && ok;
}

// This process's CPU time so far, user and system (every thread's).
static double cpu_s() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

// A root (this process's, of a unique id with a 2 s timeout) gives up on rank 2 of 3, which never came, and
// tells ranks 0 and 1; rank 2, arriving after that, is told the same at once instead of waiting out its
// own 10 s. Meanwhile the root thread, whose owner let it go, sleeps in poll: this process spends well
// under a second of CPU in those 3 s.
static bool late_rank() {
  if (mscclppSetBootstrapConnTimeout(2) != mscclppSuccess) return false;
  mscclppUniqueId id;
  mscclppResult_t r = mscclppGetUniqueId(&id);
  mscclppSetBootstrapConnTimeout(30);
  if (r != mscclppSuccess) {
    fprintf(stderr, "bootstrap_test: mscclppGetUniqueId: %s\n", mscclppGetErrorString(r));
    return false;
  }
  const double cpu_before = cpu_s();
  std::vector<pid_t> pids;
  const char* why = "rank 2 did not arrive";
  for (int rank = 0; rank < 2; ++rank) {
    pids.push_back(spawn([=] { return expect_init_refused(rank, 3, nullptr, &id, 2, 0, 4.5, why); }));
  }
  bool ok = wait_all(pids);
  ok = wait_all({spawn([=] { return expect_init_refused(2, 3, nullptr, &id, 10, 0, 1.5, why); })}) && ok;
  const double cpu = cpu_s() - cpu_before;
  if (cpu > 0.5) {
    fprintf(stderr, "bootstrap_test late: this process (the root's) spent %.2f s of CPU while it waited\n", cpu);
    ok = false;
  }
  return ok;
}

static int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (fd >= 0 && connect(fd, (sockaddr*)&a, sizeof(a)) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

// Rank 0 of the stranger case: a working rank that also checks that the root warned about the stranger.
static int rank0_watching_strangers(const char* addr) {
  mscclppSetLogHandler(capture_log);
  if (run_rank(0, 4, addr, nullptr) != 0) return 1;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  CHECK(g_log.find("WARN") != std::string::npos && g_log.find("turned away") != std::string::npos,
        "no WARN line about the stranger; the log was:\n%s", g_log.c_str());
  return 0;
}

static bool strangers() {
  char addr[64];
  int port = free_local_addr(addr, sizeof(addr));
  int ready[2], done[2];
  if (pipe(ready) != 0 || pipe(done) != 0) return false;
  double start = now_s();
  std::vector<pid_t> pids;
  pids.push_back(spawn([=] { return rank0_watching_strangers(addr); }));
  // The stranger: as soon as the root is up, one connection sends garbage and one stays silent; both stay
  // open until the job is over.
  pid_t stranger = spawn([=] {
    g_rank = -2;
    int noisy = -1;
    for (int i = 0; i < 2000 && noisy < 0; ++i) {
      noisy = connect_to(port);
      if (noisy < 0) usleep(5000);
    }
    CHECK(noisy >= 0, "the stranger never reached the root");
    int silent = connect_to(port);
    CHECK(silent >= 0, "the silent stranger could not connect");
    const char garbage[] = "GET / HTTP/1.1\r\nHost: example\r\n\r\nthis is not a bootstrap greeting at all....";
    CHECK(write(noisy, garbage, sizeof(garbage)) == (ssize_t)sizeof(garbage), "the stranger could not write");
    CHECK(write(ready[1], "x", 1) == 1, "signal");
    char c;
    (void)!read(done[0], &c, 1);
    close(noisy);
    close(silent);
    return 0;
  });
  char c;
  if (read(ready[0], &c, 1) != 1) return false;
  // Give rank 0 time to say hello, so the root knows the job has 4 ranks; then a rank of another job,
  // which thinks it has 5, must be turned away at once while the real job waits.
  usleep(300 * 1000);
  bool imposter_ok = wait_all({spawn([=] {
    g_rank = 1;
    mscclppComm_t comm = nullptr;
    double t = now_s();
    mscclppResult_t r = mscclppCommInitRank(&comm, 5, addr, 1);
    CHECK(r == mscclppInvalidUsage, "the 5-rank imposter got %d (%s), want invalid usage", r, mscclppGetErrorString(r));
    CHECK(now_s() - t < 10, "the imposter was turned away only after %.1f s", now_s() - t);
    return 0;
  })});
  for (int r = 1; r < 4; ++r) pids.push_back(spawn([=] { return run_rank(r, 4, addr, nullptr); }));
  bool ok = wait_all(pids);
  double took = now_s() - start;
  (void)!write(done[1], "x", 1);
  ok = wait_all({stranger}) && ok && imposter_ok;
  // The silent stranger may hold its slot for up to 10 s; the ranks must not wait for it.
  if (took > 8) {
    fprintf(stderr, "bootstrap_test: the job with strangers took %.1f s\n", took);
    ok = false;
  }
  close(ready[0]);
  close(ready[1]);
  close(done[0]);
  close(done[1]);
  return ok;
}

static bool run_case(const std::string& name, bool ok) {
  printf("bootstrap_test %s: %s\n", name.c_str(), ok ? "PASS" : "FAIL");
  fflush(stdout);
  return ok;
}

int main(int argc, char** argv) {
  // A failed write to a closed test socket must be an error, not a signal.
  signal(SIGPIPE, SIG_IGN);
  bool ok = true;
  if (argc == 3 && atoi(argv[1]) > 0 && (!strcmp(argv[2], "addr") || !strcmp(argv[2], "id"))) {
    int n = atoi(argv[1]);
    bool by_id = !strcmp(argv[2], "id");
    ok = run_case(std::string(argv[1]) + " " + argv[2], by_id ? job_by_id(n) : job_by_address(n));
  } else if (argc == 2 && !strcmp(argv[1], "timeout")) {
    ok = run_case("timeout", timeouts());
  } else if (argc == 2 && !strcmp(argv[1], "stranger")) {
    ok = run_case("stranger", strangers());
  } else if (argc == 2 && !strcmp(argv[1], "late")) {
    ok = run_case("late", late_rank());
  } else if (argc == 6 && (!strcmp(argv[1], "join") || !strcmp(argv[1], "join-id"))) {
    int n = 0, first = 0, count = 0;
    if (!parse_int(argv[2], 1, 1 << 20, &n) || !parse_int(argv[4], 0, n - 1, &first) ||
        !parse_int(argv[5], 1, n - first, &count)) {
      fprintf(stderr, "bootstrap_test %s: want 1 <= N, 0 <= FIRST < N and 1 <= COUNT <= N - FIRST\n", argv[1]);
      return 2;
    }
    bool by_id = !strcmp(argv[1], "join-id");
    std::string name = std::string(argv[1]) + " " + argv[2] + " ranks " + argv[4] + "-" + std::to_string(first + count - 1);
    ok = run_case(name, join_part(n, by_id ? nullptr : argv[3], by_id ? argv[3] : nullptr, first, count));
  } else if (argc == 1) {
    for (int n : {2, 4, 8, 16}) {
      ok = run_case(std::to_string(n) + " addr", job_by_address(n)) && ok;
      ok = run_case(std::to_string(n) + " id", job_by_id(n)) && ok;
    }
    ok = run_case("timeout", timeouts()) && ok;
    ok = run_case("stranger", strangers()) && ok;
    ok = run_case("late", late_rank()) && ok;
  } else {
    fprintf(stderr,
            "usage: %s [N addr | N id | timeout | stranger | late | join N IP:PORT FIRST COUNT | join-id N IDFILE FIRST "
            "COUNT]\n",
            argv[0]);
    return 2;
  }
  return ok ? 0 : 1;
}
