// One group over two communicators (fusco.h: calls of a group are executed together, as in NCCL,
// which allows groups over several communicators): the ranks add their calls to the two
// communicators in opposite orders, and the group still completes, with exact data, whether the
// communicators span the same ranks or different rank sets.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kTimeoutMs = 5000;  // a deadlock fails the group after this, not the harness
constexpr size_t kCount = 70000;  // int32 elements per message: several slices

fuscoConfig_t testConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = kTimeoutMs;
  return cfg;
}

// A fresh unique id made by rank `maker` of `via` (the process that will be rank 0 of the new
// communicator, which binds the id's port), handed to every rank of `via` by an all-to-all in
// which only the maker's blocks carry data.
fuscoUniqueId shareNewId(fuscoComm_t via, const RankCtx& ctx, int maker) {
  const size_t B = sizeof(fuscoUniqueId);
  std::vector<char> send(B * ctx.nranks, 0), recv(B * ctx.nranks, 0);
  fuscoUniqueId id{};
  if (ctx.rank == maker) {
    EXPECT_EQ(fuscoGetUniqueId(&id), fuscoSuccess) << fuscoGetLastError(nullptr);
    for (int p = 0; p < ctx.nranks; ++p) memcpy(&send[p * B], &id, B);
  }
  FUSCO_EXPECT_OK(via, fuscoAllToAll(send.data(), recv.data(), B, fuscoInt8, via, nullptr));
  memcpy(&id, &recv[maker * B], B);
  return id;
}

fuscoComm_t initFrom(const fuscoUniqueId& id, int nranks, int rank) {
  fuscoConfig_t cfg = testConfig();
  fuscoComm_t comm = nullptr;
  fuscoResult_t r = fuscoCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  EXPECT_EQ(r, fuscoSuccess) << "init of the second communicator: " << fuscoGetLastError(nullptr);
  return r == fuscoSuccess ? comm : nullptr;
}

// One ring exchange on comm (send to the next rank, receive from the previous), added to the
// current group; data of comm k uses seed + k so a message crossing communicators shows.
struct RingCall {
  fuscoComm_t comm = nullptr;
  int rank = 0, nranks = 0;
  uint64_t seed = 0;
  std::vector<uint8_t> send, recv;

  void add() {
    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    send.resize(kCount * 4);
    recv.resize(kCount * 4);
    fusco::test::fillPayload(send.data(), seed, rank, next, 0, send.size());
    fusco::test::poison(recv.data(), recv.size());
    FUSCO_EXPECT_OK(comm, fuscoSend(send.data(), kCount, fuscoInt32, next, comm, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoRecv(recv.data(), kCount, fuscoInt32, prev, comm, nullptr));
  }
  void check(const std::string& what) const {
    const int prev = (rank + nranks - 1) % nranks;
    EXPECT_TRUE(
        fusco::test::payloadMatches(recv.data(), 4, kCount, seed, prev, rank, 0, nranks, what));
  }
};

// Runs one group in which this rank adds `first`'s calls before `second`'s; checks both.
void runGroupOf(RingCall* first, RingCall* second) {
  FUSCO_ASSERT_OK(nullptr, fuscoGroupStart());
  if (first != nullptr) first->add();
  if (second != nullptr) second->add();
  const double t0 = nowSec();
  fuscoResult_t r = fuscoGroupEnd();
  EXPECT_EQ(r, fuscoSuccess) << "fuscoGroupEnd: " << fuscoGetLastError(nullptr);
  EXPECT_LT(nowSec() - t0, kTimeoutMs / 1000.0) << "the group waited for the timeout";
  if (r != fuscoSuccess) return;
  if (first != nullptr) first->check("the group's first communicator");
  if (second != nullptr) second->check("the group's second communicator");
}

// Two communicators over the same four ranks, made in the same order; even ranks add comm 1's
// calls first, odd ranks comm 2's, so every pair of ring neighbours adds them in opposite orders.
TEST(GroupTwoComms, OppositeOrderOverTheSameRanksCompletesWithExactData) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t c1 = initComm(ctx, &cfg);
    fuscoComm_t c2 = initFrom(shareNewId(c1, ctx, 0), ctx.nranks, ctx.rank);
    ASSERT_NE(c2, nullptr);
    for (int round = 0; round < 3; ++round) {
      RingCall a{c1, ctx.rank, ctx.nranks, seed + 1 + round * 2, {}, {}};
      RingCall b{c2, ctx.rank, ctx.nranks, seed + 2 + round * 2, {}, {}};
      if (ctx.rank % 2 == 0) {
        runGroupOf(&a, &b);
      } else {
        runGroupOf(&b, &a);
      }
    }
    FUSCO_EXPECT_OK(c2, fuscoCommDestroy(c2));
    FUSCO_EXPECT_OK(c1, fuscoCommDestroy(c1));
  });
}

// A communicator over all four ranks and one over ranks 1 and 2 only (whose rank 0 is global
// rank 1). Ranks 1 and 2 add the two communicators' calls in opposite orders; ranks 0 and 3 have
// calls on the first one only.
TEST(GroupTwoComms, OppositeOrderOverDifferentRankSetsCompletesWithExactData) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t all = initComm(ctx, &cfg);
    const fuscoUniqueId subId = shareNewId(all, ctx, 1);
    const bool inSub = ctx.rank == 1 || ctx.rank == 2;
    fuscoComm_t sub = inSub ? initFrom(subId, 2, ctx.rank - 1) : nullptr;
    if (inSub) {
      ASSERT_NE(sub, nullptr);
    }
    for (int round = 0; round < 3; ++round) {
      RingCall a{all, ctx.rank, ctx.nranks, seed + 1 + round * 2, {}, {}};
      RingCall b{sub, ctx.rank - 1, 2, seed + 2 + round * 2, {}, {}};
      if (ctx.rank == 1) {
        runGroupOf(&a, &b);
      } else if (ctx.rank == 2) {
        runGroupOf(&b, &a);
      } else {
        runGroupOf(&a, nullptr);
      }
    }
    if (sub != nullptr) FUSCO_EXPECT_OK(sub, fuscoCommDestroy(sub));
    FUSCO_EXPECT_OK(all, fuscoCommDestroy(all));
  });
}

}  // namespace
