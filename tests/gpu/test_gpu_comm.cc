// CUDA communicators (fuscoMemCuda): init on device 0 with 2, 4 and 8 rank processes on one GPU,
// one node, device memory from fuscoMemAlloc, registration of cudaMalloc'd buffers; init failures
// with a clear result and message (no visible device). Ranks on several nodes: test_gpu_net.cc.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;
using namespace fusco::test::gpu;

// An out-parameter value a failed init must leave alone (docs/API.md: never written on failure).
fuscoComm_t sentinelComm() { return reinterpret_cast<fuscoComm_t>(uintptr_t{0x5a5a5a5a}); }

class GpuComm : public ::testing::TestWithParam<int> {};

TEST_P(GpuComm, InitOnOneGpuGivesOneNodeAndDeviceMemory) {
  FUSCO_GPU_REQUIRE();
  runGpuRanks(GetParam(), [](const RankCtx& ctx, fuscoComm_t comm) {
    int count = -1, rank = -1, node = -1, numNodes = -1, localRank = -1, localSize = -1;
    FUSCO_EXPECT_OK(comm, fuscoCommCount(comm, &count));
    FUSCO_EXPECT_OK(comm, fuscoCommUserRank(comm, &rank));
    FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &localRank, &localSize));
    EXPECT_EQ(count, ctx.nranks);
    EXPECT_EQ(rank, ctx.rank);
    EXPECT_EQ(node, 0);
    EXPECT_EQ(numNodes, 1);
    EXPECT_EQ(localRank, ctx.rank);
    EXPECT_EQ(localSize, ctx.nranks);
    fuscoResult_t async = fuscoInternalError;
    FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, fuscoSuccess);

    // fuscoMemAlloc on a CUDA comm: device memory of device 0, usable by cudaMemcpy.
    void* p = nullptr;
    FUSCO_EXPECT_OK(comm, fuscoMemAlloc(comm, &p, (1 << 20) + 13));
    if (p != nullptr) {
      EXPECT_TRUE(isDevicePointer(p)) << "fuscoMemAlloc returned " << p << ", not device memory";
      std::vector<uint8_t> in((1 << 20) + 13), out(in.size());
      fusco::test::fillPayload(in.data(), 3, ctx.rank, 0, 0, in.size());
      CUDA_EXPECT_OK(cudaMemcpy(p, in.data(), in.size(), cudaMemcpyHostToDevice));
      CUDA_EXPECT_OK(cudaMemcpy(out.data(), p, out.size(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(in == out) << "fuscoMemAlloc memory does not hold what was copied in";
      FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, p));
    }
    // A few allocations alive at once, freed out of order.
    std::vector<void*> ps(4, nullptr);
    for (size_t i = 0; i < ps.size(); ++i)
      FUSCO_EXPECT_OK(comm, fuscoMemAlloc(comm, &ps[i], 4096 * (i + 1) + 1));
    for (size_t i : {2, 0, 3, 1})
      if (ps[i] != nullptr) FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, ps[i]));

    // Registration of a cudaMalloc'd buffer, whole and a sub-range, then deregistration.
    void* d = nullptr;
    CUDA_EXPECT_OK(cudaMalloc(&d, 3 << 20));
    if (d != nullptr) {
      void* h = nullptr;
      FUSCO_EXPECT_OK(comm, fuscoCommRegister(comm, d, 3 << 20, &h));
      if (h != nullptr) FUSCO_EXPECT_OK(comm, fuscoCommDeregister(comm, h));
      h = nullptr;
      FUSCO_EXPECT_OK(comm, fuscoCommRegister(comm, static_cast<uint8_t*>(d) + 4096, 1 << 20, &h));
      if (h != nullptr) FUSCO_EXPECT_OK(comm, fuscoCommDeregister(comm, h));
      CUDA_EXPECT_OK(cudaFree(d));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuComm, ::testing::Values(2, 4, 8), ranksName);

// cudaDevice -1: the calling thread's current device (set to 0 here).
TEST(GpuCommInit, DeviceMinusOneUsesTheCurrentDevice) {
  FUSCO_GPU_REQUIRE();
  fuscoConfig_t cfg = gpuConfig(2);
  cfg.cudaDevice = -1;
  runGpuRanks(
      2,
      [](const RankCtx&, fuscoComm_t comm) {
        void* p = nullptr;
        FUSCO_EXPECT_OK(comm, fuscoMemAlloc(comm, &p, 1000));
        if (p != nullptr) {
          EXPECT_TRUE(isDevicePointer(p));
          FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, p));
        }
      },
      &cfg);
}

// With CUDA_VISIBLE_DEVICES=-1 in the ranks, CUDA finds no device: init must fail with
// fuscoUnhandledCudaError and a message, leave the out-parameter alone and not hang.
TEST(GpuCommInit, NoVisibleDeviceFailsWithUnhandledCudaError) {
  FUSCO_GPU_REQUIRE();
  auto opt = gpuOptions(60);
  opt.env = {{"CUDA_VISIBLE_DEVICES", "-1"}};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = gpuConfig(ctx.nranks, 5000);
        fuscoComm_t comm = sentinelComm();
        const double t0 = nowSec();
        fuscoResult_t r = fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
        const double sec = nowSec() - t0;
        const std::string msg = fuscoGetLastError(nullptr);
        EXPECT_EQ(r, fuscoUnhandledCudaError)
            << fuscoGetErrorString(r) << ": " << msg << " (no device is visible)";
        EXPECT_FALSE(msg.empty()) << "no message for a failed CUDA init";
        EXPECT_EQ(comm, sentinelComm()) << "comm written although init failed";
        EXPECT_LT(sec, 15.0) << "a failed CUDA init took " << sec << " s";
        if (r == fuscoSuccess) fuscoCommDestroy(comm);
      },
      opt);
}

// A device index that does not exist: init fails (any error) with a message and does not hang.
TEST(GpuCommInit, DeviceIndexOutOfRangeFailsInit) {
  FUSCO_GPU_REQUIRE();
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = gpuConfig(ctx.nranks, 5000);
        cfg.cudaDevice = 4096;
        fuscoComm_t comm = sentinelComm();
        fuscoResult_t r = fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
        EXPECT_NE(r, fuscoSuccess) << "init on CUDA device 4096 succeeded";
        EXPECT_FALSE(std::string(fuscoGetLastError(nullptr)).empty());
        EXPECT_EQ(comm, sentinelComm()) << "comm written although init failed";
        if (r == fuscoSuccess) fuscoCommDestroy(comm);
      },
      gpuOptions(60));
}

}  // namespace
