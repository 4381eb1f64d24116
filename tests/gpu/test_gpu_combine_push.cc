// Combine pulls where offered and pushes otherwise (docs/DESIGN.md, "Pull where offered, push
// otherwise"): a rank whose expertOut a peer cannot map pushes that peer's rows through their
// channel, and the peer's operation sums them where they lie in the ring. One combine can mix
// both; the bytes equal the reference tree either way. Rows too large for the channel's window
// are refused on every rank, naming the knobs, and the comm goes on.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::CombineSetup;
using fusco::test::MoeCase;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

// Plan, dispatch (checked) and combine (checked against the reference, weighted and not) in every
// dedup mode, with this rank's expertOut of `kind`.
void combineEveryMode(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s, Mem kind,
                      cudaStream_t stream) {
  const size_t rowOut = s.hidden * fusco::test::dtypeSize(s.dt);
  for (int dedup : {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK}) {
    const std::string what = fusco::test::caseName(s.c, dedup, s.hidden);
    fuscoMoeHandle_t h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, s.c, s.p, s.d, dedup, FUSCO_BALANCE_AUTO, stream, &h))
        << what;
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, s.p, s.d, s.x, rowOut, Mem::Cuda, Mem::Cuda, stream))
        << what;
    for (bool weighted : {true, false})
      EXPECT_TRUE(gpuCombine(comm, h, ctx.rank, s, weighted, kind, Mem::Cuda, stream))
          << what << ", expertOut " << memName(kind);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
}

// Ranks 1 and 3 keep expertOut in plain cudaMalloc (every peer gets their rows pushed), ranks 0
// and 2 in the comm's arena (read in place where the peer has mapped it): each combine pulls from
// some peers and sums others' pushed rows, one rank with no tokens.
TEST(GpuCombinePush, PullAndPushMixInOneCombine) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    MoeCase c = oneNodeCase(4);
    c.numExperts = 16;
    c.topk = 4;
    c.numTokens = {23, 0, 31, 12};
    for (fuscoDataType_t dt : {fuscoBfloat16, fuscoFloat32}) {
      const CombineSetup s = fusco::test::makeCombine(c, seed, dt, 72);
      combineEveryMode(comm, ctx, s, ctx.rank % 2 ? Mem::Cuda : Mem::Arena, stream.get());
    }
  });
}

// 16 KiB channels (4 sub-rings of 4 slots of 1 KiB): a token's four rows of 1 KiB from one rank
// do not fit three slots, so a combine that must push them fails on every rank with
// fuscoInvalidArgument naming FUSCO_CUDA_RING_BYTES (the rank that pushes at once, its peer from
// the operation), moves nothing, and the same combine from the arena (read in place, no window)
// is exact.
TEST(GpuCombinePush, RowsLargerThanTheChannelWindowFailOnEveryRank) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  fusco::test::runRanks(
      2,
      [seed](const RankCtx& ctx) {
        setenv("FUSCO_CUDA_RING_BYTES", "16384", 1);  // read at the comm's init
        fuscoComm_t comm = initGpuComm(ctx);
        ASSERT_NE(comm, nullptr);
        {
          Stream stream;
          MoeCase c = oneNodeCase(2);
          c.numExperts = 4;
          c.topk = 4;
          c.numTokens = {9, 7};
          const CombineSetup s = fusco::test::makeCombine(c, seed, fuscoBfloat16, 512);
          fuscoMoeHandle_t h = nullptr;
          ASSERT_TRUE(gpuPlan(comm, ctx.rank, s.c, s.p, s.d, FUSCO_DEDUP_NONE, FUSCO_BALANCE_AUTO,
                              stream.get(), &h));
          const size_t rowOut = s.hidden * 2;
          DevBuf eo(comm, s.expertOut[ctx.rank].size() + rowOut, Mem::Cuda);
          eo.upload(s.expertOut[ctx.rank]);
          DevBuf inArena(comm, s.expertOut[ctx.rank].size() + rowOut, Mem::Arena);
          inArena.upload(s.expertOut[ctx.rank]);
          DevBuf out = poisonedBuf(comm, s.p.numTokens[ctx.rank] * rowOut);
          // Both ranks' arena buffers exist before the refused combine, which maps the peer's.
          int one = 1, both[2];
          FUSCO_ASSERT_OK(comm, fuscoCommHostAllGather(comm, &one, both, sizeof one));
          const fuscoResult_t r = fuscoMoeCombine(h, eo.get(), fuscoBfloat16, s.hidden, nullptr,
                                                  out.get(), stream.get());
          const std::string msg = fuscoGetLastError(comm);
          EXPECT_EQ(r, fuscoInvalidArgument) << msg;
          EXPECT_NE(msg.find("FUSCO_CUDA_RING_BYTES"), std::string::npos) << msg;
          CUDA_EXPECT_OK(cudaStreamSynchronize(stream.get()));
          EXPECT_EQ(fusco::test::findNotPoison(out.download().data(), out.size()), SIZE_MAX)
              << "the refused combine wrote out";
          fuscoResult_t async = fuscoSuccess;
          FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
          FUSCO_ASSERT_OK(comm, fuscoMoeCombine(h, inArena.get(), fuscoBfloat16, s.hidden, nullptr,
                                                out.get(), stream.get()));
          CUDA_ASSERT_OK(cudaStreamSynchronize(stream.get()));
          const auto want = fusco::test::moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, {});
          EXPECT_TRUE(out.download() == want[ctx.rank])
              << "expertOut from the arena, read in place";
          FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
        }
        fuscoCommDestroy(comm);
      },
      gpuOptions());
}

}  // namespace
