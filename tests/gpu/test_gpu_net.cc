// CUDA communicators across (virtual) nodes: every rank process on one GPU, nodes split by
// config.localSize (2 x 4, 4 x 2, and the uneven 5 + 3), inter-node pairs over UCX TCP on
// loopback through the network bridge (rows staged through pinned host memory, flags passed on by
// the progress threads). Checked like the one-node suites: poisoned outputs, seeded inputs,
// bit-exact results against the sequential reference; what the bridge cannot carry (captured
// calls, combine's in-place reads, NODE dedup) is refused on every rank with a message; a killed
// rank releases every survivor's stream and is named; FUSCO_NET_GDR=1 without GPUDirect fails init
// saying why.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::makeA2avLayout;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;
using namespace fusco::test::gpu;

// UCX over TCP on loopback for the inter-node pairs (inherited by the forked ranks).
void useLoopbackUcx() {
  setenv("UCX_TLS", "tcp,self", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
}

fuscoConfig_t netConfig(int nranks, int localSize, int timeoutMs = 30000) {
  fuscoConfig_t cfg = gpuConfig(nranks, timeoutMs);
  cfg.localSize = localSize;
  return cfg;
}

struct Shape {
  int nranks, localSize;
};
std::string shapeName(const ::testing::TestParamInfo<Shape>& i) {
  return std::to_string(i.param.nranks) + "ranks_local" + std::to_string(i.param.localSize);
}
const auto kShapes = ::testing::Values(Shape{8, 4}, Shape{8, 2}, Shape{8, 5}, Shape{2, 1});

// runGpuRanksOnStream on the nodes of shape s.
void runNetRanks(const Shape& s, const GpuStreamRankBody& body) {
  useLoopbackUcx();
  const fuscoConfig_t cfg = netConfig(s.nranks, s.localSize);
  runGpuRanksOnStream(s.nranks, body, &cfg);
}

class GpuNet : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuNet, InitGivesTheNodesOfLocalSize) {
  FUSCO_GPU_REQUIRE();
  useLoopbackUcx();
  const Shape s = GetParam();
  const fuscoConfig_t cfg = netConfig(s.nranks, s.localSize);
  runGpuRanks(
      s.nranks,
      [s](const RankCtx& ctx, fuscoComm_t comm) {
        int node = -1, numNodes = -1, localRank = -1, localSize = -1;
        FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &localRank, &localSize));
        EXPECT_EQ(node, ctx.rank / s.localSize);
        EXPECT_EQ(numNodes, (s.nranks + s.localSize - 1) / s.localSize);
        EXPECT_EQ(localRank, ctx.rank % s.localSize);
      },
      &cfg);
}

// fuscoAllToAll and fuscoAllToAllv with every send and receive buffer kind (unregistered
// cudaMalloc, fuscoMemAlloc, registered), several sizes, on a created stream.
TEST_P(GpuNet, AllToAllAndAllToAllvAreBitExactForEveryBufferKind) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runNetRanks(GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    for (size_t count : {size_t{1}, size_t{1001}, size_t{300000}})
      for (Mem m : kAllMems) {
        auto u = makeA2avLayout(fusco::test::uniformCountMatrix(ctx.nranks, count), ctx.nranks,
                                ctx.rank, 4, seed, false);
        EXPECT_TRUE(gpuAllToAllChecked(comm, u, fuscoInt32, seed + count, m, m, true, stream.get()))
            << "all-to-all, count " << count << ", " << memName(m);
        auto v = makeA2avLayout(fusco::test::randomCountMatrix(seed + count, ctx.nranks, count, 10),
                                ctx.nranks, ctx.rank, 2, seed + 2, true);
        EXPECT_TRUE(
            gpuAllToAllChecked(comm, v, fuscoBfloat16, seed + 3, Mem::Cuda, m, false, stream.get()))
            << "all-to-all(v), up to " << count << ", " << memName(m);
      }
  });
}

// MoE dispatch with dedup NONE, RANK and AUTO (RANK across nodes on a CUDA comm): the receive
// counts and every received row against the sequential reference, twice in a row.
TEST_P(GpuNet, MoeDispatchMatchesTheReferenceForNoneRankAndAuto) {
  FUSCO_GPU_REQUIRE();
  const Shape s = GetParam();
  const uint64_t seed = fusco::test::testSeed();
  runNetRanks(s, [&](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    fusco::test::MoeCase c;
    c.nranks = s.nranks;
    c.localSize = s.localSize;
    c.numExperts = 4 * s.nranks;
    c.topk = 4;
    c.numTokens.assign(s.nranks, 0);
    for (int r = 0; r < s.nranks; ++r) c.numTokens[r] = 200 + 37 * r;
    const auto setup = fusco::test::makeCombine(c, seed, fuscoBfloat16, 512);
    const size_t rowBytes = 512 * 2;
    for (int dedup : {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK, FUSCO_DEDUP_AUTO}) {
      fuscoMoeHandle_t h = nullptr;
      ASSERT_TRUE(
          gpuPlan(comm, ctx.rank, c, setup.p, setup.d, dedup, FUSCO_BALANCE_AUTO, stream.get(), &h))
          << fusco::test::dedupName(dedup);
      for (int round = 0; round < 2; ++round)
        EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, setup.p, setup.d, setup.x, rowBytes, Mem::Cuda,
                                round ? Mem::Arena : Mem::Cuda, stream.get()))
            << fusco::test::dedupName(dedup) << " round " << round;
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuNet, kShapes, shapeName);

// What the bridge cannot carry is refused alike on every rank, with a message, and the comm stays
// usable: NODE dedup at plan time, combine (its kernel reads the experts' outputs in place), and
// a call captured into a CUDA graph.
TEST(GpuNetRefused, NodeDedupCombineAndCaptureAreRefusedWithAMessage) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runNetRanks({4, 2}, [&](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    fusco::test::MoeCase c;
    c.nranks = 4;
    c.localSize = 2;
    c.numTokens = {64, 64, 64, 64};
    const auto setup = fusco::test::makeCombine(c, seed, fuscoBfloat16, 256);
    fuscoMoeHandle_t h = nullptr;
    EXPECT_FALSE(gpuPlan(comm, ctx.rank, c, setup.p, setup.d, FUSCO_DEDUP_NODE, FUSCO_BALANCE_AUTO,
                         stream.get(), &h));
    EXPECT_NE(std::string(fuscoGetLastError(comm)).find("dedup NODE"), std::string::npos)
        << fuscoGetLastError(comm);
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, c, setup.p, setup.d, FUSCO_DEDUP_RANK, FUSCO_BALANCE_AUTO,
                        stream.get(), &h));
    MoeRankBufs b = moeRankBufs(comm, setup, ctx.rank);
    const fuscoResult_t r =
        fuscoMoeCombine(h, b.expertOut.get(), fuscoBfloat16, 256,
                        static_cast<const float*>(b.weights.get()), b.out.get(), stream.api());
    EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetErrorString(r);
    EXPECT_NE(std::string(fuscoGetLastError(comm)).find("another node"), std::string::npos)
        << fuscoGetLastError(comm);
    CUDA_EXPECT_OK(cudaStreamSynchronize(stream.get()));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    // Capture: refused; the capture is ended and the comm still moves data.
    DevBuf send = poisonedBuf(comm, 4 * 64), recv = poisonedBuf(comm, 4 * 64);
    CUDA_ASSERT_OK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    const fuscoResult_t g =
        fuscoAllToAll(send.get(), recv.get(), 16, fuscoInt32, comm, stream.api());
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream.get(), &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    EXPECT_EQ(g, fuscoInvalidUsage) << fuscoGetErrorString(g);
    EXPECT_NE(std::string(fuscoGetLastError(comm)).find("CUDA graph"), std::string::npos)
        << fuscoGetLastError(comm);
    auto l = makeA2avLayout(fusco::test::uniformCountMatrix(4, 99), 4, ctx.rank, 4, 5, false);
    EXPECT_TRUE(
        gpuAllToAllChecked(comm, l, fuscoInt32, 5, Mem::Cuda, Mem::Cuda, true, stream.get()));
  });
}

// A rank of the other node killed before a large all-to-all: every survivor's stream finishes
// within the timeout plus a margin and the comm reports an error naming the rank.
TEST(GpuNetFault, RemoteRankKilledReleasesEverySurvivorsStream) {
  FUSCO_GPU_REQUIRE();
  useLoopbackUcx();
  MpOptions o = gpuOptions(90);
  o.mayDie = {3};
  runRanks(
      4,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = netConfig(4, 2, 3000);
        fuscoComm_t comm = initGpuComm(ctx, &cfg);
        Stream stream;
        auto small =
            makeA2avLayout(fusco::test::uniformCountMatrix(4, 100), 4, ctx.rank, 4, 1, false);
        ASSERT_TRUE(gpuAllToAllChecked(comm, small, fuscoInt32, 1, Mem::Cuda, Mem::Cuda, true,
                                       stream.get()));
        if (ctx.rank == 3) {
          usleep(300 * 1000);
          raise(SIGKILL);
        }
        const size_t count = 1 << 20;
        {
          DevBuf send = poisonedBuf(comm, 4 * count * 4), recv = poisonedBuf(comm, 4 * count * 4);
          const double t0 = nowSec();
          const fuscoResult_t r =
              fuscoAllToAll(send.get(), recv.get(), count, fuscoFloat32, comm, stream.api());
          EXPECT_NE(syncWithin(stream.get(), 13.0), cudaErrorNotReady)
              << "a survivor's stream still waits for the dead rank";
          fuscoResult_t async = fuscoSuccess;
          EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
          EXPECT_TRUE(r != fuscoSuccess || async != fuscoSuccess) << "nobody reported rank 3";
          EXPECT_TRUE(namesRank(fuscoGetLastError(comm), 3)) << fuscoGetLastError(comm);
          EXPECT_LT(nowSec() - t0, 13.0);
        }
        const double t0 = nowSec();
        EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess);
        EXPECT_LT(nowSec() - t0, 5.0) << "destroy must not wait for the dead peer";
      },
      o);
}

// FUSCO_NET_GDR=1 where UCX reports no CUDA memory (Debian's UCX) fails init on every rank with a
// message that says why; FUSCO_NET_GDR=0 and auto use the staged path.
TEST(GpuNetGdr, ForcedGpuDirectWithoutItFailsInitSayingWhy) {
  FUSCO_GPU_REQUIRE();
  useLoopbackUcx();
  setenv("FUSCO_NET_GDR", "1", 1);
  runRanks(
      2,
      [](const RankCtx& ctx) {
        CUDA_EXPECT_OK(cudaSetDevice(0));
        fuscoConfig_t cfg = netConfig(2, 1, 20000);
        fuscoComm_t comm = nullptr;
        const fuscoResult_t r = fuscoCommInitRankConfig(&comm, 2, ctx.id, ctx.rank, &cfg);
        const std::string msg = fuscoGetLastError(nullptr);
        EXPECT_NE(r, fuscoSuccess);
        EXPECT_NE(msg.find("FUSCO_NET_GDR=1"), std::string::npos) << msg;
        if (r == fuscoSuccess) fuscoCommDestroy(comm);
      },
      gpuOptions());
  setenv("FUSCO_NET_GDR", "0", 1);
  runNetRanks({2, 1}, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    auto l = makeA2avLayout(fusco::test::uniformCountMatrix(2, 4096), 2, ctx.rank, 4, 8, false);
    EXPECT_TRUE(
        gpuAllToAllChecked(comm, l, fuscoInt32, 8, Mem::Cuda, Mem::Cuda, true, stream.get()));
  });
  unsetenv("FUSCO_NET_GDR");
}

}  // namespace
