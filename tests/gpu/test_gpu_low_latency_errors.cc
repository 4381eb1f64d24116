// Low-latency errors and faults on CUDA comms (docs/API.md, "Low-latency dispatch and combine",
// "Errors"): an invalid expert id moves nothing for its slot and is reported by
// fuscoCommGetAsyncError as fuscoInvalidArgument naming the token and slot, while every other row
// arrives and later rounds are exact; a rank killed before a dispatch leaves no survivor's stream
// waiting past the timeout, and fuscoCommGetAsyncError names it.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>

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
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;
using namespace fusco::test::gpu;

constexpr int kTimeoutMs = 3000;
constexpr double kSurviveSec = 13.0;  // timeoutMs + a generous margin (contexts on one GPU)

LlCase errorCase() {
  LlCase c;
  c.nranks = 3;
  c.numExperts = 12;
  c.topk = 4;
  c.maxTopk = 4;
  c.maxTokensPerRank = 16;
  c.hidden = 128;
  c.numTokens = {10, 10, 7};
  return c;
}

// Rank 1 routes token 5 slot 1 to expert numExperts + 3. Every call is enqueued; rank 1's comm
// reports the id (reported once, like other enqueued argument errors); every rank's receive
// slots hold every other row; two more rounds on the following halves are exact.
TEST(GpuLowLatencyErrors, InvalidIdIsAnAsyncErrorNamingTokenAndSlot) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(3, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const LlCase c = errorCase();
    LlInputs in = makeLlInputs(c, seed);
    in.topkIdx[1][5 * c.topk + 1] = c.numExperts + 3;
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    {
      const LlDevInputs b = llUpload(comm, in, ctx.rank);
      fuscoLowLatencyDispatch_t d;
      FUSCO_ASSERT_OK(comm, llGpuDispatch(ll, b, in, ctx.rank, FUSCO_LL_BF16, 0, &d, s));
      const cudaError_t e = syncWithin(s, kLlWaitSec);
      ASSERT_EQ(e, cudaSuccess) << streamSyncFailure(e, "the dispatch with an invalid id");
      fuscoResult_t async = fuscoSuccess;
      FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
      if (ctx.rank == 1) {
        const std::string msg = fuscoGetLastError(comm);
        EXPECT_EQ(async, fuscoInvalidArgument) << fuscoGetErrorString(async) << ": " << msg;
        EXPECT_TRUE(fusco::test::llNamesNumber(msg, "token", 5)) << msg;
        EXPECT_TRUE(fusco::test::llNamesNumber(msg, "slot", 1)) << msg;
      }
      EXPECT_TRUE(fusco::test::llDispatchFields(d, FUSCO_LL_BF16, 0, false));
      EXPECT_TRUE(fusco::test::llRecvMatches(
          c, FUSCO_LL_BF16, fusco::test::llRefDispatch(in, ctx.rank, FUSCO_LL_BF16),
          llFetchDevice(d, c, FUSCO_LL_BF16)))
          << "rank " << ctx.rank << " next to an invalid id";
    }
    for (int round = 1; round <= 2; ++round) {
      LlGpuRound o;
      o.buffer = round % 2;
      o.format = FUSCO_LL_FP8;
      llGpuRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + round), o, s,
                        "round " + std::to_string(round) + " after an invalid id");
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  });
}

bool isFaultError(fuscoResult_t r) { return r == fuscoRemoteError || r == fuscoTimeout; }

// A survivor's dispatch after `dead` died, returned r at t0: either the call fails with a fault
// error naming it, or its stream finishes (no CUDA fault) by t0 + kSurviveSec and the comm's
// async error is a fault error naming it.
void expectSurvivorSawDeath(fuscoComm_t comm, fuscoResult_t r, double t0, cudaStream_t s,
                            int dead) {
  if (r == fuscoSuccess) {
    const cudaError_t e = syncWithin(s, t0 + kSurviveSec - nowSec());
    EXPECT_NE(e, cudaErrorNotReady) << "the dispatch's stream was still waiting " << kSurviveSec
                                    << " s after it was enqueued, rank " << dead << " dead";
    EXPECT_TRUE(e == cudaSuccess || e == cudaErrorNotReady)
        << streamSyncFailure(e, "the dispatch") << " (a dead peer is not a CUDA fault)";
    EXPECT_EQ(fuscoCommGetAsyncError(comm, &r), fuscoSuccess);
  }
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_TRUE(isFaultError(r)) << "got " << fuscoGetErrorString(r) << " (" << msg
                               << "); expected fuscoRemoteError or fuscoTimeout";
  EXPECT_LT(nowSec() - t0, kSurviveSec);
  EXPECT_TRUE(fusco::test::namesRank(msg, dead)) << "'" << msg << "' should name rank " << dead;
}

// After one exact round rank 2 dies (SIGKILL) while the others enqueue a dispatch.
TEST(GpuLowLatencyErrors, PeerKilledBeforeDispatchIsReportedNamingIt) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  MpOptions opt = gpuOptions(90);
  opt.mayDie = {2};
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        fuscoConfig_t cfg = gpuConfig(3, kTimeoutMs);
        fuscoComm_t comm = initGpuComm(ctx, &cfg);
        {
          Stream stream;
          const cudaStream_t s = stream.get();
          const LlCase c = errorCase();
          fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
          ASSERT_NE(ll, nullptr);
          llGpuRoundChecked(comm, ll, ctx, makeLlInputs(c, seed), LlGpuRound{}, s, "first round");
          if (ctx.rank == 2) {
            usleep(300 * 1000);
            raise(SIGKILL);
          }
          const LlInputs in = makeLlInputs(c, seed + 1);
          const LlDevInputs b = llUpload(comm, in, ctx.rank);
          fuscoLowLatencyDispatch_t d;
          const double t0 = nowSec();
          const fuscoResult_t r = llGpuDispatch(ll, b, in, ctx.rank, FUSCO_LL_BF16, 0, &d, s);
          expectSurvivorSawDeath(comm, r, t0, s, 2);
          const double t1 = nowSec();
          fuscoLowLatencyDestroy(ll);  // its result after a fault is not specified; its time is
          EXPECT_LT(nowSec() - t1, kSurviveSec) << "fuscoLowLatencyDestroy after a peer died";
        }
        const double t2 = nowSec();
        EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
        EXPECT_LT(nowSec() - t2, 5.0) << "destroy must not wait for the dead peer";
      },
      opt);
}

}  // namespace
