// Communicator life cycle across real rank processes: init/destroy, queries, node maps, two comms
// at once, memory allocation and registration, abort and the async error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::A2avLayout;
using fusco::test::initComm;
using fusco::test::MpOptions;
using fusco::test::RankCtx;
using fusco::test::runRanks;

fuscoConfig_t testConfig(int timeoutMs = 30000) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  return cfg;
}

class CommLifeCycle : public ::testing::TestWithParam<int> {};

TEST_P(CommLifeCycle, InitQueryDestroy) {
  const int n = GetParam();
  runRanks(n, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    int count = -1, rank = -1, node = -1, numNodes = -1, localRank = -1, localSize = -1;
    FUSCO_EXPECT_OK(comm, fuscoCommCount(comm, &count));
    FUSCO_EXPECT_OK(comm, fuscoCommUserRank(comm, &rank));
    FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &localRank, &localSize));
    EXPECT_EQ(count, ctx.nranks);
    EXPECT_EQ(rank, ctx.rank);
    // One host, no local size: one node holding every rank.
    EXPECT_EQ(node, 0);
    EXPECT_EQ(numNodes, 1);
    EXPECT_EQ(localRank, ctx.rank);
    EXPECT_EQ(localSize, ctx.nranks);
    fuscoResult_t async = fuscoInProgress;
    FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, fuscoSuccess) << "a healthy comm has no async error";
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommLifeCycle, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

TEST(CommInit, DefaultInitWithoutConfigWorks) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    int count = 0;
    FUSCO_EXPECT_OK(comm, fuscoCommCount(comm, &count));
    EXPECT_EQ(count, 3);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(CommInit, QueriesWithNullOutputAreInvalidArgument) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    int x = 0;
    EXPECT_EQ(fuscoCommCount(comm, nullptr), fuscoInvalidArgument);
    EXPECT_EQ(fuscoCommUserRank(comm, nullptr), fuscoInvalidArgument);
    EXPECT_EQ(fuscoCommNodeInfo(comm, nullptr, &x, &x, &x), fuscoInvalidArgument);
    EXPECT_EQ(fuscoCommGetAsyncError(comm, nullptr), fuscoInvalidArgument);
    EXPECT_STRNE(fuscoGetLastError(comm), "");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// The node map a rank reports for 6 ranks in virtual nodes of 4: {0..3}, {4, 5}.
void expectSixRanksInNodesOfFour(fuscoComm_t comm, int r) {
  int node = -1, numNodes = -1, localRank = -1, localSize = -1;
  FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &localRank, &localSize));
  EXPECT_EQ(node, r / 4);
  EXPECT_EQ(numNodes, 2);
  EXPECT_EQ(localRank, r % 4);
  EXPECT_EQ(localSize, r < 4 ? 4 : 2);
}

TEST(CommNodeInfo, ConfigLocalSizeMakesVirtualNodesWithSmallerLastNode) {
  runRanks(6, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    cfg.localSize = 4;
    fuscoComm_t comm = initComm(ctx, &cfg);
    expectSixRanksInNodesOfFour(comm, ctx.rank);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(CommNodeInfo, EnvLocalSizeMakesVirtualNodes) {
  MpOptions opt;
  opt.env = {{"FUSCO_LOCAL_SIZE", "4"}};
  runRanks(
      6,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = testConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        expectSixRanksInNodesOfFour(comm, ctx.rank);
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

TEST(CommNodeInfo, ConfigLocalSizeWinsOverEnv) {
  MpOptions opt;
  opt.env = {{"FUSCO_LOCAL_SIZE", "1"}};
  runRanks(
      4,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = testConfig();
        cfg.localSize = 2;
        fuscoComm_t comm = initComm(ctx, &cfg);
        int node = -1, numNodes = -1, localRank = -1, localSize = -1;
        FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &localRank, &localSize));
        EXPECT_EQ(node, ctx.rank / 2);
        EXPECT_EQ(numNodes, 2);
        EXPECT_EQ(localRank, ctx.rank % 2);
        EXPECT_EQ(localSize, 2);
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

// Rank 0 makes a second id inside its process and hands it to the others through an all-to-all
// on the first comm; the second comm numbers the other ranks in reverse (the id's root must stay
// in the process that made the id). Both comms stay alive and are used alternately, so their
// traffic must not mix.
TEST(CommInit, TwoCommsAliveAtOnceDoNotMix) {
  runRanks(3, [](const RankCtx& ctx) {
    const int n = ctx.nranks;
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t a = initComm(ctx, &cfg);
    fuscoUniqueId id2;
    memset(&id2, 0, sizeof(id2));
    if (ctx.rank == 0) FUSCO_ASSERT_OK(nullptr, fuscoGetUniqueId(&id2));
    std::vector<fuscoUniqueId> out(n, id2), in(n);
    FUSCO_ASSERT_OK(
        a, fuscoAllToAll(out.data(), in.data(), sizeof(fuscoUniqueId), fuscoUint8, a, nullptr));
    const int r2 = (n - ctx.rank) % n;
    RankCtx ctx2{r2, n, in[0]};
    fuscoComm_t b = initComm(ctx2, &cfg);
    int rb = -1, ra = -1;
    FUSCO_EXPECT_OK(b, fuscoCommUserRank(b, &rb));
    FUSCO_EXPECT_OK(a, fuscoCommUserRank(a, &ra));
    EXPECT_EQ(ra, ctx.rank);
    EXPECT_EQ(rb, r2);
    const uint64_t seed = 4242;
    auto counts = fusco::test::randomCountMatrix(seed, n, 300, 10);
    A2avLayout la = fusco::test::makeA2avLayout(counts, n, ctx.rank, 4, seed, true);
    A2avLayout lb = fusco::test::makeA2avLayout(counts, n, r2, 4, seed + 1, true);
    for (int it = 0; it < 5; ++it) {
      EXPECT_TRUE(fusco::test::allToAllvRoundTrip(a, la, fuscoFloat32, seed + 10 * it));
      EXPECT_TRUE(fusco::test::allToAllvRoundTrip(b, lb, fuscoFloat32, seed + 10 * it + 5));
    }
    FUSCO_EXPECT_OK(b, fuscoCommDestroy(b));
    // The first comm still works after the second is gone.
    EXPECT_TRUE(fusco::test::allToAllvRoundTrip(a, la, fuscoFloat32, seed + 99));
    FUSCO_EXPECT_OK(a, fuscoCommDestroy(a));
  });
}

TEST(CommMemory, MemAllocGivesWritableMemoryAndFreesIt) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<void*> ptrs;
    const size_t sizes[] = {1, 64, 4096, 1 << 20, 3 * 1000 * 1000 + 7};
    for (int round = 0; round < 3; ++round) {
      for (size_t bytes : sizes) {
        void* p = nullptr;
        FUSCO_ASSERT_OK(comm, fuscoMemAlloc(comm, &p, bytes));
        ASSERT_NE(p, nullptr);
        fusco::test::fillPayload(p, 7, ctx.rank, round, 0, bytes);
        ptrs.push_back(p);
      }
      // Every live allocation keeps its own bytes (no overlap between allocations).
      for (size_t i = 0; i < ptrs.size(); ++i) {
        size_t bytes = sizes[i % 5];
        EXPECT_EQ(fusco::test::findPayloadMismatch(ptrs[i], 7, ctx.rank, static_cast<int>(i / 5), 0,
                                                   bytes),
                  SIZE_MAX)
            << "allocation " << i << " of " << bytes << " bytes was overwritten";
      }
      if (round < 2) continue;
      for (void* p : ptrs) FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, p));
      ptrs.clear();
    }
    void* p = nullptr;
    EXPECT_EQ(fuscoMemAlloc(comm, nullptr, 64), fuscoInvalidArgument);
    // Freed memory can be allocated again.
    FUSCO_EXPECT_OK(comm, fuscoMemAlloc(comm, &p, 1 << 20));
    if (p) FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, p));
    int onStack = 0;
    EXPECT_NE(fuscoMemFree(comm, &onStack), fuscoSuccess)
        << "freeing memory that fuscoMemAlloc did not return must fail";
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(CommMemory, RegisterAndDeregisterRoundTrip) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<uint8_t> heap(1 << 20, 1);
    void* h1 = nullptr;
    FUSCO_EXPECT_OK(comm, fuscoCommRegister(comm, heap.data(), heap.size(), &h1));
    EXPECT_NE(h1, nullptr);
    void* arena = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoMemAlloc(comm, &arena, 1 << 20));
    void* h2 = nullptr;
    // A buffer inside arena memory, not at its start.
    FUSCO_EXPECT_OK(comm, fuscoCommRegister(comm, static_cast<char*>(arena) + 4096, 65536, &h2));
    EXPECT_NE(h2, nullptr);
    EXPECT_EQ(fuscoCommRegister(comm, nullptr, 4096, &h2), fuscoInvalidArgument);
    EXPECT_EQ(fuscoCommRegister(comm, heap.data(), 4096, nullptr), fuscoInvalidArgument);
    if (h1) FUSCO_EXPECT_OK(comm, fuscoCommDeregister(comm, h1));
    if (h2) FUSCO_EXPECT_OK(comm, fuscoCommDeregister(comm, h2));
    FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, arena));
    // Registering again after deregistering works.
    void* h3 = nullptr;
    FUSCO_EXPECT_OK(comm, fuscoCommRegister(comm, heap.data(), heap.size(), &h3));
    if (h3) FUSCO_EXPECT_OK(comm, fuscoCommDeregister(comm, h3));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(CommAbort, AbortOnHealthyCommSucceedsOnEveryRank) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    FUSCO_EXPECT_OK(comm, fuscoCommAbort(comm));
  });
}

TEST(CommAbort, AbortAfterTrafficSucceeds) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    auto counts = fusco::test::uniformCountMatrix(2, 1000);
    auto l = fusco::test::makeA2avLayout(counts, 2, ctx.rank, 8, 5, false);
    EXPECT_TRUE(fusco::test::allToAllvRoundTrip(comm, l, fuscoInt64, 5));
    FUSCO_EXPECT_OK(comm, fuscoCommAbort(comm));
  });
}

// Destroy needs no peer: ranks destroy at different times without waiting for each other.
TEST(CommInit, DestroyIsNotCollective) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    if (ctx.rank == 2) usleep(300 * 1000);
    double t0 = fusco::test::nowSec();
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
    EXPECT_LT(fusco::test::nowSec() - t0, 5.0);
  });
}

}  // namespace
