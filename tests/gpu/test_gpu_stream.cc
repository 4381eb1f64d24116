// Stream semantics of CUDA comms (docs/API.md, "Streams and completion"): a call is ordered on its
// stream after earlier work and before later work, and returns once the work is enqueued (no host
// sync, except fuscoMoePlan, which may sync once). A spin kernel holds the stream back so that a
// call that reads its inputs at enqueue time, writes its outputs after its stream position, or
// waits for the stream on the host is caught.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_kernels.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::makeA2avLayout;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

constexpr double kSpinSec = 2.0;     // stream held back this long
constexpr double kEnqueueSec = 1.0;  // a call must return well before the spin ends

// The send buffer holds stale data until a copy that waits behind a spin kernel writes the real
// payload; the call must send the real one. After the call the stream copies recvbuff aside and
// then overwrites sendbuff and recvbuff: the copy must hold the result and recvbuff must end up
// with the overwrite (no late write), whatever the library does after its stream position.
TEST(GpuStream, AllToAllIsOrderedBetweenEarlierAndLaterWorkOnItsStream) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const size_t count = 100003;
    auto l = makeA2avLayout(fusco::test::uniformCountMatrix(4, count), 4, ctx.rank, 4, seed, false);
    const size_t bytes = l.sendElems * 4;
    DevBuf send = sendBufFor(comm, l, seed + 1, Mem::Cuda);  // stale
    DevBuf staging = sendBufFor(comm, l, seed);              // good
    DevBuf recv = poisonedBuf(comm, bytes, Mem::Arena), copy = poisonedBuf(comm, bytes);
    CUDA_ASSERT_OK(spinAsync(s, 0.3));
    CUDA_EXPECT_OK(cudaMemcpyAsync(send.get(), staging.get(), bytes, cudaMemcpyDeviceToDevice, s));
    FUSCO_ASSERT_OK(comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoUint32, comm, s));
    CUDA_EXPECT_OK(cudaMemcpyAsync(copy.get(), recv.get(), bytes, cudaMemcpyDeviceToDevice, s));
    CUDA_EXPECT_OK(cudaMemsetAsync(send.get(), 0, bytes, s));
    CUDA_EXPECT_OK(cudaMemsetAsync(recv.get(), 0x11, bytes, s));
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(fusco::test::checkRecv(l, copy.download().data(), seed))
        << "the result at the call's stream position (stale bytes = data read before the "
           "earlier copy ran, zeros = read after later work)";
    std::vector<uint8_t> after = recv.download();
    size_t late = 0;
    for (uint8_t b : after) late += b != 0x11;
    EXPECT_EQ(late, 0u) << late
                        << " bytes of recvbuff were written after later work on the stream had "
                           "overwritten them";
  });
}

TEST(GpuStream, AllToAllReturnsBeforeEarlierStreamWorkFinishes) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(2, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    const size_t count = 4099;
    auto l = makeA2avLayout(fusco::test::uniformCountMatrix(2, count), 2, ctx.rank, 4, seed, false);
    DevBuf send = sendBufFor(comm, l, seed), recv = poisonedBuf(comm, l.sendElems * 4);
    // Warm-up call, so connection setup does not count.
    FUSCO_ASSERT_OK(comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, s));
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    recv.poison();
    CUDA_ASSERT_OK(spinAsync(s, kSpinSec));
    const double t0 = nowSec();
    FUSCO_ASSERT_OK(comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, s));
    const double sec = nowSec() - t0;
    EXPECT_LT(sec, kEnqueueSec) << "fuscoAllToAll on a CUDA comm took " << sec
                                << " s to return behind a " << kSpinSec
                                << " s kernel: it must return once enqueued";
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady)
        << "the stream finished before the spin kernel could have";
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(fusco::test::checkRecv(l, recv.download().data(), seed));
  });
}

// The one-connection stall (docs/TESTING.md, "Failure classes"): with
// CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM's setting) every stream shares one hardware queue.
// Rank 1 enters its all-to-all 2 s late; rank 0's all-to-all is on stream A, then a tiny kernel on
// stream B must finish within 200 ms. An operation waits for its peers inside its one kernel,
// which runs, so nothing of it heads the queue (a host-released stream wait did, for 2 s).
TEST(GpuStream, LatePeerDoesNotHoldAnotherStreamWithOneConnection) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  fusco::test::runRanks(
      2,
      [seed](const RankCtx& ctx) {
        setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);  // read when the context is made
        fuscoComm_t comm = initGpuComm(ctx);
        {
          Stream a, b;
          const size_t count = 4099;
          auto l = makeA2avLayout(fusco::test::uniformCountMatrix(2, count), 2, ctx.rank, 4, seed,
                                  false);
          DevBuf send = sendBufFor(comm, l, seed), recv = poisonedBuf(comm, l.sendElems * 4);
          // The spin kernel is loaded first: its lazy load would wait for the device, which is
          // not what this test measures.
          CUDA_EXPECT_OK(spinAsync(b.get(), 0.0));
          CUDA_EXPECT_OK(cudaStreamSynchronize(b.get()));
          if (ctx.rank == 1) usleep(2000 * 1000);
          FUSCO_EXPECT_OK(comm,
                          fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, a.api()));
          if (ctx.rank == 0) {
            cudaEvent_t ev = nullptr;
            CUDA_EXPECT_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
            const double t0 = nowSec();
            CUDA_EXPECT_OK(spinAsync(b.get(), 0.0));
            CUDA_EXPECT_OK(cudaEventRecord(ev, b.get()));
            while (cudaEventQuery(ev) == cudaErrorNotReady && nowSec() - t0 < 5.0) usleep(1000);
            const double sec = nowSec() - t0;
            EXPECT_LT(sec, 0.2) << "another stream waited " << sec * 1000
                                << " ms behind an all-to-all whose peer was 2 s late";
            CUDA_EXPECT_OK(cudaEventDestroy(ev));
          }
          CUDA_EXPECT_OK(syncWithin(a.get(), 30.0));
          EXPECT_TRUE(fusco::test::checkRecv(l, recv.download().data(), seed));
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      gpuOptions());
}

// After fuscoMoePlan (which may sync the host once), dispatch and combine only enqueue.
TEST(GpuStream, MoeDispatchAndCombineReturnBeforeEarlierStreamWorkFinishes) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(2, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    fusco::test::MoeCase c = oneNodeCase(2);
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens = {40, 33};
    const auto setup = fusco::test::makeCombine(c, seed, fuscoBfloat16, 72);
    const size_t rowOut = 72 * 2;
    const auto& p = setup.p;
    const auto& d = setup.d;
    fuscoMoeHandle_t h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, c, p, d, FUSCO_DEDUP_RANK, FUSCO_BALANCE_AUTO, s, &h));
    // Warm-up dispatch + combine, checked.
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, p, d, setup.x, rowOut, Mem::Cuda, Mem::Cuda, s));
    EXPECT_TRUE(gpuCombine(comm, h, ctx.rank, setup, true, Mem::Cuda, Mem::Cuda, s));

    MoeRankBufs b = moeRankBufs(comm, setup, ctx.rank);
    CUDA_ASSERT_OK(spinAsync(s, kSpinSec));
    double t0 = nowSec();
    FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, b.x.get(), rowOut, b.recvX.get(), s));
    const double dispatchSec = nowSec() - t0;
    t0 = nowSec();
    FUSCO_EXPECT_OK(comm,
                    fuscoMoeCombine(h, b.expertOut.get(), fuscoBfloat16, 72,
                                    static_cast<const float*>(b.weights.get()), b.out.get(), s));
    const double combineSec = nowSec() - t0;
    EXPECT_LT(dispatchSec, kEnqueueSec)
        << "fuscoMoeDispatch took " << dispatchSec << " s to return behind a " << kSpinSec
        << " s kernel: it must return once enqueued";
    EXPECT_LT(combineSec, kEnqueueSec)
        << "fuscoMoeCombine took " << combineSec << " s to return behind a " << kSpinSec
        << " s kernel: it must return once enqueued";
    CUDA_ASSERT_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(b.recvX.download() == d.recvX[ctx.rank]) << "recvX differs from the reference";
    std::vector<std::vector<float>> weights = setup.weights;
    EXPECT_TRUE(b.out.download() == fusco::test::moeRefCombine(p, d, setup.expertOut, fuscoBfloat16,
                                                               72, weights)[ctx.rank])
        << "combine out differs from the reference";
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  });
}

}  // namespace
