// Low-latency dispatch and combine captured into a CUDA graph on CUDA comms (docs/API.md,
// "Low-latency dispatch and combine", "CUDA graphs"): every rank captures one dispatch and its
// combine (the first use of the buffer is under capture), then replays the graph three times with
// new rows, routing, weights and expert outputs written into the same device buffers; each replay
// repeats the calls on the captured half and must give exactly the reference's receive slots and
// `out` for those contents. An eager round afterwards is exact too.
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
using fusco::test::makeLlInputs;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

constexpr int kReplays = 3;

// One rank's graph of a dispatch and its combine; destroyed before the buffers it uses.
class LlGraph {
 public:
  LlGraph() = default;
  ~LlGraph() {
    if (exec_ != nullptr) CUDA_EXPECT_OK(cudaGraphExecDestroy(exec_));
    if (graph_ != nullptr) CUDA_EXPECT_OK(cudaGraphDestroy(graph_));
  }
  LlGraph(const LlGraph&) = delete;
  LlGraph& operator=(const LlGraph&) = delete;

  // Captures dispatch + combine of `in`'s shape from b, expertOut and out on s; *d gets the
  // dispatch's outputs.
  ::testing::AssertionResult capture(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                     const LlInputs& in, int format, const LlDevInputs& b,
                                     const DevBuf& expertOut, const DevBuf& out, cudaStream_t s,
                                     fuscoLowLatencyDispatch_t* d) {
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaStreamBeginCapture -> " << cudaGetErrorName(e);
    fuscoResult_t r = llGpuDispatch(ll, b, in, ctx.rank, format, 0, d, s);
    if (r == fuscoSuccess)
      r = llGpuCombine(ll, d, expertOut, b, in, ctx.rank, true, 0,
                       in.c.numTokens[ctx.rank] ? out.get() : nullptr, nullptr, s);
    const std::string msg = r == fuscoSuccess ? "" : fuscoGetLastError(comm);
    e = cudaStreamEndCapture(s, &graph_);
    if (r != fuscoSuccess)
      return ::testing::AssertionFailure()
             << "a call under capture -> " << fuscoGetErrorString(r) << ": " << msg;
    if (e != cudaSuccess)
      return ::testing::AssertionFailure() << "cudaStreamEndCapture -> " << cudaGetErrorName(e);
    e = cudaGraphInstantiate(&exec_, graph_, 0);
    if (e == cudaSuccess) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "cudaGraphInstantiate -> " << cudaGetErrorName(e);
  }

  ::testing::AssertionResult launch(cudaStream_t s) const {
    const cudaError_t e = cudaGraphLaunch(exec_, s);
    if (e == cudaSuccess) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "cudaGraphLaunch -> " << cudaGetErrorName(e);
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Writes replay i's contents into the captured buffers: rows, routing, weights, and the expert
// outputs of the rows this rank must receive; out poisoned.
void loadReplay(const RankCtx& ctx, const LlInputs& in, int format, LlDevInputs& b, DevBuf& eo,
                DevBuf& out) {
  llReload(b, in, ctx.rank);
  const auto want = fusco::test::llRecvOf(fusco::test::llRefDispatch(in, ctx.rank, format));
  eo.upload(fusco::test::llExpertOut(in.c, format, ctx.rank, want));
  out.poison();
}

// After replay `what`: the receive slots and out against the reference of `in`.
void checkReplay(fuscoComm_t comm, const RankCtx& ctx, const LlInputs& in, int format,
                 const fuscoLowLatencyDispatch_t& d, const DevBuf& out, cudaStream_t s,
                 const std::string& what) {
  ASSERT_TRUE(llFinish(s, comm, what));
  EXPECT_TRUE(fusco::test::llRecvMatches(in.c, format,
                                         fusco::test::llRefDispatch(in, ctx.rank, format),
                                         llFetchDevice(d, in.c, format)))
      << what << " rank " << ctx.rank << " received";
  const size_t bytes = static_cast<size_t>(in.c.numTokens[ctx.rank]) * in.c.hidden * 2;
  std::vector<uint8_t> got = out.download();
  EXPECT_EQ(fusco::test::findNotPoison(got.data() + bytes, kTailBytes), SIZE_MAX)
      << what << ": combine wrote past its out";
  got.resize(bytes);
  EXPECT_TRUE(fusco::test::llOutMatches(fusco::test::llRefCombine(in, ctx.rank, format, true), got,
                                        in.c.hidden, what + " combine"));
}

// Captures and replays the graph of one format; every replay with new contents.
void replayFormat(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx, const LlCase& c,
                  int format, uint64_t seed, cudaStream_t s) {
  std::vector<LlInputs> ins;
  for (int i = 0; i < kReplays; ++i) ins.push_back(makeLlInputs(c, seed + i));
  LlDevInputs b = llUpload(comm, ins[0], ctx.rank);
  const size_t cap = fusco::test::llCap(c);
  DevBuf eo(comm, fusco::test::llNumLocal(c) * cap * c.hidden * 2u);
  DevBuf out(comm, static_cast<size_t>(c.numTokens[ctx.rank]) * c.hidden * 2 + kTailBytes);
  fuscoLowLatencyDispatch_t d;
  LlGraph graph;
  ASSERT_TRUE(graph.capture(comm, ll, ctx, ins[0], format, b, eo, out, s, &d));
  for (int i = 0; i < kReplays; ++i) {
    const std::string what = fusco::test::llCaseName(c, format) + " replay " + std::to_string(i);
    loadReplay(ctx, ins[i], format, b, eo, out);
    ASSERT_TRUE(graph.launch(s)) << what;
    checkReplay(comm, ctx, ins[i], format, d, out, s, what);
  }
}

TEST(GpuLowLatencyGraph, DispatchCombineReplaysMatchTheReferenceWithNewInputs) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(3, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    LlCase c;
    c.nranks = 3;
    c.numExperts = 12;
    c.topk = 4;
    c.hidden = 256;
    c.numTokens = {8, 64, 1};
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    replayFormat(comm, ll, ctx, c, FUSCO_LL_BF16, seed, stream.get());
    replayFormat(comm, ll, ctx, c, FUSCO_LL_FP8, seed + 10, stream.get());
    LlGpuRound o;
    o.buffer = -1;  // after captured calls: either half
    llGpuRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + 20), o, stream.get(),
                      "an eager round after the replays");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

}  // namespace
