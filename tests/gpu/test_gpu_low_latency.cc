// Low-latency dispatch and combine on CUDA comms (docs/API.md, "Low-latency dispatch and
// combine"): device inputs, calls on a stream, the receive slots and combine `out` copied back and
// compared bitwise with the sequential reference (harness/ll_reference.h) for 0 to 128 tokens per
// rank, BF16 and FP8, experts that receive nothing; combine also against fuscoMoeCombine; the
// receive hook on the calls' stream and on a second stream; two dispatches and two combines in
// flight on both halves. CUDA graphs: test_gpu_low_latency_graph.cc; errors and faults:
// test_gpu_low_latency_errors.cc.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_ll.h"
#include "harness/data_gen.h"
#include "harness/ll_cases.h"
#include "harness/ll_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::LlCase;
using fusco::test::LlInputs;
using fusco::test::LlRecv;
using fusco::test::makeLlInputs;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

LlCase gpuLlCase(int n, int expertsPerRank, int topk, int hidden) {
  LlCase c;
  c.nranks = n;
  c.numExperts = expertsPerRank * n;
  c.topk = topk;
  c.hidden = hidden;
  const std::vector<int> tokens = {37, 0, 64, 9};
  for (int r = 0; r < n; ++r) c.numTokens.push_back(tokens[r % tokens.size()]);
  return c;
}

// Rank r passes {0, 1, 8, 64, 128}[(r + shift) % 5] tokens; over five shifts every rank passes
// every count, BF16 and FP8 in turn, with and without weights.
TEST(GpuLowLatency, DispatchAndCombineMatchTheReferenceForEveryTokenCount) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    LlCase c = gpuLlCase(4, 4, 4, 256);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    const int counts[] = {0, 1, 8, 64, 128};
    LlGpuRound o;
    for (int shift = 0; shift < 5; ++shift) {
      for (int r = 0; r < 4; ++r) c.numTokens[r] = counts[(r + shift) % 5];
      for (int format : {FUSCO_LL_BF16, FUSCO_LL_FP8}) {
        o.format = format;
        o.weighted = shift != 2;
        llGpuRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + 2 * shift + format), o,
                          stream.get(), fusco::test::llCaseName(c, format));
        o.buffer ^= 1;
      }
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

// Every third expert receives nothing.
TEST(GpuLowLatency, IdleExpertsReceiveNothing) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(3, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    LlCase c = gpuLlCase(3, 3, 6, 128);
    c.idleEvery = 3;
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    LlGpuRound o;
    for (int format : {FUSCO_LL_BF16, FUSCO_LL_FP8}) {
      o.format = format;
      llGpuRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + format), o, stream.get(),
                        fusco::test::llCaseName(c, format) + " idle experts");
      o.buffer ^= 1;
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

// fuscoMoePlan (RANK dedup, contiguous, no padding), fuscoMoeDispatch and fuscoMoeCombine of the
// same rows and routing on the device, with llExpertRow's outputs of the rows it delivered.
std::vector<uint8_t> moeCombineOut(fuscoComm_t comm, const RankCtx& ctx, const LlInputs& in,
                                   bool weighted, cudaStream_t s) {
  const LlCase& c = in.c;
  const int numLocal = fusco::test::llNumLocal(c), nTok = c.numTokens[ctx.rank];
  const size_t rowBytes = c.hidden * 2u;
  const LlDevInputs b = llUpload(comm, in, ctx.rank);
  fuscoMoeConfig_t m = FUSCO_MOE_CONFIG_INITIALIZER;
  m.numExperts = c.numExperts;
  m.dedup = FUSCO_DEDUP_RANK;
  fuscoMoeHandle_t h = nullptr;
  FUSCO_EXPECT_OK(comm, fuscoMoePlan(&h, comm, &m, b.idxPtr(), nTok, c.topk, s));
  if (h == nullptr) return {};
  size_t rows = 0;
  std::vector<int64_t> perExpert(numLocal);
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &rows, perExpert.data()));
  DevBuf recvX(comm, rows * rowBytes);
  FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, b.xPtr(), rowBytes, recvX.get(), s));
  EXPECT_TRUE(llFinish(s, comm, "fuscoMoeDispatch"));
  const std::vector<uint8_t> got = recvX.download(rows * rowBytes);
  std::vector<uint8_t> eo(rows * rowBytes);
  size_t row = 0;
  for (int e = 0; e < numLocal; ++e)
    for (int64_t i = 0; i < perExpert[e] && row < rows; ++i, ++row)
      fusco::test::llExpertRow(ctx.rank * numLocal + e, FUSCO_LL_BF16, c.hidden,
                               got.data() + row * rowBytes, nullptr, eo.data() + row * rowBytes);
  DevBuf expertOut(comm, eo.size());
  expertOut.upload(eo);
  DevBuf out = poisonedBuf(comm, nTok * rowBytes);
  FUSCO_EXPECT_OK(comm, fuscoMoeCombine(h, expertOut.get(), fuscoBfloat16, c.hidden,
                                        weighted ? b.wPtr() : nullptr, out.get(), s));
  EXPECT_TRUE(llFinish(s, comm, "fuscoMoeCombine"));
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  return out.download(nTok * rowBytes);
}

TEST(GpuLowLatency, CombineIsBitwiseWhatFuscoMoeCombineGives) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const LlInputs in = makeLlInputs(gpuLlCase(4, 4, 4, 80), seed);
    const std::string what = fusco::test::llCaseName(in.c, FUSCO_LL_BF16);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, in.c);
    ASSERT_NE(ll, nullptr);
    LlGpuRound o;
    for (bool weighted : {true, false}) {
      o.weighted = weighted;
      const auto got = llGpuRoundChecked(comm, ll, ctx, in, o, stream.get(), what);
      o.buffer ^= 1;
      const auto moe = moeCombineOut(comm, ctx, in, weighted, stream.get());
      EXPECT_TRUE(fusco::test::llOutMatches(
          moe, got, in.c.hidden,
          what + (weighted ? "" : " NULL weights") + ": low-latency out against fuscoMoeCombine"));
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

// Hooks run on the calls' stream, then on a second stream; a used or unknown hook is refused.
TEST(GpuLowLatency, HooksCompleteTheCallsOnTheSameOrASecondStream) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(3, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const LlInputs in = makeLlInputs(gpuLlCase(3, 4, 4, 128), seed);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, in.c);
    ASSERT_NE(ll, nullptr);
    Stream second;
    LlGpuRound o;
    o.hook = true;
    for (int round = 0; round < 4; ++round) {
      o.format = round % 2 ? FUSCO_LL_FP8 : FUSCO_LL_BF16;
      o.hookStream = round >= 2 ? second.get() : nullptr;
      o.buffer = round % 2;
      llGpuRoundChecked(comm, ll, ctx, in, o, stream.get(),
                        fusco::test::llCaseName(in.c, o.format) +
                            (round >= 2 ? " hooks on a second stream" : " hooks"));
    }
    const LlDevInputs b = llUpload(comm, in, ctx.rank);
    fuscoLowLatencyDispatch_t d;
    FUSCO_ASSERT_OK(comm, llGpuDispatch(ll, b, in, ctx.rank, FUSCO_LL_BF16, FUSCO_LL_RECV_HOOK, &d,
                                        stream.get()));
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, d.hook, stream.get()));
    EXPECT_EQ(fuscoLowLatencyRecvHook(ll, d.hook, stream.get()), fuscoInvalidArgument)
        << "a hook used twice";
    ASSERT_NE(d.hook, 12345u);
    EXPECT_EQ(fuscoLowLatencyRecvHook(ll, 12345, stream.get()), fuscoInvalidArgument)
        << "an unknown hook";
    EXPECT_TRUE(llFinish(stream.get(), comm, "the last dispatch"));
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

// Combine of d with FUSCO_LL_RECV_HOOK into out; returns the hook.
unsigned long long combineHooked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                 const LlInputs& in, const LlDevInputs& b,
                                 const fuscoLowLatencyDispatch_t& d, const DevBuf& eo,
                                 const DevBuf& out, cudaStream_t s) {
  unsigned long long hook = 0;
  FUSCO_EXPECT_OK(comm, llGpuCombine(ll, &d, eo, b, in, ctx.rank, true, FUSCO_LL_RECV_HOOK,
                                     in.c.numTokens[ctx.rank] ? out.get() : nullptr, &hook, s));
  return hook;
}

// Dispatch A (BF16) and B (FP8, another routing and top-k) enqueued with hooks before either hook:
// halves 0 and 1, both right; both combines in flight, their hooks in the other order.
TEST(GpuLowLatency, TwoDispatchesAndTwoCombinesInFlightUseBothBuffers) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    LlCase c = gpuLlCase(4, 4, 4, 128);
    const LlInputs a = makeLlInputs(c, seed);
    c.topk = 2;
    c.numTokens = {8, 64, 1, 0};
    const LlInputs b = makeLlInputs(c, seed + 1);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    const LlDevInputs ba = llUpload(comm, a, ctx.rank), bb = llUpload(comm, b, ctx.rank);
    fuscoLowLatencyDispatch_t da, db;
    FUSCO_ASSERT_OK(comm,
                    llGpuDispatch(ll, ba, a, ctx.rank, FUSCO_LL_BF16, FUSCO_LL_RECV_HOOK, &da, s));
    FUSCO_ASSERT_OK(comm,
                    llGpuDispatch(ll, bb, b, ctx.rank, FUSCO_LL_FP8, FUSCO_LL_RECV_HOOK, &db, s));
    EXPECT_TRUE(fusco::test::llDispatchFields(da, FUSCO_LL_BF16, 0, true)) << "dispatch A";
    EXPECT_TRUE(fusco::test::llDispatchFields(db, FUSCO_LL_FP8, 1, true)) << "dispatch B";
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, da.hook, s));
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, db.hook, s));
    ASSERT_TRUE(llFinish(s, comm, "two dispatches"));
    const LlRecv gotA = llFetchDevice(da, a.c, FUSCO_LL_BF16);
    const LlRecv gotB = llFetchDevice(db, b.c, FUSCO_LL_FP8);
    EXPECT_TRUE(fusco::test::llRecvMatches(
        a.c, FUSCO_LL_BF16, fusco::test::llRefDispatch(a, ctx.rank, FUSCO_LL_BF16), gotA))
        << "dispatch A";
    EXPECT_TRUE(fusco::test::llRecvMatches(
        b.c, FUSCO_LL_FP8, fusco::test::llRefDispatch(b, ctx.rank, FUSCO_LL_FP8), gotB))
        << "dispatch B";
    const DevBuf eoA = llDevExpertOut(comm, a.c, FUSCO_LL_BF16, ctx.rank, gotA);
    const DevBuf eoB = llDevExpertOut(comm, b.c, FUSCO_LL_FP8, ctx.rank, gotB);
    const DevBuf outA = poisonedBuf(comm, a.c.numTokens[ctx.rank] * a.c.hidden * 2u);
    const DevBuf outB = poisonedBuf(comm, b.c.numTokens[ctx.rank] * b.c.hidden * 2u);
    const auto ha = combineHooked(comm, ll, ctx, a, ba, da, eoA, outA, s);
    const auto hb = combineHooked(comm, ll, ctx, b, bb, db, eoB, outB, s);
    ASSERT_TRUE(ha != 0 && hb != 0 && ha != hb) << "combine hooks " << ha << ", " << hb;
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, hb, s));
    FUSCO_ASSERT_OK(comm, fuscoLowLatencyRecvHook(ll, ha, s));
    ASSERT_TRUE(llFinish(s, comm, "two combines"));
    EXPECT_TRUE(
        fusco::test::llOutMatches(fusco::test::llRefCombine(a, ctx.rank, FUSCO_LL_BF16, true),
                                  outA.download(), a.c.hidden, "combine A"));
    EXPECT_TRUE(
        fusco::test::llOutMatches(fusco::test::llRefCombine(b, ctx.rank, FUSCO_LL_FP8, true),
                                  outB.download(), b.c.hidden, "combine B"));
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

}  // namespace
