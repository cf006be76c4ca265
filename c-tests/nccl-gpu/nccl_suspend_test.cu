// ncclCommSuspend / ncclCommResume / ncclCommMemStats on GPUs, through our nccl.h and libnccl.so.2 alone.
//
// One process per rank, forked by the parent; rank r uses GPU r % GPUs, so every rank may share one GPU.
// Rank 0 makes the ncclUniqueId and hands it to the others through memory the processes share (the board),
// which also carries the barriers and what the ranks measured.
//
//   nccl_suspend_test [nranks] [--port P]
//
// Cases, in order, on one communicator:
//   init; collectives_before_suspend: all-reduce (1000 and 2^20 + 3 float32), all-gather (2^18 + 1 int32 per
//   rank), a send/recv ring (2^20 + 7 uint32), each checked element by element; a 64 MiB all-reduce on buffers
//   of ncclMemAlloc registered with ncclCommRegister (zero-copy, on one GPU and across GPUs), which stay
//   registered through the suspends (the peers' mappings of them are kept);
//   memstats_before: Total > 0, Suspended 0, Suspend at least the scratch's two 64 MiB slots, Total = Suspend
//   + Persist, bad stat / NULL value refused; bad_flags_and_resume_without_suspend: ncclInvalidArgument,
//   ncclInvalidUsage; suspend_frees_memory: every rank suspends (NCCL_SUSPEND_MEM); once all have,
//   cudaMemGetInfo's free memory of each GPU has grown by at least the Suspend bytes of its ranks;
//   memstats_while_suspended: Suspended 1, Suspend 0, Total = Persist; refused_while_suspended: all-reduce,
//   all-gather, send, a group, registration and a second suspend are refused (ncclInvalidUsage, the last
//   error naming ncclCommResume), the stream stays idle and the outputs untouched; deregistration works;
//   resume_takes_memory_back: every rank resumes; free memory back down by the same bytes, the statistics as
//   before; collectives_after_resume: the collectives above (the registered all-reduce too) and an all-reduce
//   captured in a CUDA graph after the resume, replayed 3 times; second_suspend_resume and
//   flags_0_suspends_without_releasing: again, with NCCL_SUSPEND_MEM and with 0, the collectives checked after
//   each; timing: 5 suspend/resume cycles, the median microseconds of each call (and of the first all-reduce
//   after a resume, against a later one) on the PASS line; destroy.
//
// Output: PASS name [note] / FAIL name: reason per case, a SUMMARY line. Exit code 0 only if every case passed.
// MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline; each rank also has an alarm.
#include "nccl_rank.h"

using namespace tc;

namespace {

constexpr int kCycles = 5;

// What the processes share beside case_runner's results: the unique id, the barriers' meeting
// (nccl_rank.h), and what the ranks measured.
struct Board
{
  SharedId id;
  Meeting meeting;
  int device[kMaxRanks];
  unsigned long long suspendBytes[kMaxRanks]; // ncclStatGpuMemSuspend before the first suspend
  double suspendUs[kMaxRanks][kCycles];
  double resumeUs[kMaxRanks][kCycles];
  double firstCallUs[kMaxRanks][kCycles];
  double laterCallUs[kMaxRanks][kCycles];
};

Board* gBoard = nullptr;
ncclComm_t gComm = nullptr;

// Buffers of the checks, allocated once (so that the free memory measured moves only by the library's).
float *gSendF = nullptr, *gRecvF = nullptr;
int32_t *gSendI = nullptr, *gRecvI = nullptr;
uint32_t *gSendU = nullptr, *gRecvU = nullptr;
float *gRegA = nullptr, *gRegB = nullptr; // ncclMemAlloc, registered
void *gHandleA = nullptr, *gHandleB = nullptr;

constexpr uint64_t kLargeF = (1u << 20) + 3;
constexpr uint64_t kGatherI = (1u << 18) + 1;
constexpr uint64_t kRingU = (1u << 20) + 7;
// 64 MiB: the size from which an all-reduce on registered buffers goes zero-copy among more than two GPUs (16
// MiB on one GPU; two GPUs' go as sends and receives from there).
constexpr uint64_t kRegF = (64u << 20) / 4;

// Device, stream, status block (nccl_rank.h), the checks' buffers.
std::string setUp(Rank& R)
{
  TC_TRY(setUpDevice(R));
  gBoard->device[R.rank] = R.device;
  TC_CUDA(cudaMalloc((void**)&gSendF, kLargeF * 4));
  TC_CUDA(cudaMalloc((void**)&gRecvF, kLargeF * 4));
  TC_CUDA(cudaMalloc((void**)&gSendI, kGatherI * 4));
  TC_CUDA(cudaMalloc((void**)&gRecvI, kGatherI * 4 * R.nranks));
  TC_CUDA(cudaMalloc((void**)&gSendU, kRingU * 4));
  TC_CUDA(cudaMalloc((void**)&gRecvU, kRingU * 4));
  return "";
}

// ---- the collectives checked ----

// All-reduce (sum) of rank r's x[i] = (r + 1) * (i % 97 + 1): ((i % 97) + 1) * n (n + 1) / 2, exact in float.
// Inputs are written on the rank's stream, before the call: the stream is non-blocking, so it is not ordered
// after the legacy default stream, and a plain copy from pageable memory may return before its data lands.
std::string allReduce(Rank& R, uint64_t count, float* send, float* recv, const char* what)
{
  std::vector<float> h(count);
  for (uint64_t i = 0; i < count; ++i) h[i] = (float)((R.rank + 1) * (int)(i % 97 + 1));
  TC_CUDA(cudaMemcpyAsync(send, h.data(), count * 4, cudaMemcpyHostToDevice, R.stream));
  TC_CUDA(cudaMemsetAsync(recv, 0xff, count * 4, R.stream));
  TN_OK(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, gComm, R.stream));
  TC_TRY(syncBounded(R, what));
  TC_CUDA(cudaMemcpy(h.data(), recv, count * 4, cudaMemcpyDeviceToHost));
  const float ranks = (float)(R.nranks * (R.nranks + 1) / 2);
  for (uint64_t i = 0; i < count; ++i) {
    const float want = (float)(i % 97 + 1) * ranks;
    if (h[i] != want) return fmt("%s: element %llu of %llu is %g, expected %g", what, (unsigned long long)i,
                                 (unsigned long long)count, h[i], want);
  }
  return "";
}

std::string allGather(Rank& R, const char* what)
{
  std::vector<int32_t> h(kGatherI * R.nranks);
  for (uint64_t i = 0; i < kGatherI; ++i) h[i] = (int32_t)(R.rank * 1000003 + i);
  TC_CUDA(cudaMemcpyAsync(gSendI, h.data(), kGatherI * 4, cudaMemcpyHostToDevice, R.stream));
  TC_CUDA(cudaMemsetAsync(gRecvI, 0xff, kGatherI * 4 * R.nranks, R.stream));
  TN_OK(ncclAllGather(gSendI, gRecvI, kGatherI, ncclInt32, gComm, R.stream));
  TC_TRY(syncBounded(R, what));
  TC_CUDA(cudaMemcpy(h.data(), gRecvI, kGatherI * 4 * R.nranks, cudaMemcpyDeviceToHost));
  for (int r = 0; r < R.nranks; ++r)
    for (uint64_t i = 0; i < kGatherI; ++i) {
      const int32_t want = (int32_t)(r * 1000003 + i);
      if (h[r * kGatherI + i] != want)
        return fmt("%s: rank %d's element %llu is %d, expected %d", what, r, (unsigned long long)i,
                   h[r * kGatherI + i], want);
    }
  return "";
}

uint32_t ringWord(int from, uint64_t i, uint32_t salt)
{
  return (uint32_t)mix64(((uint64_t)from << 40) ^ i ^ ((uint64_t)salt << 48)) | 1u;
}

// Each rank sends to the next and receives from the previous, in one group.
std::string ring(Rank& R, uint32_t salt, const char* what)
{
  const int next = (R.rank + 1) % R.nranks, prev = (R.rank + R.nranks - 1) % R.nranks;
  std::vector<uint32_t> h(kRingU);
  for (uint64_t i = 0; i < kRingU; ++i) h[i] = ringWord(R.rank, i, salt);
  TC_CUDA(cudaMemcpyAsync(gSendU, h.data(), kRingU * 4, cudaMemcpyHostToDevice, R.stream));
  TC_CUDA(cudaMemsetAsync(gRecvU, 0, kRingU * 4, R.stream));
  TN_OK(ncclGroupStart());
  TN_OK(ncclSend(gSendU, kRingU, ncclUint32, next, gComm, R.stream));
  TN_OK(ncclRecv(gRecvU, kRingU, ncclUint32, prev, gComm, R.stream));
  TN_OK(ncclGroupEnd());
  TC_TRY(syncBounded(R, what));
  TC_CUDA(cudaMemcpy(h.data(), gRecvU, kRingU * 4, cudaMemcpyDeviceToHost));
  for (uint64_t i = 0; i < kRingU; ++i)
    if (h[i] != ringWord(prev, i, salt))
      return fmt("%s: word %llu from rank %d is %#x, expected %#x", what, (unsigned long long)i, prev, h[i],
                 ringWord(prev, i, salt));
  return "";
}

// Every collective of the checks, each on every rank.
std::string collectives(Rank& R, uint32_t salt, const char* when)
{
  TC_TRY(allReduce(R, 1000, gSendF, gRecvF, fmt("all-reduce of 1000 float32 %s", when).c_str()));
  TC_TRY(allReduce(R, kLargeF, gSendF, gRecvF, fmt("all-reduce of 2^20 + 3 float32 %s", when).c_str()));
  TC_TRY(allGather(R, fmt("all-gather %s", when).c_str()));
  TC_TRY(ring(R, salt, fmt("send/recv ring %s", when).c_str()));
  return allReduce(R, kRegF, gRegA, gRegB, fmt("all-reduce of 64 MiB on registered buffers %s", when).c_str());
}

// ---- memory ----

// The bytes ncclStatGpuMemSuspend said the ranks on this rank's GPU hold.
uint64_t bytesOnMyGpu(Rank& R)
{
  uint64_t sum = 0;
  for (int r = 0; r < R.nranks; ++r)
    if (gBoard->device[r] == R.device) sum += gBoard->suspendBytes[r];
  return sum;
}

size_t freeMemory()
{
  size_t f = 0, t = 0;
  return cudaMemGetInfo(&f, &t) == cudaSuccess ? f : 0;
}

// Slack of the memory checks: what the CUDA runtime may take or give back meanwhile, besides the library.
constexpr int64_t kSlack = 4ll << 20;

double usSince(double t0) { return (nowSec() - t0) * 1e6; }

// ---- cases ----

std::string caseInit(Rank& R)
{
  ncclUniqueId id;
  TC_TRY(shareUniqueId(R, gBoard->id, &id));
  ncclResult_t r = ncclCommInitRank(&gComm, R.nranks, id, R.rank);
  if (r != ncclSuccess || !gComm) {
    R.fatal = true;
    return fmt("ncclCommInitRank returned %s: %s", resultName(r), lastError().c_str());
  }
  TN_OK(ncclMemAlloc((void**)&gRegA, kRegF * 4));
  TN_OK(ncclMemAlloc((void**)&gRegB, kRegF * 4));
  TN_OK(ncclCommRegister(gComm, gRegA, kRegF * 4, &gHandleA));
  TN_OK(ncclCommRegister(gComm, gRegB, kRegF * 4, &gHandleB));
  R.info = fmt("%d ranks on %d GPUs", R.nranks, R.nGpus);
  return "";
}

std::string caseMemStatsBefore(Rank& R)
{
  uint64_t v[4];
  TC_TRY(memStats(gComm, v));
  // The scratch's two slots of MSCCLPP_COLL_SCRATCH_MB (64 by default) at least.
  const char* mb = getenv("MSCCLPP_COLL_SCRATCH_MB");
  const uint64_t slots = 2ull * ((mb && atoi(mb) > 0 ? (uint64_t)atoi(mb) : 64ull) << 20);
  TC_EXPECT(v[3] > 0 && v[1] == 0 && v[0] >= slots,
            "before any suspend: Suspend %llu (at least %llu expected), Suspended %llu (0), Total %llu (> 0)",
            (unsigned long long)v[0], (unsigned long long)slots, (unsigned long long)v[1], (unsigned long long)v[3]);
  gBoard->suspendBytes[R.rank] = v[0];
  uint64_t x = 0;
  TN_EXPECT_RC(ncclCommMemStats(gComm, (ncclCommMemStat_t)4, &x), ncclInvalidArgument);
  TN_EXPECT_RC(ncclCommMemStats(gComm, (ncclCommMemStat_t)-1, &x), ncclInvalidArgument);
  TN_EXPECT_RC(ncclCommMemStats(gComm, ncclStatGpuMemTotal, nullptr), ncclInvalidArgument);
  R.info = fmt("Suspend %llu bytes, Persist %llu, Total %llu", (unsigned long long)v[0], (unsigned long long)v[2],
               (unsigned long long)v[3]);
  return "";
}

std::string caseBadCalls(Rank& R)
{
  (void)R;
  TN_EXPECT_RC(ncclCommSuspend(gComm, 0x2), ncclInvalidArgument);
  TN_EXPECT_RC(ncclCommSuspend(gComm, 0x3), ncclInvalidArgument);
  TN_EXPECT_RC(ncclCommResume(gComm), ncclInvalidUsage);
  TN_EXPECT_RC(ncclCommSuspend(nullptr, NCCL_SUSPEND_MEM), ncclInvalidArgument);
  TN_EXPECT_RC(ncclCommResume(nullptr), ncclInvalidArgument);
  // Nothing was suspended by the refusals.
  uint64_t suspended = 7;
  TN_OK(ncclCommMemStats(gComm, ncclStatGpuMemSuspended, &suspended));
  TC_EXPECT(suspended == 0, "Suspended is %llu after refused calls", (unsigned long long)suspended);
  return "";
}

// Every rank suspends; once all have, this GPU's free memory has grown by the Suspend bytes of its ranks.
std::string caseSuspendFrees(Rank& R, double* us)
{
  TC_CUDA(cudaDeviceSynchronize());
  TC_TRY(together(R, "", "measuring the free memory before the suspends"));
  const int64_t before = (int64_t)freeMemory();
  TC_TRY(together(R, "", "before the suspends"));
  const double t0 = nowSec();
  ncclResult_t r = ncclCommSuspend(gComm, NCCL_SUSPEND_MEM);
  *us = usSince(t0);
  std::string why = r == ncclSuccess ? "" : fmt("ncclCommSuspend returned %s: %s", resultName(r), lastError().c_str());
  TC_TRY(together(R, why, "after the suspends"));
  const int64_t want = (int64_t)bytesOnMyGpu(R);
  int64_t after = (int64_t)freeMemory();
  // The driver frees a peer's memory once its last mapping closes: give it a moment.
  for (double end = nowSec() + 2; after - before + kSlack < want && nowSec() < end; after = (int64_t)freeMemory())
    usleep(10000);
  TC_EXPECT(after - before + kSlack >= want,
            "free memory of GPU %d grew by %lld bytes once every rank suspended; its ranks' Suspend bytes are %lld",
            R.device, (long long)(after - before), (long long)want);
  R.info = fmt("GPU %d: %lld MiB more free (its ranks' Suspend: %lld MiB)", R.device,
               (long long)((after - before) >> 20),
               (long long)(want >> 20));
  return "";
}

std::string caseStatsWhileSuspended(Rank& R)
{
  (void)R;
  uint64_t v[4];
  TC_TRY(memStats(gComm, v));
  TC_EXPECT(v[1] == 1 && v[0] == 0 && v[3] == v[2],
            "while suspended: Suspended %llu (1 expected), Suspend %llu (0), Persist %llu, Total %llu (= Persist)",
            (unsigned long long)v[1], (unsigned long long)v[0], (unsigned long long)v[2], (unsigned long long)v[3]);
  return "";
}

std::string expectRefused(Rank& R, ncclResult_t r, const char* what)
{
  (void)R;
  if (r != ncclInvalidUsage)
    return fmt("%s while suspended returned %s, expected ncclInvalidUsage", what, resultName(r));
  const std::string e = lastError();
  if (e.find("ncclCommResume") == std::string::npos)
    return fmt("%s while suspended: the last error does not name ncclCommResume: %s", what, e.c_str());
  return "";
}

std::string caseRefused(Rank& R)
{
  std::vector<float> marker(1000, 12345.0f);
  TC_CUDA(cudaMemcpyAsync(gRecvF, marker.data(), 4000, cudaMemcpyHostToDevice, R.stream));
  TC_CUDA(cudaStreamSynchronize(R.stream));
  TC_TRY(expectRefused(R, ncclAllReduce(gSendF, gRecvF, 1000, ncclFloat32, ncclSum, gComm, R.stream), "ncclAllReduce"));
  TC_TRY(expectRefused(R, ncclAllGather(gSendI, gRecvI, 100, ncclInt32, gComm, R.stream), "ncclAllGather"));
  TC_TRY(expectRefused(R, ncclSend(gSendU, 100, ncclUint32, (R.rank + 1) % R.nranks, gComm, R.stream), "ncclSend"));
  TN_OK(ncclGroupStart());
  ncclResult_t inGroup = ncclAllReduce(gSendF, gRecvF, 1000, ncclFloat32, ncclSum, gComm, R.stream);
  ncclResult_t end = ncclGroupEnd();
  TC_TRY(expectRefused(R, inGroup, "ncclAllReduce in a group"));
  TC_EXPECT(end != ncclSuccess, "ncclGroupEnd of a group whose all-reduce was refused returned ncclSuccess");
  void* h = nullptr;
  TC_TRY(expectRefused(R, ncclCommRegister(gComm, gSendF, 4000, &h), "ncclCommRegister"));
  TN_EXPECT_RC(ncclCommSuspend(gComm, NCCL_SUSPEND_MEM), ncclInvalidUsage);
  TN_EXPECT_RC(ncclCommSuspend(gComm, 0), ncclInvalidUsage);
  // Nothing was queued: the stream is idle at once, the output untouched.
  TC_EXPECT(cudaStreamQuery(R.stream) == cudaSuccess, "the stream has work queued after refused calls");
  TC_CUDA(cudaMemcpy(marker.data(), gRecvF, 4000, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 1000; ++i)
    TC_EXPECT(marker[i] == 12345.0f, "refused all-reduce wrote element %d of its output (%g)", i, marker[i]);
  // The queries still answer.
  int count = 0;
  TN_OK(ncclCommCount(gComm, &count));
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(count == R.nranks && async == ncclSuccess, "Count %d, async error %s while suspended", count,
            resultName(async));
  return "";
}

// Every rank resumes (collective); then this GPU's free memory is back down by its ranks' Suspend bytes.
std::string caseResume(Rank& R, double* us)
{
  TC_TRY(together(R, "", "before the resumes"));
  const int64_t suspended = (int64_t)freeMemory();
  TC_TRY(together(R, "", "measuring the free memory while suspended"));
  const double t0 = nowSec();
  ncclResult_t r = ncclCommResume(gComm);
  *us = usSince(t0);
  std::string why = r == ncclSuccess ? "" : fmt("ncclCommResume returned %s: %s", resultName(r), lastError().c_str());
  TC_TRY(together(R, why, "after the resumes"));
  const int64_t resumed = (int64_t)freeMemory();
  const int64_t want = (int64_t)bytesOnMyGpu(R);
  TC_EXPECT(suspended - resumed + kSlack >= want,
            "free memory of GPU %d fell by %lld bytes once every rank resumed; its ranks' Suspend bytes are %lld",
            R.device, (long long)(suspended - resumed), (long long)want);
  uint64_t v[4];
  TC_TRY(memStats(gComm, v));
  TC_EXPECT(v[1] == 0 && v[0] == gBoard->suspendBytes[R.rank],
            "after the resume: Suspended %llu (0 expected), Suspend %llu (%llu before the suspend)",
            (unsigned long long)v[1], (unsigned long long)v[0], (unsigned long long)gBoard->suspendBytes[R.rank]);
  TN_EXPECT_RC(ncclCommResume(gComm), ncclInvalidUsage);
  R.info = fmt("GPU %d: %lld MiB taken again", R.device, (long long)((suspended - resumed) >> 20));
  return "";
}

std::string caseGraphAfterResume(Rank& R)
{
  const uint64_t count = 4099;
  std::vector<float> h(count);
  for (uint64_t i = 0; i < count; ++i) h[i] = (float)((R.rank + 1) * (int)(i % 31 + 1));
  TC_CUDA(cudaMemcpyAsync(gSendF, h.data(), count * 4, cudaMemcpyHostToDevice, R.stream));
  TC_CUDA(cudaStreamSynchronize(R.stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  ncclResult_t r = ncclAllReduce(gSendF, gRecvF, count, ncclFloat32, ncclSum, gComm, R.stream);
  cudaError_t e = cudaStreamEndCapture(R.stream, &graph);
  TC_EXPECT(r == ncclSuccess, "ncclAllReduce while capturing returned %s: %s", resultName(r), lastError().c_str());
  TC_CUDA(e);
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const float ranks = (float)(R.nranks * (R.nranks + 1) / 2);
  std::string why;
  for (int rep = 0; rep < 3 && why.empty(); ++rep) {
    TC_CUDA(cudaMemsetAsync(gRecvF, 0, count * 4, R.stream));
    TC_CUDA(cudaGraphLaunch(exec, R.stream));
    why = syncBounded(R, "graph replay");
    if (!why.empty()) break;
    TC_CUDA(cudaMemcpy(h.data(), gRecvF, count * 4, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < count && why.empty(); ++i)
      if (h[i] != (float)(i % 31 + 1) * ranks)
        why = fmt("replay %d: element %llu is %g, expected %g", rep, (unsigned long long)i, h[i],
                  (float)(i % 31 + 1) * ranks);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return why;
}

std::string caseSuspendResumeAgain(Rank& R, int flags, uint32_t salt)
{
  TC_CUDA(cudaDeviceSynchronize());
  TC_TRY(together(R, "", "before the suspend"));
  ncclResult_t r = ncclCommSuspend(gComm, flags);
  std::string why = r == ncclSuccess ? "" : fmt("ncclCommSuspend(%d) returned %s: %s", flags, resultName(r),
                                                lastError().c_str());
  if (why.empty()) {
    uint64_t v[4];
    why = memStats(gComm, v);
    const uint64_t released = flags == NCCL_SUSPEND_MEM;
    if (why.empty() && (v[1] != released || (released ? v[0] != 0 : v[0] != gBoard->suspendBytes[R.rank])))
      why = fmt("suspended with flags %d: Suspended %llu, Suspend %llu", flags, (unsigned long long)v[1],
                (unsigned long long)v[0]);
    if (why.empty())
      why = expectRefused(R, ncclAllReduce(gSendF, gRecvF, 10, ncclFloat32, ncclSum, gComm, R.stream), "ncclAllReduce");
  }
  TC_TRY(together(R, why, "after the suspend"));
  r = ncclCommResume(gComm);
  why = r == ncclSuccess ? "" : fmt("ncclCommResume returned %s: %s", resultName(r), lastError().c_str());
  TC_TRY(together(R, why, "after the resume"));
  return together(R, collectives(R, salt, "after the resume"), "after the collectives");
}

// kCycles suspend/resume cycles; each followed by a first small all-reduce
// and a second, timed to the end of the stream.
std::string caseTiming(Rank& R)
{
  for (int c = 0; c < kCycles; ++c) {
    TC_CUDA(cudaDeviceSynchronize());
    TC_TRY(together(R, "", "before a timed suspend"));
    double t0 = nowSec();
    ncclResult_t r = ncclCommSuspend(gComm, NCCL_SUSPEND_MEM);
    gBoard->suspendUs[R.rank][c] = usSince(t0);
    std::string why = r == ncclSuccess ? "" : fmt("ncclCommSuspend returned %s", resultName(r));
    TC_TRY(together(R, why, "after a timed suspend"));
    t0 = nowSec();
    r = ncclCommResume(gComm);
    gBoard->resumeUs[R.rank][c] = usSince(t0);
    why = r == ncclSuccess ? "" : fmt("ncclCommResume returned %s: %s", resultName(r), lastError().c_str());
    TC_TRY(together(R, why, "after a timed resume"));
    for (int k = 0; k < 2 && why.empty(); ++k) {
      t0 = nowSec();
      why = allReduce(R, 1000, gSendF, gRecvF, "all-reduce after a timed resume");
      (k == 0 ? gBoard->firstCallUs : gBoard->laterCallUs)[R.rank][c] = usSince(t0);
    }
    TC_TRY(together(R, why, "after the timed all-reduces"));
  }
  if (R.rank == 0) {
    std::vector<double> s, re, first, later;
    double worstResume = 0;
    for (int r = 0; r < R.nranks; ++r)
      for (int c = 0; c < kCycles; ++c) {
        s.push_back(gBoard->suspendUs[r][c]);
        re.push_back(gBoard->resumeUs[r][c]);
        first.push_back(gBoard->firstCallUs[r][c]);
        later.push_back(gBoard->laterCallUs[r][c]);
        worstResume = std::max(worstResume, gBoard->resumeUs[r][c]);
      }
    R.info = fmt("median over %d ranks x %d cycles: ncclCommSuspend %.0f us, ncclCommResume %.0f us (slowest %.0f), "
                 "first all-reduce of 1000 float32 after a resume %.0f us, the next %.0f us (each to the end of its "
                 "stream, copies and check included)",
                 R.nranks, kCycles, median(s), median(re), worstResume, median(first), median(later));
  }
  return "";
}

std::string caseDestroy(Rank& R)
{
  TN_OK(ncclCommDeregister(gComm, gHandleA));
  TN_OK(ncclCommDeregister(gComm, gHandleB));
  TN_OK(ncclCommDestroy(gComm));
  gComm = nullptr;
  TN_OK(ncclMemFree(gRegA));
  TN_OK(ncclMemFree(gRegB));
  return oobBarrier(R, "after ncclCommDestroy");
}

int rankMain(Rank& R)
{
  if (!setUpPassed(R, setUp(R))) return 1;
  runCase(R, "init", [&] { return together(R, caseInit(R), "after init"); });
  runCase(R, "collectives_before_suspend",
          [&] { return together(R, collectives(R, 1, "before the suspend"), "after the collectives"); });
  runCase(R, "memstats_before", [&] { return together(R, caseMemStatsBefore(R), "after the statistics"); });
  runCase(R, "bad_flags_and_resume_without_suspend",
          [&] { return together(R, caseBadCalls(R), "after the refusals"); });
  double suspendUs = 0, resumeUs = 0;
  runCase(R, "suspend_frees_memory", [&] { return caseSuspendFrees(R, &suspendUs); });
  runCase(R, "memstats_while_suspended",
          [&] { return together(R, caseStatsWhileSuspended(R), "after the statistics"); });
  runCase(R, "refused_while_suspended", [&] { return together(R, caseRefused(R), "after the refused calls"); });
  runCase(R, "resume_takes_memory_back", [&] { return caseResume(R, &resumeUs); });
  runCase(R, "collectives_after_resume", [&] {
    TC_TRY(together(R, collectives(R, 2, "right after the resume"), "after the collectives"));
    return together(R, caseGraphAfterResume(R), "after the graph");
  });
  runCase(R, "second_suspend_resume", [&] { return caseSuspendResumeAgain(R, NCCL_SUSPEND_MEM, 3); });
  runCase(R, "flags_0_suspends_without_releasing", [&] { return caseSuspendResumeAgain(R, 0, 4); });
  runCase(R, "timing", [&] {
    std::string t = caseTiming(R);
    if (t.empty() && R.rank == 0)
      R.info = fmt("first suspend %.0f us, first resume %.0f us on rank 0; %s", suspendUs, resumeUs, R.info.c_str());
    return t;
  });
  runCase(R, "destroy", [&] { return caseDestroy(R); });
  cudaFree(gSendF);
  cudaFree(gRecvF);
  cudaFree(gSendI);
  cudaFree(gRecvI);
  cudaFree(gSendU);
  cudaFree(gRecvU);
  freeRank(R);
  return 0;
}

} // namespace

int main(int argc, char** argv)
{
  // A rank told at `together` that another failed stops too: the communicator's calls no longer match
  // between the ranks.
  gMeetingRules.othersFailureIsFatal = true;
  return runBoardGroup("nccl_suspend_test", &gBoard, "nccl_suspend", parseArgs(argc, argv, 2), 600, rankMain);
}
