// The collectives (mscclppAllReduce, mscclppAllGather, mscclppReduceScatter, mscclppBroadcast), timed the
// way nccl_collectives.py times NCCL, so that compare_collectives.py can put both into one table.
//
// One process per rank (rank r on GPU r % GPUs), meeting at 127.0.0.1:port. For each collective and
// message size (the bytes NCCL-tests count: all-reduce's and broadcast's buffer, all-gather's output,
// reduce-scatter's input; out of place, sum, broadcast from rank 0):
//   1. one call is checked element by element (inputs are small non-zero integers, exact in every type,
//      the output zeroed before), and again after all the timed calls;
//   2. graph: a CUDA graph of back-to-back calls (100 up to 1 MiB, 10 above) is captured, replayed once
//      to warm up, then replayed within CUDA events; the time per call is the median of the repeats;
//   3. eager: a loop of calls between CUDA events (the host enqueues as fast as it can), median of the
//      repeats.
// A repeat lasts about --repeat-ms (calls estimated from the size), so that the skew between the ranks at
// its start does not count. algBW = message bytes / time per call.
//
// Output (rank 0): one line per measurement,
//   RESULT lib=mscclpp caller=c collective=allreduce dtype=f16 bytes=1024 mode=graph us=2.345 algbw=0.437
//          calls=2000 repeats=3 ranks=2 gpus=2 algo=auto checked=1
// then a table, then the runner's PASS/FAIL lines and SUMMARY.
//
//   collectives_bench [nranks] [--port P] [--colls LIST] [--sizes LIST] [--min-bytes N] [--max-bytes N]
//                     [--modes graph,eager] [--repeats N] [--iters N] [--repeat-ms T] [--quick] [--timeout S]
//                     [--api mscclpp|nccl|both] [--nccl-lib PATH] [--register] [--roofline]
// LIST of collectives: allreduce_f16, allreduce_f32, allreduce_bf16, allgather_f32, reducescatter_f16, ...
// ("allreduce" = allreduce_f16,allreduce_f32; a name without a type is f32). Sizes take K, M, G (KiB...).
//
// --api: which face issues the calls. mscclpp (the default): mscclpp.h's functions. nccl: nccl.h's
// (ncclAllReduce, ...) on an NCCL communicator of the same ranks, from this tree's libnccl.so.2 (loaded at
// run time from --nccl-lib, default ../lib/nccl/libnccl.so.2 beside this program; its RESULT lines say
// lib=ncclface). both: each size measured through one face then the other in the same processes, on the same
// buffers, so the difference is what the NCCL layer costs per call (issue 25, point 6).
//
// --register: both buffers are registered with mscclppCommRegister before the first call (zero-copy where
// every rank registered; algo= in RESULT lines gets "+registered"). --roofline: after each size, rank 0
// alone times device-to-device copies of the bytes the call must move at the least (timeRoofline).
// The GPU tests' harness (c-tests/harness/, on the Makefile's include path): the same runner and checks.
#include "mscclpp_rank.h"

#include <nccl.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#ifndef MSCCLPP_HAS_COLLECTIVES
#error "collectives_bench needs a mscclpp.h with the collectives (MSCCLPP_HAS_COLLECTIVES)"
#endif

using namespace tc;

namespace {

enum Coll : int
{
  kAllReduce = 0,
  kAllGather = 1,
  kReduceScatter = 2,
  kBroadcast = 3,
};
const char* const kCollNames[] = {"allreduce", "allgather", "reducescatter", "broadcast"};

enum DType : int
{
  kF16 = 0,
  kBF16 = 1,
  kF32 = 2,
};
struct DTypeInfo
{
  const char* name;
  mscclppDataType_t type;
  uint64_t bytes;
};
const DTypeInfo kDTypes[] = {{"f16", mscclppFloat16, 2}, {"bf16", mscclppBfloat16, 2}, {"f32", mscclppFloat32, 4}};

struct Spec
{
  Coll coll;
  DType dtype;
};

// Element counts of one call whose message has (at most) `bytes` bytes.
struct Shape
{
  uint64_t count = 0;     // the call's count argument
  uint64_t sendElems = 0; // what the input holds
  uint64_t recvElems = 0; // what the output holds
  uint64_t chunk = 0;     // all-gather's sendcount, reduce-scatter's recvcount
  uint64_t bytes = 0;     // the message as counted for algBW (a multiple of nranks * element size)
};

Shape shapeOf(const Spec& s, uint64_t bytes, int nranks)
{
  Shape sh;
  const uint64_t e = kDTypes[s.dtype].bytes;
  switch (s.coll) {
  case kAllReduce:
  case kBroadcast:
    sh.count = sh.sendElems = sh.recvElems = bytes / e;
    sh.bytes = sh.count * e;
    break;
  case kAllGather:
    sh.count = sh.chunk = bytes / (e * nranks);
    sh.sendElems = sh.chunk;
    sh.recvElems = sh.chunk * nranks;
    sh.bytes = sh.recvElems * e;
    break;
  case kReduceScatter:
    sh.count = sh.chunk = bytes / (e * nranks);
    sh.sendElems = sh.chunk * nranks;
    sh.recvElems = sh.chunk;
    sh.bytes = sh.sendElems * e;
    break;
  }
  return sh;
}

// ---- data: rank r's input element i is a small integer from 1 to 13, exact in f16, bf16 and f32, and so
// are sums of up to 16 of them (at most 208 < 256, bf16's last exact integer); the pattern shifts with the
// rank and with a salt per size, so that another rank's data, misplaced data or a previous size's stale
// output does not pass. Sum only: the reduction order cannot change an exact result. ----

__host__ __device__ inline float inputValue(int rank, uint64_t i, uint32_t salt)
{
  return (float)((i * 7 + (uint64_t)rank * 5 + salt) % 13 + 1);
}

__host__ __device__ inline float expectedValue(int coll, int rank, int nranks, uint64_t chunk, uint32_t salt, uint64_t j)
{
  float v = 0;
  switch (coll) {
  case kAllReduce:
    for (int r = 0; r < nranks; ++r) v += inputValue(r, j, salt);
    return v;
  case kAllGather:
    return inputValue((int)(j / chunk), j % chunk, salt);
  case kReduceScatter:
    for (int r = 0; r < nranks; ++r) v += inputValue(r, (uint64_t)rank * chunk + j, salt);
    return v;
  default: // broadcast from rank 0
    return inputValue(0, j, salt);
  }
}

template <typename T>
__device__ inline T fromFloat(float v);
template <>
__device__ inline __half fromFloat<__half>(float v)
{
  return __float2half(v);
}
template <>
__device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v)
{
  return __float2bfloat16(v);
}
template <>
__device__ inline float fromFloat<float>(float v)
{
  return v;
}

template <typename T>
__device__ inline float toFloat(T v);
template <>
__device__ inline float toFloat<__half>(__half v)
{
  return __half2float(v);
}
template <>
__device__ inline float toFloat<__nv_bfloat16>(__nv_bfloat16 v)
{
  return __bfloat162float(v);
}
template <>
__device__ inline float toFloat<float>(float v)
{
  return v;
}

template <typename T>
__global__ void fillInput(T* p, uint64_t n, int rank, uint32_t salt)
{
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = fromFloat<T>(inputValue(rank, i, salt));
}

// res[0] += wrong elements; res[1] = min(index of a wrong element).
template <typename T>
__global__ void verifyOutput(const T* p, uint64_t n, int coll, int rank, int nranks, uint64_t chunk, uint32_t salt,
                             unsigned long long* res)
{
  unsigned long long bad = 0, first = ~0ull;
  for (uint64_t j = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (uint64_t)gridDim.x * blockDim.x) {
    if (toFloat<T>(p[j]) != expectedValue(coll, rank, nranks, chunk, salt, j)) {
      ++bad;
      if (j < first) first = j;
    }
  }
  if (bad) {
    atomicAdd(&res[0], bad);
    atomicMin(&res[1], first);
  }
}

// ---- configuration ----

struct Config
{
  std::vector<Spec> specs;
  std::vector<uint64_t> sizes;
  bool graph = true, eager = true;
  int repeats = 3;
  long iters = 0; // calls per repeat; 0: from --repeat-ms
  double repeatMs = 10;
  double timeoutS = 0; // 0: from the number of cases
  bool viaMscclpp = true, viaNccl = false;
  std::string ncclLib;  // empty: beside this program
  bool registered = false; // --register: both buffers registered with mscclppCommRegister (zero-copy)
  bool roofline = false;   // --roofline: also time a device-to-device copy of what each call must move
};
Config gCfg;

constexpr uint64_t kDefaultMin = 1ull << 10, kDefaultMax = 1ull << 30;

// Powers of 4 from 1 KiB: 1, 4, 16, 64, 256 KiB, 1, 4, 16, 64, 256 MiB, 1 GiB (the 1, 16 and 256 MiB of
// the issue's targets among them, and 256 KiB where the library switches from packets to copies).
std::vector<uint64_t> defaultSizes(uint64_t lo, uint64_t hi)
{
  std::vector<uint64_t> v;
  for (uint64_t b = kDefaultMin; b <= kDefaultMax; b *= 4)
    if (b >= lo && b <= hi) v.push_back(b);
  return v;
}

// Graph mode captures this many calls: more for small messages, so that the replay's own launch is
// spread over enough calls to vanish.
int callsPerGraph(uint64_t bytes) { return bytes <= (1ull << 20) ? 100 : 10; }

// Calls per timed repeat (the same on every rank: the ranks must make the same calls). The estimate (5 us
// plus 250 GB/s) only sizes the loop; a repeat lasts about repeatMs, and has at least 10 calls.
long callsPerRepeat(uint64_t bytes)
{
  if (gCfg.iters > 0) return gCfg.iters;
  const double estUs = 5.0 + (double)bytes / 250e3;
  return std::max(10L, std::min(20000L, (long)std::ceil(gCfg.repeatMs * 1000.0 / estUs)));
}

[[noreturn]] void usage(const char* prog, const char* why)
{
  fprintf(stderr,
          "%s\nusage: %s [nranks] [--port P] [--colls LIST] [--sizes LIST] [--min-bytes N] [--max-bytes N]\n"
          "       [--modes graph,eager] [--repeats N] [--iters N] [--repeat-ms T] [--quick] [--timeout S]\n"
          "       [--api mscclpp|nccl|both] [--nccl-lib PATH] [--register] [--roofline]\n"
          "collectives: allreduce_f16 allreduce_f32 allreduce_bf16 allgather[_TYPE] reducescatter[_TYPE]\n"
          "             broadcast[_TYPE] (TYPE f16, bf16 or f32; f32 when left out; allreduce = f16 and f32)\n"
          "sizes: bytes, or with K, M, G (KiB, MiB, GiB)\n",
          why, prog);
  exit(2);
}

bool parseBytes(const char* s, uint64_t* out)
{
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  uint64_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ull << 10;
  if (*end == 'M' || *end == 'm') mult = 1ull << 20;
  if (*end == 'G' || *end == 'g') mult = 1ull << 30;
  if (mult != 1) ++end;
  if (*end == 'B' || *end == 'b') ++end; // "1KB", "1MiB" read as binary units too
  if (*end == 'i') ++end;
  if (*end == 'B') ++end;
  if (*end != '\0' || v == 0) return false;
  *out = (uint64_t)v * mult;
  return true;
}

std::vector<std::string> splitList(const std::string& s)
{
  std::vector<std::string> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) v.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return v;
}

bool addSpecs(const std::string& name, std::vector<Spec>* out)
{
  if (name == "allreduce") {
    out->push_back({kAllReduce, kF16});
    out->push_back({kAllReduce, kF32});
    return true;
  }
  for (int c = 0; c < 4; ++c) {
    const std::string base = kCollNames[c];
    if (name == base) {
      out->push_back({(Coll)c, kF32});
      return true;
    }
    for (int d = 0; d < 3; ++d) {
      if (name == base + "_" + kDTypes[d].name) {
        out->push_back({(Coll)c, (DType)d});
        return true;
      }
    }
  }
  return false;
}

Options parseOptions(int argc, char** argv)
{
  Options o;
  uint64_t lo = kDefaultMin, hi = kDefaultMax;
  bool quick = false;
  std::string colls = "allreduce_f16,allreduce_f32,allgather_f32,reducescatter_f32,broadcast_f32";
  std::string sizes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool hasValue = i + 1 < argc;
    if (a == "--port" && hasValue) {
      o.port = atoi(argv[++i]);
    } else if (a == "--colls" && hasValue) {
      colls = argv[++i];
    } else if (a == "--sizes" && hasValue) {
      sizes = argv[++i];
    } else if (a == "--min-bytes" && hasValue) {
      if (!parseBytes(argv[++i], &lo)) usage(argv[0], "bad --min-bytes");
    } else if (a == "--max-bytes" && hasValue) {
      if (!parseBytes(argv[++i], &hi)) usage(argv[0], "bad --max-bytes");
    } else if (a == "--modes" && hasValue) {
      gCfg.graph = gCfg.eager = false;
      for (const std::string& m : splitList(argv[++i])) {
        if (m == "graph") gCfg.graph = true;
        else if (m == "eager") gCfg.eager = true;
        else usage(argv[0], "bad --modes (graph, eager)");
      }
    } else if (a == "--repeats" && hasValue) {
      gCfg.repeats = atoi(argv[++i]);
      if (gCfg.repeats < 1) usage(argv[0], "bad --repeats");
    } else if (a == "--iters" && hasValue) {
      gCfg.iters = atol(argv[++i]);
      if (gCfg.iters < 1) usage(argv[0], "bad --iters");
    } else if (a == "--repeat-ms" && hasValue) {
      gCfg.repeatMs = atof(argv[++i]);
      if (!(gCfg.repeatMs > 0)) usage(argv[0], "bad --repeat-ms");
    } else if (a == "--timeout" && hasValue) {
      gCfg.timeoutS = atof(argv[++i]);
    } else if (a == "--api" && hasValue) {
      const std::string api = argv[++i];
      gCfg.viaMscclpp = api == "mscclpp" || api == "both";
      gCfg.viaNccl = api == "nccl" || api == "both";
      if (!gCfg.viaMscclpp && !gCfg.viaNccl) usage(argv[0], "bad --api (mscclpp, nccl, both)");
    } else if (a == "--nccl-lib" && hasValue) {
      gCfg.ncclLib = argv[++i];
    } else if (a == "--register") {
      gCfg.registered = true;
    } else if (a == "--roofline") {
      gCfg.roofline = true;
    } else if (a == "--quick") {
      quick = true;
    } else if (a[0] != '-') {
      o.nranks = atoi(a.c_str());
    } else {
      usage(argv[0], ("unknown or incomplete argument " + a).c_str());
    }
  }
  if (o.nranks < 2 || o.nranks > kMaxRanks) usage(argv[0], "nranks must be in [2, 16]");
  for (const std::string& c : splitList(colls))
    if (!addSpecs(c, &gCfg.specs)) usage(argv[0], ("unknown collective " + c).c_str());
  if (!sizes.empty()) {
    for (const std::string& s : splitList(sizes)) {
      uint64_t b = 0;
      if (!parseBytes(s.c_str(), &b)) usage(argv[0], ("bad size " + s).c_str());
      gCfg.sizes.push_back(b);
    }
  } else if (quick) {
    // The issue's sizes, at least: 1 KiB and 64 KiB (the small-message target's ends), 1, 16, 256 MiB.
    for (uint64_t b : {1ull << 10, 64ull << 10, 1ull << 20, 16ull << 20, 256ull << 20})
      if (b >= lo && b <= hi) gCfg.sizes.push_back(b);
  } else {
    gCfg.sizes = defaultSizes(lo, hi);
  }
  if (quick) gCfg.repeatMs = std::min(gCfg.repeatMs, 5.0);
  if (gCfg.specs.empty() || gCfg.sizes.empty()) usage(argv[0], "nothing to measure");
  // One case per collective and size, plus init, set-up and teardown.
  const size_t apis = (gCfg.viaMscclpp ? 1 : 0) + (gCfg.viaNccl ? 1 : 0);
  if (apis * gCfg.specs.size() * gCfg.sizes.size() + 4 > (size_t)kMaxCases)
    usage(argv[0], "too many collectives x sizes");
  return o;
}

// ---- the measurement ----

char* gSend = nullptr;
char* gRecv = nullptr;
uint64_t gBufBytes = 0;
std::string gAlgo;

struct Row
{
  Spec spec;
  uint64_t bytes;
  bool nccl = false; // measured through nccl.h
  double graphUs = -1, eagerUs = -1;
  bool checked = false;
};
std::vector<Row> gRows;

// ---- the NCCL face, loaded at run time (this program links libmscclpp only) ----

struct NcclFace
{
  void* lib = nullptr;
  ncclComm_t comm = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) initRank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) errorString = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclAllGather) allGather = nullptr;
  decltype(&ncclReduceScatter) reduceScatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
};
NcclFace gNccl;
bool gUseNccl = false; // which face the calls below go through

template <typename F>
std::string ncclSym(F* fn, const char* name)
{
  *fn = reinterpret_cast<F>(dlsym(gNccl.lib, name));
  TC_EXPECT(*fn != nullptr, "%s is not in the NCCL library: %s", name, dlerror());
  return "";
}

std::string ncclLibPath()
{
  if (!gCfg.ncclLib.empty()) return gCfg.ncclLib;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "libnccl.so.2";
  self[n] = 0;
  std::string dir(self);
  dir.resize(dir.rfind('/'));
  return dir + "/../lib/nccl/libnccl.so.2";
}

// An NCCL communicator of the same ranks: rank 0's unique id reaches the others through the bootstrap.
std::string ncclSetup(Rank& R)
{
  const std::string path = ncclLibPath();
  gNccl.lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TC_EXPECT(gNccl.lib != nullptr, "cannot load the NCCL face %s: %s", path.c_str(), dlerror());
  TC_TRY(ncclSym(&gNccl.getUniqueId, "ncclGetUniqueId"));
  TC_TRY(ncclSym(&gNccl.initRank, "ncclCommInitRank"));
  TC_TRY(ncclSym(&gNccl.destroy, "ncclCommDestroy"));
  TC_TRY(ncclSym(&gNccl.errorString, "ncclGetErrorString"));
  TC_TRY(ncclSym(&gNccl.allReduce, "ncclAllReduce"));
  TC_TRY(ncclSym(&gNccl.allGather, "ncclAllGather"));
  TC_TRY(ncclSym(&gNccl.reduceScatter, "ncclReduceScatter"));
  TC_TRY(ncclSym(&gNccl.broadcast, "ncclBroadcast"));
  auto ids = std::make_shared<std::vector<ncclUniqueId>>(R.nranks);
  if (R.rank == 0) {
    const ncclResult_t r = gNccl.getUniqueId(&(*ids)[0]);
    TC_EXPECT(r == ncclSuccess, "ncclGetUniqueId returned %d", (int)r);
  }
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppBootstrapAllGather (the NCCL unique id)", R.hostTimeoutS, [comm, ids]() {
    return mscclppBootstrapAllGather(comm, ids->data(), (int)sizeof(ncclUniqueId));
  }));
  const ncclResult_t r = gNccl.initRank(&gNccl.comm, R.nranks, (*ids)[0], R.rank);
  TC_EXPECT(r == ncclSuccess, "ncclCommInitRank returned %d (%s)", (int)r, gNccl.errorString(r));
  return "";
}

ncclDataType_t ncclTypeOf(DType d) { return d == kF16 ? ncclFloat16 : d == kBF16 ? ncclBfloat16 : ncclFloat32; }

// The call through nccl.h, its result as the mscclppResult_t of the same meaning where there is one.
mscclppResult_t issueNccl(const Spec& s, const Shape& sh, cudaStream_t st)
{
  const ncclDataType_t t = ncclTypeOf(s.dtype);
  ncclResult_t r;
  switch (s.coll) {
  case kAllReduce:
    r = gNccl.allReduce(gSend, gRecv, sh.count, t, ncclSum, gNccl.comm, st);
    break;
  case kAllGather:
    r = gNccl.allGather(gSend, gRecv, sh.count, t, gNccl.comm, st);
    break;
  case kReduceScatter:
    r = gNccl.reduceScatter(gSend, gRecv, sh.count, t, ncclSum, gNccl.comm, st);
    break;
  default:
    r = gNccl.broadcast(gSend, gRecv, sh.count, t, 0, gNccl.comm, st);
    break;
  }
  switch (r) {
  case ncclSuccess:
    return mscclppSuccess;
  case ncclInvalidArgument:
    return mscclppInvalidArgument;
  case ncclInvalidUsage:
    return mscclppInvalidUsage;
  case ncclRemoteError:
    return mscclppRemoteError;
  default:
    return mscclppInternalError;
  }
}

mscclppResult_t issue(Rank& R, const Spec& s, const Shape& sh, cudaStream_t st)
{
  if (gUseNccl) return issueNccl(s, sh, st);
  const mscclppDataType_t t = kDTypes[s.dtype].type;
  switch (s.coll) {
  case kAllReduce:
    return mscclppAllReduce(gSend, gRecv, sh.count, t, mscclppSum, R.comm, st);
  case kAllGather:
    return mscclppAllGather(gSend, gRecv, sh.count, t, R.comm, st);
  case kReduceScatter:
    return mscclppReduceScatter(gSend, gRecv, sh.count, t, mscclppSum, R.comm, st);
  default:
    return mscclppBroadcast(gSend, gRecv, sh.count, t, 0, R.comm, st);
  }
}

#define BENCH_CALL(expr)                                                                                       \
  do {                                                                                                         \
    mscclppResult_t r_ = (expr);                                                                               \
    if (r_ != mscclppSuccess) {                                                                                \
      R.fatal = true;                                                                                          \
      return fmt("%s returned %d (%s)", kCollNames[s.coll], (int)r_, errStr(r_));                              \
    }                                                                                                          \
  } while (0)

template <typename T>
std::string fillTyped(Rank& R, const Shape& sh, uint32_t salt)
{
  fillInput<T><<<gridFor(sh.sendElems), 256, 0, R.stream>>>((T*)gSend, sh.sendElems, R.rank, salt);
  TC_CUDA(cudaGetLastError());
  return "";
}

template <typename T>
std::string verifyTyped(Rank& R, const Spec& s, const Shape& sh, uint32_t salt, const char* when)
{
  TC_CUDA(cudaMemsetAsync(R.dVerify, 0, sizeof(unsigned long long), R.stream));
  TC_CUDA(cudaMemsetAsync(R.dVerify + 1, 0xff, sizeof(unsigned long long), R.stream));
  verifyOutput<T><<<gridFor(sh.recvElems), 256, 0, R.stream>>>((const T*)gRecv, sh.recvElems, s.coll, R.rank, R.nranks,
                                                               sh.chunk, salt, R.dVerify);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "verify kernel"));
  unsigned long long res[2];
  TC_CUDA(cudaMemcpy(res, R.dVerify, sizeof(res), cudaMemcpyDeviceToHost));
  if (res[0] == 0) return "";
  T got;
  TC_CUDA(cudaMemcpy(&got, (const T*)gRecv + res[1], sizeof(T), cudaMemcpyDeviceToHost));
  float gotF = 0;
  if (sizeof(T) == 4) {
    memcpy(&gotF, &got, 4);
  } else {
    // Widened on the host: f16 and bf16 are only printed here.
    uint16_t bits;
    memcpy(&bits, &got, 2);
    uint32_t w = 0;
    if (s.dtype == kBF16) {
      w = (uint32_t)bits << 16;
      memcpy(&gotF, &w, 4);
    } else {
      __half_raw raw;
      raw.x = bits;
      gotF = __half2float(__half(raw));
    }
  }
  return fmt("%s: %llu of %llu elements wrong, first at %llu: got %g, want %g", when, res[0],
             (unsigned long long)sh.recvElems, res[1], gotF,
             expectedValue(s.coll, R.rank, R.nranks, sh.chunk, salt, res[1]));
}

std::string fillInputs(Rank& R, const Spec& s, const Shape& sh, uint32_t salt)
{
  switch (s.dtype) {
  case kF16:
    return fillTyped<__half>(R, sh, salt);
  case kBF16:
    return fillTyped<__nv_bfloat16>(R, sh, salt);
  default:
    return fillTyped<float>(R, sh, salt);
  }
}

std::string verify(Rank& R, const Spec& s, const Shape& sh, uint32_t salt, const char* when)
{
  switch (s.dtype) {
  case kF16:
    return verifyTyped<__half>(R, s, sh, salt, when);
  case kBF16:
    return verifyTyped<__nv_bfloat16>(R, s, sh, salt, when);
  default:
    return verifyTyped<float>(R, s, sh, salt, when);
  }
}

std::string timeGraph(Rank& R, const Spec& s, const Shape& sh, cudaEvent_t start, cudaEvent_t stop, double* usPerCall,
                      long* calls)
{
  const int perGraph = callsPerGraph(sh.bytes);
  const long replays = std::max(1L, (callsPerRepeat(sh.bytes) + perGraph - 1) / perGraph);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Thread-local: helper threads (the bounded barrier's) may make CUDA calls meanwhile.
  TC_CUDA(cudaStreamBeginCapture(R.stream, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < perGraph; ++k) {
    mscclppResult_t r = issue(R, s, sh, R.stream);
    if (r != mscclppSuccess) {
      cudaStreamEndCapture(R.stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      R.fatal = true;
      return fmt("%s during capture returned %d (%s)", kCollNames[s.coll], (int)r, errStr(r));
    }
  }
  TC_CUDA(cudaStreamEndCapture(R.stream, &graph));
  TC_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  TC_TRY(barrier(R, "before the graph's warm-up"));
  TC_CUDA(cudaGraphLaunch(exec, R.stream));
  TC_TRY(syncBounded(R, "graph warm-up"));
  std::vector<double> us;
  for (int rep = 0; rep < gCfg.repeats; ++rep) {
    TC_TRY(barrier(R, "before a timed graph repeat"));
    TC_CUDA(cudaEventRecord(start, R.stream));
    for (long l = 0; l < replays; ++l) TC_CUDA(cudaGraphLaunch(exec, R.stream));
    TC_CUDA(cudaEventRecord(stop, R.stream));
    TC_TRY(syncBounded(R, "timed graph replays", 2 * R.hostTimeoutS));
    float ms = 0;
    TC_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back((double)ms * 1000.0 / ((double)perGraph * replays));
  }
  TC_CUDA(cudaGraphExecDestroy(exec));
  TC_CUDA(cudaGraphDestroy(graph));
  *usPerCall = median(us);
  *calls = perGraph * replays;
  return "";
}

std::string timeEager(Rank& R, const Spec& s, const Shape& sh, cudaEvent_t start, cudaEvent_t stop, double* usPerCall,
                      long* calls)
{
  const long n = callsPerRepeat(sh.bytes);
  TC_TRY(barrier(R, "before the eager warm-up"));
  for (long k = 0; k < std::min(n, 20L); ++k) BENCH_CALL(issue(R, s, sh, R.stream));
  TC_TRY(syncBounded(R, "eager warm-up"));
  std::vector<double> us;
  for (int rep = 0; rep < gCfg.repeats; ++rep) {
    TC_TRY(barrier(R, "before a timed eager repeat"));
    TC_CUDA(cudaEventRecord(start, R.stream));
    for (long k = 0; k < n; ++k) BENCH_CALL(issue(R, s, sh, R.stream));
    TC_CUDA(cudaEventRecord(stop, R.stream));
    TC_TRY(syncBounded(R, "timed eager calls", 2 * R.hostTimeoutS));
    float ms = 0;
    TC_CUDA(cudaEventElapsedTime(&ms, start, stop));
    us.push_back((double)ms * 1000.0 / (double)n);
  }
  *usPerCall = median(us);
  *calls = n;
  return "";
}

void printResult(const Rank& R, const Spec& s, const Shape& sh, const char* mode, double us, long calls, bool checked)
{
  if (R.rank != 0) return;
  printf("RESULT lib=%s caller=c collective=%s dtype=%s bytes=%llu mode=%s us=%.3f algbw=%.3f calls=%ld "
         "repeats=%d ranks=%d gpus=%d algo=%s checked=%d\n",
         gUseNccl ? "ncclface" : "mscclpp", kCollNames[s.coll], kDTypes[s.dtype].name, (unsigned long long)sh.bytes, mode, us,
         (double)sh.bytes / us / 1000.0, calls, gCfg.repeats, R.nranks, R.nGpus, gAlgo.c_str(), checked ? 1 : 0);
  fflush(stdout);
}

// *all = whether every rank's `mine` is true. A rank whose check failed must not be the only one to skip
// the timed calls: its peers' calls would then meet the next size's.
std::string allRanks(Rank& R, bool mine, bool* all)
{
  // Shared with the helper thread, which may outlive this frame if the call times out.
  auto votes = std::make_shared<std::vector<int>>(R.nranks, 0);
  (*votes)[R.rank] = mine ? 1 : 0;
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppBootstrapAllGather (check verdicts)", R.hostTimeoutS,
                     [comm, votes]() { return mscclppBootstrapAllGather(comm, votes->data(), (int)sizeof(int)); }));
  *all = std::all_of(votes->begin(), votes->end(), [](int v) { return v == 1; });
  return "";
}

// The roofline of a call on ranks that share one GPU: rank 0 alone copies, device to device, as many bytes as
// the call must read and write at the least on all ranks together, as copies of at most the buffers' size,
// while the other ranks wait. Printed as mode=roofline. Of N message bytes among n ranks, out of place: an
// all-reduce or an all-gather n x N (every output written, about as much read), a broadcast n x N (every
// rank's output from the root's input), a reduce-scatter (n + 1) x N / 2 (every input read, N written).
std::string timeRoofline(Rank& R, const Spec& s, const Shape& sh, cudaEvent_t start, cudaEvent_t stop)
{
  const uint64_t n = (uint64_t)R.nranks;
  const uint64_t total = s.coll == kReduceScatter ? sh.bytes * (n + 1) / 2 : sh.bytes * n;
  TC_TRY(barrier(R, "before the roofline"));
  if (R.rank == 0) {
    std::vector<double> us;
    for (int rep = 0; rep < gCfg.repeats + 1; ++rep) {
      TC_CUDA(cudaEventRecord(start, R.stream));
      for (uint64_t done = 0; done < total;) {
        const uint64_t chunk = std::min(total - done, gBufBytes);
        TC_CUDA(cudaMemcpyAsync(gRecv, gSend, chunk, cudaMemcpyDeviceToDevice, R.stream));
        done += chunk;
      }
      TC_CUDA(cudaEventRecord(stop, R.stream));
      TC_TRY(syncBounded(R, "roofline copies"));
      float ms = 0;
      TC_CUDA(cudaEventElapsedTime(&ms, start, stop));
      if (rep > 0) us.push_back((double)ms * 1000.0);
    }
    printResult(R, s, sh, "roofline", median(us), 1, true);
  }
  return barrier(R, "after the roofline");
}

std::string benchOne(Rank& R, const Spec& s, uint64_t bytes, uint32_t salt, cudaEvent_t start, cudaEvent_t stop)
{
  const Shape sh = shapeOf(s, bytes, R.nranks);
  TC_EXPECT(sh.count > 0, "%llu bytes are too few for %d ranks", (unsigned long long)bytes, R.nranks);
  // The inputs stay as filled here for every call of this size: every call's output is the same, so the
  // output after the timed calls must still be exact.
  TC_TRY(fillInputs(R, s, sh, salt));
  TC_CUDA(cudaMemsetAsync(gRecv, 0, sh.recvElems * kDTypes[s.dtype].bytes, R.stream));
  TC_TRY(syncBounded(R, "fill"));
  TC_TRY(barrier(R, "before the checked call"));
  BENCH_CALL(issue(R, s, sh, R.stream));
  TC_TRY(syncBounded(R, "checked call"));
  const std::string first = verify(R, s, sh, salt, "after one call");
  if (R.fatal) return first;
  bool allOk = false;
  TC_TRY(allRanks(R, first.empty(), &allOk));
  TC_TRY(first);
  TC_EXPECT(allOk, "another rank's check failed: not timed");

  Row row{s, sh.bytes, gUseNccl};
  long graphCalls = 0, eagerCalls = 0;
  if (gCfg.graph) TC_TRY(timeGraph(R, s, sh, start, stop, &row.graphUs, &graphCalls));
  if (gCfg.eager) TC_TRY(timeEager(R, s, sh, start, stop, &row.eagerUs, &eagerCalls));
  const std::string after = verify(R, s, sh, salt, "after the timed calls");
  if (R.fatal) return after;
  row.checked = after.empty();
  if (gCfg.graph) printResult(R, s, sh, "graph", row.graphUs, graphCalls, row.checked);
  if (gCfg.eager) printResult(R, s, sh, "eager", row.eagerUs, eagerCalls, row.checked);
  gRows.push_back(row);
  TC_TRY(after);
  if (gCfg.roofline) TC_TRY(timeRoofline(R, s, sh, start, stop));
  R.info = fmt("(graph %.2f us, eager %.2f us per call)", row.graphUs, row.eagerUs);
  return "";
}

std::string setup(Rank& R)
{
  uint64_t most = 0;
  for (uint64_t b : gCfg.sizes) most = std::max(most, b);
  // Every collective's input and output fit in the message's bytes (see Shape).
  gBufBytes = most;
  TC_CUDA(cudaMalloc((void**)&gSend, gBufBytes));
  TC_CUDA(cudaMalloc((void**)&gRecv, gBufBytes));
  if (gCfg.registered) {
    void* handle = nullptr;
    TC_EXPECT(mscclppCommRegister(R.comm, gSend, gBufBytes, &handle) == mscclppSuccess, "registering the input failed");
    TC_EXPECT(mscclppCommRegister(R.comm, gRecv, gBufBytes, &handle) == mscclppSuccess, "registering the output failed");
  }
  const char* algo = getenv("MSCCLPP_COLL_ALGO");
  gAlgo = algo && *algo ? algo : "auto";
  if (gCfg.registered) gAlgo += "+registered";
  if (R.rank == 0) {
    cudaDeviceProp prop;
    TC_CUDA(cudaGetDeviceProperties(&prop, R.device));
    printf("INFO collectives_bench ranks=%d gpus=%d device=\"%s\" algo=%s repeats=%d repeat_ms=%.1f\n", R.nranks,
           R.nGpus, prop.name, gAlgo.c_str(), gCfg.repeats, gCfg.repeatMs);
    if (R.nranks > R.nGpus)
      printf("NOTE: %d ranks share %d GPU(s): the ranks are time-sliced on one GPU, so these timings are NOT "
             "comparable to figures with one GPU per rank (only the logic is checked)\n",
             R.nranks, R.nGpus);
    fflush(stdout);
  }
  return "";
}

void printTable(const Rank& R)
{
  if (R.rank != 0 || gRows.empty()) return;
  printf("\ncollectives_bench: %d ranks, %d GPUs, MSCCLPP_COLL_ALGO=%s, us per call and algBW in GB/s\n", R.nranks,
         R.nGpus, gAlgo.c_str());
  printf("%-14s %-5s %8s %-7s | %11s %9s | %11s %9s | %s\n", "collective", "type", "size", "api", "graph us", "GB/s",
         "eager us", "GB/s", "checked");
  for (const Row& r : gRows) {
    char g[2][32] = {"-", "-"}, e[2][32] = {"-", "-"};
    if (r.graphUs > 0) {
      snprintf(g[0], 32, "%.2f", r.graphUs);
      snprintf(g[1], 32, "%.2f", (double)r.bytes / r.graphUs / 1000.0);
    }
    if (r.eagerUs > 0) {
      snprintf(e[0], 32, "%.2f", r.eagerUs);
      snprintf(e[1], 32, "%.2f", (double)r.bytes / r.eagerUs / 1000.0);
    }
    printf("%-14s %-5s %8s %-7s | %11s %9s | %11s %9s | %s\n", kCollNames[r.spec.coll], kDTypes[r.spec.dtype].name,
           sizeName(r.bytes).c_str(), r.nccl ? "nccl.h" : "mscclpp", g[0], g[1], e[0], e[1],
           r.checked ? "yes" : "FAILED");
  }
  if (R.nranks > R.nGpus) printf("NOTE: ranks share GPUs: these timings are not comparable to one GPU per rank\n");
  printf("\n");
  fflush(stdout);
}

int rankMain(Rank& R)
{
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "collectives_setup", [&] { return setup(R); })) return 1;
  if (gCfg.viaNccl && !runCase(R, "nccl_face_setup", [&] { return ncclSetup(R); })) return 1;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    rankLog(R, "cudaEventCreate failed");
    return 1;
  }
  bool ok = true;
  uint32_t salt = 0;
  for (const Spec& s : gCfg.specs) {
    for (uint64_t bytes : gCfg.sizes) {
      ++salt;
      // Through each face in turn, on the same buffers: one after the other for each size.
      for (int face = 0; face < 2; ++face) {
        gUseNccl = face == 1;
        if (gUseNccl ? !gCfg.viaNccl : !gCfg.viaMscclpp) continue;
        const std::string name = fmt("%s_%s_%s%s", kCollNames[s.coll], kDTypes[s.dtype].name,
                                     sizeName(bytes).c_str(), gUseNccl ? "_nccl_h" : "");
        ok = runCase(R, name, [&] { return benchOne(R, s, bytes, salt, start, stop); }) && ok;
      }
    }
  }
  printTable(R);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ok = runCase(R, "teardown", [&] {
         if (gNccl.comm) {
           const ncclResult_t r = gNccl.destroy(gNccl.comm);
           TC_EXPECT(r == ncclSuccess, "ncclCommDestroy returned %d", (int)r);
         }
         TC_TRY(destroyComm(R, false));
         TC_CUDA(cudaFree(gSend));
         TC_CUDA(cudaFree(gRecv));
         return std::string();
       }) && ok;
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseOptions(argc, argv);
  // A backstop only: every wait inside has its own deadline (case_runner.h).
  const double timeoutS =
      gCfg.timeoutS > 0 ? gCfg.timeoutS : 120.0 + 15.0 * (double)(gCfg.specs.size() * gCfg.sizes.size());
  return runRanks("collectives_bench", opt, timeoutS, rankMain);
}
