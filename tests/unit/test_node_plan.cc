// The NODE dedup planner (src/plan/node_plan.h) simulated in one process: every rank's forward
// metadata goes to its forwarders, every forwarder's blocks to the ranks of its node, and each
// rank must end up with exactly the metadata RANK dedup sends it (so its receive plan, and recvX,
// are the same), whatever routes the balancer chose. Malformed messages are remote errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <utility>
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

// How makeWorld reshapes the balancer's routes: every flow of 2+ rows split in halves over two
// forwarders, or over two relays that land at the same forwarder.
enum class Split { None, TwoForwarders, TwoRelaysOneForwarder };

// nranks ranks, localSize per node; rank s's tokens prefer node `hot` when skewed (so the
// balancer has uneven flows to split).
World makeWorld(int nranks, int localSize, int topk, uint64_t seed, bool skewed, Balance mode,
                Split split = Split::None, bool allowRelay = false) {
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
    remoteNodeRows(w.nodes, s, w.nodeSend[s].nodeTokens, rowsTo.data() + s * w.nodes.numNodes);
  }
  BalancePlan bal;
  planBalance(mode, w.nodes, rowsTo, allowRelay, &bal);
  for (auto& routes : bal.routes) {  // halves in route order
    if (split == Split::None || routes.size() != 1 || routes[0].rows < 2) continue;
    const RailRoute r = routes[0];
    const bool twoForwarders = split == Split::TwoForwarders;
    const int pivot = twoForwarders ? r.forwarder : r.relay;
    const auto& peers = w.nodes.ranksOfNode[w.nodes.nodeOf[pivot]];
    const int next = peers[(w.nodes.localRankOf[pivot] + 1) % peers.size()];
    const uint64_t half = r.rows / 2;
    routes.push_back(twoForwarders ? RailRoute{r.relay, next, r.rows - half}
                                   : RailRoute{next, r.forwarder, r.rows - half});
    routes[0].rows = half;
  }
  w.segs = nodeSegments(w.nodes, bal);
  for (int s = 0; s < nranks; ++s) planNodeSend(w.nodes, s, w.rankPlan[s], w.segs, &w.nodeSend[s]);
  return w;
}

// The forward metadata forwarder f receives: what every source of another node sent it.
std::vector<std::vector<int32_t>> forwardMetaTo(const World& w, int f) {
  std::vector<std::vector<int32_t>> metaFrom(w.nodes.nranks);
  for (int s = 0; s < w.nodes.nranks; ++s)
    if (!w.nodes.sameNode(s, f)) metaFrom[s] = w.nodeSend[s].fwdMeta[f];
  return metaFrom;
}

// The blocks each forwarder g of l's node sends l (blocks[g]), planned from what g received.
std::vector<std::vector<int32_t>> blocksTo(const World& w, int l) {
  std::vector<std::vector<int32_t>> blocks(w.nodes.nranks);
  std::vector<NodeFwdSeg> fwd;
  for (int g = 0; g < w.nodes.nranks; ++g) {
    if (!w.nodes.sameNode(g, l)) continue;
    EXPECT_EQ(planNodeForward(w.shape, w.nodes, g, w.segs, forwardMetaTo(w, g), &fwd), fuscoSuccess)
        << "forwarder " << g << ": " << threadLastError();
    nodeBlocksFor(fwd, w.segs, w.nodes.localRankOf[l], &blocks[g]);
  }
  return blocks;
}

// Runs steps 3 and 4 for every rank (failures recorded).
void checkEveryRankGetsRankMetadata(const World& w) {
  const int n = w.nodes.nranks;
  for (int l = 0; l < n; ++l) {
    std::vector<std::vector<int32_t>> blocks = blocksTo(w, l), metaFrom(n);
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
      World w = makeWorld(nranks, ls, 4, seed, true, Balance::Static, Split::TwoForwarders);
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
  const std::vector<std::vector<int32_t>> metaFrom = forwardMetaTo(w, f);
  std::vector<NodeFwdSeg> fwd;
  auto truncated = metaFrom;
  truncated[s].pop_back();
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, truncated, &fwd), fuscoRemoteError);
  EXPECT_NE(threadLastError().find("rank " + std::to_string(s)), std::string::npos)
      << threadLastError();
  auto extra = metaFrom;
  extra[s].push_back(1);
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, extra, &fwd), fuscoRemoteError);
  // The first block (local rank 0's rows): a count above the segment's rows, rows out of order
  // or out of range, and metadata describing one row more than its count.
  ASSERT_GE(metaFrom[s].size(), 2u);
  auto badCount = metaFrom;
  badCount[s][0] = static_cast<int32_t>(w.segs[0].rows + 1);
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, badCount, &fwd), fuscoRemoteError);
  const int32_t c0 = metaFrom[s][0];
  if (c0 >= 1) {
    auto badRow = metaFrom;
    badRow[s][1] = static_cast<int32_t>(w.segs[0].rows);  // one past the segment's last row
    EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, badRow, &fwd), fuscoRemoteError);
    EXPECT_NE(threadLastError().find("out of order or range"), std::string::npos)
        << threadLastError();
  }
  // A segment whose row count (from counts other ranks reported) is far beyond the words sent:
  // refused as truncated before anything is sized by it.
  std::vector<NodeSegment> hugeSegs = w.segs;
  hugeSegs[0].rows = uint64_t{1} << 31;
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, hugeSegs, metaFrom, &fwd), fuscoRemoteError);
  EXPECT_NE(threadLastError().find("truncated"), std::string::npos) << threadLastError();
  auto extraRow = metaFrom;  // lr 0's metadata gains a row its count does not have
  const size_t wordsAt = 1 + static_cast<size_t>(c0);
  extraRow[s][wordsAt] += 2;
  extraRow[s].insert(extraRow[s].begin() + static_cast<std::ptrdiff_t>(wordsAt + 1), {1, 0});
  EXPECT_EQ(planNodeForward(w.shape, w.nodes, f, w.segs, extraRow, &fwd), fuscoRemoteError);
  // Every forwarder of f's node, as f receives their blocks: fine as sent, an error once changed.
  std::vector<std::vector<int32_t>> blocks = blocksTo(w, f), out(4);
  std::vector<std::vector<NodeInSeg>> inFrom;
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
  std::vector<std::vector<int32_t>> blocks = blocksTo(w, f), out(4);
  std::vector<std::vector<NodeInSeg>> inFrom;
  int sender = -1;
  for (int g = 0; g < 4 && sender < 0; ++g)
    if (!blocks[g].empty()) sender = g;
  ASSERT_GE(sender, 0);
  ASSERT_EQ(planNodeReceive(w.nodes, f, w.segs, blocks, &out, &inFrom), fuscoSuccess)
      << threadLastError();
  out.assign(4, {});
  blocks[sender][2] += 1000;  // the first block's row count, its metadata unchanged
  EXPECT_EQ(planNodeReceive(w.nodes, f, w.segs, blocks, &out, &inFrom), fuscoRemoteError);
  EXPECT_NE(threadLastError().find("forwarder rank " + std::to_string(sender)), std::string::npos)
      << threadLastError();
}

// The straightforward forms of nodeTokensOf and planNodeSend: one push per token and node, and a
// token-by-token merge over the RANK rows of every rank of the destination node.
std::vector<std::vector<int64_t>> referenceNodeTokens(const MoeShape& shape, const NodeMap& nodes,
                                                      const int64_t* topkIdx, size_t numTokens,
                                                      int topk) {
  std::vector<std::vector<int64_t>> out(nodes.numNodes);
  for (size_t t = 0; t < numTokens; ++t)
    for (int k = 0; k < topk; ++k) {
      const int64_t e = topkIdx[t * topk + k];
      if (e < 0 || e >= shape.numExperts) continue;
      auto& v = out[nodes.nodeOf[shape.expertToRank[e]]];
      if (v.empty() || v.back() != static_cast<int64_t>(t)) v.push_back(static_cast<int64_t>(t));
    }
  return out;
}

std::vector<std::vector<int32_t>> referenceForwardMeta(
    const NodeMap& nodes, int rank, const MoeSendPlan& plan, const std::vector<NodeSegment>& segs,
    const std::vector<std::vector<int64_t>>& nodeTokens, std::vector<size_t>* mine) {
  std::vector<std::vector<int32_t>> out(nodes.nranks);
  std::vector<size_t> row(nodes.nranks, 0), word(nodes.nranks, 0);
  mine->clear();
  for (size_t i = 0; i < segs.size(); ++i) {
    const NodeSegment& g = segs[i];
    if (g.src != rank) continue;
    mine->push_back(i);
    const auto& tokens = nodeTokens[g.node];
    const auto& local = nodes.ranksOfNode[g.node];
    // Per local rank: the segment's rows it needs and their RANK metadata, in row order.
    std::vector<std::vector<int32_t>> rowsOf(local.size()), metaOf(local.size());
    for (uint64_t j = g.pos0; j < g.pos0 + g.rows && j < tokens.size(); ++j) {
      for (size_t lr = 0; lr < local.size(); ++lr) {
        const int r = local[lr];
        if (row[r] >= plan.rows[r].size() || plan.rows[r][row[r]] != tokens[j]) continue;
        const int32_t m = plan.meta[r][word[r]];
        rowsOf[lr].push_back(static_cast<int32_t>(j - g.pos0));
        metaOf[lr].insert(metaOf[lr].end(), plan.meta[r].begin() + word[r],
                          plan.meta[r].begin() + word[r] + 1 + m);
        word[r] += 1 + m;
        ++row[r];
      }
    }
    auto& meta = out[g.forwarder];
    for (size_t lr = 0; lr < local.size(); ++lr) {
      meta.push_back(static_cast<int32_t>(rowsOf[lr].size()));
      meta.insert(meta.end(), rowsOf[lr].begin(), rowsOf[lr].end());
      meta.push_back(static_cast<int32_t>(metaOf[lr].size()));
      meta.insert(meta.end(), metaOf[lr].begin(), metaOf[lr].end());
    }
  }
  return out;
}

TEST(NodePlan, SendPlansEqualTheTokenByTokenMergeForEveryRouteShape) {
  NodeSendPlan reused;  // planned into again and again, for every world below: storage is reused
  size_t worlds = 0;
  for (Split split : {Split::None, Split::TwoForwarders, Split::TwoRelaysOneForwarder})
    for (auto [nranks, ls, topk] :
         {std::tuple{4, 2, 3}, {9, 3, 5}, {12, 4, 8}, {7, 3, 2}, {16, 8, 6}})
      for (uint64_t seed = 1; seed <= 4; ++seed) {
        SCOPED_TRACE(std::to_string(nranks) + "/" + std::to_string(ls) + " top-" +
                     std::to_string(topk) + " seed " + std::to_string(seed) + " split " +
                     std::to_string(static_cast<int>(split)));
        const World w =
            makeWorld(nranks, ls, topk, seed, seed % 2 == 0, Balance::Greedy, split, seed % 3 != 0);
        ++worlds;
        for (int s = 0; s < nranks; ++s) {
          const auto tokens =
              referenceNodeTokens(w.shape, w.nodes, w.topkIdx[s].data(), w.tokens[s], topk);
          ASSERT_EQ(w.nodeSend[s].nodeTokens, tokens) << "rank " << s;
          std::vector<size_t> mine;
          const auto want = referenceForwardMeta(w.nodes, s, w.rankPlan[s], w.segs, tokens, &mine);
          EXPECT_EQ(w.nodeSend[s].fwdMeta, want) << "rank " << s;
          EXPECT_EQ(w.nodeSend[s].segs, mine) << "rank " << s;
          nodeTokensOf(w.nodes, w.rankPlan[s], &reused.nodeTokens);
          EXPECT_EQ(reused.nodeTokens, tokens) << "rank " << s << ", from the RANK plan";
          const MoeSendPlan none =
              planSend(w.shape, s, w.topkIdx[s].data(), w.tokens[s], topk, Dedup::None);
          nodeTokensOf(w.nodes, none, &reused.nodeTokens);
          EXPECT_EQ(reused.nodeTokens, tokens) << "rank " << s << ", from the NONE plan";
          nodeTokensOf(w.shape, w.nodes, w.topkIdx[s].data(), w.tokens[s], topk,
                       &reused.nodeTokens);
          planNodeSend(w.nodes, s, w.rankPlan[s], w.segs, &reused);
          EXPECT_EQ(reused.nodeTokens, tokens) << "rank " << s << ", reused plan";
          EXPECT_EQ(reused.fwdMeta, want) << "rank " << s << ", reused plan";
          EXPECT_EQ(reused.segs, mine) << "rank " << s << ", reused plan";
        }
      }
  EXPECT_EQ(worlds, 60u);
}

// A rank's balancer counts: its tokens per remote node, nothing for its own, and their sum.
TEST(NodePlan, RemoteNodeRowsCountsRemoteNodesOnlyAndSumsThem) {
  const NodeMap nodes = buildNodeMap(std::vector<std::string>(6, "h"), 2);
  const std::vector<std::vector<int64_t>> tokens = {{0, 1, 2}, {4}, {1, 3}};
  uint64_t out[3] = {9, 9, 9};
  EXPECT_EQ(remoteNodeRows(nodes, 2, tokens, out), 5u);  // rank 2 is on node 1
  EXPECT_EQ(out[0], 3u);
  EXPECT_EQ(out[1], 0u);
  EXPECT_EQ(out[2], 2u);
  // Missing lists count as empty; a mismatched forwarder-metadata vector is an internal error.
  EXPECT_EQ(remoteNodeRows(nodes, 0, {{0}}, out), 0u);
  EXPECT_EQ(out[1] + out[2], 0u);
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(6, 6, nullptr, 1, &shape), fuscoSuccess);
  std::vector<NodeFwdSeg> fwd;
  EXPECT_EQ(planNodeForward(shape, nodes, 0, {}, std::vector<std::vector<int32_t>>(5), &fwd),
            fuscoInternalError);
}

TEST(NodePlan, SegmentsOfFindsEachSourcesRoutesAndReusedListsMatchFreshOnes) {
  std::vector<NodeSegment> reused;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const World w = makeWorld(12, 4, 4, seed, true, Balance::Greedy, Split::TwoForwarders, true);
    for (int s = -1; s <= 12; ++s)
      for (int node = -1; node <= w.nodes.numNodes; ++node) {
        size_t first = w.segs.size(), last = 0;
        for (size_t i = 0; i < w.segs.size(); ++i)
          if (w.segs[i].src == s && (node < 0 || w.segs[i].node == node)) {
            first = std::min(first, i);
            last = i + 1;
          }
        const auto got = segmentsOf(w.segs, s, node);
        if (last == 0) {
          EXPECT_EQ(got.first, got.second) << s << " -> " << node;
        } else {
          EXPECT_EQ(got, std::make_pair(first, last)) << s << " -> " << node;
        }
      }
    BalancePlan bal;
    std::vector<uint64_t> rowsTo(12 * w.nodes.numNodes, 0);
    for (int s = 0; s < 12; ++s)
      remoteNodeRows(w.nodes, s, w.nodeSend[s].nodeTokens, rowsTo.data() + s * w.nodes.numNodes);
    planBalance(Balance::Greedy, w.nodes, rowsTo, seed % 2 == 0, &bal,
                static_cast<uint32_t>(seed * 16));
    nodeSegmentsInto(w.nodes, bal, &reused);
    const auto fresh = nodeSegments(w.nodes, bal);
    ASSERT_EQ(reused.size(), fresh.size());
    for (size_t i = 0; i < fresh.size(); ++i) {
      EXPECT_EQ(reused[i].src, fresh[i].src);
      EXPECT_EQ(reused[i].node, fresh[i].node);
      EXPECT_EQ(reused[i].route, fresh[i].route);
      EXPECT_EQ(reused[i].relay, fresh[i].relay);
      EXPECT_EQ(reused[i].forwarder, fresh[i].forwarder);
      EXPECT_EQ(reused[i].pos0, fresh[i].pos0);
      EXPECT_EQ(reused[i].rows, fresh[i].rows);
    }
  }
}

}  // namespace
}  // namespace fusco
