// Calls a careless user makes (docs/API.md, "Low-latency dispatch and combine", "Capacity mode",
// docs/DESIGN.md, "The progress thread"): low-latency create on a comm whose peer died, destroy
// when a peer never comes, create and destroy in different orders; a knob set out of range; a
// capacity plan with a huge recvCapacity; and an enqueue-only all-to-all that moves for longer
// than the timeout but never stops moving.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/ll_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

// The comm's timeout is a minute: a create that waited for the dead peer would take it.
TEST(LowLatencyCreate, AfterAPeerDiedFailsAtOnceNamingTheBrokenComm) {
  MpOptions opt;
  opt.mayDie = {1};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 60000);
        fuscoComm_t comm = initComm(ctx, &cfg);
        if (ctx.rank == 1) raise(SIGKILL);
        usleep(300 * 1000);
        const fusco::test::LlCase c = fusco::test::llSmallCase(2);
        const fuscoLowLatencyConfig_t lc = fusco::test::llConfig(c);
        fuscoLowLatency_t ll = nullptr;
        const double t0 = nowSec();
        const fuscoResult_t r = fuscoLowLatencyCreate(&ll, comm, &lc);
        EXPECT_EQ(r, fuscoRemoteError) << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
        EXPECT_LT(nowSec() - t0, 5.0) << "create waited for the dead peer";
        EXPECT_TRUE(fusco::test::namesRank(fuscoGetLastError(comm), 1)) << fuscoGetLastError(comm);
        EXPECT_EQ(ll, nullptr);
        EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
      },
      opt);
}

// Rank 1 makes no destroy call within rank 0's timeout: rank 0's destroy fails and breaks the
// comm, so a later create fails at once instead of succeeding on an unusable comm.
TEST(LowLatencyDestroy, APeerThatNeverComesFailsTheDestroyAndBreaksTheComm) {
  MpOptions opt;
  opt.env = {{"FUSCO_TIMEOUT_MS", "1000"}};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 1000);
        fuscoComm_t comm = initComm(ctx, &cfg);
        const fusco::test::LlCase c = fusco::test::llSmallCase(2);
        fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
        ASSERT_NE(ll, nullptr);
        if (ctx.rank == 1) {
          usleep(3000 * 1000);  // past rank 0's timeout; then it leaves without a destroy
          return;
        }
        EXPECT_NE(fuscoLowLatencyDestroy(ll), fuscoSuccess) << "destroy without the peer";
        const fuscoLowLatencyConfig_t lc = fusco::test::llConfig(c);
        fuscoLowLatency_t again = nullptr;
        const double t0 = nowSec();
        const fuscoResult_t r = fuscoLowLatencyCreate(&again, comm, &lc);
        EXPECT_NE(r, fuscoSuccess) << "create on a broken comm";
        EXPECT_LT(nowSec() - t0, 0.9) << "create waited instead of failing at once";
        EXPECT_NE(std::string(fuscoGetLastError(comm)).find("cannot be used"), std::string::npos)
            << fuscoGetLastError(comm);
        fuscoCommDestroy(comm);
      },
      opt);
}

TEST(LowLatencyCreate, CreateAgainstADestroyNamesBothCalls) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 10000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const fusco::test::LlCase c = fusco::test::llSmallCase(2);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    fuscoResult_t r;
    if (ctx.rank == 0) {
      r = fuscoLowLatencyDestroy(ll);
    } else {
      const fuscoLowLatencyConfig_t lc = fusco::test::llConfig(c);
      fuscoLowLatency_t other = nullptr;
      r = fuscoLowLatencyCreate(&other, comm, &lc);
    }
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetErrorString(r) << ": " << msg;
    EXPECT_EQ(msg.find("malformed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fuscoLowLatencyCreate"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fuscoLowLatencyDestroy"), std::string::npos) << msg;
    fuscoCommDestroy(comm);
  });
}

// FUSCO_CHUNK_BYTES=1G lies outside the slices the transports take: warned about and replaced by
// the default, as fusco_info shows, and every init works.
TEST(KnobsOutOfRange, ChunkBytesOutOfRangeFallsBackToTheDefault) {
  MpOptions opt;
  opt.env = {{"FUSCO_CHUNK_BYTES", "1G"}};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoComm_t comm = initComm(ctx);
        ASSERT_NE(comm, nullptr);
        std::vector<int32_t> send(2 * 1000), recv(2 * 1000, -1);
        for (size_t i = 0; i < send.size(); ++i) send[i] = ctx.rank * 100000 + static_cast<int>(i);
        FUSCO_ASSERT_OK(comm,
                        fuscoAllToAll(send.data(), recv.data(), 1000, fuscoInt32, comm, nullptr));
        for (int p = 0; p < 2; ++p) EXPECT_EQ(recv[p * 1000 + 7], p * 100000 + ctx.rank * 1000 + 7);
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

// The all-to-all's timeout (as a user reported it): the 192 MiB each rank moves, 4 ranks on two
// cores, take about that long.
constexpr const char* kAsyncTimeoutMs = "1000";

// What rank `rank` received from each peer in the sparse pattern of the test below.
void checkSparse(const std::vector<int32_t>& recv, size_t count, int rank, int n, int round) {
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i) {
      const size_t at = rank * count + i;
      const int32_t want = at % 4099 == 0 ? static_cast<int32_t>(p * 7919 + round * 31 + at) : 0;
      if (recv[p * count + i] != want) {
        ADD_FAILURE() << "round " << round << ": element " << i << " from rank " << p << " is "
                      << recv[p * count + i] << ", expected " << want;
        return;
      }
    }
}

// Pages this process holds, in bytes (resident set).
size_t residentBytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// The receive lists of a capacity plan are sized for recvCapacity rows but cost what arrives:
// 60 tokens with the documented maximum 2^32 - 1 (51.5 GB of lists) plan in little memory. The
// enqueue-only engine (FUSCO_ASYNC_HOST, the CUDA path's protocol) also reserves staging of the
// lists' size in the shared arena before its first wait: 2^24 rows there.
TEST(MoeCapacity, HugeRecvCapacityCostsWhatArrives) {
  const char* twin = getenv("FUSCO_ASYNC_HOST");
  const size_t capacity = twin != nullptr && twin[0] == '1' ? size_t{1} << 24 : size_t{UINT32_MAX};
  runRanks(2, [capacity](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    fuscoMoeConfig_t mc = FUSCO_MOE_CONFIG_INITIALIZER;
    mc.numExperts = 4;
    const size_t tokens = 60;
    std::vector<int64_t> topk(tokens * 2);
    for (size_t t = 0; t < tokens; ++t) {
      topk[2 * t] = static_cast<int64_t>(t % 4);
      topk[2 * t + 1] = static_cast<int64_t>((t + 1) % 4);
    }
    const size_t before = residentBytes();
    const double t0 = nowSec();
    fuscoMoeHandle_t h = nullptr;
    FUSCO_ASSERT_OK(comm,
                    fuscoMoePlanCapacity(&h, comm, &mc, topk.data(), tokens, 2, capacity, nullptr));
    size_t rows = 0;
    FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &rows, nullptr));
    EXPECT_EQ(rows, tokens * 2) << "every slot lands once (2 of 4 experts per rank)";
    EXPECT_LT(residentBytes() - before, size_t{256} << 20) << "the plan's memory grew with the "
                                                              "capacity";
    EXPECT_LT(nowSec() - t0, 10.0);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// The enqueue-only engine on its host twin, with a timeout well below how long the transfer
// takes (64 MiB to each of 3 peers, the ranks entering together): every rank's stream keeps
// moving (its beat rises with each copy task), so no wait may be declared stuck, and the bytes
// are exact.
TEST(AsyncProgress, ATransferLongerThanTheTimeoutThatKeepsMovingIsNotAHang) {
  // The ranks meet at a barrier of their own before each call, so filling their buffers (which the
  // library cannot see) makes no rank late for the call: what the timeout meets is the transfer.
  auto* bar = static_cast<pthread_barrier_t*>(mmap(nullptr, sizeof(pthread_barrier_t),
                                                   PROT_READ | PROT_WRITE,
                                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(bar, MAP_FAILED);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(bar, &attr, 4);
  MpOptions opt;
  opt.env = {{"FUSCO_ASYNC_HOST", "1"}, {"FUSCO_TIMEOUT_MS", kAsyncTimeoutMs}};
  opt.timeoutSec = 120;
  const int n = 4;
  runRanks(
      n,
      [bar](const RankCtx& ctx) {
        fuscoComm_t comm = initComm(ctx);
        const size_t count = size_t{16} << 20;  // int32 elements per peer: 64 MiB
        std::vector<int32_t> send(count * n), recv(count * n);
        for (int round = 0; round < 3; ++round) {
          for (size_t i = 0; i < send.size(); i += 4099)
            send[i] = static_cast<int32_t>(ctx.rank * 7919 + round * 31 + i);
          std::memset(recv.data(), 0xA5, recv.size() * sizeof(int32_t));
          pthread_barrier_wait(bar);  // every rank enters the large call together
          FUSCO_ASSERT_OK(
              comm, fuscoAllToAll(send.data(), recv.data(), count, fuscoInt32, comm, nullptr));
          checkSparse(recv, count, ctx.rank, n, round);
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
  pthread_barrier_destroy(bar);
  munmap(bar, sizeof(pthread_barrier_t));
}

}  // namespace
