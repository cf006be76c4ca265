// patterns.h: the data the GPU tests move and how a kernel reports trouble. Every word of a pattern depends
// on a seed (role, sender, receiver, salt) and its index, so misplaced, stale, missing or foreign data is
// detected (fillKernel, verifyKernel); a kernel's failure report and progress markers live in host-mapped
// memory (DevStatus), readable while the kernel still runs; globalTimerNs is the clock of device deadlines.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tc {

constexpr int kMaxProgress = 64; // blocks whose progress DevStatus keeps

// Nanoseconds of the GPU's global timer (the same clock on every SM).
__device__ __forceinline__ uint64_t globalTimerNs()
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ------------------------------------------------------------------------------------------------
// Data patterns: every word depends on a seed (role, sender, receiver, salt) and on its index, is never
// zero, and differs between neighbours, so misplaced, stale, missing or foreign data is detected.
// ------------------------------------------------------------------------------------------------

enum Role : uint32_t
{
  kRoleSrc = 1,      // data a rank sends
  kRoleSentinel = 2, // what a receive region holds before the transfer
  kRoleGuard = 3,    // memory around a buffer that nobody may write
  kRoleNew = 4,      // data written over a source after flush()
  kRolePing = 5,     // ping-pong payloads
  kRoleDirect = 6,   // stores through remoteBuff
  kRoleReg = 7,      // registered-buffer writes
};

__host__ __device__ inline uint64_t mix64(uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__host__ __device__ inline uint32_t makeSeed(uint32_t role, uint32_t from, uint32_t to, uint32_t salt)
{
  uint64_t x = mix64(((uint64_t)role << 56) ^ ((uint64_t)(from & 0xff) << 48) ^ ((uint64_t)(to & 0xff) << 40) ^ salt);
  uint32_t s = (uint32_t)(x ^ (x >> 32));
  return s ? s : 0x2468ACE1u;
}

__host__ __device__ inline uint32_t patternWord(uint32_t seed, uint64_t idx)
{
  uint64_t x = mix64(((uint64_t)seed << 32) ^ idx ^ ((uint64_t)seed * 0xD6E8FEB86659FD93ull));
  uint32_t v = (uint32_t)(x ^ (x >> 32));
  return v ? v : 0x13579BDFu;
}

// ------------------------------------------------------------------------------------------------
// Device side: failure reports and progress markers in host-mapped memory (readable while a kernel
// is still running).
// ------------------------------------------------------------------------------------------------

enum DevFailure : int
{
  kFailWaitTimeout = 1,
  kFailDataMismatch = 2,
  kFailBadOp = 3,
  kFailNullPointer = 4,
};

struct DevStatus
{
  volatile int failed; // 0, or a DevFailure; written last
  volatile int block;
  volatile int op;
  volatile int pad;
  volatile unsigned long long iter;
  volatile unsigned long long expected;
  volatile unsigned long long observed;
  // Per block: (op + 1) << 40 | iteration, updated as the block goes.
  volatile unsigned long long progress[kMaxProgress];
};

__device__ inline void devFail(DevStatus* st, int code, int op, uint64_t iter, uint64_t expected, uint64_t observed)
{
  if (st->failed) return; // keep the first report (best effort; only diagnostics race here)
  st->block = (int)blockIdx.x;
  st->op = op;
  st->iter = iter;
  st->expected = expected;
  st->observed = observed;
  __threadfence_system();
  st->failed = code;
  __threadfence_system();
}

__device__ inline void devProgress(DevStatus* st, int op, uint64_t iter)
{
  if (blockIdx.x < kMaxProgress) st->progress[blockIdx.x] = ((unsigned long long)(op + 1) << 40) | (iter & 0xFFFFFFFFFFull);
}

__global__ void fillKernel(uint32_t* buf, uint64_t n, uint32_t seed, uint64_t idx0)
{
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    buf[i] = patternWord(seed, idx0 + i);
  }
}

// out[0] += number of wrong words; out[1] = min(index of a wrong word).
__global__ void verifyKernel(const uint32_t* buf, uint64_t n, uint32_t seed, uint64_t idx0, unsigned long long* out)
{
  unsigned long long bad = 0, first = ~0ull;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    if (buf[i] != patternWord(seed, idx0 + i)) {
      ++bad;
      if (i < first) first = i;
    }
  }
  if (bad) {
    atomicAdd(&out[0], bad);
    atomicMin(&out[1], first);
  }
}

} // namespace tc
