// fuscoMoeReplan on CUDA comms (docs/API.md, "Replanning a handle"): twenty layers of changing
// routing on one handle, each dispatched and combined on one stream while the next layer is
// replanned on another stream without any ordering by the caller, so the replan's upload must
// wait for the earlier calls that read the handle's device lists. Every recvX and `out` is
// bit-exact against the host reference (harness/moe_reference.h), and the handle's device buffer
// is never allocated again once its first, largest layer planned it (api/moe_inspect.h).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "api/moe_inspect.h"
#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::CombineSetup;
using fusco::test::makeCombine;
using fusco::test::MoeCase;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

constexpr int kLayers = 20;

// Layer 0 is the largest (top-6); later layers take 40-80% of its tokens with top-2 to top-6, and
// every fourth one leaves one rank without tokens.
MoeCase layerCase(int layer) {
  MoeCase c = oneNodeCase(4);
  c.numExperts = 16;
  c.align = 4;
  c.unusedPercent = 10;
  c.topk = layer == 0 ? 6 : 2 + layer % 5;
  const size_t first[4] = {64, 48, 56, 40};
  c.numTokens.resize(4);
  for (int r = 0; r < 4; ++r)
    c.numTokens[r] = layer == 0 ? first[r] : first[r] * (40 + (layer * 13 + r * 7) % 41) / 100;
  if (layer % 4 == 1) c.numTokens[layer % 3] = 0;
  return c;
}

// The handle's device buffer (both sides, with their capacity).
std::vector<fusco::ListStorage> deviceBufferOf(fuscoMoeHandle_t h) {
  std::vector<fusco::ListStorage> all, dev;
  EXPECT_TRUE(fusco::moeHandleStorage(h, &all));
  for (const fusco::ListStorage& l : all)
    if (l.name.rfind("devBuffer.", 0) == 0) dev.push_back(l);
  return dev;
}

// One layer's dispatch and combine, enqueued and not yet checked.
struct Enqueued {
  CombineSetup s;
  MoeRankBufs b;
  std::string what;
};

std::unique_ptr<Enqueued> enqueueLayer(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                       CombineSetup s, const std::string& what,
                                       cudaStream_t stream) {
  auto e = std::make_unique<Enqueued>(Enqueued{std::move(s), {}, what});
  const CombineSetup& c = e->s;
  e->b = moeRankBufs(comm, c, rank);
  const size_t rowBytes = c.hidden * fusco::test::dtypeSize(c.dt);
  const bool tokens = c.p.numTokens[rank] > 0;
  FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, e->b.x.get(), rowBytes, e->b.recvX.get(), stream));
  FUSCO_EXPECT_OK(comm, fuscoMoeCombine(h, e->b.expertOut.get(), c.dt, c.hidden,
                                        static_cast<const float*>(e->b.weights.get()),
                                        tokens ? e->b.out.get() : nullptr, stream));
  return e;
}

// Waits for the layer's stream work, then compares its recvX and out with the reference.
void checkLayer(const Enqueued& e, int rank, cudaStream_t stream) {
  const cudaError_t err = syncWithin(stream, 60);
  ASSERT_EQ(err, cudaSuccess) << e.what << ": " << streamSyncFailure(err, "the layer");
  const CombineSetup& s = e.s;
  const size_t rowBytes = s.hidden * fusco::test::dtypeSize(s.dt);
  const std::vector<uint8_t> recvX = e.b.recvX.download(s.d.numRecvRows[rank] * rowBytes);
  EXPECT_TRUE(recvX == s.d.recvX[rank]) << e.what << ": recvX differs from the reference";
  const std::vector<uint8_t> out = e.b.out.download(s.p.numTokens[rank] * rowBytes);
  const auto want =
      fusco::test::moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, s.weights)[rank];
  EXPECT_TRUE(out == want) << e.what << ": combine out differs from the reference";
}

TEST(GpuMoeReplan, TwentyLayersMatchReferenceAndKeepTheDeviceBuffer) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    Stream planStream;
    for (int dedup : {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK}) {
      fuscoMoeHandle_t h = nullptr;
      std::vector<fusco::ListStorage> firstBuffer;
      std::unique_ptr<Enqueued> previous;
      for (int layer = 0; layer < kLayers; ++layer) {
        CombineSetup s = makeCombine(layerCase(layer), seed + layer, fuscoBfloat16, 40);
        const std::string what =
            fusco::test::caseName(s.c, dedup, s.hidden) + ", layer " + std::to_string(layer);
        const auto planned = layer == 0
                                 ? gpuPlan(comm, ctx.rank, s.c, s.p, s.d, dedup, FUSCO_BALANCE_AUTO,
                                           stream.get(), &h)
                                 : gpuReplan(comm, h, ctx.rank, s.c, s.p, s.d, planStream.get());
        ASSERT_TRUE(planned) << what;
        if (previous) checkLayer(*previous, ctx.rank, stream.get());
        if (layer == 0) firstBuffer = deviceBufferOf(h);
        EXPECT_TRUE(deviceBufferOf(h) == firstBuffer)
            << what << ": the device buffer was allocated again";
        previous = enqueueLayer(comm, h, ctx.rank, std::move(s), what, stream.get());
      }
      if (previous) checkLayer(*previous, ctx.rank, stream.get());
      ASSERT_EQ(firstBuffer.size(), 2u);
      EXPECT_NE(firstBuffer[1].data, nullptr) << "no device buffer after the first plan";
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
  });
}

// A replan on a capturing stream is refused on every rank (it reads the routing on the host) and
// leaves the handle unplanned: dispatch refuses it until an eager replan, which is exact again.
TEST(GpuMoeReplan, CaptureIsRefusedAndLeavesTheHandleUnplanned) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const CombineSetup first = makeCombine(layerCase(0), seed, fuscoBfloat16, 40);
    const CombineSetup next = makeCombine(layerCase(1), seed + 1, fuscoBfloat16, 40);
    const size_t rowBytes = 40 * 2;
    fuscoMoeHandle_t h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, first.c, first.p, first.d, FUSCO_DEDUP_RANK,
                        FUSCO_BALANCE_AUTO, stream.get(), &h));
    DevBuf idx = toDevice(comm, next.p.topkIdx[ctx.rank]);
    CUDA_ASSERT_OK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    const fuscoResult_t r = fuscoMoeReplan(h, static_cast<const int64_t*>(idx.get()),
                                           next.p.numTokens[ctx.rank], next.c.topk, stream.get());
    const std::string msg = fuscoGetLastError(comm);
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream.get(), &graph);
    if (graph != nullptr) CUDA_EXPECT_OK(cudaGraphDestroy(graph));
    cudaGetLastError();
    EXPECT_TRUE(e == cudaSuccess || e == cudaErrorStreamCaptureInvalidated) << cudaGetErrorName(e);
    EXPECT_EQ(r, fuscoInvalidUsage) << "fuscoMoeReplan under capture: " << msg;
    EXPECT_NE(msg.find("CUDA graph"), std::string::npos) << "the message should say why: " << msg;
    MoeRankBufs b = moeRankBufs(comm, next, ctx.rank);
    EXPECT_EQ(fuscoMoeDispatch(h, b.x.get(), rowBytes, b.recvX.get(), stream.get()),
              fuscoInvalidUsage)
        << "dispatch on the handle whose replan was refused";
    ASSERT_TRUE(gpuReplan(comm, h, ctx.rank, next.c, next.p, next.d, stream.get()));
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, next.p, next.d, next.x, rowBytes, Mem::Cuda,
                            Mem::Cuda, stream.get()));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  });
}

}  // namespace
