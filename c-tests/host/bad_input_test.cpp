// Every exported function, given a bad argument, returns an error code and logs a line that names the
// argument; none crashes or hangs. Host-only: runs on machines without a GPU.
#include <mscclpp.h>

#define HOST_TEST_NAME "bad_input_test"
// Only free_local_addr is used of the shared helpers; the program is bounded by the runner's limit.
static const unsigned CHILD_LIMIT_S = 60;
#include "host_test_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

static std::mutex logMutex;
static std::vector<std::string> logLines;

static void captureLog(const char* msg) {
  std::lock_guard<std::mutex> lock(logMutex);
  logLines.push_back(msg ? msg : "");
}

static int passed = 0, failed = 0;

// Checks that `got` is `want` and that a log line written since `mark` contains `needle`.
static void expect(const char* name, mscclppResult_t got, mscclppResult_t want, const char* needle, size_t mark) {
  bool logged = needle == nullptr;
  {
    std::lock_guard<std::mutex> lock(logMutex);
    for (size_t i = mark; i < logLines.size() && !logged; ++i) logged = logLines[i].find(needle) != std::string::npos;
  }
  if (got == want && logged) {
    ++passed;
    printf("PASS %s\n", name);
  } else {
    ++failed;
    printf("FAIL %s: got %d (%s), want %d; log naming \"%s\": %s\n", name, got, mscclppGetErrorString(got), want,
           needle ? needle : "", logged ? "yes" : "missing");
  }
}

static size_t mark() {
  std::lock_guard<std::mutex> lock(logMutex);
  return logLines.size();
}

#define CASE(name, call, want, needle) \
  do {                                 \
    size_t m_ = mark();                \
    expect(name, call, want, needle, m_); \
  } while (0)

int main() {
  const mscclppResult_t ARG = mscclppInvalidArgument, USAGE = mscclppInvalidUsage, OK = mscclppSuccess;
  if (mscclppSetLogHandler(captureLog) != mscclppSuccess) {
    printf("FAIL mscclppSetLogHandler\n");
    return 1;
  }
  // A port the kernel just handed out, not one derived from the pid: another process may hold that.
  char addr[64];
  free_local_addr(addr, sizeof(addr));
  mscclppComm_t comm = nullptr;
  mscclppUniqueId zeroId;
  memset(&zeroId, 0, sizeof(zeroId));

  CASE("GetUniqueId(NULL)", mscclppGetUniqueId(nullptr), ARG, "uniqueId");
  CASE("CommInitRank(comm NULL)", mscclppCommInitRank(nullptr, 1, addr, 0), ARG, "comm");
  CASE("CommInitRank(nranks 0)", mscclppCommInitRank(&comm, 0, addr, 0), ARG, "nranks");
  CASE("CommInitRank(nranks -3)", mscclppCommInitRank(&comm, -3, addr, 0), ARG, "nranks");
  CASE("CommInitRank(rank == nranks)", mscclppCommInitRank(&comm, 2, addr, 2), ARG, "rank");
  CASE("CommInitRank(rank -1)", mscclppCommInitRank(&comm, 2, addr, -1), ARG, "rank");
  CASE("CommInitRank(ipPortPair NULL)", mscclppCommInitRank(&comm, 1, nullptr, 0), ARG, "ipPortPair");
  const char* badAddrs[] = {"", "no-port", "127.0.0.1:", "127.0.0.1:70000", "127.0.0.1:-1", "999.1.1.1:5000",
                            "[::1:5000", "127.0.0.1:port", "a:b:c:d"};
  for (const char* a : badAddrs) {
    std::string name = std::string("CommInitRank(ipPortPair \"") + a + "\")";
    CASE(name.c_str(), mscclppCommInitRank(&comm, 1, a, 0), ARG, "ipPortPair");
  }
  CASE("CommInitRankFromId(comm NULL)", mscclppCommInitRankFromId(nullptr, 1, zeroId, 0), ARG, "comm");
  CASE("CommInitRankFromId(zero id)", mscclppCommInitRankFromId(&comm, 1, zeroId, 0), ARG, "id");
  CASE("CommInitRankFromId(nranks 0)", mscclppCommInitRankFromId(&comm, 0, zeroId, 0), ARG, "nranks");
  CASE("SetBootstrapConnTimeout(-1)", mscclppSetBootstrapConnTimeout(-1), ARG, "timeout");
  CASE("SetBootstrapConnTimeout(0)", mscclppSetBootstrapConnTimeout(0), ARG, "timeout");
  CASE("SetBootstrapConnTimeout(10)", mscclppSetBootstrapConnTimeout(10), OK, nullptr);

  // A real two-rank communicator, both ranks in this process (rank 1 on a thread).
  // Another process may take the free port before rank 0 listens on it (a system error at rank 0, a
  // time-out at rank 1): then once more on another.
  mscclppComm_t peer = nullptr;
  mscclppResult_t init = mscclppInternalError, peerInit = mscclppInternalError;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt > 0) free_local_addr(addr, sizeof(addr));
    std::thread t([&] { peerInit = mscclppCommInitRank(&peer, 2, addr, 1); });
    init = mscclppCommInitRank(&comm, 2, addr, 0);
    t.join();
    if (init != mscclppSystemError) break;
    printf("note: rank 0 could not listen on %s (system error); once more on another port\n", addr);
  }
  if (init != OK || peerInit != OK) {
    printf("FAIL two-rank init: %d / %d\n", init, peerInit);
    std::lock_guard<std::mutex> lock(logMutex);
    for (const std::string& line : logLines) printf("    log: %s\n", line.c_str());
    printf("bad input: %d passed, %d failed\n", passed, failed + 1);
    return 1;
  }
  int value = 0;
  char buf[64];
  CASE("CommRank(comm NULL)", mscclppCommRank(nullptr, &value), ARG, "comm");
  CASE("CommRank(rank NULL)", mscclppCommRank(comm, nullptr), ARG, "rank");
  CASE("CommSize(size NULL)", mscclppCommSize(comm, nullptr), ARG, "size");
  CASE("CommRank(made-up handle)", mscclppCommRank((mscclppComm_t)0x1234, &value), USAGE, "not a live communicator");
  CASE("BootstrapAllGather(comm NULL)", mscclppBootstrapAllGather(nullptr, buf, 4), ARG, "comm");
  CASE("BootstrapAllGather(data NULL)", mscclppBootstrapAllGather(comm, nullptr, 4), ARG, "data");
  CASE("BootstrapAllGather(size -1)", mscclppBootstrapAllGather(comm, buf, -1), ARG, "size");
  CASE("BootstrapBarrier(comm NULL)", mscclppBootstrapBarrier(nullptr), ARG, "comm");
  int dummy = 0;
  void* fake = &dummy;
  CASE("Connect(comm NULL)", mscclppConnect(nullptr, 1, 0, fake, 8, mscclppTransportP2P), ARG, "comm");
  CASE("Connect(remoteRank 2 of 2)", mscclppConnect(comm, 2, 0, fake, 8, mscclppTransportP2P), ARG, "remoteRank");
  CASE("Connect(remoteRank -1)", mscclppConnect(comm, -1, 0, fake, 8, mscclppTransportP2P), ARG, "remoteRank");
  CASE("Connect(remoteRank self)", mscclppConnect(comm, 0, 0, fake, 8, mscclppTransportP2P), ARG, "remoteRank");
  CASE("Connect(localBuff NULL)", mscclppConnect(comm, 1, 0, nullptr, 8, mscclppTransportP2P), ARG, "localBuff");
  CASE("Connect(buffSize 0)", mscclppConnect(comm, 1, 0, fake, 0, mscclppTransportP2P), ARG, "buffSize");
  CASE("Connect(transportType 7)", mscclppConnect(comm, 1, 0, fake, 8, (mscclppTransport_t)7), ARG, "transportType");
  CASE("Connect(transportType SHM)", mscclppConnect(comm, 1, 0, fake, 8, mscclppTransportSHM), ARG, "transportType");
  CASE("Connect(IB, ibDev NULL)", mscclppConnect(comm, 1, 0, fake, 8, mscclppTransportIB), ARG, "ibDev");
  CASE("Connect(IB, ibDev \"\")", mscclppConnect(comm, 1, 0, fake, 8, mscclppTransportIB, ""), ARG, "ibDev");
  {
    // A host pointer is not device memory: rejected naming localBuff on a GPU machine, or failing for
    // want of a driver elsewhere. Either way, not success and no crash.
    size_t m = mark();
    mscclppResult_t r = mscclppConnect(comm, 1, 0, fake, 8, mscclppTransportP2P);
    expect("Connect(host pointer) fails", r == OK ? OK : ARG, ARG, nullptr, m);
  }
  CASE("ConnectionSetup(comm NULL)", mscclppConnectionSetup(nullptr), ARG, "comm");
  mscclppDevConn_t* conns = nullptr;
  CASE("GetAllDeviceConnections(devConns NULL)", mscclppGetAllDeviceConnections(comm, nullptr, &value), ARG, "devConns");
  CASE("GetAllDeviceConnections(nConns NULL)", mscclppGetAllDeviceConnections(comm, &conns, nullptr), ARG, "nConns");
  CASE("GetAllDeviceConnections(no connections)", mscclppGetAllDeviceConnections(comm, &conns, &value), USAGE,
       "mscclppConnect");
  CASE("GetDeviceConnection(devConn NULL)", mscclppGetDeviceConnection(comm, 1, 0, nullptr), ARG, "devConn");
  CASE("GetDeviceConnection(remoteRank 9)", mscclppGetDeviceConnection(comm, 9, 0, &conns), ARG, "remoteRank");
  CASE("ProxyLaunch(comm NULL)", mscclppProxyLaunch(nullptr), ARG, "comm");
  CASE("ProxyStop(comm NULL)", mscclppProxyStop(nullptr), ARG, "comm");
  mscclppResult_t asyncErr = mscclppInProgress;
  CASE("CommAbort(comm NULL)", mscclppCommAbort(nullptr), ARG, "comm");
  CASE("CommAbort(made-up handle)", mscclppCommAbort((mscclppComm_t)0x1234), USAGE, "not a live communicator");
  CASE("CommGetAsyncError(comm NULL)", mscclppCommGetAsyncError(nullptr, &asyncErr), ARG, "comm");
  CASE("CommGetAsyncError(asyncError NULL)", mscclppCommGetAsyncError(comm, nullptr), ARG, "asyncError");
  CASE("CommGetAsyncError", mscclppCommGetAsyncError(comm, &asyncErr), OK, nullptr);
  expect("CommGetAsyncError of a healthy communicator", asyncErr, OK, nullptr, mark());
  mscclppRegisteredMemory reg;
  CASE("RegisterBuffer(comm NULL)", mscclppRegisterBuffer(nullptr, fake, 8, &reg), ARG, "comm");
  CASE("RegisterBuffer(local_memory NULL)", mscclppRegisterBuffer(comm, nullptr, 8, &reg), ARG, "local_memory");
  CASE("RegisterBuffer(regMem NULL)", mscclppRegisterBuffer(comm, fake, 8, nullptr), ARG, "regMem");
  CASE("RegisterBuffer(size 0)", mscclppRegisterBuffer(comm, fake, 0, &reg), ARG, "size");
  CASE("RegisterBuffer(no connections)", mscclppRegisterBuffer(comm, fake, 8, &reg), USAGE, "mscclppConnectionSetup");
  CASE("RegisteredBufferWrite(regMem NULL)", mscclppRegisteredBufferWrite(comm, nullptr, fake, 8, 0, 0, 0), ARG, "regMem");
  CASE("RegisteredBufferWrite(srcBuff NULL)", mscclppRegisteredBufferWrite(comm, &reg, nullptr, 8, 0, 0, 0), ARG, "srcBuff");
  CASE("RegisteredBufferWrite(empty regMem)", mscclppRegisteredBufferWrite(comm, &reg, fake, 8, 0, 0, 0), ARG, "regMem");

  // Registration (MSCCLPP_HAS_REGISTRATION): arguments first, then the driver's query of the buffer.
  void* handle = fake;
  CASE("CommRegister(comm NULL)", mscclppCommRegister(nullptr, fake, 8, &handle), ARG, "comm");
  CASE("CommRegister(handle NULL)", mscclppCommRegister(comm, fake, 8, nullptr), ARG, "handle is NULL");
  CASE("CommRegister(buff NULL)", mscclppCommRegister(comm, nullptr, 8, &handle), ARG, "buff is NULL");
  CASE("CommRegister(size 0)", mscclppCommRegister(comm, fake, 0, &handle), ARG, "size is 0");
  CASE("CommRegister(made-up comm)", mscclppCommRegister((mscclppComm_t)0x1234, fake, 8, &handle), USAGE,
       "not a live communicator");
  {
    // Host memory: refused by the driver's query on a GPU machine, or for want of a driver elsewhere.
    size_t m = mark();
    mscclppResult_t r = mscclppCommRegister(comm, fake, 8, &handle);
    expect("CommRegister(host memory) fails", r == ARG || r == mscclppUnhandledCudaError ? ARG : r, ARG, "mscclppCommRegister", m);
    expect("CommRegister leaves *handle alone on error", handle == fake ? OK : ARG, OK, nullptr, mark());
  }
  CASE("CommDeregister(comm NULL)", mscclppCommDeregister(nullptr, fake), ARG, "comm");
  CASE("CommDeregister(handle NULL)", mscclppCommDeregister(comm, nullptr), ARG, "handle is NULL");
  CASE("CommDeregister(never issued)", mscclppCommDeregister(comm, (void*)0x4d53000000bc0000ull), USAGE,
       "not a live registration");
  CASE("CommDeregister(an address)", mscclppCommDeregister(comm, fake), USAGE, "not a live registration");

  // Collectives: argument checks come before any GPU work, so they hold on machines without a GPU.
  void* dev = fake;  // never dereferenced: every case below fails (or does nothing) before touching it
  CASE("AllReduce(comm NULL)", mscclppAllReduce(dev, dev, 4, mscclppFloat32, mscclppSum, nullptr, nullptr), ARG, "comm");
  CASE("AllReduce(datatype 42)", mscclppAllReduce(dev, dev, 4, (mscclppDataType_t)42, mscclppSum, comm, nullptr), ARG,
       "datatype is 42");
  CASE("AllReduce(op 9)", mscclppAllReduce(dev, dev, 4, mscclppFloat32, (mscclppRedOp_t)9, comm, nullptr), ARG, "op is 9");
  CASE("AllReduce(op -1)", mscclppAllReduce(dev, dev, 4, mscclppFloat32, (mscclppRedOp_t)-1, comm, nullptr), ARG, "op is -1");
  CASE("AllReduce(count overflows)",
       mscclppAllReduce(dev, dev, (size_t)-1 / 4, mscclppFloat64, mscclppSum, comm, nullptr), ARG, "overflow");
  CASE("AllReduce(sendbuff NULL)", mscclppAllReduce(nullptr, dev, 4, mscclppInt32, mscclppMax, comm, nullptr), ARG,
       "sendbuff is NULL");
  CASE("AllReduce(recvbuff NULL)", mscclppAllReduce(dev, nullptr, 4, mscclppInt32, mscclppMax, comm, nullptr), ARG,
       "recvbuff is NULL");
  CASE("AllReduce(count 0, NULL buffers)", mscclppAllReduce(nullptr, nullptr, 0, mscclppBfloat16, mscclppAvg, comm, nullptr),
       OK, nullptr);
  CASE("AllGather(comm NULL)", mscclppAllGather(dev, dev, 4, mscclppUint8, nullptr, nullptr), ARG, "comm");
  CASE("AllGather(datatype -1)", mscclppAllGather(dev, dev, 4, (mscclppDataType_t)-1, comm, nullptr), ARG, "datatype");
  CASE("AllGather(sendcount x nranks overflows)",
       mscclppAllGather(dev, dev, (size_t)1 << 62, mscclppInt8, comm, nullptr), ARG, "sendcount");
  CASE("AllGather(recvbuff NULL)", mscclppAllGather(dev, nullptr, 4, mscclppInt8, comm, nullptr), ARG, "recvbuff");
  CASE("ReduceScatter(op 5)", mscclppReduceScatter(dev, dev, 4, mscclppFloat16, (mscclppRedOp_t)5, comm, nullptr), ARG,
       "op is 5");
  CASE("ReduceScatter(sendbuff NULL)", mscclppReduceScatter(nullptr, dev, 4, mscclppFloat16, mscclppSum, comm, nullptr),
       ARG, "sendbuff");
  CASE("ReduceScatter(count 0)", mscclppReduceScatter(dev, dev, 0, mscclppUint64, mscclppProd, comm, nullptr), OK, nullptr);
  CASE("Broadcast(root 2 of 2)", mscclppBroadcast(dev, dev, 4, mscclppInt64, 2, comm, nullptr), ARG, "root is 2");
  CASE("Broadcast(root -1)", mscclppBroadcast(dev, dev, 4, mscclppInt64, -1, comm, nullptr), ARG, "root is -1");
  CASE("Broadcast(datatype 10)", mscclppBroadcast(dev, dev, 4, (mscclppDataType_t)10, 0, comm, nullptr), ARG, "datatype");
  CASE("Broadcast(comm made up)", mscclppBroadcast(dev, dev, 4, mscclppInt64, 0, (mscclppComm_t)0x1234, nullptr), USAGE,
       "not a live communicator");
  {
    // Host memory is not a device buffer: rejected naming sendbuff on a GPU machine, or failing for want of
    // a driver elsewhere. Either way, not success and no crash.
    size_t m = mark();
    mscclppResult_t r = mscclppAllReduce(dev, dev, 4, mscclppFloat32, mscclppSum, comm, nullptr);
    expect("AllReduce(host memory) fails", r == OK ? OK : ARG, ARG, nullptr, m);
  }

  // Result strings: every code has one, distinct; unknown codes too.
  bool distinct = true;
  for (int a = 0; a < 8; ++a)
    for (int b = a + 1; b < 8; ++b)
      distinct = distinct && strcmp(mscclppGetErrorString((mscclppResult_t)a), mscclppGetErrorString((mscclppResult_t)b));
  expect("GetErrorString distinct", distinct ? OK : ARG, OK, nullptr, mark());
  expect("GetErrorString(99)", mscclppGetErrorString((mscclppResult_t)99) ? OK : ARG, OK, nullptr, mark());
  mscclppDefaultLogHandler(nullptr);  // must not crash

  // Destroy, then use after destroy, from both ranks.
  CASE("CommDestroy(NULL)", mscclppCommDestroy(nullptr), ARG, "comm");
  std::thread t2([&] { mscclppCommDestroy(peer); });
  CASE("CommDestroy", mscclppCommDestroy(comm), OK, nullptr);
  t2.join();
  CASE("CommRank after destroy", mscclppCommRank(comm, &value), USAGE, "not a live communicator");
  CASE("BootstrapBarrier after destroy", mscclppBootstrapBarrier(comm), USAGE, "not a live communicator");
  CASE("CommDestroy twice", mscclppCommDestroy(comm), USAGE, "not a live communicator");
  CASE("CommGetAsyncError after destroy", mscclppCommGetAsyncError(comm, &asyncErr), USAGE,
       "not a live communicator");
  CASE("CommAbort after destroy", mscclppCommAbort(comm), USAGE, "not a live communicator");
  CASE("CommRegister after destroy", mscclppCommRegister(comm, fake, 8, &handle), USAGE, "not a live communicator");
  CASE("CommDeregister after destroy", mscclppCommDeregister(comm, fake), USAGE, "not a live communicator");
  CASE("AllReduce after destroy", mscclppAllReduce(dev, dev, 4, mscclppFloat32, mscclppSum, comm, nullptr), USAGE,
       "not a live communicator");
  CASE("SetLogHandler(NULL) restores default", mscclppSetLogHandler(nullptr), OK, nullptr);

  printf("bad input: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
