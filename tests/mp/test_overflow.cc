// Byte sizes that overflow (docs/API.md, "Conventions"): a count times an element or row size, or
// a sum of counts, that does not fit in size_t is fuscoInvalidArgument on the rank that passed it,
// with a message naming the call and the values, and a peer error naming that rank elsewhere;
// never a wrapped size that "succeeds" (and could pair with a peer's small count). The comm stays
// usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::namesRank;
using fusco::test::RankCtx;
using fusco::test::runRanks;

// 2^62 + 1 elements of 4 bytes: 2^64 + 4 bytes, which wraps to 4.
constexpr size_t kWraps = (size_t{1} << 62) + 1;

fuscoConfig_t quickConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  return cfg;
}

// badRank gets fuscoInvalidArgument naming fn and "overflows"; the others an error naming it.
void expectOverflow(fuscoComm_t comm, int me, int badRank, fuscoResult_t r, const char* fn) {
  const std::string msg = fuscoGetLastError(comm);
  if (me == badRank) {
    EXPECT_EQ(r, fuscoInvalidArgument) << fn << ": " << fuscoGetErrorString(r) << ": " << msg;
    EXPECT_NE(msg.find(fn), std::string::npos) << msg;
    EXPECT_NE(msg.find("overflows"), std::string::npos) << msg;
  } else {
    EXPECT_TRUE(r == fuscoInvalidUsage || r == fuscoRemoteError)
        << fn << ": a peer got " << fuscoGetErrorString(r) << ": " << msg;
    EXPECT_TRUE(namesRank(msg, badRank)) << fn << ": '" << msg << "' should name " << badRank;
  }
}

void expectUsable(fuscoComm_t comm, const RankCtx& ctx, uint64_t seed) {
  auto counts = fusco::test::randomCountMatrix(seed, ctx.nranks, 500, 20);
  auto l = fusco::test::makeA2avLayout(counts, ctx.nranks, ctx.rank, 4, seed, true);
  EXPECT_TRUE(fusco::test::allToAllvRoundTrip(comm, l, fuscoInt32, seed));
}

TEST(Overflow, AllToAllCountTimesSizeThatWrapsFailsEveryRank) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<int32_t> send(4, 7), recv(4);
    const size_t count = ctx.rank == 1 ? kWraps : 1;
    fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), count, fuscoInt32, comm, nullptr);
    expectOverflow(comm, ctx.rank, 1, r, "fuscoAllToAll");
    expectUsable(comm, ctx, 21);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Overflow, AllToAllvCountOrDisplacementThatWrapsFailsEveryRank) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<int32_t> send(3, 7), recv(3);
    std::vector<size_t> ones = {1, 1, 1}, displs = {0, 1, 2};
    std::vector<size_t> sc = ones;
    if (ctx.rank == 2) sc[0] = kWraps;
    fuscoResult_t r = fuscoAllToAllv(send.data(), sc.data(), displs.data(), recv.data(),
                                     ones.data(), displs.data(), fuscoInt32, comm, nullptr);
    expectOverflow(comm, ctx.rank, 2, r, "fuscoAllToAllv");
    expectUsable(comm, ctx, 22);
    // A displacement that wraps, and a sum of counts that wraps.
    std::vector<size_t> rd = displs, rc = ones;
    if (ctx.rank == 0) rd[1] = kWraps;
    r = fuscoAllToAllv(send.data(), ones.data(), displs.data(), recv.data(), ones.data(), rd.data(),
                       fuscoInt32, comm, nullptr);
    expectOverflow(comm, ctx.rank, 0, r, "fuscoAllToAllv");
    if (ctx.rank == 1) rc = {1, SIZE_MAX, 2};
    r = fuscoAllToAllv(send.data(), ones.data(), displs.data(), recv.data(), rc.data(),
                       displs.data(), fuscoInt8, comm, nullptr);
    expectOverflow(comm, ctx.rank, 1, r, "fuscoAllToAllv");
    expectUsable(comm, ctx, 23);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Overflow, SendRecvAndRowCallsWhoseBytesWrapFail) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int peer = 1 - ctx.rank;
    std::vector<int32_t> buf(8, 7), out(8);
    fuscoResult_t r = ctx.rank == 0 ? fuscoSend(buf.data(), kWraps, fuscoInt32, peer, comm, nullptr)
                                    : fuscoRecv(out.data(), 1, fuscoInt32, peer, comm, nullptr);
    expectOverflow(comm, ctx.rank, 0, r, "fuscoSend");
    r = ctx.rank == 1 ? fuscoRecv(out.data(), kWraps, fuscoInt32, peer, comm, nullptr)
                      : fuscoSend(buf.data(), 1, fuscoInt32, peer, comm, nullptr);
    expectOverflow(comm, ctx.rank, 1, r, "fuscoRecv");
    // nrows x rowBytes, and a row index x rowBytes.
    const int64_t rows4[] = {0, 0, 0, 0}, far[] = {int64_t{1} << 61};
    r = ctx.rank == 0 ? fuscoGatherSend(buf.data(), rows4, 4, kWraps, peer, comm, nullptr)
                      : fuscoScatterRecv(out.data(), rows4, 1, 4, peer, comm, nullptr);
    expectOverflow(comm, ctx.rank, 0, r, "fuscoGatherSend");
    r = ctx.rank == 1 ? fuscoScatterRecv(out.data(), far, 1, 8, peer, comm, nullptr)
                      : fuscoGatherSend(buf.data(), rows4, 1, 8, peer, comm, nullptr);
    expectOverflow(comm, ctx.rank, 1, r, "fuscoScatterRecv");
    expectUsable(comm, ctx, 24);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Overflow, LayoutRowTimesRowBytesThatWrapsFailsEveryRank) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t counts[] = {1, 1};
    const int64_t rows[] = {0, 4};  // row 4 of 2^62 bytes ends past 2^64
    const size_t rowBytes = ctx.rank == 1 ? size_t{1} << 62 : 4;
    fuscoLayout_t layout = nullptr;
    fuscoResult_t r = fuscoLayoutCreate(&layout, comm, rowBytes, counts, rows, counts, rows);
    expectOverflow(comm, ctx.rank, 1, r, "fuscoLayoutCreate");
    EXPECT_EQ(layout, nullptr);
    const size_t huge[] = {SIZE_MAX, 2};
    r = fuscoLayoutCreate(&layout, comm, 4, ctx.rank == 0 ? huge : counts, rows, counts, rows);
    expectOverflow(comm, ctx.rank, 0, r, "fuscoLayoutCreate");
    expectUsable(comm, ctx, 25);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Overflow, MoeRowBytesAndCombineHiddenThatWrapFailEveryRank) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    fuscoMoeConfig_t mc = FUSCO_MOE_CONFIG_INITIALIZER;
    mc.numExperts = 2;
    mc.dedup = FUSCO_DEDUP_RANK;
    const int64_t topk[] = {0, 1, 1, 0};  // 2 tokens, top-2: every rank gets 2 rows
    fuscoMoeHandle_t h = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoMoePlan(&h, comm, &mc, topk, 2, 2, nullptr));
    std::vector<char> x(64, 1), recvX(64), out(64);
    fuscoResult_t r =
        fuscoMoeDispatch(h, x.data(), ctx.rank == 1 ? kWraps : 4, recvX.data(), nullptr);
    expectOverflow(comm, ctx.rank, 1, r, "fuscoMoeDispatch");
    r = fuscoMoeCombine(h, recvX.data(), fuscoFloat32, ctx.rank == 0 ? kWraps : 1, nullptr,
                        out.data(), nullptr);
    expectOverflow(comm, ctx.rank, 0, r, "fuscoMoeCombine");
    FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, x.data(), 4, recvX.data(), nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectUsable(comm, ctx, 26);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
