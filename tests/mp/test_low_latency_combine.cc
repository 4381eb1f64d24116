// Low-latency combine, the receive hook and the two buffers on host communicators (docs/API.md,
// "Low-latency dispatch and combine"): `out` bitwise equal to the reference's fixed tree and to
// fuscoMoeCombine for the same routing, the same round twice giving the same bytes, calls completed
// by their hooks (a used or unknown hook refused), two dispatches and two combines in flight on
// both halves, and a sequence of calls with different routings, formats and top-k.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/ll_cases.h"
#include "harness/ll_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::kLlTailBytes;
using fusco::test::LlCase;
using fusco::test::LlInputs;
using fusco::test::LlRecv;
using fusco::test::LlRound;
using fusco::test::makeLlInputs;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr unsigned long long kUnknownHook = 12345;

LlCase combineCase(int n, int hidden) {
  LlCase c;
  c.nranks = n;
  c.numExperts = 4 * n;
  c.topk = 4;
  c.hidden = hidden;
  const std::vector<int> tokens = {37, 0, 64, 9};
  for (int r = 0; r < n; ++r) c.numTokens.push_back(tokens[r % tokens.size()]);
  return c;
}

// fuscoMoePlan (contiguous placement, RANK dedup, no padding), fuscoMoeDispatch and
// fuscoMoeCombine of this rank's rows and routing, with the expert outputs llExpertRow makes from
// the rows fuscoMoeDispatch delivered. Returns `out`.
std::vector<uint8_t> moeCombineOut(fuscoComm_t comm, const RankCtx& ctx, const LlInputs& in,
                                   bool weighted) {
  const LlCase& c = in.c;
  const int numLocal = fusco::test::llNumLocal(c), nTok = c.numTokens[ctx.rank];
  const size_t rowBytes = c.hidden * 2u;
  fuscoMoeConfig_t m = FUSCO_MOE_CONFIG_INITIALIZER;
  m.numExperts = c.numExperts;
  m.dedup = FUSCO_DEDUP_RANK;
  const auto& idx = in.topkIdx[ctx.rank];
  fuscoMoeHandle_t h = nullptr;
  FUSCO_EXPECT_OK(comm,
                  fuscoMoePlan(&h, comm, &m, nTok ? idx.data() : nullptr, nTok, c.topk, nullptr));
  if (h == nullptr) return {};
  size_t rows = 0;
  std::vector<int64_t> perExpert(numLocal);
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &rows, perExpert.data()));
  std::vector<uint8_t> recvX(rows * rowBytes), expertOut(rows * rowBytes);
  FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, nTok ? in.x[ctx.rank].data() : nullptr, rowBytes,
                                         rows ? recvX.data() : nullptr, nullptr));
  size_t row = 0;
  for (int e = 0; e < numLocal; ++e)
    for (int64_t i = 0; i < perExpert[e] && row < rows; ++i, ++row)
      fusco::test::llExpertRow(ctx.rank * numLocal + e, FUSCO_LL_BF16, c.hidden,
                               recvX.data() + row * rowBytes, nullptr,
                               expertOut.data() + row * rowBytes);
  std::vector<uint8_t> out(nTok * rowBytes + kLlTailBytes, fusco::test::kPoison);
  FUSCO_EXPECT_OK(comm,
                  fuscoMoeCombine(h, rows ? expertOut.data() : nullptr, fuscoBfloat16, c.hidden,
                                  weighted && nTok ? in.weights[ctx.rank].data() : nullptr,
                                  nTok ? out.data() : nullptr, nullptr));
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  out.resize(nTok * rowBytes);
  return out;
}

class LowLatencyCombine : public ::testing::TestWithParam<int> {};

// With weights and with NULL weights: the reference's tree, and the bytes of fuscoMoeCombine.
TEST_P(LowLatencyCombine, OutIsBitwiseWhatFuscoMoeCombineGives) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlInputs in = makeLlInputs(combineCase(ctx.nranks, 80), seed);
    const std::string what = fusco::test::llCaseName(in.c, FUSCO_LL_BF16);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, in.c);
    ASSERT_NE(ll, nullptr);
    LlRound o;
    for (bool weighted : {true, false}) {
      o.weighted = weighted;
      const std::vector<uint8_t> got = fusco::test::llRoundChecked(comm, ll, ctx, in, o, what);
      o.buffer ^= 1;
      const std::vector<uint8_t> moe = moeCombineOut(comm, ctx, in, weighted);
      EXPECT_TRUE(fusco::test::llOutMatches(
          moe, got, in.c.hidden,
          what + (weighted ? "" : " NULL weights") + ": low-latency out against fuscoMoeCombine"));
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LowLatencyCombine, ::testing::Values(1, 2, 3, 4),
                         fusco::test::ranksName);

// The same inputs on half 0 and then half 1 give the same bytes, BF16 and FP8.
TEST(LowLatencyCombineRepeat, SameRoundTwiceGivesTheSameBytes) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlInputs in = makeLlInputs(combineCase(3, 256), seed);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, in.c);
    ASSERT_NE(ll, nullptr);
    LlRound o;
    for (int format : {FUSCO_LL_BF16, FUSCO_LL_FP8}) {
      o.format = format;
      const std::string what = fusco::test::llCaseName(in.c, format);
      const auto first = fusco::test::llRoundChecked(comm, ll, ctx, in, o, what + " first");
      o.buffer ^= 1;
      const auto second = fusco::test::llRoundChecked(comm, ll, ctx, in, o, what + " second");
      o.buffer ^= 1;
      EXPECT_TRUE(fusco::test::llOutMatches(first, second, in.c.hidden, what + " run to run"));
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// A hook completes its call once; the same hook again, or one never given out, is refused.
void expectHookRefused(fuscoComm_t comm, fuscoLowLatency_t ll, unsigned long long used,
                       const std::string& what) {
  EXPECT_EQ(fuscoLowLatencyRecvHook(ll, used, nullptr), fuscoInvalidArgument)
      << what << ": a hook used twice: " << fuscoGetLastError(comm);
  ASSERT_NE(used, kUnknownHook);
  EXPECT_EQ(fuscoLowLatencyRecvHook(ll, kUnknownHook, nullptr), fuscoInvalidArgument)
      << what << ": an unknown hook: " << fuscoGetLastError(comm);
}

// Dispatch and combine with FUSCO_LL_RECV_HOOK: the outputs after the hooks are those of the calls
// without them; hooks cannot be reused; a call without hooks follows on the other half.
TEST(LowLatencyHook, HooksCompleteDispatchAndCombineOnce) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlInputs in = makeLlInputs(combineCase(3, 128), seed);
    const std::string what = fusco::test::llCaseName(in.c, FUSCO_LL_FP8) + " with hooks";
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, in.c);
    ASSERT_NE(ll, nullptr);
    LlRound o;
    o.format = FUSCO_LL_FP8;
    o.hook = true;
    fuscoLowLatencyDispatch_t d;
    LlRecv got;
    ASSERT_TRUE(fusco::test::llDispatchChecked(comm, ll, ctx, in, o, what, &d, &got));
    expectHookRefused(comm, ll, d.hook, what + " dispatch");
    const size_t bytes = static_cast<size_t>(in.c.numTokens[ctx.rank]) * in.c.hidden * 2;
    std::vector<uint8_t> out(bytes + 1, fusco::test::kPoison);
    unsigned long long hook = 0;
    FUSCO_ASSERT_OK(
        comm, fusco::test::llCombineCall(
                  ll, &d, in, ctx.rank, fusco::test::llExpertOut(in.c, o.format, ctx.rank, got),
                  true, FUSCO_LL_RECV_HOOK, bytes ? out.data() : nullptr, &hook));
    ASSERT_NE(hook, 0u) << what << ": combine gave no hook";
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, hook, nullptr));
    expectHookRefused(comm, ll, hook, what + " combine");
    EXPECT_EQ(out.back(), fusco::test::kPoison) << what << ": combine wrote past its out";
    out.pop_back();
    EXPECT_TRUE(fusco::test::llOutMatches(fusco::test::llRefCombine(in, ctx.rank, o.format, true),
                                          out, in.c.hidden, what + " combine"));
    o = LlRound{};
    o.buffer = 1;
    fusco::test::llRoundChecked(comm, ll, ctx, in, o, what + ", then without");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// This rank's outputs of a dispatch already completed, against the reference.
void expectReceived(const RankCtx& ctx, const LlInputs& in, const fuscoLowLatencyDispatch_t& d,
                    int format, LlRecv* got, const std::string& what) {
  *got = fusco::test::llFetchHost(d, in.c, format);
  EXPECT_TRUE(fusco::test::llRecvMatches(in.c, format,
                                         fusco::test::llRefDispatch(in, ctx.rank, format), *got))
      << what << " rank " << ctx.rank << " received";
}

// Combine of d with FUSCO_LL_RECV_HOOK into *out (poisoned first); returns the hook (0: failed).
unsigned long long combineHooked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                 const LlInputs& in, const fuscoLowLatencyDispatch_t& d, int format,
                                 const LlRecv& got, std::vector<uint8_t>* out) {
  out->assign(static_cast<size_t>(in.c.numTokens[ctx.rank]) * in.c.hidden * 2,
              fusco::test::kPoison);
  unsigned long long hook = 0;
  FUSCO_EXPECT_OK(
      comm, fusco::test::llCombineCall(
                ll, &d, in, ctx.rank, fusco::test::llExpertOut(in.c, format, ctx.rank, got), true,
                FUSCO_LL_RECV_HOOK, out->empty() ? nullptr : out->data(), &hook));
  return hook;
}

// Dispatch A (BF16) and B (FP8, another routing and top-k) both with hooks before either hook
// runs: halves 0 and 1, both results right; then both combines in flight, their hooks run in the
// other order; then a third dispatch reuses half 0.
TEST(LowLatencyHook, TwoDispatchesAndTwoCombinesInFlightUseBothBuffers) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    LlCase c = combineCase(4, 128);
    const LlInputs a = makeLlInputs(c, seed);
    c.topk = 2;
    c.numTokens = {8, 64, 1, 0};
    const LlInputs b = makeLlInputs(c, seed + 1);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    fuscoLowLatencyDispatch_t da, db;
    std::memset(&da, fusco::test::kPoison, sizeof da);
    std::memset(&db, fusco::test::kPoison, sizeof db);
    FUSCO_ASSERT_OK(
        comm, fusco::test::llDispatchCall(ll, a, ctx.rank, FUSCO_LL_BF16, FUSCO_LL_RECV_HOOK, &da));
    FUSCO_ASSERT_OK(
        comm, fusco::test::llDispatchCall(ll, b, ctx.rank, FUSCO_LL_FP8, FUSCO_LL_RECV_HOOK, &db));
    EXPECT_TRUE(fusco::test::llDispatchFields(da, FUSCO_LL_BF16, 0, true)) << "dispatch A";
    EXPECT_TRUE(fusco::test::llDispatchFields(db, FUSCO_LL_FP8, 1, true)) << "dispatch B";
    EXPECT_NE(da.hook, db.hook);
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, da.hook, nullptr));
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, db.hook, nullptr));
    LlRecv gotA, gotB;
    expectReceived(ctx, a, da, FUSCO_LL_BF16, &gotA, "dispatch A");
    expectReceived(ctx, b, db, FUSCO_LL_FP8, &gotB, "dispatch B");
    std::vector<uint8_t> outA, outB;
    const unsigned long long ha = combineHooked(comm, ll, ctx, a, da, FUSCO_LL_BF16, gotA, &outA);
    const unsigned long long hb = combineHooked(comm, ll, ctx, b, db, FUSCO_LL_FP8, gotB, &outB);
    ASSERT_TRUE(ha != 0 && hb != 0 && ha != hb) << "combine hooks " << ha << ", " << hb;
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, hb, nullptr));
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, ha, nullptr));
    EXPECT_TRUE(fusco::test::llOutMatches(
        fusco::test::llRefCombine(a, ctx.rank, FUSCO_LL_BF16, true), outA, c.hidden, "combine A"));
    EXPECT_TRUE(fusco::test::llOutMatches(
        fusco::test::llRefCombine(b, ctx.rank, FUSCO_LL_FP8, true), outB, c.hidden, "combine B"));
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + 2), LlRound{},
                                "a third dispatch on half 0");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// The order the user ran: Dispatch(d0), Dispatch(d1), Combine(d1), Combine(d0),
// Dispatch(d2) (which reuses d0's half), Combine(d0) again. d2 has a hook, and d0 has one or not:
// the stale combine is fuscoInvalidUsage on every rank, saying so, and writes nothing into `out`;
// d2's combine is then exact. (Two dispatches without FUSCO_LL_RECV_HOOK carry nothing that
// tells them apart; docs/API.md leaves that order to the caller.)
TEST(LowLatencyHook, CombiningAStaleDispatchIsInvalidUsage) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlCase c = combineCase(2, 64);
    // d0 and d2 with hooks, d2 alone with one, and neither (the two structs then equal byte for
    // byte: the combine is told by the struct it is given).
    for (int variant = 0; variant < 3; ++variant) {
      const bool hookedD0 = variant == 0, hookedD2 = variant < 2;
      const std::string w = std::string(hookedD0 ? "d0 with a hook" : "d0 without a hook") +
                            (hookedD2 ? ", d2 with one" : ", d2 without");
      const LlInputs in0 = makeLlInputs(c, seed), in1 = makeLlInputs(c, seed + 1),
                     in2 = makeLlInputs(c, seed + 2);
      fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
      ASSERT_NE(ll, nullptr);
      LlRound o0, o1, o2;
      o0.hook = hookedD0;
      o1.buffer = 1;
      o2.hook = hookedD2;
      fuscoLowLatencyDispatch_t d0, d1, d2;
      LlRecv got0, got1, got2;
      ASSERT_TRUE(fusco::test::llDispatchChecked(comm, ll, ctx, in0, o0, w + ", d0", &d0, &got0));
      ASSERT_TRUE(fusco::test::llDispatchChecked(comm, ll, ctx, in1, o1, w + ", d1", &d1, &got1));
      fusco::test::llCombineChecked(comm, ll, ctx, in1, o1, d1, got1, w + ", d1");
      fusco::test::llCombineChecked(comm, ll, ctx, in0, o0, d0, got0, w + ", d0");
      ASSERT_TRUE(fusco::test::llDispatchChecked(comm, ll, ctx, in2, o2, w + ", d2", &d2, &got2));
      const size_t bytes = static_cast<size_t>(c.numTokens[ctx.rank]) * c.hidden * 2;
      std::vector<uint8_t> out(bytes + kLlTailBytes, fusco::test::kPoison);
      const fuscoResult_t r = fusco::test::llCombineCall(
          ll, &d0, in0, ctx.rank, fusco::test::llExpertOut(c, FUSCO_LL_BF16, ctx.rank, got0), true,
          0, bytes ? out.data() : nullptr, nullptr);
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_EQ(r, fuscoInvalidUsage) << w << ": " << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_NE(msg.find("fuscoLowLatencyCombine"), std::string::npos) << w << ": " << msg;
      EXPECT_NE(msg.find("dispatch on buffer 0"), std::string::npos) << w << ": " << msg;
      EXPECT_NE(msg.find("two calls later"), std::string::npos) << w << ": " << msg;
      EXPECT_EQ(fusco::test::findNotPoison(out.data(), out.size()), SIZE_MAX)
          << w << ": the refused combine wrote out";
      fusco::test::llCombineChecked(comm, ll, ctx, in2, o2, d2, got2, w + ", d2 after the refusal");
      FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Ten calls, dispatch and combine alternating, each pair with its own routing, token counts,
// top-k, format, weights and hooks; every result exact and the halves alternating.
TEST(LowLatencySequence, TenAlternatingCallsWithDifferentRoutings) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx);
    fuscoComm_t comm = initComm(ctx, &cfg);
    LlCase c = combineCase(4, 128);
    c.numExperts = 32;
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    const int counts[] = {0, 1, 8, 64, 128};
    const int topks[] = {1, 3, 8, 2, 5};
    for (int round = 0; round < 5; ++round) {
      for (int s = 0; s < 4; ++s) c.numTokens[s] = counts[(2 * s + round) % 5];
      c.topk = topks[round];
      LlRound o;
      o.format = round % 2 ? FUSCO_LL_FP8 : FUSCO_LL_BF16;
      o.hook = round == 1 || round == 4;
      o.weighted = round != 2;
      o.buffer = round % 2;
      fusco::test::llRoundChecked(
          comm, ll, ctx, makeLlInputs(c, seed + round), o,
          fusco::test::llCaseName(c, o.format) + " call pair " + std::to_string(round));
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
