// The NIC / forwarder load balancer (src/plan/balance.h): every plan is checked for consistency
// (routes sum to the flows, relays on the source node, forwarders on the destination, loads add
// up), and GREEDY is compared with STATIC, the FUSCO paper's Algorithm 1, the brute-force unsplit
// optimum and the lower bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "plan/balance.h"

namespace fusco {
namespace {

// nranks ranks, node = rank / localSize (the last node may be smaller).
NodeMap makeNodes(int nranks, int localSize) {
  return buildNodeMap(std::vector<std::string>(nranks, "host"), localSize);
}

size_t flowIndex(const NodeMap& nodes, int s, int n) {
  return static_cast<size_t>(s) * nodes.numNodes + n;
}

std::vector<uint64_t> randomRows(const NodeMap& nodes, uint64_t seed, uint64_t maxRows,
                                 int zeroPercent) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> rows(static_cast<size_t>(nodes.nranks) * nodes.numNodes);
  for (uint64_t& r : rows)
    r = static_cast<int>(rng() % 100) < zeroPercent ? 0 : 1 + rng() % maxRows;
  return rows;
}

// Checks every promise of BalancePlan for this input.
void expectValidPlan(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, bool allowRelay,
                     const BalancePlan& p) {
  ASSERT_EQ(p.routes.size(), rowsTo.size());
  std::vector<uint64_t> send(nodes.nranks, 0), recv(nodes.nranks, 0);
  for (int s = 0; s < nodes.nranks; ++s)
    for (int n = 0; n < nodes.numNodes; ++n) {
      const size_t f = flowIndex(nodes, s, n);
      const std::vector<RailRoute>& rs = p.routes[f];
      if (n == nodes.nodeOf[s] || rowsTo[f] == 0) {
        EXPECT_TRUE(rs.empty()) << "s " << s << " n " << n;
        continue;
      }
      uint64_t sum = 0;
      std::set<std::pair<int, int>> seen;
      for (const RailRoute& r : rs) {
        EXPECT_GT(r.rows, 0u);
        ASSERT_GE(r.relay, 0);
        ASSERT_LT(r.relay, nodes.nranks);
        ASSERT_GE(r.forwarder, 0);
        ASSERT_LT(r.forwarder, nodes.nranks);
        EXPECT_EQ(nodes.nodeOf[r.relay], nodes.nodeOf[s]);
        EXPECT_EQ(nodes.nodeOf[r.forwarder], n);
        if (!allowRelay) {
          EXPECT_EQ(r.relay, s);
        }
        EXPECT_TRUE(seen.insert({r.relay, r.forwarder}).second) << "duplicate route";
        sum += r.rows;
        send[r.relay] += r.rows;
        recv[r.forwarder] += r.rows;
      }
      EXPECT_EQ(sum, rowsTo[f]) << "s " << s << " n " << n;
    }
  EXPECT_EQ(p.sendLoad, send);
  EXPECT_EQ(p.recvLoad, recv);
  uint64_t m = 0;
  for (int r = 0; r < nodes.nranks; ++r) m = std::max({m, send[r], recv[r]});
  EXPECT_EQ(p.maxLoad, m);
}

BalancePlan plan(Balance mode, const NodeMap& nodes, const std::vector<uint64_t>& rowsTo,
                 bool allowRelay) {
  BalancePlan p;
  planBalance(mode, nodes, rowsTo, allowRelay, &p);
  expectValidPlan(nodes, rowsTo, allowRelay, p);
  return p;
}

uint64_t maxSendTotal(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo) {
  uint64_t m = 0;
  for (int s = 0; s < nodes.nranks; ++s) {
    uint64_t t = 0;
    for (int n = 0; n < nodes.numNodes; ++n)
      if (n != nodes.nodeOf[s]) t += rowsTo[flowIndex(nodes, s, n)];
    m = std::max(m, t);
  }
  return m;
}

// The FUSCO paper's Algorithm 1: per destination node, senders sorted by rows (descending, ties by
// rank), the order rotated by the node index, forwarders assigned by position. Returns its maxLoad.
uint64_t algorithm1MaxLoad(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo) {
  std::vector<uint64_t> recv(nodes.nranks, 0);
  for (int n = 0; n < nodes.numNodes; ++n) {
    std::vector<int> senders;
    for (int s = 0; s < nodes.nranks; ++s)
      if (nodes.nodeOf[s] != n) senders.push_back(s);
    std::stable_sort(senders.begin(), senders.end(), [&](int a, int b) {
      return rowsTo[flowIndex(nodes, a, n)] > rowsTo[flowIndex(nodes, b, n)];
    });
    const int m = nodes.localSize(n);
    for (size_t i = 0; i < senders.size(); ++i)
      recv[nodes.ranksOfNode[n][(i + n) % m]] += rowsTo[flowIndex(nodes, senders[i], n)];
  }
  return std::max(maxSendTotal(nodes, rowsTo), *std::max_element(recv.begin(), recv.end()));
}

// Best single-forwarder assignment (no splits, no relays), by enumeration. Nodes are independent
// (send loads are fixed without relays, and each node's forwarders only see flows into it), so the
// optimum over all assignments is max(largest send total, per node the best max receive load).
uint64_t bruteForceUnsplit(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo) {
  uint64_t best = maxSendTotal(nodes, rowsTo);
  for (int n = 0; n < nodes.numNodes; ++n) {
    std::vector<uint64_t> flows;
    for (int s = 0; s < nodes.nranks; ++s)
      if (nodes.nodeOf[s] != n) flows.push_back(rowsTo[flowIndex(nodes, s, n)]);
    const int m = nodes.localSize(n);
    size_t combos = 1;
    for (size_t i = 0; i < flows.size(); ++i) combos *= m;
    uint64_t nodeBest = UINT64_MAX;
    for (size_t c = 0; c < combos; ++c) {
      std::vector<uint64_t> load(m, 0);
      size_t code = c;
      for (uint64_t w : flows) {
        load[code % m] += w;
        code /= m;
      }
      nodeBest = std::min(nodeBest, *std::max_element(load.begin(), load.end()));
    }
    best = std::max(best, nodeBest);
  }
  return best;
}

TEST(Balance, StaticRoutesUseTheSameLocalIndex) {
  const NodeMap nodes = makeNodes(12, 4);
  const std::vector<uint64_t> rows = randomRows(nodes, 7, 50, 10);
  for (Balance mode : {Balance::None, Balance::Static}) {
    const BalancePlan p = plan(mode, nodes, rows, true);
    for (int s = 0; s < nodes.nranks; ++s)
      for (int n = 0; n < nodes.numNodes; ++n) {
        const size_t f = flowIndex(nodes, s, n);
        if (p.routes[f].empty()) continue;
        ASSERT_EQ(p.routes[f].size(), 1u);
        EXPECT_EQ(p.routes[f][0].relay, s);
        EXPECT_EQ(nodes.localRankOf[p.routes[f][0].forwarder], nodes.localRankOf[s]);
      }
  }
  EXPECT_EQ(plan(Balance::None, nodes, rows, true).routes,
            plan(Balance::Static, nodes, rows, true).routes);
}

TEST(Balance, StaticWrapsLocalIndexOnSmallerNode) {
  const NodeMap nodes = makeNodes(7, 3);  // nodes {0,1,2} {3,4,5} {6}
  std::vector<uint64_t> rows(static_cast<size_t>(nodes.nranks) * nodes.numNodes, 5);
  const BalancePlan p = plan(Balance::Static, nodes, rows, false);
  EXPECT_EQ(p.routes[flowIndex(nodes, 2, 1)][0].forwarder, 5);
  EXPECT_EQ(p.routes[flowIndex(nodes, 2, 2)][0].forwarder, 6);
  EXPECT_EQ(p.routes[flowIndex(nodes, 6, 0)][0].forwarder, 0);
  EXPECT_EQ(p.recvLoad[6], 30u);  // all six remote ranks land on the single rank of node 2
}

TEST(Balance, PlansAreDeterministicAndIgnoreStaleOutput) {
  const NodeMap nodes = makeNodes(24, 4);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<uint64_t> rows = randomRows(nodes, seed, 1000, 20);
    for (bool relay : {false, true}) {
      const BalancePlan a = plan(Balance::Greedy, nodes, rows, relay);
      BalancePlan b;
      planBalance(Balance::Greedy, nodes, randomRows(nodes, seed + 100, 50, 0), !relay, &b);
      planBalance(Balance::Greedy, nodes, rows, relay, &b);  // reuses b's storage
      EXPECT_EQ(a.routes, b.routes);
      EXPECT_EQ(a.sendLoad, b.sendLoad);
      EXPECT_EQ(a.recvLoad, b.recvLoad);
      EXPECT_EQ(a.maxLoad, b.maxLoad);
      EXPECT_EQ(a.lowerBound, b.lowerBound);
    }
  }
}

TEST(Balance, OwnNodeEntriesAreIgnored) {
  const NodeMap nodes = makeNodes(8, 4);
  std::vector<uint64_t> rows = randomRows(nodes, 3, 100, 0);
  const BalancePlan a = plan(Balance::Greedy, nodes, rows, true);
  for (int s = 0; s < nodes.nranks; ++s) rows[flowIndex(nodes, s, nodes.nodeOf[s])] = 123456;
  const BalancePlan b = plan(Balance::Greedy, nodes, rows, true);
  EXPECT_EQ(a.routes, b.routes);
  EXPECT_EQ(a.lowerBound, b.lowerBound);
}

TEST(Balance, SingleNodeHasNoRoutesAndZeroLoads) {
  const NodeMap nodes = makeNodes(8, 8);
  const std::vector<uint64_t> rows(8, 77);
  for (Balance mode : {Balance::None, Balance::Static, Balance::Greedy}) {
    const BalancePlan p = plan(mode, nodes, rows, true);
    for (const auto& rs : p.routes) EXPECT_TRUE(rs.empty());
    EXPECT_EQ(p.maxLoad, 0u);
    EXPECT_EQ(p.lowerBound, 0u);
    EXPECT_EQ(p.sendLoad, std::vector<uint64_t>(8, 0));
  }
}

TEST(Balance, ZeroRowsGiveAnEmptyPlan) {
  const NodeMap nodes = makeNodes(16, 4);
  const std::vector<uint64_t> rows(64, 0);
  const BalancePlan p = plan(Balance::Greedy, nodes, rows, true);
  for (const auto& rs : p.routes) EXPECT_TRUE(rs.empty());
  EXPECT_EQ(p.maxLoad, 0u);
  EXPECT_EQ(p.lowerBound, 0u);
  EXPECT_NE(describeBalance(Balance::Greedy, p).find("ratio 1.000"), std::string::npos);
}

TEST(Balance, RejectsWrongSizeAndUnknownMode) {
  const NodeMap nodes = makeNodes(8, 4);
  BalancePlan p;
  EXPECT_THROW(planBalance(Balance::Greedy, nodes, std::vector<uint64_t>(15, 1), true, &p),
               std::invalid_argument);
  EXPECT_THROW(planBalance(static_cast<Balance>(FUSCO_BALANCE_AUTO), nodes,
                           std::vector<uint64_t>(16, 1), true, &p),
               std::invalid_argument);
}

TEST(Balance, GreedyMatchesBruteForceOnSmallCases) {
  const std::vector<std::pair<int, int>> shapes = {{4, 2}, {6, 2}, {6, 3}, {9, 3}, {5, 2}, {8, 3}};
  int beatsUnsplit = 0;  // cases where splitting over forwarders beats every unsplit assignment
  for (const auto& [nranks, localSize] : shapes) {
    const NodeMap nodes = makeNodes(nranks, localSize);
    for (uint64_t seed = 1; seed <= 150; ++seed) {
      SCOPED_TRACE("nranks " + std::to_string(nranks) + " local " + std::to_string(localSize) +
                   " seed " + std::to_string(seed));
      const std::vector<uint64_t> rows = randomRows(nodes, seed * 7919 + nranks, 40, 25);
      const uint64_t unsplitOpt = bruteForceUnsplit(nodes, rows);
      const uint64_t alg1 = algorithm1MaxLoad(nodes, rows);
      const uint64_t stat = plan(Balance::Static, nodes, rows, false).maxLoad;

      const BalancePlan g = plan(Balance::Greedy, nodes, rows, false);
      EXPECT_LE(g.maxLoad, stat);
      EXPECT_LE(g.maxLoad, alg1);
      EXPECT_LE(g.maxLoad, unsplitOpt);  // splitting over forwarders only helps
      beatsUnsplit += g.maxLoad < unsplitOpt;
      EXPECT_EQ(g.maxLoad, g.lowerBound);
      EXPECT_GE(g.lowerBound, maxSendTotal(nodes, rows));

      const BalancePlan gr = plan(Balance::Greedy, nodes, rows, true);
      EXPECT_GE(gr.maxLoad, gr.lowerBound);
      EXPECT_EQ(gr.maxLoad, gr.lowerBound);
      EXPECT_LE(gr.maxLoad, unsplitOpt);
      EXPECT_LE(gr.maxLoad, g.maxLoad);
    }
  }
  EXPECT_GT(beatsUnsplit, 0) << "the random cases never exercised a split";
}

TEST(Balance, GreedyReachesLowerBoundOnLargeSkewedInput) {
  for (const auto& [nranks, localSize] :
       std::vector<std::pair<int, int>>{{64, 8}, {1024, 8}, {100, 8}, {96, 32}}) {
    const NodeMap nodes = makeNodes(nranks, localSize);
    std::mt19937_64 rng(nranks);
    std::vector<uint64_t> rows(static_cast<size_t>(nranks) * nodes.numNodes);
    for (uint64_t& r : rows) r = (rng() % 8 == 0) ? 1000 + rng() % 9000 : rng() % 100;
    for (bool relay : {false, true}) {
      const BalancePlan g = plan(Balance::Greedy, nodes, rows, relay);
      EXPECT_EQ(g.maxLoad, g.lowerBound) << nranks << " relay " << relay;
      EXPECT_LE(g.maxLoad, plan(Balance::Static, nodes, rows, relay).maxLoad);
    }
  }
}

TEST(Balance, UniformPatternKeepsStaticRoutesAtTheLowerBound) {
  const NodeMap nodes = makeNodes(64, 8);
  const std::vector<uint64_t> rows(64 * 8, 100);
  const BalancePlan s = plan(Balance::Static, nodes, rows, true);
  for (bool relay : {false, true}) {
    const BalancePlan g = plan(Balance::Greedy, nodes, rows, relay);
    EXPECT_EQ(g.maxLoad, g.lowerBound);
    EXPECT_EQ(g.maxLoad, 700u);
    EXPECT_EQ(g.routes, s.routes);  // nothing to improve: no moves, splits or relays
  }
}

TEST(Balance, SingleDestinationPatternReachesLowerBound) {
  // Every rank sends only to the next node; rows differ per rank.
  for (const auto& [nranks, localSize] : std::vector<std::pair<int, int>>{{64, 8}, {20, 8}}) {
    const NodeMap nodes = makeNodes(nranks, localSize);
    std::vector<uint64_t> rows(static_cast<size_t>(nranks) * nodes.numNodes, 0);
    for (int s = 0; s < nranks; ++s)
      rows[flowIndex(nodes, s, (nodes.nodeOf[s] + 1) % nodes.numNodes)] = 100 + 37 * (s % 5);
    const BalancePlan st = plan(Balance::Static, nodes, rows, true);
    for (bool relay : {false, true}) {
      const BalancePlan g = plan(Balance::Greedy, nodes, rows, relay);
      EXPECT_EQ(g.maxLoad, g.lowerBound) << nranks << " relay " << relay;
      EXPECT_LE(g.maxLoad, st.maxLoad);
    }
  }
}

TEST(Balance, ImbalancedPatternRelaysToWithinTenPercentOfLowerBound) {
  const NodeMap nodes = makeNodes(64, 8);
  std::vector<uint64_t> rows(64 * 8);
  for (int s = 0; s < 64; ++s)
    for (int n = 0; n < 8; ++n) rows[flowIndex(nodes, s, n)] = nodes.localRankOf[s] < 4 ? 300 : 100;
  const BalancePlan st = plan(Balance::Static, nodes, rows, true);
  const BalancePlan g = plan(Balance::Greedy, nodes, rows, true);
  EXPECT_EQ(g.lowerBound, 1400u);  // per node (4 * 2100 + 4 * 700) / 8
  EXPECT_LE(g.maxLoad * 10, g.lowerBound * 11);
  EXPECT_GT(st.maxLoad, g.maxLoad);
  EXPECT_EQ(st.maxLoad, 2100u);
  // Without relays the heavy senders' own rails bound the result.
  const BalancePlan gn = plan(Balance::Greedy, nodes, rows, false);
  EXPECT_EQ(gn.maxLoad, 2100u);
  EXPECT_EQ(gn.lowerBound, 2100u);
  const std::string line = describeBalance(Balance::Greedy, g);
  EXPECT_NE(line.find("balance GREEDY: maxLoad 1400 lowerBound 1400 ratio 1.000"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("relayed 0 "), std::string::npos) << line;
}

// With slack, GREEDY keeps STATIC's routes when they are close to the bound, and otherwise stops
// filling rails at bound * (1 + slack) instead of the bound: fewer relays and splits.
TEST(Balance, SlackKeepsStaticRoutesNearTheBoundAndCapsTheRestAtIt) {
  const NodeMap nodes = makeNodes(16, 4);
  std::vector<uint64_t> near(16 * 4), far(16 * 4);
  for (int s = 0; s < 16; ++s)
    for (int n = 0; n < 4; ++n) {
      near[flowIndex(nodes, s, n)] = 1000 + (s * 7 + n * 3) % 40;  // within 4% of even
      far[flowIndex(nodes, s, n)] = nodes.localRankOf[s] < 2 ? 300 : 100;
    }
  const BalancePlan st = plan(Balance::Static, nodes, near, true);
  BalancePlan g;
  planBalance(Balance::Greedy, nodes, near, true, &g, 64);
  expectValidPlan(nodes, near, true, g);
  EXPECT_EQ(g.routes, st.routes) << "within 1/16 of the bound: STATIC's routes";
  EXPECT_LE(g.maxLoad * 1024, g.lowerBound * (1024 + 64));
  BalancePlan exact = plan(Balance::Greedy, nodes, near, true);
  EXPECT_EQ(exact.maxLoad, exact.lowerBound) << "slack 0 is exact";
  EXPECT_NE(exact.routes, st.routes);
  planBalance(Balance::Greedy, nodes, far, true, &g, 64);
  expectValidPlan(nodes, far, true, g);
  EXPECT_LE(g.maxLoad * 1024, g.lowerBound * (1024 + 64));
  EXPECT_LT(g.maxLoad, plan(Balance::Static, nodes, far, true).maxLoad);
}

TEST(Balance, GreedyWithoutRelayNeverRelays) {
  const NodeMap nodes = makeNodes(32, 8);
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const std::vector<uint64_t> rows = randomRows(nodes, seed, 5000, 30);
    const BalancePlan g = plan(Balance::Greedy, nodes, rows, false);  // checks relay == s
    EXPECT_EQ(describeBalance(Balance::Greedy, g).find("relayed 0 ") != std::string::npos, true);
  }
}

TEST(Balance, NamesAreStable) {
  EXPECT_STREQ(balanceName(Balance::None), "NONE");
  EXPECT_STREQ(balanceName(Balance::Static), "STATIC");
  EXPECT_STREQ(balanceName(Balance::Greedy), "GREEDY");
}

}  // namespace
}  // namespace fusco
