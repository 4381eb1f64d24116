// What only the UCX transport has: it scores peers on other nodes only and has no registered
// memory, and it notices a dead peer by itself (through UCX), without knowing its pid. The channel
// itself (order, credits, sizes, death, abort, close) is checked for every transport by
// test_transport_conformance.cc, where UCX runs over TCP on loopback. Built only with UCX.
#ifdef FUSCO_HAVE_UCX
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "core/topology.h"
#include "harness/transport_group.h"
#include "harness/transport_kinds.h"
#include "harness/transport_traffic.h"
#include "transport/transport.h"

namespace fusco {
extern const TransportOps kUcxTransport;
}

namespace {

using fusco::kUcxTransport;
using fusco::nowNs;
using namespace fusco::test::transport;  // NOLINT(google-build-using-namespace)

constexpr int64_t kPromptMs = 3000;

// Rank `victim` is killed by the parent after the first barrier; its pid was never published, so
// only UCX (the endpoint's error handler) can tell the others.
int survivorBody(RankEnv& e, int victim) {
  if (exchangeAll(e, 5) != 0) return 1;
  CHILD_CHECK(e.barrier(), "barrier");  // the parent kills the victim now
  if (e.rank == victim)
    for (;;) pause();
  CHILD_CHECK(e.infos[victim].pid == 0, "the victim's pid is known");
  int64_t ms = 0;
  fuscoResult_t r = waitForFailure(e, victim, kTimeoutMs, &ms);
  CHILD_CHECK(r == fuscoRemoteError, "checkPeer(%d) gave %d after %lld ms", victim, r,
              (long long)ms);
  CHILD_CHECK(ms < kPromptMs, "noticed the death after %lld ms", (long long)ms);
  CHILD_CHECK(fusco::threadLastError().find("rank " + std::to_string(victim)) != std::string::npos,
              "message does not name the rank");
  int64_t t0 = nowNs();
  e.ops->close(e.tc);
  e.tc = nullptr;
  ms = (nowNs() - t0) / 1000000;
  CHILD_CHECK(ms < kPromptMs, "close took %lld ms", (long long)ms);
  return 0;
}

TEST(UcxTransport, KilledPeerIsNoticedByUcxAlone) {
  Options o;
  o.kind = &ucxKind();
  o.nranks = 3;
  o.victim = 1;
  o.knownPids = false;
  o.chunkBytes = 64 * 1024;
  runChildren(o, [](RankEnv& e) { return survivorBody(e, 1); });
}

TEST(UcxTransport, ScoresOnlyPeersOnOtherNodes) {
  std::vector<std::string> hosts = {"h/a", "h/a", "h/a", "h/a"};
  fusco::NodeMap nodes = fusco::buildNodeMap(hosts, 2);
  std::vector<fusco::PeerInfo> infos(4);
  fusco::TransportContext ctx;
  ctx.rank = 0;
  ctx.nranks = 4;
  ctx.nodes = &nodes;
  ctx.peers = &infos;
  EXPECT_LT(kUcxTransport.score(ctx, 0), 0);
  EXPECT_LT(kUcxTransport.score(ctx, 1), 0);
  EXPECT_GT(kUcxTransport.score(ctx, 2), 1);
  ctx.memType = fuscoMemCuda;
  EXPECT_LT(kUcxTransport.score(ctx, 2), 0);
  EXPECT_EQ(kUcxTransport.memAlloc, nullptr);
  EXPECT_EQ(kUcxTransport.peerPointer, nullptr);
}

}  // namespace
#endif  // FUSCO_HAVE_UCX
