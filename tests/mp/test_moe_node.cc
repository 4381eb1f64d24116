// NODE dedup across (virtual) nodes: every token crosses the network once per remote node, to a
// forwarder that fans it out on its node, and combine sums per node at the forwarder. recvX and
// out must be byte-identical to NONE and RANK in every balance mode; the dispatch stats must show
// exactly one network row per (token, remote node). Inter-node pairs use UCX (TCP on loopback).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::combineChecked;
using fusco::test::commConfig;
using fusco::test::initComm;
using fusco::test::makeCombine;
using fusco::test::MoeCase;
using fusco::test::RankCtx;
using fusco::test::runRanks;

struct NodeShape {
  int nranks, localSize;
};

std::string shapeName(const ::testing::TestParamInfo<NodeShape>& i) {
  return std::to_string(i.param.nranks) + "ranks" + std::to_string(i.param.localSize) + "pernode";
}

// NONE is the reference mode; NODE under every balance mode must give the same bytes.
void nodeModesAgree(fuscoComm_t comm, const RankCtx& ctx, MoeCase c, uint64_t seed,
                    fuscoDataType_t dt, size_t hidden) {
  auto s = makeCombine(c, seed, dt, hidden);
  auto none = combineChecked(comm, ctx, s, FUSCO_DEDUP_NONE);
  for (int balance :
       {FUSCO_BALANCE_NONE, FUSCO_BALANCE_STATIC, FUSCO_BALANCE_GREEDY, FUSCO_BALANCE_AUTO}) {
    s.c.balance = balance;
    auto node = combineChecked(comm, ctx, s, FUSCO_DEDUP_NODE);
    EXPECT_TRUE(node == none) << "NODE with balance " << balance << " differs from NONE on rank "
                              << ctx.rank;
  }
}

class MoeNodeShapes : public ::testing::TestWithParam<NodeShape> {};

TEST_P(MoeNodeShapes, EveryBalanceModeMatchesNoDedupBitwise) {
  const uint64_t seed = fusco::test::testSeed();
  const NodeShape shape = GetParam();
  runRanks(shape.nranks, [seed, shape](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = ctx.nranks;
    c.localSize = shape.localSize;
    c.numExperts = 3 * ctx.nranks;
    c.topk = 5;
    c.align = 2;
    c.unusedPercent = 10;
    for (int r = 0; r < ctx.nranks; ++r) c.numTokens.push_back(r == 1 ? 0 : 30 + 11 * r);
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    nodeModesAgree(comm, ctx, c, seed, fuscoBfloat16, 72);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Two nodes of 2, 3 ranks on uneven nodes (2 + 1), 4 nodes of 2, 2 nodes of 3.
INSTANTIATE_TEST_SUITE_P(Moe, MoeNodeShapes,
                         ::testing::Values(NodeShape{4, 2}, NodeShape{3, 2}, NodeShape{8, 2},
                                           NodeShape{6, 3}),
                         shapeName);

// Slices smaller than a row: forwarders see rows land in pieces and must pass each on only once
// it is whole (staged, and written straight into recvX from fuscoMemAlloc); fp32 sums over many
// experts per node.
TEST(MoeNode, SlicesSmallerThanARowForwardOnlyWholeRows) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    setenv("FUSCO_CHUNK_BYTES", "4096", 1);
    MoeCase c;
    c.nranks = 4;
    c.localSize = 2;
    c.numExperts = 16;
    c.topk = 8;
    c.numTokens = {21, 9, 17, 13};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    nodeModesAgree(comm, ctx, c, seed, fuscoFloat32, 1800);  // 7200-byte rows, staged
    fusco::test::setMoeArenaBuffers(true);  // direct writes of rows as they land, in pieces
    nodeModesAgree(comm, ctx, c, seed + 1, fuscoFloat32, 1800);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// All experts on the last node: flows of 35, 35 and 30 rows into a node of two forwarders. GREEDY
// reaches the bound (50 rows per forwarder) only by splitting the third flow over both.
TEST(MoeNode, AFlowSplitOverTwoForwardersStaysExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(6, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 6;
    c.localSize = 2;
    c.numExperts = 8;
    c.placement = {4, 5, 4, 5, 4, 5, 4, 5};
    c.topk = 3;
    c.unusedPercent = 0;
    c.numTokens = {36, 35, 31, 0, 10, 10};  // token 0 of each rank routes nowhere (makeCombine)
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    nodeModesAgree(comm, ctx, c, seed, fuscoBfloat16, 40);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// The first rank of every node sends everything across the network: GREEDY relays part of its
// rows through a local peer's NIC (rows handed over intra-node, passed on as they land) and
// spreads them over forwarders; combine returns the node sums the same way back. Rows large
// enough to need several slices and a transport that moves them in the background.
TEST(MoeNode, HeavySendersRelayThroughLocalPeersAndStayExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(6, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 6;
    c.localSize = 2;
    c.numExperts = 24;
    c.topk = 4;
    c.route = fusco::test::Route::HeavyRails;
    c.numTokens = {90, 60, 120, 30, 100, 70};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int rep = 0; rep < 2; ++rep) {
      fusco::test::setMoeArenaBuffers(rep == 1);  // rep 1: forwarders write final rows directly
      nodeModesAgree(comm, ctx, c, seed + rep, fuscoBfloat16, 1024);
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Every token's experts on one other node: RANK crosses once per remote rank, NODE once per node.
TEST(MoeNode, TokensForOneRemoteNodeCrossOnceInsteadOfOncePerRank) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.localSize = 2;
    c.numExperts = 8;  // experts 0-3 on node 0, 4-7 on node 1
    c.topk = 4;
    c.numTokens = {25, 25, 25, 25};
    c.unusedPercent = 0;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    auto p = fusco::test::makeProblem(c, seed);
    // Every token of a rank of node n picks all four experts of the other node.
    for (int s = 0; s < c.nranks; ++s)
      for (size_t i = 0; i < p.topkIdx[s].size(); ++i)
        p.topkIdx[s][i] = 4 * (1 - s / 2) + static_cast<int>(i % 4);
    const auto ref = fusco::test::moeRefSendStats(p, ctx.rank);
    EXPECT_EQ(ref.nodeInter, 25u);
    EXPECT_EQ(ref.rankInter, 50u);
    size_t inter[2] = {0, 0};
    int i = 0;
    for (int dedup : {FUSCO_DEDUP_RANK, FUSCO_DEDUP_NODE}) {
      fuscoMoeConfig_t m = fusco::test::moeConfig(c, dedup);
      fuscoMoeHandle_t h = nullptr;
      FUSCO_EXPECT_OK(comm, fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), 25, 4, nullptr));
      size_t numRecv = 0;
      FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &numRecv, nullptr));
      std::vector<uint8_t> x(25 * 32, static_cast<uint8_t>(ctx.rank + 1)),
          recvX(numRecv * 32 + 1, 0);
      FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, x.data(), 32, recvX.data(), nullptr));
      fuscoMoeStats_t st{};
      st.size = sizeof st;
      FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
      inter[i++] = st.dispatchRowsInterNode;
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
    EXPECT_EQ(inter[0], 50u) << "RANK: one row per (token, remote rank)";
    EXPECT_EQ(inter[1], 25u) << "NODE: one row per (token, remote node)";
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Ranks that balance NODE routes differently would plan different routes: every rank fails the
// plan with an error naming the rank that differs, nothing hangs, and the comm stays usable.
TEST(MoeNode, RanksWithDifferentBalanceSettingsFailThePlanEverywhere) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.localSize = 2;
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens = {20, 20, 20, 20};
    fuscoConfig_t cfg = commConfig(c, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    auto p = fusco::test::makeProblem(c, seed);
    fuscoMoeConfig_t m = fusco::test::moeConfig(c, FUSCO_DEDUP_NODE);
    m.balance = ctx.rank == 3 ? FUSCO_BALANCE_STATIC : FUSCO_BALANCE_GREEDY;
    fuscoMoeHandle_t h = nullptr;
    const double t0 = fusco::test::nowSec();
    const fuscoResult_t r = fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), 20, 3, nullptr);
    EXPECT_LT(fusco::test::nowSec() - t0, 10.0) << "the failing plan must not wait for the timeout";
    EXPECT_NE(r, fuscoSuccess) << "ranks planned NODE routes with different balance settings";
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_NE(msg.find("FUSCO_BALANCE_SLACK must agree"), std::string::npos) << msg;
    EXPECT_NE(msg.find(ctx.rank == 3 ? "rank 0" : "rank 3"), std::string::npos) << msg;
    if (r == fuscoSuccess) FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    // The same plan with one setting everywhere succeeds on the same comm.
    m.balance = FUSCO_BALANCE_GREEDY;
    FUSCO_EXPECT_OK(comm, fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), 20, 3, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
