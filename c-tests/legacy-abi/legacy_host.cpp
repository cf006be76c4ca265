// The legacy-ABI test's half that needs no GPU: a program compiled against MSCCL++ 0.1.0's own mscclpp.h
// (copied from LEGACY_HEADER into build/legacy-include/, never our header) and linked with our libmscclpp,
// as a user's program built for the legacy library is. Built by `make` where the 0.1.0 header is found
// (c-tests/legacy-abi/legacy.mk) and run by `make test`, which counts it as skipped, saying why, where the
// header is not there. Its GPU half is legacy_allgather.cu (make gpu-test).
//
// Checks:
// - every function the 0.1.0 header declares resolves in our library (taking their addresses makes the link
//   fail otherwise), with the legacy header's exact signature;
// - the legacy result codes and the error strings;
// - one rank from a unique id and two ranks (two processes) from "ip:port": rank, size, the bootstrap's
//   all-gather and barrier, destroy, as the legacy header declares them;
// - a bad argument returns mscclppInvalidArgument and reaches a log handler set through the legacy
//   mscclppSetLogHandler.
// Ends with "legacy host test: N passed, N failed".
#define HOST_TEST_NAME "legacy_host"
static const unsigned CHILD_LIMIT_S = 60;
#include "host_test_common.h"

#include <mscclpp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// The header this program sees must be the legacy one: ours defines these, 0.1.0's does not.
#if defined(MSCCLPP_HAS_ABORT) || defined(MSCCLPP_HAS_COLLECTIVES)
#error "compiled against our mscclpp.h; the legacy-ABI test needs MSCCL++ 0.1.0's header first on the path"
#endif

static int passed = 0;
static int failed = 0;

static void verdict(bool ok, const std::string& what) {
  if (ok) {
    passed++;
    printf("PASS %s\n", what.c_str());
  } else {
    failed++;
    printf("FAIL %s\n", what.c_str());
  }
  fflush(stdout);
}

// Every function of the 0.1.0 header, by its declared type: a name our library lacks fails the link, a
// different signature fails the compile.
struct Entry {
  const char* name;
  const void* address;
};
#define ENTRY(f) Entry{#f, reinterpret_cast<const void*>(&f)}
static const Entry kFunctions[] = {
  ENTRY(mscclppGetUniqueId),           ENTRY(mscclppCommInitRank),         ENTRY(mscclppCommInitRankFromId),
  ENTRY(mscclppBootstrapAllGather),    ENTRY(mscclppBootstrapBarrier),     ENTRY(mscclppCommDestroy),
  ENTRY(mscclppGetErrorString),        ENTRY(mscclppConnect),              ENTRY(mscclppConnectionSetup),
  ENTRY(mscclppGetAllDeviceConnections), ENTRY(mscclppGetDeviceConnection), ENTRY(mscclppProxyLaunch),
  ENTRY(mscclppProxyStop),             ENTRY(mscclppCommRank),             ENTRY(mscclppCommSize),
  ENTRY(mscclppSetBootstrapConnTimeout), ENTRY(mscclppDefaultLogHandler),  ENTRY(mscclppSetLogHandler),
  ENTRY(mscclppRegisterBuffer),        ENTRY(mscclppRegisteredBufferWrite),
};

// One rank of a job of `nranks` (joined from `addr`, or from `id` when addr is null): rank and size, an
// all-gather of one int per rank, a barrier, destroy. Returns 0 when all of it worked.
static int one_rank(int nranks, int rank, const char* addr, const mscclppUniqueId* id) {
  g_rank = rank;
  mscclppComm_t comm = nullptr;
  mscclppResult_t rc = addr ? mscclppCommInitRank(&comm, nranks, addr, rank)
                            : mscclppCommInitRankFromId(&comm, nranks, *id, rank);
  CHECK(rc == mscclppSuccess && comm != nullptr, "init: %s", mscclppGetErrorString(rc));
  int r = -1, n = -1;
  CHECK(mscclppCommRank(comm, &r) == mscclppSuccess && r == rank, "mscclppCommRank gave %d", r);
  CHECK(mscclppCommSize(comm, &n) == mscclppSuccess && n == nranks, "mscclppCommSize gave %d", n);
  std::vector<int> data(nranks, -1);
  data[rank] = 100 + rank;
  rc = mscclppBootstrapAllGather(comm, data.data(), sizeof(int));
  CHECK(rc == mscclppSuccess, "mscclppBootstrapAllGather: %s", mscclppGetErrorString(rc));
  for (int i = 0; i < nranks; i++) CHECK(data[i] == 100 + i, "all-gather slot %d holds %d", i, data[i]);
  CHECK(mscclppBootstrapBarrier(comm) == mscclppSuccess, "mscclppBootstrapBarrier");
  CHECK(mscclppCommDestroy(comm) == mscclppSuccess, "mscclppCommDestroy");
  return 0;
}

int main() {
  // 1. The functions.
  std::string missing;
  for (const Entry& e : kFunctions)
    if (e.address == nullptr) missing += std::string(" ") + e.name;
  verdict(missing.empty(), "the " + std::to_string(sizeof(kFunctions) / sizeof(kFunctions[0])) +
                             " functions of the 0.1.0 header resolve in our library" +
                             (missing.empty() ? "" : ": missing" + missing));

  // 2. Result codes and their strings (the legacy header's numbering).
  bool strings = true;
  for (int c = mscclppSuccess; c < mscclppNumResults; c++) {
    const char* s = mscclppGetErrorString(static_cast<mscclppResult_t>(c));
    strings = strings && s != nullptr && s[0] != '\0';
  }
  verdict(strings && mscclppInvalidArgument == 4 && mscclppInvalidUsage == 5 && mscclppNumResults == 8,
          "mscclppGetErrorString names every result code of the legacy header");
  verdict(mscclppSetBootstrapConnTimeout(20) == mscclppSuccess, "mscclppSetBootstrapConnTimeout(20)");

  // 3. A bad argument, seen through a log handler set with the legacy declaration.
  verdict(mscclppSetLogHandler(capture_log) == mscclppSuccess, "mscclppSetLogHandler");
  int rank = -1;
  mscclppResult_t rc = mscclppCommRank(nullptr, &rank);
  verdict(rc == mscclppInvalidArgument, std::string("mscclppCommRank(NULL) is mscclppInvalidArgument (got ") +
                                          mscclppGetErrorString(rc) + ")");
  verdict(!log_line_with({"MSCCLPP WARN", "mscclppCommRank"}).empty(),
          "its log line reaches the handler: " + log_line_with({"mscclppCommRank"}));
  verdict(mscclppSetLogHandler(mscclppDefaultLogHandler) == mscclppSuccess,
          "mscclppSetLogHandler(mscclppDefaultLogHandler)");

  // 4. One rank from a unique id.
  mscclppUniqueId id;
  memset(&id, 0, sizeof(id));
  rc = mscclppGetUniqueId(&id);
  verdict(rc == mscclppSuccess, std::string("mscclppGetUniqueId: ") + mscclppGetErrorString(rc));
  verdict(one_rank(1, 0, nullptr, &id) == 0, "one rank from a unique id: rank, size, all-gather, barrier, destroy");

  // 5. Two ranks in two processes, meeting at rank 0's ip:port.
  char addr[64];
  int port = free_local_addr(addr, sizeof(addr));
  std::vector<pid_t> pids;
  for (int r = 0; r < 2 && port > 0; r++) pids.push_back(spawn([&, r] { return one_rank(2, r, addr, nullptr); }));
  verdict(port > 0 && wait_all(pids), std::string("two ranks (two processes) at ") + addr +
                                        ": rank, size, all-gather, barrier, destroy");

  printf("legacy host test: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
