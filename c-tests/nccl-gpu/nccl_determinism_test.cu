// Reproducible reductions (MSCCLPP_DETERMINISTIC=1), through our nccl.h and libnccl.so.2 alone: every element
// of a reduction must be one fixed expression of the ranks' values of that element, whatever the message it
// travels in. Each rank's input is a pattern of random values with exponents spread over a wide range (so
// that the order of the additions changes the rounding); every element's expected bits are computed on the
// host, in rank order, with the device's rounding (half and bfloat16 in float, rounded to the type after
// each step; a PreMulSum's scaled input rounded before it is added; an average divided at the end).
//
// One process per rank, forked by the parent; rank r uses GPU r % GPUs, so every rank may share one GPU.
//
//   nccl_determinism_test [nranks] [--port P] [--quick] [--expect-difference]
//
// The environment picks the mode and the algorithm (MSCCLPP_DETERMINISTIC, MSCCLPP_COLL_ALGO): the runner
// (c-tests/run_nccl_gpu_tests.sh) runs it under each.
//
// Cases: init; then, for each kind of buffer (plain cudaMalloc; registered with ncclCommRegister; a window of
// ncclMemAlloc registered with ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC), a sweep: all-reduce,
// reduce-scatter and reduce (root: the last rank), in float32 (sum, average, PreMulSum, product), bfloat16
// (sum, PreMulSum), half (sum, average) and float64 (sum), messages of 4 KiB to 16 MiB (and 256 MiB for the
// sums of float32 and bfloat16), out of place and in place, eager, then each at 1 MiB and 16 MiB captured in a
// CUDA graph and replayed twice. Every element of a 4 KiB prefix of each rank's output (reduce-scatter: of its
// shard; reduce: the root's) is compared bitwise with the host's value; destroy.
// --quick: float32 sum and PreMulSum, bfloat16 sum and half average, plain buffers and windows, 4 KiB, 1 MiB
// and 256 MiB (16 MiB in graphs).
// --expect-difference (without MSCCLPP_DETERMINISTIC, with an algorithm that reduces in another order): the
// same sweep, each mismatch counted rather than failed; the case `order_matters` passes where some element
// differs, which shows that the data tells one order of additions from another (else the sweep proves
// nothing).
//
// Output: PASS name [note] / FAIL name: reason per case, a SUMMARY line. Exit code 0 only if every case passed.
#include "nccl_rank.h"

#include <cmath>
#include <cstring>

using namespace tc;

namespace {

constexpr uint64_t kPrefixBytes = 4096;
constexpr uint64_t kLargest = 256ull << 20;
constexpr uint64_t kSeed = 0x5eedf00dull;

struct Board
{
  SharedId id;
  Meeting meeting;
  long mismatches; // --expect-difference: every rank's count, added
  long checked;
};

Board* gBoard = nullptr;
ncclComm_t gComm = nullptr;
bool gQuick = false;
bool gExpectDifference = false;
long gMismatches = 0; // --expect-difference: elements unlike the rank-order value
long gChecked = 0;    // elements compared

// ------------------------------------------------------------------------------------------------
// The input pattern (the same formula on the device and on the host)
// ------------------------------------------------------------------------------------------------

__host__ __device__ inline uint64_t mixBits(uint64_t x)
{
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

enum class Ty { F32, BF16, F16, F64 };

// The bits of rank `rank`'s element `i`: a random sign and mantissa, an exponent in a spread range (float32,
// bfloat16 and float64: 2^-8 to 2^8; half: 2^-5 to 2^5, so that eight ranks' sums stay finite).
__host__ __device__ inline uint64_t patternBits(Ty t, int rank, uint64_t i)
{
  const uint64_t h = mixBits(kSeed ^ ((uint64_t)rank << 48) ^ i);
  const uint64_t sign = h >> 63;
  switch (t) {
  case Ty::F32: return (sign << 31) | ((uint64_t)(127 - 8 + (h >> 40) % 17) << 23) | (h & 0x7fffff);
  case Ty::BF16: return (sign << 15) | ((uint64_t)(127 - 8 + (h >> 40) % 17) << 7) | (h & 0x7f);
  case Ty::F16: return (sign << 15) | ((uint64_t)(15 - 5 + (h >> 40) % 11) << 10) | (h & 0x3ff);
  case Ty::F64: return (sign << 63) | ((uint64_t)(1023 - 8 + (h >> 40) % 17) << 52) | (h & 0xfffffffffull);
  }
  return 0;
}

__global__ void fillPattern(void* buf, uint64_t count, Ty t, int rank, uint64_t first)
{
  for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < count; j += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t b = patternBits(t, rank, first + j);
    switch (t) {
    case Ty::F32: ((uint32_t*)buf)[j] = (uint32_t)b; break;
    case Ty::BF16:
    case Ty::F16: ((uint16_t*)buf)[j] = (uint16_t)b; break;
    case Ty::F64: ((uint64_t*)buf)[j] = b; break;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The host's arithmetic, as the device's (round to nearest even at every step)
// ------------------------------------------------------------------------------------------------

float bitsToFloat(uint32_t b)
{
  float f;
  memcpy(&f, &b, 4);
  return f;
}
uint32_t floatToBits(float f)
{
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

float bf16ToFloat(uint16_t h) { return bitsToFloat((uint32_t)h << 16); }
uint16_t floatToBf16(float f)
{
  uint32_t b = floatToBits(f);
  if ((b & 0x7fffffff) > 0x7f800000) return (uint16_t)((b >> 16) | 0x40);
  b += 0x7fff + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}

float halfToFloat(uint16_t h)
{
  const uint32_t sign = (uint32_t)(h >> 15) << 31;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp((float)mant, -24);
  if (exp == 31) return bitsToFloat(sign | 0x7f800000 | (mant << 13));
  return bitsToFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}
uint16_t floatToHalf(float f)
{
  const uint32_t b = floatToBits(f);
  const uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  const uint32_t a = b & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;
  if (a >= 0x477ff000) return sign | 0x7c00; // 65520 and above round to infinity
  if (a < 0x38800000) {                       // below 2^-14: a subnormal, k * 2^-24
    return sign | (uint16_t)std::nearbyint(std::fabs(f) * 16777216.0f);
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffff) >> 13));
  const uint32_t rest = a & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return sign | (uint16_t)h;
}

enum class Op { Sum, Avg, PreMulSum, Prod };

// The arithmetic type's value of an element's bits, and back (float for half and bfloat16).
double up(Ty t, uint64_t b)
{
  switch (t) {
  case Ty::F32: return bitsToFloat((uint32_t)b);
  case Ty::BF16: return bf16ToFloat((uint16_t)b);
  case Ty::F16: return halfToFloat((uint16_t)b);
  case Ty::F64: {
    double d;
    memcpy(&d, &b, 8);
    return d;
  }
  }
  return 0;
}
uint64_t down(Ty t, double v)
{
  switch (t) {
  case Ty::F32: return floatToBits((float)v);
  case Ty::BF16: return floatToBf16((float)v);
  case Ty::F16: return floatToHalf((float)v);
  case Ty::F64: {
    uint64_t b;
    memcpy(&b, &v, 8);
    return b;
  }
  }
  return 0;
}

// One step x op y in the type's arithmetic (float for every type but float64), rounded to the type.
uint64_t step(Ty t, Op op, uint64_t x, uint64_t y)
{
  if (t == Ty::F64) {
    const double a = up(t, x), b = up(t, y);
    return down(t, op == Op::Prod ? a * b : a + b);
  }
  const float a = (float)up(t, x), b = (float)up(t, y);
  volatile float r = op == Op::Prod ? a * b : a + b; // volatile: never contracted with a neighbour
  return down(t, r);
}

// Rank r's PreMulSum scalar, in the element type (as NCCL takes it).
uint64_t scalarBits(Ty t, int r) { return down(t, 1.0 / (r + 3)); }

// Rank r's input element after PreMulSum's scaling: the product in the arithmetic type, rounded to the type.
uint64_t scaled(Ty t, int r, uint64_t x)
{
  if (t == Ty::F64) return down(t, up(t, x) * up(t, scalarBits(t, r)));
  volatile float p = (float)up(t, x) * (float)up(t, scalarBits(t, r));
  return down(t, p);
}

// Element `i`'s reduction over the ranks, in rank order: the fixed expression the reproducible mode promises.
uint64_t expected(Ty t, Op op, int nranks, uint64_t i)
{
  auto input = [&](int r) {
    const uint64_t x = patternBits(t, r, i);
    return op == Op::PreMulSum ? scaled(t, r, x) : x;
  };
  uint64_t acc = input(0);
  for (int r = 1; r < nranks; ++r) acc = step(t, op, acc, input(r));
  if (op == Op::Avg) {
    if (t == Ty::F64) return down(t, up(t, acc) / nranks);
    volatile float q = (float)up(t, acc) / (float)nranks;
    return down(t, q);
  }
  return acc;
}

// ------------------------------------------------------------------------------------------------
// The sweep
// ------------------------------------------------------------------------------------------------

enum class Coll { AllReduce, ReduceScatter, Reduce };
enum class Kind { Plain, Registered, Window };

const char* collName(Coll c) { return c == Coll::AllReduce ? "all_reduce" : c == Coll::ReduceScatter ? "reduce_scatter" : "reduce"; }
const char* kindName(Kind k) { return k == Kind::Plain ? "plain" : k == Kind::Registered ? "registered" : "window"; }
const char* opName(Op o)
{
  return o == Op::Sum ? "sum" : o == Op::Avg ? "avg" : o == Op::PreMulSum ? "premulsum" : "prod";
}
const char* tyName(Ty t) { return t == Ty::F32 ? "f32" : t == Ty::BF16 ? "bf16" : t == Ty::F16 ? "f16" : "f64"; }
size_t tySize(Ty t) { return t == Ty::F64 ? 8 : t == Ty::F32 ? 4 : 2; }
ncclDataType_t ncclType(Ty t)
{
  return t == Ty::F32 ? ncclFloat32 : t == Ty::BF16 ? ncclBfloat16 : t == Ty::F16 ? ncclFloat16 : ncclFloat64;
}

struct Combo
{
  Ty ty;
  Op op;
  bool largest; // also at 256 MiB
};

std::vector<Combo> combos()
{
  if (gQuick)
    return {{Ty::F32, Op::Sum, true}, {Ty::F32, Op::PreMulSum, false}, {Ty::BF16, Op::Sum, true}, {Ty::F16, Op::Avg, false}};
  return {{Ty::F32, Op::Sum, true},     {Ty::F32, Op::Avg, false},  {Ty::F32, Op::PreMulSum, false},
          {Ty::F32, Op::Prod, false},   {Ty::BF16, Op::Sum, true},  {Ty::BF16, Op::PreMulSum, false},
          {Ty::F16, Op::Sum, false},    {Ty::F16, Op::Avg, false},  {Ty::F64, Op::Sum, false}};
}

std::vector<uint64_t> sizes(bool largest)
{
  std::vector<uint64_t> s = gQuick ? std::vector<uint64_t>{4096, 1u << 20} : std::vector<uint64_t>{4096, 64u << 10, 1u << 20, 16u << 20};
  if (largest) s.push_back(kLargest);
  return s;
}

// A kind's two buffers of kLargest bytes each (input, output), registered as the kind says.
struct Buffers
{
  Kind kind;
  char* send = nullptr;
  char* recv = nullptr;
  void* handles[2] = {nullptr, nullptr};
  ncclWindow_t wins[2] = {nullptr, nullptr};
};

std::string openBuffers(Kind kind, Buffers* b)
{
  b->kind = kind;
  for (int k = 0; k < 2; ++k) {
    char** p = k == 0 ? &b->send : &b->recv;
    if (kind == Kind::Window) {
      if (ncclMemAlloc((void**)p, kLargest) != ncclSuccess) return fmt("ncclMemAlloc of %s failed: %s", sizeName(kLargest).c_str(), lastError().c_str());
      if (ncclCommWindowRegister(gComm, *p, kLargest, &b->wins[k], NCCL_WIN_COLL_SYMMETRIC) != ncclSuccess)
        return fmt("ncclCommWindowRegister failed: %s", lastError(gComm).c_str());
    } else {
      if (cudaMalloc((void**)p, kLargest) != cudaSuccess) return fmt("cudaMalloc of %s failed", sizeName(kLargest).c_str());
      if (kind == Kind::Registered && ncclCommRegister(gComm, *p, kLargest, &b->handles[k]) != ncclSuccess)
        return fmt("ncclCommRegister failed: %s", lastError(gComm).c_str());
    }
  }
  return "";
}

std::string closeBuffers(Rank& R, Buffers* b)
{
  TC_CUDA(cudaStreamSynchronize(R.stream));
  for (int k = 0; k < 2; ++k) {
    char* p = k == 0 ? b->send : b->recv;
    if (!p) continue;
    if (b->kind == Kind::Window) {
      if (b->wins[k]) TN_OK(ncclCommWindowDeregister(gComm, b->wins[k]));
      TN_OK(ncclMemFree(p));
    } else {
      if (b->handles[k]) TN_OK(ncclCommDeregister(gComm, b->handles[k]));
      TC_CUDA(cudaFree(p));
    }
  }
  *b = Buffers{};
  return "";
}

// One call's shape: its counts and where this rank's output and checked elements are.
struct Call
{
  Coll coll;
  Combo combo;
  uint64_t bytes; // the message: all-reduce's and reduce's buffer, reduce-scatter's input
  bool inPlace;
  int nranks, rank;
  uint64_t count() const { return bytes / tySize(combo.ty); }                                  // input elements
  uint64_t recvCount() const { return coll == Coll::ReduceScatter ? count() / nranks : count(); } // per rank
  int root() const { return nranks - 1; }
  bool hasOutput() const { return coll != Coll::Reduce || rank == root(); }
  // The input element of this rank's first output element.
  uint64_t firstElement() const { return coll == Coll::ReduceScatter ? (uint64_t)rank * recvCount() : 0; }
  std::string name() const
  {
    return fmt("%s %s %s %s %s", collName(coll), tyName(combo.ty), opName(combo.op), sizeName(bytes).c_str(),
               inPlace ? "in place" : "out of place");
  }
};

// The call on `stream`, from `send` into `recv` (in place: the input's own shard or buffer); `op` made by
// the caller (PreMulSum's is this rank's).
ncclResult_t issue(const Call& c, ncclRedOp_t op, char* send, char* recv, cudaStream_t stream)
{
  const size_t ts = tySize(c.combo.ty);
  char* out = c.inPlace ? (c.coll == Coll::ReduceScatter ? send + c.firstElement() * ts : send) : recv;
  const ncclDataType_t t = ncclType(c.combo.ty);
  switch (c.coll) {
  case Coll::AllReduce: return ncclAllReduce(send, out, c.count(), t, op, gComm, stream);
  case Coll::ReduceScatter: return ncclReduceScatter(send, out, c.recvCount(), t, op, gComm, stream);
  case Coll::Reduce: return ncclReduce(send, out, c.count(), t, op, c.root(), gComm, stream);
  }
  return ncclInvalidArgument;
}

char* outputOf(const Call& c, char* send, char* recv)
{
  return c.inPlace ? (c.coll == Coll::ReduceScatter ? send + c.firstElement() * tySize(c.combo.ty) : send) : recv;
}

std::string makeOp(const Call& c, int rank, ncclRedOp_t* op)
{
  switch (c.combo.op) {
  case Op::Sum: *op = ncclSum; return "";
  case Op::Avg: *op = ncclAvg; return "";
  case Op::Prod: *op = ncclProd; return "";
  case Op::PreMulSum: {
    const uint64_t s = scalarBits(c.combo.ty, rank);
    if (ncclRedOpCreatePreMulSum(op, (void*)&s, ncclType(c.combo.ty), ncclScalarHostImmediate, gComm) != ncclSuccess)
      return fmt("ncclRedOpCreatePreMulSum failed: %s", lastError(gComm).c_str());
    return "";
  }
  }
  return "no such operator";
}

// The input filled with this rank's pattern and the output with a marker, on the stream.
std::string fill(Rank& R, const Call& c, char* send, char* recv)
{
  fillPattern<<<1024, 256, 0, R.stream>>>(send, c.count(), c.combo.ty, R.rank, 0);
  TC_CUDA(cudaGetLastError());
  if (!c.inPlace) TC_CUDA(cudaMemsetAsync(recv, 0xff, c.recvCount() * tySize(c.combo.ty), R.stream));
  return "";
}

// Every element of the output's prefix against the host's rank-order value: a mismatch fails the call (or
// is counted, with --expect-difference).
std::string check(Rank& R, const Call& c, const char* out, const char* how)
{
  if (!c.hasOutput()) return "";
  const size_t ts = tySize(c.combo.ty);
  const uint64_t n = std::min<uint64_t>(c.recvCount(), kPrefixBytes / ts);
  std::vector<uint64_t> got(n, 0);
  std::vector<char> raw(n * ts);
  TC_CUDA(cudaMemcpy(raw.data(), out, n * ts, cudaMemcpyDeviceToHost));
  for (uint64_t j = 0; j < n; ++j) {
    uint64_t g = 0;
    memcpy(&g, raw.data() + j * ts, ts);
    const uint64_t want = expected(c.combo.ty, c.combo.op, c.nranks, c.firstElement() + j);
    ++gChecked;
    if (g == want) continue;
    if (gExpectDifference) {
      ++gMismatches;
      continue;
    }
    return fmt("%s, %s: element %llu (input element %llu) is 0x%llx (%.9g), the rank-order value 0x%llx (%.9g)",
               c.name().c_str(), how, (unsigned long long)j, (unsigned long long)(c.firstElement() + j),
               (unsigned long long)g, up(c.combo.ty, g), (unsigned long long)want, up(c.combo.ty, want));
  }
  return "";
}

std::string eager(Rank& R, const Call& c, Buffers& b)
{
  ncclRedOp_t op;
  TC_TRY(makeOp(c, R.rank, &op));
  std::string why = fill(R, c, b.send, b.recv);
  if (why.empty()) {
    ncclResult_t r = issue(c, op, b.send, b.recv, R.stream);
    if (r != ncclSuccess) why = fmt("%s returned %s: %s", c.name().c_str(), resultName(r), lastError(gComm).c_str());
  }
  if (why.empty()) why = syncBounded(R, c.name().c_str());
  if (why.empty()) why = check(R, c, outputOf(c, b.send, b.recv), "eager");
  if (c.combo.op == Op::PreMulSum) ncclRedOpDestroy(op, gComm);
  return why;
}

std::string graphed(Rank& R, const Call& c, Buffers& b)
{
  ncclRedOp_t op;
  TC_TRY(makeOp(c, R.rank, &op));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string why;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeRelaxed));
  ncclResult_t r = issue(c, op, b.send, b.recv, R.stream);
  cudaError_t e = cudaStreamEndCapture(R.stream, &graph);
  if (r != ncclSuccess) why = fmt("%s while capturing returned %s: %s", c.name().c_str(), resultName(r), lastError(gComm).c_str());
  if (why.empty() && e != cudaSuccess) why = fmt("cudaStreamEndCapture: %s", cudaGetErrorString(e));
  if (why.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) why = "cudaGraphInstantiate failed";
  for (int rep = 0; rep < 2 && why.empty(); ++rep) {
    why = fill(R, c, b.send, b.recv);
    if (why.empty() && cudaGraphLaunch(exec, R.stream) != cudaSuccess) why = "cudaGraphLaunch failed";
    if (why.empty()) why = syncBounded(R, (c.name() + " replayed").c_str());
    if (why.empty()) why = check(R, c, outputOf(c, b.send, b.recv), fmt("graph replay %d", rep).c_str());
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (c.combo.op == Op::PreMulSum) ncclRedOpDestroy(op, gComm);
  return why;
}

std::string sweep(Rank& R, Kind kind)
{
  Buffers b;
  std::string why = openBuffers(kind, &b);
  long calls = 0;
  for (Coll coll : {Coll::AllReduce, Coll::ReduceScatter, Coll::Reduce}) {
    for (const Combo& combo : combos()) {
      for (uint64_t bytes : sizes(combo.largest)) {
        for (bool inPlace : {false, true}) {
          if (!why.empty()) break;
          const Call c{coll, combo, bytes, inPlace, R.nranks, R.rank};
          why = eager(R, c, b);
          ++calls;
        }
      }
      for (uint64_t bytes : {1ull << 20, 16ull << 20}) {
        if (!why.empty()) break;
        why = graphed(R, Call{coll, combo, bytes, false, R.nranks, R.rank}, b);
        ++calls;
      }
    }
  }
  std::string closed = closeBuffers(R, &b);
  if (why.empty()) why = closed;
  if (why.empty()) {
    ncclResult_t async = ncclInternalError;
    TN_OK(ncclCommGetAsyncError(gComm, &async));
    TC_EXPECT(async == ncclSuccess, "ncclCommGetAsyncError says %s: %s", resultName(async), lastError(gComm).c_str());
  }
  R.info = fmt("%ld calls, %s", calls, gExpectDifference ? "mismatches counted" : "every element as in rank order");
  return why;
}

int rankMain(Rank& R)
{
  std::string why = setUpDevice(R);
  // This program's kernel is loaded before any peer's kernel can wait on this rank.
  cudaFuncAttributes attributes;
  if (why.empty() && cudaFuncGetAttributes(&attributes, fillPattern) != cudaSuccess) why = "cudaFuncGetAttributes(fillPattern) failed";
  if (!setUpPassed(R, why)) return 1;
  runCase(R, "init", [&] {
    std::string w = initBoardComm(R, gBoard->id, &gComm);
    const char* det = getenv("MSCCLPP_DETERMINISTIC");
    const char* algo = getenv("MSCCLPP_COLL_ALGO");
    R.info = fmt("%d ranks on %d GPUs, MSCCLPP_DETERMINISTIC=%s, MSCCLPP_COLL_ALGO=%s", R.nranks, R.nGpus, det ? det : "(unset)",
                 algo ? algo : "(unset)");
    return together(R, w, "after init");
  });
  std::vector<Kind> kinds = gQuick ? std::vector<Kind>{Kind::Plain, Kind::Window}
                                   : std::vector<Kind>{Kind::Plain, Kind::Registered, Kind::Window};
  for (Kind k : kinds) runCase(R, fmt("sweep_%s", kindName(k)), [&] { return together(R, sweep(R, k), "after a sweep"); });
  if (gExpectDifference) {
    runCase(R, "order_matters", [&] {
      // One rank's differences are enough to show that the data tells the orders apart.
      TC_EXPECT(gChecked > 0, "no element was checked");
      __atomic_add_fetch(&gBoard->mismatches, gMismatches, __ATOMIC_SEQ_CST);
      __atomic_add_fetch(&gBoard->checked, gChecked, __ATOMIC_SEQ_CST);
      TC_TRY(together(R, "", "after counting"));
      const long total = __atomic_load_n(&gBoard->mismatches, __ATOMIC_SEQ_CST);
      const long all = __atomic_load_n(&gBoard->checked, __ATOMIC_SEQ_CST);
      R.info = fmt("%ld of %ld elements unlike the rank-order value", total, all);
      TC_EXPECT(total > 0, "every one of %ld elements is as in rank order: the sweep cannot tell one order from another", all);
      return std::string();
    });
  }
  runCase(R, "destroy", [&] {
    TN_OK(ncclCommDestroy(gComm));
    gComm = nullptr;
    return oobBarrier(R, "after ncclCommDestroy");
  });
  freeRank(R);
  return 0;
}

} // namespace

int main(int argc, char** argv)
{
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (!strcmp(argv[i], "--expect-difference")) {
      gExpectDifference = true;
      continue;
    }
    args.push_back(argv[i]);
  }
  Options opt = parseArgs((int)args.size(), args.data(), 4);
  gQuick = opt.quick;
  gMeetingRules.othersFailureIsFatal = true;
  return runBoardGroup("nccl_determinism_test", &gBoard, "nccl_determinism", opt, 900, rankMain);
}
