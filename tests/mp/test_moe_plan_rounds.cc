// What fuscoMoePlan by the planner's steps costs the host (docs/DESIGN.md, "Planning on the GPU"),
// on the host twin of the CUDA path (FUSCO_PLAN=steps, FUSCO_ASYNC_HOST=1), whose operations are
// enqueued as on a GPU: a plan with sizes waits for its peers once, the read-back of its summary,
// and no host round of its own; a capacity plan never. Counted through api/moe_inspect.h, with the
// plan's lists checked against the reference and a bad argument or routing still failing every
// rank promptly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/moe_inspect.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::commConfig;
using fusco::test::initComm;
using fusco::test::MoeCase;
using fusco::test::moeConfig;
using fusco::test::MoeRefProblem;
using fusco::test::RankCtx;
using fusco::test::runRanks;
using Rounds = fusco::MoeHandle::PlanRounds;

fusco::test::MpOptions twinOptions() {
  fusco::test::MpOptions opt;
  opt.env = {{"FUSCO_PLAN", "steps"}, {"FUSCO_ASYNC_HOST", "1"}};
  return opt;
}

MoeCase roundsCase(int n) {
  MoeCase c;
  c.nranks = n;
  c.numExperts = 3 * n;
  c.topk = 3;
  c.numTokens.assign(n, 40);
  return c;
}

constexpr size_t kRowBytes = 48;

// The reference dispatch of p, with its rows.
struct Ref {
  fusco::test::Bytes2D x;
  fusco::test::MoeRefDispatch d;
};
Ref refOf(const MoeRefProblem& p, uint64_t seed) {
  Ref r;
  r.x = fusco::test::makeRows(p, seed, kRowBytes);
  r.d = fusco::test::moeRefDispatch(p, r.x, kRowBytes);
  return r;
}

Rounds roundsOf(fuscoMoeHandle_t h) {
  Rounds r;
  r.hostRounds = r.readBacks = 99;
  EXPECT_TRUE(fusco::moeHandlePlanRounds(h, &r)) << "not a handle planned by the steps";
  return r;
}

// Three layers planned anew and replanned: each is exact and costs one read-back, no host round.
TEST(PlanRounds, APlanWithSizesWaitsForItsPeersOnceByItsReadBack) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(
      4,
      [seed](const RankCtx& ctx) {
        const MoeCase c = roundsCase(ctx.nranks);
        fuscoConfig_t cfg = commConfig(c);
        fuscoComm_t comm = initComm(ctx, &cfg);
        for (int layer = 0; layer < 3; ++layer) {
          const MoeRefProblem p = fusco::test::makeProblem(c, seed + layer);
          const Ref ref = refOf(p, seed + layer);
          const std::string what = "layer " + std::to_string(layer);
          fuscoMoeHandle_t h =
              fusco::test::planChecked(comm, ctx, c, p, ref.d, FUSCO_DEDUP_RANK, what);
          if (h == nullptr) break;
          fusco::test::dispatchChecked(comm, h, ctx, p, ref.d, ref.x, kRowBytes, FUSCO_DEDUP_RANK,
                                       what);
          const Rounds r = roundsOf(h);
          EXPECT_EQ(r.hostRounds, 0u) << "layer " << layer << ": host rounds";
          EXPECT_EQ(r.readBacks, 1u) << "layer " << layer << ": read-backs";
          const std::vector<int64_t>& idx = p.topkIdx[ctx.rank];
          FUSCO_EXPECT_OK(comm, fuscoMoeReplan(h, idx.empty() ? nullptr : idx.data(),
                                               p.numTokens[ctx.rank], c.topk, nullptr));
          fusco::test::recvCountsChecked(comm, h, ctx, ref.d, "replanned");
          fusco::test::dispatchChecked(comm, h, ctx, p, ref.d, ref.x, kRowBytes, FUSCO_DEDUP_RANK,
                                       what + " replanned");
          const Rounds q = roundsOf(h);
          EXPECT_EQ(q.hostRounds + q.readBacks, 1u) << "layer " << layer << ": the replan";
          FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      twinOptions());
}

// A capacity plan reads nothing back: no read-back and no host round.
TEST(PlanRounds, ACapacityPlanNeverWaitsForItsPeers) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        const MoeCase c = roundsCase(ctx.nranks);
        fuscoConfig_t cfg = commConfig(c);
        fuscoComm_t comm = initComm(ctx, &cfg);
        const MoeRefProblem p = fusco::test::makeProblem(c, seed);
        fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_RANK);
        fuscoMoeHandle_t h = nullptr;
        FUSCO_ASSERT_OK(comm, fuscoMoePlanCapacity(&h, comm, &m, p.topkIdx[ctx.rank].data(),
                                                   p.numTokens[ctx.rank], c.topk, 4096, nullptr));
        const Rounds r = roundsOf(h);
        EXPECT_EQ(r.hostRounds, 0u);
        EXPECT_EQ(r.readBacks, 0u);
        const Ref ref = refOf(p, seed);
        fusco::test::recvCountsChecked(comm, h, ctx, ref.d, "capacity plan");
        FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      twinOptions());
}

// Without host rounds the checks ride on the operations: a NULL topkIdx on rank 1, then an
// expert id out of range on rank 2, fail the plan on every rank within seconds, and the next plan
// works.
TEST(PlanRounds, BadArgumentsAndRoutingStillFailEveryRankAtOnce) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        const MoeCase c = roundsCase(ctx.nranks);
        fuscoConfig_t cfg = commConfig(c, 30000);
        fuscoComm_t comm = initComm(ctx, &cfg);
        MoeRefProblem p = fusco::test::makeProblem(c, seed);
        fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_RANK);
        for (int bad = 1; bad <= 2; ++bad) {
          std::vector<int64_t> idx = p.topkIdx[ctx.rank];
          if (ctx.rank == 2 && bad == 2) idx[7 * c.topk + 1] = c.numExperts + 5;
          const int64_t* arg = ctx.rank == 1 && bad == 1 ? nullptr : idx.data();
          fuscoMoeHandle_t h = nullptr;
          const double t0 = fusco::test::nowSec();
          const fuscoResult_t r =
              fuscoMoePlan(&h, comm, &m, arg, p.numTokens[ctx.rank], c.topk, nullptr);
          const std::string msg = fuscoGetLastError(comm);
          EXPECT_NE(r, fuscoSuccess) << "case " << bad;
          EXPECT_EQ(h, nullptr);
          EXPECT_LT(fusco::test::nowSec() - t0, 5.0) << "case " << bad;
          if (ctx.rank != bad)
            EXPECT_TRUE(fusco::test::namesRank(msg, bad)) << "case " << bad << ": " << msg;
          else
            EXPECT_EQ(r, fuscoInvalidArgument) << msg;
        }
        const Ref ref = refOf(p, seed);
        fuscoMoeHandle_t h =
            fusco::test::planChecked(comm, ctx, c, p, ref.d, FUSCO_DEDUP_RANK, "after");
        if (h != nullptr) FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      twinOptions());
}

}  // namespace
