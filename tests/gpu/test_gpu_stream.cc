// Stream semantics of CUDA comms (API.md, "Streams and completion"): a call is ordered on its
// stream after earlier work and before later work, and returns once the work is enqueued (no host
// sync, except fuscoMoePlan, which may sync once). A spin kernel holds the stream back so that a
// call that reads its inputs at enqueue time, writes its outputs after its stream position, or
// waits for the stream on the host is caught.
#include <gtest/gtest.h>

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
using fusco::test::runRanks;
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
  runRanks(
      4,
      [seed](const RankCtx& ctx) {
        fuscoComm_t comm = initGpuComm(ctx);
        {
          Stream stream;
          const cudaStream_t s = stream.get();
          const size_t count = 100003;
          auto l = makeA2avLayout(fusco::test::uniformCountMatrix(4, count), 4, ctx.rank, 4, seed,
                                  false);
          const size_t bytes = l.sendElems * 4;
          std::vector<uint8_t> good(bytes), stale(bytes);
          fusco::test::fillSend(l, good.data(), seed);
          fusco::test::fillSend(l, stale.data(), seed + 1);
          DevBuf send(comm, bytes, Mem::Cuda), staging(comm, bytes), recv(comm, bytes, Mem::Arena),
              copy(comm, bytes);
          send.upload(stale);
          staging.upload(good);
          recv.poison();
          copy.poison();
          CUDA_ASSERT_OK(spinAsync(s, 0.3));
          CUDA_EXPECT_OK(
              cudaMemcpyAsync(send.get(), staging.get(), bytes, cudaMemcpyDeviceToDevice, s));
          FUSCO_ASSERT_OK(comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoUint32, comm, s));
          CUDA_EXPECT_OK(
              cudaMemcpyAsync(copy.get(), recv.get(), bytes, cudaMemcpyDeviceToDevice, s));
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
                              << " bytes of recvbuff were written after later work on the "
                                 "stream had overwritten them";
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      gpuOptions());
}

TEST(GpuStream, AllToAllReturnsBeforeEarlierStreamWorkFinishes) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runRanks(
      2,
      [seed](const RankCtx& ctx) {
        fuscoComm_t comm = initGpuComm(ctx);
        {
          Stream stream;
          const cudaStream_t s = stream.get();
          const size_t count = 4099;
          auto l = makeA2avLayout(fusco::test::uniformCountMatrix(2, count), 2, ctx.rank, 4, seed,
                                  false);
          std::vector<uint8_t> hs(l.sendElems * 4);
          fusco::test::fillSend(l, hs.data(), seed);
          DevBuf send(comm, hs.size()), recv(comm, hs.size());
          send.upload(hs);
          recv.poison();
          // Warm-up call, so connection setup does not count.
          FUSCO_ASSERT_OK(comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, s));
          CUDA_ASSERT_OK(cudaStreamSynchronize(s));
          recv.poison();
          CUDA_ASSERT_OK(spinAsync(s, kSpinSec));
          const double t0 = nowSec();
          FUSCO_ASSERT_OK(comm, fuscoAllToAll(send.get(), recv.get(), count, fuscoInt32, comm, s));
          const double sec = nowSec() - t0;
          EXPECT_LT(sec, kEnqueueSec)
              << "fuscoAllToAll on a CUDA comm took " << sec << " s to return behind a " << kSpinSec
              << " s kernel: it must return once enqueued";
          EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady)
              << "the stream finished before the spin kernel could have";
          CUDA_ASSERT_OK(cudaStreamSynchronize(s));
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
  runRanks(
      2,
      [seed](const RankCtx& ctx) {
        fuscoComm_t comm = initGpuComm(ctx);
        {
          Stream stream;
          const cudaStream_t s = stream.get();
          fusco::test::MoeCase c;
          c.nranks = 2;
          c.numExperts = 8;
          c.topk = 3;
          c.numTokens = {40, 33};
          c.localSize = 2;
          const auto setup = fusco::test::makeCombine(c, seed, fuscoBfloat16, 72);
          const size_t rowOut = 72 * 2;
          const auto& p = setup.p;
          const auto& d = setup.d;
          fuscoMoeHandle_t h = nullptr;
          ASSERT_TRUE(
              gpuPlan(comm, ctx.rank, c, p, d, FUSCO_DEDUP_RANK, FUSCO_BALANCE_AUTO, s, &h));
          // Warm-up dispatch + combine, checked.
          EXPECT_TRUE(
              gpuDispatch(comm, h, ctx.rank, p, d, setup.x, rowOut, Mem::Cuda, Mem::Cuda, s));
          EXPECT_TRUE(gpuCombine(comm, h, ctx.rank, setup, true, Mem::Cuda, Mem::Cuda, s));

          const size_t nRecv = d.numRecvRows[ctx.rank], nTok = p.numTokens[ctx.rank];
          DevBuf x = toDevice(comm, setup.x[ctx.rank]);
          DevBuf recvX(comm, nRecv * rowOut), eo = toDevice(comm, setup.expertOut[ctx.rank]);
          DevBuf w = toDevice(comm, setup.weights[ctx.rank]), out(comm, nTok * rowOut);
          recvX.poison();
          out.poison();
          CUDA_ASSERT_OK(spinAsync(s, kSpinSec));
          double t0 = nowSec();
          FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, x.get(), rowOut, recvX.get(), s));
          const double dispatchSec = nowSec() - t0;
          t0 = nowSec();
          FUSCO_EXPECT_OK(comm, fuscoMoeCombine(h, eo.get(), fuscoBfloat16, 72,
                                                static_cast<const float*>(w.get()), out.get(), s));
          const double combineSec = nowSec() - t0;
          EXPECT_LT(dispatchSec, kEnqueueSec)
              << "fuscoMoeDispatch took " << dispatchSec << " s to return behind a " << kSpinSec
              << " s kernel: it must return once enqueued";
          EXPECT_LT(combineSec, kEnqueueSec)
              << "fuscoMoeCombine took " << combineSec << " s to return behind a " << kSpinSec
              << " s kernel: it must return once enqueued";
          CUDA_ASSERT_OK(cudaStreamSynchronize(s));
          EXPECT_TRUE(recvX.download() == d.recvX[ctx.rank]) << "recvX differs from the reference";
          std::vector<std::vector<float>> weights = setup.weights;
          EXPECT_TRUE(out.download() == fusco::test::moeRefCombine(p, d, setup.expertOut,
                                                                   fuscoBfloat16, 72,
                                                                   weights)[ctx.rank])
              << "combine out differs from the reference";
          FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      gpuOptions());
}

}  // namespace
