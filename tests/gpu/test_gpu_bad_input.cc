// Bad input on CUDA comms (docs/TESTING.md, docs/API.md's collective error rule): a host pointer
// (malloc) where a CUDA comm needs device memory gives fuscoInvalidArgument on the rank that passed
// it, at once, and on every other rank an error naming that rank (fuscoCommGetAsyncError once its
// stream finished, since calls on CUDA comms only enqueue); the comm stays usable afterwards (a
// correct call is bit-exact).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::makeA2avLayout;
using fusco::test::MoeCase;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

constexpr int kTimeoutMs = 20000;
constexpr double kPromptSec = 5.0;  // an argument error must not wait for the timeout

bool isPeerError(fuscoResult_t r) { return r == fuscoInvalidUsage || r == fuscoRemoteError; }

struct Timed {
  fuscoResult_t r;
  double sec;
};
template <class F>
Timed timed(F&& f) {
  const double t0 = nowSec();
  fuscoResult_t r = f();
  return Timed{r, nowSec() - t0};
}

// One rank passed a host pointer: its call returns fuscoInvalidArgument at once. Every other
// rank's call only enqueues (fuscoSuccess, promptly); once its stream finished,
// fuscoCommGetAsyncError reports fuscoInvalidArgument and the message names the bad rank.
// fuscoMoePlan, which synchronizes, still fails on every rank (fuscoInvalidUsage or
// fuscoRemoteError naming the bad rank).
void expectOneRankBad(fuscoComm_t comm, int myRank, int badRank, const Timed& t,
                      cudaStream_t stream, const std::string& what) {
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_LT(t.sec, kPromptSec) << what << ": the call took " << t.sec << " s";
  if (myRank == badRank) {
    EXPECT_EQ(t.r, fuscoInvalidArgument) << what << ": " << fuscoGetErrorString(t.r) << ": " << msg;
    EXPECT_FALSE(msg.empty()) << what << ": no message";
    CUDA_EXPECT_OK(cudaStreamSynchronize(stream));
    return;
  }
  if (t.r != fuscoSuccess) {  // a synchronizing call (fuscoMoePlan)
    EXPECT_TRUE(isPeerError(t.r)) << what << ": a peer of the bad rank got "
                                  << fuscoGetErrorString(t.r) << " (" << msg
                                  << "); expected fuscoInvalidUsage or fuscoRemoteError";
    EXPECT_TRUE(namesRank(msg, badRank))
        << what << ": message '" << msg << "' should name rank " << badRank;
    CUDA_EXPECT_OK(cudaStreamSynchronize(stream));
    return;
  }
  CUDA_EXPECT_OK(cudaStreamSynchronize(stream));
  fuscoResult_t async = fuscoSuccess;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  EXPECT_EQ(async, fuscoInvalidArgument) << what << ": the peers' async error";
  const std::string asyncMsg = fuscoGetLastError(comm);
  EXPECT_TRUE(namesRank(asyncMsg, badRank))
      << what << ": async message '" << asyncMsg << "' should name rank " << badRank;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  EXPECT_EQ(async, fuscoSuccess) << what << ": an argument error is reported once";
}

// A correct uneven all-to-allv on device buffers is bit-exact on this comm.
void expectUsable(fuscoComm_t comm, const RankCtx& ctx, uint64_t seed, cudaStream_t stream,
                  const std::string& after) {
  auto counts = fusco::test::randomCountMatrix(seed, ctx.nranks, 2000, 20);
  auto l = makeA2avLayout(counts, ctx.nranks, ctx.rank, 4, seed, true);
  EXPECT_TRUE(gpuAllToAllChecked(comm, l, fuscoInt32, seed, Mem::Cuda, Mem::Cuda, false, stream))
      << "the comm is not usable after " << after;
}

// A malloc'd host buffer, filled so a library that reads it anyway reads defined bytes.
struct HostBuf {
  explicit HostBuf(size_t n) : p(malloc(n > 0 ? n : 1)) { memset(p, 0x3C, n > 0 ? n : 1); }
  ~HostBuf() { free(p); }
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
  void* p;
};

// runGpuRanksOnStream on comms with timeoutMs kTimeoutMs.
void runBadInputRanks(int n, const GpuStreamRankBody& body) {
  const fuscoConfig_t cfg = gpuConfig(n, kTimeoutMs);
  runGpuRanksOnStream(n, body, &cfg);
}

TEST(GpuBadInput, HostBufferInAllToAllOnOneRankFailsEveryRankPromptly) {
  FUSCO_GPU_REQUIRE();
  runBadInputRanks(4, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const size_t count = 1024;
    DevBuf send = poisonedBuf(comm, 4 * count * 4), recv(comm, 4 * count * 4);
    HostBuf host(4 * count * 4);
    expectUsable(comm, ctx, 10, stream.get(), "init");

    Timed t = timed([&] {
      return fuscoAllToAll(ctx.rank == 1 ? host.p : send.get(), recv.get(), count, fuscoInt32, comm,
                           stream.api());
    });
    expectOneRankBad(comm, ctx.rank, 1, t, stream.get(), "host sendbuff on rank 1");
    expectUsable(comm, ctx, 11, stream.get(), "a host sendbuff");

    t = timed([&] {
      return fuscoAllToAll(send.get(), ctx.rank == 2 ? host.p : recv.get(), count, fuscoInt32, comm,
                           stream.api());
    });
    expectOneRankBad(comm, ctx.rank, 2, t, stream.get(), "host recvbuff on rank 2");
    expectUsable(comm, ctx, 12, stream.get(), "a host recvbuff");
  });
}

TEST(GpuBadInput, HostRecvBufferInAllToAllvOnOneRankFailsEveryRank) {
  FUSCO_GPU_REQUIRE();
  runBadInputRanks(3, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    auto l = makeA2avLayout(fusco::test::randomCountMatrix(5, 3, 900, 0), 3, ctx.rank, 4, 5, true);
    DevBuf send = poisonedBuf(comm, l.sendElems * 4), recv(comm, l.recvElems * 4);
    HostBuf host(l.recvElems * 4);
    Timed t = timed([&] {
      return fuscoAllToAllv(send.get(), l.sendcounts.data(), l.sdispls.data(),
                            ctx.rank == 0 ? host.p : recv.get(), l.recvcounts.data(),
                            l.rdispls.data(), fuscoFloat32, comm, stream.api());
    });
    expectOneRankBad(comm, ctx.rank, 0, t, stream.get(), "host recvbuff on rank 0");
    expectUsable(comm, ctx, 13, stream.get(), "a host recvbuff in fuscoAllToAllv");
  });
}

TEST(GpuBadInput, HostBuffersOnEveryRankAreInvalidArgumentEverywhere) {
  FUSCO_GPU_REQUIRE();
  runBadInputRanks(2, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    HostBuf send(2 * 64 * 4), recv(2 * 64 * 4);
    Timed t =
        timed([&] { return fuscoAllToAll(send.p, recv.p, 64, fuscoFloat32, comm, stream.api()); });
    EXPECT_EQ(t.r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    EXPECT_LT(t.sec, kPromptSec);
    EXPECT_STRNE(fuscoGetLastError(comm), "");
    CUDA_EXPECT_OK(cudaStreamSynchronize(stream.get()));
    expectUsable(comm, ctx, 14, stream.get(), "host buffers everywhere");
  });
}

// Registering host memory with a CUDA comm is refused (a local call: only this rank).
TEST(GpuBadInput, RegisteringHostMemoryIsInvalidArgument) {
  FUSCO_GPU_REQUIRE();
  runBadInputRanks(2, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    HostBuf host(1 << 16);
    void* handle = reinterpret_cast<void*>(uintptr_t{0x77});
    EXPECT_EQ(fuscoCommRegister(comm, host.p, 1 << 16, &handle), fuscoInvalidArgument)
        << fuscoGetLastError(comm);
    EXPECT_EQ(handle, reinterpret_cast<void*>(uintptr_t{0x77})) << "handle written on failure";
    EXPECT_STRNE(fuscoGetLastError(comm), "");
    expectUsable(comm, ctx, 15, stream.get(), "registering host memory");
  });
}

// Host topkIdx in fuscoMoePlan, host recvX in dispatch and host out in combine, each on one rank.
TEST(GpuBadInput, HostPointersInMoeCallsOnOneRankFailEveryRank) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runBadInputRanks(3, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const cudaStream_t s = stream.get();
    MoeCase c = oneNodeCase(3);
    c.numExperts = 6;
    c.topk = 2;
    c.numTokens = {20, 18, 25};
    c.unusedPercent = 0;  // every rank receives rows, so recvX is never legitimately NULL
    const auto setup = fusco::test::makeCombine(c, seed, fuscoFloat32, 24);
    const auto& p = setup.p;
    const auto& d = setup.d;
    const size_t rowOut = 24 * 4;
    fuscoMoeConfig_t m = fusco::test::moeConfig(c, FUSCO_DEDUP_RANK);
    DevBuf idx = toDevice(comm, p.topkIdx[ctx.rank]);
    MoeRankBufs b = moeRankBufs(comm, setup, ctx.rank);

    // fuscoMoePlan with a host topkIdx on rank 2.
    fuscoMoeHandle_t h = nullptr;
    Timed t = timed([&] {
      const int64_t* ti =
          ctx.rank == 2 ? p.topkIdx[ctx.rank].data() : static_cast<const int64_t*>(idx.get());
      return fuscoMoePlan(&h, comm, &m, ti, p.numTokens[ctx.rank], c.topk, s);
    });
    expectOneRankBad(comm, ctx.rank, 2, t, s, "host topkIdx in fuscoMoePlan on rank 2");
    EXPECT_EQ(h, nullptr) << "handle written although fuscoMoePlan failed";
    if (t.r == fuscoSuccess && h != nullptr) fuscoMoeHandleDestroy(h);

    // A good plan; then dispatch with a host recvX on rank 1.
    h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, c, p, d, FUSCO_DEDUP_RANK, FUSCO_BALANCE_AUTO, s, &h));
    HostBuf hostRecv(d.numRecvRows[ctx.rank] * rowOut);
    t = timed([&] {
      return fuscoMoeDispatch(h, b.x.get(), rowOut, ctx.rank == 1 ? hostRecv.p : b.recvX.get(), s);
    });
    expectOneRankBad(comm, ctx.rank, 1, t, s, "host recvX in fuscoMoeDispatch on rank 1");
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));

    // A good plan and dispatch; then combine with a host out on rank 0.
    h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, c, p, d, FUSCO_DEDUP_RANK, FUSCO_BALANCE_AUTO, s, &h));
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, p, d, setup.x, rowOut, Mem::Cuda, Mem::Cuda, s));
    HostBuf hostOut(p.numTokens[ctx.rank] * rowOut);
    t = timed([&] {
      return fuscoMoeCombine(h, b.expertOut.get(), fuscoFloat32, 24, nullptr,
                             ctx.rank == 0 ? hostOut.p : b.out.get(), s);
    });
    expectOneRankBad(comm, ctx.rank, 0, t, s, "host out in fuscoMoeCombine on rank 0");
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));

    // The comm still plans, dispatches and combines exactly.
    h = nullptr;
    ASSERT_TRUE(gpuPlan(comm, ctx.rank, c, p, d, FUSCO_DEDUP_NONE, FUSCO_BALANCE_AUTO, s, &h))
        << "after the bad MoE calls";
    EXPECT_TRUE(gpuDispatch(comm, h, ctx.rank, p, d, setup.x, rowOut, Mem::Cuda, Mem::Cuda, s))
        << "after the bad MoE calls";
    EXPECT_TRUE(gpuCombine(comm, h, ctx.rank, setup, true, Mem::Cuda, Mem::Cuda, s))
        << "after the bad MoE calls";
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectUsable(comm, ctx, 16, s, "the bad MoE calls");
  });
}

}  // namespace
