// fuscoCommHostAllGather across real rank processes: every rank's bytes in rank order, and every
// refused argument failing every rank at once, the comm still usable afterwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::namesRank;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

fuscoComm_t gatherComm(const RankCtx& ctx) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 60000;
  return initComm(ctx, &cfg);
}

// One gather of `bytes` seeded bytes per rank; true when recv holds each rank's, poison elsewhere.
bool gatherExact(fuscoComm_t comm, const RankCtx& ctx, uint64_t seed, size_t bytes) {
  std::vector<uint8_t> mine(bytes), got(bytes * ctx.nranks + 64), want(got.size());
  fusco::test::fillPayload(mine.data(), seed, ctx.rank, 0, 0, bytes);
  fusco::test::poison(got.data(), got.size());
  fusco::test::poison(want.data(), want.size());
  for (int p = 0; p < ctx.nranks; ++p)
    fusco::test::fillPayload(want.data() + p * bytes, seed, p, 0, 0, bytes);
  const fuscoResult_t r = fuscoCommHostAllGather(comm, mine.data(), got.data(), bytes);
  EXPECT_EQ(r, fuscoSuccess) << bytes << " bytes: " << fuscoGetLastError(comm);
  return r == fuscoSuccess && got == want;
}

TEST(HostAllGather, EveryRankGetsEveryRanksBytesInRankOrder) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoComm_t comm = gatherComm(ctx);
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{1} << 20})
      EXPECT_TRUE(gatherExact(comm, ctx, seed + bytes, bytes)) << bytes << " bytes";
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Rank 1 passes a NULL sendbuf, then every rank more than 1 MiB, then rank 0 another size: each
// time every rank fails at once with fuscoInvalidArgument naming the rank at fault, and a gather
// with good arguments works afterwards.
TEST(HostAllGather, RefusedArgumentsFailEveryRankAtOnceAndLeaveTheCommUsable) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoComm_t comm = gatherComm(ctx);
    std::vector<uint8_t> send(2 << 20, 7), recv(3 * (2 << 20));
    auto expectRefused = [&](const void* s, size_t bytes, int atFault, const char* what) {
      const double t0 = nowSec();
      EXPECT_EQ(fuscoCommHostAllGather(comm, s, recv.data(), bytes), fuscoInvalidArgument) << what;
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_TRUE(namesRank(msg, atFault)) << what << ": " << msg;
      EXPECT_LT(nowSec() - t0, 10.0) << what << ": waited for the timeout";
    };
    expectRefused(ctx.rank == 1 ? nullptr : send.data(), 16, 1, "a NULL sendbuf on rank 1");
    expectRefused(send.data(), (1 << 20) + 1, 0, "more than 1 MiB");
    expectRefused(send.data(), ctx.rank == 0 ? 8 : 16, 0, "8 bytes on rank 0, 16 elsewhere");
    EXPECT_TRUE(gatherExact(comm, ctx, 99, 24)) << "after the refused calls";
    EXPECT_EQ(fuscoCommHostAllGather(nullptr, send.data(), recv.data(), 4), fuscoInvalidArgument);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// A peer that is gone: the gather fails within the timeout instead of waiting for ever.
TEST(HostAllGather, APeerThatExitedFailsTheGatherWithinTheTimeout) {
  fusco::test::MpOptions opt;
  opt.mayDie = {2};
  runRanks(
      3,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
        cfg.timeoutMs = 3000;
        fuscoComm_t comm = initComm(ctx, &cfg);
        if (ctx.rank == 2) _exit(3);
        uint64_t mine = ctx.rank, all[3] = {};
        const double t0 = nowSec();
        const fuscoResult_t r = fuscoCommHostAllGather(comm, &mine, all, sizeof(mine));
        EXPECT_TRUE(r == fuscoRemoteError || r == fuscoTimeout)
            << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
        EXPECT_LT(nowSec() - t0, 15.0);
        fuscoCommDestroy(comm);
      },
      opt);
}

}  // namespace

namespace {

// The documented maximum, 1 MiB a rank, on 32 ranks with a 1 s timeout: rank 0 forwards 32 MiB to
// each of 31 ranks, which takes longer than the timeout here, but never stops moving. The timeout
// counts time without progress, so the gather completes, exact, on every rank. A second comm with
// a long timeout brings the ranks together first, so what the short one meets is the transfer,
// not a rank that is slow to start.
TEST(HostAllGather, TheDocumentedMaximumOn32RanksIsNotCutOffWhileItMoves) {
  const uint64_t seed = fusco::test::testSeed();
  const int n = 32;
  const size_t bytes = size_t{1} << 20;
  runRanks(n, [seed, bytes](const RankCtx& ctx) {
    fuscoComm_t meet = gatherComm(ctx);
    fuscoUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (ctx.rank == 0) {
      FUSCO_ASSERT_OK(meet, fuscoGetUniqueId(&id));
    }
    std::vector<fuscoUniqueId> ids(ctx.nranks);
    FUSCO_ASSERT_OK(meet, fuscoCommHostAllGather(meet, &id, ids.data(), sizeof(id)));
    fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
    cfg.timeoutMs = 1000;
    fuscoComm_t comm = nullptr;
    FUSCO_ASSERT_OK(meet, fuscoCommInitRankConfig(&comm, ctx.nranks, ids[0], ctx.rank, &cfg));
    std::vector<uint8_t> mine(bytes), got(bytes * ctx.nranks), want(bytes);
    fusco::test::fillPayload(mine.data(), seed, ctx.rank, 0, 0, bytes);
    for (int round = 0; round < 2; ++round) {
      fusco::test::poison(got.data(), got.size());
      FUSCO_ASSERT_OK(meet, fuscoCommHostAllGather(meet, nullptr, nullptr, 0));  // together
      FUSCO_ASSERT_OK(comm, fuscoCommHostAllGather(comm, mine.data(), got.data(), bytes));
      for (int p = 0; p < ctx.nranks; ++p) {
        fusco::test::fillPayload(want.data(), seed, p, 0, 0, bytes);
        EXPECT_EQ(std::memcmp(got.data() + p * bytes, want.data(), bytes), 0)
            << "round " << round << ": rank " << p << "'s bytes";
      }
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
    FUSCO_EXPECT_OK(meet, fuscoCommDestroy(meet));
  });
}

}  // namespace
