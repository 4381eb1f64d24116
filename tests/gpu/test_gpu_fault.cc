// A rank of a CUDA comm killed (SIGKILL) before or during stream-ordered work: every survivor
// learns of it within the timeout (3 s here) plus a margin, either from the call itself
// (fuscoRemoteError / fuscoTimeout) or, when the call was only enqueued, from
// fuscoCommGetAsyncError once its stream has finished. Survivors never block on a stream without a
// deadline, destroy the comm promptly, and no process hangs (the harness kills any rank that does).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_kernels.h"
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

constexpr int kTimeoutMs = 3000;
constexpr double kSurviveSec = 13.0;  // timeoutMs + a generous margin (8 contexts on one GPU)

bool isFaultError(fuscoResult_t r) { return r == fuscoRemoteError || r == fuscoTimeout; }

// A CUDA comm with timeoutMs kTimeoutMs. The fault tests do not use runGpuRanks: a survivor
// destroys its comm itself (finishSurvivor), and a killed rank never gets that far.
fuscoComm_t initFaultComm(const RankCtx& ctx) {
  fuscoConfig_t cfg = gpuConfig(ctx.nranks, kTimeoutMs);
  return initGpuComm(ctx, &cfg);
}

MpOptions faultOptions(int mayDie) {
  MpOptions o = gpuOptions(90);
  o.mayDie = {mayDie};
  return o;
}

// How a survivor learned that a peer died (Broken: its stream hung or failed; failure recorded).
enum class Saw { Nothing, CallError, AsyncError, Broken };

// After a call on `stream` returned r at time t0: if r is an error it must be a fault error;
// otherwise the stream must finish (no device-side hang) and the comm must report an async fault
// error, all before t0 + kSurviveSec. Returns what was seen; records failures.
Saw awaitFault(fuscoComm_t comm, fuscoResult_t r, double t0, cudaStream_t stream, int dead,
               bool mustSee, const std::string& what) {
  if (r != fuscoSuccess) {
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_TRUE(isFaultError(r)) << what << ": got " << fuscoGetErrorString(r) << " (" << msg
                                 << "); expected fuscoRemoteError or fuscoTimeout";
    EXPECT_LT(nowSec() - t0, kSurviveSec)
        << what << ": the failed call took " << nowSec() - t0 << " s";
    EXPECT_TRUE(namesRank(msg, dead))
        << what << ": message '" << msg << "' should name rank " << dead;
    // Whatever was enqueued before must still drain.
    EXPECT_NE(syncWithin(stream, kSurviveSec), cudaErrorNotReady)
        << what << ": the stream did not finish after the call failed";
    return Saw::CallError;
  }
  const double left = t0 + kSurviveSec - nowSec();
  cudaError_t e = syncWithin(stream, left > 0 ? left : 0);
  EXPECT_NE(e, cudaErrorNotReady) << what
                                  << ": the call was enqueued but its stream did not finish within "
                                  << kSurviveSec << " s after rank " << dead
                                  << " died (a device-side wait for the dead peer?)";
  EXPECT_TRUE(e == cudaSuccess || e == cudaErrorNotReady)
      << what << ": the stream failed with " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e)
      << " (a dead peer must be reported through fuscoCommGetAsyncError, not a CUDA fault)";
  if (e != cudaSuccess) return Saw::Broken;
  fuscoResult_t async = fuscoSuccess;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  if (async == fuscoSuccess) {
    if (mustSee)
      ADD_FAILURE() << what << ": the call succeeded, its stream finished and "
                    << "fuscoCommGetAsyncError reports no error although rank " << dead
                    << " died before the call";
    return Saw::Nothing;
  }
  EXPECT_TRUE(isFaultError(async)) << what << ": async error " << fuscoGetErrorString(async)
                                   << "; expected fuscoRemoteError or fuscoTimeout";
  return Saw::AsyncError;
}

// A survivor that saw the fault: the comm reports an async error and is destroyed promptly.
void finishSurvivor(fuscoComm_t comm) {
  fuscoResult_t async = fuscoSuccess;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  EXPECT_NE(async, fuscoSuccess) << "a comm whose peer died must report an async error";
  const double t0 = nowSec();
  EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess)
      << "destroy after a peer died: " << fuscoGetLastError(nullptr);
  EXPECT_LT(nowSec() - t0, 5.0) << "destroy must not wait for the dead peer";
}

// Rank 3 dies while the others enter a 4 MiB-per-peer all-to-all.
TEST(GpuFaultKill, PeerKilledBeforeAllToAllFailsEverySurvivor) {
  FUSCO_GPU_REQUIRE();
  runRanks(
      4,
      [](const RankCtx& ctx) {
        fuscoComm_t comm = initFaultComm(ctx);
        Stream stream;
        {
          // One good call first, so every connection is up.
          auto small =
              makeA2avLayout(fusco::test::uniformCountMatrix(4, 100), 4, ctx.rank, 4, 1, false);
          ASSERT_TRUE(gpuAllToAllChecked(comm, small, fuscoInt32, 1, Mem::Cuda, Mem::Cuda, true,
                                         stream.get()));
        }
        if (ctx.rank == 3) {
          usleep(300 * 1000);
          raise(SIGKILL);
        }
        {
          const size_t count = 1 << 20;
          DevBuf send = poisonedBuf(comm, 4 * count * 4), recv(comm, 4 * count * 4, Mem::Arena);
          const double t0 = nowSec();
          fuscoResult_t r =
              fuscoAllToAll(send.get(), recv.get(), count, fuscoFloat32, comm, stream.api());
          awaitFault(comm, r, t0, stream.get(), 3, true, "all-to-all after rank 3 died");
        }  // fuscoMemFree after the fault, before destroy
        finishSurvivor(comm);
      },
      faultOptions(3));
}

// Every rank enqueues an all-to-all behind a 1 s kernel; rank 1 dies right after its call
// returned, so its part never runs. The survivors' calls were only enqueued: their streams must
// still finish and the comm report the fault.
TEST(GpuFaultKill, PeerKilledAfterEnqueueBeforeItsStreamRan) {
  FUSCO_GPU_REQUIRE();
  runRanks(
      3,
      [](const RankCtx& ctx) {
        fuscoComm_t comm = initFaultComm(ctx);
        Stream stream;
        const size_t count = 65536;
        auto l =
            makeA2avLayout(fusco::test::uniformCountMatrix(3, count), 3, ctx.rank, 4, 9, false);
        ASSERT_TRUE(
            gpuAllToAllChecked(comm, l, fuscoInt32, 9, Mem::Cuda, Mem::Cuda, true, stream.get()));
        DevBuf send = poisonedBuf(comm, 3 * count * 4), recv(comm, 3 * count * 4);
        CUDA_ASSERT_OK(spinAsync(stream.get(), 1.0));
        const double t0 = nowSec();
        fuscoResult_t r =
            fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, stream.api());
        if (ctx.rank == 1) raise(SIGKILL);
        awaitFault(comm, r, t0, stream.get(), 1, true, "all-to-all enqueued before rank 1 died");
        finishSurvivor(comm);
      },
      faultOptions(1));
}

// Class F (docs/TESTING.md, "Failure classes"): two warm-up calls make the fuscoMemAlloc receive
// buffers in-place targets; then rank 3 enqueues its call behind a 3 s kernel and is killed 300 ms
// later, while the survivors' calls wait for it. Each survivor must get fuscoRemoteError (or a
// timeout) naming rank 3 within the timeout, and its stream must finish without a fault. The
// survivors' operations wait for it inside their kernels; the dead peer sets the abort word, and
// from then on they touch none of its memory (a released wait let their copies run into it).
TEST(GpuFaultKill, PeerKilledWhileSurvivorsWaitForIt) {
  FUSCO_GPU_REQUIRE();
  runRanks(
      4,
      [](const RankCtx& ctx) {
        fuscoComm_t comm = initFaultComm(ctx);
        Stream stream;
        {
          const size_t count = 16384;
          auto l =
              makeA2avLayout(fusco::test::uniformCountMatrix(4, count), 4, ctx.rank, 4, 5, false);
          DevBuf send = sendBufFor(comm, l, 5), recv(comm, 4 * count * 4, Mem::Arena);
          for (int it = 0; it < 2; ++it) {
            FUSCO_ASSERT_OK(
                comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, stream.api()));
            CUDA_ASSERT_OK(cudaStreamSynchronize(stream.get()));
          }
          if (ctx.rank == 3) CUDA_ASSERT_OK(spinAsync(stream.get(), 3.0));
          const double t0 = nowSec();
          fuscoResult_t r =
              fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, stream.api());
          if (ctx.rank == 3) {
            usleep(300 * 1000);
            raise(SIGKILL);
          }
          awaitFault(comm, r, t0, stream.get(), 3, true, "all-to-all waiting for rank 3");
        }
        finishSurvivor(comm);
      },
      faultOptions(3));
}

// Rank 2 is killed by a timer thread while the ranks loop over MoE dispatch + combine, so it dies
// in the middle of some call or some stream's work.
TEST(GpuFaultKill, PeerKilledDuringALoopOfMoeCallsFailsEverySurvivor) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        fuscoComm_t comm = initFaultComm(ctx);
        Stream stream;
        const cudaStream_t s = stream.get();
        fusco::test::MoeCase c = oneNodeCase(3);
        c.numExperts = 12;
        c.topk = 4;
        c.numTokens = {300, 280, 310};
        const auto setup = fusco::test::makeCombine(c, seed, fuscoBfloat16, 1024);
        const size_t rowOut = 1024 * 2;
        fuscoMoeHandle_t h = nullptr;
        ASSERT_TRUE(fusco::test::gpu::gpuPlan(comm, ctx.rank, c, setup.p, setup.d, FUSCO_DEDUP_RANK,
                                              FUSCO_BALANCE_AUTO, s, &h));
        // One checked round, so every connection is up and the data path is right.
        ASSERT_TRUE(gpuDispatch(comm, h, ctx.rank, setup.p, setup.d, setup.x, rowOut, Mem::Cuda,
                                Mem::Cuda, s));
        if (ctx.rank == 2) {
          std::thread([] {
            usleep(500 * 1000);
            raise(SIGKILL);
          }).detach();
        }
        Saw saw = Saw::Nothing;
        {
          MoeRankBufs b = moeRankBufs(comm, setup, ctx.rank, Mem::Arena);
          const double start = nowSec();
          while (saw == Saw::Nothing && nowSec() - start < 30) {
            double t0 = nowSec();
            fuscoResult_t r = fuscoMoeDispatch(h, b.x.get(), rowOut, b.recvX.get(), s);
            saw = awaitFault(comm, r, t0, s, 2, false, "dispatch");
            if (saw != Saw::Nothing) break;
            t0 = nowSec();
            r = fuscoMoeCombine(h, b.expertOut.get(), fuscoBfloat16, 1024, nullptr, b.out.get(), s);
            saw = awaitFault(comm, r, t0, s, 2, false, "combine");
          }
        }
        if (saw == Saw::Nothing)
          ADD_FAILURE() << "MoE calls kept succeeding for 30 s after rank 2 was killed";
        if (saw == Saw::Broken) return;  // a hung stream: leave the rest to process exit
        EXPECT_EQ(fuscoMoeHandleDestroy(h), fuscoSuccess) << "handle destroy after a peer died";
        finishSurvivor(comm);
      },
      faultOptions(2));
}

}  // namespace
