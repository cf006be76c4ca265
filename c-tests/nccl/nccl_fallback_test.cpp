// MSCCLPP_NCCL_FALLBACK without a GPU, against the fake NVIDIA library (fake_nvidia_nccl.c, built beside
// this program as fake/libnccl.so.2 and fake-incomplete/libnccl.so.2). Settings are read once per process,
// so each case runs in a child of its own (fork, before any call into the library) with its environment:
// - unset: what we do not carry out (several ids) fails at once, ncclInvalidUsage, naming the function and
//   the setting; fp8 types and PreMulSum operators are ours, never refused as unsupported;
// - the fake, ranks on one host: two ranks made in one group get NVIDIA communicators beside ours, made from
//   one NVIDIA id; every call is ours (fp8 and PreMulSum too) and none reaches the fake; async errors,
//   finalize, destroy, abort and revoke reach it; split and shrink (ours on one host) do not, and a split
//   comm gets a fake comm of its own;
// - the fake, ranks on two hosts (two processes, each in a UTS namespace of its own with its own host name;
//   skipped where namespaces cannot be made): every collective and send or receive reaches the fake with the
//   caller's arguments, a PreMulSum operator as its twin made on the fake; calls in our group go inside one
//   fake group at our group's end; the fake's ncclSend's call to its own ncclGetVersion stayed inside it;
//   a suspend refuses work until the resume; a split is ours, with a new fake comm of its own; a revoke
//   reaches the fake and aborts its comm; the
//   same with the fake dlopened by its path beforehand (as torch does): a private copy is loaded;
// - the fake, three ranks on three hosts, one SIGKILLed: the survivors get ncclRemoteError naming it, the
//   fake comm is aborted, the next call fails without reaching it, and ncclCommShrink makes a communicator
//   of two with a new fake comm that gets the next all-reduce;
// - the fake, four ranks on two hosts, the second host killed whole (both its ranks): the survivors get
//   ncclRemoteError naming one of them, the fake comm is aborted, and ncclCommShrink leaving the host out
//   gives a communicator of the two on one host, ours alone (its all-reduce never reaches the fake);
// - two ranks on two hosts grown to three on three (ncclCommGrow): ours, with a new fake comm of three;
// - two hosts without the setting: the fake found in LD_LIBRARY_PATH, also behind the folder of our own thin
//   libnccl.so.2 (build/lib/nccl, skipped: it needs libmscclpp.so.0); none anywhere: the initialisation
//   fails on both ranks saying what to install or set;
// - a control: the same fake loaded without RTLD_DEEPBIND, its ncclSend's call reaches our ncclGetVersion;
// - a path that does not exist, a library lacking a symbol, and NVIDIA's init refused: a WARN saying why,
//   and our communicator still works.
// Prints one line per check and "nccl fallback test: N passed, N failed".
#include <nccl.h>

#include "nccl_check.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <functional>
#include <limits.h>
#include <sched.h>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

static std::string dir, calls_path;

// The fake's lines holding `text`.
static std::vector<std::string> calls(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(read_file(calls_path));
  for (std::string line; std::getline(in, line);)
    if (line.find(text) != std::string::npos) out.push_back(line);
  return out;
}

static std::string field(const std::string& line, const std::string& name) {
  size_t at = line.find(name + "=");
  if (at == std::string::npos) return "";
  at += name.size() + 1;
  return line.substr(at, line.find(' ', at) - at);
}

static void two_ranks(ncclComm_t comms[2]) {
  ncclUniqueId id;
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclCommInitRank(&comms[0], 2, id, 0), ncclSuccess, "ncclCommInitRank(rank 0) in a group");
  expect(ncclCommInitRank(&comms[1], 2, id, 1), ncclSuccess, "ncclCommInitRank(rank 1) in a group");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd: both ranks made");
}

static bool eventually(const std::function<bool()>& cond, double seconds);

static void *const BUF = (void*)0x1000, *const OUT = (void*)0x2000;
static const cudaStream_t STREAM = (cudaStream_t)0x3000;

static void unset_case() {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  expect(ncclGetUniqueId(&id), ncclSuccess, "ncclGetUniqueId");
  expect(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess, "ncclCommInitRank(1 rank)");
  // fp8 types and PreMulSum operators are ours: our own checks answer (no GPU here), never "not carried out".
  expect(ncclSend(BUF, 4, ncclFloat8e4m3, 0, comm, STREAM), ncclInvalidArgument, "ncclSend(fp8) to self, unmatched: ours");
  float half = 0.5f;
  ncclRedOp_t op = ncclSum;
  expect(ncclRedOpCreatePreMulSum(&op, &half, ncclFloat, ncclScalarHostImmediate, comm), ncclSuccess,
         "ncclRedOpCreatePreMulSum");
  for (ncclResult_t r : {ncclReduce(BUF, OUT, 4, ncclFloat8e4m3, ncclSum, 0, comm, STREAM),
                         ncclAlltoAll(BUF, OUT, 4, ncclFloat8e5m2, comm, STREAM),
                         ncclAllReduce(BUF, OUT, 4, ncclFloat8e5m2, ncclSum, comm, STREAM),
                         ncclAllReduce(BUF, OUT, 4, ncclFloat, op, comm, STREAM)})
    check(r != ncclInvalidUsage && r != ncclSuccess, "an fp8 or PreMulSum call is ours (no GPU: it fails in our core)");
  check(read_file(log_path).find("is not carried out") == std::string::npos, "none is refused as not carried out");
  expect(ncclRedOpDestroy(op, comm), ncclSuccess, "ncclRedOpDestroy");
  // Split and shrink are ours: they need no setting.
  ncclComm_t sub = (ncclComm_t)0x1;
  expect(ncclCommSplit(comm, 0, 0, &sub, NULL), ncclSuccess, "ncclCommSplit without the setting");
  int one = 0;
  check(sub != NULL && ncclCommCount(sub, &one) == ncclSuccess && one == 1, "a split comm of one rank");
  expect(ncclCommDestroy(sub), ncclSuccess, "ncclCommDestroy(split comm)");
  ncclUniqueId ids[2] = {id, id};
  expect(ncclCommInitRankScalable(&sub, 1, 0, 2, ids, NULL), ncclInvalidUsage, "ncclCommInitRankScalable(2 ids)");
  logged("with 2 ids is not carried out by this library yet (one id is); set MSCCLPP_NCCL_FALLBACK");
  check(std::strstr(ncclGetLastError(NULL), "MSCCLPP_NCCL_FALLBACK") != NULL, "ncclGetLastError names the setting");
  expect(ncclCommRevoke(comm, 0), ncclSuccess, "ncclCommRevoke without the setting");
  expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  check(read_file(calls_path).empty(), "no fallback was loaded");
}

static void fake_case() {
  ncclComm_t comms[2] = {NULL, NULL};
  two_ranks(comms);
  logged("MSCCLPP_NCCL_FALLBACK: loaded \"" + dir + "/fake/libnccl.so.2\", NVIDIA NCCL 2.29.1 (ncclGetVersion: 22901)");
  logged("NVIDIA's communicator made beside ours");
  int v = 0;
  ncclGetVersion(&v);
  check(v == 23203, "our ncclGetVersion is still ours (23203)");
  auto ids = calls("ncclGetUniqueId");
  auto inits = calls("ncclCommInitRank rank=");
  check(ids.size() == 1, "one NVIDIA unique id (rank 0's), got " + std::to_string(ids.size()));
  check(inits.size() == 2, "two NVIDIA communicators made, got " + std::to_string(inits.size()));
  std::string fake_comm[2];
  for (auto& l : inits) {
    int r = std::atoi(field(l, "rank").c_str());
    if (r == 0 || r == 1) fake_comm[r] = field(l, "comm");
    check(field(l, "nranks") == "2" && !ids.empty() && field(l, "id") == field(ids[0], "id"),
          "rank " + std::to_string(r) + " joined with 2 ranks and rank 0's id");
  }
  check(!fake_comm[0].empty() && !fake_comm[1].empty() && fake_comm[0] != fake_comm[1], "one fake comm per rank");

  // On one host every call is ours, fp8 types and PreMulSum operators too: nothing reaches the fake (without
  // a GPU our core fails them).
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclSend(BUF, 7, ncclFloat8e4m3, 1, comms[0], STREAM), ncclSuccess, "ncclSend(fp8) in a group");
  expect(ncclRecv(OUT, 7, ncclFloat8e4m3, 0, comms[1], STREAM), ncclSuccess, "ncclRecv(fp8) in a group");
  check(ncclGroupEnd() != ncclSuccess, "the group's end: ours (no GPU here), not forwarded");
  for (ncclResult_t r : {ncclReduce(BUF, OUT, 3, ncclFloat8e5m2, ncclMax, 1, comms[0], STREAM),
                         ncclAlltoAll(BUF, OUT, 5, ncclFloat8e5m2, comms[0], STREAM),
                         ncclGather(BUF, OUT, 5, ncclFloat8e5m2, 1, comms[0], STREAM),
                         ncclScatter(BUF, OUT, 5, ncclFloat8e5m2, 0, comms[0], STREAM),
                         ncclAllReduce(BUF, OUT, 9, ncclFloat8e4m3, ncclSum, comms[0], STREAM)})
    check(r != ncclSuccess && r != ncclInvalidUsage, "an fp8 collective is ours (it fails in our core)");
  float scalar = 0.5f;
  ncclRedOp_t op;
  expect(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comms[0]), ncclSuccess,
         "ncclRedOpCreatePreMulSum");
  check(calls("ncclRedOpCreatePreMulSum").empty(), "no twin on the fake: our collectives carry the operator");
  check(ncclAllReduce(BUF, OUT, 4, ncclFloat, op, comms[0], STREAM) != ncclSuccess, "ncclAllReduce(PreMulSum): ours");
  expect(ncclRedOpDestroy(op, comms[0]), ncclSuccess, "ncclRedOpDestroy");
  expect(ncclSend(BUF, 7, ncclFloat8e4m3, 2, comms[0], STREAM), ncclInvalidArgument, "ncclSend(peer 2 of 2)");
  for (const char* f : {"ncclSend ", "ncclRecv ", "ncclReduce ", "ncclAlltoAll ", "ncclGather ", "ncclScatter ",
                        "ncclAllReduce ", "ncclGroupStart", "ncclRedOpDestroy"})
    check(calls(f).empty(), std::string("the fake got no ") + f);

  // On one host split, shrink and revoke are ours, and the fake gets none of them (ranks on several
  // hosts would have them forwarded); a split comm gets an NVIDIA communicator of its own, as any init.
  size_t twins = calls("ncclCommInitRank rank=").size();
  ncclComm_t subs[2] = {NULL, NULL};
  expect(ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  expect(ncclCommSplit(comms[0], 2, 1, &subs[0], NULL), ncclSuccess, "ncclCommSplit(rank 0) in a group");
  expect(ncclCommSplit(comms[1], 2, 0, &subs[1], NULL), ncclSuccess, "ncclCommSplit(rank 1) in a group");
  expect(ncclGroupEnd(), ncclSuccess, "ncclGroupEnd makes both");
  int rank = -1, count = -1;
  check(subs[0] != NULL && ncclCommUserRank(subs[0], &rank) == ncclSuccess && ncclCommCount(subs[0], &count) == ncclSuccess &&
            rank == 1 && count == 2,
        "rank 0's split comm: rank 1 of 2 (by key)");
  check(calls("ncclCommSplit").empty(), "the fake got no ncclCommSplit");
  auto twin_inits = calls("ncclCommInitRank rank=");
  check(twin_inits.size() == twins + 2, "the split comms got NVIDIA communicators beside them");
  expect(ncclCommDestroy(subs[0]), ncclSuccess, "ncclCommDestroy(split comm)");
  expect(ncclCommDestroy(subs[1]), ncclSuccess, "ncclCommDestroy(split comm)");
  ncclComm_t none = (ncclComm_t)0x1;
  expect(ncclCommSplit(comms[0], NCCL_SPLIT_NOCOLOR, 0, &none, NULL), ncclSuccess, "ncclCommSplit(NOCOLOR, rank 0)");
  check(none == NULL, "no comm for NCCL_SPLIT_NOCOLOR");
  expect(ncclCommSplit(comms[1], NCCL_SPLIT_NOCOLOR, 0, &none, NULL), ncclSuccess, "ncclCommSplit(NOCOLOR, rank 1)");
  int exclude[1] = {1};
  ncclComm_t shrunk = NULL;
  expect(ncclCommShrink(comms[0], exclude, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT), ncclSuccess, "ncclCommShrink");
  check(shrunk != NULL && ncclCommCount(shrunk, &count) == ncclSuccess && count == 1, "rank 1 left out: one rank");
  check(calls("ncclCommShrink").empty(), "the fake got no ncclCommShrink");
  expect(ncclCommAbort(shrunk), ncclSuccess, "ncclCommAbort(shrunk comm)");

  // NVIDIA's asynchronous error is ours too. The fake is reached through the loaded copy (RTLD_NOLOAD).
  ncclResult_t async = ncclInternalError;
  expect(ncclCommGetAsyncError(comms[0], &async), ncclSuccess, "ncclCommGetAsyncError");
  check(async == ncclSuccess, "no asynchronous error");
  void* fake = dlopen((dir + "/fake/libnccl.so.2").c_str(), RTLD_NOW | RTLD_NOLOAD);
  auto set_error = fake ? (void (*)(int))dlsym(fake, "fake_nccl_set_async_error") : NULL;
  check(set_error != NULL, "the fake is loaded (RTLD_NOLOAD finds it)");
  if (set_error) {
    set_error(6);
    expect(ncclCommGetAsyncError(comms[0], &async), ncclSuccess, "ncclCommGetAsyncError");
    check(async == ncclRemoteError, "NVIDIA's remote error is the comm's");
    check(std::strstr(ncclGetLastError(comms[0]), "a remote peer is gone") != NULL, "ncclGetLastError gives NVIDIA's text");
    set_error(0);
  }

  // The ends reach the fake.
  expect(ncclCommFinalize(comms[1]), ncclSuccess, "ncclCommFinalize(rank 1)");
  check(calls("ncclCommFinalize comm=" + fake_comm[1]).size() == 1, "the fake got ncclCommFinalize");
  expect(ncclSend(BUF, 1, ncclFloat8e5m2, 0, comms[1], STREAM), ncclInvalidUsage, "ncclSend(fp8) after finalize");
  expect(ncclCommDestroy(comms[1]), ncclSuccess, "ncclCommDestroy(rank 1)");
  check(calls("ncclCommDestroy comm=" + fake_comm[1]).size() == 1, "the fake got ncclCommDestroy");
  // Our revoke revokes NVIDIA's communicator beside ours too: forwarded work is the communicator's work.
  expect(ncclCommRevoke(comms[0], 0), ncclSuccess, "ncclCommRevoke(rank 0)");
  check(calls("ncclCommRevoke comm=" + fake_comm[0]).size() == 1, "the fake got ncclCommRevoke");
  expect(ncclAllReduce(BUF, OUT, 4, ncclFloat8e4m3, ncclSum, comms[0], STREAM), ncclInvalidUsage, "fp8 on a revoked comm");
  check(calls("ncclAllReduce ").empty(), "it is not forwarded");
  expect(ncclCommAbort(comms[0]), ncclSuccess, "ncclCommAbort(rank 0)");
  check(calls("ncclCommAbort comm=" + fake_comm[0]).size() == 1, "the fake got ncclCommAbort");
}

// One rank of a job on two hosts (hosts_case), with rank 0's unique id.
static void hosts_rank(int rank, const ncclUniqueId& id) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  ncclComm_t comm = NULL;
  expect(ncclCommInitRank(&comm, 2, id, rank), ncclSuccess, me + "ncclCommInitRank");
  if (!comm) return;
  logged("the ranks span 2 hosts (ranks 0; 1), 1 rail: every collective goes to it");
  auto inits = calls("ncclCommInitRank rank=");
  check(inits.size() == 1 && field(inits[0], "rank") == std::to_string(rank) && field(inits[0], "nranks") == "2",
        me + "one NVIDIA communicator, this rank of 2");
  const std::string fc = inits.empty() ? "?" : field(inits[0], "comm");

  // Sends and receives of any type, fp8 included, with the caller's arguments.
  if (rank == 0) {
    expect(ncclSend(BUF, 7, ncclFloat8e4m3, 1, comm, STREAM), ncclSuccess, me + "ncclSend forwarded");
    auto sends = calls("ncclSend ");
    check(sends.size() == 1 && field(sends[0], "buff") == "0x1000" && field(sends[0], "count") == "7" &&
              field(sends[0], "datatype") == "10" && field(sends[0], "peer") == "1" && field(sends[0], "comm") == fc &&
              field(sends[0], "stream") == "0x3000",
          me + "the fake got ncclSend's arguments and this rank's fake comm: " + (sends.empty() ? "none" : sends[0]));
    check(!sends.empty() && field(sends[0], "version") == "22901",
          me + "the fake's own call to ncclGetVersion stayed inside it (RTLD_DEEPBIND)");
  } else {
    expect(ncclRecv(OUT, 7, ncclFloat8e4m3, 0, comm, STREAM), ncclSuccess, me + "ncclRecv forwarded");
    auto recvs = calls("ncclRecv ");
    check(recvs.size() == 1 && field(recvs[0], "peer") == "0" && field(recvs[0], "comm") == fc,
          me + "the fake got ncclRecv on this rank's fake comm");
  }
  expect(ncclSend(BUF, 7, ncclFloat8e4m3, 2, comm, STREAM), ncclInvalidArgument, me + "ncclSend(peer 2 of 2): checked here");

  // Every collective, of every type and operator.
  expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclSuccess, me + "ncclAllReduce(float) forwarded");
  auto sums = calls("ncclAllReduce ");
  check(sums.size() == 1 && field(sums[0], "count") == "9" && field(sums[0], "datatype") == "7" &&
            field(sums[0], "op") == "0" && field(sums[0], "comm") == fc,
        me + "the fake got the all-reduce");
  expect(ncclReduce(BUF, OUT, 3, ncclFloat8e5m2, ncclMax, 1, comm, STREAM), ncclSuccess, me + "ncclReduce(fp8) forwarded");
  auto reduces = calls("ncclReduce ");
  check(reduces.size() == 1 && field(reduces[0], "op") == "2" && field(reduces[0], "root") == "1" &&
            field(reduces[0], "datatype") == "11" && field(reduces[0], "recv") == "0x2000",
        me + "the fake got ncclReduce's op, root, type and buffers");
  expect(ncclReduce(BUF, OUT, 3, ncclFloat8e5m2, ncclMax, 2, comm, STREAM), ncclInvalidArgument, me + "ncclReduce(root 2)");
  expect(ncclAlltoAll(BUF, OUT, 5, ncclFloat8e5m2, comm, STREAM), ncclSuccess, me + "ncclAlltoAll forwarded");
  expect(ncclGather(BUF, OUT, 5, ncclUint8, 1, comm, STREAM), ncclSuccess, me + "ncclGather forwarded");
  expect(ncclScatter(BUF, OUT, 5, ncclFloat8e4m3, 0, comm, STREAM), ncclSuccess, me + "ncclScatter forwarded");
  check(calls("ncclAlltoAll ").size() == 1 && calls("ncclGather ").size() == 1 && calls("ncclScatter ").size() == 1 &&
            calls("ncclReduce ").size() == 1,
        me + "the fake got ncclAlltoAll, ncclGather, ncclScatter, and no bad call");

  // A PreMulSum operator: its twin on the fake, which gets the twin's number.
  float scalar = 0.5f;
  ncclRedOp_t op;
  expect(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm), ncclSuccess,
         me + "ncclRedOpCreatePreMulSum");
  auto made = calls("ncclRedOpCreatePreMulSum");
  check(made.size() == 1 && field(made[0], "comm") == fc && field(made[0], "datatype") == "7", me + "its twin made on the fake comm");
  expect(ncclAllReduce(BUF, OUT, 4, ncclFloat, op, comm, STREAM), ncclSuccess, me + "ncclAllReduce(PreMulSum) forwarded");
  auto premul = calls("ncclAllReduce ");
  check(premul.size() == 2 && !made.empty() && field(premul[1], "op") == field(made[0], "op"),
        me + "the fake got its own operator (" + (made.empty() ? std::string("?") : field(made[0], "op")) + "), not ours (" +
            std::to_string((int)op) + ")");
  expect(ncclReduceScatter(BUF, OUT, 4, ncclFloat16, op, comm, STREAM), ncclInvalidArgument,
         me + "the operator on another type: refused here");
  check(calls("ncclReduceScatter ").empty(), me + "and not forwarded");
  expect(ncclRedOpDestroy(op, comm), ncclSuccess, me + "ncclRedOpDestroy");
  check(calls("ncclRedOpDestroy").size() == 1, me + "its twin destroyed");

  // A group: nothing reaches the fake before our group's end, then all of it inside one fake group.
  size_t before = calls("").size();
  expect(ncclGroupStart(), ncclSuccess, me + "ncclGroupStart");
  expect(ncclGroupStart(), ncclSuccess, me + "ncclGroupStart (nested)");
  if (rank == 0)
    expect(ncclSend(BUF, 1, ncclFloat8e5m2, 1, comm, STREAM), ncclSuccess, me + "ncclSend in a group");
  else
    expect(ncclRecv(OUT, 1, ncclFloat8e5m2, 0, comm, STREAM), ncclSuccess, me + "ncclRecv in a group");
  expect(ncclGroupEnd(), ncclSuccess, me + "inner ncclGroupEnd");
  expect(ncclAllReduce(BUF, OUT, 2, ncclBfloat16, ncclAvg, comm, STREAM), ncclSuccess, me + "ncclAllReduce in the group");
  check(calls("").size() == before, me + "nothing issued before the outermost end");
  expect(ncclGroupEnd(), ncclSuccess, me + "ncclGroupEnd");
  auto all = calls("");
  bool in_order = all.size() == before + 4 && all[before] == "ncclGroupStart" &&
                  all[before + 1].rfind(rank == 0 ? "ncclSend " : "ncclRecv ", 0) == 0 &&
                  all[before + 2].rfind("ncclAllReduce ", 0) == 0 && all[before + 3] == "ncclGroupEnd";
  check(in_order, me + "the fake got GroupStart, the send or receive, the all-reduce, GroupEnd in order");

  // A suspend across hosts: ours holds no device memory there and NVIDIA's keeps its own; work is refused,
  // and not forwarded, until the resume.
  expect(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclSuccess, me + "ncclCommSuspend across hosts");
  size_t sums_before = calls("ncclAllReduce ").size();
  expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclInvalidUsage, me + "ncclAllReduce while suspended");
  check(calls("ncclAllReduce ").size() == sums_before, me + "not forwarded while suspended");
  expect(ncclCommResume(comm), ncclSuccess, me + "ncclCommResume across hosts");
  expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclSuccess, me + "ncclAllReduce after the resume");
  check(calls("ncclAllReduce ").size() == sums_before + 1, me + "forwarded again");

  // A split is ours, over our bootstrap, with a new fake communicator of its own among its ranks; its
  // calls go there. NVIDIA's split is never asked.
  ncclComm_t sub = NULL;
  expect(ncclCommSplit(comm, 1, rank, &sub, NULL), ncclSuccess, me + "ncclCommSplit");
  auto made_sub = calls("ncclCommInitRank rank=");
  int n = -1, r = -1;
  check(calls("ncclCommSplit").empty() && made_sub.size() == 2 && field(made_sub[1], "nranks") == "2" &&
            field(made_sub[1], "rank") == std::to_string(rank) && field(made_sub[1], "id") != field(made_sub[0], "id") &&
            sub != NULL && ncclCommCount(sub, &n) == ncclSuccess && ncclCommUserRank(sub, &r) == ncclSuccess && n == 2 &&
            r == rank,
        me + "the split comm is ours, with a new fake comm from a new id (2 ranks, this rank)");
  if (sub) {
    expect(ncclAllReduce(BUF, OUT, 4, ncclFloat8e4m3, ncclSum, sub, STREAM), ncclSuccess, me + "ncclAllReduce on the split comm");
    auto on_sub = calls("ncclAllReduce ");
    check(made_sub.size() == 2 && on_sub.size() == 5 && field(on_sub[4], "comm") == field(made_sub[1], "comm"),
          me + "it went to the split comm's fake comm");
    expect(ncclCommDestroy(sub), ncclSuccess, me + "ncclCommDestroy(split comm)");
  }

  // A revoke reaches the fake, and, being our abort, aborts NVIDIA's communicator (on a thread of its own);
  // the destroy then has nothing left to end there.
  expect(ncclCommRevoke(comm, 0), ncclSuccess, me + "ncclCommRevoke");
  check(calls("ncclCommRevoke comm=" + fc).size() == 1, me + "the fake got ncclCommRevoke");
  check(eventually([&] { return calls("ncclCommAbort comm=" + fc).size() == 1; }, 5.0),
        me + "the revoke aborted the fake comm");
  expect(ncclCommDestroy(comm), ncclSuccess, me + "ncclCommDestroy");
  check(calls("ncclCommDestroy comm=" + fc).empty(), me + "the aborted fake comm is not destroyed again");
}

// Waits up to `seconds` for `cond`.
static bool eventually(const std::function<bool()>& cond, double seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (cond()) return true;
    usleep(10000);
  }
  return cond();
}

// Gives this process a host of its own: a UTS namespace with another host name (the library tells hosts
// apart by boot id and host name). False where no namespace can be made (neither root nor user namespaces).
static bool own_host(int host) {
  if (unshare(CLONE_NEWUTS) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWUTS) != 0) return false;
  const std::string name = "nccl-fallback-test-host-" + std::to_string(host);
  return sethostname(name.c_str(), name.size()) == 0;
}

// Runs `body(rank, id)` in `n` processes, each on a host of its own (own_host), or on host `hosts[rank]` where
// `hosts` is given (ranks of one host name are one host), with rank 0's unique id
// (made there, passed to the others through a pipe), the fake's calls and our log in files of the rank's own
// (printed where a check of that rank failed). A rank whose process ends otherwise than by exit status 0
// fails, unless it is `victim` or at least `victim` (`victims_above`). False after a SKIP line where no
// namespace can be made.
static bool on_own_hosts(int n, const std::function<void(int, const ncclUniqueId&)>& body, int victim = -1,
                         const std::vector<int>& hosts = {}, bool victims_above = false) {
  int fds[2];
  if (pipe(fds) != 0) {
    check(false, "pipe");
    return false;
  }
  std::vector<pid_t> pids(n);
  for (int rank = 0; rank < n; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      if (!own_host(hosts.empty() ? rank : hosts[rank])) _exit(77);
      log_path += ".rank" + std::to_string(rank);
      calls_path += ".rank" + std::to_string(rank);
      setenv("MSCCLPP_DEBUG_FILE", log_path.c_str(), 1);
      setenv("FAKE_NCCL_LOG", calls_path.c_str(), 1);
      ncclUniqueId id;
      if (rank == 0) {
        close(fds[0]);
        expect(ncclGetUniqueId(&id), ncclSuccess, "rank 0: ncclGetUniqueId");
        for (int r = 1; r < n; ++r)
          if (write(fds[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
      } else {
        close(fds[1]);
        if (read(fds[0], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
      }
      int before = counts->failed;
      body(rank, id);
      if (counts->failed != before)
        std::printf("rank %d's log:\n%s\nfake's calls:\n%s", rank, read_file(log_path).c_str(), read_file(calls_path).c_str());
      std::fflush(stdout);
      std::remove(log_path.c_str());
      std::remove(calls_path.c_str());
      _exit(0);
    }
  }
  close(fds[0]);
  close(fds[1]);
  std::vector<int> status(n, 0);
  for (int rank = 0; rank < n; ++rank) waitpid(pids[rank], &status[rank], 0);
  if (WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 77) {
    std::printf("SKIP ranks on %d hosts: no UTS namespace could be made here (neither root nor user namespaces)\n", n);
    return false;
  }
  for (int rank = 0; rank < n; ++rank)
    if (victim < 0 || (victims_above ? rank < victim : rank != victim))
      check(WIFEXITED(status[rank]) && WEXITSTATUS(status[rank]) == 0, "rank " + std::to_string(rank) + " ended normally");
  return true;
}

// Two ranks, each a process on a host of its own: every call goes to NVIDIA's communicator.
static void hosts_case() {
  on_own_hosts(2, hosts_rank);
}

// The ranks of a kill case past their first all-reduce (shared by its processes).
static int* kill_ready = nullptr;

// kill_ready mapped shared and zeroed, before a kill case forks its ranks.
static bool map_kill_ready() {
  void* at = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  check(at != MAP_FAILED, "mmap");
  if (at == MAP_FAILED) return false;
  kill_ready = static_cast<int*>(at);
  *kill_ready = 0;
  return true;
}

// A kill case's step after a rank's first all-reduce: a victim SIGKILLs itself once all `nranks` ranks are
// past theirs (a death during the initialisation fails it instead, and one before a fellow victim's first
// all-reduce fails that); a survivor waits for ncclRemoteError from ncclCommGetAsyncError and returns
// ncclGetLastError's text.
static std::string die_or_see_the_death(ncclComm_t comm, int nranks, bool victim, const std::string& me,
                                        const std::string& death) {
  __atomic_fetch_add(kill_ready, 1, __ATOMIC_SEQ_CST);
  if (victim) {
    check(eventually([nranks] { return __atomic_load_n(kill_ready, __ATOMIC_SEQ_CST) == nranks; }, 20.0),
          me + "every rank made its communicator and its first all-reduce");
    kill(getpid(), SIGKILL);
  }
  ncclResult_t async = ncclSuccess;
  check(eventually([&] { return ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclRemoteError; }, 10.0),
        me + "ncclCommGetAsyncError says ncclRemoteError after " + death);
  return ncclGetLastError(comm);
}

// Three ranks on three hosts; rank 2 SIGKILLs itself after a first all-reduce. The survivors learn of it from
// our bootstrap (ncclRemoteError naming rank 2, within 0.1 s of seeing it), our failure path aborts the fake
// communicator, the next call fails without reaching the fake, and ncclCommShrink (NCCL_SHRINK_ABORT) gives
// both a communicator of 2 ranks over our bootstrap, with a new fake communicator that gets the next
// all-reduce.
static void kill_rank(int rank, const ncclUniqueId& id) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  ncclComm_t comm = NULL;
  expect(ncclCommInitRank(&comm, 3, id, rank), ncclSuccess, me + "ncclCommInitRank (3 ranks on 3 hosts)");
  if (!comm) return;
  auto inits = calls("ncclCommInitRank rank=");
  const std::string fc = inits.empty() ? "?" : field(inits[0], "comm");
  expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclSuccess, me + "a first ncclAllReduce");
  const std::string text = die_or_see_the_death(comm, 3, rank == 2, me, "rank 2's death");
  check(text.find("rank 2") != std::string::npos, me + "ncclGetLastError names rank 2: " + text);
  check(eventually([&] { return calls("ncclCommAbort comm=" + fc).size() == 1; }, 5.0),
        me + "our failure path aborted the fake communicator");
  size_t forwarded = calls("ncclAllReduce ").size();
  expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclRemoteError,
         me + "the next ncclAllReduce gets the failure");
  check(calls("ncclAllReduce ").size() == forwarded, me + "and does not reach the aborted fake comm");
  int dead[1] = {2};
  ncclComm_t shrunk = NULL;
  expect(ncclCommShrink(comm, dead, 1, &shrunk, NULL, NCCL_SHRINK_ABORT), ncclSuccess, me + "ncclCommShrink(rank 2 out)");
  int n = -1, r = -1;
  check(shrunk != NULL && ncclCommCount(shrunk, &n) == ncclSuccess && ncclCommUserRank(shrunk, &r) == ncclSuccess &&
            n == 2 && r == rank,
        me + "the shrunk comm: this rank of 2");
  auto made = calls("ncclCommInitRank rank=");
  check(made.size() == 2 && field(made[1], "nranks") == "2" && field(made[1], "rank") == std::to_string(rank) &&
            calls("ncclCommShrink").empty(),
        me + "its fake comm made afresh among the survivors (NVIDIA's shrink not asked)");
  if (shrunk) {
    expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, shrunk, STREAM), ncclSuccess, me + "ncclAllReduce on it");
    auto sums = calls("ncclAllReduce ");
    check(made.size() == 2 && !sums.empty() && field(sums.back(), "comm") == field(made[1], "comm"),
          me + "it reached the new fake comm");
    expect(ncclCommDestroy(shrunk), ncclSuccess, me + "ncclCommDestroy(shrunk)");
  }
  expect(ncclCommDestroy(comm), ncclSuccess, me + "ncclCommDestroy(the failed comm)");
}

static void kill_case() {
  if (!map_kill_ready()) return;
  on_own_hosts(3, kill_rank, 2);
}

// Four ranks on two hosts (0 and 1 on one, 2 and 3 on the other); the second host dies whole (both its ranks
// SIGKILL themselves once the survivors are made, as a host that loses power). The survivors, on one host,
// learn of it from our bootstrap (ncclRemoteError naming a rank of the dead host), our failure path aborts
// the fake communicator, and ncclCommShrink (NCCL_SHRINK_ABORT) leaving out the dead host gives both a
// communicator of 2 ranks on one host: ours alone, whose collectives never reach the fake.
static void host_kill_rank(int rank, const ncclUniqueId& id) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  ncclComm_t comm = NULL;
  expect(ncclCommInitRank(&comm, 4, id, rank), ncclSuccess, me + "ncclCommInitRank (4 ranks on 2 hosts)");
  if (!comm) return;
  check(read_file(log_path).find("the ranks span 2 hosts (ranks 0-1; 2-3), 2 rails") != std::string::npos,
        me + "the INFO line gives the hosts' layout");
  auto inits = calls("ncclCommInitRank rank=");
  const std::string fc = inits.empty() ? "?" : field(inits[0], "comm");
  expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclSuccess, me + "a first ncclAllReduce");
  const std::string text = die_or_see_the_death(comm, 4, rank >= 2, me, "the other host's death");
  check(text.find("rank 2") != std::string::npos || text.find("rank 3") != std::string::npos,
        me + "ncclGetLastError names a rank of the dead host: " + text);
  check(eventually([&] { return calls("ncclCommAbort comm=" + fc).size() == 1; }, 5.0),
        me + "our failure path aborted the fake communicator");
  int dead[2] = {2, 3};
  ncclComm_t shrunk = NULL;
  expect(ncclCommShrink(comm, dead, 2, &shrunk, NULL, NCCL_SHRINK_ABORT), ncclSuccess,
         me + "ncclCommShrink(the dead host's ranks 2 and 3 out)");
  int n = -1, r = -1;
  check(shrunk != NULL && ncclCommCount(shrunk, &n) == ncclSuccess && ncclCommUserRank(shrunk, &r) == ncclSuccess &&
            n == 2 && r == rank,
        me + "the shrunk comm: this rank of 2");
  if (shrunk) {
    size_t forwarded = calls("ncclAllReduce ").size();
    check(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, shrunk, STREAM) != ncclSuccess,
          me + "ncclAllReduce on it is ours (one host; no GPU here)");
    check(calls("ncclAllReduce ").size() == forwarded, me + "and does not reach the fake");
    expect(ncclCommDestroy(shrunk), ncclSuccess, me + "ncclCommDestroy(shrunk)");
  }
  expect(ncclCommDestroy(comm), ncclSuccess, me + "ncclCommDestroy(the failed comm)");
}

static void host_kill_case() {
  if (!map_kill_ready()) return;
  on_own_hosts(4, host_kill_rank, 2, {0, 0, 1, 1}, true);
}

// The grow's id, handed from rank 0 to the new rank of grow_case (shared by its processes).
struct GrowBoard {
  int ready;
  ncclUniqueId id;
};
static GrowBoard* grow_board = nullptr;

// Two ranks on two hosts grow to three, the new one on a third host: the grown communicator is ours, with a
// new fake communicator of three ranks that gets its all-reduce.
static void grow_rank(int rank, const ncclUniqueId& id) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  ncclComm_t parent = NULL, grown = NULL;
  if (rank < 2) {
    expect(ncclCommInitRank(&parent, 2, id, rank), ncclSuccess, me + "ncclCommInitRank (2 ranks on 2 hosts)");
    if (!parent) return;
    ncclUniqueId gid;
    if (rank == 0) {
      expect(ncclCommGetUniqueId(parent, &gid), ncclSuccess, me + "ncclCommGetUniqueId (the grow's id)");
      grow_board->id = gid;
      __atomic_store_n(&grow_board->ready, 1, __ATOMIC_SEQ_CST);
    }
    expect(ncclCommGrow(parent, 3, rank == 0 ? &gid : NULL, -1, &grown, NULL), ncclSuccess, me + "ncclCommGrow to 3");
  } else {
    check(eventually([] { return __atomic_load_n(&grow_board->ready, __ATOMIC_SEQ_CST) == 1; }, 20.0),
          me + "the grow's id arrived");
    ncclUniqueId gid = grow_board->id;
    expect(ncclCommGrow(NULL, 3, &gid, 2, &grown, NULL), ncclSuccess, me + "ncclCommGrow (the new rank)");
  }
  int n = -1, r = -1;
  check(grown != NULL && ncclCommCount(grown, &n) == ncclSuccess && ncclCommUserRank(grown, &r) == ncclSuccess && n == 3 &&
            r == rank,
        me + "the grown comm: this rank of 3");
  auto made = calls("ncclCommInitRank rank=");
  const std::string fc = made.empty() ? "?" : field(made.back(), "comm");
  check(!made.empty() && field(made.back(), "nranks") == "3" && field(made.back(), "rank") == std::to_string(rank),
        me + "a fake comm of 3 ranks made for it");
  if (grown) {
    expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, grown, STREAM), ncclSuccess, me + "ncclAllReduce on it");
    auto sums = calls("ncclAllReduce ");
    check(!sums.empty() && field(sums.back(), "comm") == fc, me + "it reached the grown comm's fake comm");
    expect(ncclCommDestroy(grown), ncclSuccess, me + "ncclCommDestroy(grown)");
  }
  if (parent) expect(ncclCommDestroy(parent), ncclSuccess, me + "ncclCommDestroy(parent)");
}

static void grow_case() {
  grow_board =
      static_cast<GrowBoard*>(mmap(NULL, sizeof(GrowBoard), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (grow_board == MAP_FAILED) {
    check(false, "mmap");
    return;
  }
  grow_board->ready = 0;
  on_own_hosts(3, grow_rank);
}

// Two hosts and no engine to be found: the initialisation fails at once on both ranks, saying what to do.
static void no_engine_case() {
  for (const char* d : {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/lib", "/usr/local/cuda/lib64", "/usr/lib"})
    if (access((std::string(d) + "/libnccl.so.2").c_str(), F_OK) == 0) {
      std::printf("SKIP no engine between hosts: this machine has %s/libnccl.so.2\n", d);
      return;
    }
  on_own_hosts(2, [](int rank, const ncclUniqueId& id) {
    const std::string me = "rank " + std::to_string(rank) + ": ";
    ncclComm_t comm = NULL;
    expect(ncclCommInitRank(&comm, 2, id, rank), ncclInvalidUsage, me + "ncclCommInitRank across hosts, no engine");
    const std::string text = ncclGetLastError(NULL);
    check(text.find("span 2 hosts") != std::string::npos && text.find("pip install nvidia-nccl") != std::string::npos &&
              text.find("MSCCLPP_NCCL_FALLBACK") != std::string::npos,
          me + "the error says the ranks span hosts and what to install or set: " + text);
  });
}

// Two hosts, no setting, the fake in LD_LIBRARY_PATH: found there, and every call goes to it.
static void found_case() {
  on_own_hosts(2, [](int rank, const ncclUniqueId& id) {
    ncclComm_t comm = NULL;
    expect(ncclCommInitRank(&comm, 2, id, rank), ncclSuccess, "rank " + std::to_string(rank) + ": ncclCommInitRank");
    logged("NVIDIA's NCCL between hosts (in LD_LIBRARY_PATH): loaded \"" + dir + "/fake/libnccl.so.2\"");
    expect(ncclAllReduce(BUF, OUT, 9, ncclFloat, ncclSum, comm, STREAM), ncclSuccess, "ncclAllReduce");
    check(calls("ncclAllReduce ").size() == 1, "rank " + std::to_string(rank) + ": it reached the found fake");
    expect(ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  });
}

// Without RTLD_DEEPBIND the fake's call to its own ncclGetVersion reaches ours: the check above can fail.
static void control_case() {
  void* fake = dlopen((dir + "/fake/libnccl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL);
  auto send = fake ? (int (*)(const void*, size_t, int, int, void*, void*))dlsym(fake, "ncclSend") : NULL;
  check(send != NULL, "the fake loaded without RTLD_DEEPBIND");
  if (!send) return;
  send(BUF, 1, 0, 0, NULL, NULL);
  auto sends = calls("ncclSend ");
  check(sends.size() == 1 && field(sends[0], "version") == "23203",
        "without DEEPBIND the fake's ncclGetVersion call reaches ours (23203)");
}

// A fallback that cannot be had: a WARN saying why, our communicators work, the calls fail as unset.
static void unusable_case(const std::string& why) {
  ncclComm_t comms[2] = {NULL, NULL};
  two_ranks(comms);
  logged(why);
  logged("this communicator goes on without the fallback");
  expect(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comms[0], STREAM), ncclSuccess, "our collective works");
  check(ncclSend(BUF, 4, ncclFloat8e4m3, 1, comms[0], STREAM) != ncclInvalidUsage, "ncclSend(fp8): ours");
  check(calls("ncclSend").empty(), "nothing forwarded");
  expect(ncclCommDestroy(comms[0]), ncclSuccess, "ncclCommDestroy(rank 0)");
  expect(ncclCommDestroy(comms[1]), ncclSuccess, "ncclCommDestroy(rank 1)");
}

static void run(const char* name, const std::vector<std::pair<const char*, std::string>>& env,
                const std::function<void()>& body) {
  std::printf("-- %s\n", name);
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    for (auto& e : env) setenv(e.first, e.second.c_str(), 1);
    int before = counts->failed;
    body();
    if (counts->failed != before) std::printf("log:\n%s\nfake's calls:\n%s", read_file(log_path).c_str(),
                                              read_file(calls_path).c_str());
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  check(WIFEXITED(status) && WEXITSTATUS(status) == 0, std::string(name) + ": the child ended normally");
  std::remove(log_path.c_str());
  std::remove(calls_path.c_str());
}

int main() {
  if (!init_counts()) return 2;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return 2;
  exe[n] = 0;
  dir = std::string(exe).substr(0, std::string(exe).rfind('/'));
  char tmp[] = "/tmp/nccl_fallback_test.XXXXXX";
  if (!mkdtemp(tmp)) return 2;
  log_path = std::string(tmp) + "/log";
  calls_path = std::string(tmp) + "/calls";
  // No setting leaks in from the caller's environment.
  for (const char* v : {"MSCCLPP_NCCL_FALLBACK", "MSCCLPP_DEBUG", "NCCL_DEBUG", "NCCL_COMM_ID", "FAKE_NCCL_INIT_FAIL"})
    unsetenv(v);
  setenv("MSCCLPP_DEBUG_FILE", log_path.c_str(), 1);
  setenv("FAKE_NCCL_LOG", calls_path.c_str(), 1);
  std::string fake = dir + "/fake/libnccl.so.2";
  run("without MSCCLPP_NCCL_FALLBACK", {}, unset_case);
  run("MSCCLPP_NCCL_FALLBACK = the fake", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"MSCCLPP_DEBUG", "INFO"}}, fake_case);
  run("the fake, ranks on two hosts", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"MSCCLPP_DEBUG", "INFO"}}, hosts_case);
  // As torch 2.11's start-up does: NVIDIA's file dlopened by its path without RTLD_DEEPBIND before the
  // library looks for it. A private copy is loaded, and the fake's call to its own ncclGetVersion still stays
  // inside it (hosts_rank checks it).
  run("the fake loaded beforehand, ranks on two hosts", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"MSCCLPP_DEBUG", "INFO"}}, [&] {
    check(dlopen(fake.c_str(), RTLD_NOW | RTLD_LOCAL) != NULL, "the fake dlopened by its path, without RTLD_DEEPBIND");
    on_own_hosts(2, [](int rank, const ncclUniqueId& id) {
      hosts_rank(rank, id);
      logged("is already loaded in this process (without RTLD_DEEPBIND): loading a private copy");
    });
  });
  run("the fake, a rank killed on another host", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"MSCCLPP_DEBUG", "INFO"}}, kill_case);
  run("the fake, a whole host killed", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"MSCCLPP_DEBUG", "INFO"}}, host_kill_case);
  run("the fake, two hosts grown to three", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"MSCCLPP_DEBUG", "INFO"}}, grow_case);
  run("two hosts, the fake found in LD_LIBRARY_PATH", {{"LD_LIBRARY_PATH", dir + "/fake"}, {"MSCCLPP_DEBUG", "INFO"}},
      found_case);
  // Our own libnccl.so.2 first (the thin library this program loaded): the search skips it for the fake.
  run("two hosts, our libnccl.so.2 then the fake in LD_LIBRARY_PATH",
      {{"LD_LIBRARY_PATH", dir + "/../../lib/nccl:" + dir + "/fake"}, {"MSCCLPP_DEBUG", "INFO"}}, found_case);
  run("two hosts, no engine anywhere", {{"LD_LIBRARY_PATH", ""}}, no_engine_case);
  run("the fake without RTLD_DEEPBIND (control)", {}, control_case);
  run("a path that does not exist", {{"MSCCLPP_NCCL_FALLBACK", "/nonexistent/libnccl.so.2"}}, [] {
    unusable_case("MSCCLPP_NCCL_FALLBACK: cannot load \"/nonexistent/libnccl.so.2\": /nonexistent/libnccl.so.2: "
                  "cannot open shared object file: No such file or directory");
  });
  run("a library lacking ncclCommAbort", {{"MSCCLPP_NCCL_FALLBACK", dir + "/fake-incomplete/libnccl.so.2"}}, [] {
    unusable_case("is not a usable NVIDIA NCCL (2.28 or later): symbol ncclCommAbort is missing");
  });
  // Our own libnccl.so.2 named as NVIDIA's would take every forwarded call back into this library.
  run("MSCCLPP_NCCL_FALLBACK = our own libnccl.so.2", {{"MSCCLPP_NCCL_FALLBACK", dir + "/../../lib/nccl/libnccl.so.2"}}, [] {
    unusable_case("is this library's own libnccl.so.2 (or its core libmscclpp.so.0), not NVIDIA's NCCL");
  });
  run("NVIDIA's init refused", {{"MSCCLPP_NCCL_FALLBACK", fake}, {"FAKE_NCCL_INIT_FAIL", "1"}}, [] {
    unusable_case("NVIDIA's ncclCommInitRank (MSCCLPP_NCCL_FALLBACK) returned 5: fake: duplicate GPU detected");
  });
  rmdir(tmp);
  std::printf("nccl fallback test: %d passed, %d failed\n", counts->passed, counts->failed);
  return counts->failed ? 1 : 0;
}
