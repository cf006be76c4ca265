// The collectives (mscclppAllReduce, mscclppAllGather, mscclppReduceScatter, mscclppBroadcast) on GPUs,
// checked against host references: every type, operator and placement, sizes up to 256 MiB, calls cut into
// windows, CUDA graphs, back-to-back calls, a rank killed mid-stream, and bad arguments.
//
// One process per rank; rank r uses GPU r % ngpus, so any number of ranks runs on one GPU (time-sliced:
// every collective then takes milliseconds). Library settings are read once per process, so each group of
// cases below runs in its own set of rank processes with its own environment, and prints its own lines.
//
//   collectives_test <case|all> [nranks] [--port P]
//
//   matrix (= matrix_auto, matrix_packet, matrix_copy, matrix_sendrecv; MSCCLPP_COLL_ALGO auto, packet, copy,
//       sendrecv: what sends and receives can carry goes that way at every size, on one GPU too; at destroy the
//       library's INFO line counts those calls: every call with data between two ranks, among more at least
//       the broadcasts, which go as a chain): every collective
//       x type x operator, in place and out of place, counts 0, 1, 3, 7, 1000 and 65537, aligned and not;
//       integers exact, floating point within a bound; all-reduce results bitwise equal on every rank; nothing
//       written around the output; out of place, the input untouched
//   matrix_small: the same for 4 types, 2 operators and 4 counts (for compute-sanitizer; not in "all"); above 4
//       ranks 2 types, 1 operator and 3 counts (both algorithms of every collective still)
//   large (= large, large_windows, large_windows_packet): 256 MiB float32 all-reduce, an all-gather of
//       128 MiB / nranks per rank, a reduce-scatter of 256 MiB, a 256 MiB broadcast (checked on the GPU); then,
//       with MSCCLPP_COLL_SCRATCH_MB=1, odd counts cut into several windows (auto, and packets forced)
//   graph: (MSCCLPP_COLL_SCRATCH_MB=1) the first collective of a fresh communicator inside a capture; the
//       same on a blocking stream; nine collectives of mixed kinds and sizes captured once, with the kernel
//       that changes their data, replayed 50 times
//   sizes: 200 calls cycling through kinds, types and sizes of 1 B to 1 MiB, each into its own buffer,
//       without synchronizing in between; twice
//   kill: every rank loops on 1 MiB all-reduces; the last is SIGKILLed; each survivor's stream drains within
//       seconds, mscclppCommGetAsyncError says mscclppRemoteError, the next call fails at once, destroy works
//   exit (= exit_in_flight, exit_after_kill, exit_after_fault): a rank calls exit() while its all-reduce waits
//       for peers that join 2 s later; every survivor of a SIGKILLed rank calls exit() without synchronizing or
//       destroying; a rank's own kernel faults and every rank calls exit() once it sees an error: each process
//       ends within seconds, with the status it chose
//   zerocopy (= zerocopy, zerocopy_partial, zerocopy_windows; MSCCLPP_COLL_ALGO=zerocopy): the matrix (5 types, 2
//       operators, 5 counts to 262147, in and out of place, unaligned) twice (once from 8 ranks) on pools registered
//       with mscclppCommRegister: both on every rank; the receive pool only; freed without deregistering and reused,
//       then registered afresh; the graph case's 9 calls on registered pools, replayed 50 times; and
//       (zerocopy_partial) on rank 0 only, where the kernels' vote says no and they move the data through the
//       scratch themselves, again (zerocopy_windows) with MSCCLPP_COLL_SCRATCH_MB=1, the larger counts in several
//       windows; then the kill case with both buffers registered (kill_zerocopy). zerocopy_small (for
//       compute-sanitizer; not in "all"): the first case alone, 2 types and 3 counts. Results as the matrix checks
//       them; at destroy the library's INFO line counts the zero-copy calls: at least 90 % of the eligible ones,
//       never more
//   copyengine (= copyengine, kill_copyengine; MSCCLPP_COLL_ALGO=copyengine): the zerocopy cases again, every
//       eager all-gather and broadcast whose outputs are registered moved by the copy engine (the library's INFO
//       line counts them: nearly every eligible one, never more); then the last rank SIGKILLed while every rank
//       streams copy-engine all-gathers (kill_copyengine). copyengine_small: as zerocopy_small
//   args: host memory, too small buffers, another GPU's buffer or stream, null buffers, unknown type or
//       operator, overflowing counts, bad roots, null or destroyed communicators: each rejected with the
//       documented code and a log line; count 0 with null buffers works; the communicator still works after
//
// Output: one line per case (PASS name [note] / FAIL name: reason / SKIP name: why), a SUMMARY line per group
// and one for the program. Exit code 0 only if everything passed. MSCCLPP_TEST_TIMEOUT_SCALE multiplies every
// deadline (e.g. under compute-sanitizer).
#include "forked_ranks.h"
#include "kill_case.h"
#include "log_capture.h"
#include "mscclpp_rank.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <functional>

using namespace tc;

namespace {

// ------------------------------------------------------------------------------------------------
// Collectives, types and operators
// ------------------------------------------------------------------------------------------------

enum Coll : int
{
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
};
const Coll kColls[] = {kAllReduce, kAllGather, kReduceScatter, kBroadcast};

const char* collName(int c)
{
  static const char* names[] = {"allreduce", "allgather", "reducescatter", "broadcast"};
  return c >= 0 && c < 4 ? names[c] : "?";
}
bool reduces(int c) { return c == kAllReduce || c == kReduceScatter; }

const char* typeName(int t)
{
  static const char* names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                "uint64",  "float16", "float32", "float64", "bfloat16"};
  return t >= 0 && t < 10 ? names[t] : "?";
}
const char* opName(int op)
{
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < 5 ? names[op] : "none";
}

__host__ __device__ inline int typeSize(int t)
{
  switch (t) {
  case mscclppInt8:
  case mscclppUint8: return 1;
  case mscclppFloat16:
  case mscclppBfloat16: return 2;
  case mscclppInt32:
  case mscclppUint32:
  case mscclppFloat32: return 4;
  default: return 8;
  }
}
__host__ __device__ inline bool typeIsFloat(int t)
{
  return t == mscclppFloat16 || t == mscclppFloat32 || t == mscclppFloat64 || t == mscclppBfloat16;
}
__host__ __device__ inline bool typeIsSigned(int t) { return t == mscclppInt8 || t == mscclppInt32 || t == mscclppInt64; }

// Spacing of the type's numbers around 1: the scale of one rounding.
double typeEps(int t)
{
  switch (t) {
  case mscclppFloat16: return 0x1p-10;
  case mscclppBfloat16: return 0x1p-7;
  case mscclppFloat32: return 0x1p-23;
  default: return 0x1p-52;
  }
}

// ------------------------------------------------------------------------------------------------
// Input data: a function of (seed, rank, index), computed the same way on the GPU (to fill inputs) and on
// the host (for references). Never zero, different on every rank and element, and chosen per operator so
// that integer results stay exact: small values for sums and averages, +-1 and +-2 for products, the whole
// range of the type for minimum, maximum and the collectives that only move data (random bits).
// ------------------------------------------------------------------------------------------------

enum GenKind : int
{
  kGenMove,   // random bits (all-gather, broadcast)
  kGenSum,    // sum and average
  kGenProd,   // product
  kGenMinMax, // minimum and maximum
};

__host__ __device__ inline int genKindFor(int coll, int op)
{
  if (coll == kAllGather || coll == kBroadcast) return kGenMove;
  if (op == mscclppProd) return kGenProd;
  if (op == mscclppMax || op == mscclppMin) return kGenMinMax;
  return kGenSum;
}

__host__ __device__ inline uint64_t elementHash(uint64_t seed, uint32_t rank, uint64_t idx)
{
  return mix64(mix64(seed ^ (0x9E3779B97F4A7C15ull * (rank + 1ull))) ^ idx);
}

// The bits of `v` rounded to a floating type.
__host__ __device__ inline uint64_t encodeFloat(int type, double v)
{
  switch (type) {
  case mscclppFloat16: {
    const __half h = __float2half_rn((float)v);
    const __half_raw raw = h;
    return raw.x;
  }
  case mscclppBfloat16: {
    const __nv_bfloat16 h = __float2bfloat16_rn((float)v);
    const __nv_bfloat16_raw raw = h;
    return raw.x;
  }
  case mscclppFloat32: {
    const float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, sizeof(b));
    return b;
  }
  default: {
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
  }
  }
}

// Element `idx` of `rank`'s input, as the bits of one element of `type` (in the low bytes).
__host__ __device__ inline uint64_t genBits(int type, int kind, uint64_t seed, uint32_t rank, uint64_t idx)
{
  const uint64_t h = elementHash(seed, rank, idx);
  const int size = typeSize(type);
  const uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
  const bool negative = (h >> 63) != 0;
  const uint64_t low = h & 0xffffffffull;
  if (kind == kGenMove || (kind == kGenMinMax && !typeIsFloat(type))) {
    const uint64_t b = h & mask;
    return b ? b : 1;
  }
  if (typeIsFloat(type)) {
    double v;
    if (kind == kGenSum) {
      v = ((double)(low % 2001) - 1000.0) / 128.0; // within +-7.8, in steps a float16 still holds
      if (v == 0) v = 0.5;
    } else if (kind == kGenProd) {
      v = 0.75 + (double)(low % 751) / 1000.0; // products of 16 of them stay far from overflow and underflow
      if (negative) v = -v;
    } else {
      v = ((double)(low % 20001) - 10000.0) / 64.0;
      if (v == 0) v = -0.25;
    }
    return encodeFloat(type, v);
  }
  int64_t v;
  if (kind == kGenSum) {
    v = typeIsSigned(type) ? (int64_t)(low % 8) + 1 : (int64_t)(low % 15) + 1;
  } else {
    v = low % 4 == 0 ? 2 : 1;
  }
  if (negative && typeIsSigned(type)) v = -v;
  return (uint64_t)v & mask;
}

// Fills count elements of `type` at dst with `rank`'s input under seed + *seedBump (a counter on the GPU,
// so that a replayed graph gets fresh data each time without the host).
__global__ void fillInputKernel(char* dst, uint64_t count, int type, int kind, uint64_t seed, const uint64_t* seedBump,
                                uint32_t rank)
{
  const uint64_t s = seed + (seedBump ? *seedBump : 0);
  const int size = typeSize(type);
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t b = genBits(type, kind, s, rank, i);
    switch (size) {
    case 1: reinterpret_cast<uint8_t*>(dst)[i] = (uint8_t)b; break;
    case 2: reinterpret_cast<uint16_t*>(dst)[i] = (uint16_t)b; break;
    case 4: reinterpret_cast<uint32_t*>(dst)[i] = (uint32_t)b; break;
    default: reinterpret_cast<uint64_t*>(dst)[i] = b; break;
    }
  }
}

// The last node of a captured graph: the next replay's inputs differ.
__global__ void bumpKernel(uint64_t* counter)
{
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter += 1;
}

// ---- the large case's check, on the GPU (256 MiB would take seconds on the host) ----

__host__ __device__ inline float largeInput(uint64_t seed, uint32_t rank, uint64_t idx)
{
  const uint32_t b = (uint32_t)genBits(mscclppFloat32, kGenSum, seed, rank, idx);
  float v;
  memcpy(&v, &b, sizeof(v));
  return v;
}

// Element j of a float32 sum (or copy) collective's output. Inputs are multiples of 1/128 below 8 in
// magnitude, so every partial sum is exact and the order of the reduction does not matter.
__host__ __device__ inline float largeExpected(int coll, uint64_t j, uint64_t count, uint32_t nranks, uint32_t rank,
                                               uint32_t root, uint64_t seed)
{
  float acc = 0;
  switch (coll) {
  case kAllReduce:
    for (uint32_t r = 0; r < nranks; ++r) acc += largeInput(seed, r, j);
    return acc;
  case kReduceScatter:
    for (uint32_t r = 0; r < nranks; ++r) acc += largeInput(seed, r, (uint64_t)rank * count + j);
    return acc;
  case kAllGather: return largeInput(seed, (uint32_t)(j / count), j % count);
  default: return largeInput(seed, root, j);
  }
}

// out[0] += wrong elements; out[1] = min(index of a wrong element).
__global__ void verifyLargeKernel(const float* got, uint64_t n, int coll, uint64_t count, uint32_t nranks, uint32_t rank,
                                  uint32_t root, uint64_t seed, unsigned long long* out)
{
  unsigned long long bad = 0, first = ~0ull;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x) {
    if (got[j] != largeExpected(coll, j, count, nranks, rank, root, seed)) {
      ++bad;
      if (j < first) first = j;
    }
  }
  if (bad) {
    atomicAdd(&out[0], bad);
    atomicMin(&out[1], first);
  }
}

// ------------------------------------------------------------------------------------------------
// Host references
// ------------------------------------------------------------------------------------------------

double decodeFloat(int type, uint64_t bits)
{
  switch (type) {
  case mscclppFloat16: {
    __half_raw raw;
    raw.x = (unsigned short)bits;
    return __half2float(__half(raw));
  }
  case mscclppBfloat16: {
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  case mscclppFloat32: {
    const uint32_t b = (uint32_t)bits;
    float f;
    memcpy(&f, &b, sizeof(f));
    return f;
  }
  default: {
    double d;
    memcpy(&d, &bits, sizeof(d));
    return d;
  }
  }
}

int64_t signExtend(uint64_t bits, int size)
{
  if (size == 8) return (int64_t)bits;
  const int shift = 64 - 8 * size;
  return (int64_t)(bits << shift) >> shift;
}

uint64_t readBits(const uint8_t* p, int size)
{
  uint64_t b = 0;
  memcpy(&b, p, (size_t)size); // little-endian, as the GPU
  return b;
}

std::string showValue(int type, uint64_t bits)
{
  const int size = typeSize(type);
  if (typeIsFloat(type)) return fmt("%.9g (0x%0*llx)", decodeFloat(type, bits), 2 * size, (unsigned long long)bits);
  if (typeIsSigned(type)) return fmt("%lld (0x%0*llx)", (long long)signExtend(bits, size), 2 * size, (unsigned long long)bits);
  return fmt("%llu (0x%0*llx)", (unsigned long long)bits, 2 * size, (unsigned long long)bits);
}

// One collective call of a test: what it does, and where its buffers lie in the case's two pools.
struct Call
{
  Coll coll = kAllReduce;
  int type = mscclppFloat32;
  int op = -1;        // a mscclppRedOp_t for all-reduce and reduce-scatter
  uint64_t count = 0; // the call's count argument (sendcount of an all-gather, recvcount of a reduce-scatter)
  int root = 0;       // broadcast
  bool inPlace = false;
  bool nullSendOffRoot = false; // broadcast: ranks other than the root pass sendbuff = NULL
  uint64_t seed = 0;
  int sendShift = 0, recvShift = 0; // elements past a 256-byte boundary: 16-byte aligned or not
  // Placement (planCalls): out of place, the input at sendOff in the send pool; the output (and, in place,
  // the input) in a region at regionOff of the receive pool, with guard bytes around it.
  size_t sendOff = 0, regionOff = 0, regionBytes = 0;
};

uint64_t inElems(const Call& c, int nranks) { return c.coll == kReduceScatter ? c.count * nranks : c.count; }
uint64_t outElems(const Call& c, int nranks) { return c.coll == kAllGather ? c.count * nranks : c.count; }

std::string describe(const Call& c)
{
  std::string s = fmt("%s %s", collName(c.coll), typeName(c.type));
  if (reduces(c.coll)) s += fmt(" %s", opName(c.op));
  s += fmt(" count %llu", (unsigned long long)c.count);
  if (c.coll == kBroadcast) s += fmt(" root %d", c.root);
  s += c.inPlace ? " in place" : " out of place";
  if (c.sendShift || c.recvShift) s += " (unaligned)";
  return s;
}

// The reduction of element idx of every rank's input, for integer types: wrapping as the type wraps (so the
// reference holds for any values), the average truncated as C divides.
uint64_t reduceIntegers(const Call& c, int nranks, uint64_t idx)
{
  const int size = typeSize(c.type);
  const bool sgn = typeIsSigned(c.type);
  const uint64_t mask = size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
  const int kind = genKindFor(c.coll, c.op);
  uint64_t acc = 0;
  for (int r = 0; r < nranks; ++r) {
    const uint64_t b = genBits(c.type, kind, c.seed, (uint32_t)r, idx);
    const uint64_t v = sgn ? (uint64_t)signExtend(b, size) : b;
    if (r == 0) {
      acc = v;
      continue;
    }
    switch (c.op) {
    case mscclppProd: acc *= v; break;
    case mscclppMax: acc = sgn ? ((int64_t)v > (int64_t)acc ? v : acc) : (v > acc ? v : acc); break;
    case mscclppMin: acc = sgn ? ((int64_t)v < (int64_t)acc ? v : acc) : (v < acc ? v : acc); break;
    default: acc += v; break;
    }
  }
  if (c.op == mscclppAvg) {
    const uint64_t sum = acc & mask;
    acc = sgn ? (uint64_t)(signExtend(sum, size) / nranks) : sum / (uint64_t)nranks;
  }
  return acc & mask;
}

// The same for floating types, in double, with the error a reduction in the type may make: one rounding per
// step of the size of the partial results (half and bfloat16 are rounded after each step), with a margin.
void reduceFloats(const Call& c, int nranks, uint64_t idx, double* want, double* tol)
{
  const int kind = genKindFor(c.coll, c.op);
  double acc = 0, magnitude = 0;
  for (int r = 0; r < nranks; ++r) {
    const double v = decodeFloat(c.type, genBits(c.type, kind, c.seed, (uint32_t)r, idx));
    magnitude += fabs(v);
    if (r == 0) {
      acc = v;
      continue;
    }
    switch (c.op) {
    case mscclppProd: acc *= v; break;
    case mscclppMax: acc = std::max(acc, v); break;
    case mscclppMin: acc = std::min(acc, v); break;
    default: acc += v; break;
    }
  }
  const double steps = nranks + 2.0;
  switch (c.op) {
  case mscclppProd: *tol = steps * typeEps(c.type) * fabs(acc); break;
  case mscclppMax:
  case mscclppMin: *tol = 0; break; // picks one of the inputs: exact
  case mscclppAvg:
    acc /= nranks;
    *tol = steps * typeEps(c.type) * magnitude / nranks;
    break;
  default: *tol = steps * typeEps(c.type) * magnitude; break;
  }
  *want = acc;
}

// Compares this rank's output of `c` (host copy at out) with the reference; "" if right.
std::string checkOutput(const Call& c, int rank, int nranks, const uint8_t* out)
{
  const int size = typeSize(c.type);
  const uint64_t n = outElems(c, nranks);
  const int kind = genKindFor(c.coll, c.op);
  uint64_t wrong = 0;
  std::string first;
  for (uint64_t j = 0; j < n; ++j) {
    const uint64_t got = readBits(out + j * size, size);
    if (!reduces(c.coll)) {
      const uint32_t src = c.coll == kAllGather ? (uint32_t)(j / c.count) : (uint32_t)c.root;
      const uint64_t idx = c.coll == kAllGather ? j % c.count : j;
      const uint64_t want = genBits(c.type, kind, c.seed, src, idx);
      if (got != want && wrong++ == 0)
        first = fmt("element %llu (rank %u's element %llu): got %s, want %s", (unsigned long long)j, src,
                    (unsigned long long)idx, showValue(c.type, got).c_str(), showValue(c.type, want).c_str());
      continue;
    }
    const uint64_t idx = c.coll == kReduceScatter ? (uint64_t)rank * c.count + j : j;
    if (!typeIsFloat(c.type)) {
      const uint64_t want = reduceIntegers(c, nranks, idx);
      if (got != want && wrong++ == 0)
        first = fmt("element %llu: got %s, want %s", (unsigned long long)j, showValue(c.type, got).c_str(),
                    showValue(c.type, want).c_str());
      continue;
    }
    double want = 0, tol = 0;
    reduceFloats(c, nranks, idx, &want, &tol);
    const double g = decodeFloat(c.type, got);
    if (!(fabs(g - want) <= tol) && wrong++ == 0)
      first = fmt("element %llu: got %s, want %.9g (tolerance %.3g)", (unsigned long long)j, showValue(c.type, got).c_str(),
                  want, tol);
  }
  if (wrong == 0) return "";
  return fmt("%llu of %llu output elements wrong, first %s", (unsigned long long)wrong, (unsigned long long)n, first.c_str());
}

uint64_t fnv1a(const uint8_t* p, size_t n)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// ------------------------------------------------------------------------------------------------
// Buffers and calls on the GPU
// ------------------------------------------------------------------------------------------------

constexpr size_t kGuard = 64;          // bytes around each output that must stay as they were
constexpr size_t kAlign = 256;         // where each buffer starts (before its shift)
constexpr unsigned char kSentinel = 0xA5;

struct DeviceBuffer
{
  char* ptr = nullptr;
  size_t bytes = 0;
};

struct Pools
{
  DeviceBuffer send, recv;
  // mscclppCommRegister's handles of the two, while registered (registerPools).
  void* sendHandle = nullptr;
  void* recvHandle = nullptr;
};

size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Grows a buffer to at least `bytes` (contents are lost); only between batches, never during a capture.
std::string ensure(Rank& R, DeviceBuffer& b, size_t bytes)
{
  if (b.bytes >= bytes) return "";
  if (b.ptr) TC_CUDA(cudaFree(b.ptr));
  b.ptr = nullptr;
  b.bytes = 0;
  TC_CUDA(cudaMalloc((void**)&b.ptr, bytes));
  b.bytes = bytes;
  return "";
}

void release(Pools& P)
{
  if (P.send.ptr) cudaFree(P.send.ptr);
  if (P.recv.ptr) cudaFree(P.recv.ptr);
  P = Pools();
}

// Places every call's buffers in the pools, each at its own offset with gaps for guards; returns the bytes
// the receive pool needs and sets *sendBytes.
size_t planCalls(std::vector<Call>& calls, int nranks, size_t* sendBytes)
{
  size_t s = 0, r = 0;
  for (Call& c : calls) {
    const size_t esz = (size_t)typeSize(c.type);
    r = alignUp(r + kGuard, kAlign) + c.recvShift * esz;
    c.regionOff = r;
    const uint64_t elems = c.inPlace ? std::max(inElems(c, nranks), outElems(c, nranks)) : outElems(c, nranks);
    c.regionBytes = elems * esz;
    r += c.regionBytes + kGuard;
    if (!c.inPlace) {
      s = alignUp(s, kAlign) + c.sendShift * esz;
      c.sendOff = s;
      s += inElems(c, nranks) * esz;
    }
  }
  *sendBytes = s + kAlign;
  return r + kAlign;
}

// The pointers a call passes, NCCL's way in place: all-gather's input is this rank's piece of the output,
// reduce-scatter's output this rank's piece of the input.
void callPointers(const Call& c, const Pools& P, int rank, char** send, char** recv)
{
  char* region = P.recv.ptr + c.regionOff;
  const size_t piece = c.count * (size_t)typeSize(c.type);
  if (!c.inPlace) {
    *send = P.send.ptr + c.sendOff;
    *recv = region;
  } else if (c.coll == kAllGather) {
    *recv = region;
    *send = region + rank * piece;
  } else if (c.coll == kReduceScatter) {
    *send = region;
    *recv = region + rank * piece;
  } else {
    *send = *recv = region;
  }
  if (c.nullSendOffRoot && rank != c.root) *send = nullptr;
}

mscclppResult_t collective(Coll coll, const void* send, void* recv, size_t count, int type, int opOrRoot,
                           mscclppComm_t comm, cudaStream_t stream)
{
  const mscclppDataType_t dt = (mscclppDataType_t)type;
  switch (coll) {
  case kAllReduce: return mscclppAllReduce(send, recv, count, dt, (mscclppRedOp_t)opOrRoot, comm, stream);
  case kAllGather: return mscclppAllGather(send, recv, count, dt, comm, stream);
  case kReduceScatter: return mscclppReduceScatter(send, recv, count, dt, (mscclppRedOp_t)opOrRoot, comm, stream);
  default: return mscclppBroadcast(send, recv, count, dt, opOrRoot, comm, stream);
  }
}

// Queues the fill of the call's input and the call itself on `stream`.
std::string issueCall(Rank& R, const Call& c, const Pools& P, mscclppComm_t comm, cudaStream_t stream,
                      const uint64_t* seedBump = nullptr)
{
  char *send = nullptr, *recv = nullptr;
  callPointers(c, P, R.rank, &send, &recv);
  const uint64_t n = inElems(c, R.nranks);
  if (send && n > 0) {
    fillInputKernel<<<gridFor(n), 256, 0, stream>>>(send, n, c.type, genKindFor(c.coll, c.op), c.seed, seedBump,
                                                     (uint32_t)R.rank);
    TC_CUDA(cudaGetLastError());
  }
  const mscclppResult_t r =
    collective(c.coll, send, recv, c.count, c.type, c.coll == kBroadcast ? c.root : c.op, comm, stream);
  if (r != mscclppSuccess) {
    R.fatal = true; // the other ranks' kernels of this call now wait for ours
    return fmt("%s returned %d (%s)", describe(c).c_str(), (int)r, errStr(r));
  }
  return "";
}

// Waits for `stream` (or, if given, for `event` on it) with a deadline (the case runner's syncBounded, for
// any stream).
std::string waitStream(Rank& R, cudaStream_t stream, const char* what, cudaEvent_t event = nullptr)
{
  const double t0 = nowSec();
  for (;;) {
    const cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
    if (e == cudaSuccess) return "";
    if (e != cudaErrorNotReady) {
      R.fatal = true;
      return fmt("%s: stream error: %s", what, cudaGetErrorString(e));
    }
    if (nowSec() - t0 > R.hostTimeoutS) {
      R.fatal = true;
      return fmt("%s: TIMED OUT after %.0f s (a collective never finished)", what, R.hostTimeoutS);
    }
    usleep(100);
  }
}

// Checks one finished call: the guards around its output, its output, and (out of place) its input. A wrong
// result goes to *wrong; the return value is for errors that end the case. *hash: the output's hash.
std::string checkCall(Rank& R, const Call& c, const Pools& P, std::string* wrong, uint64_t* hash)
{
  const int size = typeSize(c.type);
  std::vector<uint8_t> region(c.regionBytes + 2 * kGuard);
  TC_CUDA(cudaMemcpy(region.data(), P.recv.ptr + c.regionOff - kGuard, region.size(), cudaMemcpyDeviceToHost));
  char *send = nullptr, *recv = nullptr;
  callPointers(c, P, R.rank, &send, &recv);
  const uint8_t* out = region.data() + kGuard + (recv - (P.recv.ptr + c.regionOff));
  const size_t outBytes = outElems(c, R.nranks) * size;
  *hash = fnv1a(out, outBytes);
  *wrong = "";
  for (size_t i = 0; i < region.size(); ++i) {
    if (i >= kGuard && i < kGuard + c.regionBytes) continue;
    if (region[i] != kSentinel) {
      const long long at = i < kGuard ? (long long)i - (long long)kGuard : (long long)(i - kGuard - c.regionBytes);
      *wrong = fmt("%s: wrote outside its buffer: byte %lld %s it is 0x%02x, not the sentinel 0x%02x", describe(c).c_str(),
                   at < 0 ? -at : at + 1, at < 0 ? "before" : "after", region[i], kSentinel);
      return "";
    }
  }
  std::string e = checkOutput(c, R.rank, R.nranks, out);
  if (!e.empty()) {
    *wrong = describe(c) + ": " + e;
    return "";
  }
  if (!c.inPlace && send) {
    const uint64_t n = inElems(c, R.nranks);
    std::vector<uint8_t> in(n * size);
    if (n) TC_CUDA(cudaMemcpy(in.data(), send, in.size(), cudaMemcpyDeviceToHost));
    const int kind = genKindFor(c.coll, c.op);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t got = readBits(in.data() + i * size, size), want = genBits(c.type, kind, c.seed, R.rank, i);
      if (got != want) {
        *wrong = fmt("%s: changed its input: element %llu is %s, was %s", describe(c).c_str(), (unsigned long long)i,
                     showValue(c.type, got).c_str(), showValue(c.type, want).c_str());
        return "";
      }
    }
  }
  return "";
}

// What a sequence of checked calls found. Wrong results do not end a case: every rank must go on making the
// same calls, or its peers would wait for calls it never makes.
struct Tally
{
  int calls = 0, wrong = 0;
  std::string first;
  std::vector<uint64_t> allReduceHashes;
  std::vector<std::string> allReduceNames;

  void add(const Call& c, const std::string& e, uint64_t hash)
  {
    ++calls;
    if (!e.empty() && wrong++ == 0) first = e;
    if (c.coll == kAllReduce) {
      allReduceHashes.push_back(hash);
      allReduceNames.push_back(describe(c));
    }
  }
  std::string verdict() const { return wrong ? fmt("%d of %d calls wrong; first: %s", wrong, calls, first.c_str()) : ""; }
};

// Lays the calls out, fills the guards, queues every call (each after the fill of its input) without
// synchronizing, then waits and checks them all.
std::string runBatch(Rank& R, mscclppComm_t comm, cudaStream_t stream, std::vector<Call>& calls, Pools& P, Tally& t)
{
  size_t sendBytes = 0;
  const size_t recvBytes = planCalls(calls, R.nranks, &sendBytes);
  TC_TRY(waitStream(R, stream, "before growing the buffers"));
  TC_TRY(ensure(R, P.send, sendBytes));
  TC_TRY(ensure(R, P.recv, recvBytes));
  TC_CUDA(cudaMemsetAsync(P.recv.ptr, kSentinel, recvBytes, stream));
  for (const Call& c : calls) TC_TRY(issueCall(R, c, P, comm, stream));
  TC_TRY(waitStream(R, stream, fmt("a batch of %zu collectives", calls.size()).c_str()));
  for (const Call& c : calls) {
    std::string wrong;
    uint64_t hash = 0;
    TC_TRY(checkCall(R, c, P, &wrong, &hash));
    t.add(c, wrong, hash);
  }
  return "";
}

// All-reduce gives every rank the same bits: compares the hashes of every all-reduce output with rank 0's.
std::string compareAcrossRanks(Rank& R, mscclppComm_t comm, const Tally& t)
{
  const size_t n = t.allReduceHashes.size();
  if (n == 0 || R.nranks < 2) return "";
  // Shared with the helper thread, which may outlive a timed-out wait.
  auto all = std::make_shared<std::vector<uint64_t>>(n * R.nranks);
  std::copy(t.allReduceHashes.begin(), t.allReduceHashes.end(), all->begin() + R.rank * n);
  const int bytes = (int)(n * sizeof(uint64_t));
  TC_TRY(callBounded(R, "mscclppBootstrapAllGather of the all-reduce results' hashes", R.hostTimeoutS,
                     [comm, all, bytes] { return mscclppBootstrapAllGather(comm, all->data(), bytes); }));
  int differ = 0;
  std::string first;
  for (int r = 1; r < R.nranks; ++r)
    for (size_t i = 0; i < n; ++i)
      if ((*all)[r * n + i] != (*all)[i] && differ++ == 0)
        first = fmt("rank %d's and rank 0's results of %s differ", r, t.allReduceNames[i].c_str());
  if (differ) return fmt("all-reduce results are not bitwise equal on every rank: %d differences, first: %s", differ, first.c_str());
  return "";
}

uint64_t seedOf(uint64_t salt, uint64_t serial) { return mix64(salt * 0x2545F4914F6CDD1Dull + serial); }

Call makeCall(Coll coll, int type, int op, uint64_t count, bool inPlace, int root, uint64_t seed)
{
  Call c;
  c.coll = coll;
  c.type = type;
  c.op = reduces(coll) ? op : -1;
  c.count = count;
  c.inPlace = inPlace;
  c.root = root;
  c.seed = seed;
  return c;
}

// ------------------------------------------------------------------------------------------------
// matrix: every collective x type x operator x placement x count
// ------------------------------------------------------------------------------------------------

struct MatrixSpec
{
  std::vector<int> types, ops;
  std::vector<uint64_t> counts;
};

// The matrix's calls with data, and its broadcasts with data (matrix_sendrecv compares them with the calls
// the library says went as sends and receives: sendRecvCounted).
long long gMatrixCalls = 0, gMatrixBroadcasts = 0;

std::string caseMatrix(Rank& R, const MatrixSpec& spec)
{
  Pools P;
  Tally t;
  uint64_t serial = 0;
  const double t0 = nowSec();
  std::string err;
  for (Coll coll : kColls) {
    for (int type : spec.types) {
      const std::vector<int> ops = reduces(coll) ? spec.ops : std::vector<int>{-1};
      for (int op : ops) {
        // One batch per collective, type and operator: every count, in place and not, queued back to back.
        std::vector<Call> batch;
        for (size_t k = 0; k < spec.counts.size(); ++k) {
          for (int inPlace = 0; inPlace < 2; ++inPlace) {
            Call c = makeCall(coll, type, op, spec.counts[k], inPlace != 0, (int)(serial % R.nranks), seedOf(1, serial));
            ++serial;
            // Half the calls start their buffers off 16-byte boundaries (the kernels' unaligned paths).
            c.sendShift = (int)(k % 2);
            c.recvShift = inPlace ? (int)(k % 2) : (int)((k / 2) % 2);
            gMatrixCalls += c.count > 0;
            gMatrixBroadcasts += c.count > 0 && coll == kBroadcast;
            batch.push_back(c);
          }
        }
        err = runBatch(R, R.comm, R.stream, batch, P, t);
        if (!err.empty()) break;
      }
      if (!err.empty()) break;
    }
    if (!err.empty()) break;
  }
  release(P);
  TC_TRY(err);
  TC_TRY(compareAcrossRanks(R, R.comm, t));
  R.info = fmt("%d calls (%zu all-reduces bitwise equal on every rank) in %.1f s", t.calls, t.allReduceHashes.size(),
               nowSec() - t0);
  return t.verdict();
}

int matrixBody(Rank& R, const char* name)
{
  MatrixSpec spec;
  if (!strcmp(name, "matrix_small")) {
    // A run per collective short enough for compute-sanitizer: both algorithms (70000 float32 elements are
    // above the packet limit), partial units, unaligned buffers.
    spec.types = {mscclppUint8, mscclppInt64, mscclppFloat32, mscclppBfloat16};
    spec.ops = {mscclppSum, mscclppMax};
    spec.counts = {0, 3, 1000, 70000};
    if (R.nranks > 4) {
      // Eight ranks or more take turns on one GPU under the sanitizer: fewer calls, each algorithm still
      // (140000 float32 are above the all-reduce's packet limit; 70000 are below it).
      spec.types = {mscclppUint8, mscclppFloat32};
      spec.ops = {mscclppSum};
      spec.counts = {3, 70000, 140000};
    }
  } else {
    for (int t = 0; t < 10; ++t) spec.types.push_back(t);
    spec.ops = {mscclppSum, mscclppProd, mscclppMax, mscclppMin, mscclppAvg};
    spec.counts = {0, 1, 3, 7, 1000, 65537};
  }
  return runCase(R, name, [&] { return caseMatrix(R, spec); }) ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------
// large: up to 256 MiB, checked on the GPU; then odd counts cut into windows of a 1 MiB scratch
// ------------------------------------------------------------------------------------------------

struct LargeBuffers
{
  DeviceBuffer a, b;
};

std::string verifyLarge(Rank& R, const float* got, uint64_t n, Coll coll, uint64_t count, int root, uint64_t seed)
{
  TC_CUDA(cudaMemsetAsync(R.dVerify, 0, sizeof(unsigned long long), R.stream));
  TC_CUDA(cudaMemsetAsync(R.dVerify + 1, 0xff, sizeof(unsigned long long), R.stream));
  verifyLargeKernel<<<gridFor(n), 256, 0, R.stream>>>(got, n, coll, count, R.nranks, R.rank, root, seed, R.dVerify);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "the check of the output"));
  unsigned long long res[2];
  TC_CUDA(cudaMemcpy(res, R.dVerify, sizeof(res), cudaMemcpyDeviceToHost));
  if (res[0] == 0) return "";
  float g = 0;
  TC_CUDA(cudaMemcpy(&g, got + res[1], sizeof(g), cudaMemcpyDeviceToHost));
  return fmt("%llu of %llu output elements wrong, first element %llu: got %.9g, want %.9g", res[0], (unsigned long long)n,
             res[1], g, largeExpected(coll, res[1], count, R.nranks, R.rank, root, seed));
}

std::string caseLarge(Rank& R, LargeBuffers& B, Coll coll)
{
  const uint64_t whole = (256ull << 20) / sizeof(float); // 256 MiB of float32
  const int n = R.nranks, root = n - 1;
  const uint64_t seed = seedOf(2, coll);
  TC_TRY(ensure(R, B.a, whole * sizeof(float)));
  TC_TRY(ensure(R, B.b, whole * sizeof(float)));
  float* a = (float*)B.a.ptr;
  float* b = (float*)B.b.ptr;
  uint64_t count = 0, inN = 0, outN = 0;
  float *send = nullptr, *recv = nullptr, *input = nullptr;
  switch (coll) {
  case kAllReduce: // out of place
    count = inN = outN = whole;
    send = input = a;
    recv = b;
    break;
  case kAllGather: // in place; 64 MiB per rank at 2 ranks
    count = inN = whole / 2 / n;
    outN = count * n;
    recv = a;
    send = input = a + (uint64_t)R.rank * count;
    break;
  case kReduceScatter: // out of place, 256 MiB of input
    count = outN = whole / n;
    inN = count * n;
    send = input = a;
    recv = b;
    break;
  default: // in place, from the last rank
    count = inN = outN = whole;
    send = recv = input = a;
    break;
  }
  fillInputKernel<<<gridFor(inN), 256, 0, R.stream>>>((char*)input, inN, mscclppFloat32, kGenSum, seed, nullptr, R.rank);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "the fill of the input"));
  const double t0 = nowSec();
  const mscclppResult_t r = collective(coll, send, recv, count, mscclppFloat32, coll == kBroadcast ? root : mscclppSum,
                                       R.comm, R.stream);
  if (r != mscclppSuccess) {
    R.fatal = true;
    return fmt("%s float32 count %llu returned %d (%s)", collName(coll), (unsigned long long)count, (int)r, errStr(r));
  }
  TC_TRY(syncBounded(R, "the collective"));
  const double dt = nowSec() - t0;
  std::string e = verifyLarge(R, recv, outN, coll, count, root, seed);
  if (!e.empty()) return fmt("%s float32 count %llu: %s", collName(coll), (unsigned long long)count, e.c_str());
  R.info = fmt("count %llu, output %s, %.3f s", (unsigned long long)count, sizeName(outN * sizeof(float)).c_str(), dt);
  return "";
}

int largeBody(Rank& R)
{
  LargeBuffers B;
  bool ok = true;
  ok &= runCase(R, "large_allreduce_float32_sum_256MiB", [&] { return caseLarge(R, B, kAllReduce); });
  ok &= runCase(R, "large_allgather_float32_128MiB_output_in_place", [&] { return caseLarge(R, B, kAllGather); });
  ok &= runCase(R, "large_reducescatter_float32_sum_256MiB_input", [&] { return caseLarge(R, B, kReduceScatter); });
  ok &= runCase(R, "large_broadcast_float32_256MiB_in_place", [&] { return caseLarge(R, B, kBroadcast); });
  cudaFree(B.a.ptr);
  cudaFree(B.b.ptr);
  return ok ? 0 : 1;
}

// One checked call per case, each larger than a window of the 1 MiB scratch (MSCCLPP_COLL_SCRATCH_MB=1),
// with odd counts: several launches per call, the last window partial.
int windowsBody(Rank& R, bool packetsForced)
{
  const int n = R.nranks;
  std::vector<Call> calls;
  if (!packetsForced) {
    calls = {
      makeCall(kAllReduce, mscclppFloat32, mscclppSum, 1000003, false, 0, 0),   // copies, ~11 windows
      makeCall(kAllReduce, mscclppBfloat16, mscclppAvg, 500001, true, 0, 0),    // copies
      makeCall(kAllReduce, mscclppFloat16, mscclppSum, 65531, false, 0, 0),     // packets, several windows
      makeCall(kAllReduce, mscclppInt64, mscclppMax, 32001, true, 0, 0),        // packets, several windows
      makeCall(kAllGather, mscclppUint8, -1, 1000001, false, 0, 0),             // copies
      makeCall(kAllGather, mscclppFloat64, -1, 8191, true, 0, 0),               // packets at 2 ranks
      makeCall(kReduceScatter, mscclppInt32, mscclppSum, 300007, false, 0, 0),  // copies
      makeCall(kReduceScatter, mscclppFloat32, mscclppMin, 10007, true, 0, 0),  // packets
      makeCall(kBroadcast, mscclppInt8, -1, 3000001, false, 0, 0),              // copies
      makeCall(kBroadcast, mscclppFloat16, -1, 30001, true, n - 1, 0),          // packets
    };
  } else {
    // MSCCLPP_COLL_ALGO=packet: packets however large (128 KiB windows or smaller).
    calls = {
      makeCall(kAllReduce, mscclppUint64, mscclppSum, 100001, false, 0, 0),
      makeCall(kAllGather, mscclppUint8, -1, 300001, true, 0, 0),
      makeCall(kReduceScatter, mscclppFloat16, mscclppAvg, 100001, false, 0, 0),
      makeCall(kBroadcast, mscclppFloat32, -1, 100003, false, n - 1, 0),
    };
  }
  Pools P;
  bool ok = true;
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& c = calls[i];
    c.seed = seedOf(packetsForced ? 4 : 3, i);
    c.sendShift = (int)(i % 2);
    c.recvShift = (int)((i / 2) % 2);
    const std::string name = fmt("%s_%s_%s%s%llu_%s", packetsForced ? "windows_packet" : "windows", collName(c.coll),
                                 typeName(c.type), reduces(c.coll) ? fmt("%s_", opName(c.op)).c_str() : "",
                                 (unsigned long long)c.count, c.inPlace ? "in_place" : "out_of_place");
    ok &= runCase(R, name, [&]() -> std::string {
      std::vector<Call> one = {c};
      Tally t;
      const double t0 = nowSec();
      TC_TRY(runBatch(R, R.comm, R.stream, one, P, t));
      TC_TRY(compareAcrossRanks(R, R.comm, t));
      R.info = fmt("%.3f s", nowSec() - t0);
      return t.verdict();
    });
  }
  release(P);
  return ok ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------
// graph: captured collectives, replayed with fresh data each time
// ------------------------------------------------------------------------------------------------

// Captures [fill + call] for every call and a bump of the replay counter, replays the graph `replays` times,
// checks every call after each of the first `checkedReplays` replays and after the last (replays in between
// run back to back), then frees everything. Call k of replay i has seed c.seed + i.
// Which of a rank's pools it registers.
enum ZcRegister { kZcNone = 0, kZcSend = 1, kZcRecv = 2, kZcBoth = 3 };

std::string registerPools(mscclppComm_t comm, Pools& P, int which)
{
  if (which & kZcSend) TC_EXPECT(mscclppCommRegister(comm, P.send.ptr, P.send.bytes, &P.sendHandle) == mscclppSuccess, "registering the send pool failed");
  if (which & kZcRecv) TC_EXPECT(mscclppCommRegister(comm, P.recv.ptr, P.recv.bytes, &P.recvHandle) == mscclppSuccess, "registering the receive pool failed");
  return "";
}

std::string deregisterPools(mscclppComm_t comm, Pools& P)
{
  if (P.sendHandle) TC_EXPECT(mscclppCommDeregister(comm, P.sendHandle) == mscclppSuccess, "deregistering the send pool failed");
  if (P.recvHandle) TC_EXPECT(mscclppCommDeregister(comm, P.recvHandle) == mscclppSuccess, "deregistering the receive pool failed");
  P.sendHandle = P.recvHandle = nullptr;
  return "";
}

// Calls whose every buffer that a peer touches is registered on its rank: the only ones that may go
// zero-copy (zeroCopyCounted).
long long gZcEligible = 0;

// Whether runGraph registers its pools (with its communicator) before the capture: the zerocopy group's.
// Every replayed call is then eligible for zero-copy.
bool gGraphRegisters = false;

std::string runGraph(Rank& R, mscclppComm_t comm, cudaStream_t stream, std::vector<Call>& calls, int replays,
                     int checkedReplays, Tally& t)
{
  Pools P;
  uint64_t* counter = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string err = [&]() -> std::string {
    size_t sendBytes = 0;
    const size_t recvBytes = planCalls(calls, R.nranks, &sendBytes);
    TC_TRY(ensure(R, P.send, sendBytes));
    TC_TRY(ensure(R, P.recv, recvBytes));
    if (gGraphRegisters) {
      TC_TRY(registerPools(comm, P, kZcBoth));
      gZcEligible += (long long)calls.size() * replays;
      // Every rank's registration has reached the others before the capture (the records travel ahead of
      // the barrier's messages), so the captured calls find every mapping.
      TC_TRY(oobBarrier(R, "after registering the graph's pools"));
    }
    TC_CUDA(cudaMalloc((void**)&counter, sizeof(uint64_t)));
    TC_CUDA(cudaMemsetAsync(counter, 0, sizeof(uint64_t), stream));
    TC_CUDA(cudaMemsetAsync(P.recv.ptr, kSentinel, recvBytes, stream));
    TC_TRY(waitStream(R, stream, "the set-up of the graph's buffers"));

    // Global mode: the strictest; the library must relax it itself where its first call needs to.
    TC_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    std::string captureErr;
    for (const Call& c : calls) {
      captureErr = issueCall(R, c, P, comm, stream, counter);
      if (!captureErr.empty()) break;
    }
    if (captureErr.empty()) {
      bumpKernel<<<1, 1, 0, stream>>>(counter);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) captureErr = fmt("launch of the bump kernel in the capture: %s", cudaGetErrorString(e));
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t endErr = cudaStreamEndCapture(stream, &graph);
    if (captureErr.empty() && endErr != cudaSuccess) captureErr = fmt("cudaStreamEndCapture: %s", cudaGetErrorString(endErr));
    if (captureErr.empty() && graph) {
      const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
      if (e != cudaSuccess) captureErr = fmt("cudaGraphInstantiate: %s", cudaGetErrorString(e));
    }
    if (graph) cudaGraphDestroy(graph);
    if (!captureErr.empty()) {
      R.fatal = true;
      return captureErr;
    }

    // Replays queued back to back are waited for one by one, each with the deadline of one: a hang is a
    // replay that never ends, however long the queue (16 ranks on one GPU take over a second a replay).
    std::vector<cudaEvent_t> done(replays, nullptr);
    for (cudaEvent_t& e : done) TC_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    struct Events
    {
      std::vector<cudaEvent_t>& v;
      ~Events()
      {
        for (cudaEvent_t e : v) cudaEventDestroy(e);
      }
    } destroyEvents{done};
    int waited = -1;
    for (int i = 0; i < replays; ++i) {
      TC_CUDA(cudaGraphLaunch(exec, stream));
      TC_CUDA(cudaEventRecord(done[i], stream));
      if (i >= checkedReplays && i != replays - 1) continue;
      for (++waited; waited <= i; ++waited)
        TC_TRY(waitStream(R, stream, fmt("replay %d of the graph", waited).c_str(), done[waited]));
      waited = i;
      for (const Call& c : calls) {
        Call replayed = c;
        replayed.seed = c.seed + (uint64_t)i;
        std::string wrong;
        uint64_t hash = 0;
        TC_TRY(checkCall(R, replayed, P, &wrong, &hash));
        t.add(replayed, wrong.empty() ? "" : fmt("replay %d: %s", i, wrong.c_str()), hash);
      }
    }
    return "";
  }();
  if (err.empty() || !R.fatal) {
    if (exec) cudaGraphExecDestroy(exec);
    if (counter) cudaFree(counter);
    const std::string deregistered = deregisterPools(comm, P);
    if (err.empty()) err = deregistered;
    release(P);
  }
  return err;
}

// A plain (not captured) call after graphs on the same communicator: the kernels' epoch, kept on the GPU,
// went on counting through the replays.
std::string eagerAfterGraph(Rank& R, mscclppComm_t comm, cudaStream_t stream, Tally& t)
{
  std::vector<Call> calls = {makeCall(kAllReduce, mscclppFloat32, mscclppSum, 1000, false, 0, seedOf(5, t.calls)),
                             makeCall(kBroadcast, mscclppInt32, -1, 100001, true, 0, seedOf(6, t.calls))};
  Pools P;
  std::string e = runBatch(R, comm, stream, calls, P, t);
  release(P);
  return e;
}

std::string initSecondComm(Rank& R, mscclppComm_t* out)
{
  auto slot = std::make_shared<mscclppComm_t>(nullptr);
  const std::string addr = fmt("127.0.0.1:%d", R.port + 1);
  const int n = R.nranks, rank = R.rank;
  TC_TRY(callBounded(R, "mscclppCommInitRank of a second communicator", R.hostTimeoutS,
                     [slot, addr, n, rank] { return mscclppCommInitRank(slot.get(), n, addr.c_str(), rank); }));
  *out = *slot;
  return "";
}

std::string destroySecondComm(Rank& R, mscclppComm_t comm)
{
  TC_TRY(callBounded(R, "mscclppCommDestroy of the second communicator", R.hostTimeoutS,
                     [comm] { return mscclppCommDestroy(comm); }));
  return oobBarrier(R, "after destroying the second communicator");
}

std::string caseGraphFirstCall(Rank& R)
{
  // R.comm has made no collective call yet: its set-up (scratch, peers' mappings, kernels) happens in the
  // capture, and the moving kernels load in it too.
  const int n = R.nranks;
  std::vector<Call> calls = {
    makeCall(kAllReduce, mscclppFloat32, mscclppSum, 1000, false, 0, seedOf(7, 0)),
    makeCall(kAllGather, mscclppFloat16, -1, 777, true, 0, seedOf(7, 1)),
    makeCall(kReduceScatter, mscclppInt32, mscclppMax, 333, false, 0, seedOf(7, 2)),
    makeCall(kBroadcast, mscclppUint64, -1, 99, false, n - 1, seedOf(7, 3)),
  };
  Tally t;
  TC_TRY(runGraph(R, R.comm, R.stream, calls, 5, 5, t));
  TC_TRY(eagerAfterGraph(R, R.comm, R.stream, t));
  TC_TRY(compareAcrossRanks(R, R.comm, t));
  R.info = fmt("%d checked results", t.calls);
  return t.verdict();
}

std::string caseGraphBlockingStream(Rank& R)
{
  // A fresh communicator whose first call is captured on a blocking stream: a blocking stream's capture is
  // invalidated by any use of the legacy default stream, which the set-up must therefore not touch.
  mscclppComm_t comm = nullptr;
  TC_TRY(initSecondComm(R, &comm));
  cudaStream_t stream = nullptr;
  TC_CUDA(cudaStreamCreate(&stream));
  const int n = R.nranks;
  std::vector<Call> calls = {
    makeCall(kAllReduce, mscclppBfloat16, mscclppMax, 4099, true, 0, seedOf(8, 0)),
    makeCall(kBroadcast, mscclppInt64, -1, 1001, false, n - 1, seedOf(8, 1)),
    makeCall(kReduceScatter, mscclppUint8, mscclppSum, 513, true, 0, seedOf(8, 2)),
    makeCall(kAllReduce, mscclppFloat64, mscclppAvg, 70001, false, 0, seedOf(8, 3)), // copies, 2 windows
  };
  Tally t;
  TC_TRY(runGraph(R, comm, stream, calls, 5, 5, t));
  TC_TRY(eagerAfterGraph(R, comm, stream, t));
  TC_TRY(compareAcrossRanks(R, comm, t));
  TC_TRY(waitStream(R, stream, "the blocking stream before destroy"));
  TC_CUDA(cudaStreamDestroy(stream));
  TC_TRY(destroySecondComm(R, comm));
  R.info = fmt("%d checked results", t.calls);
  return t.verdict();
}

std::string caseGraphMixed(Rank& R)
{
  const int n = R.nranks;
  std::vector<Call> calls = {
    makeCall(kAllReduce, mscclppFloat32, mscclppSum, 1000, false, 0, 0),       // packets, one window
    makeCall(kAllReduce, mscclppFloat32, mscclppSum, 1000003, false, 0, 0),    // copies, ~11 windows
    makeCall(kAllReduce, mscclppFloat32, mscclppAvg, 60000, true, 0, 0),       // packets, 4 to 8 windows
    makeCall(kAllGather, mscclppInt32, -1, 100, false, 0, 0),
    makeCall(kReduceScatter, mscclppFloat64, mscclppMin, 50001, false, 0, 0),
    makeCall(kBroadcast, mscclppUint8, -1, 100003, true, 1 % n, 0),
    makeCall(kAllReduce, mscclppInt64, mscclppProd, 7, true, 0, 0),
    makeCall(kAllGather, mscclppBfloat16, -1, 70001, true, 0, 0),
    makeCall(kReduceScatter, mscclppFloat16, mscclppSum, 3001, true, 0, 0),
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i].seed = seedOf(9, i);
    calls[i].sendShift = (int)(i % 2);
  }
  Tally t;
  TC_TRY(runGraph(R, R.comm, R.stream, calls, 50, 10, t));
  TC_TRY(eagerAfterGraph(R, R.comm, R.stream, t));
  TC_TRY(compareAcrossRanks(R, R.comm, t));
  R.info = fmt("50 replays of %zu collectives; %d checked results", calls.size(), t.calls);
  return t.verdict();
}

int graphBody(Rank& R)
{
  bool ok = true;
  // First: it needs a communicator that has made no collective call.
  ok &= runCase(R, "graph_first_call_captured", [&] { return caseGraphFirstCall(R); });
  ok &= runCase(R, "graph_first_call_captured_blocking_stream", [&] { return caseGraphBlockingStream(R); });
  ok &= runCase(R, "graph_mixed_replayed_50_times", [&] { return caseGraphMixed(R); });
  return ok ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------
// sizes: back-to-back calls of changing kinds and sizes
// ------------------------------------------------------------------------------------------------

std::string caseSizes(Rank& R)
{
  // Around the packet limits (64 KiB broadcast, 256 KiB all-gather and reduce-scatter, 512 KiB all-reduce)
  // and the 16-byte units.
  const uint64_t bytes[] = {1,     2,     3,     8,      15,     16,     17,     100,    255,     1000,    4096,
                            4097,  65535, 65536, 65537,  131072, 262143, 262144, 262145, 524288, 524289, 1000001,
                            1048576};
  const size_t nBytes = sizeof(bytes) / sizeof(bytes[0]);
  const int n = R.nranks;
  Pools P;
  Tally t;
  const double t0 = nowSec();
  std::string err;
  for (int pass = 0; pass < 2 && err.empty(); ++pass) {
    // The second pass writes the same buffers with other data: a call that wrote nothing leaves the first
    // pass's results, which no longer match.
    std::vector<Call> calls;
    for (int i = 0; i < 200; ++i) {
      const Coll coll = kColls[i % 4];
      const int type = (i * 7 + pass) % 10;
      const uint64_t b = bytes[(i / 4 + i) % nBytes];
      const uint64_t elems = std::max<uint64_t>(1, b / typeSize(type));
      const uint64_t count = coll == kAllGather || coll == kReduceScatter ? std::max<uint64_t>(1, elems / n) : elems;
      Call c = makeCall(coll, type, (i * 3) % 5, count, i % 3 == 1, i % n, seedOf(10 + pass, i));
      c.sendShift = (i / 3) % 2;
      c.recvShift = (i / 5) % 2;
      calls.push_back(c);
    }
    err = runBatch(R, R.comm, R.stream, calls, P, t);
  }
  release(P);
  TC_TRY(err);
  TC_TRY(compareAcrossRanks(R, R.comm, t));
  R.info = fmt("2 x 200 calls, 1 B to 1 MiB, in %.1f s", nowSec() - t0);
  return t.verdict();
}

int sizesBody(Rank& R) { return runCase(R, "sizes_200_calls_back_to_back", [&] { return caseSizes(R); }) ? 0 : 1; }

// ------------------------------------------------------------------------------------------------
// zerocopy: the matrix on registered buffers (MSCCLPP_COLL_ALGO=zerocopy: every size tries zero-copy)
// ------------------------------------------------------------------------------------------------

constexpr size_t kZcPoolBytes = 96ull << 20;


// Every collective x type (5 of them) x operator (sum, max) x placement x count, on pools of fixed size,
// `rounds` times over (later rounds find every peer's mapping in place). `eligible` says which calls may go
// zero-copy with the pools registered as they are.
// zerocopy_small (for compute-sanitizer): 2 types and 3 counts.
bool gZcSmall = false;
// Eager all-gathers and broadcasts among the eligible calls: those the copy engine takes under
// MSCCLPP_COLL_ALGO=copyengine.
long long gCeEligible = 0;
// The copyengine group: its all-gathers and broadcasts write the peers' outputs, so a registered output
// is all they need.
bool gCopyEngine = false;

std::string zcMatrix(Rank& R, Pools& P, Tally& t, int rounds, const std::function<bool(const Call&)>& eligible)
{
  std::vector<int> types{mscclppUint8, mscclppInt32, mscclppFloat32, mscclppFloat16, mscclppBfloat16};
  std::vector<uint64_t> counts{1, 7, 1000, 65537, 262147};
  if (gZcSmall) {
    types = {mscclppUint8, mscclppFloat32};
    counts = {7, 1000, 65537};
  }
  uint64_t serial = 0;
  for (int round = 0; round < rounds; ++round)
    for (Coll coll : kColls)
      for (int type : types) {
        std::vector<int> ops{-1};
        if (reduces(coll)) ops = {mscclppSum, mscclppMax};
        for (int op : ops) {
          std::vector<Call> batch;
          for (size_t k = 0; k < counts.size(); ++k)
            for (int inPlace = 0; inPlace < 2; ++inPlace) {
              Call c = makeCall(coll, type, op, counts[k], inPlace != 0, (int)(serial % R.nranks), seedOf(7, serial));
              ++serial;
              c.sendShift = (int)(k % 2);
              c.recvShift = inPlace ? (int)(k % 2) : (int)((k / 2) % 2);
              gZcEligible += eligible(c) ? 1 : 0;
              gCeEligible += eligible(c) && (coll == kAllGather || coll == kBroadcast) ? 1 : 0;
              batch.push_back(c);
            }
          TC_TRY(runBatch(R, R.comm, R.stream, batch, P, t));
        }
      }
  return "";
}

std::string zcAllocate(Rank& R, Pools& P)
{
  TC_TRY(ensure(R, P.send, kZcPoolBytes));
  TC_TRY(ensure(R, P.recv, kZcPoolBytes));
  return "";
}

// One case of the group: the pools registered as `which` says on the ranks `registers` picks, the matrix
// twice (once from eight ranks); then deregistered and freed.
std::string caseZeroCopy(Rank& R, int which, bool (*registers)(int rank), const std::function<bool(const Call&)>& eligible,
                         const char* what)
{
  Pools P;
  Tally t;
  const double t0 = nowSec();
  TC_TRY(zcAllocate(R, P));
  if (registers(R.rank)) TC_TRY(registerPools(R.comm, P, which));
  // Eight ranks or more take turns on the GPUs (about 30 ms a call at 16 on two): one round there, which
  // still has every call after the first few find its peers' mappings; fewer ranks check the second round.
  std::string err = zcMatrix(R, P, t, R.nranks >= 8 ? 1 : 2, eligible);
  if (err.empty()) err = deregisterPools(R.comm, P);
  release(P);
  TC_TRY(err);
  TC_TRY(compareAcrossRanks(R, R.comm, t));
  R.info = fmt("%s: %d calls (%zu all-reduces bitwise equal on every rank) in %.1f s", what, t.calls,
               t.allReduceHashes.size(), nowSec() - t0);
  return t.verdict();
}

// Registered, then freed without deregistering and allocated again (perhaps at the same address: the
// registration is then stale, never used), then deregistered, freed, allocated and registered afresh.
std::string caseZeroCopyReuse(Rank& R)
{
  Pools P;
  Tally t;
  TC_TRY(zcAllocate(R, P));
  const auto every = [](const Call&) { return true; };
  TC_TRY(registerPools(R.comm, P, kZcBoth));
  TC_TRY(zcMatrix(R, P, t, 1, every));
  TC_TRY(waitStream(R, R.stream, "before freeing the registered pools"));
  const Pools freed = P;
  release(P);
  TC_TRY(zcAllocate(R, P));
  const bool sameAddress = freed.send.ptr == P.send.ptr;
  // The registrations (of the freed pools, deregistered below) are stale now: nothing may go zero-copy.
  P.sendHandle = freed.sendHandle;
  P.recvHandle = freed.recvHandle;
  std::string err = zcMatrix(R, P, t, 1, [](const Call&) { return false; });
  if (err.empty()) err = deregisterPools(R.comm, P);
  if (err.empty()) err = waitStream(R, R.stream, "before freeing the pools again");
  release(P);
  TC_TRY(err);
  TC_TRY(zcAllocate(R, P));
  TC_TRY(registerPools(R.comm, P, kZcBoth));
  err = zcMatrix(R, P, t, 2, every);
  if (err.empty()) err = deregisterPools(R.comm, P);
  release(P);
  TC_TRY(err);
  TC_TRY(compareAcrossRanks(R, R.comm, t));
  R.info = fmt("%d calls; the send pool came back %s", t.calls, sameAddress ? "at the same address" : "elsewhere");
  return t.verdict();
}

bool everyRank(int) { return true; }
bool rankZeroOnly(int rank) { return rank == 0; }

// The count of zero-copy calls the library logged at destroy (INFO), or -1 without that line.
long long zcCallsLogged(const char* what = " call(s) moved their data zero-copy")
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  for (const std::string& line : gLog) {
    const size_t at = line.find(what);
    if (at == std::string::npos) continue;
    size_t start = at;
    while (start > 0 && isdigit((unsigned char)line[start - 1])) --start;
    return atoll(line.substr(start, at - start).c_str());
  }
  return -1;
}

int zeroCopyBody(Rank& R, const char* name)
{
  bool ok = true;
  if (!strcmp(name, "zerocopy") || !strcmp(name, "copyengine")) {
    ok &= runCase(R, "zerocopy_registered_everywhere", [&] {
      return caseZeroCopy(R, kZcBoth, everyRank, [](const Call&) { return true; }, "both pools on every rank");
    });
    // The kernels of all-reduce, reduce-scatter and broadcast read the peers' inputs, which are in the send
    // pool but for calls in place; all-gather's kernel and the copy engine write the peers' outputs.
    ok &= runCase(R, "zerocopy_outputs_only", [&] {
      return caseZeroCopy(
          R, kZcRecv, everyRank,
          [](const Call& c) { return c.inPlace || c.coll == kAllGather || (gCopyEngine && c.coll == kBroadcast); },
          "the receive pool only");
    });
    ok &= runCase(R, "zerocopy_freed_and_reused", [&] { return caseZeroCopyReuse(R); });
    // The mixed graph (9 calls, 50 replays) on registered pools.
    ok &= runCase(R, "zerocopy_graph_replayed", [&] {
      gGraphRegisters = true;
      const std::string e = caseGraphMixed(R);
      gGraphRegisters = false;
      return e;
    });
  } else if (!strcmp(name, "zerocopy_small") || !strcmp(name, "copyengine_small")) {
    gZcSmall = true;
    ok &= runCase(R, "zerocopy_small_registered_everywhere", [&] {
      return caseZeroCopy(R, kZcBoth, everyRank, [](const Call&) { return true; }, "both pools on every rank");
    });
  } else {
    // A broadcast reads its root's input alone.
    ok &= runCase(R, "zerocopy_rank0_only", [&] {
      return caseZeroCopy(R, kZcBoth, rankZeroOnly, [](const Call& c) { return c.coll == kBroadcast && c.root == 0; },
                          "rank 0 alone registers");
    });
  }
  return ok ? 0 : 1;
}

// After the group's teardown: the library said how many calls went zero-copy. Never more than the eligible
// ones (a call that needs an unregistered buffer must not), and most of them: only a call made before a
// peer's new registration reached this rank may take the scratch path (at most a few per registration).
bool zeroCopyCounted(Rank& R, const char* name)
{
  return runCase(R, fmt("%s_counted", name), [&]() -> std::string {
    const long long n = std::max(zcCallsLogged(), 0ll);
    TC_EXPECT(n <= gZcEligible, "%lld calls went zero-copy, but only %lld had every buffer they need registered", n,
              gZcEligible);
    TC_EXPECT(n >= gZcEligible * 9 / 10, "only %lld of %lld eligible calls went zero-copy", n, gZcEligible);
    R.info = fmt("%lld of %lld eligible calls zero-copy", n, gZcEligible);
    if (strncmp(name, "copyengine", 10) != 0) return "";
    const long long ce = std::max(zcCallsLogged(" call(s) moved their data by the copy engine"), 0ll);
    TC_EXPECT(ce <= gCeEligible, "%lld calls went by the copy engine, but only %lld eager all-gathers and broadcasts "
              "had their inputs registered", ce, gCeEligible);
    TC_EXPECT(ce >= gCeEligible * 9 / 10, "only %lld of %lld eligible all-gathers and broadcasts went by the copy engine",
              ce, gCeEligible);
    R.info += fmt(", %lld of %lld eligible all-gathers and broadcasts by the copy engine", ce, gCeEligible);
    return "";
  });
}

// After matrix_sendrecv's teardown: the library said how many calls went as sends and receives. Between two
// ranks every collective goes so; among more, at least the broadcasts (a chain), at most every call.
bool sendRecvCounted(Rank& R, const char* name)
{
  return runCase(R, fmt("%s_counted", name), [&]() -> std::string {
    const long long n = std::max(zcCallsLogged(" call(s) went as sends and receives"), 0ll);
    const long long least = R.nranks == 2 ? gMatrixCalls : gMatrixBroadcasts;
    TC_EXPECT(n >= least && n <= gMatrixCalls, "%lld calls went as sends and receives, not within [%lld, %lld]", n,
              least, gMatrixCalls);
    R.info = fmt("%lld of %lld calls with data as sends and receives", n, gMatrixCalls);
    return "";
  });
}

// ------------------------------------------------------------------------------------------------
// args: bad input on a GPU
// ------------------------------------------------------------------------------------------------

bool logMentions(size_t from, const std::string& a, const std::string& b)
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  for (size_t i = from; i < gLog.size(); ++i)
    if (gLog[i].find(a) != std::string::npos && gLog[i].find(b) != std::string::npos) return true;
  return false;
}

// Whether the library logs at WARN here (MSCCLPP_DEBUG may turn that off).
bool warningsLogged()
{
  const char* level = getenv("MSCCLPP_DEBUG");
  if (!level) return true;
  for (const char* l : {"WARN", "INFO", "DEBUG", "TRACE"})
    if (!strcasecmp(level, l)) return true;
  return false;
}

struct Rejection
{
  std::string name;
  std::function<mscclppResult_t()> call;
  mscclppResult_t want;
  std::string function, argument; // what the log line must name
};

std::string expectRejections(Rank& R, const std::vector<Rejection>& list)
{
  const bool checkLog = warningsLogged();
  int bad = 0;
  std::string why;
  for (const Rejection& x : list) {
    const size_t mark = logCount();
    const double t0 = nowSec();
    const mscclppResult_t got = x.call();
    const double dt = nowSec() - t0;
    const cudaError_t cudaErr = cudaGetLastError();
    std::string w;
    if (got != x.want)
      w = fmt("returned %d (%s), want %d (%s)", (int)got, errStr(got), (int)x.want, errStr(x.want));
    else if (cudaErr != cudaSuccess)
      w = fmt("left a CUDA error behind: %s", cudaGetErrorString(cudaErr));
    else if (dt > 5)
      w = fmt("took %.1f s", dt);
    else if (checkLog && x.want != mscclppSuccess && !logMentions(mark, x.function, x.argument))
      w = fmt("no log line names %s and \"%s\"", x.function.c_str(), x.argument.c_str());
    if (!w.empty() && bad++ < 3) why += fmt("%s%s: %s", why.empty() ? "" : "; ", x.name.c_str(), w.c_str());
  }
  mscclppResult_t async = mscclppSuccess;
  TC_MSCCLPP(mscclppCommGetAsyncError(R.comm, &async));
  if (async != mscclppSuccess) return fmt("bad arguments left the communicator failed: async error %d (%s)", (int)async, errStr(async));
  if (bad) return fmt("%d of %zu calls not as documented: %s", bad, list.size(), why.c_str());
  R.info = fmt("%zu calls, each as documented", list.size());
  return "";
}

struct ArgBuffers
{
  char* big = nullptr;   // 1 MiB of device memory: large enough for every call below
  char* small = nullptr; // 4096 bytes of device memory
  char* host = nullptr;  // malloc
  char* pinned = nullptr;
  char* otherGpu = nullptr;      // device memory of another GPU (with 2 GPUs or more)
  cudaStream_t otherStream = nullptr;
};

// Every call here is refused on every rank before any GPU work, so none of them leaves a peer waiting in a
// kernel (broadcasts make each rank its own root, so that their sendbuff is checked everywhere).
std::vector<Rejection> rejections(Rank& R, const ArgBuffers& b, mscclppComm_t comm)
{
  const mscclppResult_t ARG = mscclppInvalidArgument;
  const int me = R.rank, n = R.nranks;
  cudaStream_t s = R.stream;
  const size_t tooMany = 1025; // floats: 4100 bytes, past the small buffer's 4096
  std::vector<Rejection> list;
  for (Coll coll : kColls) {
    const std::string fn = coll == kAllReduce ? "mscclppAllReduce" : coll == kAllGather ? "mscclppAllGather"
                         : coll == kReduceScatter ? "mscclppReduceScatter" : "mscclppBroadcast";
    const char* countName = coll == kAllGather ? "sendcount" : coll == kReduceScatter ? "recvcount" : "count";
    const int opOrRoot = coll == kBroadcast ? me : (int)mscclppSum;
    auto add = [&](const std::string& what, const void* send, void* recv, size_t count, int type, int opRoot,
                   mscclppComm_t c, cudaStream_t st, mscclppResult_t want, const char* argument) {
      list.push_back({fmt("%s(%s)", fn.c_str(), what.c_str()),
                      [=] { return collective(coll, send, recv, count, type, opRoot, c, st); }, want, fn, argument});
    };
    const int f32 = mscclppFloat32;
    add("malloc sendbuff", b.host, b.big, 16, f32, opOrRoot, comm, s, ARG, "sendbuff");
    add("malloc recvbuff", b.big, b.host, 16, f32, opOrRoot, comm, s, ARG, "recvbuff");
    add("pinned host sendbuff", b.pinned, b.big, 16, f32, opOrRoot, comm, s, ARG, "sendbuff");
    add("pinned host recvbuff", b.big, b.pinned, 16, f32, opOrRoot, comm, s, ARG, "recvbuff");
    add("sendbuff too small", b.small, b.big, tooMany, f32, opOrRoot, comm, s, ARG, "sendbuff");
    add("recvbuff too small", b.big, b.small, tooMany, f32, opOrRoot, comm, s, ARG, "recvbuff");
    // The output's last element runs 4 bytes past the end of the 4096-byte allocation.
    add("recvbuff 4 bytes short", b.big, b.small + 4096 - 4 - (coll == kAllGather ? 8 * (n - 1) : 0), 2, f32, opOrRoot,
        comm, s, ARG, "recvbuff");
    add("sendbuff NULL", nullptr, b.big, 16, f32, opOrRoot, comm, s, ARG, "sendbuff");
    add("recvbuff NULL", b.big, nullptr, 16, f32, opOrRoot, comm, s, ARG, "recvbuff");
    add("datatype 42", b.big, b.big, 16, 42, opOrRoot, comm, s, ARG, "datatype");
    add("datatype -1", b.big, b.big, 16, -1, opOrRoot, comm, s, ARG, "datatype");
    add(fmt("%s overflows", countName), b.big, b.big, SIZE_MAX / 4 + 1, f32, opOrRoot, comm, s, ARG, countName);
    add(fmt("%s x 8 bytes overflows", countName), b.big, b.big, SIZE_MAX / 8 + 1, mscclppFloat64, opOrRoot, comm, s, ARG,
        countName);
    if (reduces(coll)) {
      add("op 9", b.big, b.big, 16, f32, 9, comm, s, ARG, "op");
      add("op -1", b.big, b.big, 16, f32, -1, comm, s, ARG, "op");
    } else if (coll == kBroadcast) {
      add("root -1", b.big, b.big, 16, f32, -1, comm, s, ARG, "root");
      add(fmt("root %d of %d", n, n), b.big, b.big, 16, f32, n, comm, s, ARG, "root");
    }
    if (b.otherGpu) {
      add("sendbuff on another GPU", b.otherGpu, b.big, 16, f32, opOrRoot, comm, s, ARG, "sendbuff");
      add("recvbuff on another GPU", b.big, b.otherGpu, 16, f32, opOrRoot, comm, s, ARG, "recvbuff");
      add("stream of another GPU", b.big, b.big, 16, f32, opOrRoot, comm, b.otherStream, ARG, "stream");
    }
    add("comm NULL", b.big, b.big, 16, f32, opOrRoot, nullptr, s, ARG, "comm");
    // Count 0 does nothing, whatever the buffers (this rank's root included).
    add("count 0, NULL buffers", nullptr, nullptr, 0, f32, opOrRoot, comm, s, mscclppSuccess, "");
    add("count 0, malloc buffers", b.host, b.host, 0, mscclppInt8, opOrRoot, comm, s, mscclppSuccess, "");
  }
  return list;
}

// Valid calls of every kind after the refused ones, checked; the broadcast's non-roots pass sendbuff = NULL
// (only the root's is read).
std::string validAfterRejections(Rank& R, uint64_t salt)
{
  const int n = R.nranks;
  std::vector<Call> calls = {
    makeCall(kAllReduce, mscclppFloat32, mscclppSum, 1000, false, 0, seedOf(salt, 0)),
    makeCall(kAllGather, mscclppInt8, -1, 333, true, 0, seedOf(salt, 1)),
    makeCall(kReduceScatter, mscclppBfloat16, mscclppMax, 70001, false, 0, seedOf(salt, 2)),
    makeCall(kBroadcast, mscclppInt32, -1, 1000, false, n - 1, seedOf(salt, 3)),
  };
  calls[3].nullSendOffRoot = true;
  Pools P;
  Tally t;
  std::string e = runBatch(R, R.comm, R.stream, calls, P, t);
  release(P);
  TC_TRY(e);
  R.info = "each collective right, the broadcast with sendbuff = NULL off the root";
  return t.verdict();
}

std::string caseDestroyedComm(Rank& R, const ArgBuffers& b)
{
  mscclppComm_t comm = nullptr;
  TC_TRY(initSecondComm(R, &comm));
  // Set its collectives up (scratch, peers' mappings) so that destroy has them to free.
  const mscclppResult_t r = mscclppAllReduce(b.big, b.big, 1000, mscclppInt32, mscclppSum, comm, R.stream);
  if (r != mscclppSuccess) {
    R.fatal = true;
    return fmt("an all-reduce on the second communicator returned %d (%s)", (int)r, errStr(r));
  }
  TC_TRY(syncBounded(R, "the all-reduce on the second communicator"));
  TC_TRY(destroySecondComm(R, comm));
  std::vector<Rejection> list;
  for (Coll coll : kColls) {
    list.push_back({fmt("%s(destroyed comm)", collName(coll)),
                    [=] { return collective(coll, b.big, b.big, 16, mscclppFloat32, coll == kBroadcast ? 0 : mscclppSum,
                                            comm, R.stream); },
                    mscclppInvalidUsage, coll == kAllReduce ? "mscclppAllReduce" : coll == kAllGather ? "mscclppAllGather"
                                         : coll == kReduceScatter ? "mscclppReduceScatter" : "mscclppBroadcast",
                    "comm"});
  }
  return expectRejections(R, list);
}

int argsBody(Rank& R)
{
  gLogRank = R.rank;
  mscclppSetLogHandler(captureLog);
  ArgBuffers b;
  bool ok = runCase(R, "args_buffers", [&]() -> std::string {
    TC_CUDA(cudaMalloc((void**)&b.big, 1 << 20));
    TC_CUDA(cudaMemset(b.big, 0, 1 << 20));
    TC_CUDA(cudaMalloc((void**)&b.small, 4096));
    TC_CUDA(cudaMallocHost((void**)&b.pinned, 1 << 20));
    b.host = (char*)malloc(1 << 20);
    TC_EXPECT(b.host, "malloc failed");
    if (R.nGpus > 1) {
      const int other = (R.device + 1) % R.nGpus;
      TC_CUDA(cudaSetDevice(other));
      TC_CUDA(cudaMalloc((void**)&b.otherGpu, 1 << 20));
      TC_CUDA(cudaStreamCreateWithFlags(&b.otherStream, cudaStreamNonBlocking));
      TC_CUDA(cudaSetDevice(R.device));
    }
    return "";
  });
  if (!ok) return 1;
  if (!b.otherGpu && R.rank == 0) {
    printf("SKIP args_other_gpu: %d GPU visible; a buffer and a stream of another GPU need 2\n", R.nGpus);
    fflush(stdout);
  }
  // Before the first valid call (no collective set-up yet), and again after it.
  ok &= runCase(R, "args_rejected_before_setup", [&] { return expectRejections(R, rejections(R, b, R.comm)); });
  ok &= runCase(R, "args_valid_calls_after_rejected_ones", [&] { return validAfterRejections(R, 12); });
  ok &= runCase(R, "args_rejected_after_setup", [&] { return expectRejections(R, rejections(R, b, R.comm)); });
  ok &= runCase(R, "args_valid_calls_still_work", [&] { return validAfterRejections(R, 13); });
  ok &= runCase(R, "args_destroyed_comm", [&] { return caseDestroyedComm(R, b); });
  mscclppSetLogHandler(nullptr);
  if (b.otherGpu) {
    cudaSetDevice((R.device + 1) % R.nGpus);
    cudaFree(b.otherGpu);
    cudaStreamDestroy(b.otherStream);
    cudaSetDevice(R.device);
  }
  cudaFree(b.big);
  cudaFree(b.small);
  cudaFreeHost(b.pinned);
  free(b.host);
  return ok ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------
// Groups: the cases that share a set of rank processes (and their settings)
// ------------------------------------------------------------------------------------------------

struct Group
{
  const char* name;
  const char* family;   // `collectives_test <family>` runs every group of it
  bool inAll;           // part of `collectives_test all`
  double limitS;        // the group's time limit (its budget at 4 ranks on one GPU is well below)
  const char* algo;     // MSCCLPP_COLL_ALGO, or null
  const char* scratchMb; // MSCCLPP_COLL_SCRATCH_MB, or null
  bool kill;            // the kill case: its own parent logic
};

const Group kGroups[] = {
  {"matrix_auto", "matrix", true, 150, "auto", nullptr, false},
  {"matrix_packet", "matrix", true, 150, "packet", nullptr, false},
  {"matrix_copy", "matrix", true, 150, "copy", nullptr, false},
  {"matrix_sendrecv", "matrix", true, 150, "sendrecv", nullptr, false},
  {"matrix_small", "matrix_small", false, 90, nullptr, nullptr, false},
  {"large", "large", true, 120, nullptr, nullptr, false},
  {"large_windows", "large", true, 90, nullptr, "1", false},
  {"large_windows_packet", "large", true, 90, "packet", "1", false},
  {"graph", "graph", true, 120, nullptr, "1", false},
  {"sizes", "sizes", true, 90, nullptr, nullptr, false},
  {"kill", "kill", true, 90, nullptr, nullptr, true},
  {"exit_in_flight", "exit", true, 90, nullptr, nullptr, true},
  {"exit_after_kill", "exit", true, 90, nullptr, nullptr, true},
  {"exit_after_fault", "exit", true, 90, nullptr, nullptr, true},
  {"args", "args", true, 90, nullptr, nullptr, false},
  {"zerocopy", "zerocopy", true, 240, "zerocopy", nullptr, false},
  {"zerocopy_partial", "zerocopy", true, 120, "zerocopy", nullptr, false},
  {"zerocopy_windows", "zerocopy", true, 120, "zerocopy", "1", false},
  {"kill_zerocopy", "zerocopy", true, 90, nullptr, nullptr, true},
  {"zerocopy_small", "zerocopy_small", false, 90, "zerocopy", nullptr, false},
  {"copyengine", "copyengine", true, 240, "copyengine", nullptr, false},
  {"kill_copyengine", "copyengine", true, 90, nullptr, nullptr, true},
  {"copyengine_small", "copyengine_small", false, 90, "copyengine", nullptr, false},
};

std::string teardown(Rank& R)
{
  TC_TRY(syncBounded(R, "the last calls before teardown"));
  TC_TRY(destroyComm(R, false));
  freeRank(R);
  // Frees the context, so that compute-sanitizer's leak check sees what became of every allocation.
  TC_CUDA(cudaDeviceReset());
  return "";
}

int groupRankMain(Rank& R, const Group& g)
{
  // Settings are read once, at the library's first need: before the communicator exists.
  if (g.algo) setenv("MSCCLPP_COLL_ALGO", g.algo, 1);
  if (g.scratchMb) setenv("MSCCLPP_COLL_SCRATCH_MB", g.scratchMb, 1);
  const std::string name = g.name;
  const bool zeroCopy = !strncmp(g.name, "zerocopy", 8) || !strncmp(g.name, "copyengine", 10);
  gCopyEngine = !strncmp(g.name, "copyengine", 10);
  const bool sendRecv = name == "matrix_sendrecv";
  if (zeroCopy || sendRecv) {
    // The count of zero-copy calls (and of those sent and received) is logged at INFO when the communicator
    // goes.
    setenv("MSCCLPP_DEBUG", "INFO", 1);
    gLogRank = R.rank;
    mscclppSetLogHandler(captureLog);
  }
  if (!runCase(R, fmt("%s_init", g.name), [&] { return initRank(R); })) return 1;
  int rc = 0;
  if (!strncmp(g.name, "matrix", 6)) rc = matrixBody(R, g.name);
  else if (name == "large") rc = largeBody(R);
  else if (name == "large_windows") rc = windowsBody(R, false);
  else if (name == "large_windows_packet") rc = windowsBody(R, true);
  else if (name == "graph") rc = graphBody(R);
  else if (name == "sizes") rc = sizesBody(R);
  else if (name == "args") rc = argsBody(R);
  else if (zeroCopy) rc = zeroCopyBody(R, g.name);
  const bool down = runCase(R, fmt("%s_teardown", g.name), [&] { return teardown(R); });
  if (zeroCopy && down && !zeroCopyCounted(R, g.name)) rc = 1;
  if (sendRecv && down && !sendRecvCounted(R, g.name)) rc = 1;
  return rc == 0 && down ? 0 : 1;
}

// ------------------------------------------------------------------------------------------------
// kill: the last rank SIGKILLed while every rank streams all-reduces
// ------------------------------------------------------------------------------------------------

struct KillResult : KillOutcome
{
  int warmupOk;
  int loopEndRc; // what the mscclppAllReduce that ended the loop returned (0: the async error ended it)
  int laterRc;
  double laterS;
  int destroyRc;
  double destroyS;
  unsigned long long iterations;
};

// What the kill case's ranks loop on.
enum KillMode : int
{
  kKillAllReduces,          // 1 MiB all-reduces through the scratch
  kKillZeroCopyAllReduces,  // the same on registered buffers, zero-copy
  kKillCopyEngineAllGathers // 1 MiB a rank all-gathers on registered buffers, by the copy engine
};

int killRankMain(int rank, int nranks, int port, KillShared<KillResult>* S, KillMode mode)
{
  KillResult& out = S->res[rank];
  const double scale = timeoutScale();
  auto fail = [&](const std::string& why) {
    copyText(out.note, sizeof(out.note), why);
    return 1;
  };
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  const bool zeroCopy = mode != kKillAllReduces;
  const bool gathers = mode == kKillCopyEngineAllGathers;
  if (mode == kKillZeroCopyAllReduces) setenv("MSCCLPP_COLL_ALGO", "zerocopy", 1);
  if (gathers) setenv("MSCCLPP_COLL_ALGO", "copyengine", 1);
  int ngpus = 0;
  if (cudaGetDeviceCount(&ngpus) != cudaSuccess || ngpus < 1) return fail("no CUDA device visible");
  const int device = rank % ngpus;
  const cudaError_t set = cudaSetDevice(device);
  if (set != cudaSuccess) return fail(fmt("cudaSetDevice failed: %s", cudaGetErrorString(set)));
  mscclppComm_t comm = nullptr;
  mscclppResult_t r = mscclppCommInitRank(&comm, nranks, fmt("127.0.0.1:%d", port).c_str(), rank);
  if (r != mscclppSuccess) return fail(fmt("mscclppCommInitRank returned %d", (int)r));
  const uint64_t count = (1u << 20) / sizeof(float);
  char *send = nullptr, *recv = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t events[4];
  // An all-gather's output holds every rank's piece.
  const uint64_t outCount = gathers ? count * nranks : count;
  if (cudaMalloc((void**)&send, count * 4) != cudaSuccess || cudaMalloc((void**)&recv, outCount * 4) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return fail("allocations failed");
  for (cudaEvent_t& e : events)
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return fail("cudaEventCreate failed");
  if (zeroCopy) {
    // Both buffers registered on every rank: the loop's all-reduces read and write the peers' buffers.
    void* handle = nullptr;
    if (mscclppCommRegister(comm, send, count * 4, &handle) != mscclppSuccess ||
        mscclppCommRegister(comm, recv, outCount * 4, &handle) != mscclppSuccess)
      return fail("mscclppCommRegister failed");
  }

  // A checked first call: the set-up, and proof that the loop below moves real data.
  const Call c = makeCall(gathers ? kAllGather : kAllReduce, mscclppFloat32, mscclppSum, count, false, 0, seedOf(14, 0));
  const char* what = gathers ? "mscclppAllGather" : "mscclppAllReduce";
  auto issue = [&] { return collective(c.coll, send, recv, count, c.type, c.op, comm, stream); };
  fillInputKernel<<<gridFor(count), 256, 0, stream>>>(send, count, c.type, genKindFor(c.coll, c.op), c.seed, nullptr,
                                                       rank);
  r = issue();
  if (r != mscclppSuccess) return fail(fmt("the first %s returned %d", what, (int)r));
  const double warmDeadline = nowSec() + 60 * scale;
  while (cudaStreamQuery(stream) == cudaErrorNotReady && nowSec() < warmDeadline) usleep(200);
  if (cudaStreamQuery(stream) != cudaSuccess) return fail(fmt("the first %s did not finish within 60 s", what));
  std::vector<uint8_t> host(outCount * 4);
  cudaMemcpy(host.data(), recv, host.size(), cudaMemcpyDeviceToHost);
  const std::string wrong = checkOutput(c, rank, nranks, host.data());
  if (!wrong.empty()) return fail(fmt("the first %s: %s", what, wrong.c_str()));
  out.warmupOk = 1;
  S->ready[rank] = 1;

  // All-reduces until the failure shows, at most four in flight: each waits for the one four calls back,
  // watching the communicator's error meanwhile.
  const std::function<mscclppResult_t()> error = [comm] {
    mscclppResult_t a = mscclppSuccess;
    mscclppCommGetAsyncError(comm, &a);
    return a;
  };
  mscclppResult_t asyncErr = mscclppSuccess, loopRc = mscclppSuccess;
  if (!loopUntilFailure<mscclppResult_t>(stream, events, &S->stop, error, issue, &out.iterations, &asyncErr, &loopRc))
    fail("no failure seen: the loop was told to stop or ran out of time");
  out.loopEndRc = (int)loopRc;
  out.tDetect = nowSec();
  // The communicator's error (it may trail a failed call by a moment).
  out.asyncError = (int)trailingError(asyncErr, error, 10);

  // No hang: the queued kernels see the abort and end.
  drainOrExit(out, rank, device, stream, "a collective kernel hangs on the dead rank");

  // A later call returns the error at once.
  const double t0 = nowSec();
  out.laterRc = (int)issue();
  out.laterS = nowSec() - t0;

  out.destroyRc = (int)boundedOrExit<mscclppResult_t>(
      out, rank, device, 20, [comm] { return mscclppCommDestroy(comm); },
      "mscclppCommDestroy did not return within 20 s", &out.destroyS);
  for (cudaEvent_t& e : events) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  cudaFree(send);
  cudaFree(recv);
  cudaDeviceReset();
  out.finished = 1;
  return 0;
}

int runKill(int nranks, int port, KillMode mode)
{
  const char* name = mode == kKillZeroCopyAllReduces     ? "kill_last_rank_during_zerocopy_allreduces"
                     : mode == kKillCopyEngineAllGathers ? "kill_last_rank_during_copy_engine_allgathers"
                                                         : "kill_last_rank_during_allreduces";
  if (nranks < 2) {
    printf("SKIP %s: needs 2 ranks or more\n", name);
    return 0;
  }
  const KillPlan k = {name, nranks, 150, 90, 1000000, "loop", false};
  const double lim = timeoutScale(), t0 = nowSec();
  KillShared<KillResult>* S = nullptr;
  KillJudge<KillResult> judge;
  judge.rank = [&](int r) { // forked once runKillCase has mapped S
    const int rc = killRankMain(r, nranks, port, S, mode);
    if (rc != 0) fprintf(stderr, "[rank %d] %s\n", r, S->res[r].note);
    return rc;
  };
  judge.check = [&](int, const KillResult& o, double tKill) -> std::string {
    if (o.iterations == 0) return "no call ran in the loop";
    if (o.asyncError != mscclppRemoteError)
      return fmt("mscclppCommGetAsyncError gave %d (%s), not mscclppRemoteError", o.asyncError,
                 errStr((mscclppResult_t)o.asyncError));
    const std::string why = detectedAndDrained(o, tKill);
    if (!why.empty()) return why;
    if (o.laterRc != o.asyncError)
      return fmt("the next call returned %d (%s), not the communicator's error", o.laterRc,
                 errStr((mscclppResult_t)o.laterRc));
    if (o.laterS > 1 * lim) return fmt("the next call took %.2f s to fail", o.laterS);
    if (o.destroyRc != mscclppSuccess && o.destroyRc != mscclppRemoteError)
      return fmt("mscclppCommDestroy returned %d (%s)", o.destroyRc, errStr((mscclppResult_t)o.destroyRc));
    if (o.destroyS > 10 * lim) return fmt("mscclppCommDestroy took %.2f s", o.destroyS);
    return "";
  };
  judge.info = [&](int r, const KillResult& o, double tKill) {
    return fmt(" rank%d: %llu calls, failure seen %.3f s after the kill, stream drained in %.3f s, next call failed in "
               "%.1f ms, destroy %.2f s;",
               r, o.iterations, o.tDetect - tKill, o.syncS, o.laterS * 1e3, o.destroyS);
  };
  std::string info;
  const int failed = runKillCase(k, &S, judge, &info);
  return endKillCase(k, S, failed, info, "", fmt("kill (%d ranks, port %d, %.1f s)", nranks, port, nowSec() - t0));
}

// ------------------------------------------------------------------------------------------------
// exit: a process that ends while its communicator is alive is not held by the library
// ------------------------------------------------------------------------------------------------

struct ExitShared
{
  volatile int ready[kMaxRanks];
  volatile double tExit[kMaxRanks]; // CLOCK_MONOTONIC, just before the rank called exit()
  char note[kMaxRanks][200];
};

// in_flight: rank 0 queues an all-reduce that its peers join only 2 s later and calls exit() at once, its
// kernel still waiting; after_kill: the last rank is SIGKILLed while every rank loops on all-reduces, and
// each survivor calls exit() as soon as it sees the failure, without synchronizing or destroying. Either
// way exit() must return (the process end) within seconds on every rank.
enum ExitMode : int
{
  kExitInFlight,
  kExitAfterKill,
  kExitAfterFault,
};

__global__ void faultKernel(int* bad) { *bad = 1; }

// after_fault: the last rank's own kernel writes to an unmapped address (under MPS every client on the GPU
// sees the fault); it and every other rank call exit() once they see an error.
int exitRankMain(int rank, int nranks, int port, ExitShared* S, ExitMode mode)
{
  const bool inFlight = mode == kExitInFlight;
  auto fail = [&](const std::string& why) {
    copyText(S->note[rank], sizeof(S->note[rank]), why);
    return 1;
  };
  int ngpus = 0;
  if (cudaGetDeviceCount(&ngpus) != cudaSuccess || ngpus < 1) return fail("no CUDA device visible");
  const cudaError_t set = cudaSetDevice(rank % ngpus);
  if (set != cudaSuccess) return fail(fmt("cudaSetDevice failed: %s", cudaGetErrorString(set)));
  mscclppComm_t comm = nullptr;
  if (mscclppCommInitRank(&comm, nranks, fmt("127.0.0.1:%d", port).c_str(), rank) != mscclppSuccess)
    return fail("mscclppCommInitRank failed");
  const uint64_t count = (1u << 20) / sizeof(float);
  char *send = nullptr, *recv = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMalloc((void**)&send, count * 4) != cudaSuccess || cudaMalloc((void**)&recv, count * 4) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return fail("allocations failed");
  cudaMemset(send, 0, count * 4);
  // A first call, synchronized: the set-up is done on every rank.
  if (mscclppAllReduce(send, recv, count, mscclppFloat32, mscclppSum, comm, stream) != mscclppSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    return fail("the first all-reduce failed");
  S->ready[rank] = 1;
  for (int r = 0; r < nranks; ++r)
    while (!S->ready[r]) usleep(1000);
  if (inFlight) {
    if (rank != 0) usleep(2000000);
    mscclppAllReduce(send, recv, count, mscclppFloat32, mscclppSum, comm, stream);
    if (rank == 0) {
      S->tExit[rank] = nowSec();
      exit(0);
    }
  }
  if (mode == kExitAfterFault && rank == nranks - 1) {
    usleep(300000);
    faultKernel<<<1, 1, 0, stream>>>((int*)0x8);
    const cudaError_t e = cudaStreamSynchronize(stream);
    copyText(S->note[rank], sizeof(S->note[rank]), fmt("its own fault: %s", cudaGetErrorString(e)));
    S->tExit[rank] = nowSec();
    exit(4);
  }
  const double deadline = nowSec() + 60 * timeoutScale();
  mscclppResult_t err = mscclppSuccess;
  cudaError_t streamErr = cudaSuccess;
  while (err == mscclppSuccess && nowSec() < deadline) {
    if (mscclppAllReduce(send, recv, count, mscclppFloat32, mscclppSum, comm, stream) != mscclppSuccess) break;
    mscclppCommGetAsyncError(comm, &err);
    streamErr = cudaStreamQuery(stream);
    if (streamErr != cudaSuccess && streamErr != cudaErrorNotReady) break;
    usleep(1000);
  }
  mscclppCommGetAsyncError(comm, &err);
  if (err == mscclppSuccess && (streamErr == cudaSuccess || streamErr == cudaErrorNotReady))
    return fail("no failure seen within 60 s");
  S->tExit[rank] = nowSec();
  exit(3);
}

int runExit(int nranks, int port, ExitMode mode)
{
  const bool inFlight = mode == kExitInFlight;
  const char* name = inFlight                  ? "exit_with_a_collective_in_flight"
                     : mode == kExitAfterKill ? "exit_after_a_peer_was_killed"
                                              : "exit_after_a_gpu_fault";
  if (nranks < 2) {
    printf("SKIP %s: needs 2 ranks or more\n", name);
    return 0;
  }
  const double scale = timeoutScale(), t0 = nowSec();
  ExitShared* S = mapShared<ExitShared>();
  if (!S) {
    printf("FAIL %s: mmap failed\n", name);
    return 1;
  }
  const int victim = mode == kExitAfterKill ? nranks - 1 : -1;
  // The previous case's processes ended with kernels running: under MPS the server may refuse new clients
  // until it has cleaned up after them (docs/failures.md, "A process that ends").
  const std::string gpu = waitForGpuClients(30 * scale);
  if (!gpu.empty()) {
    printf("FAIL %s: the GPU took no new process within %.0f s (%s)\n", name, 30 * scale, gpu.c_str());
    return 1;
  }
  ForkedRanks ranks(nranks, 120 * scale, [&](int r) {
    const int rc = exitRankMain(r, nranks, port, S, mode);
    fprintf(stderr, "[rank %d] %s\n", r, S->note[r]);
    return rc;
  });
  bool early = false;
  const bool ready = ranks.waitReady([&](int r) { return S->ready[r] != 0; }, 90 * scale, &early);
  double tKill = 0;
  if (ready && victim >= 0) {
    usleep(500000);
    ranks.kill(victim);
    tKill = nowSec();
  }
  ranks.waitEnded(60 * scale);
  const double now = nowSec();
  const std::vector<bool> alive = ranks.killRest();
  int failed = 0;
  std::string info;
  for (int r = 0; r < nranks; ++r) {
    if (alive[r]) {
      printf("FAIL %s: rank %d still alive 60 s on (%s)\n", name, r,
             S->tExit[r] > 0 ? fmt("it called exit() %.1f s before", now - S->tExit[r]).c_str() : S->note[r]);
      ++failed;
      continue;
    }
    if (r == victim) continue;
    const int want = inFlight && r == 0 ? 0 : mode == kExitAfterFault && r == nranks - 1 ? 4 : 3;
    const double took = S->tExit[r] > 0 ? ranks.ended(r) - S->tExit[r] : -1;
    if (!ready) {
      printf("FAIL %s: rank %d ended before every rank was ready: %s (%s)\n", name, r, describeStatus(ranks.status(r)).c_str(),
             S->note[r]);
      ++failed;
    } else if (!WIFEXITED(ranks.status(r)) || WEXITSTATUS(ranks.status(r)) != want) {
      printf("FAIL %s: rank %d: %s, not exit status %d (%s)\n", name, r, describeStatus(ranks.status(r)).c_str(), want,
             S->note[r]);
      ++failed;
    } else if (took < 0 || took > 10 * scale) {
      printf("FAIL %s: rank %d: exit() took %.2f s to end the process\n", name, r, took);
      ++failed;
    } else {
      info += fmt(" rank%d: exit() ended it in %.2f s%s;", r, took,
                  tKill > 0 ? fmt(", %.2f s after the kill", ranks.ended(r) - tKill).c_str() : "");
    }
  }
  if (!failed) printf("PASS %s:%s\n", name, info.c_str());
  printf("SUMMARY %s (%d ranks, %.1f s): %d passed, %d failed\n", name, nranks, nowSec() - t0, failed ? 0 : 1,
         failed ? 1 : 0);
  fflush(stdout);
  munmap(S, sizeof(ExitShared));
  return failed ? 1 : 0;
}

} // namespace

int main(int argc, char** argv)
{
  const char* which = nullptr;
  int nranks = 2, port = 0;
  bool badOption = false;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--port") && i + 1 < argc) {
      port = (int)parseNumber(argv[++i], "--port", 1, 65000);
    } else if (argv[i][0] == '-') {
      badOption = true;
    } else if (!which) {
      which = argv[i];
    } else {
      nranks = (int)parseNumber(argv[i], "nranks", 1, kMaxRanks);
    }
  }
  bool known = !badOption && which && !strcmp(which, "all");
  for (const Group& g : kGroups)
    known = known || (!badOption && which && (!strcmp(which, g.name) || !strcmp(which, g.family)));
  if (!known) {
    fprintf(stderr, "usage: %s <case|all> [nranks] [--port P]\ncases:", argv[0]);
    for (const Group& g : kGroups) fprintf(stderr, " %s%s", g.name, g.inAll ? "" : " (not in all)");
    fprintf(stderr, "\nfamilies: matrix (the three matrix_* but small), large (large, large_windows*)\n");
    return 2;
  }
  // The parent never touches CUDA: each group forks its own rank processes, which start CUDA afresh.
  const double t0 = nowSec();
  int ran = 0, failed = 0, index = 0;
  for (const Group& g : kGroups) {
    ++index;
    const bool selected = !strcmp(which, g.name) || !strcmp(which, g.family) || (!strcmp(which, "all") && g.inAll);
    if (!selected || gStopRequested) continue;
    // A port pair per group: a group's bootstrap ports may linger a moment after it ends.
    const int groupPort = port > 0 ? port + 2 * (index - 1) : pickPort(0, 2);
    Options opt;
    opt.nranks = nranks;
    opt.port = groupPort;
    int rc;
    if (g.kill && !strncmp(g.name, "exit", 4)) {
      rc = runExit(nranks, groupPort,
                   !strcmp(g.name, "exit_in_flight")  ? kExitInFlight
                   : !strcmp(g.name, "exit_after_kill") ? kExitAfterKill
                                                        : kExitAfterFault);
    } else if (g.kill) {
      rc = runKill(nranks, groupPort,
                   !strcmp(g.name, "kill_zerocopy")     ? kKillZeroCopyAllReduces
                   : !strcmp(g.name, "kill_copyengine") ? kKillCopyEngineAllGathers
                                                        : kKillAllReduces);
    } else {
      const Group* group = &g;
      // Above 4 ranks on one GPU each call takes longer (the ranks share its multiprocessors): the limit grows.
      const double limit = g.limitS * std::max(1.0, nranks / 4.0);
      rc = runRanks(g.name, opt, limit, [group](Rank& R) { return groupRankMain(R, *group); });
    }
    ++ran;
    failed += rc != 0;
  }
  printf("SUMMARY collectives_test (%d ranks, %.1f s): %d of %d groups passed\n", nranks, nowSec() - t0, ran - failed, ran);
  return failed ? 1 : 0;
}
