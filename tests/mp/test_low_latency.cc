// Low-latency dispatch on host communicators (docs/API.md, "Low-latency dispatch and combine"),
// where the calls run the kernels' steps on the calling thread. Every rank regenerates every
// rank's seeded bf16 rows and routing, and checks its receive slots (counts, per-source layout,
// source tokens, row bytes, FP8 bytes and scales) and the combine `out` that follows each dispatch
// (poisoned, with a poisoned tail) bitwise against the sequential reference of
// harness/ll_reference.h, over 1 to 8 ranks, 0 to 128 tokens per rank, top-1 to top-8, repeated
// and idle experts. Combine against fuscoMoeCombine, the receive hook, both buffers in flight and
// call sequences: test_low_latency_combine.cc; bad input and faults: test_low_latency_errors.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/ll_cases.h"
#include "harness/ll_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::LlCase;
using fusco::test::LlInputs;
using fusco::test::LlRound;
using fusco::test::makeLlInputs;
using fusco::test::RankCtx;
using fusco::test::runRanks;

const std::vector<int> kTokenCounts = {0, 1, 8, 64, 128};

// Rank r passes kTokenCounts[(r + shift) % 5] tokens, so ranks differ within a call and over
// shift = 0..4 every rank passes every count.
std::vector<int> shiftedCounts(int n, int shift) {
  std::vector<int> t(n);
  for (int r = 0; r < n; ++r) t[r] = kTokenCounts[(r + shift) % kTokenCounts.size()];
  return t;
}

LlCase llCase(int n, int expertsPerRank, int topk, int hidden) {
  LlCase c;
  c.nranks = n;
  c.numExperts = expertsPerRank * n;
  c.topk = topk;
  c.hidden = hidden;
  c.numTokens.assign(n, 8);
  return c;
}

// Five checked rounds on one buffer (token counts shifted each time, formats as given), each with
// a new routing; the halves alternate.
void shiftedRounds(fuscoComm_t comm, const RankCtx& ctx, LlCase c, uint64_t seed, int format) {
  fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
  ASSERT_NE(ll, nullptr);
  for (int shift = 0; shift < 5; ++shift) {
    c.numTokens = shiftedCounts(c.nranks, shift);
    const LlInputs in = makeLlInputs(c, seed + shift);
    LlRound o;
    o.format = format;
    o.buffer = shift % 2;
    o.weighted = shift != 3;
    fusco::test::llRoundChecked(comm, ll, ctx, in, o, fusco::test::llCaseName(c, format));
  }
  FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
}

class LowLatencyDispatch : public ::testing::TestWithParam<int> {};

// BF16 rows verbatim, top-1, top-4 and top-8, 4 or 8 experts per rank, hidden sizes whose rows are
// not a multiple of 16 bytes.
TEST_P(LowLatencyDispatch, Bf16RowsArriveBySourceThenTokenThenSlot) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    shiftedRounds(comm, ctx, llCase(ctx.nranks, 4, 1, 67), seed, FUSCO_LL_BF16);
    shiftedRounds(comm, ctx, llCase(ctx.nranks, 8, 4, 132), seed + 10, FUSCO_LL_BF16);
    shiftedRounds(comm, ctx, llCase(ctx.nranks, 8, 8, 44), seed + 20, FUSCO_LL_BF16);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// FP8: e4m3 bytes and per-128-channel scales of the reference quantiser; combine from the
// dequantised rows.
TEST_P(LowLatencyDispatch, Fp8RowsAndScalesMatchTheReferenceQuantiser) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    shiftedRounds(comm, ctx, llCase(ctx.nranks, 4, 4, 256), seed, FUSCO_LL_FP8);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LowLatencyDispatch, ::testing::Values(1, 2, 3, 4),
                         fusco::test::ranksName);

TEST(LowLatencyDispatchShapes, EightRanksWithUnevenTokenCounts) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(8, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    LlCase c = llCase(8, 4, 8, 96);
    c.numTokens = {128, 0, 1, 8, 64, 17, 128, 3};
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    for (int round = 0; round < 2; ++round) {
      LlRound o;
      o.buffer = round;
      fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + round), o,
                                  fusco::test::llCaseName(c, FUSCO_LL_BF16));
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// A token that names one expert in several slots: the first slot moves its row, the later ones are
// refused (the rank's call fails naming the first such token and slot) and left out of the sum.
TEST(LowLatencyDispatchShapes, ExpertRepeatedInOneTokenMovesOnlyItsFirstSlot) {
  const uint64_t seed = fusco::test::testSeed();
  LlCase c = llCase(3, 4, 6, 128);
  c.numTokens = {64, 8, 1};
  c.repeatPercent = 40;
  const LlInputs in = makeLlInputs(c, seed);
  int repeats = 0;
  for (int t = 0; t < c.numTokens[0]; ++t) {
    std::vector<int64_t> ids(in.topkIdx[0].begin() + t * c.topk,
                             in.topkIdx[0].begin() + (t + 1) * c.topk);
    std::sort(ids.begin(), ids.end());
    for (int k = 1; k < c.topk; ++k) repeats += ids[k] >= 0 && ids[k] == ids[k - 1];
  }
  ASSERT_GT(repeats, 10) << "the routing should repeat experts within tokens";
  runRanks(3, [&in](const RankCtx& ctx) {
    fusco::test::llFormatRounds(
        ctx, [&in](int) { return in; }, "repeated experts");
  });
}

// Every third expert receives nothing: its count is 0 and every source's layout entry is empty.
TEST(LowLatencyDispatchShapes, IdleExpertsReceiveNothing) {
  const uint64_t seed = fusco::test::testSeed();
  LlCase c = llCase(4, 3, 2, 128);
  c.idleEvery = 3;
  c.numTokens = {64, 128, 8, 1};
  runRanks(4, [seed, &c](const RankCtx& ctx) {
    fusco::test::llFormatRounds(
        ctx, [&](int format) { return makeLlInputs(c, seed + format); }, "idle experts");
  });
}

// A DeepSeek-sized row (7168 channels, 56 FP8 groups) for a few tokens.
TEST(LowLatencyDispatchShapes, Fp8WithHidden7168) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    LlCase c = llCase(2, 4, 2, 7168);
    c.maxTokensPerRank = 4;
    c.maxTopk = 2;
    c.numTokens = {3, 1};
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    LlRound o;
    o.format = FUSCO_LL_FP8;
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed), o,
                                fusco::test::llCaseName(c, FUSCO_LL_FP8));
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
