// The NODE dedup planner (src/plan/node_plan.h) simulated in one process: every rank's forward
// metadata goes to its forwarders, every forwarder's blocks to the ranks of its node, and each
// rank must end up with exactly the metadata RANK dedup sends it (so its receive plan, and recvX,
// are the same), whatever routes the balancer chose. Malformed messages are remote errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/topology.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"
#include "plan/node_plan.h"

namespace fusco {
namespace {

struct World {
  NodeMap nodes;
  MoeShape shape;
  int topk = 0;
  std::vector<std::vector<int64_t>> topkIdx;  // [rank]
  std::vector<size_t> tokens;
  std::vector<MoeSendPlan> rankPlan;
  std::vector<NodeSendPlan> nodeSend;
  std::vector<NodeSegment> segs;
};

// nranks ranks, localSize per node; rank s's tokens prefer node `hot` when skewed (so the
// balancer has uneven flows to split).
World makeWorld(int nranks, int localSize, int topk, uint64_t seed, bool skewed, Balance mode,
                bool splitEveryFlow = false) {
  World w;
  w.nodes = buildNodeMap(std::vector<std::string>(nranks, "h"), localSize);
  EXPECT_EQ(buildMoeShape(nranks, 4 * nranks, nullptr, 1, &w.shape), fuscoSuccess);
  w.topk = topk;
  std::mt19937_64 rng(seed);
  for (int s = 0; s < nranks; ++s) {
    const size_t t = 5 + rng() % (skewed && s % 2 == 0 ? 60 : 20);
    w.tokens.push_back(t);
    std::vector<int64_t> idx;
    for (size_t i = 0; i < t; ++i) {
      std::vector<int64_t> row;
      while (static_cast<int>(row.size()) < topk) {
        int64_t e = static_cast<int64_t>(rng() % w.shape.numExperts);
        if (rng() % 7 == 0) e = -1;
        bool dup = false;
        for (int64_t x : row) dup |= (x == e && e >= 0);
        if (!dup) row.push_back(e);
      }
      idx.insert(idx.end(), row.begin(), row.end());
    }
    w.topkIdx.push_back(idx);
  }
  std::vector<uint64_t> rowsTo(static_cast<size_t>(nranks) * w.nodes.numNodes, 0);
  w.nodeSend.resize(nranks);
  for (int s = 0; s < nranks; ++s) {
    w.rankPlan.push_back(planSend(w.shape, s, w.topkIdx[s].data(), w.tokens[s], topk, Dedup::Rank));
    nodeTokensOf(w.shape, w.nodes, w.topkIdx[s].data(), w.tokens[s], topk,
                 &w.nodeSend[s].nodeTokens);
    for (int n = 0; n < w.nodes.numNodes; ++n)
      if (n != w.nodes.nodeOf[s])
        rowsTo[s * w.nodes.numNodes + n] = w.nodeSend[s].nodeTokens[n].size();
  }
  BalancePlan bal;
  planBalance(mode, w.nodes, rowsTo, false, &bal);
  if (splitEveryFlow) {  // every flow of 2+ rows over two forwarders, halves in route order
    for (auto& routes : bal.routes) {
      if (routes.size() != 1 || routes[0].rows < 2) continue;
      const int node = w.nodes.nodeOf[routes[0].forwarder];
      const auto& local = w.nodes.ranksOfNode[node];
      const int other = local[(w.nodes.localRankOf[routes[0].forwarder] + 1) % local.size()];
      const uint64_t half = routes[0].rows / 2;
      routes.push_back(RailRoute{routes[0].relay, other, routes[0].rows - half});
      routes[0].rows = half;
    }
  }
  w.segs = nodeSegments(w.nodes, bal);
  for (int s = 0; s < nranks; ++s) planNodeSend(w.nodes, s, w.rankPlan[s], w.segs, &w.nodeSend[s]);
  return w;
}

// Runs steps 3 and 4 for every rank (failures recorded).
void checkEveryRankGetsRankMetadata(const World& w) {
  const int n = w.nodes.nranks;
  std::vector<std::vector<NodeFwdSeg>> fwd(n);
  for (int f = 0; f < n; ++f) {
    std::vector<std::vector<int32_t>> metaFrom(n);
    for (int s = 0; s < n; ++s)
      if (!w.nodes.sameNode(s, f)) metaFrom[s] = w.nodeSend[s].fwdMeta[f];
    ASSERT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, metaFrom, &fwd[f]), fuscoSuccess)
        << threadLastError();
  }
  for (int l = 0; l < n; ++l) {
    std::vector<std::vector<int32_t>> blocks(n), metaFrom(n);
    for (int f = 0; f < n; ++f)
      if (w.nodes.sameNode(f, l)) nodeBlocksFor(fwd[f], w.segs, w.nodes.localRankOf[l], &blocks[f]);
    std::vector<std::vector<NodeInSeg>> inFrom;
    ASSERT_EQ(planNodeReceive(w.nodes, l, w.segs, blocks, &metaFrom, &inFrom), fuscoSuccess)
        << threadLastError();
    for (int s = 0; s < n; ++s) {
      if (w.nodes.sameNode(s, l)) continue;
      EXPECT_EQ(metaFrom[s], w.rankPlan[s].meta[l]) << "rank " << l << " from " << s;
      std::vector<std::pair<int, NodeInSeg>> got;  // (route, segment) of source s
      for (int f = 0; f < n; ++f)
        for (const NodeInSeg& e : inFrom[f])
          if (w.segs[e.seg].src == s) got.push_back({w.segs[e.seg].route, e});
      std::sort(got.begin(), got.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      size_t rows = 0;
      for (const auto& [route, e] : got) {
        EXPECT_EQ(e.rowOffset, rows)
            << "route " << route << ": segments of a source follow route order";
        rows += e.rows;
      }
      EXPECT_EQ(rows, w.rankPlan[s].rows[l].size()) << "rank " << l << " from " << s;
    }
  }
}

TEST(NodePlan, EveryRankGetsExactlyTheRankMetadataInEveryBalanceMode) {
  for (Balance mode : {Balance::None, Balance::Static, Balance::Greedy})
    for (auto [nranks, ls] : {std::pair{4, 2}, {6, 3}, {5, 2}, {8, 2}, {9, 3}})
      for (uint64_t seed = 1; seed <= 6; ++seed) {
        SCOPED_TRACE(std::string(balanceName(mode)) + " " + std::to_string(nranks) + "/" +
                     std::to_string(ls) + " seed " + std::to_string(seed));
        checkEveryRankGetsRankMetadata(makeWorld(nranks, ls, 4, seed, seed % 2 == 0, mode));
      }
}

TEST(NodePlan, SegmentsCoverEachFlowOnceInRouteOrder) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    World w = makeWorld(9, 3, 5, seed, true, Balance::Greedy);
    for (int s = 0; s < 9; ++s)
      for (int node = 0; node < w.nodes.numNodes; ++node) {
        uint64_t pos = 0;
        for (const NodeSegment& g : w.segs) {
          if (g.src != s || g.node != node) continue;
          EXPECT_EQ(g.pos0, pos);
          EXPECT_EQ(w.nodes.nodeOf[g.forwarder], node);
          pos += g.rows;
        }
        const size_t want = node == w.nodes.nodeOf[s] ? 0 : w.nodeSend[s].nodeTokens[node].size();
        EXPECT_EQ(pos, want) << s << " -> node " << node;
      }
  }
}

TEST(NodePlan, FlowsSplitOverTwoForwardersReassembleInRouteOrder) {
  for (auto [nranks, ls] : {std::pair{4, 2}, {6, 3}, {9, 3}})
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(std::to_string(nranks) + "/" + std::to_string(ls) + " seed " +
                   std::to_string(seed));
      World w = makeWorld(nranks, ls, 4, seed, true, Balance::Static, true);
      size_t twoRoutes = 0;
      for (const NodeSegment& g : w.segs) twoRoutes += g.route == 1;
      EXPECT_GT(twoRoutes, 0u);
      checkEveryRankGetsRankMetadata(w);
    }
}

TEST(NodePlan, MalformedForwardMetadataOrBlocksAreRemoteErrors) {
  World w = makeWorld(4, 2, 3, 5, false, Balance::Static);
  const int f = w.segs.empty() ? 0 : w.segs[0].forwarder, s = w.segs.empty() ? 0 : w.segs[0].src;
  ASSERT_FALSE(w.segs.empty());
  std::vector<std::vector<int32_t>> metaFrom(4);
  for (int p = 0; p < 4; ++p)
    if (!w.nodes.sameNode(p, f)) metaFrom[p] = w.nodeSend[p].fwdMeta[f];
  std::vector<NodeFwdSeg> fwd;
  auto truncated = metaFrom;
  truncated[s].pop_back();
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, truncated, &fwd), fuscoRemoteError);
  EXPECT_NE(threadLastError().find("rank " + std::to_string(s)), std::string::npos)
      << threadLastError();
  auto extra = metaFrom;
  extra[s].push_back(1);
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, extra, &fwd), fuscoRemoteError);
  auto badRank = metaFrom;
  badRank[s][1] = 7;  // local rank index of the first row's first destination
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, badRank, &fwd), fuscoRemoteError);
  // Every forwarder of f's node, as f receives their blocks: fine as sent, an error once changed.
  std::vector<std::vector<int32_t>> blocks(4), out(4);
  std::vector<std::vector<NodeInSeg>> inFrom;
  for (int g = 0; g < 4; ++g) {
    if (!w.nodes.sameNode(g, f)) continue;
    std::vector<std::vector<int32_t>> from(4);
    for (int p = 0; p < 4; ++p)
      if (!w.nodes.sameNode(p, g)) from[p] = w.nodeSend[p].fwdMeta[g];
    ASSERT_EQ(planNodeForward(w.shape, w.nodes, g, w.segs, from, &fwd), fuscoSuccess);
    nodeBlocksFor(fwd, w.segs, w.nodes.localRankOf[f], &blocks[g]);
  }
  EXPECT_EQ(planNodeReceive(w.nodes, f, w.segs, blocks, &out, &inFrom), fuscoSuccess)
      << threadLastError();
  out.assign(4, {});
  blocks[f][0] ^= 1;  // names another source
  EXPECT_EQ(planNodeReceive(w.nodes, f, w.segs, blocks, &out, &inFrom), fuscoRemoteError);
}

// A block's row count sizes the receiver's views of the source's fan rows: one that disagrees
// with the rows its metadata describes would make dispatch and combine read past them.
TEST(NodePlan, BlockRowCountThatDisagreesWithItsMetadataIsARemoteError) {
  World w = makeWorld(4, 2, 3, 5, false, Balance::Static);
  ASSERT_FALSE(w.segs.empty());
  const int f = w.segs[0].forwarder;
  std::vector<std::vector<int32_t>> blocks(4), out(4);
  std::vector<std::vector<NodeInSeg>> inFrom;
  std::vector<NodeFwdSeg> fwd;
  int sender = -1;
  for (int g = 0; g < 4; ++g) {
    if (!w.nodes.sameNode(g, f)) continue;
    std::vector<std::vector<int32_t>> from(4);
    for (int p = 0; p < 4; ++p)
      if (!w.nodes.sameNode(p, g)) from[p] = w.nodeSend[p].fwdMeta[g];
    ASSERT_EQ(planNodeForward(w.shape, w.nodes, g, w.segs, from, &fwd), fuscoSuccess);
    nodeBlocksFor(fwd, w.segs, w.nodes.localRankOf[f], &blocks[g]);
    if (sender < 0 && !blocks[g].empty()) sender = g;
  }
  ASSERT_GE(sender, 0);
  ASSERT_EQ(planNodeReceive(w.nodes, f, w.segs, blocks, &out, &inFrom), fuscoSuccess)
      << threadLastError();
  out.assign(4, {});
  blocks[sender][2] += 1000;  // the first block's row count, its metadata unchanged
  EXPECT_EQ(planNodeReceive(w.nodes, f, w.segs, blocks, &out, &inFrom), fuscoRemoteError);
  EXPECT_NE(threadLastError().find("forwarder rank " + std::to_string(sender)), std::string::npos)
      << threadLastError();
}

}  // namespace
}  // namespace fusco
