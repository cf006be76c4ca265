// Robustness against bad input, on GPUs with two ranks:
//   - mscclppConnect with bad arguments returns an error (and records nothing: set-up still works after);
//   - mscclppGetDeviceConnection / mscclppGetAllDeviceConnections with bad arguments return an error;
//   - triggers pushed straight into the FIFO with offsets or sizes past the buffer, or a connId past the
//     number of connections, are dropped by the proxy: nothing around or inside either rank's buffer
//     changes, flush() still returns and a valid put afterwards still arrives;
//   - mscclppRegisterBuffer + mscclppRegisteredBufferWrite honour srcOffset and dstOffset;
//   - mscclppProxyStop twice is harmless; mscclppCommDestroy without mscclppProxyStop is safe.
//
//   bad_triggers 2
// From c-tests/harness/ (the Makefile adds it to the include path): shared with the benchmarks.
#include "mscclpp_rank.h"
#include "log_capture.h"

using namespace tc;

namespace {

constexpr uint64_t kGuardBytes = 64 * 1024;
constexpr uint64_t kBufBytes = 1024 * 1024; // two halves, as in p2p_methods
constexpr uint64_t kHalf = kBufBytes / 2;

std::string logSince(size_t from)
{
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (from >= gLog.size()) return "no log line";
  std::string s = gLog[from];
  if (s.size() > 140) s = s.substr(0, 140) + "...";
  return fmt("%zu log line(s), first: \"%s\"", gLog.size() - from, s.c_str());
}

struct State
{
  int peer = -1;
  char* alloc = nullptr; // guard | buffer | guard
  char* buf = nullptr;
  char* buf2 = nullptr;   // buffer of the second communicator
  char* reg = nullptr;    // registered buffer
  char* regSrc = nullptr; // source of the registered write
  void* hostBuf = nullptr;
  mscclppDevConn_t conn;
  uint64_t sendHalf = 0, recvHalf = 0;
  uint64_t sent = 0, waited = 0;
};
State g;

uint32_t guardSeed(int me, int which) { return makeSeed(kRoleGuard, me, 0, 100 + which); }
uint32_t bufSeed(int me) { return makeSeed(kRoleSentinel, me, 0, 200); }

std::string verifyGuards(Rank& R)
{
  TC_TRY(verifyWords(R, g.alloc, 0, kGuardBytes, guardSeed(R.rank, 0), 0, "guard before the buffer"));
  TC_TRY(verifyWords(R, g.buf, kBufBytes, kGuardBytes, guardSeed(R.rank, 1), 0, "guard after the buffer"));
  return "";
}

std::string checkEpochs(Rank& R)
{
  uint64_t device = 0, proxy = 0, wait = 0;
  TC_TRY(readEpochs(R, g.conn, &device, &proxy, &wait));
  TC_EXPECT(device == g.sent && proxy == g.waited && wait == g.waited,
            "epochs device %llu proxy %llu wait %llu, expected %llu %llu %llu", (unsigned long long)device,
            (unsigned long long)proxy, (unsigned long long)wait, (unsigned long long)g.sent, (unsigned long long)g.waited,
            (unsigned long long)g.waited);
  return "";
}

// ------------------------------------------------------------------------------------------------
// mscclppConnect argument checks (before the valid connect, so a wrongly recorded connection would
// break the set-up that follows)
// ------------------------------------------------------------------------------------------------

std::string expectConnectError(Rank& R, mscclppComm_t comm, int remoteRank, void* buf, uint64_t size, int transport,
                               const char* ibDev)
{
  size_t before = logCount();
  mscclppResult_t r = mscclppConnect(comm, remoteRank, 0, buf, size, (mscclppTransport_t)transport, ibDev);
  TC_EXPECT(r != mscclppSuccess, "mscclppConnect accepted it (returned mscclppSuccess)");
  R.info = fmt("(returned %d %s; %s)", (int)r, errStr(r), logSince(before).c_str());
  return "";
}

std::string caseAlloc(Rank& R)
{
  TC_EXPECT(R.nranks == 2, "this test needs exactly 2 ranks");
  g.peer = 1 - R.rank;
  g.sendHalf = R.rank < g.peer ? 0 : kHalf;
  g.recvHalf = R.rank < g.peer ? kHalf : 0;
  TC_CUDA(cudaMalloc((void**)&g.alloc, kBufBytes + 2 * kGuardBytes));
  g.buf = g.alloc + kGuardBytes;
  TC_CUDA(cudaMalloc((void**)&g.buf2, kBufBytes));
  TC_CUDA(cudaMalloc((void**)&g.reg, 256 * 1024));
  TC_CUDA(cudaMalloc((void**)&g.regSrc, 256 * 1024));
  g.hostBuf = malloc(kBufBytes);
  TC_EXPECT(g.hostBuf != nullptr, "malloc failed");
  TC_TRY(fillWords(R, g.alloc, 0, kGuardBytes, guardSeed(R.rank, 0), 0));
  TC_TRY(fillWords(R, g.buf, kBufBytes, kGuardBytes, guardSeed(R.rank, 1), 0));
  TC_TRY(fillWords(R, g.buf, 0, kBufBytes, bufSeed(R.rank), 0));
  TC_TRY(syncBounded(R, "fill"));
  return "";
}

std::string caseValidSetup(Rank& R)
{
  mscclppResult_t r = mscclppConnect(R.comm, g.peer, 0, g.buf, kBufBytes, mscclppTransportP2P);
  if (r != mscclppSuccess) {
    R.fatal = true;
    return fmt("valid mscclppConnect returned %d (%s)", (int)r, errStr(r));
  }
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppConnectionSetup", R.hostTimeoutS, [comm]() { return mscclppConnectionSetup(comm); }));
  mscclppDevConn_t* all = nullptr;
  int n = -1;
  TC_MSCCLPP(mscclppGetAllDeviceConnections(R.comm, &all, &n));
  if (n != 1 || all == nullptr || all[0].remoteRank != g.peer || all[0].localBuff != (void*)g.buf) {
    R.fatal = true;
    return fmt("after the rejected connects, mscclppGetAllDeviceConnections gave %d connections (first: remoteRank %d, "
               "localBuff %p; expected 1 to rank %d with %p)",
               n, (n > 0 && all) ? all[0].remoteRank : -1, (n > 0 && all) ? all[0].localBuff : nullptr, g.peer, (void*)g.buf);
  }
  g.conn = all[0];
  TC_TRY(loadConns(R, all, 1));
  TC_MSCCLPP(mscclppProxyLaunch(comm));
  R.info = "(exactly the one valid connection exists)";
  return "";
}

std::string caseGetConnBadArgs(Rank& R)
{
  mscclppDevConn_t* p = nullptr;
  mscclppResult_t r = mscclppGetDeviceConnection(R.comm, g.peer, 999, &p);
  TC_EXPECT(r != mscclppSuccess, "mscclppGetDeviceConnection(peer, unknown tag 999) returned success (%p)", (void*)p);
  r = mscclppGetDeviceConnection(R.comm, R.rank, 0, &p);
  TC_EXPECT(r != mscclppSuccess, "mscclppGetDeviceConnection(self, 0) returned success");
  r = mscclppGetDeviceConnection(R.comm, g.peer, 0, nullptr);
  TC_EXPECT(r != mscclppSuccess, "mscclppGetDeviceConnection(..., devConn NULL) returned success");
  r = mscclppGetDeviceConnection(nullptr, g.peer, 0, &p);
  TC_EXPECT(r != mscclppSuccess, "mscclppGetDeviceConnection(NULL comm, ...) returned success");
  int n = 0;
  r = mscclppGetAllDeviceConnections(R.comm, nullptr, &n);
  TC_EXPECT(r != mscclppSuccess, "mscclppGetAllDeviceConnections(devConns NULL) returned success");
  mscclppDevConn_t* all = nullptr;
  r = mscclppGetAllDeviceConnections(R.comm, &all, nullptr);
  TC_EXPECT(r != mscclppSuccess, "mscclppGetAllDeviceConnections(nConns NULL) returned success");
  p = nullptr;
  r = mscclppGetDeviceConnection(R.comm, g.peer, 0, &p);
  TC_EXPECT(r == mscclppSuccess && p != nullptr && p->remoteRank == g.peer && p->tag == 0,
            "positive control: mscclppGetDeviceConnection(peer, 0) returned %d / %p", (int)r, (void*)p);
  return "";
}

// ------------------------------------------------------------------------------------------------
// Bad triggers
// ------------------------------------------------------------------------------------------------

struct BadTrigger
{
  uint64_t type, dst, src, size;
  int connId; // -1: the connection's own
  int pad;
};

// A Flag on our own connection is counted first, as the header's signalling methods do; the peer's proxy
// raises such a flag even when it drops the data, so each is matched by one wait.
__host__ __device__ inline bool isOwnFlag(const BadTrigger& t) { return t.connId < 0 && (t.type & mscclppFlag); }

__global__ void badTriggerKernel(const BadTrigger* t, int n, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mscclppDevConn_t conn = gConns[0];
  int ownFlags = 0;
  for (int i = 0; i < n; ++i) {
    devProgress(st, i, 0);
    mscclppConcurrentFifo fifo = conn.fifo;
    if (t[i].connId >= 0) fifo.connId = t[i].connId;
    if (isOwnFlag(t[i])) {
      conn.epochIncrement();
      ++ownFlags;
    }
    fifo.push(t[i].type, t[i].dst, t[i].src, t[i].size);
  }
  devProgress(st, n, 0);
  // The proxy must keep consuming: this returns only once it has passed every trigger above.
  conn.flush();
  devProgress(st, n + 1, 0);
  for (int k = 0; k < ownFlags; ++k) {
    if (!boundedWait(conn, st, timeoutNs, n + 2, k)) return;
  }
}

// Flags on our own connection among the bad triggers (each counted and waited for once).
int ownFlags(const std::vector<BadTrigger>& t)
{
  int n = 0;
  for (const BadTrigger& b : t) n += isOwnFlag(b) ? 1 : 0;
  return n;
}

__global__ void validPutKernel(uint64_t sendHalf, uint64_t bytes, DevStatus* st, uint64_t timeoutNs)
{
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mscclppDevConn_t conn = gConns[0];
  conn.putWithSignal(sendHalf, bytes);
  conn.flush();
  boundedWait(conn, st, timeoutNs, 0, 0);
}

size_t gBadLogStart = 0;
int gBadCount = 0;

std::string caseBadTriggersFlush(Rank& R)
{
  const uint64_t S = kBufBytes;
  const uint64_t D = mscclppData, F = mscclppFlag, Y = mscclppSync;
  std::vector<BadTrigger> t = {
    {D, 0, S, 4, -1, 0},                 // source starts at the end
    {D, 0, S - 4, 8, -1, 0},             // source straddles the end
    {D, S, 0, 4, -1, 0},                 // destination starts at the end
    {D, S - 4, 0, 8, -1, 0},             // destination straddles the end
    {D, 0, 0, S + 4, -1, 0},             // size larger than the buffer
    {D, 0xFFFFFFF0ull, 0, 0x20, -1, 0},  // destination near 4 GiB
    {D, 0, 0xFFFFFFF0ull, 0x20, -1, 0},  // source near 4 GiB
    {D, 0, 0, 0xFFFFFFFFull, -1, 0},     // largest size
    {D | F, S - 60, 0, 64, -1, 0},       // flag with out-of-range data
    {D, 0, 0, 64, 1, 0},                 // connId 1, but only connection 0 exists
    {D | F | Y, 0, 0, 64, 1023, 0},      // largest connId
    {F, 0, 0, 1, 1023, 0},               // flag for a connection that does not exist
    {0, 0, 0, 64, -1, 0},                // no type bits at all
  };
  gBadCount = (int)t.size();
  BadTrigger* d = nullptr;
  TC_CUDA(cudaMalloc((void**)&d, t.size() * sizeof(BadTrigger)));
  TC_CUDA(cudaMemcpyAsync(d, t.data(), t.size() * sizeof(BadTrigger), cudaMemcpyHostToDevice, R.stream));
  TC_TRY(barrier(R, "before bad triggers"));
  gBadLogStart = logCount();
  resetStatus(R);
  badTriggerKernel<<<1, 32, 0, R.stream>>>(d, (int)t.size(), R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  std::string e = syncBounded(R, fmt("bad-trigger kernel (progress op i < %d: pushing trigger i; op %d: in flush; "
                                     "op %d: waiting for the peer's flags)",
                                     gBadCount, gBadCount, gBadCount + 2).c_str());
  if (!e.empty()) return "the proxy stopped serving the FIFO: " + e;
  const int own = ownFlags(t);
  g.sent += own;
  g.waited += own;
  TC_CUDA(cudaFree(d));
  // Both ranks' proxies have passed all triggers once both flushes returned.
  TC_TRY(barrier(R, "after bad triggers"));
  R.info = fmt("(%d bad triggers; %s)", gBadCount, logSince(gBadLogStart).c_str());
  return "";
}

std::string caseBadTriggersGuards(Rank& R) { return verifyGuards(R); }

std::string caseBadTriggersBufferUntouched(Rank& R)
{
  TC_TRY(verifyWords(R, g.buf, 0, kBufBytes, bufSeed(R.rank), 0,
                     "buffer interior (a trigger was partly carried out instead of dropped)"));
  TC_TRY(checkEpochs(R));
  return "";
}

std::string caseValidPutAfter(Rank& R)
{
  const uint32_t src = makeSeed(kRoleSrc, R.rank, g.peer, 300);
  const uint32_t sentinel = makeSeed(kRoleSentinel, R.rank, g.peer, 300);
  TC_TRY(fillWords(R, g.buf, g.sendHalf, kHalf, src, 0));
  TC_TRY(fillWords(R, g.buf, g.recvHalf, kHalf, sentinel, 0));
  TC_TRY(syncBounded(R, "fill"));
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  validPutKernel<<<1, 32, 0, R.stream>>>(g.sendHalf, kHalf, R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "valid put after bad triggers"));
  ++g.sent;
  ++g.waited;
  TC_TRY(barrier(R, "after kernel"));
  TC_TRY(verifyWords(R, g.buf, g.recvHalf, kHalf, makeSeed(kRoleSrc, g.peer, R.rank, 300), 0, "received half"));
  TC_TRY(verifyWords(R, g.buf, g.sendHalf, kHalf, src, 0, "sending half"));
  TC_TRY(verifyGuards(R));
  TC_TRY(checkEpochs(R));
  return "";
}

// ------------------------------------------------------------------------------------------------
// Registered buffers
// ------------------------------------------------------------------------------------------------

std::string caseRegisteredWrite(Rank& R)
{
  const uint64_t regBytes = 256 * 1024, size = 64 * 1024;
  const uint32_t srcOff = 8192 + 4, dstOff = 65536 + 8;
  char* reg = g.reg;
  char* src = g.regSrc;
  const uint32_t regSentinel = makeSeed(kRoleSentinel, R.rank, g.peer, 400);
  TC_TRY(fillWords(R, reg, 0, regBytes, regSentinel, 0));
  TC_TRY(fillWords(R, src, 0, regBytes, makeSeed(kRoleReg, R.rank, g.peer, 400), 0));
  TC_TRY(syncBounded(R, "fill"));

  std::string result;
  {
    mscclppRegisteredMemory regMem;
    mscclppComm_t comm = R.comm;
    mscclppRegisteredMemory* rm = &regMem;
    TC_TRY(callBounded(R, "mscclppRegisterBuffer", R.hostTimeoutS,
                       [comm, reg, regBytes, rm]() { return mscclppRegisterBuffer(comm, reg, regBytes, rm); }));
    if (regMem.p2p.size() != 1 || regMem.p2p[0].remoteBuff == nullptr) {
      R.fatal = true;
      return fmt("mscclppRegisterBuffer filled %zu p2p entries (first remoteBuff %p), expected 1 with a peer buffer",
                 regMem.p2p.size(), regMem.p2p.empty() ? nullptr : regMem.p2p[0].remoteBuff);
    }
    TC_TRY(barrier(R, "before write")); // the peer's registered buffer holds its sentinel
    // Past the end, and past it by wrapping around 2^64: refused, and nothing written (the checks below
    // find the sentinel everywhere but the real write's range).
    for (uint64_t badDst : {regBytes - size + 8, (uint64_t)~0ull - 8}) {
      mscclppResult_t b = mscclppRegisteredBufferWrite(R.comm, &regMem, src, size, 0, badDst, (int64_t)(intptr_t)R.stream);
      if (b != mscclppInvalidArgument) {
        R.fatal = true;
        return fmt("mscclppRegisteredBufferWrite with dstOffset %llu returned %d (%s), expected mscclppInvalidArgument",
                   (unsigned long long)badDst, (int)b, errStr(b));
      }
    }
    mscclppResult_t r = mscclppRegisteredBufferWrite(R.comm, &regMem, src, size, srcOff, dstOff, (int64_t)(intptr_t)R.stream);
    if (r != mscclppSuccess) {
      R.fatal = true;
      return fmt("mscclppRegisteredBufferWrite returned %d (%s)", (int)r, errStr(r));
    }
    TC_TRY(syncBounded(R, "registered write"));
    TC_TRY(barrier(R, "after write"));
    const uint32_t from = makeSeed(kRoleReg, g.peer, R.rank, 400);
    result = verifyWords(R, reg, 0, dstOff, regSentinel, 0, "registered buffer before dstOffset");
    if (result.empty()) {
      result = verifyWords(R, reg, dstOff, size, from, srcOff / 4,
                           fmt("registered buffer [dstOffset, dstOffset + size) (should hold the peer's source from srcOffset %u)", srcOff));
    }
    if (result.empty()) {
      result = verifyWords(R, reg, dstOff + size, regBytes - dstOff - size, regSentinel, (dstOff + size) / 4,
                           "registered buffer after dstOffset + size");
    }
    if (R.fatal) return result;
    TC_TRY(barrier(R, "after check"));
  }
  if (result.empty()) R.info = fmt("(%llu bytes, srcOffset %u, dstOffset %u)", (unsigned long long)size, srcOff, dstOff);
  return result;
}

// ------------------------------------------------------------------------------------------------
// Teardown
// ------------------------------------------------------------------------------------------------

std::string caseProxyStopTwice(Rank& R)
{
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "first mscclppProxyStop", R.hostTimeoutS, [comm]() { return mscclppProxyStop(comm); }));
  auto rc = std::make_shared<mscclppResult_t>(mscclppSuccess);
  std::string e = callBounded(R, "second mscclppProxyStop", R.hostTimeoutS, [comm, rc]() {
    *rc = mscclppProxyStop(comm);
    return mscclppSuccess;
  });
  if (!e.empty()) return e;
  R.info = fmt("(second call returned %d %s)", (int)*rc, errStr(*rc));
  return "";
}

std::string caseDestroy(Rank& R)
{
  mscclppComm_t comm = R.comm;
  TC_TRY(callBounded(R, "mscclppCommDestroy", R.hostTimeoutS, [comm]() { return mscclppCommDestroy(comm); }));
  R.comm = nullptr;
  return "";
}

// A fresh communicator that is destroyed while its proxy still runs.
std::string caseDestroyWithoutStop(Rank& R)
{
  const std::string addr = fmt("127.0.0.1:%d", R.port + 1);
  mscclppComm_t comm = nullptr;
  TC_MSCCLPP(mscclppCommInitRank(&comm, R.nranks, addr.c_str(), R.rank));
  TC_EXPECT(comm != nullptr, "mscclppCommInitRank returned a NULL communicator");
  R.comm = comm;
  // A buffer of its own: the first communicator's mappings are gone, but do not depend on it.
  TC_MSCCLPP(mscclppConnect(comm, g.peer, 5, g.buf2, kBufBytes, mscclppTransportP2P));
  TC_TRY(callBounded(R, "mscclppConnectionSetup", R.hostTimeoutS, [comm]() { return mscclppConnectionSetup(comm); }));
  mscclppDevConn_t* all = nullptr;
  int n = -1;
  TC_MSCCLPP(mscclppGetAllDeviceConnections(comm, &all, &n));
  if (n != 1 || all == nullptr) {
    R.fatal = true;
    return fmt("second communicator has %d connections", n);
  }
  TC_TRY(loadConns(R, all, 1));
  TC_MSCCLPP(mscclppProxyLaunch(comm));
  // Use it once, so that the proxy has done real work.
  const uint32_t src = makeSeed(kRoleSrc, R.rank, g.peer, 500);
  TC_TRY(fillWords(R, g.buf2, g.sendHalf, kHalf, src, 0));
  TC_TRY(fillWords(R, g.buf2, g.recvHalf, kHalf, makeSeed(kRoleSentinel, R.rank, g.peer, 500), 0));
  TC_TRY(syncBounded(R, "fill"));
  TC_TRY(barrier(R, "before kernel"));
  resetStatus(R);
  validPutKernel<<<1, 32, 0, R.stream>>>(g.sendHalf, kHalf, R.dStatus, R.waitTimeoutNs);
  TC_CUDA(cudaGetLastError());
  TC_TRY(syncBounded(R, "put on the second communicator"));
  TC_TRY(barrier(R, "after kernel"));
  std::string check = verifyWords(R, g.buf2, g.recvHalf, kHalf, makeSeed(kRoleSrc, g.peer, R.rank, 500), 0,
                                  "received half on the second communicator");
  if (R.fatal) return check;
  TC_TRY(callBounded(R, "mscclppCommDestroy without mscclppProxyStop", R.hostTimeoutS,
                     [comm]() { return mscclppCommDestroy(comm); }));
  R.comm = nullptr;
  TC_TRY(oobBarrier(R, "after mscclppCommDestroy"));
  TC_TRY(check);
  TC_TRY(verifyGuards(R));
  return "";
}

int rankMain(Rank& R)
{
  gLogRank = R.rank;
  if (!runCase(R, "set_log_handler", [&]() -> std::string {
        mscclppResult_t r = mscclppSetLogHandler(captureLog);
        TC_EXPECT(r == mscclppSuccess, "mscclppSetLogHandler returned %d", (int)r);
        return "";
      }))
    return 1;
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  if (!runCase(R, "guarded_buffer_alloc", [&] { return caseAlloc(R); })) return 1;

  const int self = R.rank, peer = 1 - R.rank;
  const int P2P = (int)mscclppTransportP2P, IB = (int)mscclppTransportIB;
  struct BadConnect
  {
    const char* name;
    bool nullComm;
    int remoteRank;
    int which; // 0: device buffer, 1: NULL, 2: host malloc buffer
    uint64_t size;
    int transport;
    const char* ibDev;
  };
  const BadConnect bad[] = {
    {"connect_rejects_null_comm", true, peer, 0, kBufBytes, P2P, nullptr},
    {"connect_rejects_remote_rank_self", false, self, 0, kBufBytes, P2P, nullptr},
    {"connect_rejects_remote_rank_nranks", false, R.nranks, 0, kBufBytes, P2P, nullptr},
    {"connect_rejects_remote_rank_negative", false, -1, 0, kBufBytes, P2P, nullptr},
    {"connect_rejects_null_buffer", false, peer, 1, kBufBytes, P2P, nullptr},
    {"connect_rejects_size_zero", false, peer, 0, 0, P2P, nullptr},
    {"connect_rejects_transport_7", false, peer, 0, kBufBytes, 7, nullptr},
    {"connect_rejects_ib_without_device", false, peer, 0, kBufBytes, IB, nullptr},
    {"connect_rejects_ib_unknown_device", false, peer, 0, kBufBytes, IB, "mlx5_does_not_exist"},
    {"connect_rejects_host_buffer", false, peer, 2, kBufBytes, P2P, nullptr},
  };
  for (const BadConnect& b : bad) {
    runCase(R, b.name, [&] {
      void* buf = b.which == 0 ? (void*)g.buf : b.which == 1 ? nullptr : g.hostBuf;
      return expectConnectError(R, b.nullComm ? nullptr : R.comm, b.remoteRank, buf, b.size, b.transport, b.ibDev);
    });
  }
  if (!runCase(R, "connect_valid_after_rejected_ones", [&] { return caseValidSetup(R); })) return 1;
  runCase(R, "get_device_connection_rejects_bad_args", [&] { return caseGetConnBadArgs(R); });
  if (!runCase(R, "bad_triggers_flush_still_returns", [&] { return caseBadTriggersFlush(R); })) return 1;
  runCase(R, "bad_triggers_guards_intact", [&] { return caseBadTriggersGuards(R); });
  runCase(R, "bad_triggers_buffer_untouched", [&] { return caseBadTriggersBufferUntouched(R); });
  runCase(R, "valid_put_after_bad_triggers", [&] { return caseValidPutAfter(R); });
  runCase(R, "registered_buffer_write_offsets", [&] { return caseRegisteredWrite(R); });
  runCase(R, "proxy_stop_twice", [&] { return caseProxyStopTwice(R); });
  runCase(R, "comm_destroy", [&] { return caseDestroy(R); });
  bool ok = runCase(R, "comm_destroy_without_proxy_stop", [&] { return caseDestroyWithoutStop(R); });
  mscclppSetLogHandler(mscclppDefaultLogHandler);
  cudaFree(g.alloc);
  cudaFree(g.buf2);
  cudaFree(g.reg);
  cudaFree(g.regSrc);
  free(g.hostBuf);
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  return runRanks("bad_triggers", opt, 80, rankMain);
}
