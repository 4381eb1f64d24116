// MoE dispatch (docs/API.md, "MoE dispatch and combine"): recvX, receive counts and dispatch stats
// against the sequential reference; case generation and checkers live in harness/moe_cases.h,
// which also documents the stats asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::Bytes2D;
using fusco::test::commConfig;
using fusco::test::dedupName;
using fusco::test::dispatchChecked;
using fusco::test::initComm;
using fusco::test::kAllModes;
using fusco::test::makeProblem;
using fusco::test::makeRows;
using fusco::test::MoeCase;
using fusco::test::MoeRefDispatch;
using fusco::test::MoeRefProblem;
using fusco::test::planChecked;
using fusco::test::RankCtx;
using fusco::test::Route;
using fusco::test::runDispatchCase;
using fusco::test::runRanks;

std::vector<size_t> unevenTokens(int n, size_t base) {
  std::vector<size_t> t(n);
  for (int r = 0; r < n; ++r) t[r] = base + 17 * r;
  if (n > 1) t[1] = 0;
  if (n > 2) t[2] = 1;
  return t;
}

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

class MoeDispatchRanks : public ::testing::TestWithParam<int> {};

TEST_P(MoeDispatchRanks, UnevenTokensMatchReferenceInEveryDedupMode) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = ctx.nranks;
    c.numExperts = 4 * ctx.nranks;
    c.topk = std::min(4, c.numExperts);
    c.numTokens = unevenTokens(ctx.nranks, 23);
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 36, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeDispatchRanks, ::testing::Values(1, 2, 3, 4, 5, 8), ranksName);

TEST(MoeDispatch, ZeroTokensOnEveryRankGivesNoRows) {
  runRanks(3, [](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 6;
    c.numTokens = {0, 0, 0};
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, 5, 64, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, TopkOneToEightWithUnusedSlotsMatchesReference) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 24;
    c.numTokens = {40, 7, 31};
    c.unusedPercent = 30;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int k = 1; k <= 8; ++k) {
      c.topk = k;
      runDispatchCase(comm, ctx, c, seed + k, 20, {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK});
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, RowBytesNotAMultipleOf16AreCopiedVerbatim) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 2;
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens = {19, 12};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (size_t rb : {size_t{1}, size_t{36}, size_t{7168 * 2 + 4}})
      runDispatchCase(comm, ctx, c, seed + rb, rb, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, EveryTokenToOneExpertLeavesOtherExpertsEmpty) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens = {30, 0, 1, 45};
    c.route = Route::OneExpert;
    c.fixedExpert = 5;  // rank 2's second expert
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 40, kAllModes);
    c.align = 16;
    runDispatchCase(comm, ctx, c, seed, 40, {FUSCO_DEDUP_RANK});
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, ExpertsThatReceiveNothingGetEmptyBlocks) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 12;
    c.topk = 4;
    c.numTokens = {25, 33, 9};
    c.route = Route::SomeExpertsIdle;
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 24, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, ExplicitPlacementWithExpertsNotAMultipleOfRanks) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 10;
    c.topk = 4;
    c.numTokens = {28, 1, 36};
    c.placement = {2, 0, 1, 1, 2, 0, 2, 2, 1, 0};  // interleaved, uneven: 3, 3, 4 experts
    c.align = 1;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 33, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, ExpertAlignmentPadsEachBlockWithZeroRows) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 9;
    c.topk = 3;
    c.numTokens = {21, 5, 14};
    c.unusedPercent = 25;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int align : {0, 1, 4, 16}) {
      c.align = align;
      runDispatchCase(comm, ctx, c, seed + align, 13, kAllModes);
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, EightRanksWithPlacementAndAlignment) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(8, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 8;
    c.numExperts = 20;  // not a multiple of 8
    c.topk = 6;
    c.numTokens = {12, 0, 1, 30, 7, 19, 0, 25};
    for (int e = 0; e < c.numExperts; ++e) c.placement.push_back((e * 5 + 3) % 8);
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 50, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, LargeBf16HiddenTopEightMatchesReference) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 64;
    c.topk = 8;
    c.numTokens = {512, 512, 512, 512};
    c.unusedPercent = 5;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 7168 * 2, {FUSCO_DEDUP_RANK});
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// ---------------------------------------------------------------- stats

TEST(MoeStats, TokenToTwoExpertsOnOneRankCrossesOnceWithRankDedup) {
  runRanks(2, [](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 2;
    c.numExperts = 4;  // experts 2, 3 on rank 1
    c.topk = 2;
    c.numTokens = {3, 0};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeRefProblem p = makeProblem(c, 1);
    p.topkIdx[0] = {2, 3, 3, 2, 0, 3};  // rows to rank 1: RANK 3, NONE 5
    Bytes2D x = makeRows(p, 9, 16);
    MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, 16);
    for (int dedup : {FUSCO_DEDUP_RANK, FUSCO_DEDUP_NONE}) {
      fuscoMoeHandle_t h = planChecked(comm, ctx, c, p, d, dedup, dedupName(dedup));
      if (!h) continue;
      dispatchChecked(comm, h, ctx, p, d, x, 16, dedup, dedupName(dedup));
      fuscoMoeStats_t st{};
      st.size = sizeof st;
      FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
      if (ctx.rank == 0) {
        EXPECT_EQ(st.dispatchRowsIntraNode, dedup == FUSCO_DEDUP_RANK ? 3u : 5u);
      }
      EXPECT_EQ(st.dispatchRowsInterNode, 0u);
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeStats, VirtualNodesSplitRowsBetweenIntraAndInterNode) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 16;
    c.topk = 5;
    c.numTokens = {33, 20, 0, 41};
    c.localSize = 2;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    int node = -1, numNodes = -1, lr = -1, ls = -1;
    FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &lr, &ls));
    EXPECT_EQ(numNodes, 2);
    EXPECT_EQ(node, ctx.rank / 2);
    runDispatchCase(comm, ctx, c, seed, 72, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeStats, WrongStatsSizeOrNullIsInvalidArgument) {
  runRanks(2, [](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 2;
    c.numTokens = {4, 4};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeRefProblem p = makeProblem(c, 3);
    Bytes2D x = makeRows(p, 4, 8);
    MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, 8);
    fuscoMoeHandle_t h = planChecked(comm, ctx, c, p, d, FUSCO_DEDUP_RANK, "stats");
    ASSERT_NE(h, nullptr);
    fuscoMoeStats_t st;
    std::memset(&st, 0x33, sizeof st);
    st.size = sizeof st - 8;
    EXPECT_EQ(fuscoMoeGetStats(h, &st), fuscoInvalidArgument);
    EXPECT_EQ(st.dispatchRowsIntraNode, 0x3333333333333333ull) << "written on failure";
    EXPECT_EQ(fuscoMoeGetStats(h, nullptr), fuscoInvalidArgument);
    EXPECT_EQ(fuscoMoeGetStats(nullptr, &st), fuscoInvalidArgument);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
