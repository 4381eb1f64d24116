// What only the CUDA IPC transport has, across real processes: on a host split into virtual nodes
// (localSize 2, so ranks 0-1 and 2-3), a connect attaches only the ranks of its own node, although
// every rank of every node publishes a cuda_ipc blob; so a rank of another node never maps a
// region, and an owner's "mapped by" marks (indexed by local rank, which repeats on every node)
// only ever mean its own node's peer (docs/TESTING.md, "Failure classes": class D). The channel
// itself is checked for every transport by test_transport_conformance.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/result.h"
#include "harness/transport_group.h"
#include "harness/transport_kinds.h"
#include "transport/transport.h"

#ifdef FUSCO_HAVE_CUDA

namespace {

using fusco::test::transport::cudaIpcKind;
using fusco::test::transport::kindSkipReason;
using fusco::test::transport::Options;
using fusco::test::transport::RankEnv;
using fusco::test::transport::runChildren;
using fusco::test::transport::TransportKind;

// CUDA IPC over two virtual nodes of two ranks each.
const TransportKind& twoByTwo() {
  static const TransportKind k = [] {
    TransportKind t = cudaIpcKind();
    t.name = "CudaIpc2x2";
    t.ranksPerNode = 2;
    return t;
  }();
  return k;
}

// Rank 0 exports a region. Ranks 2 and 3 (the other node; rank 2 has rank 0's local index, rank 3
// rank 1's) map what they can see, rank 1 not yet: rank 0 must not see its region mapped by rank
// 1. Then rank 1 maps it, and rank 0 does.
int connectBody(RankEnv& e) {
  const int node = e.rank / 2, peer = node * 2 + (1 - e.rank % 2);
  CHILD_CHECK(e.peers == std::vector<int>{peer}, "rank %d scores %zu peers", e.rank,
              e.peers.size());
  void* region = nullptr;
  uint64_t token = 0;
  if (e.rank == 0) {
    CHILD_CHECK(e.ops->memAlloc(e.tc, 1 << 20, &region) == fuscoSuccess, "memAlloc");
    CHILD_CHECK(e.ops->regionToken(e.tc, region, 1 << 20, &token), "a token for the region");
  }
  CHILD_CHECK(e.barrier(), "barrier: exported");
  if (e.rank >= 2) CHILD_CHECK(e.ops->mapRegions(e.tc) == fuscoSuccess, "map (other node)");
  CHILD_CHECK(e.barrier(), "barrier: the other node mapped");
  if (e.rank == 0)
    CHILD_CHECK(!e.ops->peerMapped(e.tc, 1, token),
                "rank 1 has not mapped rank 0's region, yet rank 0 sees it mapped: a rank of the "
                "other node with rank 1's local index mapped it");
  CHILD_CHECK(e.barrier(), "barrier: checked");
  if (e.rank == 1) {
    CHILD_CHECK(e.ops->regionsToMap(e.tc), "rank 1 sees rank 0's new region");
    CHILD_CHECK(e.ops->mapRegions(e.tc) == fuscoSuccess, "map (this node)");
  }
  CHILD_CHECK(e.barrier(), "barrier: rank 1 mapped");
  if (e.rank == 0) {
    CHILD_CHECK(e.ops->peerMapped(e.tc, 1, token), "rank 1 mapped rank 0's region");
    CHILD_CHECK(e.ops->memFree(e.tc, region) == fuscoSuccess, "memFree");
  }
  return e.barrier() ? 0 : 1;
}

TEST(CudaIpc, ConnectAttachesOnlyItsPeers) {
  bool mustRun = false;
  const std::string why = kindSkipReason(twoByTwo(), &mustRun);
  if (mustRun) FAIL() << "FUSCO_TEST_REQUIRE_GPU=1 but " << why;
  if (!why.empty()) GTEST_SKIP() << why;
  Options o;
  o.kind = &twoByTwo();
  o.nranks = 4;
  runChildren(o, connectBody);
}

}  // namespace

#endif  // FUSCO_HAVE_CUDA
