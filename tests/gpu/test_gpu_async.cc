// Calls on CUDA comms only enqueue (src/engine/engine_async.h, src/exec/progress.h): each call
// puts a fixed skeleton on its stream and returns; the comm's progress thread exchanges the call's
// headers with the peers' progress threads later and lets the stream go on. So a call returns at
// once even when a peer has not reached it yet, a disagreement between ranks is found after the
// call returned (fuscoCommGetAsyncError reports it once; no byte moves; the comm stays usable),
// and the progress thread sleeps when idle. Graph capture: test_gpu_graph.cc.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::A2avLayout;
using fusco::test::CombineSetup;
using fusco::test::makeA2avLayout;
using fusco::test::MoeCase;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

constexpr int kRanks = 4;
constexpr int kLateRank = 3;
constexpr double kLateSec = 2.0;       // the late rank sleeps this long before its call
constexpr double kEnqueueSec = 0.010;  // a call on any other rank returns within this

void sleepSec(double sec) { std::this_thread::sleep_for(std::chrono::duration<double>(sec)); }

fuscoResult_t allToAll(fuscoComm_t comm, const A2avLayout& l, const DevBuf& send,
                       const DevBuf& recv, cudaStream_t s) {
  return fuscoAllToAll(send.get(), recv.get(), l.sendcounts[0], fuscoInt32, comm, s);
}

// A receive buffer for l with a poisoned tail of kTailBytes.
DevBuf recvBufFor(fuscoComm_t comm, const A2avLayout& l, Mem kind = Mem::Cuda) {
  return poisonedBuf(comm, l.recvElems * l.esize + kTailBytes, kind);
}

// recv (from recvBufFor) holds every block bit-exact, its gaps and tail still poison.
::testing::AssertionResult recvMatches(const A2avLayout& l, const DevBuf& recv, uint64_t seed) {
  const std::vector<uint8_t> got = recv.download();
  const size_t used = l.recvElems * l.esize;
  ::testing::AssertionResult ok = fusco::test::checkRecv(l, got.data(), seed);
  if (!ok) return ok;
  return fusco::test::isPoisoned(got.data() + used, got.size() - used, "the tail past recvbuff");
}

// The comm has no asynchronous error to report.
void expectNoAsyncError(fuscoComm_t comm, const std::string& when) {
  fuscoResult_t async = fuscoInternalError;
  FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
  EXPECT_EQ(async, fuscoSuccess) << when << ": fuscoCommGetAsyncError reports "
                                 << fuscoGetErrorString(async) << ": " << fuscoGetLastError(comm);
}

// Right after a call returned on a rank that is not late: it took under kEnqueueSec and its
// stream still waits for the late rank, which has not called yet.
void expectOnlyEnqueued(double sec, cudaStream_t s, const std::string& what) {
  EXPECT_LT(sec, kEnqueueSec) << what << " took " << sec * 1e3 << " ms to return while rank "
                              << kLateRank << " was " << kLateSec
                              << " s late: a call on a CUDA comm must only enqueue";
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady)
      << "the stream finished " << what << " before rank " << kLateRank << " called it";
}

TEST(GpuAsync, AllToAllReturnsAtOnceWhileAPeerIsLate) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(kRanks, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const A2avLayout l = fusco::test::uniformLayout(kRanks, ctx.rank, 65537, 4, seed);
    DevBuf send = sendBufFor(comm, l, seed), recv = recvBufFor(comm, l);
    // Warm-up on the same buffers, so connection setup and mappings do not count.
    FUSCO_ASSERT_OK(comm, allToAll(comm, l, send, recv, s));
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    recv.poison();
    if (ctx.rank == kLateRank) sleepSec(kLateSec);
    const double t0 = nowSec();
    const fuscoResult_t r = allToAll(comm, l, send, recv, s);
    const double sec = nowSec() - t0;
    FUSCO_ASSERT_OK(comm, r);
    if (ctx.rank != kLateRank) expectOnlyEnqueued(sec, s, "fuscoAllToAll");
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(recvMatches(l, recv, seed)) << "after rank " << kLateRank << " came late";
    expectNoAsyncError(comm, "after the late rank's call");
  });
}

// 4 ranks, 16 experts, top-3, bf16 rows of 72 elements, weighted combine.
CombineSetup lateMoeSetup(uint64_t seed) {
  MoeCase c = oneNodeCase(kRanks);
  c.numExperts = 16;
  c.topk = 3;
  c.numTokens = {40, 33, 57, 21};
  return fusco::test::makeCombine(c, seed, fuscoBfloat16, 72);
}

struct MoeTimes {
  double dispatch = 0, combine = 0;
};

// fuscoMoeDispatch then fuscoMoeCombine on b, each timed on the host around the call only.
MoeTimes enqueueMoeRound(fuscoComm_t comm, fuscoMoeHandle_t h, const CombineSetup& setup,
                         const MoeRankBufs& b, cudaStream_t s) {
  const size_t rowBytes = setup.hidden * fusco::test::dtypeSize(setup.dt);
  MoeTimes t;
  double t0 = nowSec();
  fuscoResult_t r = fuscoMoeDispatch(h, b.x.get(), rowBytes, b.recvX.get(), s);
  t.dispatch = nowSec() - t0;
  FUSCO_EXPECT_OK(comm, r);
  t0 = nowSec();
  r = fuscoMoeCombine(h, b.expertOut.get(), setup.dt, setup.hidden,
                      static_cast<const float*>(b.weights.get()), b.out.get(), s);
  t.combine = nowSec() - t0;
  FUSCO_EXPECT_OK(comm, r);
  return t;
}

// After the stream finished: recvX and out equal the reference bit for bit.
void expectMoeRound(const CombineSetup& setup, const MoeRankBufs& b, int rank,
                    const std::string& what) {
  EXPECT_TRUE(b.recvX.download() == setup.d.recvX[rank])
      << what << ": recvX differs from the reference";
  const auto want = fusco::test::moeRefCombine(setup.p, setup.d, setup.expertOut, setup.dt,
                                               setup.hidden, setup.weights);
  EXPECT_TRUE(b.out.download() == want[rank]) << what << ": combine out differs from the reference";
}

TEST(GpuAsync, MoeDispatchAndCombineReturnAtOnceWhileAPeerIsLate) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(kRanks, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const CombineSetup setup = lateMoeSetup(seed);
    fuscoMoeHandle_t h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, setup.c, setup.p, setup.d, FUSCO_DEDUP_RANK,
                        FUSCO_BALANCE_AUTO, s, &h));
    {
      MoeRankBufs b = moeRankBufs(comm, setup, ctx.rank);
      enqueueMoeRound(comm, h, setup, b, s);  // warm-up on the same buffers, checked
      CUDA_ASSERT_OK(cudaStreamSynchronize(s));
      expectMoeRound(setup, b, ctx.rank, "the warm-up round");
      b.recvX.poison();
      b.out.poison();
      if (ctx.rank == kLateRank) sleepSec(kLateSec);
      const MoeTimes t = enqueueMoeRound(comm, h, setup, b, s);
      if (ctx.rank != kLateRank) {
        EXPECT_LT(t.dispatch, kEnqueueSec) << "fuscoMoeDispatch took " << t.dispatch * 1e3 << " ms";
        expectOnlyEnqueued(t.combine, s, "fuscoMoeCombine");
      }
      CUDA_ASSERT_OK(cudaStreamSynchronize(s));
      expectMoeRound(setup, b, ctx.rank, "the round with a late rank");
    }
    expectNoAsyncError(comm, "after the late rank's MoE calls");
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  });
}

// Random counts, except that rank 1 sends 100 elements to rank 2 while rank 2 (viewer 2) expects
// 96 from rank 1: 400 bytes against 384.
A2avLayout mismatchedLayout(int rank, uint64_t seed) {
  std::vector<size_t> counts = fusco::test::randomCountMatrix(seed, kRanks, 3000, 0);
  counts[1 * kRanks + 2] = rank == 2 ? 96 : 100;
  return makeA2avLayout(counts, kRanks, rank, 4, seed, true);
}

// After the stream of the mismatched call finished: the call failed on every rank (docs/API.md,
// "The collective error rule": no rank reports success for a call that failed anywhere), so
// fuscoCommGetAsyncError reports it on each, naming the pair; ranks 1 and 2 word it as the count
// that rank 1 sends.
void expectMismatchReported(fuscoComm_t comm, int rank) {
  fuscoResult_t async = fuscoSuccess;
  FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_EQ(async, fuscoInvalidArgument)
      << "async error " << fuscoGetErrorString(async) << " (" << msg << ")";
  EXPECT_TRUE(namesRank(msg, 1) && namesRank(msg, 2))
      << "message '" << msg << "' should name ranks 1 and 2";
  if (rank == 1 || rank == 2) {
    EXPECT_NE(msg.find("rank 1 sends"), std::string::npos)
        << "message '" << msg << "' should say what rank 1 sends";
  }
}

// fuscoAllToAllv is a collective with a verdict round (src/engine/op_rounds.cc, decideCollective):
// the pair's disagreement fails the call on every rank before any copy is resolved, so no rank's
// recvbuff is written, ranks 0 and 3 included, as on the host path (tests/mp/test_bad_input.cc,
// BadInput.MismatchedAllToAllvCountsFailEveryRank).
TEST(GpuAsync, MismatchedAllToAllvCountsAreReportedOnceAsAsyncErrorsAndCommStaysUsable) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(kRanks, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const A2avLayout l = mismatchedLayout(ctx.rank, seed);
    DevBuf send = sendBufFor(comm, l, seed), recv = recvBufFor(comm, l);
    FUSCO_EXPECT_OK(comm,
                    fuscoAllToAllv(send.get(), l.sendcounts.data(), l.sdispls.data(), recv.get(),
                                   l.recvcounts.data(), l.rdispls.data(), fuscoInt32, comm, s));
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    expectMismatchReported(comm, ctx.rank);
    const std::vector<uint8_t> got = recv.download();
    EXPECT_TRUE(fusco::test::isPoisoned(got.data(), got.size(), "recvbuff"))
        << "a call that failed on every rank moved bytes (src/engine/engine_async.h: a call "
           "whose arguments disagree with a peer's moves no byte)";
    expectNoAsyncError(comm, "a second fuscoCommGetAsyncError (the error is reported once)");
    const A2avLayout good =
        makeA2avLayout(fusco::test::randomCountMatrix(seed + 1, kRanks, 3000, 10), kRanks, ctx.rank,
                       4, seed + 1, true);
    EXPECT_TRUE(
        gpuAllToAllChecked(comm, good, fuscoInt32, seed + 1, Mem::Cuda, Mem::Cuda, false, s))
        << "fuscoAllToAllv with consistent counts after the mismatch";
    expectNoAsyncError(comm, "after the consistent fuscoAllToAllv");
  });
}

constexpr int kOddRank = 2;

// 4 ranks, 12 experts, top-2, fp32 rows of 24 elements (96 bytes), every slot used.
CombineSetup rowBytesSetup(uint64_t seed) {
  MoeCase c = oneNodeCase(kRanks);
  c.numExperts = 12;
  c.topk = 2;
  c.numTokens = {30, 26, 35, 22};
  c.unusedPercent = 0;
  return fusco::test::makeCombine(c, seed, fuscoFloat32, 24);
}

// After the stream of the dispatch with rank kOddRank's odd rowBytes finished: a rank whose call
// succeeded learns the failure from fuscoCommGetAsyncError (a message naming kOddRank); only
// kOddRank may have failed the call itself, with fuscoInvalidArgument. Drains the async error.
void expectRowBytesFailure(fuscoComm_t comm, int rank, fuscoResult_t r,
                           const std::string& callMsg) {
  fuscoResult_t async = fuscoSuccess;
  FUSCO_EXPECT_OK(comm, fuscoCommGetAsyncError(comm, &async));
  const std::string msg = fuscoGetLastError(comm);
  if (r != fuscoSuccess) {
    EXPECT_EQ(rank, kOddRank) << "a rank that passed the common rowBytes failed the call: "
                              << fuscoGetErrorString(r) << ": " << callMsg;
    EXPECT_EQ(r, fuscoInvalidArgument) << callMsg;
    return;
  }
  EXPECT_EQ(async, fuscoInvalidArgument)
      << "the dispatch with rank " << kOddRank << "'s different rowBytes: async error "
      << fuscoGetErrorString(async) << " (" << msg << ")";
  EXPECT_TRUE(namesRank(msg, kOddRank)) << "message '" << msg << "' should name rank " << kOddRank;
}

TEST(GpuAsync, MoeDispatchRowBytesDifferingOnOneRankFailsEveryRankAndCommStaysUsable) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(kRanks, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const CombineSetup setup = rowBytesSetup(seed);
    const size_t rowBytes = 24 * 4;
    fuscoMoeHandle_t h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, setup.c, setup.p, setup.d, FUSCO_DEDUP_RANK,
                        FUSCO_BALANCE_AUTO, s, &h));
    {
      // Smaller rows on kOddRank (80 bytes), so its buffers, sized for 96-byte rows, hold them.
      MoeRankBufs b = moeRankBufs(comm, setup, ctx.rank);
      const size_t mine = ctx.rank == kOddRank ? rowBytes - 16 : rowBytes;
      const fuscoResult_t r = fuscoMoeDispatch(h, b.x.get(), mine, b.recvX.get(), s);
      const std::string callMsg = fuscoGetLastError(comm);
      CUDA_ASSERT_OK(cudaStreamSynchronize(s));
      expectRowBytesFailure(comm, ctx.rank, r, callMsg);
    }
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, setup.p, setup.d, setup.x, rowBytes, Mem::Cuda,
                            Mem::Cuda, s))
        << "the next dispatch, with the same rowBytes on every rank";
    expectNoAsyncError(comm, "after the correct dispatch");
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  });
}

// User plus system CPU time of this rank process so far.
double processCpuSec() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

TEST(GpuAsync, IdleProgressThreadUsesNoCpu) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(kRanks, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const A2avLayout l = fusco::test::uniformLayout(kRanks, ctx.rank, 65537, 4, seed);
    // A completed call (synchronized inside): its waits are satisfied, nothing is queued.
    ASSERT_TRUE(
        gpuAllToAllChecked(comm, l, fuscoInt32, seed, Mem::Cuda, Mem::Cuda, true, stream.get()));
    const double cpu0 = processCpuSec(), t0 = nowSec();
    sleepSec(1.0);
    const double cpu = processCpuSec() - cpu0, wall = nowSec() - t0;
    EXPECT_LT(cpu, 0.100) << "rank " << ctx.rank << " used " << cpu * 1e3 << " ms of CPU over "
                          << wall << " s of sleep after its last call completed: the progress "
                          << "thread must sleep when it has neither work nor waits";
  });
}

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(GpuAsync, AllToAllEnqueueTakesUnderAMillisecond) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(kRanks, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    constexpr int kCalls = 50;
    const cudaStream_t s = stream.get();
    const A2avLayout l = fusco::test::uniformLayout(kRanks, ctx.rank, (1 << 20) / 4, 4,
                                                    seed);  // 1 MiB to every peer
    DevBuf send = sendBufFor(comm, l, seed), recv = recvBufFor(comm, l, Mem::Arena);
    FUSCO_ASSERT_OK(comm, allToAll(comm, l, send, recv, s));  // warm-up
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    recv.poison();
    std::vector<double> sec(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      const double t0 = nowSec();
      const fuscoResult_t r = allToAll(comm, l, send, recv, s);
      sec[i] = nowSec() - t0;
      FUSCO_ASSERT_OK(comm, r);
    }
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(recvMatches(l, recv, seed)) << "after " << kCalls << " back-to-back calls";
    const double median = medianOf(sec);
    std::cout << "[gpu async] rank " << ctx.rank << ": fuscoAllToAll (1 MiB per peer, " << kRanks
              << " ranks) enqueue time, median of " << kCalls << " calls: " << median * 1e6 << " us"
              << std::endl;
    EXPECT_LT(median, 1e-3) << "median host time per enqueued fuscoAllToAll";
    expectNoAsyncError(comm, "after the back-to-back calls");
  });
}

}  // namespace
