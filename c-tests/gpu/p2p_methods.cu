// Every device method of mscclppDevConn over P2P connections, all-to-all between the ranks.
//
//   p2p_methods 2          two ranks (one per GPU on a 2-GPU machine)
//   p2p_methods 4          four ranks (two processes per GPU)
//   p2p_methods 2 --quick  set-up, two cases, teardown, cudaDeviceReset (for compute-sanitizer)
//
// Each rank connects to every peer three times (tags 0, 7, 42), each connection with its own buffer. A
// connection's buffer is split in two halves: the lower-ranked end of a pair sends from (and into) half 0,
// the other end half 1, so both ends can transfer at once. Before each case the sending half is filled with
// a pattern of (sender, receiver, case, tag) and the receiving half with a sentinel; afterwards the
// receiving half must hold exactly the transferred words and the sentinel everywhere else. After every case
// each connection's epoch counters must equal the number of signals and waits made so far.
// From c-tests/harness/ (the Makefile adds it to the include path): shared with the benchmarks.
#include "mscclpp_rank.h"

using namespace tc;

namespace {

const int kTags[] = {0, 7, 42};
enum TagIdx
{
  kTagMain = 0,   // big buffer, most cases
  kTagSmall = 1,  // second connection per pair
  kTagOffset = 2, // buffer that starts kGuard bytes into its allocation, guarded on both sides
  kNumTags = 3,
};
const uint64_t kHalfBytes[kNumTags] = {32ull << 20, 1ull << 20, 1ull << 20};
constexpr uint64_t kGuard = 4096;

enum OpKind : int
{
  kPut3 = 1,  // put(dst, src, size)
  kPut2,      // put(offset, size)
  kSignal,    // signal()
  kPws3,      // putWithSignal(dst, src, size)
  kPws2,      // putWithSignal(offset, size)
  kPwsf3,     // putWithSignalAndFlush(dst, src, size)
  kPwsf2,     // putWithSignalAndFlush(offset, size)
  kFlush,     // flush()
  kWait,      // wait(), bounded
  kOverwrite, // all threads of the block overwrite [src, src + size) of the sending half, last word first
};

// One step of a case. Offsets are relative to the sender's half (2-argument forms need dst == src).
struct Op
{
  int kind;
  uint32_t seed; // kOverwrite: pattern to write
  uint64_t dst, src, size;
};

// What one thread block works on: a connection and where its halves are.
struct Job
{
  int conn;
  int pad;
  uint64_t sendHalf; // byte offset of this rank's half in its buffer (= the peer's receiving half)
  uint64_t recvHalf; // byte offset of the half the peer writes into
  uint64_t arg;
};

bool isData(int k) { return k == kPut3 || k == kPut2 || k == kPws3 || k == kPws2 || k == kPwsf3 || k == kPwsf2; }
bool isSignal(int k) { return k == kSignal || k == kPws3 || k == kPws2 || k == kPwsf3 || k == kPwsf2; }

// ------------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------------

// Runs the op list; block b serves jobs[b]. Thread 0 calls the connection's methods.
__global__ void opsKernel(const Op* ops, int nOps, const Job* jobs, DevStatus* st, uint64_t timeoutNs)
{
  __shared__ int stop;
  const Job job = jobs[blockIdx.x];
  mscclppDevConn_t conn = gConns[job.conn];
  if (threadIdx.x == 0) stop = 0;
  __syncthreads();
  for (int i = 0; i < nOps; ++i) {
    const Op op = ops[i];
    if (op.kind == kOverwrite) {
      uint32_t* words = (uint32_t*)((char*)conn.localBuff + job.sendHalf + op.src);
      const uint64_t n = op.size / 4, idx0 = op.src / 4;
      // Last word first, so that a copy still reading the source (a flush() that returned too early)
      // meets new data as soon as possible.
      for (uint64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const uint64_t j = n - 1 - k;
        words[j] = patternWord(op.seed, idx0 + j);
      }
      __threadfence_system();
      __syncthreads();
      continue;
    }
    if (threadIdx.x == 0) {
      devProgress(st, i, 0);
      const uint64_t d = job.sendHalf + op.dst, s = job.sendHalf + op.src;
      switch (op.kind) {
        case kPut3: conn.put(d, s, op.size); break;
        case kPut2: conn.put(d, op.size); break;
        case kSignal: conn.signal(); break;
        case kPws3: conn.putWithSignal(d, s, op.size); break;
        case kPws2: conn.putWithSignal(d, op.size); break;
        case kPwsf3: conn.putWithSignalAndFlush(d, s, op.size); break;
        case kPwsf2: conn.putWithSignalAndFlush(d, op.size); break;
        case kFlush: conn.flush(); break;
        case kWait:
          if (!boundedWait(conn, st, timeoutNs, i, 0)) stop = 1;
          break;
        default:
          devFail(st, kFailBadOp, i, 0, 0, (uint64_t)op.kind);
          stop = 1;
      }
      devProgress(st, i + 1, 0);
    }
    __syncthreads();
    // Read by all before thread 0 can touch it again in the next step.
    const int stopNow = stop;
    __syncthreads();
    if (stopNow) return;
  }
}

// Ping-pong between the two ends of each connection: the lower rank sends first. With data, every
// message is a 4-byte word in a slot (iteration % 1024) checked by the receiver right after wait().
__global__ void pingpongKernel(const Job* jobs, int iters, int withData, uint32_t salt, int rank, DevStatus* st,
                               uint64_t timeoutNs)
{
  if (threadIdx.x != 0) return;
  const Job job = jobs[blockIdx.x];
  mscclppDevConn_t conn = gConns[job.conn];
  const int peer = conn.remoteRank;
  const bool first = rank < peer;
  const uint32_t mySeed = makeSeed(kRolePing, rank, peer, salt);
  const uint32_t peerSeed = makeSeed(kRolePing, peer, rank, salt);
  volatile uint32_t* out = (volatile uint32_t*)((char*)conn.localBuff + job.sendHalf);
  volatile uint32_t* in = (volatile uint32_t*)((char*)conn.localBuff + job.recvHalf);
  for (int it = 0; it < iters; ++it) {
    if ((it & 63) == 0) devProgress(st, 0, (uint64_t)it);
    const uint64_t slot = (uint64_t)(it % 1024);
    for (int half = 0; half < 2; ++half) {
      const bool sending = (half == 0) == first;
      if (sending) {
        if (withData) {
          out[slot] = patternWord(mySeed, (uint64_t)it);
          __threadfence_system(); // the copy engine must read the new word
          conn.putWithSignal(job.sendHalf + slot * 4, 4);
        } else {
          conn.signal();
        }
      } else {
        if (!boundedWait(conn, st, timeoutNs, 1, (uint64_t)it)) return;
        if (withData) {
          __threadfence();
          const uint32_t got = in[slot];
          const uint32_t want = patternWord(peerSeed, (uint64_t)it);
          if (got != want) {
            devFail(st, kFailDataMismatch, 2, (uint64_t)it, want, got);
            return;
          }
        }
      }
    }
  }
}

// Both sides putWithSignal region i % kRegions of their half at once, then wait, and check that the
// peer's region has landed (its first, middle and last word) before zeroing those words for the region's
// next round. A flag that counted signals whose data is still queued (the legacy copy of the `device`
// epoch, when the copy engine falls behind) lets wait() return early, and a check fails.
constexpr int kRegions = 16;
constexpr uint64_t kRegionBytes = 1 << 20;
__global__ void bidirCheckedKernel(const Job* jobs, int iters, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0) return;
  const Job job = jobs[blockIdx.x];
  mscclppDevConn_t conn = gConns[job.conn];
  const uint32_t peerSeed = (uint32_t)job.arg;
  volatile uint32_t* in = (volatile uint32_t*)((char*)conn.localBuff + job.recvHalf);
  for (int it = 0; it < iters; ++it) {
    if ((it & 63) == 0) devProgress(st, 0, (uint64_t)it);
    const uint64_t region = (uint64_t)(it % kRegions) * kRegionBytes;
    conn.putWithSignal(job.sendHalf + region, kRegionBytes);
    if (!boundedWait(conn, st, timeoutNs, 1, (uint64_t)it)) return;
    const uint64_t first = region / 4, words[3] = {first, first + kRegionBytes / 8, first + kRegionBytes / 4 - 1};
    for (uint64_t w : words) {
      const uint32_t got = in[w], want = patternWord(peerSeed, w);
      if (got != want) {
        devFail(st, kFailDataMismatch, 3, (uint64_t)it, want, got);
        return;
      }
    }
    for (uint64_t w : words) in[w] = 0;
    __threadfence_system(); // zeroed before the peer's next copy into the region, which our flag precedes
  }
}

// Many threads (blocksPerConn blocks per connection) each putWithSignal their own slice at once.
__global__ void burstKernel(const Job* jobs, int blocksPerConn, uint64_t slice)
{
  const Job job = jobs[blockIdx.x / blocksPerConn];
  mscclppDevConn_t conn = gConns[job.conn];
  const uint64_t t = (uint64_t)(blockIdx.x % blocksPerConn) * blockDim.x + threadIdx.x;
  conn.putWithSignal(job.sendHalf + t * slice, slice);
}

// After burstKernel: epochIncrement() is a plain read-modify-write, so concurrent signallers lose counts.
// Set the counter to the number the peer will wait for (job.arg), signal once more so that the last flag
// carries it, flush, then wait for the peer's as many times.
__global__ void burstFinishKernel(const Job* jobs, uint64_t waits, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0) return;
  const Job job = jobs[blockIdx.x];
  mscclppDevConn_t conn = gConns[job.conn];
  *(volatile uint64_t*)&conn.localSignalEpochId->device = job.arg;
  conn.signal();
  conn.flush();
  for (uint64_t w = 0; w < waits; ++w) {
    if (!boundedWait(conn, st, timeoutNs, 1, w)) return;
  }
}

// Sustained load far beyond the FIFO's 128 slots: nPuts puts of `stride` bytes to distinct places, every
// signalEvery-th one with a signal, then a final signal and flush, then the matching waits.
__global__ void streamKernel(const Job* jobs, uint64_t nPuts, uint64_t stride, int signalEvery, uint64_t waits,
                             DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0) return;
  const Job job = jobs[blockIdx.x];
  mscclppDevConn_t conn = gConns[job.conn];
  for (uint64_t i = 0; i < nPuts; ++i) {
    if ((i & 4095) == 0) devProgress(st, 0, i);
    const uint64_t off = job.sendHalf + i * stride;
    if (i % signalEvery == (uint64_t)signalEvery - 1) {
      conn.putWithSignal(off, stride);
    } else {
      conn.put(off, stride);
    }
  }
  devProgress(st, 1, nPuts);
  conn.signal();
  conn.flush();
  devProgress(st, 2, 0);
  for (uint64_t w = 0; w < waits; ++w) {
    if (!boundedWait(conn, st, timeoutNs, 3, w)) return;
  }
}

// Plain stores through remoteBuff into the peer's receiving half (no proxy involved).
__global__ void directKernel(const Job* jobs, uint64_t words, const uint32_t* seeds, DevStatus* st)
{
  const Job job = jobs[blockIdx.x];
  mscclppDevConn_t conn = gConns[job.conn];
  if (conn.remoteBuff == nullptr) {
    if (threadIdx.x == 0) devFail(st, kFailNullPointer, 0, 0, 0, 0);
    return;
  }
  uint32_t* dst = (uint32_t*)((char*)conn.remoteBuff + job.sendHalf);
  const uint32_t seed = seeds[blockIdx.x];
  for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) dst[i] = patternWord(seed, i);
}

// ------------------------------------------------------------------------------------------------
// Host state
// ------------------------------------------------------------------------------------------------

struct Conn
{
  int peer = -1;
  int tagIdx = 0;
  int index = -1;          // position in mscclppConnect order = connId
  char* alloc = nullptr;   // cudaMalloc'd block
  char* buf = nullptr;     // buffer given to mscclppConnect
  uint64_t half = 0;       // bytes per half; the buffer has two
  uint64_t sendHalf = 0;   // byte offset of this rank's half
  uint64_t recvHalf = 0;   // byte offset of the peer's half
  uint64_t sent = 0;       // signals made here so far (expected localSignalEpochId->device)
  uint64_t waited = 0;     // waits made here so far (expected *waitEpochId, and ->proxy)
  mscclppDevConn_t dev;    // as returned by the library
};

struct State
{
  std::vector<Conn> conns;
  int nPeers = 0;
  uint32_t salt = 0; // changes for every case, the same on all ranks
  Op* dOps = nullptr;
  Job* dJobs = nullptr;
  uint32_t* dSeeds = nullptr;
  bool quick = false;
};
State g;

constexpr int kMaxOps = 64;
constexpr int kMaxJobs = 256;

uint32_t tagSalt(uint32_t salt, int tagIdx) { return salt * 16u + (uint32_t)tagIdx; }
uint32_t srcSeed(int from, int to, uint32_t salt, int tagIdx) { return makeSeed(kRoleSrc, from, to, tagSalt(salt, tagIdx)); }
uint32_t sentinelSeed(int me, int peer, uint32_t salt, int tagIdx) { return makeSeed(kRoleSentinel, me, peer, tagSalt(salt, tagIdx)); }

std::string connName(const Conn& c) { return fmt("peer %d tag %d", c.peer, kTags[c.tagIdx]); }

std::vector<Conn*> connsOf(std::initializer_list<int> tags)
{
  std::vector<Conn*> v;
  for (Conn& c : g.conns) {
    for (int t : tags) {
      if (c.tagIdx == t) v.push_back(&c);
    }
  }
  return v;
}

// Each connection made n more signals and waited for as many (what checkEpochs() then expects).
void countSignals(const std::vector<Conn*>& cs, uint64_t n)
{
  for (Conn* c : cs) {
    c->sent += n;
    c->waited += n;
  }
}

// Sending half <- source pattern, receiving half <- sentinel.
std::string fillConn(Rank& R, Conn& c)
{
  TC_TRY(fillWords(R, c.buf, c.sendHalf, c.half, srcSeed(R.rank, c.peer, g.salt, c.tagIdx), 0));
  TC_TRY(fillWords(R, c.buf, c.recvHalf, c.half, sentinelSeed(R.rank, c.peer, g.salt, c.tagIdx), 0));
  return "";
}

std::string fillAll(Rank& R, const std::vector<Conn*>& cs)
{
  for (Conn* c : cs) TC_TRY(fillConn(R, *c));
  TC_TRY(syncBounded(R, "fill"));
  return "";
}

std::string verifyGuards(Rank& R, Conn& c)
{
  if (c.tagIdx != kTagOffset) return "";
  TC_TRY(verifyWords(R, c.alloc, 0, kGuard, makeSeed(kRoleGuard, R.rank, c.peer, 0), 0,
                     fmt("%s: guard before the buffer", connName(c).c_str())));
  TC_TRY(verifyWords(R, c.buf, 2 * c.half, kGuard, makeSeed(kRoleGuard, R.rank, c.peer, 1), 0,
                     fmt("%s: guard after the buffer", connName(c).c_str())));
  return "";
}

struct Seg
{
  uint64_t dst, src, size;
};

// Receiving half: the segments carry the peer's source words, everything else the sentinel.
std::string verifyRecv(Rank& R, Conn& c, std::vector<Seg> segs)
{
  std::sort(segs.begin(), segs.end(), [](const Seg& a, const Seg& b) { return a.dst < b.dst; });
  const uint32_t from = srcSeed(c.peer, R.rank, g.salt, c.tagIdx);
  const uint32_t sent = sentinelSeed(R.rank, c.peer, g.salt, c.tagIdx);
  uint64_t pos = 0;
  for (const Seg& s : segs) {
    TC_EXPECT(s.dst >= pos && s.dst + s.size <= c.half, "internal: overlapping or oversized segment in the test");
    TC_TRY(verifyWords(R, c.buf, c.recvHalf + pos, s.dst - pos, sent, pos / 4,
                       fmt("%s: untouched bytes [%llu, %llu) of the receiving half", connName(c).c_str(),
                           (unsigned long long)pos, (unsigned long long)s.dst)));
    TC_TRY(verifyWords(R, c.buf, c.recvHalf + s.dst, s.size, from, s.src / 4,
                       fmt("%s: received bytes [%llu, %llu) (from source offset %llu)", connName(c).c_str(),
                           (unsigned long long)s.dst, (unsigned long long)(s.dst + s.size), (unsigned long long)s.src)));
    pos = s.dst + s.size;
  }
  TC_TRY(verifyWords(R, c.buf, c.recvHalf + pos, c.half - pos, sent, pos / 4,
                     fmt("%s: untouched bytes [%llu, %llu) of the receiving half", connName(c).c_str(),
                         (unsigned long long)pos, (unsigned long long)c.half)));
  TC_TRY(verifyGuards(R, c));
  return "";
}

// The sending half must still hold this rank's source words (the peer never writes there).
std::string verifySendUnchanged(Rank& R, Conn& c)
{
  return verifyWords(R, c.buf, c.sendHalf, c.half, srcSeed(R.rank, c.peer, g.salt, c.tagIdx), 0,
                     fmt("%s: sending half", connName(c).c_str()));
}

// Every connection's counters must match the signals and waits made so far (cases are balanced, so the
// peer's signals to this rank equal this rank's waits).
std::string checkEpochs(Rank& R)
{
  for (Conn& c : g.conns) {
    uint64_t device = 0, proxy = 0, wait = 0;
    TC_TRY(readEpochs(R, c.dev, &device, &proxy, &wait));
    TC_EXPECT(device == c.sent && wait == c.waited && proxy == c.waited,
              "%s: epochs device %llu proxy %llu wait %llu, expected %llu %llu %llu", connName(c).c_str(),
              (unsigned long long)device, (unsigned long long)proxy, (unsigned long long)wait,
              (unsigned long long)c.sent, (unsigned long long)c.waited, (unsigned long long)c.waited);
  }
  return "";
}

std::string uploadJobs(Rank& R, const std::vector<Job>& jobs)
{
  TC_EXPECT(!jobs.empty() && jobs.size() <= (size_t)kMaxJobs, "internal: %zu jobs", jobs.size());
  TC_CUDA(cudaMemcpyAsync(g.dJobs, jobs.data(), jobs.size() * sizeof(Job), cudaMemcpyHostToDevice, R.stream));
  return "";
}

std::vector<Job> jobsFor(const std::vector<Conn*>& cs)
{
  std::vector<Job> jobs;
  for (Conn* c : cs) jobs.push_back(Job{c->index, 0, c->sendHalf, c->recvHalf, 0});
  return jobs;
}

// One op-list case on the given tags: fill, barrier, run, barrier, verify, check epochs.
// `overwriteSeed` != 0: the ops overwrite the whole sending half with that pattern (checked instead).
std::string runOps(Rank& R, std::initializer_list<int> tags, const std::vector<Op>& ops, int threads = 64,
                   uint32_t overwriteSeed = 0)
{
  ++g.salt;
  std::vector<Conn*> cs = connsOf(tags);
  TC_EXPECT(!cs.empty(), "internal: no connections");
  TC_EXPECT(ops.size() <= (size_t)kMaxOps, "internal: too many ops");
  std::vector<Seg> segs;
  for (const Op& op : ops) {
    if (isData(op.kind)) segs.push_back(Seg{op.dst, op.src, op.size});
    if (op.kind == kPut2 || op.kind == kPws2 || op.kind == kPwsf2) TC_EXPECT(op.dst == op.src, "internal: 2-arg op with dst != src");
    for (Conn* c : cs) TC_EXPECT(op.dst + op.size <= c->half && op.src + op.size <= c->half, "internal: op beyond a half");
  }
  TC_TRY(fillAll(R, cs));
  TC_CUDA(cudaMemcpyAsync(g.dOps, ops.data(), ops.size() * sizeof(Op), cudaMemcpyHostToDevice, R.stream));
  TC_TRY(uploadJobs(R, jobsFor(cs)));
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  opsKernel<<<(unsigned)cs.size(), threads, 0, R.stream>>>(g.dOps, (int)ops.size(), g.dJobs, R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "ops kernel"));
  for (Conn* c : cs) {
    for (const Op& op : ops) {
      if (isSignal(op.kind)) ++c->sent;
      if (op.kind == kWait) ++c->waited;
    }
  }
  TC_TRY(barrier(R, "after kernel"));
  for (Conn* c : cs) {
    TC_TRY(verifyRecv(R, *c, segs));
    if (overwriteSeed) {
      TC_TRY(verifyWords(R, c->buf, c->sendHalf, c->half, overwriteSeed, 0,
                         fmt("%s: sending half after the overwrite", connName(*c).c_str())));
    } else {
      TC_TRY(verifySendUnchanged(R, *c));
    }
  }
  TC_TRY(checkEpochs(R));
  uint64_t bytes = 0;
  for (const Seg& s : segs) bytes += s.size;
  R.info = fmt("(%zu connections, %llu bytes each way per connection)", cs.size(), (unsigned long long)bytes);
  return "";
}

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------

std::string caseSetup(Rank& R)
{
  g.nPeers = R.nranks - 1;
  // Tag-major order, so that connIds interleave peers; the index of each connection is its connId.
  for (int t = 0; t < kNumTags; ++t) {
    for (int peer = 0; peer < R.nranks; ++peer) {
      if (peer == R.rank) continue;
      Conn c;
      c.peer = peer;
      c.tagIdx = t;
      c.index = (int)g.conns.size();
      c.half = kHalfBytes[t];
      c.sendHalf = R.rank < peer ? 0 : c.half;
      c.recvHalf = R.rank < peer ? c.half : 0;
      const uint64_t bytes = 2 * c.half;
      if (t == kTagOffset) {
        TC_CUDA(cudaMalloc((void**)&c.alloc, bytes + 2 * kGuard));
        c.buf = c.alloc + kGuard;
      } else {
        TC_CUDA(cudaMalloc((void**)&c.alloc, bytes));
        c.buf = c.alloc;
      }
      g.conns.push_back(c);
    }
  }
  TC_EXPECT((int)g.conns.size() <= kMaxConns, "internal: too many connections");
  // Guards first: the peer may write into the buffers as soon as the proxies run.
  for (Conn& c : g.conns) {
    if (c.tagIdx != kTagOffset) continue;
    TC_TRY(fillWords(R, c.alloc, 0, kGuard, makeSeed(kRoleGuard, R.rank, c.peer, 0), 0));
    TC_TRY(fillWords(R, c.buf, 2 * c.half, kGuard, makeSeed(kRoleGuard, R.rank, c.peer, 1), 0));
  }
  TC_TRY(syncBounded(R, "guard fill"));
  for (Conn& c : g.conns) {
    mscclppResult_t r = mscclppConnect(R.comm, c.peer, kTags[c.tagIdx], c.buf, 2 * c.half, mscclppTransportP2P);
    if (r != mscclppSuccess) {
      R.fatal = true;
      return fmt("mscclppConnect(%s, %llu bytes) returned %d (%s)", connName(c).c_str(), (unsigned long long)(2 * c.half),
                 (int)r, errStr(r));
    }
  }
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppConnectionSetup", R.hostTimeoutS, [comm]() { return mscclppConnectionSetup(comm); }));

  mscclppDevConn_t* all = nullptr;
  int n = -1;
  TC_MSCCLPP(mscclppGetAllDeviceConnections(R.comm, &all, &n));
  if (n != (int)g.conns.size() || all == nullptr) {
    R.fatal = true;
    return fmt("mscclppGetAllDeviceConnections gave %d connections (array %p), expected %zu", n, (void*)all, g.conns.size());
  }
  std::vector<mscclppDevConn_t> host(n);
  for (int i = 0; i < n; ++i) {
    host[i] = all[i];
    g.conns[i].dev = all[i];
  }
  TC_TRY(loadConns(R, host.data(), n));
  TC_CUDA(cudaMalloc((void**)&g.dOps, kMaxOps * sizeof(Op)));
  TC_CUDA(cudaMalloc((void**)&g.dJobs, kMaxJobs * sizeof(Job)));
  TC_CUDA(cudaMalloc((void**)&g.dSeeds, kMaxJobs * sizeof(uint32_t)));
  TC_MSCCLPP(mscclppProxyLaunch(comm));
  R.info = fmt("(%d connections)", n);
  return "";
}

// The array from mscclppGetAllDeviceConnections is in connect order and every entry describes its
// connection; mscclppGetDeviceConnection finds the same entry by (remoteRank, tag).
std::string caseDevConnFields(Rank& R)
{
  for (Conn& c : g.conns) {
    const mscclppDevConn_t& d = c.dev;
    std::string name = fmt("connection %d (%s)", c.index, connName(c).c_str());
    if (d.localSignalEpochId == nullptr || d.waitEpochId == nullptr || d.fifo.triggerFifo == nullptr ||
        d.fifo.triggerFifoTail == nullptr || d.fifo.triggerFifoHead == nullptr) {
      R.fatal = true; // kernels would fault
      return fmt("%s: NULL pointer: localSignalEpochId %p waitEpochId %p triggerFifo %p tail %p head %p", name.c_str(),
                 (void*)d.localSignalEpochId, (void*)d.waitEpochId, (void*)d.fifo.triggerFifo,
                 (void*)d.fifo.triggerFifoTail, (void*)d.fifo.triggerFifoHead);
    }
    TC_EXPECT(d.remoteRank == c.peer && d.tag == kTags[c.tagIdx], "%s: entry says remoteRank %d tag %d", name.c_str(),
              d.remoteRank, d.tag);
    TC_EXPECT(d.localBuff == (void*)c.buf, "%s: localBuff %p, connected buffer %p", name.c_str(), d.localBuff, (void*)c.buf);
    TC_EXPECT(d.fifo.connId == c.index, "%s: fifo.connId %d, expected its connect index %d", name.c_str(), d.fifo.connId, c.index);
    TC_EXPECT(d.remoteBuff != nullptr, "%s: remoteBuff is NULL for a P2P connection", name.c_str());
    TC_EXPECT(d.remoteSignalEpochId != nullptr, "%s: remoteSignalEpochId is NULL for a P2P connection", name.c_str());

    mscclppDevConn_t* one = nullptr;
    mscclppResult_t r = mscclppGetDeviceConnection(R.comm, c.peer, kTags[c.tagIdx], &one);
    TC_EXPECT(r == mscclppSuccess && one != nullptr, "mscclppGetDeviceConnection(%s) returned %d, pointer %p",
              connName(c).c_str(), (int)r, (void*)one);
    TC_EXPECT(one->remoteRank == c.peer && one->tag == kTags[c.tagIdx] && one->localBuff == (void*)c.buf &&
                one->fifo.connId == c.index && one->localSignalEpochId == d.localSignalEpochId &&
                one->waitEpochId == d.waitEpochId && one->remoteBuff == d.remoteBuff,
              "mscclppGetDeviceConnection(%s) returned a different connection (remoteRank %d tag %d connId %d localBuff %p)",
              connName(c).c_str(), one->remoteRank, one->tag, one->fifo.connId, one->localBuff);
  }
  TC_TRY(checkEpochs(R)); // all zero before any use
  R.info = fmt("(%zu connections checked)", g.conns.size());
  return "";
}

const uint64_t H = kHalfBytes[kTagMain];
constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

Op op(int kind, uint64_t dst = 0, uint64_t src = 0, uint64_t size = 0, uint32_t seed = 0)
{
  return Op{kind, seed, dst, src, size};
}

std::string casePut3(Rank& R)
{
  return runOps(R, {kTagMain},
                {op(kPut3, 4096, 0, 1 * MiB), op(kPut3, 2 * MiB, 8 * MiB + 12, 256 * KiB + 4), op(kPut3, H - 4, 100, 4),
                 op(kSignal), op(kFlush), op(kWait)});
}

std::string casePut2(Rank& R)
{
  return runOps(R, {kTagMain},
                {op(kPut2, 0, 0, 64 * KiB), op(kPut2, 1 * MiB + 8, 1 * MiB + 8, 3 * MiB), op(kPut2, H - 8, H - 8, 8),
                 op(kSignal), op(kWait), op(kFlush)});
}

std::string casePws3(Rank& R)
{
  return runOps(R, {kTagMain},
                {op(kPws3, 256, 8192, 512 * KiB), op(kPws3, 4 * MiB, 12 * MiB, 4 * MiB), op(kWait), op(kWait), op(kFlush)});
}

std::string casePws2(Rank& R)
{
  return runOps(R, {kTagMain},
                {op(kPws2, 0, 0, 4), op(kPws2, 64 * KiB, 64 * KiB, 1 * MiB), op(kPws2, 16 * MiB, 16 * MiB, 16 * MiB),
                 op(kWait), op(kWait), op(kWait), op(kFlush)});
}

std::string casePwsf3(Rank& R)
{
  return runOps(R, {kTagMain}, {op(kPwsf3, 1 * MiB, 20 * MiB, 2 * MiB), op(kPwsf3, 0, H - 4096, 4096), op(kWait), op(kWait)});
}

std::string casePwsf2(Rank& R)
{
  return runOps(R, {kTagMain},
                {op(kPwsf2, 512, 512, 1 * MiB - 512), op(kPwsf2, 8 * MiB, 8 * MiB, 8 * MiB), op(kWait), op(kWait)});
}

std::string caseFullHalf(Rank& R) { return runOps(R, {kTagMain}, {op(kPut2, 0, 0, H), op(kSignal), op(kWait), op(kFlush)}); }

// After flush() the sender may reuse its source: it overwrites it at once and signals again; the receiver
// waits for both signals and must still see the old data.
std::string caseFlushThenOverwrite(Rank& R)
{
  const uint32_t newSeed = makeSeed(kRoleNew, R.rank, 0, g.salt + 1);
  return runOps(R, {kTagMain},
                {op(kPut2, 0, 0, H), op(kSignal), op(kFlush), op(kOverwrite, 0, 0, H, newSeed), op(kSignal), op(kWait),
                 op(kWait)},
                512, newSeed);
}

// After a ping-pong on connections with fast flags (one process per GPU, so that the timing holds): waits
// for signals that follow data (which the proxy never raises through the fast flag) have stopped reading
// it; waits for bare signals, which the fast flag carries microseconds before the copy engine, read it
// again (the signal ping-pong starts where the earlier cases, all with data, left the mode).
std::string checkWaitMode(Rank& R, const std::vector<Conn*>& cs, bool withData)
{
#ifdef MSCCLPP_HAS_EPOCH_REACHED
  for (Conn* c : cs) {
    uint64_t words[8];
    TC_CUDA(cudaMemcpy(words, c->dev.localSignalEpochId, sizeof(words), cudaMemcpyDefault));
    if (words[3] == 0) continue; // no fast flag (MSCCLPP_P2P_FAST_FLAGS=0)
    const bool skips = (words[7] & mscclppDevConn::kWaitSkipsFastFlag) != 0;
    TC_EXPECT(skips == withData, "connection to rank %d: waits %s the fast flag after a ping-pong %s data (mode word 0x%llx)",
              c->peer, skips ? "skip" : "read", withData ? "with" : "without", (unsigned long long)words[7]);
  }
#else
  (void)R, (void)cs, (void)withData;
#endif
  return "";
}

std::string casePingpong(Rank& R, bool withData, int iters)
{
  ++g.salt;
  std::vector<Conn*> cs = connsOf({kTagMain});
  TC_TRY(fillAll(R, cs));
  TC_TRY(uploadJobs(R, jobsFor(cs)));
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  double t0 = nowSec();
  pingpongKernel<<<(unsigned)cs.size(), 32, 0, R.stream>>>(g.dJobs, iters, withData ? 1 : 0, g.salt, R.rank, R.dStatus,
                                                           R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "ping-pong kernel", 2 * R.hostTimeoutS));
  double dt = nowSec() - t0;
  countSignals(cs, (uint64_t)iters);
  TC_TRY(barrier(R, "after kernel"));
  TC_TRY(checkEpochs(R));
  if (R.nranks == 2) TC_TRY(checkWaitMode(R, cs, withData));
  R.info = fmt("(%d round trips per connection, %.1f us per round trip incl. launch)", iters, dt * 1e6 / iters);
  return "";
}

std::string caseBidirChecked(Rank& R, int iters, int launches)
{
  ++g.salt;
  std::vector<Conn*> cs = connsOf({kTagMain});
  TC_EXPECT(kRegions * kRegionBytes <= H, "internal: regions too big");
  TC_TRY(fillAll(R, cs));
  std::vector<Job> jobs = jobsFor(cs);
  for (size_t i = 0; i < cs.size(); ++i) jobs[i].arg = srcSeed(cs[i]->peer, R.rank, g.salt, kTagMain);
  TC_TRY(uploadJobs(R, jobs));
  for (int l = 0; l < launches; ++l) {
    TC_TRY(barrier(R, "before kernel"));
    resetStatus(R);
    bidirCheckedKernel<<<(unsigned)cs.size(), 32, 0, R.stream>>>(g.dJobs, iters, R.dStatus, R.waitTimeoutNs);
    TC_CUDA(cudaGetLastError());
    TC_TRY(syncBounded(R, "bidirectional checked kernel", 2 * R.hostTimeoutS));
    countSignals(cs, (uint64_t)iters);
  }
  TC_TRY(barrier(R, "after kernel"));
  TC_TRY(checkEpochs(R));
  R.info = fmt("(%d launches of %d iterations, 1 MiB each way)", launches, iters);
  return "";
}

std::string caseManyThreads(Rank& R, int blocksPerConn, int threads)
{
  ++g.salt;
  const uint64_t slice = 4 * KiB;
  const uint64_t n = (uint64_t)blocksPerConn * threads;
  std::vector<Conn*> cs = connsOf({kTagMain});
  TC_EXPECT(n * slice <= H, "internal: burst too big");
  TC_TRY(fillAll(R, cs));
  std::vector<Job> jobs = jobsFor(cs);
  for (size_t i = 0; i < cs.size(); ++i) jobs[i].arg = cs[i]->sent + n;
  TC_TRY(uploadJobs(R, jobs));
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  burstKernel<<<(unsigned)(cs.size() * blocksPerConn), threads, 0, R.stream>>>(g.dJobs, blocksPerConn, slice);
  TC_CUDA(cudaGetLastError());
  burstFinishKernel<<<(unsigned)cs.size(), 32, 0, R.stream>>>(g.dJobs, n + 1, R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "burst kernels"));
  countSignals(cs, n + 1);
  TC_TRY(barrier(R, "after kernel"));
  for (Conn* c : cs) {
    TC_TRY(verifyRecv(R, *c, {Seg{0, 0, n * slice}}));
    TC_TRY(verifySendUnchanged(R, *c));
  }
  TC_TRY(checkEpochs(R));
  R.info = fmt("(%llu threads x %llu bytes per connection)", (unsigned long long)n, (unsigned long long)slice);
  return "";
}

std::string caseFifoWrap(Rank& R, uint64_t nPuts)
{
  ++g.salt;
  const uint64_t stride = 64;
  const int signalEvery = 16;
  const uint64_t signals = nPuts / signalEvery + 1;
  std::vector<Conn*> cs = connsOf({kTagMain});
  TC_EXPECT(nPuts * stride <= H, "internal: too many puts");
  TC_TRY(fillAll(R, cs));
  TC_TRY(uploadJobs(R, jobsFor(cs)));
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  double t0 = nowSec();
  streamKernel<<<(unsigned)cs.size(), 32, 0, R.stream>>>(g.dJobs, nPuts, stride, signalEvery, signals, R.dStatus,
                                                         R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "stream kernel", 3 * R.hostTimeoutS));
  double dt = nowSec() - t0;
  countSignals(cs, signals);
  TC_TRY(barrier(R, "after kernel"));
  for (Conn* c : cs) {
    TC_TRY(verifyRecv(R, *c, {Seg{0, 0, nPuts * stride}}));
    TC_TRY(verifySendUnchanged(R, *c));
  }
  TC_TRY(checkEpochs(R));
  R.info = fmt("(%llu triggers per connection through a %d-slot FIFO, %.2f us per trigger)",
               (unsigned long long)(nPuts + signals + 1), MSCCLPP_PROXY_FIFO_SIZE,
               dt * 1e6 / (double)((nPuts + signals + 1) * cs.size()));
  return "";
}

// The same op list on all three tags at once; each connection's pattern includes its tag, so data sent
// over the wrong connection is caught.
std::string caseMultiTag(Rank& R)
{
  return runOps(R, {kTagMain, kTagSmall, kTagOffset},
                {op(kPws2, 0, 0, 256 * KiB), op(kPws3, 600 * KiB, 4 * KiB, 256 * KiB), op(kWait), op(kWait), op(kFlush)});
}

// The buffer starts 4096 bytes into its allocation: writes must land exactly there, guards unchanged.
std::string caseOffsetBuffer(Rank& R)
{
  const uint64_t h = kHalfBytes[kTagOffset];
  return runOps(R, {kTagOffset}, {op(kPut2, 0, 0, h), op(kSignal), op(kWait), op(kFlush)});
}

// Plain device stores through remoteBuff must land in the peer's buffer (not at its allocation's base).
std::string caseRemoteBuffDirect(Rank& R)
{
  ++g.salt;
  std::vector<Conn*> cs = connsOf({kTagMain, kTagOffset});
  for (Conn* c : cs) {
    if (c->dev.remoteBuff == nullptr) {
      R.fatal = true; // leaving before the barriers would desynchronize the ranks
      return fmt("%s: remoteBuff is NULL", connName(*c).c_str());
    }
  }
  TC_TRY(fillAll(R, cs));
  std::vector<uint32_t> seeds;
  for (Conn* c : cs) seeds.push_back(makeSeed(kRoleDirect, R.rank, c->peer, tagSalt(g.salt, c->tagIdx)));
  TC_CUDA(cudaMemcpyAsync(g.dSeeds, seeds.data(), seeds.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, R.stream));
  TC_TRY(uploadJobs(R, jobsFor(cs)));
  const uint64_t bytes = 256 * KiB;
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  directKernel<<<(unsigned)cs.size(), 256, 0, R.stream>>>(g.dJobs, bytes / 4, g.dSeeds, R.dStatus);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "direct-store kernel"));
  TC_TRY(barrier(R, "after kernel"));
  for (Conn* c : cs) {
    const uint32_t from = makeSeed(kRoleDirect, c->peer, R.rank, tagSalt(g.salt, c->tagIdx));
    const uint32_t sent = sentinelSeed(R.rank, c->peer, g.salt, c->tagIdx);
    TC_TRY(verifyWords(R, c->buf, c->recvHalf, bytes, from, 0, fmt("%s: words stored by the peer", connName(*c).c_str())));
    TC_TRY(verifyWords(R, c->buf, c->recvHalf + bytes, c->half - bytes, sent, bytes / 4,
                       fmt("%s: rest of the receiving half", connName(*c).c_str())));
    TC_TRY(verifySendUnchanged(R, *c));
    TC_TRY(verifyGuards(R, *c));
  }
  TC_TRY(checkEpochs(R));
  R.info = fmt("(%zu connections)", cs.size());
  return "";
}

std::string caseTeardown(Rank& R)
{
  // Every rank has closed its mappings of the peers' buffers before any buffer is freed.
  TC_TRY(destroyComm(R));
  for (Conn& c : g.conns) TC_CUDA(cudaFree(c.alloc));
  g.conns.clear();
  TC_CUDA(cudaFree(g.dOps));
  TC_CUDA(cudaFree(g.dJobs));
  TC_CUDA(cudaFree(g.dSeeds));
  g.dOps = nullptr;
  g.dJobs = nullptr;
  g.dSeeds = nullptr;
  return "";
}

// P2P_METHODS_ONLY=<substring> runs only the cases whose names contain it (after set-up), and
// P2P_METHODS_BURST=<blocks>,<threads> sizes the many-threads case (default 4 x 256): for narrowing a failure down.
bool selected(const char* name)
{
  const char* only = getenv("P2P_METHODS_ONLY");
  return only == nullptr || strstr(name, only) != nullptr;
}

int rankMain(Rank& R)
{
  const bool shared = R.nranks > 2; // possibly several ranks per GPU: fewer iterations
  int burstBlocks = 4, burstThreads = 256;
  if (const char* b = getenv("P2P_METHODS_BURST")) sscanf(b, "%d,%d", &burstBlocks, &burstThreads);
  auto runSelected = [&](const char* name, const std::function<std::string()>& body) {
    if (selected(name)) runCase(R, name, body);
  };
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "setup_connect_all_to_all", [&] { return caseSetup(R); })) return 1;
  if (!runCase(R, "devconn_fields", [&] { return caseDevConnFields(R); })) return 1;
  runSelected("put3_signal_flush_wait", [&] { return casePut3(R); });
  runSelected("putWithSignal_2arg", [&] { return casePws2(R); });
  if (!g.quick) {
    runSelected("put2_signal_wait", [&] { return casePut2(R); });
    runSelected("putWithSignal_3arg", [&] { return casePws3(R); });
    runSelected("putWithSignalAndFlush_3arg", [&] { return casePwsf3(R); });
    runSelected("putWithSignalAndFlush_2arg", [&] { return casePwsf2(R); });
    runSelected("put_whole_half_32MiB", [&] { return caseFullHalf(R); });
    runSelected("flush_then_overwrite_source", [&] { return caseFlushThenOverwrite(R); });
    runSelected("pingpong_signal_wait", [&] { return casePingpong(R, false, shared ? 200 : 3000); });
    runSelected("bidir_putWithSignal_checked_each_wait", [&] { return caseBidirChecked(R, shared ? 100 : 2000, shared ? 1 : 10); });
    runSelected("pingpong_putWithSignal_data", [&] { return casePingpong(R, true, shared ? 100 : 1000); });
    // With several processes per GPU their spinning kernels time-slice, and a trigger takes about a
    // millisecond (4 ranks on 2 H200s: 30000 puts a connection took 130 s): fewer puts, still dozens of
    // times around the FIFO (every rank's connections share its FIFO: 3000 puts on each of 3 connections
    // go around its 128 slots about 75 times).
    runSelected("fifo_wraparound", [&] { return caseFifoWrap(R, R.nranks > 4 ? 500 : shared ? 3000 : 100000); });
    runSelected("multi_tag_routing", [&] { return caseMultiTag(R); });
    runSelected("offset_buffer_with_guards", [&] { return caseOffsetBuffer(R); });
    runSelected("remote_buff_direct_store", [&] { return caseRemoteBuffDirect(R); });
    runSelected("many_threads_putWithSignal", [&] { return caseManyThreads(R, burstBlocks, burstThreads); });
    // 1024 threads of one block pushing on one connection at once.
    runSelected("many_threads_one_block", [&] { return caseManyThreads(R, 1, 1024); });
  }
  bool ok = runCase(R, "teardown", [&] { return caseTeardown(R); });
  freeRank(R);
  if (g.quick) {
    // Destroy the context so that compute-sanitizer's leak check sees every allocation's fate.
    cudaError_t e = cudaDeviceReset();
    if (e != cudaSuccess) {
      rankLog(R, "cudaDeviceReset failed: %s", cudaGetErrorString(e));
      return 1;
    }
  }
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  g.quick = opt.quick;
  return runRanks(opt.quick ? "p2p_methods_quick" : "p2p_methods", opt, opt.quick ? 90 : (opt.nranks > 2 ? 150 : 100),
                  rankMain);
}
