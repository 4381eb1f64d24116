// tools/fusco_sim's link accounting (tools/fusco_sim/fusco_sim_model.h) on a tiny cluster, 2 nodes
// x 2 GPUs, with bytes computed by hand, and its routing patterns' promises (perf/moe_routing.h,
// through tools/fusco_sim/fusco_sim_routing.h). fusco_sim_lib comes from tools/ (built with
// FUSCO_BUILD_PERF); without it these tests are not compiled.
#include <gtest/gtest.h>

#if __has_include("fusco_sim_model.h")

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "fusco_sim_model.h"
#include "fusco_sim_routing.h"
#include "fusco_sim_timing.h"

namespace fusco {
namespace sim {
namespace {

// Ranks 0,1 on node 0 and 2,3 on node 1; rank r holds experts 2r and 2r+1. Two tokens per rank,
// top-2. Rank 0: token 0 -> experts 4 (rank 2) and 6 (rank 3); token 1 -> experts 4 and 5 (both
// rank 2). Every other rank keeps its tokens on its own experts (no link bytes).
struct Tiny {
  NodeMap nodes = buildNodeMap(std::vector<std::string>(4, "h"), 2);
  MoeShape shape;
  Accounting acc;
  static constexpr uint64_t B = 1000000;  // 1 MB rows: 1 GB/s links give whole milliseconds

  explicit Tiny(uint32_t slack = 0) {
    EXPECT_EQ(buildMoeShape(4, 8, nullptr, 1, &shape), fuscoSuccess);
    AccountSpec spec;
    spec.tokens = 2;
    spec.topk = 2;
    spec.rowBytes = B;
    spec.slack1024 = slack;
    accountCluster(
        shape, nodes,
        [](int r, std::vector<int64_t>* idx) {
          if (r == 0)
            *idx = {4, 6, 4, 5};
          else
            *idx = {2 * r, 2 * r + 1, 2 * r, 2 * r + 1};
        },
        spec, &acc);
  }
  const LinkBytes& of(Strategy s) const { return acc.links[static_cast<int>(s)]; }
};

TEST(FuscoSim, NcclLikeSendsOneRowPerTokenExpertAndPermutesEveryRow) {
  Tiny t;
  const LinkBytes& l = t.of(Strategy::NcclLike);
  EXPECT_EQ(l.nicSend, (std::vector<uint64_t>{4 * Tiny::B, 0, 0, 0}));
  EXPECT_EQ(l.nicRecv, (std::vector<uint64_t>{0, 0, 3 * Tiny::B, 1 * Tiny::B}));
  EXPECT_EQ(l.totalNvSend(), 0u);
  // Sent rows + received rows, self rows included: rank 2 sends 4 to itself and gets 3 from 0.
  EXPECT_EQ(l.hbm, (std::vector<uint64_t>{4 * Tiny::B, 8 * Tiny::B, 11 * Tiny::B, 9 * Tiny::B}));
  EXPECT_EQ(t.acc.flatRemoteRows, 4u);
  EXPECT_EQ(t.acc.netCopies, 2u);  // one copy per (token, remote node)
}

TEST(FuscoSim, StaticRailCrossesOnceAndForwarderFansOut) {
  Tiny t;
  const LinkBytes& l = t.of(Strategy::DeepepLike);
  EXPECT_EQ(l.nicSend, (std::vector<uint64_t>{2 * Tiny::B, 0, 0, 0}));
  EXPECT_EQ(l.nicRecv, (std::vector<uint64_t>{0, 0, 2 * Tiny::B, 0}));  // same local index: rank 2
  // Token 0 also needs rank 3: rank 2 forwards it over NVLink; token 1 stays at rank 2.
  EXPECT_EQ(l.nvSend, (std::vector<uint64_t>{0, 0, 1 * Tiny::B, 0}));
  EXPECT_EQ(l.nvRecv, (std::vector<uint64_t>{0, 0, 0, 1 * Tiny::B}));
  EXPECT_EQ(l.hbm, t.of(Strategy::NcclLike).hbm);  // separate permute passes
}

TEST(FuscoSim, PaperBalancerRotatesPositionsByNodeIndex) {
  Tiny t;
  // Node 0 by load: [0, 1]; node 1 (loads equal): [2, 3] rotated by 1 -> [3, 2]: position 0 is 3.
  const LinkBytes& l = t.of(Strategy::FuscoPaperLike);
  EXPECT_EQ(l.nicRecv, (std::vector<uint64_t>{0, 0, 0, 2 * Tiny::B}));
  EXPECT_EQ(l.nvSend, (std::vector<uint64_t>{0, 0, 0, 2 * Tiny::B}));  // both tokens need rank 2
  EXPECT_EQ(l.nvRecv, (std::vector<uint64_t>{0, 0, 2 * Tiny::B, 0}));
  EXPECT_EQ(t.acc.balance[2].maxLoad, 2u);
  EXPECT_EQ(l.totalNicSend(), 2 * Tiny::B);
}

TEST(FuscoSim, GreedyRelaysHalfThroughTheLocalPeer) {
  Tiny t(/*slack=*/0);
  const LinkBytes& l = t.of(Strategy::Fusco);
  EXPECT_EQ(t.acc.balance[3].maxLoad, 1u);
  EXPECT_EQ(l.nicSend, (std::vector<uint64_t>{Tiny::B, Tiny::B, 0, 0}));
  EXPECT_EQ(l.nicRecv[2] + l.nicRecv[3], 2 * Tiny::B);
  EXPECT_EQ(std::max(l.nicRecv[2], l.nicRecv[3]), Tiny::B);
  EXPECT_EQ(l.nvSend[0], Tiny::B);  // the relay hand-off
  EXPECT_EQ(l.nvRecv[1], Tiny::B);
}

TEST(FuscoSim, PhaseTimeIsTheBusiestLinkPerHop) {
  Tiny t;
  LinkModel m;
  m.nicGBs = m.nvlinkGBs = m.permuteGBs = 1;
  m.stepUs = 0;
  m.sliceKB = 0;
  const StrategyModel flat{1.0, HopMode::Flat, true, 0};
  const PhaseTime d = phaseTime(t.of(Strategy::NcclLike), false, m, flat);
  EXPECT_DOUBLE_EQ(d.interMs, 4.0);  // 4 MB out of rank 0's NIC
  EXPECT_DOUBLE_EQ(d.permMs, 11.0);  // rank 2's permute passes
  EXPECT_DOUBLE_EQ(d.ms, 15.0);
  EXPECT_EQ(d.busiest, "hbm-permute r2");
  const StrategyModel noPerm{1.0, HopMode::Flat, false, 0};
  const PhaseTime c = phaseTime(t.of(Strategy::NcclLike), true, m, noPerm);
  EXPECT_EQ(c.busiest, "nic-rx r0");  // combine mirrors dispatch
  EXPECT_DOUBLE_EQ(c.ms, 4.0);
  const LinkBytes& p = t.of(Strategy::FuscoPaperLike);  // inter 2 ms, intra 2 ms
  EXPECT_DOUBLE_EQ(phaseTime(p, false, m, {1.0, HopMode::Sequential, false, 0}).ms, 4.0);
  EXPECT_DOUBLE_EQ(phaseTime(p, false, m, {1.0, HopMode::Pipelined, false, 0}).ms, 2.0);
  EXPECT_DOUBLE_EQ(lowerBoundMs(t.acc.netCopies, Tiny::B, 4, m), 1.0);
}

std::set<int> nodesOfToken(const std::vector<int64_t>& idx, size_t t, int topk, int perNode) {
  std::set<int> n;
  for (int k = 0; k < topk; ++k) n.insert(static_cast<int>(idx[t * topk + k]) / perNode);
  return n;
}

TEST(FuscoSim, RoutingPatternsKeepTheirNodePromises) {
  SimRoutingSpec s;  // 8 x 8, 256 experts, top-8: 32 experts per node
  s.tokens = 256;
  for (Pattern p : {Pattern::RealWorld, Pattern::SingleNode, Pattern::Imbalanced}) {
    for (int imbMax : {0, 4}) {
      if (imbMax && p != Pattern::Imbalanced) continue;
      s.pattern = p;
      s.imbMaxNodes = imbMax;
      const SimRouter router(s);
      std::vector<int64_t> a, b;
      router.route(3, &a);
      router.route(3, &b);
      EXPECT_EQ(a, b) << perf::patternName(p);  // deterministic
      size_t widest = 0;
      for (size_t t = 0; t < s.tokens; ++t) {
        const std::set<int> n = nodesOfToken(a, t, s.topk, 32);
        widest = std::max(widest, n.size());
        const size_t limit = p == Pattern::SingleNode  ? 1
                             : p == Pattern::RealWorld ? 4
                             : imbMax                  ? 4
                                                       : 7;
        EXPECT_LE(n.size(), limit) << perf::patternName(p) << " token " << t;
        // Rank 3 is heavy (local index < 4): under imbalanced it never stays on node 0.
        if (p == Pattern::Imbalanced) {
          EXPECT_EQ(n.count(0), 0u) << "token " << t;
        }
      }
      // Without a node cap, some of 256 hot-skewed top-8 tokens span more than 4 nodes.
      if (p == Pattern::Imbalanced && imbMax == 0) {
        EXPECT_GT(widest, 4u);
      }
    }
  }
}

// Imbalanced: the heavy half of every node (the same local indices everywhere) sends about
// imbRatio times the cross-node (token, expert) rows of the light half.
TEST(FuscoSim, ImbalancedHeavyRanksSendImbRatioTimesTheCrossNodeRows) {
  SimRoutingSpec s;  // 8 x 8
  s.tokens = 4096;
  s.pattern = Pattern::Imbalanced;
  const SimRouter router(s);
  const int perRank = s.numExperts / (s.nodes * s.gpus);
  double heavy = 0, light = 0;
  std::vector<int64_t> idx;
  for (int r = 0; r < s.nodes * s.gpus; ++r) {
    router.route(r, &idx);
    size_t remote = 0;
    for (int64_t e : idx) remote += static_cast<int>(e) / perRank / s.gpus != r / s.gpus;
    (r % s.gpus < s.gpus / 2 ? heavy : light) += static_cast<double>(remote);
  }
  EXPECT_NEAR(heavy / light, s.imbRatio, 0.1 * s.imbRatio);
}

// The planner timing runs rank 0's whole layer (send, forward, receive) on metadata the other
// ranks really planned; a malformed step would throw. What it forwards and receives is exact: the
// rows of its segments, and every row the cluster routes to its experts.
TEST(FuscoSim, PlanTimingRunsRankZerosWholeLayerOnTheClustersMetadata) {
  PlanTimingSpec spec;
  spec.routing.nodes = 3;
  spec.routing.gpus = 4;
  spec.routing.numExperts = 24;
  spec.routing.topk = 4;
  spec.routing.tokens = 300;
  spec.reps = 2;
  const PlanTiming t = timePlanLayer(spec);
  EXPECT_GT(t.forwardedRows, 0u);
  // Rows rank 0 receives: one per (source token, expert of rank 0) (no alignment padding).
  const SimRouter router(spec.routing);
  std::vector<int64_t> idx;
  size_t want = 0;
  for (int s = 0; s < 12; ++s) {
    router.route(s, &idx);
    for (int64_t e : idx) want += e >= 0 && e < 2;  // rank 0 holds experts 0 and 1
  }
  EXPECT_EQ(t.receivedRows, want);
  EXPECT_GE(t.total(), 0.0);
}

}  // namespace
}  // namespace sim
}  // namespace fusco

#endif  // __has_include("fusco_sim_model.h")
