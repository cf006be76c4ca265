// Windows and suspensions together, through our nccl.h and libnccl.so.2 alone: what vLLM's sleep mode does
// before a symmetric all-reduce (a real client saw one rank of four hang here, then wrong sums on the others).
// It runs with CUDA_MODULE_LOADING=LAZY, CUDA's default: the hang was a rank loading the library's kernels
// at its first call after the resume while its peers' kernels, on the same GPU under MPS, spun waiting for it.
//
// One process per rank, forked by the parent; rank r uses GPU r % GPUs, so every rank may share one GPU.
//
//   nccl_window_suspend_test [nranks] [--port P] [--quick]
//
// Cases, in order, on one communicator:
//   init; warm_up: an all-reduce of one element (as vLLM's communicator makes at its creation);
//   suspend_then_window: kCycles times, no barrier between the steps (as a client makes them), each rank pausing
//   0-50 ms (its own) before each step and between its suspend and its resume, so that the ranks interleave
//   differently: every rank suspends (NCCL_SUSPEND_MEM) and resumes, takes a buffer of 4 MiB at an offset inside a
//   larger cudaMalloc (as PyTorch's caching allocator hands one out), registers it with ncclCommWindowRegister
//   (NCCL_WIN_COLL_SYMMETRIC), fills it with rank + 1 on its stream and all-reduces it out of place on that stream
//   into the next piece of the same allocation, one call a cycle (the legacy default stream on even cycles, as
//   PyTorch's current stream, a non-blocking one on odd cycles); every element is checked, ncclCommGetAsyncError
//   must say ncclSuccess, and the window is deregistered and the memory freed;
//   window_across_suspend: kCycles times, the reverse order: a window registered (and used) before the
//   suspend, used again after the resume, in and out of place, checked as above;
//   graph_on_window_after_resume: an all-reduce of the window captured in a CUDA graph after a resume,
//   replayed 3 times;
//   destroy.
//
// Output: PASS name [note] / FAIL name: reason per case, a SUMMARY line. Exit code 0 only if every case passed.
// --quick runs 3 cycles instead of kCycles. MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline.
#include "nccl_rank.h"

using namespace tc;

namespace {

constexpr int kCycles = 20;
// The window: 4 MiB of float32, 2 MiB into an allocation of 20 MiB (PyTorch's caching allocator rounds a
// large request up to a segment of its own and hands out pieces of it).
constexpr uint64_t kCount = (4u << 20) / 4;
constexpr uint64_t kSegmentBytes = 20u << 20;
constexpr uint64_t kOffsetBytes = 2u << 20;

struct Board
{
  SharedId id;
  Meeting meeting;
};

Board* gBoard = nullptr;
ncclComm_t gComm = nullptr;
int gCycles = kCycles;
float* gOut = nullptr; // the out-of-place all-reduce's output, a plain cudaMalloc

__global__ void fill(float* x, uint64_t n, float v)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    x[i] = v * (float)(i % 13 + 1);
}

// Every element of `y` is (i % 13 + 1) * n (n + 1) / 2, and no asynchronous error is pending.
std::string check(Rank& R, const float* y, const char* what)
{
  std::vector<float> h(kCount);
  TC_CUDA(cudaMemcpy(h.data(), y, kCount * 4, cudaMemcpyDeviceToHost));
  const float ranks = (float)(R.nranks * (R.nranks + 1) / 2);
  for (uint64_t i = 0; i < kCount; ++i)
    if (h[i] != (float)(i % 13 + 1) * ranks)
      return fmt("%s: element %llu is %g, expected %g", what, (unsigned long long)i, h[i], (float)(i % 13 + 1) * ranks);
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(async == ncclSuccess, "%s: ncclCommGetAsyncError says %s: %s", what, resultName(async),
            lastError(gComm).c_str());
  return "";
}

// The window's all-reduce out of place into `out`, then (`inPlace`) in place, each filled afresh on the stream
// first.
std::string allReduces(Rank& R, float* win, float* out, const char* when, bool inPlace = true)
{
  fill<<<64, 256, 0, R.stream>>>(win, kCount, (float)(R.rank + 1));
  TC_CUDA(cudaGetLastError());
  TC_CUDA(cudaMemsetAsync(out, 0xff, kCount * 4, R.stream));
  TN_OK(ncclAllReduce(win, out, kCount, ncclFloat32, ncclSum, gComm, R.stream));
  TC_TRY(syncBounded(R, fmt("out-of-place all-reduce from the window %s", when).c_str()));
  TC_TRY(check(R, out, fmt("out-of-place all-reduce from the window %s", when).c_str()));
  if (!inPlace) return "";
  fill<<<64, 256, 0, R.stream>>>(win, kCount, (float)(R.rank + 1));
  TC_CUDA(cudaGetLastError());
  TN_OK(ncclAllReduce(win, win, kCount, ncclFloat32, ncclSum, gComm, R.stream));
  TC_TRY(syncBounded(R, fmt("in-place all-reduce on the window %s", when).c_str()));
  return check(R, win, fmt("in-place all-reduce on the window %s", when).c_str());
}

void jitter(Rank& R, int c, int step);

// A suspend, a pause (`jitter`: the ranks stay suspended for different times), the resume.
std::string suspendResume(Rank& R, int c, const char* when)
{
  TC_CUDA(cudaStreamSynchronize(R.stream));
  TN_OK(ncclCommSuspend(gComm, NCCL_SUSPEND_MEM));
  jitter(R, c, 5);
  ncclResult_t r = ncclCommResume(gComm);
  TC_EXPECT(r == ncclSuccess, "ncclCommResume %s returned %s: %s", when, resultName(r), lastError().c_str());
  return "";
}

struct Window
{
  char* segment = nullptr;
  float* buf = nullptr;
  float* out = nullptr; // the next piece of the same segment, as the allocator hands out the output
  ncclWindow_t win = nullptr;
};

std::string openWindow(Rank& R, Window* w)
{
  (void)R;
  TC_CUDA(cudaMalloc((void**)&w->segment, kSegmentBytes));
  w->buf = (float*)(w->segment + kOffsetBytes);
  w->out = w->buf + kCount;
  TN_OK(ncclCommWindowRegister(gComm, w->buf, kCount * 4, &w->win, NCCL_WIN_COLL_SYMMETRIC));
  return "";
}

std::string closeWindow(Rank& R, Window* w)
{
  TC_CUDA(cudaStreamSynchronize(R.stream));
  TN_OK(ncclCommWindowDeregister(gComm, w->win));
  TC_CUDA(cudaFree(w->segment));
  *w = Window{};
  return "";
}

// A pause of 0 to 50 ms, different on every rank and cycle: the ranks reach each step at different times,
// as processes of a real client do (a lockstep test would try one interleaving only).
void jitter(Rank& R, int c, int step)
{
  uint64_t h = mix64(((uint64_t)R.rank << 32) ^ ((uint64_t)c << 8) ^ (uint64_t)step);
  usleep((useconds_t)(h % 50000));
}

// Cycle c's stream: the legacy default stream on even cycles (PyTorch's current stream unless the
// application chose another: it waits for every blocking stream of the context, the library's own
// included), the rank's non-blocking stream on odd ones.
cudaStream_t cycleStream(cudaStream_t own, int c) { return c % 2 == 0 ? cudaStreamLegacy : own; }

// gCycles cycles of `steps` (its window opened or not by it, closed here), each on cycleStream's stream and
// ended together by every rank; `what` names a cycle in the reasons.
template <typename Steps>
std::string cycles(Rank& R, const char* what, Steps steps)
{
  const cudaStream_t own = R.stream;
  for (int c = 0; c < gCycles; ++c) {
    R.stream = cycleStream(own, c);
    const std::string when = fmt("%s %d of %d (%s stream)", what, c + 1, gCycles,
                                 c % 2 == 0 ? "legacy default" : "non-blocking");
    Window w;
    std::string why = steps(c, when, &w);
    if (why.empty()) why = closeWindow(R, &w);
    R.stream = own;
    TC_TRY(together(R, why, when.c_str()));
  }
  R.info = fmt("%d cycles", gCycles);
  return "";
}

std::string caseSuspendThenWindow(Rank& R)
{
  return cycles(R, "after suspend and resume", [&](int c, const std::string& when, Window* w) {
    jitter(R, c, 0);
    std::string why = suspendResume(R, c, when.c_str());
    jitter(R, c, 1);
    if (why.empty()) why = openWindow(R, w);
    jitter(R, c, 2);
    if (why.empty()) why = allReduces(R, w->buf, w->out, when.c_str(), false);
    return why;
  });
}

std::string caseWindowAcrossSuspend(Rank& R)
{
  return cycles(R, "registered before suspend", [&](int c, const std::string& when, Window* w) {
    std::string why = openWindow(R, w);
    if (why.empty()) why = allReduces(R, w->buf, w->out, (when + ", before it").c_str());
    jitter(R, c, 3);
    if (why.empty()) why = suspendResume(R, c, when.c_str());
    jitter(R, c, 4);
    if (why.empty()) why = allReduces(R, w->buf, gOut, (when + ", after the resume").c_str());
    return why;
  });
}

std::string caseGraphAfterResume(Rank& R)
{
  Window w;
  TC_TRY(suspendResume(R, 0, "before the graph"));
  TC_TRY(openWindow(R, &w));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  ncclResult_t r = ncclAllReduce(w.buf, gOut, kCount, ncclFloat32, ncclSum, gComm, R.stream);
  cudaError_t e = cudaStreamEndCapture(R.stream, &graph);
  TC_EXPECT(r == ncclSuccess, "ncclAllReduce while capturing returned %s: %s", resultName(r), lastError().c_str());
  TC_CUDA(e);
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::string why;
  for (int rep = 0; rep < 3 && why.empty(); ++rep) {
    fill<<<64, 256, 0, R.stream>>>(w.buf, kCount, (float)(R.rank + 1));
    TC_CUDA(cudaMemsetAsync(gOut, 0, kCount * 4, R.stream));
    TC_CUDA(cudaGraphLaunch(exec, R.stream));
    why = syncBounded(R, "graph replay");
    if (why.empty()) why = check(R, gOut, fmt("graph replay %d", rep).c_str());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  TC_TRY(why);
  return closeWindow(R, &w);
}

int rankMain(Rank& R)
{
  // CUDA's default, which PyTorch, JAX and CuPy run with (the other GPU tests load eagerly): a kernel is
  // loaded at its first use, which is when a rank that loads one can wait for a peer's spinning kernels.
  setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  std::string why = setUpDevice(R);
  // This program's own kernel is loaded now, before any peer's kernel can wait on this rank: a lazy load of
  // it mid-cycle would be this program's hang, not the library's.
  cudaFuncAttributes attributes;
  if (why.empty() && cudaFuncGetAttributes(&attributes, fill) != cudaSuccess) why = "cudaFuncGetAttributes(fill) failed";
  if (why.empty() && cudaMalloc((void**)&gOut, kCount * 4) != cudaSuccess) why = "cudaMalloc of the output failed";
  if (!setUpPassed(R, why)) return 1;
  runCase(R, "init", [&] {
    std::string w = initBoardComm(R, gBoard->id, &gComm);
    R.info = fmt("%d ranks on %d GPUs", R.nranks, R.nGpus);
    return together(R, w, "after init");
  });
  runCase(R, "warm_up", [&] {
    // A client's first call (vLLM's communicator all-reduces one element at its creation): the epoch
    // counted on the GPU is odd at the first suspend, and stays so at every later one.
    TN_OK(ncclAllReduce(gOut, gOut, 1, ncclFloat32, ncclSum, gComm, R.stream));
    return together(R, syncBounded(R, "the warm-up all-reduce"), "after the warm-up");
  });
  runCase(R, "suspend_then_window", [&] { return caseSuspendThenWindow(R); });
  runCase(R, "window_across_suspend", [&] { return caseWindowAcrossSuspend(R); });
  runCase(R, "graph_on_window_after_resume",
          [&] { return together(R, caseGraphAfterResume(R), "after the graph"); });
  runCase(R, "destroy", [&] {
    TN_OK(ncclCommDestroy(gComm));
    gComm = nullptr;
    return oobBarrier(R, "after ncclCommDestroy");
  });
  cudaFree(gOut);
  freeRank(R);
  return 0;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 4);
  if (opt.quick) gCycles = 3;
  gMeetingRules.othersFailureIsFatal = true;
  return runBoardGroup("nccl_window_suspend_test", &gBoard, "nccl_window_suspend", opt, 900, rankMain);
}
