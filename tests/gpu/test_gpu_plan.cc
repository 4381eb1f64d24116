// The GPU planner's kernels (src/device/plan_kernels.cu) against the host planner: the cases of
// tests/unit/test_gpu_plan_twin.cc (harness/gpu_plan_cases.h), every rank's steps run on the
// device of one forked process, every list compared with the host planner's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "gpu/gpu_harness.h"
#include "harness/gpu_plan_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::GpuPlanCase;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

// Device buffers (poisoned), the kernels on one stream, copies after a stream sync.
class KernelExec {
 public:
  KernelExec() { CUDA_EXPECT_OK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~KernelExec() {
    cudaStreamSynchronize(s_);
    for (void* p : bufs_) cudaFree(p);
    cudaStreamDestroy(s_);
  }
  char* alloc(size_t bytes) {
    void* p = nullptr;
    CUDA_EXPECT_OK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    CUDA_EXPECT_OK(cudaMemset(p, 0xA5, bytes));
    bufs_.push_back(p);
    return static_cast<char*>(p);
  }
  void toDevice(void* dst, const void* src, size_t bytes) {
    CUDA_EXPECT_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  // After a failed step nothing is read back: the sizes the run reads stay zero, so it never
  // sizes host buffers from the poison of a step that did not run.
  void toHost(void* dst, const void* src, size_t bytes) {
    if (!ok_) {
      memset(dst, 0, bytes);
      return;
    }
    CUDA_EXPECT_OK(cudaStreamSynchronize(s_));
    CUDA_EXPECT_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void send(const fusco::gplan::SendArgs& a) { step(fusco::devicePlanSend(a, s_), "send"); }
  void recv(const fusco::gplan::RecvArgs& a) { step(fusco::devicePlanRecv(a, s_), "recv"); }
  void terms(const fusco::gplan::SendArgs& a, const int64_t* fan) {
    step(fusco::devicePlanTermRows(a, fan, s_), "terms");
  }

 private:
  void step(fuscoResult_t r, const char* what) {
    EXPECT_EQ(r, fuscoSuccess) << "the planner's " << what << " step";
    ok_ = ok_ && r == fuscoSuccess;
  }

  bool ok_ = true;
  cudaStream_t s_ = nullptr;
  std::vector<void*> bufs_;
};

// Runs body in one forked process with device 0 selected.
template <typename F>
void onDevice(F body) {
  fusco::test::runRanks(
      1,
      [&body](const RankCtx&) {
        CUDA_ASSERT_OK(cudaSetDevice(0));
        body();
      },
      gpuOptions());
}

class GpuPlan : public ::testing::TestWithParam<GpuPlanCase> {};

TEST_P(GpuPlan, KernelListsEqualTheHostPlanner) {
  FUSCO_GPU_REQUIRE();
  const GpuPlanCase c = GetParam();
  onDevice([&c] {
    const fusco::test::MoeRefProblem p =
        fusco::test::makeProblem(c.moe, fusco::test::testSeed(c.salt));
    KernelExec x;
    fusco::test::GpuPlanRun run(p, c.dedup, c.entrySlack);
    run.execute(x);
    EXPECT_EQ(run.compareWithHostPlanner(), "") << c.name;
  });
}

INSTANTIATE_TEST_SUITE_P(Routings, GpuPlan, ::testing::ValuesIn(fusco::test::gpuPlanCases()),
                         [](const ::testing::TestParamInfo<GpuPlanCase>& i) {
                           return i.param.name;
                         });

// A receive side sized too small: the overflow is reported and no fan row is written.
TEST(GpuPlanCapacity, TooManyEntriesAreReportedAndNothingIsWritten) {
  FUSCO_GPU_REQUIRE();
  onDevice([] {
    fusco::test::MoeCase mc;
    mc.nranks = 3;
    mc.numExperts = 6;
    mc.topk = 2;
    mc.numTokens = {30, 30, 30};
    const fusco::test::MoeRefProblem p = fusco::test::makeProblem(mc, fusco::test::testSeed(7));
    KernelExec x;
    fusco::test::GpuPlanRun run(p, fusco::Dedup::Rank, 0);
    run.capEntries(1);
    run.execute(x);
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(run.recvErrors(r) & fusco::gplan::kErrOverflow, 0u) << "rank " << r;
      EXPECT_TRUE(run.fanRowsUntouched(r)) << "rank " << r;
    }
  });
}

}  // namespace
