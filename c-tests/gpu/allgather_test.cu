// The legacy all-gather test's two patterns (see allgather_kernels.cuh), checked word by word for whole
// buffers of 1 KiB to 1 GiB.
//
//   allgather_test 2           two ranks
//   allgather_test 2 --quick   1 KiB, 1 MiB and 16 MiB only
//
// Per size and kernel: two launches on fresh data (each checked), then three launches back to back on the
// same data (checked after the last), which also exercises epoch counters that persist across launches.
// From c-tests/harness/ (the Makefile adds it to the include path): shared with the benchmarks.
#include "allgather_kernels.cuh"
#include "mscclpp_rank.h"

using namespace tc;

namespace {

AllGather gA;
uint32_t gSalt = 0;
uint64_t gLaunches = 0; // all-gather launches so far (each adds one signal and one wait per connection with 2 ranks)

std::string launchCounted(Rank& R, int kernel, uint64_t total)
{
  TC_CUDA((allgatherLaunch<false>(R, kernel, total, R.stream)));
  ++gLaunches;
  return "";
}

std::string caseSize(Rank& R, int kernel, uint64_t total)
{
  std::string firstError;
  for (int launch = 1; launch <= 2; ++launch) {
    ++gSalt;
    TC_TRY(allgatherFill(R, gA, total, gSalt));
    TC_TRY(barrier(R, "before all-gather"));
    resetStatus(R);
    TC_TRY(launchCounted(R, kernel, total));
    TC_TRY(syncBounded(R, "all-gather kernel"));
    // A wrong word is recorded but the launches go on, so that all ranks keep making the same calls.
    std::string e = allgatherVerify(R, gA, total, gSalt, fmt("launch %d", launch));
    if (R.fatal) return e;
    if (firstError.empty()) firstError = e;
  }
  // Back to back on the data of the last launch: every launch re-sends the same chunks.
  TC_TRY(barrier(R, "before back-to-back launches"));
  resetStatus(R);
  for (int i = 0; i < 3; ++i) TC_TRY(launchCounted(R, kernel, total));
  TC_TRY(syncBounded(R, "back-to-back launches"));
  std::string e = allgatherVerify(R, gA, total, gSalt, "after 3 back-to-back launches");
  if (R.fatal) return e;
  if (firstError.empty()) firstError = e;
  TC_TRY(barrier(R, "after case"));
  if (!firstError.empty()) return firstError;
  // With 2 ranks both kernels make one signal and one wait per launch on the only connection.
  if (R.nranks == 2) {
    mscclppDevConn_t* all = nullptr;
    int n = -1;
    TC_MSCCLPP(mscclppGetAllDeviceConnections(R.comm, &all, &n));
    TC_EXPECT(n == 1 && all != nullptr, "mscclppGetAllDeviceConnections gave %d connections", n);
    uint64_t device = 0, proxy = 0, wait = 0;
    TC_TRY(readEpochs(R, all[0], &device, &proxy, &wait));
    TC_EXPECT(device == gLaunches && proxy == gLaunches && wait == gLaunches,
              "epochs device %llu proxy %llu wait %llu, expected %llu each after %llu launches",
              (unsigned long long)device, (unsigned long long)proxy, (unsigned long long)wait,
              (unsigned long long)gLaunches, (unsigned long long)gLaunches);
  }
  R.info = fmt("(%s in %d chunks of %s, 5 launches)", sizeName(total).c_str(), R.nranks,
               sizeName(chunkBytesFor(total, R.nranks)).c_str());
  return "";
}

bool gQuick = false;

int rankMain(Rank& R)
{
  if (!runCase(R, "init", [&] { return initRank(R); })) return 1;
  const uint64_t maxTotal = gQuick ? (16ull << 20) : (1ull << 30);
  if (!runCase(R, "allgather_setup", [&] { return allgatherSetup(R, gA, maxTotal + 64 * 1024); })) return 1;
  std::vector<uint64_t> sizes;
  if (gQuick) {
    sizes = {1ull << 10, 1ull << 20, 16ull << 20};
  } else {
    for (uint64_t s = 1ull << 10; s <= (1ull << 30); s *= 4) sizes.push_back(s);
  }
  for (int kernel = 0; kernel < 2; ++kernel) {
    for (uint64_t total : sizes) {
      runCase(R, fmt("allgather_kernel%d_%s", kernel, sizeName(total).c_str()), [&] { return caseSize(R, kernel, total); });
    }
  }
  bool ok = runCase(R, "teardown", [&] { return allgatherTeardown(R, gA); });
  freeRank(R);
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv)
{
  Options opt = parseArgs(argc, argv, 2);
  gQuick = opt.quick;
  return runRanks("allgather_test", opt, 100, rankMain);
}
