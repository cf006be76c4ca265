// NCCL's API on GPUs, through our nccl.h and libnccl.so.2 alone (this program links no other library of
// ours): what the NCCL face carries out, each result checked element by element against a host reference,
// and what it refuses checked to be refused without touching the GPU.
//
// One process per rank, forked by the parent; rank r uses GPU r % GPUs, so every rank may share one GPU.
// Rank 0 makes each communicator's ncclUniqueId and hands its 128 bytes to the others through memory
// shared by the processes (as PyTorch hands it over its store).
//
//   nccl_gpu_test <all|main|kill|initall> [nranks] [--port P]
//
//   main: ncclGetVersion; ncclCommInitRank; Count / CuDevice / UserRank; ncclAllReduce (sum, prod, max, min,
//       avg) x (float16, bfloat16, float32, int32, int64, uint8, float64) x counts 0, 1, 1000, 65537,
//       2^20 + 3, in place and out of place; ncclAllGather, ncclReduceScatter (every operator), ncclBroadcast
//       (in and out of place) and ncclBcast from rank 0 and the last rank; ncclReduce (every operator on
//       float16, bfloat16, int32, float64, counts 1 to 2^20 + 3, roots 0 and last, a non-root's recvbuff NULL
//       or a real buffer left untouched, in place); ncclGather and ncclScatter (roots 0 and last, counts 1,
//       1000, 70001, 2^18 + 5 per rank, in and out of place, the buffer a non-root does not use NULL or
//       untouched) and ncclAlltoAll (counts 1 to 2^18 + 3 per peer, in and out of place) on uint8, bfloat16,
//       float32, float64; nothing written past an output, out of place the input untouched; three gathers
//       in packets back to back with the root late (on a communicator of its own); ncclSend/ncclRecv: a
//       ring in one group (1, 65537, 2^20 + 7 elements of uint8 and float32, aligned and 4 bytes off),
//       pairs both ways with the sends first, an all-to-all of sends and receives in one group (100003
//       float32 per pair, this rank included), a rank to itself, two sends to one peer received in order,
//       a send and a receive each alone outside a group (up to 1 MiB), a graph of a group replayed 5
//       times, and the bad ones (peer out of range, an unmatched send to self, a datatype out of range:
//       ncclInvalidArgument); collectives in one group, in nested groups, a group failed by a bad call; a
//       CUDA graph of an all-reduce replayed 10 times; ncclCommInitRankConfig blocking and non-blocking
//       (ncclInProgress, then ncclCommGetAsyncError reaches ncclSuccess); ncclMemAlloc buffers registered
//       with ncclCommRegister in three 4 MiB all-reduces (zero-copy); ncclMemAlloc memory mapped by the other ranks' processes
//       (1 MiB + 12 bytes filled with a rank's pattern on its stream, its cudaIpcGetMemHandle published on
//       the shared board, the next rank's buffer opened with cudaIpcOpenMemHandle and every byte checked by
//       a kernel where this device can reach it and by a copy to the host, closed, then ncclMemFree);
//       fp8 (ncclFloat8e4m3, ncclFloat8e5m2): AllReduce, ReduceScatter and Reduce (sum, max, min), AllGather,
//       Broadcast / Bcast, a ring of Send/Recv; the sums of small integers that every partial sum keeps
//       exact, max and min of any finite byte pattern (but -0), so that any order of reduction gives the
//       reference's bits; the host reference converts with cuda_fp8.h's types;
//       PreMulSum (ncclRedOpCreatePreMulSum) on float32, float16, bfloat16, float64, int32, in AllReduce
//       (1 to 2^20 + 3, in and out of place), ReduceScatter and Reduce (roots 0 and last): the reference is
//       the sum over the ranks of each input times the scalar, each product rounded to the type (values
//       chosen so that all is exact); with ncclScalarHostImmediate (the value read at the creation: the
//       variable changed afterwards changes nothing) and ncclScalarDevice (two all-reduces in a CUDA graph
//       replayed three times, the device scalar rewritten on the stream between replays: each replay uses
//       the value it finds); ncclRedOpDestroy, after which the operator is ncclInvalidArgument (in a
//       collective and in a second destroy);
//       ncclCommSplit: bad color, colors by parity with keys reversing the order, one color with keys
//       reversing the order, a split of that split (pairs, reversed again), NCCL_SPLIT_NOCOLOR for the last
//       rank (*newcomm NULL); on each new communicator Count / UserRank / CuDevice as the keys say, and
//       all-reduces and all-gathers (packets and copies) checked against the reference of its own ranks;
//       ncclCommShrink: bad input, the last rank left out (NCCL_SHRINK_DEFAULT) and the others' new
//       communicator working, the parent untouched; ncclCommRevoke on a split of its own (the main
//       communicator is never revoked): a peer not yet revoked sees ncclRemoteError (from
//       ncclCommGetAsyncError and from a collective), then on the revoked communicator collectives, sends,
//       splits and registrations are ncclInvalidUsage with nothing queued, the queries answer,
//       ncclCommGetAsyncError says ncclSuccess, a shrink of it leaving nobody out works, and ncclCommAbort /
//       ncclCommDestroy free it; NCCL's device API (ncclDevCommCreate / Destroy) is not offered:
//       ncclInvalidUsage naming it, nothing queued, the communicator still works; host memory as a buffer is
//       ncclInvalidArgument; ncclCommFinalize, ncclCommDestroy; then cudaDeviceReset (for
//       compute-sanitizer's leak check)
//   kill: every rank loops on all-reduces, then (a second run) on one all-reduce captured in a CUDA graph
//       and the graph launched again and again, then (a third) on groups of a send of 4 MiB to the next
//       rank and a receive from the previous; the last is SIGKILLed; every survivor sees ncclRemoteError
//       from ncclCommGetAsyncError within seconds, its stream drains, the next call fails with the same
//       code, ncclGetLastError names the dead rank; the survivors then ncclCommShrink the dead rank out
//       (NCCL_SHRINK_ABORT), run an all-reduce on their new communicator checked against the host
//       reference, destroy it, ncclCommAbort the old one, and make a new communicator of the survivors
//       from a fresh unique id on the same GPU(s) (an all-reduce on it checked, then its destroy): the dead
//       rank's memory, gone while their kernels may have been writing into it, must not have faulted them
//   initall: ncclCommInitAll in one process with one device, with a device that does not exist (refused at
//       once, ncclInvalidArgument naming it and the count), and with every GPU where there are several
//       (all-reduces on each in one group)
//
// Output: one line per case (PASS name [note] / FAIL name: reason / SKIP name: why), a SUMMARY line per group.
// Exit code 0 only if every case passed. MSCCLPP_TEST_TIMEOUT_SCALE multiplies every deadline.
//
// The harness (c-tests/harness/: nccl_rank.h, kill_case.h) calls nothing of libmscclpp, and the link
// (-lnccl only) would fail if anything here did.
#include "kill_case.h"
#include "nccl_rank.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

using namespace tc;

namespace {

// ------------------------------------------------------------------------------------------------
// What the processes of one group share beside case_runner's results: the unique ids rank 0 makes, the
// barriers' meeting (nccl_rank.h)
// ------------------------------------------------------------------------------------------------

constexpr int kMaxIds = 8;

struct Board
{
  SharedId ids[kMaxIds];
  volatile int skipMultiDevice; // initall: set by the rank where only one GPU is visible
  char skipWhy[200];
  Meeting meeting;
  int gatherHung; // gather_back_to_back: set by the root when its gathers did not finish
  cudaIpcMemHandle_t memHandles[kMaxRanks]; // memalloc_mapped_by_peers: each rank's ncclMemAlloc buffer
};

Board* gBoard = nullptr;      // mapped shared by the parent before the ranks are forked
ncclComm_t gComm = nullptr;   // the rank's communicator of the main group
char* gPoolA = nullptr;       // device memory the cases carve their buffers from (inputs)
char* gPoolB = nullptr;       // (outputs)
uint64_t gPoolBytes = 0;
int gRanks = 2;               // ranks of the group (setUpRank): the fp8 sums' values are sized by it

// The id of communicator `slot`: rank 0 makes it, the others wait for it (bounded).
std::string shareId(Rank& R, int slot, ncclUniqueId* id)
{
  if (slot < 0 || slot >= kMaxIds) return "internal: id slot out of range";
  return shareUniqueId(R, gBoard->ids[slot], id, fmt("rank 0 did not publish unique id %d", slot));
}

// CUDA device, stream, the status block syncBounded reads, and the buffer pools (sized for the largest call:
// an all-gather of 2^20 + 3 float64 per rank).
std::string setUpRank(Rank& R)
{
  TC_TRY(setUpDevice(R));
  gRanks = R.nranks;
  gPoolBytes = (uint64_t)R.nranks * ((1u << 20) + 3) * 8 + (1u << 16);
  TC_CUDA(cudaMalloc((void**)&gPoolA, gPoolBytes));
  TC_CUDA(cudaMalloc((void**)&gPoolB, gPoolBytes));
  return "";
}

void freeRankBuffers(Rank& R)
{
  if (gPoolA) cudaFree(gPoolA);
  if (gPoolB) cudaFree(gPoolB);
  gPoolA = gPoolB = nullptr;
  freeRank(R);
}

// ------------------------------------------------------------------------------------------------
// Types, values and the host reference
// ------------------------------------------------------------------------------------------------

const ncclDataType_t kTypes[] = {ncclFloat16, ncclBfloat16, ncclFloat32, ncclInt32, ncclInt64, ncclUint8, ncclFloat64};
const std::vector<ncclRedOp_t> kOps = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
// fp8's operators here: those whose result any order of reduction gives exactly (inputValue).
const std::vector<ncclRedOp_t> kFp8Ops = {ncclSum, ncclMax, ncclMin};
const ncclDataType_t kFp8Types[] = {ncclFloat8e4m3, ncclFloat8e5m2};
// Gather, Scatter, AlltoAll move bytes: one type per element size.
const ncclDataType_t kMoveTypes[] = {ncclUint8, ncclBfloat16, ncclFloat32, ncclFloat64};

const char* opName(ncclRedOp_t op)
{
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (int)op >= 0 && (int)op < 5 ? names[(int)op] : "?";
}

// The float types whose results are compared with a tolerance (fp8 results are compared exactly).
bool isFloat(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64; }

bool isFp8(ncclDataType_t t) { return t == ncclFloat8e4m3 || t == ncclFloat8e5m2; }

// The value of an fp8 byte, by cuda_fp8.h's conversion (on the host).
double fp8Value(ncclDataType_t t, uint8_t bits)
{
  if (t == ncclFloat8e4m3) {
    __nv_fp8_e4m3 v;
    v.__x = bits;
    return (double)static_cast<float>(v);
  }
  __nv_fp8_e5m2 v;
  v.__x = bits;
  return (double)static_cast<float>(v);
}

void storeElem(ncclDataType_t t, void* base, uint64_t i, double v)
{
  switch (t) {
  case ncclInt8: ((int8_t*)base)[i] = (int8_t)v; break;
  case ncclUint8: ((uint8_t*)base)[i] = (uint8_t)v; break;
  case ncclInt32: ((int32_t*)base)[i] = (int32_t)v; break;
  case ncclUint32: ((uint32_t*)base)[i] = (uint32_t)v; break;
  case ncclInt64: ((int64_t*)base)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t*)base)[i] = (uint64_t)v; break;
  case ncclFloat16: ((__half*)base)[i] = __float2half((float)v); break;
  case ncclBfloat16: ((__nv_bfloat16*)base)[i] = __float2bfloat16((float)v); break;
  case ncclFloat8e4m3: ((__nv_fp8_e4m3*)base)[i] = __nv_fp8_e4m3(v); break;
  case ncclFloat8e5m2: ((__nv_fp8_e5m2*)base)[i] = __nv_fp8_e5m2(v); break;
  case ncclFloat32: ((float*)base)[i] = (float)v; break;
  default: ((double*)base)[i] = v; break;
  }
}

double loadElem(ncclDataType_t t, const void* base, uint64_t i)
{
  switch (t) {
  case ncclInt8: return ((const int8_t*)base)[i];
  case ncclUint8: return ((const uint8_t*)base)[i];
  case ncclInt32: return ((const int32_t*)base)[i];
  case ncclUint32: return ((const uint32_t*)base)[i];
  case ncclInt64: return (double)((const int64_t*)base)[i];
  case ncclUint64: return (double)((const uint64_t*)base)[i];
  case ncclFloat16: return __half2float(((const __half*)base)[i]);
  case ncclBfloat16: return __bfloat162float(((const __nv_bfloat16*)base)[i]);
  case ncclFloat8e4m3: return (double)static_cast<float>(((const __nv_fp8_e4m3*)base)[i]);
  case ncclFloat8e5m2: return (double)static_cast<float>(((const __nv_fp8_e5m2*)base)[i]);
  case ncclFloat32: return ((const float*)base)[i];
  default: return ((const double*)base)[i];
  }
}

// The value rank `from` contributes at index i, already rounded to the type. Chosen per operator so that
// every order of reduction gives the exact result on 2 and 4 ranks (quarters of at most 8 for sums, powers of
// two for products, wider ranges for max and min, 64-bit ones for int64), and never overflowing the type.
// fp8: max and min (and the collectives that move data, see moveGen) take any finite byte but -0 (max(+0, -0)
// may be either); sums take integers small enough that every partial sum over the group's ranks stays exact
// (e4m3 holds every integer up to 16, e5m2 up to 8).
double inputValue(ncclDataType_t t, ncclRedOp_t op, int from, uint64_t i, uint32_t salt)
{
  const uint64_t h = mix64(((uint64_t)salt << 40) ^ ((uint64_t)(from & 0xff) << 32) ^ i ^ ((uint64_t)t << 56));
  if (isFp8(t)) {
    if (op == ncclMax || op == ncclMin) {
      uint8_t b = (uint8_t)(h & 0xff);
      if (t == ncclFloat8e4m3 && (b & 0x7f) == 0x7f) b ^= 0x01; // NaN: +-448 instead
      if (t == ncclFloat8e5m2 && (b & 0x7c) == 0x7c) b ^= 0x04; // Inf and NaN: a finite value instead
      if (b == 0x80) b = 0;                                     // -0
      return fp8Value(t, b);
    }
    const int lim = std::max(1, (t == ncclFloat8e4m3 ? 16 : 8) / std::max(1, gRanks));
    return (double)((int64_t)(h % (uint64_t)(2 * lim + 1)) - lim);
  }
  double v;
  switch (op) {
  case ncclProd:
    if (t == ncclUint8) v = 1 + (double)(h % 3);
    else if (isFloat(t)) { static const double k[] = {-2, -1, -0.5, 0.5, 1, 2}; v = k[h % 6]; }
    else { static const double k[] = {-2, -1, 1, 2}; v = k[h % 4]; }
    break;
  case ncclMax:
  case ncclMin:
    if (t == ncclUint8) v = (double)(h % 256);
    else if (t == ncclInt64) v = (double)((int64_t)(h % (1ull << 41)) - (int64_t)(1ull << 40));
    else if (isFloat(t)) v = ((double)(h % 513) - 256.0) / 4.0;
    else v = (double)((int64_t)(h % 2000001) - 1000000);
    break;
  default: // sum, avg, and the collectives that do not reduce
    if (t == ncclUint8) v = (double)(h % 16);
    else if (isFloat(t)) v = ((double)(h % 65) - 32.0) / 4.0;
    else v = (double)((int64_t)(h % 17) - 8);
    break;
  }
  uint64_t bits[1] = {0};
  storeElem(t, bits, 0, v);
  return loadElem(t, bits, 0);
}

// op over the values of every rank, as NCCL defines it (avg: the sum divided by nranks, integers truncated
// toward zero), rounded to the type.
double reduceRef(ncclDataType_t t, ncclRedOp_t op, int nranks, const std::function<double(int)>& valueOf)
{
  double acc = valueOf(0);
  for (int k = 1; k < nranks; ++k) {
    const double v = valueOf(k);
    switch (op) {
    case ncclProd: acc *= v; break;
    case ncclMax: acc = std::max(acc, v); break;
    case ncclMin: acc = std::min(acc, v); break;
    default: acc += v; break;
    }
  }
  if (op == ncclAvg) acc = isFloat(t) ? acc / nranks : std::trunc(acc / nranks);
  uint64_t bits[1] = {0};
  storeElem(t, bits, 0, acc);
  return loadElem(t, bits, 0);
}

bool closeEnough(ncclDataType_t t, double got, double want)
{
  if (!isFloat(t)) return got == want;
  const double rel = t == ncclFloat16 ? 1e-3 : t == ncclBfloat16 ? 8e-3 : t == ncclFloat32 ? 1e-6 : 1e-12;
  return std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
}

// v rounded to the type (as storing it and reading it back).
double rounded(ncclDataType_t t, double v)
{
  uint64_t bits[1] = {0};
  storeElem(t, bits, 0, v);
  return loadElem(t, bits, 0);
}

// The values of the collectives that move data (no reduction): inputValue's for this operator. fp8: any
// finite byte pattern; the other types as before.
ncclRedOp_t moveGen(ncclDataType_t t) { return isFp8(t) ? ncclMax : ncclSum; }

// PreMulSum's inputs: integers in [-4, 4], so that every product with the scalars of the cases (1.5, -0.75,
// 2.5; for int32 3, -2, 5) and every partial sum over up to 8 ranks is exact in every type (bfloat16's 8
// significant bits included): any order of reduction gives the reference's value.
double premulInput(ncclDataType_t t, int from, uint64_t i, uint32_t salt)
{
  const uint64_t h =
    mix64(((uint64_t)salt << 40) ^ ((uint64_t)(from & 0xff) << 32) ^ i ^ ((uint64_t)t << 56) ^ 0x5bd1e995ull);
  return (double)((int64_t)(h % 9) - 4);
}

// One value of type t in the low bytes of 8 (a PreMulSum scalar).
uint64_t scalarBits(ncclDataType_t t, double v)
{
  uint64_t bits[1] = {0};
  storeElem(t, bits, 0, v);
  return bits[0];
}

// ------------------------------------------------------------------------------------------------
// One collective call: prepared (buffers carved from the pools, inputs uploaded, outputs set to a sentinel),
// issued (alone or inside a group), checked (every output element, the bytes after it, out of place the
// input).
// ------------------------------------------------------------------------------------------------

enum Coll : int
{
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast, // ncclBroadcast
  kBcast,     // ncclBcast (in place by definition)
  kReduce,
  kGather,
  kScatter,
  kAlltoAll,
};

const char* collName(Coll c)
{
  static const char* names[] = {"allreduce", "allgather", "reducescatter", "broadcast", "bcast",
                                "reduce",    "gather",    "scatter",       "alltoall"};
  return names[c];
}

constexpr uint64_t kGuard = 256;      // bytes after each output that nobody may write
constexpr unsigned char kSentinel = 0xA5;
constexpr unsigned char kGuardByte = 0x5A;

struct Spec
{
  Coll coll = kAllReduce;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  uint64_t count = 0; // NCCL's count argument (sendcount, recvcount)
  bool inPlace = false;
  int root = 0;
  uint32_t salt = 1;
  // Reduce and Gather: a non-root passes NULL as recvbuff; Scatter: as sendbuff (the buffer NCCL does not
  // use there). Otherwise that rank passes a real buffer, which must be left untouched.
  bool nullOther = false;
  // Buffers given by the case (ncclMemAlloc's) instead of the pools; out of place only.
  char* extSend = nullptr;
  char* extRecv = nullptr;
  // PreMulSum (AllReduce, ReduceScatter, Reduce): the call passes `premulOp` (made by ncclRedOpCreatePreMulSum
  // with `scalar`), the inputs are premulInput's, and the reference is the sum over the ranks of each input
  // times `scalar`, each product rounded to the type first. `op` is not used then.
  bool premul = false;
  ncclRedOp_t premulOp = ncclSum;
  double scalar = 1;
};

std::string describe(const Spec& s)
{
  std::string d = fmt("%s %s", collName(s.coll), typeName(s.type));
  if (s.premul) d += fmt(" premulsum (op %d) x %g", (int)s.premulOp, s.scalar);
  else if (s.coll == kAllReduce || s.coll == kReduceScatter || s.coll == kReduce) d += fmt(" %s", opName(s.op));
  if (s.coll == kBroadcast || s.coll == kBcast || s.coll == kReduce || s.coll == kGather || s.coll == kScatter)
    d += fmt(" root %d", s.root);
  if (s.nullOther && !s.inPlace) d += " (NULL where unused)";
  return d + fmt(" count %llu %s", (unsigned long long)s.count, s.inPlace ? "in place" : "out of place");
}

struct Prepared
{
  Spec s;
  const void* send = nullptr;
  void* recv = nullptr;
  char* outBase = nullptr; // the output region as a whole (in place: inside the one buffer)
  uint64_t outBytes = 0;
  char* inBase = nullptr;  // out of place: the input, checked untouched
  std::vector<unsigned char> input;
  std::vector<double> want; // per output element
  std::vector<char> stay;   // where non-empty: output elements that must still hold the sentinel
};

// The next free bytes of a pool, 256-byte aligned.
struct Arena
{
  uint64_t a = 0, b = 0;
};

std::string carve(Rank& R, char* pool, uint64_t* used, uint64_t bytes, char** out)
{
  const uint64_t at = (*used + 255) & ~255ull;
  if (at + bytes > gPoolBytes) {
    R.fatal = true;
    return fmt("internal: the pool is too small (%llu + %llu bytes)", (unsigned long long)at, (unsigned long long)bytes);
  }
  *used = at + bytes;
  *out = pool + at;
  return "";
}

std::string prepareRooted(Rank& R, const Spec& s, Arena& arena, Prepared* p);

// The value rank `from` puts at element i of its input, and what it adds to a reduction there (PreMulSum:
// times the scalar, rounded to the type).
double inputOf(const Spec& s, int from, uint64_t i)
{
  if (s.premul) return premulInput(s.type, from, i, s.salt);
  const bool reduces = s.coll == kAllReduce || s.coll == kReduceScatter || s.coll == kReduce;
  return inputValue(s.type, reduces ? s.op : moveGen(s.type), from, i, s.salt);
}

double termOf(const Spec& s, int from, uint64_t i)
{
  return s.premul ? rounded(s.type, inputOf(s, from, i) * s.scalar) : inputOf(s, from, i);
}

// The reduction of every rank's term at element i of their inputs.
double reductionAt(const Spec& s, int nranks, uint64_t i)
{
  return reduceRef(s.type, s.premul ? ncclSum : s.op, nranks, [&](int k) { return termOf(s, k, i); });
}

// AllReduce, AllGather, ReduceScatter, Broadcast: the reference of each element of R's output.
std::vector<double> wantOf(const Rank& R, const Spec& s)
{
  const int N = R.nranks, me = R.rank;
  const uint64_t n = s.count;
  const uint64_t outElems = s.coll == kAllGather ? n * N : n;
  std::vector<double> want(outElems);
  for (uint64_t j = 0; j < outElems; ++j) {
    switch (s.coll) {
    case kAllReduce: want[j] = reductionAt(s, N, j); break;
    case kReduceScatter: want[j] = reductionAt(s, N, (uint64_t)me * n + j); break;
    case kAllGather: want[j] = inputOf(s, (int)(j / n), j % n); break;
    default: want[j] = inputOf(s, s.root, j); break;
    }
  }
  return want;
}

std::string prepare(Rank& R, const Spec& s, Arena& arena, Prepared* p)
{
  if (s.coll >= kReduce) return prepareRooted(R, s, arena, p);
  p->s = s;
  const int N = R.nranks, me = R.rank;
  const uint64_t n = s.count, es = typeSize(s.type);
  uint64_t inElems = n, outElems = n;
  if (s.coll == kAllGather) outElems = n * N;
  if (s.coll == kReduceScatter) inElems = n * N;
  const uint64_t inBytes = inElems * es;
  p->outBytes = outElems * es;

  // This rank's input, and the reference of its output.
  p->input.assign(inBytes, 0);
  for (uint64_t i = 0; i < inElems; ++i) storeElem(s.type, p->input.data(), i, inputOf(s, me, i));
  p->want = wantOf(R, s);
  if (n == 0) {
    // NCCL allows any pointers for an empty call; NULL is the hardest case.
    p->send = nullptr;
    p->recv = nullptr;
    return "";
  }

  if (s.extSend || s.extRecv) {
    TC_EXPECT(s.extSend && s.extRecv && !s.inPlace, "internal: external buffers are for out-of-place calls");
    p->inBase = s.extSend;
    p->outBase = s.extRecv;
  } else if (!s.inPlace) {
    TC_TRY(carve(R, gPoolA, &arena.a, inBytes, &p->inBase));
    TC_TRY(carve(R, gPoolB, &arena.b, p->outBytes + kGuard, &p->outBase));
  } else {
    // One buffer: NCCL's in-place layouts (all-gather's input is this rank's piece of the output,
    // reduce-scatter's output is this rank's piece of the input).
    const uint64_t bytes = std::max(inBytes, p->outBytes);
    char* buf = nullptr;
    TC_TRY(carve(R, gPoolB, &arena.b, bytes + kGuard, &buf));
    p->outBase = buf;
    if (s.coll == kReduceScatter) p->outBase = buf + (uint64_t)me * n * es;
  }
  char* whole = s.inPlace ? p->outBase - (s.coll == kReduceScatter ? (uint64_t)me * n * es : 0) : p->outBase;
  const uint64_t wholeBytes = s.inPlace ? std::max(inBytes, p->outBytes) : p->outBytes;
  // Sentinel over the output, guard bytes after the buffer (external buffers have no room for a guard).
  TC_CUDA(cudaMemsetAsync(whole, kSentinel, wholeBytes, R.stream));
  if (!s.extRecv) TC_CUDA(cudaMemsetAsync(whole + wholeBytes, kGuardByte, kGuard, R.stream));
  char* sendAt = nullptr;
  if (!s.inPlace) {
    sendAt = p->inBase;
    p->recv = p->outBase;
  } else if (s.coll == kAllGather) {
    sendAt = p->outBase + (uint64_t)me * n * es;
    p->recv = p->outBase;
  } else {
    sendAt = whole;
    p->recv = p->outBase;
  }
  TC_CUDA(cudaMemcpyAsync(sendAt, p->input.data(), inBytes, cudaMemcpyHostToDevice, R.stream));
  p->send = sendAt;
  return "";
}

// Reduce, Gather, Scatter, AlltoAll in NCCL's layouts. Out of place a rank's output region is its recvbuff
// (none where it passes NULL), its input its sendbuff. In place the one buffer is the output region as a
// whole: Gather's sendbuff is piece `rank` of it, Scatter's recvbuff piece `rank`; what a rank must not write
// there (a gather's non-root: the other pieces; a scatter's non-root: the other pieces) is marked to stay.
std::string prepareRooted(Rank& R, const Spec& s, Arena& arena, Prepared* p)
{
  p->s = s;
  const int N = R.nranks, me = R.rank;
  const bool root = me == s.root;
  const uint64_t n = s.count, es = typeSize(s.type);
  // Elements of this rank's sendbuff and recvbuff as NCCL sizes them on the root (and on every rank for
  // AlltoAll); a non-root's unused buffer has the root's size here too.
  const uint64_t inElems = (s.coll == kScatter || s.coll == kAlltoAll) ? n * N : n;
  const uint64_t outElems = (s.coll == kGather || s.coll == kAlltoAll) ? n * N : n;
  // The value at element i of rank `from`'s sendbuff.
  auto in = [&](int from, uint64_t i) { return inputOf(s, from, i); };
  // Whether this rank's sendbuff / recvbuff is used by NCCL.
  const bool usesIn = s.coll != kScatter || root;
  const bool usesOut = (s.coll != kReduce && s.coll != kGather) || root;

  // What this rank uploads (a scatter's non-root: its own values into the buffer NCCL does not read).
  p->input.assign(inElems * es, 0);
  for (uint64_t i = 0; i < inElems; ++i) storeElem(s.type, p->input.data(), i, in(me, i));
  // What NCCL's output is at element j of this rank's output region (out of place: recvbuff).
  auto result = [&](uint64_t j) -> double {
    switch (s.coll) {
    case kReduce: return reductionAt(s, N, j);
    case kGather: return in((int)(j / n), j % n);
    case kScatter: return in(s.root, (uint64_t)me * n + j);
    default: return in((int)(j / n), (uint64_t)me * n + j % n);
    }
  };
  if (n == 0) {
    p->send = nullptr;
    p->recv = nullptr;
    return "";
  }

  if (!s.inPlace) {
    const bool nullIn = !usesIn && s.nullOther, nullOut = !usesOut && s.nullOther;
    if (!nullIn) TC_TRY(carve(R, gPoolA, &arena.a, inElems * es, &p->inBase));
    if (!nullOut) {
      TC_TRY(carve(R, gPoolB, &arena.b, outElems * es + kGuard, &p->outBase));
      p->outBytes = outElems * es;
      p->want.resize(outElems);
      if (usesOut) {
        for (uint64_t j = 0; j < outElems; ++j) p->want[j] = result(j);
      } else {
        p->stay.assign(outElems, 1);
      }
      TC_CUDA(cudaMemsetAsync(p->outBase, kSentinel, p->outBytes, R.stream));
      TC_CUDA(cudaMemsetAsync(p->outBase + p->outBytes, kGuardByte, kGuard, R.stream));
    }
    if (p->inBase) TC_CUDA(cudaMemcpyAsync(p->inBase, p->input.data(), p->input.size(), cudaMemcpyHostToDevice, R.stream));
    p->send = p->inBase;
    p->recv = p->outBase;
    if (!p->inBase) p->input.clear(); // nothing to check
    return "";
  }

  // In place: one buffer of the larger size.
  const uint64_t whole = std::max(inElems, outElems);
  char* buf = nullptr;
  TC_TRY(carve(R, gPoolB, &arena.b, whole * es + kGuard, &buf));
  p->outBase = buf;
  p->outBytes = whole * es;
  TC_CUDA(cudaMemsetAsync(buf, kSentinel, p->outBytes, R.stream));
  TC_CUDA(cudaMemsetAsync(buf + p->outBytes, kGuardByte, kGuard, R.stream));
  p->want.assign(whole, 0);
  p->stay.assign(whole, 0);
  const uint64_t piece = (uint64_t)me * n; // this rank's piece of the buffer, in elements
  switch (s.coll) {
  case kReduce: // the root's result; a non-root's buffer is its input, unread and unwritten
    for (uint64_t j = 0; j < n; ++j) p->want[j] = root ? result(j) : in(me, j);
    TC_CUDA(cudaMemcpyAsync(buf, p->input.data(), n * es, cudaMemcpyHostToDevice, R.stream));
    p->send = p->recv = buf;
    break;
  case kGather: // sendbuff is piece `rank` of the root's output
    for (uint64_t j = 0; j < whole; ++j) {
      if (root) p->want[j] = result(j);
      else if (j >= piece && j < piece + n) p->want[j] = in(me, j - piece);
      else p->stay[j] = 1;
    }
    TC_CUDA(cudaMemcpyAsync(buf + piece * es, p->input.data(), n * es, cudaMemcpyHostToDevice, R.stream));
    p->send = buf + piece * es;
    p->recv = buf;
    break;
  case kScatter: // recvbuff is piece `rank` of the root's input; a non-root's other pieces are not its own
    for (uint64_t j = 0; j < whole; ++j) {
      if (root) p->want[j] = in(me, j);
      else if (j >= piece && j < piece + n) p->want[j] = result(j - piece);
      else p->stay[j] = 1;
    }
    if (root) TC_CUDA(cudaMemcpyAsync(buf, p->input.data(), whole * es, cudaMemcpyHostToDevice, R.stream));
    p->send = buf;
    p->recv = buf + piece * es;
    break;
  default:
    for (uint64_t j = 0; j < whole; ++j) p->want[j] = result(j);
    TC_CUDA(cudaMemcpyAsync(buf, p->input.data(), whole * es, cudaMemcpyHostToDevice, R.stream));
    p->send = p->recv = buf;
    break;
  }
  return "";
}

ncclResult_t issue(const Prepared& p, ncclComm_t comm, cudaStream_t stream)
{
  const Spec& s = p.s;
  const ncclRedOp_t op = s.premul ? s.premulOp : s.op;
  switch (s.coll) {
  case kReduce: return ncclReduce(p.send, p.recv, s.count, s.type, op, s.root, comm, stream);
  case kGather: return ncclGather(p.send, p.recv, s.count, s.type, s.root, comm, stream);
  case kScatter: return ncclScatter(p.send, p.recv, s.count, s.type, s.root, comm, stream);
  case kAlltoAll: return ncclAlltoAll(p.send, p.recv, s.count, s.type, comm, stream);
  case kAllReduce: return ncclAllReduce(p.send, p.recv, s.count, s.type, op, comm, stream);
  case kAllGather: return ncclAllGather(p.send, p.recv, s.count, s.type, comm, stream);
  case kReduceScatter: return ncclReduceScatter(p.send, p.recv, s.count, s.type, op, comm, stream);
  case kBroadcast: return ncclBroadcast(p.send, p.recv, s.count, s.type, s.root, comm, stream);
  default: return ncclBcast(p.recv, s.count, s.type, s.root, comm, stream);
  }
}

// Checks the output (after the stream has drained), the guard, and out of place the input.
std::string check(Rank& R, const Prepared& p)
{
  const Spec& s = p.s;
  if (s.count == 0) return "";
  // A non-root passing NULL as recvbuff has no output region.
  std::vector<unsigned char> out(p.outBase ? p.outBytes + (s.extRecv ? 0 : kGuard) : 0);
  if (p.outBase) TC_CUDA(cudaMemcpyAsync(out.data(), p.outBase, out.size(), cudaMemcpyDeviceToHost, R.stream));
  std::vector<unsigned char> in;
  if (!s.inPlace && p.inBase) {
    in.resize(p.input.size());
    TC_CUDA(cudaMemcpyAsync(in.data(), p.inBase, in.size(), cudaMemcpyDeviceToHost, R.stream));
  }
  TC_TRY(syncBounded(R, "copy of the results"));
  uint64_t bad = 0, first = 0, moved = 0, firstMoved = 0;
  double got0 = 0, want0 = 0;
  const uint64_t es = typeSize(s.type);
  for (uint64_t j = 0; j < p.want.size(); ++j) {
    if (!p.stay.empty() && p.stay[j]) {
      // An element NCCL does not write on this rank: every byte still the sentinel.
      bool same = true;
      for (uint64_t b = 0; b < es; ++b) same = same && out[j * es + b] == kSentinel;
      if (!same && moved++ == 0) firstMoved = j;
      continue;
    }
    const double got = loadElem(s.type, out.data(), j);
    if (!closeEnough(s.type, got, p.want[j])) {
      if (bad++ == 0) {
        first = j;
        got0 = got;
        want0 = p.want[j];
      }
    }
  }
  TC_EXPECT(bad == 0, "%s: %llu of %llu elements wrong, first at %llu: got %.17g, want %.17g", describe(s).c_str(),
            (unsigned long long)bad, (unsigned long long)p.want.size(), (unsigned long long)first, got0, want0);
  TC_EXPECT(moved == 0, "%s: %llu elements this rank must not write were written, first at %llu", describe(s).c_str(),
            (unsigned long long)moved, (unsigned long long)firstMoved);
  if (!s.extRecv && p.outBase) {
    // In place the guard follows the whole buffer; out of place the output.
    const uint64_t guardAt = p.outBytes;
    if (!(s.inPlace && s.coll == kReduceScatter)) {
      for (uint64_t k = 0; k < kGuard; ++k)
        TC_EXPECT(out[guardAt + k] == kGuardByte, "%s: byte %llu after the output was written (0x%02x)",
                  describe(s).c_str(), (unsigned long long)k, out[guardAt + k]);
    }
  }
  if (!s.inPlace && p.inBase) {
    TC_EXPECT(in == p.input, "%s: the input buffer was changed by an out-of-place call", describe(s).c_str());
  }
  return "";
}

// prepare + issue + sync + check, on `comm`.
std::string runOne(Rank& R, ncclComm_t comm, const Spec& s)
{
  Arena arena;
  Prepared p;
  TC_TRY(prepare(R, s, arena, &p));
  ncclResult_t r = issue(p, comm, R.stream);
  TC_EXPECT(r == ncclSuccess, "%s returned %s: %s", describe(s).c_str(), resultName(r), lastError(comm).c_str());
  TC_TRY(syncBounded(R, describe(s).c_str()));
  return check(R, p);
}

const uint64_t kCounts[] = {0, 1, 1000, 65537, (1u << 20) + 3};
const uint64_t kCountsRs[] = {0, 1, 1000, 65537}; // reduce-scatter: nranks x count in, every operator

uint32_t gSalt = 100; // every call of the rank's sequence its own data (the same sequence on every rank)

// ------------------------------------------------------------------------------------------------
// Cases of the main group
// ------------------------------------------------------------------------------------------------

std::string caseInit(Rank& R)
{
  int v = 0;
  TN_OK(ncclGetVersion(&v));
  TC_EXPECT(v == NCCL_VERSION_CODE && v == 23203, "ncclGetVersion gave %d, expected 23203", v);
  ncclUniqueId id;
  TC_TRY(shareId(R, 0, &id));
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, R.nranks, id, R.rank);
  if (r != ncclSuccess || comm == nullptr) {
    R.fatal = true;
    return fmt("ncclCommInitRank(nranks %d, rank %d) returned %s (comm %p): %s", R.nranks, R.rank, resultName(r),
               (void*)comm, lastError(nullptr).c_str());
  }
  gComm = comm;
  int count = -1, dev = -1, rank = -1;
  TN_OK(ncclCommCount(comm, &count));
  TN_OK(ncclCommCuDevice(comm, &dev));
  TN_OK(ncclCommUserRank(comm, &rank));
  TC_EXPECT(count == R.nranks && dev == R.device && rank == R.rank,
            "Count/CuDevice/UserRank say %d/%d/%d, expected %d/%d/%d", count, dev, rank, R.nranks, R.device, R.rank);
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(comm, &async));
  TC_EXPECT(async == ncclSuccess, "ncclCommGetAsyncError of a new communicator gave %s", resultName(async));
  R.info = fmt("%d ranks on %d GPUs", R.nranks, R.nGpus);
  return "";
}

// `coll` of type `t` with operator `op` (unused by the moving collectives) at each of `counts`, out of place
// and in place, each call checked.
template <size_t N>
std::string sweepCounts(Rank& R, Coll coll, ncclDataType_t t, ncclRedOp_t op, const uint64_t (&counts)[N])
{
  for (uint64_t n : counts)
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      Spec s;
      s.coll = coll;
      s.type = t;
      s.op = op;
      s.count = n;
      s.inPlace = inPlace;
      s.salt = ++gSalt;
      TC_TRY(runOne(R, gComm, s));
    }
  return "";
}

std::string caseAllReduce(Rank& R, ncclDataType_t t, ncclRedOp_t op) { return sweepCounts(R, kAllReduce, t, op, kCounts); }

std::string caseAllGather(Rank& R, ncclDataType_t t) { return sweepCounts(R, kAllGather, t, ncclSum, kCounts); }

std::string caseReduceScatter(Rank& R, ncclDataType_t t, const std::vector<ncclRedOp_t>& ops = kOps)
{
  for (ncclRedOp_t op : ops) TC_TRY(sweepCounts(R, kReduceScatter, t, op, kCountsRs));
  return "";
}

std::string caseBroadcast(Rank& R, ncclDataType_t t)
{
  for (int root : {0, R.nranks - 1})
    for (uint64_t n : kCounts)
      for (int form = 0; form < 3; ++form) { // ncclBroadcast out of place, in place; ncclBcast
        Spec s;
        s.coll = form == 2 ? kBcast : kBroadcast;
        s.type = t;
        s.count = n;
        s.inPlace = form != 0;
        s.root = root;
        s.salt = ++gSalt;
        TC_TRY(runOne(R, gComm, s));
      }
  return "";
}

// Several collectives of different kinds between one ncclGroupStart and its ncclGroupEnd.
std::string caseGroupSeveral(Rank& R)
{
  Spec a, b, c;
  a.coll = kAllReduce, a.type = ncclFloat32, a.op = ncclSum, a.count = 1000, a.salt = ++gSalt;
  b.coll = kAllGather, b.type = ncclInt32, b.count = 4097, b.salt = ++gSalt;
  c.coll = kBroadcast, c.type = ncclBfloat16, c.count = 65537, c.root = R.nranks - 1, c.salt = ++gSalt;
  Arena arena;
  Prepared p[3];
  TC_TRY(prepare(R, a, arena, &p[0]));
  TC_TRY(prepare(R, b, arena, &p[1]));
  TC_TRY(prepare(R, c, arena, &p[2]));
  TN_OK(ncclGroupStart());
  ncclResult_t rc[3];
  for (int i = 0; i < 3; ++i) rc[i] = issue(p[i], gComm, R.stream);
  ncclResult_t end = ncclGroupEnd();
  for (int i = 0; i < 3; ++i)
    TC_EXPECT(rc[i] == ncclSuccess, "%s inside the group returned %s", describe(p[i].s).c_str(), resultName(rc[i]));
  TC_EXPECT(end == ncclSuccess, "ncclGroupEnd returned %s: %s", resultName(end), lastError(gComm).c_str());
  TC_TRY(syncBounded(R, "the group's collectives"));
  for (int i = 0; i < 3; ++i) TC_TRY(check(R, p[i]));
  return "";
}

// Nested groups: nothing is issued at the inner end; everything at the outermost.
std::string caseGroupNested(Rank& R)
{
  Spec a, b;
  a.coll = kAllReduce, a.type = ncclFloat64, a.op = ncclMax, a.count = 1000, a.salt = ++gSalt;
  b.coll = kReduceScatter, b.type = ncclFloat16, b.op = ncclSum, b.count = 333, b.inPlace = true, b.salt = ++gSalt;
  Arena arena;
  Prepared p[2];
  TC_TRY(prepare(R, a, arena, &p[0]));
  TC_TRY(prepare(R, b, arena, &p[1]));
  TC_TRY(syncBounded(R, "the inputs"));
  TN_OK(ncclGroupStart());
  TN_OK(ncclGroupStart());
  ncclResult_t r0 = issue(p[0], gComm, R.stream);
  ncclResult_t inner = ncclGroupEnd();
  // The outer group is still open: the all-reduce must not have been issued.
  TC_TRY(syncBounded(R, "the stream after the inner ncclGroupEnd"));
  std::vector<unsigned char> out(p[0].outBytes);
  cudaError_t ce = cudaMemcpy(out.data(), p[0].outBase, out.size(), cudaMemcpyDeviceToHost);
  ncclResult_t r1 = issue(p[1], gComm, R.stream);
  ncclResult_t outer = ncclGroupEnd();
  TC_EXPECT(r0 == ncclSuccess && r1 == ncclSuccess && inner == ncclSuccess && outer == ncclSuccess,
            "calls %s, %s; inner end %s, outer end %s: %s", resultName(r0), resultName(r1), resultName(inner),
            resultName(outer), lastError(gComm).c_str());
  TC_CUDA(ce);
  for (unsigned char ch : out)
    TC_EXPECT(ch == kSentinel, "the all-reduce's output changed before the outermost ncclGroupEnd (issued early)");
  TC_TRY(syncBounded(R, "the nested group's collectives"));
  TC_TRY(check(R, p[0]));
  return check(R, p[1]);
}

// A bad call inside a group fails the group: its end returns the error and issues nothing (as NCCL does),
// and the next group starts clean.
std::string caseGroupBadCall(Rank& R)
{
  Spec a;
  a.coll = kAllReduce, a.type = ncclFloat32, a.op = ncclSum, a.count = 1000, a.salt = ++gSalt;
  Arena arena;
  Prepared p;
  TC_TRY(prepare(R, a, arena, &p));
  TN_OK(ncclGroupStart());
  ncclResult_t good = issue(p, gComm, R.stream);
  ncclResult_t bad = ncclAllReduce(p.send, p.recv, 1000, (ncclDataType_t)99, ncclSum, gComm, R.stream);
  ncclResult_t end = ncclGroupEnd();
  TC_EXPECT(good == ncclSuccess, "the good call inside the group returned %s", resultName(good));
  TC_EXPECT(bad == ncclInvalidArgument, "datatype 99 inside the group returned %s, expected ncclInvalidArgument",
            resultName(bad));
  TC_EXPECT(end != ncclSuccess, "ncclGroupEnd of a group with a failed call returned ncclSuccess");
  TC_TRY(syncBounded(R, "the stream after the failed group"));
  std::vector<unsigned char> out(p.outBytes);
  TC_CUDA(cudaMemcpy(out.data(), p.outBase, out.size(), cudaMemcpyDeviceToHost));
  for (unsigned char ch : out) TC_EXPECT(ch == kSentinel, "the failed group issued its good all-reduce");
  R.info = fmt("ncclGroupEnd returned %s", resultName(end));
  // The next call (outside any group) works.
  a.salt = ++gSalt;
  return runOne(R, gComm, a);
}

__global__ void addKernel(float* p, uint64_t n, float v)
{
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) p[i] += v;
}

// A graph of [add 1 to the input; ncclAllReduce] captured once and replayed 10 times: each replay's output is
// the sum over the ranks of the input as that replay left it.
std::string caseGraph(Rank& R)
{
  Spec s;
  s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = 65537, s.salt = ++gSalt;
  Arena arena;
  Prepared p;
  TC_TRY(prepare(R, s, arena, &p));
  // A first call of the same kind outside the capture, as applications warm up before they capture.
  TN_OK(issue(p, gComm, R.stream));
  TC_TRY(syncBounded(R, "the warm-up all-reduce"));
  TC_TRY(check(R, p));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  addKernel<<<gridFor(s.count), 256, 0, R.stream>>>((float*)p.inBase, s.count, 1.0f);
  ncclResult_t r = issue(p, gComm, R.stream);
  cudaError_t endRc = cudaStreamEndCapture(R.stream, &graph);
  TC_EXPECT(r == ncclSuccess, "ncclAllReduce during the capture returned %s: %s", resultName(r), lastError(gComm).c_str());
  TC_CUDA(endRc);
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> out(s.count);
  std::string why;
  for (int k = 1; k <= 10 && why.empty(); ++k) {
    TC_CUDA(cudaMemsetAsync(p.outBase, kSentinel, p.outBytes, R.stream));
    TC_CUDA(cudaGraphLaunch(exec, R.stream));
    TC_CUDA(cudaMemcpyAsync(out.data(), p.outBase, p.outBytes, cudaMemcpyDeviceToHost, R.stream));
    why = syncBounded(R, fmt("replay %d", k).c_str());
    for (uint64_t j = 0; j < s.count && why.empty(); ++j) {
      double want = 0;
      for (int q = 0; q < R.nranks; ++q) want += inputValue(s.type, ncclSum, q, j, s.salt) + k;
      if (out[j] != (float)want) why = fmt("replay %d: element %llu is %.9g, want %.9g", k, (unsigned long long)j, out[j], want);
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  R.info = "10 replays checked";
  return why;
}

// ncclCommInitRankConfig, blocking: a communicator of its own, an all-reduce on it, finalize and destroy.
std::string caseConfigBlocking(Rank& R)
{
  ncclUniqueId id;
  TC_TRY(shareId(R, 1, &id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = "nccl_gpu_test_blocking";
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, R.nranks, id, R.rank, &config);
  TC_EXPECT(r == ncclSuccess && comm != nullptr, "ncclCommInitRankConfig (blocking) returned %s: %s", resultName(r),
            lastError(nullptr).c_str());
  int count = -1;
  TN_OK(ncclCommCount(comm, &count));
  TC_EXPECT(count == R.nranks, "ncclCommCount gave %d", count);
  Spec s;
  s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = 65537, s.salt = ++gSalt;
  std::string why = runOne(R, comm, s);
  ncclResult_t fin = ncclCommFinalize(comm);
  ncclResult_t des = ncclCommDestroy(comm);
  TC_TRY(why);
  TC_EXPECT(fin == ncclSuccess && des == ncclSuccess, "ncclCommFinalize %s, ncclCommDestroy %s", resultName(fin),
            resultName(des));
  return "";
}

// Polls ncclCommGetAsyncError until it is no longer ncclInProgress; *state gets the last value.
std::string pollAsync(Rank& R, ncclComm_t comm, const char* what, ncclResult_t* state)
{
  const double deadline = nowSec() + R.hostTimeoutS * 2;
  for (;;) {
    ncclResult_t r = ncclCommGetAsyncError(comm, state);
    TC_EXPECT(r == ncclSuccess, "ncclCommGetAsyncError (%s) returned %s", what, resultName(r));
    if (*state != ncclInProgress) return "";
    TC_EXPECT(nowSec() < deadline, "%s: still ncclInProgress after %.0f s", what, R.hostTimeoutS * 2);
    usleep(1000);
  }
}

// ncclCommInitRankConfig, non-blocking: ncclInProgress, then ncclCommGetAsyncError reaches ncclSuccess; calls
// on such a communicator may also answer ncclInProgress, and are then polled the same way.
std::string caseConfigNonBlocking(Rank& R)
{
  ncclUniqueId id;
  TC_TRY(shareId(R, 2, &id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "nccl_gpu_test_nonblocking";
  ncclComm_t comm = nullptr;
  const double t0 = nowSec();
  ncclResult_t r = ncclCommInitRankConfig(&comm, R.nranks, id, R.rank, &config);
  const double tCall = nowSec() - t0;
  TC_EXPECT(r == ncclInProgress && comm != nullptr, "ncclCommInitRankConfig (non-blocking) returned %s (comm %p): %s",
            resultName(r), (void*)comm, lastError(nullptr).c_str());
  ncclResult_t state = ncclInProgress;
  TC_TRY(pollAsync(R, comm, "the initialisation", &state));
  TC_EXPECT(state == ncclSuccess, "the non-blocking initialisation ended with %s: %s", resultName(state),
            lastError(comm).c_str());
  int rank = -1;
  TN_OK(ncclCommUserRank(comm, &rank));
  TC_EXPECT(rank == R.rank, "ncclCommUserRank gave %d", rank);
  Spec s;
  s.coll = kAllReduce, s.type = ncclInt32, s.op = ncclMin, s.count = 4099, s.salt = ++gSalt;
  Arena arena;
  Prepared p;
  TC_TRY(prepare(R, s, arena, &p));
  r = issue(p, comm, R.stream);
  TC_EXPECT(r == ncclSuccess || r == ncclInProgress, "ncclAllReduce on the non-blocking comm returned %s: %s",
            resultName(r), lastError(comm).c_str());
  if (r == ncclInProgress) {
    TC_TRY(pollAsync(R, comm, "the all-reduce", &state));
    TC_EXPECT(state == ncclSuccess, "the all-reduce ended with %s", resultName(state));
  }
  TC_TRY(syncBounded(R, "the all-reduce on the non-blocking comm"));
  TC_TRY(check(R, p));
  r = ncclCommFinalize(comm);
  TC_EXPECT(r == ncclSuccess || r == ncclInProgress, "ncclCommFinalize returned %s", resultName(r));
  if (r == ncclInProgress) {
    TC_TRY(pollAsync(R, comm, "the finalize", &state));
    TC_EXPECT(state == ncclSuccess, "ncclCommFinalize ended with %s", resultName(state));
  }
  TN_OK(ncclCommDestroy(comm));
  R.info = fmt("ncclCommInitRankConfig returned in %.1f ms", tCall * 1e3);
  return "";
}

// ncclMemAlloc buffers, registered, in all-reduces above the packet sizes (so that they go zero-copy once
// every rank's registration reached the others); then deregistered and freed.
std::string caseMemAlloc(Rank& R)
{
  const uint64_t count = (4u << 20) / 4 + 1, bytes = count * 4;
  void *a = nullptr, *b = nullptr;
  TN_OK(ncclMemAlloc(&a, bytes));
  TN_OK(ncclMemAlloc(&b, bytes));
  TC_EXPECT(a && b, "ncclMemAlloc returned NULL");
  cudaPointerAttributes attr;
  TC_CUDA(cudaPointerGetAttributes(&attr, a));
  TC_EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == R.device,
            "ncclMemAlloc's memory is of type %d on device %d, expected device memory on %d", (int)attr.type,
            attr.device, R.device);
  void *ha = nullptr, *hb = nullptr;
  TN_OK(ncclCommRegister(gComm, a, bytes, &ha));
  TN_OK(ncclCommRegister(gComm, b, bytes, &hb));
  TC_EXPECT(ha && hb && ha != hb, "ncclCommRegister's handles %p and %p", ha, hb);
  Spec s;
  s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = count, s.salt = ++gSalt;
  s.extSend = (char*)a;
  s.extRecv = (char*)b;
  TC_TRY(runOne(R, gComm, s));
  s.op = ncclMax, s.salt = ++gSalt;
  TC_TRY(runOne(R, gComm, s));
  s.op = ncclMin, s.salt = ++gSalt;
  TC_TRY(runOne(R, gComm, s));
  TN_OK(ncclCommDeregister(gComm, ha));
  TN_OK(ncclCommDeregister(gComm, hb));
  ncclResult_t again = ncclCommDeregister(gComm, ha);
  TC_EXPECT(again != ncclSuccess, "a second ncclCommDeregister of the same handle succeeded");
  TN_OK(ncclMemFree(a));
  TN_OK(ncclMemFree(b));
  return "";
}

// memalloc_mapped_by_peers: byte i of rank r's buffer (ranks below 16 differ in every byte: 53 is odd).
__host__ __device__ inline unsigned char mappedByte(int rank, uint64_t i)
{
  return (unsigned char)(((i ^ (i >> 8) ^ (i >> 16)) * 131u + (uint64_t)rank * 53u + 1u) & 0xFF);
}

__global__ void fillMappedKernel(unsigned char* p, uint64_t n, int rank)
{
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = mappedByte(rank, i);
}

// Counts the bytes of `p` that are not `rank`'s pattern (found[0]) and keeps the first such index (found[1]).
__global__ void checkMappedKernel(const unsigned char* p, uint64_t n, int rank, unsigned long long* found)
{
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    if (p[i] != mappedByte(rank, i)) {
      atomicAdd(&found[0], 1ull);
      atomicMin(&found[1], (unsigned long long)i);
    }
}

// ncclMemAlloc's memory can be mapped by the other ranks' processes (as NCCL's users map it): each rank
// allocates 1 MiB + 12 bytes, fills it with its pattern on its stream, publishes its cudaIpcGetMemHandle on
// the board; then each opens the next rank's buffer (cudaIpcOpenMemHandle), checks every byte of that
// rank's pattern (a kernel on this device where it can reach the buffer's, and a copy to the host),
// closes it; only once every rank has closed its mapping are the buffers freed. One rank alone checks its
// own buffer (a process cannot open its own handle).
std::string caseMemAllocMapped(Rank& R)
{
  const uint64_t bytes = (1u << 20) + 12;
  const int next = (R.rank + 1) % R.nranks;
  void* mine = nullptr;
  std::string why = together(R, [&]() -> std::string {
    TN_OK(ncclMemAlloc(&mine, bytes));
    TC_EXPECT(mine, "ncclMemAlloc returned NULL");
    fillMappedKernel<<<64, 256, 0, R.stream>>>((unsigned char*)mine, bytes, R.rank);
    TC_CUDA(cudaGetLastError());
    TC_TRY(syncBounded(R, "the pattern's fill"));
    cudaIpcMemHandle_t h;
    TC_CUDA(cudaIpcGetMemHandle(&h, mine));
    memcpy(&gBoard->memHandles[R.rank], &h, sizeof(h));
    __sync_synchronize();
    return "";
  }(), "after publishing the ncclMemAlloc buffers' IPC handles");
  bool viaKernel = false;
  if (why.empty()) why = together(R, [&]() -> std::string {
    __sync_synchronize();
    cudaIpcMemHandle_t h;
    memcpy(&h, &gBoard->memHandles[next], sizeof(h));
    void* theirs = mine;
    if (next != R.rank) {
      theirs = nullptr;
      TC_CUDA(cudaIpcOpenMemHandle(&theirs, h, cudaIpcMemLazyEnablePeerAccess));
      TC_EXPECT(theirs, "cudaIpcOpenMemHandle of rank %d's buffer gave NULL", next);
    }
    std::string found = [&]() -> std::string {
      cudaPointerAttributes attr;
      TC_CUDA(cudaPointerGetAttributes(&attr, theirs));
      TC_EXPECT(attr.type == cudaMemoryTypeDevice, "rank %d's mapped buffer is of memory type %d, not device memory",
                next, (int)attr.type);
      int reach = attr.device == R.device;
      if (!reach) TC_CUDA(cudaDeviceCanAccessPeer(&reach, R.device, attr.device));
      if (reach) {
        viaKernel = true;
        unsigned long long* counts = (unsigned long long*)gPoolB;
        TC_CUDA(cudaMemsetAsync(counts, 0, sizeof(unsigned long long), R.stream));
        TC_CUDA(cudaMemsetAsync(counts + 1, 0xFF, sizeof(unsigned long long), R.stream));
        checkMappedKernel<<<64, 256, 0, R.stream>>>((const unsigned char*)theirs, bytes, next, counts);
        TC_CUDA(cudaGetLastError());
        unsigned long long got[2] = {0, 0};
        TC_CUDA(cudaMemcpyAsync(got, counts, sizeof(got), cudaMemcpyDeviceToHost, R.stream));
        TC_TRY(syncBounded(R, "the check of the mapped buffer on the device"));
        TC_EXPECT(got[0] == 0, "on the device, %llu of the %llu bytes of rank %d's buffer are not its pattern (the "
                  "first at byte %llu)", got[0], (unsigned long long)bytes, next, got[1]);
      }
      std::vector<unsigned char> host(bytes);
      TC_CUDA(cudaMemcpyAsync(host.data(), theirs, bytes, cudaMemcpyDeviceToHost, R.stream));
      TC_TRY(syncBounded(R, "the copy of the mapped buffer to the host"));
      for (uint64_t i = 0; i < bytes; ++i)
        TC_EXPECT(host[i] == mappedByte(next, i), "copied to the host, byte %llu of rank %d's buffer is %u, expected %u",
                  (unsigned long long)i, next, (unsigned)host[i], (unsigned)mappedByte(next, i));
      return "";
    }();
    if (theirs != mine) {
      cudaError_t e = cudaIpcCloseMemHandle(theirs);
      if (found.empty() && e != cudaSuccess)
        found = fmt("cudaIpcCloseMemHandle of rank %d's buffer: %s", next, cudaGetErrorString(e));
    }
    return found;
  }(), "after every rank checked and closed its mapping");
  if (mine) {
    ncclResult_t r = ncclMemFree(mine);
    if (why.empty() && r != ncclSuccess) why = fmt("ncclMemFree returned %s", resultName(r));
  }
  if (why.empty())
    R.info = R.nranks == 1 ? std::string("one rank: its own buffer checked, nothing mapped")
                           : fmt("rank %d's buffer checked %s", next,
                                 viaKernel ? "by a kernel and on the host" : "on the host (this device cannot reach it)");
  return why;
}

// Fills `bytes` of `buf` with the sentinel and waits, so that a refused call can be shown to leave it.
std::string sentinel(Rank& R, void* buf, uint64_t bytes)
{
  TC_CUDA(cudaMemsetAsync(buf, kSentinel, bytes, R.stream));
  return syncBounded(R, "the sentinel fill");
}

std::string untouched(Rank& R, const void* buf, uint64_t bytes, const char* what)
{
  // Nothing was queued: the stream is idle at once.
  cudaError_t q = cudaStreamQuery(R.stream);
  TC_EXPECT(q == cudaSuccess, "%s queued work on the stream (cudaStreamQuery: %s)", what, cudaGetErrorString(q));
  std::vector<unsigned char> out(bytes);
  TC_CUDA(cudaMemcpy(out.data(), buf, bytes, cudaMemcpyDeviceToHost));
  for (unsigned char ch : out) TC_EXPECT(ch == kSentinel, "%s wrote into the output buffer", what);
  return "";
}

// ncclReduce: every operator, roots 0 and last, counts up to 2^20 + 3 (past the packets' limit, into the
// copies); out of place with a non-root's recvbuff NULL, out of place with a real one left untouched, and in
// place (a non-root's buffer keeps its input).
const uint64_t kCountsReduce[] = {1, 1000, 65537, (1u << 20) + 3};

std::string caseReduce(Rank& R, ncclDataType_t t, const std::vector<ncclRedOp_t>& ops = kOps)
{
  for (ncclRedOp_t op : ops)
    for (int root : {0, R.nranks - 1})
      for (uint64_t n : kCountsReduce)
        for (int form = 0; form < 3; ++form) {
          Spec s;
          s.coll = kReduce, s.type = t, s.op = op, s.count = n, s.root = root, s.salt = ++gSalt;
          s.inPlace = form == 2;
          s.nullOther = form == 0;
          TC_TRY(runOne(R, gComm, s));
        }
  return "";
}

// The gathers' and scatters' counts per rank: packets, copies, and a count past 2^18 whose pieces are no
// multiple of 16 bytes for any type.
const uint64_t kCountsRooted[] = {1, 1000, 70001, (1u << 18) + 5};

// ncclGather and ncclScatter: roots 0 and last, in and out of place (out of place once with NULL where a
// non-root's buffer is unused, once with a real one left untouched).
std::string caseGatherScatter(Rank& R, Coll coll, ncclDataType_t t)
{
  for (int root : {0, R.nranks - 1})
    for (uint64_t n : kCountsRooted)
      for (int form = 0; form < 3; ++form) {
        Spec s;
        s.coll = coll, s.type = t, s.count = n, s.root = root, s.salt = ++gSalt;
        s.inPlace = form == 2;
        s.nullOther = form == 0;
        const std::string why = runOne(R, gComm, s);
        // A gather's non-root waits for nobody in packets (see gather_back_to_back_root_late): the barrier
        // keeps it from running calls ahead here, so that this case is about the data. Passed on failure
        // too, so that the ranks' barriers stay in step.
        if (coll == kGather) TC_TRY(boardBarrier(R, "between gathers"));
        TC_TRY(why);
      }
  return "";
}

const uint64_t kCountsAlltoAll[] = {1, 1000, 65537, (1u << 18) + 3};

std::string caseAlltoAll(Rank& R, ncclDataType_t t)
{
  for (uint64_t n : kCountsAlltoAll)
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      Spec s;
      s.coll = kAlltoAll, s.type = t, s.count = n, s.inPlace = inPlace, s.salt = ++gSalt;
      TC_TRY(runOne(R, gComm, s));
    }
  return "";
}

// Three gathers in packets to one root, issued back to back, the root's half a second after the others':
// a non-root keeps no output, so its kernels wait for nothing and its three calls end before the root's
// first begins. Its third call's packets go to the same half of the root's scratch as its first's; the
// root must still get each call's data (a library that lets them overwrite the first call's packets leaves
// the root waiting for flags that never come). On a communicator of its own, aborted if the root hangs.
std::string caseGatherBackToBack(Rank& R)
{
  ncclUniqueId id;
  TC_TRY(shareId(R, 3, &id));
  ncclComm_t comm = nullptr;
  TN_OK(ncclCommInitRank(&comm, R.nranks, id, R.rank));
  Arena arena;
  Prepared p[3];
  for (Prepared& q : p) {
    Spec s;
    s.coll = kGather, s.type = ncclFloat32, s.count = 1000, s.root = 0, s.nullOther = true, s.salt = ++gSalt;
    TC_TRY(prepare(R, s, arena, &q));
  }
  TC_TRY(syncBounded(R, "the inputs"));
  TC_TRY(boardBarrier(R, "before the gathers"));
  if (R.rank == 0) usleep(500000);
  ncclResult_t rc[3];
  for (int i = 0; i < 3; ++i) rc[i] = issue(p[i], comm, R.stream);
  // Bounded, and not fatal: a hang is this case's failure, ended by an abort below.
  const double deadline = nowSec() + 20 * timeoutScale();
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(R.stream)) == cudaErrorNotReady && nowSec() < deadline) usleep(200);
  if (q != cudaSuccess) __atomic_store_n(&gBoard->gatherHung, 1, __ATOMIC_SEQ_CST);
  TC_TRY(boardBarrier(R, "after the gathers"));
  if (__atomic_load_n(&gBoard->gatherHung, __ATOMIC_SEQ_CST)) {
    ncclResult_t ab = ncclCommAbort(comm);
    TC_TRY(syncBounded(R, "the stream after ncclCommAbort"));
    return fmt("the root's gathers did not finish within %.0f s (%s), ncclCommAbort %s: a non-root's later call "
               "overwrote packets the root had not read yet",
               20 * timeoutScale(), R.rank == 0 ? cudaGetErrorString(q) : "seen by the root", resultName(ab));
  }
  for (int i = 0; i < 3; ++i)
    TC_EXPECT(rc[i] == ncclSuccess, "gather %d returned %s: %s", i, resultName(rc[i]), lastError(comm).c_str());
  std::string why;
  for (int i = 0; i < 3 && why.empty(); ++i) why = check(R, p[i]);
  ncclResult_t des = ncclCommDestroy(comm);
  TC_TRY(why);
  TC_EXPECT(des == ncclSuccess, "ncclCommDestroy returned %s", resultName(des));
  return "";
}

// ------------------------------------------------------------------------------------------------
// Send and receive: a plan of one rank's calls, their buffers, and the host reference
// ------------------------------------------------------------------------------------------------

// Element i of the k-th message `from` sends `to` in one plan (k counted among that pair's sends).
double p2pValue(ncclDataType_t t, int from, int to, int k, uint64_t i, uint32_t salt)
{
  return inputValue(t, moveGen(t), from, i, salt * 131u + (uint32_t)to * 17u + (uint32_t)k * 7919u);
}

struct P2pMsg
{
  bool send;
  int peer;
  ncclDataType_t type;
  uint64_t count;
  int k; // the k-th send to `peer` (or receive from it) of the plan
  char* buf = nullptr;
  std::vector<unsigned char> data; // a send's input
};

struct P2pPlan
{
  std::vector<P2pMsg> msgs; // in call order
  uint32_t salt = 0;
  uint64_t offset = 0;      // every buffer this many bytes past a 256-byte boundary

  void add(bool send, int peer, ncclDataType_t t, uint64_t count)
  {
    int k = 0;
    for (const P2pMsg& m : msgs) k += m.send == send && m.peer == peer ? 1 : 0;
    P2pMsg m;
    m.send = send, m.peer = peer, m.type = t, m.count = count, m.k = k;
    msgs.push_back(m);
  }
};

std::string describe(const P2pMsg& m)
{
  return fmt("%s rank %d (#%d of the pair, %llu x %s)", m.send ? "ncclSend to" : "ncclRecv from", m.peer, m.k,
             (unsigned long long)m.count, typeName(m.type));
}

// Sends' inputs uploaded, receives' buffers (and kGuard bytes after them) set to the sentinel.
std::string prepareP2p(Rank& R, P2pPlan& plan, Arena& arena)
{
  for (P2pMsg& m : plan.msgs) {
    const uint64_t bytes = m.count * typeSize(m.type);
    char* at = nullptr;
    if (m.send) {
      TC_TRY(carve(R, gPoolA, &arena.a, bytes + plan.offset, &at));
      m.buf = at + plan.offset;
      m.data.assign(bytes, 0);
      for (uint64_t i = 0; i < m.count; ++i)
        storeElem(m.type, m.data.data(), i, p2pValue(m.type, R.rank, m.peer, m.k, i, plan.salt));
      TC_CUDA(cudaMemcpyAsync(m.buf, m.data.data(), bytes, cudaMemcpyHostToDevice, R.stream));
    } else {
      TC_TRY(carve(R, gPoolB, &arena.b, bytes + plan.offset + kGuard, &at));
      m.buf = at + plan.offset;
      TC_CUDA(cudaMemsetAsync(m.buf, kSentinel, bytes, R.stream));
      TC_CUDA(cudaMemsetAsync(m.buf + bytes, kGuardByte, kGuard, R.stream));
    }
  }
  return syncBounded(R, "the send and receive buffers");
}

// The plan's calls, in one group or each alone; the first failure named.
std::string issueP2p(const P2pPlan& plan, ncclComm_t comm, cudaStream_t stream, bool grouped)
{
  if (grouped) TN_OK(ncclGroupStart());
  std::string why;
  for (const P2pMsg& m : plan.msgs) {
    ncclResult_t r = m.send ? ncclSend(m.buf, m.count, m.type, m.peer, comm, stream)
                            : ncclRecv(m.buf, m.count, m.type, m.peer, comm, stream);
    if (r != ncclSuccess && why.empty()) why = fmt("%s returned %s: %s", describe(m).c_str(), resultName(r), lastError(comm).c_str());
  }
  if (grouped) {
    ncclResult_t end = ncclGroupEnd();
    if (end != ncclSuccess && why.empty()) why = fmt("ncclGroupEnd returned %s: %s", resultName(end), lastError(comm).c_str());
  }
  return why;
}

// After the stream drained: every receive element by element (plus `plus` on each value: a graph's
// replays), the guard after it, and (where checkSends) every send's input untouched.
std::string checkP2p(Rank& R, const P2pPlan& plan, double plus = 0, bool checkSends = true)
{
  for (const P2pMsg& m : plan.msgs) {
    const uint64_t bytes = m.count * typeSize(m.type);
    if (m.send && !checkSends) continue;
    std::vector<unsigned char> got(bytes + (m.send ? 0 : kGuard));
    TC_CUDA(cudaMemcpy(got.data(), m.buf, got.size(), cudaMemcpyDeviceToHost));
    if (m.send) {
      TC_EXPECT(got == m.data, "%s: the send buffer was changed", describe(m).c_str());
      continue;
    }
    uint64_t bad = 0, first = 0;
    double got0 = 0, want0 = 0;
    for (uint64_t i = 0; i < m.count; ++i) {
      const double want = p2pValue(m.type, m.peer, R.rank, m.k, i, plan.salt) + plus;
      const double v = loadElem(m.type, got.data(), i);
      if (!closeEnough(m.type, v, want) && bad++ == 0) first = i, got0 = v, want0 = want;
    }
    TC_EXPECT(bad == 0, "%s: %llu of %llu elements wrong, first at %llu: got %.17g, want %.17g", describe(m).c_str(),
              (unsigned long long)bad, (unsigned long long)m.count, (unsigned long long)first, got0, want0);
    for (uint64_t b = 0; b < kGuard; ++b)
      TC_EXPECT(got[bytes + b] == kGuardByte, "%s: byte %llu after the receive buffer was written (0x%02x)",
                describe(m).c_str(), (unsigned long long)b, got[bytes + b]);
  }
  return "";
}

std::string runP2p(Rank& R, P2pPlan& plan, bool grouped = true)
{
  Arena arena;
  plan.salt = ++gSalt;
  TC_TRY(prepareP2p(R, plan, arena));
  TC_TRY(issueP2p(plan, gComm, R.stream, grouped));
  TC_TRY(syncBounded(R, "the sends and receives"));
  return checkP2p(R, plan);
}


// Each rank sends to the next and receives from the previous in one group; offset: the buffers' misalignment.
std::string caseP2pRing(Rank& R, ncclDataType_t t, uint64_t offset)
{
  for (uint64_t n : {(uint64_t)1, (uint64_t)65537, (uint64_t)(1u << 20) + 7}) {
    P2pPlan plan;
    plan.offset = offset;
    plan.add(true, nextRank(R), t, n);
    plan.add(false, prevRank(R), t, n);
    TC_TRY(runP2p(R, plan));
  }
  R.info = fmt("counts 1, 65537, 2^20 + 7%s", offset ? fmt(", buffers %llu bytes off 16", (unsigned long long)offset).c_str() : "");
  return "";
}

// Pairs (0, 1), (2, 3), ... (an odd last rank pairs with itself): both directions in one group, the send
// issued before the receive on both sides (4 MiB: the chunks' credits must flow both ways at once).
std::string caseP2pPairs(Rank& R)
{
  const int partner = (R.rank ^ 1) < R.nranks ? (R.rank ^ 1) : R.rank;
  for (uint64_t n : {(uint64_t)1000, (uint64_t)(1u << 20) + 7}) {
    P2pPlan plan;
    plan.add(true, partner, ncclFloat32, n);
    plan.add(false, partner, ncclFloat32, n);
    TC_TRY(runP2p(R, plan));
  }
  return "";
}

// An all-to-all by sends and receives in one group, this rank included: every send first, then every
// receive; 100003 float32 per pair (more than 1 MiB: every lane, several chunks each).
std::string caseP2pAlltoAll(Rank& R)
{
  P2pPlan plan;
  for (int p = 0; p < R.nranks; ++p) plan.add(true, p, ncclFloat32, 100003);
  for (int p = 0; p < R.nranks; ++p) plan.add(false, p, ncclFloat32, 100003);
  return runP2p(R, plan);
}

// A rank to itself: a send then a receive in one group (a copy); two of them, matched in call order.
std::string caseP2pSelf(Rank& R)
{
  for (uint64_t n : {(uint64_t)1, (uint64_t)65537, (uint64_t)(1u << 18) + 1}) {
    P2pPlan plan;
    plan.add(true, R.rank, ncclFloat64, n);
    plan.add(false, R.rank, ncclFloat64, n);
    TC_TRY(runP2p(R, plan));
  }
  P2pPlan two;
  two.add(true, R.rank, ncclInt32, 1000);
  two.add(true, R.rank, ncclInt32, 3001);
  two.add(false, R.rank, ncclInt32, 1000);
  two.add(false, R.rank, ncclInt32, 3001);
  return runP2p(R, two);
}

// Two sends to the same peer in one group, of different sizes: the peer's two receives get them in order.
std::string caseP2pTwoToOnePeer(Rank& R)
{
  P2pPlan plan;
  plan.add(true, nextRank(R), ncclFloat32, 70001);
  plan.add(true, nextRank(R), ncclFloat32, 300007);
  plan.add(false, prevRank(R), ncclFloat32, 70001);
  plan.add(false, prevRank(R), ncclFloat32, 300007);
  return runP2p(R, plan);
}

// A send and a receive each alone, outside any group, the send first on every rank: each completes without
// the other since a message of at most 1 MiB fits the receiver's buffering (8 lanes x 2 chunks of 64 KiB),
// so the send's launch ends before the receive's begins on the same stream.
std::string caseP2pAlone(Rank& R)
{
  for (uint64_t n : {(uint64_t)1000, (uint64_t)(1u << 18)}) {
    P2pPlan plan;
    plan.add(true, nextRank(R), ncclFloat32, n);
    plan.add(false, prevRank(R), ncclFloat32, n);
    TC_TRY(runP2p(R, plan, false));
  }
  R.info = "1000 and 262144 float32 (1 MiB)";
  return "";
}

// A graph of [add 1 to the send buffer; a group of send to next, receive from previous] captured once and
// replayed 5 times: replay k receives the previous rank's input plus k.
std::string caseP2pGraph(Rank& R)
{
  P2pPlan plan;
  const uint64_t n = 300007; // more than 1 MiB: credits flow inside each replay
  plan.add(true, nextRank(R), ncclFloat32, n);
  plan.add(false, prevRank(R), ncclFloat32, n);
  // A first run outside the capture, as applications warm up before they capture.
  TC_TRY(runP2p(R, plan));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  addKernel<<<gridFor(n), 256, 0, R.stream>>>((float*)plan.msgs[0].buf, n, 1.0f);
  std::string issued = issueP2p(plan, gComm, R.stream, true);
  cudaError_t endRc = cudaStreamEndCapture(R.stream, &graph);
  TC_EXPECT(issued.empty(), "during the capture: %s", issued.c_str());
  TC_CUDA(endRc);
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::string why;
  const uint64_t bytes = n * 4;
  for (int k = 1; k <= 5 && why.empty(); ++k) {
    cudaError_t e = cudaMemsetAsync(plan.msgs[1].buf, kSentinel, bytes, R.stream);
    if (e == cudaSuccess) e = cudaGraphLaunch(exec, R.stream);
    if (e != cudaSuccess) why = fmt("replay %d: %s", k, cudaGetErrorString(e));
    if (why.empty()) why = syncBounded(R, fmt("replay %d", k).c_str());
    if (why.empty()) why = checkP2p(R, plan, k, false);
    if (!why.empty()) why = fmt("replay %d: %s", k, why.c_str());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  R.info = "5 replays checked";
  return why;
}

// Bad sends and receives: refused at the call (nothing queued, the output untouched), the same calls on
// every rank so that none is left waiting; the communicator works after them.
std::string caseP2pBad(Rank& R)
{
  const uint64_t bytes = 4000;
  TC_TRY(sentinel(R, gPoolB, bytes));
  const int N = R.nranks;
  TN_EXPECT_RC(ncclSend(gPoolA, 1000, ncclFloat32, N, gComm, R.stream), ncclInvalidArgument);
  TN_EXPECT_RC(ncclRecv(gPoolB, 1000, ncclFloat32, N, gComm, R.stream), ncclInvalidArgument);
  TN_EXPECT_RC(ncclSend(gPoolA, 1000, ncclFloat32, -1, gComm, R.stream), ncclInvalidArgument);
  std::string msg = lastError(gComm);
  TC_EXPECT(msg.find("peer") != std::string::npos, "the last error does not name the peer: '%s'", msg.c_str());
  // A send to itself with no receive from itself (alone, and in a group: its end fails).
  TN_EXPECT_RC(ncclSend(gPoolA, 1000, ncclFloat32, R.rank, gComm, R.stream), ncclInvalidArgument);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("itself") != std::string::npos, "the unmatched send to self: last error '%s'", msg.c_str());
  TN_OK(ncclGroupStart());
  ncclResult_t a = ncclSend(gPoolA, 1000, ncclFloat32, R.rank, gComm, R.stream);
  ncclResult_t b = ncclRecv(gPoolB, 999, ncclFloat32, R.rank, gComm, R.stream);
  ncclResult_t end = ncclGroupEnd();
  TC_EXPECT(a == ncclSuccess && b == ncclSuccess && end == ncclInvalidArgument,
            "a send to self of 1000 and a receive from self of 999 in a group: %s, %s, ncclGroupEnd %s (expected "
            "ncclInvalidArgument at the end)",
            resultName(a), resultName(b), resultName(end));
  TC_TRY(untouched(R, gPoolB, bytes, "a refused send or receive"));
  // A datatype out of range (fp8's are in range and carried out: p2p_ring_float8*).
  TN_EXPECT_RC(ncclSend(gPoolA, 1000, (ncclDataType_t)ncclNumTypes, nextRank(R), gComm, R.stream), ncclInvalidArgument);
  msg = lastError(gComm);
  TC_EXPECT(msg.find("datatype") != std::string::npos, "the bad datatype's refusal does not name it: '%s'", msg.c_str());
  TN_EXPECT_RC(ncclRecv(gPoolB, 1000, (ncclDataType_t)-1, prevRank(R), gComm, R.stream), ncclInvalidArgument);
  TC_TRY(untouched(R, gPoolB, bytes, "a send or receive of a bad datatype"));
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(async == ncclSuccess, "after the refusals ncclCommGetAsyncError gives %s", resultName(async));
  P2pPlan plan;
  plan.add(true, nextRank(R), ncclFloat32, 1000);
  plan.add(false, prevRank(R), ncclFloat32, 1000);
  return runP2p(R, plan);
}

// What the face does not offer (NCCL's device API): ncclInvalidUsage, the last error naming the function,
// nothing queued or written, the communicator still usable. Every rank makes the same call, so none is left
// waiting.
std::string caseRefused(Rank& R, const char* fn, const std::function<ncclResult_t(void* send, void* recv)>& call)
{
  const uint64_t bytes = 4096 * 4 * R.nranks;
  void* send = gPoolA;
  void* recv = gPoolB;
  TC_TRY(sentinel(R, recv, bytes));
  ncclResult_t r = call(send, recv);
  const std::string msg = lastError(gComm);
  TC_EXPECT(r == ncclInvalidUsage, "%s returned %s, expected ncclInvalidUsage (not offered): %s", fn, resultName(r),
            msg.c_str());
  TC_EXPECT(msg.find(fn) != std::string::npos, "ncclGetLastError does not name %s: '%s'", fn, msg.c_str());
  TC_TRY(untouched(R, recv, bytes, fn));
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(async == ncclSuccess, "after the refusal ncclCommGetAsyncError gives %s", resultName(async));
  // The communicator still works.
  Spec s;
  s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = 1000, s.salt = ++gSalt;
  TC_TRY(runOne(R, gComm, s));
  R.info = "'" + msg.substr(0, 120) + "'";
  return "";
}

// ------------------------------------------------------------------------------------------------
// fp8
// ------------------------------------------------------------------------------------------------

// fp8 through one collective: AllReduce, ReduceScatter, Reduce (sum, max, min), AllGather, Broadcast / Bcast,
// with the counts, layouts and roots of the other types' cases; results compared bit for bit (the values
// make every order of reduction exact, see inputValue).
std::string caseFp8(Rank& R, ncclDataType_t t, Coll coll)
{
  switch (coll) {
  case kAllReduce:
    for (ncclRedOp_t op : kFp8Ops) TC_TRY(caseAllReduce(R, t, op));
    break;
  case kReduceScatter: TC_TRY(caseReduceScatter(R, t, kFp8Ops)); break;
  case kReduce: TC_TRY(caseReduce(R, t, kFp8Ops)); break;
  case kAllGather: TC_TRY(caseAllGather(R, t)); break;
  default: TC_TRY(caseBroadcast(R, t)); break;
  }
  const int lim = std::max(1, (t == ncclFloat8e4m3 ? 16 : 8) / R.nranks);
  if (coll == kAllGather || coll == kBroadcast) R.info = "every finite value but -0";
  else R.info = fmt("sums of integers in [-%d, %d]; max, min of every finite value but -0", lim, lim);
  return "";
}

// ------------------------------------------------------------------------------------------------
// PreMulSum
// ------------------------------------------------------------------------------------------------

const ncclDataType_t kPremulTypes[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclFloat64, ncclInt32};

// `op` (a PreMulSum of `scalar`) in AllReduce (counts 1 to 2^20 + 3: packets and copies, in and out of
// place), ReduceScatter (1000 and 65537 per rank, in and out of place) and Reduce (roots 0 and last, a
// non-root's recvbuff NULL, and in place), each checked against the sum of the ranks' inputs times scalar.
std::string runPremul(Rank& R, ncclDataType_t t, ncclRedOp_t op, double scalar)
{
  auto spec = [&](Coll coll, uint64_t n) {
    Spec s;
    s.coll = coll, s.type = t, s.count = n, s.salt = ++gSalt;
    s.premul = true, s.premulOp = op, s.scalar = scalar;
    return s;
  };
  for (uint64_t n : {(uint64_t)1, (uint64_t)1000, (uint64_t)65537, (uint64_t)(1u << 20) + 3})
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      Spec s = spec(kAllReduce, n);
      s.inPlace = inPlace;
      TC_TRY(runOne(R, gComm, s));
    }
  for (uint64_t n : {(uint64_t)1000, (uint64_t)65537})
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      Spec s = spec(kReduceScatter, n);
      s.inPlace = inPlace;
      TC_TRY(runOne(R, gComm, s));
    }
  for (int root : {0, R.nranks - 1})
    for (uint64_t n : {(uint64_t)1000, (uint64_t)65537})
      for (int inPlace = 0; inPlace < 2; ++inPlace) {
        Spec s = spec(kReduce, n);
        s.root = root, s.inPlace = inPlace, s.nullOther = !inPlace;
        TC_TRY(runOne(R, gComm, s));
      }
  return "";
}

// After ncclRedOpDestroy: the operator is an invalid argument, in a collective (nothing queued) and in a
// second destroy; a built-in operator is never destroyed.
std::string destroyedOpRefused(Rank& R, ncclDataType_t t, ncclRedOp_t op)
{
  const uint64_t bytes = 1000 * typeSize(t);
  TC_TRY(sentinel(R, gPoolB, bytes));
  TN_EXPECT_RC(ncclAllReduce(gPoolA, gPoolB, 1000, t, op, gComm, R.stream), ncclInvalidArgument);
  TC_TRY(untouched(R, gPoolB, bytes, "an all-reduce with a destroyed PreMulSum operator"));
  TN_EXPECT_RC(ncclRedOpDestroy(op, gComm), ncclInvalidArgument);
  TN_EXPECT_RC(ncclRedOpDestroy(ncclSum, gComm), ncclInvalidArgument);
  return "";
}

// ncclScalarHostImmediate: the scalar's value is read at the creation; the variable is changed right after,
// which must change nothing.
std::string casePremulHost(Rank& R, ncclDataType_t t)
{
  const double a = t == ncclInt32 ? 3 : 1.5;
  uint64_t host = scalarBits(t, a);
  ncclRedOp_t op = ncclNumOps;
  TN_OK(ncclRedOpCreatePreMulSum(&op, &host, t, ncclScalarHostImmediate, gComm));
  TC_EXPECT((int)op >= (int)ncclNumOps, "ncclRedOpCreatePreMulSum made op %d, a built-in's number", (int)op);
  host = scalarBits(t, 7);
  std::string why = runPremul(R, t, op, a);
  ncclResult_t d = ncclRedOpDestroy(op, gComm);
  TC_TRY(why);
  TC_EXPECT(d == ncclSuccess, "ncclRedOpDestroy returned %s: %s", resultName(d), lastError(gComm).c_str());
  TC_TRY(destroyedOpRefused(R, t, op));
  R.info = fmt("scalar %g, op %d", a, (int)op);
  return "";
}

// ncclScalarDevice, scalar `a` then `b` in device memory: direct calls first, then a graph of two
// all-reduces (1000 elements: packets; 2^20 + 3: copies) captured once and replayed three times, the scalar
// rewritten on the stream before each replay (a, b, a): each replay uses the value it finds.
std::string premulDeviceBody(Rank& R, ncclDataType_t t, ncclRedOp_t op, void* dScalar, double a, double b)
{
  TC_TRY(runPremul(R, t, op, a));
  Arena arena;
  Prepared p[2];
  const uint64_t counts[2] = {1000, (1u << 20) + 3};
  for (int i = 0; i < 2; ++i) {
    Spec s;
    s.coll = kAllReduce, s.type = t, s.count = counts[i], s.salt = ++gSalt;
    s.premul = true, s.premulOp = op, s.scalar = a;
    TC_TRY(prepare(R, s, arena, &p[i]));
  }
  TC_TRY(syncBounded(R, "the inputs"));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal));
  ncclResult_t r0 = issue(p[0], gComm, R.stream);
  ncclResult_t r1 = issue(p[1], gComm, R.stream);
  cudaError_t endRc = cudaStreamEndCapture(R.stream, &graph);
  TC_EXPECT(r0 == ncclSuccess && r1 == ncclSuccess, "the all-reduces during the capture returned %s, %s: %s",
            resultName(r0), resultName(r1), lastError(gComm).c_str());
  TC_CUDA(endRc);
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double values[3] = {a, b, a};
  uint64_t bits[3];
  std::string why;
  for (int k = 0; k < 3 && why.empty(); ++k) {
    bits[k] = scalarBits(t, values[k]);
    cudaError_t e = cudaMemcpyAsync(dScalar, &bits[k], typeSize(t), cudaMemcpyHostToDevice, R.stream);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = cudaMemsetAsync(p[i].outBase, kSentinel, p[i].outBytes, R.stream);
    if (e == cudaSuccess) e = cudaGraphLaunch(exec, R.stream);
    if (e != cudaSuccess) why = fmt("replay %d: %s", k + 1, cudaGetErrorString(e));
    if (why.empty()) why = syncBounded(R, fmt("replay %d", k + 1).c_str());
    for (int i = 0; i < 2 && why.empty(); ++i) {
      p[i].s.scalar = values[k];
      p[i].want = wantOf(R, p[i].s);
      why = check(R, p[i]);
    }
    if (!why.empty()) why = fmt("replay %d (device scalar %g): %s", k + 1, values[k], why.c_str());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return why;
}

std::string casePremulDevice(Rank& R, ncclDataType_t t)
{
  const double a = t == ncclInt32 ? -2 : -0.75, b = t == ncclInt32 ? 5 : 2.5;
  void* d = nullptr;
  TC_CUDA(cudaMalloc(&d, 8));
  const uint64_t bits = scalarBits(t, a);
  TC_CUDA(cudaMemcpy(d, &bits, 8, cudaMemcpyHostToDevice));
  ncclRedOp_t op = ncclNumOps;
  ncclResult_t r = ncclRedOpCreatePreMulSum(&op, d, t, ncclScalarDevice, gComm);
  std::string why;
  if (r != ncclSuccess) why = fmt("ncclRedOpCreatePreMulSum (ncclScalarDevice) returned %s: %s", resultName(r), lastError(gComm).c_str());
  if (why.empty()) why = premulDeviceBody(R, t, op, d, a, b);
  if (r == ncclSuccess) {
    ncclResult_t des = ncclRedOpDestroy(op, gComm);
    if (des != ncclSuccess && why.empty()) why = fmt("ncclRedOpDestroy returned %s", resultName(des));
  }
  cudaFree(d);
  TC_TRY(why);
  TC_TRY(destroyedOpRefused(R, t, op));
  R.info = fmt("scalar %g, then 3 replays with %g, %g, %g", a, a, b, a);
  return "";
}

// ------------------------------------------------------------------------------------------------
// Split, shrink, revoke
// ------------------------------------------------------------------------------------------------

// Count and UserRank of `c` are `count` and `rank`.
std::string expectPlace(ncclComm_t c, int count, int rank, const char* what)
{
  int n = -1, r = -1;
  const ncclResult_t a = ncclCommCount(c, &n), b = ncclCommUserRank(c, &r);
  TC_EXPECT(a == ncclSuccess && b == ncclSuccess, "%s: ncclCommCount %s, ncclCommUserRank %s", what, resultName(a),
            resultName(b));
  TC_EXPECT(n == count && r == rank, "%s: rank %d of %d, expected rank %d of %d", what, r, n, rank, count);
  return "";
}

// R as seen on communicator `comm`: its rank and size there, which the references are computed from.
std::string viewOn(Rank& R, ncclComm_t comm, Rank* V)
{
  int n = -1, r = -1, dev = -1;
  TN_OK(ncclCommCount(comm, &n));
  TN_OK(ncclCommUserRank(comm, &r));
  TN_OK(ncclCommCuDevice(comm, &dev));
  TC_EXPECT(n >= 1 && r >= 0 && r < n && dev == R.device, "ncclCommCount %d, UserRank %d, CuDevice %d (device %d)", n,
            r, dev, R.device);
  *V = R;
  V->rank = r;
  V->nranks = n;
  return "";
}

// Collectives on a communicator made by a split or a shrink, each checked against the reference of that
// communicator's ranks: all-reduces in packets and in copies, all-gathers whose pieces come in its rank order.
std::string workOn(Rank& R, ncclComm_t comm, uint32_t salt, const char* what)
{
  Rank V;
  std::string why = viewOn(R, comm, &V);
  Spec s[4];
  s[0].coll = kAllReduce, s[0].type = ncclFloat32, s[0].op = ncclSum, s[0].count = 65537;
  s[1].coll = kAllReduce, s[1].type = ncclBfloat16, s[1].op = ncclMax, s[1].count = (1u << 20) + 3, s[1].inPlace = true;
  s[2].coll = kAllGather, s[2].type = ncclInt32, s[2].count = 4099;
  s[3].coll = kAllGather, s[3].type = ncclFloat64, s[3].count = (1u << 18) + 1, s[3].inPlace = true;
  for (int i = 0; i < 4 && why.empty(); ++i) {
    s[i].salt = salt + i;
    why = runOne(V, comm, s[i]);
  }
  R.fatal = R.fatal || V.fatal;
  if (!why.empty()) return fmt("%s (rank %d of %d there): %s", what, V.rank, V.nranks, why.c_str());
  return "";
}

// ncclCommSplit of the main communicator (every rank calls each split, in the same order): bad input; colors
// by parity with keys reversing the order; one color with keys reversing it; a split of that one (pairs of
// its ranks, each reversed again); NCCL_SPLIT_NOCOLOR for the last rank. Each new communicator's place as the
// keys say, and collectives on it checked. Each step ends with every rank's verdict (`together`).
std::string caseSplit(Rank& R)
{
  const int N = R.nranks, me = R.rank;
  const uint32_t salt = (gSalt += 32);
  ncclComm_t bad = (ncclComm_t)&R; // any non-NULL value: it must be set to NULL
  TN_EXPECT_RC(ncclCommSplit(gComm, -2, 0, &bad, nullptr), ncclInvalidArgument);
  TC_EXPECT(bad == nullptr, "ncclCommSplit(color -2) left *newcomm = %p, expected NULL", (void*)bad);
  TN_EXPECT_RC(ncclCommSplit(gComm, 0, 0, nullptr, nullptr), ncclInvalidArgument);

  std::vector<ncclComm_t> made; // destroyed at the end, last made first
  ncclComm_t rev = nullptr;
  // Colors by parity, keys N - rank: within a color the higher parent rank comes first.
  std::string why = together(R, [&]() -> std::string {
    ncclComm_t half = nullptr;
    TN_OK(ncclCommSplit(gComm, me % 2, N - me, &half, nullptr));
    made.push_back(half);
    int size = 0, place = 0;
    for (int r = 0; r < N; ++r)
      if (r % 2 == me % 2) ++size, place += r > me ? 1 : 0;
    TC_TRY(expectPlace(half, size, place, "the split by parity"));
    return workOn(R, half, salt, "the split by parity");
  }(), "after the split by parity");
  // One color, keys N - 1 - rank: the parent's order reversed.
  if (why.empty()) why = together(R, [&]() -> std::string {
    TN_OK(ncclCommSplit(gComm, 0, N - 1 - me, &rev, nullptr));
    made.push_back(rev);
    TC_TRY(expectPlace(rev, N, N - 1 - me, "the split reversing the order"));
    return workOn(R, rev, salt + 4, "the split reversing the order");
  }(), "after the split reversing the order");
  // A split of that split: its ranks in pairs (q / 2), each pair reversed again (keys N - q).
  if (why.empty()) why = together(R, [&]() -> std::string {
    const int q = N - 1 - me;
    ncclComm_t pair = nullptr;
    TN_OK(ncclCommSplit(rev, q / 2, N - q, &pair, nullptr));
    made.push_back(pair);
    const int size = std::min(2, N - 2 * (q / 2));
    TC_TRY(expectPlace(pair, size, size == 2 ? 1 - q % 2 : 0, "the split of the split"));
    return workOn(R, pair, salt + 8, "the split of the split");
  }(), "after the split of the split");
  // The last rank in no color: *newcomm NULL; the others in parent order (equal keys).
  if (why.empty()) why = together(R, [&]() -> std::string {
    ncclComm_t most = (ncclComm_t)&R;
    TN_OK(ncclCommSplit(gComm, me == N - 1 ? NCCL_SPLIT_NOCOLOR : 7, 0, &most, nullptr));
    if (me == N - 1) {
      TC_EXPECT(most == nullptr, "NCCL_SPLIT_NOCOLOR: *newcomm = %p, expected NULL", (void*)most);
      return "";
    }
    made.push_back(most);
    TC_TRY(expectPlace(most, N - 1, me, "the split without the last rank"));
    return workOn(R, most, salt + 12, "the split without the last rank");
  }(), "after the split without the last rank");
  // Every rank is done with every new communicator before any is freed.
  TC_TRY(boardBarrier(R, "before the split communicators' destroy"));
  for (auto it = made.rbegin(); it != made.rend(); ++it) {
    const ncclResult_t d = ncclCommDestroy(*it);
    if (d != ncclSuccess && why.empty()) why = fmt("ncclCommDestroy of a split communicator returned %s", resultName(d));
  }
  TC_TRY(why);
  R.info = fmt("%d communicators made and destroyed here", (int)made.size());
  return "";
}

// After a case on communicators made from the main one: the main one shows no error and an all-reduce of
// `count` float32 on it is right on every rank.
std::string mainCommUntouched(Rank& R, const char* after, uint64_t count, uint32_t salt)
{
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(async == ncclSuccess, "after %s the main communicator's ncclCommGetAsyncError gives %s", after,
            resultName(async));
  Spec s;
  s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = count, s.salt = salt;
  return runOne(R, gComm, s);
}

// ncclCommShrink of the main communicator: bad input; the last rank left out (alive; it does not call), the
// others' new communicator in parent order and working; the parent untouched (NCCL_SHRINK_DEFAULT).
std::string caseShrink(Rank& R)
{
  const int N = R.nranks, me = R.rank, last = N - 1;
  const uint32_t salt = (gSalt += 8);
  ncclComm_t bad = (ncclComm_t)&R;
  int self[1] = {me};
  TN_EXPECT_RC(ncclCommShrink(gComm, self, 1, &bad, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  TC_EXPECT(bad == nullptr, "ncclCommShrink (this rank excluded) left *newcomm = %p, expected NULL", (void*)bad);
  int outside[1] = {N};
  TN_EXPECT_RC(ncclCommShrink(gComm, outside, 1, &bad, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  int lastOnly[1] = {last};
  TN_EXPECT_RC(ncclCommShrink(gComm, lastOnly, 1, &bad, nullptr, 2), ncclInvalidArgument);
  ncclComm_t shrunk = nullptr;
  std::string why;
  if (me != last) {
    why = [&]() -> std::string {
      TN_OK(ncclCommShrink(gComm, lastOnly, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT));
      TC_TRY(expectPlace(shrunk, N - 1, me, "the shrunk communicator"));
      TC_TRY(workOn(R, shrunk, salt, "the shrunk communicator"));
      ncclResult_t async = ncclInternalError;
      TN_OK(ncclCommGetAsyncError(shrunk, &async));
      TC_EXPECT(async == ncclSuccess, "the shrunk communicator's ncclCommGetAsyncError gives %s", resultName(async));
      return "";
    }();
  }
  // Every survivor is done with the new communicator before any frees it; the rank left out waits meanwhile.
  why = together(R, why, "after the work on the shrunk communicator");
  if (shrunk) {
    const ncclResult_t d = ncclCommDestroy(shrunk);
    if (d != ncclSuccess && why.empty()) why = fmt("ncclCommDestroy of the shrunk communicator returned %s", resultName(d));
  }
  TC_TRY(why);
  // The parent as it was: no error, and it works for every rank, the one left out included.
  TC_TRY(mainCommUntouched(R, "the shrink", 65537, salt + 4));
  R.info = fmt("rank %d left out, %d rank(s) in the new communicator", last, N - 1);
  return "";
}

// ncclCommRevoke on a communicator of its own (a split of the main one, which is never revoked). Rank 0
// revokes first: the others, not revoked yet, see ncclRemoteError (from ncclCommGetAsyncError and from a
// collective), then revoke too. On the revoked communicator collectives, sends, splits and registrations are
// ncclInvalidUsage (nothing queued), the queries answer, ncclCommGetAsyncError says ncclSuccess; a shrink of
// it leaving nobody out gives a working communicator; ncclCommAbort (rank 0) and ncclCommDestroy (the
// others) free it.
std::string caseRevoke(Rank& R)
{
  const int N = R.nranks, me = R.rank;
  const uint32_t salt = (gSalt += 8);
  const uint64_t bytes = 1000 * 4;
  ncclComm_t rc = nullptr;
  std::string why = together(R, [&]() -> std::string {
    TN_OK(ncclCommSplit(gComm, 0, me, &rc, nullptr));
    TC_TRY(expectPlace(rc, N, me, "the split to revoke"));
    Spec s;
    s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = 1000, s.salt = salt;
    TC_TRY(runOne(R, rc, s));
    TN_EXPECT_RC(ncclCommRevoke(rc, 1), ncclInvalidArgument);
    TN_EXPECT_RC(ncclCommRevoke(nullptr, 0), ncclInvalidArgument);
    return "";
  }(), "before the revoke");
  if (why.empty()) why = together(R, [&]() -> std::string {
    if (me == 0) {
      TN_OK(ncclCommRevoke(rc, 0));
    } else {
      // Not revoked here yet: rank 0's revoke reaches this rank as its communicator's failure.
      ncclResult_t async = ncclSuccess;
      const double deadline = nowSec() + 10 * timeoutScale();
      while (ncclCommGetAsyncError(rc, &async) == ncclSuccess && async == ncclSuccess && nowSec() < deadline) usleep(1000);
      TC_EXPECT(async == ncclRemoteError, "after rank 0's revoke ncclCommGetAsyncError gave %s (within 10 s), expected "
                "ncclRemoteError", resultName(async));
      TC_TRY(sentinel(R, gPoolB, bytes));
      TN_EXPECT_RC(ncclAllReduce(gPoolA, gPoolB, 1000, ncclFloat32, ncclSum, rc, R.stream), ncclRemoteError);
      TC_TRY(untouched(R, gPoolB, bytes, "an all-reduce on a communicator a peer revoked"));
      TN_OK(ncclCommRevoke(rc, 0));
    }
    TC_TRY(sentinel(R, gPoolB, bytes));
    TN_EXPECT_RC(ncclAllReduce(gPoolA, gPoolB, 1000, ncclFloat32, ncclSum, rc, R.stream), ncclInvalidUsage);
    // ncclGetLastError gives the communicator's failure first (docs/failures.md): on the ranks that saw rank 0's
    // revoke as their communicator's failure, that is rank 0's abort; on rank 0, the refusal.
    const std::string msg = lastError(rc);
    if (me == 0)
      TC_EXPECT(msg.find("revoked") != std::string::npos, "the refusal does not say the comm was revoked: '%s'",
                msg.c_str());
    else
      TC_EXPECT(msg.find("rank 0") != std::string::npos,
                "ncclGetLastError does not give the communicator's failure (rank 0's revoke): '%s'", msg.c_str());
    TN_EXPECT_RC(ncclBroadcast(gPoolA, gPoolB, 1000, ncclFloat32, 0, rc, R.stream), ncclInvalidUsage);
    TN_EXPECT_RC(ncclSend(gPoolA, 1000, ncclFloat32, (me + 1) % N, rc, R.stream), ncclInvalidUsage);
    ncclComm_t nc = (ncclComm_t)&R;
    TN_EXPECT_RC(ncclCommSplit(rc, 0, 0, &nc, nullptr), ncclInvalidUsage);
    TC_EXPECT(nc == nullptr, "a split of a revoked comm left *newcomm = %p, expected NULL", (void*)nc);
    void* handle = nullptr;
    TN_EXPECT_RC(ncclCommRegister(rc, gPoolA, 4096, &handle), ncclInvalidUsage);
    TC_TRY(untouched(R, gPoolB, bytes, "the calls on a revoked comm"));
    TC_TRY(expectPlace(rc, N, me, "the revoked comm's queries"));
    int dev = -1;
    TN_OK(ncclCommCuDevice(rc, &dev));
    ncclResult_t async = ncclInternalError;
    TN_OK(ncclCommGetAsyncError(rc, &async));
    TC_EXPECT(async == ncclSuccess, "ncclCommGetAsyncError of the revoked comm gives %s, expected ncclSuccess",
              resultName(async));
    return "";
  }(), "after the revokes");
  // A shrink of the revoked communicator leaving nobody out: every rank in a working communicator.
  ncclComm_t fresh = nullptr;
  if (why.empty()) why = together(R, [&]() -> std::string {
    TN_OK(ncclCommShrink(rc, nullptr, 0, &fresh, nullptr, NCCL_SHRINK_DEFAULT));
    TC_TRY(expectPlace(fresh, N, me, "the shrink of the revoked comm"));
    return workOn(R, fresh, salt + 1, "the shrink of the revoked comm");
  }(), "after the work on the shrink of the revoked comm");
  if (fresh) {
    const ncclResult_t d = ncclCommDestroy(fresh);
    if (d != ncclSuccess && why.empty()) why = fmt("ncclCommDestroy of the shrunk comm returned %s", resultName(d));
  }
  if (rc) {
    const ncclResult_t d = me == 0 ? ncclCommAbort(rc) : ncclCommDestroy(rc);
    if (d != ncclSuccess && why.empty())
      why = fmt("%s of the revoked comm returned %s", me == 0 ? "ncclCommAbort" : "ncclCommDestroy", resultName(d));
  }
  TC_TRY(why);
  // The main communicator was never touched.
  TC_TRY(mainCommUntouched(R, "the revoke case", 1000, salt + 6));
  R.info = "rank 0 revoked first; freed by ncclCommAbort on rank 0, ncclCommDestroy elsewhere";
  return "";
}

// Host memory where device memory belongs: ncclInvalidArgument naming the buffer, nothing queued, the
// communicator still usable. Every rank passes the same bad buffer, so none is left waiting.
std::string caseHostMemory(Rank& R)
{
  std::vector<float> host(65537 * R.nranks, 1.0f);
  const uint64_t bytes = 65537 * 4;
  TC_TRY(sentinel(R, gPoolB, bytes * R.nranks));
  ncclResult_t r = ncclAllReduce(host.data(), gPoolB, 65537, ncclFloat32, ncclSum, gComm, R.stream);
  std::string msg = lastError(gComm);
  TC_EXPECT(r == ncclInvalidArgument, "ncclAllReduce from host memory returned %s, expected ncclInvalidArgument: %s",
            resultName(r), msg.c_str());
  TC_EXPECT(msg.find("sendbuff") != std::string::npos, "the last error does not name sendbuff: '%s'", msg.c_str());
  TC_TRY(untouched(R, gPoolB, bytes, "ncclAllReduce from host memory"));
  r = ncclAllGather(gPoolA, host.data(), 65537 / R.nranks, ncclFloat32, gComm, R.stream);
  msg = lastError(gComm);
  TC_EXPECT(r == ncclInvalidArgument, "ncclAllGather into host memory returned %s, expected ncclInvalidArgument: %s",
            resultName(r), msg.c_str());
  TC_EXPECT(msg.find("recvbuff") != std::string::npos, "the last error does not name recvbuff: '%s'", msg.c_str());
  for (float v : host) TC_EXPECT(v == 1.0f, "ncclAllGather wrote into the host buffer it refused");
  ncclResult_t async = ncclInternalError;
  TN_OK(ncclCommGetAsyncError(gComm, &async));
  TC_EXPECT(async == ncclSuccess, "after the refusals ncclCommGetAsyncError gives %s", resultName(async));
  Spec s;
  s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = 65537, s.salt = ++gSalt;
  return runOne(R, gComm, s);
}

// ncclCommFinalize, then ncclCommDestroy: after the finalize only the destroy is accepted; after the destroy
// the handle is dead.
std::string caseFinalizeDestroy(Rank& R)
{
  TN_OK(ncclCommFinalize(gComm));
  TC_TRY(sentinel(R, gPoolB, 4000));
  ncclResult_t r = ncclAllReduce(gPoolA, gPoolB, 1000, ncclFloat32, ncclSum, gComm, R.stream);
  TC_EXPECT(r == ncclInvalidUsage, "ncclAllReduce after ncclCommFinalize returned %s, expected ncclInvalidUsage",
            resultName(r));
  TC_TRY(untouched(R, gPoolB, 4000, "ncclAllReduce after ncclCommFinalize"));
  ncclComm_t dead = gComm;
  gComm = nullptr;
  TN_OK(ncclCommDestroy(dead));
  int count = -1;
  r = ncclCommCount(dead, &count);
  TC_EXPECT(r == ncclInvalidArgument, "ncclCommCount on a destroyed comm returned %s, expected ncclInvalidArgument",
            resultName(r));
  return oobBarrier(R, "after ncclCommDestroy");
}

int mainRank(Rank& R)
{
  if (!setUpPassed(R, setUpRank(R))) return 1;
  runCase(R, "init_rank_count_cudevice_userrank", [&] { return caseInit(R); });
  for (ncclDataType_t t : kTypes)
    for (ncclRedOp_t op : kOps)
      runCase(R, fmt("allreduce_%s_%s", typeName(t), opName(op)), [&] { return caseAllReduce(R, t, op); });
  for (ncclDataType_t t : kTypes) runCase(R, fmt("allgather_%s", typeName(t)), [&] { return caseAllGather(R, t); });
  for (ncclDataType_t t : kTypes)
    runCase(R, fmt("reducescatter_%s_every_op", typeName(t)), [&] { return caseReduceScatter(R, t); });
  for (ncclDataType_t t : kTypes)
    runCase(R, fmt("broadcast_bcast_%s_root_0_and_last", typeName(t)), [&] { return caseBroadcast(R, t); });
  runCase(R, "group_three_collectives", [&] { return caseGroupSeveral(R); });
  runCase(R, "group_nested", [&] { return caseGroupNested(R); });
  runCase(R, "group_failed_by_a_bad_call", [&] { return caseGroupBadCall(R); });
  runCase(R, "graph_allreduce_replayed_10_times", [&] { return caseGraph(R); });
  runCase(R, "init_rank_config_blocking", [&] { return caseConfigBlocking(R); });
  runCase(R, "init_rank_config_nonblocking", [&] { return caseConfigNonBlocking(R); });
  runCase(R, "memalloc_register_allreduce", [&] { return caseMemAlloc(R); });
  runCase(R, "memalloc_mapped_by_peers", [&] { return caseMemAllocMapped(R); });
  for (ncclDataType_t t : {ncclFloat16, ncclBfloat16, ncclInt32, ncclFloat64})
    runCase(R, fmt("reduce_%s_every_op_roots_0_and_last", typeName(t)), [&] { return caseReduce(R, t); });
  for (ncclDataType_t t : kMoveTypes) {
    runCase(R, fmt("gather_%s_roots_0_and_last", typeName(t)), [&] { return caseGatherScatter(R, kGather, t); });
    runCase(R, fmt("scatter_%s_roots_0_and_last", typeName(t)), [&] { return caseGatherScatter(R, kScatter, t); });
    runCase(R, fmt("alltoall_%s", typeName(t)), [&] { return caseAlltoAll(R, t); });
  }
  runCase(R, "p2p_ring_uint8", [&] { return caseP2pRing(R, ncclUint8, 0); });
  runCase(R, "p2p_ring_float32", [&] { return caseP2pRing(R, ncclFloat32, 0); });
  runCase(R, "p2p_ring_unaligned_by_4_bytes_uint8", [&] { return caseP2pRing(R, ncclUint8, 4); });
  runCase(R, "p2p_ring_unaligned_by_4_bytes_float32", [&] { return caseP2pRing(R, ncclFloat32, 4); });
  runCase(R, "p2p_pairs_both_ways_sends_first", [&] { return caseP2pPairs(R); });
  runCase(R, "p2p_alltoall_in_one_group", [&] { return caseP2pAlltoAll(R); });
  runCase(R, "p2p_to_self", [&] { return caseP2pSelf(R); });
  runCase(R, "p2p_two_sends_to_one_peer_in_order", [&] { return caseP2pTwoToOnePeer(R); });
  runCase(R, "p2p_alone_outside_a_group_up_to_1MiB", [&] { return caseP2pAlone(R); });
  runCase(R, "p2p_graph_replayed_5_times", [&] { return caseP2pGraph(R); });
  runCase(R, "p2p_bad_inputs", [&] { return caseP2pBad(R); });
  // fp8 and PreMulSum after the cases of the other types and operators, so that a failure there costs
  // nothing of the rest.
  for (ncclDataType_t t : kFp8Types) {
    const std::string n = typeName(t);
    runCase(R, "allreduce_" + n + "_sum_max_min", [&] { return caseFp8(R, t, kAllReduce); });
    runCase(R, "allgather_" + n, [&] { return caseFp8(R, t, kAllGather); });
    runCase(R, "reducescatter_" + n + "_sum_max_min", [&] { return caseFp8(R, t, kReduceScatter); });
    runCase(R, "broadcast_bcast_" + n + "_root_0_and_last", [&] { return caseFp8(R, t, kBroadcast); });
    runCase(R, "reduce_" + n + "_sum_max_min_roots_0_and_last", [&] { return caseFp8(R, t, kReduce); });
  }
  runCase(R, "p2p_ring_float8e4m3", [&] { return caseP2pRing(R, ncclFloat8e4m3, 0); });
  runCase(R, "p2p_ring_unaligned_by_4_bytes_float8e5m2", [&] { return caseP2pRing(R, ncclFloat8e5m2, 4); });
  for (ncclDataType_t t : kPremulTypes) {
    runCase(R, fmt("premulsum_host_immediate_%s", typeName(t)), [&] { return casePremulHost(R, t); });
    runCase(R, fmt("premulsum_device_scalar_graph_%s", typeName(t)), [&] { return casePremulDevice(R, t); });
  }
  runCase(R, "split_parity_reversed_nested_nocolor", [&] { return caseSplit(R); });
  runCase(R, "shrink_leaving_the_last_rank_out", [&] { return caseShrink(R); });
  runCase(R, "revoke_a_split_then_shrink_abort_destroy", [&] { return caseRevoke(R); });
  runCase(R, "not_offered_ncclDevCommCreate_ncclDevCommDestroy", [&]() -> std::string {
    TC_TRY(caseRefused(R, "ncclDevComm", [&](void*, void*) { return ncclDevCommCreate(gComm, nullptr, nullptr); }));
    return caseRefused(R, "ncclDevComm", [&](void*, void*) { return ncclDevCommDestroy(gComm, nullptr); });
  });
  runCase(R, "bad_input_host_memory", [&] { return caseHostMemory(R); });
  // Late: a failure here may leave a kernel waiting on its own communicator.
  runCase(R, "gather_back_to_back_root_late", [&] { return caseGatherBackToBack(R); });
  runCase(R, "finalize_destroy", [&] { return caseFinalizeDestroy(R); });
  freeRankBuffers(R);
  // Frees the context, so that compute-sanitizer's leak check sees what became of every allocation.
  cudaError_t e = cudaDeviceReset();
  if (e != cudaSuccess) rankLog(R, "cudaDeviceReset failed: %s", cudaGetErrorString(e));
  return 0;
}

// ------------------------------------------------------------------------------------------------
// initall: ncclCommInitAll in one process
// ------------------------------------------------------------------------------------------------

std::string caseInitAllOne(Rank& R)
{
  int dev = R.device;
  ncclComm_t comm = nullptr;
  TN_OK(ncclCommInitAll(&comm, 1, &dev));
  int count = -1, cu = -1, rank = -1;
  TN_OK(ncclCommCount(comm, &count));
  TN_OK(ncclCommCuDevice(comm, &cu));
  TN_OK(ncclCommUserRank(comm, &rank));
  TC_EXPECT(count == 1 && cu == dev && rank == 0, "Count/CuDevice/UserRank say %d/%d/%d, expected 1/%d/0", count, cu,
            rank, dev);
  // One rank: every collective gives its input back (R.nranks is 1 here).
  std::string why;
  for (Coll coll : {kAllReduce, kAllGather, kReduceScatter, kBroadcast})
    for (int inPlace = 0; inPlace < 2 && why.empty(); ++inPlace) {
      Spec s;
      s.coll = coll, s.type = ncclFloat32, s.op = ncclAvg, s.count = 65537, s.inPlace = inPlace, s.salt = ++gSalt;
      why = runOne(R, comm, s);
    }
  ncclResult_t des = ncclCommDestroy(comm);
  TC_TRY(why);
  TC_EXPECT(des == ncclSuccess, "ncclCommDestroy returned %s", resultName(des));
  return "";
}

// Every GPU, one rank each, in this one process: an all-reduce on each communicator in one group (the way
// ncclCommInitAll's communicators are driven from one thread).
std::string caseInitAllDevices(Rank& R, int ndev)
{
  std::vector<int> devs(ndev);
  for (int d = 0; d < ndev; ++d) devs[d] = d;
  std::vector<ncclComm_t> comms(ndev, nullptr);
  TN_OK(ncclCommInitAll(comms.data(), ndev, devs.data()));
  const uint64_t count = 65537;
  std::vector<float*> bufs(ndev, nullptr);
  std::vector<cudaStream_t> streams(ndev, nullptr);
  std::string why;
  for (int d = 0; d < ndev && why.empty(); ++d) {
    int cu = -1, rank = -1;
    if (ncclCommCuDevice(comms[d], &cu) != ncclSuccess || ncclCommUserRank(comms[d], &rank) != ncclSuccess || cu != d ||
        rank != d)
      why = fmt("communicator %d says device %d rank %d", d, cu, rank);
    std::vector<float> in(count);
    for (uint64_t j = 0; j < count; ++j) in[j] = (float)inputValue(ncclFloat32, ncclSum, d, j, 7);
    if (cudaSetDevice(d) != cudaSuccess || cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void**)&bufs[d], count * 4) != cudaSuccess ||
        cudaMemcpy(bufs[d], in.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess)
      why = fmt("buffers on device %d could not be made", d);
  }
  if (why.empty()) {
    ncclGroupStart();
    ncclResult_t rc = ncclSuccess;
    for (int d = 0; d < ndev; ++d) {
      cudaSetDevice(d);
      ncclResult_t r = ncclAllReduce(bufs[d], bufs[d], count, ncclFloat32, ncclSum, comms[d], streams[d]);
      if (r != ncclSuccess) rc = r;
    }
    ncclResult_t end = ncclGroupEnd();
    if (rc != ncclSuccess || end != ncclSuccess)
      why = fmt("the all-reduces returned %s, ncclGroupEnd %s: %s", resultName(rc), resultName(end), lastError(nullptr).c_str());
  }
  for (int d = 0; d < ndev && why.empty(); ++d) {
    cudaSetDevice(d);
    std::vector<float> out(count);
    const double deadline = nowSec() + R.hostTimeoutS;
    while (cudaStreamQuery(streams[d]) == cudaErrorNotReady && nowSec() < deadline) usleep(200);
    if (cudaStreamQuery(streams[d]) != cudaSuccess) {
      why = fmt("device %d's all-reduce did not finish within %.0f s", d, R.hostTimeoutS);
      R.fatal = true;
      break;
    }
    cudaMemcpy(out.data(), bufs[d], count * 4, cudaMemcpyDeviceToHost);
    for (uint64_t j = 0; j < count && why.empty(); ++j) {
      double want = 0;
      for (int q = 0; q < ndev; ++q) want += inputValue(ncclFloat32, ncclSum, q, j, 7);
      if (out[j] != (float)want) why = fmt("device %d element %llu is %.9g, want %.9g", d, (unsigned long long)j, out[j], want);
    }
  }
  for (int d = 0; d < ndev; ++d) {
    cudaSetDevice(d);
    if (bufs[d]) cudaFree(bufs[d]);
    if (streams[d]) cudaStreamDestroy(streams[d]);
    if (comms[d] && ncclCommDestroy(comms[d]) != ncclSuccess && why.empty()) why = fmt("ncclCommDestroy of %d failed", d);
  }
  cudaSetDevice(R.device);
  R.info = fmt("%d devices", ndev);
  return why;
}

// A device that does not exist (cupy's test_send_recv on a machine of one GPU passes {0, 1}):
// ncclInvalidArgument at once, naming the device and the count, and no communicator made.
std::string caseInitAllMissingDevice(Rank& R)
{
  std::vector<int> devs = {0, R.nGpus};
  std::vector<ncclComm_t> comms(2, nullptr);
  const double t0 = nowSec();
  ncclResult_t r = ncclCommInitAll(comms.data(), 2, devs.data());
  const double took = nowSec() - t0;
  const std::string e = lastError(nullptr);
  TC_EXPECT(r == ncclInvalidArgument, "ncclCommInitAll(2, {0, %d}) with %d GPU(s) returned %s, expected "
            "ncclInvalidArgument", R.nGpus, R.nGpus, resultName(r));
  TC_EXPECT(took < 2.0, "ncclCommInitAll with a missing device took %.1f s to fail", took);
  TC_EXPECT(e.find(fmt("device %d", R.nGpus)) != std::string::npos &&
                e.find(fmt("%d CUDA device", R.nGpus)) != std::string::npos,
            "the last error does not name the device and the count: %s", e.c_str());
  TC_EXPECT(comms[0] == nullptr && comms[1] == nullptr, "a communicator was handed out");
  R.info = fmt("%.0f ms", took * 1e3);
  return "";
}

int initAllRank(Rank& R)
{
  if (!setUpPassed(R, setUpRank(R), "initall_setup")) return 1;
  runCase(R, "initall_one_device", [&] { return caseInitAllOne(R); });
  runCase(R, "initall_missing_device", [&] { return caseInitAllMissingDevice(R); });
  if (R.nGpus > 1) {
    const int ndev = std::min(R.nGpus, 8);
    runCase(R, fmt("initall_%d_devices_allreduce_in_one_group", ndev), [&] { return caseInitAllDevices(R, ndev); });
  } else {
    snprintf(gBoard->skipWhy, sizeof(gBoard->skipWhy), "initall_every_device: one GPU visible (the one-device case ran)");
    gBoard->skipMultiDevice = 1;
  }
  freeRankBuffers(R);
  return 0;
}

// ------------------------------------------------------------------------------------------------
// kill: the last rank SIGKILLed during all-reduces
// ------------------------------------------------------------------------------------------------

struct KillResult : KillOutcome
{
  unsigned long long iterations;
  int laterRc;
  int abortRc;
  double abortS;
  int shrinkRc;       // ncclCommShrink leaving the dead rank out
  double shrinkS;
  int shrunkCount;    // the new communicator's Count and UserRank
  int shrunkRank;
  int shrunkDestroyRc;
  char shrunkWhy[240]; // the all-reduce on it, where it failed
  int freshRc;         // a new communicator of the survivors (ncclCommInitRank, after the abort)
  char freshWhy[240];  // its all-reduce or destroy, where it failed
  char lastError[240];
};

// What the ranks loop on when the last one is killed: all-reduces called one by one, the same all-reduce
// captured once in a CUDA graph and the graph launched (a kernel of a graph learns of the failure from the
// device's flags alone: nothing on the host runs between its launches), or rings of sends and receives.
enum class KillWork
{
  AllReduces,
  AllReducesInGraph,
  SendRecvRing,
};

// One step of the loop: an all-reduce of 1 MiB, or (p2p) a group of a send of 4 MiB to the next rank and a
// receive of 4 MiB from the previous one.
ncclResult_t killStep(Rank& R, ncclComm_t comm, bool p2p)
{
  const uint64_t count = p2p ? (1u << 20) : (1u << 20) / 4;
  if (!p2p) return ncclAllReduce(gPoolA, gPoolB, count, ncclFloat32, ncclSum, comm, R.stream);
  ncclGroupStart();
  ncclResult_t a = ncclSend(gPoolA, count, ncclFloat32, nextRank(R), comm, R.stream);
  ncclResult_t b = ncclRecv(gPoolB, count, ncclFloat32, prevRank(R), comm, R.stream);
  ncclResult_t end = ncclGroupEnd();
  return a != ncclSuccess ? a : b != ncclSuccess ? b : end;
}

int killRank(Rank& R, KillShared<KillResult>* S, KillWork work)
{
  const bool p2p = work == KillWork::SendRecvRing;
  KillResult& out = S->res[R.rank];
  auto fail = [&](const std::string& why) { return killFail(out, R.rank, why); };
  std::string why = setUpRank(R);
  if (!why.empty()) return fail(why);
  ncclUniqueId id;
  why = shareId(R, 0, &id);
  if (!why.empty()) return fail(why);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, R.nranks, id, R.rank);
  if (r != ncclSuccess) return fail(fmt("ncclCommInitRank returned %s", resultName(r)));
  // A checked first call: the set-up, and proof that the loop moves real data.
  if (p2p) {
    P2pPlan plan;
    plan.add(true, nextRank(R), ncclFloat32, 1u << 20);
    plan.add(false, prevRank(R), ncclFloat32, 1u << 20);
    plan.salt = 5;
    Arena arena;
    why = prepareP2p(R, plan, arena);
    if (why.empty()) why = issueP2p(plan, comm, R.stream, true);
    if (why.empty()) why = syncBounded(R, "the first sends and receives");
    if (why.empty()) why = checkP2p(R, plan);
    if (!why.empty()) return fail("the first ring of sends and receives: " + why);
  } else {
    Spec s;
    s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = (1u << 20) / 4, s.salt = 5;
    why = runOne(R, comm, s);
    if (!why.empty()) return fail("the first all-reduce: " + why);
  }
  S->ready[R.rank] = 1;

  // Steps until the failure shows, at most four in flight, watching the communicator's error.
  cudaEvent_t events[4];
  for (cudaEvent_t& e : events)
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return fail("cudaEventCreate failed");
  const std::function<ncclResult_t()> error = asyncErrorOf(comm);
  // In a graph: the step captured once; a launch that fails is the step's failure.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graphExec = nullptr;
  if (work == KillWork::AllReducesInGraph) {
    if (cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
      return fail("cudaStreamBeginCapture failed");
    const ncclResult_t captured = killStep(R, comm, false);
    const cudaError_t ended = cudaStreamEndCapture(R.stream, &graph);
    if (captured != ncclSuccess) return fail(fmt("ncclAllReduce in the capture returned %s", resultName(captured)));
    if (ended != cudaSuccess || cudaGraphInstantiate(&graphExec, graph, 0) != cudaSuccess)
      return fail("the all-reduce's graph was not captured and instantiated");
  }
  const std::function<ncclResult_t()> step = [&] {
    if (!graphExec) return killStep(R, comm, p2p);
    return cudaGraphLaunch(graphExec, R.stream) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  };
  ncclResult_t async = ncclSuccess, loopRc = ncclSuccess;
  if (!loopUntilFailure<ncclResult_t>(R.stream, events, &S->stop, error, step, &out.iterations, &async, &loopRc))
    return fail("no failure seen: the loop was stopped or ran out of time");
  out.tDetect = nowSec();
  out.asyncError = (int)trailingError(async, error, 10);
  copyText(out.lastError, sizeof(out.lastError), lastError(comm));
  if (loopRc != ncclSuccess) fprintf(stderr, "[rank %d] the loop ended on a call returning %d\n", R.rank, loopRc);

  // No hang: the queued kernels see the failure and end.
  drainOrExit(out, R.rank, R.device, R.stream, "a kernel hangs on the dead rank");
  if (graphExec) cudaGraphExecDestroy(graphExec);
  if (graph) cudaGraphDestroy(graph);
  out.laterRc = (int)killStep(R, comm, p2p);

  // The survivors go on without the dead rank: ncclCommShrink leaving it out (NCCL_SHRINK_ABORT, as after a
  // failure: the parent is revoked first), an all-reduce on the new communicator checked against the host
  // reference of its ranks, its destroy.
  const int victim = R.nranks - 1;
  ncclComm_t shrunk = nullptr;
  ncclComm_t* shrunkAt = &shrunk;
  out.shrinkRc = (int)boundedOrExit<ncclResult_t>(
      out, R.rank, R.device, 40,
      [comm, victim, shrunkAt] {
        int exclude[1] = {victim};
        return ncclCommShrink(comm, exclude, 1, shrunkAt, nullptr, NCCL_SHRINK_ABORT);
      },
      "ncclCommShrink did not return within 40 s", &out.shrinkS);
  out.shrunkDestroyRc = (int)ncclSuccess;
  if (out.shrinkRc == ncclSuccess && shrunk) {
    Rank V;
    why = viewOn(R, shrunk, &V);
    out.shrunkCount = V.nranks;
    out.shrunkRank = V.rank;
    if (why.empty()) {
      Spec s;
      s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = 65537, s.salt = 6;
      why = runOne(V, shrunk, s);
    }
    copyText(out.shrunkWhy, sizeof(out.shrunkWhy), why);
    double took = 0;
    out.shrunkDestroyRc = (int)boundedOrExit<ncclResult_t>(
        out, R.rank, R.device, 20, [shrunk] { return ncclCommDestroy(shrunk); },
        "ncclCommDestroy of the shrunk communicator did not return within 20 s", &took);
  }
  out.abortRc = (int)boundedOrExit<ncclResult_t>(out, R.rank, R.device, 20, [comm] { return ncclCommAbort(comm); },
                                                 "ncclCommAbort did not return within 20 s", &out.abortS);

  // A new communicator of the survivors on the same GPU(s), from a fresh unique id: the dead rank's memory
  // went with it while the survivors' kernels may still have been writing into it, and a kernel that faulted
  // there would have ended every MPS client of the GPU, these ranks' next work included.
  Rank F = R;
  F.nranks = R.nranks - 1;
  ncclUniqueId freshId;
  why = shareId(F, 1, &freshId);
  ncclComm_t fresh = nullptr;
  ncclComm_t* freshAt = &fresh;
  out.freshRc = (int)ncclSuccess;
  if (why.empty()) {
    double took = 0;
    out.freshRc = (int)boundedOrExit<ncclResult_t>(
        out, R.rank, R.device, 40, [freshAt, freshId, &F] { return ncclCommInitRank(freshAt, F.nranks, freshId, F.rank); },
        "ncclCommInitRank of the survivors' new communicator did not return within 40 s", &took);
  }
  if (why.empty() && out.freshRc == ncclSuccess) {
    Spec s;
    s.coll = kAllReduce, s.type = ncclFloat32, s.op = ncclSum, s.count = (1u << 20) / 4, s.salt = 7;
    why = runOne(F, fresh, s);
    double took = 0;
    const ncclResult_t destroyRc = boundedOrExit<ncclResult_t>(
        out, R.rank, R.device, 20, [fresh] { return ncclCommDestroy(fresh); },
        "ncclCommDestroy of the survivors' new communicator did not return within 20 s", &took);
    if (why.empty() && destroyRc != ncclSuccess) why = fmt("ncclCommDestroy returned %s", resultName(destroyRc));
  }
  copyText(out.freshWhy, sizeof(out.freshWhy), why);
  for (cudaEvent_t& e : events) cudaEventDestroy(e);
  freeRankBuffers(R);
  out.finished = 1;
  return 0;
}

int runKill(const Options& opt, KillWork work)
{
  const bool p2p = work == KillWork::SendRecvRing, graphWork = work == KillWork::AllReducesInGraph;
  const char* name = p2p                                   ? "kill_last_rank_during_send_recv_ring"
                     : work == KillWork::AllReducesInGraph ? "kill_last_rank_during_allreduces_in_a_graph"
                                                           : "kill_last_rank_during_allreduces";
  const KillPlan k = {name, opt.nranks, 180, 120, 1000000, "loop", true}; // the loops 1 s under way at the kill
  const double scale = timeoutScale(), t0 = nowSec();
  const int nranks = opt.nranks, victim = nranks - 1;
  memset((void*)gBoard, 0, sizeof(Board));
  KillShared<KillResult>* S = nullptr;
  KillJudge<KillResult> judge;
  judge.rank = [&](int r) { // forked once runKillCase has mapped S
    Rank R = killCaseRank(r, nranks);
    return killRank(R, S, work);
  };
  judge.check = [&](int r, const KillResult& o, double tKill) -> std::string {
    if (o.iterations == 0) return "no call ran in the loop";
    std::string why = sawRemoteError(o.asyncError, o.tDetect - tKill, o.lastError, victim);
    if (why.empty()) why = detectedAndDrained(o, tKill);
    if (!why.empty()) return why;
    if (o.laterRc != ncclRemoteError)
      return fmt("the next %s returned %s, not ncclRemoteError", p2p ? "group of ncclSend/ncclRecv" : "ncclAllReduce",
                 resultName((ncclResult_t)o.laterRc));
    if (o.shrinkRc != ncclSuccess)
      return fmt("ncclCommShrink(NCCL_SHRINK_ABORT) leaving rank %d out returned %s", victim,
                 resultName((ncclResult_t)o.shrinkRc));
    if (o.shrunkCount != nranks - 1 || o.shrunkRank != r)
      return fmt("the shrunk communicator says rank %d of %d, expected %d of %d", o.shrunkRank, o.shrunkCount, r,
                 nranks - 1);
    if (o.shrunkWhy[0]) return fmt("the all-reduce on the shrunk communicator: %s", o.shrunkWhy);
    if (o.shrunkDestroyRc != ncclSuccess)
      return fmt("ncclCommDestroy of the shrunk communicator returned %s", resultName((ncclResult_t)o.shrunkDestroyRc));
    if (o.abortRc != ncclSuccess) return fmt("ncclCommAbort returned %s", resultName((ncclResult_t)o.abortRc));
    if (o.abortS > 10 * scale) return fmt("ncclCommAbort took %.2f s", o.abortS);
    if (o.freshRc != ncclSuccess)
      return fmt("the survivors' new communicator: ncclCommInitRank returned %s", resultName((ncclResult_t)o.freshRc));
    if (o.freshWhy[0]) return fmt("the survivors' new communicator: %s", o.freshWhy);
    return "";
  };
  judge.info = [&](int r, const KillResult& o, double tKill) {
    return fmt(" rank%d: %llu calls, ncclRemoteError %.3f s after the kill, stream drained in %.3f s, shrunk to %d "
               "rank(s) in %.2f s (all-reduce checked), abort %.2f s, a new communicator of the survivors right;",
               r, o.iterations, o.tDetect - tKill, o.syncS, o.shrunkCount, o.shrinkS, o.abortS);
  };
  std::string info;
  const int failed = runKillCase(k, &S, judge, &info);
  return endKillCase(k, S, failed, info, failed || !S ? std::string() : fmt(" last error '%s'", S->res[0].lastError),
                     fmt("%s (%d ranks, %.1f s)", p2p ? "kill_p2p" : graphWork ? "kill_graph" : "kill", nranks, nowSec() - t0));
}

} // namespace

int main(int argc, char** argv)
{
  const char* which = "all";
  int argi = 1;
  if (argc > 1 && argv[1][0] != '-' && !isdigit((unsigned char)argv[1][0])) which = argv[argi++];
  // parseArgs reads [nranks] [--port P] after the group's name.
  Options opt = parseArgs(argc - argi + 1, argv + argi - 1, 2);
  const bool all = !strcmp(which, "all");
  // kill runs the three kill cases; kill_allreduces, kill_graph and kill_p2p one each, so that a runner can restart the MPS
  // daemon between them (a killed client may leave it refusing new ones: docs/failures.md, "A process that ends").
  const bool killAllReduces = !strcmp(which, "kill") || !strcmp(which, "kill_allreduces");
  const bool killP2p = !strcmp(which, "kill") || !strcmp(which, "kill_p2p");
  const bool killGraph = !strcmp(which, "kill") || !strcmp(which, "kill_graph");
  if (!all && strcmp(which, "main") && !killAllReduces && !killP2p && !killGraph && strcmp(which, "initall")) {
    fprintf(stderr, "usage: %s <all|main|kill|kill_allreduces|kill_graph|kill_p2p|initall> [nranks] [--port P]\n",
            argv[0]);
    return 2;
  }
  gBoard = mapBoard<Board>("nccl_gpu_test");
  if (!gBoard) return 1;
  if (skipWithoutGpu(fmt("nccl_gpu_test %s", which))) return 0;
  int rc = 0;
  if (all || !strcmp(which, "main")) {
    memset((void*)gBoard, 0, sizeof(Board));
    rc |= runRanks("nccl_main", opt, 1200, mainRank);
  }
  if (all || killAllReduces) rc |= runKill(opt, KillWork::AllReduces);
  if (all || killGraph) rc |= runKill(opt, KillWork::AllReducesInGraph);
  if (all || killP2p) rc |= runKill(opt, KillWork::SendRecvRing);
  if (all || !strcmp(which, "initall")) {
    memset((void*)gBoard, 0, sizeof(Board));
    Options one = opt;
    one.nranks = 1; // one process holds every rank
    rc |= runRanks("nccl_initall", one, 180, initAllRank);
    if (gBoard->skipMultiDevice) printf("SKIP %s\n", gBoard->skipWhy);
  }
  return rc;
}
