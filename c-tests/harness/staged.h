// staged.h: what the NCCL face's staged GPU programs share (nccl_grow_test, nccl_collconfig_test): return-code
// checks that name the call, waiting for a flag another process sets, a communicator's health after its
// stream drained, device buffers freed on every path, uploads and element-by-element comparisons of floats,
// and the number of GPUs a new process sees. Each program keeps its own board of shared memory and its
// meetings.
#pragma once

#include "forked_ranks.h"

#include <nccl.h>

#include <functional>

namespace tc {

// How long a process waits for the others (scaled by the test's MSCCLPP_TEST_TIMEOUT_SCALE in main).
inline double gWaitS = 60;

inline std::string rc(ncclResult_t r) { return fmt("%s (%d)", ncclGetErrorString(r), (int)r); }

#define TG_CUDA(expr)                                                                                          \
  do {                                                                                                         \
    cudaError_t e_ = (expr);                                                                                   \
    if (e_ != cudaSuccess) return fmt("%s: %s (%s:%d)", #expr, cudaGetErrorString(e_), __FILE__, __LINE__);   \
  } while (0)

// An NCCL call that must return `want`.
#define TG_EXPECT(expr, want)                                                                                  \
  do {                                                                                                         \
    ncclResult_t r_ = (expr);                                                                                  \
    if (r_ != (want)) {                                                                                        \
      return fmt("%s returned %s, expected %s (%s:%d); last error: %s", #expr, rc(r_).c_str(),                 \
                 rc(want).c_str(), __FILE__, __LINE__, ncclGetLastError(NULL));                                \
    }                                                                                                          \
  } while (0)
#define TG_OK(expr) TG_EXPECT(expr, ncclSuccess)

// Waits until *flag is set by another process (bounded).
inline std::string waitFlag(int* flag, const char* what)
{
  const double deadline = nowSec() + gWaitS;
  while (!__atomic_load_n(flag, __ATOMIC_SEQ_CST)) {
    if (nowSec() > deadline) return fmt("%s did not come within %.0f s", what, gWaitS);
    usleep(1000);
  }
  return "";
}

// The communicator's own error after a stream was drained: a failure seen meanwhile fails the stage.
inline std::string healthy(ncclComm_t comm)
{
  ncclResult_t async = ncclInternalError;
  TG_OK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) return fmt("ncclCommGetAsyncError says %s: %s", rc(async).c_str(), ncclGetLastError(comm));
  return "";
}

// Device buffers freed on every path.
struct Buffers
{
  std::vector<void*> all;
  float* get(size_t count)
  {
    void* p = nullptr;
    if (cudaMalloc(&p, count * sizeof(float) + 16) != cudaSuccess) return nullptr;
    all.push_back(p);
    return (float*)p;
  }
  ~Buffers()
  {
    for (void* p : all) cudaFree(p);
  }
};

// Compares `count` floats of the device buffer `d` with want(i).
template <typename F>
inline std::string compare(const char* what, const float* d, size_t count, cudaStream_t stream, F want)
{
  std::vector<float> h(count);
  TG_CUDA(cudaMemcpyAsync(h.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
  TG_CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < count; ++i)
    if (h[i] != want(i))
      return fmt("%s: element %zu is %g, expected %g", what, i, (double)h[i], (double)want(i));
  return "";
}

inline std::string upload(float* d, size_t count, cudaStream_t stream, const std::function<float(size_t)>& value)
{
  std::vector<float> h(count);
  for (size_t i = 0; i < count; ++i) h[i] = value(i);
  TG_CUDA(cudaMemcpyAsync(d, h.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
  TG_CUDA(cudaStreamSynchronize(stream));
  return "";
}

} // namespace tc
