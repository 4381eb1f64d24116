// MoE plan, dispatch and combine on CUDA comms (docs/API.md, "MoE dispatch and combine"): topkIdx,
// x, expertOut, topkWeights and every output in device memory; recvX, tokensPerLocalExpert,
// padding rows, dispatch stats and combine `out` (fp32, bf16, fp16) bit-exact against the host
// reference (harness/moe_reference.h) in every dedup mode (a CUDA comm is one node, so NODE and
// AUTO act like RANK), identical across modes and balance settings and from run to run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::Bytes2D;
using fusco::test::CombineSetup;
using fusco::test::dedupName;
using fusco::test::makeCombine;
using fusco::test::makeProblem;
using fusco::test::makeRows;
using fusco::test::MoeCase;
using fusco::test::MoeRefDispatch;
using fusco::test::MoeRefProblem;
using fusco::test::RankCtx;
using fusco::test::Route;
using namespace fusco::test::gpu;

const std::vector<int> kGpuModes = {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK, FUSCO_DEDUP_AUTO,
                                    FUSCO_DEDUP_NODE};

std::vector<size_t> unevenTokens(int n, size_t base) {
  std::vector<size_t> t(n);
  for (int r = 0; r < n; ++r) t[r] = base + 17 * r;
  if (n > 1) t[1] = 0;
  if (n > 2) t[2] = 1;
  return t;
}

// Plan + dispatch (twice: bit-identical) + stats for every mode; every mode's recvX identical.
void dispatchAllModes(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c, uint64_t seed,
                      size_t rowBytes, const std::vector<int>& modes, Mem xKind, Mem recvKind,
                      cudaStream_t stream) {
  MoeRefProblem p = makeProblem(c, seed);
  Bytes2D x = makeRows(p, seed + 1, rowBytes);
  MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, rowBytes);
  std::vector<uint8_t> first;
  for (int dedup : modes) {
    const std::string what = fusco::test::caseName(c, dedup, rowBytes);
    fuscoMoeHandle_t h = nullptr;
    auto planned = gpuPlan(comm, ctx.rank, c, p, d, dedup, FUSCO_BALANCE_AUTO, stream, &h);
    EXPECT_TRUE(planned) << what;
    if (!planned) continue;
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<uint8_t> got;
      auto ok = gpuDispatch(comm, h, ctx.rank, p, d, x, rowBytes, xKind, recvKind, stream, &got);
      EXPECT_TRUE(ok) << what << ", dispatch " << rep + 1;
      EXPECT_TRUE(dispatchStatsMatch(h, p, ctx.rank, dedup, rowBytes)) << what;
      if (!ok) continue;
      if (first.empty()) first = got;
      EXPECT_TRUE(got == first) << what << ": recvX differs from the first mode's / run's";
    }
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
}

// ---------------------------------------------------------------- dispatch

class GpuMoeDispatchRanks : public ::testing::TestWithParam<int> {};

TEST_P(GpuMoeDispatchRanks, UnevenTokensMatchReferenceInEveryDedupMode) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(
      GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        MoeCase c = oneNodeCase(ctx.nranks);
        c.numExperts = 4 * ctx.nranks;
        c.topk = 4;
        c.numTokens = unevenTokens(ctx.nranks, 23);
        dispatchAllModes(comm, ctx, c, seed, 36, kGpuModes, Mem::Cuda, Mem::Cuda, stream.get());
      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuMoeDispatchRanks, ::testing::Values(2, 4, 8), ranksName);

TEST(GpuMoeDispatch, EveryBufferKindForXAndRecvX) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 12;
    c.topk = 4;
    c.numTokens = {37, 0, 64, 5};
    c.align = 4;
    for (Mem xk : kAllMems)
      for (Mem rk : kAllMems)
        dispatchAllModes(comm, ctx, c, seed + 3 * static_cast<int>(xk) + static_cast<int>(rk),
                         7168 * 2 + 6, {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK}, xk, rk, stream.get());
  });
}

TEST(GpuMoeDispatch, ExpertAlignmentPadsEachBlockWithZeroRows) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 12;
    c.topk = 3;
    c.numTokens = {21, 5, 14, 0};
    c.unusedPercent = 25;
    for (int align : {0, 1, 4, 16}) {
      c.align = align;
      dispatchAllModes(comm, ctx, c, seed + align, 13, kGpuModes, Mem::Cuda,
                       align == 16 ? Mem::Arena : Mem::Cuda, stream.get());
    }
  });
}

// Padding is one range per local expert, zeroed by one kernel over the ranges: long ranges (up to
// the largest supported alignment) and many short ones come back all zero over the poison.
TEST(GpuMoeDispatch, LargeAlignmentPaddingRangesAreZeroed) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 16;
    c.topk = 2;
    c.numTokens = {9, 0, 4, 11};
    for (int align : {3, 4096, 65536}) {
      c.align = align;
      dispatchAllModes(comm, ctx, c, seed + align, 10, kGpuModes, Mem::Cuda,
                       align == 4096 ? Mem::Arena : Mem::Cuda, stream.get());
    }
  });
}

TEST(GpuMoeDispatch, ZeroTokensOneTokenAndIdleExperts) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(2, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(2);
    c.numExperts = 6;
    c.topk = 2;
    c.numTokens = {0, 0};
    c.align = 4;
    dispatchAllModes(comm, ctx, c, seed, 64, kGpuModes, Mem::Cuda, Mem::Cuda, stream.get());
    c.numTokens = {1, 0};
    dispatchAllModes(comm, ctx, c, seed + 1, 64, kGpuModes, Mem::Cuda, Mem::Cuda, stream.get());
    c.numTokens = {25, 33};
    c.route = Route::SomeExpertsIdle;
    dispatchAllModes(comm, ctx, c, seed + 2, 24, kGpuModes, Mem::Cuda, Mem::Cuda, stream.get());
    c.route = Route::OneExpert;  // every token to expert 4 (rank 1)
    c.fixedExpert = 4;
    c.align = 16;
    dispatchAllModes(comm, ctx, c, seed + 3, 40, kGpuModes, Mem::Cuda, Mem::Registered,
                     stream.get());
  });
}

TEST(GpuMoeDispatch, EightRanksTopOneToEightWithPlacementAndAlignment) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(8, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(8);
    c.numExperts = 20;  // not a multiple of 8
    c.numTokens = {12, 0, 1, 30, 7, 19, 0, 25};
    for (int e = 0; e < c.numExperts; ++e) c.placement.push_back((e * 5 + 3) % 8);
    c.align = 4;
    c.unusedPercent = 30;
    for (int k : {1, 2, 5, 8}) {
      c.topk = k;
      dispatchAllModes(comm, ctx, c, seed + k, 50, {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK}, Mem::Cuda,
                       Mem::Cuda, stream.get());
    }
  });
}

TEST(GpuMoeDispatch, LargeBf16RowsTopEightOnLegacyStream) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanks(4, [seed](const RankCtx& ctx, fuscoComm_t comm) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 64;
    c.topk = 8;
    c.numTokens = {256, 200, 256, 129};
    c.unusedPercent = 5;
    dispatchAllModes(comm, ctx, c, seed, 7168 * 2, {FUSCO_DEDUP_RANK}, Mem::Cuda, Mem::Arena,
                     nullptr);
  });
}

// Every balance setting yields the same bytes (one node: nothing to balance, still exact).
TEST(GpuMoeDispatch, EveryBalanceModeGivesTheSameRecvX) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 16;
    c.topk = 5;
    c.numTokens = {33, 20, 0, 41};
    MoeRefProblem p = makeProblem(c, seed);
    Bytes2D x = makeRows(p, seed + 1, 72);
    MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, 72);
    for (int dedup : {FUSCO_DEDUP_RANK, FUSCO_DEDUP_NODE})
      for (int bal :
           {FUSCO_BALANCE_AUTO, FUSCO_BALANCE_NONE, FUSCO_BALANCE_STATIC, FUSCO_BALANCE_GREEDY}) {
        fuscoMoeHandle_t h = nullptr;
        auto planned = gpuPlan(comm, ctx.rank, c, p, d, dedup, bal, stream.get(), &h);
        EXPECT_TRUE(planned) << dedupName(dedup) << ", balance " << bal;
        if (!planned) continue;
        EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, p, d, x, 72, Mem::Cuda, Mem::Cuda, stream.get()))
            << dedupName(dedup) << ", balance " << bal;
        FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
      }
  });
}

// ---------------------------------------------------------------- combine

// Plan + dispatch (checked) + combine with and without weights, twice each, for every mode:
// bit-exact against the reference tree, identical run to run and across modes; NONE's combine
// stats count every received row going back raw.
void combineAllModes(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s, Mem inKind,
                     Mem outKind, cudaStream_t stream) {
  const size_t rowOut = s.hidden * fusco::test::dtypeSize(s.dt);
  std::vector<std::vector<uint8_t>> firstOut(2);  // [weighted]
  bool haveFirst[2] = {false, false};
  for (int dedup : kGpuModes) {
    const std::string what =
        fusco::test::caseName(s.c, dedup, s.hidden) + " " + fusco::test::dtypeName(s.dt);
    fuscoMoeHandle_t h = nullptr;
    auto planned = gpuPlan(comm, ctx.rank, s.c, s.p, s.d, dedup, FUSCO_BALANCE_AUTO, stream, &h);
    EXPECT_TRUE(planned) << what;
    if (!planned) continue;
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, s.p, s.d, s.x, rowOut, Mem::Cuda, Mem::Cuda, stream))
        << what;
    for (int weighted = 1; weighted >= 0; --weighted)
      for (int rep = 0; rep < 2; ++rep) {
        std::vector<uint8_t> got;
        auto ok = gpuCombine(comm, h, ctx.rank, s, weighted, inKind, outKind, stream, &got);
        EXPECT_TRUE(ok) << what << ", combine " << rep + 1;
        if (!ok) continue;
        if (!haveFirst[weighted]) {
          firstOut[weighted] = got;
          haveFirst[weighted] = true;
        }
        EXPECT_TRUE(got == firstOut[weighted]) << what << (weighted ? " weighted" : " unweighted")
                                               << ": out differs from the first mode's / run's";
        if (dedup == FUSCO_DEDUP_NONE) {
          fuscoMoeStats_t st{};
          st.size = sizeof st;
          FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
          EXPECT_EQ(st.combineBytesIntraNode, noneCombineBytes(s.p, ctx.rank, rowOut))
              << what << " combineBytesIntraNode (NONE: every received row back raw)";
          EXPECT_EQ(st.combineBytesInterNode, 0u) << what << " combineBytesInterNode";
        }
      }
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
}

std::string dtName(const ::testing::TestParamInfo<fuscoDataType_t>& i) {
  return fusco::test::dtypeName(i.param);
}

class GpuMoeCombineTypes : public ::testing::TestWithParam<fuscoDataType_t> {};

TEST_P(GpuMoeCombineTypes, OutMatchesReferenceTreeInEveryDedupMode) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  const fuscoDataType_t dt = GetParam();
  runGpuRanksOnStream(4, [seed, dt](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 12;
    c.topk = 6;
    c.numTokens = {37, 1, 22, 0};
    c.unusedPercent = 20;
    c.align = 4;
    combineAllModes(comm, ctx, makeCombine(c, seed, dt, 67), Mem::Cuda, Mem::Cuda, stream.get());
  });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuMoeCombineTypes,
                         ::testing::Values(fuscoFloat32, fuscoBfloat16, fuscoFloat16), dtName);

class GpuMoeCombineRanks : public ::testing::TestWithParam<int> {};

TEST_P(GpuMoeCombineRanks, Bf16TopEightMatchesReference) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(
      GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        MoeCase c = oneNodeCase(ctx.nranks);
        c.numExperts = 4 * ctx.nranks;
        c.topk = 8;
        c.numTokens = unevenTokens(ctx.nranks, 30);
        c.unusedPercent = 10;
        combineAllModes(comm, ctx, makeCombine(c, seed, fuscoBfloat16, 7168 / 8 + 3), Mem::Cuda,
                        Mem::Cuda, stream.get());
      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuMoeCombineRanks, ::testing::Values(2, 4, 8), ranksName);

TEST(GpuMoeCombine, EveryBufferKindForExpertOutAndOut) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 7;  // explicit placement, not a multiple of the ranks
    c.placement = {3, 3, 1, 0, 2, 1, 0};
    c.topk = 3;
    c.numTokens = {0, 26, 1, 18};
    const CombineSetup s = makeCombine(c, seed, fuscoFloat16, 40);
    for (Mem in : kAllMems)
      for (Mem out : kAllMems) combineAllModes(comm, ctx, s, in, out, stream.get());
  });
}

// Class A (docs/TESTING.md, "Failure classes"): the first combine of an expertOut from plain
// cudaMalloc, rank 0 entering 200 ms after its peers. The library once copied it into a buffer it
// exported inside the call, which the peers, having looked for new buffers when they entered,
// could not map. Now no peer can map it, so its rows are pushed through the channels and each
// peer sums them where they lie; the bytes equal the reference.
TEST(GpuMoeCombine, FirstCombineOfAnUnregisteredExpertOutIsExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 8;
    c.topk = 2;
    c.numTokens = {40, 33, 17, 25};
    const CombineSetup s = makeCombine(c, seed, fuscoBfloat16, 64);
    const size_t rowOut = s.hidden * 2;
    fuscoMoeHandle_t h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, s.c, s.p, s.d, FUSCO_DEDUP_RANK, FUSCO_BALANCE_AUTO,
                        stream.get(), &h));
    ASSERT_TRUE(
        gpuDispatch(comm, h, ctx.rank, s.p, s.d, s.x, rowOut, Mem::Cuda, Mem::Cuda, stream.get()));
    if (ctx.rank == 0) usleep(200 * 1000);
    EXPECT_TRUE(gpuCombine(comm, h, ctx.rank, s, true, Mem::Cuda, Mem::Cuda, stream.get()));
    fuscoResult_t async = fuscoSuccess;
    FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, fuscoSuccess) << fuscoGetLastError(comm);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  });
}

// ---------------------------------------------------------------- which planner

// CUDA comms plan by the GPU planner's steps by default; FUSCO_PLAN=host keeps the host planner
// (topkIdx copied to the host). Both must give the reference's bytes, in dispatch and combine.
// The variable is set in each rank process before its first plan (parameters are read once).
TEST(GpuMoePlanner, HostPlannerAndStepsBothMatchTheReference) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  for (const char* where : {"host", "steps"}) {
    runGpuRanksOnStream(
        4, [seed, where](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
          setenv("FUSCO_PLAN", where, 1);
          MoeCase c = oneNodeCase(4);
          c.numExperts = 16;
          c.topk = 4;
          c.numTokens = {70, 0, 1, 45};
          c.align = 8;
          dispatchAllModes(comm, ctx, c, seed, 40, kGpuModes, Mem::Cuda, Mem::Cuda, stream.get());
          combineAllModes(comm, ctx, makeCombine(c, seed, fuscoBfloat16, 64), Mem::Cuda, Mem::Cuda,
                          stream.get());
        });
  }
}

}  // namespace
