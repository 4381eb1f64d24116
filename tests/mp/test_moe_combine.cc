// MoE combine (docs/API.md, "MoE dispatch and combine"): `out` bit-exact against the reference's
// fixed reduction tree in every dedup mode and combine type, plus combine stats; the setup and
// checkers live in harness/moe_cases.h.
#include <gtest/gtest.h>

#include <string>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::combineAllModes;
using fusco::test::commConfig;
using fusco::test::initComm;
using fusco::test::makeCombine;
using fusco::test::MoeCase;
using fusco::test::RankCtx;
using fusco::test::runRanks;

class MoeCombineTypes : public ::testing::TestWithParam<fuscoDataType_t> {};

TEST_P(MoeCombineTypes, OutMatchesReferenceTreeInEveryDedupMode) {
  const uint64_t seed = fusco::test::testSeed();
  const fuscoDataType_t dt = GetParam();
  runRanks(3, [seed, dt](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 12;
    c.topk = 6;
    c.numTokens = {37, 1, 22};
    c.unusedPercent = 20;
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    combineAllModes(comm, ctx, makeCombine(c, seed, dt, 67));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeCombineTypes,
                         ::testing::Values(fuscoFloat32, fuscoBfloat16, fuscoFloat16),
                         [](const ::testing::TestParamInfo<fuscoDataType_t>& i) {
                           return std::string(fusco::test::dtypeName(i.param));
                         });

TEST(MoeCombine, ZeroTokensOnSomeRanksAndExplicitPlacement) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 7;
    c.topk = 3;
    c.numTokens = {0, 26, 1, 18};
    c.placement = {3, 3, 1, 0, 2, 1, 0};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    combineAllModes(comm, ctx, makeCombine(c, seed, fuscoBfloat16, 40));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeCombine, VirtualNodesFollowTheNodeLevelOfTheTree) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(5, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 5;
    c.numExperts = 15;
    c.topk = 8;
    c.numTokens = {24, 11, 0, 30, 9};
    c.localSize = 2;  // nodes {0,1} {2,3} {4}
    c.unusedPercent = 10;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (fuscoDataType_t dt : {fuscoBfloat16, fuscoFloat16})
      combineAllModes(comm, ctx, makeCombine(c, seed + dt, dt, 48));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
