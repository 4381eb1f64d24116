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
#include "transport/ucx/ucx_comm.h"
#include "transport/ucx/ucx_gdr.h"

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
  // A CUDA comm's pairs on other nodes use it too (the engine's network bridge stages the rows).
  ctx.memType = fuscoMemCuda;
  EXPECT_GT(kUcxTransport.score(ctx, 2), 1);
  EXPECT_LT(kUcxTransport.score(ctx, 1), 0);
  EXPECT_EQ(kUcxTransport.memAlloc, nullptr);
  EXPECT_EQ(kUcxTransport.peerPointer, nullptr);
}

// FUSCO_NET_GDR against what UCX reports: auto and 0 stage (and say why), 1 fails saying why,
// anything else is refused.
TEST(UcxNetPath, GdrSettingAgainstWhatUcxReports) {
  std::string path;
  ASSERT_EQ(fusco::ucx::chooseNetPath("auto", 0, 2, &path), fuscoSuccess);
  EXPECT_NE(path.find("staged through pinned host memory"), std::string::npos) << path;
  EXPECT_NE(path.find("no CUDA memory on 2 of 2 rail(s)"), std::string::npos) << path;
  ASSERT_EQ(fusco::ucx::chooseNetPath("0", 2, 2, &path), fuscoSuccess);
  EXPECT_NE(path.find("FUSCO_NET_GDR=0"), std::string::npos) << path;
  path = "unchanged";
  EXPECT_EQ(fusco::ucx::chooseNetPath("1", 1, 2, &path), fuscoInvalidUsage);
  EXPECT_EQ(path, "unchanged");
  const std::string why = fusco::threadLastError();
  EXPECT_NE(why.find("FUSCO_NET_GDR=1"), std::string::npos) << why;
  EXPECT_NE(why.find("no CUDA memory on 1 of 2"), std::string::npos) << why;
  EXPECT_EQ(fusco::ucx::chooseNetPath("1", 2, 2, &path), fuscoInvalidUsage);
  EXPECT_NE(fusco::threadLastError().find("no GPUDirect data path"), std::string::npos)
      << fusco::threadLastError();
  EXPECT_EQ(fusco::ucx::chooseNetPath("yes", 0, 1, &path), fuscoInvalidArgument);
  EXPECT_NE(fusco::threadLastError().find("expected auto, 0 or 1"), std::string::npos);
}

// A real rail (UCX's own choice of devices here) reports what memory it supports; on Debian's UCX
// no CUDA memory, so auto stages.
TEST(UcxNetPath, RailsReportTheirMemoryTypes) {
  fusco::ucx::UcxComm c;
  c.rails.resize(1);
  ASSERT_EQ(fusco::ucx::openRail(&c, "", &c.rails[0]), fuscoSuccess) << fusco::threadLastError();
  const size_t cuda = fusco::ucx::railHasCudaMemory(&c, 0) ? 1 : 0;
  std::string path;
  EXPECT_EQ(fusco::ucx::chooseNetPath("auto", cuda, 1, &path), fuscoSuccess);
  EXPECT_NE(path.find("staged"), std::string::npos) << path;
  EXPECT_TRUE(fusco::ucx::teardown(&c));
}

}  // namespace
#endif  // FUSCO_HAVE_UCX
