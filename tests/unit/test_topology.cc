// Node maps: ranks grouped by host identity, or into virtual nodes of a fixed local size.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/topology.h"
#include "device/device_share.h"
#include "engine/peer_info.h"

namespace {

using fusco::buildNodeMap;
using fusco::NodeMap;

// The invariants every node map keeps, whatever built it.
void expectConsistent(const NodeMap& m, int nranks) {
  ASSERT_EQ(m.nranks, nranks);
  ASSERT_EQ(static_cast<int>(m.nodeOf.size()), nranks);
  ASSERT_EQ(static_cast<int>(m.localRankOf.size()), nranks);
  ASSERT_EQ(static_cast<int>(m.ranksOfNode.size()), m.numNodes);
  int total = 0;
  for (int n = 0; n < m.numNodes; ++n) {
    EXPECT_FALSE(m.ranksOfNode[n].empty()) << "node " << n << " is empty";
    total += m.localSize(n);
    for (size_t i = 0; i < m.ranksOfNode[n].size(); ++i) {
      int r = m.ranksOfNode[n][i];
      EXPECT_EQ(m.nodeOf[r], n);
      EXPECT_EQ(m.localRankOf[r], static_cast<int>(i));
      if (i > 0) {
        EXPECT_LT(m.ranksOfNode[n][i - 1], r) << "ranks of a node must ascend";
      }
    }
  }
  EXPECT_EQ(total, nranks);
}

TEST(NodeMap, SameHostIdSharesANode) {
  NodeMap m = buildNodeMap({"a", "a", "b", "b", "a"}, 0);
  expectConsistent(m, 5);
  EXPECT_EQ(m.numNodes, 2);
  EXPECT_EQ(m.nodeOf, (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(m.localRankOf, (std::vector<int>{0, 1, 0, 1, 2}));
  EXPECT_EQ(m.ranksOfNode[0], (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(m.ranksOfNode[1], (std::vector<int>{2, 3}));
  EXPECT_TRUE(m.sameNode(0, 4));
  EXPECT_FALSE(m.sameNode(1, 2));
}

TEST(NodeMap, NodesAreNumberedByTheirLowestRank) {
  // "z" sorts after "a" but holds rank 0, so it is node 0.
  NodeMap m = buildNodeMap({"z", "a", "z", "m"}, 0);
  expectConsistent(m, 4);
  EXPECT_EQ(m.nodeOf, (std::vector<int>{0, 1, 0, 2}));
}

TEST(NodeMap, AllRanksOnOneHostAreOneNode) {
  NodeMap m = buildNodeMap(std::vector<std::string>(8, "host"), 0);
  expectConsistent(m, 8);
  EXPECT_EQ(m.numNodes, 1);
  EXPECT_EQ(m.localSize(0), 8);
}

TEST(NodeMap, LocalSizeSplitsWithASmallerLastNode) {
  // Distinct host ids must not matter once a local size is given.
  NodeMap m = buildNodeMap({"a", "b", "c", "d", "e", "f"}, 4);
  expectConsistent(m, 6);
  EXPECT_EQ(m.numNodes, 2);
  EXPECT_EQ(m.ranksOfNode[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m.ranksOfNode[1], (std::vector<int>{4, 5}));
  EXPECT_EQ(m.localRankOf, (std::vector<int>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(m.localSize(1), 2);
}

TEST(NodeMap, LocalSizeOverridesOneHost) {
  NodeMap m = buildNodeMap(std::vector<std::string>(8, "same"), 2);
  expectConsistent(m, 8);
  EXPECT_EQ(m.numNodes, 4);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(m.nodeOf[r], r / 2) << "rank " << r;
    EXPECT_EQ(m.localRankOf[r], r % 2) << "rank " << r;
  }
}

TEST(NodeMap, LocalSizeOneGivesOneNodePerRank) {
  NodeMap m = buildNodeMap(std::vector<std::string>(5, "h"), 1);
  expectConsistent(m, 5);
  EXPECT_EQ(m.numNodes, 5);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(m.localRankOf[r], 0);
}

TEST(NodeMap, LocalSizeAtLeastNranksGivesOneNode) {
  for (int l : {3, 4, 100}) {
    NodeMap m = buildNodeMap(std::vector<std::string>(3, "h"), l);
    expectConsistent(m, 3);
    EXPECT_EQ(m.numNodes, 1) << "localSize " << l;
  }
}

TEST(NodeMap, SingleRank) {
  for (int l : {0, 1, 4}) {
    NodeMap m = buildNodeMap({"only"}, l);
    expectConsistent(m, 1);
    EXPECT_EQ(m.numNodes, 1);
    EXPECT_EQ(m.nodeOf[0], 0);
  }
}

TEST(NodeMap, EverySizeAndLocalSizeIsConsistent) {
  for (int n = 1; n <= 9; ++n) {
    for (int l = 1; l <= n + 1; ++l) {
      NodeMap m = buildNodeMap(std::vector<std::string>(n, "h"), l);
      SCOPED_TRACE("nranks " + std::to_string(n) + " localSize " + std::to_string(l));
      expectConsistent(m, n);
      EXPECT_EQ(m.numNodes, (n + l - 1) / l);
    }
  }
}

TEST(LocalHostId, IsStableAndNonEmpty) {
  std::string a = fusco::localHostId();
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, fusco::localHostId());
}

}  // namespace

// Ranks on one GPU (equal device UUIDs) split its multiprocessors: each rank's kernels take their
// part, so the spinning grids of co-located ranks fit on the GPU together.
TEST(DeviceShare, RanksWithTheSameDeviceIdentityShareItsMultiprocessors) {
  const std::vector<std::string> ids = {"gpu-a", "gpu-a", "gpu-b", "gpu-a", "", ""};
  EXPECT_EQ(fusco::ranksSharingDevice(ids, 0), 3);
  EXPECT_EQ(fusco::ranksSharingDevice(ids, 3), 3);
  EXPECT_EQ(fusco::ranksSharingDevice(ids, 2), 1);
  EXPECT_EQ(fusco::ranksSharingDevice(ids, 4), 1) << "an unknown identity is not shared";
  EXPECT_EQ(fusco::ranksSharingDevice(ids, 9), 1);
  EXPECT_EQ(fusco::sharedSms(132, 8), 16);
  EXPECT_EQ(fusco::sharedSms(132, 1), 132);
  EXPECT_EQ(fusco::sharedSms(4, 8), 1) << "every rank keeps one multiprocessor";
}

// The SM budget (fuscoConfig_t.maxSms, FUSCO_CUDA_SMS) caps a rank's grids below its share of the
// GPU, and never lifts the share of a GPU that ranks share.
TEST(DeviceShare, TheSmBudgetCapsTheShareAndNeverLiftsIt) {
  EXPECT_EQ(fusco::budgetSms(132, 1, 24), 24);
  EXPECT_EQ(fusco::budgetSms(132, 1, 0), 132) << "no budget: the whole device";
  EXPECT_EQ(fusco::budgetSms(132, 1, 500), 132);
  EXPECT_EQ(fusco::budgetSms(132, 8, 24), 16) << "the share of 8 ranks is the smaller cap";
  EXPECT_EQ(fusco::budgetSms(132, 8, 4), 4);
  EXPECT_EQ(fusco::budgetSms(4, 8, 2), 1);
}

// A CUDA comm says at init when CUDA_DEVICE_MAX_CONNECTIONS leaves a combine's reading kernel
// sharing the caller's hardware queues behind its waits (Megatron-LM runs with 1).
TEST(DeviceShare, FewHardwareQueuesAreWarnedAbout) {
  EXPECT_NE(fusco::connectionsWarning("1").find("holds back the work"), std::string::npos);
  EXPECT_NE(fusco::connectionsWarning("2"), "");
  EXPECT_EQ(fusco::connectionsWarning("8"), "");
  EXPECT_EQ(fusco::connectionsWarning(nullptr), "");
  EXPECT_EQ(fusco::connectionsWarning(""), "");
  EXPECT_EQ(fusco::connectionsWarning("lots"), "");
}
