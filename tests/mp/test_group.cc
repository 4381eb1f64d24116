// Point-to-point: fuscoSend/fuscoRecv inside fuscoGroupStart/End (collected and run together,
// matched per peer in call order) and on their own outside a group.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::RankCtx;
using fusco::test::runRanks;

fuscoConfig_t testConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 60000;
  return cfg;
}

// Message k from src to dst uses its own payload stream, so a message matched to the wrong
// receive shows up as data from the wrong message.
uint64_t msgSeed(uint64_t seed, int k) { return seed + 1000003ull * static_cast<uint64_t>(k); }

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

class GroupRing : public ::testing::TestWithParam<int> {};

TEST_P(GroupRing, EachRankSendsToNextAndReceivesFromPrevious) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = ctx.nranks, next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
    for (size_t count : {size_t{1}, size_t{4099}, size_t{300000}}) {
      std::vector<uint8_t> send(count * 4), recv(count * 4);
      fusco::test::fillPayload(send.data(), seed, ctx.rank, next, 0, send.size());
      fusco::test::poison(recv.data(), recv.size());
      FUSCO_ASSERT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(send.data(), count, fuscoFloat32, next, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoRecv(recv.data(), count, fuscoFloat32, prev, comm, nullptr));
      FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
      EXPECT_TRUE(fusco::test::payloadMatches(recv.data(), 4, count, seed, prev, ctx.rank, 0, n,
                                              "ring recv, count " + std::to_string(count)));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GroupRing, ::testing::Values(1, 2, 3, 5), ranksName);

class GroupAllPairs : public ::testing::TestWithParam<int> {};

// Every rank sends to and receives from every rank (itself included) with uneven counts, some 0.
TEST_P(GroupAllPairs, UnevenCountsToEveryPeerAreBitExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = ctx.nranks;
    auto counts = fusco::test::randomCountMatrix(seed, n, 20000, 20);
    std::vector<std::vector<uint8_t>> send(n), recv(n);
    FUSCO_ASSERT_OK(comm, fuscoGroupStart());
    for (int p = 0; p < n; ++p) {
      // Post in a rank-dependent order: matching is per peer, not global.
      int q = (p + ctx.rank) % n;
      size_t sc = counts[ctx.rank * n + q], rc = counts[q * n + ctx.rank];
      send[q].resize(sc * 2 + 1);
      recv[q].resize(rc * 2 + 1);
      fusco::test::fillPayload(send[q].data(), seed, ctx.rank, q, 0, sc * 2);
      fusco::test::poison(recv[q].data(), recv[q].size());
      FUSCO_EXPECT_OK(comm, fuscoRecv(recv[q].data(), rc, fuscoBfloat16, q, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoSend(send[q].data(), sc, fuscoBfloat16, q, comm, nullptr));
    }
    FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
    for (int p = 0; p < n; ++p) {
      size_t rc = counts[p * n + ctx.rank];
      EXPECT_TRUE(fusco::test::payloadMatches(recv[p].data(), 2, rc, seed, p, ctx.rank, 0, n,
                                              "recv from " + std::to_string(p)));
      EXPECT_TRUE(fusco::test::isPoisoned(recv[p].data() + rc * 2, 1, "byte past the message"));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GroupAllPairs, ::testing::Values(1, 2, 4, 8), ranksName);

// Several messages of different sizes to the same peer, matched in call order.
TEST(Group, SeveralSendsToOnePeerMatchInOrder) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = ctx.nranks;
    const size_t sizes[] = {100, 1, 70000, 0, 333};
    const int m = 5;
    const int to = (ctx.rank + 1) % n, from = (ctx.rank + n - 1) % n;
    std::vector<std::vector<uint8_t>> send(m), recv(m);
    FUSCO_ASSERT_OK(comm, fuscoGroupStart());
    for (int k = 0; k < m; ++k) {
      send[k].resize(sizes[k] * 4 + 1);
      recv[k].resize(sizes[k] * 4 + 1);
      fusco::test::fillPayload(send[k].data(), msgSeed(seed, k), ctx.rank, to, 0, sizes[k] * 4);
      fusco::test::poison(recv[k].data(), recv[k].size());
      FUSCO_EXPECT_OK(comm, fuscoSend(send[k].data(), sizes[k], fuscoInt32, to, comm, nullptr));
    }
    for (int k = 0; k < m; ++k)
      FUSCO_EXPECT_OK(comm, fuscoRecv(recv[k].data(), sizes[k], fuscoInt32, from, comm, nullptr));
    FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
    for (int k = 0; k < m; ++k) {
      EXPECT_TRUE(fusco::test::payloadMatches(recv[k].data(), 4, sizes[k], msgSeed(seed, k), from,
                                              ctx.rank, 0, n, "message " + std::to_string(k)));
      EXPECT_TRUE(fusco::test::isPoisoned(recv[k].data() + sizes[k] * 4, 1, "past message"));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Group, RankSendsToItself) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t count = 12345;
    std::vector<uint8_t> send(count * 8), recv(count * 8);
    // Two messages to itself, plus nothing to anyone else.
    for (int k = 0; k < 2; ++k) {
      fusco::test::fillPayload(send.data(), msgSeed(seed, k), ctx.rank, ctx.rank, 0, send.size());
      fusco::test::poison(recv.data(), recv.size());
      FUSCO_ASSERT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(send.data(), count, fuscoFloat64, ctx.rank, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoRecv(recv.data(), count, fuscoFloat64, ctx.rank, comm, nullptr));
      FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
      EXPECT_TRUE(fusco::test::payloadMatches(recv.data(), 8, count, msgSeed(seed, k), ctx.rank,
                                              ctx.rank, 0, ctx.nranks, "self message"));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Group, EmptyGroupSucceeds) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    FUSCO_EXPECT_OK(comm, fuscoGroupStart());
    FUSCO_EXPECT_OK(comm, fuscoGroupEnd());
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Groups and all-to-alls interleave on one comm without mixing their traffic.
TEST(Group, GroupsAndAllToAllInterleave) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = ctx.nranks, next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
    for (int it = 0; it < 10; ++it) {
      const size_t count = 500 + 97 * it;
      std::vector<uint8_t> send(count), recv(count);
      fusco::test::fillPayload(send.data(), msgSeed(seed, it), ctx.rank, next, 0, count);
      fusco::test::poison(recv.data(), count);
      FUSCO_ASSERT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(send.data(), count, fuscoUint8, next, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoRecv(recv.data(), count, fuscoUint8, prev, comm, nullptr));
      FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
      EXPECT_TRUE(fusco::test::payloadMatches(recv.data(), 1, count, msgSeed(seed, it), prev,
                                              ctx.rank, 0, n, "ring"));
      auto counts = fusco::test::randomCountMatrix(seed + it, n, 1000, 20);
      auto l = fusco::test::makeA2avLayout(counts, n, ctx.rank, 4, seed + it, true);
      EXPECT_TRUE(fusco::test::allToAllvRoundTrip(comm, l, fuscoInt32, seed + it));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

class PointToPoint : public ::testing::TestWithParam<int> {};

// Outside a group each call runs on its own. Pairs (0,1), (2,3), ...: the even rank sends first and
// the odd one receives first, so blocking calls cannot deadlock; then they swap roles.
TEST_P(PointToPoint, PairwiseSendRecvOutsideAGroup) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = ctx.nranks;
    const int partner = ctx.rank ^ 1;
    if (partner < n) {
      const bool even = ctx.rank % 2 == 0;
      for (size_t count : {size_t{3}, size_t{200000}}) {
        std::vector<uint8_t> send(count * 4), recv(count * 4);
        fusco::test::fillPayload(send.data(), seed + count, ctx.rank, partner, 0, send.size());
        fusco::test::poison(recv.data(), recv.size());
        for (int phase = 0; phase < 2; ++phase) {
          if ((phase == 0) == even) {
            FUSCO_EXPECT_OK(comm,
                            fuscoSend(send.data(), count, fuscoUint32, partner, comm, nullptr));
          } else {
            FUSCO_EXPECT_OK(comm,
                            fuscoRecv(recv.data(), count, fuscoUint32, partner, comm, nullptr));
          }
        }
        EXPECT_TRUE(fusco::test::payloadMatches(recv.data(), 4, count, seed + count, partner,
                                                ctx.rank, 0, n, "pairwise recv"));
      }
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, PointToPoint, ::testing::Values(2, 3, 4), ranksName);

}  // namespace
