// A careless user's low-latency buffers and comms (docs/API.md, "Low-latency dispatch and
// combine"; fusco.h: distinct comms may be used concurrently from different threads): buffers
// destroyed in a different order on each rank are refused before a peer writes freed memory, and
// a comm making buffers or capacity plans never holds back another comm's all-to-alls.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness/ll_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

// Rank 0 destroys A then B, rank 1 B then A (a garbage collector finalizing in another order on
// each rank). Both first destroys fail naming both buffers and break the comm, so rank 1's later
// dispatch on its A writes nothing into rank 0's memory, which rank 0 has taken back for another
// buffer.
TEST(LowLatencyDestroy, BuffersDestroyedInDifferentOrdersFailBothRanksAndWriteNothing) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 10000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const fusco::test::LlCase c = fusco::test::llSmallCase(2);
    fuscoLowLatency_t a = fusco::test::llCreate(comm, c);
    fuscoLowLatency_t b = fusco::test::llCreate(comm, c);
    ASSERT_TRUE(a != nullptr && b != nullptr);
    const fuscoResult_t r = fuscoLowLatencyDestroy(ctx.rank == 0 ? a : b);
    const std::string why = fuscoGetLastError(comm);
    EXPECT_EQ(r, fuscoInvalidUsage) << why;
    EXPECT_NE(why.find("buffer #1"), std::string::npos) << why;
    EXPECT_NE(why.find("buffer #2"), std::string::npos) << why;
    EXPECT_TRUE(fusco::test::namesRank(why, 1 - ctx.rank)) << why;
    if (ctx.rank == 0) {
      // A's memory, taken back by the comm, may come back here: it must stay as written.
      std::vector<void*> bufs(4, nullptr);
      for (void*& p : bufs)
        if (fuscoMemAlloc(comm, &p, 1 << 16) == fuscoSuccess) std::memset(p, 0xA5, 1 << 16);
      usleep(600 * 1000);  // rank 1's dispatch on A comes meanwhile
      for (void* p : bufs) {
        if (p == nullptr) continue;
        const auto* q = static_cast<const uint8_t*>(p);
        for (size_t i = 0; i < (1u << 16); ++i)
          if (q[i] != 0xA5) {
            ADD_FAILURE() << "byte " << i << " of memory rank 0 reused was written by a peer";
            break;
          }
        fuscoMemFree(comm, p);
      }
    } else {
      usleep(200 * 1000);
      const fusco::test::LlInputs in = fusco::test::makeLlInputs(c, 11);
      fuscoLowLatencyDispatch_t d;
      const fuscoResult_t dr = fusco::test::llDispatchCall(a, in, 1, FUSCO_LL_BF16, 0, &d);
      EXPECT_NE(dr, fuscoSuccess) << "a dispatch on a comm whose destroys disagreed";
    }
    char mine = 1, all[2];
    EXPECT_NE(fuscoCommHostAllGather(comm, &mine, all, 1), fuscoSuccess) << "the comm is broken";
    fuscoLowLatencyDestroy(ctx.rank == 0 ? b : a);
    EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
  });
}

// A second comm for ctx's ranks, from a unique id rank 0 makes and gives out over comm.
fuscoComm_t secondComm(const RankCtx& ctx, fuscoComm_t comm) {
  fuscoUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (ctx.rank == 0) {
    EXPECT_EQ(fuscoGetUniqueId(&id), fuscoSuccess);
  }
  std::vector<fuscoUniqueId> ids(ctx.nranks);
  EXPECT_EQ(fuscoCommHostAllGather(comm, &id, ids.data(), sizeof(id)), fuscoSuccess)
      << fuscoGetLastError(comm);
  fuscoComm_t second = nullptr;
  EXPECT_EQ(fuscoCommInitRank(&second, ctx.nranks, ids[0], ctx.rank), fuscoSuccess)
      << fuscoGetLastError(nullptr);
  return second;
}

// All-to-alls on comm, each checked byte for byte.
void allToAlls(const RankCtx& ctx, fuscoComm_t comm, int calls) {
  const size_t block = 4096;
  std::vector<uint8_t> send(block * ctx.nranks), recv(block * ctx.nranks);
  for (int k = 0; k < calls; ++k) {
    for (size_t i = 0; i < send.size(); ++i)
      send[i] = static_cast<uint8_t>(ctx.rank * 31 + (i / block) * 7 + i + k);
    std::memset(recv.data(), 0xA5, recv.size());
    const fuscoResult_t r =
        fuscoAllToAll(send.data(), recv.data(), block, fuscoUint8, comm, nullptr);
    if (r != fuscoSuccess) {
      ADD_FAILURE() << "all-to-all " << k << ": " << fuscoGetLastError(comm);
      return;
    }
    for (size_t i = 0; i < recv.size(); ++i) {
      const size_t src = i / block;
      const auto want =
          static_cast<uint8_t>(src * 31 + ctx.rank * 7 + (ctx.rank * block + i % block) + k);
      if (recv[i] != want) {
        ADD_FAILURE() << "all-to-all " << k << ": byte " << i << " from rank " << src;
        return;
      }
    }
  }
}

// Low-latency buffers made and destroyed, and capacity plans, on comm.
void setupCalls(const RankCtx& ctx, fuscoComm_t comm, int rounds) {
  const fusco::test::LlCase c = fusco::test::llSmallCase(ctx.nranks);
  fuscoMoeConfig_t mc = FUSCO_MOE_CONFIG_INITIALIZER;
  mc.numExperts = 2 * ctx.nranks;
  std::vector<int64_t> topk(64);
  for (size_t t = 0; t < topk.size(); ++t) topk[t] = static_cast<int64_t>((t + ctx.rank) % 4);
  for (int k = 0; k < rounds; ++k) {
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    if (ll == nullptr) return;
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    fuscoMoeHandle_t h = nullptr;
    FUSCO_ASSERT_OK(
        comm, fuscoMoePlanCapacity(&h, comm, &mc, topk.data(), 32, 2, size_t{1024} << k, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
}

// Thread A runs all-to-alls on comm A while thread B makes low-latency buffers and capacity plans
// on comm B (the enqueue-only engine, as CUDA comms run). Neither waits for the other's peers.
TEST(TwoComms, BuffersAndCapacityPlansOnOneCommHoldNothingBackOnAnother) {
  MpOptions opt;
  opt.env = {{"FUSCO_ASYNC_HOST", "1"}, {"FUSCO_TIMEOUT_MS", "4000"}};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 4000);
        fuscoComm_t a = initComm(ctx, &cfg);
        fuscoComm_t b = secondComm(ctx, a);
        ASSERT_NE(b, nullptr);
        const double t0 = nowSec();
        std::thread ta([&] { allToAlls(ctx, a, 300); });
        std::thread tb([&] { setupCalls(ctx, b, 6); });
        ta.join();
        tb.join();
        EXPECT_LT(nowSec() - t0, 20.0);
        FUSCO_EXPECT_OK(b, fuscoCommDestroy(b));
        FUSCO_EXPECT_OK(a, fuscoCommDestroy(a));
      },
      opt);
}

}  // namespace
