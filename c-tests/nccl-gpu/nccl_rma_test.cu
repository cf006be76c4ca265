// NCCL's one-sided calls on GPUs, through our nccl.h and libnccl.so.2 alone: ncclPutSignal, ncclSignal,
// ncclWaitSignal, ncclWinGetUserPtr, and the peer pointers of a window (ncclGetPeerDevicePointer,
// ncclGetLsaDevicePointer), each result checked word by word on the GPU.
//
// One process per rank, forked by the parent; rank r uses GPU r % GPUs, so every rank may share one GPU.
// Rank 0 makes the ncclUniqueId and hands it to the others through memory shared by the processes.
//
//   nccl_rma_test <all|main|kill|initall> [nranks] [--port P]
//
//   main: every rank registers two windows (ncclMemAlloc + ncclCommWindowRegister, in the same order) and
//       ncclWinGetUserPtr gives each one's buffer back; rank r puts a pattern into rank (r + 1) % n's first
//       window (ncclPutSignal; 1 KiB and 64 MiB of uint8, bfloat16, float32, float64; 1028 bytes and 1 MiB +
//       4 bytes 4 bytes off 16-byte alignment), the receiver waits for it (ncclWaitSignal) and checks it on
//       its stream, and that nothing past it was written; a put into the second window (windows are matched
//       by the order they were registered in); a put to the rank itself; ncclSignal alone, the wait shown
//       to block until the signal comes (its event not done 300 ms later, while the sender holds back); a
//       wait of opCnt 3 after three puts on one signal; a group whose wait comes before its put; the put and
//       wait captured in a CUDA graph and replayed 5 times with the data changed between replays (each
//       checked), then a wait shown to find no signal left over; ncclGetPeerDevicePointer and
//       ncclGetLsaDevicePointer of the next rank's window read by a kernel of this rank (every word checked)
//       and of this rank's own (its buffer); bad arguments refused with ncclInvalidArgument (peer out of
//       range, an offset past the peer's window, a NULL or dead window, a buffer registration as a window,
//       sigIdx / ctx / flags out of range, nDesc < 0, NULL descriptors, a bad descriptor, a bad datatype,
//       offsets past a window in the pointer queries) and nothing queued by them (a put and wait after them
//       checked); then the time of a round (every rank puts to the next and waits for the previous) of 1
//       KiB, 64 KiB, 128 KiB, 1 MiB and 1 GiB (256 MiB where the GPU lacks the memory), in microseconds
//       and GB/s; ncclCommWindowDeregister, ncclMemFree, ncclCommDestroy;
//   kill: every rank but the last waits for a signal of the last (ncclWaitSignal), which never comes: the
//       last rank is SIGKILLed; each survivor's ncclCommGetAsyncError says ncclRemoteError within seconds,
//       its stream drains (the wait kernel ends), ncclCommAbort returns;
//   initall: two ranks of one process (ncclCommInitAll, devices 0 and 1, or 0 twice with one GPU) put 1 KiB
//       and 256 KiB into each other's window and wait; each checks what it got, and its
//       ncclGetPeerDevicePointer of the other's window is the other's own address.
//
// Output: one line per case (PASS name [note] / FAIL name: reason / SKIP name: why), a SUMMARY line per group.
// Exit code 0 only if every case passed. MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline.
#include "kill_case.h"
#include "nccl_rank.h"

#include <nccl_device/host.h>

using namespace tc;

namespace {

// ------------------------------------------------------------------------------------------------
// What the processes share beside case_runner's results: the unique id, and the barriers' meeting
// (nccl_rank.h)
// ------------------------------------------------------------------------------------------------

struct Board
{
  SharedId id;
  Meeting meeting;
};

Board* gBoard = nullptr;
ncclComm_t gComm = nullptr;

// The two windows every rank registers, in this order, and a source buffer.
constexpr uint64_t kWinBytes = (64ull << 20) + (1ull << 20);
constexpr uint64_t kWin2Bytes = 1ull << 20;
char* gWin = nullptr;
char* gWin2 = nullptr;
char* gSrc = nullptr;
ncclWindow_t gWinH = nullptr;
ncclWindow_t gWin2H = nullptr;
// The timing's window, kept until the communicator is gone (the peers map it until then).
char* gTimeWin = nullptr;
ncclWindow_t gTimeWinH = nullptr;

// Device, stream, status block, the verify counters.
std::string setUpRank(Rank& R)
{
  TC_TRY(setUpDevice(R));
  TC_CUDA(cudaMalloc((void**)&R.dVerify, 2 * sizeof(unsigned long long)));
  return "";
}

uint32_t dataSeed(int from, int to, uint32_t salt) { return makeSeed(kRoleSrc, (uint32_t)from, (uint32_t)to, salt); }
uint32_t sentinelSeed(int rank, uint32_t salt) { return makeSeed(kRoleSentinel, (uint32_t)rank, 0, salt); }

// Bytes of sentinel after a put's region that must stay untouched.
constexpr uint64_t kGuard = 256;

// One put of every rank into the next rank's window `win` (base `winBase`, this rank's registration) at
// `off`: `bytes` of this rank's source at `srcOff`, signalled on (sig, ctx); each rank waits for the
// previous rank's and checks every word it got, and that the guard after it still holds the sentinel.
std::string ringPut(Rank& R, ncclWindow_t win, char* winBase, uint64_t off, uint64_t bytes, ncclDataType_t t,
                    uint64_t srcOff, int sig, int ctx, uint32_t salt, bool toSelf = false)
{
  const int to = toSelf ? R.rank : nextRank(R);
  const int from = toSelf ? R.rank : prevRank(R);
  std::string why = fillWords(R, winBase, off, bytes + kGuard, sentinelSeed(R.rank, salt), 0);
  if (why.empty()) why = fillWords(R, gSrc, srcOff, bytes, dataSeed(R.rank, to, salt), 0);
  if (why.empty()) why = syncBounded(R, "sentinel and source");
  TC_TRY(together(R, why, "the sentinels are in place"));
  const size_t count = bytes / typeSize(t);
  ncclResult_t r = ncclPutSignal(gSrc + srcOff, count, t, to, win, off, sig, ctx, 0, gComm, R.stream);
  if (r != ncclSuccess) why = fmt("ncclPutSignal returned %s: %s", resultName(r), lastError(gComm).c_str());
  ncclWaitSignalDesc_t desc = {1, from, sig, ctx};
  if (why.empty()) {
    r = ncclWaitSignal(1, &desc, gComm, R.stream);
    if (r != ncclSuccess) why = fmt("ncclWaitSignal returned %s: %s", resultName(r), lastError(gComm).c_str());
  }
  if (why.empty()) why = verifyWords(R, winBase, off, bytes, dataSeed(from, R.rank, salt), 0, "the put's data");
  if (why.empty())
    why = verifyWords(R, winBase, off + bytes, kGuard, sentinelSeed(R.rank, salt), bytes / 4, "the guard after it");
  return together(R, why, "the puts are checked");
}

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------

std::string caseWindows(Rank& R)
{
  TN_OK(ncclMemAlloc((void**)&gWin, kWinBytes));
  TN_OK(ncclMemAlloc((void**)&gWin2, kWin2Bytes));
  TC_CUDA(cudaMalloc((void**)&gSrc, kWinBytes));
  TN_OK(ncclCommWindowRegister(gComm, gWin, kWinBytes, &gWinH, NCCL_WIN_DEFAULT));
  TN_OK(ncclCommWindowRegister(gComm, gWin2, kWin2Bytes, &gWin2H, NCCL_WIN_COLL_SYMMETRIC));
  void* p = nullptr;
  TN_OK(ncclWinGetUserPtr(gComm, gWinH, &p));
  TC_EXPECT(p == gWin, "ncclWinGetUserPtr gave %p for the first window, registered at %p", p, (void*)gWin);
  TN_OK(ncclWinGetUserPtr(gComm, gWin2H, &p));
  TC_EXPECT(p == gWin2, "ncclWinGetUserPtr gave %p for the second window, registered at %p", p, (void*)gWin2);
  return together(R, "", "the windows are registered");
}

std::string casePut(Rank& R, ncclDataType_t t, uint64_t bytes, uint32_t salt)
{
  // Offsets that differ per size, inside the window, 16-byte aligned.
  const uint64_t off = bytes >= (64ull << 20) ? (512ull << 10) : 4096;
  TC_TRY(ringPut(R, gWinH, gWin, off, bytes, t, 0, 0, 0, salt));
  R.info = fmt("%s x %llu from rank %d checked", typeName(t), (unsigned long long)(bytes / typeSize(t)), prevRank(R));
  return "";
}

std::string caseUnaligned(Rank& R)
{
  // 4 bytes off 16-byte alignment on both sides: the put kernel's byte path, then the copy engine's.
  TC_TRY(ringPut(R, gWinH, gWin, 4, 1028, ncclFloat32, 4, 1, 0, 21));
  TC_TRY(ringPut(R, gWinH, gWin, (2ull << 20) + 12, (1ull << 20) + 4, ncclUint8, 12, 1, 0, 22));
  return "";
}

std::string caseSecondWindow(Rank& R)
{
  TC_TRY(ringPut(R, gWin2H, gWin2, 8192, 100000, ncclFloat32, 0, 2, 1, 31));
  return "";
}

std::string caseSelf(Rank& R)
{
  TC_TRY(ringPut(R, gWinH, gWin, 65536, 300000, ncclBfloat16, 0, 4, 2, 41, true));
  TC_TRY(ringPut(R, gWinH, gWin, 65536, 4096, ncclUint8, 0, 4, 2, 42, true));
  return "";
}

// ncclSignal alone: the receiver's wait blocks (its event is not done 300 ms later) until the sender, which
// holds back until every receiver has looked, signals (on another stream: its own is held by its wait);
// then it ends.
std::string caseSignalAlone(Rank& R)
{
  const int sig = 3, ctx = 1;
  cudaEvent_t done;
  cudaStream_t side;
  TC_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  TC_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::string why;
  ncclWaitSignalDesc_t desc = {1, prevRank(R), sig, ctx};
  ncclResult_t r = ncclWaitSignal(1, &desc, gComm, R.stream);
  if (r != ncclSuccess) why = fmt("ncclWaitSignal returned %s", resultName(r));
  if (why.empty() && cudaEventRecord(done, R.stream) != cudaSuccess) why = "cudaEventRecord failed";
  if (why.empty()) {
    usleep(300000);
    cudaError_t q = cudaEventQuery(done);
    if (q != cudaErrorNotReady) why = fmt("300 ms after the wait, before any signal, its event says %s", cudaGetErrorName(q));
  }
  // Every rank's wait was seen blocked: now signal.
  TC_TRY(together(R, why, "every wait is seen blocked"));
  r = ncclSignal(nextRank(R), sig, ctx, 0, gComm, side);
  if (r != ncclSuccess) why = fmt("ncclSignal returned %s: %s", resultName(r), lastError(gComm).c_str());
  if (why.empty()) why = syncBounded(R, "the wait after the signal");
  if (why.empty() && cudaStreamSynchronize(side) != cudaSuccess) why = "the signal's stream failed";
  cudaEventDestroy(done);
  cudaStreamDestroy(side);
  return together(R, why, "every wait ended");
}

// Three puts on one signal into three regions, one wait of opCnt 3, then all three checked.
std::string caseOpCount3(Rank& R)
{
  const uint64_t bytes = 200000, gap = 1ull << 20;
  const int sig = 2, ctx = 0;
  const uint32_t salt = 51;
  std::string why;
  for (int k = 0; k < 3 && why.empty(); ++k) {
    why = fillWords(R, gWin, k * gap, bytes, sentinelSeed(R.rank, salt + k), 0);
    if (why.empty()) why = fillWords(R, gSrc, k * gap, bytes, dataSeed(R.rank, nextRank(R), salt + k), 0);
  }
  if (why.empty()) why = syncBounded(R, "sentinels and sources");
  TC_TRY(together(R, why, "the sentinels are in place"));
  for (int k = 0; k < 3 && why.empty(); ++k) {
    ncclResult_t r = ncclPutSignal(gSrc + k * gap, bytes / 4, ncclInt32, nextRank(R), gWinH, k * gap, sig, ctx, 0,
                                   gComm, R.stream);
    if (r != ncclSuccess) why = fmt("put %d: ncclPutSignal returned %s", k, resultName(r));
  }
  ncclWaitSignalDesc_t desc = {3, prevRank(R), sig, ctx};
  if (why.empty() && ncclWaitSignal(1, &desc, gComm, R.stream) != ncclSuccess) why = "ncclWaitSignal failed";
  for (int k = 0; k < 3 && why.empty(); ++k)
    why = verifyWords(R, gWin, k * gap, bytes, dataSeed(prevRank(R), R.rank, salt + k), 0, fmt("put %d", k));
  return together(R, why, "the three puts are checked");
}

// In one group: the wait on the previous rank first, then the put to the next. The group issues its puts
// before its waits, so every rank's put goes out and every wait ends.
std::string caseGroupWaitFirst(Rank& R)
{
  const uint64_t off = 8ull << 20, bytes = 70000 * 4;
  const uint32_t salt = 61;
  std::string why = fillWords(R, gWin, off, bytes, sentinelSeed(R.rank, salt), 0);
  if (why.empty()) why = fillWords(R, gSrc, 0, bytes, dataSeed(R.rank, nextRank(R), salt), 0);
  if (why.empty()) why = syncBounded(R, "sentinel and source");
  TC_TRY(together(R, why, "the sentinels are in place"));
  ncclWaitSignalDesc_t desc = {1, prevRank(R), 5, 3};
  TN_OK(ncclGroupStart());
  ncclResult_t a = ncclWaitSignal(1, &desc, gComm, R.stream);
  ncclResult_t b = ncclPutSignal(gSrc, bytes / 4, ncclFloat32, nextRank(R), gWinH, off, 5, 3, 0, gComm, R.stream);
  ncclResult_t end = ncclGroupEnd();
  if (a != ncclSuccess || b != ncclSuccess || end != ncclSuccess)
    why = fmt("in a group: ncclWaitSignal %s, ncclPutSignal %s, ncclGroupEnd %s", resultName(a), resultName(b),
              resultName(end));
  if (why.empty()) why = verifyWords(R, gWin, off, bytes, dataSeed(prevRank(R), R.rank, salt), 0, "the group's put");
  return together(R, why, "the group's puts are checked");
}

// A put of 1 KiB (the put kernel) and one of 256 KiB (the copy engine) with their wait, captured once and
// replayed 5 times, the sources changed before each replay; every replay's data checked. Then a wait on
// the same signals must block: every replay consumed exactly its own.
std::string caseGraph(Rank& R)
{
  const uint64_t small = 1024, large = 256ull << 10, offLarge = 16ull << 20, offSmall = 20ull << 20;
  const int sigSmall = 6, sigLarge = 7;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  ncclResult_t a = ncclPutSignal(gSrc, small, ncclUint8, nextRank(R), gWinH, offSmall, sigSmall, 0, 0, gComm, R.stream);
  ncclResult_t b =
      ncclPutSignal(gSrc + small, large / 8, ncclFloat64, nextRank(R), gWinH, offLarge, sigLarge, 0, 0, gComm, R.stream);
  ncclWaitSignalDesc_t descs[2] = {{1, prevRank(R), sigSmall, 0}, {1, prevRank(R), sigLarge, 0}};
  ncclResult_t c = ncclWaitSignal(2, descs, gComm, R.stream);
  cudaError_t endRc = cudaStreamEndCapture(R.stream, &graph);
  std::string why;
  if (a != ncclSuccess || b != ncclSuccess || c != ncclSuccess)
    why = fmt("during the capture: ncclPutSignal %s and %s, ncclWaitSignal %s (%s)", resultName(a), resultName(b),
              resultName(c), lastError(gComm).c_str());
  if (why.empty() && endRc != cudaSuccess) why = fmt("cudaStreamEndCapture: %s", cudaGetErrorString(endRc));
  if (why.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) why = "cudaGraphInstantiate failed";
  TC_TRY(together(R, why, "the graph is made"));
  for (int k = 1; k <= 5 && why.empty(); ++k) {
    const uint32_t salt = 70 + k;
    why = fillWords(R, gSrc, 0, small + large, dataSeed(R.rank, nextRank(R), salt), 0);
    if (why.empty()) why = fillWords(R, gWin, offSmall, small, sentinelSeed(R.rank, salt), 0);
    if (why.empty()) why = fillWords(R, gWin, offLarge, large, sentinelSeed(R.rank, salt), 0);
    if (why.empty()) why = syncBounded(R, "sources and sentinels");
    why = together(R, why, "a replay's sources are in place");
    if (!why.empty()) break;
    if (cudaGraphLaunch(exec, R.stream) != cudaSuccess) why = fmt("replay %d: cudaGraphLaunch failed", k);
    const uint32_t seed = dataSeed(prevRank(R), R.rank, salt);
    if (why.empty()) why = verifyWords(R, gWin, offSmall, small, seed, 0, fmt("replay %d, 1 KiB", k));
    if (why.empty()) why = verifyWords(R, gWin, offLarge, large, seed, small / 4, fmt("replay %d, 256 KiB", k));
    why = together(R, why, "a replay is checked");
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  TC_TRY(why);
  // Nothing left over: a wait on the small put's signal blocks until one more signal comes (from another
  // stream: this one is held by the wait).
  cudaEvent_t done;
  cudaStream_t side;
  TC_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  TC_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  if (ncclWaitSignal(1, descs, gComm, R.stream) != ncclSuccess) why = "the last ncclWaitSignal failed";
  if (why.empty() && cudaEventRecord(done, R.stream) != cudaSuccess) why = "cudaEventRecord failed";
  if (why.empty()) {
    usleep(200000);
    if (cudaEventQuery(done) != cudaErrorNotReady) why = "after 5 replays a wait found a signal left over";
  }
  TC_TRY(together(R, why, "no signal is left over"));
  if (ncclSignal(nextRank(R), sigSmall, 0, 0, gComm, side) != ncclSuccess) why = "ncclSignal failed";
  if (why.empty()) why = syncBounded(R, "the last wait");
  if (why.empty() && cudaStreamSynchronize(side) != cudaSuccess) why = "the signal's stream failed";
  cudaEventDestroy(done);
  cudaStreamDestroy(side);
  R.info = "5 replays checked, no signal left over";
  return together(R, why, "the graph case ends");
}

// The next rank's window read by a kernel of this rank through ncclGetPeerDevicePointer (and the same
// pointer from ncclGetLsaDevicePointer); this rank's own pointer is its buffer.
std::string casePeerPointer(Rank& R)
{
  const uint64_t off = 3ull << 20, bytes = 1ull << 20;
  const uint32_t salt = 81;
  std::string why = fillWords(R, gWin, off, bytes, dataSeed(R.rank, R.rank, salt), 0);
  if (why.empty()) why = syncBounded(R, "the pattern");
  TC_TRY(together(R, why, "every window holds its pattern"));
  void* peer = nullptr;
  void* lsa = nullptr;
  void* own = nullptr;
  ncclResult_t a = ncclGetPeerDevicePointer(gWinH, off, nextRank(R), &peer);
  ncclResult_t b = ncclGetLsaDevicePointer(gWinH, off, nextRank(R), &lsa);
  ncclResult_t c = ncclGetPeerDevicePointer(gWinH, off, R.rank, &own);
  if (a != ncclSuccess || b != ncclSuccess || c != ncclSuccess)
    why = fmt("ncclGetPeerDevicePointer %s, ncclGetLsaDevicePointer %s, own %s (%s)", resultName(a), resultName(b),
              resultName(c), lastError(nullptr).c_str());
  if (why.empty() && (peer == nullptr || peer != lsa))
    why = fmt("the peer pointer %p and the LSA pointer %p differ (or are NULL)", peer, lsa);
  if (why.empty() && own != gWin + off) why = fmt("this rank's own pointer is %p, not %p", own, (void*)(gWin + off));
  if (why.empty())
    why = verifyWords(R, peer, 0, bytes, dataSeed(nextRank(R), nextRank(R), salt), 0, "the next rank's window, read here");
  R.info = "1 MiB of the next rank's window read by a kernel of this rank";
  return together(R, why, "the peer pointers are checked");
}

// Bad arguments: every call refused with ncclInvalidArgument, before anything is queued, on every rank;
// then a put and wait that work (no signal was raised by a refused call).
std::string caseBad(Rank& R)
{
  const int N = R.nranks, next = nextRank(R);
  const ncclResult_t bad = ncclInvalidArgument;
  // First, so that every rank registers it whatever fails below (windows are matched by their order): a
  // window once deregistered.
  char* spare = nullptr;
  ncclWindow_t dead = nullptr;
  TN_OK(ncclMemAlloc((void**)&spare, 4096));
  TN_OK(ncclCommWindowRegister(gComm, spare, 4096, &dead, NCCL_WIN_DEFAULT));
  TN_OK(ncclCommWindowDeregister(gComm, dead));
  TN_OK(ncclMemFree(spare));
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, N, gWinH, 0, 0, 0, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, -1, gWinH, 0, 0, 0, 0, gComm, R.stream), bad);
  std::string msg = lastError(gComm);
  TC_EXPECT(msg.find("peer") != std::string::npos, "the bad peer's refusal does not name it: '%s'", msg.c_str());
  TN_EXPECT_RC(ncclPutSignal(gSrc, 1024, ncclUint8, next, gWinH, kWinBytes - 512, 0, 0, 0, gComm, R.stream), bad);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("peerWinOffset") != std::string::npos, "the offset's refusal does not name it: '%s'", msg.c_str());
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, nullptr, 0, 0, 0, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, gWinH, 0, 8, 0, 0, gComm, R.stream), bad);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("sigIdx") != std::string::npos, "the sigIdx's refusal does not name it: '%s'", msg.c_str());
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, gWinH, 0, -1, 0, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, gWinH, 0, 0, 4, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, gWinH, 0, 0, 0, 1, gComm, R.stream), bad);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("flags") != std::string::npos, "the flags' refusal does not name them: '%s'", msg.c_str());
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, (ncclDataType_t)-1, next, gWinH, 0, 0, 0, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclPutSignal(nullptr, 16, ncclUint8, next, gWinH, 0, 0, 0, 0, gComm, R.stream), bad);
  // A buffer registration is no window; nor is a window once deregistered.
  void* handle = nullptr;
  TN_OK(ncclCommRegister(gComm, gSrc, 4096, &handle));
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, (ncclWindow_t)handle, 0, 0, 0, 0, gComm, R.stream), bad);
  TN_OK(ncclCommDeregister(gComm, handle));
  TN_EXPECT_RC(ncclPutSignal(gSrc, 16, ncclUint8, next, dead, 0, 0, 0, 0, gComm, R.stream), bad);
  void* p = nullptr;
  TN_EXPECT_RC(ncclWinGetUserPtr(gComm, dead, &p), bad);
  TN_EXPECT_RC(ncclWinGetUserPtr(gComm, nullptr, &p), bad);
  // Signals and waits.
  TN_EXPECT_RC(ncclSignal(N, 0, 0, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclSignal(next, 8, 0, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclSignal(next, 0, -1, 0, gComm, R.stream), bad);
  TN_EXPECT_RC(ncclSignal(next, 0, 0, 2, gComm, R.stream), bad);
  ncclWaitSignalDesc_t good = {1, prevRank(R), 0, 0};
  TN_EXPECT_RC(ncclWaitSignal(-1, &good, gComm, R.stream), bad);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("nDesc") != std::string::npos, "nDesc's refusal does not name it: '%s'", msg.c_str());
  TN_EXPECT_RC(ncclWaitSignal(1, nullptr, gComm, R.stream), bad);
  ncclWaitSignalDesc_t descs[2] = {good, {1, N, 0, 0}};
  TN_EXPECT_RC(ncclWaitSignal(2, descs, gComm, R.stream), bad);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("signalDescs[1].peer") != std::string::npos, "the bad descriptor is not named: '%s'", msg.c_str());
  descs[1] = {-2, 0, 0, 0};
  TN_EXPECT_RC(ncclWaitSignal(2, descs, gComm, R.stream), bad);
  descs[1] = {1, 0, 0, 9};
  TN_EXPECT_RC(ncclWaitSignal(2, descs, gComm, R.stream), bad);
  // The pointer queries.
  TN_EXPECT_RC(ncclGetPeerDevicePointer(gWinH, kWinBytes, next, &p), bad);
  TN_EXPECT_RC(ncclGetPeerDevicePointer(gWinH, 0, N, &p), bad);
  TN_EXPECT_RC(ncclGetLsaDevicePointer(gWinH, 0, -1, &p), bad);
  TN_EXPECT_RC(ncclGetPeerDevicePointer(nullptr, 0, next, &p), bad);
  TN_EXPECT_RC(ncclGetPeerDevicePointer(gWinH, 0, next, nullptr), bad);
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(async == ncclSuccess, "after the refusals ncclCommGetAsyncError gives %s", resultName(async));
  TC_TRY(together(R, "", "every refusal is made"));
  return ringPut(R, gWinH, gWin, 4096, 4096, ncclUint8, 0, 0, 0, 91);
}

// The time of a round: every rank puts `bytes` into the next rank's window and waits for the previous
// rank's put, `iters` times back to back on its stream (after a warm-up). Rank 0's time per round.
std::string timeRounds(Rank& R, ncclWindow_t win, char* src, uint64_t bytes, int iters, double* us)
{
  cudaEvent_t t0, t1;
  TC_CUDA(cudaEventCreate(&t0));
  TC_CUDA(cudaEventCreate(&t1));
  std::string why;
  ncclWaitSignalDesc_t desc = {1, prevRank(R), 0, 0};
  auto round = [&]() -> std::string {
    TN_OK(ncclPutSignal(src, bytes, ncclUint8, nextRank(R), win, 0, 0, 0, 0, gComm, R.stream));
    TN_OK(ncclWaitSignal(1, &desc, gComm, R.stream));
    return "";
  };
  for (int i = 0; i < 3 && why.empty(); ++i) why = round();
  if (why.empty()) why = syncBounded(R, "the warm-up rounds", R.hostTimeoutS * 2);
  why = together(R, why, "the warm-up is done");
  if (why.empty() && cudaEventRecord(t0, R.stream) != cudaSuccess) why = "cudaEventRecord failed";
  for (int i = 0; i < iters && why.empty(); ++i) why = round();
  if (why.empty() && cudaEventRecord(t1, R.stream) != cudaSuccess) why = "cudaEventRecord failed";
  if (why.empty()) why = syncBounded(R, "the timed rounds", R.hostTimeoutS * 4);
  float ms = 0;
  if (why.empty() && cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess) why = "cudaEventElapsedTime failed";
  *us = ms * 1000.0 / iters;
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return together(R, why, "the timed rounds are done");
}

std::string caseTiming(Rank& R)
{
  // 1 GiB where every rank's window and source (2 GiB each) fit the GPU with room to spare, else 256 MiB.
  size_t freeBytes = 0, total = 0;
  TC_CUDA(cudaMemGetInfo(&freeBytes, &total));
  const int sharers = (R.nranks + R.nGpus - 1) / R.nGpus;
  const bool gib = (double)freeBytes > (double)sharers * 2.5 * (1ull << 30);
  // Every rank must take the same size: the smallest verdict wins.
  std::string why = gib ? "" : "small";
  bool anySmall = false;
  boardBarrier(R, "the large size is agreed", why, &anySmall);
  const uint64_t large = anySmall ? (256ull << 20) : (1ull << 30);
  char* src = nullptr;
  TN_OK(ncclMemAlloc((void**)&gTimeWin, large));
  TC_CUDA(cudaMalloc((void**)&src, large));
  TN_OK(ncclCommWindowRegister(gComm, gTimeWin, large, &gTimeWinH, NCCL_WIN_DEFAULT));
  struct Size
  {
    uint64_t bytes;
    int iters;
  } sizes[] = {{1024, 1000}, {64ull << 10, 500}, {128ull << 10, 500}, {1ull << 20, 200}, {large, 10}};
  std::string info;
  for (const Size& s : sizes) {
    double us = 0;
    why = timeRounds(R, gTimeWinH, src, s.bytes, s.iters, &us);
    if (!why.empty()) break;
    info += fmt(" %s %.1f us %.2f GB/s;", sizeName(s.bytes).c_str(), us, (double)s.bytes / (us * 1e3));
  }
  if (why.empty() && anySmall) info += " (256 MiB: the GPU lacks the memory for 1 GiB per rank)";
  R.info = fmt("round (every rank puts to the next, waits for the previous), %d ranks on %d GPU(s):%s", R.nranks,
               std::min(R.nranks, R.nGpus), info.c_str());
  cudaFree(src);
  return together(R, why, "the timing ends");
}

// The windows go, then the communicator (which closes the peers' mappings of them), then their memory.
std::string caseEnd(Rank& R)
{
  if (gTimeWinH) TN_OK(ncclCommWindowDeregister(gComm, gTimeWinH));
  TN_OK(ncclCommWindowDeregister(gComm, gWin2H));
  TN_OK(ncclCommWindowDeregister(gComm, gWinH));
  TC_TRY(together(R, "", "the windows are deregistered"));
  ncclComm_t c = gComm;
  gComm = nullptr;
  TN_OK(ncclCommDestroy(c));
  TC_TRY(together(R, "", "every communicator is destroyed"));
  TN_OK(ncclMemFree(gTimeWin));
  TN_OK(ncclMemFree(gWin2));
  TN_OK(ncclMemFree(gWin));
  TC_CUDA(cudaFree(gSrc));
  return "";
}

int mainRank(Rank& R)
{
  std::string why = setUpRank(R);
  ncclUniqueId id;
  if (why.empty()) why = shareUniqueId(R, gBoard->id, &id);
  if (why.empty()) {
    ncclResult_t r = ncclCommInitRank(&gComm, R.nranks, id, R.rank);
    if (r != ncclSuccess) why = fmt("ncclCommInitRank returned %s", resultName(r));
  }
  if (!setUpPassed(R, why)) return 1;
  if (!runCase(R, "window_register_get_user_ptr", [&] { return caseWindows(R); })) return 1;
  uint32_t salt = 1;
  for (uint64_t bytes : {1024ull, 64ull << 20})
    for (ncclDataType_t t : {ncclUint8, ncclBfloat16, ncclFloat32, ncclFloat64}) {
      const uint32_t s = salt++;
      runCase(R, fmt("put_signal_wait_%s_%s", typeName(t), sizeName(bytes).c_str()), [&] { return casePut(R, t, bytes, s); });
    }
  runCase(R, "put_signal_4_bytes_off_alignment_kernel_and_copy_engine", [&] { return caseUnaligned(R); });
  runCase(R, "put_signal_into_the_second_window", [&] { return caseSecondWindow(R); });
  runCase(R, "put_signal_to_self", [&] { return caseSelf(R); });
  runCase(R, "signal_alone_wait_blocks_until_signalled", [&] { return caseSignalAlone(R); });
  runCase(R, "wait_opcnt_3_after_three_puts", [&] { return caseOpCount3(R); });
  runCase(R, "group_wait_before_put", [&] { return caseGroupWaitFirst(R); });
  runCase(R, "graph_put_wait_replayed_5_times", [&] { return caseGraph(R); });
  runCase(R, "peer_device_pointer_read_by_a_kernel", [&] { return casePeerPointer(R); });
  runCase(R, "bad_arguments_refused", [&] { return caseBad(R); });
  runCase(R, "put_signal_wait_round_times", [&] { return caseTiming(R); });
  runCase(R, "deregister_free_destroy", [&] { return caseEnd(R); });
  freeRank(R);
  return 0;
}

// ------------------------------------------------------------------------------------------------
// initall: two ranks of one process (ncclCommInitAll), which reach each other's windows at their own
// addresses
// ------------------------------------------------------------------------------------------------

// A view of rank `r` of one process on `device`: its stream, status block and verify counters.
std::string viewOn(Rank& R, int device, Rank* V)
{
  V->rank = R.rank;
  V->nranks = R.nranks;
  V->nGpus = R.nGpus;
  V->device = device;
  V->hostTimeoutS = R.hostTimeoutS;
  TC_CUDA(cudaSetDevice(device));
  TC_CUDA(cudaStreamCreateWithFlags(&V->stream, cudaStreamNonBlocking));
  TC_CUDA(cudaHostAlloc((void**)&V->status, sizeof(DevStatus), cudaHostAllocMapped));
  memset((void*)V->status, 0, sizeof(DevStatus));
  TC_CUDA(cudaMalloc((void**)&V->dVerify, 2 * sizeof(unsigned long long)));
  return "";
}

// Each rank puts 1 KiB (the put kernel) and 256 KiB (the copy engine) into the other's window and waits for
// the other's; each checks what it got, and the other's window pointer is the other's own buffer.
std::string caseInitAllRma(Rank& R)
{
  const int devs[2] = {0, R.nGpus > 1 ? 1 : 0};
  const uint64_t winBytes = 1ull << 20, small = 1024, large = 256ull << 10, offSmall = 4096, offLarge = 65536;
  ncclComm_t comms[2] = {nullptr, nullptr};
  TN_OK(ncclCommInitAll(comms, 2, devs));
  Rank V[2];
  char* win[2] = {nullptr, nullptr};
  char* src[2] = {nullptr, nullptr};
  ncclWindow_t h[2] = {nullptr, nullptr};
  std::string why;
  for (int r = 0; r < 2 && why.empty(); ++r) {
    why = viewOn(R, devs[r], &V[r]);
    if (why.empty() && ncclMemAlloc((void**)&win[r], winBytes) != ncclSuccess) why = "ncclMemAlloc failed";
    if (why.empty() && cudaMalloc((void**)&src[r], winBytes) != cudaSuccess) why = "cudaMalloc failed";
    if (why.empty() && ncclCommWindowRegister(comms[r], win[r], winBytes, &h[r], NCCL_WIN_DEFAULT) != ncclSuccess)
      why = fmt("rank %d: ncclCommWindowRegister failed: %s", r, lastError(comms[r]).c_str());
    if (why.empty()) why = fillWords(V[r], src[r], 0, small + large, dataSeed(r, 1 - r, 101), 0);
    if (why.empty()) why = fillWords(V[r], win[r], 0, winBytes, sentinelSeed(r, 101), 0);
    if (why.empty()) why = syncBounded(V[r], "source and sentinel");
  }
  for (int r = 0; r < 2 && why.empty(); ++r) {
    ncclResult_t a = ncclPutSignal(src[r], small, ncclUint8, 1 - r, h[r], offSmall, 0, 0, 0, comms[r], V[r].stream);
    ncclResult_t b =
        ncclPutSignal(src[r] + small, large / 4, ncclFloat32, 1 - r, h[r], offLarge, 1, 0, 0, comms[r], V[r].stream);
    if (a != ncclSuccess || b != ncclSuccess)
      why = fmt("rank %d: ncclPutSignal %s, %s: %s", r, resultName(a), resultName(b), lastError(comms[r]).c_str());
  }
  for (int r = 0; r < 2 && why.empty(); ++r) {
    ncclWaitSignalDesc_t descs[2] = {{1, 1 - r, 0, 0}, {1, 1 - r, 1, 0}};
    if (ncclWaitSignal(2, descs, comms[r], V[r].stream) != ncclSuccess) why = fmt("rank %d: ncclWaitSignal failed", r);
  }
  for (int r = 0; r < 2 && why.empty(); ++r) {
    TC_CUDA(cudaSetDevice(devs[r]));
    const uint32_t seed = dataSeed(1 - r, r, 101);
    why = verifyWords(V[r], win[r], offSmall, small, seed, 0, fmt("rank %d, 1 KiB", r));
    if (why.empty()) why = verifyWords(V[r], win[r], offLarge, large, seed, small / 4, fmt("rank %d, 256 KiB", r));
    void* p = nullptr;
    if (why.empty() && ncclGetPeerDevicePointer(h[r], offLarge, 1 - r, &p) != ncclSuccess)
      why = fmt("rank %d: ncclGetPeerDevicePointer failed: %s", r, lastError(nullptr).c_str());
    if (why.empty() && p != win[1 - r] + offLarge)
      why = fmt("rank %d: the other rank's pointer is %p, not its own address %p", r, p, (void*)(win[1 - r] + offLarge));
  }
  for (int r = 0; r < 2; ++r)
    if (h[r]) ncclCommWindowDeregister(comms[r], h[r]);
  for (int r = 0; r < 2; ++r)
    if (comms[r] && ncclCommDestroy(comms[r]) != ncclSuccess && why.empty()) why = "ncclCommDestroy failed";
  for (int r = 0; r < 2; ++r) {
    if (win[r]) ncclMemFree(win[r]);
    if (src[r]) cudaFree(src[r]);
    freeRank(V[r]);
  }
  R.info = fmt("ranks on devices %d and %d", devs[0], devs[1]);
  return why;
}

int initAllRank(Rank& R)
{
  if (!setUpPassed(R, setUpRank(R), "initall_setup")) return 1;
  runCase(R, "initall_two_ranks_of_one_process_put_wait_peer_pointer", [&] { return caseInitAllRma(R); });
  freeRank(R);
  return 0;
}

// ------------------------------------------------------------------------------------------------
// kill: the signal never comes; the waiters' streams must drain
// ------------------------------------------------------------------------------------------------

struct KillResult : KillOutcome
{
  int abortRc;
  double abortS;
  int blockedBeforeKill;
  char lastError[240];
};

int killRank(Rank& R, KillShared<KillResult>* S)
{
  KillResult& out = S->res[R.rank];
  auto fail = [&](const std::string& why) { return killFail(out, R.rank, why); };
  std::string why = setUpRank(R);
  ncclUniqueId id;
  if (why.empty()) why = shareUniqueId(R, gBoard->id, &id);
  if (!why.empty()) return fail(why);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, R.nranks, id, R.rank);
  if (r != ncclSuccess) return fail(fmt("ncclCommInitRank returned %s", resultName(r)));
  gComm = comm;
  // A checked round first: the one-sided calls work on this communicator.
  char* win = nullptr;
  ncclWindow_t h = nullptr;
  if (ncclMemAlloc((void**)&win, 1 << 20) != ncclSuccess || cudaMalloc((void**)&gSrc, 1 << 20) != cudaSuccess ||
      ncclCommWindowRegister(comm, win, 1 << 20, &h, NCCL_WIN_DEFAULT) != ncclSuccess)
    return fail("registering the window failed");
  why = ringPut(R, h, win, 0, 65536, ncclUint8, 0, 0, 0, 7);
  if (!why.empty()) return fail("the first round: " + why);
  const int victim = R.nranks - 1;
  if (R.rank == victim) {
    S->ready[R.rank] = 1;
    for (;;) pause(); // until killed
  }
  ncclWaitSignalDesc_t desc = {1, victim, 1, 0};
  cudaEvent_t done;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) return fail("cudaEventCreate failed");
  r = ncclWaitSignal(1, &desc, comm, R.stream);
  if (r != ncclSuccess) return fail(fmt("ncclWaitSignal returned %s", resultName(r)));
  cudaEventRecord(done, R.stream);
  usleep(100000);
  out.blockedBeforeKill = cudaEventQuery(done) == cudaErrorNotReady;
  S->ready[R.rank] = 1;
  const std::function<ncclResult_t()> error = asyncErrorOf(comm);
  out.asyncError = (int)trailingError(ncclSuccess, error, 60);
  out.tDetect = nowSec();
  copyText(out.lastError, sizeof(out.lastError), lastError(comm));
  drainOrExit(out, R.rank, R.device, R.stream, "the wait kernel hangs on the dead rank");
  out.abortRc = (int)boundedOrExit<ncclResult_t>(out, R.rank, R.device, 20, [comm] { return ncclCommAbort(comm); },
                                                 "ncclCommAbort did not return within 20 s", &out.abortS);
  cudaEventDestroy(done);
  out.finished = 1;
  return 0;
}

int runKill(const Options& opt)
{
  const KillPlan k = {"kill_the_signaller_during_a_wait", opt.nranks, 180, 120, 500000, "wait", true};
  const double t0 = nowSec();
  const int nranks = opt.nranks, victim = nranks - 1;
  memset((void*)gBoard, 0, sizeof(Board));
  KillShared<KillResult>* S = nullptr;
  KillJudge<KillResult> judge;
  judge.rank = [&](int r) { // forked once runKillCase has mapped S
    Rank R = killCaseRank(r, nranks);
    return killRank(R, S);
  };
  judge.check = [&](int, const KillResult& o, double tKill) -> std::string {
    if (!o.blockedBeforeKill) return "the wait ended before the kill, with no signal sent";
    std::string why = sawRemoteError(o.asyncError, o.tDetect - tKill, o.lastError, victim);
    if (why.empty()) why = detectedAndDrained(o, tKill);
    if (why.empty() && o.abortRc != ncclSuccess)
      why = fmt("ncclCommAbort returned %s", resultName((ncclResult_t)o.abortRc));
    return why;
  };
  judge.info = [&](int r, const KillResult& o, double tKill) {
    return fmt(" rank%d: ncclRemoteError %.3f s after the kill, stream drained in %.3f s, abort %.2f s;", r,
               o.tDetect - tKill, o.syncS, o.abortS);
  };
  std::string info;
  const int failed = runKillCase(k, &S, judge, &info);
  return endKillCase(k, S, failed, info, "", fmt("rma_kill (%d ranks, %.1f s)", nranks, nowSec() - t0));
}

} // namespace

int main(int argc, char** argv)
{
  const char* which = "all";
  int argi = 1;
  if (argc > 1 && argv[1][0] != '-' && !isdigit((unsigned char)argv[1][0])) which = argv[argi++];
  Options opt = parseArgs(argc - argi + 1, argv + argi - 1, 2);
  const bool all = !strcmp(which, "all");
  if (!all && strcmp(which, "main") && strcmp(which, "kill") && strcmp(which, "initall")) {
    fprintf(stderr, "usage: %s <all|main|kill|initall> [nranks] [--port P]\n", argv[0]);
    return 2;
  }
  gBoard = mapBoard<Board>("nccl_rma_test");
  if (!gBoard) return 1;
  gMeetingRules.pollUs = 50; // as this program's barrier always has
  if (skipWithoutGpu(fmt("nccl_rma_test %s", which))) return 0;
  int rc = 0;
  if (all || !strcmp(which, "main")) {
    memset((void*)gBoard, 0, sizeof(Board));
    rc |= runRanks("nccl_rma", opt, 900, mainRank);
  }
  if (all || !strcmp(which, "kill")) rc |= runKill(opt);
  if (all || !strcmp(which, "initall")) {
    memset((void*)gBoard, 0, sizeof(Board));
    Options one = opt;
    one.nranks = 1; // one process holds both ranks
    rc |= runRanks("nccl_rma_initall", one, 120, initAllRank);
  }
  return rc;
}
